"""bench_bsma at a tiny scale: every view under every strategy, verified (no timing asserted)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench_bsma.generate import generate
from bench_bsma.run import STRATEGIES, run
from bench_bsma.views import VIEWS_BY_NAME
from bench_bsma.workloads import WORKLOADS, State


def test_generator_is_deterministic_and_keeps_keys() -> None:
    a, b = generate(0.0002, 7), generate(0.0002, 7)
    assert {t: a.rows(t) for t in a.tables} == {t: b.rows(t) for t in b.tables}
    assert a.records("mention") == b.records("mention")
    assert generate(0.0002, 8).records("friendlist") != a.records("friendlist")
    for table, key in (("friendlist", (0, 1)), ("mention", (0, 1)), ("retweet", (0, 1)),
                       ("rel_event_microblog", (0, 1)), ("microblog", (0,))):
        rows = [tuple(r[i] for i in key) for r in a.records(table)]
        assert len(rows) == len(set(rows)), f"{table}: duplicate keys"
    mids = set(a.tables["microblog"]["mid"].tolist())
    assert set(a.tables["mention"]["mid"].tolist()) <= mids


def test_workloads_keep_the_model_consistent() -> None:
    state = State(generate(0.0002, 7))
    for i, w in enumerate(WORKLOADS):
        batch = state.batch(w, 10, i)
        assert batch, w
    assert all(c.table in ("users", "microblog", "mention", "retweet", "rel_event_microblog")
               for c in state.batch("mixed", 20, 99))


def _check(report: dict[str, Any], out: Path, workloads: list[str],
           views: list[str] | None = None) -> None:
    rows = report["measurements"]
    assert rows and all(r["verified"] for r in rows)
    assert {(r["view"], r["strategy"], r["workload"]) for r in rows} == {
        (v, s, w) for v in views or VIEWS_BY_NAME for s in STRATEGIES for w in workloads}
    assert (out / "results.json").exists() and (out / "results.md").exists()
    assert (out / f"fig10_{report['config']['backend']}.png").exists() or \
        "users" not in workloads


@pytest.mark.slow  # a benchmark harness run (correctness: the differential suites)
@pytest.mark.postgres
def test_every_view_and_strategy_on_postgres(pg_dsn: str, pg_schema: str,
                                             tmp_path: Path) -> None:
    report = run("postgres", 0.0002, tmp_path, repeat=1, d=10, cold=False, dsn=pg_dsn,
                 pg_schema=f"{pg_schema}_bsma", console=Console(file=io.StringIO()))
    _check(report, tmp_path, list(WORKLOADS))


@pytest.mark.slow  # a benchmark harness run (correctness: the differential suites)
def test_every_view_and_strategy_on_spark(spark_available: None, tmp_path: Path) -> None:
    from idivm.spark import embedded_session

    # three views (the whole set runs on PostgreSQL above): a join count, the many-to-many
    # aggregate, an aggregate over a cached join — every strategy, a mixed batch
    views = ["q7", "qs1", "qs3"]
    spark = embedded_session("local[2]")
    report = run("spark", 0.0001, tmp_path, views=views, workloads=["mixed"], repeat=1, d=8,
                 cold=False, spark=spark, console=Console(file=io.StringIO()))
    _check(report, tmp_path, ["mixed"], views)


@pytest.mark.slow  # a benchmark harness run (correctness: the differential suites)
@pytest.mark.postgres
def test_parts_devices_sweep_on_postgres(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    from bench_bsma.sweeps import VALUES, sweep

    report = sweep("postgres", ["j"], tmp_path, links=2000, repeat=1, dsn=pg_dsn,
                   pg_schema=f"{pg_schema}_sweep", console=Console(file=io.StringIO()))
    assert report["verified"]
    assert [e["value"] for e in report["sweeps"]["j"]] == VALUES["j"]
    assert (tmp_path / "sweeps_postgres.json").exists()
    assert (tmp_path / "sweep_j_postgres.png").exists()


@pytest.mark.slow  # a benchmark harness run (correctness: the differential suites)
@pytest.mark.postgres
def test_warmup_batches_are_verified_not_measured(pg_dsn: str, pg_schema: str,
                                                  tmp_path: Path) -> None:
    """``warmup``: User-workload batches before the measured ones, every view maintained and
    verified (a difference raises), none in the measurements."""
    report = run("postgres", 0.0002, tmp_path, views=["q7"], workloads=["users"], repeat=1,
                 d=5, cold=False, dsn=pg_dsn, pg_schema=f"{pg_schema}_bsma", warmup=2,
                 console=Console(file=io.StringIO()))
    assert report["config"]["warmup"] == 2
    _check(report, tmp_path, ["users"], ["q7"])
    assert len(report["measurements"]) == len(STRATEGIES)  # one measured round each
