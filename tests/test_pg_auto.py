"""``strategy="auto"`` on PostgreSQL: each refresh runs the ID-based Δ-script or recomputes the
view, whichever the shared cost model (``idivm.refresh_cost``) estimates cheaper from the pending
log rows, the tables' sizes and the view's ``refresh_history``.

The contract: the decision and its reason are in ``stats.decision``; a recomputation is as safe
as the Δ-script (one transaction, the logs consumed, rolled back whole on failure) and writes
only the rows that changed, so views over a recomputed view receive exact change logs; every
refresh that consumed changes is a row of ``<companion>.refresh_history`` (written in the
maintenance transaction), summarized by ``<companion>.refresh_efficiency()``; a plain ``CALL
maintain('v')`` from SQL runs an auto view's Δ-script (or what ``choices`` asks).

Differential: after random inserts, updates and deletes, each view equals its query recomputed,
whichever branch the refresh took — the branches forced by seeding the history's newest
recomputation (a recomputation measured at ~0 s is always cheaper; one of 10⁶ s never is).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idivm.cli import main as cli_main
from idivm.errors import IdivmError, MaintenanceError
from idivm.postgres import PostgresMaintainer
from idivm.postgres.compile import HISTORY_ROWS, HISTORY_TRIM

try:
    from tests.pipeline_cases import VIEWS, closure, recompute_sql
except ImportError:  # pragma: no cover - run from inside tests/
    from pipeline_cases import VIEWS, closure, recompute_sql  # type: ignore[no-redef]

Conn = psycopg.Connection[Any]

DDL = """
CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, x int);
CREATE TABLE u (g int PRIMARY KEY, name text);
INSERT INTO t SELECT i, i % 7, (i * 13) % 50 FROM generate_series(1, 300) i;
INSERT INTO u SELECT i, 'n' || (i % 3) FROM generate_series(0, 5) i;
"""

# views with caches (aggregates, MIN/MAX, DISTINCT), nullable IDs (a LEFT JOIN) and none
QUERIES = {
    "agg": "SELECT t.g, u.name, sum(t.x) AS s, count(*) AS n FROM t JOIN u ON t.g = u.g "
           "GROUP BY t.g, u.name",
    "spj": "SELECT t.id, t.x, u.name FROM t JOIN u ON t.g = u.g WHERE t.x > 10",
    "ext": "SELECT g, max(x) AS mx, min(x) AS mn FROM t GROUP BY g",
    "lj": "SELECT t.id, t.x, u.name FROM t LEFT JOIN u ON t.g = u.g WHERE t.id % 3 = 0",
    "dist": "SELECT DISTINCT u.name, t.x FROM t JOIN u ON t.g = u.g WHERE t.x < 25",
    "tot": "SELECT sum(x) AS s, count(*) AS n FROM t",
}
CHEAP, DEAR = 1e-12, 1e6  # a seeded recomputation's seconds: always / never the cheaper


def _companion(schema: str) -> str:
    return f"{schema}__idivm"


def _rows(conn: Conn, query: str) -> Counter[Any]:
    return Counter(map(tuple, conn.execute(query).fetchall()))


def _check(conn: Conn, schema: str, queries: dict[str, str]) -> None:
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    for v, query in queries.items():
        assert _rows(conn, f"SELECT * FROM {v}") == _rows(conn, query), v


def _seed(conn: Conn, schema: str, view: str, seconds: float) -> None:
    """A recomputation of ``view`` measured at ``seconds`` as its history's newest."""
    conn.execute(sql.SQL("INSERT INTO {} (view, strategy, changes, seconds, base_rows, reason) "
                         "VALUES (%s, 'recompute', 1, %s, NULL, 'seeded by the test')").format(
        sql.Identifier(_companion(schema), "refresh_history")), (view, seconds))


def _stale(conn: Conn, schema: str, view: str) -> bool:
    row = conn.execute(sql.SQL("SELECT caches_stale FROM {} WHERE name = %s").format(
        sql.Identifier(_companion(schema), "views")), (view,)).fetchone()
    assert row is not None
    return bool(row[0])


def _history(conn: Conn, schema: str, view: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL(
        "SELECT strategy, changes, seconds, base_rows, reason FROM {} WHERE view = %s "
        "ORDER BY id").format(sql.Identifier(_companion(schema), "refresh_history")),
        (view,)).fetchall()


