"""Delta Lake tables as the Spark backend's storage: Spark computes, delta-rs commits.

Every stored relation — base table, cache, view — is a Delta table with its Change Data Feed
on, readable by any Delta reader (delta-rs, duckdb's ``delta`` extension, Spark with Delta).
No Delta jars are needed: Spark reads a table at a version through the list of its live files
(``DeltaTable(path, version).file_uris()`` — never the directory, which also holds removed
files), and writes new data files that a delta-rs transaction then commits.

Caches and views are partitioned by ``__idivm_bucket = pmod(xxhash64(id), N)`` over an ID that
their i-diffs name rows by, so a refresh reads only the files of the buckets its i-diffs touch.
It then writes in one of two ways:

- **merge-on-read** (small refreshes on the driver, ``stage_dv``): the rows it changes or
  deletes are marked in Delta *deletion vectors* (``idivm.spark.dv``) of the files that hold
  them, and their new versions go into one new file of the partition ``__idivm_bucket=-1``
  (``RECENT``: rows of any bucket, read by every restricted read); the commit carries a
  change-data file (the marked rows as ``delete``, the added as ``insert``). A scattered batch
  so costs a file and a few bitmaps instead of rewriting every file it touches;
- **copy-on-write** (Spark refreshes, recomputations, and a driver refresh once merge-on-read's
  leftovers would pass ``should_fold``): the post-state of every touched bucket is written
  anew, together with the ``RECENT`` partition and every bucket with a marked file
  (``folded``), whose rows go back to their buckets — so leftovers never outlive the next
  copy-on-write refresh and reads stay bounded.

Stage writes the new files where no reader sees them (files not in the log): Spark's writes
under the warehouse's staging area, moved in at publish; the driver's straight into the table's
bucket directories, named by the run, so publishing moves nothing (files placed by a run that
never commits are deleted when the run is discarded). Publish commits the removals, the
deletion vectors and the additions as one Delta commit, carrying an application transaction
(``idivm``, version = the table version it was staged against + 1), so publishing again after
a crash commits nothing twice; delta-rs writes no deletion vectors, so for tables that take
them the commit's actions are written by ``dv.commit`` (a checkpoint every
``CHECKPOINT_EVERY`` versions, as delta-rs's own commits do). Tables created before deletion
vectors stay copy-on-write and are committed by delta-rs. Base tables keep the user's shape (no
bucket column); changes handed to idivm as DataFrames are merged into them by delta-rs, which
records row-level CDF.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlglot import exp

from idivm.errors import BackendError
from idivm.planner.ruleapi import c, select, subquery, t, union_all
from idivm.spark import dv
from idivm.spark.storage import ApplyOp, StageResult, apply_sql, on_ids

BUCKET = "__idivm_bucket"
TXN_APP = "idivm"
CDF_ON = {"delta.enableChangeDataFeed": "true"}
RECENT = -1  # the partition of the rows merge-on-read refreshes add (see ``stage_dv``)
_BUCKET_SEGMENT = re.compile(rf"(?:^|/){BUCKET}=(-?\d+)/")
STAGING = "_idivm_staging"  # under the warehouse root, never inside a table's directory
PLACED = "_placed.json"  # files a run wrote straight into a table, listed before they exist
# A refresh whose touched buckets hold at most this many rows writes them from the driver (one
# Arrow batch, split per bucket): Spark's partitioned writer costs ~20 ms per directory, which
# dominates a small refresh that touches a few hundred buckets.
DRIVER_WRITE_ROWS = 2_000_000
CHECKPOINT_EVERY = 100  # a checkpoint of a stored relation's log every this many commits


class DeltaError(BackendError):
    """A Delta table idivm cannot use as asked (missing, wrong schema, CDF off, …)."""


def _delta() -> Any:
    try:
        import deltalake
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise DeltaError("the Spark backend stores Delta tables through delta-rs: "
                         "pip install deltalake") from e
    return deltalake


def open_table(path: str | os.PathLike[str], version: int | None = None) -> Any:
    """The Delta table at ``path`` (at ``version``), or a clear error."""
    dl = _delta()
    p = str(path)
    if not dl.DeltaTable.is_deltatable(p):
        raise DeltaError(f"no Delta table at {p}")
    try:
        return dl.DeltaTable(p, version=version)
    except Exception as e:  # delta-rs raises its own types (e.g. a vacuumed version)
        at = f" at version {version}" if version is not None else ""
        raise DeltaError(f"cannot open the Delta table at {p}{at}: {e}") from e


def arrow(data: Any) -> Any:
    """A pyarrow Table from delta-rs's Arrow output, with the view types Spark cannot take
    (``string_view``, ``binary_view``, unsigned ints) cast to plain ones."""
    import pyarrow as pa

    table = pa.table(data)
    fields = []
    for f in table.schema:
        ty = f.type
        if pa.types.is_string_view(ty) or pa.types.is_large_string(ty):
            ty = pa.string()
        elif pa.types.is_binary_view(ty) or pa.types.is_large_binary(ty):
            ty = pa.binary()
        elif pa.types.is_unsigned_integer(ty):
            ty = pa.int64()
        fields.append(pa.field(f.name, ty, f.nullable))
    return table.cast(pa.schema(fields))


def delta_rows(path: str | os.PathLike[str], columns: Sequence[str],
               version: int | None = None) -> list[tuple[Any, ...]]:
    """The rows of a Delta table's ``columns`` read by delta-rs alone (no Spark), as tuples:
    what any other Delta reader sees."""
    reader = open_table(path, version).scan(columns=list(columns))  # reads deletion vectors
    table = arrow(reader.read_all())
    return list(zip(*(table.column(k).to_pylist() for k in columns), strict=True))


def arrow_schema(spark_schema: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema)


def add_actions(dt: Any) -> list[dict[str, Any]]:
    """The table's live files: path, size, records, partition values (metadata only)."""
    return list(arrow(dt.get_add_actions(flatten=True)).to_pylist())


