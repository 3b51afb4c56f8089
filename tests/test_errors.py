"""Bad input: a clear error naming the problem, and nothing installed."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

import idivm
from idivm.errors import BackendError, CatalogError, UnsupportedSQL
from idivm.examples import PAPER_DDL
from idivm.postgres import PostgresMaintainer

DDL = PAPER_DDL + "CREATE TABLE nokey (a INT, b INT);"
CAT = idivm.Catalog.from_ddl(DDL)

REFUSED = [
    ("SELECT p.pid FROM parts p LEFT JOIN devices_parts dp ON dp.pid IN (SELECT pid FROM parts)",
     "subquery in a LEFT JOIN's ON"),
    ("SELECT p.pid FROM parts p WHERE p.price > (SELECT max(price) FROM parts GROUP BY pid)",
     "scalar subquery with GROUP BY"),
    ("SELECT pid, rank() OVER (ORDER BY price) FROM parts", "window function"),
    ("SELECT pid FROM parts ORDER BY pid", "ORDER BY"),
    ("SELECT pid FROM parts LIMIT 3", "LIMIT"),
    ("SELECT pid, now() AS t FROM parts", "CURRENT_TIMESTAMP"),
    ("SELECT pid, clock_timestamp() AS t FROM parts", "clock_timestamp"),
    ("SELECT pid FROM parts WHERE price > random()", "RAND"),
    ("SELECT dp.did, (SELECT max(p.price) FROM parts p WHERE p.pid = dp.did) AS m "
     "FROM devices_parts dp GROUP BY dp.did", "ungrouped column"),
    ("SELECT p.pid FROM parts p WHERE p.price > (SELECT count(DISTINCT q.price) FROM parts q)",
     "DISTINCT aggregate in a scalar subquery"),
    ("SELECT p.pid FROM parts p, devices d WHERE p.price > (SELECT avg(q.price) FROM parts q "
     "WHERE q.price < p.price AND q.pid < d.did)", "non-equality correlation across several"),
    ("SELECT p.pid FROM parts p WHERE p.price > (SELECT q.price FROM parts q WHERE q.pid = 'a')",
     "scalar subquery without an aggregate"),
    ("SELECT count(DISTINCT price), count(DISTINCT pid) FROM parts",
     "DISTINCT aggregates over several arguments"),
    ("SELECT string_agg(pid, ',') FROM parts", "aggregate"),
    ("SELECT pid FROM parts EXCEPT ALL SELECT pid FROM devices_parts", "EXCEPT ALL"),
    ("SELECT a FROM nokey", "without a primary key"),
    ("SELECT p.pid FROM parts p WHERE p.price NOT IN (SELECT a FROM nokey)",
     "without a primary key"),
    ("SELECT did FROM devices WHERE category NOT IN (SELECT category FROM devices d2)",
     "nullable"),
    ("SELECT pid FROM parts; SELECT did FROM devices", "multiple statements"),
    ("DELETE FROM parts", "DELETE"),
    # D1: a subquery in HAVING was read as the outer query's aggregate (silently wrong); now
    # an uncorrelated one is joined above γ, a correlated one refused
    ("SELECT p.pid FROM parts p WHERE p.price > (SELECT max(price) FROM parts "
     "UNION SELECT 1)", "scalar subquery over a set operation"),
    ("SELECT pid FROM parts p GROUP BY pid HAVING sum(price) > "
     "(SELECT sum(q.price) FROM parts q WHERE q.pid = p.pid)",
     "correlated scalar subquery in HAVING"),
    # D3: a correlated derived table, named as such (was "cannot resolve")
    # (a one-row aggregate there is read as a comparison with it; a grouped one is not)
    ("SELECT p1.pid FROM parts p1 WHERE EXISTS (SELECT 1 FROM (SELECT p2.pid, sum(p2.price) "
     "AS s FROM parts p2 WHERE p2.pid = p1.pid GROUP BY p2.pid) n1 WHERE p1.price < n1.s)",
     "correlated subquery in FROM"),
]


@pytest.mark.parametrize("view,construct", REFUSED, ids=[c for _, c in REFUSED])
def test_unsupported_sql_names_the_construct(view: str, construct: str) -> None:
    with pytest.raises(UnsupportedSQL) as err:
        idivm.plan(view, CAT)
    assert construct.lower() in str(err.value).lower()


def test_refusals_name_what_they_refuse() -> None:
    with pytest.raises(UnsupportedSQL, match=r"refers to p1\.pid"):
        idivm.plan(REFUSED[-1][0], CAT)


def test_having_subquery_in_fresh_views_too(cxx: None) -> None:
    """D1: fresh views refused the HAVING subquery only when rows were read; now it is a
    nested aggregate they maintain (a stage per aggregate)."""
    from idivm.fresh import FreshView

    fv = FreshView.compile("SELECT did, count(*) AS c FROM devices_parts GROUP BY did "
                           "HAVING count(*) > (SELECT count(*) FROM parts)", CAT)
    assert len(fv.pipeline.stages) == 3
    for pid in ("p1", "p2"):
        fv.insert("parts", (pid, 1))
    for did, pid in (("d1", "p1"), ("d1", "p2"), ("d1", "p3"), ("d2", "p1")):
        fv.insert("devices_parts", (did, pid))
    assert fv.rows() == [("d1", 3)]
    fv.insert("parts", ("p3", 1))  # the threshold rises: d1's row goes
    assert fv.rows() == []
    fv.close()


def test_unquoted_identifiers_fold_like_postgresql() -> None:
    """D2: ``CREATE TABLE R`` is table r; ``FROM R`` reads it, ``FROM "R"`` does not."""
    cat = idivm.Catalog.from_ddl('CREATE TABLE R (A int PRIMARY KEY, b int); '
                                 'CREATE TABLE "Mixed" ("Key" int PRIMARY KEY, v int)')
    assert sorted(cat.tables) == ["Mixed", "r"]
    assert idivm.plan("SELECT A, B FROM R", cat).columns == ("a", "b")
    assert idivm.plan('SELECT "Key", V FROM "Mixed"', cat).columns == ("Key", "v")
    with pytest.raises(CatalogError, match="'R'"):
        idivm.plan('SELECT a FROM "R"', cat)
    with pytest.raises(CatalogError, match="'mixed'"):
        idivm.plan("SELECT v FROM Mixed", cat)


def test_keyless_table_error_names_it() -> None:
    with pytest.raises(UnsupportedSQL, match="nokey"):
        idivm.plan("SELECT a, b FROM nokey", CAT)


def test_unknown_table_and_column() -> None:
    with pytest.raises(CatalogError, match="nosuch"):
        idivm.plan("SELECT x FROM nosuch", CAT)
    with pytest.raises(UnsupportedSQL):
        idivm.plan("SELECT nosuchcol FROM parts", CAT)


def test_bad_changes_argument() -> None:
    with pytest.raises(idivm.IdivmError, match="modification type"):
        idivm.plan("SELECT pid FROM parts", CAT, changes={"parts": ["upsert"]})
    with pytest.raises(idivm.IdivmError, match="does not read"):
        idivm.plan("SELECT pid FROM parts", CAT, changes={"devices": ["insert"]})


def test_bad_dsn_says_so() -> None:
    with pytest.raises(BackendError, match="cannot connect"):
        PostgresMaintainer("postgresql://postgres@127.0.0.1:1/nosuchdb")


def test_refused_view_installs_nothing(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        for stmt in CAT.ddl():
            conn.execute(stmt)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            for view, _ in REFUSED[:4]:
                with pytest.raises(UnsupportedSQL):
                    m.create_view("bad", view)
        assert _objects(conn, pg_schema) == {"devices", "parts", "devices_parts", "nokey"}
        assert _objects(conn, f"{pg_schema}__idivm") == set()
        assert _triggers(conn, pg_schema) == 0


def test_failed_create_view_rolls_back(pg_dsn: str, pg_schema: str) -> None:
    """A name clash found inside the transaction leaves no caches, logs or triggers."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        for stmt in CAT.ddl():
            conn.execute(stmt)
        conn.execute("CREATE TABLE taken (x INT)")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m, pytest.raises(
                BackendError, match="already exists"):
            m.create_view("taken", "SELECT did, count(*) AS n FROM devices_parts GROUP BY did")
        assert _objects(conn, f"{pg_schema}__idivm") == set()
        assert _triggers(conn, pg_schema) == 0


