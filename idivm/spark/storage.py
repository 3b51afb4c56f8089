"""Storage of base tables, views and caches for the Spark backend.

``Store`` is the small interface the maintainer needs: create, read, stage the effect of a list
of APPLY operations durably, expose the staged post-state, publish it idempotently. A Delta Lake
or Iceberg store would stage by running the Δ-script's MERGE statements on a branch/version and
publish by committing; it needs jars this project cannot install, so none is shipped.

``BucketedParquetStore`` keeps each relation as parquet files partitioned by a hash bucket of
one of its IDs, ``__bucket = pmod(xxhash64(id), N)``, plus a short list of *pending i-diffs*
(merge-on-read, as Iceberg's equality deletes or Delta's deletion vectors, but ID-based):

- **append** (the usual case): a round's APPLYs are written as they are — the i-diffs, a few
  hundred rows for a few hundred changes — and the relation is read as its bucket files with
  the pending i-diffs applied in order (small i-diffs: broadcast joins). Maintenance then costs
  in proportion to the i-diffs, not to the buckets they touch: 200 scattered price updates touch
  most buckets of any sensible layout.
- **rewrite** (compaction): when the pending i-diffs grow past a share of the relation or a
  count, the round writes the post-state of exactly the buckets the pending and new i-diffs
  touch, and clears the list. Base tables are always rewritten (their post-state is what a
  recomputation reads).

Staging writes under a run's staging directory; publishing copies into place and then records
the new pending list in the relation's metadata (an atomic file replace) — repeatable after a
crash at any point, since staged files carry post-state values and APPLY is idempotent. Why
buckets and not Spark's own ``INSERT OVERWRITE … PARTITION``: dynamic overwrite cannot empty a
bucket (a bucket whose rows all go away would keep its old files), and a copy from staging can
be repeated, where a move could not.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlglot import exp

from idivm.planner.ruleapi import and_all, c, select, subquery, t, union_all

BUCKET = "__bucket"
MATCH = "__m"
PENDING = "_pending"  # Spark's file listing skips names starting with "_"


@dataclass(frozen=True)
class ApplyOp:
    """One APPLY of the Δ-script: an i-diff (a DataFrame) and how it names the target's rows."""

    kind: str  # "del", "upd", "ins"; "replace": the diff is the whole new relation
    diff: Any  # pyspark DataFrame
    ids: tuple[str, ...]
    columns: tuple[str, ...]  # upd: the columns set (from c__post); ins: every column
    nullable: frozenset[str] = frozenset()


@dataclass
class StageResult:
    mode: str = "rewrite"  # "append": i-diffs kept pending; "rewrite": touched buckets rewritten
    touched: list[int] = field(default_factory=list)  # buckets rewritten
    total: int = 0  # buckets in all
    rows: list[int] = field(default_factory=list)  # rows each operation names (rewrite) or
    # holds (append)
    pending_rows: int = 0  # rows of pending i-diffs after the round
    post: Callable[[], Any] | None = None  # builds the relation after the operations

    @property
    def post_state(self) -> Any:
        """The relation after the operations (a DataFrame; built on demand, as only a cache
        that later statements read needs it)."""
        assert self.post is not None
        return self.post()


class Store(Protocol):
    def exists(self, name: str) -> bool: ...
    def create(self, name: str, df: Any, key: Sequence[str], bucket_col: str | None) -> None: ...
    def read(self, name: str) -> Any: ...
    def drop(self, name: str) -> None: ...
    def stage(self, run: str, name: str, ops: Sequence[ApplyOp],
              rewrite: bool = False) -> StageResult: ...
    def publish(self, run: str, name: str) -> None: ...
    def discard(self, run: str) -> None: ...
    def partitions(self, name: str) -> int: ...
    def pending(self, name: str) -> list[dict[str, Any]]: ...


