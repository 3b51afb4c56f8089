"""One-time guards in the compiled code's EXECUTEd statements: a SELECT that inner-joins a
derived table or CTE over scratch relations also tests their row counts (TRUE or FALSE at run
time), so PostgreSQL drops the join when the i-diffs are empty (TPC-H Q20: 134 → 56 ms for a
refresh whose nation i-diffs were empty but whose plan computed the other side first)."""

from __future__ import annotations

import sqlglot

from idivm.postgres.compile import one_time_guards

COUNTERS = {"d1": "n1", "d2": "n2"}


def guarded(sql: str) -> str:
    return one_time_guards(sqlglot.parse_one(sql, read="postgres"), COUNTERS).sql("postgres")


def test_a_join_with_a_union_of_idiffs_tests_them_as_a_whole() -> None:
    out = guarded("WITH c AS (SELECT x FROM d2) SELECT b.x FROM big AS b JOIN "
                  "(SELECT x FROM d1 UNION SELECT x FROM c) AS u ON u.x = b.x")
    assert out.endswith("ON u.x = b.x WHERE (n1 > 0 OR n2 > 0)"), out
    assert "FROM d2 WHERE" not in out  # not inside the CTE: its readers carry the test


def test_what_an_empty_idiff_does_not_empty_is_left_alone() -> None:
    for sql in ("SELECT b.x FROM big AS b LEFT JOIN (SELECT x FROM d1) AS a ON a.x = b.x",
                "SELECT u.x FROM (SELECT x FROM d1 UNION SELECT x FROM big) AS u",
                "SELECT count(*) FROM (SELECT x FROM d1) AS a",
                "SELECT a.x FROM d1 AS a JOIN big AS b ON a.x = b.x"):  # a scan of it is free
        assert "n1 > 0" not in guarded(sql), sql
