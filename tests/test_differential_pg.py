"""Differential tests: views maintained by idivm must equal their recomputation on PostgreSQL.

Every catalogue view (tests/differential/views.py) is maintained through seeded rounds of random
DML and compared, as a multiset, with its query run from scratch. ``test_workloads_are_valid_sql``
checks the test material itself (DDL, views, DML) without idivm's maintainer.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import psycopg
import pytest
import sqlglot
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

try:
    from tests.differential import harness
    from tests.differential.schemas import SCHEMAS
    from tests.differential.views import VIEWS, VIEWS_BY_NAME, views_of
    from tests.differential.workload import Workload
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from differential import harness  # type: ignore[no-redef]
    from differential.schemas import SCHEMAS  # type: ignore[no-redef]
    from differential.views import VIEWS, VIEWS_BY_NAME, views_of  # type: ignore[no-redef]
    from differential.workload import Workload  # type: ignore[no-redef]

SEEDS = (7, 20240611)
ROUNDS = 6
OPS_PER_ROUND = 15
VALIDITY_ROUNDS = 20
HYPOTHESIS_VIEWS = (
    "paper_v",
    "paper_v_cost",
    "paper_using_group_aggs",
    "social_city_stats",
    "orders_revenue",
    "setops_except",
)

# Constructs the catalogue must cover, as regexes over the (whitespace-normalized) view SQL.
REQUIRED_CONSTRUCTS = {
    "NATURAL JOIN": r"\bNATURAL JOIN\b",
    "JOIN ... ON": r"\bJOIN \w+ \w+ ON\b",
    "USING": r"\bUSING \(",
    "comma join": r"\bFROM \w+ \w+, \w+",
    "CROSS JOIN": r"\bCROSS JOIN\b",
    "theta join": r"\bON [\w.]+ < [\w.]+",
    "GROUP BY": r"\bGROUP BY\b",
    "HAVING": r"\bHAVING\b",
    "SUM": r"\bsum\(",
    "COUNT(*)": r"\bcount\(\*\)",
    "COUNT(col)": r"\bcount\([\w.]+\)",
    "AVG": r"\bavg\(",
    "MIN": r"\bmin\(",
    "MAX": r"\bmax\(",
    "DISTINCT": r"\bSELECT DISTINCT\b",
    "CASE": r"\bCASE WHEN\b",
    "COALESCE": r"\bCOALESCE\(",
    "function": r"\b(upper|lower|abs)\(",
    "NOT EXISTS": r"\bNOT EXISTS\b",
    "EXISTS": r"(?<!NOT )\bEXISTS\b",
    "NOT IN": r"\bNOT IN \(SELECT\b",
    "IN (subquery)": r"(?<!NOT )\bIN \(SELECT\b",
    "EXCEPT": r"\bEXCEPT\b",
    "UNION": r"\bUNION SELECT\b",
    "UNION ALL": r"\bUNION ALL\b",
    "subquery in FROM": r"\bFROM \(SELECT\b",
    "global aggregate": r"^SELECT count\(\*\) AS \w+, .* FROM \w+( WHERE .*)?$",
}


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().replace("( ", "(")


# ---------------------------------------------------------------------------- no database


def test_view_catalogue_covers_required_constructs() -> None:
    assert len(VIEWS) >= 16
    assert len(VIEWS_BY_NAME) == len(VIEWS), "view names must be unique"
    assert {v.schema for v in VIEWS} == set(SCHEMAS)
    missing = [
        name
        for name, pattern in REQUIRED_CONSTRUCTS.items()
        if not any(re.search(pattern, _flat(v.sql), re.IGNORECASE) for v in VIEWS)
    ]
    assert not missing, f"no view covers: {missing}"
    assert _flat(VIEWS_BY_NAME["paper_v"].sql) == (
        "SELECT did, pid, price FROM parts NATURAL JOIN devices_parts NATURAL JOIN devices "
        "WHERE category = 'phone'"
    )


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.name)
def test_views_parse_with_sqlglot(view: Any) -> None:
    """Each view is one query sqlglot reads whole, and reads back the same from its own
    rendering (a construct sqlglot dropped or misread would not survive the round trip)."""
    tree = sqlglot.parse_one(view.sql, read="postgres")
    assert isinstance(tree, sqlglot.exp.Query), type(tree).__name__
    assert sqlglot.parse_one(tree.sql("postgres"), read="postgres") == tree


@pytest.mark.parametrize("schema_key", sorted(SCHEMAS))
def test_workload_is_deterministic(schema_key: str) -> None:
    def trace(seed: int) -> list[Any]:
        w = Workload(schema_key, "s", seed)
        out: list[Any] = list(w.initial_statements())
        for _ in range(5):
            out.extend(w.next_round(OPS_PER_ROUND))
        return out

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


# ---------------------------------------------------------------------------- PostgreSQL only


def _table_rows(conn: psycopg.Connection[Any], schema: str, w: Workload) -> dict[str, Counter]:
    out = {}
    for name, state in w.tables.items():
        cols = psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, state.spec.column_names))
        query = psycopg.sql.SQL("SELECT {} FROM {}").format(
            cols, psycopg.sql.Identifier(schema, name)
        )
        out[name] = Counter(conn.execute(query).fetchall())
    return out


@pytest.mark.postgres
@pytest.mark.parametrize("schema_key", sorted(SCHEMAS))
def test_workloads_are_valid_sql(pg_dsn: str, pg_schema: str, schema_key: str) -> None:
    """DDL, every view and 20 DML rounds run on PostgreSQL; the workload model matches the data."""
    views = views_of(schema_key)
    seen_rows: dict[str, int] = dict.fromkeys((v.name for v in views), 0)
    contents: dict[str, set[str]] = {v.name: set() for v in views}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        w = harness.setup_base_tables(conn, pg_schema, schema_key, seed=11)
        for round_no in range(VALIDITY_ROUNDS + 1):
            if round_no:
                batch = w.next_round(OPS_PER_ROUND)
                assert len(batch) >= OPS_PER_ROUND
                harness.apply_statements(conn, batch, single_transaction=round_no % 2 == 0)
            model = {name: Counter(rows) for name, rows in w.snapshot().items()}
            assert _table_rows(conn, pg_schema, w) == model, f"model drifted in round {round_no}"
            for view in views:
                names, rows = harness.run_query(conn, pg_schema, view.sql)
                assert len(set(names)) == len(names), f"{view.name}: duplicate column names"
                seen_rows[view.name] = max(seen_rows[view.name], len(rows))
                contents[view.name].add(
                    repr(sorted(harness.normalize_rows(rows).items(), key=repr))
                )
    empty = [name for name, n in seen_rows.items() if n == 0]
    assert not empty, f"views never produced a row: {empty}"
    static = [name for name, seen in contents.items() if len(seen) < 3]
    assert not static, f"views barely changed over the workload: {static}"


@pytest.mark.postgres
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("view_name", [v.name for v in VIEWS])
def test_view_matches_recomputation(pg_dsn: str, pg_schema: str, view_name: str, seed: int) -> None:
    view = VIEWS_BY_NAME[view_name]
    harness.run_differential(
        pg_dsn, pg_schema, view.schema, [view_name], seed, ROUNDS, OPS_PER_ROUND
    )


@pytest.mark.postgres
@pytest.mark.parametrize("strategy", ["tuple", "recompute"])
@pytest.mark.parametrize("view_name", [v.name for v in VIEWS])
def test_baseline_strategy_matches_recomputation(pg_dsn: str, pg_schema: str, view_name: str,
                                                 strategy: str) -> None:
    """The comparison strategies (tuple-based t-diffs, recomputation) meet the same bar."""
    view = VIEWS_BY_NAME[view_name]
    harness.run_differential(pg_dsn, pg_schema, view.schema, [view_name], SEEDS[0], 4,
                             OPS_PER_ROUND, strategy=strategy)


@pytest.mark.postgres
@pytest.mark.parametrize("schema_key", sorted(SCHEMAS))
def test_all_views_of_a_schema_together(pg_dsn: str, pg_schema: str, schema_key: str) -> None:
    """Several views over the same base tables, maintained side by side."""
    names = [v.name for v in views_of(schema_key)]
    harness.run_differential(pg_dsn, pg_schema, schema_key, names, 99, 4, OPS_PER_ROUND)


@pytest.mark.postgres
@settings(
    max_examples=10,
    deadline=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    view_name=st.sampled_from(HYPOTHESIS_VIEWS),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    rounds=st.integers(min_value=1, max_value=4),
    ops_per_round=st.integers(min_value=1, max_value=30),
)
def test_differential_hypothesis(
    pg_dsn: str, pg_schema: str, view_name: str, seed: int, rounds: int, ops_per_round: int
) -> None:
    """Random seeds and round shapes; the harness recreates the schema for every example."""
    view = VIEWS_BY_NAME[view_name]
    harness.run_differential(
        pg_dsn, pg_schema, view.schema, [view_name], seed, rounds, ops_per_round
    )
