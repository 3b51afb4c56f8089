"""The change log read through the conditions its rows must meet to reach the view
(``idivm.planner.log_filter``): what is derived per table, and views that stay exact while rows
move in and out of those conditions within a batch."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

import idivm
from idivm.planner.log_filter import log_filters
from idivm.postgres import PostgresMaintainer

try:
    from tests.pg_batches import prepare, run_batches
except ImportError:  # pragma: no cover
    from pg_batches import prepare, run_batches  # type: ignore[no-redef]

DDL = ("CREATE TABLE item (id int PRIMARY KEY, grp int, qty int, price int, tag text);\n"
       "CREATE TABLE grp (g int PRIMARY KEY, name text, region text);")

CASES = {  # view → {table: its log filter, as PostgreSQL prints it} (absent: unfiltered)
    "SELECT id, qty FROM item WHERE qty > 3": {"item": '"qty" > 3'},
    # the part of each disjunct on one table (TPC-H Q19)
    "SELECT i.id, g.name FROM item AS i JOIN grp AS g ON i.grp = g.g "
    "WHERE (i.qty < 2 AND g.region = 'n') OR (i.price > 5 AND g.region = 's')":
        {"item": '"qty" < 2 OR "price" > 5', "grp": '"region" = \'n\' OR "region" = \'s\''},
    # a disjunct saying nothing about a table leaves it unfiltered
    "SELECT i.id FROM item AS i JOIN grp AS g ON i.grp = g.g WHERE i.qty < 2 OR g.region = 'n'":
        {},
    # the preserved side of an outer join is not filtered by its ON; the other side is
    "SELECT g.g, i.id FROM grp AS g LEFT JOIN item AS i ON i.grp = g.g AND i.tag = 'x'":
        {"item": '"tag" = \'x\''},
    # a condition above the outer join filters the preserved side
    "SELECT g.g, i.id FROM grp AS g LEFT JOIN item AS i ON i.grp = g.g WHERE g.region = 'n'":
        {"grp": '"region" = \'n\''},
    # HAVING is on groups, not rows
    "SELECT grp, SUM(qty) AS q FROM item GROUP BY grp HAVING SUM(qty) > 3": {},
    # EXISTS: the subquery's rows are filtered by its own condition
    "SELECT g.g FROM grp AS g WHERE EXISTS (SELECT 1 FROM item AS i WHERE i.grp = g.g "
    "AND i.qty > 7)": {"item": '"qty" > 7'},
    # NOT EXISTS: the outer rows are not filtered by the subquery's condition
    "SELECT g.g FROM grp AS g WHERE g.region = 'n' AND NOT EXISTS (SELECT 1 FROM item AS i "
    "WHERE i.grp = g.g AND i.qty > 7)": {"grp": '"region" = \'n\'', "item": '"qty" > 7'},
    # two scans of one table: either's rows matter
    "SELECT a.id FROM item AS a JOIN item AS b ON a.grp = b.id WHERE a.qty > 1 AND b.qty < 0":
        {"item": '("qty" > 1) OR ("qty" < 0)'},
    # one scan unfiltered: the table is
    "SELECT a.id FROM item AS a JOIN item AS b ON a.grp = b.id WHERE a.qty > 1": {},
    # a condition on a projection's computed column reaches the table through it
    "SELECT id, d FROM (SELECT id, qty * 2 AS d FROM item) AS s WHERE d > 6":
        {"item": '("qty" * 2) > 6'},
}


@pytest.mark.parametrize("view", sorted(CASES))
def test_log_filters(view: str) -> None:
    p = idivm.plan(view, idivm.Catalog.from_ddl(DDL))
    got = {t: e.sql("postgres") for t, e in
           log_filters(p.root, [m.nid for m in p.materialized]).items()}
    assert got == CASES[view]


def test_a_cache_holds_every_row_of_its_operator() -> None:
    """A σ above a cached γ-input does not filter what the cache stores (V′: the cost cache
    of devices ⋈ parts below the γ): only the views's own σ over the base rows does."""
    from idivm.examples import PAPER_DDL, V_PRIME_SQL
    p = idivm.plan(V_PRIME_SQL, idivm.Catalog.from_ddl(PAPER_DDL))
    cached = [m.nid for m in p.materialized]
    assert len(cached) > 1  # a cache and the view
    every = log_filters(p.root, cached)
    none_cached = log_filters(p.root, [p.root.nid])
    assert set(every) <= set(none_cached)


