"""``idivm bench tpch`` at a tiny scale: three queries, one round, every view and peer verified,
JSON and PNG written, the schemas dropped; a wrong view fails the run loudly; the multiset
comparison. The peers: ``REFRESH MATERIALIZED VIEW`` always; pg_ivm when the server has it (the
tests that need it skip otherwise — the run without it, the table with its column and the
auto_explain parsing are covered without it)."""

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

from idivm.bench import explain, pgivm, tpch_bench
from idivm.cli import build_parser, main
from idivm.postgres.maintainer import PostgresMaintainer

SAMPLE = Path(__file__).parent / "data" / "auto_explain_notices.json"


def _schemas(dsn: str, prefix: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,))]


def _pg_ivm(dsn: str) -> bool:
    return not pgivm.unavailable(dsn)


def test_tiny_run_verifies_every_view(pg_dsn: str, tmp_path: Path) -> None:
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[1, 3, 6], rounds=1, dsn=pg_dsn, out=tmp_path,
                        keep=False, schema=schema, explain=True, warmup=1,
                        console=Console(file=out, width=260))
    assert rc == 0, out.getvalue()
    assert _schemas(pg_dsn, schema) == []
    saved = json.loads((tmp_path / "tpch.json").read_text())
    assert (tmp_path / "tpch.png").stat().st_size > 0
    assert saved["config"]["sf"] == 0.002 and saved["config"]["server"]["version"]
    # the checkpoints the server started during the run, its WAL settings beside them
    assert saved["config"]["server"]["max_wal_size"]
    assert set(saved["checkpoints"]) == {"requested", "timed"}
    assert all(n >= 0 for n in saved["checkpoints"].values())
    assert (tpch_bench.checkpoint_note(saved) is None) == (saved["checkpoints"]["requested"] == 0)
    assert saved["ok"] is True
    assert set(saved["queries"]) == {"1", "3", "6"}
    # pg_ivm accepts Q1, Q3 and Q6 (GROUP BY, or one row): its IMMVs verified like the views
    ivm = ["pg_ivm"] if _pg_ivm(pg_dsn) else []
    assert bool(ivm) == ("unavailable" not in saved["pg_ivm"])
    for nr, q in saved["queries"].items():
        assert q["status"] == "accepted"
        assert q["summary"]["verified"] == "yes", q
        assert q["verified_initial"] == {"id": True, "tuple": True, "auto": True,
                                         **{c: True for c in ivm}}
        assert q["script_lines"] > 0 and q["plan_s"]["median"] > 0
        assert set(q["create_s"]) == {"id", "tuple", "auto", *ivm}
        assert not q["peer_failures"]
        [r] = q["rounds"]
        assert r["verified"] == {c: True for c in ("id", "tuple", "auto", "refresh", *ivm)}
        # a warm-up round before it: every column maintained and verified, out of the medians
        [w0] = q["warmup"]
        assert w0["verified"] == r["verified"] and w0["id"]["s"] > 0
        assert q["summary"]["id"]["median"] == r["id"]["s"]
        assert q["summary"]["where_time_goes"]["cold_s"] == w0["id"]["s"]
        assert q["summary"]["where_time_goes"]["warm_s"] == r["id"]["s"]
        assert r["auto"]["decision"]["choice"] in ("id", "recompute")
        assert r["id"]["s"] > 0 and r["tuple"]["s"] > 0 and r["recompute_s"] > 0
        assert r["refresh"]["s"] > 0 and r["apply_s"] > 0
        assert r["order"] == tpch_bench.round_order(0, list(tpch_bench.COLUMNS))
        assert r["order"][:3] == ["recompute", "id", "auto"]  # a full read first
        s = q["summary"]
        assert s["apply_id"]["median"] == pytest.approx(r["apply_s"] + r["id"]["s"])
        assert s["tuple_over_id"] == pytest.approx(r["tuple"]["s"] / r["id"]["s"])
        assert s["refresh"]["median"] == r["refresh"]["s"]
        if ivm:
            assert q["pg_ivm"]["status"] == "accepted" and q["pg_ivm"]["indexed"]
            assert s["pg_ivm_over_apply_id"] == pytest.approx(
                r["pg_ivm"]["s"] / (r["apply_s"] + r["id"]["s"]))
        else:
            assert "pg_ivm" not in r and s["pg_ivm_over_apply_id"] is None
        # one more batch, the id maintain under auto_explain: every statement's plan
        x = q["explain"]
        assert x["verified"] == {"id": True} and x["changes"]
        assert len(x["statements"]) > 5 and 0 < len(x["top"]) <= tpch_bench.EXPLAIN_TOP
        assert all(not st["wraps"] for st in x["top"])
        assert any(st["sql"].startswith("INSERT INTO") and st["depth"] >= 2
                   for st in x["statements"])
        assert sum(st["shared_hit"] + st["local_hit"] for st in x["statements"]) > 0
        assert r["batch"]["rf1 orders"] >= 1 and r["batch"]["rf2 orders"] >= 1
        # Q6's few line items of a year and a discount band: a tiny batch may have none
        assert r["id"]["log_rows"]["lineitem"] > 0 or nr == "6"
        # where the refresh goes: it read its changes from the logs, at least
        w = q["summary"]["where_time_goes"]
        assert w["read_total"] >= w["read"]["log"] >= w["changes"]
        assert w["must_read"] >= w["changes"]
        assert (w["changes"] > 0 and w["top"]) or nr == "6"
    if ivm:
        assert saved["pg_ivm"]["version"] and saved["pg_ivm"]["copy_differs"] == []
    text = out.getvalue()
    assert "Q6" in text and "equalled its recomputation" in text
    assert "where the id refresh goes" in text and "slowest statements (auto_explain" in text
    assert "pg_ivm ÷ (apply+id)" in text


