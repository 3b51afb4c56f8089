"""Benchmarks of idivm itself (``idivm bench ...``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console


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
