"""PostgreSQL backend against what users' databases hold (issue 24): names with any character,
maintains cancelled or timed out at every point, schema changes that rewrite data behind the
change log, json columns, and functions whose value can change without a logged change.

Every test that maintains compares each view, as a multiset, with its recomputation. Every
wait is bounded (statement_timeout / lock_timeout on every connection, timeouts on joins).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest
from psycopg import sql

import idivm
from idivm.errors import BackendError, MaintenanceError, UnsupportedSQL
from idivm.postgres import PostgresMaintainer
from idivm.postgres.compile import lock_relation

try:
    from tests.differential.harness import normalize_rows
    from tests.differential.pg_env import Env as BaseEnv
except ImportError:  # pragma: no cover - run from inside tests/
    from differential.harness import normalize_rows  # type: ignore[no-redef]
    from differential.pg_env import Env as BaseEnv  # type: ignore[no-redef]

Conn = psycopg.Connection[Any]
WAIT = 15.0


# --------------------------------------------------------------------------- helpers


class Env(BaseEnv):
    """One schema (any name) in the test database; its connections closed at teardown."""

    def check(self, text_columns: bool = False) -> None:
        """Each view equals its recomputation (one snapshot for both); ``text_columns``:
        compare every value as text (json has no equality)."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as c:
            c.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(self.schema)))
            with c.transaction():
                c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                for name, view_sql in self.views.items():
                    got = rows(c, sql.SQL("SELECT * FROM {}").format(
                        sql.Identifier(self.schema, name)), text_columns)
                    want = rows(c, view_sql, text_columns)
                    assert got == want, f"view {name} differs from its recomputation: " \
                                        f"{got - want} extra, {want - got} missing"


def rows(conn: Conn, query: sql.Composable | str, text_columns: bool = False) -> Counter[Any]:
    if text_columns:
        inner = sql.SQL(query) if isinstance(query, str) else query
        query = sql.SQL("SELECT to_jsonb(r)::text FROM ({}) r").format(inner)
    return normalize_rows(conn.execute(query).fetchall())


def ident(name: str) -> str:
    return sql.Identifier(name).as_string(None)


@pytest.fixture
def env(pg_dsn: str, pg_schema: str) -> Iterator[Env]:
    with ExitStack() as stack:
        yield Env(pg_dsn, pg_schema, stack)


def companion_objects(conn: Conn, schema: str) -> tuple[bool, int]:
    """Whether the companion schema exists, and how many idivm triggers the schema's tables
    have."""
    comp = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                        (f"{schema}__idivm",)).fetchone()
    trig = conn.execute(
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND t.tgname LIKE 'idivm%%'", (schema,)).fetchone()
    return bool(comp and comp[0]), int(trig[0]) if trig else 0


# --------------------------------------------------------------------------- 1. names

NASTY = ["q'x", 'd"q', "ü", "bs\\x", "sp ace", "MiXed", "é'\"\\ ü"]


@pytest.mark.parametrize("schema_name", NASTY)
def test_names_with_any_character(pg_dsn: str, schema_name: str) -> None:
    """Schema, table and column names with quotes, backslashes, non-ASCII, spaces and mixed
    case: create, maintain over every kind of change, the DDL guard, drop."""
    schema = f"{schema_name}_{time.monotonic_ns() % 100000}"
    tab_a, tab_b, col = "Tq'ü", 'b"\\s', "c'x\"ü"
    with ExitStack() as stack:
        e = Env(pg_dsn, schema, stack)
        admin = psycopg.connect(pg_dsn, autocommit=True)
        stack.callback(admin.close)
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            _names_scenario(e, tab_a, tab_b, col)
        finally:
            for s in (schema, f"{schema}__idivm"):
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(s)))


def _names_scenario(e: Env, tab_a: str, tab_b: str, col: str) -> None:
    a, b, c = ident(tab_a), ident(tab_b), ident(col)
    w = e.conn()
    w.execute(f"CREATE TABLE {a} (id int PRIMARY KEY, {c} int, g text)")
    w.execute(f"CREATE TABLE {b} (id int PRIMARY KEY, a_id int, v int)")
    w.execute(f"INSERT INTO {a} SELECT i, i % 7, 'g' || (i % 3) FROM generate_series(1, 30) i")
    w.execute(f"INSERT INTO {b} SELECT i, 1 + i % 30, i FROM generate_series(1, 60) i")
    m = e.maintainer()
    e.create(m, "v join", f"SELECT x.id, x.{c}, y.v FROM {a} x JOIN {b} y ON y.a_id = x.id "
                          f"WHERE x.{c} > 1")
    e.create(m, "V'agg", f"SELECT x.g, sum(y.v) AS s, count(*) AS n FROM {a} x "
                         f"JOIN {b} y ON y.a_id = x.id GROUP BY x.g", strategy="tuple")
    w.execute(f"INSERT INTO {a} VALUES (31, 5, 'g9')")
    w.execute(f"INSERT INTO {b} VALUES (61, 31, 100), (62, 2, 7)")
    w.execute(f"UPDATE {a} SET {c} = {c} + 3 WHERE id % 4 = 0")
    w.execute(f"UPDATE {b} SET id = id + 1000 WHERE id % 5 = 0")  # key updates
    w.execute(f"DELETE FROM {b} WHERE id % 9 = 0")
    for name in e.views:
        m.maintain(name)
    e.check()
    assert {s["view"] for s in m.status()} == set(e.views)
    # the DDL guard still recognizes the tables: a rename is refused, harmless DDL passes
    with pytest.raises(psycopg.errors.ObjectInUse, match="renaming"):
        w.execute(f"ALTER TABLE {a} RENAME TO other")
    w.execute(f"ALTER TABLE {a} ADD COLUMN extra int")
    w.execute(f"UPDATE {a} SET g = 'g1' WHERE id = 3")
    for name in e.views:
        m.maintain(name)
    e.check()
    for name in list(e.views):
        m.drop_view(name)
    assert companion_objects(w, e.schema) == (False, 0)


