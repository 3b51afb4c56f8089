"""``idivm spark`` and the Spark ``idivm demo``, called in-process on one shared SparkSession."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idivm.cli import main
from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test process's session (``conftest.spark``, which this fixture overrides for the
    module) handed to the CLI through ``idivm.spark.session.SPARK_SESSION``."""
    from idivm.spark import session as session_module

    saved = session_module.SPARK_SESSION
    session_module.SPARK_SESSION = spark
    yield spark
    session_module.SPARK_SESSION = saved


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def paper(tmp_path: Path) -> dict[str, str]:
    """Figure 1's schema, Figure 2's rows as CSV files, V and V' as SQL files."""
    return {
        "ddl": _write(tmp_path / "schema.sql", PAPER_DDL),
        "wh": str(tmp_path / "wh"),
        "devices": _write(tmp_path / "devices.csv",
                          "did,category\nD1,phone\nD2,phone\nD3,tablet\n"),
        "parts": _write(tmp_path / "parts.csv", "price,pid\n10,P1\n20,P2\n"),  # any order
        "devices_parts": _write(tmp_path / "dp.csv", "did,pid\nD1,P1\nD2,P1\nD1,P2\nD3,P2\n"),
        "v": _write(tmp_path / "v.sql", V_SQL),
        "v2": _write(tmp_path / "v2.sql", V_PRIME_SQL),
    }


def _spark(paper: dict[str, str], action: str, *args: str) -> int:
    return main(["spark", action, "--warehouse", paper["wh"], "--ddl", paper["ddl"], *args])


def _read(paper: dict[str, str], view: str, capsys: pytest.CaptureFixture[str]
          ) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert _spark(paper, "read", view, "--json", "--limit", "100") == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return rows


def test_spark_cli_round_trip(spark: Any, paper: dict[str, str], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    for table in ("devices", "parts", "devices_parts"):
        assert _spark(paper, "load", table, "--data", paper[table]) == 0
    assert "loaded devices_parts: 4 rows" in capsys.readouterr().out
    assert _spark(paper, "create-view", "v", "--sql-file", paper["v"],
                  "--changes", "parts=update:price", "--strategy", "id") == 0
    assert _spark(paper, "create-view", "cost", "--sql-file", paper["v2"]) == 0
    assert "created view cost (did, cost)" in capsys.readouterr().out
    assert _read(paper, "cost", capsys) == [{"did": "D1", "cost": 30}, {"did": "D2", "cost": 10}]

    # P1's price 10 -> 11 as a CSV change feed; D3 becomes a phone via a parquet one
    feed = _write(tmp_path / "parts_changes.csv",
                  "pid,price,_change_type\nP1,10,update_preimage\nP1,11,update_postimage\n")
    assert _spark(paper, "apply-changes", "parts", "--data", feed) == 0
    assert "views to maintain: cost, v" in capsys.readouterr().out
    assert _spark(paper, "status", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["tables"]["parts"]["version"] == 1
    assert {r["view"]: r["pending_versions"]["parts"] for r in status["views"]} == \
        {"cost": 1, "v": 1}

    assert _spark(paper, "maintain", "v", "--json") == 0
    stats = json.loads(capsys.readouterr().out)
    assert {t: n for t, n in stats["changes"].items() if n} == {"parts": 1}
    assert stats["partitions_rewritten"]
    assert _read(paper, "v", capsys) == [
        {"did": "D1", "pid": "P1", "price": 11}, {"did": "D1", "pid": "P2", "price": 20},
        {"did": "D2", "pid": "P1", "price": 11}]

    parquet = str(tmp_path / "devices_changes.parquet")
    spark.createDataFrame([("D3", "tablet", "update_preimage"), ("D3", "phone",
                                                                 "update_postimage")],
                          "did string, category string, _change_type string") \
        .write.parquet(parquet)
    assert _spark(paper, "apply-changes", "devices", "--data", parquet) == 0
    # --strategy id: cost refreshes "auto", whose choice rests on a measured recompute time
    assert _spark(paper, "maintain", "cost", "--strategy", "id") == 0
    out = capsys.readouterr().out
    assert "maintenance of cost" in out and "effective changes of devices" in out
    assert _read(paper, "cost", capsys) == [{"did": "D1", "cost": 31}, {"did": "D2", "cost": 11},
                                           {"did": "D3", "cost": 20}]
    assert _spark(paper, "status", "cost") == 0
    assert "none" in capsys.readouterr().out  # nothing pending

    # v was planned for price updates only: the category change is refused, not lost
    assert _spark(paper, "maintain", "v") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "devices" in err, err


def test_spark_cli_errors(spark: Any, paper: dict[str, str], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _spark(paper, "status") == 2
    assert "no idivm warehouse" in capsys.readouterr().err
    assert _spark(paper, "load", "parts", "--data", paper["parts"]) == 0
    capsys.readouterr()
    bad = {
        "upsert.csv": ("pid,price,_change_type\nP1,11,upsert\n", "_change_type must be one of"),
        "color.csv": ("pid,price,color,_change_type\nP1,11,red,insert\n",
                      "unknown column(s) color"),
        "nokey.csv": ("price,_change_type\n11,insert\n", "lacks column(s) pid"),
        "twice.csv": ("pid,price,_change_type\nP9,1,insert\nP9,2,insert\n", "twice"),
    }
    for name, (text, what) in bad.items():
        assert _spark(paper, "apply-changes", "parts", "--data",
                      _write(tmp_path / name, text)) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: change batch for parts") and what in err, err
    assert not (Path(paper["wh"]) / "changes" / "parts").exists()  # nothing was recorded
    assert _spark(paper, "apply-changes", "parts", "--data", str(tmp_path / "nope.csv")) == 2
    assert "no such data file" in capsys.readouterr().err
    assert _spark(paper, "apply-changes", "gadgets", "--data", paper["parts"]) == 2
    assert "gadgets" in capsys.readouterr().err
    assert _spark(paper, "maintain", "nope") == 2
    assert "no idivm view 'nope'" in capsys.readouterr().err
    assert _spark(paper, "create-view", "bad", "--sql-file",
                  _write(tmp_path / "bad.sql", "SELECT pid FROM parts ORDER BY pid")) == 2
    assert "ORDER BY" in capsys.readouterr().err


def test_demo_spark(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for view in ("mentioned_users", "retweeters"):
        assert f"verified: {view} equals its recomputation" in out
    assert "MISMATCH" not in out
    assert "all views equal their recomputation" in out


@pytest.mark.slow  # a benchmark harness run (correctness: the Spark differential suite)
def test_bench_spark_tiny(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark end to end at a tiny size: every round verified, medians reported."""
    out = tmp_path / "bench"
    assert main(["bench", "spark", "--devices-parts", "2000", "--repeat", "2",
                 "--out", str(out)]) == 0
    assert "every maintained view equals its recomputation" in capsys.readouterr().out
    report = json.loads((out / "results.json").read_text())
    assert len(report["rounds"]) == 12 and all(r["verified"] for r in report["rounds"])
    assert [(r["view"], r["batch"], r["rounds"]) for r in report["results"]] == [
        ("V", "a", 2), ("V'", "a", 2), ("V", "b", 2), ("V'", "b", 2), ("V", "c", 2),
        ("V'", "c", 2)]
    # the limit copies were refreshed with just the final changes and equal the views
    assert all(r["limit"]["verified"] for r in report["rounds"])
    assert all(r["limit_seconds"] > 0 and r["id_vs_limit"] > 0 for r in report["results"])
    assert (out / "spark_bench.png").exists()
