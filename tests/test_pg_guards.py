"""One-time guards in the compiled code's EXECUTEd statements: a SELECT that inner-joins a
derived table or CTE over scratch relations also tests their row counts (TRUE or FALSE at run
time), so PostgreSQL drops the join when the i-diffs are empty (TPC-H Q20: 134 → 56 ms for a
refresh whose nation i-diffs were empty but whose plan computed the other side first); and a
statement over scratch relations only is planned without nested loops."""

from __future__ import annotations

import re
from collections import Counter

import psycopg
import sqlglot
from psycopg import sql as pgsql
from sqlglot import exp

from idivm.examples import V_PRIME_SQL
from idivm.postgres import PostgresMaintainer
from idivm.postgres.changelog import lit
from idivm.postgres.compile import (
    Cut,
    Relation,
    _analyze,
    cut_unions,
    fingerprint_source,
    one_time_guards,
)
from tests.test_pg_plan_shape import load

COUNTERS = {"d1": "n1", "d2": "n2"}


def guarded(sql: str) -> str:
    return one_time_guards(sqlglot.parse_one(sql, read="postgres"), COUNTERS).sql("postgres")


def test_a_join_with_a_union_of_idiffs_tests_them_as_a_whole() -> None:
    out = guarded("WITH c AS (SELECT x FROM d2) SELECT b.x FROM big AS b JOIN "
                  "(SELECT x FROM d1 UNION SELECT x FROM c) AS u ON u.x = b.x")
    assert out.endswith("ON u.x = b.x WHERE (n1 > 0 OR n2 > 0)"), out
    assert "FROM d2 WHERE" not in out  # not inside the CTE: its readers carry the test


def test_what_an_empty_idiff_does_not_empty_is_left_alone() -> None:
    for sql in ("SELECT b.x FROM big AS b LEFT JOIN (SELECT x FROM d1) AS a ON a.x = b.x",
                "SELECT u.x FROM (SELECT x FROM d1 UNION SELECT x FROM big) AS u",
                "SELECT count(*) FROM (SELECT x FROM d1) AS a",
                "SELECT a.x FROM d1 AS a JOIN big AS b ON a.x = b.x"):  # a scan of it is free
        assert "n1 > 0" not in guarded(sql), sql


