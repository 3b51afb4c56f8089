"""Compile generated C++ with g++ once per (source, flags) and load it with ctypes.

Cache entries live under ``$IDIVM_FRESH_CACHE`` (default ``~/.cache/idivm/fresh``), one
directory per hash of the generated source, the runtime headers and the compiler command;
the readable ``view.cpp`` is kept next to ``view.so``. ``$IDIVM_FRESH_OPT`` replaces the
optimization level (default ``-O3``; the test suite compiles at ``-O1``, ~2.5x sooner). A build
goes to a temporary file renamed into place, so concurrent compiles of the same view never
load a half-written library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from idivm.errors import BackendError

HERE = Path(__file__).parent
RUNTIME = ("runtime.hpp", "abi.hpp")
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-march=native", "-DNDEBUG")
OPT = "-O3"


def flags() -> tuple[str, ...]:
    """The compiler's flags: ``FLAGS`` and the optimization level (``$IDIVM_FRESH_OPT``)."""
    opt = os.environ.get("IDIVM_FRESH_OPT") or OPT
    if opt not in ("-O0", "-O1", "-O2", "-O3", "-Os", "-Og"):
        raise BackendError(f"IDIVM_FRESH_OPT must be one of -O0 -O1 -O2 -O3 -Os -Og, not {opt!r}")
    return (opt, *FLAGS)


def cache_dir() -> Path:
    return Path(os.environ.get("IDIVM_FRESH_CACHE") or Path.home() / ".cache/idivm/fresh")


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise BackendError("fresh views need g++ (set CXX to another C++17 compiler)")
    return cxx


def build(source: str) -> Path:
    """The shared library for ``source`` (compiled on first use, then cached)."""
    cxx, opts = compiler(), flags()
    h = hashlib.sha256()
    for part in (source, *((HERE / f).read_text() for f in RUNTIME), cxx, *opts):
        h.update(part.encode())
        h.update(b"\0")
    entry = cache_dir() / h.hexdigest()[:24]
    lib = entry / "view.so"
    if lib.exists():
        return lib
    entry.mkdir(parents=True, exist_ok=True)
    for f in RUNTIME:
        shutil.copyfile(HERE / f, entry / f)
    (entry / "view.cpp").write_text(source)
    fd, tmp = tempfile.mkstemp(dir=entry, suffix=".so")
    os.close(fd)
    cmd = [cxx, *opts, "-o", tmp, str(entry / "view.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        os.unlink(tmp)
        raise BackendError(f"g++ failed on {entry / 'view.cpp'}:\n{res.stderr[-4000:]}")
    os.replace(tmp, lib)
    return lib


def load(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    p, i64, i32, dbl = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
    p64 = ctypes.POINTER(ctypes.c_int64)
    sig = {
        "fv_new": ([], p), "fv_free": ([p], None), "fv_intern": ([p, ctypes.c_char_p], i64),
        "fv_string": ([p, i64], ctypes.c_char_p), "fv_apply": ([p, i32, i32, p64, p64], i32),
        "fv_recompute": ([p], None), "fv_map_size": ([p, i32], i64),
        "fv_map_dump": ([p, i32, p64, ctypes.POINTER(dbl)], None), "fv_bytes": ([p], i64),
        "fv_replay": ([p, ctypes.c_char_p, i32, i32, dbl, i64, ctypes.POINTER(dbl),
                       ctypes.c_char_p, i32], i32),
    }
    for name, (args, res) in sig.items():
        fn = getattr(dll, name)
        fn.argtypes = args
        fn.restype = res
    return dll