def _batch(conn: Conn, schema: str, rng: random.Random, n: int) -> None:
    with conn.transaction():
        for _ in range(n):
            k = rng.randrange(1, 400)
            op = rng.random()
            if op < 0.35:
                conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s) ON CONFLICT (id) DO "
                                     "UPDATE SET x = EXCLUDED.x").format(
                    sql.Identifier(schema, "t")), (k, rng.randrange(7), rng.randrange(50)))
            elif op < 0.65:
                conn.execute(sql.SQL("UPDATE {} SET x = x + %s, g = CASE WHEN %s THEN "
                                     "(g + 1) %% 7 ELSE g END WHERE id = %s").format(
                    sql.Identifier(schema, "t")),
                    (rng.randrange(-5, 30), rng.random() < 0.3, k))
            elif op < 0.9:
                conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(
                    sql.Identifier(schema, "t")), (k,))
            else:
                conn.execute(sql.SQL("UPDATE {} SET name = %s WHERE g = %s").format(
                    sql.Identifier(schema, "u")), (f"n{rng.randrange(4)}", rng.randrange(7)))


@pytest.fixture
def env(pg_dsn: str, pg_schema: str) -> Iterator[tuple[PostgresMaintainer, Conn]]:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
    conn.execute(DDL)
    m = PostgresMaintainer(pg_dsn, pg_schema)
    yield m, conn
    m.close()
    conn.close()


def test_auto_differential_both_branches(env: tuple[PostgresMaintainer, Conn],
                                         pg_schema: str) -> None:
    """Random batches; each round every auto view refreshed by the branch the seeded history
    makes cheaper (both, in random order: a recomputation must leave the caches right for
    the next Δ-script) and equal to its query after it."""
    m, conn = env
    for v, query in QUERIES.items():
        m.create_view(v, query, strategy="auto")
    _check(conn, pg_schema, QUERIES)
    rng = random.Random(2027)
    seen: Counter[str] = Counter()
    was_stale = dict.fromkeys(QUERIES, False)
    for _ in range(14):
        _batch(conn, pg_schema, rng, rng.choice([1, 6, 40]))
        for v in QUERIES:
            want = rng.choice(["id", "recompute"])
            _seed(conn, pg_schema, v, CHEAP if want == "recompute" else DEAR)
            stats = m.maintain(v)
            d = stats.decision
            pending = sum(stats.log_rows.values())
            if pending == 0:  # (a batch that missed the view's tables: nothing to decide)
                assert d["choice"] == "id" and "nothing" in d["reason"]
                continue
            assert d["choice"] == want, (v, d)
            stale = _stale(conn, pg_schema, v)
            if d["strategy"] == "rebuild":  # maintained after a recomputation left caches stale
                assert want == "id" and was_stale[v] and not stale
                assert "caches are stale" in d["reason"] and "rebuilds them" in d["reason"]
                assert "every stored relation recomputed" in d["reason"]
                assert stats.changes == {}  # (no Δ-script ran: everything recomputed)
                seen["rebuild"] += 1
            else:
                assert d["strategy"] == want
            assert "maintain ≈" in d["reason"] and "recompute ≈" in d["reason"]
            assert d["changes"] == pending  # the estimate counted exactly the log rows consumed
            assert d["maintain_estimate"] > 0 and d["recompute_estimate"] is not None
            if want == "recompute":
                # the view alone recomputed, from the base tables: its caches untouched, stale
                assert {k.split("→")[1] for k in stats.applied_rows} == {f"{v}__store"}
                assert [k for k, _ in stats.statement_seconds] == [f"recompute {v}__store"]
                assert stats.changes == {}
                assert stale == (len(m.plan_of(v).materialized) > 1)  # (caches below it)
            was_stale[v] = stale
            seen[want] += 1
        _check(conn, pg_schema, QUERIES)
    assert seen["id"] > 10 and seen["recompute"] > 10 and seen["rebuild"] > 5, seen
    # nothing pending: nothing consumed twice, whichever branch ran last
    again = m.maintain_all()
    assert all(sum(s.log_rows.values()) == 0 for s in again.values())
    _check(conn, pg_schema, QUERIES)