# --------------------------------------------------------------------------- 2. cancels

PAPER = """
CREATE TABLE devices (did text PRIMARY KEY, category text);
CREATE TABLE parts (pid text PRIMARY KEY, price int NOT NULL);
CREATE TABLE devices_parts (did text NOT NULL REFERENCES devices (did),
                            pid text NOT NULL REFERENCES parts (pid), PRIMARY KEY (did, pid));
INSERT INTO devices SELECT 'D' || i, CASE WHEN i % 3 = 0 THEN 'tablet' ELSE 'phone' END
  FROM generate_series(0, 999) i;
INSERT INTO parts SELECT 'P' || i, 1 + (i * 37) % 100 FROM generate_series(0, 499) i;
INSERT INTO devices_parts SELECT 'D' || (i % 1000), 'P' || ((i % 1000 + (i / 1000) * 19) % 500)
  FROM generate_series(0, 7999) i;
ANALYZE devices, parts, devices_parts;
"""
V_SQL = ("SELECT dp.did, dp.pid, p.price FROM devices d JOIN devices_parts dp ON dp.did = d.did "
         "JOIN parts p ON p.pid = dp.pid WHERE d.category = 'phone'")
V_AGG_SQL = ("SELECT dp.did, sum(p.price) AS cost FROM devices_parts dp JOIN parts p "
             "ON p.pid = dp.pid GROUP BY dp.did")


def batch(w: Conn, k: int) -> None:
    """Changes touching every table (different rows each round ``k``)."""
    with w.transaction():
        w.execute("UPDATE parts SET price = price + 1 WHERE (hashtext(pid) + %s) %% 5 = 0", (k,))
        w.execute("UPDATE devices SET category = CASE WHEN category = 'phone' THEN 'tablet' "
                  "ELSE 'phone' END WHERE (hashtext(did) + %s) %% 13 = 0", (k,))
        w.execute("DELETE FROM devices_parts WHERE (hashtext(did || pid) + %s) %% 17 = 0", (k,))
        w.execute("INSERT INTO devices_parts SELECT 'D' || ((i * 7 + %s) %% 1000), "
                  "'P' || ((i * 11 + %s * 3) %% 500) FROM generate_series(0, 400) i "
                  "ON CONFLICT DO NOTHING", (k, k))


def held_by(conn: Conn, pid: int, env: Env, view: str) -> list[str]:
    """Locks backend ``pid`` holds that another maintain of ``view`` would wait for."""
    lock = f"{sql.Identifier(env.companion, lock_relation(view)).as_string(None)}"
    return [str(r[0]) for r in conn.execute(
        "SELECT locktype || ' ' || mode FROM pg_locks WHERE pid = %s AND granted AND "
        "(locktype = 'advisory' OR relation = to_regclass(%s))", (pid, lock)).fetchall()]


def pending(m: PostgresMaintainer, view: str) -> int:
    return sum(m.status(view)[0]["pending_log_rows"].values())


def assert_truthful(env: Env, m: PostgresMaintainer, view: str, outcome: Any,
                    before: Counter[Any], mon: Conn) -> str:
    """``outcome`` (stats or the exception) tells the truth, and nothing is left locked."""
    c = env.conn()
    now = rows(c, sql.SQL("SELECT * FROM {}").format(sql.Identifier(env.schema, view)))
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, MaintenanceError), repr(outcome)
        assert "rolled back" in str(outcome), str(outcome)
        assert now == before, "reported rolled back, but the view changed"
        assert pending(m, view) > 0, "reported rolled back, but the changes were consumed"
        kind = "rolled back"
    else:
        assert pending(m, view) == 0, "returned normally, but changes are still pending"
        want = rows(c, env.views[view])
        assert now == want, f"returned normally, but the view is wrong: {now - want} extra, " \
                            f"{want - now} missing"
        kind = "committed"
    assert held_by(mon, m.conn.info.backend_pid, env, view) == []
    # another session maintains the view without waiting
    other = env.maintainer(lock_timeout="2s")
    other.maintain(view)
    other.close()
    return kind


def test_statement_timeout_swept_across_a_maintain(env: Env) -> None:
    """statement_timeout from 1 ms to past the whole maintain, in fine steps: each outcome is
    either committed (stats returned, view right) or rolled back (said so, nothing consumed),
    never a lock left behind; then the view equals its recomputation."""
    w = env.conn()
    w.execute(PAPER)
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    mon = env.conn()
    batch(w, 0)
    start = time.perf_counter()
    m.maintain("v")  # (also creates the session's temporary tables)
    batch(w, 1)
    start = time.perf_counter()
    m.maintain("v")
    whole = max(time.perf_counter() - start, 0.01)
    outcomes: Counter[str] = Counter()
    steps = 30
    # past the sweep, the timeout doubles until a maintain commits (a machine slower now than
    # when ``whole`` was timed), up to the 30 s the other statements run under
    sweep = [max(1, round(1000 * whole * 1.5 * k / steps)) for k in range(steps)]
    extra = [sweep[-1] * 2 ** i for i in range(1, 16) if sweep[-1] * 2 ** i <= 30_000]
    for k, ms in enumerate(sweep + extra):
        if k >= steps and outcomes["committed"] > 0:
            break
        batch(w, k + 2)
        c = env.conn()
        before = rows(c, sql.SQL("SELECT * FROM {}").format(sql.Identifier(env.schema, "v")))
        m.conn.execute(f"SET statement_timeout = {ms}")
        outcome: Any
        try:
            outcome = m.maintain("v")
        except idivm.IdivmError as e:
            outcome = e
        m.conn.execute("SET statement_timeout = '30s'")
        outcomes[assert_truthful(env, m, "v", outcome, before, mon)] += 1
    m.maintain("v")
    env.check()
    assert outcomes["rolled back"] > 0 and outcomes["committed"] > 0, outcomes


