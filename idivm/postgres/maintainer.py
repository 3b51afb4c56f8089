"""PostgreSQL backend: materialize views and caches, log changes, run Δ-scripts.

Layout: base tables and the user-facing view live in the user's schema; idivm's own relations
(the view's stored table with its hidden ID columns, caches, change logs, the registry) live in
the companion schema ``"<schema>__idivm"``. Every Δ-script runs in one transaction with
``search_path`` set to the companion schema then the user's schema, so the plan's unqualified
names resolve.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from sqlglot import exp

from idivm import hoist, pipeline
from idivm.catalog import Catalog, Table
from idivm.errors import (
    BackendError,
    CatalogError,
    IdivmError,
    MaintenanceError,
    UnsupportedSQL,
)
from idivm.frontend import relations_read
from idivm.plan import Plan, plan
from idivm.planner.model import MAX_IDENT, fit
from idivm.planner.selective import Recorded
from idivm.postgres import changelog, ddl_epoch
from idivm.postgres import compile as compile_
from idivm.postgres.statistics import PgStatistics
from idivm.refresh_cost import (
    REFRESH_STRATEGIES,
    Decision,
    History,
    RefreshStrategy,
    decide,
    planned,
    threshold,
)
from idivm.script import Apply

REGISTRY = "views"
# the advisory locks a create_view holds on its view's name, through its three transactions
# (the first key; the second: hashtext of the companion-qualified name)
CREATE_LOCK_CLASS = changelog.LOCK_CLASS + 1
REWRITE_TRIGGER = "idivm_guard_rewrite"


q = changelog.q  # one identifier quoted for PostgreSQL (remembered)


def qq(schema: str, name: str) -> str:
    return f"{q(schema)}.{q(name)}"


HISTORY = compile_.HISTORY


STALE_RETRIES = 3  # auto decisions made again when another session's refresh outdated them


class _StaleDecision(Exception):
    """An auto view's function refused a decision made from an older refresh history."""


class _StaleRegistry(Exception):
    """The procedures refused a call decided from a registry read before it changed."""


Info = dict[str, tuple[str, tuple[str, ...]]]  # view → (refresh strategy, relations it reads)


@dataclass(frozen=True)
class _Cost:
    """An auto view's refresh history as its decisions use it."""

    history: History
    base_rows: int | None  # the tables' rows at the newest refresh
    history_id: int | None  # the newest row of refresh_history the history holds
    warm: bool = False  # a Δ-script run that was not its session's first is among them


@dataclass
class MaintenanceStats:
    """What one ``maintain`` did: rows per i-diff, time per statement, what ran and why."""

    view: str
    # base table → effective changes (keys) the view can see (``planner.log_filter``); a table
    # the Δ-script reads unfolded (sums only, ``planner.linear``): its log rows, an update
    # counting twice
    changes: dict[str, int] = field(default_factory=dict)
    idiff_rows: dict[str, int] = field(default_factory=dict)  # temp relation → rows
    applied_rows: dict[str, int] = field(default_factory=dict)  # "kind diff→target" → rows
    statement_seconds: list[tuple[str, float]] = field(default_factory=list)
    seconds: float = 0.0  # the maintain call's, as the caller waited for it
    # the view's compiled function's own, from its first statement to its return (not the
    # lock wait, the commit, the prune after it, nor the round trip)
    function_seconds: float = 0.0
    # the views this one reads, maintained first in the same transaction: name → their stats
    upstream: dict[str, MaintenanceStats] = field(default_factory=dict)
    # what ran and why, as Spark's stats.decision: choice (id: the Δ-script, or recompute),
    # reason, and for an ``auto`` refresh the estimates (maintain_estimate,
    # recompute_estimate, changes, base_rows); strategy: id, tuple or recompute
    _decision: dict[str, Any] = field(default_factory=dict)
    log_rows: dict[str, int] = field(default_factory=dict)  # base table → log rows consumed
    # an auto refresh's estimates at the log rows it counted and their reason, worked out
    # when ``decision`` is first read (the model's evaluation is not on the refresh's path)
    _explain: Callable[[], Mapping[str, Any]] | None = field(default=None, repr=False,
                                                             compare=False)

    @classmethod
    def of(cls, name: str, stats: Mapping[str, Any]) -> MaintenanceStats:
        """From the statistics a compiled maintenance function returns."""
        decision = dict(stats.get("decision") or {})
        secs = stats["statement_seconds"]  # (labels and seconds: compile._records_jsonb)
        if stats.get("strategy"):
            decision["strategy"] = str(stats["strategy"])
        return cls(name, {k: int(v) for k, v in stats["changes"].items()},
                   {k: int(v) for k, v in stats["idiff_rows"].items()},
                   {k: int(v) for k, v in stats["applied_rows"].items()},
                   [(str(k), float(v)) for k, v in zip(secs["labels"] or (),
                                                       secs["seconds"] or (), strict=True)],
                   float(stats.get("seconds") or 0.0),
                   function_seconds=float(stats.get("seconds") or 0.0), _decision=decision,
                   log_rows={k: int(v) for k, v in (stats.get("log_rows") or {}).items()})

    @property
    def decision(self) -> dict[str, Any]:
        """What ran and why (see ``_decision``)."""
        if self._explain is not None:
            explain, self._explain = self._explain, None
            self._decision.update(explain())
        return self._decision

    @property
    def choice(self) -> str:
        """``id`` (the Δ-script ran) or ``recompute``."""
        return str(self._decision.get("choice", "id"))

    @property
    def reason(self) -> str:
        return str(self.decision.get("reason", ""))

    def as_dict(self) -> dict[str, Any]:
        out = {"view": self.view, "changes": self.changes, "idiff_rows": self.idiff_rows,
               "applied_rows": self.applied_rows, "seconds": self.seconds,
               "function_seconds": self.function_seconds,
               "statement_seconds": self.statement_seconds, "decision": self.decision,
               "log_rows": self.log_rows}
        if self.upstream:
            out["upstream"] = {k: v.as_dict() for k, v in self.upstream.items()}
        return out


def _estimates(n: int, cost: _Cost, warm: bool, choice: str, ran: str) -> dict[str, Any]:
    """An auto refresh's estimates at the ``n`` log rows it counted, from the history its
    threshold came from (``decide``), and their reason where the model chose what ran."""
    d = decide("auto", n, cost.base_rows, cost.history, "postgres", warm_session=warm)
    out: dict[str, Any] = {"maintain_estimate": d.maintain_estimate,
                           "recompute_estimate": d.recompute_estimate}
    if d.choice == choice:
        out["reason"] = d.reason + (compile_.REBUILD_REASON if ran == "rebuild" else "")
    return out


def _warmed(stats: Mapping[str, Any]) -> set[str]:
    """The views of a ``CALL``'s statistics whose Δ-script ran over changes — as the compiled
    code sets its session's warm flag: a recomputation, a rebuild or a run with nothing
    pending plans none of the Δ-script's statements."""
    runs = dict(stats.get("views") or {}) | dict(stats.get("upstream") or {})
    if stats.get("view") is not None:
        runs[str(stats["view"])] = stats
    return {str(v) for v, s in runs.items()
            if s.get("strategy") in ("id", "tuple")
            and any(int(n) > 0 for n in (s.get("changes") or {}).values())}


