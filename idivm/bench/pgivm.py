"""pg_ivm as a peer in the PostgreSQL benchmarks (``idivm bench pg``, ``idivm bench tpch``).

`pg_ivm <https://github.com/sraoss/pg_ivm>`_ maintains an IMMV (``pgivm.create_immv``) in AFTER
triggers of the base-table statements, so a benchmark gives it its own copy of the base tables
and times the batch applied there whole. idivm neither ships nor builds it
(``scripts/install_pg_ivm.sh`` builds it from its source); without it the benchmarks leave its
column out and say why (``unavailable``).

pg_ivm forgets a dropped IMMV (its row in ``pgivm.pg_ivm_immv``) in an object-access hook of
its library, which runs only in a session that loaded it: ``drop_schemas`` loads it first, so
dropping a copy schema leaves no stale catalog row behind.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import psycopg
from psycopg import sql

Conn: TypeAlias = "psycopg.Connection[Any]"

# pg_ivm's notice when it could not index an IMMV itself (its target list lacks a base
# table's key and the view neither groups nor is DISTINCT)
NO_INDEX = "could not create an index"


def unavailable(dsn: str) -> str:
    """Why pg_ivm cannot be used on the server (``""`` when it can): its library loads and
    its extension exists (created here if missing)."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("LOAD 'pg_ivm'")
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_ivm")
    except psycopg.Error as e:
        return (f"pg_ivm is not installed on the server ({str(e).strip()}); build it with "
                "scripts/install_pg_ivm.sh")
    return ""


def connect(dsn: str, schema: str, *, load: bool = True) -> Conn:
    """An autocommit connection on ``schema`` (``jit = off``, as every benchmark connection),
    with pg_ivm's library loaded up front (``load``) so that no timed statement pays for it."""
    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    conn.execute("SET jit = off")
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    if load:
        conn.execute("LOAD 'pg_ivm'")
    return conn


def drop_schemas(dsn: str, *schemas: str) -> None:
    """``DROP SCHEMA … CASCADE`` of each of ``schemas`` that exists, from a session that
    loaded pg_ivm when the server has it (so pg_ivm drops its catalog rows of the IMMVs)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        try:
            conn.execute("LOAD 'pg_ivm'")
        except psycopg.Error:
            pass  # not installed: there is no IMMV to forget
        for s in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


@dataclass(frozen=True)
class Immv:
    """An IMMV as created: seconds, pg_ivm's notices, and whether it indexed it itself."""

    name: str
    seconds: float
    notices: tuple[str, ...] = field(default=())

    @property
    def indexed(self) -> bool:
        """False when pg_ivm said it could not index the IMMV (its maintenance then scans it;
        its notice advises an index by hand)."""
        return not any(NO_INDEX in n for n in self.notices)


def create_immv(conn: Conn, name: str, query: str,
                indexes: Sequence[sql.SQL | sql.Composed] = ()) -> Immv:
    """``pgivm.create_immv(name, query)`` and then ``indexes`` in one transaction, then
    ANALYZE of the IMMV; pg_ivm's notices are kept. Raises ``psycopg.Error`` when pg_ivm
    refuses the query (its message says why)."""
    notices: list[str] = []

    def keep(d: psycopg.errors.Diagnostic) -> None:
        notices.append(" ".join(x for x in (d.message_primary, d.message_detail,
                                            d.message_hint) if x))

    conn.add_notice_handler(keep)
    try:
        t0 = time.perf_counter()
        with conn.transaction():
            conn.execute("SELECT pgivm.create_immv(%s, %s)", (name, query))
            for q in indexes:
                conn.execute(q)
        took = time.perf_counter() - t0
    finally:
        conn.remove_notice_handler(keep)
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)))
    return Immv(name, took, tuple(notices))


def visible_columns(conn: Conn, name: str) -> list[str]:
    """The IMMV's columns without pg_ivm's hidden counters (``__ivm_*``), in order."""
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped AND NOT starts_with(attname, '__ivm_') ORDER BY attnum",
        (sql.Identifier(name).as_string(conn),)).fetchall()
    return [str(r[0]) for r in rows]


def drop_immv(conn: Conn, name: str) -> None:
    """``DROP TABLE`` of the IMMV (its triggers on the base tables go with it; the
    connection has loaded pg_ivm, which forgets it)."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