class Bg(threading.Thread):
    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - reported by outcome()
            self.error = e

    def outcome(self) -> Any:
        self.join(WAIT)
        assert not self.is_alive(), "the maintain did not finish"
        return self.error if self.error is not None else self.result


def wait_for_lock(mon: Conn, pid: int, t: Bg) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        row = mon.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                          (pid,)).fetchone()
        if row and row[0] == "Lock":
            return
        assert t.is_alive(), f"the maintain finished instead of waiting: {t.error!r}"
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock")


# where a maintain is held, in the order it gets there; what a cancel there must report
POINTS = {
    "the registry": ("LOCK TABLE {registry} IN ACCESS EXCLUSIVE MODE", "rolled back"),
    "view lock": ("LOCK TABLE {lock} IN EXCLUSIVE MODE", "rolled back"),
    "base table": ("LOCK TABLE devices IN ACCESS EXCLUSIVE MODE", "rolled back"),
    "stored view": ("LOCK TABLE {store} IN EXCLUSIVE MODE", "rolled back"),
    "its commit": (None, "rolled back"),  # a deferred trigger on the stored view, at COMMIT
    "the prune": ("SELECT 1 FROM {log_tables} FOR UPDATE", "committed"),
}


@pytest.mark.parametrize("how", ["pg_cancel_backend", "statement_timeout"])
@pytest.mark.parametrize("point", list(POINTS))
def test_cancel_at_each_point_of_a_maintain(env: Env, point: str, how: str) -> None:
    """A maintain held at each of its waiting points — its first read (the registry, before
    the ``CALL``), the view's lock, a base table's lock
    before the snapshot, its writes, its COMMIT, the prune after it — and cancelled there:
    the outcome says what happened, no lock is left, and a re-run makes the view right."""
    w = env.conn()
    w.execute(PAPER)
    m = env.maintainer()
    m.conn.execute("SET idivm.prune_xids = 0")  # its prune is due (it would wait otherwise)
    env.create(m, "v", V_SQL)
    env.create(m, "agg", V_AGG_SQL)
    m.maintain("v")
    batch(w, 7)
    mon = env.conn()
    before = rows(mon, sql.SQL("SELECT * FROM {}").format(sql.Identifier(env.schema, "v")))
    names = {"lock": sql.Identifier(env.companion, lock_relation("v")).as_string(None),
             "store": sql.Identifier(env.companion, "v__store").as_string(None),
             "log_tables": sql.Identifier(env.companion, "log_tables").as_string(None),
             "registry": sql.Identifier(env.companion, "views").as_string(None)}
    holder = env.conn(autocommit=False)
    hold, expected = POINTS[point]
    if hold is None:  # a deferred constraint trigger sleeping at the maintenance's COMMIT
        mon.execute("CREATE FUNCTION pg_temp_sleep() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$BEGIN PERFORM pg_sleep(20); RETURN NULL; END$$")
        mon.execute(sql.SQL("CREATE CONSTRAINT TRIGGER slow AFTER INSERT OR UPDATE OR DELETE "
                            "ON {} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE "
                            "FUNCTION pg_temp_sleep()").format(
            sql.Identifier(env.companion, "v__store")))
    else:
        holder.execute(hold.format(**names))
    if how == "statement_timeout":
        m.conn.execute("SET statement_timeout = '1s'")
    pid = m.conn.info.backend_pid
    t = Bg(lambda: m.maintain("v"))
    t.start()
    if hold is None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # sleeping in the trigger
            row = mon.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                              (pid,)).fetchone()
            if row and row[0] == "PgSleep":
                break
            time.sleep(0.01)
    else:
        wait_for_lock(mon, pid, t)
    if how == "pg_cancel_backend":
        mon.execute("SELECT pg_cancel_backend(%s)", (pid,))
    outcome = t.outcome()
    holder.rollback()
    m.conn.execute("SET statement_timeout = '30s'")
    if hold is None:
        mon.execute(sql.SQL("DROP TRIGGER slow ON {}").format(
            sql.Identifier(env.companion, "v__store")))
    assert assert_truthful(env, m, "v", outcome, before, mon) == expected
    for name in env.views:
        m.maintain(name)
    env.check()


def test_interrupted_after_the_commit_reports_it_committed(env: Env) -> None:
    """A timeout outside every handler after the maintenance committed (here: at the prune's
    COMMIT, held by a deferred trigger) returns the run's statistics instead of claiming it
    "failed and was rolled back", and leaves no lock behind. The prune only reaches log rows
    below every running transaction of the cluster: a few attempts."""
    w = env.conn()
    w.execute(PAPER)
    m = env.maintainer()
    m.conn.execute("SET idivm.prune_xids = 0")  # every prune due
    env.create(m, "v", V_SQL)
    mon = env.conn()
    mon.execute("CREATE SEQUENCE fired")
    mon.execute(sql.SQL(
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "PERFORM nextval({}); PERFORM pg_sleep(20); RETURN NULL; END$$").format(
        sql.Literal(sql.Identifier(env.schema, "fired").as_string(None))))
    mon.execute(sql.SQL(
        "CREATE CONSTRAINT TRIGGER slow AFTER UPDATE ON {} DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION {}()").format(
        sql.Identifier(env.companion, "log_tables"), sql.Identifier(env.schema, "slow")))
    for k in range(30):
        batch(w, k)
        m.conn.execute("SET statement_timeout = '1500ms'")
        try:
            stats = m.maintain("v")
        finally:
            m.conn.execute("SET statement_timeout = '30s'")
        row = mon.execute("SELECT last_value, is_called FROM fired").fetchone()
        assert row is not None
        assert stats.view == "v" and pending(m, "v") == 0
        assert held_by(mon, m.conn.info.backend_pid, env, "v") == []
        env.check()
        if row[1]:  # a prune ran after the commit and was interrupted
            break
        time.sleep(0.3)
    # (when other sessions' long transactions held the log rows in every attempt, no prune
    # ran: the invariants above were still checked after every maintain)


