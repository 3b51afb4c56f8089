"""Storage of base tables, views and caches for the Spark backend.

``Store`` is the small interface the maintainer needs: create, read, stage the effect of a list
of APPLY operations durably, expose the staged post-state, publish it idempotently. A Delta Lake
or Iceberg store would stage by running the Δ-script's MERGE statements on a branch/version and
publish by committing; it needs jars this project cannot install, so none is shipped.

``BucketedParquetStore`` keeps each relation as parquet files partitioned by a hash bucket of
one of its IDs, ``__bucket = pmod(xxhash64(id), N)``. An APPLY touches only the buckets holding
the rows its i-diff names; staging writes the post-state of exactly those buckets to a staging
directory, and publishing replaces those bucket directories by copies of the staged ones —
repeatable after a crash at any point, since the staged files carry post-state rows. Why buckets
and not Spark's own ``INSERT OVERWRITE … PARTITION``: dynamic overwrite cannot empty a bucket
(a bucket whose rows all go away would keep its old files), and a copy from staging can be
repeated, where a move could not.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlglot import exp

from idivm.planner.ruleapi import and_all, c, select, subquery, t, union_all

BUCKET = "__bucket"
MATCH = "__m"


@dataclass(frozen=True)
class ApplyOp:
    """One APPLY of the Δ-script: an i-diff (a DataFrame) and how it names the target's rows."""

    kind: str  # "del", "upd", "ins"
    diff: Any  # pyspark DataFrame
    ids: tuple[str, ...]
    columns: tuple[str, ...]  # upd: the columns set (from c__post); ins: every column
    nullable: frozenset[str] = frozenset()


@dataclass
class StageResult:
    touched: list[int] = field(default_factory=list)  # buckets rewritten
    total: int = 0  # buckets in all
    rows: list[int] = field(default_factory=list)  # rows each operation names
    post_state: Any = None  # the relation after the operations (a DataFrame)


class Store(Protocol):
    def exists(self, name: str) -> bool: ...
    def create(self, name: str, df: Any, key: Sequence[str], bucket_col: str | None) -> None: ...
    def read(self, name: str) -> Any: ...
    def drop(self, name: str) -> None: ...
    def stage(self, run: str, name: str, ops: Sequence[ApplyOp]) -> StageResult: ...
    def publish(self, run: str, name: str) -> None: ...
    def discard(self, run: str) -> None: ...
    def partitions(self, name: str) -> int: ...


