"""Deferred ID-based maintenance on Spark: Delta tables' change feeds in, Spark-dialect
Δ-scripts, views out as Delta tables.

Base tables are Delta tables — loaded through idivm (``load_table``, ``apply_changes``) or the
user's own, attached where they are (``attach_delta``); caches and views are Delta tables under
the warehouse (``idivm.spark.delta``). A refresh (``maintain``) is crash-safe:

1. each base table's Delta version is read; the Change Data Feed since the view's watermark is
   folded into effective changes; the base tables are read at those versions;
2. the refresh chooses between running the Δ-script and recomputing (``strategy``; ``auto``
   estimates both from the change counts, the tables' sizes and what earlier runs measured);
3. the Δ-script runs statement by statement: i-diff queries are checkpointed in memory, and each
   cache's or the view's APPLYs are *staged* — the post-state of the buckets they touch is
   written under ``_idivm_staging/<run>/`` — after which later statements read the staged
   post-state;
4. a manifest records the run (staged targets, the versions consumed);
5. each staged relation is committed (one Delta commit each, repeatable), and only then does the
   view's watermark move: idivm reads a refresh whole or not at all.

A run killed before the manifest leaves nothing applied (its staging is discarded on the next
run); a run killed after it is finished by the next ``maintain`` from the staged files.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlglot import exp

from idivm import hoist, pipeline
from idivm.catalog import Catalog, Table
from idivm.errors import BackendError, IdivmError
from idivm.frontend import relations_read
from idivm.plan import Plan, plan
from idivm.planner.model import Strategy, change_table
from idivm.planner.prune import prune_empty, reads_only_empty
from idivm.refresh_cost import History, RefreshStrategy, choose_engine, decide
from idivm.render import deep_trees
from idivm.script import Apply, Compute, apply_run, query_sql, reads
from idivm.spark import changes as cdf
from idivm.spark import driver
from idivm.spark.delta import (
    STAGING,
    DeltaError,
    DeltaStore,
    add_actions,
    arrow,
    open_table,
    quote_column,
    read_files,
)
from idivm.spark.session import embedded_session
from idivm.spark.storage import ApplyOp

log = logging.getLogger("idivm.spark")

# Checkpointed relations carry no size estimate, so Spark would sort-merge-join a large stored
# relation against a 200-row i-diff; i-diffs known to be at most this many rows are hinted as
# broadcast (hash) join inputs instead.
BROADCAST_ROWS = 1_000_000


Engine = Literal["auto", "spark", "driver"]


# the message a NULL in a NOT NULL column fails load_table's write with: the column follows
_NULL_MARK = "idivm: NULL in NOT NULL column <"


class InjectedFailure(BaseException):
    """Raised by the test hook that kills a maintenance run at a chosen step. A BaseException,
    like a kill: no ``except Exception`` cleanup runs, so tests see what a dead process leaves."""


@dataclass
class SparkMaintenanceStats:
    view: str
    changes: dict[str, int] = field(default_factory=dict)
    idiff_rows: dict[str, int] = field(default_factory=dict)
    partitions_rewritten: dict[str, tuple[int, int]] = field(default_factory=dict)
    # a stored relation's snapshot read by the driver engine: (buckets read, buckets in all)
    partitions_read: dict[str, tuple[int, int]] = field(default_factory=dict)
    statements: list[tuple[str, float]] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)  # base table: [since, upto]
    committed: dict[str, int] = field(default_factory=dict)  # stored relation: Delta version
    decision: dict[str, Any] = field(default_factory=dict)  # what ran, and why
    recovered: bool = False
    seconds: float = 0.0
    # the views this one reads, refreshed first at the same base-table versions: their stats
    upstream: dict[str, SparkMaintenanceStats] = field(default_factory=dict)

    def record_stage(self, target: str, touched: int, total: int,
                     rows: Iterable[tuple[str, int]], seconds: float) -> None:
        """What staging a target's APPLYs did (either engine): buckets rewritten of all, rows
        each kind of APPLY named, time."""
        self.partitions_rewritten[target] = (touched, total)
        for kind, n in rows:
            self.idiff_rows[f"{kind} → {target}"] = \
                self.idiff_rows.get(f"{kind} → {target}", 0) + n
        self.statements.append((f"stage {target}", seconds))

    def as_dict(self) -> dict[str, Any]:
        return {"view": self.view, "changes": self.changes, "idiff_rows": self.idiff_rows,
                "partitions_rewritten": {k: list(v) for k, v in
                                         self.partitions_rewritten.items()},
                "partitions_read": {k: list(v) for k, v in self.partitions_read.items()},
                "statements": self.statements, "versions": self.versions,
                "committed": self.committed, "decision": self.decision,
                "recovered": self.recovered, "seconds": self.seconds,
                **({"upstream": {k: v.as_dict() for k, v in self.upstream.items()}}
                   if self.upstream else {})}


class SparkMaintainer:
    """Base tables (Delta: loaded or attached), views and caches (Delta, under ``warehouse``);
    views maintained from the base tables' change feeds."""

    def __init__(self, catalog: Catalog, warehouse: str | os.PathLike[str], spark: Any = None,
                 master: str | None = None, buckets: int | None = None,
                 rows_per_bucket: int = 2000, engine: Engine = "auto") -> None:
        if engine not in ("auto", "spark", "driver"):
            raise IdivmError(f"engine must be auto, spark or driver, not {engine!r}")
        self.engine: Engine = engine
        self.catalog = catalog
        self.root = Path(warehouse).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.spark = spark if spark is not None else embedded_session(master)
        self.store = DeltaStore(self.spark, self.root, rows_per_bucket, buckets=buckets)
        self._plans: dict[str, Plan] = {}
        self._duckdb_texts: dict[str, dict[str, str]] = {}  # per view: its statements' text
        self._driver_ok: dict[str, driver.Eligibility] = {}  # per view: its stored relations
        self._duckdb: Any = None  # the driver engine's DuckDB database, opened when first used
        self._schemas: dict[tuple[str, str], Any] = {}
        self._no_changes: dict[str, Any] = {}  # empty change table per base table (schema only)
        self._base: dict[str, tuple[int, Any]] = {}  # base table: (version, DataFrame) read
        self.fail_at: Callable[[str], bool] | None = None  # test hook: kill a run at a step
        self._dirty: set[str] = set()  # views whose last run did not finish in this session
        # caches whose temp view is not registered: read (a file listing) when a Δ-script
        # reads them, not after every refresh
        self._stale: set[str] = set()
        self._inputs: dict[str, Table] = {}  # views read by other views, as tables
        self._register_all()

    # -- registry -------------------------------------------------------------------------------
    @property
    def _registry_path(self) -> Path:
        return self.root / "_idivm" / "registry.json"

    def registry(self) -> dict[str, Any]:
        if self._registry_path.exists():
            data: dict[str, Any] = json.loads(self._registry_path.read_text())
            return data
        return {"tables": {}, "views": {}}

    def _save(self, reg: Mapping[str, Any]) -> None:
        """Atomic replace, so a crash never leaves a half-written registry."""
        self._registry_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._registry_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(reg, indent=1, sort_keys=True))
        os.replace(tmp, self._registry_path)

    def _register(self, name: str) -> None:
        self.store.read(name).createOrReplaceTempView(name)

    def _register_all(self) -> None:
        reg = self.registry()
        for t in reg["tables"]:
            try:
                self._register_base(t)
            except IdivmError as e:  # a moved or deleted table: say so when it is used
                log.warning("idivm: base table %s: %s", t, e)
        for v, entry in reg["views"].items():
            self._stale.update(m for m in entry["materialized"] if m != entry["store"])
            if self.store.exists(entry["store"]):
                self._register(entry["store"])
                self._register_view(v, entry["store"], entry["columns"])

    def _ensure(self, names: Sequence[str]) -> None:
        """Register the stale caches among ``names``."""
        for n in [n for n in names if n in self._stale]:
            if self.store.exists(n):
                self._register(n)
            self._stale.discard(n)

    def _register_view(self, name: str, store: str, columns: Sequence[str],
                       version: int | None = None) -> None:
        """The view's temp view: its declared columns of the stored relation's files."""
        # (one Py4J call for the projection: a refresh re-registers the view every time)
        self.store.read_raw(store, version).selectExpr(*[quote_column(c) for c in columns]) \
            .createOrReplaceTempView(name)

    def _step(self, what: str) -> None:
        if self.fail_at is not None and self.fail_at(what):
            raise InjectedFailure(f"injected failure before {what}")

    # -- base tables ----------------------------------------------------------------------------
    def table_location(self, name: str) -> str:
        """The Delta table behind a base table: the user's own (attached) or idivm's; for a
        view read by another view, its stored relation."""
        reg = self.registry()
        if name in reg["views"]:
            return str(self.store.path(reg["views"][name]["store"]))
        entry = reg["tables"].get(name)
        if entry is None:
            raise BackendError(f"table {name} is neither loaded nor attached in {self.root}")
        return str(entry.get("delta") or self.store.path(name))

    def table_version(self, name: str) -> int:
        return int(open_table(self.table_location(name)).version())

    def _register_base(self, name: str, version: int | None = None) -> int:
        """The base table as a temp view, read at ``version`` (default: the latest); returns
        the version read. A view read by another view: its own temp view, at that version of
        its stored relation."""
        entry = self.registry()["views"].get(name)
        if entry is not None:
            v = int(self.store.table(entry["store"], version).version())
            self._register_view(name, entry["store"], entry["columns"], v)
            return v
        path = self.table_location(name)
        dt = open_table(path, version)
        v = int(dt.version())
        cached = self._base.get(name)
        if cached is None or cached[0] != v:
            if self.registry()["tables"][name].get("delta"):  # the user's table may change
                check_attachable(self.catalog.table(name), dt, path)  # shape: say so
            files = dt.file_uris()
            df = read_files(self.spark, Path(path), files, self.store.spark_schema(name, dt))
            cached = (v, self._typed(name, df))
            self._base[name] = cached
        cached[1].createOrReplaceTempView(name)
        return v

    def load_table(self, name: str, df: Any) -> None:
        """Initial contents of a base table, stored as a Delta table under the warehouse
        (replaces what was there)."""
        table = self.catalog.table(name)
        if not table.primary_key:
            raise IdivmError(f"table {name} has no primary key; idivm needs one on every table")
        missing = [c for c in table.column_names if c not in df.columns]
        if missing:
            raise IdivmError(f"load_table {name}: missing column(s) {', '.join(missing)}")
        reg = self.registry()
        if reg["tables"].get(name, {}).get("delta"):
            raise IdivmError(f"{name} is attached from {reg['tables'][name]['delta']}; "
                             "write to that Delta table instead")
        users = [v for v, e in reg["views"].items() if name in e["watermarks"]]
        if users:
            raise IdivmError(f"{name} is read by view(s) {', '.join(users)}; reloading it "
                             "would cut their change feed (drop them first)")
        # a NULL in a column the catalog declares NOT NULL (or a key's) fails the write itself
        # (no job of its own), naming the column; nothing is registered or replaced
        from pyspark.sql import functions as F

        typed = self._typed(name, df.select(*table.column_names))
        not_null = {*table.primary_key, *table.not_null_non_key_columns}
        typed = typed.select(*[
            F.when(F.col(f"`{c}`").isNull(), F.raise_error(F.lit(f"{_NULL_MARK}{c}>")))
            .otherwise(F.col(f"`{c}`")).alias(c) if c in not_null else F.col(f"`{c}`")
            for c in table.column_names])
        try:
            self.store.create(name, typed, table.primary_key, None)
        except Exception as e:
            found = re.search(re.escape(_NULL_MARK) + r"(.*?)>", str(e))
            if found is None:
                raise
            raise IdivmError(f"load_table {name}: NULL in column {found.group(1)}, which the "
                             "catalog declares NOT NULL (or primary key); nothing loaded, the "
                             "table stays as it was") from None
        self._base.pop(name, None)
        reg["tables"][name] = {}
        self._save(reg)
        self._register_base(name)

    def attach_delta(self, name: str, path: str | os.PathLike[str]) -> int:
        """Register the user's Delta table at ``path`` as base table ``name`` (no copy: only its
        metadata is read). Its columns must match the catalog's, and its Change Data Feed must
        be on. Returns the table's current version (views created next start from it)."""
        table = self.catalog.table(name)
        if not table.primary_key:
            raise IdivmError(f"table {name} has no primary key; idivm needs one on every table")
        location = str(Path(path).resolve()) if "://" not in str(path) else str(path)
        dt = open_table(location)
        check_attachable(table, dt, location)
        reg = self.registry()
        if name in reg["views"]:
            raise IdivmError(f"{name} is a view in {self.root}")
        old = reg["tables"].get(name)
        if old is not None and old.get("delta") != location:
            users = [v for v, e in reg["views"].items() if name in e["watermarks"]]
            if users:
                raise IdivmError(f"{name} is read by view(s) {', '.join(users)}; drop them "
                                 "before attaching another table under that name")
        reg["tables"][name] = {"delta": location}
        self._save(reg)
        self._base.pop(name, None)
        return self._register_base(name)

    def _typed(self, name: str, df: Any, keep: Sequence[str] = ()) -> Any:
        """Columns cast to the catalog's types (as Spark spells them)."""
        from pyspark.sql import functions as F

        table = self._table(name)
        out = []
        for c in table.columns:
            ty = exp.DataType.build(c.type, dialect="postgres").sql("spark")
            out.append(F.col(f"`{c.name}`").cast(ty).alias(c.name))
        return df.select(*out, *[F.col(k) for k in keep])

    def apply_changes(self, name: str, changes: Any) -> int:
        """Commit a CDF-shaped batch to a base table loaded through idivm (one Delta commit, by
        delta-rs, whose change feed records it row by row). Returns the table's new version.
        A bad batch is refused before anything is written."""
        table = self.catalog.table(name)
        reg = self.registry()
        if name not in reg["tables"]:
            raise IdivmError(f"table {name} is not loaded (load_table first)")
        if reg["tables"][name].get("delta"):
            raise IdivmError(f"{name} is attached from {reg['tables'][name]['delta']}; commit "
                             "changes to that Delta table with your own writer")
        batch = cdf.validate(table, changes)
        if batch is None:
            return self.table_version(name)
        typed = self._typed(name, batch, (cdf.CHANGE_TYPE, cdf.VERSION))
        eff = cdf.fold(self.spark, table, typed, f"load_{name}")
        key = tuple(table.primary_key)
        version = self.store.merge_changes(name, eff, key, table.column_names)
        self._register_base(name)
        return version

    # -- views ----------------------------------------------------------------------------------
    def plan_of(self, name: str) -> Plan:
        if name not in self._plans:
            entry = self.registry()["views"].get(name)
            if entry is None:
                raise BackendError(f"no idivm view {name!r} in {self.root}")
            self._plans[name] = plan(entry["sql"],
                                     self._planning_catalog(entry.get("upstream") or ()),
                                     name=name, changes=entry.get("changes"),
                                     strategy=_planned(entry.get("strategy", "id")))
        return self._plans[name]

    def _planning_catalog(self, upstream: Sequence[str]) -> Catalog:
        """The catalog a view is planned over: the base tables, and the views it reads as
        tables keyed by their IDs (``pipeline.input_table``)."""
        if not upstream:
            return self.catalog
        return Catalog.of([*(t for n, t in self.catalog.tables.items() if n not in upstream),
                           *(self._table(v) for v in upstream)])

    def _table(self, name: str) -> Table:
        """A base table of the catalog, or a view read by other views as a table."""
        entry = self.registry()["views"].get(name)
        if entry is None:
            return self.catalog.table(name)
        if name not in self._inputs:
            types = {f.name: _sql_type(f.dataType.simpleString())
                     for f in self.store.spark_schema(entry["store"]).fields}
            self._inputs[name] = pipeline.input_table(name, self.plan_of(name), types)
        return self._inputs[name]

    def _views_reading(self, name: str) -> list[str]:
        return sorted(v for v, e in self.registry()["views"].items()
                      if name in (e.get("upstream") or ()))

    @deep_trees()
    def create_view(self, name: str, view_sql: str,
                    changes: Mapping[str, Sequence[str]] | None = None,
                    strategy: RefreshStrategy = "auto") -> Plan:
        """Materialize the view and its caches as Delta tables (refused SQL raises before
        anything is written). ``strategy``: ``auto`` (the default: each refresh maintains or
        recomputes, whichever is estimated cheaper), ``id`` (always the ID-based Δ-script),
        ``tuple`` (t-diffs, the baseline) or ``recompute``.

        Unless it recomputes, a WITH aggregate the view reads more than once
        (``hoist.shared_ctes``) becomes a view of its own, ``<name>__<cte>``, refreshed once
        ahead of the view, which reads its change feed like any view it reads; the registry
        records ``name`` as its ``owner`` and ``drop_view(name)`` drops it too. A CTE that
        cannot key such a view stays inline, as does every CTE when ``changes`` is declared."""
        if strategy not in ("auto", "id", "tuple", "recompute"):
            raise IdivmError(f"strategy must be auto, id, tuple or recompute, not {strategy!r}")
        views = self.registry()["views"]
        if name in views or changes or strategy == "recompute":
            return self._create_view(name, view_sql, changes, strategy)
        for v, e in sorted(views.items()):  # left by a create_view of this name that did not
            if e.get("owner") == name and v in self.registry()["views"]:  # finish
                self.drop_view(v, cascade=True)
        hoisted = hoist.chosen(name, view_sql,
                               lambda v, body: self._holdable(v, body, strategy))
        if not hoisted:
            return self._create_view(name, view_sql, changes, strategy)
        return hoist.create_with_views(
            name, view_sql, hoisted,
            lambda v, q: self._create_view(v, q, None, strategy),  # (no changes: see above)
            self._annotate, self._drop_made)

    def _drop_made(self, view: str) -> None:
        if view in self.registry()["views"]:
            self.drop_view(view, cascade=True)

    def _annotate(self, view: str, **entries: str) -> None:
        reg = self.registry()
        reg["views"][view].update(entries)
        self._save(reg)

    def _holdable(self, view: str, body: str, strategy: RefreshStrategy) -> bool:
        """``view`` can hold a CTE's query ``body``: the name is free, it reads base tables
        only, and it plans as a view its IDs key (``pipeline.check_input``)."""
        reg = self.registry()
        if view in reg["views"] or view in reg["tables"] \
                or relations_read(body) & set(reg["views"]):
            return False
        try:
            pipeline.check_input(view, plan(body, self.catalog, name=view,
                                            strategy=_planned(strategy)))
        except IdivmError:
            return False
        return True

    def definitions(self) -> dict[str, str]:
        """The views → the query each was created with (not the views create_view made of
        their CTEs)."""
        return hoist.as_written(self.registry()["views"])

    def _create_view(self, name: str, view_sql: str,
                     changes: Mapping[str, Sequence[str]] | None,
                     strategy: RefreshStrategy) -> Plan:
        """``create_view`` of one view, as written."""
        reads_ = relations_read(view_sql)
        pipeline.check_reads(name, reads_)
        upstream = sorted(reads_ & set(self.registry()["views"]))
        p = plan(view_sql, self._planning_catalog(upstream), name=name, changes=changes,
                 strategy=_planned(strategy))
        reg = self.registry()
        if name in reg["views"] or name in reg["tables"]:
            raise BackendError(f"{name} already exists in {self.root}")
        for v in upstream:  # it starts from their state now (then they move together)
            self.maintain(v)
        reg = self.registry()
        missing = [t for t in p.tables if t not in reg["tables"] and t not in upstream]
        if missing:
            raise BackendError(f"load_table or attach_delta first: {', '.join(missing)}")
        versions = {t: self._register_base(t) for t in p.tables}
        t0 = time.perf_counter()
        for m, query in p.materialize_queries():
            df = self.spark.sql(query_sql(query, "spark"))
            self.store.create(m.name, df, m.key, _bucket_col(p, m.name, m.key))
            self._register(m.name)
        seconds = time.perf_counter() - t0
        self._register_view(name, p.store.name, p.columns)
        reg["views"][name] = {
            "sql": view_sql, "changes": {k: list(v) for k, v in changes.items()} if changes
            else None, "strategy": strategy, "store": p.store.name, "columns": list(p.columns),
            "materialized": [m.name for m in p.materialized], "watermarks": versions,
            "upstream": upstream,
            "cost": History().with_recompute(seconds, self._base_rows(p, versions),
                                             at_create=True).as_dict()}
        self._save(reg)
        self._plans[name] = p
        self._driver_ok.pop(name, None)
        # the DuckDB text of the Δ-script, generated now (a refresh on the driver runs it)
        self._duckdb_texts[name] = driver.compile_texts(p)
        return p

    def view_location(self, name: str) -> str:
        """The Delta table holding the view's rows: any Delta reader (delta-rs, duckdb, Spark)
        can read it, its change feed and its earlier versions. Besides the view's columns it
        has the hidden columns idivm keeps (IDs and counts, named ``__…``, and
        ``__idivm_bucket``, the partition column)."""
        return str(self.store.path(self.plan_of(name).store.name))

    def read_view(self, name: str) -> Any:
        """The view as a DataFrame with exactly its declared columns."""
        self.plan_of(name)
        return self.spark.table(name)

    def drop_view(self, name: str, cascade: bool = False) -> None:
        """Drop the view and its caches. Refused while other views read it, unless
        ``cascade``: then they go first."""
        p = self.plan_of(name)
        dependents = self._views_reading(name)
        if dependents and not cascade:
            raise BackendError(f"view {name!r} is read by view(s) {', '.join(dependents)}: "
                               "drop them first, or drop it with cascade=True")
        for d in dependents:
            if d in self.registry()["views"]:
                self.drop_view(d, cascade=True)
        if dependents and name not in self.registry()["views"]:
            return  # (dropped with the view that made it of a CTE)
        self._inputs.pop(name, None)
        for m in p.materialized:
            self.store.drop(m.name)
            self.spark.catalog.dropTempView(m.name)
        self.spark.catalog.dropTempView(name)
        reg = self.registry()
        reg["views"].pop(name, None)
        self._save(reg)
        self._plans.pop(name, None)
        self._duckdb_texts.pop(name, None)
        self._driver_ok.pop(name, None)
        for v, e in sorted(reg["views"].items()):  # the views it made of its CTEs
            if e.get("owner") == name and not self._views_reading(v):
                self.drop_view(v)

    def status(self) -> list[dict[str, Any]]:
        reg = self.registry()
        now = {t: self.table_version(t) for t in reg["tables"]}
        now |= {v: self.store.version(e["store"]) for v, e in reg["views"].items()}
        return [{"view": v, "strategy": e.get("strategy", "id"), "watermarks": e["watermarks"],
                 "upstream": list(e.get("upstream") or ()),
                 "pending_versions": {t: now[t] - int(w) for t, w in e["watermarks"].items()},
                 "location": str(self.store.path(e["store"])),
                 "last_refresh": e.get("last_refresh")}
                for v, e in sorted(reg["views"].items())]

    def _base_rows(self, p: Plan, versions: Mapping[str, int]) -> int | None:
        """Rows of the view's base tables at those versions, from the Delta logs' file
        statistics (no data read); None when a file carries no row count."""
        total = 0
        for t in p.tables:
            for a in add_actions(open_table(self.table_location(t), versions[t])):
                if a.get("num_records") is None:
                    return None
                total += int(a["num_records"])
        return total

    # -- maintenance ----------------------------------------------------------------------------
    def _manifest(self, name: str) -> Path:
        return self.root / STAGING / f"{name}.manifest.json"

    @deep_trees()
    def maintain(self, name: str, strategy: RefreshStrategy | None = None
                 ) -> SparkMaintenanceStats:
        """Bring the view up to date with every base-table version after its watermark.
        ``strategy`` overrides the view's for this refresh (``id`` forces the Δ-script,
        ``recompute`` a recomputation, ``auto`` estimates both); the choice and its reason are
        in the returned stats and in ``status``. The views it reads are refreshed first
        (transitively, each once; their stats in ``upstream``), all of them up to the same
        base-table versions, read once; it then consumes their stored relations' change
        feeds up to the versions their refreshes committed."""
        self.plan_of(name)
        reg = self.registry()
        order = pipeline.order(_upstream_map(reg), [name])
        pins = self._pins(order, reg)
        ups = {v: self._maintain_one(v, None, pins) for v in order[:-1]}
        stats = self._maintain_one(name, strategy, pins)
        stats.upstream = ups
        return stats

    @deep_trees()
    def maintain_all(self, strategy: RefreshStrategy | None = None
                     ) -> dict[str, SparkMaintenanceStats]:
        """Refresh every view in dependency order (a view after the views it reads), all up to
        the same base-table versions: view name → its stats. ``strategy`` as ``maintain``'s,
        for each."""
        reg = self.registry()
        order = pipeline.order(_upstream_map(reg), reg["views"])
        pins = self._pins(order, reg)
        return {v: self._maintain_one(v, strategy, pins) for v in order}

    def _pins(self, order: Sequence[str], reg: Mapping[str, Any]) -> dict[str, int]:
        """The version of every base table the views of ``order`` read, read once: what all of
        their refreshes consume up to."""
        tables = sorted({t for v in order for t in self.plan_of(v).tables
                         if t not in reg["views"]})
        return {t: int(open_table(self.table_location(t)).version()) for t in tables}

    def _maintain_one(self, name: str, strategy: RefreshStrategy | None,
                      pins: Mapping[str, int]) -> SparkMaintenanceStats:
        """``maintain`` of one view, its base tables read at ``pins`` (the views it reads at
        their latest versions)."""
        p = self.plan_of(name)
        stats = SparkMaintenanceStats(name)
        start = time.perf_counter()
        if name in self._dirty:  # a killed run left staged post-states in the session
            self._reset_views(p)
        self._dirty.add(name)
        self._sweep(name)
        if self._manifest(name).exists():  # a run staged everything, then died: finish it
            self._publish(p, json.loads(self._manifest(name).read_text()), stats)
            stats.recovered = True
        reg = self.registry()
        entry = reg["views"][name]
        asked: RefreshStrategy = strategy or entry.get("strategy", "id")
        if asked == "tuple" and entry.get("strategy") != "tuple":
            raise IdivmError("strategy='tuple' is chosen at create_view (it plans t-diffs)")
        since = {t: int(entry["watermarks"][t]) for t in p.tables}
        locations = {t: self.table_location(t) for t in p.tables}
        # each base table opened once, at the version this refresh consumes
        heads = {t: open_table(loc, pins.get(t)) for t, loc in locations.items()}
        upto = {t: int(dt.version()) for t, dt in heads.items()}
        stats.versions = {t: [since[t], upto[t]] for t in p.tables}
        if upto == since:
            self._dirty.discard(name)
            stats.seconds = time.perf_counter() - start
            return stats
        for t in p.tables:
            if upto[t] < since[t]:
                raise IdivmError(f"{t} is at version {upto[t]}, older than the version "
                                 f"{since[t]} view {name} consumed (was the table replaced?); "
                                 "recreate the view")
        run = f"{name}_{uuid.uuid4().hex[:8]}"
        staged: list[str] = []
        try:
            self._step("fold")
            arrows: dict[str, Any] = {}
            for t in p.tables:  # a forced recomputation needs no feed (it may be gone)
                arrows[t] = cdf.read_cdf_arrow(self._table(t), locations[t],
                                               since[t], upto[t], heads[t]) \
                    if upto[t] > since[t] and asked != "recompute" else None
            history = History.from_dict(entry.get("cost"))
            n = sum(0 if a is None else int(a.num_rows) for a in arrows.values())
            # where a maintenance would run: the estimate is that engine's
            engine, why = ("spark", "a recomputation runs on Spark") if asked == "recompute" \
                else self._engine_for(p, n, history, locations, heads)
            decision = decide(asked, n, self._base_rows(p, upto)
                              if asked == "auto" else None, history, engine)
            stats.decision = decision.as_dict()
            if decision.choice == "recompute":
                engine, why = "spark", "a recomputation runs on Spark"
            stats.decision |= {"engine": engine, "engine_reason": why}
            if engine == "driver":
                staged = self._stage_on_driver(p, run, arrows, locations, heads, stats)
            else:
                for t in p.tables:
                    self._register_base(t, upto[t])
                if decision.choice == "recompute":
                    staged = self._stage_recompute(p, run, stats)
                else:
                    feeds = {t: (None, 0) if a is None else
                             (self.spark.createDataFrame(a), int(a.num_rows))
                             for t, a in arrows.items()}
                    staged = self._stage_script(p, run, feeds, stats)
            self._step("manifest")
            manifest = {"run": run, "targets": staged, "upto": upto,
                        "decision": stats.decision}
            self._manifest(name).parent.mkdir(parents=True, exist_ok=True)
            tmp = self._manifest(name).with_suffix(".tmp")
            tmp.write_text(json.dumps(manifest))
            os.replace(tmp, self._manifest(name))
        except Exception:
            self.store.discard(run)
            self._reset_views(p)
            raise
        self._publish(p, manifest, stats)
        if stats.decision.get("engine") != "driver":  # (the driver registers nothing in Spark)
            self._drop_temps(p)
        self._dirty.discard(name)
        stats.seconds = time.perf_counter() - start
        self._record(p, stats, n, upto)
        return stats

    def _record(self, p: Plan, stats: SparkMaintenanceStats, changes: int,
                upto: Mapping[str, int]) -> None:
        """What this refresh cost, for the next one's estimate and for ``status``."""
        reg = self.registry()
        entry = reg["views"][p.name]
        h = History.from_dict(entry.get("cost"))
        if stats.decision.get("choice") == "recompute":
            h = h.with_recompute(stats.seconds, self._base_rows(p, upto))
        else:
            h = h.with_maintain(changes, stats.seconds, stats.decision.get("engine", "spark"))
        entry["cost"] = h.as_dict()
        entry["last_refresh"] = {**stats.decision, "seconds": round(stats.seconds, 3),
                                 "changes": changes}
        self._save(reg)

    def _engine_for(self, p: Plan, changes: int, history: History,
                    locations: Mapping[str, str], heads: Mapping[str, Any]
                    ) -> tuple[Engine, str]:
        """Where the Δ-script runs: on the driver (DuckDB) or Spark, as ``choose_engine``
        estimates from this view's refreshes (small batches on the driver until measured)."""
        if self.engine == "spark":
            return "spark", "engine='spark'"
        if p.name not in self._driver_ok:
            self._driver_ok[p.name] = driver.stored_eligible(p, self.store)
        ok = self._driver_ok[p.name]
        if ok.ok:
            views = self.registry()["views"]
            ok = driver.base_eligible({t: loc for t, loc in locations.items()
                                       if t not in views}, heads)
        if self.engine == "driver":
            if not ok.ok:
                raise IdivmError(f"engine='driver' cannot refresh {p.name}: {ok.reason}")
            return "driver", "engine='driver'"
        if not ok.ok:
            return "spark", ok.reason
        engine, why = choose_engine(changes, history, driver.DRIVER_MAX_CHANGES,
                                    driver.DRIVER_CEILING)
        return ("driver" if engine == "driver" else "spark"), why

    def _stage_on_driver(self, p: Plan, run: str, feeds: Mapping[str, Any],
                         locations: Mapping[str, str], heads: Mapping[str, Any],
                         stats: SparkMaintenanceStats) -> list[str]:
        attached = self.registry()["tables"]
        for t in p.tables:  # the user's table may have changed shape (as _register_base checks)
            if attached.get(t, {}).get("delta"):
                check_attachable(self.catalog.table(t), heads[t], locations[t])
        if self._duckdb is None:
            self._duckdb = driver.driver_database()
        inputs = {t: str(e["store"]) for t, e in self.registry()["views"].items()
                  if t in p.tables}
        d = driver.DriverRefresh(self._planning_catalog(sorted(inputs)), self.store, locations,
                                 heads, self._step, self._duckdb_texts.setdefault(p.name, {}),
                                 self._duckdb, inputs)
        try:
            return driver.run_script(
                d, p, run, feeds, lambda one_row, known: self._instance_sizes(
                    p, stats, known, one_row), stats)
        finally:
            d.close()

    def _stage_recompute(self, p: Plan, run: str, stats: SparkMaintenanceStats) -> list[str]:
        """Stage every stored relation anew from its query over the base tables."""
        staged = []
        self._ensure([m.name for m in p.materialized])
        for m, query in p.materialize_queries():
            self._step(f"stage {m.name}")
            t0 = time.perf_counter()
            df = self.spark.sql(query_sql(query, "spark"))
            res = self.store.stage(run, m.name, [ApplyOp("replace", df, (), m.columns)])
            res.post_state.createOrReplaceTempView(m.name)  # the view's query reads caches
            stats.partitions_rewritten[m.name] = (len(res.touched), res.total)
            stats.idiff_rows[f"replace → {m.name}"] = res.rows[0]
            staged.append(m.name)
            stats.statements.append((f"recompute {m.name}", time.perf_counter() - t0))
        return staged

    def _stage_script(self, p: Plan, run: str, feeds: Mapping[str, tuple[Any, int]],
                      stats: SparkMaintenanceStats) -> list[str]:
        """Run the Δ-script over the folded feeds, staging each target's APPLYs."""
        from pyspark.sql import functions as F

        self._ensure([r for st in p.statements for r in reads(st)])
        folded: dict[str, Any] = {}
        for t in p.tables:
            table = self._table(t)
            feed, _ = feeds[t]
            if feed is None:  # no new row: no job needed to know it is empty
                if t not in self._no_changes:  # analyzed once: its schema never changes
                    self._no_changes[t] = cdf.empty_changes(self.spark, table)
                chg = self._no_changes[t]
                stats.changes[t] = 0
            else:
                chg = cdf.fold(self.spark, table, self._typed(t, feed, (cdf.CHANGE_TYPE,
                                                                      cdf.VERSION)),
                               p.name).localCheckpoint(eager=False)  # the count job fills it
                folded[change_table(t)] = chg
            chg.createOrReplaceTempView(change_table(t))
        known = {change_table(t): n for t, n in stats.changes.items()}
        known |= self._instance_sizes(p, stats, known)
        for ct, chg in folded.items():
            if known[ct] <= BROADCAST_ROWS:
                F.broadcast(chg).createOrReplaceTempView(ct)
        uses = Counter(r for st in p.statements for r in reads(st))
        computes = {st.name: st for st in p.statements if isinstance(st, Compute)}
        ready: set[str] = set()  # i-diffs registered as temp views in this run
        statements = list(p.statements)
        staged: list[str] = []
        i = 0
        while i < len(statements):
            s = statements[i]
            if isinstance(s, Compute):
                srcs = reads(s)
                # skipped when counted empty, or when every i-diff it reads is known empty
                if known.get(s.name) == 0 or reads_only_empty(srcs, known, computes):
                    known[s.name] = 0
                    i += 1
                    continue
                self._step(s.name)
                t0 = time.perf_counter()
                empty = {r for r in srcs if known.get(r) == 0}
                for r in empty & computes.keys():  # empty inputs a live statement reads
                    self._ensure_empty(p, computes, r, ready)
                df = self.spark.sql(query_sql(prune_empty(s.query, empty), "spark"))
                if uses[s.name] > 1 and s.phase != "instance":
                    df = df.localCheckpoint(eager=True)  # read more than once: keep it
                    known[s.name] = df.count()
                    stats.idiff_rows[s.name] = known[s.name]
                    if known[s.name] <= BROADCAST_ROWS:
                        df = F.broadcast(df)
                df.createOrReplaceTempView(s.name)
                ready.add(s.name)
                stats.statements.append((s.name, time.perf_counter() - t0))
                i += 1
                continue
            target = s.target
            run_of, i = apply_run(statements, i)
            ops = [ApplyOp(a.kind, self.spark.table(a.diff), a.ids, a.columns, a.nullable)
                   for a in run_of if known.get(a.diff) != 0]
            if not ops:
                continue
            self._step(f"stage {target}")
            t0 = time.perf_counter()
            res = self.store.stage(run, target, ops)
            if any(target in reads(st) for st in statements[i:]):
                res.post_state.createOrReplaceTempView(target)  # later statements read it
            staged.append(target)
            stats.record_stage(target, len(res.touched), res.total,
                               zip((op.kind for op in ops), res.rows, strict=True),
                               time.perf_counter() - t0)
        return staged

    def _ensure_empty(self, p: Plan, computes: Mapping[str, Compute], name: str,
                      ready: set[str]) -> None:
        """Register a skipped (empty) i-diff as an empty relation of its schema; the schema is
        analyzed once per plan, over its own inputs registered the same way."""
        if name in ready:
            return
        key = (p.name, name)
        if key not in self._schemas:
            s = computes[name]
            for r in reads(s):
                if r in computes:
                    self._ensure_empty(p, computes, r, ready)
            self._schemas[key] = self.spark.sql(query_sql(s.query, "spark")).schema
        # an empty local relation (not an empty RDD): Spark sizes it at 0 and prunes joins on it
        empty = exp.select(*[exp.alias_(exp.cast(exp.null(), exp.DataType.build(
            f.dataType.simpleString(), dialect="spark")), f.name, quoted=True)
            for f in self._schemas[key].fields]).where(exp.false())
        self.spark.sql(empty.sql("spark")).createOrReplaceTempView(name)
        ready.add(name)

    def _instance_sizes(self, p: Plan, stats: SparkMaintenanceStats, known: Mapping[str, int],
                        one_row: Callable[[exp.Select], Mapping[str, Any]] | None = None
                        ) -> dict[str, int]:
        """Rows of every base-table i-diff (§5 instances), one aggregate query per changed
        table (``one_row`` runs it: a Spark job by default) — so rules fed only by empty
        i-diffs are skipped without running them."""
        if one_row is None:
            def one_row(q: exp.Select) -> Mapping[str, Any]:
                return self.spark.sql(query_sql(q, "spark")).collect()[0].asDict()

        by_table: dict[str, list[Compute]] = {
            change_table(t): [] for t in p.tables if known.get(change_table(t)) != 0}
        for s in p.statements:
            if isinstance(s, Compute) and s.phase == "instance":
                src = s.query.args["from_"].this.name
                if src in by_table:
                    by_table[src].append(s)
        out: dict[str, int] = {}
        for src, stmts in by_table.items():
            items = [exp.alias_(exp.func("COUNT", exp.Star()), "__total", quoted=True)]
            for s in stmts:
                cond = s.query.args["where"].this.copy()
                items.append(exp.alias_(exp.Sum(this=exp.Case(
                    ifs=[exp.If(this=cond, true=exp.Literal.number(1))],
                    default=exp.Literal.number(0))), s.name, quoted=True))
            table = src.removeprefix("__chg__")
            checks = p.undeclared_changes(table)
            for i, (_, pred) in enumerate(checks):
                items.append(exp.alias_(exp.Sum(this=exp.Case(
                    ifs=[exp.If(this=pred, true=exp.Literal.number(1))],
                    default=exp.Literal.number(0))), f"__undeclared{i}", quoted=True))
            q = exp.select(*items).from_(exp.table_(exp.to_identifier(src, quoted=True), alias="g"))
            row = one_row(q)
            for i, (what, _) in enumerate(checks):
                if row[f"__undeclared{i}"]:
                    raise IdivmError(f"{row[f'__undeclared{i}']} {what}(s) on {table}, but the "
                                     f"view {p.name} was planned without them (changes=...)")
            stats.changes[table] = int(row["__total"])
            out[src] = int(row["__total"])
            for s in stmts:
                out[s.name] = int(row[s.name] or 0)
                stats.idiff_rows[s.name] = out[s.name]
        return out

    def _sweep(self, name: str) -> None:
        """Staging of runs that died before their manifest: never applied, so just removed."""
        keep = None
        if self._manifest(name).exists():
            keep = json.loads(self._manifest(name).read_text())["run"]
        staging = self.root / STAGING
        if staging.exists():
            for d in staging.glob(f"{name}_*"):
                if d.is_dir() and d.name != keep:
                    self.store.discard(d.name)

    def _publish(self, p: Plan, manifest: Mapping[str, Any],
                 stats: SparkMaintenanceStats) -> None:
        """Commit each staged relation (repeatable), then move the watermark, last."""
        run = manifest["run"]
        try:
            for target in manifest["targets"]:
                self._step(f"publish {target}")
                self.store.publish(run, target)
                stats.committed[target] = self.store.version(target)
            self._step("watermark")
            reg = self.registry()
            reg["views"][p.name]["watermarks"] = {t: int(v) for t, v in
                                                  manifest["upto"].items()}
            self._save(reg)
        finally:
            self._reset_views(p)
        self._manifest(p.name).unlink(missing_ok=True)
        self.store.discard(run, published=True)

    def _reset_views(self, p: Plan) -> None:
        """Temp views back to the stored relations (undo the staged post-states): the view's
        now, its caches' when a Δ-script next reads them."""
        for m in p.materialized:  # (registered again by the next Δ-script on Spark)
            self.spark.catalog.dropTempView(m.name)
            self._stale.add(m.name)
        if self.store.exists(p.store.name):
            self._register_view(p.name, p.store.name, p.columns)

    def _drop_temps(self, p: Plan) -> None:
        for s in p.statements:
            if isinstance(s, Compute):
                self.spark.catalog.dropTempView(s.name)
        for t in p.tables:
            self.spark.catalog.dropTempView(change_table(t))

    @deep_trees()
    def recompute(self, name: str) -> Any:
        """The view's query run from scratch over the base tables at the versions the view
        reflects (its watermarks): what the maintained view must equal."""
        p = self.plan_of(name)
        reg = self.registry()
        marks = reg["views"][name]["watermarks"]
        for t in p.tables:
            self._register_base(t, int(marks[t]))
        out = self.spark.sql(query_sql(p.recompute_query(), "spark"))  # (bound now)
        for t in p.tables:  # the views it reads: their temp views back to their latest
            if t in reg["views"]:
                self._register_base(t)
        return out


