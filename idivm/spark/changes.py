"""Change feeds in Delta Lake's Change Data Feed shape: read from Delta tables, or handed in.

Rows have the table's columns, ``_change_type`` ∈ {insert, update_preimage, update_postimage,
delete} and ``_commit_version``. ``read_cdf`` reads a Delta table's feed (delta-rs);
``validate`` checks a batch a user hands in. Folding reuses the PostgreSQL backend's
dialect-neutral ``fold_select``: pre-images and deletes are old row images
('D'), inserts and post-images new ones ('I'); per key, the image the versions remove once
more than they add is the row before, the one they add once more the row after (the fold
does not depend on the order of the rows; a feed whose images do not add up raises).
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from idivm.catalog import Table
from idivm.errors import IdivmError
from idivm.postgres.changelog import OP, SEQ, fold_select

CHANGE_TYPE = "_change_type"
VERSION = "_commit_version"
KINDS = ("insert", "update_preimage", "update_postimage", "delete")
OLD_IMAGES = ("update_preimage", "delete")


class ChangeFeedError(IdivmError):
    """A change batch that does not fit its table; nothing was written."""


def validate(table: Table, df: Any) -> Any:
    """Check a CDF batch against the table (one Spark job); return it with ``_commit_version``
    filled in (0 where absent: one version), or None for an empty batch."""
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
        df = df.withColumn(VERSION, F.lit(0).cast("long"))
    df = df.withColumn(VERSION, F.col(VERSION).cast("long"))
    key = list(table.primary_key)
    bad_type = ~F.col(CHANGE_TYPE).isin(*KINDS) | F.col(CHANGE_TYPE).isNull()
    old = F.col(CHANGE_TYPE).isin(*OLD_IMAGES)
    # the catalog's NOT NULL columns: a new image with a NULL there would make the views
    # planned on them silently wrong
    not_null = list(table.not_null_non_key_columns)
    r = df.select(
        *[F.sum(F.when(~old & F.col(c).isNull(), 1).otherwise(0)).alias(f"__null_{i}")
          for i, c in enumerate(not_null)],
        F.sum(F.when(bad_type, 1).otherwise(0)).alias("bad_type"),
        F.sum(F.when(_any([F.col(k).isNull() for k in key]), 1).otherwise(0)).alias("null_key"),
        F.count("*").alias("n"),
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
    nulls = [c for i, c in enumerate(not_null) if r[f"__null_{i}"]]
    if nulls:
        raise ChangeFeedError(f"change batch for {table.name}: NULL in column(s) "
                              f"{', '.join(nulls)}, which the catalog declares NOT NULL")
    if r["n"] != r["distinct"]:
        raise ChangeFeedError(f"change batch for {table.name}: some key changes twice in one "
                              "_commit_version (two inserts, two deletes or two pre-images)")
    return df if r["n"] else None


def _any(conds: list[Any]) -> Any:
    out = conds[0]
    for c in conds[1:]:
        out = out | c
    return out


def read_cdf(spark: Any, table: Table, path: str, since: int, upto: int) -> tuple[Any, int]:
    """``read_cdf_arrow`` as a Spark DataFrame (None when empty), and its row count."""
    data = read_cdf_arrow(table, path, since, upto)
    if data is None:
        return None, 0
    return spark.createDataFrame(data), int(data.num_rows)


def read_cdf_arrow(table: Table, path: str, since: int, upto: int, dt: Any = None) -> Any:
    """The Change Data Feed of the Delta table at ``path`` (``dt``, when opened already) for
    versions ``since < v <= upto`` (read by delta-rs), as an Arrow table of the table's
    columns, ``_change_type`` and ``_commit_version``; None when it has no row. A range the
    table no longer holds (vacuumed, or CDF off for some version) is refused: skipping it
    would leave the view silently wrong."""
    from idivm.spark.delta import arrow, open_table

    dt = dt if dt is not None else open_table(path)
    try:
        data = arrow(dt.load_cdf(starting_version=since + 1, ending_version=upto))
    except Exception as e:  # delta-rs's own error types
        raise ChangeFeedError(
            f"cannot read the change feed of {table.name} ({path}) for versions {since + 1}"
            f"..{upto}: {e}. The view cannot be maintained across that gap (were those versions "
            "vacuumed, or the Change Data Feed off when they were written?); recompute it "
            "(maintain(..., strategy='recompute'))") from e
    keep = [*table.column_names, CHANGE_TYPE, VERSION]
    missing = [k for k in keep if k not in data.column_names]
    if missing:
        raise ChangeFeedError(f"the change feed of {table.name} ({path}) lacks column(s) "
                              f"{', '.join(missing)}")
    data = data.select(keep)
    return data if data.num_rows else None


def as_log(df: Any) -> Any:
    """CDF rows shaped as the PostgreSQL change log: ``__seq`` orders versions with a version's
    old images first, ``__op`` is 'D' for an old image, 'I' for a new one."""
    from pyspark.sql import functions as F

    old = F.col(CHANGE_TYPE).isin(*OLD_IMAGES)
    op = F.when(old, F.lit("D")).otherwise(F.lit("I"))
    seq = F.col(VERSION).cast("long") * 2 + F.when(old, 0).otherwise(1)
    cols = [c for c in df.columns if c not in (CHANGE_TYPE, VERSION, "_commit_timestamp")]
    return df.select(seq.alias(SEQ), op.alias(OP), *[F.col(f"`{c}`") for c in cols])


def fold(spark: Any, table: Table, changes: Any, view_name: str) -> Any:
    """Effective changes (key, c__pre, c__post, __has_pre, __has_post) of CDF rows, in Spark
    SQL (the PostgreSQL backend's dialect-neutral ``fold_select``)."""
    if changes is None:
        return empty_changes(spark, table)
    import hashlib

    # temp view names must be plain identifiers, whatever the view and table are called
    tmp = "__idivm_log_" + hashlib.sha1(f"{view_name}/{table.name}".encode()).hexdigest()[:12]
    as_log(changes).createOrReplaceTempView(tmp)
    q = fold_select(table, exp.table_(exp.to_identifier(tmp, quoted=True)), exp.true(),
                     dialect="spark")
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
