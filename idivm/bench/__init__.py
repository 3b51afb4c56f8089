"""Benchmarks of idivm itself (``idivm bench ...``)."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress


def pyplot(c: Console) -> Any | None:
    """matplotlib's pyplot on the file-only Agg backend, or None (said on ``c``) when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        c.print("[yellow]matplotlib is not installed: plot skipped (pip install matplotlib)"
                "[/yellow]")
        return None
    return plt


@contextmanager
def step(progress: Progress, what: str) -> Iterator[None]:
    """One step of a run, shown as a finished task when it ends."""
    task = progress.add_task(what, total=1)
    yield
    progress.update(task, completed=1)
    progress.stop_task(task)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector run now and paused until the block ends, for the
    timed steps in it: a full collection of a benchmark's own heap (the rows it fetched to
    verify views, its plans) takes 50–250 ms on a 2-core machine (gc callbacks, TPC-H SF 0.1)
    and would otherwise land in whichever timed step allocates next. (The larger spikes of a
    maintain right after the recomputation were the maintainer session's plans of dropped
    views: ``PostgresMaintainer._new_session``.)"""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def write_results(c: Console, report: Mapping[str, Any], out: Path) -> None:
    """A benchmark's report as ``out/results.json`` (the directory made if needed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    c.print(f"wrote {out / 'results.json'}")
