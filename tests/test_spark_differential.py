"""Spark backend, differential: every operator's views maintained by DuckDB on the driver, each
equal to its recomputation after every round. Spark SQL's run of the same views and workloads
is test_spark_mixed.py's (the engines in turn, Spark SQL first: its rounds 0 and 2, round 0
folding two commits at once as here); a run of Spark SQL alone here repeated it (~180 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

try:
    from tests.spark.harness import views_by_schema, views_match_recomputation
except ImportError:  # pragma: no cover
    from spark.harness import views_by_schema, views_match_recomputation  # type: ignore[no-redef]


@pytest.mark.parametrize("engine", ["driver"])
@pytest.mark.parametrize("schema_key,views", views_by_schema())
def test_spark_views_match_recomputation(spark: Any, tmp_path: Path, schema_key: str,
                                         views: list[str], engine: str) -> None:
    views_match_recomputation(spark, tmp_path, schema_key, views, engine)
