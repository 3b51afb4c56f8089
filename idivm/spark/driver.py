"""Small refreshes on the driver: the Δ-script run by DuckDB over the Delta tables' files.

A Spark job costs 0.1–1 s whatever its size, and a Δ-script is a dozen statements: for a batch of
a few hundred changes the jobs, not the data, are the refresh. Below a size the cost model sets
(``SparkMaintainer(engine=...)``, ``choose_engine``), the same Δ-script runs in an in-process
DuckDB on the driver instead:

- base tables, caches and views are read from their Delta files at the versions the refresh
  consumes (the file lists delta-rs gives; DuckDB prunes columns and row groups itself); the
  change feeds are the Arrow tables delta-rs read, folded by the same ``fold_select`` as on
  Spark and PostgreSQL;
- each statement is the Spark SQL text of the Δ-script transpiled to DuckDB by sqlglot (Spark's
  semantics: ``/`` is a fractional division, a failed cast is NULL), materialized as a
  temporary table;
- each target's APPLYs are staged merge-on-read: the post-state of the rows read (the touched
  buckets' and ``RECENT``'s, each with its file and position) is compared with those rows;
  unchanged rows stay, the others are marked in deletion vectors and their new versions written
  in one file (``DeltaStore.stage_dv``). Past ``DeltaStore.should_fold`` (or for a table
  without deletion vectors) the touched buckets and merge-on-read's leftovers are written anew
  instead, one file per bucket. Either way the same ``_stage.json`` the Spark path writes
  records the commit, so the manifest, the publish and the crash recovery are the Spark path's.
  A row's bucket is Spark's ``pmod(xxhash64(id), N)`` (``idivm.spark.sparkhash``), so either
  engine finds it later.

Assumed: the warehouse and the base tables are on a file system the driver reads and writes
(``choose_engine`` picks Spark otherwise, and for base tables with partition columns or bucket
IDs of types ``sparkhash`` does not cover). Executors are not involved, so their number and
where they run do not matter.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sqlglot import exp

from idivm.catalog import Catalog, Table
from idivm.plan import Plan
from idivm.planner.model import change_table
from idivm.planner.prune import prune_empty, reads_only_empty
from idivm.planner.ruleapi import c, select, t
from idivm.script import Apply, Compute, adapt, apply_run, reads
from idivm.spark import changes as cdf
from idivm.spark.delta import BUCKET, RECENT, DeltaStore, _bucket_value, add_actions, folded
from idivm.spark.sparkhash import bucket_function, buckets
from idivm.spark.storage import ApplyOp, apply_sql, on_ids

# A batch of at most this many change-feed rows is refreshed on the driver (``engine="auto"``):
# DuckDB runs a statement over thousands of rows in milliseconds, where a Spark job costs
# 0.1–1 s; above it the i-diffs are large enough for Spark's executors to pay off.
DRIVER_MAX_CHANGES = 20_000
# ... and never more than this many, whatever the estimates say (the i-diffs are in memory)
DRIVER_CEILING = 1_000_000
_BUCKET_DIR = re.compile(rf"{BUCKET}=(-?\d+)/")  # a staged file's bucket, from its path


def duckdb_sql(query: exp.Expr) -> str:
    """A Δ-script query as DuckDB runs it: the tree adapted to Spark SQL (its types, e.g. no
    unbounded NUMERIC) and generated for DuckDB, whose casts and divisions fail as Spark's do
    in ANSI mode (Spark 4's default)."""
    return adapt(query.copy(), "spark").sql(dialect="duckdb")


def compile_texts(p: Plan) -> dict[str, str]:
    """The DuckDB text of every computed statement of ``p`` (what ``DriverRefresh`` runs),
    generated once per view rather than at each refresh."""
    texts = {s.name: duckdb_sql(s.query) for s in p.statements if isinstance(s, Compute)}
    for name in p.tables:
        texts[f"fold {name}"] = duckdb_sql(_fold(p.catalog.table(name), _feed_name(p, name)))
    return texts


def _feed_name(p: Plan, table: str) -> str:
    return f"__idivm_feed_{p.tables.index(table)}"


def _fold(table: Table, src: str) -> exp.Select:
    """Effective changes of the CDF rows registered as ``src`` (``fold_select``)."""
    log = exp.Subquery(this=_as_log(src, table),
                       alias=exp.TableAlias(this=exp.to_identifier("__idivm_log", quoted=True)))
    return cdf.fold_select(table, log, exp.true(), dialect="duckdb")


def _ident(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql("duckdb")


def _files_sql(root: Path, paths: Sequence[str], hive: bool, positions: bool = False) -> str:
    """``read_parquet`` of some files of a table, as a FROM item; with ``positions``, each
    row's file (``filename``, the path as given) and position in it (``file_row_number``)."""
    files = exp.Array(expressions=[exp.Literal.string(p if p.startswith("/") else
                                                      str(root / p)) for p in paths])
    opts = ", hive_partitioning = true" if hive else ", hive_partitioning = false"
    if positions:
        opts += ", filename = true, file_row_number = true"
    return f"read_parquet({files.sql('duckdb')}{opts})"


@dataclass(frozen=True)
class LiveFiles:
    """A stored relation's rows as DuckDB reads them: its files by bucket (absolute paths;
    ``RECENT``: the rows merge-on-read refreshes added, in any bucket) and the row positions
    their deletion vectors delete."""

    by_bucket: Mapping[int, Sequence[str]]
    deleted: Mapping[str, Sequence[int]]

    @staticmethod
    def of(root: Path, files: Sequence[Mapping[str, Any]]) -> LiveFiles:
        by: dict[int, list[str]] = {}
        for f in files:
            b = _bucket_value(f)
            by.setdefault(0 if b is None else b, []).append(str(root / f["path"]))
        return LiveFiles(by, {str(root / f["path"]): list(f["deleted"])
                              for f in files if f.get("deleted")})

    def paths(self, buckets: Iterable[int] | None = None) -> list[str]:
        """The files of ``buckets`` (all when None) and always those of ``RECENT``."""
        keys = sorted(self.by_bucket) if buckets is None else sorted(set(buckets) | {RECENT})
        return [f for b in keys for f in self.by_bucket.get(b, ())]


@dataclass(frozen=True)
class Eligibility:
    ok: bool
    reason: str


def stored_eligible(p: Plan, store: DeltaStore) -> Eligibility:
    """Whether the driver can refresh this view's stored relations (see the module doc): a
    property of the view, fixed at ``create_view``."""
    if "://" in str(store.root):
        return Eligibility(False, "the warehouse is not on the driver's file system")
    import pyarrow as pa

    for m in p.materialized:
        dt = store.table(m.name)
        col = store.layout(m.name, dt).get("bucket_col")
        if col is None:
            continue
        ty = pa.schema(dt.schema().to_arrow()).field(col).type
        if bucket_function(ty) is None:
            return Eligibility(False, f"{m.name} is bucketed by {col} of type {ty}")
    return Eligibility(True, "")


def base_eligible(locations: Mapping[str, str], heads: Mapping[str, Any]) -> Eligibility:
    """Whether the driver can read these base tables (their locations and Delta tables; see
    the module doc)."""
    for t_, loc in locations.items():
        if "://" in loc:
            return Eligibility(False, f"base table {t_} is not on the driver's file system")
        if list(heads[t_].metadata().partition_columns):
            return Eligibility(False, f"base table {t_} has partition columns")
    return Eligibility(True, "")


def driver_database() -> Any:
    """An in-memory DuckDB database for driver refreshes (each refresh opens a connection)."""
    import duckdb

    db = duckdb.connect()
    db.execute("SET threads = 2")
    return db


class DriverRefresh:
    """One refresh's Δ-script in DuckDB; ``run`` stages every target like the Spark path."""

    def __init__(self, catalog: Catalog, store: DeltaStore, locations: Mapping[str, str],
                 heads: Mapping[str, Any], step: Callable[[str], None],
                 texts: dict[str, str] | None = None, db: Any = None,
                 inputs: Mapping[str, str] | None = None) -> None:
        # DuckDB text of the plan's statements, kept by the caller across refreshes
        self.texts: dict[str, str] = {} if texts is None else texts
        self.catalog = catalog
        self.store = store
        self.locations = locations
        self.heads = heads  # each base table's Delta table at the version the refresh reads
        # views read as base tables → their stored relations (read with deletion vectors)
        self.inputs = dict(inputs or {})
        self.step = step
        self._stored: dict[str, Any] = {}  # stored relation: its DeltaTable (as of now)
        # stored relations registered as their files before this refresh (not yet replaced
        # by a staged post-state): a snapshot of one may read just some of those files
        self.stored_names: set[str] = set()
        self.partitions_read: dict[str, tuple[int, int]] = {}  # (buckets read, in all)
        # a stored relation read as its post-state: its files and deletion vectors
        self.post_files: dict[str, LiveFiles] = {}
        # a connection of its own to the maintainer's DuckDB database (``driver_database``):
        # its temporary tables and registered Arrow tables go with it at ``close``; opening a
        # database costs ~25 ms, a connection to one well under 1 ms
        self.con = (db or driver_database()).cursor()
        self._held: list[Any] = []  # Arrow tables registered in DuckDB (kept alive)
        self.con.execute("SET TimeZone = 'UTC'")

    def stored(self, name: str) -> Any:
        """A cache's or the view's Delta table (it does not change until the publish)."""
        if name not in self._stored:
            self._stored[name] = self.store.table(name)
        return self._stored[name]

    def close(self) -> None:
        self.con.close()

    # -- inputs -------------------------------------------------------------------------------
    def _view(self, name: str, body: str) -> None:
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW {_ident(name)} AS {body}")

    def _empty_of(self, dt: Any) -> str:
        """An empty relation with a Delta table's columns (no file to read them from)."""
        import pyarrow as pa

        schema = pa.schema(dt.schema().to_arrow())
        holder = f"__idivm_empty_{len(self._held)}"
        self._hold(holder, pa.table({f.name: pa.array([], type=f.type)
                                     for f in schema if f.name != BUCKET}))
        return f"SELECT * FROM {_ident(holder)}"

    def register_inputs(self, p: Plan) -> None:
        for name in p.tables:
            dt = self.heads[name]
            cols = ", ".join(_ident(k) for k in self.catalog.table(name).column_names)
            if name in self.inputs:  # a view's stored relation: its live rows
                live = LiveFiles.of(self.store.path(self.inputs[name]),
                                    self.store.files(self.inputs[name], dt))
                paths = live.paths()
                body = self._live_sql(cols, paths, False, live.deleted) if paths \
                    else self._empty_of(dt)
            else:
                files = [a["path"] for a in add_actions(dt)]
                body = (f"SELECT {cols} FROM "
                        f"{_files_sql(Path(self.locations[name]), files, False)}"
                        if files else self._empty_of(dt))
            self._view(name, body)
        for m in p.materialized:
            self._register_stored(m.name)

    def _register_stored(self, name: str) -> None:
        """A cache or the view as its live files (without the bucket column)."""
        dt = self.stored(name)
        live = self._live(name)
        cols = ", ".join(_ident(f.name) for f in dt.schema().fields if f.name != BUCKET)
        paths = live.paths()
        self._view(name, self._live_sql(cols, paths, False, live.deleted)
                   if paths else self._empty_of(dt))
        self.stored_names.add(name)

    def _live(self, rel: str) -> LiveFiles:
        """A stored relation's files as DuckDB reads it now (its post-state once its APPLYs
        are staged)."""
        if rel in self.post_files:
            return self.post_files[rel]
        return LiveFiles.of(self.store.path(rel), self.store.files(rel, self.stored(rel)))

    def _live_sql(self, cols: str, paths: Sequence[str], hive: bool,
                  deleted: Mapping[str, Sequence[int]], positions: bool = False) -> str:
        """``SELECT cols`` of the rows of some files (absolute paths) that their deletion
        vectors (``deleted``) keep; with ``positions``, also each row's ``__file`` and
        ``__pos``."""
        listed = set(paths)
        gone = {f: rows for f, rows in deleted.items() if rows and f in listed}
        if not gone and not positions:
            return f"SELECT {cols} FROM {_files_sql(Path('/'), paths, hive)}"
        extra = ", filename AS __file, file_row_number AS __pos" if positions else ""
        body = (f"SELECT {cols}{extra} FROM {_files_sql(Path('/'), paths, hive, True)} "
                "AS __r")
        if gone:
            import pyarrow as pa

            holder = f"__idivm_dv_{len(self._held)}"
            self._hold(holder, pa.table({
                "__f": [f for f, rows in gone.items() for _ in rows],
                "__p": pa.array([int(r) for rows in gone.values() for r in rows], pa.int64())}))
            body += (f" WHERE NOT EXISTS (SELECT 1 FROM {_ident(holder)} AS __g WHERE "
                     "__g.__f = __r.filename AND __g.__p = __r.file_row_number)")
        return body

    def register_changes(self, p: Plan, feeds: Mapping[str, Any]) -> dict[str, int]:
        """Each base table's folded change table; returns rows per change table."""
        out: dict[str, int] = {}
        for name in p.tables:
            table = self.catalog.table(name)
            feed = feeds.get(name)
            src = _feed_name(p, name)
            if feed is None:
                body = _empty_changes(table)
            else:
                self._hold(src, feed)
                body = self._text(f"fold {name}", partial(_fold, table, src))
            ct = change_table(name)
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE {_ident(ct)} AS {body}")
            out[ct] = self.count(ct)
        return out

    def count(self, name: str) -> int:
        row = self.con.execute(f"SELECT count(*) FROM {_ident(name)}").fetchone()
        return int(row[0]) if row else 0

    def one_row(self, q: exp.Select) -> dict[str, Any]:
        rel = self.con.execute(duckdb_sql(q))
        names = [d[0] for d in rel.description or ()]
        row = rel.fetchone() or ()
        return dict(zip(names, row, strict=False))

    # -- statements ---------------------------------------------------------------------------
    def _text(self, key: str, query: Callable[[], exp.Expr]) -> str:
        """The DuckDB text under ``key`` (generated from ``query`` unless known)."""
        if key not in self.texts:
            self.texts[key] = duckdb_sql(query())
        return self.texts[key]

    def compute(self, s: Compute, known: Mapping[str, int] | None = None,
                idle: bool = False) -> int:
        """Run one statement into a temporary table; returns its rows. A stored relation the
        statement reads only where an i-diff names it is read from the files of the buckets
        the i-diff can touch (``_restricted``). An ``idle`` statement (its i-diffs all empty)
        becomes an empty table of its columns: the constant-false filter lets DuckDB plan it
        without reading any input."""
        body = None if idle else self._restricted(s, known or {})
        body = body or self._text(s.name, lambda: s.query)
        if idle:
            body = f"SELECT * FROM ({body}) AS {_ident('__idle')} WHERE false"
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {_ident(s.name)} AS {body}")
        return 0 if idle else self.count(s.name)

    def _bucketing(self, rel: str) -> tuple[str, int] | None:
        """A stored relation's bucket column and number of buckets; None when unbucketed."""
        layout = self.store.layout(rel, self.stored(rel))
        col, n = layout.get("bucket_col"), int(layout.get("buckets") or 1)
        return None if col is None or n <= 1 else (col, n)

    def _restricted(self, s: Compute, known: Mapping[str, int]) -> str | None:
        """The statement's text reading each stored relation R only from the files of the
        buckets its i-diffs name, where R is read as ``FROM R WHERE EXISTS (… d …) OR …`` (a
        snapshot) or ``FROM R JOIN d ON R.b = d.x`` (an inner join with an i-diff) and b is R's
        bucket column: a row outside those buckets satisfies no EXISTS and matches no i-diff
        row. None when nothing is restricted (the statement's own text runs)."""
        q = prune_empty(s.query, frozenset(n for n, k in known.items() if k == 0))
        done = False
        for sel in list(q.find_all(exp.Select)):
            src = sel.args.get("from_")
            if src is None or not isinstance(src.this, exp.Table):
                continue
            rel, alias = src.this.name, src.this.alias_or_name
            if rel not in self.stored_names and rel not in self.post_files:
                continue
            where, joins = sel.args.get("where"), sel.args.get("joins")
            bucketing = self._bucketing(rel)
            if bucketing is None:
                continue
            col, n = bucketing
            probes: list[tuple[str, str]] | None = None
            if joins:
                probes = _join_probes(joins, alias, col, known)
            elif where is not None:
                probes = _bucket_probes(where.this, alias, col)
            if probes is None:
                continue
            hash_type = _arrow_type(self.stored(rel), col)
            hit: set[int] = set()
            for diff, other in probes:
                vals = self.con.execute(f"SELECT DISTINCT {_ident(other)} FROM {_ident(diff)}"
                                        ).fetch_arrow_table().column(0).combine_chunks()
                got = buckets(vals.cast(hash_type), n)
                if got is None:
                    break
                hit.update(got)
            else:
                live = self._live(rel)
                files = live.paths(hit)
                self.partitions_read[rel] = (len(hit), n)
                part = f"__idivm_part_{rel}_{len(self._held)}_{id(sel)}"
                cols = ", ".join(_ident(f.name) for f in self.stored(rel).schema().fields
                                 if f.name != BUCKET)
                self._view(part, self._live_sql(cols, files, False, live.deleted)
                           if files else f"SELECT * FROM {_ident(rel)} WHERE false")
                src.this.set("this", exp.to_identifier(part, quoted=True))
                if not src.this.alias:
                    src.this.set("alias", exp.TableAlias(this=exp.to_identifier(rel,
                                                                                quoted=True)))
                done = True
        return duckdb_sql(q) if done else None

    def stage(self, run: str, target: str, applies: Sequence[Apply], later_reads: bool
              ) -> tuple[list[int], int, list[int]]:
        """Stage the APPLYs on ``target``: (buckets whose files it replaces or marks, buckets
        in all, rows per op).

        Merge-on-read (``DeltaStore.stage_dv``): the rows the APPLYs change or delete are
        marked in deletion vectors and their new versions written in one file. Copy-on-write
        instead (``stage_arrow``: the touched buckets written anew, with the leftovers of
        merge-on-read, ``folded``) when the table predates deletion vectors or its leftovers
        would outgrow ``DeltaStore.should_fold`` with this batch."""
        import pyarrow as pa

        dt = self.stored(target)
        layout = self.store.layout(target, dt)
        schema = pa.schema(dt.schema().to_arrow())
        fields = [f for f in schema if f.name != BUCKET]
        cols = [f.name for f in fields]
        col, n = layout["bucket_col"], int(layout["buckets"])
        files = self.store.files(target, dt)
        root = self.store.path(target)
        live = LiveFiles.of(root, files)
        all_cols = [*cols, BUCKET]
        listed = ", ".join(_ident(k) for k in all_cols)
        raw = f"__idivm_raw_{target}"
        self._view(raw, self._live_sql(listed, live.paths(), True, live.deleted)
                   if files else f"SELECT *, CAST(NULL AS INTEGER) AS {_ident(BUCKET)} FROM "
                   f"{_ident(target)} WHERE false")
        touched: set[int] = set()
        per_op: list[int] = []
        named: list[tuple[ApplyOp, str]] = []
        hash_type = schema.field(col).type
        sizes = [self.count(a.diff) for a in applies]
        mor = self.store.merge_on_read(dt) and not self.store.should_fold(files, sum(sizes))
        for i, a in enumerate(applies):
            d = f"__idivm_op{i}_{target}"
            if a.kind == "ins":
                rows = self.con.execute(
                    f"SELECT DISTINCT * FROM {_ident(a.diff)}").fetch_arrow_table()
                rows = rows.append_column(BUCKET, pa.array(
                    buckets(rows.column(col).combine_chunks().cast(hash_type), n) or [],
                    type=pa.int32()))
                if mor:  # an inserted row comes from no file
                    rows = rows.append_column("__file", pa.nulls(rows.num_rows, pa.string()))
                    rows = rows.append_column("__pos", pa.nulls(rows.num_rows, pa.int64()))
                self._hold(d, rows)
                touched.update(rows.column(BUCKET).to_pylist())
                per_op.append(rows.num_rows)
            elif col in a.ids:
                vals = self.con.execute(f"SELECT DISTINCT {_ident(col)} FROM "
                                        f"{_ident(a.diff)}").fetch_arrow_table().column(0)
                touched.update(buckets(vals.combine_chunks().cast(hash_type), n) or [])
                self._view(d, f"SELECT * FROM {_ident(a.diff)}")
                per_op.append(sizes[i])
            else:  # named by other IDs: the buckets of the rows they name
                probe = select([(BUCKET, c(BUCKET, "r"))], t(raw, "r"), distinct=True).join(
                    t(a.diff, "d"), on=on_ids(a.ids, "r", "d", a.nullable),
                    join_type="left semi")
                got = self.con.execute(duckdb_sql(probe)).fetch_arrow_table().column(0).to_pylist()
                touched.update(int(b) for b in got)
                self._view(d, f"SELECT * FROM {_ident(a.diff)}")
                per_op.append(sizes[i])
            named.append((ApplyOp(a.kind, None, a.ids, a.columns, a.nullable), d))
        # rows merge-on-read added may be named by a bucket's IDs: RECENT is always read
        # (``LiveFiles.paths``); copy-on-write also rewrites the leftovers' buckets
        touched |= set() if mor else folded(files)
        old = f"__idivm_old_{target}"
        old_paths = live.paths(touched)
        carried = [*all_cols, "__file", "__pos"] if mor else all_cols
        empty = (", CAST(NULL AS VARCHAR) AS __file, CAST(NULL AS BIGINT) AS __pos"
                 if mor else "")
        body = (self._live_sql(listed, old_paths, True, live.deleted, positions=mor)
                if old_paths else f"SELECT *{empty} FROM {_ident(raw)} WHERE false")
        if mor:  # the rows no APPLY names stay as they are: only the named are compared
            body = _named_rows(body, named, layout["key"]) or body
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {_ident(old)} AS {body}")
        q: exp.Select = select([(k, c(k, "r")) for k in carried], t(old, "r"))
        for i, (op, d) in enumerate(named):
            q = apply_sql(q, op, d, carried, layout["key"], f"s{i}")
        typed = pa.schema([*fields, pa.field(BUCKET, pa.int32())])
        if not mor:
            post = self.con.execute(duckdb_sql(q)).fetch_arrow_table().select(all_cols)
            # a row from RECENT goes back to its bucket
            post = post.set_column(post.schema.get_field_index(BUCKET), BUCKET, pa.array(
                buckets(post.column(col).combine_chunks().cast(hash_type), n) or [],
                type=pa.int32())).cast(typed)
            staged = self.store.stage_arrow(run, target, dt, sorted(touched), post)
            if later_reads:  # later statements read the post-state
                kept = [f for f in files if _bucket_value(f) not in touched]
                after = LiveFiles.of(root, kept)
                by = {b: list(v) for b, v in after.by_bucket.items()}
                for path in staged:
                    m = _BUCKET_DIR.search(path)
                    by.setdefault(int(m.group(1)) if m else 0, []).append(path)
                self._register_stored_post(target, LiveFiles(by, after.deleted))
            return sorted(touched - {RECENT}), n, per_op
        hit = self._stage_merge_on_read(run, target, dt, q, old, cols, fields, live, later_reads)
        return hit, n, per_op

    def _stage_merge_on_read(self, run: str, target: str, dt: Any, q: exp.Select, old: str,
                             cols: Sequence[str], fields: Sequence[Any], live: LiveFiles,
                             later_reads: bool) -> list[int]:
        """The post-state ``q`` of the rows read (``old``, with each row's ``__file`` and
        ``__pos``) against them: an old row the post-state keeps unchanged stays where it is;
        every other old row is deleted (its position in its file's deletion vector), every
        other post-state row added. Returns the buckets whose files it marks."""
        import pyarrow as pa

        post, same = f"__idivm_post_{target}", f"__idivm_same_{target}"
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {_ident(post)} AS {duckdb_sql(q)}")
        equal = " AND ".join(f"__p.{_ident(k)} IS NOT DISTINCT FROM __o.{_ident(k)}"
                             for k in cols) or "true"
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE {_ident(same)} AS SELECT __p.__file, __p.__pos "
            f"FROM {_ident(post)} AS __p JOIN {_ident(old)} AS __o ON __p.__file = __o.__file "
            f"AND __p.__pos = __o.__pos WHERE {equal}")
        listed = ", ".join(f"__x.{_ident(k)}" for k in cols)
        unmatched = (f"NOT EXISTS (SELECT 1 FROM {_ident(same)} AS __s WHERE __s.__file = "
                     "__x.__file AND __s.__pos = __x.__pos)")
        gone = self.con.execute(f"SELECT __x.__file, __x.__pos, {listed} FROM {_ident(old)} "
                                f"AS __x WHERE {unmatched}").fetch_arrow_table()
        added = self.con.execute(f"SELECT {listed} FROM {_ident(post)} AS __x WHERE "
                                 f"{unmatched}").fetch_arrow_table()
        schema = pa.schema(list(fields))
        added = added.select(list(cols)).cast(schema)
        removed = gone.select(list(cols)).cast(schema)
        kinds = pa.array(["delete"] * removed.num_rows + ["insert"] * added.num_rows)
        changes = pa.concat_tables([removed, added]).append_column("_change_type", kinds)
        root = self.store.path(target)
        newly: dict[str, list[int]] = {}
        for f, pos in zip(gone.column("__file").to_pylist(), gone.column("__pos").to_pylist(),
                          strict=True):
            newly.setdefault(f, []).append(int(pos))
        relative = {Path(f).relative_to(root).as_posix(): rows for f, rows in newly.items()}
        staged = self.store.stage_dv(run, target, dt, added, relative, changes)
        if later_reads:
            by = {b: list(v) for b, v in live.by_bucket.items()}
            for path in staged:
                by.setdefault(RECENT, []).append(path)
            deleted = {f: sorted(set(live.deleted.get(f, ())) | set(rows))
                       for f, rows in newly.items()}
            self._register_stored_post(target, LiveFiles(by, {**live.deleted, **deleted}))
        return sorted(b for b, paths in live.by_bucket.items()
                      if b != RECENT and any(p in newly for p in paths))

    def _register_stored_post(self, target: str, live: LiveFiles) -> None:
        """Later statements read ``target`` as its staged post-state ``live``."""
        self.stored_names.discard(target)
        self.post_files[target] = live
        dt = self.stored(target)
        cols = ", ".join(_ident(f.name) for f in dt.schema().fields if f.name != BUCKET)
        paths = live.paths()
        self._view(target, self._live_sql(cols, paths, False, live.deleted)
                   if paths else self._empty_of(dt))

    def _hold(self, name: str, table: Any) -> None:
        """An Arrow table as a DuckDB relation named ``name`` (kept alive until close)."""
        self._held.append(table)
        self.con.register(name, table)


def _named_rows(body: str, named: Sequence[tuple[ApplyOp, str]], key: Sequence[str]
                ) -> str | None:
    """``body``'s rows that some APPLY names: a DELETE's or UPDATE's by its IDs, an insert's
    (insert-or-replace) by the key. None when an UPDATE sets a column some APPLY names rows
    by (a later APPLY could then name rows by their new values)."""
    names = {k for op, _ in named for k in (key if op.kind == "ins" else op.ids)}
    if any(op.kind == "upd" and set(op.columns) & names for op, _ in named):
        return None
    conds = [exp.Exists(this=select([("x", exp.Literal.number(1))], t(d, "__d")).where(
        on_ids(key if op.kind == "ins" else op.ids, "__o", "__d", op.nullable)))
        for op, d in named]
    cond: exp.Expr = conds[0]
    for other in conds[1:]:
        cond = exp.Or(this=cond, expression=other)
    return f"SELECT * FROM ({body}) AS __o WHERE {cond.sql('duckdb')}"


def _bucket_probes(cond: exp.Expr, alias: str, col: str) -> list[tuple[str, str]] | None:
    """For a condition that is an OR of ``EXISTS (SELECT … FROM d AS z WHERE … AND
    alias.col = z.other AND …)``: each (d, other); None for any other shape."""
    if isinstance(cond, exp.Paren):
        return _bucket_probes(cond.this, alias, col)
    if isinstance(cond, exp.Or):
        left, right = (_bucket_probes(cond.left, alias, col),
                       _bucket_probes(cond.right, alias, col))
        return None if left is None or right is None else left + right
    if not isinstance(cond, exp.Exists) or not isinstance(cond.this, exp.Select):
        return None
    sub = cond.this
    src, w = sub.args.get("from_"), sub.args.get("where")
    if src is None or w is None or sub.args.get("joins") or not isinstance(src.this, exp.Table):
        return None
    inner = src.this.alias_or_name
    for part in w.this.flatten() if isinstance(w.this, exp.And) else [w.this]:
        if isinstance(part, exp.EQ):
            a, b = part.this, part.expression
            for x, y in ((a, b), (b, a)):
                if isinstance(x, exp.Column) and isinstance(y, exp.Column) and \
                        x.table == alias and x.name == col and y.table == inner:
                    return [(src.this.name, y.name)]
    return None


def _join_probes(joins: Sequence[exp.Join], alias: str, col: str, known: Mapping[str, int]
                 ) -> list[tuple[str, str]] | None:
    """For ``FROM R AS alias [INNER] JOIN d … ON … alias.col = d.x …`` where ``d`` is an
    i-diff (``known``), or a subquery selecting its column ``x`` from one: [(d, x)]."""
    for j in joins:
        if j.args.get("side") or j.args.get("kind") not in (None, "", "INNER") or \
                j.args.get("on") is None:
            continue
        src = j.this
        inner: dict[str, str] = {}
        if isinstance(src, exp.Table):
            diff, other = src.name, src.alias_or_name
        elif isinstance(src, exp.Subquery) and isinstance(src.this, exp.Select) and \
                not src.this.args.get("joins") and isinstance(
                    (src.this.args.get("from_") or exp.From()).this, exp.Table):
            diff, other = src.this.args["from_"].this.name, src.alias_or_name
            for e in src.this.expressions:
                if isinstance(e, exp.Alias) and isinstance(e.this, exp.Column):
                    inner[e.alias] = e.this.name
                elif isinstance(e, exp.Column):
                    inner[e.name] = e.name
        else:
            continue
        if diff not in known:
            continue
        on = j.args["on"]
        for part in on.flatten() if isinstance(on, exp.And) else [on]:
            if not isinstance(part, exp.EQ):
                continue
            for x, y in ((part.this, part.expression), (part.expression, part.this)):
                if isinstance(x, exp.Column) and isinstance(y, exp.Column) and \
                        x.table == alias and x.name == col and y.table == other:
                    name = inner.get(y.name, y.name) if isinstance(src, exp.Subquery) \
                        else y.name
                    if isinstance(src, exp.Subquery) and y.name not in inner:
                        continue
                    return [(diff, name)]
    return None


def _arrow_type(dt: Any, col: str) -> Any:
    import pyarrow as pa

    return pa.schema(dt.schema().to_arrow()).field(col).type


def _as_log(src: str, table: Table) -> exp.Select:
    """CDF rows shaped as the PostgreSQL change log (``cdf.as_log``, in SQL)."""
    old = exp.In(this=c(cdf.CHANGE_TYPE), expressions=[exp.Literal.string(k)
                                                        for k in cdf.OLD_IMAGES])
    op = exp.Case(ifs=[exp.If(this=old, true=exp.Literal.string("D"))],
                  default=exp.Literal.string("I"))
    seq = exp.Add(this=exp.Mul(this=exp.cast(c(cdf.VERSION), "BIGINT"),
                               expression=exp.Literal.number(2)),
                  expression=exp.Case(ifs=[exp.If(this=old.copy(),
                                                  true=exp.Literal.number(0))],
                                      default=exp.Literal.number(1)))
    items = [(cdf.SEQ, seq), (cdf.OP, op)] + [(k, c(k)) for k in table.column_names]
    return select(items, t(src))


def _empty_changes(table: Table) -> str:
    """A change table with no rows (the columns ``fold_select`` yields)."""
    key = list(table.primary_key)
    items = [f"{_ident(k)}" for k in key]
    items += [f"{_ident(k)} AS {_ident(k + '__pre')}" for k in table.non_key_columns]
    items += [f"{_ident(k)} AS {_ident(k + '__post')}" for k in table.non_key_columns]
    items += ["false AS __has_pre", "false AS __has_post"]
    return f"SELECT {', '.join(items)} FROM {_ident(table.name)} WHERE false"


def run_script(d: DriverRefresh, p: Plan, run: str, feeds: Mapping[str, Any],
               sizes: Callable[[Callable[[exp.Select], dict[str, Any]], Mapping[str, int]],
                               dict[str, int]],
               stats: Any) -> list[str]:
    """The Δ-script of ``p`` in DuckDB, each target's APPLYs staged; returns the targets."""
    d.register_inputs(p)
    known = d.register_changes(p, feeds)
    for tname in p.tables:
        stats.changes[tname] = known[change_table(tname)]
    known |= sizes(d.one_row, known)
    statements = list(p.statements)
    computes = {st.name for st in statements if isinstance(st, Compute)}
    staged: list[str] = []
    i = 0
    while i < len(statements):
        s = statements[i]
        if isinstance(s, Compute):
            d.step(s.name)
            t0 = time.perf_counter()
            # every i-diff it reads is empty: an empty table of its columns, nothing scanned
            idle = s.phase != "instance" and reads_only_empty(reads(s), known, computes)
            known[s.name] = d.compute(s, known, idle)
            stats.partitions_read.update(d.partitions_read)
            if s.phase != "instance":
                stats.idiff_rows[s.name] = known[s.name]
                stats.statements.append((s.name, time.perf_counter() - t0))
            i += 1
            continue
        assert isinstance(s, Apply)
        target = s.target
        run_of, i = apply_run(statements, i)
        group = [a for a in run_of if known.get(a.diff) != 0]
        if not group:
            continue
        d.step(f"stage {target}")
        t0 = time.perf_counter()
        later = any(target in reads(st) for st in statements[i:])
        touched, total, rows = d.stage(run, target, group, later)
        staged.append(target)
        stats.record_stage(target, len(touched), total,
                           zip((a.kind for a in group), rows, strict=True),
                           time.perf_counter() - t0)
    return staged
