"""PostgreSQL backend under concurrency, failures and DDL: writers never blocked by a maintain,
snapshot-exact consumption of the change log, serialized maintains of one view, killed and
cancelled maintains, TRUNCATE, replica mode, the DDL guard, the catalog fingerprint, long view
names, failed create_view, and maintenance through SQL.

Every test ends by maintaining once more and comparing each view, as a multiset, with its
recomputation. Every wait is bounded (statement_timeout / lock_timeout on every connection,
timeouts on thread joins and polls): a hang fails the test instead of hanging the suite.
"""

from __future__ import annotations

import random
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
from idivm.errors import BackendError
from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL
from idivm.postgres import MaintenanceStats, PostgresMaintainer

try:
    from tests.differential.pg_env import Env as BaseEnv
except ImportError:  # pragma: no cover - run from inside tests/
    from differential.pg_env import Env as BaseEnv  # type: ignore[no-redef]

Conn = psycopg.Connection[Any]
Rows = Counter[tuple[Any, ...]]

# 200 devices (every 7th without a category, every 3rd of the others a tablet), 200 parts and
# 2,000 links: device Dd has the parts P((d + 19k) % 200), k = 0..9.
DATA = """
INSERT INTO devices SELECT 'D' || i, CASE WHEN i % 7 = 0 THEN NULL WHEN i % 3 = 0 THEN 'tablet'
                                          ELSE 'phone' END FROM generate_series(0, 199) i;
INSERT INTO parts SELECT 'P' || i, 1 + (i * 37) % 100 FROM generate_series(0, 199) i;
INSERT INTO devices_parts SELECT 'D' || (i % 200), 'P' || ((i % 200 + (i / 200) * 19) % 200)
  FROM generate_series(0, 1999) i;
"""
LOG_TRIGGERS = ("idivm_log_insert", "idivm_log_update", "idivm_log_delete", "idivm_log_truncate")
PAPER_CATALOG = idivm.Catalog.from_ddl(PAPER_DDL)
WAIT = 15.0  # seconds: upper bound of every poll and join


# --------------------------------------------------------------------------- helpers


class Env(BaseEnv):
    """A schema with the paper's tables and data, and every connection a test opens (all
    closed at teardown, before the schema is dropped)."""

    def create(self, m: PostgresMaintainer, name: str, view_sql: str, reflect: bool = False,
               **kw: Any) -> None:
        """``reflect``: let create_view reflect the schema (slow); else pass the paper's
        catalog."""
        if not reflect:
            kw.setdefault("catalog", PAPER_CATALOG)
        super().create(m, name, view_sql, **kw)


@pytest.fixture
def env(pg_dsn: str, pg_schema: str) -> Iterator[Env]:
    with ExitStack() as stack:
        e = Env(pg_dsn, pg_schema, stack)
        c = e.conn()
        c.execute(PAPER_DDL)
        c.execute(DATA)
        c.execute("ANALYZE devices, parts, devices_parts")
        yield e


def rows(conn: Conn, query: sql.Composed | str) -> Rows:
    return Counter(tuple(r) for r in conn.execute(query).fetchall())


def view_rows(env: Env, conn: Conn, name: str) -> Rows:
    return rows(conn, sql.SQL("SELECT * FROM {}").format(sql.Identifier(env.schema, name)))


def diff(got: Rows, want: Rows) -> str:
    extra, missing = got - want, want - got
    return (f"{sum(extra.values())} extra rows, e.g. {list(extra)[:5]}; "
            f"{sum(missing.values())} missing rows, e.g. {list(missing)[:5]}")


def check(env: Env, names: list[str] | None = None) -> None:
    """Each view equals its recomputation on the base tables (one snapshot for both)."""
    with psycopg.connect(env.dsn, autocommit=True, connect_timeout=10) as c:
        c.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(env.schema)))
        c.execute("SET statement_timeout = '30s'")
        with c.transaction():
            c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for name in names if names is not None else list(env.views):
                got, want = view_rows(env, c, name), rows(c, env.views[name])
                assert got == want, f"view {name} differs from its recomputation: " \
                                    f"{diff(got, want)}"


def maintain_and_check(env: Env, m: PostgresMaintainer) -> None:
    for name in env.views:
        m.maintain(name)
    check(env)


class Bg(threading.Thread):
    """Run ``fn`` in a daemon thread, keeping its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e

    def finish(self, timeout: float = WAIT) -> Any:
        self.join(timeout)
        assert not self.is_alive(), f"{self.fn} did not finish within {timeout} s"
        return self.result


def activity(conn: Conn, pid: int) -> tuple[str | None, str | None, str | None]:
    row = conn.execute("SELECT wait_event_type, wait_event, state FROM pg_stat_activity "
                       "WHERE pid = %s", (pid,)).fetchone()
    return (row[0], row[1], row[2]) if row else (None, None, None)


def wait_until_waiting(conn: Conn, pid: int, event: str | None = None,
                       thread: Bg | None = None) -> None:
    """Poll until backend ``pid`` waits on a heavyweight lock (of kind ``event``)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        etype, ev, _ = activity(conn, pid)
        if etype == "Lock" and (event is None or ev == event):
            return
        if thread is not None and not thread.is_alive():
            raise AssertionError(f"the maintain finished instead of waiting: {thread.error!r}")
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on a lock {event or ''}: "
                         f"{activity(conn, pid)}")