def test_every_timed_maintain_starts_just_after_a_statistics_flush(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session flushes its statistics when it goes idle a second or more after its last
    flush, and the client waits for it: each timed maintain (tuple, id, auto) starts after
    the same steps — a flush, then the count of the rows read so far — so none pays for a
    flush and the columns compare alike (the count was the id column's alone, and a
    maintain started a few ms after its flush took 0.1–0.4 ms more at SF 0.1 than one started
    right after it). Each records its rows read."""
    events: list[str] = []
    flush, maintain = tpch_bench.QueryRun.flush_statistics, PostgresMaintainer.maintain

    def flushed(self: tpch_bench.QueryRun) -> None:
        flush(self)
        events.append("flush")

    def maintained(self: PostgresMaintainer, name: str, *a: Any, **k: Any) -> Any:
        events.append(f"maintain {name}")
        return maintain(self, name, *a, **k)

    monkeypatch.setattr(tpch_bench.QueryRun, "flush_statistics", flushed)
    monkeypatch.setattr(PostgresMaintainer, "maintain", maintained)
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    rc = tpch_bench.run(sf=0.002, queries=[6], rounds=2, dsn=pg_dsn, out=tmp_path, warmup=0,
                        schema=schema, console=Console(file=io.StringIO(), width=200))
    assert rc == 0
    timed = [i for i, e in enumerate(events) if e.startswith("maintain")]
    assert sorted(events[i] for i in timed) == sorted(
        f"maintain q6_{c}" for c in ("tuple", "id", "auto") for _ in range(2))
    assert all(events[i - 1] == "flush" for i in timed), events
    saved = json.loads((tmp_path / "tpch.json").read_text())
    for r in saved["queries"]["6"]["rounds"]:
        assert all(isinstance(r[c]["rows_read"], dict) for c in ("tuple", "id", "auto"))


def test_without_pg_ivm_the_run_says_so(pg_dsn: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a server without pg_ivm (CI): no copy schema, no column, said why; the
    materialized view is still refreshed and verified."""
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(pgivm, "unavailable", lambda dsn: "pg_ivm is not installed (test)")
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[6], rounds=2, dsn=pg_dsn, out=tmp_path, warmup=0,
                        keep=False, schema=schema, console=Console(file=out, width=260))
    assert rc == 0, out.getvalue()
    assert _schemas(pg_dsn, schema) == []
    saved = json.loads((tmp_path / "tpch.json").read_text())
    assert saved["pg_ivm"] == {"unavailable": "pg_ivm is not installed (test)"}
    q = saved["queries"]["6"]
    assert "pg_ivm" not in q and "explain" not in q
    assert [r["verified"] for r in q["rounds"]] == [{"id": True, "tuple": True, "auto": True,
                                                      "refresh": True}] * 2
    # the batch's rows read first by a slow column, id and auto next, their order alternating
    assert q["rounds"][1]["order"] == ["tuple", "auto", "id", "refresh", "recompute", "pg_ivm"]
    assert q["summary"]["refresh"] and q["summary"]["pg_ivm"] is None
    assert "no pg_ivm column: pg_ivm is not installed (test)" in out.getvalue()


