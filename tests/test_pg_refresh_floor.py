"""The fixed part of a refresh on PostgreSQL: a maintain prunes only the logs it consumed rows
of (a call per log, 0.3–1 ms each, was the larger part of a small refresh: TPC-H Q11 at SF 0.1,
9–10 → 6–7 ms), and computes its watermark once (``consumed()`` evaluated per row of the
UPDATE, one row per table the view reads, re-planned at each call)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from idivm.postgres import PostgresMaintainer

VIEW = "SELECT a.id, a.v, b.w FROM a JOIN b ON a.id = b.id"


def _pruned(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    return dict(conn.execute(sql.SQL("SELECT tbl, pruned FROM {}").format(
        sql.Identifier(f"{schema}__idivm", "log_tables"))).fetchall())


def _all_pruned(conn: psycopg.Connection[Any], schema: str, *tables: str) -> bool:
    """Every log row of ``tables`` the prune rule lets go is gone, and each log's prune mark
    has reached the rule's bound: the xmin of the oldest watermark of the log's table. (A
    transaction of another test, open when the maintenance took its snapshot, keeps that
    bound below the rows this test logged: they stay for a later prune.)"""
    comp = f"{schema}__idivm"
    for t in tables:
        row = conn.execute(sql.SQL(
            "WITH b AS (SELECT min(pg_snapshot_xmin(u.watermark)) AS bound FROM {} u "
            "WHERE u.tbl = %s) SELECT (SELECT p.pruned >= b.bound FROM {} p WHERE p.tbl = %s), "
            "(SELECT count(*) FROM {} l WHERE l.__xid < b.bound) FROM b").format(
                sql.Identifier(comp, "log_users"), sql.Identifier(comp, "log_tables"),
                sql.Identifier(comp, f"log__{t}")), (t, t)).fetchone()
        if row is None or row[0] is not True or row[1] != 0:
            return False
    return True


def test_a_maintain_prunes_only_the_logs_it_consumed(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY, w int)")
        conn.execute("INSERT INTO a SELECT g, g FROM generate_series(1, 20) g")
        conn.execute("INSERT INTO b SELECT g, 10 * g FROM generate_series(1, 20) g")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("v", VIEW)
            conn.execute("UPDATE a SET v = v + 1 WHERE id <= 5")
            conn.execute("UPDATE b SET w = w + 1 WHERE id = 3")
            m.maintain("v")  # both logs consumed and pruned
            assert _all_pruned(conn, pg_schema, "a", "b")
            before = _pruned(conn, pg_schema)
            conn.execute("UPDATE a SET v = v + 1 WHERE id > 15")
            stats = m.maintain("v")
            assert stats.log_rows == {"a": 10, "b": 0}
            # the function's own clock, inside the call's (no lock wait, commit or prune)
            assert 0 < stats.function_seconds < stats.seconds
            assert stats.as_dict()["function_seconds"] == stats.function_seconds
            after = _pruned(conn, pg_schema)
            assert after["b"] == before["b"]  # b's log: no call
            assert _all_pruned(conn, pg_schema, "a")
            # one watermark for every table the view reads
            marks = conn.execute(sql.SQL("SELECT DISTINCT watermark::text FROM {} WHERE "
                                         "view = 'v'").format(sql.Identifier(
                                             f"{pg_schema}__idivm", "log_users"))).fetchall()
            assert len(marks) == 1
            conn.execute("DELETE FROM b WHERE id = 20")
            conn.execute("INSERT INTO b VALUES (21, 5)")
            conn.execute("INSERT INTO a VALUES (21, 1)")
            m.maintain("v")
            assert _all_pruned(conn, pg_schema, "a", "b")
            assert Counter(conn.execute("SELECT * FROM v")) == Counter(conn.execute(VIEW))