def hold_store(env: Env, view: str) -> Conn:
    """A transaction holding the view's stored table in EXCLUSIVE mode: a maintain blocks at its
    first write to it (after its snapshot and the fold), readers do not. Release with
    commit()/rollback()."""
    c = env.conn(autocommit=False, lock_timeout="5s")
    c.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(env.store(view)))
    return c


def timed(conn: Conn, query: str, params: Any = None, limit: float = 2.0) -> float:
    start = time.monotonic()
    conn.execute(query, params)
    took = time.monotonic() - start
    assert took < limit, f"{query!r} took {took:.2f} s (blocked?)"
    return took


def pending(m: PostgresMaintainer, view: str) -> dict[str, int]:
    return dict(m.status(view)[0]["pending_log_rows"])


def idivm_triggers(conn: Conn, schema: str) -> list[tuple[str, str, str]]:
    return [(str(r[0]), str(r[1]), str(r[2])) for r in conn.execute(
        "SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON "
        "c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND t.tgname LIKE 'idivm%%' ORDER BY 1, 2", (schema,)).fetchall()]


def schema_exists(conn: Conn, name: str) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                       (name,)).fetchone()
    return bool(row and row[0])


def advisory_holders(conn: Conn) -> list[int]:
    return [int(r[0]) for r in conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s",
        (0x1D1,)).fetchall()]


# --------------------------------------------------------------------------- 1. writers


def test_writers_commit_while_a_maintain_is_held(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL, reflect=True)
    env.create(m, "vp", V_PRIME_SQL)
    w = env.conn(lock_timeout="2s")
    # the change the maintain will consume (and apply to the stored view, where it is held)
    w.execute("INSERT INTO devices VALUES ('X1', 'phone')")
    w.execute("INSERT INTO devices_parts VALUES ('X1', 'P1')")
    before_vp = view_rows(env, w, "vp")

    locker = hold_store(env, "v")
    t = Bg(lambda: m.maintain("v"))
    t.start()
    mon = env.conn()
    wait_until_waiting(mon, m.conn.info.backend_pid, thread=t)

    # readers are not blocked either
    start = time.monotonic()
    assert sum(view_rows(env, w, "v").values()) > 0
    assert time.monotonic() - start < 2
    # single statements: inserts, deletes, key-changing updates, category flips, prices
    timed(w, "INSERT INTO devices VALUES ('W1', 'phone'), ('W2', 'tablet'), ('W3', NULL)")
    timed(w, "INSERT INTO devices_parts VALUES ('W1', 'P1'), ('W1', 'P2'), ('W2', 'P3'), "
             "('W3', 'P4')")
    timed(w, "DELETE FROM devices_parts WHERE did = 'D2'")
    timed(w, "UPDATE devices_parts SET pid = 'P2' WHERE did = 'D1' AND pid = 'P1'")
    timed(w, "UPDATE devices_parts SET did = 'D4' WHERE did = 'D5' AND pid = 'P5'")
    timed(w, "UPDATE devices SET category = 'tablet' WHERE did = 'D4'")
    timed(w, "UPDATE devices SET category = 'phone' WHERE did IN ('D3', 'D7', 'W3')")
    timed(w, "UPDATE parts SET price = price + 1000 WHERE pid IN ('P1', 'P20', 'P39')")
    # rows the held maintain is applying right now
    timed(w, "UPDATE devices SET category = 'tablet' WHERE did = 'X1'")
    timed(w, "UPDATE devices_parts SET pid = 'P7' WHERE did = 'X1'")
    # a multi-row, multi-table transaction
    with w.transaction():
        timed(w, "INSERT INTO parts VALUES ('PW', 5)")
        timed(w, "INSERT INTO devices_parts VALUES ('D1', 'PW'), ('D8', 'PW'), ('D10', 'PW')")
        timed(w, "UPDATE parts SET price = 6 WHERE pid = 'PW'")
        timed(w, "DELETE FROM devices_parts WHERE did = 'D1' AND pid = 'P20'")
        timed(w, "UPDATE devices SET category = NULL WHERE did = 'D8'")
        timed(w, "UPDATE devices_parts SET pid = 'P3' WHERE did = 'D10' AND pid = 'P10'")
    # a transaction that rolls back leaves no trace
    with w.transaction(force_rollback=True):
        timed(w, "DELETE FROM devices_parts WHERE did = 'D11'")
        timed(w, "UPDATE parts SET price = 0")
    # ... and one more on another connection, in autocommit
    w2 = env.conn(lock_timeout="2s")
    timed(w2, "DELETE FROM devices_parts WHERE did = 'X1'")
    timed(w2, "DELETE FROM devices WHERE did = 'X1'")

    # all of it happened while the maintain was held
    assert t.is_alive() and activity(mon, m.conn.info.backend_pid)[0] == "Lock"
    locker.commit()
    first: MaintenanceStats = t.finish()
    assert t.error is None, repr(t.error)
    # it consumed exactly what committed before its snapshot
    assert first.changes == {"devices": 1, "devices_parts": 1, "parts": 0}
    assert view_rows(env, w, "vp") == before_vp  # not maintained yet
    left = pending(m, "v")
    assert left["devices"] > 0 and left["devices_parts"] > 0 and left["parts"] > 0
    maintain_and_check(env, m)
    assert pending(m, "v") == {"devices": 0, "devices_parts": 0, "parts": 0}


# --------------------------------------------------------------------------- 2. long writer


