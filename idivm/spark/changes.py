"""Change feeds in Delta Lake's Change Data Feed shape, kept as a versioned log per table.

A batch has the table's columns, ``_change_type`` ∈ {insert, update_preimage, update_postimage,
delete} and optionally ``_commit_version`` (assigned when absent). Folding reuses the
PostgreSQL backend's dialect-neutral ``fold_query``: pre-images and deletes are old row images
('D'), inserts and post-images new ones ('I'), ordered by ``_commit_version`` with a version's
old images first; per key the first pre-image and the last post-image survive.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sqlglot import exp

from idivm.catalog import Table
from idivm.errors import IdivmError
from idivm.postgres.changelog import OP, SEQ, fold_query

CHANGE_TYPE = "_change_type"
VERSION = "_commit_version"
KINDS = ("insert", "update_preimage", "update_postimage", "delete")
OLD_IMAGES = ("update_preimage", "delete")


class ChangeFeedError(IdivmError):
    """A change batch that does not fit its table; nothing was written."""


def validate(table: Table, df: Any, last_version: int) -> tuple[Any, int | None]:
    """Check a CDF batch against the table (one Spark job); return it with
    ``_commit_version`` filled in, and its highest version (None for an empty batch)."""
    from pyspark.sql import functions as F

    cols = set(df.columns)
    unknown = sorted(cols - set(table.column_names) - {CHANGE_TYPE, VERSION})
    if unknown:
        raise ChangeFeedError(f"change batch for {table.name} has unknown column(s) "
                              f"{', '.join(unknown)}")
    missing = [c for c in table.column_names if c not in cols]
    if CHANGE_TYPE not in cols:
        missing.append(CHANGE_TYPE)
    if missing:
        raise ChangeFeedError(f"change batch for {table.name} lacks column(s) "
                              f"{', '.join(missing)}")
    if VERSION not in cols:
        df = df.withColumn(VERSION, F.lit(last_version + 1).cast("long"))
    df = df.withColumn(VERSION, F.col(VERSION).cast("long"))
    key = list(table.primary_key)
    bad_type = ~F.col(CHANGE_TYPE).isin(*KINDS) | F.col(CHANGE_TYPE).isNull()
    old = F.col(CHANGE_TYPE).isin(*OLD_IMAGES)
    r = df.select(
        F.sum(F.when(bad_type, 1).otherwise(0)).alias("bad_type"),
        F.sum(F.when(_any([F.col(k).isNull() for k in key]), 1).otherwise(0)).alias("null_key"),
        F.min(VERSION).alias("vmin"), F.max(VERSION).alias("vmax"), F.count("*").alias("n"),
        # a key may leave (old image) and enter (new image) once per version
        F.count_distinct(F.struct(*key, F.col(VERSION), old)).alias("distinct"),
        F.collect_set(F.when(bad_type, F.coalesce(F.col(CHANGE_TYPE), F.lit("NULL"))))
        .alias("bad"),
    ).collect()[0]
    if r["bad_type"]:
        raise ChangeFeedError(f"change batch for {table.name}: _change_type must be one of "
                              f"{', '.join(KINDS)}; got {sorted(r['bad'])[:5]}")
    if r["null_key"]:
        raise ChangeFeedError(f"change batch for {table.name}: {r['null_key']} row(s) "
                              f"with a missing key ({', '.join(key)})")
    if r["vmin"] is not None and r["vmin"] <= last_version:
        raise ChangeFeedError(f"change batch for {table.name}: _commit_version must be above "
                              f"the last recorded version {last_version}")
    if r["n"] != r["distinct"]:
        raise ChangeFeedError(f"change batch for {table.name}: some key changes twice in one "
                              "_commit_version (two inserts, two deletes or two pre-images)")
    return df, (int(r["vmax"]) if r["vmax"] is not None else None)


def _any(conds: list[Any]) -> Any:
    out = conds[0]
    for c in conds[1:]:
        out = out | c
    return out


def log_path(root: Path, table: str) -> Path:
    return root / "changes" / table


def write_log(root: Path, table: str, df: Any) -> None:
    """Record the batch; re-writing the same versions replaces them (a retried batch)."""
    df.write.mode("overwrite").option("partitionOverwriteMode", "dynamic") \
        .partitionBy(VERSION).parquet(str(log_path(root, table)))


def read_log(spark: Any, root: Path, table: Table, since: int, upto: int) -> Any:
    """Log rows with since < version <= upto, shaped as the PostgreSQL log (__seq, __op)."""
    from pyspark.sql import functions as F

    path = log_path(root, table.name)
    if not path.exists() or upto <= since:
        return None
    # the log's schema, so that reading it infers nothing from its files
    types = [(c.name, exp.DataType.build(c.type, dialect="postgres")) for c in table.columns]
    types += [(CHANGE_TYPE, exp.DataType.build("STRING")), (VERSION, exp.DataType.build("BIGINT"))]
    schema = ", ".join(f"{exp.to_identifier(n, quoted=True).sql('spark')} {ty.sql('spark')}"
                       for n, ty in types)
    df = spark.read.schema(schema).parquet(str(path)).where(
        (F.col(VERSION) > since) & (F.col(VERSION) <= upto))
    op = F.when(F.col(CHANGE_TYPE).isin(*OLD_IMAGES), F.lit("D")).otherwise(F.lit("I"))
    seq = F.col(VERSION) * 2 + F.when(F.col(CHANGE_TYPE).isin(*OLD_IMAGES), 0).otherwise(1)
    return df.select(seq.alias(SEQ), op.alias(OP), *table.column_names)


def fold(spark: Any, root: Path, table: Table, since: int, upto: int, view_name: str) -> Any:
    """Effective changes (key, c__pre, c__post, __has_pre, __has_post) in Spark SQL."""
    log = read_log(spark, root, table, since, upto)
    if log is None:
        return empty_changes(spark, table)
    import hashlib

    # temp view names must be plain identifiers, whatever the view and table are called
    tmp = "__idivm_log_" + hashlib.sha1(f"{view_name}/{table.name}".encode()).hexdigest()[:12]
    log.createOrReplaceTempView(tmp)
    q = fold_query(table, exp.table_(exp.to_identifier(tmp, quoted=True)), since * 2 + 1,
                   upto * 2 + 1)
    return spark.sql(q.sql("spark"))


def empty_changes(spark: Any, table: Table) -> Any:
    from pyspark.sql import functions as F

    base = spark.table(table.name).limit(0)
    key = list(table.primary_key)
    cols = [F.col(k) for k in key]
    cols += [F.col(c).alias(f"{c}__pre") for c in table.non_key_columns]
    cols += [F.col(c).alias(f"{c}__post") for c in table.non_key_columns]
    cols += [F.lit(False).alias("__has_pre"), F.lit(False).alias("__has_post")]
    return base.select(*cols)


def prune(root: Path, table: str, upto: int) -> None:
    """Drop log versions every view has consumed."""
    path = log_path(root, table)
    if not path.exists():
        return
    for d in path.iterdir():
        if d.name.startswith(f"{VERSION}=") and int(d.name.split("=", 1)[1]) <= upto:
            shutil.rmtree(d, ignore_errors=True)
