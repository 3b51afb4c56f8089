"""Cost-based refresh: maintain (run the Δ-script) or recompute, estimated before running.

A pure model over what a backend records per view (``History``): the seconds a recomputation
took and how many base-table rows it read, and the seconds each maintenance took for how many
change-feed rows on which engine. A maintenance is modelled per engine as ``fixed + per_change
× changes`` (the fixed part is the engine's floor — fold the feeds, size the i-diffs, commit —
and the rest grows with the i-diffs); a recomputation as ``seconds_per_row × base rows``. With
no measurement yet, an engine's floor and per-change cost are its ``ENGINE_DEFAULTS``. The
per-change cost is learned only from batches at least a quarter the size of the one estimated
(sizes compared in powers of two, ``size_class``):
a refresh's cost is not linear in its changes (the buckets a batch touches saturate), so a rate
seen on a few hundred changes overstates the cost of ten thousand.

Both backends use this one model: Spark keeps a view's ``History`` in its registry (``as_dict``)
and estimates a maintenance on the engine it would run on (``spark`` or ``driver``);
PostgreSQL derives it from the view's rows of the companion's ``refresh_history`` table
(``History.of_runs``) and estimates a maintenance on ``postgres``.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, NamedTuple

from idivm.errors import IdivmError
from idivm.planner.model import Strategy

Choice = Literal["id", "recompute"]
RefreshStrategy = Literal["auto", "id", "tuple", "recompute"]
REFRESH_STRATEGIES: tuple[RefreshStrategy, ...] = ("auto", "id", "tuple", "recompute")
RECOMPUTED = ("recompute", "create")  # history runs that computed the view from its tables

DEFAULT_FIXED = 1.0  # seconds: a Spark refresh's floor, measured at 0.4–1 s (README)
DEFAULT_PER_CHANGE = 1.5e-4  # seconds per change-feed row (V′ under a 1% batch at 5M links)
# engine: (floor, per change) before anything is measured; the driver (DuckDB) figures are
# the 1M-link benchmark's (0.3–0.45 s for 200 changes, ~25 µs per change up to 10k changes)
# PostgreSQL's (the compiled function): ~1.4 ms with nothing pending, 4–5 ms for one change;
# TPC-H SF 1 batches of 2,800–23,700 log rows take 25–250 ms warm (`idivm bench tpch`), 1.4–15
# µs a change (Q17 1.4, Q9 3.8, Q3 6.8, Q18 7.7, Q21 12, Q20 15); `idivm bench pg`'s 20,000
# price updates 0.6–1.8 s (30–90 µs, V′'s wide joins). The rate is a prior the first
# maintenance of a size corrects (the ``explore`` verdict): too high a one keeps a view
# recomputing without ever measuring its Δ-script (TPC-H SF 1 Q17 at 20 µs: 18,000 changes
# estimated at 0.37 s against a 45–62 ms recomputation; it maintains in 15–25 ms)
ENGINE_DEFAULTS = {"spark": (DEFAULT_FIXED, DEFAULT_PER_CHANGE), "driver": (0.3, 3e-5),
                   "postgres": (0.005, 1e-5)}
KEEP = 8  # maintenance samples kept per view
LARGE = 1024  # changes: a maintenance large enough to show a per-change rate
# a view whose caches are stale (PostgreSQL: the last refresh recomputed the view alone) is
# maintained again only if the Δ-script's estimate plus its rebuild (every stored relation
# recomputed) spread over this many refreshes stays below recomputing
AMORTIZE = KEEP
REBUILD_DEFAULT = 2.0  # × the recomputation: a rebuild's estimate before one is measured
CALIBRATE = 0.4  # maintain estimate / create-time recompute above which a recompute is timed
EXPLORE = 4.0  # an unmeasured maintenance estimated within this factor of recompute runs once
# maintenances of a size an engine's estimate rests on before the explore rule trusts it: on
# PostgreSQL a session's second to fifth runs of the compiled function plan each statement
# for its parameters (PL/pgSQL's custom plans), so one warm run is not yet what the session
# pays (TPC-H SF 0.1 Q17: 14 ms in its second run, 2–5 ms from its third, against a
# recomputation of ~8 ms — one sample recomputed it for good, its caches then stale)
FEW = {"postgres": 3}


def few(engine: str) -> int:
    """``FEW``'s count for ``engine`` (one elsewhere)."""
    return FEW.get(engine, 1)


