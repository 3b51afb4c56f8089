"""Spark backend, differential: every operator's views maintained by Spark SQL and by DuckDB on
the driver, each equal to its recomputation after every round (both engines in turn:
test_spark_mixed.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

try:
    from tests.spark.harness import views_by_schema, views_match_recomputation
except ImportError:  # pragma: no cover
    from spark.harness import views_by_schema, views_match_recomputation  # type: ignore[no-redef]


@pytest.mark.parametrize("engine", ["spark", "driver"])
@pytest.mark.parametrize("schema_key,views", views_by_schema())
def test_spark_views_match_recomputation(spark: Any, tmp_path: Path, schema_key: str,
                                         views: list[str], engine: str) -> None:
    views_match_recomputation(spark, tmp_path, schema_key, views, engine)