def test_a_failed_maintain_after_a_committed_one_reports_the_failure(env: Env) -> None:
    """The session keeps the statistics of the last run that committed (``_committed``),
    tagged with that run's call: a run that fails before its commit — here, waiting for the
    view's lock past ``lock_timeout`` — finds another call's tag there and is reported as
    failed and rolled back, not as that earlier run."""
    w = env.conn()
    w.execute(PAPER)
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    batch(w, 0)
    m.maintain("v")  # committed: its statistics stay in the session
    batch(w, 1)
    holder = env.conn()
    holder.autocommit = False
    holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
        sql.Identifier(env.companion, lock_relation("v"))))
    m.conn.execute("SET lock_timeout = '200ms'")
    try:
        with pytest.raises(MaintenanceError, match="rolled back"):
            m.maintain("v")
    finally:
        m.conn.execute("RESET lock_timeout")
        holder.rollback()
    assert pending(m, "v") > 0
    m.maintain("v")
    assert pending(m, "v") == 0
    env.check()


def test_a_dropped_view_leaves_no_compiled_code_in_the_session(env: Env) -> None:
    """PL/pgSQL keeps the compiled code and cached plans of a function a session ran until
    the session ends — also once the function is dropped — and every invalidation message
    another session sends walks them all: ``drop_view`` leaves the maintainer on a new
    session, where the other views go on (their next run planned again)."""
    w, m = paper_view(env)
    batch(w, 0)
    maintain_all(env, m)

    def compiled() -> int:
        row = m.conn.execute("SELECT count(*) FROM pg_backend_memory_contexts "
                             "WHERE name = 'PL/pgSQL function'").fetchone()
        return int(row[0]) if row else 0

    assert compiled() >= 2  # (both views' functions, the procedure)
    m.drop_view("agg")
    del env.views["agg"]
    assert compiled() == 0
    batch(w, 1)
    maintain_all(env, m)
    assert compiled() >= 1


# --------------------------------------------------------------------------- 3. schema changes


def paper_view(env: Env) -> tuple[Conn, PostgresMaintainer]:
    w = env.conn()
    w.execute(PAPER)
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "agg", V_AGG_SQL)
    return w, m


def maintain_all(env: Env, m: PostgresMaintainer) -> None:
    for name in env.views:
        m.maintain(name)
    env.check()


def test_retype_that_rewrites_read_values_is_refused(env: Env) -> None:
    w, m = paper_view(env)
    with pytest.raises(psycopg.errors.ObjectInUse, match='column "price".*rewriting'):
        w.execute("ALTER TABLE parts ALTER COLUMN price TYPE int USING price + 1000")
    with pytest.raises(psycopg.errors.ObjectInUse):  # to another type too
        w.execute("ALTER TABLE parts ALTER COLUMN price TYPE bigint USING price * 2")
    w.execute("UPDATE parts SET price = price + 1000 WHERE pid < 'P3'")  # the logged way
    maintain_all(env, m)


@pytest.mark.parametrize("ddl", [
    "ALTER TABLE parts ALTER COLUMN price TYPE int USING price",  # no rewrite, same values
    "ALTER TABLE parts ALTER COLUMN price SET DEFAULT 5",
    "ALTER TABLE parts ALTER COLUMN price SET STATISTICS 200",
    "ALTER TABLE parts ADD COLUMN z float DEFAULT random()",  # a rewrite keeping every value
    "ALTER TABLE parts ADD COLUMN w int; ALTER TABLE parts ALTER COLUMN w TYPE bigint "
    "USING w + 1",  # a rewrite of a column no view reads
    "ALTER TABLE parts SET (fillfactor = 70); ALTER TABLE parts ALTER COLUMN price SET NOT NULL",
    "ALTER TABLE parts ADD CONSTRAINT positive CHECK (price > 0)",
    "ALTER TABLE devices_parts DROP CONSTRAINT devices_parts_pkey, ADD PRIMARY KEY (did, pid)",
    "ALTER TABLE devices_parts DROP CONSTRAINT devices_parts_pkey, "
    "ADD CONSTRAINT dp UNIQUE (did, pid)",
    "CREATE INDEX ON parts (price); VACUUM FULL parts; CLUSTER parts USING parts_pkey",
])
def test_harmless_ddl_passes(env: Env, ddl: str) -> None:
    w, m = paper_view(env)
    for stmt in ddl.split("; "):
        w.execute(stmt)
    w.execute("UPDATE parts SET price = price + 1 WHERE pid < 'P2'")
    w.execute("INSERT INTO devices_parts VALUES ('D1', 'P400') ON CONFLICT DO NOTHING")
    maintain_all(env, m)


def test_dropping_the_primary_key_is_refused(env: Env) -> None:
    w, m = paper_view(env)
    with pytest.raises(psycopg.errors.ObjectInUse, match="primary key"):
        w.execute("ALTER TABLE parts DROP CONSTRAINT parts_pkey CASCADE")
    with pytest.raises(psycopg.errors.ObjectInUse, match="primary key"):
        w.execute("ALTER TABLE devices_parts DROP CONSTRAINT devices_parts_pkey")
    maintain_all(env, m)


def test_primary_key_dropped_behind_the_guard_is_detected(env: Env) -> None:
    """Event triggers do not fire in replica mode: the key is dropped and a duplicate key
    inserted; maintenance refuses (before, it folded the two rows as one change)."""
    w, m = paper_view(env)
    w.execute("SET session_replication_role = replica")
    w.execute("ALTER TABLE parts DROP CONSTRAINT parts_pkey CASCADE")
    w.execute("SET session_replication_role = origin")
    w.execute("INSERT INTO parts VALUES ('P1', 555)")
    with pytest.raises(MaintenanceError, match="lost its primary key"):
        m.maintain("v")