@pytest.mark.parametrize("commit_when", ["after_the_maintain", "while_it_is_held"])
def test_writer_spanning_a_maintain(env: Env, commit_when: str) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "vp", V_PRIME_SQL)
    other = env.conn()
    other.execute("INSERT INTO devices VALUES ('Y1', 'phone')")
    other.execute("INSERT INTO devices_parts VALUES ('Y1', 'P9')")
    # begins and writes before the maintain starts
    w = env.conn(autocommit=False, lock_timeout="2s")
    timed(w, "INSERT INTO devices VALUES ('L1', 'phone')")
    timed(w, "INSERT INTO devices_parts VALUES ('L1', 'P1'), ('L1', 'P2')")
    timed(w, "UPDATE parts SET price = price + 500 WHERE pid = 'P3'")
    timed(w, "DELETE FROM devices_parts WHERE did = 'D6'")
    timed(w, "UPDATE devices SET category = 'phone' WHERE did = 'D0'")
    if commit_when == "after_the_maintain":
        stats = m.maintain("v")
        m.maintain("vp")
        assert stats.changes == {"devices": 1, "devices_parts": 1, "parts": 0}
        check(env)  # the open transaction's changes are in neither side
        w.commit()
    else:
        locker = hold_store(env, "v")
        t = Bg(lambda: m.maintain("v"))
        t.start()
        mon = env.conn()
        wait_until_waiting(mon, m.conn.info.backend_pid, thread=t)
        start = time.monotonic()
        w.commit()
        assert time.monotonic() - start < 2
        locker.rollback()
        stats = t.finish()
        assert t.error is None, repr(t.error)
        assert stats.changes == {"devices": 1, "devices_parts": 1, "parts": 0}
    left = pending(m, "v")
    assert left["devices"] > 0 and left["devices_parts"] > 0 and left["parts"] > 0
    maintain_and_check(env, m)
    assert ("L1", "P1", 1 + 37 % 100) in view_rows(env, other, "v")


# --------------------------------------------------------------------------- 3. two maintains


def test_two_maintains_of_one_view_serialize(env: Env) -> None:
    m1, m2 = env.maintainer(), env.maintainer()
    env.create(m1, "v", V_SQL)
    env.create(m1, "vp", V_PRIME_SQL)
    w = env.conn(lock_timeout="2s")
    w.execute("INSERT INTO devices VALUES ('Z1', 'phone')")
    w.execute("INSERT INTO devices_parts VALUES ('Z1', 'P1')")
    mon = env.conn()

    locker = hold_store(env, "v")
    t1 = Bg(lambda: m1.maintain("v"))
    t1.start()
    wait_until_waiting(mon, m1.conn.info.backend_pid, "relation", thread=t1)
    # committed after the first one's snapshot, before the second one starts
    timed(w, "INSERT INTO devices VALUES ('Z2', 'phone')")
    timed(w, "INSERT INTO devices_parts VALUES ('Z2', 'P2'), ('Z2', 'P3')")
    t2 = Bg(lambda: m2.maintain("v"))
    t2.start()
    # the second waits for the first on the view's lock relation, before taking its snapshot
    wait_until_waiting(mon, m2.conn.info.backend_pid, "relation", thread=t2)
    assert t1.is_alive()
    locker.commit()
    r1, r2 = t1.finish(), t2.finish()
    assert t1.error is None and t2.error is None, (t1.error, t2.error)
    assert r1.changes == {"devices": 1, "devices_parts": 1, "parts": 0}
    assert r2.changes == {"devices": 1, "devices_parts": 2, "parts": 0}
    m2.maintain("vp")
    check(env)  # nothing lost, nothing applied twice

    # and unsynchronized: two threads racing maintains of the same views with a writer
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(m: PostgresMaintainer, names: list[str]) -> int:
        n = 0
        while not stop.is_set():
            for name in names:
                try:
                    m.maintain(name)
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
                    return n
                n += 1
        return n

    a, b = Bg(lambda: loop(m1, ["v", "vp"])), Bg(lambda: loop(m2, ["vp", "v"]))
    a.start()
    b.start()
    for i in range(40):
        with w.transaction():
            timed(w, "UPDATE parts SET price = price + 1 WHERE pid = %s", (f"P{i % 200}",))
            timed(w, "UPDATE devices SET category = CASE WHEN category = 'phone' THEN 'tablet'"
                     " ELSE 'phone' END WHERE did = %s", (f"D{(i * 7) % 200}",))
        time.sleep(0.01)
    stop.set()
    assert a.finish() > 0 and b.finish() > 0
    assert not errors, errors
    maintain_and_check(env, m1)


# --------------------------------------------------------------------------- 4. killed


def test_terminated_maintain_leaves_nothing_half_done(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "vp", V_PRIME_SQL)
    w = env.conn()
    w.execute("INSERT INTO devices VALUES ('K1', 'phone')")
    w.execute("INSERT INTO devices_parts VALUES ('K1', 'P1'), ('K1', 'P2')")
    w.execute("UPDATE parts SET price = price + 7 WHERE pid IN ('P1', 'P19')")
    w.execute("DELETE FROM devices_parts WHERE did = 'D1'")
    before = {n: view_rows(env, w, n) for n in env.views}
    caches = [sql.Identifier(env.companion, str(r[0])) for r in w.execute(
        sql.SQL("SELECT unnest(relations) FROM {}").format(
            sql.Identifier(env.companion, "views"))).fetchall()]
    stored_before = {c.as_string(w): rows(w, sql.SQL("SELECT * FROM {}").format(c))
                     for c in caches}

    # vp first: its cache is applied before its stored view, where it is held
    for name in ["vp", "v"]:
        locker = hold_store(env, name)
        t = Bg(lambda m=m, name=name: m.maintain(name))  # type: ignore[misc]
        t.start()
        mon = env.conn()
        pid = m.conn.info.backend_pid
        wait_until_waiting(mon, pid, thread=t)
        mon.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.finish()
        assert t.error is not None, "a terminated maintain returned normally"
        locker.commit()
        m.close()
        assert {n: view_rows(env, w, n) for n in env.views} == before
        assert {c.as_string(w): rows(w, sql.SQL("SELECT * FROM {}").format(c))
                for c in caches} == stored_before
        m = env.maintainer(lock_timeout="5s")
        left = pending(m, name)
        assert left["devices"] > 0 and left["devices_parts"] > 0 and left["parts"] > 0
        assert pid not in advisory_holders(w)
    maintain_and_check(env, m)  # a fresh maintainer is not kept waiting (lock_timeout 5 s)


