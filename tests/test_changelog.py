"""Tests of the PostgreSQL modification log (idivm.postgres.changelog), on a real server."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlglot import exp

from idivm.catalog import Column, Table
from idivm.errors import BackendError, CatalogError
from idivm.postgres import changelog as cl

DEFAULT_DSN = ("postgresql://postgres@127.0.0.1:5432/postgres"
               "?options=-c%20synchronous_commit%3Doff")  # as conftest.DEFAULT_DSN
START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


@pytest.fixture(scope="session")
def _cl_dsn() -> str:
    dsn = os.environ.get("IDIVM_TEST_DSN", DEFAULT_DSN)
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.OperationalError as e:
        msg = f"PostgreSQL unreachable at {dsn} ({e}); start it with: {START_HINT}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return dsn


@pytest.fixture()
def _cl_conn(_cl_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(_cl_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture()
def _cl_schema(_cl_conn: psycopg.Connection) -> Iterator[str]:
    name = f"idivm_cl_{uuid.uuid4().hex[:10]}"
    _cl_conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    for s in (name, f"{name}__idivm"):
        _cl_conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


def ident(*parts: str) -> sql.Composable:
    return sql.Identifier(*parts)


def create(conn: psycopg.Connection, schema: str, table: Table) -> None:
    cols = [
        sql.SQL("{} {}{}").format(
            ident(c.name), sql.SQL(c.type), sql.SQL("" if c.nullable else " NOT NULL")
        )
        for c in table.columns
    ]
    # DEFERRABLE: checked at statement end, so one UPDATE can swap the keys of two rows.
    pk = sql.SQL("PRIMARY KEY ({}) DEFERRABLE").format(
        sql.SQL(", ").join(map(ident, table.primary_key))
    )
    conn.execute(
        sql.SQL("CREATE TABLE {} ({})").format(
            ident(schema, table.name), sql.SQL(", ").join([*cols, pk])
        )
    )


def log_rows(conn: psycopg.Connection, schema: str, table: Table) -> list[tuple[Any, ...]]:
    """The log's rows (its ``ctid``, ``__op``, the table's columns) in the order they were
    written (a log a test never prunes: its rows lie in the order of their inserts)."""
    log = ident(f"{schema}__idivm", f"log__{table.name}")
    cols = ["ctid", cl.OP, *table.column_names]
    return conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY ctid").format(
        sql.SQL(", ").join(map(ident, cols)), log)).fetchall()


def fold(
    conn: psycopg.Connection, schema: str, table: Table, view: str, advance: bool = True
) -> list[dict[str, Any]]:
    """Fold the changes pending for ``view`` in a REPEATABLE READ transaction (as maintenance
    does) and return them as dicts; ``advance`` moves the view's watermark past them."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        mark = cl.watermark(conn, schema, table.name, view)
        rows = _folded(conn, schema, table, view, by_key=False)
        # the compiled maintenance's fold agrees (tables without equality: the same fold)
        by_key = _folded(conn, schema, table, view, by_key=True)
        assert sorted(map(repr, by_key)) == sorted(map(repr, rows))
        if advance:
            cl.advance(conn, schema, view, [table.name])
            assert cl.watermark(conn, schema, table.name, view) != mark or not rows
    return rows


def _folded(conn: psycopg.Connection, schema: str, table: Table, view: str,
            by_key: bool) -> list[dict[str, Any]]:
    cl.fold_into_temp(conn, schema, table, view, "changes", by_key=by_key)
    cur = conn.execute('SELECT * FROM "changes"')
    assert cur.description is not None
    names = [d.name for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    conn.execute('DROP TABLE "changes"')
    return rows


def snapshot(conn: psycopg.Connection, schema: str, table: Table) -> dict[tuple[Any, ...], tuple]:
    keys, others = table.primary_key, table.non_key_columns
    rows = conn.execute(
        sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(map(ident, [*keys, *others])), ident(schema, table.name)
        )
    ).fetchall()
    return {r[: len(keys)]: r[len(keys) :] for r in rows}


