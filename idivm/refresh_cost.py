"""Cost-based refresh: maintain (run the Δ-script) or recompute, estimated before running.

A pure model over what a backend records per view (``History``): the seconds a recomputation
took and how many base-table rows it read, and the seconds each maintenance took for how many
change-feed rows. A maintenance is modelled as ``fixed + per_change × changes`` (the fixed part
is the engine's floor — fold the feeds, size the i-diffs, commit — and the rest grows with the
i-diffs); a recomputation as ``seconds_per_row × base rows``. With no measurement yet, the
per-change cost is ``DEFAULT_PER_CHANGE``, the floor ``DEFAULT_FIXED``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Choice = Literal["id", "recompute"]
RefreshStrategy = Literal["auto", "id", "tuple", "recompute"]

DEFAULT_FIXED = 1.0  # seconds: a Spark refresh's floor, measured at 0.4–1 s (README)
DEFAULT_PER_CHANGE = 1.5e-4  # seconds per change-feed row (V′ under a 1% batch at 5M links)
KEEP = 8  # maintenance samples kept per view
CALIBRATE = 0.4  # maintain estimate / create-time recompute above which a recompute is timed


@dataclass(frozen=True)
class History:
    recompute_seconds: float | None = None
    recompute_rows: int | None = None  # base-table rows the recomputation read
    maintain: tuple[tuple[int, float], ...] = ()  # (changes, seconds), newest last
    recompute_at_create: bool = False  # the recomputation was only timed by create_view

    def as_dict(self) -> dict[str, Any]:
        return {"recompute_seconds": self.recompute_seconds,
                "recompute_rows": self.recompute_rows,
                "maintain": [list(x) for x in self.maintain],
                "recompute_at_create": self.recompute_at_create}

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> History:
        if not d:
            return History()
        return History(d.get("recompute_seconds"), d.get("recompute_rows"),
                       tuple((int(n), float(s)) for n, s in d.get("maintain", ())),
                       bool(d.get("recompute_at_create", False)))

    def with_maintain(self, changes: int, seconds: float) -> History:
        return replace(self, maintain=(*self.maintain, (changes, seconds))[-KEEP:])

    def with_recompute(self, seconds: float, rows: int | None,
                       at_create: bool = False) -> History:
        return replace(self, recompute_seconds=seconds, recompute_rows=rows,
                       recompute_at_create=at_create)


@dataclass(frozen=True)
class Decision:
    choice: Choice
    reason: str
    maintain_estimate: float | None = None
    recompute_estimate: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"choice": self.choice, "reason": self.reason,
                "maintain_estimate": self.maintain_estimate,
                "recompute_estimate": self.recompute_estimate}


def maintain_model(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(fixed, per_change)`` from earlier maintenances: the floor is the fastest run's time
    less its changes at the per-change rate; the rate is the steepest (seconds - floor) /
    changes among runs large enough to show it (≥ 1,000 changes), else the default."""
    if not samples:
        return DEFAULT_FIXED, DEFAULT_PER_CHANGE
    big = [(n, s) for n, s in samples if n >= 1000]
    fixed0 = min(s for _, s in samples)
    per = DEFAULT_PER_CHANGE
    if big:
        per = max(max(0.0, s - fixed0) / n for n, s in big)
    small = [(n, s) for n, s in samples if n < 1000] or list(samples)
    fixed = max(0.0, min(s - per * n for n, s in small))
    return fixed, per


def decide(strategy: RefreshStrategy, changes: int, base_rows: int | None,
           history: History) -> Decision:
    """The refresh to run for ``changes`` change-feed rows over tables of ``base_rows`` rows."""
    if strategy in ("id", "tuple"):
        return Decision("id", f"strategy={strategy!r} forces maintenance")
    if strategy == "recompute":
        return Decision("recompute", "strategy='recompute' forces recomputation")
    fixed, per = maintain_model(history.maintain)
    m_est = fixed + per * changes
    if history.recompute_seconds is None:
        return Decision("id", "no recomputation measured yet: maintain", m_est, None)
    r_est = history.recompute_seconds
    if base_rows and history.recompute_rows:
        r_est *= base_rows / history.recompute_rows
    how = (f"maintain ≈ {m_est:.2f} s ({fixed:.2f} s + {changes:,} changes × "
           f"{per * 1e6:.0f} µs) vs recompute ≈ {r_est:.2f} s (measured "
           f"{history.recompute_seconds:.2f} s over {history.recompute_rows or 0:,} rows, "
           f"now {base_rows or 0:,})")
    if history.recompute_at_create and history.maintain and m_est >= CALIBRATE * r_est:
        # create_view's timing includes a cold start (measured up to 3× a later refresh's):
        # when maintenance is within reach of it, one recomputation calibrates the estimate
        return Decision("recompute", how + "; recomputing once to time a refresh (the "
                        "recomputation was only timed by create_view)", m_est, r_est)
    if m_est <= r_est:
        return Decision("id", how, m_est, r_est)
    return Decision("recompute", how, m_est, r_est)
