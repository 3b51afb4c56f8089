"""PostgreSQL backend: materialize views and caches, log changes, run Δ-scripts.

Layout: base tables and the user-facing view live in the user's schema; idivm's own relations
(the view's stored table with its hidden ID columns, caches, change logs, the registry) live in
the companion schema ``"<schema>__idivm"``. Every Δ-script runs in one transaction with
``search_path`` set to the companion schema then the user's schema, so the plan's unqualified
names resolve.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlglot import exp

from idivm.catalog import Catalog
from idivm.errors import BackendError, IdivmError, MaintenanceError
from idivm.plan import Plan, plan
from idivm.planner.model import Strategy, change_table
from idivm.planner.prune import prune_empty
from idivm.postgres import changelog
from idivm.script import Apply, Compute, Statement, to_sql

REGISTRY = "views"


def q(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql("postgres")


def qq(schema: str, name: str) -> str:
    return f"{q(schema)}.{q(name)}"


@dataclass
class MaintenanceStats:
    """What one ``maintain`` did: rows per i-diff, time per statement."""

    view: str
    changes: dict[str, int] = field(default_factory=dict)  # base table → effective changes
    idiff_rows: dict[str, int] = field(default_factory=dict)  # temp relation → rows
    applied_rows: dict[str, int] = field(default_factory=dict)  # "kind diff→target" → rows
    statement_seconds: list[tuple[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"view": self.view, "changes": self.changes, "idiff_rows": self.idiff_rows,
                "applied_rows": self.applied_rows, "seconds": self.seconds,
                "statement_seconds": self.statement_seconds}


class PostgresMaintainer:
    """Deferred ID-based maintenance of materialized views on one PostgreSQL schema."""

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        self.dsn = dsn
        try:
            self.conn = psycopg.connect(dsn, autocommit=False, connect_timeout=10)
        except psycopg.Error as e:
            raise BackendError(f"cannot connect to PostgreSQL with DSN {_redact(dsn)!r}: "
                               f"{str(e).strip()}") from e
        if schema is None:
            row = self.conn.execute("SELECT current_schema()").fetchone()
            schema = str(row[0]) if row and row[0] else "public"
        self.conn.rollback()
        self.schema = schema
        self.companion = changelog.companion_schema(schema)
        self._plans: dict[str, Plan] = {}

    # -- helpers ---------------------------------------------------------------------------
    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PostgresMaintainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def catalog(self) -> Catalog:
        """The schema's tables, keys and foreign keys, reflected through SQLAlchemy."""
        return Catalog.reflect(_as_url(self.dsn), schema=self.schema)

    def _search_path(self) -> None:
        self.conn.execute(f"SET LOCAL search_path = {q(self.companion)}, {q(self.schema)}")

    def _registry(self) -> None:
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(self.companion)}")
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {qq(self.companion, REGISTRY)} (name text PRIMARY KEY,"
            " sql text NOT NULL, changes jsonb, created timestamptz NOT NULL DEFAULT now(),"
            " last_maintained timestamptz, runs bigint NOT NULL DEFAULT 0)")
        # registries made before strategies existed hold ID-based views
        self.conn.execute(f"ALTER TABLE {qq(self.companion, REGISTRY)} ADD COLUMN IF NOT EXISTS"
                          " strategy text NOT NULL DEFAULT 'id'")

    def _entry(self, name: str) -> tuple[str, dict[str, list[str]] | None, Strategy]:
        row = None
        exists = self.conn.execute("SELECT to_regclass(%s)", (qq(self.companion, REGISTRY),)
                                   ).fetchone()
        if exists and exists[0]:
            strategy = "strategy" if self._has_strategy() else "'id'"
            row = self.conn.execute(
                f"SELECT sql, changes, {strategy} FROM {qq(self.companion, REGISTRY)} "
                "WHERE name = %s", (name,)).fetchone()
        if row is None:
            raise BackendError(f"no idivm view {name!r} in schema {self.schema!r}")
        return str(row[0]), row[1], row[2]

    def _has_strategy(self) -> bool:
        row = self.conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = %s AND column_name = 'strategy'", (self.companion, REGISTRY)).fetchone()
        return row is not None

    def plan_of(self, name: str) -> Plan:
        if name not in self._plans:
            # its own transaction: a bare read would leave one open, and later work would run
            # in a savepoint of it and be rolled back at close
            with self.conn.transaction():
                sql, changes, strategy = self._entry(name)
            self._plans[name] = plan(sql, self.catalog(), name=name, changes=changes,
                                     strategy=strategy)
        return self._plans[name]

    # -- API ---------------------------------------------------------------------------------
    def create_view(self, name: str, view_sql: str,
                    changes: Mapping[str, Sequence[str]] | None = None,
                    catalog: Catalog | None = None, strategy: Strategy = "id") -> Plan:
        """Materialize the view and its caches and start logging its base tables.
        ``strategy``: ``id`` (ID-based, the default), ``tuple`` (tuple-based t-diffs, the
        baseline) or ``recompute``.

        Unsupported SQL raises before anything is created; any failure rolls back.
        """
        p = plan(view_sql, catalog or self.catalog(), name=name, changes=changes,
                 strategy=strategy)
        try:
            with self.conn.transaction():
                self._registry()
                taken = self.conn.execute("SELECT to_regclass(%s)", (qq(self.schema, name),)
                                          ).fetchone()
                if taken and taken[0]:
                    raise BackendError(f"{self.schema}.{name} already exists")
                self._search_path()
                for t in p.tables:
                    self.conn.execute(f"LOCK TABLE {qq(self.schema, t)} IN SHARE MODE")
                for m, query in p.materialize_queries():
                    self.conn.execute(f"CREATE TABLE {qq(self.companion, m.name)} AS "
                                      f"{query.sql('postgres')}")
                    self._indexes(p, m.name, m.key, m.nullable)
                for t in p.tables:
                    changelog.install(self.conn, self.schema, p.catalog.table(t), name)
                cols = ", ".join(q(c) for c in p.columns)
                self.conn.execute(f"CREATE VIEW {qq(self.schema, name)} AS SELECT {cols} FROM "
                                  f"{qq(self.companion, p.store.name)}")
                self.conn.execute(
                    f"INSERT INTO {qq(self.companion, REGISTRY)} (name, sql, changes, strategy)"
                    " VALUES (%s, %s, %s, %s)",
                    (name, view_sql, json.dumps(dict(changes)) if changes else None, strategy))
        except psycopg.Error as e:
            raise BackendError(f"create_view {name!r} failed and was rolled back: "
                               f"{str(e).strip()}") from e
        self._plans[name] = p
        return p

    def _indexes(self, p: Plan, table: str, key: Sequence[str], nullable: frozenset[str]
                 ) -> None:
        """A unique index on the IDs, and an index per i-diff ID set the Δ-script matches on."""
        if key:
            nd = " NULLS NOT DISTINCT" if nullable else ""
            self.conn.execute(f"CREATE UNIQUE INDEX ON {qq(self.companion, table)} "
                              f"({', '.join(q(k) for k in key)}){nd}")
        seen = {tuple(key)}
        for s in p.statements:
            if isinstance(s, Apply) and s.target == table and s.ids and \
                    tuple(s.ids) not in seen:
                seen.add(tuple(s.ids))
                self.conn.execute(f"CREATE INDEX ON {qq(self.companion, table)} "
                                  f"({', '.join(q(k) for k in s.ids)})")

    def maintain(self, name: str) -> MaintenanceStats:
        """Fold the log since this view's last run into effective i-diffs, run the Δ-script in
        one transaction, and move the watermark. A failure rolls everything back."""
        p = self.plan_of(name)
        stats = MaintenanceStats(name)
        start = time.perf_counter()
        try:
            with self.conn.transaction():
                self._search_path()
                # Δ-script statements run once each over small i-diffs; a JIT compile of their
                # plan (triggered by cost estimates over unanalyzed temp tables) takes seconds
                self.conn.execute("SET LOCAL jit = off")
                for t in p.tables:
                    self.conn.execute(f"LOCK TABLE {qq(self.schema, t)} IN SHARE MODE")
                marks = {}
                for t in p.tables:
                    table = p.catalog.table(t)
                    _, upto = changelog.fold_into_temp(self.conn, self.schema, table, name,
                                                       change_table(t))
                    marks[t] = upto
                    row = self.conn.execute(f"SELECT count(*) FROM {q(change_table(t))}"
                                            ).fetchone()
                    stats.changes[t] = int(row[0]) if row else 0
                self._check_declared(p, stats)
                # no effective change: every i-diff is empty, and a recomputation is moot
                live = p.statements if any(stats.changes.values()) else ()
                created = self._run_script(live, stats)
                if created:  # one statement for all: each is a round trip
                    self.conn.execute("DROP TABLE IF EXISTS " + ", ".join(
                        f"pg_temp.{q(n)}" for n in created))
                for t, upto in marks.items():
                    changelog.set_watermark(self.conn, self.schema, t, name, upto)
                    changelog.prune(self.conn, self.schema, t)
                self.conn.execute(
                    f"UPDATE {qq(self.companion, REGISTRY)} SET last_maintained = now(), "
                    "runs = runs + 1 WHERE name = %s", (name,))
        except psycopg.Error as e:
            raise MaintenanceError(f"maintenance of {name!r} failed and was rolled back "
                                   f"(re-run it): {str(e).strip()}") from e
        stats.seconds = time.perf_counter() - start
        return stats

    def _run_script(self, statements: Sequence[Statement], stats: MaintenanceStats
                    ) -> list[str]:
        """Run the Δ-script, skipping work that empty i-diffs make moot: a rule whose input
        i-diffs are all empty yields none (its relation is only created, empty and unexecuted,
        if a later statement still reads it), an APPLY of an empty i-diff changes nothing, and
        EXISTS tests over empty i-diffs are pruned from the other statements (so a snapshot is
        driven by the i-diffs that hold rows, and can use the indexes on their IDs). Returns
        the temporary relations created."""
        empty = {change_table(t) for t, n in stats.changes.items() if n == 0}
        computed = {change_table(t) for t in stats.changes}
        skipped: dict[str, Compute] = {}
        created: list[str] = []

        def ensure(query: exp.Expr) -> None:
            """Create the skipped relations ``query`` reads (empty), theirs first."""
            for tb in query.find_all(exp.Table):
                skip = skipped.pop(tb.name, None)
                if skip is not None:
                    ensure(skip.query)
                    self.conn.execute(to_sql(skip, "postgres") + " WITH NO DATA")
                    created.append(skip.name)

        for s in statements:
            t0 = time.perf_counter()
            if isinstance(s, Compute):
                inputs = [tb.name for tb in s.query.find_all(exp.Table) if tb.name in computed]
                computed.add(s.name)
                if inputs and all(r in empty for r in inputs):
                    skipped[s.name] = s
                    empty.add(s.name)
                    stats.idiff_rows[s.name] = 0
                    continue
                run = Compute(s.name, prune_empty(s.query, empty), s.comment, s.phase)
                ensure(run.query)
                cur = self.conn.execute(to_sql(run, "postgres"))
                created.append(s.name)
                stats.idiff_rows[s.name] = cur.rowcount
                if cur.rowcount == 0:
                    empty.add(s.name)
                stats.statement_seconds.append((s.name, time.perf_counter() - t0))
                continue
            key = f"{s.kind} {s.diff}→{s.target}"
            if s.diff in empty and s.kind != "replace":  # an empty replace empties the view
                stats.applied_rows[key] = 0
                continue
            cur = self.conn.execute(to_sql(s, "postgres"))
            stats.applied_rows[key] = cur.rowcount
            stats.statement_seconds.append((key, time.perf_counter() - t0))
        return created

    def _check_declared(self, p: Plan, stats: MaintenanceStats) -> None:
        """Changes outside the plan's declared modification types would be silently lost."""
        for t, n in stats.changes.items():
            checks = p.undeclared_changes(t) if n else []
            if not checks:
                continue
            q = exp.select(*[exp.alias_(exp.Sum(this=exp.Case(
                ifs=[exp.If(this=pred, true=exp.Literal.number(1))],
                default=exp.Literal.number(0))), f"c{i}") for i, (_, pred) in enumerate(checks)]
            ).from_(exp.table_(exp.to_identifier(change_table(t), quoted=True)))
            row = self.conn.execute(q.sql("postgres")).fetchone()
            for (what, _), count in zip(checks, row or (), strict=False):
                if count:
                    raise IdivmError(f"{count} {what}(s) on {t}, but the view {p.name} was "
                                     "planned without them (changes=...)")

    def drop_view(self, name: str) -> None:
        """Remove the view, its stored table, caches, logging and registry entry."""
        p = self.plan_of(name)
        try:
            with self.conn.transaction():
                self.conn.execute(f"DROP VIEW IF EXISTS {qq(self.schema, name)}")
                for m in p.materialized:
                    self.conn.execute(f"DROP TABLE IF EXISTS {qq(self.companion, m.name)}")
                for t in p.tables:
                    changelog.uninstall(self.conn, self.schema, t, name)
                self.conn.execute(f"DELETE FROM {qq(self.companion, REGISTRY)} WHERE name = %s",
                                  (name,))
                left = self.conn.execute(f"SELECT count(*) FROM {qq(self.companion, REGISTRY)}"
                                         ).fetchone()
                if left is not None and left[0] == 0:  # the last view: nothing of ours remains
                    self.conn.execute(f"DROP SCHEMA {q(self.companion)} CASCADE")
        except psycopg.Error as e:
            raise BackendError(f"drop_view {name!r} failed: {str(e).strip()}") from e
        self._plans.pop(name, None)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Registered views, when they were last maintained and how many changes wait."""
        with self.conn.transaction():
            exists = self.conn.execute("SELECT to_regclass(%s)", (qq(self.companion, REGISTRY),)
                                       ).fetchone()
            if not exists or not exists[0]:
                return []
            rows = self.conn.execute(
                f"SELECT name, created, last_maintained, runs FROM "
                f"{qq(self.companion, REGISTRY)} ORDER BY name").fetchall()
            out = []
            for vname, created, last, runs in rows:
                if name is not None and vname != name:
                    continue
                p = self.plan_of(vname)
                pending = {t: self._pending(t, vname) for t in p.tables}
                out.append({"view": vname, "created": str(created), "last_maintained":
                            str(last) if last else None, "runs": runs,
                            "pending_log_rows": pending})
        return out


    def _pending(self, table: str, view: str) -> int:
        """Logged changes of ``table`` that ``view`` has not consumed yet."""
        mark = changelog.watermark(self.conn, self.schema, table, view)
        row = self.conn.execute(
            f"SELECT count(*) FROM {qq(self.companion, changelog.log_table_name(table))} "
            f"WHERE {q('__seq')} > %s", (mark,)).fetchone()
        return int(row[0]) if row else 0


def _as_url(dsn: str) -> str:
    """A libpq key=value DSN as the URL SQLAlchemy wants (URLs pass unchanged)."""
    if "://" in dsn:
        return dsn
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    d = conninfo_to_dict(dsn)
    port = d.get("port")
    return URL.create("postgresql+psycopg", username=_s(d.get("user")),
                      password=_s(d.get("password")), host=_s(d.get("host")),
                      port=int(str(port)) if port else None,
                      database=_s(d.get("dbname"))).render_as_string(hide_password=False)


def _s(v: object) -> str | None:
    return None if v is None else str(v)


def _redact(dsn: str) -> str:
    import re

    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", re.sub(r"password=\S+", "password=***",
                                                             dsn))