def _bucket_col(p: Plan, target: str, key: Sequence[str]) -> str | None:
    """Bucket by an ID column every i-diff applied to the target names rows by, if any."""
    sets = [set(s.ids) for s in p.statements
            if isinstance(s, Apply) and s.target == target and s.kind != "ins"]
    for k in key:
        if sets and all(k in ids for ids in sets):
            return k
    return key[0] if key else None


def _planned(strategy: str) -> Strategy:
    """The planner's strategy for a view's refresh strategy (``auto`` plans the ID-based
    Δ-script and may recompute instead)."""
    return "id" if strategy == "auto" else strategy  # type: ignore[return-value]


# Delta types as Spark SQL spells them, for comparing an attached table with the catalog
_DELTA_TYPES = {"integer": "INT", "long": "BIGINT", "short": "SMALLINT", "byte": "TINYINT",
                "string": "STRING", "boolean": "BOOLEAN", "double": "DOUBLE", "float": "FLOAT",
                "date": "DATE", "timestamp": "TIMESTAMP", "timestamp_ntz": "TIMESTAMP_NTZ",
                "binary": "BINARY"}


def check_attachable(table: Any, dt: Any, location: str) -> None:
    """Refuse a Delta table idivm cannot maintain views over, saying why and how to fix it:
    CDF off, a reader feature whose files Spark would misread, columns missing or typed
    otherwise than the catalog says, files outside hive-style partition directories."""
    conf = dt.metadata().configuration
    if str(conf.get("delta.enableChangeDataFeed", "false")).lower() != "true":
        raise DeltaError(
            f"the Delta table at {location} has its Change Data Feed off; idivm maintains views "
            "from it. Enable it (delta-rs: DeltaTable(path).alter.set_table_properties("
            "{'delta.enableChangeDataFeed': 'true'}); Spark SQL: ALTER TABLE … SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true)) and attach again")
    features = set(dt.protocol().reader_features or ())
    bad = sorted(features & {"deletionVectors", "columnMapping", "v2Checkpoint"})
    if bad:
        raise DeltaError(f"the Delta table at {location} uses reader feature(s) "
                         f"{', '.join(bad)}, which idivm's Spark reader does not support")
    schema = json.loads(dt.schema().to_json())["fields"]
    fields = {f["name"]: f["type"] for f in schema}
    problems = []
    for col in table.columns:
        if col.name not in fields:
            problems.append(f"column {col.name} is missing")
            continue
        want = exp.DataType.build(col.type, dialect="postgres").sql("spark")
        have = fields[col.name]
        have_sql = _DELTA_TYPES.get(have, have.upper()) if isinstance(have, str) else str(have)
        if _norm_type(want) != _norm_type(have_sql):
            problems.append(f"column {col.name} is {have}, the catalog says {col.type}")
    if problems:
        raise DeltaError(f"the Delta table at {location} does not match table {table.name}: "
                         + "; ".join(problems))
    nullable = {f["name"] for f in schema if f.get("nullable", True)}
    nulls = null_columns(dt, [c for c in (*table.primary_key, *table.not_null_non_key_columns)
                              if c in nullable])
    if nulls:
        said = ", ".join(c + (" (primary key)" if c in table.primary_key else "") for c in nulls)
        raise DeltaError(
            f"the Delta table at {location} holds NULL in column(s) {said}, which the catalog "
            f"declares NOT NULL for table {table.name}: views over it are planned on that (NOT "
            "IN, joins and IDs matched with =) and would be silently wrong, so nothing is read "
            "from it. Remove the NULLs (or declare the column NOT NULL in the Delta table, "
            "which its writers then enforce), or declare the column nullable in the catalog and "
            "create the views again")
    partition = list(dt.metadata().partition_columns)
    if partition:
        for uri in dt.file_uris()[:100]:
            if not all(f"/{k}=" in uri for k in partition):
                raise DeltaError(f"the Delta table at {location} keeps partition values "
                                 "outside its file paths (random file prefixes); idivm's Spark "
                                 "reader needs hive-style partition directories")


