"""Table 9 on PostgreSQL: SUM, COUNT and AVG of an attribute an update i-diff changes take
Σ(post − pre) straight from the i-diff joined to γ's input cache, while the rows other i-diffs
of the same batch touch (a link deleted or inserted for the updated part, a device leaving the
filter) are counted through the cache's snapshots. Each batch below is several statements
maintained at once, and the view must equal its query after each."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg
import pytest
from psycopg import sql

from idivm.plan import Plan
from idivm.postgres import PostgresMaintainer

try:
    from tests.differential.harness import normalize_rows
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from differential.harness import normalize_rows  # type: ignore[no-redef]

DDL = """
CREATE TABLE devices (did text PRIMARY KEY, category text NOT NULL, weight int);
CREATE TABLE parts (pid text PRIMARY KEY, price int);
CREATE TABLE devices_parts (did text REFERENCES devices, pid text REFERENCES parts,
                            PRIMARY KEY (did, pid));
INSERT INTO devices VALUES ('D1', 'phone', 10), ('D2', 'phone', 20), ('D3', 'tablet', NULL);
INSERT INTO parts VALUES ('P1', 5), ('P2', 7), ('P3', NULL), ('P4', 11);
INSERT INTO devices_parts VALUES ('D1', 'P1'), ('D1', 'P2'), ('D2', 'P1'), ('D2', 'P3'),
                                 ('D3', 'P1'), ('D3', 'P4');
"""

VIEWS = {
    "grouped": "SELECT d.did, SUM(p.price) AS s, COUNT(p.price) AS n, AVG(p.price) AS a, "
               "COUNT(*) AS c FROM devices d JOIN devices_parts dp ON d.did = dp.did "
               "JOIN parts p ON p.pid = dp.pid WHERE d.category = 'phone' GROUP BY d.did",
    "global": "SELECT SUM(p.price) AS s, AVG(p.price) AS a, COUNT(p.price) AS n "
              "FROM devices_parts dp JOIN parts p ON p.pid = dp.pid",
    # two update i-diffs (a part's price, a device's weight) into one cache row
    "two_sums": "SELECT dp.pid, SUM(p.price) AS s, SUM(d.weight) AS w FROM devices d "
                "JOIN devices_parts dp ON d.did = dp.did JOIN parts p ON p.pid = dp.pid "
                "GROUP BY dp.pid",
}

BATCHES = (
    ("UPDATE parts SET price = price + 1 WHERE pid = 'P1'",),
    # the updated part loses one link and gains another in the same batch
    ("UPDATE parts SET price = 50 WHERE pid = 'P1'",
     "DELETE FROM devices_parts WHERE did = 'D2' AND pid = 'P1'",
     "INSERT INTO devices_parts VALUES ('D2', 'P2')",
     "UPDATE parts SET price = 8 WHERE pid = 'P2'"),
    # to and from NULL
    ("UPDATE parts SET price = NULL WHERE pid = 'P2'",
     "UPDATE parts SET price = 3 WHERE pid = 'P3'"),
    # values whose difference overflows a 4-byte integer
    ("UPDATE parts SET price = 2000000000 WHERE pid = 'P4'",),
    ("UPDATE parts SET price = -2000000000 WHERE pid = 'P4'",
     "UPDATE devices SET weight = 2000000000 WHERE did = 'D3'"),
    # a device enters the filter while its parts' prices change; weights change too
    ("UPDATE devices SET category = 'phone' WHERE did = 'D3'",
     "UPDATE parts SET price = price * 2 WHERE pid = 'P1'",
     "UPDATE parts SET price = 2000000000 WHERE pid = 'P4'",
     "UPDATE devices SET weight = -2000000000 WHERE did = 'D3'",
     "UPDATE devices SET weight = 3 WHERE did = 'D1'"),
    # a part's every link deleted, its price updated, then a new part and its link
    ("DELETE FROM devices_parts WHERE pid = 'P1'",
     "UPDATE parts SET price = 1 WHERE pid = 'P1'",
     "INSERT INTO parts VALUES ('P5', 9)",
     "INSERT INTO devices_parts VALUES ('D1', 'P5')"),
    # a price changed and changed back: no net change
    ("UPDATE parts SET price = 100 WHERE pid = 'P2'",
     "UPDATE parts SET price = NULL WHERE pid = 'P2'"),
    ("DELETE FROM devices_parts",),
)


def maintained_through(pg_dsn: str, pg_schema: str, ddl: str, query: str, strategy: str,
                       batches: Sequence[Sequence[str]],
                       read_straight: Callable[[Plan], bool]) -> None:
    """``query`` as view v over ``ddl``, maintained after each batch (its statements run
    first) and equal to the query each time; under id, ``read_straight`` holds of its plan."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn, \
            PostgresMaintainer(pg_dsn, pg_schema) as m:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        conn.execute(ddl)
        m.create_view("v", query, strategy=strategy)  # type: ignore[arg-type]
        if strategy == "id":
            assert read_straight(m.plan_of("v")), query
        for i, batch in enumerate(batches):
            for statement in batch:
                conn.execute(statement)
            m.maintain("v")
            got = normalize_rows(conn.execute("SELECT * FROM v").fetchall())
            want = normalize_rows(conn.execute(query).fetchall())
            assert got == want, f"{query} ({strategy}) after batch {i}: {batch}"


