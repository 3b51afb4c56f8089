"""A WITH aggregate a Spark view reads more than once, held as a view of its own
(``create_view`` with ``hoist.chosen``), as on PostgreSQL (``tests/test_pg_hoist.py``): refreshed
once, ahead of the view, which reads its change feed; the owner recorded, dropped with the
view, the query as written in ``definitions``. Differential over random batches."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import idivm

DDL = """CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, x int);
CREATE TABLE u (g int PRIMARY KEY, name text);"""

TOP = ("WITH s AS (SELECT g, sum(x) AS total FROM t GROUP BY g) "
       "SELECT u.g, u.name, s.total FROM u JOIN s ON u.g = s.g "
       "WHERE s.total = (SELECT max(total) FROM s)")


def test_shared_cte_view_on_spark(spark: Any, tmp_path: Path) -> None:
    from idivm.spark import SparkMaintainer

    m = SparkMaintainer(idivm.Catalog.from_ddl(DDL), tmp_path, spark=spark)
    m.load_table("t", spark.createDataFrame(
        [(i, i % 7, (i * 13) % 50) for i in range(1, 201)], "id int, g int, x int"))
    m.load_table("u", spark.createDataFrame([(i, f"n{i}") for i in range(7)],
                                            "g int, name string"))
    m.create_view("top", TOP, strategy="id")
    assert {s["view"]: s["upstream"] for s in m.status()} == {"top": ["top__s"], "top__s": []}
    assert m.registry()["views"]["top__s"]["owner"] == "top"
    assert m.definitions() == {"top": TOP}
    rng = random.Random(2711)
    for _ in range(3):
        cur = {r[0] for r in spark.table("t").select("id").collect()}
        rows = []
        for k in rng.sample(range(1, 260), 25):
            kind = ("delete" if rng.random() < 0.3 else "update_postimage") if k in cur \
                else "insert"
            rows.append((k, rng.randrange(7), rng.randrange(90), kind))
        m.apply_changes("t", spark.createDataFrame(
            rows, "id int, g int, x int, _change_type string"))
        st = m.maintain("top")
        assert sorted(st.upstream) == ["top__s"]
        assert Counter(map(tuple, m.read_view("top").collect())) == \
            Counter(map(tuple, spark.sql(TOP).collect()))
    m.drop_view("top")
    assert m.status() == []
