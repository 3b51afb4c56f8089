"""One differential run on ``local-cluster[2,1,1024]``: executors are separate JVMs."""

from __future__ import annotations

import sys
from pathlib import Path

import idivm
from idivm.spark import SparkMaintainer, embedded_session
from tests.differential.views import VIEWS_BY_NAME
from tests.spark.harness import SparkDifferential, schema_ddl


def main(warehouse: str) -> int:
    spark = embedded_session("local-cluster[2,1,1024]")
    try:
        v = VIEWS_BY_NAME["paper_v_cost"]
        m = SparkMaintainer(idivm.Catalog.from_ddl(schema_ddl(v.schema)), Path(warehouse),
                            spark=spark, buckets=4)
        run = SparkDifferential(m, v.schema, seed=5)
        m.create_view(v.name, v.sql)
        for r in range(1):
            run.step(10)
            m.maintain(v.name)
            run.check(v.name, f"local-cluster round {r}")
        print("local-cluster ok")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
