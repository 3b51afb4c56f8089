"""A WITH query a PostgreSQL view reads more than once, held as a view of its own
(``create_view`` with ``hoist.shared_ctes``): maintained once per refresh, ahead of the view,
which reads its changes from its log — never two caches of the same aggregate.

Differential: after random batches, the view (and the view made of its CTE) equal their
definitions recomputed from the base tables, under ``id`` and ``auto``; the registry records
the owner; dropping the view drops what it made; a failed create leaves nothing; CTEs that
cannot key a view stay inline, and so does every CTE of a ``recompute`` view.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idivm.cli import main as cli_main
from idivm.errors import BackendError
from idivm.postgres import PostgresMaintainer

DDL = """
CREATE TABLE item (id int PRIMARY KEY, sup int NOT NULL, price int, day int);
CREATE TABLE sup (sid int PRIMARY KEY, name text);
INSERT INTO item SELECT i, i % 9, (i * 37) % 100, i % 30 FROM generate_series(1, 400) i;
INSERT INTO sup SELECT i, 's' || i FROM generate_series(0, 9) i;
"""

# TPC-H Q15's shape: the top supplier(s) by revenue, the revenue CTE read twice
TOP = ("WITH revenue AS (SELECT sup AS supplier_no, sum(price) AS total FROM item "
       "WHERE day < 20 GROUP BY sup) "
       "SELECT sid, name, total FROM sup, revenue "
       "WHERE sid = supplier_no AND total = (SELECT max(total) FROM revenue)")
# its column list, read three times (twice in a later CTE)
ABOVE = ("WITH r (k, tot) AS (SELECT sup, sum(price) FROM item GROUP BY sup), "
         "hi AS (SELECT k FROM r WHERE tot > 1500) "
         "SELECT r.k, r.tot FROM r JOIN hi ON r.k = hi.k WHERE r.tot < (SELECT max(tot) FROM r)")


def _rows(conn: psycopg.Connection[Any], sql: str) -> Counter[Any]:
    return Counter(map(tuple, conn.execute(sql).fetchall()))


def _batch(conn: psycopg.Connection[Any], rng: random.Random, n: int) -> None:
    with conn.transaction():
        for _ in range(n):
            k = rng.randrange(1, 500)
            op = rng.random()
            if op < 0.35:
                conn.execute("INSERT INTO item VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO "
                             "UPDATE SET price = EXCLUDED.price",
                             (k, rng.randrange(9), rng.randrange(100), rng.randrange(30)))
            elif op < 0.7:
                conn.execute("UPDATE item SET price = price + %s, sup = CASE WHEN %s THEN "
                             "(sup + 1) %% 9 ELSE sup END, day = (day + %s) %% 30 WHERE id = %s",
                             (rng.randrange(-20, 60), rng.random() < 0.3,
                              rng.choice([0, 0, 7]), k))
            elif op < 0.9:
                conn.execute("DELETE FROM item WHERE id = %s", (k,))
            else:
                conn.execute("UPDATE sup SET name = %s WHERE sid = %s",
                             (f"t{rng.randrange(5)}", rng.randrange(10)))


@pytest.fixture
def db(pg_dsn: str, pg_schema: str) -> Any:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(f"SET search_path = {pg_schema}")
    conn.execute(DDL)
    m = PostgresMaintainer(pg_dsn, pg_schema)
    yield m, conn
    m.close()
    conn.close()


def _owners(conn: psycopg.Connection[Any], schema: str) -> dict[str, str | None]:
    return dict(conn.execute(f"SELECT name, owner FROM {schema}__idivm.views").fetchall())


@pytest.mark.parametrize("strategy", ["id", "auto", "tuple"])
def test_shared_cte_view_differential(db: Any, pg_schema: str, strategy: str) -> None:
    m, conn = db
    m.create_view("top", TOP, strategy=strategy)
    m.create_view("above", ABOVE, strategy=strategy)
    assert _owners(conn, pg_schema) == {"top": None, "top__revenue": "top",
                                        "above": None, "above__r": "above"}
    assert m.definitions() == {"top": TOP, "above": ABOVE}  # as written
    # two caches of the revenue aggregate became one view, read by top as a table
    assert set(m.plan_of("top").tables) == {"sup", "top__revenue"}
    assert len(m.plan_of("top__revenue").materialized) == 1
    rng = random.Random(2711)
    for rnd in range(10):
        _batch(conn, rng, rng.choice([1, 6, 50]))
        for name, sql in (("top", TOP), ("above", ABOVE)):
            if strategy == "auto":  # both branches: recompute alone, then the Δ-script
                st = m.maintain(name, strategy="recompute" if rnd % 3 == 1 else None)
            else:
                st = m.maintain(name)
            assert sorted(st.upstream) == [f"{name}__{'revenue' if name == 'top' else 'r'}"]
            assert _rows(conn, f"SELECT * FROM {name}") == _rows(conn, sql), (rnd, name)
    assert _rows(conn, "SELECT * FROM top__revenue") == _rows(
        conn, "SELECT sup, sum(price) FROM item WHERE day < 20 GROUP BY sup")
    m.drop_view("top")
    m.drop_view("above")
    assert not conn.execute(f"SELECT to_regclass('{pg_schema}.top__revenue')").fetchone()[0]
    assert m.status() == []


def test_what_stays_inline(db: Any, pg_schema: str) -> None:
    """A recompute view, declared changes, a name taken, a CTE whose IDs could be NULL:
    inline, and still maintained exactly."""
    m, conn = db
    conn.execute("CREATE TABLE maybe (id int PRIMARY KEY, g int, v int)")
    conn.execute("INSERT INTO maybe SELECT i, nullif(i % 4, 0), i FROM generate_series(1, 40) i")
    nullable = ("WITH s AS (SELECT g, sum(v) AS t FROM maybe GROUP BY g) "
                "SELECT a.g, a.t FROM s a JOIN s b ON a.t = b.t")
    conn.execute("CREATE TABLE taken__revenue (x int)")
    m.create_view("rec", TOP, strategy="recompute")
    m.create_view("declared", TOP, changes={"item": ["update"]})
    m.create_view("taken", TOP)
    m.create_view("nul", nullable)
    assert set(_owners(conn, pg_schema)) == {"rec", "declared", "taken", "nul"}
    assert set(m.plan_of("taken").tables) == {"item", "sup"}
    conn.execute("UPDATE item SET price = price + 50 WHERE id IN (3, 12, 21)")
    conn.execute("UPDATE maybe SET v = v + 7 WHERE id < 9")
    for name, sql in (("rec", TOP), ("declared", TOP), ("taken", TOP), ("nul", nullable)):
        m.maintain(name)
        assert _rows(conn, f"SELECT * FROM {name}") == _rows(conn, sql), name


def test_a_failed_create_leaves_nothing(db: Any, pg_schema: str) -> None:
    """The CTE's view is made first; when the view itself then fails, it goes too."""
    m, conn = db
    bad = TOP.replace("SELECT sid, name", "SELECT sid, no_such_column")
    with pytest.raises(Exception):  # noqa: B017 - whatever the planner says, nothing stays
        m.create_view("bad", bad)
    assert m.status() == []
    assert not conn.execute(f"SELECT to_regclass('{pg_schema}.bad__revenue')").fetchone()[0]


