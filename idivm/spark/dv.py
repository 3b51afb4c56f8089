"""Delta deletion vectors: the merge-on-read half of the Spark backend's storage.

A refresh that changes a few rows in many files need not rewrite those files (copy-on-write):
it marks the changed rows deleted in a *deletion vector* (DV) per file and adds their new
versions in one new file. This module writes and reads DVs as the Delta protocol defines them
(``PROTOCOL.md``, "Deletion Vectors"), so every Delta reader that supports the
``deletionVectors`` reader feature (delta-rs, Spark with Delta, DuckDB's ``delta`` extension)
reads the same rows idivm does:

- a DV is a 64-bit roaring bitmap of row positions in its data file, serialized in the
  "portable" format after the magic number 1681511377 (little endian);
- it is stored in a file next to the data (storage type ``u``: the file
  ``deletion_vector_<uuid>.bin`` at the table root, named in the descriptor by the UUID in
  Z85), which starts with a version byte (1) and holds, at the descriptor's ``offset``, the
  DV's size (4 bytes, big endian), the DV, and its CRC-32 (4 bytes, big endian);
- a data file's live DV is named by its ``add`` action; changing it is a ``remove`` of the file
  with its old DV and an ``add`` of the same file with the new one.

delta-rs (1.x) reads such tables (``DeltaTable.scan``) but neither writes DVs nor exposes the
descriptors of the live files, so this module also replays the log for them
(``live_descriptors``) and commits hand-written actions (``commit``).
"""

from __future__ import annotations

import functools
import json
import os
import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from idivm.errors import BackendError

MAGIC = 1681511377
FEATURE = "deletionVectors"
ENABLE = {"delta.enableDeletionVectors": "true"}
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


class DeltaCommitConflict(BackendError):
    """Another writer committed the table version this commit was for."""


