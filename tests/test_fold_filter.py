"""The fold of a table's log filtered by the keys of a σ that a join reads by its whole key —
directly or through the inner joins of the join's other input — read from its table where
the σ is not stored (``planner/selective.py`` ``filter_candidates``, ``planner/log_filter.py``
``read_by_key``, ``postgres/compile.py`` ``fold_visible``).

TPC-H Q5's shape: line items joined on their order key with customers ⋈ σ(orders of one
year); a line item of an order outside the year (before and after the batch) reaches no row
of the view, and its log rows are left out of the fold. Planner: the candidates, the choice
by statistics (a fraction, not the σ already cached), the fold's semijoins. PostgreSQL: plan
shape (a batch of line items of other orders folds to nothing), the choice recorded in the
registry, and differential — random batches moving orders in and out of φ, changing line
items' orders, inserting and deleting both — under ``id`` and ``auto``.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg
import pytest

from idivm import Catalog, plan
from idivm import algebra as A
from idivm.planner.log_filter import fold_filters, log_filters, reaching
from idivm.planner.selective import (
    FILTER_FRACTION,
    FILTER_PREFIX,
    Candidate,
    Recorded,
    chosen_filters,
    filter_candidates,
)
from idivm.postgres import PostgresMaintainer
from idivm.postgres.statistics import MIN_TABLE_ROWS

DDL = """
CREATE TABLE cust (ck int PRIMARY KEY, seg text NOT NULL);
CREATE TABLE ord (ok int PRIMARY KEY, ck int NOT NULL, odate int NOT NULL);
CREATE TABLE line (lk int PRIMARY KEY, ok int NOT NULL, price int NOT NULL);
"""
# Q5's shape: the σ of orders reaches the join with line items through the customer join
THROUGH = ("SELECT c.seg, sum(l.price) AS revenue, count(*) AS n FROM cust c "
           "JOIN ord o ON o.ck = c.ck JOIN line l ON l.ok = o.ok WHERE o.odate < 10 "
           "GROUP BY c.seg")
# the σ an input of the join itself, and of a semi-join
DIRECT = ("SELECT l.lk, l.price, o.odate FROM line l JOIN ord o ON o.ok = l.ok "
          "WHERE o.odate BETWEEN 5 AND 12")
SEMI = ("SELECT l.ok, sum(l.price) AS p FROM line l WHERE l.ok IN "
        "(SELECT ok FROM ord WHERE odate < 10) GROUP BY l.ok")
# the null-supplying side of an outer join, its preserved side the σ
OUTER = ("SELECT o.ok, o.odate, l.lk, l.price FROM ord o LEFT JOIN line l ON l.ok = o.ok "
         "WHERE o.odate < 10")


class Fraction:
    """Statistics that give every candidate the same fraction."""

    def __init__(self, f: float) -> None:
        self.f = f

    def selectivity(self, candidate: Candidate) -> float | None:
        return self.f


def _cat() -> Catalog:
    return Catalog.from_ddl(DDL)


def _filters(sql: str) -> list[Candidate]:
    p = plan(sql, _cat(), name="v")
    return list(filter_candidates(p.root, p.infos))


def test_candidates_reach_the_join_through_inner_joins() -> None:
    (c,) = _filters(THROUGH)
    assert c.table == "ord" and c.kind == "filter"
    assert c.signature == f'{FILTER_PREFIX}ord: "odate" < 10'
    assert [x.table for x in _filters(DIRECT)] == ["ord"]
    assert [x.table for x in _filters(SEMI)] == ["ord"]
    assert [x.table for x in _filters(OUTER)] == ["ord"]
    # the σ's key not equated by the join (line items read by a column other than the
    # order's key): none; nor a σ below a γ (its rows are groups, not the σ's)
    assert _filters("SELECT l.lk FROM line l JOIN ord o ON o.ck = l.ok "
                    "WHERE o.odate < 10") == []
    assert _filters("SELECT l.lk FROM line l JOIN (SELECT ck, max(odate) AS d FROM ord "
                    "WHERE odate < 10 GROUP BY ck) o ON o.ck = l.ok") == []


def test_reaching_stops_where_rows_are_not_just_filtered() -> None:
    p = plan(THROUGH, _cat(), name="v")
    joins = [n for n in A.walk(p.root) if isinstance(n, A.Join)]
    tables = {n.nid: sorted(s.child.table for s in reaching(n)  # type: ignore[attr-defined]
                            ) for n in joins}
    assert ["ord"] in tables.values(), tables  # cust ⋈ σ(ord): the σ reaches it
    gamma = next(n for n in A.walk(p.root) if isinstance(n, A.Aggregate))
    assert reaching(gamma) == []


def test_chosen_by_fraction_and_not_where_cached() -> None:
    for sql in (THROUGH, DIRECT):
        p = plan(sql, _cat(), name="v")
        assert p.selective == frozenset()  # no statistics: as before
        near = plan(sql, _cat(), name="v", statistics=Fraction(FILTER_FRACTION))
        assert any(s.startswith(FILTER_PREFIX) for s in near.selective), near.selective
        far = plan(sql, _cat(), name="v", statistics=Fraction(FILTER_FRACTION + 0.01))
        assert far.selective == frozenset()
    # a σ cached (a tenth of its table or less) is not a filter too: it filters as stored
    cached = plan(DIRECT, _cat(), name="v", statistics=Fraction(0.0))
    assert cached.selective == {'ord: "odate" BETWEEN 5 AND 12'}, cached.selective
    assert chosen_filters(cached.root, cached.infos, Fraction(0.0)) != {}
    assert chosen_filters(cached.root, cached.infos, Fraction(0.0),
                          [m.nid for m in cached.materialized]) == {}
    # recorded: the same choice from the registry's signatures
    p = plan(THROUGH, _cat(), name="v", statistics=Fraction(0.3))
    again = plan(THROUGH, _cat(), name="v", statistics=Recorded(p.selective))
    assert again.selective == p.selective


def test_fold_filters_key_the_line_items() -> None:
    p = plan(THROUGH, _cat(), name="v", statistics=Fraction(0.3))
    (c,) = filter_candidates(p.root, p.infos)
    keyed = {c.nid: tuple(p.infos[c.nid].ids)}
    cached = [m.nid for m in p.materialized]
    found = {t: f.sql("postgres") for t, f in fold_filters(p.root, cached, keyed).items()}
    assert found["line"].startswith("KEYS_OF(") and '"ok"' in found["line"], found
    assert "KEYS_OF" not in str(log_filters(p.root, cached))  # (never the triggers')


# -- PostgreSQL ------------------------------------------------------------------------------

N_ORD = 2 * MIN_TABLE_ROWS  # large enough for its statistics to count
N_CUST = 500


def _fill(conn: psycopg.Connection[Any]) -> None:
    conn.execute(DDL)
    conn.execute(f"INSERT INTO cust SELECT i, 'S' || (i % 5) FROM generate_series(1, {N_CUST}) i")
    # odate 0..39: φ (odate < 10) keeps a quarter
    conn.execute(f"INSERT INTO ord SELECT i, 1 + i % {N_CUST}, (i * 7) % 40 "
                 f"FROM generate_series(1, {N_ORD}) i")
    conn.execute(f"INSERT INTO line SELECT i, 1 + (i * 7919) % {N_ORD}, i % 97 "
                 f"FROM generate_series(1, 8000) i")
    conn.execute("ANALYZE cust; ANALYZE ord; ANALYZE line")


def _batch(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    with conn.transaction():
        for _ in range(rng.randrange(10, 60)):
            op = rng.random()
            ok = rng.randrange(1, N_ORD + 1)
            lk = rng.randrange(1, 12000)
            if op < 0.25:
                conn.execute("INSERT INTO line VALUES (%s, %s, %s) ON CONFLICT (lk) DO "
                             "UPDATE SET price = EXCLUDED.price", (lk, ok, rng.randrange(97)))
            elif op < 0.4:  # a line item's price, or its order
                conn.execute("UPDATE line SET price = %s, ok = CASE WHEN %s THEN %s ELSE ok "
                             "END WHERE lk = %s", (rng.randrange(97), rng.random() < 0.4, ok,
                                                   lk))
            elif op < 0.5:
                conn.execute("DELETE FROM line WHERE lk = %s", (lk,))
            elif op < 0.75:  # an order moves in or out of φ (or its customer changes)
                conn.execute("UPDATE ord SET odate = %s, ck = CASE WHEN %s THEN %s ELSE ck "
                             "END WHERE ok = %s", (rng.randrange(20), rng.random() < 0.2,
                                                   rng.randrange(1, N_CUST + 1), ok))
            elif op < 0.82:  # a new order in φ or not, with line items in the same batch
                new = N_ORD + rng.randrange(1, 400)
                conn.execute("INSERT INTO ord VALUES (%s, %s, %s) ON CONFLICT (ok) DO NOTHING",
                             (new, rng.randrange(1, N_CUST + 1), rng.randrange(20)))
                conn.execute("INSERT INTO line VALUES (%s, %s, 5) ON CONFLICT (lk) DO "
                             "UPDATE SET ok = EXCLUDED.ok", (lk, new))
            elif op < 0.9:  # an order and its line items deleted
                conn.execute("DELETE FROM line WHERE ok = %s", (ok,))
                conn.execute("DELETE FROM ord WHERE ok = %s", (ok,))
            else:
                conn.execute("UPDATE cust SET seg = %s WHERE ck = %s",
                             (f"S{rng.randrange(5)}", rng.randrange(1, N_CUST + 1)))


@pytest.fixture
def db(pg_dsn: str, pg_schema: str) -> Any:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(f"SET search_path = {pg_schema}")
    _fill(conn)
    m = PostgresMaintainer(pg_dsn, pg_schema)
    yield m, conn, pg_schema
    m.close()
    conn.close()


def _rows(conn: psycopg.Connection[Any], sql: str) -> Counter[tuple[Any, ...]]:
    return Counter(map(tuple, conn.execute(sql).fetchall()))


@pytest.mark.parametrize("sql", [THROUGH, DIRECT, SEMI, OUTER],
                         ids=["through", "direct", "semi", "outer"])
def test_pg_differential(db: Any, sql: str) -> None:
    m, conn, schema = db
    made = {st: m.create_view(f"v_{st}", sql, strategy=st) for st in ("id", "auto")}
    for p in made.values():
        assert any(s.startswith(FILTER_PREFIX) for s in p.selective), p.selective
    # recorded: a new maintainer re-plans the same choice from the registry
    other = PostgresMaintainer(m.dsn, schema)
    try:
        assert other.plan_of("v_id").selective == made["id"].selective
    finally:
        other.close()
    rng = random.Random(5)
    for r in range(8):
        _batch(conn, rng)
        for st in made:
            m.maintain(f"v_{st}", strategy="recompute" if st == "auto" and r == 3 else None)
        want = _rows(conn, sql)
        for st in made:
            assert _rows(conn, f"SELECT * FROM v_{st}") == want, (st, r)


def test_pg_fold_keeps_line_items_of_orders_the_view_can_see(db: Any) -> None:
    """Plan shape: a batch of line items of orders outside φ, before and after, folds to
    nothing; an order moved into φ in the same batch as a new line item of it counts that
    line item, one moved out counts its updated ones; the view equals its query."""
    m, conn, _ = db
    outside = [r[0] for r in conn.execute(
        "SELECT ok FROM ord WHERE odate >= 10 ORDER BY ok LIMIT 40").fetchall()]
    inside = [r[0] for r in conn.execute(
        "SELECT ok FROM ord WHERE odate < 10 ORDER BY ok LIMIT 3").fetchall()]
    conn.execute("INSERT INTO line SELECT 40000 + i, %s, i FROM generate_series(1, 5) i",
                 (inside[1],))
    m.create_view("v", THROUGH, strategy="id")
    with conn.transaction():
        for k, ok in enumerate(outside[:30]):
            conn.execute("INSERT INTO line VALUES (%s, %s, 5)", (20000 + k, ok))
        conn.execute("UPDATE line SET price = price + 1 WHERE ok = ANY(%s)", (outside[:30],))
    stats = m.maintain("v")
    assert stats.changes.get("line", 0) == 0, stats.changes
    moved = conn.execute("SELECT count(*) FROM line WHERE ok = %s AND price <> 9",
                         (inside[1],)).fetchone()
    assert moved is not None and moved[0] > 0
    with conn.transaction():
        conn.execute("INSERT INTO line VALUES (30000, %s, 5), (30001, %s, 6), (30002, %s, 7)",
                     (outside[30], inside[0], outside[31]))
        conn.execute("UPDATE ord SET odate = 3 WHERE ok = %s", (outside[31],))
        conn.execute("UPDATE ord SET odate = 30 WHERE ok = %s", (inside[1],))
        conn.execute("UPDATE line SET price = 9 WHERE ok = %s", (inside[1],))
    stats = m.maintain("v")
    assert stats.changes.get("line", 0) == 2 + int(moved[0]), stats.changes
    assert _rows(conn, "SELECT * FROM v") == _rows(conn, THROUGH)
