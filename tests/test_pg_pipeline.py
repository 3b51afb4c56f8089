"""Views over views on PostgreSQL (pipelines): a view reads other views of its schema as tables
keyed by their IDs, and consumes the changes their maintenance applied (logged from their stored
tables) — never by recomputing them.

The contract: ``maintain(name)`` maintains every view ``name`` reads (transitively, each once)
and then ``name``, in one transaction (one snapshot of the base tables); ``maintain_all``
maintains every view in dependency order and returns view → statistics; ``drop_view`` is
refused while views read the view, ``cascade=True`` drops them first; a view reading itself is
refused; ``status`` names each view's upstream views and its watermarks.

Differential: after random batches of inserts, updates and deletes (and a concurrent writer),
each view a maintain brought up to date equals its definition recomputed from the base tables.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from idivm.cli import main as cli_main
from idivm.errors import BackendError, UnsupportedSQL
from idivm.postgres import PostgresMaintainer

try:
    from tests.pipeline_cases import VIEWS, closure, recompute_sql
except ImportError:  # pragma: no cover - run from inside tests/
    from pipeline_cases import VIEWS, closure, recompute_sql  # type: ignore[no-redef]

DDL = """
CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, x int);
CREATE TABLE u (g int PRIMARY KEY, name text);
INSERT INTO t SELECT i, i % 7, (i * 13) % 50 FROM generate_series(1, 300) i;
INSERT INTO u SELECT i, 'n' || (i % 3) FROM generate_series(0, 6) i;
"""


def _recomputed(conn: psycopg.Connection[Any], schema: str, name: str) -> Counter[Any]:
    """The view's definition over the base tables: the views it reads as WITH queries."""
    conn.execute(f"SET search_path = {schema}")
    return Counter(map(tuple, conn.execute(recompute_sql(name)).fetchall()))


def _stored(conn: psycopg.Connection[Any], schema: str, name: str) -> Counter[Any]:
    return Counter(map(tuple, conn.execute(f"SELECT * FROM {schema}.{name}").fetchall()))


def _check(conn: psycopg.Connection[Any], schema: str, names: list[str]) -> None:
    for v in names:
        assert _stored(conn, schema, v) == _recomputed(conn, schema, v), v


def _batch(conn: psycopg.Connection[Any], schema: str, rng: random.Random, n: int) -> None:
    with conn.transaction():
        for _ in range(n):
            k = rng.randrange(1, 400)
            op = rng.random()
            if op < 0.4:
                conn.execute(f"INSERT INTO {schema}.t VALUES (%s, %s, %s) ON CONFLICT (id) DO "
                             "UPDATE SET x = EXCLUDED.x", (k, rng.randrange(7), rng.randrange(50)))
            elif op < 0.7:
                conn.execute(f"UPDATE {schema}.t SET x = x + %s, g = CASE WHEN %s THEN "
                             "(g + 1) %% 7 ELSE g END WHERE id = %s",
                             (rng.randrange(-5, 30), rng.random() < 0.3, k))
            elif op < 0.9:
                conn.execute(f"DELETE FROM {schema}.t WHERE id = %s", (k,))
            else:
                conn.execute(f"UPDATE {schema}.u SET name = %s WHERE g = %s",
                             (f"n{rng.randrange(4)}", rng.randrange(7)))


@pytest.fixture
def pipeline(pg_dsn: str, pg_schema: str) -> Any:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(f"SET search_path = {pg_schema}")
    conn.execute(DDL)
    m = PostgresMaintainer(pg_dsn, pg_schema)
    for name, sql in VIEWS.items():
        m.create_view(name, sql)
    yield m, conn
    m.close()
    conn.close()


def test_views_over_views_differential(pipeline: Any, pg_schema: str) -> None:
    m, conn = pipeline
    _check(conn, pg_schema, list(VIEWS))
    rng = random.Random(2611)
    for rnd in range(12):
        _batch(conn, pg_schema, rng, rng.choice([1, 5, 40]))
        if rnd % 4 == 3:
            stats = m.maintain_all()
            assert list(stats) == ["a", "b", "c", "d", "e"]  # upstream first, then by name
            done = list(VIEWS)
        else:
            name = rng.choice(list(VIEWS))
            st = m.maintain(name)
            assert sorted(st.upstream) == sorted(closure(name)[:-1])
            done = closure(name)
        _check(conn, pg_schema, done)
    # nothing pending: nothing consumed twice
    again = m.maintain_all()
    assert all(sum(s.changes.values()) == 0 for s in again.values()), \
        {k: s.changes for k, s in again.items()}
    _check(conn, pg_schema, list(VIEWS))