@pytest.mark.parametrize("strategy", ["id", "tuple"])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_update_batches_with_other_changes(pg_dsn: str, pg_schema: str, view: str,
                                           strategy: str) -> None:
    # the price update is read straight over the cache
    maintained_through(pg_dsn, pg_schema, DDL, VIEWS[view], strategy, BATCHES,
                       lambda p: any(p.composition.direct.values()))


# γ over a many-to-many join, left uncached (BSMA Q*1's shape: per person, sums over the
# friends of their friends in their city): a score update is read straight from its i-diff
# joined to Input_post, while the batch also adds and removes paths through the updated
# person, moves people between cities, and deletes and inserts people
FOF_DDL = """
CREATE TABLE people (pid int PRIMARY KEY, city int NOT NULL, score int);
CREATE TABLE follows (a int REFERENCES people, b int REFERENCES people, PRIMARY KEY (a, b));
INSERT INTO people VALUES (1, 1, 10), (2, 1, 20), (3, 2, 30), (4, 1, NULL), (5, 2, 50),
                          (6, 1, 60);
INSERT INTO follows VALUES (1, 2), (2, 3), (2, 4), (1, 5), (5, 6), (3, 4), (4, 1), (6, 2),
                           (5, 2), (2, 6), (3, 1);
"""

FOF_VIEWS = {
    "fof": "SELECT f1.a, COUNT(*) AS n, SUM(p.score) AS s, AVG(p.score) AS m, "
           "COUNT(p.score) AS c FROM follows f1 JOIN follows f2 ON f2.a = f1.b "
           "JOIN people q ON q.pid = f1.a JOIN people p ON p.pid = f2.b "
           "WHERE q.city = p.city GROUP BY f1.a",
    "fof_global": "SELECT SUM(p.score) AS s, COUNT(*) AS n FROM follows f1 "
                  "JOIN follows f2 ON f2.a = f1.b JOIN people p ON p.pid = f2.b",
}

FOF_BATCHES = (
    ("UPDATE people SET score = score + 1 WHERE pid IN (4, 6)",),
    ("UPDATE people SET score = 7 WHERE pid = 4",),
    # a path through the updated person added, another removed, in the same batch
    ("UPDATE people SET score = 100 WHERE pid = 2",
     "INSERT INTO follows VALUES (6, 1)",
     "DELETE FROM follows WHERE a = 1 AND b = 2",
     "UPDATE people SET score = 3 WHERE pid = 6"),
    # the updated person moves to another city; a group's person too
    ("UPDATE people SET score = score * 2, city = 2 WHERE pid = 6",
     "UPDATE people SET city = 2 WHERE pid = 1"),
    # to and from NULL; values whose difference overflows a 4-byte integer
    ("UPDATE people SET score = NULL WHERE pid = 2",
     "UPDATE people SET score = 2000000000 WHERE pid = 4"),
    ("UPDATE people SET score = -2000000000 WHERE pid = 4",),
    # a person deleted with their links while another's score changes; a new person linked
    ("DELETE FROM follows WHERE a = 5 OR b = 5",
     "DELETE FROM people WHERE pid = 5",
     "UPDATE people SET score = 1 WHERE pid = 3",
     "INSERT INTO people VALUES (7, 1, 70)",
     "INSERT INTO follows VALUES (2, 7), (7, 6)"),
    # changed and changed back: no net change
    ("UPDATE people SET score = 999 WHERE pid = 6",
     "UPDATE people SET score = 3 WHERE pid = 6"),
    ("UPDATE people SET score = score + 5",),
    ("DELETE FROM follows",),
)


@pytest.mark.parametrize("strategy", ["id", "tuple"])
@pytest.mark.parametrize("view", sorted(FOF_VIEWS))
def test_update_read_straight_over_an_uncached_join(pg_dsn: str, pg_schema: str, view: str,
                                                    strategy: str) -> None:
    # γ's input is not cached, and the score update is read straight
    maintained_through(pg_dsn, pg_schema, FOF_DDL, FOF_VIEWS[view], strategy, FOF_BATCHES,
                       lambda p: not p.composition.direct and any(p.dag.direct.values()))