@dataclass(frozen=True)
class History:
    recompute_seconds: float | None = None
    recompute_rows: int | None = None  # base-table rows the recomputation read
    maintain: tuple[tuple[int, float, str], ...] = ()  # (changes, seconds, engine), newest last
    recompute_at_create: bool = False  # the recomputation was only timed by create_view
    # the caches below the view: seconds to recompute them and the view (a *rebuild*), and
    # whether they are stale now (the Δ-script then rebuilds them first)
    rebuild_seconds: float | None = None
    caches_stale: bool = False
    # every maintenance sample is a cold run (its session's first, which plans every
    # statement): an upper bound of what a session that already ran the code pays
    cold_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"recompute_seconds": self.recompute_seconds,
                "recompute_rows": self.recompute_rows,
                "maintain": [list(x) for x in self.maintain],
                "recompute_at_create": self.recompute_at_create,
                "rebuild_seconds": self.rebuild_seconds, "caches_stale": self.caches_stale,
                "cold_only": self.cold_only}

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> History:
        if not d:
            return History()
        return History(d.get("recompute_seconds"), d.get("recompute_rows"),
                       tuple((int(x[0]), float(x[1]), str(x[2]) if len(x) > 2 else "spark")
                             for x in d.get("maintain", ())),
                       bool(d.get("recompute_at_create", False)), d.get("rebuild_seconds"),
                       bool(d.get("caches_stale", False)), bool(d.get("cold_only", False)))

    @staticmethod
    def of_runs(runs: Iterable[tuple[str, int, float, int | None]
                               | tuple[str, int, float, int | None, bool]],
                engine: str = "postgres") -> History:
        """The history of a view's recorded refreshes, oldest first: (what ran — ``id`` or
        ``tuple`` (the Δ-script, on ``engine``), ``recompute``, ``rebuild`` (the caches and
        the view recomputed), or ``create`` (the materialization by create_view) —, changes,
        seconds, base-table rows[, cold]). The newest recomputation (or creation) is the
        recomputation's measurement, the newest rebuild the rebuild's; the Δ-script
        runs that consumed changes are the maintenance samples (the newest ``KEEP``). A
        *cold* run — a session's first of the view's code, which plans every statement — is
        a sample only while no warm one is known (a scheduler that connects per refresh
        only has cold ones, and they are its cost)."""
        h = History()
        listed = list(runs)
        warm = any(len(r) < 5 or not r[4] for r in listed
                   if r[0] not in RECOMPUTED and r[1] > 0)
        for r in listed:
            what, changes, seconds, rows = r[:4]
            if what in RECOMPUTED:
                h = h.with_recompute(float(seconds), None if rows is None else int(rows),
                                     at_create=what == "create")
            elif what == "rebuild":
                h = replace(h, rebuild_seconds=float(seconds))
            elif changes > 0 and not (warm and len(r) > 4 and r[4]):
                h = h.with_maintain(int(changes), float(seconds), engine)
        return replace(h, cold_only=bool(h.maintain) and not warm)

    def unsampled(self) -> tuple[Any, ...]:
        """The fields but the maintenance samples (``threshold``'s key beside those it
        reads)."""
        return tuple(getattr(self, f) for f in _UNSAMPLED)

    def with_maintain(self, changes: int, seconds: float, engine: str = "spark") -> History:
        return replace(self, maintain=(*self.maintain, (changes, seconds, engine))[-KEEP:])

    def with_recompute(self, seconds: float, rows: int | None,
                       at_create: bool = False) -> History:
        return replace(self, recompute_seconds=seconds, recompute_rows=rows,
                       recompute_at_create=at_create)


