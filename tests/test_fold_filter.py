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
CREATE TABLE line (ok int NOT NULL, ln int NOT NULL, price int NOT NULL, PRIMARY KEY (ok, ln));
"""
# Q5's shape: the σ of orders reaches the join with line items through the customer join
THROUGH = ("SELECT c.seg, sum(l.price) AS revenue, count(*) AS n FROM cust c "
           "JOIN ord o ON o.ck = c.ck JOIN line l ON l.ok = o.ok WHERE o.odate < 10 "
           "GROUP BY c.seg")
# the σ an input of the join itself, and of a semi-join
DIRECT = ("SELECT l.ok, l.ln, l.price, o.odate FROM line l JOIN ord o ON o.ok = l.ok "
          "WHERE o.odate BETWEEN 5 AND 12")
SEMI = ("SELECT l.ok, sum(l.price) AS p FROM line l WHERE l.ok IN "
        "(SELECT ok FROM ord WHERE odate < 10) GROUP BY l.ok")
# the null-supplying side of an outer join, its preserved side the σ
OUTER = ("SELECT o.ok, o.odate, l.ln, l.price FROM ord o LEFT JOIN line l ON l.ok = o.ok "
         "WHERE o.odate < 10")
# orders of a segment's customers: the σ of customers is chosen, but the orders' log is not
# filtered by it (an order's customer is no part of its key: a probe per log row)
SEGMENT = ("SELECT o.ok, o.odate, c.seg FROM ord o JOIN cust c ON c.ck = o.ck "
           "WHERE c.seg = 'S1'")


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
    assert _filters("SELECT l.ln FROM line l JOIN ord o ON o.ck = l.ok "
                    "WHERE o.odate < 10") == []
    assert _filters("SELECT l.ln FROM line l JOIN (SELECT ck, max(odate) AS d FROM ord "
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
    found = {t: f.sql("postgres") for t, f in
             fold_filters(p.root, cached, keyed, [c.nid]).items()}
    assert found["line"].startswith("KEYS_OF(") and '"ok"' in found["line"], found
    assert "KEYS_OF" not in str(log_filters(p.root, cached))  # (never the triggers')
    # a σ not reaching through joins (a stored one) filters only as the join's input
    assert "KEYS_OF" not in str(fold_filters(p.root, cached, keyed))


# -- PostgreSQL ------------------------------------------------------------------------------

N_ORD = 2 * MIN_TABLE_ROWS  # large enough for its statistics to count
N_CUST = MIN_TABLE_ROWS + 2000


def _fill(conn: psycopg.Connection[Any]) -> None:
    conn.execute(DDL)
    conn.execute(f"INSERT INTO cust SELECT i, 'S' || (i % 5) FROM generate_series(1, {N_CUST}) i")
    # odate 0..39: φ (odate < 10) keeps a quarter
    conn.execute(f"INSERT INTO ord SELECT i, 1 + i % {N_CUST}, (i * 7) % 40 "
                 f"FROM generate_series(1, {N_ORD}) i")
    conn.execute(f"INSERT INTO line SELECT DISTINCT ON (1, 2) 1 + (i * 7919) % {N_ORD}, i % 4, "
                 f"i % 97 FROM generate_series(1, 8000) i")
    conn.execute("ANALYZE cust; ANALYZE ord; ANALYZE line")


def _batch(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    with conn.transaction():
        for _ in range(rng.randrange(10, 60)):
            op = rng.random()
            ok = rng.randrange(1, N_ORD + 1)
            ln = rng.randrange(4)
            if op < 0.25:
                conn.execute("INSERT INTO line VALUES (%s, %s, %s) ON CONFLICT (ok, ln) DO "
                             "UPDATE SET price = EXCLUDED.price", (ok, ln, rng.randrange(97)))
            elif op < 0.4:  # a line item's price, or its order (its key)
                conn.execute("UPDATE line SET price = %s, ok = CASE WHEN %s THEN %s ELSE ok "
                             "END WHERE ok = %s AND ln = %s AND NOT EXISTS (SELECT FROM line m "
                             "WHERE m.ok = %s AND m.ln = %s)",
                             (rng.randrange(97), rng.random() < 0.4, ok + 1, ok, ln, ok + 1,
                              ln))
            elif op < 0.5:
                conn.execute("DELETE FROM line WHERE ok = %s AND ln = %s", (ok, ln))
            elif op < 0.75:  # an order moves in or out of φ (or its customer changes)
                conn.execute("UPDATE ord SET odate = %s, ck = CASE WHEN %s THEN %s ELSE ck "
                             "END WHERE ok = %s", (rng.randrange(20), rng.random() < 0.2,
                                                   rng.randrange(1, N_CUST + 1), ok))
            elif op < 0.82:  # a new order in φ or not, with line items in the same batch
                new = N_ORD + rng.randrange(1, 400)
                conn.execute("INSERT INTO ord VALUES (%s, %s, %s) ON CONFLICT (ok) DO NOTHING",
                             (new, rng.randrange(1, N_CUST + 1), rng.randrange(20)))
                conn.execute("INSERT INTO line VALUES (%s, %s, 5) ON CONFLICT (ok, ln) DO "
                             "NOTHING", (new, ln))
            elif op < 0.9:  # an order and its line items deleted
                conn.execute("DELETE FROM line WHERE ok = %s", (ok,))
                conn.execute("DELETE FROM ord WHERE ok = %s", (ok,))
            else:  # a customer moves in or out of a segment
                conn.execute("UPDATE cust SET seg = %s WHERE ck = %s",
                             (f"S{rng.randrange(5)}", rng.randrange(1, N_CUST + 1)))


@pytest.fixture
def db(pg_db: Any) -> Any:
    _fill(pg_db[1])
    return pg_db


def _rows(conn: psycopg.Connection[Any], sql: str) -> Counter[tuple[Any, ...]]:
    return Counter(map(tuple, conn.execute(sql).fetchall()))


@pytest.mark.parametrize("sql", [THROUGH, DIRECT, SEMI, OUTER, SEGMENT],
                         ids=["through", "direct", "semi", "outer", "segment"])
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
    """Plan shape: the line items of orders outside φ, before and after the batch, fold to
    nothing; those of an order deleted from φ, of one created in φ and of one moved into φ
    in the same batch are folded; the view equals its query. The orders of customers outside
    a segment are folded all the same (no semijoin by a column outside the log's key)."""
    m, conn, _ = db
    m.create_view("v", THROUGH, strategy="id")
    m.create_view("s", SEGMENT, strategy="id")
    far, near = (tuple(int(r[0]) for r in conn.execute(
        f"SELECT ok FROM ord WHERE {cond} ORDER BY ok LIMIT 3").fetchall())
        for cond in ("odate >= 10", "odate < 10 AND ok IN (SELECT ok FROM line)"))
    with conn.transaction():  # new, changed and deleted line items of orders out of φ
        conn.execute("INSERT INTO line SELECT %s, 10 + i, i FROM generate_series(1, 4) i",
                     (far[0],))
        conn.execute("UPDATE line SET price = price + 1 WHERE ok = ANY(%s)", (list(far),))
        conn.execute("DELETE FROM line WHERE ok = %s", (far[1],))
    assert m.maintain("v").changes.get("line", 0) == 0
    gone = conn.execute("SELECT count(*) FROM line WHERE ok = %s", (near[0],)).fetchone()
    assert gone is not None and gone[0] > 0
    with conn.transaction():
        conn.execute("DELETE FROM line WHERE ok = %s", (near[0],))
        conn.execute("INSERT INTO ord VALUES (%s, 1, 2)", (N_ORD + 900,))
        conn.execute("INSERT INTO line VALUES (%s, 1, 3), (%s, 11, 4), (%s, 12, 5)",
                     (N_ORD + 900, far[2], far[2]))
        conn.execute("UPDATE ord SET odate = 1 WHERE ok = %s", (far[2],))
        out = conn.execute("WITH u AS (UPDATE ord SET odate = odate + 1 WHERE ck IN (SELECT "
                           "ck FROM cust WHERE seg <> 'S1' ORDER BY ck LIMIT 20) AND ok <> %s "
                           "RETURNING 1) SELECT count(*) FROM u", (far[2],)).fetchone()
    assert m.maintain("v").changes.get("line", 0) == int(gone[0]) + 3
    assert _rows(conn, "SELECT * FROM v") == _rows(conn, THROUGH)
    moved = m.maintain("s")
    assert out is not None and out[0] > 0
    assert moved.changes.get("ord", 0) >= out[0], (moved.changes, out)
    assert _rows(conn, "SELECT * FROM s") == _rows(conn, SEGMENT)


# -- a σ whose keys a semijoin carries: TPC-H Q20's magic set --------------------------------

Q20_DDL = """
CREATE TABLE part (pk int PRIMARY KEY, name text NOT NULL);
CREATE TABLE ps (pk int NOT NULL, sk int NOT NULL, avail int NOT NULL, PRIMARY KEY (pk, sk));
CREATE TABLE li (ok int NOT NULL, ln int NOT NULL, pk int NOT NULL, sk int NOT NULL,
                 qty int NOT NULL, sdate int NOT NULL, PRIMARY KEY (ok, ln));
"""
# the line items of the suppliers' parts a σ of parts keeps, summed per (part, supplier): the
# decorrelated subquery groups only the (part, supplier) pairs of partsupp ⋉ σ(part) — a
# magic set through which the line items reach the view
Q20_SHAPE = ("SELECT ps.pk, ps.sk FROM ps WHERE ps.pk IN (SELECT pk FROM part WHERE name "
             "LIKE 'f%') AND ps.avail > (SELECT 0.5 * sum(li.qty) FROM li WHERE li.pk = ps.pk "
             "AND li.sk = ps.sk AND li.sdate < 10)")
N_PART = 2 * MIN_TABLE_ROWS


def test_a_semijoin_carries_a_stored_sigmas_keys_to_the_line_items() -> None:
    """The line items reach the view through ``⋉ (partsupp ⋉ σ(part))`` on ``li.pk =
    ps.pk = part.pk`` (``log_filter.carried``): with σ(part) stored, the line-item fold keeps
    the images of the σ's parts only (``KeysOf`` of the stored σ over ``li.pk``); the
    triggers' filter is unchanged (the date only)."""
    from sqlglot import exp

    from idivm.postgres.compile import fold_visible

    p = plan(Q20_SHAPE, Catalog.from_ddl(Q20_DDL), name="v", statistics=Fraction(0.05))
    stored = {m.name for m in p.materialized}
    found = fold_visible(p, "s", "s__idivm", exp.column("prev"))
    li = found["li"].hashed.sql("postgres")
    assert '"pk" IN (SELECT' in li and any(f'"{n}"' in li for n in stored), (li, stored)
    assert '"sdate" < 10' in li
    assert "KEYS_OF" not in str(log_filters(p.root, [m.nid for m in p.materialized]))


def _fill_q20(conn: psycopg.Connection[Any]) -> None:
    conn.execute(Q20_DDL)
    # one part in 20 named f…: the σ keeps 5% (stored, past the statistics' floor)
    conn.execute(f"INSERT INTO part SELECT i, CASE WHEN i % 20 = 0 THEN 'f' ELSE 'g' END || i "
                 f"FROM generate_series(1, {N_PART}) i")
    conn.execute(f"INSERT INTO ps SELECT i, i % 3, i % 50 FROM generate_series(1, {N_PART}) i")
    conn.execute(f"INSERT INTO li SELECT i / 4, i % 4, 1 + (i * 7) % {N_PART}, ((i * 7) % "
                 f"{N_PART} + 1) % 3, 1 + i % 9, (i / 20) % 20 FROM generate_series(4, 12000) i")
    conn.execute("ANALYZE part; ANALYZE ps; ANALYZE li")


def test_pg_q20_shape_differential(pg_db: Any) -> None:
    """Random batches — line items inserted, deleted, moved to another part or date; parts
    renamed into and out of the σ; partsupp rows added, removed, their availability changed
    — maintained under ``id`` and ``auto`` with the line items' fold filtered by the σ's
    keys: each view equals its query after every batch, and a batch of line items of parts
    outside the σ (before and after) folds to no change."""
    m, conn, _ = pg_db
    _fill_q20(conn)
    assert sum(_rows(conn, Q20_SHAPE).values()) > 50  # (the σ's parts with line items)
    made = {st: m.create_view(f"v_{st}", Q20_SHAPE, strategy=st) for st in ("id", "auto")}
    assert any(s for s in made["id"].selective), made["id"].selective
    rng = random.Random(20)
    outside = [int(r[0]) for r in conn.execute(
        "SELECT pk FROM part WHERE name NOT LIKE 'f%' ORDER BY pk LIMIT 50").fetchall()]
    with conn.transaction():
        conn.execute("UPDATE li SET qty = qty + 1 WHERE pk = ANY(%s)", (outside,))
    assert m.maintain("v_id").changes.get("li", 0) == 0
    # parts into and out of the σ in the batch that changes their line items: the fold keeps
    # the images by the σ's keys before the batch and the keys of the parts' changed rows
    moving = [tuple(int(x) for x in r) for r in conn.execute(
        "SELECT p.pk, (p.name LIKE 'f%')::int FROM part p WHERE EXISTS (SELECT FROM ps WHERE "
        "ps.pk = p.pk) AND EXISTS (SELECT FROM li WHERE li.pk = p.pk AND li.sdate < 10) "
        "ORDER BY (p.name LIKE 'f%'), p.pk LIMIT 3").fetchall()]
    moving += [tuple(int(x) for x in r) for r in conn.execute(
        "SELECT p.pk, 1 FROM part p WHERE p.name LIKE 'f%' AND EXISTS (SELECT FROM ps WHERE "
        "ps.pk = p.pk) AND EXISTS (SELECT FROM li WHERE li.pk = p.pk AND li.sdate < 10) "
        "ORDER BY p.pk LIMIT 3").fetchall()]
    assert {f for _, f in moving} == {0, 1}, moving
    with conn.transaction():
        for pk, was_f in moving:
            conn.execute("UPDATE part SET name = %s WHERE pk = %s",
                         (("g" if was_f else "f") + str(pk), pk))
            conn.execute("UPDATE li SET qty = qty * 40 WHERE pk = %s", (pk,))
            conn.execute("UPDATE ps SET avail = avail + 7 WHERE pk = %s", (pk,))
    for st in made:
        m.maintain(f"v_{st}")
        assert _rows(conn, f"SELECT * FROM v_{st}") == _rows(conn, Q20_SHAPE), st
    for r in range(5):
        with conn.transaction():
            for _ in range(rng.randrange(10, 50)):
                op, pk = rng.random(), rng.randrange(1, N_PART + 1)
                ok, ln = rng.randrange(1, 3_000), rng.randrange(4)
                if op < 0.3:
                    conn.execute("INSERT INTO li VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT "
                                 "(ok, ln) DO UPDATE SET qty = EXCLUDED.qty",
                                 (ok, ln, pk - pk % 20 or 20, rng.randrange(3),
                                  rng.randrange(1, 9), rng.randrange(20)))
                elif op < 0.45:
                    conn.execute("UPDATE li SET pk = %s, sdate = %s WHERE ok = %s AND ln = %s",
                                 (pk, rng.randrange(20), ok, ln))
                elif op < 0.55:
                    conn.execute("DELETE FROM li WHERE ok = %s", (ok,))
                elif op < 0.7:  # a part into or out of the σ
                    conn.execute("UPDATE part SET name = %s WHERE pk = %s",
                                 (rng.choice("fg") + str(pk), pk - pk % 20 or 20))
                elif op < 0.85:
                    conn.execute("INSERT INTO ps VALUES (%s, %s, %s) ON CONFLICT (pk, sk) DO "
                                 "UPDATE SET avail = EXCLUDED.avail",
                                 (pk - pk % 20 or 20, rng.randrange(3), rng.randrange(50)))
                else:
                    conn.execute("DELETE FROM ps WHERE pk = %s AND sk = %s",
                                 (pk - pk % 20 or 20, rng.randrange(3)))
        for st in made:
            m.maintain(f"v_{st}", strategy="recompute" if st == "auto" and r == 2 else None)
        want = _rows(conn, Q20_SHAPE)
        for st in made:
            assert _rows(conn, f"SELECT * FROM v_{st}") == want, (st, r)
