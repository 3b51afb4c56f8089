"""Every row change is captured exactly once, whatever fires it (issue 24).

Statement triggers log row changes in the order their statements *end*: a cascade or a row
trigger runs nested statements whose log rows come before the outer statement's, so the log
order is not the order of the row changes. The fold must not depend on it. Each test changes
base tables through cascades, triggers, savepoints, key swaps…, maintains its views under the
``id`` and ``tuple`` strategies and compares each with its recomputation (as multisets).

Inheritance: PostgreSQL's ``FROM parent`` reads the children too, whose writes fire no trigger
of the parent — such tables are refused at ``create_view``, and a child created later makes
``maintain`` refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idivm.catalog import Column, Table
from idivm.errors import BackendError, IdivmError, UnsupportedSQL
from idivm.postgres import PostgresMaintainer
from idivm.postgres import changelog as cl
from tests.differential.harness import maintained_rows, recompute_rows

STRATEGIES = ("id", "tuple")

Step = str | Sequence[str]  # one autocommit statement, or the statements of one transaction


def _run(conn: psycopg.Connection[Any], schema: str, step: Step) -> None:
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    if isinstance(step, str):
        conn.execute(step.encode())
        return
    with conn.transaction():
        for s in step:
            conn.execute(s.encode())


def check(dsn: str, schema: str, ddl: Sequence[str], views: dict[str, str],
          rounds: Sequence[Sequence[Step]]) -> None:
    """Create the tables and the views (each under every strategy), then per round run its
    steps, maintain every view once and compare it with its recomputation."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in ddl:
            _run(conn, schema, s)
        with PostgresMaintainer(dsn, schema=schema) as m:
            names = {}
            for view, q in views.items():
                for strategy in STRATEGIES:
                    name = f"{view}_{strategy}"
                    m.create_view(name, q, strategy=strategy)
                    names[name] = q
            for i, steps in enumerate(rounds):
                for step in steps:
                    _run(conn, schema, step)
                for name, q in names.items():
                    m.maintain(name)
                    assert maintained_rows(conn, schema, name) == \
                        recompute_rows(conn, schema, q), f"{name} after round {i}"


def test_a_row_changed_twice_by_an_update_cascade_is_captured(pg_dsn: str,
                                                              pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (a int PRIMARY KEY, b int REFERENCES t (a) ON UPDATE CASCADE)",
           "INSERT INTO t VALUES (1, NULL), (2, 1), (3, 2)"],
          {"all_t": "SELECT * FROM t",
           "by_b": "SELECT t.b, count(*) AS n FROM t GROUP BY t.b",
           "chain": "SELECT x.a, y.a AS up FROM t x JOIN t y ON x.b = y.a"},
          [["UPDATE t SET a = a + 10"],
           ["UPDATE t SET a = a - 10 WHERE a = 11", "UPDATE t SET a = 20 WHERE a = 13"]])