def apply_changes(
    state: dict[tuple[Any, ...], tuple], table: Table, changes: list[dict[str, Any]]
) -> None:
    """Apply effective changes, checking each pre-image against the current state."""
    keys, others = table.primary_key, table.non_key_columns
    seen = set()
    for ch in changes:
        key = tuple(ch[k] for k in keys)
        assert key not in seen, f"key {key} folded twice"
        seen.add(key)
        pre = tuple(ch[f"{c}__pre"] for c in others)
        post = tuple(ch[f"{c}__post"] for c in others)
        assert ch["__has_pre"] or ch["__has_post"]
        if ch["__has_pre"] and ch["__has_post"]:
            assert pre != post, f"no-op change for {key} not dropped"
        if ch["__has_pre"]:
            assert state.pop(key) == pre
        else:
            assert key not in state
            assert all(v is None for v in pre)
        if ch["__has_post"]:
            state[key] = post
        else:
            assert all(v is None for v in post)


T_SIMPLE = Table(
    name='Odd "t"',
    columns=(Column("k", "integer", False), Column("a b", "text", True)),
    primary_key=("k",),
    foreign_keys=(),
)


def test_logging_order(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (0, 'before')").format(base))
    cl.install(conn, s, t, "v")
    assert log_rows(conn, s, t) == []

    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'x'), (2, NULL)").format(base))
    conn.execute(sql.SQL("UPDATE {} SET \"a b\" = coalesce(\"a b\", '') || '!'").format(base))
    conn.execute(sql.SQL("DELETE FROM {} WHERE k = 1").format(base))
    rows = [r[1:] for r in log_rows(conn, s, t)]
    assert rows[:2] == [("I", 1, "x"), ("I", 2, None)]
    upd = rows[2:8]
    assert [r[0] for r in upd] == ["D"] * 3 + ["I"] * 3
    assert sorted(upd[:3], key=lambda r: r[1]) == [
        ("D", 0, "before"),
        ("D", 1, "x"),
        ("D", 2, None),
    ]
    assert sorted(upd[3:], key=lambda r: r[1]) == [
        ("I", 0, "before!"),
        ("I", 1, "x!"),
        ("I", 2, "!"),
    ]
    assert rows[8:] == [("D", 1, "x!")]

    changes = {c["k"]: c for c in fold(conn, s, t, "v")}
    assert set(changes) == {0, 2}
    assert changes[0]["a b__pre"] == "before" and changes[0]["a b__post"] == "before!"
    assert changes[2]["__has_pre"] is False and changes[2]["a b__post"] == "!"
    assert fold(conn, s, t, "v") == []  # consumed: nothing is folded twice


T_RAND = Table(
    name="r",
    columns=(
        Column("k1", "integer", False),
        Column("a", "integer", True),
        Column("k2", "text", False),
        Column("b", "text", True),
        Column("c", "numeric(6,2)", True),
    ),
    primary_key=("k1", "k2"),
    foreign_keys=(),
)


