"""``idivm bench tpch`` at a tiny scale: three queries, one round, every view verified, JSON and
PNG written, the schema dropped; a wrong view fails the run loudly; the multiset comparison."""

from __future__ import annotations

import io
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

from idivm.bench import tpch_bench
from idivm.cli import build_parser


def _schemas(dsn: str, prefix: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,))]


def test_tiny_run_verifies_every_view(pg_dsn: str, tmp_path: Path) -> None:
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[1, 3, 6], rounds=1, dsn=pg_dsn, out=tmp_path,
                        keep=False, schema=schema, console=Console(file=out, width=200))
    assert rc == 0, out.getvalue()
    assert _schemas(pg_dsn, schema) == []
    saved = json.loads((tmp_path / "tpch.json").read_text())
    assert (tmp_path / "tpch.png").stat().st_size > 0
    assert saved["config"]["sf"] == 0.002 and saved["config"]["server"]["version"]
    assert saved["ok"] is True
    assert set(saved["queries"]) == {"1", "3", "6"}
    for q in saved["queries"].values():
        assert q["status"] == "accepted"
        assert q["summary"]["verified"] == "yes", q
        assert q["verified_initial"] == {"id": True, "tuple": True}
        assert q["script_lines"] > 0 and q["plan_s"]["median"] > 0
        assert set(q["create_s"]) == {"id", "tuple"}
        [r] = q["rounds"]
        assert r["verified"] == {"id": True, "tuple": True}
        assert r["id"]["s"] > 0 and r["tuple"]["s"] > 0 and r["recompute_s"] > 0
        assert r["batch"]["rf1 orders"] >= 1 and r["batch"]["rf2 orders"] >= 1
        assert r["id"]["changes"]["lineitem"] > 0
        # where the refresh goes: it read its changes from the logs, at least
        w = q["summary"]["where_time_goes"]
        assert w["read"]["log"] > 0 and w["read_total"] >= w["read"]["log"]
        assert w["must_read"] >= w["changes"] > 0 and w["top"]
    text = out.getvalue()
    assert "Q6" in text and "equalled its recomputation" in text
    assert "where the id refresh goes" in text


def test_rows_read_by_kind_of_relation() -> None:
    before = {"s.lineitem": 10, "s__idivm.q1__store": 5, "s__idivm.log__lineitem": 0}
    after = {"s.lineitem": 10, "s__idivm.q1__store": 9, "s__idivm.log__lineitem": 7,
             "s.orders": 3}
    assert tpch_bench.read_since(before, after) == {
        "stored:q1__store": 4, "log:log__lineitem": 7, "base:orders": 3}


def test_a_wrong_view_fails_loudly(pg_dsn: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored row lost behind idivm's back (after each batch): a mismatch, exit code 1, FAIL
    in the JSON; the schema is dropped anyway."""
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    apply = tpch_bench.apply_batch

    def and_lose_a_row(conn: Any, batch: tpch_bench.Batch) -> float:
        took = apply(conn, batch)
        for (store,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE "
                "'%%\\_\\_store'", (f"{schema}__idivm",)).fetchall():
            conn.execute(sql.SQL("DELETE FROM {t} WHERE ctid = (SELECT min(ctid) FROM {t})")
                         .format(t=sql.Identifier(f"{schema}__idivm", store)))
        return took

    monkeypatch.setattr(tpch_bench, "apply_batch", and_lose_a_row)
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[1], rounds=1, dsn=pg_dsn, out=tmp_path, keep=False,
                        schema=schema, console=Console(file=out, width=200))
    assert rc == 1
    assert _schemas(pg_dsn, schema) == []
    saved = json.loads((tmp_path / "tpch.json").read_text())
    q = saved["queries"]["1"]
    assert saved["ok"] is False and q["summary"]["verified"] == "FAIL"
    assert {m["view"] for m in q["mismatches"]} == {"q1_id", "q1_tuple"}
    assert "differs from the query" in out.getvalue()


def test_compare_multisets_with_fraction_tolerance() -> None:
    third = Decimal(1) / Decimal(3)
    assert tpch_bench.compare([("a", 1, third)], [("a", 1, Decimal("0.3333333333333333"))]
                              )["equal"]
    # a numeric with few decimals is exact: a cent off is a difference
    assert not tpch_bench.compare([("a", Decimal("10.01"))], [("a", Decimal("10.02"))])["equal"]
    assert tpch_bench.compare([("a", Decimal("10.10"))], [("a", Decimal("10.1"))])["equal"]
    # floats near a rounding boundary still pair up
    assert tpch_bench.compare([(1, 0.12345649999999)], [(1, 0.1234565000001)])["equal"]
    assert not tpch_bench.compare([(1, 0.5)], [(1, 0.6)])["equal"]
    # multisets: duplicates count
    r = tpch_bench.compare([("x",), ("x",)], [("x",)])
    assert (r["equal"], r["only_view"], r["only_expected"]) == (False, 1, 0)
    assert tpch_bench.compare([(None, 1.0)], [(None, 1.0)])["equal"]
    assert tpch_bench.compare([], [])["equal"]


def test_batch_sizes_and_cli() -> None:
    sizes = tpch_bench.batch_sizes(150_000)
    assert sizes["rf1 orders"] == sizes["rf2 orders"] == 150
    assert sizes["lineitem updates"] == 300 and min(sizes.values()) >= 1
    assert min(tpch_bench.batch_sizes(10).values()) == 1
    args = build_parser().parse_args(["bench", "tpch", "--sf", "0.01", "--queries", "1", "6",
                                      "--rounds", "2", "--keep"])
    assert (args.sf, args.queries, args.rounds, args.keep, args.out) == (
        0.01, [1, 6], 2, True, "bench_out/tpch")
    assert args.func.__name__ == "cmd_bench_tpch"


def test_a_slow_maintain_is_a_timeout_and_skips_the_rounds(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(tpch_bench, "MAINTAIN_LIMIT_S", 0.001)  # statement_timeout 1 ms
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[6], rounds=3, dsn=pg_dsn, out=tmp_path, keep=False,
                        schema=schema, console=Console(file=out, width=200))
    assert rc == 0, out.getvalue()  # reported, not failed
    assert _schemas(pg_dsn, schema) == []
    q = json.loads((tmp_path / "tpch.json").read_text())["queries"]["6"]
    assert q["summary"]["verified"] == "timeout" and not q["errors"] and not q["mismatches"]
    assert len(q["rounds"]) == 1 and q["skipped_rounds"] == 2
    assert any("cancelled" in t for t in q["timeouts"])
    assert "rounds skipped" in out.getvalue()