def test_the_batch_decides(env: tuple[PostgresMaintainer, Conn], pg_schema: str) -> None:
    """Unforced: against a recomputation measured at 40 ms, one changed row is maintained
    (≈ 5 ms) and 20,000 new rows are recomputed (≈ 0.2 s, over 4× the recomputation: not
    worth measuring); the reason names both estimates."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    _seed(conn, pg_schema, "agg", 0.04)
    conn.execute("UPDATE t SET x = x + 1 WHERE id = 7")
    small = m.maintain("agg")
    assert small.choice == "id" and small.decision["changes"] == 2, small.decision
    assert small.decision["maintain_estimate"] < small.decision["recompute_estimate"]
    conn.execute("INSERT INTO t SELECT i, i % 7, i % 50 FROM generate_series(1001, 21000) i")
    _seed(conn, pg_schema, "agg", 0.04)
    big = m.maintain("agg")
    assert big.choice == "recompute" and big.decision["changes"] == 20000, big.decision
    assert "20,000 changes" in big.reason and "recompute ≈ 40.0 ms" in big.reason
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


def test_history_and_refresh_efficiency(env: tuple[PostgresMaintainer, Conn],
                                        pg_schema: str) -> None:
    """Every refresh that consumed changes is a row of refresh_history (what ran, log rows,
    seconds, reason; the materialization a ``create`` row); refresh_efficiency() sums it up
    per view; status() shows both; the history is bounded per view, keeping the newest
    recomputation the model needs."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    m.create_view("plain", QUERIES["spj"])  # strategy id: recorded too
    conn.execute("UPDATE t SET x = x + 1 WHERE id <= 3")  # 6 log rows
    m.maintain("agg", strategy="id")
    m.maintain("plain")
    m.maintain("plain")  # nothing pending: not recorded
    conn.execute("UPDATE t SET x = x + 1 WHERE id <= 5")
    m.maintain("agg", strategy="recompute")
    conn.execute("UPDATE t SET x = x + 1 WHERE id <= 2")
    m.maintain("agg", strategy="id")  # its caches stale: rebuilt (caches and view recomputed)
    conn.execute("UPDATE t SET x = x + 1 WHERE id <= 2")
    m.maintain("agg", strategy="id")
    h = _history(conn, pg_schema, "agg")
    assert [(r[0], r[1]) for r in h] == [("create", 0), ("id", 6), ("recompute", 10),
                                         ("rebuild", 4), ("id", 4)]
    assert all(r[2] > 0 for r in h)
    assert h[1][4] == "strategy='id' asked for this refresh"
    assert h[2][4] == "strategy='recompute' asked for this refresh"
    assert h[3][4] == "strategy='id' asked for this refresh; the caches were stale (a " \
        "recomputation had refreshed the view alone): every stored relation recomputed"
    assert [(r[0], r[1]) for r in _history(conn, pg_schema, "plain")] == \
        [("create", 0), ("id", 6)]
    assert _history(conn, pg_schema, "plain")[1][4] == "strategy='id': the Δ-script"

    comp = sql.Identifier(_companion(pg_schema))
    eff = {r[0]: r for r in conn.execute(sql.SQL(
        "SELECT view, refreshes, id_refreshes, recompute_refreshes, id_median_seconds, "
        "recompute_median_seconds, avg_changes, id_recompute_ratio, last_refresh "
        "FROM {}.refresh_efficiency()").format(comp)).fetchall()}
    ids = sorted(r[2] for r in h if r[0] == "id")
    assert eff["agg"][1:4] == (4, 2, 1)  # (the rebuild a refresh, neither id nor recompute)
    assert eff["agg"][4] == pytest.approx(sum(ids) / 2)
    assert eff["agg"][5] == pytest.approx(h[2][2])
    assert eff["agg"][6] == pytest.approx(24 / 4)
    assert eff["agg"][7] == pytest.approx(sum(ids) / 2 / h[2][2])
    assert eff["plain"][1:4] == (1, 1, 0) and eff["plain"][7] is None

    status = {r["view"]: r for r in m.status()}
    assert status["agg"]["strategy"] == "auto"
    assert status["agg"]["last_refresh"]["strategy"] == "id"
    assert status["agg"]["last_refresh"]["changes"] == 4
    assert status["agg"]["efficiency"]["recompute_refreshes"] == 1
    assert [r["strategy"] for r in m.history("agg")] == ["create", "id", "recompute",
                                                         "rebuild", "id"]

    # bounded: the newest HISTORY_ROWS rows, and the newest recomputation and rebuild however
    # old, trimmed at every HISTORY_TRIM-th run that read the logs (the view's runs)
    hist = sql.Identifier(_companion(pg_schema), "refresh_history")
    conn.execute(sql.SQL("INSERT INTO {} (view, strategy, changes, seconds, reason) SELECT "
                         "'agg', 'id', 1, 0.001, 'filler' FROM generate_series(1, %s)").format(
        hist), (HISTORY_ROWS + 20,))
    views = sql.Identifier(_companion(pg_schema), "views")
    for _ in range(HISTORY_TRIM):
        runs = conn.execute(sql.SQL("SELECT runs FROM {} WHERE name = 'agg'").format(views)
                            ).fetchone()
        assert runs is not None
        before = len(_history(conn, pg_schema, "agg"))
        conn.execute("UPDATE t SET x = x + 1 WHERE id = 1")
        m.maintain("agg", strategy="id")
        kept = _history(conn, pg_schema, "agg")
        if (runs[0] + 1) % HISTORY_TRIM == 0:
            break
        assert len(kept) == before + 1  # (not trimmed: a row more)
    assert len(kept) == HISTORY_ROWS + 2
    assert kept[0][0] == "recompute" and kept[1][0] == "rebuild"
    assert kept[-1][0] == "id" and kept[-1][1] == 2
    assert m.history_model("agg").recompute_seconds == pytest.approx(h[2][2])
    assert m.history_model("agg").rebuild_seconds == pytest.approx(h[3][2])
    m.drop_view("plain")
    assert _history(conn, pg_schema, "plain") == []