def _random_statement(rng: random.Random, conn: psycopg.Connection, base: sql.Composable) -> None:
    # ordered: a random choice among them must not depend on the rows' physical order
    existing = conn.execute(sql.SQL("SELECT k1, k2 FROM {} ORDER BY 1, 2").format(base)).fetchall()
    keys = set(existing)

    def val_a() -> int | None:
        return rng.choice([None, rng.randint(0, 3)])

    def val_b() -> str | None:
        return rng.choice([None, "x", "y", "z"])

    def val_c() -> str | None:
        return rng.choice([None, "1.50", "2.00", f"{rng.randint(0, 999) / 100:.2f}"])

    free = sorted({(k1, k2) for k1 in range(8) for k2 in "pqrst"} - keys)

    def fresh_key() -> tuple[int, str]:
        return rng.choice(free)

    kind = rng.choice(
        ["insert", "insert", "delete", "delete", "update", "update", "rekey", "swap", "multi"]
        + ["ins_del"]
    )
    # Keep the table around half full so every kind keeps finding rows and free keys.
    if kind == "insert" and len(existing) > 20:
        kind = "delete"
    elif kind == "delete" and len(existing) < 10:
        kind = "insert"
    if kind in ("insert", "ins_del") or not existing:
        k = fresh_key()
        conn.execute(
            sql.SQL("INSERT INTO {} (k1, k2, a, b, c) VALUES (%s, %s, %s, %s, %s)").format(base),
            (*k, val_a(), val_b(), val_c()),
        )
        if kind == "ins_del":
            conn.execute(sql.SQL("DELETE FROM {} WHERE k1 = %s AND k2 = %s").format(base), k)
        return
    k = rng.choice(existing)
    if kind == "delete":
        conn.execute(sql.SQL("DELETE FROM {} WHERE k1 = %s AND k2 = %s").format(base), k)
    elif kind == "update":
        col, v = rng.choice([("a", val_a()), ("b", val_b()), ("c", val_c())])
        conn.execute(
            sql.SQL("UPDATE {} SET {} = %s WHERE k1 = %s AND k2 = %s").format(base, ident(col)),
            (v, *k),
        )
    elif kind == "rekey":
        new = fresh_key()
        conn.execute(
            sql.SQL("UPDATE {} SET k1 = %s, k2 = %s, a = %s WHERE k1 = %s AND k2 = %s").format(
                base
            ),
            (*new, val_a(), *k),
        )
    elif kind == "swap":
        # One statement exchanging the keys of two rows: both keys stay, images swap.
        same = [e for e in existing if e[0] == k[0] and e != k]
        if not same:
            return
        o = rng.choice(same)
        conn.execute(
            sql.SQL(
                "UPDATE {} SET k2 = CASE WHEN k2 = %s THEN %s ELSE %s END "
                "WHERE k1 = %s AND k2 IN (%s, %s)"
            ).format(base),
            (k[1], o[1], k[1], k[0], k[1], o[1]),
        )
    else:  # multi-row statement, sometimes a no-op on some rows
        conn.execute(
            sql.SQL(
                "UPDATE {} SET b = CASE WHEN b IS NULL THEN %s ELSE b END WHERE k1 = %s"
            ).format(base),
            (val_b(), k[0]),
        )


@pytest.mark.parametrize("seed", [7, 2024])
def test_random_sequence_fold_reproduces_post_state(
    _cl_conn: psycopg.Connection, _cl_schema: str, seed: int
) -> None:
    conn, s, t = _cl_conn, _cl_schema, T_RAND
    create(conn, s, t)
    base = ident(s, t.name)
    rng = random.Random(seed)
    for k1 in range(4):
        conn.execute(
            sql.SQL(
                "INSERT INTO {} VALUES (%s, 1, 'p', 'x', 1.5), (%s, NULL, 'q', NULL, NULL)"
            ).format(base),
            (k1, k1),
        )
    cl.install(conn, s, t, "whole")
    cl.install(conn, s, t, "chunked")
    pre = snapshot(conn, s, t)
    chunked = dict(pre)
    for step in range(360):
        _random_statement(rng, conn, base)
        if step % 90 == 89:
            apply_changes(chunked, t, fold(conn, s, t, "chunked"))
            assert chunked == snapshot(conn, s, t)
    kinds = {r[1] for r in log_rows(conn, s, t)}
    assert kinds == {"D", "I"}

    whole = dict(pre)
    changes = fold(conn, s, t, "whole")
    apply_changes(whole, t, changes)
    assert whole == snapshot(conn, s, t)
    # The sequence is rich enough to produce deletes, inserts and updates once folded.
    assert {(c["__has_pre"], c["__has_post"]) for c in changes} == {
        (True, False),
        (False, True),
        (True, True),
    }