@pytest.mark.parametrize("how", ["statement_timeout", "pg_cancel_backend"])
def test_cancelled_maintain_releases_the_view_for_other_maintainers(env: Env, how: str) -> None:
    """A maintain cancelled mid-run (statement_timeout, pg_cancel_backend) rolls back; then
    another maintainer's maintain of the view must not wait for the cancelled session."""
    m1 = env.maintainer()
    env.create(m1, "v", V_SQL)
    w = env.conn()
    w.execute("INSERT INTO devices VALUES ('C1', 'phone')")
    w.execute("INSERT INTO devices_parts VALUES ('C1', 'P1')")
    before = view_rows(env, w, "v")
    if how == "statement_timeout":
        m1.conn.execute("SET statement_timeout = '1s'")
    locker = hold_store(env, "v")
    t = Bg(lambda: m1.maintain("v"))
    t.start()
    mon = env.conn()
    pid = m1.conn.info.backend_pid
    wait_until_waiting(mon, pid, thread=t)
    if how == "pg_cancel_backend":
        mon.execute("SELECT pg_cancel_backend(%s)", (pid,))
    t.finish()
    locker.commit()
    assert isinstance(t.error, idivm.MaintenanceError), repr(t.error)
    assert "rolled back" in str(t.error)
    assert view_rows(env, w, "v") == before
    m1.conn.execute("SET statement_timeout = '30s'")
    # the cancelled session is idle and alive; it must not keep the view's advisory lock
    assert activity(mon, pid)[2] == "idle"
    held = pid in advisory_holders(mon)
    m2 = env.maintainer(lock_timeout="1s")
    try:
        m2.maintain("v")
        other_error = None
    except idivm.MaintenanceError as e:
        other_error = e
    assert not held and other_error is None, (
        f"after a cancelled maintain, backend {pid} still holds the view's advisory lock "
        f"(held={held}) and another maintainer cannot maintain the view: {other_error}")
    m1.maintain("v")  # re-running it on the cancelled session works too
    check(env)


def test_failure_after_the_commit_is_not_reported_as_rolled_back(env: Env) -> None:
    """The procedure commits the maintenance, then prunes the consumed log rows in a
    transaction of its own. If that prune fails (here: a row lock on a consumed log row and
    lock_timeout; in practice e.g. statement_timeout during a large prune), the error must not
    claim the maintenance "failed and was rolled back" when it was in fact committed.

    The prune only reaches rows below the oldest transaction running anywhere in the cluster,
    so with other sessions' long transactions it may not run at all: a few attempts."""
    m = env.maintainer()
    m.conn.execute("SET idivm.prune_xids = 0")  # every prune due
    env.create(m, "v", V_SQL)
    c = env.conn()
    log = sql.Identifier(env.companion, "log__devices")
    for attempt in range(5):
        did = f"D{3 * attempt + 3}"  # a tablet (3, 6, 9, 12, 15 are none of 7's multiples)
        c.execute("UPDATE devices SET category = 'phone' WHERE did = %s", (did,))
        before = view_rows(env, c, "v")
        locker = env.conn(autocommit=False)
        locked = locker.execute(sql.SQL("SELECT 1 FROM {} WHERE did = %s FOR UPDATE").format(
            log), (did,)).fetchall()
        assert len(locked) == 1  # the update's new image (V sees no tablet: the old one)
        m.conn.execute("SET lock_timeout = '1s'")
        raised: idivm.MaintenanceError | None = None
        try:
            m.maintain("v")
        except idivm.MaintenanceError as e:
            raised = e
        locker.rollback()
        m.conn.execute("SET lock_timeout = '20s'")
        if raised is None:
            time.sleep(0.2)
            continue
        if "rolled back" in str(raised):
            left = pending(m, "v")
            assert view_rows(env, c, "v") == before and left["devices"] > 0, (
                f"maintain raised {str(raised).splitlines()[0]!r}, but the maintenance had "
                f"been committed: the view changed ({diff(view_rows(env, c, 'v'), before)}) "
                f"and its changes were consumed (pending now {left})")
        break
    maintain_and_check(env, m)


# --------------------------------------------------------------------------- 5. stress


