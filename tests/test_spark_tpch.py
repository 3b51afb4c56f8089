"""All 22 TPC-H queries maintained on Spark (slow: ``python -m pytest -q -m slow``).

PostgreSQL generates a tiny TPC-H and one refresh batch of ``idivm bench tpch`` (new and deleted
orders with their lineitems, updates of prices, dates, flags, foreign keys and dimensions); the
batch reaches Spark as the change feed between the two states of each table. Every view is
created over the first state, maintained with the ID-based rules and compared with its
recomputation.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import idivm
from idivm.bench import tpch, tpch_bench

try:
    from tests.differential.harness import normalize_rows
    from tests.spark.harness import cdf_rows, spark_schema
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from differential.harness import normalize_rows  # type: ignore[no-redef]
    from spark.harness import cdf_rows, spark_schema  # type: ignore[no-redef]

QUERIES = tuple(range(1, 23))


def _rows(conn: psycopg.Connection[Any], table: idivm.Table) -> list[tuple[Any, ...]]:
    cols = sql.SQL(", ").join(map(sql.Identifier, table.column_names))
    return [tuple(r) for r in conn.execute(
        sql.SQL("SELECT {} FROM {}").format(cols, sql.Identifier(table.name))).fetchall()]


@pytest.mark.slow
def test_tpch_queries_on_spark(pg_dsn: str, spark_available: None, tmp_path: Path) -> None:
    from idivm.spark import SparkMaintainer, embedded_session

    catalog = idivm.Catalog.from_ddl(tpch.TPCH_DDL)
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    before: dict[str, list[tuple[Any, ...]]] = {}
    after: dict[str, list[tuple[Any, ...]]] = {}
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        with tpch_bench._connect(pg_dsn, schema) as conn:
            tpch_bench.load(conn, 0.002)
            before = {t: _rows(conn, catalog.table(t)) for t in tpch.TABLES}
            tpch_bench.apply_batch(conn, tpch_bench.Refresher(conn, seed=3).build())
            after = {t: _rows(conn, catalog.table(t)) for t in tpch.TABLES}
    finally:
        tpch_bench.drop_schema(pg_dsn, schema)

    spark = embedded_session("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    m = SparkMaintainer(catalog, tmp_path / "wh", spark=spark, buckets=4)
    for t in tpch.TABLES:
        m.load_table(t, spark.createDataFrame(before[t], spark_schema(catalog.table(t))))
    views = {nr: f"q{nr}" for nr in QUERIES}
    qs = tpch.queries()
    for nr, name in views.items():
        m.create_view(name, qs[nr], strategy="id")
    changed = 0
    for t in tpch.TABLES:
        rows = cdf_rows(catalog.table(t), before[t], after[t])
        if rows:
            changed += len(rows)
            m.apply_changes(t, spark.createDataFrame(
                rows, spark_schema(catalog.table(t)) + ", `_change_type` string"))
    assert changed > 0
    wrong = []
    for nr, name in views.items():
        m.maintain(name)
        got = normalize_rows(r for r in m.read_view(name).collect())
        want = normalize_rows(r for r in m.recompute(name).collect())
        if got != want:
            wrong.append(nr)
    assert not wrong, f"maintained views differ from recomputation: Q{wrong}"