def read_files(spark: Any, root: Path, files: Sequence[str], schema: Any,
               deleted: Mapping[str, Sequence[int]] | None = None) -> Any:
    """Rows of some files of a table at ``root`` (hive-style partition directories, as every
    Delta writer lays them out), with the table's Spark ``schema``, without the rows their
    deletion vectors delete (``deleted``: file path as in ``files`` → row positions)."""
    if not files:
        return spark.createDataFrame([], schema)
    df = _read_parquet(spark, root, files, schema)
    listed = set(files)
    gone = [(f, rows) for f, rows in (deleted or {}).items() if rows and f in listed]
    if not gone:
        return df
    import pyarrow as pa
    from pyspark.sql import functions as F

    # a row is named by its file (leaf name and bucket: leaf names repeat across buckets) and
    # its position in the file, as Spark's _metadata reports them
    keys = [(_bucket_of_path(f), f.rpartition("/")[2]) for f, _ in gone]
    marks = spark.createDataFrame(pa.table({
        "__dv_bucket": pa.array([k[0] for k, (_, rows) in zip(keys, gone, strict=True)
                                 for _ in rows], pa.int32()),
        "__dv_file": [k[1] for k, (_, rows) in zip(keys, gone, strict=True) for _ in rows],
        "__dv_row": pa.array([int(r) for _, rows in gone for r in rows], pa.int64())}))
    named = df.select("*", F.col("_metadata.file_name").alias("__dv_name"),
                      F.col("_metadata.row_index").alias("__dv_index"))
    bucket = F.col(BUCKET) if BUCKET in df.columns else F.lit(None).cast("int")
    on = (named["__dv_name"] == marks["__dv_file"]) & (named["__dv_index"] == marks["__dv_row"]) \
        & bucket.eqNullSafe(marks["__dv_bucket"])
    return named.join(F.broadcast(marks), on, "left_anti").drop("__dv_name", "__dv_index")


def _bucket_of_path(path: str) -> int | None:
    hit = _BUCKET_SEGMENT.search(path)
    return int(hit.group(1)) if hit else None


def _read_parquet(spark: Any, root: Path, files: Sequence[str], schema: Any) -> Any:
    paths = [f if "://" in f or f.startswith("/") else str(root / f) for f in files]
    reader = spark.read.schema(schema).option("basePath", str(root))
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or len(paths) < 8 or any("\n" in p_ for p_ in paths):
        return reader.parquet(*paths)
    # a classic session: Py4J would pass the list one element per call (a round trip each,
    # ~1 ms: a view of 512 bucket files took half a second to register); one string split in
    # the JVM is three calls
    from pyspark.sql import DataFrame

    listed = jvm.java.util.regex.Pattern.compile("\n").splitAsStream("\n".join(paths)).toList()
    return DataFrame(reader._jreader.parquet(jvm.PythonUtils.toSeq(listed)), spark)


