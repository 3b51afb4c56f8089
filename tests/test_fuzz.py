"""The random-view differential fuzzer (``idivm fuzz``): its generators are deterministic by
seed and produce valid SQL, its shrinker reduces a failing case, and a fixed-seed run on every
backend finds nothing (PostgreSQL id + tuple, fresh views, a tiny Spark sample)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idivm.cli import main
from idivm.fuzz import FuzzConfig, Txn, random_case
from idivm.fuzz.oracle import (
    Hang,
    classify,
    create_schema,
    deadline,
    documented,
    drop_schema,
    new_schema_name,
    validate,
)
from idivm.fuzz.run import FuzzOptions, fuzz
from idivm.fuzz.shrink import Repro, shrink, view_candidates

# Fixed seeds of the CI runs (seeds that found something are listed in the fuzzer's report).
PG_SEED, PG_VIEWS = 1000, 24
FRESH_SEED, FRESH_VIEWS = 2000, 6
SPARK_SEED, SPARK_VIEWS = 3004, 2


def test_generator_is_deterministic_by_seed() -> None:
    a = random_case(7, FuzzConfig(), 6, 3)
    b = random_case(7, FuzzConfig(), 6, 3)
    c = random_case(8, FuzzConfig(), 6, 3)
    assert a == b
    assert a.views != c.views
    assert 2 <= len(a.schema.tables) <= 6
    assert all(t.primary_key for t in a.schema.tables)


def test_generator_covers_the_supported_constructs() -> None:
    text = " ".join(v for s in range(80) for v in random_case(s, FuzzConfig(), 5, 0).views)
    for construct in ("LEFT JOIN", "RIGHT JOIN", "FULL JOIN", " JOIN ", "GROUP BY", "HAVING",
                      "DISTINCT", "NOT EXISTS", "EXISTS", " IN (SELECT", "NOT IN (SELECT",
                      "UNION ALL", "UNION SELECT", "EXCEPT", "INTERSECT", "WITH ", "BETWEEN",
                      "CASE WHEN", "COALESCE(", "IS NULL", "AVG(", "MIN(", "MAX(", "COUNT(*)",
                      "SUM(", ") AS d", " LIKE '", " ANY (", " ALL (", "EXTRACT(",
                      "SUBSTRING(", "COUNT(DISTINCT", "AVG(DISTINCT", "GROUP BY COALESCE("):
        assert construct in text, construct
    schemas = [random_case(s, FuzzConfig(), 0, 0).schema for s in range(40)]
    ddl = " ".join(" ".join(s.ddl()) for s in schemas)
    for feature in ("ON UPDATE CASCADE", "ON DELETE CASCADE", "CREATE TRIGGER",
                    "PRIMARY KEY (k0, k1)", "numeric(8,2)", "double precision", "boolean", "date",
                    "bigint"):
        assert feature in ddl, feature
    rounds = " ".join(s for seed in range(20)
                      for r in random_case(seed, FuzzConfig(), 0, 3).rounds
                      for t in r for s in t.statements)
    for change in ("INSERT INTO", "DELETE FROM", "UPDATE ", "= NULL", "ON CONFLICT",
                   "ROLLBACK TO SAVEPOINT"):
        assert change in rounds, change


def test_generated_views_are_valid_postgresql(pg_dsn: str) -> None:
    invalid = []
    total = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for seed in range(6):
            case = random_case(seed, FuzzConfig(), 8, 0)
            name = new_schema_name()
            try:
                create_schema(conn, name, case.schema, case.setup)
                for view in case.views:
                    total += 1
                    error = validate(conn, view)
                    if error is not None:
                        invalid.append((view, error))
            finally:
                drop_schema(conn, name)
    assert len(invalid) <= total // 20, invalid


def _marker_repro() -> Repro:
    case = random_case(5, FuzzConfig(), 0, 3)
    view = ("SELECT a1.k0 AS c0, a1.k0 + 1 AS c1 FROM t0 AS a1 JOIN t1 AS a2 ON a1.k0 = a2.k0 "
            "WHERE a1.k0 > 2 AND EXISTS (SELECT 1 FROM t1 AS a3 WHERE a3.k0 = a1.k0) "
            "AND a1.k0 < 7")
    rounds = (*case.rounds, (Txn(("DELETE FROM t1 WHERE k0 = 3", "UPDATE t0 SET k0 = 9"),),))
    return Repro(case.schema, case.setup, view, "id", rounds)


def test_shrinker_reduces_to_what_the_predicate_needs() -> None:
    calls: list[Repro] = []

    def still_fails(r: Repro) -> bool:
        calls.append(r)
        stmts = [s for rnd in r.rounds for t in rnd for s in t.statements]
        return "EXISTS" in r.view and "DELETE FROM t1 WHERE k0 = 3" in stmts

    start = _marker_repro()
    out = shrink(start, still_fails, fail_round=len(start.rounds))
    assert out.setup == ()
    assert [s for rnd in out.rounds for t in rnd for s in t.statements] == \
        ["DELETE FROM t1 WHERE k0 = 3"]
    assert len(out.rounds) == 1
    assert len(out.view) < len(start.view)
    assert "JOIN" not in out.view and "a1.k0 < 7" not in out.view
    first = list(calls)
    calls.clear()
    assert shrink(start, still_fails, fail_round=len(start.rounds)) == out
    assert calls == first  # deterministic: the same questions in the same order
    assert still_fails(out)


def test_shrinker_cuts_the_rounds_after_the_failing_one() -> None:
    start = _marker_repro()
    out = shrink(start, lambda r: True, fail_round=0)
    assert out.rounds == () and out.setup == ()


def test_view_candidates_are_simpler() -> None:
    view = ("SELECT a1.k0 AS c0 FROM t0 AS a1 WHERE a1.k0 > 1 UNION ALL "
            "SELECT a2.k0 AS c0 FROM t1 AS a2")
    cands = list(view_candidates(view))
    assert "SELECT a1.k0 AS c0 FROM t0 AS a1 WHERE a1.k0 > 1" in cands
    assert "SELECT a2.k0 AS c0 FROM t1 AS a2" in cands
    assert all(len(c) < len(view) for c in cands)


def test_refusals_are_classified_by_the_readme_list() -> None:
    assert documented("window function")
    assert documented("random()")
    assert documented("NOT IN")
    assert not documented("subquery in a predicate")
    assert not documented("TABLE")


def test_a_deadline_turns_a_stuck_call_into_a_hang() -> None:
    with pytest.raises(Hang) as err, deadline(0.2):
        time.sleep(5)
    assert classify(err.value, "id", 1).status == "hang"


def test_fuzz_postgres_fixed_seed(pg_dsn: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """PostgreSQL, strategies id, tuple and auto, through the CLI: no finding."""
    code = main(["fuzz", "--backend", "pg", "--dsn", pg_dsn, "--seed", str(PG_SEED),
                 "--views", str(PG_VIEWS), "--rounds", "3", "--views-per-seed", "8",
                 "--out", str(tmp_path), "--json", "--shrink-seconds", "60"])
    out = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "summary.json").read_text())["generated"] == PG_VIEWS
    assert out["findings"] == [], out["findings"]
    assert code == 0
    assert out["valid"] >= PG_VIEWS * 0.9
    assert out["accepted"] >= out["valid"] * 0.8, out


def test_fuzz_fresh_fixed_seed(pg_dsn: str, cxx: None) -> None:
    s = fuzz(FuzzOptions(backend="fresh", dsn=pg_dsn, seed=FRESH_SEED, views=FRESH_VIEWS,
                         rounds=3, views_per_seed=FRESH_VIEWS, shrink=False))
    assert s.findings == [], s.findings
    assert s.accepted >= 1


def test_fuzz_spark_fixed_seed(pg_dsn: str, spark: Any) -> None:
    # (``spark``: the test process's session, which the fuzzer's getOrCreate reuses)
    s = fuzz(FuzzOptions(backend="spark", dsn=pg_dsn, seed=SPARK_SEED, views=SPARK_VIEWS,
                         rounds=1, views_per_seed=SPARK_VIEWS, shrink=False))
    assert s.findings == [], s.findings
    assert s.accepted >= 1
