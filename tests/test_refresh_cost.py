"""The cost-based refresh model alone: forced strategies, estimates, learning, calibration."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idivm.errors import IdivmError
from idivm.refresh_cost import (
    AMORTIZE,
    DEFAULT_PER_CHANGE,
    ENGINE_DEFAULTS,
    FEW,
    KEEP,
    LARGE,
    REBUILD_DEFAULT,
    History,
    choose_engine,
    decide,
    engine_defaults,
    maintain_model,
    planned,
    size_class,
    threshold,
)


def test_forced_strategies_ignore_estimates() -> None:
    h = History(recompute_seconds=0.001, recompute_rows=10)
    assert decide("id", 10**9, 10, h).choice == "id"
    assert decide("tuple", 10**9, 10, h).choice == "id"
    assert decide("recompute", 0, 10, h).choice == "recompute"


def test_auto_compares_maintain_and_scaled_recompute() -> None:
    h = History(recompute_seconds=10.0, recompute_rows=1_000_000)
    small = decide("auto", 200, 1_000_000, h)
    assert small.choice == "id" and small.maintain_estimate < small.recompute_estimate
    big = decide("auto", 1_000_000, 1_000_000, h)
    assert big.choice == "recompute"
    # a recomputation grows with the tables: twice the rows, twice the estimate
    assert decide("auto", 200, 2_000_000, h).recompute_estimate == 20.0


def test_model_learns_floor_and_rate() -> None:
    assert maintain_model(()) == (1.0, DEFAULT_PER_CHANGE)
    fixed, per = maintain_model(((200, 2.0), (10_000, 12.0)))
    assert per == (12.0 - 2.0) / 10_000
    assert abs(fixed - (2.0 - per * 200)) < 1e-9
    h = History(recompute_seconds=8.0, recompute_rows=100).with_maintain(200, 2.0) \
        .with_maintain(10_000, 12.0)
    assert decide("auto", 500, 100, h).choice == "id"
    assert decide("auto", 20_000, 100, h).choice == "recompute"
    assert len(History().with_maintain(1, 1.0).with_maintain(2, 1.0).maintain) == 2
    assert History.from_dict(h.as_dict()) == h


def test_create_time_recompute_is_calibrated_once() -> None:
    h = History().with_recompute(10.0, 100, at_create=True).with_maintain(10, 5.0)
    d = decide("auto", 10, 100, h)
    assert d.choice == "recompute" and "calibrate" not in d.reason and "once" in d.reason
    timed = h.with_recompute(3.0, 100)
    assert not timed.recompute_at_create
    assert decide("auto", 10, 100, timed).choice == "recompute"  # 5 s > 3 s, measured
    assert decide("auto", 10, 100, timed.with_maintain(10, 1.0)).choice == "id"


def test_model_is_per_engine_and_does_not_extrapolate_small_batches() -> None:
    """Driver and Spark refreshes are learned apart; a rate seen on batches far smaller than
    the one estimated is not trusted (the 1M-link bench: 1.2k changes in 0.47 s, then 11.6k in
    0.55 s on the driver — a rate from the first predicted 1.9 s)."""
    h = History(recompute_seconds=1.3, recompute_rows=1_200_000) \
        .with_maintain(400, 0.31, "driver").with_maintain(1198, 0.47, "driver") \
        .with_maintain(400, 9.0, "spark")
    assert decide("auto", 11_655, 1_200_000, h, "driver").choice == "id"
    assert decide("auto", 11_655, 1_200_000, h, "spark").choice == "recompute"
    fixed, per = maintain_model(h.maintain, 1198, "driver")
    assert per == (0.47 - 0.31) / 1198  # batches of its size do teach the rate
    assert maintain_model(h.maintain, 11_655, "driver")[1] == 3e-5  # the driver's default
    assert History.from_dict({"maintain": [[10, 1.0]]}).maintain == ((10, 1.0, "spark"),)


def test_engine_is_chosen_by_the_model_once_both_are_measured() -> None:
    """Small batches go to the driver until both engines have refreshed this view at a
    comparable size; then the cheaper estimate wins, either way; never the driver above the
    ceiling."""
    empty = History()
    assert choose_engine(500, empty, 20_000, 1_000_000)[0] == "driver"
    assert choose_engine(50_000, empty, 20_000, 1_000_000)[0] == "spark"
    slow_driver = empty.with_maintain(40_000, 9.0, "driver").with_maintain(300, 0.3, "driver") \
        .with_maintain(40_000, 2.0, "spark").with_maintain(300, 1.0, "spark")
    engine, why = choose_engine(15_000, slow_driver, 20_000, 1_000_000)
    assert engine == "spark" and "driver ≈" in why  # under the threshold, measured slower
    fast_driver = empty.with_maintain(40_000, 0.9, "driver").with_maintain(300, 0.3, "driver") \
        .with_maintain(40_000, 4.0, "spark").with_maintain(300, 1.0, "spark")
    assert choose_engine(60_000, fast_driver, 20_000, 1_000_000)[0] == "driver"  # above it
    assert choose_engine(2_000_000, fast_driver, 20_000, 1_000_000)[0] == "spark"
    # measured on both, but only on batches far smaller than this one: the threshold decides
    small = empty.with_maintain(300, 0.3, "driver").with_maintain(300, 1.0, "spark")
    assert choose_engine(60_000, small, 20_000, 1_000_000)[0] == "spark"


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_defaults_before_anything_is_measured() -> None:
    """A PostgreSQL maintenance starts from its own floor and rate (milliseconds, not Spark's
    second), and Spark's or the driver's samples teach it nothing."""
    fixed, per = ENGINE_DEFAULTS["postgres"]
    assert fixed < 0.01 and per < DEFAULT_PER_CHANGE
    assert maintain_model((), 0, "postgres") == (fixed, per)
    spark_only = History().with_maintain(10_000, 30.0).with_maintain(5_000, 20.0, "driver")
    assert maintain_model(spark_only.maintain, 10_000, "postgres") == (fixed, per)
    h = spark_only.with_recompute(0.2, 1_000_000)
    # 200 changes ≈ 7 ms: maintain; 100,000 ≈ 1 s: recompute (measured at 0.2 s); 30,000 ≈
    # 0.3 s, unmeasured and within reach: maintained once to measure it
    small = decide("auto", 200, 1_000_000, h, "postgres")
    assert small.choice == "id" and small.maintain_estimate == pytest.approx(fixed + 200 * per)
    assert "on postgres" in small.reason and "ms" in small.reason
    assert decide("auto", 100_000, 1_000_000, h, "postgres").choice == "recompute"
    explore = decide("auto", 30_000, 1_000_000, h, "postgres")
    assert explore.choice == "id" and "maintaining once to measure it" in explore.reason
    # one maintenance at this size is not yet what a session pays (PL/pgSQL plans a session's
    # second to fifth runs statement by statement): maintained until FEW of them are measured
    measured = h.with_maintain(30_000, 0.5, "postgres")
    again = decide("auto", 30_000, 1_000_000, measured, "postgres")
    assert again.choice == "id" and "maintaining again to measure it" in again.reason
    for _ in range(FEW["postgres"] - 1):
        measured = measured.with_maintain(30_000, 0.5, "postgres")
    assert decide("auto", 30_000, 1_000_000, measured, "postgres").choice == "recompute"
    assert decide("id", 10**9, 10, h, "postgres").choice == "id"
    assert decide("recompute", 1, 10, h, "postgres").choice == "recompute"


def test_history_of_recorded_runs() -> None:
    """``History.of_runs``: PostgreSQL's refresh_history rows, oldest first, as the model's
    history — the newest recomputation (a ``create`` marks it as create_view's timing), the
    Δ-script runs that consumed changes (tuple-based ones too) as postgres samples, the
    newest KEEP of them."""
    assert History.of_runs([]) == History()
    h = History.of_runs([("create", 0, 0.5, 1000), ("id", 0, 0.001, None),
                         ("id", 200, 0.02, 1000), ("tuple", 40, 0.03, 1000)])
    assert h.recompute_seconds == 0.5 and h.recompute_rows == 1000 and h.recompute_at_create
    assert h.maintain == ((200, 0.02, "postgres"), (40, 0.03, "postgres"))
    later = History.of_runs([("create", 0, 0.5, 1000), ("recompute", 5000, 0.3, None),
                             *[("id", k + 1, 0.01, 1000) for k in range(20)]])
    assert later.recompute_seconds == 0.3 and later.recompute_rows is None
    assert not later.recompute_at_create
    assert len(later.maintain) == KEEP and later.maintain[-1] == (20, 0.01, "postgres")
    # a recomputation measured without table sizes is not scaled by them
    d = decide("auto", 5_000, 2_000_000, later, "postgres")
    assert d.recompute_estimate == 0.3


def test_create_time_timing_is_the_measurement_on_postgres() -> None:
    """On PostgreSQL create_view's timing (a ``create`` row) is the materialization a
    recomputation runs again, not a cold start: it decides without a calibrating
    recomputation (TPC-H SF 0.1: those cost 2–25× the plain query, every cache recomputed),
    and a measured recomputation replaces it."""
    runs = [("create", 0, 0.02, 500), *[("id", 300, 0.012, 500)] * FEW["postgres"]]
    d = decide("auto", 300, 500, History.of_runs(runs), "postgres")
    assert d.choice == "id" and "once" not in d.reason
    runs.append(("recompute", 300, 0.005, 500))
    assert decide("auto", 300, 500, History.of_runs(runs), "postgres").choice == "recompute"


def test_planned_strategy() -> None:
    assert planned("auto") == "id"
    assert [planned(s) for s in ("id", "tuple", "recompute")] == ["id", "tuple", "recompute"]
    with pytest.raises(IdivmError, match="strategy must be auto, id, tuple or recompute"):
        planned("fast")  # type: ignore[arg-type]


samples = st.lists(st.tuples(st.sampled_from([1, 10, 300, 1000, 1024, 4000, 5000, 20000,
                                              150000]),
                             st.floats(0.001, 3.0)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(recompute=st.floats(0.001, 2.0), rows=st.sampled_from([None, 1000, 50000]),
       now=st.sampled_from([None, 1000, 80000]), runs=samples,
       probes=st.lists(st.integers(1, 10**7), min_size=20, max_size=20),
       stale=st.booleans(), rebuild=st.none() | st.floats(0.001, 5.0))
def test_threshold_is_decide_for_every_batch_size(recompute: float, rows: int | None,
                                                   now: int | None,
                                                   runs: list[tuple[int, float]],
                                                   probes: list[int], stale: bool,
                                                   rebuild: float | None) -> None:
    """The threshold the compiled function applies chooses as ``decide`` does at every batch
    size — except above a size ``decide`` already recomputes, where ``decide`` may still
    explore (maintain once to measure) and the threshold recomputes."""
    h = History(rebuild_seconds=rebuild, caches_stale=stale).with_recompute(recompute, rows)
    for n, s in runs:
        h = h.with_maintain(n, s, "postgres")
    t = threshold(now, h, "postgres")
    if t.max_changes is not None:
        above = decide("auto", t.max_changes + 1, now, h, "postgres")
        assert above.choice == "recompute" and t.reason_recompute == above.reason
        if t.max_changes > 0:  # (the reasons as decide gives them from the whole history)
            assert t.reason_id == decide("auto", t.max_changes, now, h, "postgres").reason
        assert all(decide("auto", n, now, h, "postgres").choice == "id"
                   for n in range(1, min(t.max_changes, 2000) + 1))
    for n in probes:
        want = decide("auto", n, now, h, "postgres").choice
        if t.max_changes is None or n <= t.max_changes:
            assert want == "id" and t.choice(n) == "id"
        else:
            assert t.choice(n) == "recompute"


def test_stale_caches_are_rebuilt_only_where_maintaining_repays_it() -> None:
    """After a recomputation of the view alone (its caches stale), maintaining costs a
    rebuild first (every stored relation recomputed: measured by the newest ``rebuild`` run,
    else ``REBUILD_DEFAULT`` × the recomputation): auto maintains again only if the
    Δ-script's estimate plus the rebuild spread over ``AMORTIZE`` refreshes is below
    recomputing — not where the Δ-script is merely a little cheaper, and it never explores
    through a rebuild."""
    runs = [("create", 0, 0.030, 1000), ("id", 10, 0.005, 1000),
            *[("id", 1500, 0.050, 1000)] * FEW["postgres"], ("recompute", 1500, 0.030, 1000)]
    h = History.of_runs(runs, "postgres")
    assert h.rebuild_seconds is None and not h.caches_stale
    fresh = decide("auto", 1500, 1000, h, "postgres")
    assert fresh.choice == "recompute" and "stale" not in fresh.reason
    stale = History.of_runs([*runs, ("rebuild", 200, 0.090, 1000)], "postgres")
    assert stale.rebuild_seconds == 0.090 and stale.maintain == h.maintain  # (not a sample)
    stale = replace(stale, caches_stale=True)
    assert History.from_dict(stale.as_dict()) == stale
    # 10 changes: maintained at ≈ 5 ms; the rebuild (90 ms) over 8 refreshes 11 ms: < 30 ms
    small = decide("auto", 10, 1000, stale, "postgres")
    assert small.choice == "id" and "rebuilds them (≈ 90.0 ms" in small.reason
    # 600 changes ≈ 23 ms maintained (the measured 30 µs a change): 23 + 11 > 30 ms
    mid = decide("auto", 600, 1000, stale, "postgres")
    assert mid.maintain_estimate is not None and mid.maintain_estimate < 0.030
    assert mid.choice == "recompute" and "caches are stale" in mid.reason
    assert decide("auto", 600, 1000, replace(stale, caches_stale=False),
                  "postgres").choice == "id"
    # unmeasured rebuild: REBUILD_DEFAULT × the recomputation, scaled by the tables' rows
    unmeasured = replace(stale, rebuild_seconds=None)
    d = decide("auto", 10, 2000, unmeasured, "postgres")
    assert f"rebuilds them (≈ {REBUILD_DEFAULT * 0.060:.2f} s" in d.reason
    assert d.maintain_estimate is not None
    assert d.choice == ("id" if d.maintain_estimate + REBUILD_DEFAULT * 0.060 / AMORTIZE
                        <= 0.060 else "recompute")
    # nothing measured at this size, within reach of recomputing: explored when fresh only
    probe = History(recompute_seconds=0.010, recompute_rows=1000)
    assert decide("auto", 300, 1000, probe, "postgres").choice == "id"
    assert decide("auto", 300, 1000, replace(probe, caches_stale=True),
                  "postgres").choice == "recompute"


def test_threshold_without_a_measured_recomputation_maintains_everything() -> None:
    t = threshold(1000, History().with_maintain(500, 0.01, "postgres"))
    assert t.max_changes is None and t.choice(10**9) == "id"
    assert t.as_dict()["choice"] == "auto" and t.as_dict()["max_changes"] is None


def test_cold_runs_count_only_while_no_warm_one_is_known() -> None:
    """A session's first run of a view's code plans its statements: its time is a sample only
    until a warm run is recorded (a scheduler connecting per refresh has only cold ones)."""
    cold_only = History.of_runs([("create", 0, 0.05, 10), ("id", 2000, 0.060, 10, True)])
    assert cold_only.maintain == ((2000, 0.060, "postgres"),)
    both = History.of_runs([("create", 0, 0.05, 10), ("id", 2000, 0.060, 10, True),
                            ("id", 1900, 0.015, 10, False), ("id", 1800, 0.070, 10, True)])
    assert both.maintain == ((1900, 0.015, "postgres"),)


def test_a_warm_session_measures_a_warm_run_before_trusting_cold_ones() -> None:
    """Cold runs plan every statement (TPC-H SF 0.1 Q20: 66 ms cold, 11–24 ms warm, against
    a 12–33 ms recomputation): while they are the only samples, a session that has already
    run the code maintains once to measure itself, where the cold estimate is within reach
    of recomputing; a new session (a scheduler connecting per refresh) pays the cold cost."""
    cold = History.of_runs([("create", 0, 0.030, 1000),
                            *[("id", 300, 0.066, 1000, True)] * FEW["postgres"]])
    assert cold.cold_only and cold.maintain == ((300, 0.066, "postgres"),) * FEW["postgres"]
    assert not History.of_runs([("create", 0, 0.03, 1000), ("id", 300, 0.066, 1000, True),
                                ("id", 300, 0.015, 1000, False)]).cold_only
    assert decide("auto", 300, 1000, cold, "postgres").choice == "recompute"
    warm = decide("auto", 300, 1000, cold, "postgres", warm_session=True)
    assert warm.choice == "id" and "measure a warm run" in warm.reason
    assert threshold(1000, cold, "postgres", warm_session=True).choice(300) == "id"
    assert threshold(1000, cold, "postgres").choice(300) == "recompute"
    # a cold floor far above recomputing is still explored (it is mostly planning), but not
    # a batch out of reach at the engine's default floor and rate (5 ms + 10 µs a change)
    far = History.of_runs([("create", 0, 0.004, 1000), ("id", 300, 0.200, 1000, True)])
    assert decide("auto", 300, 1000, far, "postgres", warm_session=True).choice == "id"
    assert decide("auto", 30_000, 1000, far, "postgres", warm_session=True
                  ).choice == "recompute"
    assert History.from_dict(cold.as_dict()) == cold


def test_threshold_is_kept_while_what_decide_reads_is_unchanged() -> None:
    """A refresh with nothing pending leaves the history as it was, and a new sample that moves
    neither the model (its floor, its rate) nor the size classes of the ``FEW`` largest
    batches measured (the explore rule counts them) leaves what
    ``decide`` reads of it as it was: the next decision is the threshold already computed
    (the same object); a sample that moves either computes another."""
    h = History().with_recompute(0.1, 1000)
    for _ in range(FEW["postgres"]):
        h = h.with_maintain(500, 0.01, "postgres")
    t = threshold(1000, h, "postgres", True)
    assert threshold(1000, History.from_dict(h.as_dict()), "postgres", True) is t
    # 300 changes in 12 ms: neither the floor (10 ms - 500 x 10 µs) nor the largest batches
    assert threshold(1000, h.with_maintain(300, 0.012, "postgres"), "postgres", True) is t
    # a larger batch of the same size class (256–511: the explore rule's measure)
    assert threshold(1000, h.with_maintain(510, 0.012, "postgres"), "postgres", True) is t
    h2 = h.with_maintain(4000, 0.02, "postgres")
    t2 = threshold(1000, h2, "postgres", True)
    assert t2 is not t  # (the largest batch moved)
    assert decide("auto", (t2.max_changes or 0) + 1, 1000, h2, "postgres", True
                  ).choice == "recompute"
    assert threshold(1000, h.with_maintain(100, 0.001, "postgres"), "postgres",
                     True) is not t  # (a lower floor)


def _model_by_definition(samples: list[tuple[int, float, str]], changes: int,
                         engine: str) -> tuple[float, float]:
    """``maintain_model`` as its docstring states it, sample by sample."""
    default_fixed, default_per = engine_defaults(engine)
    own = [(n, s) for n, s, e in samples if e == engine]
    if not own:
        return default_fixed, default_per
    fixed0 = min(s for _, s in own)
    big = [(n, s) for n, s in own if size_class(n) >= max(LARGE, changes // 4)]
    per = max(max(0.0, s - fixed0) / n for n, s in big) if big else default_per
    small = [(n, s) for n, s in own if n < LARGE] or own
    return max(0.0, min(s - per * n for n, s in small)), per


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(st.tuples(st.sampled_from([1, 10, 300, 999, 1000, 1001, 1023, 1024, 1025,
                                                4000, 4096, 20000]),
                               st.floats(0.0, 3.0), st.sampled_from(["postgres", "spark"])),
                     max_size=9),
       changes=st.sampled_from([0, 1, 3999, 4000, 4004, 4096, 4100, 16000, 16384, 80000, 10**7]),
       engine=st.sampled_from(["postgres", "spark"]))
def test_maintain_model_is_its_definition(runs: list[tuple[int, float, str]], changes: int,
                                          engine: str) -> None:
    """The model the threshold evaluates at every interval (the per-change rates of all
    sizes in one pass over the samples by size) is the one its definition states."""
    assert maintain_model(runs, changes, engine) == pytest.approx(
        _model_by_definition(runs, changes, engine))