class BucketedParquetStore:
    """Parquet directories under ``root/data``, bucketed by one ID column (see module doc)."""

    def __init__(self, spark: Any, root: Path, rows_per_bucket: int = 2000,
                 max_buckets: int = 1024, buckets: int | None = None) -> None:
        self.spark = spark
        self.root = root
        self.rows_per_bucket = rows_per_bucket
        self.max_buckets = max_buckets
        self.fixed_buckets = buckets

    # -- layout -------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.root / "data" / name

    def staging(self, run: str, name: str) -> Path:
        return self.root / "_staging" / run / name

    def meta(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads((self.path(name) / "_idivm_meta.json").read_text())
        return meta

    def exists(self, name: str) -> bool:
        return (self.path(name) / "_idivm_meta.json").exists()

    def partitions(self, name: str) -> int:
        return int(self.meta(name)["buckets"])

    def _schema(self, name: str) -> Any:
        from pyspark.sql.types import StructType

        return StructType.fromJson(self.meta(name)["schema"])

    def _bucket_expr(self, name: str) -> Any:
        from pyspark.sql import functions as F

        m = self.meta(name)
        return F.pmod(F.xxhash64(F.col(m["bucket_col"])), F.lit(int(m["buckets"])))

    # -- create / read / drop -------------------------------------------------------------------
    def create(self, name: str, df: Any, key: Sequence[str], bucket_col: str | None) -> None:
        from pyspark.sql import functions as F

        path = self.path(name)
        if path.exists():
            shutil.rmtree(path)
        rows = df.count()
        n = self.fixed_buckets or _pow2(max(1, rows // self.rows_per_bucket))
        n = max(1, min(n, self.max_buckets))
        col = bucket_col or (key[0] if key else df.columns[0])
        from pyspark.sql.types import IntegerType, StructType

        schema = StructType(list(df.schema.fields)).add(BUCKET, IntegerType(), False)
        meta = {"key": list(key), "bucket_col": col, "buckets": n, "schema": schema.jsonValue()}
        df = df.withColumn(BUCKET, F.pmod(F.xxhash64(F.col(col)), F.lit(n)).cast("int"))
        df.write.mode("overwrite").partitionBy(BUCKET).parquet(str(path))
        path.mkdir(parents=True, exist_ok=True)
        (path / "_idivm_meta.json").write_text(json.dumps(meta))

    def read_raw(self, name: str) -> Any:
        """The relation with its ``__bucket`` column (for pruning by bucket)."""
        return self.spark.read.schema(self._schema(name)).parquet(str(self.path(name)))

    def read(self, name: str) -> Any:
        return self.read_raw(name).drop(BUCKET)

    def drop(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)

    # -- applying i-diffs -----------------------------------------------------------------------
    def _bucket_sql(self, name: str, alias: str | None = None) -> exp.Expr:
        m = self.meta(name)
        return exp.func("PMOD", exp.func("XXHASH64", c(m["bucket_col"], alias)),
                        exp.Literal.number(int(m["buckets"])))

    def _touched(self, name: str, raw: str, ops: Sequence[tuple[ApplyOp, str]]
                 ) -> tuple[list[int], list[int]]:
        """The buckets the operations touch, and how many rows each names (one Spark job)."""
        col = self.meta(name)["bucket_col"]
        parts: list[exp.Select] = []
        for i, (op, d) in enumerate(ops):
            if op.kind == "ins" or col in op.ids:
                parts.append(select([("__op", exp.Literal.number(i)),
                                     (BUCKET, self._bucket_sql(name, "d"))], t(d, "d")))
            else:  # the i-diff names rows by other IDs: find the buckets of those rows
                q = select([("__op", exp.Literal.number(i)), (BUCKET, c(BUCKET, "r"))],
                           t(raw, "r"))
                parts.append(q.join(t(d, "d"), on=_on(op.ids, "r", "d", op.nullable),
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
        """Write the post-state of every bucket the operations touch to the staging area.

        The APPLYs become one SQL query (one analysis, one job) over the touched buckets.
        """
        m = self.meta(name)
        schema = self._schema(name)
        fields = [f for f in schema.fields if f.name != BUCKET]
        cols = [f.name for f in fields]
        raw = f"__idivm_raw_{name}"
        self.read_raw(name).createOrReplaceTempView(raw)
        named = []
        for i, op in enumerate(ops):
            d = f"__idivm_op{i}_{name}"
            op.diff.createOrReplaceTempView(d)
            named.append((op, d))
        touched, per_op = self._touched(name, raw, named)
        in_touched = exp.In(this=c(BUCKET, "r"), expressions=[
            exp.Literal.number(b) for b in touched]) if touched else exp.false()
        q: exp.Select = select([(k, c(k, "r")) for k in cols], t(raw, "r"), in_touched)
        for i, (op, d) in enumerate(named):
            q = _apply_sql(q, op, d, cols, m["key"], f"s{i}")
        final = select([(f.name, exp.cast(c(f.name, "z"), exp.DataType.build(
            f.dataType.simpleString(), dialect="spark"))) for f in fields]
            + [(BUCKET, exp.cast(self._bucket_sql(name, "z"), "INT"))], subquery(q, "z"))
        out = self.staging(run, name)
        if out.exists():
            shutil.rmtree(out)
        self.spark.sql(final.sql("spark")).write.mode("overwrite").partitionBy(BUCKET) \
            .parquet(str(out))
        out.mkdir(parents=True, exist_ok=True)
        (out / "_touched.json").write_text(json.dumps(touched))
        staged = f"__idivm_staged_{name}"
        self.spark.read.schema(schema).parquet(str(out)).createOrReplaceTempView(staged)
        kept = select([(k, c(k, "r")) for k in cols], t(raw, "r"), exp.Not(this=in_touched))
        post = union_all([kept, select([(k, c(k, "s")) for k in cols], t(staged, "s"))])
        return StageResult(touched, int(m["buckets"]), per_op, self.spark.sql(post.sql("spark")))

    def _staged_touched(self, run: str, name: str) -> list[int]:
        p = self.staging(run, name) / "_touched.json"
        return list(json.loads(p.read_text())) if p.exists() else []

    def publish(self, run: str, name: str) -> None:
        """Replace each touched bucket by its staged copy (or remove it when it emptied)."""
        staged = self.staging(run, name)
        for b in self._staged_touched(run, name):
            target = self.path(name) / f"{BUCKET}={b}"
            shutil.rmtree(target, ignore_errors=True)
            src = staged / f"{BUCKET}={b}"
            if src.exists():
                shutil.copytree(src, target)

    def discard(self, run: str) -> None:
        shutil.rmtree(self.root / "_staging" / run, ignore_errors=True)


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _on(ids: Sequence[str], left: str, right: str, nullable: frozenset[str]) -> exp.Expr:
    parts: list[exp.Expr] = []
    for k in ids:
        a, b = c(k, left), c(k, right)
        parts.append(exp.NullSafeEQ(this=a, expression=b) if k in nullable
                     else exp.EQ(this=a, expression=b))
    return and_all(parts)


def _apply_sql(q: exp.Select, op: ApplyOp, d: str, cols: Sequence[str], key: Sequence[str],
               alias: str) -> exp.Select:
    """APPLY (§2) as SQL over the rows so far: DELETE by IDs, UPDATE … SET by IDs, or
    insert-or-replace by the key."""
    cur = subquery(q, alias)
    if op.kind == "del":
        ids = select([(k, c(k, "x")) for k in op.ids], t(d, "x"), distinct=True)
        return select([(k, c(k, alias)) for k in cols], cur).join(
            subquery(ids, "d"), on=_on(op.ids, alias, "d", op.nullable), join_type="left anti")
    if op.kind == "upd":
        posts = [(f"{k}__post", c(f"{k}__post", "x")) for k in op.columns]
        ids = select([(k, c(k, "x")) for k in op.ids] + posts + [(MATCH, exp.true())],
                     t(d, "x"), distinct=True)
        items = [(k, exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Is(
            this=c(MATCH, "d"), expression=exp.null())), true=c(f"{k}__post", "d"))],
            default=c(k, alias)) if k in op.columns else c(k, alias)) for k in cols]
        return select(items, cur).join(subquery(ids, "d"),
                                       on=_on(op.ids, alias, "d", op.nullable), join_type="left")
    rows = select([(k, c(k, "x")) for k in cols], t(d, "x"), distinct=True)
    keys = select([(k, c(k, "x")) for k in key], t(d, "x"), distinct=True)
    kept = select([(k, c(k, alias)) for k in cols], cur).join(
        subquery(keys, "d"), on=_on(key, alias, "d", op.nullable), join_type="left anti")
    return select([(k, c(k, "y")) for k in cols], subquery(union_all([kept, rows]), "y"))
