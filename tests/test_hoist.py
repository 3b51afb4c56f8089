"""The pass that finds the WITH queries a view reads more than once (``idivm.hoist``) and
rewrites the view to read views holding them instead: which CTEs qualify, and that the rewrite
reads the same relations under the same names."""

from __future__ import annotations

from idivm.frontend import relations_read
from idivm.hoist import SharedCte, read_from, shared_ctes

Q15 = ("WITH revenue AS (SELECT l_suppkey AS supplier_no, SUM(l_extendedprice) AS total "
       "FROM lineitem GROUP BY l_suppkey) SELECT s_suppkey, total FROM supplier, revenue "
       "WHERE s_suppkey = supplier_no AND total = (SELECT MAX(total) FROM revenue)")


def test_a_cte_read_twice_is_shared() -> None:
    (cte,) = shared_ctes(Q15)
    assert cte == SharedCte("revenue", "SELECT l_suppkey AS supplier_no, SUM(l_extendedprice) "
                            "AS total FROM lineitem GROUP BY l_suppkey", 2)


def test_the_rewrite_reads_the_view_under_the_cte_name() -> None:
    out = read_from(Q15, {"revenue": "v__revenue"})
    assert "WITH" not in out
    assert out.count('"v__revenue" AS revenue') == 2
    assert relations_read(out) == {"supplier", "v__revenue"}


def test_column_list_becomes_output_names() -> None:
    sql = ("WITH r (k, tot) AS (SELECT g, sum(x) FROM t GROUP BY g) "
           "SELECT * FROM r WHERE tot > (SELECT avg(tot) FROM r AS rr)")
    (cte,) = shared_ctes(sql)
    assert cte.body == "SELECT g AS k, SUM(x) AS tot FROM t GROUP BY g"
    out = read_from(sql, {"r": "v__r"})
    assert '"v__r" AS r' in out and '"v__r" AS rr' in out


def test_later_ctes_read_it_and_stay() -> None:
    sql = ("WITH r AS (SELECT g, sum(x) AS s FROM t GROUP BY g), "
           "big AS (SELECT g FROM r WHERE s > 3) SELECT * FROM r JOIN big ON r.g = big.g")
    assert [c.alias for c in shared_ctes(sql)] == ["r"]
    out = read_from(sql, {"r": "v__r"})
    assert out.startswith('WITH big AS (SELECT g FROM "v__r" AS r')


def test_a_cte_named_as_the_table_it_reads() -> None:
    """Inside its own body the name is the table's."""
    sql = "WITH t AS (SELECT g, sum(x) AS s FROM t GROUP BY g) SELECT * FROM t a JOIN t b USING (g)"
    (cte,) = shared_ctes(sql)
    assert cte.body == "SELECT g, SUM(x) AS s FROM t GROUP BY g"
    assert relations_read(read_from(sql, {"t": "v__t"})) == {"v__t"}


def test_what_stays_inline() -> None:
    once = "WITH r AS (SELECT g, sum(x) AS s FROM t GROUP BY g) SELECT * FROM r"
    no_group = "WITH r AS (SELECT g, x FROM t WHERE x > 0) SELECT * FROM r a JOIN r b USING (g)"
    union = ("WITH r AS (SELECT g FROM t GROUP BY g UNION SELECT g FROM u GROUP BY g) "
             "SELECT * FROM r a JOIN r b USING (g)")
    reads_cte = ("WITH a AS (SELECT g, x FROM t), r AS (SELECT g, sum(x) AS s FROM a GROUP BY g) "
                 "SELECT * FROM r p JOIN r q USING (g)")
    shadowed = ("WITH r AS (SELECT g, sum(x) AS s FROM t GROUP BY g) SELECT * FROM r "
                "WHERE g IN (WITH r AS (SELECT 1 AS g) SELECT g FROM r)")
    recursive = ("WITH RECURSIVE r AS (SELECT g, sum(x) AS s FROM t GROUP BY g) "
                 "SELECT * FROM r a JOIN r b USING (g)")
    quoted = 'WITH R AS (SELECT g, sum(x) AS s FROM t GROUP BY g) SELECT * FROM r, "R"'
    for sql in (once, no_group, union, reads_cte, shadowed, recursive, quoted):
        assert shared_ctes(sql) == (), sql
    assert shared_ctes("SELECT 1") == ()