VIEWS = {
    "filtered": "SELECT id, grp, qty FROM item WHERE qty > 3 AND tag <> 'skip'",
    "joined_or": "SELECT i.id, g.name, i.price FROM item AS i JOIN grp AS g ON i.grp = g.g "
                 "WHERE (i.qty < 3 AND g.region = 'n') OR (i.price > 5 AND g.region = 's')",
    "summed": "SELECT g.region, SUM(i.price) AS p, COUNT(*) AS n FROM item AS i JOIN grp AS g "
              "ON i.grp = g.g WHERE i.qty BETWEEN 2 AND 6 GROUP BY g.region",
    "outer": "SELECT g.g, g.name, i.id, i.qty FROM grp AS g LEFT JOIN item AS i "
             "ON i.grp = g.g AND i.tag = 'x'",
    "exists": "SELECT g.g, g.name FROM grp AS g WHERE g.region <> 'w' AND EXISTS "
              "(SELECT 1 FROM item AS i WHERE i.grp = g.g AND i.qty > 6)",
    "extremes": "SELECT grp, MIN(price) AS lo, MAX(qty) AS hi FROM item WHERE qty < 5 "
                "GROUP BY grp",
}

BATCHES: list[list[str]] = [
    [  # into the condition and out again within the batch; out and back in
        "UPDATE item SET qty = 9 WHERE id = 1",
        "UPDATE item SET qty = 0 WHERE id = 1",
        "UPDATE item SET qty = 0 WHERE id = 4",
        "UPDATE item SET qty = 4, tag = 'x' WHERE id = 4",
        "INSERT INTO item VALUES (100, 1, 0, 9, 'x')",
        "UPDATE item SET qty = 5 WHERE id = 100",
    ],
    [  # an invisible row deleted, one inserted invisible; a key moved; a group's region flips
        "DELETE FROM item WHERE qty = 0",
        "INSERT INTO item VALUES (101, 2, 1, 1, 'skip')",
        "UPDATE item SET id = id + 500 WHERE id = 7",
        "UPDATE grp SET region = 's' WHERE g = 1",
        "UPDATE item SET tag = 'x' WHERE id % 4 = 1",
    ],
    [  # rows leaving the condition while their group changes too
        "UPDATE item SET qty = qty + 3, grp = (grp + 1) % 4 WHERE id % 3 = 0",
        "UPDATE grp SET region = 'w' WHERE g = 2",
        "DELETE FROM item WHERE id = 101",
    ],
    ["TRUNCATE item", "INSERT INTO item VALUES (1, 1, 4, 7, 'x'), (2, 1, 1, 9, NULL)"],
]