def test_statements_over_scratch_relations_only_are_hashed(pg_dsn: str, pg_schema: str
                                                           ) -> None:
    """A statement joining only scratch relations (no index on any), and each fold of a log,
    runs with nested loops off, and the setting is put back for the statements after it
    (TPC-H Q9: a chain of anti-joins estimated at one row made a nested loop rescan a 6k-row
    i-diff 237 times; Q8's fold with a second view's rows in the log: 12 s)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        load(conn, pg_schema, 2_000)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("v_prime", V_PRIME_SQL)
            source = "\n".join(str(r[0]) for r in conn.execute(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON "
                "n.oid = p.pronamespace WHERE nspname = %s AND proname LIKE 'maintain\\_\\_%%'",
                (f"{pg_schema}__idivm",)))
            wrapped = re.findall(
                r"'enable_nestloop', 'off', true\);\n\s*((?:idivm__sql := ')?INSERT INTO .*)",
                source)
            assert wrapped and source.count("idivm__nestloop, true)") == len(wrapped)
            # and every fold of a log (its pending rows are estimated at one): its grouping
            # by key, and the fold of the keys logged more often (changelog.KeyFold)
            folds = [s for s in wrapped if 'AS "__idivm_k"' in s]
            assert len(folds) == source.count('AS "__idivm_k"') == 3
            again = [s for s in wrapped if 'AS "__idivm_fold"' in s]
            assert len(again) == source.count('AS "__idivm_fold"') == 3
            # those with merge joins off too (a merge join sorted every pending log row)
            assert source.count("'enable_mergejoin', 'off', true);") == 3
            assert source.count("idivm__mergejoin, true)") == 3
            assert all(f'"{pg_schema}"' not in s and '"v_prime' not in s for s in wrapped)
            conn.execute("UPDATE devices SET category = 'phone' WHERE did IN ('D3', 'D4')")
            conn.execute("DELETE FROM devices_parts WHERE did = 'D5'")
            conn.execute("UPDATE parts SET price = price + 1 WHERE pid IN ('P7', 'P8')")
            m.conn.execute("SET enable_nestloop = on")
            stats = m.maintain("v_prime")
            assert m.conn.execute("SHOW enable_nestloop").fetchone() == ("on",)
            # the row counts read after a statement are its own, not the setting's
            assert stats.changes["parts"] == 2 and stats.changes["devices_parts"] > 1
            got = Counter(tuple(r) for r in conn.execute(
                pgsql.SQL("SELECT * FROM {}").format(pgsql.Identifier(pg_schema, "v_prime"))))
            assert got == Counter(tuple(r) for r in conn.execute(V_PRIME_SQL))


def _cut(sql: str, types: dict[str, dict[str, str]]) -> tuple[str, list[Cut]]:
    """``cut_unions`` over ``sql`` with marks ``idivm__t<k>__`` (EXISTS over relation k) and
    ``idivm__nz<k>__ > 0`` both needing ``n<k> > 0``."""
    def needs(e: exp.Expr) -> str | None:
        name = e.this.name if isinstance(e, exp.GT) else e.name \
            if isinstance(e, exp.Column) else ""
        k = re.fullmatch(r"idivm__(?:t|nz)(\d+)__", name)
        return f"n{k.group(1)} > 0" if k else None

    cuts: list[Cut] = []
    typed = {t: {c: exp.DataType.build(v) for c, v in cols.items()}
             for t, cols in types.items()}
    out = cut_unions(sqlglot.parse_one(sql, read="postgres"), needs, cuts, typed)
    return out.sql("postgres"), cuts


UNION = ("INSERT INTO t SELECT u.x * 2 AS x FROM (SELECT a.x FROM big AS a WHERE idivm__t0__ "
         "UNION SELECT b.{col} FROM big AS b WHERE idivm__nz1__ > 0 AND b.x > 1 "
         "UNION SELECT c.x FROM big AS c) AS u")


def test_a_union_is_filled_at_run_time_with_the_branches_that_may_have_rows(
        pg_dsn: str) -> None:
    """The branches of a union an EXECUTEd statement reads are left out of its text when an
    i-diff they need is empty, rather than planned under a FALSE (TPC-H Q8: 121 → 45 ms)."""
    out, cuts = _cut(UNION.format(col="x"), {"big": {"x": "int", "y": "numeric"}})
    assert out == "INSERT INTO t SELECT u.x * 2 AS x FROM (idivm__union0__) AS u", out
    [cut] = cuts
    assert [c for c, _ in cut.branches] == ["(n0 > 0)", "(n1 > 0)", None]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        got: list[str] = []
        conn.add_notice_handler(lambda d: got.append(d.message_primary or ""))
        for n0, n1 in ((0, 5), (0, 0), (3, 3)):
            conn.execute(f"DO $$ DECLARE idivm__sql text := {lit(out)}; n0 int := {n0}; "
                         f"n1 int := {n1}; BEGIN {cut.fill()} RAISE NOTICE '%', idivm__sql; "
                         "END $$")
    assert [s.count(" UNION ") + 1 for s in got] == [2, 1, 3]
    assert "FROM big AS a" not in got[0] and "FROM big AS b" in got[0]


def test_a_union_whose_branches_differ_in_type_is_left_whole() -> None:
    """Without the numeric branch the union would be integer (u.x * 2 typed otherwise), and
    a bare NULL would be text alone: such unions stay whole, FALSE where i-diffs are empty."""
    types = {"big": {"x": "int", "y": "numeric"}}
    for sql in (UNION.format(col="y"), UNION.replace("SELECT c.x", "SELECT NULL AS x")):
        out, cuts = _cut(sql.format(col="x"), types)
        assert not cuts and "idivm__union" not in out, out


def test_a_scratch_relation_is_analyzed_when_its_empty_pages_inflate_the_estimate(
        pg_dsn: str, pg_schema: str) -> None:
    """A scratch relation is emptied by DELETE and never vacuumed: its pages grow run after
    run with the same rows, and the planner scales its row estimate with them (TPC-H Q21:
    a 3.7k-row i-diff planned as 22k after five runs, 60 → 1,200 ms). The ANALYZE after a
    fill compares the rows with the planner's estimate (the companion's ``stats_stale``,
    here in the test's schema): from its pages and its columns' widths before it was analyzed
    with rows — near enough here, so left alone (an ANALYZE re-plans every statement reading
    the relation) — and from ``reltuples`` scaled by its pages after."""
    r = Relation("scratch", "d1", "n")
    check = _analyze(r, pg_schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("SET search_path = {}").format(pgsql.Identifier(pg_schema)))
        conn.execute(fingerprint_source(pg_schema))
        conn.execute("CREATE TABLE scratch (a int, b text) WITH (autovacuum_enabled = false)")
        conn.execute("ANALYZE scratch")  # (as a view's are at create: analyzed empty)

        def relpages() -> int:
            row = conn.execute("SELECT relpages FROM pg_class WHERE oid = 'scratch'::regclass"
                               ).fetchone()
            assert row is not None
            return int(row[0])

        def run(empty: str) -> bool:
            """Empty, refill with 2,000 rows, run the check: whether it analyzed."""
            conn.execute(empty)
            conn.execute("INSERT INTO scratch SELECT g, repeat('x', 40) FROM "
                         "generate_series(1, 2000) g")
            before = relpages()
            conn.execute(f"DO $$ DECLARE n bigint := 2000; BEGIN {check} END $$")
            return relpages() != before

        seen = [run("DELETE FROM scratch") for _ in range(2)]
        seen += [run("TRUNCATE scratch")] + [run("DELETE FROM scratch") for _ in range(4)]
        assert seen == [
            False,  # estimated from its pages and widths (~1.2× the rows): left alone
            True,  # twice the pages, past 2× the rows: analyzed
            False,  # truncated (relpages 0 again), the widths now analyzed: left alone
            True,  # twice the pages: analyzed
            False, False,  # 1.5×, 2× the rows: left alone
            True]  # 2.5×: analyzed


def test_the_delta_script_is_planned_at_its_own_cpu_tuple_cost(pg_dsn: str, pg_schema: str
                                                               ) -> None:
    """The Δ-script's branch runs at ``DELTA_CPU_TUPLE_COST`` (SET LOCAL before it, the
    caller's value put back after it); the session's own setting is the same after a
    maintain, and the view equals its query."""
    from idivm.postgres.compile import DELTA_CPU_TUPLE_COST

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        load(conn, pg_schema, 2_000)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("v_prime", V_PRIME_SQL)
            source = "\n".join(str(r[0]) for r in conn.execute(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON "
                "n.oid = p.pronamespace WHERE nspname = %s AND proname LIKE 'maintain\\_\\_%%'",
                (f"{pg_schema}__idivm",)))
            set_at = source.index(f"set_config('cpu_tuple_cost', '{DELTA_CPU_TUPLE_COST}', true)")
            put_back = source.index("set_config('cpu_tuple_cost', idivm__cputuple, true)")
            folds = [i for i in range(len(source)) if source.startswith('AS "__idivm_k"', i)]
            assert folds and all(set_at < i < put_back for i in folds)
            m.conn.execute("SET cpu_tuple_cost = 0.02")
            conn.execute("UPDATE parts SET price = price + 1 WHERE pid IN ('P7', 'P8')")
            assert m.maintain("v_prime").changes["parts"] == 2
            assert m.conn.execute("SHOW cpu_tuple_cost").fetchone() == ("0.02",)
            got = Counter(tuple(r) for r in conn.execute(
                pgsql.SQL("SELECT * FROM {}").format(pgsql.Identifier(pg_schema, "v_prime"))))
            assert got == Counter(tuple(r) for r in conn.execute(V_PRIME_SQL))


def test_a_dynamic_statement_is_planned_once_a_session(pg_dsn: str, pg_schema: str) -> None:
    """An EXECUTEd statement runs as the session's prepared statement of its text: prepared
    by the first run that arrives at the text, its plan kept for the later runs (it was
    planned at every run: TPC-H SF 1 Q20 34.5 → 31.2 ms a refresh); its row count (which
    the statements after it are gated by) is the rows its INSERT wrote; a DEALLOCATE ALL
    in the session just makes the next run prepare again. Every run equals the query."""
    from idivm.postgres.compile import PREPARED_PREFIX

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        load(conn, pg_schema, 2_000)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("v_prime", V_PRIME_SQL)

            def prepared() -> dict[str, int]:
                return {str(n): int(g) for n, g in m.conn.execute(
                    "SELECT name, generic_plans FROM pg_prepared_statements "
                    "WHERE name LIKE %s", (PREPARED_PREFIX + "%",))}

            def run(k: int) -> dict[str, int]:
                """A batch of one shape (the same i-diffs empty): parts' prices."""
                conn.execute("UPDATE parts SET price = price + %s WHERE pid IN ('P7', 'P8')",
                             (k,))
                stats = m.maintain("v_prime")
                assert stats.changes["parts"] == 2
                got = Counter(tuple(r) for r in conn.execute(pgsql.SQL("SELECT * FROM {}")
                              .format(pgsql.Identifier(pg_schema, "v_prime"))))
                assert got == Counter(tuple(r) for r in conn.execute(V_PRIME_SQL))
                return prepared()

            first = run(1)
            assert first and all(len(n) == len(PREPARED_PREFIX) + 32 for n in first)
            second = run(2)
            assert second.keys() == first.keys()  # the same texts: nothing prepared again
            assert all(second[n] == first[n] + 1 for n in first)  # each plan run once more
            m.conn.execute("DEALLOCATE ALL")
            assert run(3).keys() == first.keys()


def test_prepared_statements_survive_a_base_table_change(pg_dsn: str, pg_schema: str) -> None:
    """With the session's prepared statements in place, an ALTER TABLE of a base table (a
    column no view reads added, then an index) makes PostgreSQL plan them again at their next
    run: the refresh after it is exact, and so are the ones after that."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        load(conn, pg_schema, 2_000)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("v_prime", V_PRIME_SQL)

            def run(k: int) -> None:
                conn.execute("UPDATE parts SET price = price + %s WHERE pid IN ('P7', 'P8')",
                             (k,))
                conn.execute("DELETE FROM devices_parts WHERE did = %s", (f"D{k}",))
                m.maintain("v_prime")
                got = Counter(tuple(r) for r in conn.execute(pgsql.SQL("SELECT * FROM {}")
                              .format(pgsql.Identifier(pg_schema, "v_prime"))))
                assert got == Counter(tuple(r) for r in conn.execute(V_PRIME_SQL)), k

            run(1)
            assert m.conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE name "
                                  "LIKE 'idivm\\_%'").fetchone() != (0,)
            conn.execute("ALTER TABLE parts ADD COLUMN note text")
            run(2)
            conn.execute("CREATE INDEX ON devices_parts (pid)")
            run(3)
            run(4)