_UNSAMPLED = tuple(f.name for f in fields(History) if f.name != "maintain")


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


def engine_defaults(engine: str) -> tuple[float, float]:
    """``(fixed, per_change)`` seconds of ``engine`` before anything is measured (an engine
    without its own: Spark's)."""
    return ENGINE_DEFAULTS.get(engine, ENGINE_DEFAULTS["spark"])


def maintain_model(samples: Sequence[tuple[int, float] | tuple[int, float, str]],
                   changes: int = 0, engine: str = "spark") -> tuple[float, float]:
    """``(fixed, per_change)`` of ``engine`` from its earlier maintenances (samples without an
    engine are Spark's): the floor is the fastest run's time less its changes at the
    per-change rate; the rate is the steepest (seconds - floor) / changes among runs large
    enough to show it (of ``LARGE`` changes or more, and at least a quarter of ``changes``,
    each run counted at its ``size_class``), else the default."""
    own = _own(samples, engine)
    return _model(own, _rates(own, engine)[_large_from(own, changes)], engine)


def _own(samples: Sequence[tuple[int, float] | tuple[int, float, str]], engine: str
         ) -> list[tuple[int, float]]:
    """``engine``'s samples as (changes, seconds), by changes."""
    return sorted((x[0], x[1]) for x in samples
                  if (x[2] if len(x) > 2 else "spark") == engine)