def writer(env: Env, idx: int, stop: threading.Event, errors: list[str],
           waits: list[float], counts: list[int]) -> None:
    """Random small transactions over writer ``idx``'s own devices and links (and prices of its
    own parts), so writers never conflict with each other: any lock wait is the maintainers'."""
    rnd = random.Random(1000 + idx)
    conn = env.conn(lock_timeout="1s")
    devices = [f"D{j}" for j in range(200) if j % 3 == idx]
    parts = [f"P{j}" for j in range(200) if j % 3 == idx]
    every_part = [f"P{j}" for j in range(200)]
    fresh = 0

    def run(query: str, params: Any = None) -> list[Any]:
        start = time.monotonic()
        cur = conn.execute(query, params)
        waits.append(time.monotonic() - start)
        return cur.fetchall() if cur.description else []

    def one() -> None:
        nonlocal fresh
        op = rnd.randrange(9)
        d = rnd.choice(devices)
        if op == 0:
            run("UPDATE devices SET category = CASE WHEN category = 'phone' THEN 'tablet' "
                "ELSE 'phone' END WHERE did = %s", (d,))
        elif op == 1:
            run("UPDATE devices SET category = %s WHERE did = %s",
                (rnd.choice([None, "phone", "tablet"]), d))
        elif op == 2:
            run("UPDATE parts SET price = price + %s WHERE pid = %s",
                (rnd.randint(-5, 5), rnd.choice(parts)))
        elif op == 3:
            run("UPDATE parts SET price = price + 1 WHERE pid = ANY(%s)",
                (rnd.sample(parts, 3),))
        elif op == 4:  # delete a link, maybe put it back in the same transaction
            gone = run("DELETE FROM devices_parts WHERE (did, pid) IN (SELECT did, pid FROM "
                       "devices_parts WHERE did = %s ORDER BY pid LIMIT 1) RETURNING pid", (d,))
            if gone and rnd.random() < 0.5:
                run("INSERT INTO devices_parts VALUES (%s, %s)", (d, gone[0][0]))
        elif op == 5:  # (re-)insert links
            run("INSERT INTO devices_parts VALUES (%s, %s), (%s, %s) ON CONFLICT DO NOTHING",
                (d, rnd.choice(every_part), d, rnd.choice(every_part)))
        elif op == 6:  # a key-changing update
            run("UPDATE devices_parts SET pid = %s WHERE did = %s AND pid = (SELECT min(pid) "
                "FROM devices_parts WHERE did = %s) AND NOT EXISTS (SELECT 1 FROM devices_parts"
                " WHERE did = %s AND pid = %s)", (p := rnd.choice(every_part), d, d, d, p))
        elif op == 7:  # a new device with links
            fresh += 1
            nd = f"W{idx}_{fresh}"
            run("INSERT INTO devices VALUES (%s, %s)", (nd, rnd.choice(["phone", "tablet"])))
            run("INSERT INTO devices_parts VALUES (%s, %s), (%s, %s) ON CONFLICT DO NOTHING",
                (nd, rnd.choice(every_part), nd, rnd.choice(every_part)))
        else:  # delete a device of ours with its links
            old = run("SELECT did FROM devices WHERE did LIKE %s ORDER BY did LIMIT 1",
                      (f"W{idx}\\_%",))
            if old:
                run("DELETE FROM devices_parts WHERE did = %s", (old[0][0],))
                run("DELETE FROM devices WHERE did = %s", (old[0][0],))

    try:
        while not stop.is_set():
            try:
                with conn.transaction(force_rollback=rnd.random() < 0.1):
                    for _ in range(rnd.randint(1, 3)):
                        one()
                counts[idx] += 1
            except psycopg.errors.DeadlockDetected as e:
                errors.append(f"writer {idx}: deadlock: {e}")
            except psycopg.errors.LockNotAvailable as e:
                errors.append(f"writer {idx}: waited over 1 s for a lock: {e}")
            time.sleep(0.002)
    except BaseException as e:  # noqa: BLE001
        errors.append(f"writer {idx}: {e!r}")


def test_concurrent_writers_and_maintainers(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "vp", V_PRIME_SQL)
    env.create(m, "vt", V_SQL, strategy="tuple")
    stop, stop_m = threading.Event(), threading.Event()
    errors: list[str] = []
    waits: list[float] = []
    counts = [0, 0, 0]
    runs: Counter[str] = Counter()

    def maintainer_loop(names: list[str]) -> None:
        mm = env.maintainer()
        while not stop_m.is_set():
            for name in names:
                try:
                    s = mm.maintain(name)
                    runs[name] += 1
                    if sum(s.changes.values()):
                        runs[name + " consumed"] += 1
                except BaseException as e:  # noqa: BLE001
                    errors.append(f"maintain {name}: {e!r}")
                    return
            time.sleep(0.02)

    writers = [Bg(lambda i=i: writer(env, i, stop, errors, waits, counts))  # type: ignore[misc]
               for i in range(3)]
    maintainers = [Bg(lambda: maintainer_loop(["v", "vp"])), Bg(lambda: maintainer_loop(["vt"]))]
    for t in [*writers, *maintainers]:
        t.start()
    time.sleep(4.5)
    stop.set()
    for t in writers:
        t.finish()
    stop_m.set()
    for t in maintainers:
        t.finish(30)
    print(f"writer transactions {counts}, maintains {dict(runs)}, "
          f"max statement {max(waits):.3f} s")
    assert not errors, errors[:10]
    assert min(counts) > 10, counts
    assert all(runs[f"{n} consumed"] >= 2 for n in env.views), runs
    assert max(waits) < 1.0, f"a writer statement took {max(waits):.2f} s"
    maintain_and_check(env, m)
    for n in env.views:
        assert pending(m, n) == {"devices": 0, "devices_parts": 0, "parts": 0}


# --------------------------------------------------------------------------- 6. TRUNCATE