class BucketedParquetStore:
    """Parquet directories under ``root/data``, bucketed by one ID column, with pending
    i-diffs (see module doc)."""

    def __init__(self, spark: Any, root: Path, rows_per_bucket: int = 2000,
                 max_buckets: int = 1024, buckets: int | None = None,
                 compact_share: float = 0.05, max_pending: int = 8) -> None:
        self.spark = spark
        self.root = root
        self.rows_per_bucket = rows_per_bucket
        self.max_buckets = max_buckets
        self.fixed_buckets = buckets
        self.compact_share = compact_share  # rewrite once pending rows pass this share …
        self.max_pending = max_pending  # … or this many pending i-diffs
        self._main: dict[str, Any] = {}  # bucket files read once per version of the files
        self._raw: dict[str, Any] = {}
        self._files: dict[str, Any] = {}  # i-diff files never change once written

    # -- layout -------------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.root / "data" / name

    def staging(self, run: str, name: str) -> Path:
        return self.root / "_staging" / run / name

    def meta(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads((self.path(name) / "_idivm_meta.json").read_text())
        meta.setdefault("pending", [])
        return meta

    def _save_meta(self, name: str, meta: dict[str, Any]) -> None:
        """Atomic replace: a crash leaves the old or the new metadata, never half of one."""
        target = self.path(name) / "_idivm_meta.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, target)
        self._raw.pop(name, None)

    def exists(self, name: str) -> bool:
        return (self.path(name) / "_idivm_meta.json").exists()

    def partitions(self, name: str) -> int:
        return int(self.meta(name)["buckets"])

    def pending(self, name: str) -> list[dict[str, Any]]:
        """The pending i-diffs, in the order they apply."""
        return list(self.meta(name)["pending"])

    def _schema(self, name: str) -> Any:
        from pyspark.sql.types import StructType

        return StructType.fromJson(self.meta(name)["schema"])

    # -- create / read / drop -------------------------------------------------------------------
    def create(self, name: str, df: Any, key: Sequence[str], bucket_col: str | None) -> None:
        from pyspark.sql import functions as F

        path = self.path(name)
        if path.exists():
            shutil.rmtree(path)
        self._main.pop(name, None)
        self._raw.pop(name, None)
        rows = df.count()
        n = self.fixed_buckets or _pow2(max(1, rows // self.rows_per_bucket))
        n = max(1, min(n, self.max_buckets))
        col = bucket_col or (key[0] if key else df.columns[0])
        from pyspark.sql.types import IntegerType, StructType

        schema = StructType(list(df.schema.fields)).add(BUCKET, IntegerType(), False)
        meta = {"key": list(key), "bucket_col": col, "buckets": n, "schema": schema.jsonValue(),
                "rows": rows, "pending": []}
        df = df.withColumn(BUCKET, F.pmod(F.xxhash64(F.col(col)), F.lit(n)).cast("int"))
        # one file per bucket: without the shuffle every task writes a file into every bucket
        df.repartition(BUCKET).write.mode("overwrite").partitionBy(BUCKET).parquet(str(path))
        path.mkdir(parents=True, exist_ok=True)
        self._save_meta(name, meta)

    def _read_main(self, name: str) -> Any:
        """The bucket files alone, with ``__bucket``; kept until they change, so the file
        listing is done once."""
        if name not in self._main:
            self._main[name] = self.spark.read.schema(self._schema(name)).parquet(
                str(self.path(name)))
        return self._main[name]

    def read_raw(self, name: str) -> Any:
        """The relation with its ``__bucket`` column: bucket files, pending i-diffs applied."""
        if name not in self._raw:
            meta = self.meta(name)
            self._raw[name] = self._merged(name, meta, [
                (e, self.path(name) / PENDING / e["file"]) for e in meta["pending"]])
        return self._raw[name]

    def read(self, name: str) -> Any:
        return self.read_raw(name).drop(BUCKET)

    def drop(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)
        self._main.pop(name, None)
        self._raw.pop(name, None)

    def _idiff_file(self, entry: dict[str, Any], path: Path) -> Any:
        """A stored i-diff, read with its recorded schema (no inference) and kept."""
        key = str(path)
        if key not in self._files:
            from pyspark.sql.types import StructType

            reader = self.spark.read
            if "schema" in entry:
                reader = reader.schema(StructType.fromJson(entry["schema"]))
            self._files[key] = reader.parquet(key)
        return self._files[key]

    def _merged(self, name: str, meta: dict[str, Any],
                ops: Sequence[tuple[dict[str, Any], Path]]) -> Any:
        """Bucket files with the i-diffs stored at the given paths applied in order."""
        main = self._read_main(name)
        if not ops:
            return main
        cols = [f.name for f in main.schema.fields if f.name != BUCKET]
        base = f"__idivm_main_{name}"
        main.createOrReplaceTempView(base)
        q: exp.Select = select([(k, c(k, "r")) for k in cols], t(base, "r"))
        for i, (entry, path) in enumerate(ops):
            d = f"__idivm_pend_{name}_{i}"
            self._idiff_file(entry, path).createOrReplaceTempView(d)
            q = _apply_sql(q, _op_of(entry), d, cols, meta["key"], f"s{i}",
                           distinct=not entry.get("distinct"))
        final = select([(k, c(k, "z")) for k in cols]
                       + [(BUCKET, exp.cast(self._bucket_sql(meta, "z"), "INT"))],
                       subquery(q, "z"))
        return self.spark.sql(final.sql("spark"))

    # -- applying i-diffs -----------------------------------------------------------------------
    @staticmethod
    def _bucket_sql(meta: dict[str, Any], alias: str | None = None) -> exp.Expr:
        return exp.func("PMOD", exp.func("XXHASH64", c(meta["bucket_col"], alias)),
                        exp.Literal.number(int(meta["buckets"])))

    def _touched(self, meta: dict[str, Any], raw: str, ops: Sequence[tuple[ApplyOp, str]]
                 ) -> tuple[list[int], list[int]]:
        """The buckets the operations touch, and how many rows each names (one Spark job)."""
        col = meta["bucket_col"]
        parts: list[exp.Select] = []
        for i, (op, d) in enumerate(ops):
            if op.kind == "ins" or col in op.ids:
                parts.append(select([("__op", exp.Literal.number(i)),
                                     (BUCKET, self._bucket_sql(meta, "d"))], t(d, "d")))
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

    def stage(self, run: str, name: str, ops: Sequence[ApplyOp],
              rewrite: bool = False) -> StageResult:
        """Stage the effect of the operations: append them as pending i-diffs, or — when asked,
        or when the pending i-diffs have grown too large — rewrite the buckets they touch."""
        meta = self.meta(name)
        out = self.staging(run, name)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        if any(op.kind == "replace" for op in ops):
            if len(ops) != 1:
                raise ValueError("a replace must be the only operation of its stage")
            return self._stage_replace(name, meta, ops[0], out)
        if not rewrite:
            res = self._stage_append(name, meta, ops, out)
            if res is not None:
                return res
        return self._stage_rewrite(name, meta, ops, out)

    def _stage_append(self, name: str, meta: dict[str, Any], ops: Sequence[ApplyOp],
                      out: Path) -> StageResult | None:
        """Write each i-diff as it is (one job each, counted while written); None when the
        pending i-diffs would then pass the compaction thresholds."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        entries: list[dict[str, Any]] = []
        counts: list[int] = []
        cols = [f.name for f in self._schema(name).fields if f.name != BUCKET]
        for i, op in enumerate(ops):
            f = f"{out.parent.name}_{i:03d}"
            seen = Observation(f"idivm_rows_{i}")
            stored = _stored_form(op, cols)
            stored.observe(seen, F.count(F.lit(1)).alias("n")).coalesce(1) \
                .write.mode("overwrite").parquet(str(out / f))
            counts.append(int(seen.get["n"]))
            entries.append({"file": f, "kind": op.kind, "ids": list(op.ids),
                            "columns": list(op.columns), "nullable": sorted(op.nullable),
                            "schema": stored.schema.jsonValue(), "rows": counts[-1],
                            "distinct": True})
        pending = meta["pending"] + entries
        pending_rows = sum(int(e["rows"]) for e in pending)
        if len(pending) > self.max_pending or \
                pending_rows > self.compact_share * max(1, int(meta.get("rows", 0))):
            shutil.rmtree(out)
            out.mkdir(parents=True)
            return None
        (out / "_stage.json").write_text(json.dumps({"mode": "append", "entries": entries}))
        paths = [(e, self.path(name) / PENDING / e["file"]) for e in meta["pending"]]
        paths += [(e, out / e["file"]) for e in entries]
        return StageResult("append", [], int(meta["buckets"]), counts, pending_rows,
                           lambda: self._merged(name, meta, paths).drop(BUCKET))

    def _stage_rewrite(self, name: str, meta: dict[str, Any], ops: Sequence[ApplyOp],
                       out: Path) -> StageResult:
        """The post-state of every bucket the pending and new operations touch, written to the
        staging area in one SQL query (one analysis, one job)."""
        schema = self._schema(name)
        fields = [f for f in schema.fields if f.name != BUCKET]
        cols = [f.name for f in fields]
        raw = f"__idivm_raw_{name}"
        self._read_main(name).createOrReplaceTempView(raw)
        named: list[tuple[ApplyOp, str]] = []
        stored: set[int] = set()  # operations read from distinct pending files
        for j, e in enumerate(meta["pending"]):  # pending i-diffs first, in their order
            d = f"__idivm_pend_{name}_{j}"
            self._idiff_file(e, self.path(name) / PENDING / e["file"]).createOrReplaceTempView(d)
            named.append((_op_of(e), d))
            if e.get("distinct"):
                stored.add(j)
        first_new = len(named)
        for i, op in enumerate(ops):
            d = f"__idivm_op{i}_{name}"
            op.diff.createOrReplaceTempView(d)
            named.append((op, d))
        touched, per_op = self._touched(meta, raw, named)
        in_touched = exp.In(this=c(BUCKET, "r"), expressions=[
            exp.Literal.number(b) for b in touched]) if touched else exp.false()
        q: exp.Select = select([(k, c(k, "r")) for k in cols], t(raw, "r"), in_touched)
        for i, (op, d) in enumerate(named):
            q = _apply_sql(q, op, d, cols, meta["key"], f"s{i}", distinct=i not in stored)
        final = select([(f.name, exp.cast(c(f.name, "z"), exp.DataType.build(
            f.dataType.simpleString(), dialect="spark"))) for f in fields]
            + [(BUCKET, exp.cast(self._bucket_sql(meta, "z"), "INT"))], subquery(q, "z"))
        data = out / "buckets"
        self.spark.sql(final.sql("spark")).repartition(BUCKET).write.mode("overwrite") \
            .partitionBy(BUCKET).parquet(str(data))
        data.mkdir(parents=True, exist_ok=True)
        (out / "_stage.json").write_text(json.dumps({"mode": "rewrite", "touched": touched}))

        def post() -> Any:
            staged = f"__idivm_staged_{name}"
            self.spark.read.schema(schema).parquet(str(data)).createOrReplaceTempView(staged)
            self._read_main(name).createOrReplaceTempView(raw)
            kept = select([(k, c(k, "r")) for k in cols], t(raw, "r"), exp.Not(this=in_touched))
            rows = union_all([kept, select([(k, c(k, "s")) for k in cols], t(staged, "s"))])
            return self.spark.sql(rows.sql("spark"))

        return StageResult("rewrite", touched, int(meta["buckets"]), per_op[first_new:], 0,
                           post)

    def _stage_replace(self, name: str, meta: dict[str, Any], op: ApplyOp, out: Path
                       ) -> StageResult:
        """Every bucket written anew from the operation's rows (the recompute strategy)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        schema = self._schema(name)
        fields = [f for f in schema.fields if f.name != BUCKET]
        n = int(meta["buckets"])
        seen = Observation("idivm_replaced_rows")
        df = op.diff.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name)
                              for f in fields])
        df = df.withColumn(BUCKET, F.pmod(F.xxhash64(F.col(f"`{meta['bucket_col']}`")),
                                          F.lit(n)).cast("int"))
        data = out / "buckets"
        df.observe(seen, F.count(F.lit(1)).alias("n")).repartition(BUCKET).write \
            .mode("overwrite").partitionBy(BUCKET).parquet(str(data))
        data.mkdir(parents=True, exist_ok=True)
        rows = int(seen.get["n"])
        (out / "_stage.json").write_text(json.dumps({"mode": "replace", "rows": rows}))
        return StageResult("replace", list(range(n)), n, [rows], 0,
                           lambda: self.spark.read.schema(schema).parquet(str(data))
                           .drop(BUCKET))

    def publish(self, run: str, name: str) -> None:
        """Put a staged round in place; repeatable. Append: copy the i-diffs under
        ``_pending`` and list them. Rewrite: replace each touched bucket by its staged copy
        (or remove it when it emptied), then clear the pending list."""
        out = self.staging(run, name)
        info = json.loads((out / "_stage.json").read_text())
        meta = self.meta(name)
        if info["mode"] == "append":
            listed = {e["file"] for e in meta["pending"]}
            for e in info["entries"]:
                target = self.path(name) / PENDING / e["file"]
                if e["file"] not in listed:
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(out / e["file"], target)
                    meta["pending"].append(e)
            self._save_meta(name, meta)
            return
        self._main.pop(name, None)
        if info["mode"] == "replace":  # every bucket goes; staged ones come back
            for d in self.path(name).glob(f"{BUCKET}=*"):
                shutil.rmtree(d, ignore_errors=True)
            for src in (out / "buckets").glob(f"{BUCKET}=*"):
                shutil.copytree(src, self.path(name) / src.name)
            meta["pending"], meta["rows"] = [], int(info["rows"])
            self._save_meta(name, meta)
            shutil.rmtree(self.path(name) / PENDING, ignore_errors=True)
            return
        for b in info["touched"]:
            target = self.path(name) / f"{BUCKET}={b}"
            shutil.rmtree(target, ignore_errors=True)
            src = out / "buckets" / f"{BUCKET}={b}"
            if src.exists():
                shutil.copytree(src, target)
        meta["pending"] = []
        self._save_meta(name, meta)
        shutil.rmtree(self.path(name) / PENDING, ignore_errors=True)

    def discard(self, run: str) -> None:
        shutil.rmtree(self.root / "_staging" / run, ignore_errors=True)


