"""Spark backend, differential: every operator's views maintained by Spark SQL and DuckDB on
the driver in turn (Spark SQL first) — each view equal to its recomputation after every round,
and a row one engine wrote found by the other in the bucket it expects. The suite's run of
Spark SQL over these views and workloads (the driver's alone: test_spark_differential.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

try:
    from tests.spark.harness import views_by_schema, views_match_recomputation
except ImportError:  # pragma: no cover
    from spark.harness import views_by_schema, views_match_recomputation  # type: ignore[no-redef]


@pytest.mark.parametrize("schema_key,views", views_by_schema())
def test_spark_views_match_recomputation_mixed(spark: Any, tmp_path: Path, schema_key: str,
                                               views: list[str]) -> None:
    views_match_recomputation(spark, tmp_path, schema_key, views, "mixed")