def test_fold_drops_no_op_changes(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    conn, s = _cl_conn, _cl_schema
    t = Table(
        name="n",
        columns=(
            Column("k", "integer", False),
            Column("a", "text", True),
            Column("b", "int", True),
        ),
        primary_key=("k",),
        foreign_keys=(),
    )
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} VALUES (1, 'x', 1), (2, NULL, NULL), (3, NULL, 3), (4, 'y', 4)"
        ).format(base)
    )
    cl.install(conn, s, t, "v")
    conn.execute(sql.SQL("UPDATE {} SET a = a, b = b").format(base))  # all rows, no change
    conn.execute(sql.SQL("UPDATE {} SET a = 'tmp' WHERE k = 1").format(base))
    conn.execute(sql.SQL("UPDATE {} SET a = 'x' WHERE k = 1").format(base))  # back again
    conn.execute(sql.SQL("INSERT INTO {} VALUES (5, 'z', 5)").format(base))
    conn.execute(sql.SQL("DELETE FROM {} WHERE k = 5").format(base))  # inserted then deleted
    conn.execute(sql.SQL("DELETE FROM {} WHERE k = 4").format(base))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (4, 'y', 4)").format(base))  # deleted, restored
    conn.execute(sql.SQL("UPDATE {} SET a = 'w' WHERE k = 3").format(base))  # NULL -> value
    changes = fold(conn, s, t, "v")
    assert changes == [
        {
            "k": 3,
            "a__pre": None,
            "b__pre": 3,
            "a__post": "w",
            "b__post": 3,
            "__has_pre": True,
            "__has_post": True,
        }
    ]


def test_fold_key_only_table(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    conn, s = _cl_conn, _cl_schema
    t = Table(
        name="k", columns=(Column("k", "integer", False),), primary_key=("k",), foreign_keys=()
    )
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1), (2)").format(base))
    cl.install(conn, s, t, "v")
    conn.execute(sql.SQL("DELETE FROM {}").format(base))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1), (3)").format(base))
    changes = sorted((c["k"], c["__has_pre"], c["__has_post"]) for c in fold(conn, s, t, "v"))
    assert changes == [(2, True, False), (3, False, True)]


def _prune_all(conn: psycopg.Connection, s: str, t: Table, views: list[str]) -> int:
    """Prune until the log is empty: a transaction of another session that was running when
    a watermark was taken holds the prune back (like VACUUM), so the views' watermarks are
    renewed until none is left; bounded."""
    n = 0
    for _ in range(50):
        n += cl.prune(conn, s, t.name)
        if not log_rows(conn, s, t):
            return n
        time.sleep(0.1)
        for v in views:
            assert fold(conn, s, t, v) == []
    raise AssertionError("log rows every view consumed were not pruned")


def test_two_views_watermarks_and_prune(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    base = ident(s, t.name)
    cl.install(conn, s, t, "v1")
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(base))
    cl.install(conn, s, t, "v2")  # reuses log and triggers, starts at the current snapshot
    assert len(log_rows(conn, s, t)) == 1
    conn.execute(sql.SQL("INSERT INTO {} VALUES (2, 'b')").format(base))
    assert len(log_rows(conn, s, t)) == 2  # triggers not duplicated

    assert cl.prune(conn, s, t.name) == 0  # v1 has consumed nothing
    assert sorted(c["k"] for c in fold(conn, s, t, "v2")) == [2]
    assert cl.prune(conn, s, t.name) == 0  # v1 still needs both rows
    assert sorted(c["k"] for c in fold(conn, s, t, "v1", advance=False)) == [1, 2]
    assert sorted(c["k"] for c in fold(conn, s, t, "v1")) == [1, 2]
    assert _prune_all(conn, s, t, ["v1", "v2"]) == 2
    conn.execute(sql.SQL("DELETE FROM {} WHERE k = 1").format(base))
    assert [c["k"] for c in fold(conn, s, t, "v1")] == [1]
    assert [c["k"] for c in fold(conn, s, t, "v2")] == [1]

    with pytest.raises(BackendError):
        cl.watermark(conn, s, t.name, "nope")
    with pytest.raises(BackendError):
        cl.advance(conn, s, "nope")