@pytest.mark.parametrize("branch", ["id", "recompute"])
def test_a_failed_refresh_rolls_back_its_history_row(env: tuple[PostgresMaintainer, Conn],
                                                     pg_schema: str, branch: str) -> None:
    """A refresh failing at its COMMIT (a deferred trigger on the stored view raising) leaves
    no history row, the changes pending and the view as it was; the next refresh records
    itself and is exact."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    conn.execute("UPDATE t SET x = x + 5 WHERE id % 4 = 0")
    before_rows = _rows(conn, "SELECT * FROM agg")
    before_history = _history(conn, pg_schema, "agg")
    store = sql.Identifier(_companion(pg_schema), "agg__store")
    conn.execute("CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$BEGIN RAISE EXCEPTION 'refused by the test'; END$$")
    conn.execute(sql.SQL("CREATE CONSTRAINT TRIGGER fail AFTER INSERT OR UPDATE OR DELETE ON {} "
                         "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
                         "{}.fail()").format(store, sql.Identifier(pg_schema)))
    _seed(conn, pg_schema, "agg", CHEAP if branch == "recompute" else DEAR)
    seeded = _history(conn, pg_schema, "agg")
    assert len(seeded) == len(before_history) + 1
    with pytest.raises(MaintenanceError, match="refused by the test"):
        m.maintain("agg")
    assert _history(conn, pg_schema, "agg") == seeded
    assert _rows(conn, "SELECT * FROM agg") == before_rows
    assert m.status("agg")[0]["pending_log_rows"]["t"] > 0
    conn.execute(sql.SQL("DROP TRIGGER fail ON {}").format(store))
    stats = m.maintain("agg")
    assert stats.choice == branch
    after = _history(conn, pg_schema, "agg")
    assert len(after) == len(seeded) + 1 and after[-1][0] == branch
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


def test_auto_upstream_in_a_pipeline_stays_exact(env: tuple[PostgresMaintainer, Conn],
                                                 pg_schema: str) -> None:
    """The five-view pipeline, every view auto: an upstream recomputed writes only its rows
    that changed, so the views over it fold exact change logs, whichever branch each of them
    takes; random batches, random branches, each maintained view equal to its definition."""
    m, conn = env
    for name, query in VIEWS.items():
        m.create_view(name, query, strategy="auto")
    # one changed row of t: a recomputed a changes one row, which c reads as 1 update
    _seed(conn, pg_schema, "a", CHEAP)
    _seed(conn, pg_schema, "c", DEAR)
    conn.execute("UPDATE t SET x = x + 1 WHERE id = 5")
    st = m.maintain("c")
    assert st.upstream["a"].choice == "recompute" and st.choice == "id"
    assert st.upstream["a"].applied_rows == {"delete recomputed→a__store": 1,
                                            "insert recomputed→a__store": 1}
    assert st.log_rows == {"a": 2, "u": 0} and st.changes == {"a": 1, "u": 0}
    rng = random.Random(4242)
    branches: Counter[tuple[str, str]] = Counter()
    for rnd in range(12):
        _batch(conn, pg_schema, rng, rng.choice([1, 5, 40]))
        for v in VIEWS:
            _seed(conn, pg_schema, v, rng.choice([CHEAP, DEAR]))
        if rnd % 4 == 3:
            done = list(VIEWS)
            every = m.maintain_all()
            for v, s in every.items():
                branches[(v, s.choice)] += 1
        else:
            name = rng.choice(list(VIEWS))
            s = m.maintain(name)
            done = closure(name)
            for v, x in [*s.upstream.items(), (name, s)]:
                branches[(v, x.choice)] += 1
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        for v in done:
            assert _rows(conn, f"SELECT * FROM {v}") == _rows(conn, recompute_sql(v)), v
    assert branches[("a", "id")] and branches[("a", "recompute")], branches
    m.maintain_all()
    for v in VIEWS:
        assert _rows(conn, f"SELECT * FROM {v}") == _rows(conn, recompute_sql(v)), v


def test_call_maintain_from_sql(env: tuple[PostgresMaintainer, Conn], pg_schema: str) -> None:
    """From psql or pg_cron: a plain CALL runs an auto view's Δ-script (the cost model is
    evaluated by idivm's maintainer) and records it; ``choices`` picks the branch by view."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    proc = sql.Identifier(_companion(pg_schema), "maintain")
    conn.execute("UPDATE t SET x = x + 2 WHERE id < 30")
    row = conn.execute(sql.SQL("CALL {}(%s)").format(proc), ("agg",)).fetchone()
    assert row is not None
    stats = row[0]
    assert stats["strategy"] == "id" and stats["decision"]["choice"] == "id"
    assert "without a decision" in stats["decision"]["reason"]
    assert stats["log_rows"] == {"t": 58, "u": 0}
    assert _history(conn, pg_schema, "agg")[-1][:2] == ("id", 58)
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})

    conn.execute("DELETE FROM t WHERE id % 9 = 0")
    row = conn.execute(sql.SQL("CALL {}(%s, choices => %s)").format(proc),
                       ("agg", json.dumps({"agg": "recompute"}))).fetchone()
    assert row is not None and row[0]["strategy"] == "recompute"
    assert row[0]["decision"]["reason"] == "asked for: recompute"
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    conn.execute("UPDATE u SET name = 'z' WHERE g = 2")
    row = conn.execute(sql.SQL("CALL {}(choices => %s)").format(
        sql.Identifier(_companion(pg_schema), "maintain_all")),
        (json.dumps({"agg": {"choice": "recompute", "reason": "cron at night"}}),)).fetchone()
    assert row is not None and row[0]["views"]["agg"]["strategy"] == "recompute"
    assert _history(conn, pg_schema, "agg")[-1][4] == "cron at night"
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    conn.execute("UPDATE t SET x = 0 WHERE id = 1")
    with pytest.raises(psycopg.Error, match="can be id or recompute, not tuple"):
        conn.execute(sql.SQL("CALL {}(%s, choices => %s)").format(proc),
                     ("agg", json.dumps({"agg": "tuple"})))
    assert m.maintain("agg").log_rows == {"t": 2, "u": 0}  # the refused CALL consumed nothing