def test_downstream_consumes_upstream_changes_not_a_recomputation(pipeline: Any,
                                                                  pg_schema: str) -> None:
    """One update of t changes one group of a: b and c receive that one changed row of a.
    (a and b only sum their input: they read its log rows unfolded, the update's old and new
    row — two; c joins a: one folded change.)"""
    m, conn = pipeline
    conn.execute(f"UPDATE {pg_schema}.t SET x = x + 1 WHERE id = 5")
    st = m.maintain("c")
    assert st.upstream["a"].changes == {"t": 2}
    assert st.changes == {"a": 1, "u": 0}
    assert m.maintain("b").changes == {"a": 2}  # a's change, logged once, read by b later
    assert m.maintain("b").changes == {"a": 0}
    _check(conn, pg_schema, ["a", "b", "c"])


def test_concurrent_writer(pipeline: Any, pg_dsn: str, pg_schema: str) -> None:
    """Maintains of pipelines while another session commits batches: each view still equals
    its recomputation once the writer stops (no change lost or consumed twice)."""
    m, conn = pipeline
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(pg_dsn, autocommit=True) as w:
                w.execute("SET statement_timeout = '20s'")
                while not stop.is_set():
                    _batch(w, pg_schema, rng, 3)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=write)
    th.start()
    try:
        for i in range(15):
            if i % 3 == 0:
                m.maintain_all()
            else:
                m.maintain(["d", "e", "b"][i % 3])
    finally:
        stop.set()
        th.join(30)
    assert not errors, errors
    m.maintain_all()
    _check(conn, pg_schema, list(VIEWS))


def test_drop_refused_while_read_and_cascade(pipeline: Any, pg_schema: str) -> None:
    m, conn = pipeline
    with pytest.raises(BackendError, match=r"read by view\(s\) b, c, e"):
        m.drop_view("a")
    assert {r["view"] for r in m.status()} == set(VIEWS)  # nothing dropped
    m.drop_view("c", cascade=True)  # c and d
    assert {r["view"] for r in m.status()} == {"a", "b", "e"}
    conn.execute(f"UPDATE {pg_schema}.t SET x = 0 WHERE id < 50")
    m.maintain_all()
    _check(conn, pg_schema, ["a", "b", "e"])
    m.drop_view("a", cascade=True)
    assert m.status() == []


def test_status_names_upstream_and_watermarks(pipeline: Any) -> None:
    m, _ = pipeline
    rows = {r["view"]: r for r in m.status()}
    assert rows["d"]["upstream"] == ["c"]
    assert rows["e"]["upstream"] == ["a"]
    assert set(rows["e"]["watermarks"]) == {"t", "a"}
    assert rows["a"]["upstream"] == []