def test_uncommitted_writer_is_consumed_after_it_commits(
    _cl_conn: psycopg.Connection, _cl_schema: str, _cl_dsn: str
) -> None:
    """A transaction that wrote before a fold and commits after it is not lost: the fold's
    snapshot did not see it, so the next fold does (a sequence-number watermark would have
    skipped it: its number is below rows committed earlier)."""
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    base = ident(s, t.name)
    cl.install(conn, s, t, "v")
    with psycopg.connect(_cl_dsn) as slow:  # not autocommit: its transaction stays open
        slow.execute(sql.SQL("INSERT INTO {} VALUES (1, 'slow')").format(base))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (2, 'fast')").format(base))
        assert [c["k"] for c in fold(conn, s, t, "v")] == [2]
        slow.commit()
    assert [c["k"] for c in fold(conn, s, t, "v")] == [1]
    assert fold(conn, s, t, "v") == []


def _objects(conn: psycopg.Connection, s: str, t: Table) -> tuple[int, int, bool]:
    row = conn.execute(
        """
        SELECT (SELECT count(*) FROM pg_trigger g
                WHERE g.tgrelid = (quote_ident(%(s)s) || '.' || quote_ident(%(t)s))::regclass
                  AND NOT g.tgisinternal),
               (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = %(c)s AND p.proname LIKE 'log%%'),
               to_regclass(quote_ident(%(c)s) || '.' || quote_ident('log__' || %(t)s)) IS NOT NULL
        """,
        {"s": s, "t": t.name, "c": f"{s}__idivm"},
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_uninstall_drops_everything_when_last_user_leaves(
    _cl_conn: psycopg.Connection, _cl_schema: str
) -> None:
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    cl.install(conn, s, t, "v1")
    cl.install(conn, s, t, "v2")
    assert _objects(conn, s, t) == (4, 4, True)
    cl.uninstall(conn, s, t.name, "v1")
    assert _objects(conn, s, t) == (4, 4, True)
    cl.uninstall(conn, s, t.name, "v2")
    assert _objects(conn, s, t) == (0, 0, False)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(ident(s, t.name)))
    conn.execute(sql.SQL("TRUNCATE {}").format(ident(s, t.name)))
    cl.uninstall(conn, s, t.name, "v2")  # already gone: no error
    cl.install(conn, s, t, "v3")  # reinstall from scratch works
    assert _objects(conn, s, t) == (4, 4, True)


