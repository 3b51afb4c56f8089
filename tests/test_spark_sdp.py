"""Spark Declarative Pipelines projects refreshed by idivm (``idivm spark pipeline run``): the
spec's SQL files become maintained views over the user's Delta tables, created on the first run,
refreshed incrementally later, re-created when their SQL changes; refusals come before anything
runs; and the datasets equal what ``spark-pipelines run`` computes for the same project."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idivm.cli import main as cli_main

try:
    from tests.differential.harness import normalize_rows
except ImportError:  # pragma: no cover
    from differential.harness import normalize_rows  # type: ignore[no-redef]

DDL = """CREATE TABLE orders (oid int PRIMARY KEY, cust int NOT NULL, amount int, status text);
CREATE TABLE customers (cust int PRIMARY KEY, region text);"""
SILVER = """-- cleaned orders (spark-pipelines of Spark 4.3 takes no OR REFRESH; idivm does)
CREATE MATERIALIZED VIEW clean_orders AS
SELECT oid, cust, amount FROM orders WHERE status <> 'cancelled';
"""
GOLD = """CREATE MATERIALIZED VIEW per_customer AS
SELECT cust, sum(amount) AS total, count(*) AS n FROM clean_orders GROUP BY cust;

CREATE MATERIALIZED VIEW report AS
SELECT c.region, p.cust, p.total FROM per_customer p JOIN customers c ON p.cust = c.cust
WHERE p.total > 100;
"""
DATASETS = ("clean_orders", "per_customer", "report")


def _orders(n: int) -> Any:
    import pyarrow as pa

    return pa.table({"oid": pa.array(range(n), pa.int32()),
                     "cust": pa.array([i % 37 for i in range(n)], pa.int32()),
                     "amount": pa.array([(i * 7) % 90 for i in range(n)], pa.int32()),
                     "status": ["cancelled" if i % 11 == 0 else "ok" for i in range(n)]})


@pytest.fixture
def sdp_project(tmp_path: Path, spark_available: None) -> Path:
    import pyarrow as pa
    from deltalake import write_deltalake

    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(str(tmp_path / "lake" / "orders"), _orders(500), configuration=cdf)
    write_deltalake(str(tmp_path / "lake" / "customers"), pa.table({
        "cust": pa.array(range(37), pa.int32()),
        "region": [f"r{i % 4}" for i in range(37)]}), configuration=cdf)
    proj = tmp_path / "proj"
    (proj / "transformations" / "gold").mkdir(parents=True)
    (proj / "transformations" / "silver.sql").write_text(SILVER)
    (proj / "transformations" / "gold" / "gold.sql").write_text(GOLD)
    (proj / "schema.sql").write_text(DDL)
    (proj / "spark-pipeline.yml").write_text(
        "name: shop\nstorage: storage\nlibraries:\n  - glob:\n      include: transformations/**\n"
        "configuration:\n  idivm.ddl: schema.sql\n  idivm.source.orders: ../lake/orders\n"
        "  idivm.source.customers: ../lake/customers\n")
    return proj


def _run(proj: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert cli_main(["spark", "pipeline", *extra, "--spec", str(proj), "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _sources(lake: Path) -> dict[str, list[dict[str, Any]]]:
    from deltalake import DeltaTable

    return {t: DeltaTable(str(lake / t)).to_pyarrow_table().to_pylist()
            for t in ("orders", "customers")}


def _expected(spark: Any, lake: Path) -> dict[str, Counter[Any]]:
    """The datasets computed by Spark SQL from the sources as they are now."""
    for t, rows in _sources(lake).items():
        spark.createDataFrame(rows).createOrReplaceTempView(f"src_{t}")
    with_ = ("WITH orders AS (SELECT * FROM src_orders), customers AS (SELECT * FROM "
             "src_customers), clean_orders AS (SELECT oid, cust, amount FROM orders WHERE "
             "status <> 'cancelled'), per_customer AS (SELECT cust, sum(amount) AS total, "
             "count(*) AS n FROM clean_orders GROUP BY cust) ")
    queries = {"clean_orders": "SELECT * FROM clean_orders",
               "per_customer": "SELECT * FROM per_customer",
               "report": "SELECT c.region, p.cust, p.total FROM per_customer p JOIN customers c "
                         "ON p.cust = c.cust WHERE p.total > 100"}
    return {k: normalize_rows(spark.sql(with_ + q).collect()) for k, q in queries.items()}


def _got(out: dict[str, Any]) -> dict[str, Counter[Any]]:
    from idivm.spark.delta import delta_rows

    return {d["name"]: normalize_rows(delta_rows(d["location"], d["columns"]))
            for d in out["datasets"]}


def test_run_refresh_recreate(sdp_project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deltalake import DeltaTable

    from idivm.spark.session import spark_session

    proj, lake = sdp_project, sdp_project.parent / "lake"
    dry = _run(proj, capsys, "dry-run")
    assert [(d["name"], d["refresh"]) for d in dry["datasets"]] == \
        [("clean_orders", "create"), ("per_customer", "create"), ("report", "create")]
    assert dry["datasets"][2]["reads"] == ["per_customer"]
    first = _run(proj, capsys, "run", "--strategy", "id")  # (auto may recompute: tiny data)
    assert [d["refresh"] for d in first["datasets"]] == ["create"] * 3
    spark = spark_session(None)
    assert _got(first) == _expected(spark, lake)
    # the user's writers change the sources (delta-rs here): the next run maintains
    DeltaTable(str(lake / "orders")).update(updates={"amount": "amount + 50"},
                                            predicate="oid < 40")
    DeltaTable(str(lake / "orders")).delete(predicate="oid >= 480")
    DeltaTable(str(lake / "customers")).update(updates={"region": "'r9'"}, predicate="cust = 3")
    second = _run(proj, capsys, "run", "--strategy", "id")
    by = {d["name"]: d for d in second["datasets"]}
    assert {n: by[n]["refresh"] for n in DATASETS} == {n: "id" for n in DATASETS}
    assert by["clean_orders"]["changes"]["orders"] == 60
    assert 0 < by["per_customer"]["changes"]["clean_orders"] <= 60  # its input's changes
    assert _got(second) == _expected(spark, lake)
    # a changed query: that dataset (and only what reads it) is re-created
    (proj / "transformations" / "gold" / "gold.sql").write_text(GOLD.replace("> 100", "> 150"))
    dry = _run(proj, capsys, "dry-run")
    assert [(d["name"], d["refresh"]) for d in dry["datasets"]] == \
        [("clean_orders", "refresh"), ("per_customer", "refresh"), ("report", "recreate")]
    third = _run(proj, capsys, "run")
    assert [d["refresh"] for d in third["datasets"]][2] == "recreate"
    want = _expected(spark, lake)
    got = _got(third)
    assert got["report"] == Counter({r: k for r, k in want["report"].items() if r[2] > 150})
    # --full-refresh recomputes each
    full = _run(proj, capsys, "run", "--full-refresh")
    assert all(d["refresh"] in ("recompute", "none") for d in full["datasets"])


def test_refused_before_anything_runs(sdp_project: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    (sdp_project / "transformations" / "py_view.py").write_text("x = 1\n")
    (sdp_project / "transformations" / "stream.sql").write_text(
        "CREATE STREAMING TABLE events AS SELECT * FROM STREAM(orders);")
    dry = _run(sdp_project, capsys, "dry-run")
    reasons = " ".join(r["reason"] for r in dry["refused"])
    assert "Python" in reasons and "STREAMING TABLE" in reasons
    assert cli_main(["spark", "pipeline", "run", "--spec", str(sdp_project)]) != 0
    assert not (sdp_project / "storage").exists()  # nothing was run


def test_same_as_spark_pipelines_run(sdp_project: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The project run by ``spark-pipelines run`` (open-source SDP: every materialized view
    recomputed, written as a parquet table under ``spark-warehouse/``) and by idivm: the same
    rows. SDP reads the sources from parquet snapshots of the Delta tables, declared by one
    more SQL file of its copy of the project."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    exe = shutil.which("spark-pipelines")
    if exe is None:
        pytest.fail("spark-pipelines is missing: pip install 'pyspark[pipelines]'")
    lake = sdp_project.parent / "lake"
    ours = _got(_run(sdp_project, capsys, "run"))
    sdp = tmp_path / "sdp"
    shutil.copytree(sdp_project / "transformations", sdp / "transformations")
    decl = []
    for t, rows in _sources(lake).items():
        (tmp_path / "snap" / t).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "snap" / t / "part-0.parquet")
        decl.append(f"CREATE MATERIALIZED VIEW {t} AS SELECT * FROM "
                    f"parquet.`{tmp_path / 'snap' / t}`;")
    (sdp / "transformations" / "sources.sql").write_text("\n".join(decl))
    (sdp / "spark-pipeline.yml").write_text(
        f"name: shop\nstorage: file://{sdp / 'storage'}\nlibraries:\n  - glob:\n"
        "      include: transformations/**\n")
    done = subprocess.run([exe, "run", "--spec", str(sdp / "spark-pipeline.yml")],
                          cwd=sdp, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in DATASETS:
        table = pq.read_table(sdp / "spark-warehouse" / name)
        cols = list(table.column_names)
        rows = normalize_rows(zip(*(table.column(c).to_pylist() for c in cols), strict=True))
        assert rows == ours[name], name


def test_project_files_read(tmp_path: Path) -> None:
    """Statements split by sqlglot's tokenizer (a semicolon in a string or a comment splits
    nothing), SDP's OR REFRESH accepted, anything but a materialized view refused by name."""
    from idivm.project import plan_run, read_files

    (tmp_path / "a.sql").write_text(
        "-- a comment; with a semicolon\nCREATE OR REFRESH MATERIALIZED VIEW clean AS SELECT "
        "id, g FROM t WHERE note <> 'a;b';\nCREATE MATERIALIZED VIEW per_g AS SELECT g, "
        "count(*) AS n FROM clean GROUP BY g;\nCREATE STREAMING TABLE s AS SELECT * FROM t;\n"
        "CREATE TEMPORARY VIEW tv AS SELECT 1;")
    datasets, refused = read_files([tmp_path / "a.sql"], "spark", root=tmp_path)
    assert [(d.name, d.reads) for d in datasets] == [("clean", ()), ("per_g", ("clean",))]
    assert "'a;b'" in datasets[0].sql
    assert [r.reason.split(":")[0] for r in refused] == ["STREAMING TABLE", "TEMPORARY VIEW"]
    steps = plan_run(datasets, {"clean": "SELECT id, g FROM t WHERE note <> 'a;b'",
                                "per_g": "SELECT 1"})
    assert [(s.name, s.action) for s in steps] == [("clean", "refresh"), ("per_g", "recreate")]
