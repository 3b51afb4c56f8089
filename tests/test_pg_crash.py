"""A server crash around a maintain loses at most whole refreshes, and the next maintain makes
the view equal its query again.

The maintenance transaction commits without waiting for the disk (``synchronous_commit =
off``, unless ``idivm.synchronous_refresh`` is on): a crash can lose that commit, which holds
the view's rows, its caches, its watermark and its history row together, so after the restart
the view is as before that maintain, with the changes still in the logs their writers
committed durably — or as after it. A crash in the middle of a maintain leaves nothing of it.

PostgreSQL's immediate shutdown is the crash (its processes end at once: no checkpoint, the
WAL in shared memory not yet written is gone, the restart replays what was). It is done to a
private cluster — ``initdb`` in a temporary directory, the test server's own binaries — never
to the test server, whose other sessions (the other test worker's) would break."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest

from idivm.errors import BackendError, MaintenanceError
from idivm.postgres import PostgresMaintainer
from idivm.postgres.changelog import LOCK_CLASS

# the WAL writer's pause between its rounds (its longest): the commit of a maintain that
# returned a moment ago is most likely still in shared memory when the crash comes
SERVER_OPTIONS = ("-c listen_addresses=127.0.0.1 -c wal_writer_delay=10000 "
                  "-c shared_buffers=32MB -c max_connections=20 -c fsync=on")
VIEW = "SELECT g, sum(v) AS total, count(*) AS n FROM t GROUP BY g"
QUERY = "SELECT g, sum(v) AS total, count(*) AS n FROM s.t GROUP BY g"
# a view of the view (a pipeline: both maintained in one transaction)
DOWNSTREAM = "SELECT g, n FROM v WHERE total > 70000"
DOWNSTREAM_QUERY = f"SELECT g, n FROM ({QUERY}) AS v WHERE total > 70000"
# a join under an aggregate: maintained through a cache of the join (a stored relation the
# crash must take back with the view)
JOINED = "SELECT u.r, sum(t.v) AS total FROM t JOIN u ON u.g = t.g GROUP BY u.r"
JOINED_QUERY = "SELECT u.r, sum(t.v) AS total FROM s.t JOIN s.u ON u.g = t.g GROUP BY u.r"


def _unavailable(why: str) -> NoReturn:
    """Fail under CI=true (the suite must not skip a backend test there), else skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"the crash tests cannot run: {why}", pytrace=False)
    pytest.skip(why)