def _op_of(entry: dict[str, Any]) -> ApplyOp:
    """A pending i-diff's APPLY (its rows are read from its file by the caller)."""
    return ApplyOp(entry["kind"], None, tuple(entry["ids"]), tuple(entry["columns"]),
                   frozenset(entry.get("nullable", ())))


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


def _stored_form(op: ApplyOp, cols: Sequence[str]) -> Any:
    """The i-diff as a pending file keeps it: just the columns its APPLY reads, distinct (so
    that reading it back needs no aggregation)."""
    from pyspark.sql import functions as F

    if op.kind == "del":
        keep = list(op.ids)
    elif op.kind == "upd":
        keep = [*op.ids, *(f"{k}__post" for k in op.columns)]
    else:
        keep = list(cols)
    return op.diff.select(*[F.col(f"`{k}`") for k in keep]).distinct()


def _apply_sql(q: exp.Select, op: ApplyOp, d: str, cols: Sequence[str], key: Sequence[str],
               alias: str, distinct: bool = True) -> exp.Select:
    """APPLY (§2) as SQL over the rows so far: DELETE by IDs, UPDATE … SET by IDs, or
    insert-or-replace by the key. ``distinct=False`` for i-diffs stored distinct already."""
    cur = subquery(q, alias)
    if op.kind == "del":
        ids = select([(k, c(k, "x")) for k in op.ids], t(d, "x"), distinct=distinct)
        return select([(k, c(k, alias)) for k in cols], cur).join(
            subquery(ids, "d"), on=_on(op.ids, alias, "d", op.nullable), join_type="left anti")
    if op.kind == "upd":
        posts = [(f"{k}__post", c(f"{k}__post", "x")) for k in op.columns]
        ids = select([(k, c(k, "x")) for k in op.ids] + posts + [(MATCH, exp.true())],
                     t(d, "x"), distinct=distinct)
        items = [(k, exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Is(
            this=c(MATCH, "d"), expression=exp.null())), true=c(f"{k}__post", "d"))],
            default=c(k, alias)) if k in op.columns else c(k, alias)) for k in cols]
        return select(items, cur).join(subquery(ids, "d"),
                                       on=_on(op.ids, alias, "d", op.nullable), join_type="left")
    rows = select([(k, c(k, "x")) for k in cols], t(d, "x"), distinct=distinct)
    keys = select([(k, c(k, "x")) for k in key], t(d, "x"), distinct=distinct)
    kept = select([(k, c(k, alias)) for k in cols], cur).join(
        subquery(keys, "d"), on=_on(key, alias, "d", op.nullable), join_type="left anti")
    return select([(k, c(k, "y")) for k in cols], subquery(union_all([kept, rows]), "y"))