def z85(data: bytes) -> str:
    """ZeroMQ's Z85 (the Delta protocol's base85) of ``data`` (a multiple of 4 bytes)."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out: list[str] = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        word = []
        for _ in range(5):
            v, r = divmod(v, 85)
            word.append(_Z85[r])
        out.extend(reversed(word))
    return "".join(out)


def unz85(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError("Z85 text is whole 5-character words")
    out = bytearray()
    for i in range(0, len(text), 5):
        v = 0
        for ch in text[i:i + 5]:
            v = v * 85 + _Z85.index(ch)
        out += v.to_bytes(4, "big")
    return bytes(out)


def serialize(positions: Iterable[int]) -> bytes:
    """A DV's bytes: the magic number, then the positions as a portable 64-bit roaring
    bitmap."""
    from pyroaring import BitMap64

    return struct.pack("<I", MAGIC) + BitMap64(positions).serialize()


def deserialize(data: bytes) -> list[int]:
    from pyroaring import BitMap64

    if len(data) < 4 or struct.unpack("<I", data[:4])[0] != MAGIC:
        raise BackendError("not a Delta deletion vector (wrong magic number)")
    return list(BitMap64.deserialize(data[4:]))


def dv_file(table: Path, name_uuid: uuid.UUID) -> Path:
    return table / f"deletion_vector_{name_uuid}.bin"


def write_dvs(table: Path, positions: Mapping[str, Sequence[int]], name: uuid.UUID
              ) -> dict[str, dict[str, Any]]:
    """The DV file ``dv_file(table, name)`` holding a DV per data file of ``positions`` (data
    file path → deleted row positions, all of them: a DV replaces the file's previous one).
    Returns each data file's descriptor."""
    blob = bytearray(b"\x01")
    out: dict[str, dict[str, Any]] = {}
    for path, rows in positions.items():
        data = serialize(sorted(set(rows)))
        offset = len(blob)
        blob += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        out[path] = {"storageType": "u", "pathOrInlineDv": z85(name.bytes), "offset": offset,
                     "sizeInBytes": len(data), "cardinality": len(set(rows))}
    dv_file(table, name).write_bytes(bytes(blob))
    return out


def read_dv(table: Path, descriptor: Mapping[str, Any]) -> list[int]:
    """The row positions a descriptor's DV deletes (storage types ``u`` and ``i``). A DV is
    never rewritten (a new one gets a new file), so each is decoded once per process."""
    return list(_read_dv(str(table), descriptor["storageType"], descriptor["pathOrInlineDv"],
                         int(descriptor.get("offset") or 1), int(descriptor["sizeInBytes"])))


@functools.lru_cache(maxsize=65536)
def _read_dv(table: str, kind: str, ref: str, offset: int, size: int) -> tuple[int, ...]:
    if kind == "i":
        return tuple(deserialize(unz85(ref)[:size]))
    if kind != "u":
        raise BackendError(f"deletion vectors stored as {kind!r} are not supported")
    prefix, encoded = ref[:-20], ref[-20:]
    root = Path(table)
    f = dv_file(root / prefix if prefix else root, uuid.UUID(bytes=unz85(encoded)))
    with open(f, "rb") as fh:
        fh.seek(offset)
        stored = struct.unpack(">i", fh.read(4))[0]
        data = fh.read(stored)
        (crc,) = struct.unpack(">I", fh.read(4))
    if zlib.crc32(data) != crc or stored != size:
        raise BackendError(f"deletion vector in {f} fails its checksum")
    return tuple(deserialize(data))


def dv_paths(descriptors: Iterable[Mapping[str, Any]]) -> set[str]:
    """The DV files (relative to the table) the descriptors point into."""
    out = set()
    for d in descriptors:
        if d["storageType"] == "u":
            ref = d["pathOrInlineDv"]
            prefix = ref[:-20]
            leaf = f"deletion_vector_{uuid.UUID(bytes=unz85(ref[-20:]))}.bin"
            out.add(f"{prefix}/{leaf}" if prefix else leaf)
    return out


@dataclass(frozen=True)
class LiveDVs:
    """The DV descriptor of every live data file that has one, at one table version."""

    version: int
    descriptors: Mapping[str, Mapping[str, Any]]  # data file path (as in the log) → descriptor


def live_descriptors(table: Path, version: int, since: LiveDVs | None = None) -> LiveDVs:
    """Replay the table's log up to ``version`` for the live files' DV descriptors: from
    ``since`` (the descriptors at an earlier version) when its commits are still there, else
    from the newest checkpoint at or below ``version``."""
    import pyarrow.parquet as pq

    log = table / "_delta_log"
    if since is not None and since.version <= version and all(
            (log / f"{v:020d}.json").exists() for v in range(since.version + 1, version + 1)):
        return _replay(log, since.version + 1, version, dict(since.descriptors))
    checkpoints = sorted({int(f.name[:20]) for f in log.glob("*.checkpoint*.parquet")
                          if int(f.name[:20]) <= version})
    out: dict[str, Mapping[str, Any]] = {}
    start = 0
    if checkpoints:
        start = checkpoints[-1] + 1
        for f in sorted(log.glob(f"{checkpoints[-1]:020d}.checkpoint*.parquet")):
            adds = pq.read_table(f, columns=["add"]).column("add").to_pylist()
            for a in adds:
                if a and a.get("deletionVector"):
                    out[a["path"]] = {k: v for k, v in a["deletionVector"].items()
                                      if v is not None}
    return _replay(log, start, version, out)


def _replay(log: Path, start: int, version: int, out: dict[str, Mapping[str, Any]]
            ) -> LiveDVs:
    """``out`` (descriptors before ``start``) brought up to ``version`` by the commits."""
    for v in range(start, version + 1):
        for line in (log / f"{v:020d}.json").read_text().splitlines():
            if not line.strip():
                continue
            act = json.loads(line)
            if "add" in act:
                out.pop(act["add"]["path"], None)
                if act["add"].get("deletionVector"):
                    out[act["add"]["path"]] = act["add"]["deletionVector"]
            elif "remove" in act:
                out.pop(act["remove"]["path"], None)
    return LiveDVs(version, out)


def commit(table: Path, version: int, actions: Sequence[Mapping[str, Any]]) -> None:
    """Write the table's commit ``version`` (newline-delimited JSON actions), failing with
    ``DeltaCommitConflict`` if it exists: the file appears whole or not at all (written aside,
    then linked into place, which fails on an existing name). Assumes a POSIX file system
    (as the rest of the store does)."""
    log = table / "_delta_log"
    final = log / f"{version:020d}.json"
    tmp = log / f".{version:020d}.json.{uuid.uuid4().hex}.tmp"
    tmp.write_text("".join(json.dumps(a) + "\n" for a in actions))
    try:
        os.link(tmp, final)
    except FileExistsError as e:
        raise DeltaCommitConflict(f"version {version} of {table} was committed by another "
                                  "writer") from e
    finally:
        tmp.unlink(missing_ok=True)
