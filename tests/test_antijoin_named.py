"""NOT EXISTS's rule for new rows of its right input (Table 13 ▷, ``rules/antijoin.py``
``named_by_right``): where φ equates IDs of l with columns of r and asks nothing else of l,
the new r rows name the l rows to delete by those IDs, read off the r rows alone — Input_l
is not matched (TPC-H Q22: new orders' customers deleted from the view by key). Planner:
which φ take the shortcut. PostgreSQL: differential over random batches — NULL and unknown
keys, conditions on r alone, a condition on l that keeps the general rule — under ``id``."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg
import pytest

from idivm import Catalog, plan

DDL = """
CREATE TABLE c (ck int PRIMARY KEY, grp int NOT NULL, bal int NOT NULL);
CREATE TABLE o (ok int PRIMARY KEY, ck int, amt int NOT NULL, open boolean NOT NULL);
"""
RULE = "π_I'(Δ+_r)"
# Q22's shape: customers without orders, grouped
GROUPED = ("SELECT grp, count(*) AS n, sum(bal) AS total FROM c WHERE NOT EXISTS "
           "(SELECT 1 FROM o WHERE o.ck = c.ck) GROUP BY grp")
# a condition on r alone
OPEN = "SELECT c.ck, c.bal FROM c WHERE NOT EXISTS (SELECT 1 FROM o WHERE o.ck = c.ck AND o.open)"
# a condition on l's columns too: the general rule
OVER = ("SELECT c.ck, c.bal FROM c WHERE NOT EXISTS "
        "(SELECT 1 FROM o WHERE o.ck = c.ck AND o.amt > c.bal)")
# NOT IN over columns never NULL (the only NOT IN accepted): an equality like NOT EXISTS's
NOT_IN = "SELECT c.ck, c.bal FROM c WHERE c.ck NOT IN (SELECT amt FROM o)"


def _rules(sql: str) -> list[str]:
    p = plan(sql, Catalog.from_ddl(DDL), name="v")
    return [d.rule for d in p.dag.diffs.values()]


def test_the_shortcut_where_phi_asks_only_ids_of_l() -> None:
    assert any(RULE in r for r in _rules(GROUPED))
    assert any(RULE in r for r in _rules(OPEN))
    assert not any(RULE in r for r in _rules(OVER))
    assert any(RULE in r for r in _rules(NOT_IN))
    # the key a NOT EXISTS equates with a non-ID column of l: the general rule
    assert not any(RULE in r for r in _rules(
        "SELECT c.ck FROM c WHERE NOT EXISTS (SELECT 1 FROM o WHERE o.amt = c.bal)"))


@pytest.fixture
def db(pg_db: Any) -> Any:
    m, conn, _ = pg_db
    conn.execute(DDL)
    conn.execute("INSERT INTO c SELECT i, i % 4, (i * 37) % 100 FROM generate_series(1, 300) i")
    conn.execute("INSERT INTO o SELECT i, CASE WHEN i % 9 = 0 THEN NULL ELSE 1 + (i * 13) % 200 "
                 "END, i % 100, i % 3 = 0 FROM generate_series(1, 400) i")
    return m, conn


def _batch(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    with conn.transaction():
        for _ in range(rng.randrange(5, 30)):
            op = rng.random()
            ck = rng.choice([None, rng.randrange(1, 330)])  # NULL, an unknown customer too
            ok = rng.randrange(1, 600)
            if op < 0.4:
                conn.execute("INSERT INTO o VALUES (%s, %s, %s, %s) ON CONFLICT (ok) DO UPDATE "
                             "SET ck = EXCLUDED.ck", (ok, ck, rng.randrange(100),
                                                      rng.random() < 0.5))
            elif op < 0.55:
                conn.execute("UPDATE o SET open = NOT open, amt = %s WHERE ok = %s",
                             (rng.randrange(100), ok))
            elif op < 0.75:
                conn.execute("DELETE FROM o WHERE ok = %s", (ok,))
            elif op < 0.9:
                conn.execute("UPDATE c SET bal = %s, grp = %s WHERE ck = %s",
                             (rng.randrange(100), rng.randrange(4), rng.randrange(1, 330)))
            else:  # a customer with the new orders of the same batch
                new = rng.randrange(301, 330)
                conn.execute("INSERT INTO c VALUES (%s, 1, 5) ON CONFLICT (ck) DO NOTHING",
                             (new,))
                conn.execute("INSERT INTO o VALUES (%s, %s, 1, true) ON CONFLICT (ok) DO "
                             "UPDATE SET ck = EXCLUDED.ck", (ok, new))


@pytest.mark.parametrize("sql", [GROUPED, OPEN, OVER, NOT_IN],
                         ids=["grouped", "open", "over", "not_in"])
def test_pg_differential(db: Any, sql: str) -> None:
    m, conn = db
    m.create_view("v", sql, strategy="id")
    rng = random.Random(27)
    for r in range(10):
        _batch(conn, rng)
        m.maintain("v")
        want = Counter(map(tuple, conn.execute(sql).fetchall()))
        assert Counter(map(tuple, conn.execute("SELECT * FROM v").fetchall())) == want, r