def test_refusals(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {pg_schema}")
        conn.execute(DDL + "CREATE TABLE w (id int PRIMARY KEY, g int, y int);")
        with PostgresMaintainer(pg_dsn, pg_schema) as m:
            with pytest.raises(UnsupportedSQL, match="reads itself"):
                m.create_view("s", "SELECT g FROM s")
            m.create_view("j", "SELECT t.x, u.name FROM t JOIN u ON t.g = u.g")
            with pytest.raises(UnsupportedSQL, match=r"IDs it does not show \(t__id\)"):
                m.create_view("k", "SELECT name, count(*) AS n FROM j GROUP BY name")
            m.create_view("ng", "SELECT g, sum(y) AS s FROM w GROUP BY g")  # w.g nullable
            with pytest.raises(UnsupportedSQL, match="can be NULL"):
                m.create_view("k", "SELECT sum(s) AS s FROM ng")
            m.create_view("one", "SELECT sum(x) AS s FROM t")
            with pytest.raises(UnsupportedSQL, match="has no IDs"):
                m.create_view("k", "SELECT s FROM one")
            # nothing half-made by the refusals: the views over them still maintain
            conn.execute("UPDATE t SET x = x + 1")
            assert set(m.maintain_all()) == {"j", "ng", "one"}


def test_cli_maintain_all(pipeline: Any, pg_dsn: str, pg_schema: str,
                          capsys: pytest.CaptureFixture[str]) -> None:
    m, conn = pipeline
    conn.execute(f"UPDATE {pg_schema}.t SET x = x + 3 WHERE id % 10 = 0")
    assert cli_main(["pg", "maintain", "--all", "--json", "--dsn", pg_dsn,
                     "--schema", pg_schema]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["a", "b", "c", "d", "e"]
    assert out["a"]["changes"] == {"t": 60}  # 30 updates: a sums t, read unfolded
    _check(conn, pg_schema, list(VIEWS))
    assert cli_main(["pg", "drop-view", "a", "--dsn", pg_dsn, "--schema", pg_schema]) != 0
    assert cli_main(["pg", "drop-view", "a", "--cascade", "--dsn", pg_dsn,
                     "--schema", pg_schema]) == 0


def test_order_upstream_first_and_cycles_named() -> None:
    from idivm.pipeline import order

    assert order({"b": ["a"], "c": ["b", "a"]}, ["c"]) == ["a", "b", "c"]
    assert order({"b": ["a"], "c": ["a"]}, ["c", "b"]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="a → b → a"):
        order({"a": ["b"], "b": ["a"]}, ["a"])


def test_pipeline_run_folder(pg_dsn: str, pg_schema: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """``idivm pg pipeline run DIR``: created, then maintained, a changed query re-created with
    the views reading it; refusals before anything runs."""
    (tmp_path / "gold").mkdir()
    (tmp_path / "silver.sql").write_text(
        "-- silver; a comment\nCREATE MATERIALIZED VIEW a AS " + VIEWS["a"] + ";\n")
    (tmp_path / "gold" / "gold.sql").write_text(
        f"CREATE MATERIALIZED VIEW c AS {VIEWS['c']};\nCREATE MATERIALIZED VIEW d AS "
        f"{VIEWS['d']};")
    args = ["pg", "pipeline", "run", str(tmp_path), "--json", "--dsn", pg_dsn,
            "--schema", pg_schema]

    def run(*extra: str) -> dict[str, Any]:
        capsys.readouterr()
        assert cli_main([*args[:2], *extra, *args[3:]] if extra else args) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {pg_schema}")
        conn.execute(DDL)
        first = run()
        assert [(d["name"], d["refresh"]) for d in first["datasets"]] == \
            [("a", "create"), ("c", "create"), ("d", "create")]
        conn.execute("UPDATE t SET x = x + 7 WHERE id < 60")
        second = run()
        assert [d["refresh"] for d in second["datasets"]] == ["id"] * 3
        assert second["datasets"][0]["changes"] == {"t": 118}  # 59 updates, unfolded
        _check(conn, pg_schema, ["a", "c", "d"])
        (tmp_path / "gold" / "gold.sql").write_text(
            f"CREATE MATERIALIZED VIEW c AS {VIEWS['c'].replace('1000', '900')};\n"
            f"CREATE MATERIALIZED VIEW d AS {VIEWS['d']};")
        dry = run("dry-run")
        assert [(d["name"], d["refresh"]) for d in dry["datasets"]] == \
            [("a", "refresh"), ("c", "recreate"), ("d", "recreate")]
        third = run()
        assert [d["refresh"] for d in third["datasets"]] == ["id", "recreate", "recreate"]
        assert min(r[2] for r in _stored(conn, pg_schema, "c")) > 900
        # a streaming table: refused by name, nothing runs
        (tmp_path / "x.sql").write_text("CREATE STREAMING TABLE s AS SELECT * FROM t")
        assert cli_main(args) != 0
        assert "STREAMING TABLE" in capsys.readouterr().err


def test_a_failed_pipeline_maintain_changes_nothing(pipeline: Any, pg_schema: str) -> None:
    """A pipeline maintain is one transaction: cancelled (a statement timeout) at any point,
    nothing of it stays — not a's refresh, not the log rows c and d would have read — and the
    next maintain makes every view equal its recomputation."""
    from idivm.errors import MaintenanceError

    m, conn = pipeline
    rng = random.Random(9)
    outcomes = []
    for timeout_ms in (1, 2, 5, 10, 20):
        _batch(conn, pg_schema, rng, 30)
        before = {v: _stored(conn, pg_schema, v) for v in ("a", "c", "d")}
        m.conn.execute(f"SET statement_timeout = {timeout_ms}")
        try:
            m.maintain("d")
            failed = False
        except MaintenanceError:
            failed = True
        finally:
            m.conn.execute("SET statement_timeout = 0")
        outcomes.append(failed)
        if failed:
            assert {v: _stored(conn, pg_schema, v) for v in ("a", "c", "d")} == before
        m.maintain("d")
        _check(conn, pg_schema, ["a", "c", "d"])
    assert any(outcomes)


def test_ddl_on_a_pipeline(pipeline: Any, pg_schema: str) -> None:
    """DDL that would leave a view over a view silently wrong is refused — on the upstream's
    stored table (whose triggers feed the views over it) as on a base table; DDL on columns no
    view reads is absorbed, and the pipeline stays exact."""
    m, conn = pipeline
    store = f'"{pg_schema}__idivm".a__store'
    for ddl in (f"ALTER TABLE {store} RENAME COLUMN s TO s2",
                f"ALTER TABLE {store} DISABLE TRIGGER ALL",
                f"ALTER TABLE {pg_schema}.t RENAME COLUMN x TO x2"):
        with pytest.raises(psycopg.Error, match="incrementally maintained views"):
            conn.execute(ddl)
    conn.execute(f"ALTER TABLE {pg_schema}.t ADD COLUMN note text")
    conn.execute(f"UPDATE {pg_schema}.t SET x = x + 2, note = 'n' WHERE id < 40")
    m.maintain_all()
    _check(conn, pg_schema, list(VIEWS))