def test_keys_logged_more_often_are_folded_and_counted(pg_dsn: str, pg_schema: str) -> None:
    """The compiled fold groups the log by key once; a key logged more often than once or
    twice (changed again in the batch) leaves a placeholder that a second statement folds
    and removes. Batches made only of such keys: the view is right and the run's count of
    changes is of the keys that changed in effect (a count that stayed at the placeholders'
    would run statements for changes that cancelled; one too low would skip them)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for s in ["CREATE TABLE t (k int PRIMARY KEY, v int, g int NOT NULL)",
                  "INSERT INTO t VALUES (1, 10, 1), (2, 20, 1), (3, 30, 2)"]:
            _run(conn, pg_schema, s)
        # (a view whose change table is folded: not read as sums of images, planner.linear)
        q = "SELECT t.k, t.v, t.g FROM t WHERE t.v > 0"
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("sums", q, strategy="id")
            labels: list[frozenset[str] | None] = []
            for steps, changed in [
                (["UPDATE t SET v = v + 1 WHERE k = 1", "UPDATE t SET v = v + 1 WHERE k = 1"],
                 1),  # updated twice
                (["UPDATE t SET v = v + 1 WHERE k = 2", "UPDATE t SET v = v - 1 WHERE k = 2"],
                 0),  # and back: no change
                (["INSERT INTO t VALUES (9, 90, 1)", "UPDATE t SET g = 2 WHERE k = 9",
                  "UPDATE t SET v = 5 WHERE k = 3", "UPDATE t SET v = 5 WHERE k = 3"],
                 2),  # inserted and moved; updated, then to the same value
                (["DELETE FROM t WHERE k = 9", "INSERT INTO t VALUES (9, 90, 2)",
                  "DELETE FROM t WHERE k = 9", "UPDATE t SET v = 1 WHERE k = 1"],
                 2),  # deleted, inserted, deleted; and one key changed once
            ]:
                for step in steps:
                    _run(conn, pg_schema, step)
                stats = m.maintain("sums")
                assert stats.changes == {"t": changed}, steps
                # the records list every statement of the script whenever it ran, a skipped
                # one at 0 (compile._skipped_zeros), and none when it did not
                labels.append(frozenset(stats.idiff_rows) if changed else None)
                assert changed or not stats.idiff_rows
                assert maintained_rows(conn, pg_schema, "sums") == \
                    recompute_rows(conn, pg_schema, q), steps
            ran = [x for x in labels if x is not None]
            assert len(set(ran)) == 1 and len(ran[0]) > 1, labels
            # the scratch relations are empty after each run (no placeholder left behind)
            scratch = [r[0] for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE '\\_\\_iv%%'",
                (f"{pg_schema}__idivm",)).fetchall()]
            assert scratch
            for r in scratch:
                assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(f"{pg_schema}__idivm", r))).fetchone() == (0,), r


def test_a_row_trigger_writing_its_own_table_is_captured(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (i int PRIMARY KEY)",
           "CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS "
           "$$BEGIN UPDATE t SET i = i + 1; RETURN NULL; END$$",
           "CREATE TRIGGER bump AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION bump()"],
          {"all_t": "SELECT * FROM t",
           "total": "SELECT count(*) AS n, sum(t.i) AS s FROM t"},
          [["INSERT INTO t VALUES (10)", "INSERT INTO t VALUES (9)"],
           ["INSERT INTO t VALUES (1)"],
           [["INSERT INTO t VALUES (30)", "DELETE FROM t WHERE i = 12"]]])


def test_a_row_trigger_writing_another_table_of_the_view_is_captured(
        pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE o (id int PRIMARY KEY, cust int NOT NULL, amount int NOT NULL)",
           "CREATE TABLE c (id int PRIMARY KEY, n int NOT NULL, total int NOT NULL)",
           "INSERT INTO c VALUES (1, 0, 0), (2, 0, 0)",
           # every order write updates its customer's counters, and renumbers the order
           "CREATE FUNCTION track() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN\n"
           "  UPDATE c SET n = n + 1, total = total + NEW.amount WHERE c.id = NEW.cust;\n"
           "  IF NEW.id < 100 THEN UPDATE o SET id = id + 100 WHERE o.id = NEW.id; END IF;\n"
           "  RETURN NULL; END$$",
           "CREATE TRIGGER track AFTER INSERT OR UPDATE OF amount ON o FOR EACH ROW "
           "EXECUTE FUNCTION track()"],
          {"joined": "SELECT o.id, o.amount, c.n, c.total FROM o JOIN c ON o.cust = c.id",
           "per_cust": "SELECT c.id, c.total, count(o.id) AS k, sum(o.amount) AS s "
                       "FROM c JOIN o ON o.cust = c.id GROUP BY c.id, c.total"},
          [["INSERT INTO o VALUES (1, 1, 5), (2, 1, 7), (3, 2, 1)"],
           ["UPDATE o SET amount = amount * 2 WHERE cust = 1", "DELETE FROM o WHERE id = 103"],
           [["INSERT INTO o VALUES (4, 2, 3)", "UPDATE o SET amount = 0 WHERE id = 104"]]])


def test_transactions_with_savepoints_and_rollbacks(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (k int PRIMARY KEY, v int, g int NOT NULL)",
           "CREATE TABLE u (g int PRIMARY KEY, label text)",
           "INSERT INTO t VALUES (1, 10, 1), (2, 20, 1), (3, 30, 2)",
           "INSERT INTO u VALUES (1, 'one'), (2, 'two')"],
          {"joined": "SELECT t.k, t.v, u.label FROM t JOIN u ON t.g = u.g",
           "sums": "SELECT u.label, sum(t.v) AS s, count(*) AS n FROM t JOIN u ON t.g = u.g "
                   "GROUP BY u.label"},
          [[["INSERT INTO t VALUES (4, 40, 2)",
             "SAVEPOINT a",
             "UPDATE t SET v = v + 1",
             "UPDATE u SET label = 'uno' WHERE g = 1",
             "ROLLBACK TO SAVEPOINT a",
             "UPDATE t SET v = v + 100 WHERE k = 1",
             "SAVEPOINT b",
             "DELETE FROM t WHERE k = 2",
             "RELEASE SAVEPOINT b",
             "SAVEPOINT c",
             "INSERT INTO t VALUES (5, 50, 1)",
             "ROLLBACK TO SAVEPOINT c",
             "UPDATE t SET k = 2 WHERE k = 4"]],
           # a plpgsql block whose exception handler rolls its writes back
           ["DO $$BEGIN\n  BEGIN\n    UPDATE t SET v = 0;\n    PERFORM 1 / 0;\n"
            "  EXCEPTION WHEN division_by_zero THEN NULL;\n  END;\n"
            "  UPDATE t SET v = -v WHERE k = 3;\nEND$$"],
           # a whole transaction rolled back (its log rows with it)
           ["BEGIN", "DELETE FROM t", "UPDATE u SET label = NULL", "ROLLBACK"],
           []])


def test_a_row_inserted_and_deleted_in_one_transaction(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (k int PRIMARY KEY, v int)",
           "INSERT INTO t VALUES (1, 1), (2, 2)"],
          {"all_t": "SELECT * FROM t",
           "agg": "SELECT count(*) AS n, sum(t.v) AS s FROM t"},
          [[["INSERT INTO t VALUES (3, 3)", "DELETE FROM t WHERE k = 3"],
            # deleted and inserted back as it was, and as something else
            ["DELETE FROM t WHERE k = 1", "INSERT INTO t VALUES (1, 1)",
             "DELETE FROM t WHERE k = 2", "INSERT INTO t VALUES (2, 5)"],
            # updated back and forth: no net change
            ["UPDATE t SET v = 9 WHERE k = 1", "UPDATE t SET v = 1 WHERE k = 1"]],
           [["INSERT INTO t VALUES (4, NULL)", "UPDATE t SET v = 4 WHERE k = 4",
             "UPDATE t SET v = NULL WHERE k = 4"]]])


def test_key_swaps(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (a int, v text, PRIMARY KEY (a) DEFERRABLE INITIALLY IMMEDIATE)",
           "CREATE TABLE s (a int PRIMARY KEY, w int NOT NULL)",
           "INSERT INTO t VALUES (1, 'x'), (2, 'y'), (3, 'z')",
           "INSERT INTO s VALUES (1, 10), (2, 20), (3, 30)"],
          {"all_t": "SELECT * FROM t",
           "joined": "SELECT t.v, s.w FROM t JOIN s ON t.a = s.a",
           "agg": "SELECT t.v, sum(s.w) AS sw FROM t JOIN s ON t.a = s.a GROUP BY t.v"},
          [["UPDATE t SET a = CASE a WHEN 1 THEN 2 WHEN 2 THEN 1 END WHERE a IN (1, 2)"],
           # a three-cycle, then back, in one transaction: no net change of keys 1..3
           [["UPDATE t SET a = a % 3 + 1", "UPDATE t SET a = (a + 1) % 3 + 1"]],
           [["UPDATE t SET a = a % 3 + 1", "UPDATE t SET v = v || '!' WHERE a = 1"]]])


def test_composite_keys_swapped_and_cascaded(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE h (a int, b int, v text, PRIMARY KEY (a, b))",
           "CREATE TABLE d (id int PRIMARY KEY, a int, b int, FOREIGN KEY (a, b) "
           "REFERENCES h (a, b) ON UPDATE CASCADE ON DELETE CASCADE)",
           "INSERT INTO h VALUES (1, 1, 'p'), (1, 2, 'q'), (2, 1, 'r')",
           "INSERT INTO d VALUES (1, 1, 1), (2, 1, 2), (3, 2, 1)"],
          {"joined": "SELECT d.id, h.v FROM d JOIN h ON d.a = h.a AND d.b = h.b",
           "per_v": "SELECT h.v, count(*) AS n FROM d JOIN h ON d.a = h.a AND d.b = h.b "
                    "GROUP BY h.v"},
          [["UPDATE h SET b = b + 10 WHERE a = 1"],
           [["UPDATE h SET a = a + 1 WHERE a = 2", "UPDATE h SET a = 2, b = 1 WHERE b = 11",
             "DELETE FROM h WHERE a = 3 AND b = 1"]]])


def test_on_delete_cascade_and_set_null_across_two_tables(pg_dsn: str,
                                                          pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE p (id int PRIMARY KEY, name text NOT NULL)",
           "CREATE TABLE c (id int PRIMARY KEY, "
           "pid int REFERENCES p (id) ON DELETE CASCADE ON UPDATE CASCADE, "
           "ref int REFERENCES p (id) ON DELETE SET NULL ON UPDATE SET NULL, qty int NOT NULL)",
           "INSERT INTO p VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')",
           "INSERT INTO c VALUES (10, 1, 2, 1), (11, 1, 3, 2), (12, 2, 1, 3), (13, 3, 3, 4), "
           "(14, 4, 4, 5)"],
          {"owner": "SELECT c.id, p.name, c.qty FROM c JOIN p ON c.pid = p.id",
           "refd": "SELECT c.id, c.ref, p.name FROM c LEFT JOIN p ON c.ref = p.id",
           "per_p": "SELECT p.name, count(c.id) AS n, sum(c.qty) AS q "
                    "FROM p JOIN c ON c.ref = p.id GROUP BY p.name"},
          [["DELETE FROM p WHERE id = 3"],
           [["UPDATE p SET id = 5 WHERE id = 4", "DELETE FROM p WHERE id = 2",
             "INSERT INTO p VALUES (2, 'b2')", "INSERT INTO c VALUES (15, 2, 2, 6)"]],
           ["DELETE FROM p"]])


def test_a_self_referencing_delete_cascade(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (a int PRIMARY KEY, b int REFERENCES t (a) ON DELETE SET NULL, "
           "r int REFERENCES t (a) ON DELETE CASCADE)",
           "INSERT INTO t VALUES (1, NULL, NULL), (2, 1, 1), (3, 2, 2), (4, 3, 1), (5, 4, NULL)"],
          {"all_t": "SELECT * FROM t",
           "pairs": "SELECT x.a, y.a AS parent FROM t x LEFT JOIN t y ON x.b = y.a"},
          [["DELETE FROM t WHERE a = 1"], ["DELETE FROM t WHERE a = 4"]])


def test_upserts_merge_and_truncate(pg_dsn: str, pg_schema: str) -> None:
    check(pg_dsn, pg_schema,
          ["CREATE TABLE t (k int PRIMARY KEY, v int NOT NULL)",
           "CREATE TABLE s (k int PRIMARY KEY, w int NOT NULL)",
           "INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)",
           "INSERT INTO s VALUES (1, 10), (2, 20), (4, 40)"],
          {"joined": "SELECT t.k, t.v, s.w FROM t JOIN s ON t.k = s.k",
           "agg": "SELECT sum(t.v) AS sv, count(*) AS n FROM t"},
          [["INSERT INTO t VALUES (3, 30), (4, 4) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"],
           ["MERGE INTO t USING s ON t.k = s.k WHEN MATCHED AND s.w > 30 THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET v = t.v + s.w "
            "WHEN NOT MATCHED THEN INSERT VALUES (s.k, s.w)"],
           [["TRUNCATE t", "INSERT INTO t VALUES (1, 1), (9, 9)", "TRUNCATE s, t",
             "INSERT INTO t VALUES (1, 100)", "INSERT INTO s VALUES (1, 1)"]]])


# --------------------------------------------------------------------------- the fold itself


def _log(conn: psycopg.Connection[Any], schema: str, table: Table,
         rows: Sequence[tuple[Any, ...]]) -> None:
    cols = [cl.OP, *table.column_names]
    for r in rows:
        conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(f"{schema}__idivm", f"log__{table.name}"),
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(sql.Placeholder() * len(cols))), r)


def _fold(conn: psycopg.Connection[Any], schema: str, table: Table,
          by_key: bool = False) -> list[tuple[Any, ...]]:
    with conn.transaction():
        cl.fold_into_temp(conn, schema, table, "v", "folded", by_key=by_key)
        return sorted(conn.execute("SELECT * FROM pg_temp.folded").fetchall(),
                      key=lambda r: r[0])


@pytest.mark.parametrize("by_key", [False, True], ids=["fold_select", "fold_by_key"])
def test_the_fold_does_not_depend_on_log_order(pg_dsn: str, pg_schema: str,
                                               by_key: bool) -> None:
    """Log rows of one key in any order: the net images decide (nested statements log
    theirs before the outer statement's). The compiled fold (``fold_by_key``) too: keys 2
    and 3, logged three times, go through its placeholders."""
    table = Table("t", (Column("k", "INT", False), Column("v", "INT")), ("k",))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (k int PRIMARY KEY, v int)").format(
            sql.Identifier(pg_schema, "t")))
        cl.install(conn, pg_schema, table, "v")
        _log(conn, pg_schema, table, [
            ("I", 1, 11), ("D", 1, 10),                   # 10 → 11, logged inner first
            ("I", 2, 21), ("I", 2, 22), ("D", 2, 21),     # inserted 21, 21 → 22
            ("D", 3, 30), ("I", 3, 31), ("D", 3, 31),     # deleted after an update
            ("I", 4, 40), ("D", 4, 40),                   # inserted and deleted
            ("I", 5, None), ("D", 5, None),               # updated to itself
            ("D", 6, None), ("I", 6, 6)])
        assert _fold(conn, pg_schema, table, by_key) == [
            (1, 10, 11, True, True), (2, None, 22, False, True), (3, 30, None, True, False),
            (6, None, 6, True, True)]


@pytest.mark.parametrize("by_key", [False, True], ids=["fold_select", "fold_by_key"])
def test_an_inconsistent_log_is_an_error_not_a_wrong_view(pg_dsn: str, pg_schema: str,
                                                         by_key: bool) -> None:
    table = Table("t", (Column("k", "INT", False), Column("v", "INT")), ("k",))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (k int PRIMARY KEY, v int)").format(
            sql.Identifier(pg_schema, "t")))
        cl.install(conn, pg_schema, table, "v")
        _log(conn, pg_schema, table, [("I", 1, 1), ("I", 1, 2)])  # two rows of key 1
        with pytest.raises(psycopg.Error, match="inconsistent change log"):
            _fold(conn, pg_schema, table, by_key)
        conn.execute(sql.SQL("DELETE FROM {}").format(
            sql.Identifier(f"{pg_schema}__idivm", "log__t")))
        _log(conn, pg_schema, table, [("I", 2, 1), ("I", 2, 1)])  # one image twice
        with pytest.raises(psycopg.Error, match="inconsistent change log"):
            _fold(conn, pg_schema, table, by_key)


def test_the_fold_groups_types_without_equality(pg_dsn: str, pg_schema: str) -> None:
    table = Table("t", (Column("k", "INT", False), Column("j", "JSON"), Column("x", "XML"),
                        Column("p", "POINT")), ("k",))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (k int PRIMARY KEY, j json, x xml, p point)")
                     .format(sql.Identifier(pg_schema, "t")))
        cl.install(conn, pg_schema, table, "v")
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
        conn.execute("""INSERT INTO t VALUES (1, '{"a": 1}', '<a/>', '(1,2)'),
                        (2, '[1]', '<b/>', '(0,0)'), (3, '1', NULL, NULL)""")
        cl.advance(conn, pg_schema, "v")  # those rows are the view's starting point
        with conn.transaction():
            conn.execute("UPDATE t SET j = '{\"a\": 2}' WHERE k = 1")
            conn.execute("UPDATE t SET p = '(0,1)' WHERE k = 2")
            conn.execute("UPDATE t SET j = j WHERE k = 3")
        got = _fold(conn, pg_schema, table)
        assert [(r[0], str(r[1]), str(r[4]), r[7], r[8]) for r in got] == [
            (1, "{'a': 1}", "{'a': 2}", True, True), (2, "[1]", "[1]", True, True)]
        assert got[1][3] != got[1][6]  # the point moved


# --------------------------------------------------------------------------- inheritance


def test_a_table_with_inheritance_children_is_refused(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for s in ["CREATE TABLE parent (i int PRIMARY KEY, v int)",
                  "CREATE TABLE child_a (options text, PRIMARY KEY (i)) INHERITS (parent)",
                  "INSERT INTO parent VALUES (1, 10)"]:
            _run(conn, pg_schema, s)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            with pytest.raises(UnsupportedSQL, match="table with inheritance children") as e:
                m.create_view("v", "SELECT * FROM parent")
            assert e.value.construct == "table with inheritance children"
            # the child's writes fire no trigger of the parent either way round
            with pytest.raises(UnsupportedSQL, match="inheritance child"):
                m.create_view("w", "SELECT * FROM child_a")
            assert m.status() == []


def test_a_child_created_after_create_view_makes_maintain_refuse(pg_dsn: str,
                                                                 pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _run(conn, pg_schema, "CREATE TABLE parent (i int PRIMARY KEY, v int)")
        _run(conn, pg_schema, "CREATE TABLE other (i int PRIMARY KEY, v int)")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            m.create_view("v", "SELECT * FROM parent")
            m.create_view("w", "SELECT * FROM other")
            _run(conn, pg_schema, "CREATE TABLE c2 () INHERITS (parent)")
            _run(conn, pg_schema, "INSERT INTO c2 VALUES (2, 20)")
            with pytest.raises(IdivmError, match="was altered"):
                m.maintain("v")
            # ALTER TABLE … INHERIT, and the table itself becoming a child
            _run(conn, pg_schema, "CREATE TABLE x (i int NOT NULL, v int)")
            _run(conn, pg_schema, "ALTER TABLE x INHERIT other")
            with pytest.raises(IdivmError, match="was altered"):
                m.maintain("w")


def test_partitioned_tables_are_refused_by_name(pg_dsn: str, pg_schema: str) -> None:
    """Writes straight into a partition fire no statement trigger of the partitioned table
    (PostgreSQL's documented behaviour), so its log would miss them."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for s in ["CREATE TABLE p (a int PRIMARY KEY, b int) PARTITION BY RANGE (a)",
                  "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)"]:
            _run(conn, pg_schema, s)
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            with pytest.raises(UnsupportedSQL, match="partitioned table"):
                m.create_view("v", "SELECT * FROM p")
            with pytest.raises(UnsupportedSQL, match="partition"):
                m.create_view("w", "SELECT * FROM p1")


def test_refusals_leave_nothing_behind(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _run(conn, pg_schema, "CREATE TABLE parent (i int PRIMARY KEY, v int)")
        _run(conn, pg_schema, "CREATE TABLE child_a (options text) INHERITS (parent)")
        with PostgresMaintainer(pg_dsn, schema=pg_schema) as m:
            with pytest.raises((UnsupportedSQL, BackendError)):
                m.create_view("v", "SELECT * FROM parent")
        n = conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass",
                         (f"{pg_schema}.parent",)).fetchone()
        assert n is not None and n[0] == 0