def test_strategies_asked_per_refresh(env: tuple[PostgresMaintainer, Conn],
                                      pg_schema: str) -> None:
    """``maintain(name, strategy)``: recompute an id view, auto for an id view, id for an auto
    view; tuple only for a tuple view; a recompute view has no Δ-script; a bad strategy is
    refused at create."""
    m, conn = env
    m.create_view("plain", QUERIES["ext"])
    m.create_view("rec", QUERIES["ext"].replace("max(x) AS mx, ", ""), strategy="recompute")
    m.create_view("tup", QUERIES["spj"], strategy="tuple")
    conn.execute("UPDATE t SET x = x * 2 WHERE id % 5 = 0")
    assert m.maintain("plain", strategy="recompute").decision["strategy"] == "recompute"
    conn.execute("UPDATE t SET x = x + 1 WHERE id % 5 = 0")
    _seed(conn, pg_schema, "plain", DEAR)
    d = m.maintain("plain", strategy="auto").decision
    assert d["choice"] == "id" and "maintain ≈" in d["reason"]
    st = m.maintain("tup")
    assert st.decision["strategy"] == "tuple" and st.choice == "id"
    st = m.maintain("rec")
    assert st.decision["strategy"] == "recompute" and st.choice == "recompute"
    with pytest.raises(IdivmError, match="chosen at create_view"):
        m.maintain("plain", strategy="tuple")
    with pytest.raises(IdivmError, match="no Δ-script"):
        m.maintain("rec", strategy="id")
    with pytest.raises(IdivmError, match="strategy must be auto, id, tuple or recompute"):
        m.create_view("bad", QUERIES["ext"], strategy="fast")  # type: ignore[arg-type]
    conn.execute("UPDATE t SET x = x + 1 WHERE id % 7 = 0")
    m.maintain("tup", strategy="recompute")
    m.maintain("plain")
    m.maintain("rec")
    conn.execute("UPDATE t SET x = x + 1 WHERE id % 11 = 0")
    every = m.maintain_all(strategy="id")  # (applied where it can be: not to rec)
    assert every["rec"].choice == "recompute" and every["plain"].choice == "id"
    assert every["tup"].decision["strategy"] == "tuple"
    _check(conn, pg_schema, {"plain": QUERIES["ext"], "tup": QUERIES["spj"],
                             "rec": QUERIES["ext"].replace("max(x) AS mx, ", "")})