def test_truncate_is_logged_as_deletes(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b')").format(base))
    cl.install(conn, s, t, "v")
    conn.execute(sql.SQL("TRUNCATE {}").format(base))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (2, 'c')").format(base))
    changes = sorted((c["k"], c["__has_pre"], c["__has_post"], c["a b__post"])
                     for c in fold(conn, s, t, "v"))
    assert changes == [(1, True, False, None), (2, True, True, "c")]


def test_logging_fires_in_replica_mode(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    """Logical-replication apply workers and restores run as replicas: still logged."""
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    cl.install(conn, s, t, "v")
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(sql.SQL("INSERT INTO {} VALUES (7, 'r')").format(ident(s, t.name)))
    assert [c["k"] for c in fold(conn, s, t, "v")] == [7]


def test_log_holds_only_the_columns_asked_for(
    _cl_conn: psycopg.Connection, _cl_schema: str
) -> None:
    conn, s = _cl_conn, _cl_schema
    t = Table(name="w", columns=(Column("k", "integer", False), Column("a", "int", True),
                                 Column("b", "text", True)), primary_key=("k",))
    create(conn, s, t)
    cl.install(conn, s, t, "v1", ["a"])
    assert cl.log_columns(conn, s, "w") == ["k", "a"]
    cl.install(conn, s, t, "v2", ["b"])  # widened for the second view
    assert cl.log_columns(conn, s, "w") == ["k", "a", "b"]
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 2, 'x')").format(ident(s, "w")))
    assert log_rows(conn, s, t)[0][1:] == ("I", 1, 2, "x")


def test_an_update_logs_only_the_images_that_change(
    _cl_conn: psycopg.Connection, _cl_schema: str
) -> None:
    """An UPDATE's old and new images equal in every logged column cancel in the trigger: an
    UPDATE of columns the log does not hold, or setting the values they had, logs nothing;
    keys swapped between rows equal in the logged columns log nothing either (the DEFERRABLE
    key lets one UPDATE swap them), different ones log both images; the fold still gives the
    table's changes."""
    conn, s = _cl_conn, _cl_schema
    t = Table(name="u", columns=(Column("k", "integer", False), Column("a", "text", True),
                                 Column("b", "int", True)), primary_key=("k",))
    logged = Table(name="u", columns=(Column("k", "integer", False), Column("a", "text", True)),
                   primary_key=("k",))
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'x', 1), (2, NULL, 2), (10, 's', 3), "
                         "(11, 's', 4), (20, 'p', 5), (21, 'q', 6)").format(base))
    cl.install(conn, s, t, "v", ["a"])
    before = snapshot(conn, s, logged)
    conn.execute(sql.SQL("UPDATE {} SET b = b + 1").format(base))  # not logged: b
    conn.execute(sql.SQL("UPDATE {} SET a = a").format(base))  # the values they had
    conn.execute(sql.SQL("UPDATE {} SET k = 21 - k WHERE k IN (10, 11)").format(base))
    assert log_rows(conn, s, logged) == []
    conn.execute(sql.SQL("UPDATE {} SET a = 'y', b = b + 1 WHERE k <= 2").format(base))
    conn.execute(sql.SQL("UPDATE {} SET k = 41 - k WHERE k IN (20, 21)").format(base))
    rows = sorted(r[1:] for r in log_rows(conn, s, logged))
    assert rows == sorted([("D", 1, "x"), ("I", 1, "y"), ("D", 2, None), ("I", 2, "y"),
                           ("D", 20, "p"), ("D", 21, "q"), ("I", 21, "p"), ("I", 20, "q")])
    state = dict(before)
    apply_changes(state, logged, fold(conn, s, logged, "v"))
    assert state == snapshot(conn, s, logged)


