"""Change tables read only as sums (``idivm.planner.linear``): the compiled Δ-script reads the
table's log rows unfolded — each an image before or after a change — instead of folding them
per key, and the view still equals its recomputation whatever a batch does to a key (changed
many times, deleted and inserted again, its key updated, the table truncated)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlglot import exp, parse_one

import idivm
from idivm.planner.linear import linear_change_tables, merge_image_reads
from idivm.planner.model import change_table
from idivm.postgres import PostgresMaintainer
from idivm.script import Compute

try:
    from tests.pg_batches import prepare, run_batches
except ImportError:  # pragma: no cover
    from pg_batches import prepare, run_batches  # type: ignore[no-redef]

DDL = ("CREATE TABLE item (id int PRIMARY KEY, grp text, qty numeric, price numeric, "
       "note text, ok boolean);\n"
       "CREATE TABLE shop (grp text PRIMARY KEY, city text);")
LINEAR = {  # γ of sums over σ/π of item alone
    "by_group": "SELECT grp, SUM(qty) AS q, COUNT(*) AS n, AVG(price) AS p, COUNT(price) AS cp "
                "FROM item WHERE ok GROUP BY grp",
    "global": "SELECT SUM(qty * price) AS rev, COUNT(*) AS n FROM item WHERE qty < 5",
    "having": "SELECT grp, SUM(qty) AS q FROM item GROUP BY grp HAVING SUM(qty) > 3",
    # the extremes are read from the table for the groups the sums name
    "minmax": "SELECT grp, MIN(qty) AS lo, MAX(price) AS hi FROM item GROUP BY grp",
}
FOLDED = {  # a row per key, a join: the fold's netting per key is needed
    "by_key": "SELECT id, SUM(qty) AS q FROM item GROUP BY id",  # (a row per key)
    "rows": "SELECT id, grp, qty FROM item WHERE ok",
    "joined": "SELECT s.city, SUM(i.qty) AS q FROM item AS i JOIN shop AS s ON i.grp = s.grp "
              "GROUP BY s.city",
}


def _linear(view_sql: str) -> frozenset[str]:
    cat = idivm.Catalog.from_ddl(DDL)
    p = idivm.plan(view_sql, cat)
    return linear_change_tables(p.statements, {change_table(t): cat.table(t).primary_key
                                               for t in ("item", "shop")})


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_sums_over_one_table_read_the_log(name: str) -> None:
    assert _linear(LINEAR[name]) == {change_table("item")}


@pytest.mark.parametrize("name", sorted(FOLDED))
def test_other_readers_keep_the_fold(name: str) -> None:
    assert change_table("item") not in _linear(FOLDED[name])


def _grouping(pre_sum: str) -> Compute:
    q = parse_one(
        "SELECT u.k, SUM(u.d) AS d FROM ("
        "SELECT g.grp__post AS k, g.qty__post AS d FROM __chg__item AS g "
        "WHERE g.__has_post AND g.qty__post > 1 UNION ALL "
        f"SELECT g.grp__pre AS k, {pre_sum} AS d FROM __chg__item AS g "
        "WHERE g.__has_pre AND g.qty__pre > 1) AS u GROUP BY u.k", dialect="postgres")
    return Compute("d1", q, "", "idiff")


@pytest.mark.parametrize(("pre_sum", "linear"), [
    ("-(g.qty__pre)", True),
    ("g.qty__pre", False),  # not the post branch negated: an intermediate image would count
    ("-(g.price__pre)", False),
    ("-(g.qty__post)", False),  # a pre branch reading post-images
])
def test_only_mirrored_branches_are_linear(pre_sum: str, linear: bool) -> None:
    got = linear_change_tables([_grouping(pre_sum)], {change_table("item"): ("id",)})
    assert bool(got) is linear


def test_a_log_read_scans_each_row_once() -> None:
    """Over a log (each row one image under both names), a mirrored pair is one branch: the
    post branch's filter without ``__has_post``, the summed value signed by the row's kind."""
    [merged] = merge_image_reads([_grouping("-(g.qty__pre)")], change_table("item"), ("id",))
    assert isinstance(merged, Compute)
    q = merged.query
    assert q.find(exp.Union) is None
    assert [t.name for t in q.find_all(exp.Table)] == [change_table("item")]
    inner = q.find(exp.Subquery).this
    assert inner.args["where"].sql("postgres") == "WHERE g.qty__post > 1"
    assert inner.expressions[1].sql("postgres") == (
        'CASE WHEN g.__has_post THEN g.qty__post ELSE -(g.qty__post) END AS d')
    # every view of LINEAR compiles to one read of its log per summing statement
    cat = idivm.Catalog.from_ddl(DDL)
    for view in LINEAR.values():
        p = idivm.plan(view, cat)
        for s in merge_image_reads(p.statements, change_table("item"), ("id",)):
            if isinstance(s, Compute):
                assert s.query.find(exp.Union) is None or not any(
                    t.name == change_table("item") for t in s.query.find_all(exp.Table))


BATCHES: list[list[str]] = [
    [  # a key inserted, updated twice and deleted; another moved between groups
        "INSERT INTO item VALUES (100, 'a', 1, 10, 'x', true)",
        "UPDATE item SET qty = qty + 1 WHERE id = 100",
        "UPDATE item SET grp = 'b', price = NULL WHERE id = 100",
        "DELETE FROM item WHERE id = 100",
        "UPDATE item SET grp = 'c' WHERE id = 3",
        "UPDATE item SET note = 'unread' WHERE id BETWEEN 1 AND 6",
    ],
    [  # deleted and inserted again with other values; a key renamed; NULLs
        "DELETE FROM item WHERE id = 4",
        "INSERT INTO item VALUES (4, 'd', 2, NULL, 'y', true)",
        "UPDATE item SET id = id + 1000 WHERE id = 5",
        "UPDATE item SET qty = NULL WHERE id = 7",
        "UPDATE item SET ok = NOT ok WHERE id % 3 = 0",
    ],
    [  # a group emptied, one created; an update that changes nothing
        "DELETE FROM item WHERE grp = 'b'",
        "INSERT INTO item VALUES (200, 'z', 3, 3, NULL, true), (201, 'z', 4, 1, NULL, true)",
        "UPDATE item SET qty = qty WHERE id = 8",
    ],
    ["TRUNCATE item", "INSERT INTO item VALUES (1, 'a', 2, 2, NULL, true)"],
]


def test_unfolded_log_keeps_views_exact(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        prepare(conn, pg_schema,
                DDL,
                "INSERT INTO shop VALUES ('a', 'x'), ('b', 'y'), ('c', 'x'), ('d', 'y'), "
                "('z', 'x')",
                "INSERT INTO item SELECT g, chr(97 + g % 3), g % 7, g % 5, NULL, g % 4 <> 0 "
                "FROM generate_series(1, 40) g")
        views = LINEAR | FOLDED
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            for name, q in views.items():
                m.create_view(name, q)
            def fold_only_where_needed(name: str, stats: Any) -> None:
                folded = any(s.startswith("fold item") for s, _ in stats.statement_seconds)
                assert folded is (name in FOLDED), (name, stats.statement_seconds)

            run_batches(conn, m, views, BATCHES, fold_only_where_needed)