@pytest.mark.slow  # a benchmark harness run with its pg_ivm peer (correctness: the suites)
def test_pg_ivm_refusals_and_a_failed_batch(pg_dsn: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """pg_ivm refuses Q2 (a scalar subquery): its message recorded, no column; Q6's IMMV
    verified each round; a batch that fails on pg_ivm's copy (round 2) takes pg_ivm out of the
    query's rounds and the copy gets the batch without the IMMV: it stays equal."""
    if not _pg_ivm(pg_dsn):
        pytest.skip("pg_ivm is not installed on the server (scripts/install_pg_ivm.sh)")
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    orphans = "SELECT count(*) FROM pgivm.pg_ivm_immv i WHERE NOT EXISTS (SELECT FROM pg_class c " \
              "WHERE c.oid = i.immvrelid)"
    with psycopg.connect(pg_dsn) as conn:
        before = conn.execute(orphans).fetchone()
    apply = tpch_bench.PgIvmPeer.apply
    calls: list[bool] = []

    def fail_second_timed(self: tpch_bench.PgIvmPeer, batch: tpch_bench.Batch,
                          timed: bool = False) -> float:
        calls.append(timed)
        if timed and calls.count(True) == 2:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return apply(self, batch, timed)

    monkeypatch.setattr(tpch_bench.PgIvmPeer, "apply", fail_second_timed)
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[2, 6], rounds=3, dsn=pg_dsn, out=tmp_path, warmup=0,
                        keep=False, schema=schema, console=Console(file=out, width=260))
    assert rc == 0, out.getvalue()
    assert _schemas(pg_dsn, schema) == []
    saved = json.loads((tmp_path / "tpch.json").read_text())
    assert saved["pg_ivm"]["copy_differs"] == [] and saved["ok"] is True
    q2, q6 = saved["queries"]["2"], saved["queries"]["6"]
    assert q2["pg_ivm"]["status"] == "refused"
    assert "sublink" in q2["pg_ivm"]["message"]
    assert all("pg_ivm" not in r for r in q2["rounds"])
    assert q2["summary"]["verified"] == "yes"
    assert [("pg_ivm" in r, r["verified"].get("pg_ivm")) for r in q6["rounds"]] == [
        (True, True), (False, None), (False, None)]
    assert q6["summary"]["verified"] == "yes" and len(q6["rounds"]) == 3
    [failure] = q6["peer_failures"]
    assert failure.startswith("round 2 pg_ivm: cancelled")
    assert "pg_ivm_copy_s" in q6["rounds"][2]  # round 3: the copy follows, untimed
    text = out.getvalue()
    assert "Q2 pg_ivm refused" in text and "peer left out" in text
    with psycopg.connect(pg_dsn) as conn:  # pg_ivm forgot the IMMVs dropped with the copy
        assert conn.execute(orphans).fetchone() == before


