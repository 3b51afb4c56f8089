"""Table 9 on PostgreSQL: SUM, COUNT and AVG of an attribute an update i-diff changes take
Σ(post − pre) straight from the i-diff joined to γ's input cache, while the rows other i-diffs
of the same batch touch (a link deleted or inserted for the updated part, a device leaving the
filter) are counted through the cache's snapshots. Each batch below is several statements
maintained at once, and the view must equal its query after each."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

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


@pytest.mark.parametrize("strategy", ["id", "tuple"])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_update_batches_with_other_changes(pg_dsn: str, pg_schema: str, view: str,
                                           strategy: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn, \
            PostgresMaintainer(pg_dsn, pg_schema) as m:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        conn.execute(DDL)
        m.create_view("v", VIEWS[view], strategy=strategy)  # type: ignore[arg-type]
        if strategy == "id":  # the price update is read straight
            assert any(m.plan_of("v").composition.direct.values()), view
        for i, batch in enumerate(BATCHES):
            for statement in batch:
                conn.execute(statement)
            m.maintain("v")
            got = normalize_rows(conn.execute("SELECT * FROM v").fetchall())
            want = normalize_rows(conn.execute(VIEWS[view]).fetchall())
            assert got == want, f"{view} ({strategy}) after batch {i}: {batch}"
