"""``idivm bench pg`` at a tiny size: every batch, verified, JSON and PNG written (no timing
asserted); a wrong limit copy fails the run and the schemas are dropped anyway."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import psycopg
import pytest
from rich.console import Console

from idivm.bench import pg_bench
from idivm.cli import build_parser


def _schemas(dsn: str, prefix: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,))]


def test_tiny_run_verifies_every_batch(pg_dsn: str, tmp_path: Path) -> None:
    prefix = f"idivm_test_pgb_{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    result = pg_bench.run([2000], repeat=1, scale=0.005, floor_calls=2, out=tmp_path,
                          dsn=pg_dsn, prefix=prefix, console=Console(file=out, width=200))
    assert _schemas(pg_dsn, prefix) == []
    rounds = result["sizes"][0]["rounds"]
    assert [r["batch"] for r in rounds] == list(pg_bench.BATCHES)
    assert all(r["verified"] for r in rounds)
    for r in rounds:
        for v in r["views"].values():
            assert all(v[f"{c}_s"] > 0 for c in ("id", "tuple", "recompute", "refresh",
                                                 "limit"))
    assert len(result["summary"]) == 2 * len(pg_bench.BATCHES)
    assert {t["met"] for t in result["targets"]} <= {True, False, None}
    assert len(result["targets"]) == 9
    size = result["sizes"][0]
    if size["pg_ivm"] == "measured":  # pg_ivm is installed on this server: its IMMVs verified
        assert all(v["pg_ivm_s"] > 0 for r in rounds for v in r["views"].values())
    else:
        assert size["pg_ivm"].startswith("pg_ivm is not installed"), size["pg_ivm"]
    writer = result["sizes"][0]["writer"]
    assert writer["runs"] and writer["wait_ms"]["median"] > 0
    saved = json.loads((tmp_path / "pg_bench.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    assert (tmp_path / "pg_bench.png").stat().st_size > 0
    md = pg_bench.markdown_table(result)
    assert md.startswith("| links | view | batch |") and md.count("\n| 2k |") == 10
    assert "targets" in out.getvalue() and "equalled its recomputation" in out.getvalue()


def test_a_wrong_limit_copy_fails_loudly(pg_dsn: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"idivm_test_pgb_{uuid.uuid4().hex[:8]}"
    no_update = tuple(x for x in pg_bench.LIMIT_APPLY["v"] if x[0] != "d_upd")
    monkeypatch.setitem(pg_bench.LIMIT_APPLY, "v", no_update)
    with pytest.raises(pg_bench.BenchMismatch, match="lim_v"):
        pg_bench.run([2000], repeat=1, batches=["200"], scale=0.05, floor_calls=1,
                     out=tmp_path, dsn=pg_dsn, prefix=prefix,
                     console=Console(file=io.StringIO()))
    assert _schemas(pg_dsn, prefix) == []
    assert not (tmp_path / "pg_bench.json").exists()


def test_cli_arguments() -> None:
    args = build_parser().parse_args(["bench", "pg", "--sizes", "2000", "5000", "--batches",
                                      "1", "mixed", "--repeat", "2", "--keep"])
    assert (args.links, args.batches, args.repeat, args.keep, args.out) == (
        [2000, 5000], ["1", "mixed"], 2, True, "bench_out/pg")
    assert args.func.__name__ == "cmd_bench_pg"


def test_pickers_hand_out_every_key_before_repeating() -> None:
    p = pg_bench.Picker("P", 200)
    keys = p.take(150) + p.take(50)
    assert sorted(keys) == sorted(f"P{i}" for i in range(200))
    assert pg_bench.batch_sizes(0.005, 200) == {
        "1": 1, "200": 1, "20000": 100, "200x1": 1, "mixed insert": 2, "mixed delete": 2,
        "mixed price": 2, "mixed flip": 1}