def null_columns(dt: Any, columns: Sequence[str]) -> list[str]:
    """Which of ``columns`` hold a NULL in the Delta table ``dt`` (at its version): by the
    files' statistics (``nullCount``, metadata only); a file without them for a column has
    that column read (delta-rs, that column alone, deletion vectors applied)."""
    if not columns:
        return []
    import pyarrow.compute as pc

    files = add_actions(dt)
    out = []
    for c in columns:
        counts = [f.get(f"null_count.{c}") for f in files]
        if any(n is not None and n > 0 for n in counts):
            out.append(c)
        elif any(n is None for n in counts) and files:
            data = arrow(dt.scan(columns=[c]).read_all()).column(c)
            if pc.any(pc.is_null(data)).as_py():
                out.append(c)
    return out


def _norm_type(spark_sql: str) -> str:
    """Spark SQL type text compared loosely: text types are one, decimals by precision."""
    t = exp.DataType.build(spark_sql, dialect="spark")
    if t.is_type(*exp.DataType.TEXT_TYPES):
        return "STRING"
    return t.sql("spark").replace(" ", "")


def _sql_type(spark_type: str) -> str:
    """A Spark type (``simpleString``) as the catalog spells types (PostgreSQL's names)."""
    return exp.DataType.build(spark_type, dialect="spark").sql("postgres")


def _upstream_map(reg: Mapping[str, Any]) -> dict[str, list[str]]:
    return {v: list(e.get("upstream") or ()) for v, e in reg["views"].items()}