def catalog_checks(m: PostgresMaintainer) -> dict[str, str]:
    """The catalog checks the maintainer's session keeps (``ddl_epoch``): setting → value
    (the settings its views' compiled functions name; placeholders are not in pg_settings)."""
    names = {n for (src,) in m.conn.execute(
        "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace "
        "WHERE s.nspname = %s", (m.companion,)).fetchall()
        for n in re.findall(r"idivm\.checked_\w+", str(src))}
    out = {n: m.conn.execute("SELECT current_setting(%s, true)", (n,)).fetchone()
           for n in sorted(names)}
    return {n: str(v[0]) for n, v in out.items() if v and v[0]}


def test_the_catalogs_are_checked_again_only_after_ddl(env: Env) -> None:
    """A maintain checks its tables' catalogs, and its session's next maintains check them
    again only once some DDL has committed: not after a temporary table's creation (a
    session's scratch relations, CREATE TEMP TABLE … AS) nor a materialized view's refresh,
    after any other DDL."""
    w, m = paper_view(env)
    # a transaction open across the DDL below: the snapshots' xmin stays below its xid, so
    # the DDL log's rows past that xmin are each asked whether the kept snapshot saw them
    long = env.conn()
    long.execute("BEGIN")
    long.execute("SELECT pg_current_xact_id()")
    w.execute("CREATE MATERIALIZED VIEW mv AS SELECT count(*) AS n FROM parts")
    quiet = env.conn()  # the DDL of other sessions (other tests) waits meanwhile
    with quiet.transaction():
        quiet.execute("SET LOCAL lock_timeout = '120s'")
        quiet.execute("SET LOCAL statement_timeout = '120s'")
        quiet.execute("LOCK TABLE idivm.ddl_log IN SHARE MODE")
        batch(w, 1)
        maintain_all(env, m)
        kept = catalog_checks(m)
        assert len(kept) == 2 and all(kept.values())
        batch(w, 2)
        w.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS x; CREATE INDEX ON scratch (x); "
                  "DROP TABLE scratch")
        w.execute("REFRESH MATERIALIZED VIEW mv")  # (its rows only: no view's table)
        maintain_all(env, m)
        assert catalog_checks(m) == kept
    long.execute("COMMIT")
    batch(w, 3)
    w.execute("CREATE INDEX ON devices (category)")
    maintain_all(env, m)
    again = catalog_checks(m)
    assert again.keys() == kept.keys() and all(again[k] != kept[k] for k in kept)


@pytest.mark.parametrize("ddl, error", [
    # behind the guard (its event triggers do not fire in replica mode)
    ("SET session_replication_role = replica; "
     "ALTER TABLE parts DROP CONSTRAINT parts_pkey CASCADE; "
     "SET session_replication_role = origin; INSERT INTO parts VALUES ('P1', 555)",
     "lost its primary key"),
    ("SET session_replication_role = replica; "
     "ALTER TABLE parts DISABLE TRIGGER idivm_log_update; "
     "SET session_replication_role = origin", "change logging was disabled"),
    # a temporary child: its rows are the parent's, its writes fire none of its triggers
    ("CREATE TEMP TABLE kid () INHERITS (parts)", "altered, dropped or re-created"),
    # the DDL log's trigger off while the key goes, then on again
    ("ALTER EVENT TRIGGER idivm_ddl_epoch DISABLE; "
     "SET session_replication_role = replica; "
     "ALTER TABLE parts DROP CONSTRAINT parts_pkey CASCADE; "
     "SET session_replication_role = origin; "
     "ALTER EVENT TRIGGER idivm_ddl_epoch ENABLE ALWAYS; INSERT INTO parts VALUES ('P1', 555)",
     "lost its primary key"),
])
def test_ddl_after_a_kept_catalog_check_is_detected(env: Env, ddl: str, error: str) -> None:
    """A session that has checked its tables' catalogs sees the DDL committed since, however
    it was made: the maintain refuses, naming what changed."""
    w, m = paper_view(env)
    batch(w, 1)
    maintain_all(env, m)
    assert catalog_checks(m)
    try:
        for stmt in ddl.split("; "):
            w.execute(stmt)
        w.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P2'")
        with pytest.raises(MaintenanceError, match=error):
            m.maintain("agg")
    finally:
        w.execute("ALTER EVENT TRIGGER idivm_ddl_epoch ENABLE ALWAYS")


def test_another_roles_ddl_is_logged_and_the_log_readable(env: Env) -> None:
    """The DDL log's trigger runs as its owner: a role that may not write the log runs its
    DDL as before (it is logged), and reads the log as a maintain does."""
    w, _ = paper_view(env)
    role = f"idivm_role_{env.schema[-12:]}"
    w.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        w.execute(sql.SQL("GRANT CREATE, USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(env.schema), sql.Identifier(role)))
        before = w.execute("SELECT coalesce(max(id), 0) FROM idivm.ddl_log").fetchone()
        with w.transaction():
            w.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            w.execute(sql.SQL("CREATE TABLE {} (k int PRIMARY KEY)").format(
                sql.Identifier(env.schema, "mine")))
            newest = w.execute("SELECT max(xid) FROM idivm.ddl_log").fetchone()
        after = w.execute("SELECT coalesce(max(id), 0) FROM idivm.ddl_log").fetchone()
        assert newest is not None and newest[0] is not None
        assert before is not None and after is not None and after[0] > before[0]
    finally:
        w.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(env.schema, "mine")))
        w.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        w.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_ddl_committed_after_a_check_that_ran_beside_it_is_detected(env: Env) -> None:
    """A DDL transaction still open while a maintain checks the catalogs (its change not in
    the maintain's snapshot, its DDL log row not visible to it) is seen by the next maintain
    once it commits."""
    w, m = paper_view(env)
    batch(w, 1)
    ddl = env.conn()
    with ddl.transaction():
        ddl.execute("SET LOCAL session_replication_role = replica")
        ddl.execute("ALTER TABLE parts DISABLE TRIGGER idivm_log_update")  # (no writer lock)
        maintain_all(env, m)  # checks under a snapshot without the DDL
        kept = catalog_checks(m)
        assert kept
    w.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P2'")  # not logged now
    with pytest.raises(MaintenanceError, match="change logging was disabled"):
        m.maintain("agg")


