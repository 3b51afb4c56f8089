"""The ``idivm`` command line, called in-process."""

from __future__ import annotations

import io
import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from idivm.cli import main, parse_changes
from idivm.examples import PAPER_DDL, PAPER_INSTANCE, V_PRIME_SQL, V_SQL


@pytest.fixture
def paper_files(tmp_path: Path) -> tuple[Path, Path]:
    ddl = tmp_path / "schema.sql"
    ddl.write_text(PAPER_DDL)
    view = tmp_path / "view.sql"
    view.write_text(V_SQL)
    return ddl, view


def test_parse_changes() -> None:
    assert parse_changes(["parts=update:price", "devices=insert,delete"]) == {
        "parts": ["update:price"], "devices": ["insert", "delete"]}
    assert parse_changes(["parts=update:price,pid,insert"]) == {
        "parts": ["update:price,pid", "insert"]}
    assert parse_changes(None) is None


def test_plan_price_updates_only(paper_files: tuple[Path, Path],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    ddl, view = paper_files
    assert main(["plan", "--ddl", str(ddl), "--view", str(view),
                 "--changes", "parts=update:price"]) == 0
    out = capsys.readouterr().out
    assert "Δ-script for view v" in out
    assert "UPDATE" in out
    # Price updates never need the devices table (the paper's point about i-diffs).
    assert 'FROM "devices"' not in out


@pytest.mark.parametrize("dialect", ["postgres", "spark"])
def test_plan_prints_the_backends_script(tmp_path: Path, dialect: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`idivm plan` prints the Δ-script its dialect's backend runs (scripts_out's, which the
    backends' tests compare): PostgreSQL's each i-diff apart, Spark's merged."""
    ddl, view = tmp_path / "schema.sql", tmp_path / "v_prime.sql"
    ddl.write_text(PAPER_DDL)
    view.write_text(V_PRIME_SQL)
    assert main(["plan", "--ddl", str(ddl), "--view", str(view), "--name", "v_prime",
                 "--dialect", dialect]) == 0
    expected = Path(__file__).resolve().parent.parent / "scripts_out" / \
        f"v_prime.all_changes.{dialect}.sql"
    assert capsys.readouterr().out == expected.read_text().rstrip("\n") + "\n"


def test_plan_explain_and_stdin(paper_files: tuple[Path, Path],
                                capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    ddl, _ = paper_files
    monkeypatch.setattr("sys.stdin", io.StringIO(V_PRIME_SQL))
    assert main(["plan", "--ddl", str(ddl), "--view", "-", "--name", "v2", "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("view v2: did, cost")
    assert "base-table i-diff schemas" in out
    assert "rules fired" in out


def test_plan_spark_dialect(paper_files: tuple[Path, Path],
                            capsys: pytest.CaptureFixture[str]) -> None:
    ddl, view = paper_files
    assert main(["plan", "--ddl", str(ddl), "--view", str(view), "--dialect", "spark",
                 "--changes", "parts=update:price"]) == 0
    assert "(spark)" in capsys.readouterr().out


def test_plan_unsupported_view(paper_files: tuple[Path, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    ddl, _ = paper_files
    view = tmp_path / "outer.sql"
    view.write_text("SELECT d.did, dp.pid FROM devices d LEFT JOIN devices_parts dp "
                    "ON d.did IN (SELECT did FROM devices_parts)")
    assert main(["plan", "--ddl", str(ddl), "--view", str(view)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ")
    assert "LEFT JOIN" in captured.err
    assert "Traceback" not in captured.err


def test_plan_bad_inputs(paper_files: tuple[Path, Path], tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    ddl, view = paper_files
    assert main(["plan", "--ddl", str(tmp_path / "missing.sql"), "--view", str(view)]) == 2
    assert "missing.sql" in capsys.readouterr().err
    assert main(["plan", "--ddl", str(ddl), "--view", str(view), "--changes", "parts"]) == 2
    assert "TABLE=KIND" in capsys.readouterr().err
    assert main(["plan", "--ddl", str(ddl), "--view", str(view),
                 "--changes", "parts=upsert"]) == 2
    assert "upsert" in capsys.readouterr().err


def test_bad_dsn(capsys: pytest.CaptureFixture[str]) -> None:
    dsn = "postgresql://postgres@127.0.0.1:1/postgres"
    assert main(["pg", "status", "--dsn", dsn]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot connect to PostgreSQL")
    assert "127.0.0.1" in err
    assert main(["demo", "--dsn", dsn]) == 2
    assert "cannot connect to PostgreSQL" in capsys.readouterr().err


def test_demo(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--postgres", "--dsn", pg_dsn]) == 0
    out = capsys.readouterr().out
    for label in ("V", "V'", "v_all", "v2_all"):
        assert f"verified: {label} equals its recomputation" in out
    assert "MISMATCH" not in out


def _paper_schema(pg_dsn: str, pg_schema: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """The paper's tables and instance in ``pg_schema``; V′'s SQL in a file; the CLI's
    connection arguments."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        conn.execute(PAPER_DDL)
        conn.execute(PAPER_INSTANCE)
    view = tmp_path / "v2.sql"
    view.write_text(V_PRIME_SQL)
    return view, ["--dsn", pg_dsn, "--schema", pg_schema]


def test_pg_round_trip(pg_dsn: str, pg_schema: str, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    view, base = _paper_schema(pg_dsn, pg_schema, tmp_path)

    assert main(["pg", "create-view", "cost", *base, "--sql-file", str(view),
                 "--changes", "parts=update:price"]) == 0
    assert f"created view {pg_schema}.cost" in capsys.readouterr().out

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {} SET price = 11 WHERE pid = 'P1'").format(
            sql.Identifier(pg_schema, "parts")))
    assert main(["pg", "status", "cost", *base]) == 0
    assert "cost" in capsys.readouterr().out

    assert main(["pg", "maintain", "cost", *base, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["view"] == "cost"
    assert stats["changes"]["parts"] == 1
    assert stats["idiff_rows"]

    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT did, cost FROM {} ORDER BY did").format(
            sql.Identifier(pg_schema, "cost"))).fetchall()
    assert rows == [("D1", 31), ("D2", 11)]

    assert main(["pg", "maintain", "cost", *base]) == 0
    assert "maintenance of cost" in capsys.readouterr().out
    assert main(["pg", "drop-view", "cost", *base]) == 0
    capsys.readouterr()
    assert main(["pg", "status", *base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["pg", "maintain", "cost", *base]) == 2
    assert "no idivm view 'cost'" in capsys.readouterr().err


def test_pg_maintain_every_keeps_one_warm_session(pg_dsn: str, pg_schema: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``maintain --every``: refreshes in one session — its first run over changes cold,
    the next ones warm (the refresh history's ``cold``) — a JSON line each, the view right
    after every one; nothing held open between them (a writer between refreshes)."""
    view, base = _paper_schema(pg_dsn, pg_schema, tmp_path)
    assert main(["pg", "create-view", "cost", *base, "--sql-file", str(view)]) == 0
    capsys.readouterr()
    prices = iter([12, 13, 14])
    naps: list[float] = []

    def writer() -> None:  # an update before the first refresh and between the others
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {} SET price = %s WHERE pid = 'P1'").format(
                sql.Identifier(pg_schema, "parts")), (next(prices),))

    def nap(seconds: float) -> None:
        naps.append(seconds)
        writer()

    writer()
    monkeypatch.setattr("idivm.cli._wait", nap)
    assert main(["pg", "maintain", "cost", *base, "--json", "--every", "0.5",
                 "--times", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x)["changes"]["parts"] for x in lines] == [1, 1, 1]
    assert len(naps) == 2 and all(0 <= x <= 0.5 for x in naps)
    with psycopg.connect(pg_dsn) as conn:
        cold = [r[0] for r in conn.execute(sql.SQL(
            "SELECT cold FROM {} WHERE view = 'cost' AND strategy = 'id' ORDER BY id").format(
                sql.Identifier(f"{pg_schema}__idivm", "refresh_history"))).fetchall()]
        rows = conn.execute(sql.SQL("SELECT did, cost FROM {} ORDER BY did").format(
            sql.Identifier(pg_schema, "cost"))).fetchall()
    assert cold == [True, False, False]
    assert rows == [("D1", 34), ("D2", 14)]

    def interrupted(seconds: float) -> None:  # Ctrl-C between two refreshes
        raise KeyboardInterrupt

    monkeypatch.setattr("idivm.cli._wait", interrupted)
    assert main(["pg", "maintain", "cost", *base, "--json", "--every", "60"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["view"] == "cost"  # one JSON line: the stop is on stderr
    assert "stopped after 1 refresh(es)" in captured.err
    for bad, said in ((["--every", "0"], "--every needs a positive"),
                      (["--times", "2"], "--every needs a positive"),
                      (["--every", "1", "--times", "0"], "--times needs a positive")):
        assert main(["pg", "maintain", "cost", *base, *bad]) == 2
        assert said in capsys.readouterr().err
    assert main(["pg", "status", "cost", *base, "--every", "1"]) == 2
    assert "--every and --times go with maintain" in capsys.readouterr().err


def test_bench_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["bench", "plan", "--repeat", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["repeat"] == 2
    assert len(report["views"]) >= 14
    assert all(v["statements"] > 0 and v["median_ms"] > 0 for v in report["views"])
    assert report["max_median_ms"] == max(v["median_ms"] for v in report["views"])
    assert "max median planning time" in capsys.readouterr().out