def test_the_cte_view_is_an_input_like_any(db: Any, pg_schema: str) -> None:
    """Dropping it alone is refused while the view reads it; a view another view reads too
    stays when its owner goes."""
    m, conn = db
    m.create_view("top", TOP)
    with pytest.raises(BackendError, match="read by view"):
        m.drop_view("top__revenue")
    m.create_view("other", "SELECT supplier_no, total FROM top__revenue WHERE total > 100")
    m.drop_view("top")
    assert set(_owners(conn, pg_schema)) == {"top__revenue", "other"}
    conn.execute("UPDATE item SET price = price + 500 WHERE id = 7")
    m.maintain("other")
    assert _rows(conn, "SELECT * FROM other") == _rows(
        conn, "SELECT sup, sum(price) FROM item WHERE day < 20 GROUP BY sup "
              "HAVING sum(price) > 100")


def test_pipeline_run_folder_sees_the_query_as_written(
        db: Any, pg_dsn: str, pg_schema: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``idivm pg pipeline run``: the view made of a CTE is not a dataset of the folder, and
    the view's query is the file's — the second run refreshes, it does not re-create."""
    m, conn = db
    (tmp_path / "top.sql").write_text(f"CREATE MATERIALIZED VIEW top AS {TOP};\n")
    args = ["pg", "pipeline", "run", str(tmp_path), "--json", "--dsn", pg_dsn,
            "--schema", pg_schema]
    runs = []
    for _ in range(2):
        capsys.readouterr()
        assert cli_main(args) == 0
        runs.append(json.loads(capsys.readouterr().out))
        conn.execute("UPDATE item SET price = price + 90 WHERE id % 50 = 1")
    assert [(d["name"], d["refresh"]) for d in runs[0]["datasets"]] == [("top", "create")]
    assert [(d["name"], d["refresh"]) for d in runs[1]["datasets"]] == [("top", "id")]
    assert runs[1]["left_alone"] == []
    m.maintain("top")
    assert _rows(conn, "SELECT * FROM top") == _rows(conn, TOP)


def test_dropping_the_cte_view_with_cascade(db: Any, pg_schema: str) -> None:
    m, conn = db
    m.create_view("top", TOP)
    m.drop_view("top__revenue", cascade=True)
    assert m.status() == []
    assert not conn.execute(f"SELECT to_regclass('{pg_schema}.top')").fetchone()[0]


def test_a_leftover_of_an_unfinished_create_is_reclaimed(db: Any, pg_schema: str) -> None:
    """A create_view killed between the CTE's view and the view leaves the first, owned by a
    view that does not exist: the next create_view of that name drops it and starts over."""
    m, conn = db
    m.create_view("top", TOP)
    body = m._entry("top__revenue")["sql"]
    m.drop_view("top")
    m._create_view("top__revenue", body, None, None, "id")  # (the unfinished create)
    conn.execute(f"UPDATE {pg_schema}__idivm.views SET owner = 'top' "
                 "WHERE name = 'top__revenue'")
    m.create_view("top", TOP)
    assert _owners(conn, pg_schema) == {"top": None, "top__revenue": "top"}
    assert set(m.plan_of("top").tables) == {"sup", "top__revenue"}