def test_parse_auto_explain_notices() -> None:
    """A saved sample of the notices of an id maintain of Q3 under auto_explain (SF 0.002): the
    client's statement, the compiled function's statements (depth 2: called from the
    ``maintain`` procedure in an assignment, so nothing wraps them), the prune function called
    by a statement (which wraps the two statements of ``prune_log`` it ran), and a notice that
    is no plan."""
    notices = [(str(m), c) for m, c in json.loads(SAMPLE.read_text())]
    st = explain.parse_notices(notices)
    assert len(st) == len(notices) - 1
    first = st[0]
    assert (first.sql, first.depth, first.function, first.line) == (
        "SELECT set_config($1, '', false)", 0, None, None)
    fold = st[2]
    assert fold.sql.startswith('INSERT INTO "__iv1_4701a2_c1" SELECT') and len(fold.sql) == 200
    assert (fold.depth, fold.function, fold.line, fold.wraps) == (2, "maintain__1_4701a2", 111, 0)
    assert (fold.ms, fold.rows, fold.shared_hit, fold.local_hit) == (0.151, 36, 2, 36)
    assert fold.costliest == explain.PlanNode("WindowAgg", None, None, 42, 0.04)
    probe = st[1]
    assert probe.costliest is not None and (probe.costliest.relation, probe.costliest.index) == (
        "log_users", "log_users_pkey")
    # after the function's statements, the procedure's own next statement wraps none of them
    assert [(s.function, s.wraps) for s in st[4:]] == [
        ("h2_cap__idivm.maintain", 0), ("h2_cap__idivm.prune_log", 0),
        ("h2_cap__idivm.prune_log", 0), ("prune__1_4701a2", 2), ("h2_cap__idivm.maintain", 3)]
    top = explain.top(st, 3)
    assert [s.ms for s in top] == [0.438, 0.151, 0.014]  # wrappers (0.552, 0.257) left out
    assert explain.parse_notice("duration: 1.0 ms  plan:\n{not json") is None
    assert explain.parse_notice("some other notice") is None


def test_costliest_node_of_a_cte_is_inside_it() -> None:
    """A CTE's plan (an InitPlan) runs as its scan pulls rows: its time is the scan's, not
    beside it — the costliest node of a fold is its grouping, not ``CTE Scan on __idivm_k``."""
    plan = {"Node Type": "Append", "Actual Total Time": 10.0, "Actual Loops": 1,
            "Actual Rows": 5, "Plans": [
                {"Node Type": "HashAggregate", "Subplan Name": "CTE k",
                 "Parent Relationship": "InitPlan", "Actual Total Time": 7.0,
                 "Actual Loops": 1, "Actual Rows": 100, "Plans": [
                     {"Node Type": "Seq Scan", "Relation Name": "log", "Actual Total Time": 2.0,
                      "Actual Loops": 1, "Actual Rows": 200}]},
                {"Node Type": "CTE Scan", "CTE Name": "k", "Parent Relationship": "Member",
                 "Actual Total Time": 8.0, "Actual Loops": 1, "Actual Rows": 4},
                {"Node Type": "CTE Scan", "CTE Name": "k", "Parent Relationship": "Member",
                 "Actual Total Time": 1.5, "Actual Loops": 1, "Actual Rows": 1}]}
    # self times: append 0.5, grouping 5.0, its scan 2.0, the CTE scans 1.0 and 1.5
    assert explain.costliest(plan) == explain.PlanNode("HashAggregate", None, None, 100, 5.0)


def test_a_counted_prepared_statement_is_reported_as_its_insert() -> None:
    """A Δ-script statement run as a prepared statement (its INSERT in a CTE, its rows
    counted): reported with the INSERT's text, the rows it wrote and its costliest node."""
    from idivm.postgres.compile import PREPARED_PREFIX, prepared_text

    text = prepared_text(PREPARED_PREFIX + "0123456789abcdef" * 2, "INSERT INTO t SELECT x FROM d")
    plan = {"Node Type": "Aggregate", "Actual Total Time": 4.0, "Actual Loops": 1,
            "Actual Rows": 1, "Plans": [
                {"Node Type": "ModifyTable", "Operation": "Insert", "Relation Name": "t",
                 "Subplan Name": "CTE idivm__w", "Parent Relationship": "InitPlan",
                 "Actual Total Time": 3.5, "Actual Loops": 1, "Actual Rows": 7, "Plans": [
                     {"Node Type": "Seq Scan", "Relation Name": "d", "Parent Relationship":
                      "Outer", "Actual Total Time": 1.0, "Actual Loops": 1, "Actual Rows": 7}]},
                {"Node Type": "CTE Scan", "CTE Name": "idivm__w", "Parent Relationship": "Outer",
                 "Actual Total Time": 3.8, "Actual Loops": 1, "Actual Rows": 7}]}
    s = explain.parse_notice("duration: 4.100 ms  plan:\n" + json.dumps(
        {"Query Text": text, "Plan": plan}))
    assert s is not None
    assert (s.sql, s.rows) == ("INSERT INTO t SELECT x FROM d", 7)
    assert s.costliest == explain.PlanNode("ModifyTable Insert", "t", None, 7, 2.5)


