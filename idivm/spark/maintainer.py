"""Deferred ID-based maintenance on Spark: change feeds in, Spark-dialect Δ-scripts, views out.

A maintenance round (``maintain``) is crash-safe:

1. the pending change-feed versions of every base table are folded into effective changes;
2. the Δ-script runs statement by statement: i-diff queries are checkpointed in memory, and each
   cache's or the view's APPLYs are *staged* — the post-state of the buckets they touch is
   written under ``_staging/<run>/`` — after which later statements read the staged post-state;
3. a manifest records the run (staged targets, the versions consumed);
4. the staged buckets are published (copied into place: repeatable), and only then does the
   view's watermark move.

A run killed before the manifest leaves nothing applied (its staging is discarded on the next
run); a run killed after it is finished by the next ``maintain`` from the staged files.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlglot import exp

from idivm.catalog import Catalog
from idivm.errors import BackendError, IdivmError
from idivm.plan import Plan, plan
from idivm.planner.model import Strategy, change_table
from idivm.planner.prune import prune_empty
from idivm.script import Apply, Compute, query_sql
from idivm.spark import changes as cdf
from idivm.spark.session import embedded_session
from idivm.spark.storage import ApplyOp, BucketedParquetStore, Store

log = logging.getLogger("idivm.spark")

# Checkpointed relations carry no size estimate, so Spark would sort-merge-join a large stored
# relation against a 200-row i-diff; i-diffs known to be at most this many rows are hinted as
# broadcast (hash) join inputs instead.
BROADCAST_ROWS = 1_000_000


class InjectedFailure(BaseException):
    """Raised by the test hook that kills a maintenance run at a chosen step. A BaseException,
    like a kill: no ``except Exception`` cleanup runs, so tests see what a dead process leaves."""


@dataclass
class SparkMaintenanceStats:
    view: str
    changes: dict[str, int] = field(default_factory=dict)
    idiff_rows: dict[str, int] = field(default_factory=dict)
    partitions_rewritten: dict[str, tuple[int, int]] = field(default_factory=dict)
    pending_rows: dict[str, int] = field(default_factory=dict)  # kept as pending i-diffs
    statements: list[tuple[str, float]] = field(default_factory=list)
    recovered: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"view": self.view, "changes": self.changes, "idiff_rows": self.idiff_rows,
                "partitions_rewritten": {k: list(v) for k, v in
                                         self.partitions_rewritten.items()},
                "pending_rows": self.pending_rows,
                "statements": self.statements, "recovered": self.recovered,
                "seconds": self.seconds}


class SparkMaintainer:
    """Base tables, views and caches under ``warehouse``; views maintained from change feeds."""

    def __init__(self, catalog: Catalog, warehouse: str | os.PathLike[str], spark: Any = None,
                 master: str | None = None, buckets: int | None = None,
                 rows_per_bucket: int = 2000, compact_share: float = 0.05,
                 max_pending: int = 8) -> None:
        self.catalog = catalog
        self.root = Path(warehouse).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.spark = spark if spark is not None else embedded_session(master)
        self.store: Store = BucketedParquetStore(
            self.spark, self.root, rows_per_bucket, buckets=buckets,
            compact_share=compact_share, max_pending=max_pending)
        self._plans: dict[str, Plan] = {}
        self._schemas: dict[tuple[str, str], Any] = {}
        self._no_changes: dict[str, Any] = {}  # empty change table per base table (schema only)
        self.fail_at: Callable[[str], bool] | None = None  # test hook: kill a run at a step
        self._dirty: set[str] = set()  # views whose last run did not finish in this session
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
            if self.store.exists(t):
                self._register(t)
        for v, entry in reg["views"].items():
            for m in entry["materialized"]:
                if self.store.exists(m):
                    self._register(m)
            self._register_view(v, entry["store"], entry["columns"])

    def _register_view(self, name: str, store: str, columns: Sequence[str]) -> None:
        from pyspark.sql import functions as F

        self.spark.table(store).select(*[F.col(f"`{c}`") for c in columns]) \
            .createOrReplaceTempView(name)

    def _step(self, what: str) -> None:
        if self.fail_at is not None and self.fail_at(what):
            raise InjectedFailure(f"injected failure before {what}")

    # -- base tables ----------------------------------------------------------------------------
    def load_table(self, name: str, df: Any) -> None:
        """Initial contents of a base table (replaces what was there)."""
        table = self.catalog.table(name)
        if not table.primary_key:
            raise IdivmError(f"table {name} has no primary key; idivm needs one on every table")
        missing = [c for c in table.column_names if c not in df.columns]
        if missing:
            raise IdivmError(f"load_table {name}: missing column(s) {', '.join(missing)}")
        df = self._typed(table.name, df.select(*table.column_names))
        self.store.create(name, df, table.primary_key, table.primary_key[0])
        self._register(name)
        reg = self.registry()
        reg["tables"].setdefault(name, {"version": 0})
        self._save(reg)

    def _typed(self, name: str, df: Any, keep: Sequence[str] = ()) -> Any:
        """Columns cast to the catalog's types (as Spark spells them)."""
        from pyspark.sql import functions as F

        table = self.catalog.table(name)
        out = []
        for c in table.columns:
            ty = exp.DataType.build(c.type, dialect="postgres").sql("spark")
            out.append(F.col(f"`{c.name}`").cast(ty).alias(c.name))
        return df.select(*out, *[F.col(k) for k in keep])

    def apply_changes(self, name: str, changes: Any) -> int:
        """Record a CDF-shaped batch and bring the base table to its post-state.

        Returns the last ``_commit_version`` recorded. A bad batch is refused before anything
        is written.
        """
        table = self.catalog.table(name)
        reg = self.registry()
        if name not in reg["tables"]:
            raise IdivmError(f"table {name} is not loaded (load_table first)")
        last = int(reg["tables"][name]["version"])
        batch, top = cdf.validate(table, changes, last)
        if top is None:
            return last
        typed = self._typed(name, batch, (cdf.CHANGE_TYPE, cdf.VERSION)) \
            .localCheckpoint(eager=True)
        cdf.write_log(self.root, name, typed)
        # the base table's post-state: the batch's own effective changes, applied by key
        run = f"load_{name}_{uuid.uuid4().hex[:8]}"
        eff = cdf.fold(self.spark, self.root, table, last, int(top), run)
        key = tuple(table.primary_key)
        dels = eff.where("__has_pre AND NOT __has_post").select(*key)
        ins = eff.where("__has_post").select(
            *key, *[eff[f"{c}__post"].alias(c) for c in table.non_key_columns])
        res = self.store.stage(run, name, [ApplyOp("del", dels, key, ()),
                                           ApplyOp("ins", ins, key, table.column_names)],
                               rewrite=True)  # base tables stay plain: recomputations read them
        del res
        self.store.publish(run, name)
        self.store.discard(run)
        self._register(name)
        reg["tables"][name]["version"] = int(top)
        self._save(reg)
        return int(top)

    # -- views ----------------------------------------------------------------------------------
    def plan_of(self, name: str) -> Plan:
        if name not in self._plans:
            entry = self.registry()["views"].get(name)
            if entry is None:
                raise BackendError(f"no idivm view {name!r} in {self.root}")
            self._plans[name] = plan(entry["sql"], self.catalog, name=name,
                                     changes=entry.get("changes"),
                                     strategy=entry.get("strategy", "id"))
        return self._plans[name]

    def create_view(self, name: str, view_sql: str,
                    changes: Mapping[str, Sequence[str]] | None = None,
                    strategy: Strategy = "id") -> Plan:
        """Materialize the view and its caches (refused SQL raises before anything is written).
        ``strategy``: ``id`` (the default), ``tuple`` (t-diffs, the baseline) or ``recompute``."""
        p = plan(view_sql, self.catalog, name=name, changes=changes, strategy=strategy)
        reg = self.registry()
        if name in reg["views"] or name in reg["tables"]:
            raise BackendError(f"{name} already exists in {self.root}")
        missing = [t for t in p.tables if t not in reg["tables"]]
        if missing:
            raise BackendError(f"load_table first: {', '.join(missing)}")
        for m, query in p.materialize_queries():
            df = self.spark.sql(query_sql(query, "spark"))
            self.store.create(m.name, df, m.key, _bucket_col(p, m.name, m.key))
            self._register(m.name)
        self._register_view(name, p.store.name, p.columns)
        reg["views"][name] = {
            "sql": view_sql, "changes": {k: list(v) for k, v in changes.items()} if changes
            else None, "strategy": strategy, "store": p.store.name, "columns": list(p.columns),
            "materialized": [m.name for m in p.materialized],
            "watermarks": {t: int(reg["tables"][t]["version"]) for t in p.tables}}
        self._save(reg)
        self._plans[name] = p
        return p

    def read_view(self, name: str) -> Any:
        """The view as a DataFrame with exactly its declared columns."""
        self.plan_of(name)
        return self.spark.table(name)

    def drop_view(self, name: str) -> None:
        p = self.plan_of(name)
        for m in p.materialized:
            self.store.drop(m.name)
            self.spark.catalog.dropTempView(m.name)
        self.spark.catalog.dropTempView(name)
        reg = self.registry()
        reg["views"].pop(name, None)
        self._save(reg)
        self._plans.pop(name, None)

    def status(self) -> list[dict[str, Any]]:
        reg = self.registry()
        return [{"view": v, "watermarks": e["watermarks"],
                 "pending_versions": {t: int(reg["tables"][t]["version"]) - int(w)
                                      for t, w in e["watermarks"].items()},
                 "pending_idiff_rows": {m: sum(int(x["rows"]) for x in self.store.pending(m))
                                        for m in e["materialized"] if self.store.exists(m)}}
                for v, e in sorted(reg["views"].items())]

    # -- maintenance ----------------------------------------------------------------------------
    def _manifest(self, name: str) -> Path:
        return self.root / "_staging" / f"{name}.manifest.json"

    def maintain(self, name: str) -> SparkMaintenanceStats:
        """Bring the view up to date with every recorded change after its watermark."""
        from pyspark.sql import functions as F

        p = self.plan_of(name)
        stats = SparkMaintenanceStats(name)
        start = time.perf_counter()
        if name in self._dirty:  # a killed run left staged post-states in the session
            self._reset_views(p)
        self._dirty.add(name)
        self._sweep(name)
        if self._manifest(name).exists():  # a run staged everything, then died: finish it
            self._publish(p, json.loads(self._manifest(name).read_text()))
            stats.recovered = True
        reg = self.registry()
        entry = reg["views"][name]
        upto = {t: int(reg["tables"][t]["version"]) for t in p.tables}
        since = {t: int(entry["watermarks"][t]) for t in p.tables}
        if upto == since:
            self._dirty.discard(name)
            stats.seconds = time.perf_counter() - start
            return stats
        run = f"{name}_{uuid.uuid4().hex[:8]}"
        staged: list[str] = []
        try:
            self._step("fold")
            folded: dict[str, Any] = {}
            for t in p.tables:
                table = self.catalog.table(t)
                if upto[t] == since[t]:  # no new version: no job needed to know it is empty
                    if t not in self._no_changes:  # analyzed once: its schema never changes
                        self._no_changes[t] = cdf.empty_changes(self.spark, table)
                    chg = self._no_changes[t]
                    stats.changes[t] = 0
                else:
                    chg = cdf.fold(self.spark, self.root, table, since[t], upto[t],
                                   name).localCheckpoint(eager=False)  # the count job fills it
                    folded[change_table(t)] = chg
                chg.createOrReplaceTempView(change_table(t))
            known = {change_table(t): n for t, n in stats.changes.items()}
            known |= self._instance_sizes(p, stats, known)
            for ct, chg in folded.items():
                if known[ct] <= BROADCAST_ROWS:
                    F.broadcast(chg).createOrReplaceTempView(ct)
            uses = Counter(r for st in p.statements for r in _reads(st))
            computes = {st.name: st for st in p.statements if isinstance(st, Compute)}
            ready: set[str] = set()  # i-diffs registered as temp views in this run
            statements = list(p.statements)
            i = 0
            while i < len(statements):
                s = statements[i]
                if isinstance(s, Compute):
                    reads = _reads(s)
                    inputs = [r for r in reads if r in known]
                    if known.get(s.name) == 0 or inputs and all(known[r] == 0 for r in inputs):
                        known[s.name] = 0  # counted empty, or only empty i-diffs in: not run
                        i += 1
                        continue
                    self._step(s.name)
                    t0 = time.perf_counter()
                    empty = {r for r in reads if known.get(r) == 0}
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
                ops: list[ApplyOp] = []
                while i < len(statements) and isinstance(statements[i], Apply) and \
                        statements[i].target == target:  # type: ignore[union-attr]
                    a = statements[i]
                    assert isinstance(a, Apply)
                    if known.get(a.diff) != 0:
                        ops.append(ApplyOp(a.kind, self.spark.table(a.diff), a.ids, a.columns,
                                           a.nullable))
                    i += 1
                if not ops:
                    continue
                self._step(f"stage {target}")
                t0 = time.perf_counter()
                res = self.store.stage(run, target, ops)
                stats.partitions_rewritten[target] = (len(res.touched), res.total)
                stats.pending_rows[target] = res.pending_rows
                for op, n in zip(ops, res.rows, strict=True):
                    stats.idiff_rows[f"{op.kind} → {target}"] = \
                        stats.idiff_rows.get(f"{op.kind} → {target}", 0) + n
                if any(target in _reads(st) for st in statements[i:]):
                    res.post_state.createOrReplaceTempView(target)  # later statements read it
                staged.append(target)
                stats.statements.append((f"stage {target}", time.perf_counter() - t0))
            self._step("manifest")
            manifest = {"run": run, "targets": staged, "upto": upto}
            self._manifest(name).parent.mkdir(parents=True, exist_ok=True)
            tmp = self._manifest(name).with_suffix(".tmp")
            tmp.write_text(json.dumps(manifest))
            os.replace(tmp, self._manifest(name))
        except Exception:
            self.store.discard(run)
            self._reset_views(p)
            raise
        self._publish(p, manifest)
        self._drop_temps(p)
        self._dirty.discard(name)
        stats.seconds = time.perf_counter() - start
        return stats

    def _ensure_empty(self, p: Plan, computes: Mapping[str, Compute], name: str,
                      ready: set[str]) -> None:
        """Register a skipped (empty) i-diff as an empty relation of its schema; the schema is
        analyzed once per plan, over its own inputs registered the same way."""
        if name in ready:
            return
        key = (p.name, name)
        if key not in self._schemas:
            s = computes[name]
            for r in _reads(s):
                if r in computes:
                    self._ensure_empty(p, computes, r, ready)
            self._schemas[key] = self.spark.sql(query_sql(s.query, "spark")).schema
        # an empty local relation (not an empty RDD): Spark sizes it at 0 and prunes joins on it
        empty = exp.select(*[exp.alias_(exp.cast(exp.null(), exp.DataType.build(
            f.dataType.simpleString(), dialect="spark")), f.name, quoted=True)
            for f in self._schemas[key].fields]).where(exp.false())
        self.spark.sql(empty.sql("spark")).createOrReplaceTempView(name)
        ready.add(name)

    def _instance_sizes(self, p: Plan, stats: SparkMaintenanceStats, known: Mapping[str, int]
                        ) -> dict[str, int]:
        """Rows of every base-table i-diff (§5 instances), one aggregate job per changed table
        — so rules fed only by empty i-diffs are skipped without running them."""

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
            row = self.spark.sql(query_sql(q, "spark")).collect()[0]
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
        staging = self.root / "_staging"
        if staging.exists():
            for d in staging.glob(f"{name}_*"):
                if d.is_dir() and d.name != keep:
                    self.store.discard(d.name)

    def _publish(self, p: Plan, manifest: Mapping[str, Any]) -> None:
        """Copy staged buckets into place (repeatable), then move the watermark, last."""
        run = manifest["run"]
        try:
            for target in manifest["targets"]:
                self._step(f"publish {target}")
                self.store.publish(run, target)
            self._step("watermark")
            reg = self.registry()
            reg["views"][p.name]["watermarks"] = {t: int(v) for t, v in
                                                  manifest["upto"].items()}
            self._save(reg)
        finally:
            self._reset_views(p)
        self._manifest(p.name).unlink(missing_ok=True)
        self.store.discard(run)
        for t in p.tables:
            marks = [int(e["watermarks"][t]) for e in reg["views"].values()
                     if t in e["watermarks"]]
            if marks:
                cdf.prune(self.root, t, min(marks))

    def _reset_views(self, p: Plan) -> None:
        """Temp views back to the stored relations (undo the staged post-states)."""
        for m in p.materialized:
            if self.store.exists(m.name):
                self._register(m.name)
        self._register_view(p.name, p.store.name, p.columns)

    def _drop_temps(self, p: Plan) -> None:
        for s in p.statements:
            if isinstance(s, Compute):
                self.spark.catalog.dropTempView(s.name)
        for t in p.tables:
            self.spark.catalog.dropTempView(change_table(t))

    def compact(self, name: str) -> dict[str, tuple[int, int]]:
        """Fold the pending i-diffs of the view and its caches into their buckets (what a
        maintenance round does by itself past the thresholds); returns buckets rewritten out
        of all, per relation. Contents do not change, so no manifest is needed: re-applying
        pending i-diffs to buckets that already hold their effect changes nothing (each APPLY
        sets post-state values by IDs, and a later one overrides an earlier one)."""
        p = self.plan_of(name)
        out: dict[str, tuple[int, int]] = {}
        for m in p.materialized:
            if not self.store.exists(m.name) or not self.store.pending(m.name):
                continue
            run = f"{name}_{uuid.uuid4().hex[:8]}"
            try:
                res = self.store.stage(run, m.name, [], rewrite=True)
                self.store.publish(run, m.name)
            finally:
                self.store.discard(run)
            out[m.name] = (len(res.touched), res.total)
        self._reset_views(p)
        return out

    def recompute(self, name: str) -> Any:
        """The view's query run from scratch over the base tables (for comparison)."""
        return self.spark.sql(query_sql(self.plan_of(name).recompute_query(), "spark"))


def _reads(s: Any) -> list[str]:
    """The relations a statement reads (i-diffs, snapshots, change tables, stored tables)."""
    if isinstance(s, Apply):
        return [s.diff]

    return [tb.name for tb in s.query.find_all(exp.Table)]


def _bucket_col(p: Plan, target: str, key: Sequence[str]) -> str | None:
    """Bucket by an ID column every i-diff applied to the target names rows by, if any."""
    sets = [set(s.ids) for s in p.statements
            if isinstance(s, Apply) and s.target == target and s.kind != "ins"]
    for k in key:
        if sets and all(k in ids for ids in sets):
            return k
    return key[0] if key else None