class DeltaStore:
    """Caches and views as bucketed Delta tables under ``root/tables`` (see module doc)."""

    def __init__(self, spark: Any, root: Path, rows_per_bucket: int = 2000,
                 max_buckets: int = 1024, buckets: int | None = None) -> None:
        self.spark = spark
        # Delta readers expect parquet timestamps as INT64 micros (Spark's default is INT96)
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # tables are read through their file lists: above this many paths Spark lists them in
        # a distributed job (seconds for a few hundred files); the driver takes milliseconds
        spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000")
        # Catalyst's constraint inference fails on a UNION whose branches join a global
        # aggregate's cache (NoSuchElementException: key not found: __g, in
        # UnionBase.rewriteConstraints; a scalar subquery in HAVING makes one); Δ-script
        # statements gain nothing from it
        spark.conf.set("spark.sql.constraintPropagation.enabled", "false")
        self.root = root
        self.rows_per_bucket = rows_per_bucket
        self.max_buckets = max_buckets
        self.fixed_buckets = buckets
        # merge-on-read's leftovers (rows in RECENT, rows deletion vectors delete) a
        # relation may hold before a copy-on-write refresh folds them (None: ``should_fold``)
        self.fold_rows: int | None = None
        self._reads: dict[tuple[str, int], Any] = {}  # DataFrame per (relation, version)
        self._files: dict[tuple[str, int], list[dict[str, Any]]] = {}  # live files per version
        self._dvs: dict[str, dv.LiveDVs] = {}  # per relation: descriptors at a recent version

    # -- layout -------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.root / "tables" / name

    def staging(self, run: str, name: str) -> Path:
        return self.root / STAGING / run / name

    def table(self, name: str, version: int | None = None) -> Any:
        return open_table(self.path(name), version)

    def exists(self, name: str) -> bool:
        return bool(_delta().DeltaTable.is_deltatable(str(self.path(name))))

    def layout(self, name: str, dt: Any = None) -> dict[str, Any]:
        """Key, bucket column and bucket count, kept as JSON in the table's description
        (delta-rs accepts no table properties outside ``delta.*``)."""
        out: dict[str, Any] = {"key": [], "bucket_col": None, "buckets": 1}
        dt = dt or self.table(name)
        out |= json.loads(dt.metadata().description or "{}").get("idivm", {})
        return out

    def partitions(self, name: str) -> int:
        return int(self.layout(name)["buckets"])

    def spark_schema(self, name: str, dt: Any = None) -> Any:
        from pyspark.sql.types import StructType

        dt = dt or self.table(name)
        return StructType.fromJson(json.loads(dt.schema().to_json()))

    # -- create / read / drop -------------------------------------------------------------------
    def create(self, name: str, df: Any, key: Sequence[str], bucket_col: str | None) -> None:
        """A new Delta table holding ``df``; bucketed by ``bucket_col`` unless None (base
        tables keep their own shape). Replaces a table of that name (its history goes) once
        ``df`` is written: a write that fails (a NULL ``load_table`` refuses) leaves it as it
        was."""
        from pyspark.sql import functions as F

        path = self.path(name)
        layout: dict[str, Any] = {"key": list(key)}
        run = uuid.uuid4().hex[:12]
        out = self.staging(run, name)
        partition: list[str] = []
        try:
            if bucket_col is not None:
                rows = df.count()
                n = self.fixed_buckets or _pow2(max(1, rows // self.rows_per_bucket))
                n = max(1, min(n, self.max_buckets))
                layout |= {"bucket_col": bucket_col, "buckets": n}
                df = df.withColumn(BUCKET, _bucket_of(F.col(f"`{bucket_col}`"), n))
                # one file per bucket: without the shuffle every task writes into every bucket
                df.repartition(BUCKET).write.mode("overwrite").partitionBy(BUCKET) \
                    .parquet(str(out))
                partition = [BUCKET]
            else:
                df.write.mode("overwrite").parquet(str(out))
        except Exception:
            shutil.rmtree(self.root / STAGING / run, ignore_errors=True)
            raise
        if path.exists():
            shutil.rmtree(path)
        self._forget(name)
        self._dvs.pop(name, None)  # its log starts again
        adds = _move_files(out, path, run)
        from deltalake.transaction import create_table_with_add_actions

        schema = _delta().Schema.from_arrow(arrow_schema(df.schema))
        create_table_with_add_actions(str(path), schema, [_add(a) for a in adds],
                                      mode="overwrite", partition_by=partition or None,
                                      # a base table stays readable as plain parquet
                                      configuration=CDF_ON | (dv.ENABLE if partition else {}),
                                      description=json.dumps({"idivm": layout}))
        shutil.rmtree(self.root / STAGING / run, ignore_errors=True)

    def read(self, name: str, version: int | None = None) -> Any:
        """The relation (without its bucket column) at ``version`` (default: the latest)."""
        return self.read_raw(name, version).drop(BUCKET)

    def read_raw(self, name: str, version: int | None = None) -> Any:
        dt = self.table(name, version)
        v = int(dt.version())
        if (name, v) not in self._reads:
            files = self.files(name, dt)
            self._reads[(name, v)] = read_files(self.spark, self.path(name),
                                                [a["path"] for a in files],
                                                self.spark_schema(name, dt), deleted_of(files))
        return self._reads[(name, v)]

    @staticmethod
    def merge_on_read(dt: Any) -> bool:
        """Whether the table takes deletion vectors (stored relations created since they
        were introduced; older ones stay copy-on-write)."""
        return dv.FEATURE in set(dt.protocol().reader_features or ())

    def should_fold(self, files: Sequence[Mapping[str, Any]], batch: int) -> bool:
        """Whether a refresh of ``batch`` rows should fold merge-on-read's leftovers (copy-on-
        write) rather than add to them: when the rows in ``RECENT`` or the rows deletion
        vectors delete would pass ``fold_rows``, by default the larger of a bucket's rows and
        1/16 of the relation's — every read of the relation reads ``RECENT`` whole, and a
        copy-on-write of the marked buckets then costs at most about as much again."""
        live = sum(int(f.get("num_records") or 0) - len(f.get("deleted") or ()) for f in files)
        recent = sum(int(f.get("num_records") or 0) - len(f.get("deleted") or ())
                     for f in files if _bucket_value(f) == RECENT)
        marked = sum(len(f.get("deleted") or ()) for f in files)
        limit = self.fold_rows if self.fold_rows is not None else \
            max(self.rows_per_bucket, live // 16)
        return max(recent, marked) + batch > limit

    def files(self, name: str, dt: Any = None) -> list[dict[str, Any]]:
        """The live files of a stored relation (``add_actions``), each with ``dv``, its
        deletion vector's descriptor (None if it has none), and ``deleted``, the row positions
        that deletes."""
        dt = dt or self.table(name)
        key = (name, int(dt.version()))
        if key not in self._files:
            acts = add_actions(dt)
            live: Mapping[str, Any] = {}
            if self.merge_on_read(dt):
                known = self._dvs.get(name)
                got = dv.live_descriptors(self.path(name), key[1], known)
                if known is None or got.version >= known.version:
                    self._dvs[name] = got
                live = got.descriptors
            for a in acts:
                d = live.get(a["path"]) or live.get(unquote(a["path"]))
                a["dv"] = dict(d) if d else None
                a["deleted"] = dv.read_dv(self.path(name), d) if d else []
            self._files[key] = acts
        return self._files[key]

    def version(self, name: str) -> int:
        return int(self.table(name).version())

    def drop(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)
        self._forget(name)
        self._dvs.pop(name, None)

    def _forget(self, name: str) -> None:
        for k in [k for k in self._reads if k[0] == name]:
            del self._reads[k]
        for k in [k for k in self._files if k[0] == name]:
            del self._files[k]

    # -- base-table changes (merged by delta-rs, which records row-level CDF) -------------------
    def merge_changes(self, name: str, effective: Any, key: Sequence[str],
                      columns: Sequence[str]) -> int:
        """Apply effective changes (key, c__post, __has_pre, __has_post) to a base table as
        one delta-rs MERGE; returns the new version."""
        src = arrow(effective.toArrow())
        if src.num_rows == 0:
            return self.version(name)
        dt = self.table(name)
        q = quote_column
        on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
        others = [k for k in columns if k not in key]
        posts = {q(k): f"s.{q(k + '__post')}" for k in others}
        merger = dt.merge(src, predicate=on, source_alias="s", target_alias="t") \
            .when_matched_delete(predicate="NOT s.__has_post")
        if posts:
            merger = merger.when_matched_update(updates=posts, predicate="s.__has_post")
        merger.when_not_matched_insert(
            updates={q(k): f"s.{q(k)}" for k in key} | posts,
            predicate="s.__has_post").execute()
        self._forget(name)
        return self.version(name)

    # -- staging and publishing a refresh -------------------------------------------------------
    def _touched(self, layout: Mapping[str, Any], raw: str,
                 ops: Sequence[tuple[ApplyOp, str]]) -> tuple[list[int], list[int]]:
        """The buckets the operations touch, and how many rows each names (one Spark job)."""
        col, n = layout["bucket_col"], int(layout["buckets"])
        parts: list[exp.Select] = []
        for i, (op, d) in enumerate(ops):
            if op.kind == "ins" or col in op.ids:
                parts.append(select([("__op", exp.Literal.number(i)),
                                     (BUCKET, _bucket_sql(c(col, "d"), n))], t(d, "d")))
            else:  # the i-diff names rows by other IDs: find the buckets of those rows
                q = select([("__op", exp.Literal.number(i)), (BUCKET, c(BUCKET, "r"))],
                           t(raw, "r"))
                parts.append(q.join(t(d, "d"), on=on_ids(op.ids, "r", "d", op.nullable),
                                    join_type="left semi"))
        u = subquery(union_all(parts), "u")
        q = select([("__op", c("__op", "u")), (BUCKET, c(BUCKET, "u")),
                    ("n", exp.func("COUNT", exp.Star()))], u).group_by(
            c("__op", "u"), c(BUCKET, "u"))
        rows = self.spark.sql(q.sql("spark")).collect()
        per_op = [0] * len(ops)
        for r in rows:
            per_op[int(r["__op"])] += int(r["n"])
        return sorted({int(r[BUCKET]) for r in rows}), per_op

    def stage(self, run: str, name: str, ops: Sequence[ApplyOp]) -> StageResult:
        """Write the post-state of every bucket the operations touch (a ``replace``: of the
        whole relation) next to the table, and record the commit that will publish it."""
        dt = self.table(name)
        layout = self.layout(name)
        out = self.staging(run, name)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        schema = self.spark_schema(name, dt)
        fields = [f for f in schema.fields if f.name != BUCKET]
        cols = [f.name for f in fields]
        files = self.files(name, dt)
        n = int(layout["buckets"])
        if any(op.kind == "replace" for op in ops):
            if len(ops) != 1:
                raise ValueError("a replace must be the only operation of its stage")
            touched = sorted(set(range(n)) | folded(files))
            rows_df = ops[0].diff.select(*[c_.name for c_ in fields])
            per_op: list[int] = []
        else:
            raw = f"__idivm_raw_{name}"
            if any(op.kind != "ins" and layout["bucket_col"] not in op.ids for op in ops):
                self.read_raw(name).createOrReplaceTempView(raw)  # to find rows' buckets
            named = []
            for i, op in enumerate(ops):
                d = f"__idivm_op{i}_{name}"
                # computed once: finding the touched buckets and writing them both read it
                op.diff.localCheckpoint(eager=True).createOrReplaceTempView(d)
                named.append((op, d))
            touched, per_op = self._touched(layout, raw, named)
            # copy-on-write folds what merge-on-read refreshes left: the rows they added and
            # the files their deletion vectors mark
            touched = sorted(set(touched) | folded(files))
            old = f"__idivm_old_{name}"
            read_files(self.spark, self.path(name),
                       [f["path"] for f in files if _bucket_value(f) in set(touched)],
                       schema, deleted_of(files)).createOrReplaceTempView(old)
            q: exp.Select = select([(k, c(k, "r")) for k in cols], t(old, "r"))
            for i, (op, d) in enumerate(named):
                q = apply_sql(q, op, d, cols, layout["key"], f"s{i}")
            rows_df = self.spark.sql(q.sql("spark"))
        from pyspark.sql import functions as F

        typed = rows_df.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name)
                                 for f in fields])
        typed = typed.withColumn(BUCKET, _bucket_of(F.col(f"`{layout['bucket_col']}`"), n))
        removed = [f for f in files if _bucket_value(f) in set(touched)]
        before = sum(int(f.get("num_records") or self.rows_per_bucket) for f in removed)
        if before + sum(per_op) <= DRIVER_WRITE_ROWS:  # a replace: about as many rows again
            adds = self._place(run, name, typed.toArrow())
        else:
            data = out / "files"
            typed.repartition(BUCKET).write.mode("overwrite").partitionBy(BUCKET) \
                .parquet(str(data))
            adds = _list_files(data)
        self._record_stage(out, dt, touched, files, adds)
        rows = sum(int(a["rows"]) for a in adds)
        if any(op.kind == "replace" for op in ops):
            per_op = [rows]

        def post() -> Any:
            kept = [f["path"] for f in files if _bucket_value(f) not in set(touched)]
            before = read_files(self.spark, self.path(name), kept, schema, deleted_of(files))
            placed = all(a.get("placed") for a in adds)
            staged = read_files(self.spark, self.path(name) if placed else out / "files",
                                [a["path"] for a in adds], schema)
            return before.unionByName(staged).drop(BUCKET)

        return StageResult([b for b in touched if b != RECENT], n, per_op, post)

    def _place(self, run: str, name: str, table: Any) -> list[dict[str, Any]]:
        """Write the rows of an Arrow table (with ``__idivm_bucket``) straight into the
        table's bucket directories, one file per bucket, named by the run (``_dest``); the
        paths are listed in the run's staging first (``PLACED``), so a run that dies before
        its commit leaves nothing that ``discard`` does not find. Returns the adds, placed."""
        out = self.staging(run, name)
        table = table.sort_by(BUCKET) if table.num_rows else table
        buckets = _bucket_runs(table)
        leaf = f"part-{uuid.uuid4().hex}.parquet"
        paths = [_dest(run, f"{BUCKET}={b}/{leaf}") for b, _, _ in buckets]
        (out / PLACED).write_text(json.dumps(paths))
        adds = _write_buckets(table, buckets, self.path(name), paths)
        return [{**a, "placed": True} for a in adds]

    def _record_stage(self, out: Path, dt: Any, touched: Sequence[int],
                      files: Sequence[Mapping[str, Any]], adds: Sequence[Mapping[str, Any]]
                      ) -> None:
        """The commit that will publish the staged files ``adds``: remove the touched
        buckets' files, add the new ones (``_stage.json``)."""
        hit = set(touched)
        removed = [f for f in files if _bucket_value(f) in hit]
        info = {"base_version": int(dt.version()), "touched": list(touched),
                "rows": sum(int(a["rows"]) for a in adds), "adds": list(adds),
                "removes": [_remove_of(f) for f in removed],
                "cdc": self._stage_change_data(out, dt, removed, adds)}
        (out / "_stage.json").write_text(json.dumps(info))

    def _stage_change_data(self, out: Path, dt: Any, removed: Sequence[Mapping[str, Any]],
                           adds: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """The change-data file of a copy-on-write commit that removes files deletion vectors
        mark: the rows it really deletes and inserts (the removed files' live rows against the
        added files' rows, as multisets). Without one, a reader derives the commit's changes
        from its remove and add actions, and delta-rs (1.6) then reports a removed file's
        deleted rows instead of its live ones — a change feed that does not add up. (Commits
        removing unmarked files only need none: their derived changes are exact.)"""
        if not any(f.get("deleted") for f in removed) or not self.merge_on_read(dt):
            return None
        import duckdb
        import pyarrow as pa
        import pyarrow.parquet as pq

        run, name = out.parent.name, out.name  # (``staging``'s layout)
        root = self.path(name)
        schema = pa.schema(dt.schema().to_arrow())
        schema = schema.remove(schema.get_field_index(BUCKET)) if BUCKET in schema.names \
            else schema
        sel = ", ".join('"' + c.replace('"', '""') + '"' for c in schema.names)

        def scan(paths: Sequence[str], positions: bool) -> str:
            listed = ", ".join("'" + p_.replace("'", "''") + "'" for p_ in paths)
            extra = ", filename = true, file_row_number = true" if positions else ""
            return f"read_parquet([{listed}], hive_partitioning = false{extra})"

        gone = pa.table({
            "f": [str(root / f["path"]) for f in removed for _ in f.get("deleted") or ()],
            "p": pa.array([int(r) for f in removed for r in f.get("deleted") or ()],
                          pa.int64())})
        old = (f"SELECT {sel} FROM {scan([str(root / f['path']) for f in removed], True)} AS r "
               "WHERE NOT EXISTS (SELECT 1 FROM gone WHERE gone.f = r.filename AND "
               "gone.p = r.file_row_number)")
        here = [str(root / a["path"]) if a.get("placed") else str(out / "files" / a["path"])
                for a in adds]
        new = f"SELECT {sel} FROM {scan(here, False)}" if here else \
            f"SELECT {sel} FROM ({old}) AS o WHERE false"
        con = duckdb.connect()
        try:
            con.register("gone", gone)
            changes = con.execute(
                f"SELECT *, 'delete' AS _change_type FROM ({old} EXCEPT ALL {new}) AS d "
                f"UNION ALL SELECT *, 'insert' FROM ({new} EXCEPT ALL {old}) AS i"
            ).fetch_arrow_table()
        finally:
            con.close()
        changes = changes.cast(schema.append(pa.field("_change_type", pa.string())))
        rel = f"_change_data/{BUCKET}={RECENT}/{run}-cdc-{uuid.uuid4().hex}.parquet"
        placed = out / PLACED
        listed = json.loads(placed.read_text()) if placed.exists() else []
        placed.write_text(json.dumps([*listed, rel]))  # before it exists (see ``_place``)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(changes, root / rel)
        return {"path": rel, "size": (root / rel).stat().st_size,
                "partition": {BUCKET: str(RECENT)}}

    def stage_arrow(self, run: str, name: str, dt: Any, touched: Sequence[int],
                    post: Any) -> list[str]:
        """Stage the post-state of the ``touched`` buckets, computed elsewhere (an Arrow table
        with the table's columns and ``__idivm_bucket``), against the table version ``dt``;
        returns the staged files' absolute paths (see ``stage``)."""
        out = self.staging(run, name)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        adds = self._place(run, name, post)
        self._record_stage(out, dt, touched, self.files(name, dt), adds)
        return [str(self.path(name) / a["path"]) for a in adds]

    def stage_dv(self, run: str, name: str, dt: Any, added: Any,
                 deleted: Mapping[str, Sequence[int]], changes: Any) -> list[str]:
        """Stage a merge-on-read refresh against the table version ``dt``: the rows
        ``added`` (an Arrow table of the table's columns) in one new file of the ``RECENT``
        partition, and for each file of ``deleted`` (path as in the log → row positions it
        newly deletes) a deletion vector of those rows and the ones it deleted before, all in
        one DV file; ``changes`` (the columns and ``_change_type``: the deleted rows as
        ``delete``, the added as ``insert``) becomes the commit's change-data file. A file
        all of whose rows are deleted is removed instead. Returns the added file's absolute
        path (empty when nothing is added)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        out = self.staging(run, name)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        root = self.path(name)
        live = {f["path"]: f for f in self.files(name, dt)}
        leaf = f"{run}-part-{uuid.uuid4().hex}.parquet"
        data = f"{BUCKET}={RECENT}/{leaf}" if added.num_rows else None
        cdc = f"_change_data/{BUCKET}={RECENT}/{leaf}" if changes.num_rows else None
        positions = {p: sorted(set(live[p]["deleted"]) | set(rows))
                     for p, rows in deleted.items() if rows}
        gone = [p for p, rows in positions.items()
                if len(rows) >= int(live[p].get("num_records") or 0) > 0]
        kept = {p: rows for p, rows in positions.items() if p not in gone}
        dv_uuid = uuid.uuid4()
        dv_name = dv.dv_file(Path(), dv_uuid).as_posix() if kept else None
        # every file this run writes is listed before it exists: a run that dies before its
        # commit leaves nothing ``discard`` does not find
        (out / PLACED).write_text(json.dumps([x for x in (data, cdc, dv_name) if x]))
        adds = []
        if data is not None:
            (root / data).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(added, root / data)
            adds.append({"path": data, "size": (root / data).stat().st_size,
                         "rows": added.num_rows, "partition": {BUCKET: str(RECENT)},
                         "placed": True})
        change = None
        if cdc is not None:
            (root / cdc).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(changes), root / cdc)
            change = {"path": cdc, "size": (root / cdc).stat().st_size,
                      "partition": {BUCKET: str(RECENT)}}
        descriptors: dict[str, dict[str, Any]] = {}
        if kept:
            descriptors = dv.write_dvs(root, kept, dv_uuid)
        marked = [{**_remove_of(live[p]), "rows": int(live[p].get("num_records") or 0),
                   "new_dv": descriptors[p]} for p in kept]
        info = {"base_version": int(dt.version()), "touched": sorted(
                    {_bucket_value(live[p]) or 0 for p in positions}
                    | ({RECENT} if data else set())),
                "rows": added.num_rows, "adds": adds, "marked": marked,
                "removes": [_remove_of(live[p]) for p in gone], "cdc": change}
        (out / "_stage.json").write_text(json.dumps(info))
        return [str(root / data)] if data else []

    def publish(self, run: str, name: str) -> None:
        """Commit a staged refresh: remove the touched buckets' files, add the staged ones, in
        one Delta commit. Repeatable: a commit already made (its application transaction is
        recorded in the table) is not made again."""
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import RemoveAction

        out = self.staging(run, name)
        info = json.loads((out / "_stage.json").read_text())
        target = int(info["base_version"]) + 1
        dt = self.table(name)
        if (dt.transaction_version(TXN_APP) or -1) >= target:
            return  # published before a crash
        if int(dt.version()) != int(info["base_version"]):
            raise DeltaError(f"{name} changed (version {dt.version()}) since run {run} staged "
                             f"against version {info['base_version']}; re-run maintain")
        adds = []
        for a in info["adds"]:  # move Spark's staged files in (a rename; skipped once done)
            if a.get("placed"):  # written in place by the driver
                adds.append(a)
                continue
            src, dest = out / "files" / a["path"], self.path(name) / _dest(run, a["path"])
            if src.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)
            adds.append({**a, "path": _dest(run, a["path"])})
        now = int(time.time() * 1000)
        if self.merge_on_read(dt):  # delta-rs writes no deletion vectors: the actions by hand
            dv.commit(self.path(name), target, _commit_actions(info, adds, run, target, now))
            if target % CHECKPOINT_EVERY == 0:  # (delta-rs's own commits checkpoint likewise)
                self.table(name).create_checkpoint()
            self._forget(name)
            return
        actions: list[Any] = [
            RemoveAction(r["path"], True, now, r["size"], {BUCKET: str(r["bucket"])})
            for r in info["removes"]]
        actions += [_add(a) for a in adds]
        dt.create_write_transaction(
            actions, mode="append", schema=dt.schema(), partition_by=[BUCKET],
            commit_properties=CommitProperties(
                custom_metadata={"idivm_run": run},
                app_transactions=[Transaction(TXN_APP, target)]))
        self._forget(name)

    def discard(self, run: str, published: bool = False) -> None:
        """Forget a run's staging. Files it placed in a table are deleted unless the run was
        ``published`` or, when not known, the table's commits show it was (its application
        transaction reached the version it staged for): a run that never committed leaves
        nothing behind."""
        staging = self.root / STAGING / run
        if not published and staging.is_dir():
            for out in staging.iterdir():
                if (out / PLACED).exists() and not self._committed(out):
                    table = self.path(out.name)
                    for rel in json.loads((out / PLACED).read_text()):
                        (table / rel).unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)

    def _committed(self, out: Path) -> bool:
        """Whether the stage under ``out`` was published: ``_stage.json`` exists and the
        table's application transaction reached the version it staged for."""
        if not (out / "_stage.json").exists() or not self.exists(out.name):
            return False
        target = int(json.loads((out / "_stage.json").read_text())["base_version"]) + 1
        return (self.table(out.name).transaction_version(TXN_APP) or -1) >= target