def test_costliest_node_takes_the_children_out() -> None:
    plan = {"Node Type": "ModifyTable", "Operation": "Update", "Relation Name": "v",
            "Actual Total Time": 5.0, "Actual Loops": 1, "Actual Rows": 0, "Plans": [
                {"Node Type": "Nested Loop", "Parent Relationship": "Outer",
                 "Actual Total Time": 4.0, "Actual Loops": 1, "Actual Rows": 10, "Plans": [
                     {"Node Type": "Seq Scan", "Relation Name": "d", "Actual Total Time": 0.5,
                      "Actual Loops": 1, "Actual Rows": 10},
                     {"Node Type": "Index Scan", "Relation Name": "v", "Index Name": "v_pkey",
                      "Actual Total Time": 0.3, "Actual Loops": 10, "Actual Rows": 1}]}]}
    # self times: update 1.0, loop 0.5, seq scan 0.5, index scan 3.0 (10 loops of 0.3)
    assert explain.costliest(plan) == explain.PlanNode("Index Scan", "v", "v_pkey", 10, 3.0)
    msg = "duration: 5.100 ms  plan:\n" + json.dumps({"Query Text": "UPDATE v  SET x = 1",
                                                      "Plan": plan})
    s = explain.parse_notice(msg, 'SQL statement "UPDATE v SET x = 1"\nPL/pgSQL function '
                             's__idivm.maintain__3_ab(jsonb) line 7 at SQL statement')
    assert s is not None
    assert (s.sql, s.ms, s.rows, s.function, s.line, s.depth) == (
        "UPDATE v SET x = 1", 5.1, 10, "s__idivm.maintain__3_ab", 7, 1)