class PostgresMaintainer:
    """Deferred ID-based maintenance of materialized views on one PostgreSQL schema.

    ``create_view`` compiles the view's Δ-script once into server-side code (the function
    ``"<schema>__idivm".maintain__<n>(decision)``, which can also recompute the view) and
    ``maintain`` is then one ``CALL "<schema>__idivm".maintain('<view>')`` — which a user can
    also run from psql or a scheduler inside the database. No base table is locked: a
    maintain consumes exactly the logged changes of the transactions its REPEATABLE READ
    snapshot sees.
    """

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        self.dsn = dsn
        self.conn = self._connect()
        if schema is None:
            row = self.conn.execute("SELECT current_schema()").fetchone()
            schema = str(row[0]) if row and row[0] else "public"
        self.schema = schema
        self.companion = changelog.companion_schema(schema)
        self._plans: dict[str, Plan] = {}
        self._histories = False  # the companion was seen with its refresh history
        # per auto view, what its decisions rest on: its History, the tables' rows at its
        # newest refresh, the newest refresh_history id (read once, then kept up to date from
        # what each maintain returns; a maintain that finds a newer row refuses the decision)
        self._costs: dict[str, _Cost] = {}
        # view → the auto decision last passed, with the _Cost and session warmth it came
        # from: a refresh that consumed nothing leaves the _Cost as it was, and the next
        # decision is the same dict (no threshold evaluated: a view no batch changes)
        self._decided: dict[str, tuple[_Cost, bool, dict[str, Any], str]] = {}
        # the views whose Δ-script this connection's session has run over changes (its
        # statements planned): their next runs are warm (the compiled code's own flag)
        self._ran: set[str] = set()
        # the registry as the last maintain read it, and its ``registry_token``: later
        # maintains decide from it without reading it again (a round trip, 0.3–0.6 ms of a
        # 1–2 ms refresh), and send the token, which the procedures refuse once the registry
        # has changed (another session created or dropped a view): then it is read again
        self._info: tuple[Info, str] | None = None

    # -- helpers ---------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        try:
            # autocommit: every unit of work opens its own transaction, and the maintain
            # procedure manages its transactions itself
            return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as e:
            raise BackendError(f"cannot connect to PostgreSQL with DSN {_redact(self.dsn)!r}: "
                               f"{str(e).strip()}") from e

    def _new_session(self) -> None:
        """``conn`` replaced by a new session (settings made on the old one do not carry
        over). PL/pgSQL keeps the compiled code of a function the session ran, and the
        cached plans of its statements, until the session ends — also once the function is
        dropped — and every invalidation message another session sends (a DDL statement, a
        temporary table) walks all of those plans: a session that had maintained and dropped
        the views of six TPC-H queries held 5,475 plans in 107 MB, and by the twenty-second
        query a maintain after another session's CREATE TEMP TABLE spent 30–80 ms outside its
        function. Its views' next runs are cold (planned again)."""
        old, self.conn = self.conn, self._connect()
        old.close()
        self._ran.clear()

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

    def _check_layout(self) -> None:
        """A companion schema made by an idivm from before compiled maintenance has another
        registry: say what to do rather than fail on a missing column."""
        row = self.conn.execute(
            "SELECT count(*) FILTER (WHERE column_name = 'function'), count(*) "
            "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (self.companion, REGISTRY)).fetchone()
        if row is not None and row[1] and not row[0]:
            raise BackendError(
                f"the views in schema {self.schema!r} were created by an older idivm (before "
                f"compiled maintenance); drop them (DROP SCHEMA {q(self.companion)} CASCADE, "
                "and the views in the schema) and create them again")

    def _registry(self) -> None:
        self._check_layout()
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(self.companion)}")
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {qq(self.companion, REGISTRY)} ("
            "name text PRIMARY KEY, sql text NOT NULL, changes jsonb, "
            "strategy text NOT NULL DEFAULT 'id', catalog text NOT NULL, "
            "tables text[] NOT NULL, relations text[] NOT NULL, "
            "function text NOT NULL, prune_function text NOT NULL, "
            "format_version int NOT NULL, fingerprints jsonb NOT NULL, "
            "created timestamptz NOT NULL DEFAULT now(), last_maintained timestamptz, "
            "runs bigint NOT NULL DEFAULT 0)")
        # set by a recomputation of the view alone (its caches then stale until a rebuild)
        self.conn.execute(f"ALTER TABLE {qq(self.companion, REGISTRY)} ADD COLUMN IF NOT EXISTS "
                          "caches_stale boolean NOT NULL DEFAULT false")
        # the view that made this one of a CTE it reads twice (create_view), dropped with it
        self.conn.execute(f"ALTER TABLE {qq(self.companion, REGISTRY)} ADD COLUMN IF NOT EXISTS "
                          "owner text")
        # the query as create_view was given it, when ``sql`` reads such views instead
        self.conn.execute(f"ALTER TABLE {qq(self.companion, REGISTRY)} ADD COLUMN IF NOT EXISTS "
                          "written text")
        # the σ over a scan the plan stores as caches (``planner/selective.py``), decided from
        # the tables' statistics at create_view: a re-plan from the registry makes the same
        self.conn.execute(f"ALTER TABLE {qq(self.companion, REGISTRY)} ADD COLUMN IF NOT EXISTS "
                          "selective text[]")
        # the indexes it made on the stores of views it reads (``Plan.input_lookups``), shared
        # with the other views that ask for the same: dropped with the last of them
        self.conn.execute(f"ALTER TABLE {qq(self.companion, REGISTRY)} ADD COLUMN IF NOT EXISTS "
                          "indexes text[]")
        self.conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {qq(self.companion, 'compiled')}")
        self.conn.execute(compile_.fingerprint_source(self.companion))
        self.conn.execute(compile_.history_source(self.companion))
        changelog.install_shared(self.conn, self.schema)  # (compiled code reads log_counts)

    def _install_dispatcher(self) -> None:
        """(Re)generate the companion's ``maintain`` procedure from the registry; call under
        ``lock_companion`` in a READ COMMITTED transaction (so every committed view is seen)."""
        rows = self.conn.execute(
            f"SELECT name, function, prune_function, tables, strategy FROM "
            f"{qq(self.companion, REGISTRY)} ORDER BY name").fetchall()
        names = {str(r[0]) for r in rows}
        entries = [compile_.Entry(str(n), str(f), str(pf), tuple(ts),
                                  tuple(t for t in ts if t in names))
                   for n, f, pf, ts, _ in rows]
        token = compile_.registry_token((r[0], r[4], r[3]) for r in rows)
        self._info = None
        for e in entries:  # (views created by an older idivm have none yet)
            lock = compile_.lock_relation(e.name)
            if not self._has(lock):
                self.conn.execute(f"CREATE VIEW {qq(self.companion, lock)} AS SELECT")
        self.conn.execute(compile_.dispatcher(self.schema, self.companion, entries, token))

    def _entry(self, name: str) -> dict[str, Any]:
        row = None
        exists = self.conn.execute("SELECT to_regclass(%s)", (qq(self.companion, REGISTRY),)
                                   ).fetchone()
        if exists and exists[0]:
            self._check_layout()
            cur = self.conn.execute(
                f"SELECT sql, changes, strategy, catalog, tables, relations, function, "
                f"prune_function, fingerprints, format_version, "
                f"to_jsonb(v) -> 'selective' AS selective, to_jsonb(v) -> 'indexes' AS indexes "
                f"FROM {qq(self.companion, REGISTRY)} AS v "
                "WHERE name = %s", (name,))
            row = cur.fetchone()
            if row is not None and cur.description is not None:
                return dict(zip([d.name for d in cur.description], row, strict=True))
        raise BackendError(f"no idivm view {name!r} in schema {self.schema!r}")

    def plan_of(self, name: str) -> Plan:
        """The view's plan, from what was stored when it was created (not from the tables as
        they are now: a column added since changes nothing)."""
        if name not in self._plans:
            e = self._entry(name)
            self._plans[name] = plan(e["sql"], Catalog.from_ddl(e["catalog"]), name=name,
                                     changes=e["changes"], strategy=planned(e["strategy"]),
                                     schema=self.schema,
                                     statistics=Recorded(frozenset(e["selective"] or ())),
                                     merge=compile_.MERGE)
        return self._plans[name]

    def definitions(self) -> dict[str, str]:
        """The schema's views → the query each was created with (not the views create_view
        made of their CTEs)."""
        if not self._has(REGISTRY):
            return {}
        rows = self.conn.execute(
            "SELECT v.name, coalesce(to_jsonb(v) ->> 'written', v.sql) "
            f"FROM {qq(self.companion, REGISTRY)} AS v "
            "WHERE to_jsonb(v) ->> 'owner' IS NULL").fetchall()
        return {str(n): str(q_) for n, q_ in rows}

    def dependencies(self) -> dict[str, tuple[str, ...]]:
        """The schema's views → the relations each reads (tables and views)."""
        return self._views()

    def _views(self) -> dict[str, tuple[str, ...]]:
        """The views of this schema → the relations each reads (tables and views)."""
        if not self._has(REGISTRY):
            return {}
        self._check_layout()
        rows = self.conn.execute(f"SELECT name, tables FROM {qq(self.companion, REGISTRY)}"
                                 ).fetchall()
        return {str(n): tuple(ts) for n, ts in rows}

    def _as_table(self, view: str) -> Table:
        """A view as a table of the views over it (``pipeline.input_table``)."""
        return pipeline.input_table(view, self.plan_of(view),
                                    changelog.column_types(self.conn, self.schema, view))

    # -- API ---------------------------------------------------------------------------------
    def create_view(self, name: str, view_sql: str,
                    changes: Mapping[str, Sequence[str]] | None = None,
                    catalog: Catalog | None = None, strategy: RefreshStrategy = "id") -> Plan:
        """Materialize the view and its caches, start logging its base tables and install its
        compiled Δ-script. ``strategy``: ``id`` (ID-based, the default), ``auto`` (each
        ``maintain`` runs the ID-based Δ-script or recomputes, whichever ``refresh_cost``
        estimates cheaper from the pending changes, the tables' sizes and the view's
        ``refresh_history``), ``tuple`` (tuple-based t-diffs, the baseline) or ``recompute``.

        Unless it recomputes, a WITH query the view reads more than once (an aggregate:
        ``hoist.shared_ctes``) becomes a view of its own, ``<name>__<cte>``, maintained once
        per refresh ahead of the view, which reads its changes like a table's; the registry
        records the view as its ``owner``, and ``drop_view(name)`` drops it too. A CTE that
        cannot key such a view (its IDs hidden or nullable) stays inline, as does every CTE
        when ``changes`` is declared.

        Unsupported SQL raises before anything is created; any failure rolls back. Writers
        are held up only while the logging triggers are installed, not while the view is
        computed.
        """
        if len(name.encode()) > MAX_IDENT:
            raise BackendError(f"view name {name!r} is longer than PostgreSQL's "
                               f"{MAX_IDENT}-byte identifiers")
        views = self._views()
        if name in views or changes or strategy == "recompute":
            return self._create_view(name, view_sql, changes, catalog, strategy)
        for v in self._owned(name):  # left by a create_view of this name that did not finish
            self._drop_view(v, cascade=True)
        hoisted = self._hoistable(name, view_sql, catalog, strategy)
        if not hoisted:
            return self._create_view(name, view_sql, changes, catalog, strategy)
        return hoist.create_with_views(
            name, view_sql, hoisted,
            lambda v, q_: self._create_view(v, q_, None, catalog, strategy),  # (no changes)
            self._annotate, self._drop_made)

    def _lost(self, name: str, e: BaseException) -> BackendError:
        """The error of a create_view whose connection was lost: whether what it had made
        committed is unknown, so nothing could be undone."""
        return BackendError(
            f"create_view {name!r} failed: the connection was lost ({str(e).strip()}), so "
            "what it had made may remain; status() says what: the view, or an 'unfinished "
            f"create_view' — the logging it had installed, which create_view({name!r}, …) "
            f"again completes and drop_view({name!r}) removes")

    def _annotate(self, view: str, **entries: str) -> None:
        """Set registry columns of ``view`` (``owner``, ``written``)."""
        for column, value in entries.items():
            self.conn.execute(f"UPDATE {qq(self.companion, REGISTRY)} SET {q(column)} = %s "
                              "WHERE name = %s", (value, view))

    def _drop_made(self, view: str) -> None:
        if view in self._views():
            self._drop_view(view, cascade=True)

    def _hoistable(self, name: str, view_sql: str, catalog: Catalog | None,
                   strategy: RefreshStrategy) -> dict[str, tuple[str, str]]:
        """The view's CTEs to hold as views of their own (``hoist.chosen``): those that plan
        as a view over the schema's tables alone, keyed by IDs it shows and never NULL, under
        a name free in the schema. Plans only; creates nothing."""
        views = set(self._views())

        def holdable(view: str, body: str) -> bool:
            row = self.conn.execute("SELECT to_regclass(%s)", (qq(self.schema, view),)
                                    ).fetchone()
            if view in views or (row and row[0]) \
                    or relations_read(body, schema=self.schema) & views:
                return False
            try:
                pipeline.check_input(view, plan(body, catalog or self.catalog(), name=view,
                                                strategy=planned(strategy),
                                                schema=self.schema))
            except IdivmError:
                return False  # (inline, as the planner takes it)
            return True

        return hoist.chosen(name, view_sql, holdable)

    def _create_view(self, name: str, view_sql: str,
                     changes: Mapping[str, Sequence[str]] | None,
                     catalog: Catalog | None, strategy: RefreshStrategy) -> Plan:
        """``create_view`` of one view, as written, holding the view's create lock (a
        session-level advisory lock: it ends with the session, however the session ends)
        from before it installs the logging to after it has installed the view — what tells
        a create_view in progress from an unfinished one (``unfinished``)."""
        key = self._create_lock(name)
        self.conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", key)
        try:
            return self._create_one(name, view_sql, changes, catalog, strategy)
        finally:
            if not (self.conn.closed or self.conn.broken):
                self.conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", key)

    def _create_lock(self, name: str) -> tuple[int, str]:
        """The keys of view ``name``'s create lock: its class, and the text whose
        ``hashtext`` is the second key (``_unregistered`` finds it in ``pg_locks`` so)."""
        return CREATE_LOCK_CLASS, f"{self.companion}.{name}"

    def _create_one(self, name: str, view_sql: str,
                    changes: Mapping[str, Sequence[str]] | None,
                    catalog: Catalog | None, strategy: RefreshStrategy) -> Plan:
        """``_create_view``'s work."""
        full = catalog or self.catalog()
        reads = relations_read(view_sql, schema=self.schema)
        pipeline.check_reads(name, reads)
        upstream = sorted(reads & set(self._views()))
        if upstream:  # views of this schema it reads: tables keyed by their IDs
            full = Catalog.of([*(t for n, t in full.tables.items() if n not in upstream),
                               *(self._as_table(v) for v in upstream)])
        # id-based plans store a σ a join reads as a cache where it keeps few of the
        # table's rows, by PostgreSQL's estimates now (the tuple baseline as it was)
        p = plan(view_sql, full, name=name, changes=changes, strategy=planned(strategy),
                 schema=self.schema, statistics=PgStatistics(self.conn, self.schema)
                 if planned(strategy) == "id" else None, merge=compile_.MERGE)
        for v in upstream:  # it starts from their state now (then both move together)
            self.maintain(v)
        self._check_functions(view_sql)
        # the plan's catalog holds just the columns the view reads: the log holds those, and
        # DDL on the others is absorbed
        read = p.catalog
        try:
            # 1. logging (a short transaction: trigger DDL waits for in-flight writers)
            with self.conn.transaction():
                changelog.lock_companion(self.conn, self.schema)
                self._registry()
                taken = self.conn.execute("SELECT to_regclass(%s)", (qq(self.schema, name),)
                                          ).fetchone()
                if taken and taken[0]:
                    raise BackendError(f"{self.schema}.{name} already exists")
                seen = compile_.visible(p)  # the row images it can see, per table
                for t in p.tables:
                    # a view it reads is logged from the writes to its stored table
                    source = (self.companion, self.plan_of(t).store.name) \
                        if t in upstream else None
                    if source is not None:  # IDs never NULL (_as_table): PostgreSQL enforces it
                        self.conn.execute(f"ALTER TABLE {qq(*source)} " + ", ".join(
                            f"ALTER COLUMN {q(k)} SET NOT NULL"
                            for k in read.table(t).primary_key))
                    self._check_key(t, read.table(t).primary_key, source)
                    changelog.install(self.conn, self.schema, read.table(t), name,
                                      read.table(t).column_names, source, seen.get(t))
            if changelog.install_guard(self.conn):
                self._install_rewrite_guard()
                ddl_epoch.install(self.conn)
        except psycopg.Error as e:
            if self.conn.closed or self.conn.broken:
                raise self._lost(name, e) from e
            raise BackendError(f"create_view {name!r} failed and was rolled back: "
                               f"{str(e).strip()}") from e
        try:
            # 2. the view, in one snapshot: it holds exactly the changes committed before it,
            # and the watermark says so
            with self.conn.transaction():
                self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                self._search_path()
                seconds = 0.0  # the view's own (from the base tables, as a recomputation)
                for m, query in p.materialize_queries():
                    t1 = time.perf_counter()
                    # fillfactor: room for HOT updates of the columns APPLYs set
                    if m is p.store and len(p.materialized) > 1:
                        # shaped by the query over the caches (the Δ-script's), filled as a
                        # recomputation fills it: timed, the cost model's first measure of one
                        self.conn.execute(f"CREATE TABLE {qq(self.companion, m.name)} WITH "
                                          f"(fillfactor = 90) AS {query.sql('postgres')} "
                                          "WITH NO DATA")
                        t1 = time.perf_counter()
                        self.conn.execute(f"INSERT INTO {qq(self.companion, m.name)} "
                                          f"{p.store_query().sql('postgres')}")
                    else:
                        self.conn.execute(f"CREATE TABLE {qq(self.companion, m.name)} WITH "
                                          f"(fillfactor = 90) AS {query.sql('postgres')}")
                    self._indexes(p, m.name, m.key, m.nullable, m.lookups)
                    self.conn.execute(f"ANALYZE {qq(self.companion, m.name)}")
                    if m is p.store:
                        seconds = time.perf_counter() - t1
                cols = ", ".join(q(c) for c in p.columns)
                self.conn.execute(f"CREATE VIEW {qq(self.schema, name)} AS SELECT {cols} FROM "
                                  f"{qq(self.companion, p.store.name)}")
                sources = self._sources(p)
                fingerprints = {t: self._fingerprint(t, read.table(t).column_names,
                                                     sources.get(t))
                                for t in p.tables}
                self._check_not_null(read, [t for t in p.tables if t not in sources])
                compiled = self._install_code(p, read, fingerprints, strategy)
                # the materialization, timed: the cost model's first measure of a recompute
                # (a rebuild's — every stored relation — is estimated from it until one runs)
                self.conn.execute(
                    f"INSERT INTO {qq(self.companion, HISTORY)} (view, strategy, changes, "
                    f"seconds, base_rows, reason) VALUES (%s, 'create', 0, %s, "
                    f"{qq(self.companion, 'relation_rows')}(%s), %s)",
                    (name, seconds, self._relations(p.tables, sources),
                     "create_view: the view materialized from its query"))
                indexes = self._lookup_indexes(p, upstream)
                self.conn.execute(
                    f"INSERT INTO {qq(self.companion, REGISTRY)} (name, sql, changes, strategy, "
                    "catalog, tables, relations, function, prune_function, format_version, "
                    "fingerprints, selective, indexes) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (name, view_sql, json.dumps(dict(changes)) if changes else None, strategy,
                     ";\n".join(read.ddl()), list(p.tables), [m.name for m in p.materialized],
                     compiled.function, compiled.prune_function, compile_.FORMAT_VERSION,
                     json.dumps(fingerprints), sorted(p.selective), indexes))
                if p.tables:  # a view over no table consumes no log
                    changelog.advance(self.conn, self.schema, name)
        except (psycopg.Error, IdivmError) as e:
            if self.conn.closed or self.conn.broken:
                raise self._lost(name, e) from e
            self._uninstall(name, p.tables)
            if isinstance(e, IdivmError):
                raise
            raise BackendError(f"create_view {name!r} failed and was rolled back: "
                               f"{str(e).strip()}") from e
        try:
            # 3. the maintain procedure, now with a branch for this view
            with self.conn.transaction():
                changelog.lock_companion(self.conn, self.schema)
                self._install_dispatcher()
        except psycopg.Error as e:
            if self.conn.closed or self.conn.broken:
                raise self._lost(name, e) from e
            self._drop_view(name, cascade=False)
            raise BackendError(f"create_view {name!r} failed and was rolled back: "
                               f"{str(e).strip()}") from e
        self._plans[name] = p
        self._costs.pop(name, None)
        return p

    def _check_key(self, table: str, key: Sequence[str],
                   source: tuple[str, str] | None = None) -> None:
        """The log of a table is folded by its key: refuse a table whose key PostgreSQL does
        not enforce (a catalog may declare one the table does not have), as maintenance
        would. ``source``: the relation holding the table's rows, if not the table."""
        row = self.conn.execute(f"SELECT {qq(self.companion, 'table_has_key')}(%s, %s)",
                                (qq(*(source or (self.schema, table))), list(key))).fetchone()
        if not (row and row[0]):
            raise UnsupportedSQL(
                f"table {table} without an enforced key ({', '.join(key)})",
                "its change log is folded by that key, so PostgreSQL must enforce it: a "
                "PRIMARY KEY or UNIQUE index over NOT NULL columns")

    def _install_rewrite_guard(self) -> None:
        """The DDL guard at ``table_rewrite`` too (a column retyped USING an expression
        changes its values behind the log); superusers only, like the guard itself."""
        try:
            with self.conn.transaction():
                self.conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (changelog.LOCK_CLASS,))
                row = self.conn.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = %s",
                                        (REWRITE_TRIGGER,)).fetchone()
                if row is None:
                    self.conn.execute(
                        f"CREATE EVENT TRIGGER {q(REWRITE_TRIGGER)} ON table_rewrite "
                        "WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION "
                        f"{qq(changelog.GUARD_SCHEMA, changelog.GUARD_FUNCTION)}()")
        except psycopg.errors.InsufficientPrivilege:
            pass

    def _check_functions(self, view_sql: str) -> None:
        """Refuse a view calling a function that can return another value for the same
        arguments without a logged change: a user function (or an operator's) not IMMUTABLE
        (one reading another table, say), or any VOLATILE one. PostgreSQL resolves the calls
        (overloads, operators, casts, aggregates) in a temporary view that is rolled back, and
        its stored query tree names every function it calls. (Built-in STABLE functions, such
        as ``to_char`` or ``timestamptz::date``, depend only on settings: left alone.)"""
        body = view_sql.strip().rstrip(";")
        probe = "idivm__probe"
        bad: list[tuple[str, str]] = []
        try:
            with self.conn.transaction(force_rollback=True):
                self.conn.execute(f"SET LOCAL search_path = {q(self.schema)}")
                self.conn.execute(f"CREATE TEMP VIEW {q(probe)} AS SELECT 1 FROM (\n{body}\n) "
                                  f"AS {q(probe)}")
                bad = [(str(r[0]), str(r[1])) for r in self.conn.execute(
                    "SELECT DISTINCT f.oid::regprocedure::text, f.provolatile::text "
                    "FROM pg_rewrite r, regexp_matches(r.ev_action::text, "
                    "':(?:funcid|opfuncid|aggfnoid|winfnoid) (\\d+)', 'g') AS m(oid) "
                    "JOIN pg_proc f ON f.oid = m.oid[1]::oid "
                    "WHERE r.ev_class = to_regclass(%s) AND (f.provolatile = 'v' OR "
                    "(f.provolatile = 's' AND f.pronamespace <> 'pg_catalog'::regnamespace)) "
                    "ORDER BY 1", (f"pg_temp.{q(probe)}",)).fetchall()]
        except psycopg.Error:
            return  # not a query PostgreSQL can run as a view: creating it fails and says why
        if bad:
            sig, vol = bad[0]
            kind = {"s": "STABLE", "v": "VOLATILE"}.get(vol, vol)
            raise UnsupportedSQL(f"non-immutable function {sig}",
                                 f"it is {kind}: it can return another value for the same "
                                 "arguments (reading another table, the clock or a setting) "
                                 "without any change to the tables the view reads; only "
                                 "IMMUTABLE functions can be maintained")

    def _fingerprint(self, table: str, columns: Sequence[str],
                     source: tuple[str, str] | None = None) -> str:
        row = self.conn.execute(f"SELECT {qq(self.companion, 'table_fingerprint')}(%s, %s)",
                                (qq(*(source or (self.schema, table))), list(columns))
                                ).fetchone()
        return str(row[0]) if row else ""

    def _check_not_null(self, read: Catalog, tables: Sequence[str]) -> None:
        """Refuse a catalog declaring NOT NULL a column the table lets be NULL: the plan
        relies on it (NOT IN; the compiled code's sums), and maintenance checks it stays."""
        for t in tables:
            strict = list(read.table(t).not_null_non_key_columns)
            if not strict:
                continue
            row = self.conn.execute(f"SELECT {compile_.lost_not_null_sql('%s', '%s')}",
                                    (qq(self.schema, t), strict)).fetchone()
            if row and row[0] is not None:
                raise CatalogError(f"the catalog declares column {row[0]} of table "
                                   f"{self.schema}.{t} NOT NULL, but the table lets it be "
                                   "NULL: declare it NOT NULL (ALTER TABLE … SET NOT NULL) "
                                   "or give a catalog that says so")

    def _sources(self, p: Plan) -> dict[str, tuple[str, str]]:
        """The views ``p`` reads → their stored tables (where their rows are written)."""
        views = self._views()
        return {t: (self.companion, self.plan_of(t).store.name) for t in p.tables
                if t in views and t != p.name}

    def _relations(self, tables: Sequence[str], sources: Mapping[str, tuple[str, str]]
                   ) -> list[str]:
        """The relations holding the rows of ``tables`` (an upstream view: its stored table),
        qualified and quoted (``relation_rows`` counts them)."""
        return [qq(*sources.get(t, (self.schema, t))) for t in tables]

    def _install_code(self, p: Plan, read: Catalog, fingerprints: Mapping[str, str],
                      refresh: str | None = None) -> compile_.Compiled:
        row = self.conn.execute("SELECT nextval(to_regclass(%s))",
                                (qq(self.companion, "compiled"),)).fetchone()
        # the tag names the code and its scratch relations: unique beyond the companion's
        # sequence, which restarts when the last view's companion schema is dropped (and a
        # session may still hold cached plans of functions of the same names)
        tag = f"{int(row[0]) if row else 0}_{secrets.token_hex(3)}"
        types = {t: changelog.column_types(self.conn, self.schema, t) for t in p.tables}
        compiled = compile_.compile_view(p, self.schema, self.companion, tag,
                                         {t: read.table(t) for t in p.tables}, fingerprints,
                                         types, self._sources(p), refresh,
                                         ddl_logged=ddl_epoch.installed(self.conn))
        for stmt in compiled.source:
            self.conn.execute(stmt)
        return compiled

    def _indexes(self, p: Plan, table: str, key: Sequence[str], nullable: frozenset[str],
                 lookups: Sequence[tuple[str, ...]] = ()) -> None:
        """A unique index on the IDs, an index per i-diff ID set the Δ-script matches on, and
        one per set of columns the rules read ranges of (``Materialized.lookups``)."""
        if key:
            nd = " NULLS NOT DISTINCT" if nullable else ""
            self.conn.execute(f"CREATE UNIQUE INDEX ON {qq(self.companion, table)} "
                              f"({', '.join(q(k) for k in key)}){nd}")
        seen = {tuple(key)}
        for cols in lookups:
            if cols not in seen:
                seen.add(cols)
                self.conn.execute(f"CREATE INDEX ON {qq(self.companion, table)} "
                                  f"({', '.join(q(k) for k in cols)})")
        for s in p.statements:
            if isinstance(s, Apply) and s.target == table and s.ids and \
                    tuple(s.ids) not in seen:
                seen.add(tuple(s.ids))
                self.conn.execute(f"CREATE INDEX ON {qq(self.companion, table)} "
                                  f"({', '.join(q(k) for k in s.ids)})")

    def _lookup_indexes(self, p: Plan, upstream: Sequence[str]) -> list[str]:
        """Index the stored tables of the views ``p`` reads on the columns its Δ-script finds
        their rows by (``Plan.input_lookups``: a MAX re-derived over a view, the rows equal to
        its old or new value): probes instead of scans of the whole view. One index per store
        and columns, shared by the views that ask for it; returns their names."""
        made = []
        for table, cols in p.input_lookups:
            if table not in upstream:
                continue  # (the user's tables are theirs to index)
            store = self.plan_of(table).store
            if tuple(store.key[:len(cols)]) == cols:
                continue  # (its unique index serves)
            index = lookup_index(store.name, cols)
            self.conn.execute(f"CREATE INDEX IF NOT EXISTS {q(index)} ON "
                              f"{qq(self.companion, store.name)} "
                              f"({', '.join(q(c) for c in cols)})")
            made.append(index)
        return made

    def maintain(self, name: str, strategy: RefreshStrategy | None = None
                 ) -> MaintenanceStats:
        """Run the view's compiled Δ-script over the changes committed since its last run —
        or, for an ``auto`` view whose recomputation ``refresh_cost`` estimates cheaper,
        recompute it (the choice and its reason: ``stats.decision``): one ``CALL``, one
        REPEATABLE READ transaction; a failure rolls everything back. ``strategy`` overrides
        the view's for this refresh (``id``, ``recompute``, or ``auto``: estimate both). A
        view that reads other views is maintained after them (transitively, each once, each
        by its own strategy), in the same transaction: one snapshot of the base tables for
        all; their statistics are in ``upstream``."""
        start = time.perf_counter()
        with _before_call(repr(name)):
            kept = self._info
            try:
                if kept is None:
                    raise _StaleRegistry
                stats = self._maintain_one(name, strategy, kept[0], kept[1])
            except _StaleRegistry:  # (read again; the call decided from it names no registry)
                stats = self._maintain_one(name, strategy, self._refresh_info(), None)
        out = self._stats(name, stats)
        out.upstream = {k: self._stats(k, v) for k, v in (stats.get("upstream") or {}).items()}
        out.seconds = time.perf_counter() - start
        return out

    def _maintain_one(self, name: str, strategy: RefreshStrategy | None, info: Info,
                      registry: str | None) -> dict[str, Any]:
        """``maintain``'s ``CALL``, decided from ``info`` (``registry``: its token, when it
        was read by an earlier maintain)."""
        if strategy and name not in info:
            self._entry(name)  # (raises: no such view)
        order = pipeline.order(_upstream(info), [name]) if name in info else []
        return self._decided_call(name, order, info, {name: strategy} if strategy else {},
                                  registry)

    def maintain_all(self, strategy: RefreshStrategy | None = None
                     ) -> dict[str, MaintenanceStats]:
        """Maintain every view of the schema in dependency order, in one transaction (one
        snapshot of the base tables): view name → its statistics. ``strategy`` as
        ``maintain``'s, for each view it applies to (not ``id`` to a ``recompute`` view, nor
        ``tuple`` to a view of another strategy)."""
        with _before_call(f"the views of schema {self.schema!r}"):
            kept = self._info
            try:
                if kept is None or not kept[0]:
                    raise _StaleRegistry
                stats = self._maintain_every(strategy, kept[0], kept[1])
            except _StaleRegistry:  # (read again, as ``maintain``)
                if not self._views():
                    return {}
                if not self._has_procedure("maintain_all"):  # a companion from before pipelines
                    self._recompile_stale(None)
                stats = self._maintain_every(strategy, self._refresh_info(), None)
        return {k: self._stats(k, v) for k, v in (stats.get("views") or {}).items()}

    def _maintain_every(self, strategy: RefreshStrategy | None, info: Info,
                        registry: str | None) -> dict[str, Any]:
        """``maintain_all``'s ``CALL``, decided from ``info`` (``registry`` as
        ``_maintain_one``'s)."""
        order = pipeline.order(_upstream(info), info)
        asked = {v: strategy for v in order if strategy and _applies(strategy, info[v][0])}
        return self._decided_call(None, order, info, asked, registry)

    def _decided_call(self, name: str | None, order: Sequence[str], info: Info,
                      asked: Mapping[str, RefreshStrategy | None], registry: str | None
                      ) -> dict[str, Any]:
        """``_call`` with the views' decisions; an auto decision made from a refresh history
        another session has since extended is refused by the function before it runs
        anything: then decided again from the history as it is now. (A call refused for
        ``registry``, before it ran anything, raises ``_StaleRegistry``.)"""
        for attempt in range(STALE_RETRIES + 1):
            choices = self._decisions(order, info, asked)
            try:
                out = self._call(name, retry=True, choices=choices, registry=registry)
                self._ran.update(_warmed(out))
                return out
            except _StaleDecision as e:
                if attempt == STALE_RETRIES:
                    raise MaintenanceError(f"maintenance of {name or self.schema!r} refused: "
                                           f"{e} (after {STALE_RETRIES + 1} decisions)") from e
                self._costs.clear()
        raise AssertionError("unreachable")

    # -- the refresh decision -------------------------------------------------------------
    def _refresh_info(self) -> Info:
        """The views of the schema → (refresh strategy, the relations each reads), in one
        query; none if the companion has no registry. Kept, with its ``registry_token``, for
        the next maintains (``_info``)."""
        try:
            rows = self.conn.execute(f"SELECT name, strategy, tables FROM "
                                     f"{qq(self.companion, REGISTRY)}").fetchall()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName,
                psycopg.errors.UndefinedColumn):  # (no companion, or an older idivm's: the
            self._info = None                         # maintain that follows says which)
            return {}
        info = {str(n): (str(s), tuple(ts)) for n, s, ts in rows}
        self._info = (info, compile_.registry_token(rows))
        return info

    def _decisions(self, order: Sequence[str], info: Mapping[str, tuple[str, tuple[str, ...]]],
                   asked: Mapping[str, RefreshStrategy | None]) -> dict[str, dict[str, Any]]:
        """The decision passed to each view's function whose refresh is not its function's
        default (the Δ-script; a ``recompute`` view's recomputation): for an ``auto`` view
        (or ``strategy="auto"`` asked), ``refresh_cost.threshold`` — the cost model's choice
        for any count of pending log rows, which the function applies to the rows it counts
        (after the views it reads have refreshed, in the same transaction); for a strategy
        asked for this refresh, that strategy."""
        out: dict[str, dict[str, Any]] = {}
        for v in order:
            mine = info[v][0]
            want = asked.get(v) or mine
            if want not in REFRESH_STRATEGIES:
                raise IdivmError(f"strategy must be auto, id, tuple or recompute, not {want!r}")
            if want == "tuple" and mine != "tuple":
                raise IdivmError("strategy='tuple' is chosen at create_view (it plans t-diffs)")
            if want in ("id", "tuple") and mine == "recompute":
                raise IdivmError(f"view {v!r} was created with strategy='recompute': it has no "
                                 "Δ-script to run")
            if want == "auto" and mine != "recompute":
                cost, warm = self._cost(v), v in self._ran
                kept = self._decided.get(v)
                if kept is not None and kept[0] is cost and kept[1] == warm:
                    out[v] = kept[2]
                    continue
                t = threshold(cost.base_rows, cost.history, "postgres", warm)
                out[v] = t.as_dict() | {"history_id": cost.history_id}
                self._decided[v] = (cost, warm, out[v], t.json[:-1] + ', "history_id": ' + (
                    "null" if cost.history_id is None else str(cost.history_id)) + "}")
            elif want == "recompute" and mine != "recompute":
                out[v] = Decision("recompute", "strategy='recompute' asked for this refresh"
                                  ).as_dict()
            elif want in ("id", "tuple") and mine == "auto":
                out[v] = Decision("id", f"strategy={want!r} asked for this refresh").as_dict()
        return out

    def _decided_json(self, choices: Mapping[str, Any]) -> str:
        """``choices`` as the procedure's jsonb argument (an auto decision kept from an
        earlier refresh: its text as kept)."""
        parts = []
        for v, d in choices.items():
            kept = self._decided.get(v)
            parts.append(f"{json.dumps(v)}: "
                         f"{kept[3] if kept is not None and kept[2] is d else json.dumps(d)}")
        return "{" + ", ".join(parts) + "}"

    def _cost(self, view: str, reload: bool = False) -> _Cost:
        """What ``view``'s auto decisions rest on (read from ``refresh_history`` once)."""
        if view in self._costs and not reload:
            return self._costs[view]
        if not self._histories:
            if not self._has(HISTORY) or not self._has_function("relation_rows"):
                self._recompile_stale(None)  # a companion from before refresh histories
            self._histories = True
        rows = self.conn.execute(
            f"SELECT id, strategy, changes, seconds, base_rows, cold FROM "
            f"{qq(self.companion, HISTORY)} WHERE view = %s ORDER BY id", (view,)).fetchall()
        runs = [(str(r[1]), int(r[2]), float(r[3]), None if r[4] is None else int(r[4]),
                 bool(r[5])) for r in rows]
        sizes = [r[3] for r in runs if r[3] is not None]
        warm = any(not r[4] for r in runs if r[0] in ("id", "tuple") and r[1] > 0)
        stale = self.conn.execute(f"SELECT caches_stale FROM {qq(self.companion, REGISTRY)} "
                                  "WHERE name = %s", (view,)).fetchone()
        history = replace(History.of_runs(runs, "postgres"),
                          caches_stale=bool(stale and stale[0]))
        self._costs[view] = cost = _Cost(history,
                                         sizes[-1] if sizes else None,
                                         int(rows[-1][0]) if rows else None, warm)
        return cost

    def _stats(self, name: str, stats: Mapping[str, Any]) -> MaintenanceStats:
        """``MaintenanceStats`` of one view's run; for an auto refresh, its decision with the
        model's estimates at the log rows it counted (``_estimates``, from the history the
        threshold came from, worked out when ``decision`` is read), and that history brought
        up to date with this run."""
        out = MaintenanceStats.of(name, stats)
        cost = self._costs.get(name)
        if cost is None:
            return out
        n = sum(out.log_rows.values())
        ran = out._decision.get("strategy", out.choice)
        if "max_changes" in out._decision and n > 0:  # (an auto refresh's threshold)
            out._decision["changes"] = n
            out._explain = functools.partial(_estimates, n, cost, not stats.get("cold"),
                                             out.choice, ran)
        if stats.get("history_id") is not None:
            rows = stats.get("base_rows")
            base_rows = int(rows) if rows is not None else cost.base_rows
            cold = bool(stats.get("cold"))
            if ran in ("id", "tuple") and n > 0 and not cold and not cost.warm:
                # the first warm run: the cold samples no longer count (History.of_runs)
                try:
                    self._cost(name, reload=True)
                except psycopg.Error:  # (a timeout, a cancel: the run committed all the
                    self._costs.pop(name, None)  # same; the next decision reads it again)
                return out
            h, stale = cost.history, bool(stats.get("caches_stale"))
            if h.caches_stale != stale:  # (each replace of a History: ~5 µs, in the refresh)
                h = replace(h, caches_stale=stale)
            if ran == "recompute":
                h = h.with_recompute(out.seconds, base_rows)
            elif ran == "rebuild":
                h = replace(h, rebuild_seconds=out.seconds)
            elif n > 0 and not (cold and cost.warm):
                # (a cold sample while no warm one is known: History.of_runs's cold_only)
                h = h.with_maintain(n, out.seconds, "postgres")
                if h.cold_only != (cold and not cost.warm):
                    h = replace(h, cold_only=cold and not cost.warm)
            self._costs[name] = _Cost(h, base_rows, int(stats["history_id"]), cost.warm)
        return out

    def history_model(self, name: str) -> History:
        """The cost model's ``History`` of the view, from its rows of ``refresh_history``."""
        if not self._has(HISTORY):
            return History()
        return self._cost(name, reload=True).history

    def history(self, name: str | None = None) -> list[dict[str, Any]]:
        """The rows of ``refresh_history`` (of view ``name``, or of every view), oldest first:
        view, finished_at, strategy (id, tuple, recompute; create: the materialization),
        changes (log rows consumed), seconds, base_rows, reason."""
        if not self._has(HISTORY):
            return []
        cur = self.conn.execute(
            f"SELECT view, finished_at, strategy, changes, seconds, base_rows, reason "
            f"FROM {qq(self.companion, HISTORY)} WHERE %s::text IS NULL OR view = %s "
            "ORDER BY id", (name, name))
        cols = [d.name for d in cur.description or ()]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def efficiency(self) -> dict[str, dict[str, Any]]:
        """``refresh_efficiency()`` of the companion schema: view → its row."""
        if not self._has(HISTORY) or not self._has_function("refresh_efficiency"):
            return {}
        cur = self.conn.execute(f"SELECT * FROM {qq(self.companion, 'refresh_efficiency')}()")
        cols = [d.name for d in cur.description or ()]
        return {str(r[0]): dict(zip(cols, r, strict=True)) for r in cur.fetchall()}

    def _has_function(self, fn: str) -> bool:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s", (self.companion, fn)).fetchone()
        return bool(row and row[0])

    def _call(self, name: str | None, retry: bool, choices: Mapping[str, Any] | None = None,
              registry: str | None = None) -> dict[str, Any]:
        """``CALL maintain(name)``, or ``maintain_all`` when ``name`` is None; ``choices``:
        view → its refresh decision; ``registry``: the token of the registry they were
        decided from, when it was kept from an earlier maintain (refused: ``_StaleRegistry``).
        The call is tagged (``run``): the statistics the procedure leaves in the session as
        its maintenance commits carry the tag, so a failure is told apart from a committed
        run (``_committed``) without emptying them first."""
        what = repr(name) if name is not None else f"the views of schema {self.schema!r}"
        call = f"CALL {qq(self.companion, 'maintain')}(%s, NULL, %s, %s, %s, %s)" \
            if name is not None else \
            f"CALL {qq(self.companion, 'maintain_all')}(NULL, %s, %s, %s, %s)"
        decided = self._decided_json(choices) if choices else None
        run = secrets.token_hex(8)
        args = (name, compile_.FORMAT_VERSION, decided, registry, run) if name is not None \
            else (compile_.FORMAT_VERSION, decided, registry, run)
        try:
            row = self.conn.execute(call, args).fetchone()
        except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName) as e:
            if not self._has_procedure():  # else: raised by the code it runs, reported below
                self._check_layout()
                views = self._views()
                if retry and (name in views if name is not None else views):
                    # views committed without the procedure (the session of the create_view
                    # of the schema's first view lost before its last transaction): make it
                    self._recompile_stale(None)
                    return self._call(name, retry=False, choices=choices)
                raise BackendError(f"no idivm view {name!r} in schema {self.schema!r}") from e
            if retry and not (self._has_procedure("maintain", 6) if name is not None
                              else self._has_procedure("maintain_all", 5)):
                # the procedures of an older idivm (without the registry and the tag):
                # recompile, re-run (decided from the registry as it is now)
                self._recompile_stale(name)
                return self._call(name, retry=False, choices=choices)
            raise MaintenanceError(f"maintenance of {what} failed and was rolled back "
                                   f"(re-run it): {str(e).strip()}") from e
        except psycopg.Error as e:
            if self.conn.closed or self.conn.broken:
                raise MaintenanceError(
                    f"maintenance of {what} failed: the connection was lost, so whether it "
                    "committed is unknown (re-running it is safe: a maintain consumes only "
                    f"what is still pending): {str(e).strip()}") from e
            committed = self._committed(run)
            if committed is not None:  # interrupted after its commit: it did its work
                return committed
            msg = (e.diag.message_primary or str(e)).strip()
            state = e.sqlstate
            if state == compile_.STALE_REGISTRY and registry is not None:
                raise _StaleRegistry(msg) from e
            if state == compile_.STALE_CODE and retry:
                self._recompile_stale(name)
                return self._call(name, retry=False, choices=choices)
            if state == compile_.STALE_DECISION:
                raise _StaleDecision(msg.removeprefix("idivm: ")) from e
            if state == compile_.NO_VIEW:
                raise BackendError(msg.removeprefix("idivm: ")) from e
            if state == compile_.UNDECLARED_CHANGE:
                raise IdivmError(msg) from e
            if state == compile_.SCHEMA_CHANGED:
                hint = e.diag.message_hint or ""
                raise MaintenanceError(f"maintenance of {what} refused: "
                                       f"{msg.removeprefix('idivm: ')}; {hint}") from e
            raise MaintenanceError(f"maintenance of {what} failed and was rolled back "
                                   f"(re-run it): {str(e).strip()}") from e
        if row is None or row[0] is None:
            raise MaintenanceError(f"maintenance of {what} returned no statistics")
        return dict(row[0])

    def _committed(self, run: str) -> dict[str, Any] | None:
        """After a failed ``CALL`` tagged ``run``: the statistics of the run if its
        maintenance transaction committed (the failure came after it: a cancel, a timeout,
        the prune's commit) — the session's ``COMMITTED_SETTING``, if it carries the tag (an
        earlier run's does not)."""
        try:
            row = self.conn.execute("SELECT current_setting(%s, true)",
                                    (compile_.COMMITTED_SETTING,)).fetchone()
        except psycopg.Error:
            return None
        tag, _, stats = str(row[0] if row and row[0] else "").partition(" ")
        if tag != run or not stats:
            return None
        return dict(json.loads(stats))

    def _has_procedure(self, proc: str = "maintain", args: int | None = None) -> bool:
        """Whether the companion schema has its ``maintain`` procedure (or ``proc``; taking
        ``args`` arguments, if given)."""
        row = self.conn.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s AND p.prokind = 'p' "
            "AND (%s::int IS NULL OR p.pronargs = %s::int)",
            (self.companion, proc, args, args)).fetchone()
        return bool(row and row[0])

    def _recompile_stale(self, name: str | None) -> None:
        """Recompile the views another idivm version compiled (``name`` too, whose code
        may be missing), and regenerate the procedures."""
        rows = self.conn.execute(
            f"SELECT name FROM {qq(self.companion, REGISTRY)} WHERE format_version "
            "IS DISTINCT FROM %s ORDER BY name", (compile_.FORMAT_VERSION,)).fetchall()
        stale = [str(r[0]) for r in rows]
        if name is not None and name not in stale:
            stale.append(name)
        for v in stale:
            self._recompile(v)
        if not stale:
            with self.conn.transaction():
                changelog.lock_companion(self.conn, self.schema)
                self._registry()
                self._install_dispatcher()

    def _recompile(self, name: str) -> None:
        """Re-render a view compiled by another idivm version (same plan inputs, same
        fingerprints: a table altered since is still refused)."""
        e = self._entry(name)
        p = self.plan_of(name)
        read = Catalog.from_ddl(e["catalog"])
        fingerprints = dict(e["fingerprints"])
        if int(e["format_version"]) < 3:
            # fingerprints gained a count of inheritance parents and children: a table had
            # none at creation (else its view was wrong from the start; refused from now on)
            fingerprints = {t: f"{fp}:0" for t, fp in fingerprints.items()}
        with self.conn.transaction():
            changelog.lock_companion(self.conn, self.schema)
            self._registry()
            compiled = self._install_code(p, read, fingerprints, str(e["strategy"]))
            self.conn.execute(
                f"UPDATE {qq(self.companion, REGISTRY)} SET function = %s, prune_function = %s,"
                " format_version = %s, fingerprints = %s WHERE name = %s",
                (compiled.function, compiled.prune_function, compile_.FORMAT_VERSION,
                 json.dumps(fingerprints), name))
            for fn in {e["function"], e["prune_function"]} - {compiled.function,
                                                              compiled.prune_function}:
                # (no argument list: the maintenance function's changed with format 5)
                self.conn.execute(f"DROP FUNCTION IF EXISTS {qq(self.companion, fn)}")
            if e["function"] != compiled.function:
                self._drop_scratch(e["function"])
            self._install_dispatcher()
        self._ran.discard(name)  # (new code: its first run in the session plans it)

    def drop_view(self, name: str, cascade: bool = False) -> None:
        """Remove the view, its stored table, caches, code, logging and registry entry (from
        what the registry recorded: no planning, so it works whatever became of the tables).
        Refused while other views read it, unless ``cascade``: then they go first. The
        maintainer then continues on a new session (``_new_session``: the old one would keep
        the dropped code's compiled plans). A ``create_view`` of this name that did not
        finish — its session lost after it had installed the logging (a crash, a killed
        client): ``unfinished`` — has its logging removed."""
        left = self._unregistered(True).get(name)
        if left is not None:
            try:
                with self.conn.transaction():
                    # (a create_view of it that begins now waits; one in progress since the
                    # check above holds the lock: it is not unfinished)
                    row = self.conn.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))",
                                            self._create_lock(name)).fetchone()
                    if not (row and row[0]):
                        raise BackendError(f"view {name!r} is being created by another "
                                           "session: drop it once that create_view has ended")
                    self._uninstall(name, left)
            except psycopg.Error as e:
                raise BackendError(f"drop_view {name!r} failed: {str(e).strip()}") from e
        else:
            self._drop_view(name, cascade)
        self._new_session()

    def unfinished(self) -> dict[str, list[str]]:
        """The names of ``create_view`` calls that did not finish — their session lost after
        the logging was installed and before the view was (a server crash, a client killed
        or cut off) — and the tables whose changes are still logged for them: writers pay
        for that logging, and the logs are pruned only as far as the view's watermark, which
        no refresh moves. ``drop_view(name)`` removes the logging; ``create_view(name, …)``
        again reinstalls it and creates the view. ``status()`` lists them too. A create_view
        still running in another session is not one (it holds the view's create lock)."""
        return self._unregistered(False)

    def _unregistered(self, running: bool) -> dict[str, list[str]]:
        """The names in the logs' registry that are no view of the registry → the tables
        logged for them: those whose create_view is over (``unfinished``), and with
        ``running`` those whose create_view holds its lock too."""
        if not self._has("log_users"):
            return {}
        registered = (f"NOT EXISTS (SELECT FROM {qq(self.companion, REGISTRY)} AS v "
                      "WHERE v.name = u.view)" if self._has(REGISTRY) else "true")
        rows = self.conn.execute(
            f"SELECT u.view, array_agg(u.tbl ORDER BY u.tbl) FROM "
            f"{qq(self.companion, 'log_users')} AS u WHERE {registered} AND (%s OR NOT EXISTS ("
            "SELECT FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.objsubid = 2 "
            "AND l.classid = %s::oid AND l.objid = hashtext(%s || '.' || u.view)::oid)) "
            "GROUP BY u.view ORDER BY u.view",
            (running, CREATE_LOCK_CLASS, self.companion)).fetchall()
        return {str(v): [str(t) for t in ts] for v, ts in rows}

    def _drop_view(self, name: str, cascade: bool) -> None:
        e = self._entry(name)
        views = self._views()
        dependents = sorted(v for v, ts in views.items() if name in ts)
        owned = self._owned(name)
        if dependents and not cascade:
            raise BackendError(f"view {name!r} is read by view(s) {', '.join(dependents)}: "
                               "drop them first, or drop it with cascade=True")
        for d in dependents:
            if d in self._views():  # (a dependent of another dependent may be gone already)
                self._drop_view(d, cascade=True)
        if dependents and name not in self._views():
            return  # (dropped with the view that made it of a CTE)
        try:
            with self.conn.transaction():
                changelog.lock_companion(self.conn, self.schema)
                self.conn.execute(f"DROP VIEW IF EXISTS {qq(self.schema, name)}")
                for rel in e["relations"]:
                    self.conn.execute(f"DROP TABLE IF EXISTS {qq(self.companion, rel)}")
                for fn in (e["function"], e["prune_function"]):
                    self.conn.execute(f"DROP FUNCTION IF EXISTS {qq(self.companion, fn)}")
                self._drop_scratch(e["function"])
                self.conn.execute(f"DELETE FROM {qq(self.companion, REGISTRY)} WHERE name = %s",
                                  (name,))
                self._drop_unshared(e.get("indexes") or ())
                if self._has(HISTORY):
                    self.conn.execute(f"DELETE FROM {qq(self.companion, HISTORY)} "
                                      "WHERE view = %s", (name,))
                self.conn.execute(f"DROP VIEW IF EXISTS "
                                  f"{qq(self.companion, compile_.lock_relation(name))}")
                for t in e["tables"]:
                    changelog.uninstall(self.conn, self.schema, t, name)
                self._install_dispatcher()
                self._drop_companion_if_unused()
        except psycopg.Error as e2:
            raise BackendError(f"drop_view {name!r} failed: {str(e2).strip()}") from e2
        self._plans.pop(name, None)
        self._costs.pop(name, None)
        self._ran.discard(name)
        for v in owned:  # the views it made of its CTEs, unless read by another view since
            if v in self._views() and not any(v in ts for ts in self._views().values()):
                self._drop_view(v, cascade=False)

    def _drop_unshared(self, indexes: Sequence[str]) -> None:
        """Drop the lookup indexes (``_lookup_indexes``) no view in the registry lists."""
        if not indexes:
            return
        row = self.conn.execute(
            "SELECT coalesce(array_agg(DISTINCT i), '{}') FROM "
            f"{qq(self.companion, REGISTRY)} AS v, "
            "jsonb_array_elements_text(coalesce(to_jsonb(v) -> 'indexes', '[]')) AS i"
        ).fetchone()
        kept = set(row[0]) if row is not None else set()
        for index in indexes:
            if index not in kept:
                self.conn.execute(f"DROP INDEX IF EXISTS {qq(self.companion, index)}")

    def _owned(self, name: str) -> list[str]:
        """The views ``create_view(name, …)`` made of the view's CTEs (registry ``owner``; a
        registry from before the column has none)."""
        if not self._has(REGISTRY):
            return []
        rows = self.conn.execute(f"SELECT v.name FROM {qq(self.companion, REGISTRY)} AS v "
                                 "WHERE to_jsonb(v) ->> 'owner' = %s ORDER BY v.name",
                                 (name,)).fetchall()
        return [str(r[0]) for r in rows]

    def _drop_scratch(self, function: str) -> None:
        """Drop the scratch relations of the code whose function is ``function``."""
        rows = self.conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' AND starts_with(c.relname, %s)",
            (self.companion, compile_.scratch_prefix(function))).fetchall()
        for (rel,) in rows:
            self.conn.execute(f"DROP TABLE IF EXISTS {qq(self.companion, str(rel))}")

    def _uninstall(self, name: str, tables: Sequence[str]) -> None:
        """Undo the logging a failed create_view installed."""
        with self.conn.transaction():
            for t in tables:
                changelog.uninstall(self.conn, self.schema, t, name)
            self._drop_companion_if_unused()

    def _drop_companion_if_unused(self) -> None:
        left = self.conn.execute(
            f"SELECT (SELECT count(*) FROM {qq(self.companion, REGISTRY)}) + "
            f"(SELECT count(*) FROM {qq(self.companion, 'log_users')})").fetchone() \
            if self._has(REGISTRY) and self._has("log_users") else (0,)
        if left is not None and left[0] == 0:  # the last view: nothing of ours remains
            self.conn.execute(f"DROP SCHEMA IF EXISTS {q(self.companion)} CASCADE")

    def _has(self, rel: str) -> bool:
        row = self.conn.execute("SELECT to_regclass(%s)", (qq(self.companion, rel),)).fetchone()
        return bool(row and row[0])

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Registered views, when they were last maintained and how many changes wait; their
        refresh history: ``last_refresh`` (what ran, when, over how many log rows, in how many
        seconds, and why) and ``efficiency`` (their row of ``refresh_efficiency()``). A
        ``create_view`` that did not finish (``unfinished``) is listed too, as its strategy
        says, with the changes logged for it."""
        with self.conn.transaction():
            unfinished = [self._unfinished_status(v, ts) for v, ts in self.unfinished().items()
                          if name is None or v == name]
            if not self._has(REGISTRY):
                return unfinished
            rows = self.conn.execute(
                f"SELECT name, created, last_maintained, runs, tables, strategy FROM "
                f"{qq(self.companion, REGISTRY)} ORDER BY name").fetchall()
            efficiency = self.efficiency()
            last_runs: dict[str, dict[str, Any]] = {}
            if self._has(HISTORY):
                cur = self.conn.execute(
                    f"SELECT DISTINCT ON (view) view, finished_at, strategy, changes, seconds, "
                    f"reason FROM {qq(self.companion, HISTORY)} WHERE strategy <> 'create' "
                    "ORDER BY view, id DESC")
                cols = [d.name for d in cur.description or ()]
                last_runs = {str(r[0]): dict(zip(cols[1:], r[1:], strict=True))
                             for r in cur.fetchall()}
            out = []
            names = {str(r[0]) for r in rows}
            for vname, created, last, runs, tables, strategy in rows:
                if name is not None and vname != name:
                    continue
                pending = {t: self._pending(t, vname) for t in tables}
                marks = {t: changelog.watermark(self.conn, self.schema, t, vname)
                         for t in tables}
                eff = dict(efficiency.get(vname, {}))
                eff.pop("view", None)
                out.append({"view": vname, "created": str(created), "last_maintained":
                            str(last) if last else None, "runs": runs, "strategy": strategy,
                            "upstream": sorted(t for t in tables if t in names),
                            "pending_log_rows": pending, "watermarks": marks,
                            "last_refresh": last_runs.get(vname), "efficiency": eff})
        return sorted(out + unfinished, key=lambda r: str(r["view"]))

    def _unfinished_status(self, view: str, tables: Sequence[str]) -> dict[str, Any]:
        """``status``'s row of an unfinished create_view (``unfinished``)."""
        return {"view": view, "created": "-", "last_maintained": None, "runs": 0,
                "strategy": "unfinished create_view", "upstream": [],
                "pending_log_rows": {t: self._pending(t, view) for t in tables},
                "watermarks": {t: changelog.watermark(self.conn, self.schema, t, view)
                               for t in tables},
                "last_refresh": None, "efficiency": {}, "unfinished": True}

    def _pending(self, table: str, view: str) -> int:
        """Logged changes of ``table`` that ``view`` has not consumed yet."""
        mark = changelog.snapshot_literal(changelog.watermark(self.conn, self.schema, table,
                                                              view))
        query = exp.select(exp.Count(this=exp.Star())).from_(
            changelog.log_ref(self.schema, table)).where(changelog.pending_predicate(mark))
        row = self.conn.execute(query.sql("postgres")).fetchone()
        return int(row[0]) if row else 0