def _remove_of(f: Mapping[str, Any]) -> dict[str, Any]:
    """What the commit needs to remove a live file (its deletion vector names it too)."""
    return {"path": f["path"], "size": int(f["size_bytes"]), "bucket": _bucket_value(f),
            "dv": f.get("dv")}


def _partition(bucket: Any) -> dict[str, str]:
    return {} if bucket is None else {BUCKET: str(bucket)}


def _commit_actions(info: Mapping[str, Any], adds: Sequence[Mapping[str, Any]], run: str,
                    target: int, now: int) -> list[dict[str, Any]]:
    """A staged refresh's commit as Delta log actions: the run's application transaction,
    the files it removes, the files whose deletion vectors it replaces (removed with the old
    DV, added with the new), the files it adds, its change-data file."""
    def remove(r: Mapping[str, Any]) -> dict[str, Any]:
        out = {"path": r["path"], "dataChange": True, "deletionTimestamp": now,
               "extendedFileMetadata": True, "partitionValues": _partition(r["bucket"]),
               "size": int(r["size"])}
        return {"remove": out | ({"deletionVector": r["dv"]} if r.get("dv") else {})}

    def add(path: str, partition: Mapping[str, str], size: int, rows: int,
            descriptor: Mapping[str, Any] | None = None) -> dict[str, Any]:
        out = {"path": path, "partitionValues": dict(partition), "size": int(size),
               "modificationTime": now, "dataChange": True,
               "stats": json.dumps({"numRecords": int(rows)})}
        return {"add": out | ({"deletionVector": dict(descriptor)} if descriptor else {})}

    acts: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "engineInfo": "idivm",
                        "operationParameters": {"mode": "Append"},
                        "readVersion": int(info["base_version"]), "idivm_run": run}},
        {"txn": {"appId": TXN_APP, "version": target, "lastUpdated": now}}]
    acts += [remove(r) for r in info["removes"]]
    for m in info.get("marked", ()):
        acts += [remove(m), add(m["path"], _partition(m["bucket"]), m["size"], m["rows"],
                                m["new_dv"])]
    acts += [add(a["path"], a["partition"], a["size"], a["rows"]) for a in adds]
    if info.get("cdc"):
        c_ = info["cdc"]
        acts.append({"cdc": {"path": c_["path"], "partitionValues": dict(c_["partition"]),
                             "size": int(c_["size"]), "dataChange": False}})
    return acts


