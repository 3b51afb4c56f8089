"""A test's PostgreSQL schema and every connection and maintainer it opens (all closed at
teardown, before the schema is dropped), shared by the trust and isolation suites."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from idivm.postgres import PostgresMaintainer

Conn = psycopg.Connection[Any]


@dataclass
class Env:
    dsn: str
    schema: str
    stack: ExitStack
    views: dict[str, str] = field(default_factory=dict)  # name -> SQL, compared by checks

    @property
    def companion(self) -> str:
        return f"{self.schema}__idivm"

    def conn(self, autocommit: bool = True, lock_timeout: str = "10s",
             replica: bool = False) -> Conn:
        c = psycopg.connect(self.dsn, autocommit=autocommit, connect_timeout=10)
        self.stack.callback(c.close)
        c.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(self.schema)))
        c.execute("SET statement_timeout = '30s'")
        c.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(lock_timeout)))
        if replica:
            c.execute("SET session_replication_role = replica")
        if not autocommit:
            c.commit()
        return c

    def maintainer(self, lock_timeout: str = "20s") -> PostgresMaintainer:
        m = PostgresMaintainer(self.dsn, self.schema)
        self.stack.callback(m.close)
        m.conn.execute("SET statement_timeout = '30s'")
        m.conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(lock_timeout)))
        return m

    def create(self, m: PostgresMaintainer, name: str, view_sql: str, **kw: Any) -> None:
        m.create_view(name, view_sql, **kw)
        self.views[name] = view_sql

    def store(self, view: str) -> sql.Identifier:
        return sql.Identifier(self.companion, f"{view}__store")
