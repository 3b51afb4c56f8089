"""Benchmarks of idivm itself (``idivm bench ...``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