def test_truncate_is_logged_as_deletes(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "vp", V_PRIME_SQL)
    env.create(m, "vt", V_PRIME_SQL, strategy="tuple")
    c = env.conn()
    check(env)
    c.execute("TRUNCATE devices_parts")
    c.execute("INSERT INTO devices_parts SELECT 'D' || i, 'P' || (i * 3 % 200) "
              "FROM generate_series(0, 99) i")
    maintain_and_check(env, m)
    # inserts, a TRUNCATE and inserts again, in one transaction
    with c.transaction():
        c.execute("INSERT INTO devices_parts VALUES ('D1', 'P1'), ('D2', 'P2')")
        c.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P3'")
        c.execute("TRUNCATE devices_parts")
        c.execute("INSERT INTO devices_parts SELECT 'D' || i, 'P' || (i * 7 % 200) "
                  "FROM generate_series(0, 149) i")
        c.execute("INSERT INTO devices_parts VALUES ('D1', 'P1') ON CONFLICT DO NOTHING")
    maintain_and_check(env, m)
    # a rolled-back TRUNCATE changes nothing
    with c.transaction(force_rollback=True):
        c.execute("TRUNCATE devices_parts")
    # every table at once, then new data
    c.execute("TRUNCATE devices_parts, parts, devices")
    maintain_and_check(env, m)
    c.execute("INSERT INTO devices SELECT 'D' || i, CASE WHEN i % 2 = 0 THEN 'phone' END "
              "FROM generate_series(0, 49) i")
    c.execute("INSERT INTO parts SELECT 'P' || i, i FROM generate_series(0, 49) i")
    c.execute("INSERT INTO devices_parts SELECT 'D' || (i % 50), 'P' || ((i * 13) % 50) "
              "FROM generate_series(0, 49) i")
    c.execute("TRUNCATE devices_parts")  # twice between two maintains
    c.execute("INSERT INTO devices_parts SELECT 'D' || (i % 50), 'P' || ((i * 11) % 50) "
              "FROM generate_series(0, 99) i ON CONFLICT DO NOTHING")
    maintain_and_check(env, m)
    assert sum(view_rows(env, c, "v").values()) > 0


def test_truncate_committed_during_a_maintain(env: Env) -> None:
    """TRUNCATE is not MVCC-safe: a transaction whose snapshot predates a TRUNCATE but which
    reads the table only after it committed sees the table empty. A maintain takes its snapshot,
    folds the logs, and only then reads base tables, so a TRUNCATE (+ re-insert) committed in
    between must not leave the view wrong after the next maintain.

    The maintain is held deterministically between its snapshot and its first read of
    devices_parts by an ACCESS EXCLUSIVE lock on the devices log it folds first; the same window
    exists without it while a large log is folded."""
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    m.maintain("v")  # the session's temporary tables exist: the next run reads late
    c = env.conn()
    c.execute("UPDATE devices SET category = 'phone' WHERE did = 'D3'")  # D3 has 10 links
    locker = env.conn(autocommit=False, lock_timeout="5s")
    locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
        sql.Identifier(env.companion, "log__devices")))
    t = Bg(lambda: m.maintain("v"))
    t.start()
    mon = env.conn()
    wait_until_waiting(mon, m.conn.info.backend_pid, "relation", thread=t)
    tr = env.conn(lock_timeout="5s")

    def truncate_and_refill() -> None:
        with tr.transaction():
            tr.execute("CREATE TEMP TABLE keep AS SELECT * FROM devices_parts")
            tr.execute("TRUNCATE devices_parts")
            tr.execute("INSERT INTO devices_parts SELECT * FROM keep")

    b = Bg(truncate_and_refill)
    b.start()
    deadline = time.monotonic() + WAIT  # it either commits now or waits for the maintain
    while b.is_alive() and activity(mon, tr.info.backend_pid)[0] != "Lock" and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    locker.commit()
    t.finish()
    b.finish()
    assert t.error is None and b.error is None, (t.error, b.error)
    maintain_and_check(env, m)


# --------------------------------------------------------------------------- 7. replica mode


def test_changes_in_replica_mode_are_logged(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL, reflect=True)
    env.create(m, "vp", V_PRIME_SQL)
    r = env.conn(replica=True)
    assert r.execute("SHOW session_replication_role").fetchone() == ("replica",)
    r.execute("INSERT INTO devices VALUES ('R1', 'phone')")
    r.execute("INSERT INTO devices_parts VALUES ('R1', 'P1'), ('R1', 'P2')")
    r.execute("UPDATE parts SET price = price * 2 WHERE pid IN ('P1', 'P4')")
    r.execute("UPDATE devices SET category = 'tablet' WHERE did IN ('D1', 'D2')")
    r.execute("DELETE FROM devices_parts WHERE did = 'D4'")
    r.execute("UPDATE devices_parts SET pid = 'P3' WHERE did = 'D5' AND pid = 'P5'")
    left = pending(m, "v")
    assert left["devices"] > 0 and left["devices_parts"] > 0 and left["parts"] > 0
    maintain_and_check(env, m)
    r.execute("TRUNCATE devices_parts")
    r.execute("INSERT INTO devices_parts VALUES ('D1', 'P1'), ('D4', 'P4')")
    maintain_and_check(env, m)


# --------------------------------------------------------------------------- 8. DDL


