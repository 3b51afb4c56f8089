"""Delta Lake tables as the Spark backend's storage: Spark computes, delta-rs commits.

Every stored relation — base table, cache, view — is a Delta table with its Change Data Feed
on, readable by any Delta reader (delta-rs, duckdb's ``delta`` extension, Spark with Delta).
No Delta jars are needed: Spark reads a table at a version through the list of its live files
(``DeltaTable(path, version).file_uris()`` — never the directory, which also holds removed
files), and writes new data files that a delta-rs transaction then commits.

Caches and views are partitioned by ``__idivm_bucket = pmod(xxhash64(id), N)`` over an ID that
their i-diffs name rows by, so a refresh rewrites only the files of the buckets its i-diffs
touch. Stage writes their post-state where no reader sees it (files not in the log): Spark's
writes under the warehouse's staging area, moved in at publish; the driver's straight into the
table's bucket directories, named by the run, so publishing moves nothing (files placed by a
run that never commits are deleted when the run is discarded). Publish commits the removal of
the touched buckets' files and the addition of the staged ones as one Delta commit, carrying an
application transaction (``idivm``, version = the table version it was staged against + 1), so
publishing again after a crash commits nothing twice. Base tables keep the user's shape (no
bucket column); changes handed to idivm as DataFrames are merged into them by delta-rs, which
records row-level CDF.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlglot import exp

from idivm.errors import BackendError
from idivm.planner.ruleapi import c, select, subquery, t, union_all
from idivm.spark.storage import ApplyOp, StageResult, apply_sql, on_ids

BUCKET = "__idivm_bucket"
TXN_APP = "idivm"
CDF_ON = {"delta.enableChangeDataFeed": "true"}
STAGING = "_idivm_staging"  # under the warehouse root, never inside a table's directory
PLACED = "_placed.json"  # files a run wrote straight into a table, listed before they exist
# A refresh whose touched buckets hold at most this many rows writes them from the driver (one
# Arrow batch, split per bucket): Spark's partitioned writer costs ~20 ms per directory, which
# dominates a small refresh that touches a few hundred buckets.
DRIVER_WRITE_ROWS = 2_000_000


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
    table = arrow(open_table(path, version).to_pyarrow_table(columns=list(columns)))
    return list(zip(*(table.column(k).to_pylist() for k in columns), strict=True))


def arrow_schema(spark_schema: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema)


def add_actions(dt: Any) -> list[dict[str, Any]]:
    """The table's live files: path, size, records, partition values (metadata only)."""
    return list(arrow(dt.get_add_actions(flatten=True)).to_pylist())


def read_files(spark: Any, root: Path, files: Sequence[str], schema: Any) -> Any:
    """Rows of some files of a table at ``root`` (hive-style partition directories, as every
    Delta writer lays them out), with the table's Spark ``schema``."""
    if not files:
        return spark.createDataFrame([], schema)
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
        self._reads: dict[tuple[str, int], Any] = {}  # DataFrame per (relation, version)

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
        tables keep their own shape). Replaces a table of that name (its history goes)."""
        from pyspark.sql import functions as F

        path = self.path(name)
        if path.exists():
            shutil.rmtree(path)
        self._forget(name)
        layout: dict[str, Any] = {"key": list(key)}
        run = uuid.uuid4().hex[:12]
        out = self.staging(run, name)
        partition: list[str] = []
        if bucket_col is not None:
            rows = df.count()
            n = self.fixed_buckets or _pow2(max(1, rows // self.rows_per_bucket))
            n = max(1, min(n, self.max_buckets))
            layout |= {"bucket_col": bucket_col, "buckets": n}
            df = df.withColumn(BUCKET, _bucket_of(F.col(f"`{bucket_col}`"), n))
            # one file per bucket: without the shuffle every task writes into every bucket
            df.repartition(BUCKET).write.mode("overwrite").partitionBy(BUCKET).parquet(str(out))
            partition = [BUCKET]
        else:
            df.write.mode("overwrite").parquet(str(out))
        adds = _move_files(out, path, run)
        from deltalake.transaction import create_table_with_add_actions

        schema = _delta().Schema.from_arrow(arrow_schema(df.schema))
        create_table_with_add_actions(str(path), schema, [_add(a) for a in adds],
                                      mode="overwrite", partition_by=partition or None,
                                      configuration=CDF_ON,
                                      description=json.dumps({"idivm": layout}))
        shutil.rmtree(self.root / STAGING / run, ignore_errors=True)

    def read(self, name: str, version: int | None = None) -> Any:
        """The relation (without its bucket column) at ``version`` (default: the latest)."""
        return self.read_raw(name, version).drop(BUCKET)

    def read_raw(self, name: str, version: int | None = None) -> Any:
        dt = self.table(name, version)
        v = int(dt.version())
        if (name, v) not in self._reads:
            self._reads[(name, v)] = read_files(self.spark, self.path(name),
                                                [a["path"] for a in add_actions(dt)],
                                                self.spark_schema(name, dt))
        return self._reads[(name, v)]

    def version(self, name: str) -> int:
        return int(self.table(name).version())

    def drop(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)
        self._forget(name)

    def _forget(self, name: str) -> None:
        for k in [k for k in self._reads if k[0] == name]:
            del self._reads[k]

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
        files = add_actions(dt)
        n = int(layout["buckets"])
        if any(op.kind == "replace" for op in ops):
            if len(ops) != 1:
                raise ValueError("a replace must be the only operation of its stage")
            touched = list(range(n))
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
            old = f"__idivm_old_{name}"
            read_files(self.spark, self.path(name),
                       [f["path"] for f in files if _bucket_value(f) in set(touched)],
                       schema).createOrReplaceTempView(old)
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
            before = read_files(self.spark, self.path(name), kept, schema)
            placed = all(a.get("placed") for a in adds)
            staged = read_files(self.spark, self.path(name) if placed else out / "files",
                                [a["path"] for a in adds], schema)
            return before.unionByName(staged).drop(BUCKET)

        return StageResult(touched, n, per_op, post)

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
        info = {"base_version": int(dt.version()), "touched": list(touched),
                "rows": sum(int(a["rows"]) for a in adds), "adds": list(adds),
                "removes": [{"path": f["path"], "size": int(f["size_bytes"]),
                             "bucket": _bucket_value(f)} for f in files
                            if _bucket_value(f) in hit]}
        (out / "_stage.json").write_text(json.dumps(info))

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
        self._record_stage(out, dt, touched, add_actions(dt), adds)
        return [str(self.path(name) / a["path"]) for a in adds]

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
    not store: it is the partition value) at ``root / path``; returns their adds."""
    import pyarrow.parquet as pq

    rows = table.drop_columns([BUCKET])
    adds = []
    for (b, start, n), rel in zip(runs, paths, strict=True):
        f = root / rel
        try:
            pq.write_table(rows.slice(start, n), f)
        except FileNotFoundError:  # a bucket directory the table has no file in yet
            f.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows.slice(start, n), f)
        adds.append({"path": rel, "size": f.stat().st_size, "rows": n,
                     "partition": {BUCKET: str(b)}})
    return adds


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

