"""One-time guards in the compiled code: a SELECT that inner-joins a scratch relation (or a
derived table or CTE over scratch relations only) also tests their row counts, so
PostgreSQL skips the whole subtree when an i-diff is empty (TPC-H Q20: 134 → 56 ms for a
refresh whose nation i-diffs were empty but whose plan computed the other side first)."""

from __future__ import annotations

import sqlglot

from idivm.postgres.compile import one_time_guards

COUNTERS = {"d1": "idivm__n1", "d2": "idivm__n2"}


def guarded(sql: str) -> str:
    return one_time_guards(sqlglot.parse_one(sql, read="postgres"), COUNTERS).sql("postgres")


def test_an_inner_join_of_an_idiff_tests_its_count() -> None:
    assert guarded("SELECT a.x FROM d1 AS a JOIN big AS b ON a.x = b.x") == (
        "SELECT a.x FROM d1 AS a JOIN big AS b ON a.x = b.x WHERE idivm__n1 > 0")


def test_a_union_of_idiffs_and_a_cte_over_one_are_tested_as_a_whole() -> None:
    out = guarded("WITH c AS (SELECT x FROM d2) SELECT b.x FROM big AS b JOIN "
                  "(SELECT x FROM d1 UNION SELECT x FROM c) AS u ON u.x = b.x")
    assert out.endswith("WHERE (idivm__n1 > 0 OR idivm__n2 > 0)"), out


def test_what_is_not_emptied_by_an_empty_idiff_is_left_alone() -> None:
    for sql in ("SELECT count(*) FROM d1",  # one row from no rows
                "SELECT b.x FROM big AS b LEFT JOIN d1 AS a ON a.x = b.x",  # the padded side
                "SELECT b.x FROM big AS b WHERE NOT EXISTS (SELECT 1 FROM other AS o)",
                "SELECT u.x FROM (SELECT x FROM d1 UNION SELECT x FROM big) AS u"):
        assert "idivm__n1 > 0" not in guarded(sql).split("FROM d1")[0], sql
    # inside an EXISTS the test is harmless (no rows either way), outside it absent
    out = guarded("SELECT b.x FROM big AS b WHERE EXISTS (SELECT 1 FROM d1 AS a "
                  "WHERE a.x = b.x)")
    assert out.endswith("WHERE a.x = b.x AND idivm__n1 > 0)"), out