def test_recompute_compares_rows_without_equality(env: tuple[PostgresMaintainer, Conn],
                                                  pg_schema: str) -> None:
    """json and xml have no ``=``: a recomputation compares rows as text; a value that
    compares equal but prints otherwise (numeric 1.0, 1.00) takes the recomputed form."""
    m, conn = env
    conn.execute("CREATE TABLE d (id int PRIMARY KEY, j json, x xml, n numeric)")
    conn.execute("""INSERT INTO d VALUES (1, '{"a": 1}', '<a/>', 1.0), (2, '[1, 2]', NULL, 2),
                    (3, NULL, '<b>x</b>', NULL)""")
    m.create_view("docs", "SELECT id, j, x, n FROM d WHERE id < 10", strategy="auto")
    conn.execute("""UPDATE d SET j = '{"a": 2}', n = 1.00 WHERE id = 1""")
    conn.execute("""INSERT INTO d VALUES (4, '{}', '<c/>', 4)""")
    conn.execute("DELETE FROM d WHERE id = 2")
    st = m.maintain("docs", strategy="recompute")
    assert st.applied_rows == {"delete recomputed→docs__store": 2,
                               "insert recomputed→docs__store": 2}
    got = conn.execute("SELECT id, j::text, x::text, n::text FROM docs ORDER BY id").fetchall()
    assert got == [(1, '{"a": 2}', "<a/>", "1.00"), (3, None, "<b>x</b>", None),
                   (4, "{}", "<c/>", "4")]


def test_cli_create_auto_and_status(env: tuple[PostgresMaintainer, Conn], pg_dsn: str,
                                    pg_schema: str, tmp_path: Any,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    m, conn = env
    view = tmp_path / "agg.sql"
    view.write_text(QUERIES["agg"])
    base = ["--dsn", pg_dsn, "--schema", pg_schema]
    assert cli_main(["pg", "create-view", "agg", "--sql-file", str(view), "--strategy", "auto",
                     *base]) == 0
    assert "(auto)" in capsys.readouterr().out
    _seed(conn, pg_schema, "agg", CHEAP)
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 10")
    assert cli_main(["pg", "maintain", "agg", "--json", *base]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"]["choice"] == "recompute" and "maintain ≈" in out["decision"]["reason"]
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 10")
    assert cli_main(["pg", "maintain", "agg", "--strategy", "id", *base]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "strategy='id' asked for this refresh" in shown
    assert "rebuild:" in shown and "every stored relation recomputed" in shown  # (caches stale)
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 10")
    assert cli_main(["pg", "maintain", "agg", "--strategy", "id", *base]) == 0
    capsys.readouterr()
    assert cli_main(["pg", "status", "--json", *base]) == 0
    st = json.loads(capsys.readouterr().out)[0]
    assert st["strategy"] == "auto" and st["efficiency"]["id_refreshes"] == 1
    assert st["efficiency"]["recompute_refreshes"] == 2  # (the seeded one too)
    assert cli_main(["pg", "status", *base]) == 0
    assert "agg" in capsys.readouterr().out
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


@pytest.mark.parametrize("old_args", ["", ", choices jsonb DEFAULT NULL"],
                         ids=["without-choices", "without-registry"])
def test_a_companion_of_an_older_format_upgrades(env: tuple[PostgresMaintainer, Conn],
                                                 pg_schema: str, old_args: str) -> None:
    """A companion whose procedures are an older idivm's — taking no ``choices`` (format 4),
    or ``choices`` but no ``registry`` and ``run`` — and whose views were compiled by it: the
    first maintain recompiles them and runs."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"])
    comp = sql.Identifier(_companion(pg_schema))

    def make_old(proc: str, args: str) -> None:
        conn.execute(sql.SQL(
            "CREATE PROCEDURE {}.{}(" + args + "INOUT stats jsonb DEFAULT NULL, version int "
            "DEFAULT NULL" + old_args + ") LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'old'; "
            "END$$").format(comp, sql.Identifier(proc)))

    conn.execute(sql.SQL("DROP PROCEDURE {}.maintain(text, jsonb, int, jsonb, text, text)"
                         ).format(comp))
    conn.execute(sql.SQL("DROP PROCEDURE {}.maintain_all(jsonb, int, jsonb, text, text)"
                         ).format(comp))
    for proc, args in (("maintain", "view text, "), ("maintain_all", "")):
        make_old(proc, args)
    conn.execute(sql.SQL("UPDATE {}.views SET format_version = 4").format(comp))
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 20")
    assert m.maintain("agg").log_rows == {"t": 38, "u": 0}
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    conn.execute(sql.SQL("DROP PROCEDURE {}.maintain_all(jsonb, int, jsonb, text, text)"
                         ).format(comp))
    make_old("maintain_all", "")
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 20")
    assert m.maintain_all()["agg"].log_rows == {"t": 38, "u": 0}
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    # and a maintainer that kept the registry from before: its next maintain runs too
    conn.execute(sql.SQL("DROP PROCEDURE {}.maintain(text, jsonb, int, jsonb, text, text)"
                         ).format(comp))
    make_old("maintain", "view text, ")
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 20")
    assert m.maintain("agg").log_rows == {"t": 38, "u": 0}
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


def test_a_maintainer_keeps_the_registry_it_read(env: tuple[PostgresMaintainer, Conn],
                                                 pg_schema: str, pg_dsn: str) -> None:
    """A maintain decides from the registry the maintainer's last maintain read (no query for
    it: one round trip less a refresh) and sends its token; once another session has changed
    the registry — a view created, or dropped and created again with another strategy — the
    procedures refuse that token before doing anything and the maintain reads the registry
    again: the new view is found, the new strategy decided."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"])
    reads = 0
    read = m._refresh_info

    def counted() -> Any:
        nonlocal reads
        reads += 1
        return read()

    m._refresh_info = counted  # type: ignore[method-assign]
    for k in range(3):
        conn.execute("UPDATE t SET x = x + 1 WHERE id < %s", (20 + k,))
        assert m.maintain("agg").decision.get("strategy") == "id"
    assert reads == 1  # the first maintain's only
    other = PostgresMaintainer(pg_dsn, pg_schema)
    try:
        other.create_view("tot", QUERIES["tot"], strategy="auto")
        conn.execute("UPDATE t SET x = x + 1 WHERE id < 30")
        assert "max_changes" in m.maintain("tot").decision  # decided as auto
        assert reads == 2
        other.drop_view("agg")
        other.create_view("agg", QUERIES["agg"], strategy="auto")
    finally:
        other.close()
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 40")
    stats = m.maintain("agg")
    assert "max_changes" in stats.decision and reads == 3
    assert m.maintain("tot").log_rows["t"] > 0 and reads == 3
    _check(conn, pg_schema, {v: QUERIES[v] for v in ("agg", "tot")})
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 50")
    assert set(m.maintain_all()) == {"agg", "tot"} and reads == 3  # (maintain_all alike)
    other = PostgresMaintainer(pg_dsn, pg_schema)
    try:
        other.drop_view("tot")
    finally:
        other.close()
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 60")
    assert set(m.maintain_all()) == {"agg"} and reads == 4
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