def test_a_large_update_logs_every_image(
    _cl_conn: psycopg.Connection, _cl_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An UPDATE of more than ``CANCEL_ROWS`` rows logs its images without cancelling them
    (the writer pays no in-memory difference of a large statement); the fold nets them."""
    monkeypatch.setattr(cl, "CANCEL_ROWS", 2)
    conn, s, t = _cl_conn, _cl_schema, T_SIMPLE
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b'), (3, 'c')").format(base))
    cl.install(conn, s, t, "v")
    conn.execute(sql.SQL('UPDATE {} SET "a b" = "a b" WHERE k <= 2').format(base))
    assert log_rows(conn, s, t) == []  # two rows: cancelled
    conn.execute(sql.SQL('UPDATE {} SET "a b" = "a b"').format(base))
    assert sorted(r[1] for r in log_rows(conn, s, t)) == ["D"] * 3 + ["I"] * 3
    assert fold(conn, s, t, "v") == []


def test_an_update_of_values_without_equality_logs_every_image(
    _cl_conn: psycopg.Connection, _cl_schema: str
) -> None:
    """A logged column PostgreSQL cannot compare (json) logs every image, as before: the fold
    compares its images by their text."""
    conn, s = _cl_conn, _cl_schema
    t = Table(name="j", columns=(Column("k", "integer", False), Column("a", "json", True)),
              primary_key=("k",))
    create(conn, s, t)
    base = ident(s, t.name)
    conn.execute(sql.SQL("""INSERT INTO {} VALUES (1, '{{"x": 1}}')""").format(base))
    cl.install(conn, s, t, "v")
    conn.execute(sql.SQL("UPDATE {} SET a = a").format(base))
    assert [r[1] for r in log_rows(conn, s, t)] == ["D", "I"]
    assert fold(conn, s, t, "v") == []


def test_reserved_column_refused(_cl_conn: psycopg.Connection, _cl_schema: str) -> None:
    conn, s = _cl_conn, _cl_schema
    t = Table(
        name="bad",
        columns=(Column("k", "integer", False), Column("__seq", "int", True)),
        primary_key=("k",),
        foreign_keys=(),
    )
    with pytest.raises(CatalogError, match="does not exist"):
        cl.install(conn, s, t, "v")
    create(conn, s, t)
    with pytest.raises(CatalogError, match="reserved"):
        cl.install(conn, s, t, "v")
    assert conn.execute("SELECT to_regnamespace(%s)", (f"{s}__idivm",)).fetchone() == (None,)
    # a column named as the compiled maintenance's variables (its log scans' unqualified
    # references would be ambiguous: every maintain failed)
    t2 = Table(name="bad2", columns=(Column("k", "integer", False),
                                     Column("idivm__prev", "int", True)),
               primary_key=("k",), foreign_keys=())
    create(conn, s, t2)
    with pytest.raises(CatalogError, match="idivm__prev are reserved"):
        cl.install(conn, s, t2, "v")


def test_fold_query_shape_and_spark_rendering() -> None:
    log = exp.Table(this=exp.to_identifier("log__r", quoted=True), db=exp.to_identifier("x"))
    q = cl.fold_query(T_RAND, log, 3, 10)
    assert q.named_selects == [
        "k1",
        "k2",
        "a__pre",
        "b__pre",
        "c__pre",
        "a__post",
        "b__post",
        "c__post",
        "__has_pre",
        "__has_post",
    ]
    spark = q.sql("spark")
    assert "ROW_NUMBER() OVER" in spark and "DISTINCT" not in spark.upper()
    assert "`__seq` > 3" in spark and "`__seq` <= 10" in spark
    pg = q.sql("postgres")
    assert "DISTINCT ON" not in pg


def test_fold_by_key_images_of_every_kind_of_type(
    _cl_conn: psycopg.Connection, _cl_schema: str
) -> None:
    """The compiled fold's images (``first_image``, polymorphic) for types with no ``min``
    (boolean, jsonb, uuid, bytea, arrays, a domain) and NULLs, over keys changed once and
    keys changed again in a batch: the same changes as ``fold_select``'s (``fold`` compares
    them) that reproduce the table."""
    conn, s = _cl_conn, _cl_schema
    conn.execute(sql.SQL("CREATE DOMAIN {} AS numeric(8, 2) CHECK (VALUE >= 0)").format(
        ident(s, "amount")))
    t = Table(name="typed", columns=(
        Column("k", "integer", False), Column("flag", "boolean", True),
        Column("doc", "jsonb", True), Column("u", "uuid", True), Column("raw", "bytea", True),
        Column("arr", "integer[]", True),
        Column("amt", f'"{s}"."amount"', True)), primary_key=("k",), foreign_keys=())
    create(conn, s, t)
    base = ident(s, t.name)
    rng = random.Random(11)

    def row(k: int) -> tuple[Any, ...]:
        def maybe(v: Any) -> Any:
            return None if rng.random() < 0.25 else v
        return (k, maybe(rng.random() < 0.5), maybe(psycopg.types.json.Jsonb(
                    {"n": rng.randint(0, 3)})), maybe(uuid.UUID(int=rng.randint(0, 3))),
                maybe(bytes([rng.randint(0, 3)])), maybe([rng.randint(0, 3), None]),
                maybe(f"{rng.randint(0, 300) / 100:.2f}"))

    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s)").format(base)
    for k in range(6):
        conn.execute(insert, row(k))
    cl.install(conn, s, t, "v")
    state = snapshot(conn, s, t)
    for batch in range(6):
        for _ in range(12):
            keys = [r[0] for r in conn.execute(sql.SQL("SELECT k FROM {} ORDER BY k").format(
                base)).fetchall()]
            kind = rng.choice(["insert", "update", "update", "delete"])
            if kind == "insert" or len(keys) < 3:
                free = sorted(set(range(12)) - set(keys))
                if free:
                    conn.execute(insert, row(rng.choice(free)))
            elif kind == "update":
                new = row(rng.choice(keys))
                conn.execute(sql.SQL(
                    "UPDATE {} SET flag = %s, doc = %s, u = %s, raw = %s, arr = %s, amt = %s "
                    "WHERE k = %s").format(base), (*new[1:], new[0]))
            else:
                conn.execute(sql.SQL("DELETE FROM {} WHERE k = %s").format(base),
                             (rng.choice(keys),))
        apply_changes(state, t, fold(conn, s, t, "v"))
        assert state == snapshot(conn, s, t), f"batch {batch}"


def _counts(conn: psycopg.Connection, s: str) -> dict[str, int]:
    """The logging statements' counts (``log_counts``) added up per writing transaction."""
    return {str(x): int(n) for x, n in conn.execute(sql.SQL(
        "SELECT {}::text, sum(n) FROM {} GROUP BY 1").format(
            ident(cl.XID), ident(f"{s}__idivm", cl.COUNTS))).fetchall()}