def folded(files: Sequence[Mapping[str, Any]]) -> set[int]:
    """The buckets a copy-on-write refresh rewrites besides those it touches: the ``RECENT``
    partition and every bucket with a file a deletion vector marks, so that merge-on-read's
    leftovers never outlive the next copy-on-write refresh."""
    out = set()
    for f in files:
        b = _bucket_value(f)
        if b is not None and (b == RECENT or f.get("deleted")):
            out.add(b)
    return out


def deleted_of(files: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """File path → the row positions its deletion vector deletes (files with one)."""
    return {f["path"]: list(f["deleted"]) for f in files if f.get("deleted")}


def quote_column(name: str) -> str:
    """A column name as Spark SQL and delta-rs's SQL predicates spell it."""
    return "`" + name.replace("`", "``") + "`"


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _bucket_sql(col: exp.Expr, n: int) -> exp.Expr:
    return exp.cast(exp.func("PMOD", exp.func("XXHASH64", col), exp.Literal.number(n)), "INT")


def _bucket_of(col: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(col), F.lit(n)).cast("int")


def _bucket_value(action: Mapping[str, Any]) -> int | None:
    v = action.get(f"partition.{BUCKET}")
    return None if v is None else int(v)


def _list_files(data: Path) -> list[dict[str, Any]]:
    """Parquet files Spark wrote under ``data`` (relative paths), with size, rows, bucket."""
    import pyarrow.parquet as pq

    out = []
    for f in sorted(data.rglob("*.parquet")):
        rel = f.relative_to(data).as_posix()
        part = {seg.split("=", 1)[0]: seg.split("=", 1)[1]
                for seg in rel.split("/")[:-1] if "=" in seg}
        out.append({"path": rel, "size": f.stat().st_size,
                    "rows": pq.read_metadata(f).num_rows, "partition": part})
    return out


def _bucket_runs(table: Any) -> list[tuple[int, int, int]]:
    """(bucket, first row, rows) of each bucket of an Arrow table sorted by ``BUCKET``."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return []
    ends = pc.run_end_encode(table.column(BUCKET).combine_chunks())
    out, start = [], 0
    for b, end in zip(ends.values.to_pylist(), ends.run_ends.to_pylist(), strict=True):
        out.append((int(b), start, end - start))
        start = end
    return out


def _write_buckets(table: Any, runs: Sequence[tuple[int, int, int]], root: Path,
                   paths: Sequence[str]) -> list[dict[str, Any]]:
    """One parquet file per bucket run of ``table`` (sorted by ``BUCKET``, which the files do
    not store: it is the partition value) at ``root / path``; returns their adds. The files
    are written by a thread per core (Arrow's parquet writer releases the GIL)."""
    import pyarrow.parquet as pq

    rows = table.drop_columns([BUCKET])

    def write(run: tuple[int, int, int], rel: str) -> dict[str, Any]:
        b, start, n = run
        f = root / rel
        try:
            pq.write_table(rows.slice(start, n), f)
        except FileNotFoundError:  # a bucket directory the table has no file in yet
            f.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows.slice(start, n), f)
        return {"path": rel, "size": f.stat().st_size, "rows": n,
                "partition": {BUCKET: str(b)}}

    if len(runs) < 4:
        return [write(r, rel) for r, rel in zip(runs, paths, strict=True)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(write, runs, paths))


def _dest(run: str, rel: str) -> str:
    """Where a staged file goes in the table: same partition directory, the run in its name."""
    head, _, leaf = rel.rpartition("/")
    return f"{head}/{run}-{leaf}" if head else f"{run}-{leaf}"


def _move_files(out: Path, table: Path, run: str) -> list[dict[str, Any]]:
    files = _list_files(out)
    for a in files:
        dest = table / _dest(run, a["path"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(out / a["path"], dest)
        a["path"] = _dest(run, a["path"])
    return files


def _add(a: Mapping[str, Any]) -> Any:
    from deltalake.transaction import AddAction

    return AddAction(a["path"], int(a["size"]), dict(a["partition"]),
                     int(time.time() * 1000), True, json.dumps({"numRecords": int(a["rows"])}))

