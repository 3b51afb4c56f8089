"""Batches of SQL statements against views maintained on PostgreSQL, each view compared with
its recomputation after every batch (shared by the tests of what a maintain reads)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql


def rows(conn: psycopg.Connection[Any], q: str | sql.Composable) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in conn.execute(q))


def run_batches(conn: psycopg.Connection[Any], m: Any, views: Mapping[str, str],
                batches: Sequence[Sequence[str]],
                check: Callable[[str, Any], None] | None = None) -> None:
    """Each batch in two transactions (its first half, the rest), then every view maintained
    (``check(name, stats)`` first) and compared with its query."""
    for k, batch in enumerate(batches):
        half = len(batch) // 2
        for part in (batch[:half], batch[half:]):
            with conn.transaction():
                for step in part:
                    conn.execute(step)
        for name, q in views.items():
            stats = m.maintain(name)
            if check is not None:
                check(name, stats)
            got = rows(conn, sql.SQL("SELECT * FROM {}").format(sql.Identifier(name)))
            assert got == rows(conn, q), (name, k)


def prepare(conn: psycopg.Connection[Any], schema: str, *statements: str) -> None:
    """``schema`` first on the search path, then ``statements`` (the tables, their rows)."""
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    for s in statements:
        conn.execute(s)