@pytest.mark.parametrize("strategy", ["id", "tuple"])
def test_a_not_null_column_the_view_relies_on_made_nullable_is_detected(
        env: Env, strategy: str) -> None:
    """A view's plan relies on the columns NOT NULL when it was created (NOT IN, the
    non-null counts of SUM and AVG over the log's images): after ``DROP NOT NULL`` and a
    NULL, maintenance refuses and names the column (it went on, wrong: the NOT IN kept a
    row its query no longer returns); dropping NOT NULL of a column the view does not read,
    or of one nullable anyway, is harmless."""
    w = env.conn()
    w.execute("CREATE TABLE a (k int PRIMARY KEY, x int NOT NULL, z int NOT NULL); "
              "CREATE TABLE b (k int PRIMARY KEY, y int NOT NULL, amount int NOT NULL); "
              "INSERT INTO a VALUES (1, 10, 0), (2, 20, 0); "
              "INSERT INTO b VALUES (1, 10, 5), (2, 30, 7)")
    m = env.maintainer()
    env.create(m, "v", "SELECT b.k FROM b WHERE b.y NOT IN (SELECT a.x FROM a)",
               strategy=strategy)
    env.create(m, "s", "SELECT b.y, SUM(b.amount) AS total, AVG(b.amount) AS mean, "
               "COUNT(*) AS n FROM b GROUP BY b.y", strategy=strategy)
    w.execute("ALTER TABLE a ALTER COLUMN z DROP NOT NULL")  # not read by the views
    w.execute("INSERT INTO a VALUES (3, 40, NULL); INSERT INTO b VALUES (3, 30, 1)")
    maintain_all(env, m)
    w.execute("ALTER TABLE a ALTER COLUMN x DROP NOT NULL")
    w.execute("INSERT INTO a VALUES (4, NULL, 0)")
    with pytest.raises(MaintenanceError, match="column x of table .*a is no longer NOT NULL"):
        m.maintain("v")
    w.execute("ALTER TABLE b ALTER COLUMN amount DROP NOT NULL")
    w.execute("INSERT INTO b VALUES (5, 30, NULL)")
    with pytest.raises(MaintenanceError, match="column amount of table .*b is no longer"):
        m.maintain("s")


def test_a_catalog_declaring_a_nullable_column_not_null_is_refused_at_create(env: Env
                                                                             ) -> None:
    """The plan would rely on a NOT NULL the table does not enforce: refused, naming the
    column, nothing created."""
    from idivm.catalog import Catalog
    from idivm.errors import CatalogError

    w = env.conn()
    w.execute("CREATE TABLE a (k int PRIMARY KEY, x int); CREATE TABLE b (k int PRIMARY KEY, "
              "y int NOT NULL)")
    m = env.maintainer()
    catalog = Catalog.from_ddl("CREATE TABLE a (k int PRIMARY KEY, x int NOT NULL); "
                               "CREATE TABLE b (k int PRIMARY KEY, y int NOT NULL)")
    with pytest.raises(CatalogError, match="column x of table .*a NOT NULL"):
        m.create_view("v", "SELECT b.k FROM b WHERE b.y NOT IN (SELECT a.x FROM a)",
                      catalog=catalog)
    assert companion_objects(w, env.schema)[1] == 0  # no logging trigger left


def test_table_without_an_enforced_key_is_refused_at_create(env: Env) -> None:
    """A catalog may declare a key the table does not have: its log could not be folded."""
    w = env.conn()
    w.execute("CREATE TABLE u (id int, v int)")
    w.execute("CREATE TABLE n (id int, v int)")
    w.execute("CREATE UNIQUE INDEX ON n (id)")  # nullable: not a key
    w.execute("CREATE TABLE t (id int, v int, CONSTRAINT t_pk PRIMARY KEY (id) DEFERRABLE)")
    w.execute("INSERT INTO t SELECT i, i FROM generate_series(1, 5) i")
    m = env.maintainer()
    cat = idivm.Catalog.from_ddl("CREATE TABLE u (id int PRIMARY KEY, v int); "
                                 "CREATE TABLE n (id int PRIMARY KEY, v int)")
    for view in ("SELECT id, v FROM u", "SELECT id, v FROM n"):
        with pytest.raises(UnsupportedSQL, match="enforced key"):
            m.create_view("vu", view, catalog=cat)
    assert companion_objects(w, env.schema) == (False, 0)
    # a DEFERRABLE key is enforced (duplicates within a transaction cancel in the fold)
    env.create(m, "vt", "SELECT id, v FROM t")
    with w.transaction():
        w.execute("SET CONSTRAINTS ALL DEFERRED")
        w.execute("INSERT INTO t VALUES (1, 100)")
        w.execute("DELETE FROM t WHERE id = 1 AND v = 1")
    w.execute("UPDATE t SET id = 6 - id")
    maintain_all(env, m)


# --------------------------------------------------------------------------- 4. json