def test_ddl_on_columns_no_view_reads_is_absorbed(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL, reflect=True)
    env.create(m, "vp", V_PRIME_SQL)
    c = env.conn()
    c.execute("ALTER TABLE devices ADD COLUMN note text")
    c.execute("INSERT INTO devices VALUES ('N1', 'phone', 'new'), ('N2', 'tablet', NULL)")
    c.execute("INSERT INTO devices_parts VALUES ('N1', 'P1'), ('N2', 'P1')")
    c.execute("UPDATE devices SET note = 'x' WHERE did IN ('D1', 'D2')")  # no effective change
    c.execute("UPDATE devices SET category = 'phone', note = 'y' WHERE did = 'D3'")
    maintain_and_check(env, m)
    c.execute("ALTER TABLE devices ALTER COLUMN note TYPE varchar(20)")
    c.execute("ALTER TABLE devices RENAME COLUMN note TO remark")
    c.execute("ALTER TABLE parts ADD CONSTRAINT price_not_huge CHECK (price < 1000000)")
    c.execute("ALTER TABLE devices ALTER COLUMN category SET DEFAULT 'phone'")
    c.execute("INSERT INTO devices (did) VALUES ('N3')")
    c.execute("INSERT INTO devices_parts VALUES ('N3', 'P2')")
    maintain_and_check(env, m)
    c.execute("ALTER TABLE devices DROP COLUMN remark")
    c.execute("DELETE FROM devices_parts WHERE did = 'N1'")
    c.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P1'")
    maintain_and_check(env, m)


REFUSED = [
    "ALTER TABLE parts DROP COLUMN price",
    "ALTER TABLE parts RENAME COLUMN price TO cost",
    "ALTER TABLE parts ALTER COLUMN price TYPE numeric(10,2)",
    "ALTER TABLE parts ALTER COLUMN price TYPE bigint",
    "ALTER TABLE devices_parts RENAME COLUMN pid TO part_id",
    "ALTER TABLE devices DROP COLUMN category",
    "ALTER TABLE parts RENAME TO parts2",
    "ALTER TABLE parts SET SCHEMA {other}",
    "ALTER TABLE parts DISABLE TRIGGER ALL",
    "ALTER TABLE parts DISABLE TRIGGER USER",
    "ALTER TABLE parts DISABLE TRIGGER idivm_log_update",
    "ALTER TABLE devices_parts DISABLE TRIGGER idivm_log_truncate",
    "ALTER TABLE parts ENABLE TRIGGER idivm_log_insert",  # ALWAYS -> origin only
    "ALTER TABLE parts ENABLE REPLICA TRIGGER idivm_log_delete",
]


def test_ddl_that_would_break_a_view_is_refused(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL, reflect=True)
    env.create(m, "vp", V_PRIME_SQL)
    other = f"{env.schema}_other"
    c = env.conn()
    c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(other)))
    env.stack.callback(lambda: psycopg.connect(env.dsn, autocommit=True).execute(
        sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(other))))
    triggers = idivm_triggers(c, env.schema)
    assert len(triggers) == 12 and {t[2] for t in triggers} == {"A"}
    assert {t[1] for t in triggers} == set(LOG_TRIGGERS)
    for i, ddl in enumerate(REFUSED):
        with pytest.raises(psycopg.Error) as info:
            c.execute(ddl.format(other=sql.Identifier(other).as_string(c)))
        assert "idivm" in str(info.value), (ddl, str(info.value))
        assert "drop" in (info.value.diag.message_hint or ""), (ddl, info.value.diag)
        assert idivm_triggers(c, env.schema) == triggers, ddl
        # writes still work and are still logged
        c.execute("UPDATE parts SET price = price + 3 WHERE pid = %s", (f"P{i}",))
        c.execute("UPDATE devices SET category = CASE WHEN category = 'phone' THEN 'tablet' "
                  "ELSE 'phone' END WHERE did = %s", (f"D{i + 1}",))
        c.execute("DELETE FROM devices_parts WHERE did = %s", (f"D{i + 20}",))
        m.maintain("v")
        check(env, ["v"])
    maintain_and_check(env, m)
    m.drop_view("v")
    m.drop_view("vp")
    assert idivm_triggers(c, env.schema) == []
    assert not schema_exists(c, env.companion)
    c.execute("ALTER TABLE parts RENAME COLUMN price TO cost")  # no view left: allowed


def test_guard_bypassed_then_maintain_refuses(env: Env) -> None:
    """Replica mode turns the (origin-enabled) event trigger off in that session only; the
    catalog fingerprint still catches the disabled logging trigger."""
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "vp", V_PRIME_SQL)
    c, r = env.conn(), env.conn(replica=True)
    with pytest.raises(psycopg.Error, match="idivm"):
        c.execute("ALTER TABLE parts DISABLE TRIGGER idivm_log_update")
    r.execute("ALTER TABLE parts DISABLE TRIGGER idivm_log_update")  # the guard did not fire
    assert ("parts", "idivm_log_update", "D") in idivm_triggers(c, env.schema)
    # other sessions are still guarded
    with pytest.raises(psycopg.Error, match="idivm"):
        c.execute("ALTER TABLE devices DISABLE TRIGGER idivm_log_update")
    c.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P1'")  # not logged
    for name in ["v", "vp"]:
        with pytest.raises(idivm.MaintenanceError) as info:
            m.maintain(name)
        msg = str(info.value)
        assert "re-run it" not in msg, msg
        assert "parts" in msg and "altered" in msg and "create it again" in msg, msg
        # refusing twice: nothing was consumed or changed in between
        with pytest.raises(idivm.MaintenanceError, match="create it again"):
            m.maintain(name)
    m.drop_view("v")
    m.drop_view("vp")
    assert idivm_triggers(c, env.schema) == []
    assert not schema_exists(c, env.companion)
    # created again, the view is right
    env.create(m, "v", V_SQL)
    c.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P1'")
    env.views.pop("vp")
    maintain_and_check(env, m)