@pytest.mark.parametrize("synchronous", ["on", "off"])
def test_the_maintenance_commit_waits_for_the_disk_when_asked(
        env: tuple[PostgresMaintainer, Conn], pg_schema: str, synchronous: str) -> None:
    """A maintenance transaction commits without waiting for the disk unless the session's
    ``idivm.synchronous_refresh`` is on (a run a crash loses is undone whole and re-run
    from the logs): either way the view is its query's, and the session's own
    ``synchronous_commit`` is as it was."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"])
    m.conn.execute(f"SET idivm.synchronous_refresh = {synchronous}")
    before = m.conn.execute("SHOW synchronous_commit").fetchone()
    for k in range(3):
        conn.execute("UPDATE t SET x = x + 1 WHERE id < %s", (20 + k,))
        m.maintain("agg")
        _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    assert m.conn.execute("SHOW synchronous_commit").fetchone() == before


def test_a_sessions_first_run_is_recorded_cold(env: tuple[PostgresMaintainer, Conn],
                                               pg_schema: str) -> None:
    """The first run of a view's code in a session (it plans every statement) is marked
    ``cold`` in refresh_history; the model then prefers the warm runs."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"])  # (id: every run the Δ-script's)
    for k in range(3):
        conn.execute("UPDATE t SET x = x + 1 WHERE id < %s", (20 + k,))
        m.maintain("agg")
    runs = conn.execute(sql.SQL("SELECT cold, strategy FROM {} WHERE view = 'agg' AND "
                                "strategy <> 'create' ORDER BY id").format(
        sql.Identifier(_companion(pg_schema), "refresh_history"))).fetchall()
    assert [c for c, _ in runs] == [True, False, False]
    assert [s for _, s in runs] == ["id"] * 3
    assert len(m.history_model("agg").maintain) == 2