@pytest.mark.parametrize("strategy", ["id", "tuple"])
def test_json_columns(env: Env, strategy: str) -> None:
    w = env.conn()
    w.execute("CREATE TABLE t (id int PRIMARY KEY, j json, b jsonb, k int)")
    w.execute("CREATE TABLE u (id int PRIMARY KEY, t_id int, note json)")
    w.execute("""INSERT INTO t SELECT i, json_build_object('a', i, 'l', json_build_array(i)),
                 jsonb_build_object('b', i % 3), i % 4 FROM generate_series(1, 20) i""")
    w.execute("INSERT INTO u SELECT i, 1 + i % 20, to_json(i) FROM generate_series(1, 40) i")
    m = env.maintainer()
    env.create(m, "mv_json", "SELECT id, j FROM t", strategy=strategy)
    env.create(m, "mv_both", "SELECT id, j, b FROM t WHERE k < 3", strategy=strategy)
    env.create(m, "mv_join", "SELECT u.id, t.j, u.note FROM u JOIN t ON u.t_id = t.id",
               strategy=strategy)
    env.create(m, "mv_left", "SELECT t.id, t.j, u.note FROM t LEFT JOIN u ON u.t_id = t.id "
                             "AND u.id > 30", strategy=strategy)
    w.execute("""UPDATE t SET j = '{"a":  2}' WHERE id = 1""")  # other text, equal as jsonb
    w.execute("""UPDATE t SET j = '{"a":2}' WHERE id = 2""")
    w.execute("UPDATE t SET k = k + 1 WHERE id % 3 = 0")
    w.execute("UPDATE t SET b = '[1]' WHERE id = 4")
    w.execute("""INSERT INTO t VALUES (21, '{"z": [1]}', '{}', 0), (22, NULL, NULL, 1)""")
    w.execute("UPDATE u SET t_id = 21, note = '\"x\"' WHERE id % 7 = 0")
    w.execute("DELETE FROM u WHERE id = 35")
    w.execute("UPDATE t SET j = j WHERE id = 5")  # a no-op update
    maintain_all_text(env, m)
    w.execute("UPDATE t SET id = id + 100 WHERE id % 5 = 0")
    w.execute("UPDATE u SET note = NULL WHERE id < 5")
    maintain_all_text(env, m)


@pytest.mark.parametrize("strategy", ["id", "tuple"])
def test_xml_columns(env: Env, strategy: str) -> None:
    """xml has no = either; the change-log fold groups it by text using the server's type
    (a reflected catalog does not know xml)."""
    w = env.conn()
    w.execute("CREATE TABLE x (id int PRIMARY KEY, doc xml, k int)")
    w.execute("INSERT INTO x SELECT i, xmlelement(name a, i), i % 3 FROM generate_series(1, 9) i")
    m = env.maintainer()
    env.create(m, "mv_xml", "SELECT id, doc FROM x WHERE k < 2", strategy=strategy)
    w.execute("UPDATE x SET doc = '<b/>' WHERE id = 1")
    w.execute("UPDATE x SET k = 0 WHERE id = 2")
    w.execute("UPDATE x SET doc = doc WHERE id = 3")
    w.execute("DELETE FROM x WHERE id = 4")
    w.execute("INSERT INTO x VALUES (10, '<c>1</c>', 1)")
    maintain_all_text(env, m)


def maintain_all_text(env: Env, m: PostgresMaintainer) -> None:
    for name in env.views:
        m.maintain(name)
    env.check(text_columns=True)


def test_error_inside_maintenance_is_not_called_a_missing_view(env: Env) -> None:
    """An undefined function raised by the code a maintain runs names the real cause; the
    maintain procedure missing — with the view registered: a create_view whose session was
    lost before its last transaction, ``test_pg_crash`` — is made again; with no such view,
    the maintain says the view does not exist."""
    w, m = paper_view(env)
    w.execute("UPDATE parts SET price = 1 WHERE pid = 'P1'")
    fn = sql.Identifier(env.companion, "consumed")
    w.execute(sql.SQL("ALTER FUNCTION {}() RENAME TO gone").format(fn))
    with pytest.raises(MaintenanceError, match="consumed") as err:
        m.maintain("v")
    assert "no idivm view" not in str(err.value)
    w.execute(sql.SQL("ALTER FUNCTION {}() RENAME TO consumed").format(
        sql.Identifier(env.companion, "gone")))
    maintain_all(env, m)
    w.execute(sql.SQL("DROP PROCEDURE {}").format(  # (whatever its arguments)
        sql.Identifier(env.companion, "maintain")))
    with pytest.raises(BackendError, match="no idivm view 'nope'"):
        m.maintain("nope")
    w.execute("UPDATE parts SET price = 2 WHERE pid = 'P1'")
    maintain_all(env, m)  # (the procedure made again)


# --------------------------------------------------------------------------- 5. functions


@pytest.fixture
def fx(env: Env) -> Conn:
    w = env.conn()
    w.execute("CREATE TABLE fx (id int PRIMARY KEY, rate numeric)")
    w.execute("INSERT INTO fx VALUES (1, 2)")
    w.execute("CREATE TABLE t (id int PRIMARY KEY, amount numeric, s text, d date, "
              "ts timestamp)")
    w.execute("INSERT INTO t SELECT i, i * 1.5, 'x' || i, date '2020-01-01' + i, "
              "timestamp '2020-01-01' + i * interval '1 hour' FROM generate_series(1, 10) i")
    w.execute("CREATE FUNCTION rate() RETURNS numeric STABLE LANGUAGE sql AS "
              "'SELECT rate FROM fx WHERE id = 1'")
    w.execute("CREATE FUNCTION noise(numeric) RETURNS numeric VOLATILE LANGUAGE sql AS "
              "'SELECT $1'")
    w.execute("CREATE FUNCTION twice(numeric) RETURNS numeric IMMUTABLE LANGUAGE sql AS "
              "'SELECT $1 * 2'")
    w.execute("CREATE FUNCTION near(numeric, numeric) RETURNS boolean STABLE LANGUAGE sql AS "
              "'SELECT abs($1 - $2) < (SELECT rate FROM fx WHERE id = 1)'")
    w.execute("CREATE OPERATOR ~~~ (LEFTARG = numeric, RIGHTARG = numeric, FUNCTION = near)")
    return w