def _large_from(own: Sequence[tuple[int, float]], changes: int) -> int:
    """The first of ``own`` (by changes) large enough to show the rate at ``changes``."""
    return bisect.bisect_left(own, (_class_from(max(LARGE, changes // 4)),))


def _rates(own: Sequence[tuple[int, float]], engine: str) -> list[float]:
    """``maintain_model``'s per-change rate over ``own`` (by changes) whose samples from k on
    are the large ones, for each k from 0 to ``len(own)`` (none large: the default rate)."""
    default_per = engine_defaults(engine)[1]
    if not own:
        return [default_per]
    fixed0 = min(s for _, s in own)
    out = [default_per]
    for n, s in reversed(own):  # the steepest from k on, k descending
        r = max(0.0, s - fixed0) / n
        out.append(r if len(out) == 1 or r > out[-1] else out[-1])
    return out[::-1]


def _model(own: Sequence[tuple[int, float]], per: float, engine: str) -> tuple[float, float]:
    """``maintain_model`` over ``own`` at the rate ``per``: the floor that goes with it."""
    if not own:
        return engine_defaults(engine)[0], per
    small = [(n, s) for n, s in own if n < LARGE] or own
    return max(0.0, min(s - per * n for n, s in small)), per


def choose_engine(changes: int, history: History, threshold: int, ceiling: int
                  ) -> tuple[str, str]:
    """Where a maintenance of ``changes`` change-feed rows runs, ``driver`` or ``spark``, and
    why: the engine estimated cheaper once both have been measured on batches large enough to
    trust their per-change rates (``maintain_model``: ≥ ``LARGE`` changes and ≥ a quarter of
    this batch); until then the driver up to ``threshold`` changes; never above ``ceiling``
    (the driver holds the i-diffs in its memory)."""
    if changes > ceiling:
        return "spark", f"{changes:,} changes > {ceiling:,}: too many for the driver's memory"
    floor = _class_from(max(LARGE, changes // 4))
    if all(any(x[2] == e and x[0] >= floor for x in history.maintain)
           for e in ("driver", "spark")):
        est = {}
        for e in ("driver", "spark"):
            fixed, per = maintain_model(history.maintain, changes, e)
            est[e] = fixed + per * changes
        best = min(est, key=lambda e: est[e])
        return best, (f"{changes:,} changes: driver ≈ {est['driver']:.2f} s vs Spark ≈ "
                      f"{est['spark']:.2f} s (each learned from this view's refreshes)")
    if changes > threshold:
        return "spark", (f"{changes:,} changes > {threshold:,}: large enough for Spark's "
                         "executors (not yet measured on both engines at this size)")
    return "driver", (f"{changes:,} changes ≤ {threshold:,}: DuckDB on the driver (no Spark "
                      "job)")


class _Verdict(NamedTuple):
    """``decide``'s choice for an ``auto`` refresh and what it rests on (no text: the
    threshold evaluates it at many sizes; a tuple, built in a third of a frozen dataclass's
    time)."""

    choice: Choice
    rule: Literal["unmeasured", "calibrate", "cheaper", "explore", "warm", "dearer", "rebuild",
                  "stale"]
    fixed: float
    per: float
    maintain: float
    recompute: float | None


def _verdict(changes: int, base_rows: int | None, history: History, engine: str,
             warm_session: bool = False, model: tuple[float, float] | None = None
             ) -> _Verdict:
    """``model``: ``maintain_model``'s (fixed, per) at ``changes``, when the caller has it."""
    fixed, per = model or maintain_model(history.maintain, changes, engine)
    m_est = fixed + per * changes
    if history.recompute_seconds is None:
        return _Verdict("id", "unmeasured", fixed, per, m_est, None)
    r_est = history.recompute_seconds
    if base_rows and history.recompute_rows:
        r_est *= base_rows / history.recompute_rows
    if history.caches_stale:
        # maintaining starts with a rebuild: worth it when the refreshes after it repay it
        if m_est + rebuild_estimate(history, r_est) / AMORTIZE <= r_est:
            return _Verdict("id", "rebuild", fixed, per, m_est, r_est)
        return _Verdict("recompute", "stale", fixed, per, m_est, r_est)
    if history.recompute_at_create and history.maintain and m_est >= CALIBRATE * r_est \
            and engine != "postgres":
        # create_view's timing on Spark includes a cold start (measured up to 3× a later
        # refresh's): when maintenance is within reach of it, one recomputation calibrates the
        # estimate. (On PostgreSQL create_view times the materialization a recomputation
        # runs again — every stored relation — so it is the measurement.)
        return _Verdict("recompute", "calibrate", fixed, per, m_est, r_est)
    if m_est <= r_est:
        return _Verdict("id", "cheaper", fixed, per, m_est, r_est)
    if history.cold_only and warm_session and \
            engine_defaults(engine)[0] + per * changes < EXPLORE * r_est:
        # measured only by cold runs, whose floor is mostly the planning of every statement
        # (TPC-H SF 0.1 Q20: 66 ms cold, 11–24 ms warm, against a 12–33 ms recomputation;
        # Q22: 195 ms cold, 10–20 ms warm): where the session has already run the code and the
        # batch is within reach at the engine's default floor, maintaining once measures what
        # it pays from now on
        return _Verdict("id", "warm", fixed, per, m_est, r_est)
    if m_est < EXPLORE * r_est and _measured(changes, history, engine) < few(engine):
        # the estimate rests on the engine's defaults or on fewer than ``few(engine)``
        # maintenances measured at this size: within reach of recomputing, maintaining once
        # more measures it (a recomputation never would, and the next decision learns it)
        return _Verdict("id", "explore", fixed, per, m_est, r_est)
    return _Verdict("recompute", "dearer", fixed, per, m_est, r_est)


def _measured(changes: int, history: History, engine: str) -> int:
    """How many of ``engine``'s maintenances were measured at a size comparable to
    ``changes``: whose size class (``size_class``) is at least a quarter of it."""
    least = _class_from(changes // 4)
    return sum(x[2] == engine and x[0] >= least for x in history.maintain)


def _class_from(least: int) -> int:
    """The smallest size whose ``size_class`` is at least ``least``: the power of two at or
    above it (0 for none)."""
    return 1 << (least - 1).bit_length() if least > 0 else 0


def size_class(changes: int) -> int:
    """The power of two at or below ``changes`` (0 for none): the size the model counts a
    maintenance at where it compares sizes (the explore rule, the runs a per-change rate is
    learned from). Batches of one workload vary by a few percent (TPC-H SF 0.1's
    0.1%: 560–650 log rows a refresh); measured in classes, a view's largest sizes — what
    ``threshold``'s search reads of its samples — move when a batch doubles, not at every
    refresh (which searched again at 33 of 60 refreshes of 1.5–4 ms, at ~0.3 ms each)."""
    return 1 << (changes.bit_length() - 1) if changes > 0 else 0


def rebuild_estimate(history: History, recompute: float) -> float:
    """Seconds to recompute the caches and the view (``recompute``: the view's estimate)."""
    if history.rebuild_seconds is None or not history.recompute_seconds:
        return REBUILD_DEFAULT * recompute
    return max(recompute, history.rebuild_seconds * recompute / history.recompute_seconds)


def decide(strategy: RefreshStrategy, changes: int, base_rows: int | None,
           history: History, engine: str = "spark", warm_session: bool = False, *,
           model: tuple[float, float] | None = None) -> Decision:
    """The refresh to run for ``changes`` change-feed rows over tables of ``base_rows`` rows,
    a maintenance running on ``engine``; ``warm_session``: in a session that has already run
    the view's code (its statements planned); ``model``: ``maintain_model``'s at ``changes``,
    when the caller has it."""
    if strategy in ("id", "tuple"):
        return Decision("id", f"strategy={strategy!r} forces maintenance")
    if strategy == "recompute":
        return Decision("recompute", "strategy='recompute' forces recomputation")
    v = _verdict(changes, base_rows, history, engine, warm_session, model)
    if v.recompute is None:
        return Decision("id", "no recomputation measured yet: maintain", v.maintain, None)
    how = (f"maintain ≈ {_secs(v.maintain)} on {engine} ({_secs(v.fixed)} + {changes:,} "
           f"changes × {v.per * 1e6:.0f} µs) vs recompute ≈ {_secs(v.recompute)} (measured "
           f"{_secs(history.recompute_seconds or 0.0)} over {_rows(history.recompute_rows)} "
           f"rows, now {_rows(base_rows)})")
    if v.rule == "calibrate":
        how += ("; recomputing once to time a refresh (the recomputation was only timed by "
                "create_view)")
    elif v.rule == "warm":
        how += ("; maintaining once in this session to measure a warm run (every maintenance "
                "measured so far was its session's first, which plans every statement)")
    elif v.rule == "explore":
        how += ("; maintaining once to measure it (no maintenance of this view measured at "
                "this size yet)" if not _measured(changes, history, engine) else
                f"; maintaining again to measure it (fewer than {few(engine)} maintenances of "
                "this view measured at this size)")
    elif v.rule in ("rebuild", "stale"):
        how += (f"; the caches are stale (a recomputation refreshed the view alone): "
                f"maintaining first rebuilds them (≈ "
                f"{_secs(rebuild_estimate(history, v.recompute))}, counted over {AMORTIZE} "
                "refreshes)")
    return Decision(v.choice, how, v.maintain, v.recompute)


@dataclass(frozen=True)
class Threshold:
    """``decide`` resolved ahead of the count of changes: maintain a batch of up to
    ``max_changes`` change-feed rows (every batch when None), recompute a larger one. A
    backend that counts its pending changes only where it refreshes (PostgreSQL's compiled
    function) applies it there, with no round trip for the count."""

    max_changes: int | None
    reason_id: str  # why maintaining, at the largest batch maintained
    reason_recompute: str  # why recomputing, at the smallest batch recomputed

    def choice(self, changes: int) -> Choice:
        return "id" if self.max_changes is None or changes <= self.max_changes else "recompute"

    def as_dict(self) -> dict[str, Any]:
        return {"choice": "auto", "max_changes": self.max_changes,
                "reason_id": self.reason_id, "reason_recompute": self.reason_recompute}

    @functools.cached_property
    def json(self) -> str:
        """``as_dict`` as JSON text (kept: a threshold's search is, and so its text)."""
        return json.dumps(self.as_dict())


LARGEST_BATCH = 1 << 48  # change-feed rows: beyond any batch a refresh consumes


def threshold(base_rows: int | None, history: History, engine: str = "postgres",
              warm_session: bool = False) -> Threshold:
    """``decide("auto", n, …)`` for every batch size n at once: the first n it recomputes
    (maintaining any smaller batch) becomes ``max_changes + 1``. Between consecutive sizes
    where the model's inputs change (``_breaks``: the per-change rate, the batches measured at
    a comparable size) its maintenance estimate grows with n and nothing else moves, so
    ``decide`` turns from id to recompute at most once there: each such interval is checked
    at its ends and bisected where it turns. (Where ``decide`` would maintain a
    batch larger than one it recomputes — exploring a size never measured although a smaller
    one already costs more than recomputing — the threshold recomputes: the larger costs
    more still.)

    What ``decide`` reads of the history at any size is the intervals, each one's model, the
    largest batch measured and the history's other fields, not its samples one by one: the
    search is kept for those (``_searched``), so a refresh whose new sample moves neither
    model nor the largest batch — most of them — reuses it (40–120 µs of model evaluations
    and reasons saved on a 1–3 ms refresh)."""
    own = _own(history.maintain, engine)
    points = tuple(sorted({1, LARGEST_BATCH, *_breaks([n for n, _ in own], engine)}))
    if not own or own[-1][0] < LARGE:  # (no sample large enough for a rate: the default's)
        fits: tuple[tuple[float, float], ...] = \
            (_model(own, engine_defaults(engine)[1], engine),) * (len(points) - 1)
    else:
        rates = _rates(own, engine)  # k → maintain_model's rate, the samples from k on large
        fits = tuple(_model(own, rates[_large_from(own, lo)], engine) for lo in points[:-1])
    seen = _seen(own, engine) or history.maintain[:1]
    key = (base_rows, history.unsampled(), seen, engine, warm_session, points, fits)
    kept = _SEARCHED.get(key)
    if kept is None:
        if len(_SEARCHED) >= SEARCHES_KEPT:
            _SEARCHED.clear()
        kept = _SEARCHED[key] = _searched(base_rows, replace(history, maintain=seen),
                                          engine, warm_session, points, key[-1])
    return kept


def _seen(own: Sequence[tuple[int, float]], engine: str) -> tuple[tuple[int, float, str], ...]:
    """The engine's samples (by changes) as ``decide`` reads them beside a given model: the
    explore rule counts those at least a quarter of a batch's size — fewer than ``few`` of
    them where the ``few``-th largest is smaller, none where the largest is — and its reason
    tells none from some. So the largest and ``few - 1`` times the ``few``-th largest, each
    as its ``size_class``: the same verdicts and reasons at every size, and a key that moves
    less often than the ``few`` largest themselves (a refresh whose sample moves neither
    reuses the search)."""
    k = few(engine)
    if len(own) <= k or k == 1:
        return tuple((size_class(n), 0.0, engine) for n, _ in own[-k:])
    return ((size_class(own[-k][0]), 0.0, engine),) * (k - 1) + \
        ((size_class(own[-1][0]), 0.0, engine),)


# threshold's searches by what they read (``_searched``): a refresh whose sample moves none of
# it reuses the search (its key: the history without its samples, those ``_seen`` reads, the
# intervals and their models)
_SEARCHED: dict[tuple[Any, ...], Threshold] = {}
SEARCHES_KEPT = 256


def _searched(base_rows: int | None, history: History, engine: str, warm_session: bool,
              points: tuple[int, ...], fits: tuple[tuple[float, float], ...]) -> Threshold:
    """``threshold``'s search: ``points`` bound its intervals, ``fits[i]`` the model of the
    one from ``points[i]``; ``history``'s samples only as ``decide`` reads them beside a
    given model."""
    def fit(n: int) -> tuple[float, float]:  # maintain_model's at n: its interval's
        return fits[bisect.bisect_right(points, n) - 1]

    def verdict(n: int, model: tuple[float, float]) -> _Verdict:
        return _verdict(n, base_rows, history, engine, warm_session, model)

    first: int | None = None
    for lo, hi, model in zip(points, points[1:], fits, strict=False):
        if verdict(hi - 1, model).choice == "id":
            continue  # (maintained at its end: at every size of it, as it turns only once)
        at_lo = verdict(lo, model)
        if at_lo.choice == "recompute":
            first = lo
            break
        a, b = lo, hi - 1  # maintained at a, recomputed at b
        for g in _turns(at_lo, history, engine):  # (where it may turn: narrows, or not)
            if a < g < b:
                a, b = (g, b) if verdict(g, model).choice == "id" else (a, g)
        while b - a > 1:
            mid = (a + b) // 2
            a, b = (mid, b) if verdict(mid, model).choice == "id" else (a, mid)
        first = b
        break

    def reason(n: int) -> str:
        return decide("auto", n, base_rows, history, engine, warm_session,
                      model=fit(n)).reason

    if first is None:
        return Threshold(None, reason(LARGEST_BATCH - 1), "")
    return Threshold(first - 1, reason(first - 1) if first > 1 else "", reason(first))


def _breaks(own: Sequence[int], engine: str) -> list[int]:
    """The batch sizes where ``_verdict``'s inputs other than the size change: ``4 (c + 1)``
    for the ``size_class`` c of each measured maintenance of ``LARGE`` changes or more (from
    there on ``maintain_model`` leaves it out of the per-change rate) and of the largest and
    the ``few``-th largest (from there on none, or fewer than ``few``, was measured at a
    comparable size: the ``explore`` rule). Between them its maintenance estimate grows with
    the size and nothing else moves. (Every sample's would do, with as many more intervals
    for ``threshold`` to check.) ``own``: the sizes of ``engine``'s samples, ascending."""
    tops = (own[-1], own[-few(engine)]) if len(own) >= few(engine) else own
    ends = {4 * (size_class(n) + 1) for n in own if n >= LARGE} | \
        {4 * (size_class(n) + 1) for n in tops}
    return [n for n in ends if n < LARGEST_BATCH]


def _turns(v: _Verdict, history: History, engine: str) -> list[int]:
    """The batch sizes, within an interval whose model ``v`` shows, next to which ``decide``
    may turn from id to recompute: where the maintenance estimate (``fixed + per n``, or the
    engine's default floor's ``+ per n`` of the warm rule) meets each bound a rule compares it
    with — the recomputation, ``EXPLORE`` and ``CALIBRATE`` times it, the recomputation less
    the stale caches' amortized rebuild. The threshold tests them first and bisects what is
    left (a few evaluations instead of ~50 across a 2^48 interval); they only narrow the
    bisection, so the threshold is the same with or without them."""
    if v.recompute is None or v.per <= 0:
        return []
    bounds = [(v.fixed, v.recompute * k) for k in (1.0, EXPLORE, CALIBRATE)]
    bounds.append((engine_defaults(engine)[0], EXPLORE * v.recompute))
    if history.caches_stale:
        bounds.append((v.fixed, v.recompute - rebuild_estimate(history, v.recompute) / AMORTIZE))
    out: list[int] = []
    for floor, bound in bounds:
        n = (bound - floor) / v.per
        if 0 < n < LARGEST_BATCH:
            out += [int(n), int(n) + 1]
    return out


def planned(strategy: RefreshStrategy) -> Strategy:
    """The planner's strategy for a view's refresh strategy (``auto`` plans the ID-based
    Δ-script and may recompute instead)."""
    if strategy not in REFRESH_STRATEGIES:
        raise IdivmError(f"strategy must be auto, id, tuple or recompute, not {strategy!r}")
    return "id" if strategy == "auto" else strategy


def _secs(x: float) -> str:
    """Seconds as a reason shows them: milliseconds below 0.1 s (a PostgreSQL refresh)."""
    return f"{x * 1e3:.1f} ms" if x < 0.1 else f"{x:.2f} s"


def _rows(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"