def lookup_index(store: str, cols: Sequence[str]) -> str:
    """The name of the index on stored table ``store`` that ``_lookup_indexes`` makes on
    ``cols``: the same for every view that asks for it."""
    return fit(f"{store}__by__{'__'.join(cols)}")


@contextlib.contextmanager
def _before_call(what: str) -> Iterator[None]:
    """The reads a maintain makes before its ``CALL`` (the registry, the refresh history): a
    failure there (a statement timeout, a cancel, a lost connection) ran nothing, so it is
    reported as the ``CALL``'s own failures are — rolled back, re-run it — not as a raw driver
    error. (``_call`` reports the ``CALL``'s failures itself.)"""
    try:
        yield
    except psycopg.Error as e:
        raise MaintenanceError(f"maintenance of {what} failed before it changed anything, "
                               f"and was rolled back (re-run it): {str(e).strip()}") from e


def _applies(asked: RefreshStrategy, strategy: str) -> bool:
    """Whether a refresh strategy asked for can override a view's ``strategy``."""
    return not (asked in ("id", "tuple") and strategy == "recompute") and \
        not (asked == "tuple" and strategy != "tuple")


def _upstream(info: Mapping[str, tuple[str, tuple[str, ...]]]) -> dict[str, tuple[str, ...]]:
    """View → the views it reads, from ``_refresh_info``."""
    return {v: tuple(t for t in ts if t in info) for v, (_, ts) in info.items()}


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