@pytest.mark.parametrize(("view", "function"), [
    ("SELECT id, amount * rate() AS x FROM t", "rate()"),
    ("SELECT id FROM t WHERE amount > rate()", "rate()"),
    ("SELECT id, noise(amount) AS x FROM t", "noise(numeric)"),
    ("SELECT id, sum(twice(rate())) AS x FROM t GROUP BY id", "rate()"),
    ("SELECT id FROM t WHERE amount ~~~ 3", "near(numeric,numeric)"),
    ("SELECT t.id FROM t WHERE EXISTS (SELECT 1 FROM fx WHERE fx.rate < rate())", "rate()"),
])
def test_non_immutable_functions_are_refused(env: Env, fx: Conn, view: str,
                                             function: str) -> None:
    m = env.maintainer()
    with pytest.raises(UnsupportedSQL, match=re.escape(f"non-immutable function {function}")
                       ) as err:
        m.create_view("v", view)
    assert err.value.construct == f"non-immutable function {function}"
    assert companion_objects(fx, env.schema) == (False, 0)  # nothing created


def test_immutable_functions_are_accepted(env: Env, fx: Conn) -> None:
    m = env.maintainer()
    env.create(m, "v", "SELECT id, twice(amount) AS x, coalesce(amount, 0) AS c, "
                       "abs(amount) AS a, upper(s) AS u, date_part('year', d) AS y, "
                       "extract(month FROM ts) AS mo, d + 1 AS next FROM t WHERE amount > 2")
    fx.execute("UPDATE t SET amount = amount + 10 WHERE id % 2 = 0")
    fx.execute("UPDATE fx SET rate = 3")
    maintain_all(env, m)


def test_a_view_compiled_before_the_inheritance_fingerprint_recompiles(pg_dsn: str,
                                                                       pg_schema: str) -> None:
    """A view registered by format 2 (fingerprints without the pg_inherits count) is
    recompiled by the first maintain and keeps working; a table that gained a child is
    refused."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn, \
            PostgresMaintainer(pg_dsn, pg_schema) as m:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        conn.execute("CREATE TABLE p (i int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO p VALUES (1, 1)")
        m.create_view("old", "SELECT p.i, p.v FROM p")
        registry = sql.Identifier(f"{pg_schema}__idivm", "views")
        conn.execute(sql.SQL(
            "UPDATE {} SET format_version = 2, fingerprints = (SELECT jsonb_object_agg(k, "
            "regexp_replace(v #>> '{{}}', ':[0-9]+$', '')) "
            "FROM jsonb_each(fingerprints) AS e(k, v))"
        ).format(registry))
        conn.execute("UPDATE p SET v = 2")
        m.maintain("old")
        assert conn.execute("SELECT * FROM old").fetchall() == [(1, 2)]
        conn.execute("CREATE TABLE c () INHERITS (p)")
        with pytest.raises(MaintenanceError, match="altered"):
            m.maintain("old")


def test_pending_log_rows_are_counted_with_or_without_the_statements_counts(
        pg_dsn: str, pg_schema: str) -> None:
    """A maintain counts its pending log rows from the logging statements' counts
    (``log_counts``); a log whose rows have none — written by the triggers of an idivm
    before they counted, which a recompiled view still reads — is counted from its rows,
    and its changes are applied all the same (whether a fold runs never rests on the
    counts)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn, \
            PostgresMaintainer(pg_dsn, pg_schema) as m:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        counts = sql.Identifier(f"{pg_schema}__idivm", "log_counts")

        def pending() -> int:  # (counted from the log's rows, as status() does)
            return int(m.status("w")[0]["pending_log_rows"]["t"])

        conn.execute("CREATE TABLE t (i int PRIMARY KEY, v int)")
        m.create_view("w", "SELECT t.i, t.v FROM t WHERE t.v > 1")
        conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
        conn.execute("UPDATE t SET v = v + 1 WHERE i <= 3")
        first = pending()
        assert first > 0 and conn.execute(sql.SQL("SELECT sum(n) FROM {}").format(
            counts)).fetchone() == (first,)
        assert m.maintain("w").log_rows == {"t": first}
        conn.execute("DELETE FROM t WHERE i > 7")
        conn.execute("UPDATE t SET v = 0 WHERE i = 2")
        conn.execute(sql.SQL("DELETE FROM {}").format(counts))  # as an earlier idivm's triggers
        second = pending()
        assert second > 0
        assert m.maintain("w").log_rows == {"t": second}
        assert conn.execute("SELECT * FROM w ORDER BY i").fetchall() == \
            conn.execute("SELECT * FROM t WHERE v > 1 ORDER BY i").fetchall()


def test_a_column_named_as_the_compiled_variables_is_refused_at_create(env: Env) -> None:
    """A base-table column named like the compiled maintenance's PL/pgSQL variables
    (``idivm__prev``) made every maintain fail ('column reference is ambiguous'): refused by
    name at create_view, nothing left behind. A view's own column of such a name is fine (its
    references are qualified)."""
    m, fx = env.maintainer(), env.conn()
    fx.execute("CREATE TABLE t (i int PRIMARY KEY, idivm__prev int, v int)")
    with pytest.raises(idivm.errors.CatalogError, match="idivm__prev are reserved"):
        m.create_view("w", "SELECT t.i, t.v FROM t")
    assert companion_objects(fx, env.schema)[1] == 0
    fx.execute("CREATE TABLE u (i int PRIMARY KEY, v int)")
    env.create(m, "x", "SELECT u.i, u.v AS idivm__n, u.v + 1 AS idivm__prev FROM u")
    fx.execute("INSERT INTO u SELECT g, g FROM generate_series(1, 5) g")
    maintain_all(env, m)