def _logged(conn: psycopg.Connection, s: str, t: Table) -> dict[str, int]:
    return {str(x): int(n) for x, n in conn.execute(sql.SQL(
        "SELECT {}::text, count(*) FROM {} GROUP BY 1").format(
            ident(cl.XID), ident(f"{s}__idivm", f"log__{t.name}"))).fetchall()}


T_NAMED = Table(  # columns named as the counts' columns
    name="named",
    columns=(Column("k", "integer", False), Column("n", "integer", True),
             Column("tbl", "text", True), Column("v", "integer", True)),
    primary_key=("k",),
    foreign_keys=(),
)


@pytest.mark.parametrize("t", [T_SIMPLE, T_NAMED], ids=["odd name", "variables' names"])
def test_logging_statements_count_their_rows(_cl_conn: psycopg.Connection, _cl_schema: str,
                                             t: Table) -> None:
    """Each logging statement adds how many rows it logged to ``log_counts`` (its writer's
    xid): per transaction they add up to the log's rows — INSERT, an UPDATE's images that
    do not cancel, DELETE, TRUNCATE, several statements in one transaction; a statement that
    logs nothing counts nothing; a prune takes the counts with the rows."""
    conn, s = _cl_conn, _cl_schema
    create(conn, s, t)
    base = ident(s, t.name)
    cl.install(conn, s, t, "v")
    values = "g, g::text" if t is T_SIMPLE else "g, g, 'x', g"
    conn.execute(sql.SQL("INSERT INTO {} SELECT " + values + " FROM generate_series(1, 20) g")
                 .format(base))
    other = ident(t.columns[1].name)
    with conn.transaction():
        # (images equal in every column cancel: logs nothing, counts nothing)
        conn.execute(sql.SQL("UPDATE {} SET {} = {} WHERE k <= 5").format(base, other, other))
        conn.execute(sql.SQL("UPDATE {} SET {} = NULL WHERE k BETWEEN 6 AND 8").format(
            base, other))
        conn.execute(sql.SQL("DELETE FROM {} WHERE k > 18").format(base))
    conn.execute(sql.SQL("DELETE FROM {} WHERE k > 100").format(base))  # logs nothing
    conn.execute(sql.SQL("TRUNCATE {}").format(base))
    assert _counts(conn, s) == _logged(conn, s, t)
    # 20 inserted; 3 updated (old and new images) and 2 deleted; 18 truncated
    assert sorted(_counts(conn, s).values()) == [8, 18, 20]
    assert fold(conn, s, t, "v") == []  # inserted, changed, deleted: nothing left
    assert _prune_all(conn, s, t, ["v"]) == 46
    assert _counts(conn, s) == {} == _logged(conn, s, t)
    conn.execute(sql.SQL("INSERT INTO {} SELECT " + values + " FROM generate_series(1, 2) g")
                 .format(base))
    cl.uninstall(conn, s, t.name, "v")  # the last consumer: its counts go with the log
    assert _counts(conn, s) == {}
