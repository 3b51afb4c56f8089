"""Lookups by value into a view another view reads (``planner/lookups.py``).

A view over view ``rev`` keeping the rows whose ``total`` is ``rev``'s maximum (TPC-H Q15's
shape) re-derives the maximum when its row goes and finds the rows equal to the old and the new
maximum: by the value of ``total``, not by IDs. ``rev``'s stored table gets an index on it, so
a refresh probes it instead of reading all of ``rev``; the index is shared by the views that ask
for it and dropped with the last. The user's own tables are never indexed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

from idivm.catalog import Catalog
from idivm.plan import plan
from idivm.postgres import PostgresMaintainer
from idivm.postgres.maintainer import lookup_index

GROUPS = 20_000
REV = "SELECT sup, sum(price) AS total FROM item GROUP BY sup"
TOP = ("SELECT r.sup, r.total FROM rev AS r "
       "WHERE r.total = (SELECT max(x.total) FROM rev AS x)")
TOP_NAMES = ("SELECT s.name, r.total FROM rev AS r JOIN sup AS s ON s.sid = r.sup "
             "WHERE r.total = (SELECT max(x.total) FROM rev AS x)")
CATALOG = Catalog.from_ddl(
    "CREATE TABLE rev (sup int PRIMARY KEY, total bigint);"
    "CREATE TABLE item (id int PRIMARY KEY, sup int NOT NULL, price int);"
    "CREATE TABLE sup (sid int PRIMARY KEY, name text)")


def test_the_plan_names_the_columns_it_finds_rows_by() -> None:
    assert plan(TOP, CATALOG).input_lookups == (("rev", ("total",)),)
    assert plan(TOP_NAMES, CATALOG).input_lookups == (("rev", ("total",)),)
    assert plan(TOP, CATALOG, strategy="tuple").input_lookups == (("rev", ("total",)),)
    assert plan(TOP, CATALOG, strategy="recompute").input_lookups == ()
    # a global MIN over a base table (through σ and π); a computed argument is not a column
    assert plan("SELECT min(price) AS lo FROM item WHERE sup > 3", CATALOG
                ).input_lookups == (("item", ("price",)),)
    assert plan("SELECT max(price * 2) AS hi FROM item", CATALOG).input_lookups == ()
    # grouped: re-derived per group (on the group's columns, then the argument); an input
    # the γ keeps as its cache is read there; a range φ has its indexed cache
    assert plan("SELECT sup, max(price) AS hi FROM item GROUP BY sup", CATALOG
                ).input_lookups == (("item", ("sup", "price")),)
    assert plan("SELECT s.name, max(i.price) AS hi FROM item AS i JOIN sup AS s "
                "ON s.sid = i.sup GROUP BY s.name", CATALOG).input_lookups == ()
    assert plan("SELECT r.sup FROM rev AS r WHERE r.total > (SELECT avg(total) FROM rev)",
                CATALOG).input_lookups == ()


@pytest.fixture
def db(pg_dsn: str, pg_schema: str) -> Any:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(f"SET search_path = {pg_schema}")
    conn.execute("CREATE TABLE item (id int PRIMARY KEY, sup int NOT NULL, price int);"
                 "CREATE TABLE sup (sid int PRIMARY KEY, name text)")
    conn.execute("INSERT INTO item SELECT i, i %% %s, (i * 37) %% 1000 "
                 "FROM generate_series(1, %s) i", (GROUPS, 3 * GROUPS))
    conn.execute("INSERT INTO sup SELECT i, 's' || i FROM generate_series(0, %s) i", (GROUPS,))
    conn.execute("ANALYZE")
    m = PostgresMaintainer(pg_dsn, pg_schema)
    yield m, conn
    m.close()
    conn.close()


def _indexes(conn: psycopg.Connection[Any], schema: str, table: str) -> set[str]:
    return {r[0] for r in conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
        (f"{schema}__idivm", table))}


def _reads(m: PostgresMaintainer, conn: psycopg.Connection[Any], schema: str, table: str
           ) -> tuple[int, int]:
    """(sequential scans, rows read) of a stored table so far."""
    m.conn.execute("SELECT pg_stat_force_next_flush()")
    with conn.transaction():
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT seq_scan, seq_tup_read + coalesce(idx_tup_fetch, 0) "
                           "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
                           (f"{schema}__idivm", table)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _check(m: PostgresMaintainer, conn: psycopg.Connection[Any], view: str, query: str) -> None:
    m.maintain(view)
    got = Counter(map(tuple, conn.execute(f"SELECT * FROM {view}").fetchall()))
    assert got == Counter(map(tuple, conn.execute(query.replace("rev", f"({REV})")
                                                   ).fetchall()))


def test_a_new_maximum_is_found_by_probes_of_the_view_it_reads(db: Any, pg_schema: str
                                                               ) -> None:
    m, conn = db
    store = m.create_view("rev", REV).store.name
    m.create_view("top", TOP)
    index = lookup_index(store, ("total",))
    assert index in _indexes(conn, pg_schema, store)
    top = int(conn.execute("SELECT sup FROM top").fetchone()[0])
    for change in (f"UPDATE item SET price = price + 1 WHERE id = {top + GROUPS}",  # max rises
                   f"UPDATE item SET price = 0 WHERE sup = {top}",  # max re-derived
                   "UPDATE item SET price = price + 1 WHERE id = 5",  # max unchanged
                   "INSERT INTO item VALUES (999999, 7, 99999)"):  # a new maximum
        _check(m, conn, "top", TOP)  # (the session's plans made before the counts)
        scans, rows = _reads(m, conn, pg_schema, store)
        conn.execute(change)
        _check(m, conn, "top", TOP)
        scans2, rows2 = _reads(m, conn, pg_schema, store)
        # rev's own refresh probes its store by IDs; top's probes it by total (the ~20 rows
        # tied at the old maximum, the new one), never reading its 20,000 rows
        assert (scans2 - scans, rows2 - rows <= 100) == (0, True), (change, rows2 - rows)


def test_the_index_is_shared_and_dropped_with_the_last_view_asking(db: Any, pg_schema: str
                                                                   ) -> None:
    m, conn = db
    store = m.create_view("rev", REV).store.name
    index = lookup_index(store, ("total",))
    m.create_view("rev_count", "SELECT count(*) AS n FROM rev")  # asks for none
    m.create_view("top", TOP)
    m.create_view("top_names", TOP_NAMES)
    registry = dict(conn.execute(f"SELECT name, indexes FROM {pg_schema}__idivm.views"))
    assert registry["top"] == registry["top_names"] == [index]
    assert not registry["rev_count"] and not registry["rev"]
    m.drop_view("top")
    assert index in _indexes(conn, pg_schema, store)
    conn.execute("UPDATE item SET price = price + 500 WHERE sup = 11")
    _check(m, conn, "top_names", TOP_NAMES)
    m.drop_view("top_names")
    assert index not in _indexes(conn, pg_schema, store)
    m.drop_view("rev_count")
    m.create_view("top_tuple", TOP, strategy="tuple")  # the baseline: the same index
    assert index in _indexes(conn, pg_schema, store)
    # a grouped MAX over rev: its groups' rows, by the group's columns then the argument
    by_total = "SELECT r.total, max(r.sup) AS hi FROM rev AS r GROUP BY r.total"
    m.create_view("by_total", by_total)
    assert lookup_index(store, ("total", "sup")) in _indexes(conn, pg_schema, store)
    conn.execute("DELETE FROM item WHERE sup IN (SELECT max(sup) FROM item GROUP BY price)")
    _check(m, conn, "by_total", by_total)
    _check(m, conn, "top_tuple", TOP)
    # the user's tables: never indexed (a base-table MIN is read from the table)
    m.create_view("lo", "SELECT min(price) AS lo FROM item")
    assert not [i for i in conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'item' "
        "AND indexname <> 'item_pkey'", (pg_schema,))]