def test_a_session_is_warm_only_once_the_delta_script_ran_over_changes(
        env: tuple[PostgresMaintainer, Conn], pg_schema: str) -> None:
    """PL/pgSQL plans a statement at its first execution: a run with nothing pending, a
    recomputation or a rebuild executes none of the Δ-script's, so the Δ-script's first run
    after them is still its session's cold one — recorded cold, and decided as in a cold
    session (the maintainer's own flag agrees with the compiled code's)."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")  # (a cache below its γ)
    m.maintain("agg")  # nothing pending
    assert "agg" not in m._ran
    ran = []
    for k, strategy in enumerate(("recompute", "id", "id", "id")):
        conn.execute("UPDATE t SET x = x + 1 WHERE id < %s", (20 + k,))
        ran.append(m.maintain("agg", strategy=strategy).decision.get("strategy"))
        assert ("agg" in m._ran) is ("id" in ran), ran
    # the recomputation left the cache stale: the next run rebuilt it
    assert ran == ["recompute", "rebuild", "id", "id"]
    runs = conn.execute(sql.SQL("SELECT strategy, cold FROM {} WHERE view = 'agg' AND "
                                "strategy <> 'create' ORDER BY id").format(
        sql.Identifier(_companion(pg_schema), "refresh_history"))).fetchall()
    assert [tuple(r) for r in runs] == [("recompute", True), ("rebuild", True), ("id", True),
                                        ("id", False)], runs
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


def test_a_failed_history_read_after_the_commit_still_reports_the_run(
        env: tuple[PostgresMaintainer, Conn], pg_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After an auto view's first warm run commits, the maintainer re-reads its history (the
    cold samples stop counting); a timeout or cancel of that read does not turn the committed
    run into an error: the stats are returned and the next decision reads the history again."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    _seed(conn, pg_schema, "agg", DEAR)  # (the Δ-script chosen)
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 20")
    assert m.maintain("agg").choice == "id"  # cold: the session's first run
    real, hits = m._cost, []

    def cancelled(view: str, reload: bool = False) -> Any:
        if reload:
            hits.append(view)
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return real(view, reload)

    monkeypatch.setattr(m, "_cost", cancelled)
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 30")
    stats = m.maintain("agg")  # warm: the history re-read fails
    assert hits == ["agg"] and stats.choice == "id"
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    monkeypatch.undo()
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 40")
    assert m.maintain("agg").choice == "id"
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})
    assert len(m.history_model("agg").maintain) == 2


def test_a_warm_session_measures_a_warm_run_before_trusting_cold_ones(
        env: tuple[PostgresMaintainer, Conn], pg_schema: str) -> None:
    """With only a cold maintenance measured (a session's first run plans every statement), a
    refresh in a session that has already run the view's code maintains once to measure a
    warm run, where the batch is within 4× of recomputing at the default floor; from then on
    the warm runs are the samples."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    hist = sql.Identifier(_companion(pg_schema), "refresh_history")
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 3")
    m.maintain("agg", strategy="id")  # the session runs the Δ-script over changes: warm now
    # (its sample, cold, replaced by the seeded one)
    conn.execute(sql.SQL("DELETE FROM {} WHERE view = 'agg' AND strategy = 'id'").format(hist))
    conn.execute(sql.SQL("INSERT INTO {} (view, strategy, changes, seconds, base_rows, reason, "
                         "cold) VALUES ('agg', 'id', 20, 0.5, NULL, 'seeded: cold', true)"
                         ).format(hist))
    _seed(conn, pg_schema, "agg", 0.2)  # recomputing: 0.2 s; the cold maintenance 0.5 s
    conn.execute("UPDATE t SET x = x + 1 WHERE id < 21")
    stats = m.maintain("agg")
    assert stats.choice == "id" and "measure a warm run" in stats.reason, stats.decision
    assert not m.history_model("agg").cold_only
    _check(conn, pg_schema, {"agg": QUERIES["agg"]})


def test_the_cached_model_marks_a_cold_first_sample_as_the_history_does(
        env: tuple[PostgresMaintainer, Conn], pg_schema: str) -> None:
    """The maintainer keeps each auto view's model between refreshes, brought up to date with
    each run: a session's first run, the first sample, leaves it cold-only as a re-read of the
    refresh history would; the next (warm) run replaces it."""
    m, conn = env
    m.create_view("agg", QUERIES["agg"], strategy="auto")
    _seed(conn, pg_schema, "agg", DEAR)  # (the Δ-script chosen)
    for k, cold in ((20, True), (30, False)):
        conn.execute("UPDATE t SET x = x + 1 WHERE id < %s", (k,))
        assert m.maintain("agg").choice == "id"
        assert m._costs["agg"].history.cold_only is cold
        assert m.history_model("agg").cold_only is cold