@pytest.mark.parametrize("change", [
    "DROP TABLE devices_parts; " + PAPER_DDL.split(";")[2],
    "ALTER TABLE parts ALTER COLUMN price TYPE bigint",
    "ALTER TABLE devices RENAME COLUMN category TO kind",
    "DROP TRIGGER idivm_log_delete ON devices_parts",
], ids=["recreated", "retyped", "renamed_column", "trigger_dropped"])
def test_table_recreated_or_altered_behind_the_guard(env: Env, change: str) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL, reflect=True)
    r = env.conn(replica=True)
    r.execute(change)
    with pytest.raises(idivm.MaintenanceError) as info:
        m.maintain("v")
    msg = str(info.value)
    assert "re-run it" not in msg and "create it again" in msg, msg
    assert "altered, dropped or re-created" in msg, msg
    m.drop_view("v")
    assert idivm_triggers(r, env.schema) == []
    assert not schema_exists(r, env.companion)


# --------------------------------------------------------------------------- 9. long names


def test_long_view_names(env: Env) -> None:
    m = env.maintainer()
    # 59 and 63 bytes: derived names cut to the same prefix, told apart by their hashes
    names = ["v" + "x" * 54, "v" + "x" * 58, "v" + "x" * 62, "ü" * 31 + "v"]
    assert [len(n.encode()) for n in names] == [55, 59, 63, 63]
    for n in names[:-1]:
        env.create(m, n, V_PRIME_SQL)
    env.create(m, names[-1], V_SQL)
    c = env.conn()
    c.execute("UPDATE parts SET price = price + 1 WHERE pid IN ('P1', 'P2')")
    c.execute("UPDATE devices SET category = 'phone' WHERE did = 'D3'")
    c.execute("INSERT INTO devices_parts VALUES ('D3', 'P4')")
    maintain_and_check(env, m)
    for i, n in enumerate(list(env.views)):
        m.drop_view(n)
        env.views.pop(n)
        if i == 1:
            c.execute("DELETE FROM devices_parts WHERE did = 'D5'")
            maintain_and_check(env, m)  # the others are untouched
    assert idivm_triggers(c, env.schema) == []
    assert not schema_exists(c, env.companion)
    for too_long in ["v" + "x" * 63, "ü" * 32, "v" + "ü" * 31 + "x"]:
        assert len(too_long.encode()) == 64
        with pytest.raises(BackendError, match="63"):
            m.create_view(too_long, V_PRIME_SQL)
    assert idivm_triggers(c, env.schema) == []


# --------------------------------------------------------------------------- 10. failed create


def test_failed_create_view_leaves_nothing(env: Env) -> None:
    m = env.maintainer()
    c = env.conn()
    c.execute("CREATE TABLE v (x int)")
    with pytest.raises(BackendError):
        m.create_view("v", V_SQL)
    assert idivm_triggers(c, env.schema) == []
    assert not schema_exists(c, env.companion)
    # failing while the view is computed (after the logging was installed)
    with pytest.raises(BackendError, match="rolled back"):
        m.create_view("w", "SELECT did, pid, price / (price - price) AS x FROM parts "
                           "NATURAL JOIN devices_parts NATURAL JOIN devices")
    assert idivm_triggers(c, env.schema) == []
    assert not schema_exists(c, env.companion)
    assert c.execute("SELECT to_regclass('w')").fetchone() == (None,)
    # with another view in place, a failed create leaves that one intact
    env.create(m, "good", V_PRIME_SQL)
    triggers = idivm_triggers(c, env.schema)
    with pytest.raises(BackendError):
        m.create_view("v", V_SQL)
    with pytest.raises(BackendError, match="rolled back"):
        m.create_view("w", "SELECT did, pid, price / (price - price) AS x FROM parts "
                           "NATURAL JOIN devices_parts NATURAL JOIN devices")
    assert idivm_triggers(c, env.schema) == triggers
    assert [s["view"] for s in m.status()] == ["good"]
    c.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P1'")
    maintain_and_check(env, m)


# --------------------------------------------------------------------------- 11. SQL CALL


def test_maintain_through_sql_call(env: Env) -> None:
    m = env.maintainer()
    env.create(m, "v", V_SQL)
    env.create(m, "vp", V_PRIME_SQL)
    c = env.conn()
    c.execute("UPDATE parts SET price = price + 1 WHERE pid = 'P1'")
    c.execute("INSERT INTO devices_parts VALUES ('D1', 'P2')")
    for name in ["v", "vp"]:
        row = c.execute(sql.SQL("CALL {}.maintain(%s)").format(
            sql.Identifier(env.companion)), (name,)).fetchone()
        assert row is not None
        stats = row[0]
        assert isinstance(stats, dict)
        assert {"changes", "idiff_rows", "applied_rows", "statement_seconds"} <= set(stats)
        assert stats["changes"] == {"devices": 0, "devices_parts": 1, "parts": 1}
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    check(env)
    # literal SQL, as from psql or a scheduler, and a view that does not exist
    c.execute(f"CALL \"{env.companion}\".maintain('v')")
    with pytest.raises(psycopg.Error, match="no view"):
        c.execute(sql.SQL("CALL {}.maintain('nope')").format(sql.Identifier(env.companion)))
    c.execute("DELETE FROM devices_parts WHERE did = 'D1'")
    maintain_and_check(env, m)