def test_captured_explains_nested_statements_and_restores_the_settings(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        with explain.captured(conn) as cap:
            conn.execute("DO $$ BEGIN PERFORM count(*) FROM generate_series(1, 10); END $$")
        assert [(s.function, s.depth, s.rows) for s in cap.statements] == [
            ("inline_code_block", 1, 1)]
        assert "generate_series(1, 10)" in cap.statements[0].sql
        assert cap.statements[0].costliest is not None
        assert conn.execute("SHOW auto_explain.log_min_duration").fetchone() == ("-1",)
        assert conn.execute("SHOW client_min_messages").fetchone() == ("warning",)
        conn.execute("SELECT 1")  # not captured any more
        assert len(cap.notices) == 1


def _fake_query(pg_ivm: dict[str, Any] | None, with_ivm: bool) -> dict[str, Any]:
    rounds = [{"round": k + 1, "apply_s": 0.010, "id": {"s": 0.020 + k / 1000},
               "tuple": {"s": 0.080}, "auto": {"s": 0.021}, "recompute_s": 0.300,
               "refresh": {"s": 0.250},
               "verified": {"id": True, "tuple": True, "auto": True, "refresh": True}}
              for k in range(2)]
    for r in rounds:
        if with_ivm:
            r["pg_ivm"] = {"s": 0.060}
            r["verified"]["pg_ivm"] = True
    q: dict[str, Any] = {"status": "accepted", "plan_s": {"median": 0.1}, "script_lines": 100,
                         "create_s": {"id": 0.5, "tuple": 0.6}, "rounds": rounds, "errors": [],
                         "timeouts": [], "mismatches": [], "peer_failures": []}
    if pg_ivm is not None:
        q["pg_ivm"] = pg_ivm
    q["summary"] = tpch_bench.summarize(q)
    return q


def test_summary_table_and_plot_with_every_column(tmp_path: Path) -> None:
    """The table, ratios and plot from a result holding pg_ivm figures (no server needed)."""
    q1 = _fake_query({"status": "accepted", "immv": "q1_ivm", "create_s": 0.1,
                      "notices": ["could not create an index on immv \"q1_ivm\" "
                                  "automatically"], "indexed": False}, with_ivm=True)
    q2 = _fake_query({"status": "refused", "error": "FeatureNotSupported",
                      "message": "HAVING clause is not supported"}, with_ivm=False)
    s = q1["summary"]
    assert s["apply_id"]["median"] == pytest.approx(0.0305)
    assert s["speedup"] == pytest.approx(0.3 / 0.0205)
    assert s["tuple_over_id"] == pytest.approx(0.08 / 0.0205)
    assert s["auto_over_best"] == pytest.approx(0.021 / 0.0205)
    assert s["pg_ivm_over_apply_id"] == pytest.approx(0.06 / 0.0305)
    assert s["apply_id_over_pg_ivm"] == pytest.approx(0.0305 / 0.06)
    # the paired ratios: within each round, then their median and spread
    pr = s["paired"]
    assert pr["speedup"]["min"] == pytest.approx(0.3 / 0.021)
    assert pr["speedup"]["max"] == pytest.approx(0.3 / 0.020)
    assert pr["auto_over_best"]["median"] == pytest.approx(
        (0.021 / 0.020 + 0.021 / 0.021) / 2)
    assert pr["pg_ivm_over_apply_id"]["min"] == pytest.approx(0.06 / 0.031)
    assert s["verified"] == "yes" and q2["summary"]["pg_ivm"] is None
    assert q2["summary"]["paired"]["pg_ivm_over_apply_id"] is None
    result = {"config": {"sf": 0.01, "rounds": 2, "batch_sizes": {"rf1 orders": 15}},
              "queries": {"1": q1, "2": q2}, "pg_ivm": {"schema": "s_pgivm", "version": "1.15",
                                                        "copy_s": 0.5, "copy_differs": []},
              "setup": {"generate_s": 1.0, "copy_s": 1.0, "analyze_s": 1.0, "rows": {}},
              "ok": True, "total_s": 3.0}
    out = io.StringIO()
    tpch_bench.print_result(Console(file=out, width=250), result)
    text = out.getvalue()
    assert "pg_ivm ÷ (apply+id)" in text and "1.97×" in text and "refused" in text
    assert "Q2 pg_ivm refused: HAVING clause is not supported" in text
    assert "Q1 pg_ivm could not index its IMMV" in text
    assert "IMMVs of Q1" in text
    tpch_bench.plot(Console(file=io.StringIO()), result, tmp_path / "tpch.png")
    assert (tmp_path / "tpch.png").stat().st_size > 0


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
                        warmup=0,
                        schema=schema, console=Console(file=out, width=260))
    assert rc == 1
    assert _schemas(pg_dsn, schema) == []
    saved = json.loads((tmp_path / "tpch.json").read_text())
    q = saved["queries"]["1"]
    assert saved["ok"] is False and q["summary"]["verified"] == "FAIL"
    # (auto's too when it ran the Δ-script, not when it recomputed the view)
    assert {"q1_id", "q1_tuple"} <= {m["view"] for m in q["mismatches"]} <= {
        "q1_id", "q1_tuple", "q1_auto"}
    assert "differs from the query" in out.getvalue()


def test_checkpoints_for_wal_volume_are_reported() -> None:
    """Checkpoints started for WAL volume during a run are said next to its tables, with the
    setting that caused them and how to raise it; none, nothing said."""
    result: dict[str, Any] = {"config": {"server": {"max_wal_size": "1GB"}},
                              "checkpoints": {"requested": 0, "timed": 3}}
    assert tpch_bench.checkpoint_note(result) is None
    result["checkpoints"]["requested"] = 164
    note = tpch_bench.checkpoint_note(result)
    assert note is not None and "164 checkpoint(s)" in note and "max_wal_size 1GB" in note
    assert "ALTER SYSTEM SET max_wal_size" in note


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
    assert (args.sf, args.queries, args.rounds, args.keep, args.out, args.explain) == (
        0.01, [1, 6], 2, True, "bench_out/tpch", False)
    assert build_parser().parse_args(["bench", "tpch", "--explain"]).explain is True
    assert args.warmup == 2
    assert build_parser().parse_args(["bench", "tpch", "--warmup", "0"]).warmup == 0
    assert main(["bench", "tpch", "--warmup", "-1"]) == 2
    assert args.func.__name__ == "cmd_bench_tpch"