@pytest.mark.parametrize("strategy", ["id", "tuple"])
def test_filtered_logs_keep_views_exact(pg_dsn: str, pg_schema: str, strategy: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        prepare(conn, pg_schema,
                DDL,
                "INSERT INTO grp VALUES (0, 'a', 'n'), (1, 'b', 's'), (2, 'c', 'n'), "
                "(3, 'd', 'w')",
                "INSERT INTO item SELECT g, g % 4, g % 8, g % 7, CASE WHEN g % 3 = 0 THEN "
                "'x' WHEN g % 5 = 0 THEN 'skip' END FROM generate_series(1, 40) g")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            for name, q in VIEWS.items():
                m.create_view(name, q, strategy=strategy)
            run_batches(conn, m, VIEWS, BATCHES)


def test_rows_the_view_cannot_see_are_not_folded(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        prepare(conn, pg_schema,
                DDL,
                "INSERT INTO item SELECT g, g % 4, g % 8, g, NULL "
                "FROM generate_series(1, 100) g")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("big", "SELECT id, price FROM item WHERE qty = 7")
            conn.execute("UPDATE item SET price = price + 1")  # 100 rows, 12 of them seen
            stats = m.maintain("big")
            assert stats.changes == {"item": 12}
            assert sorted(r[1] for r in conn.execute("SELECT * FROM big")) == \
                [g + 1 for g in range(1, 101) if g % 8 == 7]


def _logged(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(f"{schema}__idivm", "log__item"))).fetchone()
    return int(row[0]) if row else 0


def test_triggers_log_only_what_some_view_can_see(pg_dsn: str, pg_schema: str) -> None:
    """The logging triggers leave out row images no registered view can see; a view over the
    same table that sees every row (or whose condition would mean something else in another
    session: a timestamptz compared with a literal) makes them log everything again."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        prepare(conn, pg_schema,
                DDL,
                "ALTER TABLE item ADD COLUMN at timestamptz",
                "INSERT INTO item SELECT g, g % 4, g % 8, g, NULL, now() "
                "FROM generate_series(1, 100) g")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("sevens", "SELECT id, price FROM item WHERE qty = 7")
            m.create_view("ones", "SELECT id, price FROM item WHERE qty = 1 AND tag IS NULL")
            conn.execute("UPDATE item SET price = price + 1 WHERE qty <> 7")  # 88 rows
            assert _logged(conn, pg_schema) == 2 * 13  # the 13 with qty = 1, old and new
            conn.execute("UPDATE item SET qty = 7 WHERE id = 2")  # into sevens' condition
            assert _logged(conn, pg_schema) == 2 * 13 + 1  # its new image only
            m.create_view("recent", "SELECT id FROM item WHERE at > '2000-01-01'")
            conn.execute("UPDATE item SET price = price + 1 WHERE qty = 3")
            assert _logged(conn, pg_schema) == 2 * 13 + 1 + 2 * 13  # all 13 with qty = 3
            for name, q in (("sevens", "SELECT id, price FROM item WHERE qty = 7"),
                            ("ones", "SELECT id, price FROM item WHERE qty = 1 AND tag IS NULL"),
                            ("recent", "SELECT id FROM item WHERE at > '2000-01-01'")):
                m.maintain(name)
                assert Counter(conn.execute(sql.SQL("SELECT * FROM {}").format(
                    sql.Identifier(name)))) == Counter(conn.execute(q)), name


def _partial_indexes(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
        "WHERE i.indrelid = to_regclass(%s) AND i.indpred IS NOT NULL ORDER BY 1",
        (sql.Identifier(f"{schema}__idivm", "log__item").as_string(None),))]


def _log_reads(conn: psycopg.Connection[Any], m: PostgresMaintainer, schema: str) -> int:
    """Rows read so far from the item log (sequential and index fetches), both sessions'
    statistics flushed."""
    for c in (conn, m.conn):
        c.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM "
        "pg_stat_user_tables WHERE schemaname = %s AND relname = 'log__item'",
        (f"{schema}__idivm",)).fetchone()
    return int(row[0]) if row else 0


def test_a_view_reads_its_own_rows_of_a_shared_log(pg_dsn: str, pg_schema: str) -> None:
    """A log that holds the rows of several views' conditions (or of a view that sees every
    row) has a partial index on ``__xid`` per condition: a selective view's fold reads its
    own pending rows, not every view's. An index goes when its condition's last view does."""
    sevens = "SELECT id, price FROM item WHERE qty = 7"
    everything = "SELECT id, qty, price FROM item"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        prepare(conn, pg_schema, DDL)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("sevens", sevens)
            assert _partial_indexes(conn, pg_schema) == []  # (the log holds its rows only)
            m.create_view("everything", everything)
            assert _partial_indexes(conn, pg_schema) == ["(qty = 7)"]
            conn.execute("INSERT INTO item SELECT g, g % 4, g % 8, g, NULL "
                         "FROM generate_series(1, 800) g")
            conn.execute("UPDATE item SET price = price + 1 WHERE id % 4 = 0")
            before = _log_reads(conn, m, pg_schema)
            assert m.maintain("sevens").changes == {"item": 100}
            # its 100 new rows (the updated ones among them folded as inserts), read by the
            # fold and once more for keys logged more than twice — not the log's 1,000 rows
            assert _log_reads(conn, m, pg_schema) - before <= 3 * 100
            m.maintain("everything")
            for name, q in (("sevens", sevens), ("everything", everything)):
                assert Counter(conn.execute(sql.SQL("SELECT * FROM {}").format(
                    sql.Identifier(name)))) == Counter(conn.execute(q)), name
            m.drop_view("everything")  # the triggers still log every row: the index stays
            assert _partial_indexes(conn, pg_schema) == ["(qty = 7)"]
            m.create_view("ones", "SELECT id FROM item WHERE qty = 1")
            assert _partial_indexes(conn, pg_schema) == ["(qty = 1)", "(qty = 7)"]
            m.drop_view("sevens")
            assert _partial_indexes(conn, pg_schema) == ["(qty = 1)"]
            m.create_view("sevens", sevens)  # two conditions, both logged: both indexed
            m.drop_view("ones")
            m.drop_view("sevens")
            assert conn.execute("SELECT to_regclass(%s)", (sql.Identifier(
                f"{pg_schema}__idivm", "log__item").as_string(None),)).fetchone() == (None,)