def _triggers(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND NOT t.tgisinternal", (schema,)).fetchone()
    return int(row[0]) if row else -1


def _objects(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    return {r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'v')", (schema,)).fetchall()}


def test_key_value_dsn_works(pg_dsn: str, pg_schema: str) -> None:
    """A libpq key=value DSN is accepted (reflection converts it to a URL)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    kv = make_conninfo(**{k: v for k, v in conninfo_to_dict(pg_dsn).items() if v is not None})
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        for stmt in CAT.ddl():
            conn.execute(stmt)
    with psycopg.connect(kv, autocommit=True) as conn:  # (libpq itself takes it)
        conn.execute(sql.SQL("INSERT INTO {}.parts (pid, price) VALUES ('kv1', 1), ('kv2', 2)")
                     .format(sql.Identifier(pg_schema)))
    with PostgresMaintainer(kv, schema=pg_schema) as m:
        m.create_view("n", "SELECT count(*) AS n FROM parts")
        with psycopg.connect(kv, autocommit=True) as conn:
            conn.execute(sql.SQL("INSERT INTO {}.parts (pid, price) VALUES ('kv3', 3)")
                         .format(sql.Identifier(pg_schema)))
        st = m.maintain("n")
        assert st.changes == {"parts": 1}
        row = m.conn.execute(sql.SQL("SELECT n FROM {}.n").format(
            sql.Identifier(pg_schema))).fetchone()
        assert row is not None and row[0] == 3, row
        m.drop_view("n")
        assert "n" not in m.definitions()


def test_companion_from_an_older_idivm_says_what_to_do(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        comp = sql.Identifier(f"{pg_schema}__idivm")
        conn.execute(sql.SQL("CREATE TABLE {}.parts (pid text PRIMARY KEY, price int)").format(
            sql.Identifier(pg_schema)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(comp))
        conn.execute(sql.SQL("CREATE TABLE {}.views (name text PRIMARY KEY, sql text NOT NULL, "
                             "changes jsonb, runs bigint)").format(comp))
    with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
        for call in (lambda: m.maintain("v"), lambda: m.drop_view("v"),
                     lambda: m.create_view("v", "SELECT pid FROM parts")):
            with pytest.raises(BackendError, match="older idivm"):
                call()