def test_a_slow_maintain_is_a_timeout_and_skips_the_rounds(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(tpch_bench, "MAINTAIN_LIMIT_S", 0.001)  # statement_timeout 1 ms
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[6], rounds=3, dsn=pg_dsn, out=tmp_path, warmup=0,
                        keep=False,
                        schema=schema, console=Console(file=out, width=260))
    assert rc == 0, out.getvalue()  # reported, not failed
    assert _schemas(pg_dsn, schema) == []
    q = json.loads((tmp_path / "tpch.json").read_text())["queries"]["6"]
    assert q["summary"]["verified"] == "timeout" and not q["errors"] and not q["mismatches"]
    assert len(q["rounds"]) == 1 and q["skipped_rounds"] == 2
    assert any("cancelled" in t for t in q["timeouts"])
    assert "rounds skipped" in out.getvalue()


def test_a_column_that_times_out_leaves_and_the_others_go_on(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A maintain cancelled by its statement_timeout takes its column out of the query's later
    rounds; the other columns keep their rounds (Q21's tuple maintain, cancelled at 60 s, had
    ended its rounds after the first: its id figure was one cold refresh)."""
    schema = f"idivm_test_tpch_{uuid.uuid4().hex[:8]}"
    maintain = PostgresMaintainer.maintain

    def tuple_times_out(self: PostgresMaintainer, name: str, *a: Any, **k: Any) -> Any:
        if name.endswith("_tuple"):
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return maintain(self, name, *a, **k)

    monkeypatch.setattr(PostgresMaintainer, "maintain", tuple_times_out)
    out = io.StringIO()
    rc = tpch_bench.run(sf=0.002, queries=[6], rounds=3, dsn=pg_dsn, out=tmp_path, warmup=1,
                        keep=False, schema=schema, console=Console(file=out, width=260))
    assert rc == 0, out.getvalue()  # reported, not failed
    q = json.loads((tmp_path / "tpch.json").read_text())["queries"]["6"]
    assert "skipped_rounds" not in q and len(q["rounds"]) == 3
    rounds = [*q["warmup"], *q["rounds"]]
    ivm = ["pg_ivm"] if _pg_ivm(pg_dsn) else []
    assert all(r["verified"] == {c: True for c in ("id", "auto", "refresh", *ivm)}
               for r in rounds)
    assert [t.split(":")[0] for t in q["timeouts"]] == ["warm-up 1 maintain tuple"]
    assert q["summary"]["verified"] == "timeout" and q["summary"]["tuple"] is None
    assert q["summary"]["id"]["median"] > 0


def test_paired_ratios_cancel_what_moves_both_sides() -> None:
    """A round whose batch made every column twice as slow moves the ratios of the medians
    but not the paired ones; ``auto`` is compared with recompute where recompute is the
    better over the run, in every round, not with the faster of the two round by round."""
    rounds = [{"apply_s": 0.1 * f, "recompute_s": 0.010 * f, "id": {"s": 0.020 * f},
               "auto": {"s": 0.011 * f}, "tuple": {"s": 0.040 * f}}
              for f in (1.0, 2.0, 2.0)]
    pr = tpch_bench.paired_ratios(rounds, "recompute")
    assert pr["speedup"] == {"median": 0.5, "min": 0.5, "max": 0.5}
    assert pr["tuple_over_id"]["median"] == pytest.approx(2.0)
    assert pr["auto_over_best"]["median"] == pytest.approx(1.1)
    assert pr["pg_ivm_over_apply_id"] is None  # no pg_ivm column
    # a round without a column leaves it out of that ratio only
    rounds.append({"apply_s": 0.1, "recompute_s": 0.010, "id": {"s": 0.005}})
    pr = tpch_bench.paired_ratios(rounds, "id")
    assert pr["speedup"]["max"] == pytest.approx(2.0)
    assert pr["auto_over_best"]["median"] == pytest.approx(0.55)