def _bindir(pg_dsn: str) -> Path:
    """The test server's binaries (its ``pg_config`` view), else ``pg_config --bindir``."""
    try:
        with psycopg.connect(pg_dsn, connect_timeout=5) as c:
            row = c.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'").fetchone()
        if row and (Path(row[0]) / "initdb").exists():
            return Path(row[0])
    except psycopg.Error:
        pass
    tool = shutil.which("pg_config")
    if tool:
        out = subprocess.run([tool, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    _unavailable("PostgreSQL's initdb was not found (install the server package, e.g. "
                 "postgresql-15, or put pg_config on the PATH)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Cluster:
    """A private PostgreSQL cluster the tests may crash."""

    bindir: Path
    data: Path
    port: int
    user: list[str]  # the command prefix that runs a server binary as its owner

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str) -> None:
        out = subprocess.run([*self.user, *args], capture_output=True, text=True, check=False,
                             timeout=120)
        if out.returncode != 0:
            log = self.data / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise AssertionError(f"{' '.join(args)} failed ({out.returncode}): "
                                 f"{out.stdout}{out.stderr}\n{tail}")

    def start(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-l",
                  str(self.data / "server.log"), "-o",
                  f"-p {self.port} -k {self.data} {SERVER_OPTIONS}", "start")

    def crash(self, held: int | None = None) -> None:
        """The immediate shutdown: every process ends at once, nothing more is written.
        ``held``: the pid of a WAL writer stopped (SIGSTOP) before, continued once the
        shutdown has signalled it — it ends without writing what it was holding."""
        if held is None:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                      "stop")
            return
        with psycopg.connect(self.dsn, autocommit=True) as c:
            others = [int(r[0]) for r in c.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type IN "
                "('checkpointer', 'background writer')").fetchall()]
        stop = subprocess.Popen([*self.user, str(self.bindir / "pg_ctl"), "-D",
                                 str(self.data), "-m", "immediate", "stop"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in others):  # the postmaster has sent its children SIGQUIT
            assert time.monotonic() < deadline, "the immediate shutdown did not begin"
            time.sleep(0.005)
        os.kill(held, signal.SIGCONT)  # (it takes the SIGQUIT first: it ends, writing nothing)
        assert stop.wait(60) == 0

    def hold_wal_writer(self) -> int:
        """Stop the WAL writer (SIGSTOP): an asynchronous commit stays in shared memory."""
        with psycopg.connect(self.dsn, autocommit=True) as c:
            row = c.execute("SELECT pid FROM pg_stat_activity "
                            "WHERE backend_type = 'walwriter'").fetchone()
        assert row is not None
        os.kill(int(row[0]), signal.SIGSTOP)
        return int(row[0])


    def recovered(self) -> bool:
        """Whether the last start replayed the WAL after a crash."""
        return "redo" in (self.data / "server.log").read_text()


@pytest.fixture(scope="module")
def cluster(pg_dsn: str) -> Iterator[Cluster]:
    bindir = _bindir(pg_dsn)
    user: list[str] = []
    root = tempfile.mkdtemp(prefix="idivm_crash_")
    if os.geteuid() == 0:  # initdb and the server refuse to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no postgres user to own the cluster")
        runuser = shutil.which("runuser")
        if runuser is None:
            _unavailable("running as root and runuser (util-linux) is not installed")
        user = [str(runuser), "-u", "postgres", "--"]
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data = Path(root) / "data"
    c = Cluster(bindir, data, _free_port(), user)
    try:
        c._run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
               "-E", "UTF8", "--locale=C", "--no-sync")
        c.start()
        yield c
    finally:
        subprocess.run([*user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _rows(conn: psycopg.Connection[Any], query: str) -> list[tuple[Any, ...]]:
    return sorted(conn.execute(query).fetchall())


def _schema(cluster: Cluster, rows: int) -> None:
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        w.execute("DROP SCHEMA IF EXISTS s CASCADE")
        w.execute("DROP SCHEMA IF EXISTS s__idivm CASCADE")
        w.execute("CREATE SCHEMA s")
        w.execute("CREATE TABLE s.t (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        w.execute("INSERT INTO s.t SELECT i, i %% 7, i FROM generate_series(1, %s::int) i",
                  (rows,))
        w.execute("CREATE TABLE s.u (g int PRIMARY KEY, r int NOT NULL)")
        w.execute("INSERT INTO s.u SELECT g, g % 3 FROM generate_series(0, 6) g")


def _wait_for(w: psycopg.Connection[Any], running: str, waiting: bool = False) -> None:
    """Until a statement ``LIKE running`` is active (``waiting``: and waits for a lock)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = w.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                        "AND query LIKE %s AND (NOT %s OR wait_event_type = 'Lock') "
                        "AND pid <> pg_backend_pid()", (running, waiting)).fetchone()
        if row and row[0]:
            return
        time.sleep(0.005)
    raise AssertionError(f"no statement like {running!r} ran")


def _thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """A thread running ``call`` (not started), and the list it puts what ``call`` raised in."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # (reported to the test)
            failed.append(e)

    return threading.Thread(target=run), failed


def _crash_during(cluster: Cluster, call: Callable[[], object], running: str) -> BaseException:
    """Run ``call`` in a thread and crash the server once a statement ``LIKE running`` is
    active in it; return what ``call`` raised (it must: its connection is lost)."""
    thread, failed = _thread(call)
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        thread.start()
        _wait_for(w, running)
    cluster.crash()
    thread.join(60)
    assert not thread.is_alive()
    assert failed, f"{call} returned"
    return failed[0]


def _restart(cluster: Cluster, held: int | None = None) -> None:
    cluster.crash(held)
    cluster.start()
    assert cluster.recovered()


def test_a_crash_after_a_maintain_loses_its_refresh_whole(cluster: Cluster) -> None:
    _schema(cluster, 1000)
    with PostgresMaintainer(cluster.dsn, schema="s") as m:
        m.create_view("v", VIEW)
        m.create_view("w", DOWNSTREAM)
        m.create_view("j", JOINED)
        assert len(m.plan_of("j").materialized) > 1  # (a cache besides the view)
    views = {"v": QUERY, "w": DOWNSTREAM_QUERY, "j": JOINED_QUERY}
    seen = []
    for k in range(3):
        # the writers' changes, committed durably (the session's synchronous_commit: on)
        with psycopg.connect(cluster.dsn, autocommit=True) as w:
            w.execute("UPDATE s.t SET v = v + %s WHERE id %% 5 = %s", (k + 1, k))
            w.execute("DELETE FROM s.t WHERE id %% 11 = %s", (k,))
            w.execute("INSERT INTO s.t SELECT i, i %% 3, -i "
                      "FROM generate_series(%s::int, %s::int) i",
                      (2000 + 100 * k, 2000 + 100 * k + 49))
            w.execute("UPDATE s.u SET r = r + 1 WHERE g = %s", (k,))
            before = {v: _rows(w, f"SELECT * FROM s.{v}") for v in views}
            want = {v: _rows(w, query) for v, query in views.items()}
        m = PostgresMaintainer(cluster.dsn, schema="s")
        # rounds 0 and 2: the crash comes before the WAL writer has written anything more —
        # the maintenance commit is lost, deterministically, unless the session asked the
        # refresh to wait for the disk (round 2), which its commit then did itself
        durable = k == 2
        m.conn.execute(f"SET idivm.synchronous_refresh = {'on' if durable else 'off'}")
        held = cluster.hold_wal_writer() if k != 1 else None
        m.maintain_all()
        m.close()
        with psycopg.connect(cluster.dsn, autocommit=True) as w:
            assert {v: _rows(w, f"SELECT * FROM s.{v}") for v in views} == want
        _restart(cluster, held)
        with psycopg.connect(cluster.dsn, autocommit=True) as w:
            got = {v: _rows(w, f"SELECT * FROM s.{v}") for v in views}
            # the writers' commits survived
            assert {v: _rows(w, query) for v, query in views.items()} == want
            runs = w.execute("SELECT count(*) FROM s__idivm.refresh_history "
                             "WHERE view = 'v' AND strategy = 'id'").fetchone()
            # lost whole (every view as before — one transaction —, the run not in the
            # history) or kept whole
            lost = got == before
            assert lost or got == want, (k, got, before, want)
            seen.append("lost" if lost else "kept")
            if held is not None:
                assert lost != durable, k
            assert runs is not None and runs[0] == (k if lost else k + 1), (k, runs)
        with PostgresMaintainer(cluster.dsn, schema="s") as m:
            m.maintain_all()
        with psycopg.connect(cluster.dsn, autocommit=True) as w:
            assert {v: _rows(w, f"SELECT * FROM s.{v}") for v in views} == want, seen
            pending = w.execute("SELECT count(*) FROM s__idivm.log__t WHERE NOT "
                                "pg_visible_in_snapshot(__xid, (SELECT watermark FROM "
                                "s__idivm.log_users WHERE view = 'v' AND tbl = 't'))"
                                ).fetchone()
            assert pending is not None and pending[0] == 0  # nothing left to consume
    print("crashes after a maintain:", seen)  # (a round not held: the WAL writer's timing)


def test_a_crash_in_the_middle_of_a_maintain_leaves_nothing_of_it(cluster: Cluster) -> None:
    _schema(cluster, 200_000)
    with PostgresMaintainer(cluster.dsn, schema="s") as m:
        m.create_view("v", VIEW)
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        w.execute("UPDATE s.t SET v = v + 1")  # 400k log rows: a maintain of a second or so
        w.execute("DELETE FROM s.t WHERE id % 13 = 0")
        before = _rows(w, "SELECT * FROM s.v")
        want = _rows(w, QUERY)
    m = PostgresMaintainer(cluster.dsn, schema="s")
    err = _crash_during(cluster, lambda: m.maintain("v"), "CALL %maintain%")
    assert isinstance(err, MaintenanceError), err
    assert "connection was lost" in str(err)
    m.close()
    cluster.start()
    assert cluster.recovered()
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        assert _rows(w, "SELECT * FROM s.v") == before  # nothing of it
        assert _rows(w, QUERY) == want
    with PostgresMaintainer(cluster.dsn, schema="s") as m:
        m.maintain("v")
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        assert _rows(w, "SELECT * FROM s.v") == want


@pytest.mark.parametrize("then", ["drop_view", "create_view"])
def test_a_crash_in_the_middle_of_create_view(cluster: Cluster, then: str) -> None:
    """The logging is installed (and committed) before the view is computed: a crash in
    between leaves it, for a view that does not exist — listed by ``status()`` as an
    unfinished create_view, removed by ``drop_view``, completed by ``create_view`` again."""
    _schema(cluster, 300_000)
    m = PostgresMaintainer(cluster.dsn, schema="s")
    # materializing: the logging is in place
    err = _crash_during(cluster, lambda: m.create_view("v", VIEW),
                        "CREATE TABLE %fillfactor = 90%")
    assert isinstance(err, BackendError), err
    assert "connection was lost" in str(err) and "status()" in str(err)
    m.close()
    cluster.start()
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        w.execute("UPDATE s.t SET v = v + 1 WHERE id < 100")  # logged, for nobody
        with PostgresMaintainer(cluster.dsn, schema="s") as m:
            assert m.unfinished() == {"v": ["t"]}
            [entry] = m.status()
            assert entry["view"] == "v" and entry["unfinished"] is True
            assert entry["pending_log_rows"] == {"t": 198}
            assert [r["view"] for r in m.status("v")] == ["v"]
            if then == "drop_view":
                m.drop_view("v")
                assert m.unfinished() == {} and m.status() == []
                triggers = w.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = "
                                     "'s.t'::regclass AND NOT tgisinternal").fetchone()
                assert triggers == (0,)  # writers log nothing more
                with pytest.raises(BackendError, match="no idivm view"):
                    m.drop_view("v")
            m.create_view("v", VIEW)
            assert m.unfinished() == {}
            assert [r["view"] for r in m.status()] == ["v"]
        w.execute("UPDATE s.t SET v = v + 1 WHERE id < 200")
        with PostgresMaintainer(cluster.dsn, schema="s") as m:
            m.maintain("v")
        assert _rows(w, "SELECT * FROM s.v") == _rows(w, QUERY)


def test_a_create_view_in_progress_is_not_unfinished(pg_dsn: str, pg_schema: str) -> None:
    """Between its logging's commit and its view's, a create_view running in another session
    is not an unfinished one: not listed, not dropped — ``drop_view`` refuses, the create
    completes, and the view is maintained correctly."""
    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute(f'SET search_path = "{pg_schema}"')
        w.execute("CREATE TABLE t (id int PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
        w.execute("INSERT INTO t SELECT i, i % 7, i FROM generate_series(1, 1000) i")
        creating = PostgresMaintainer(pg_dsn, schema=pg_schema)
        thread, failed = _thread(lambda: creating.create_view("v", VIEW))
        holder = psycopg.connect(pg_dsn)  # holds the view's watermark row: the create's
        thread.start()  # last statement waits for it
        users = f'"{pg_schema}__idivm".log_users'
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the logging never committed"
            try:
                if holder.execute(f"SELECT 1 FROM {users} WHERE view = 'v' FOR UPDATE"
                                  ).fetchone():
                    break
            except psycopg.errors.UndefinedTable:
                pass
            holder.rollback()
            time.sleep(0.001)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            try:
                assert m.unfinished() == {}
                assert m.status() == []
                with pytest.raises(BackendError, match="being created by another session"):
                    m.drop_view("v")
            finally:
                holder.close()  # (the create goes on)
                thread.join(60)
            assert not thread.is_alive() and not failed, failed
            creating.close()
            assert [r["view"] for r in m.status()] == ["v"]
            w.execute("UPDATE t SET v = v + 1 WHERE id < 100")
            m.maintain("v")
        assert _rows(w, "SELECT * FROM v") == _rows(w, QUERY.replace("s.t", "t"))



@pytest.mark.parametrize("first", [True, False])
def test_a_crash_before_create_view_installs_the_maintain_procedure(cluster: Cluster,
                                                                     first: bool) -> None:
    """The view committed, its branch of the ``maintain`` procedure not yet (create_view's
    third transaction, held here at its first statement, the companion's lock) — for the
    schema's first view, no procedure at all: the view is listed, and its first maintain
    installs the branch (the procedure) and makes it equal its query."""
    _schema(cluster, 300_000)
    m = PostgresMaintainer(cluster.dsn, schema="s")
    if not first:
        m.create_view("other", "SELECT g, count(*) AS n FROM t GROUP BY g")
    thread, failed = _thread(lambda: m.create_view("v", VIEW))
    holder = psycopg.connect(cluster.dsn)
    w = psycopg.connect(cluster.dsn, autocommit=True)
    try:
        thread.start()
        _wait_for(w, "CREATE TABLE %fillfactor = 90%")  # the view's transaction
        holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext('s__idivm'))",
                       (LOCK_CLASS,))
        _wait_for(w, "SELECT pg_advisory_xact_lock%", waiting=True)  # the third, held
        cluster.crash()
    finally:
        holder.close()  # (the crash ends its transaction; a failure above: it goes on)
        w.close()
        thread.join(60)
    assert not thread.is_alive()
    assert failed and isinstance(failed[0], BackendError), failed
    assert "connection was lost" in str(failed[0])
    m.close()
    cluster.start()
    with psycopg.connect(cluster.dsn, autocommit=True) as w:
        with PostgresMaintainer(cluster.dsn, schema="s") as m:
            assert [(r["view"], r.get("unfinished")) for r in m.status()] == \
                ([] if first else [("other", None)]) + [("v", None)]
            w.execute("UPDATE s.t SET v = v + 1 WHERE id < 100")
            m.maintain("v")
            if not first:
                m.maintain_all()
        assert _rows(w, "SELECT * FROM s.v") == _rows(w, QUERY)
