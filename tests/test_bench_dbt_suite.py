"""``idivm bench dbt-suite`` on a miniature of DBToaster's query tree: declarations read
(INCLUDE, comments, FROM FILE clauses, subdirectories), names in their original case, keys
added, each query's status from PostgreSQL's verdict as a view and idivm's."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from idivm.bench import dbt_suite


def _tree(root: Path) -> None:
    q = root / "test" / "queries"
    (q / "simple").mkdir(parents=True)
    (q / "finance").mkdir()
    (q / "simple" / "schema.sql").write_text(
        "CREATE STREAM R(A int, B int)\n  FROM FILE 'r.dat' LINE DELIMITED CSV ();\n")
    (q / "simple" / "two.sql").write_text(
        "/* it's a comment; with a quote */\nINCLUDE 'test/queries/simple/schema.sql';\n"
        "-- a comment\nSELECT r.A, SUM(r.B) FROM R r GROUP BY r.A;\n"
        "SELECT * FROM R r1, R r2 WHERE r1.A = r2.B;\n"
        "SELECT LISTMAX(r.A, 1) AS m FROM R r WHERE r.B > ALL (SELECT q.A FROM R q);\n"
        "SELECT make_me_an_int(r.A) AS m FROM R r;\n")
    (q / "finance" / "vwap.sql").write_text(
        "CREATE STREAM bids(t FLOAT, id INT, broker_id INT, volume FLOAT, price FLOAT)\n"
        "  FROM FILE 'f.csv' LINE DELIMITED orderbook (book := 'bids');\n"
        "SELECT SUM(b1.price * b1.volume) AS vwap FROM bids b1 WHERE 0.25 * "
        "(SELECT SUM(b3.volume) FROM bids b3) > (SELECT SUM(b2.volume) FROM bids b2 "
        "WHERE b2.price > b1.price);\n")
    (q / "simple" / "case01").mkdir()  # a subdirectory, as DBToaster's simple/case01
    (q / "simple" / "case01" / "upper.sql").write_text(
        "CREATE STREAM R(A int, B int)\n  FROM FILE 'r.dat' LINE DELIMITED CSV ();\n"
        "SELECT COUNT(*), SUM(1), SUM(R.A) FROM R;\n"  # PostgreSQL names two columns "sum"
        "SELECT A / 2, B / 3 FROM R WHERE R.A = 1 OR R.B = 2;\n"  # "?column?" twice
        "SELECT R.A AS X, R.B AS x FROM R;\n")  # x twice, as the query names them


def test_suite_counts_and_legitimate_refusals(pg_dsn: str, tmp_path: Path) -> None:
    _tree(tmp_path)
    [f] = [f for f in dbt_suite.load(tmp_path) if f.name == "two"]
    # the names as DBToaster writes them (PostgreSQL folds them), the whole row as the key
    assert "CREATE TABLE R (A int NOT NULL, B int NOT NULL, PRIMARY KEY (A, B))" in f.ddl
    assert len(f.queries) == 4
    [v] = dbt_suite.load(tmp_path, ("finance",))
    assert "PRIMARY KEY (id)" in v.ddl and "double precision" in v.ddl
    summary = dbt_suite.run(tmp_path, pg_dsn, tmp_path / "out", Console(file=None, width=120,
                                                                         quiet=True),
                            verify_accepted=True)
    assert summary["files"] == 3 and summary["queries"] == 8  # schema.sql only declares
    by = {r["query"]: r for r in json.loads(
        (tmp_path / "out" / "dbt_suite.json").read_text())["queries"]}
    assert by["two#1"]["status"] == "accepted"
    assert by["two#2"]["status"] == dbt_suite.NOT_A_VIEW  # r1.A, r2.A, … from the stars
    assert by["two#3"]["status"] == "accepted"  # LISTMAX is GREATEST
    assert by["two#3"]["dialect_rewritten"] == ["LISTMAX"]
    assert by["two#4"]["status"] == dbt_suite.PG_REJECTS  # an external function
    assert by["vwap"]["status"] == "accepted"  # its non-equality correlation: a magic set
    # unnamed columns whose PostgreSQL names repeat are a view once named (idivm names them)
    assert by["case01/upper#1"]["status"] == by["case01/upper#2"]["status"] == "accepted"
    assert "unnamed_columns" in by["case01/upper#1"]
    assert by["case01/upper#3"]["status"] == dbt_suite.NOT_A_VIEW
    assert summary["views"] == 5 and summary["accepted"] == 5
    assert summary["verified"] == {"yes": 5}  # maintained = recomputed, original case


def test_dbtoaster_dialect_is_rewritten_to_the_sql_it_means(pg_dsn: str) -> None:
    import psycopg

    q, applied = dbt_suite.to_postgres(
        "SELECT cast_int(23.5) AS i, cast_int(-2.5) AS j, cast_float('19.2') AS f, "
        "cast_date('1998-12-19') AS d, LISTMAX(1, 3) AS hi, LISTMIN(1, 3) AS lo, "
        "SUBSTRING('13-555', 0, 2) AS cc, 2 IN LIST (1, 2) AS yes, NOT 2 IN LIST (1, 2) AS no")
    assert applied == ("CAST_DATE", "CAST_FLOAT", "CAST_INT", "IN LIST", "LISTMAX", "LISTMIN",
                       "SUBSTRING from 0")
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(q.encode()).fetchone()
    assert row is not None
    assert [str(v) for v in row] == ["23", "-2", "19.2", "1998-12-19", "3", "1", "13", "True",
                                     "False"]
    assert dbt_suite.to_postgres("SELECT COUNT(DISTINCT) FROM R WHERE R.A > 1") == (
        "SELECT COUNT(*) FROM (SELECT DISTINCT * FROM R WHERE R.A > 1) AS d",
        ("COUNT(DISTINCT) of rows",))
    atoi, cos, other = (dbt_suite._external(f"CREATE FUNCTION {f} (x string) RETURNS int AS "
                                            f"EXTERNAL '{c}'")
                        for f, c in (("to_int", "ATOI"), ("c", "cos"), ("mine", "MYLIB_FN")))
    assert atoi is not None and cos is not None and other is not None
    externals = dict([atoi, cos, other])
    q, applied = dbt_suite.to_postgres("SELECT to_int('3') AS i, c(0) AS one", externals)
    assert applied == ("EXTERNAL 'ATOI'", "EXTERNAL 'COS'")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(q.encode()).fetchone() == (3, 1.0)
    # an external idivm does not know stays as written: PostgreSQL rejects it, by its name
    assert dbt_suite.to_postgres("SELECT mine(1) AS m", externals) == ("SELECT mine(1) AS m", ())
    plain = "SELECT r.a FROM r WHERE r.a IN (1, 2)"
    assert dbt_suite.to_postgres(plain) == (plain, ())  # untouched: the suite's own text
