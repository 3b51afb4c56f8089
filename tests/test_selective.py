"""A σ over a scan that a join reads by its key, stored as a cache where it keeps few rows
(``planner/selective.py``, ``postgres/statistics.py``).

Planner: which σ are candidates, that only statistics choose them (and the same for a σ and
its magic-set copy), the cache's role and that the Δ-script reads it. PostgreSQL: the choice
from ``EXPLAIN`` at create_view, recorded in the registry (a re-plan makes the same caches),
and differential — after random batches moving rows in and out of φ, changing keys and the
other input, the view equals its query under ``id`` and ``auto``.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg
import pytest
import sqlglot

from idivm import Catalog, plan
from idivm import algebra as A
from idivm.planner.log_filter import fold_filters, log_filters
from idivm.planner.selective import SELECTIVE_FRACTION, Candidate, Recorded, candidates
from idivm.postgres import PostgresMaintainer
from idivm.postgres.statistics import MIN_TABLE_ROWS, PgStatistics

DDL = """
CREATE TABLE part (pk int PRIMARY KEY, brand text NOT NULL, size int NOT NULL);
CREATE TABLE line (lk int PRIMARY KEY, pk int NOT NULL, qty int NOT NULL, price int);
"""
# Q17's shape: the line items of one brand whose quantity is under a fifth of that part's mean
BRAND = ("SELECT sum(l.price) AS total FROM line l, part p WHERE p.pk = l.pk AND "
         "p.brand = 'B3' AND p.size < 5 AND l.qty < (SELECT 0.5 * avg(l2.qty) FROM line l2 "
         "WHERE l2.pk = p.pk)")
# a join, a semi-join and a σ read by a non-key column
JOINED = ("SELECT l.lk, l.qty, p.size FROM line l JOIN part p ON p.pk = l.pk "
          "WHERE p.brand = 'B3' AND l.qty > 2")
SEMI = ("SELECT l.pk, count(*) AS n FROM line l WHERE l.pk IN "
        "(SELECT pk FROM part WHERE brand = 'B3') GROUP BY l.pk")
FACT_SIDE = ("SELECT p.pk, sum(l.qty) AS q FROM part p JOIN line l ON l.pk = p.pk "
             "WHERE l.qty > 8 GROUP BY p.pk")


class Every:
    """Statistics that call every candidate selective."""

    def selectivity(self, candidate: Candidate) -> float | None:
        return 0.0


def _cat() -> Catalog:
    return Catalog.from_ddl(DDL)


def _roles(p: Any) -> list[str]:
    return [m.role for m in p.materialized]


def test_no_statistics_no_cache() -> None:
    for sql in (BRAND, JOINED, SEMI):
        p = plan(sql, _cat(), name="v")
        assert "cache: selective input" not in _roles(p)
        assert p.selective == frozenset()


def test_candidates_are_a_dimension_read_by_its_key() -> None:
    p = plan(JOINED, _cat(), name="v")
    (c,) = candidates(p.root, p.infos)
    assert c.table == "part"
    assert c.signature == "part: \"brand\" = 'B3'"
    # line is read by l.pk, not by its key: no candidate (its σ keeps fact rows)
    f = plan(FACT_SIDE, _cat(), name="v")
    assert candidates(f.root, f.infos) == ()
    # a condition of other than plain operators is not stored (as the log filter, which
    # judges a log row as the table row would be, takes only those)
    fn = plan("SELECT l.lk FROM line l JOIN part p ON p.pk = l.pk "
              "WHERE md5(p.brand) = 'x'", _cat(), name="v")
    assert candidates(fn.root, fn.infos) == ()


def test_statistics_choose_and_copies_follow() -> None:
    p = plan(BRAND, _cat(), name="v", statistics=Every())
    sel = [m for m in p.materialized if m.role == "cache: selective input"]
    assert len(sel) == 2  # the σ and the magic set's copy of it: one signature
    assert p.selective == {"part: \"brand\" = 'B3' AND \"size\" < 5"}
    # a re-plan from the recorded choice is the same plan
    again = plan(BRAND, _cat(), name="v", statistics=Recorded(p.selective))
    assert [m.name for m in again.materialized] == [m.name for m in p.materialized]
    assert again.statements == p.statements
    # not selective enough: not cached
    loose = plan(BRAND, _cat(), name="v", statistics=Recorded(frozenset({"other"})))
    assert "cache: selective input" not in _roles(loose)


# TPC-H Q19's shape: the join's condition a disjunction over both tables
ORED = ("SELECT sum(l.price) AS total FROM line l JOIN part p ON p.pk = l.pk "
        "WHERE (p.brand = 'B3' AND p.size < 5 AND l.qty < 4) "
        "OR (p.brand = 'B7' AND p.size > 40 AND l.qty > 9)")


def test_a_disjunctive_join_condition_filters_each_side_by_its_part() -> None:
    """``rewrite.implied_filter_below_join``: each side of the join gets a σ of the part of
    the condition on its columns alone (kept in the join too), so the dimension's is a
    candidate, cached where selective; the log filter names each conjunct once. (Over
    PostgreSQL, with its statistics: ``test_pg_differential[or]``.)"""
    p = plan(ORED, _cat(), name="v")
    sel = {n.child.table: n.predicate.sql("postgres") for n in A.walk(p.root)
           if isinstance(n, A.Select) and isinstance(n.child, A.Scan)}
    assert sel["part"].count("'B3'") == 1 and "qty" not in sel["part"], sel
    assert "brand" not in sel["line"] and sel["line"].count("qty") == 2, sel
    (c,) = candidates(p.root, p.infos)
    assert c.table == "part"
    cached = plan(ORED, _cat(), name="v", statistics=Every())
    assert "cache: selective input" in _roles(cached)
    assert log_filters(p.root)["part"].sql("postgres").count("'B3'") == 1


def test_semi_join_right_side() -> None:
    p = plan(SEMI, _cat(), name="v", statistics=Every())
    assert "cache: selective input" in _roles(p)


def _fold_filters(sql: str) -> dict[str, str]:
    p = plan(sql, _cat(), name="v", statistics=Every())
    keyed = {m.nid: m.key for m in p.materialized if m.role != "view" and not m.nullable}
    cached = [m.nid for m in p.materialized]
    assert "KEYS_OF" not in str(log_filters(p.root, cached))  # (never the triggers')
    return {t: f.sql("postgres") for t, f in fold_filters(p.root, cached, keyed).items()}


def test_fold_filters_semijoin_the_stored_keys() -> None:
    """A table joined (inner, EXISTS/IN, the null-supplying side of an outer join) with a
    stored σ by that σ's whole key keeps in its fold only rows whose value is one of its keys;
    the preserved side of an outer join and the outer rows of NOT EXISTS keep every row."""
    joined = _fold_filters(JOINED)
    assert joined["line"].startswith("KEYS_OF(") and '"pk"' in joined["line"] \
        and '"qty" > 2' in joined["line"], joined
    assert _fold_filters(SEMI)["line"].startswith("KEYS_OF("), _fold_filters(SEMI)
    # both scans of line, one joined with the σ, one with its magic-set copy: one semijoin
    # (the copy's stored rows are the σ's), not an OR of two
    brand = _fold_filters(BRAND)["line"]
    assert brand.count("KEYS_OF(") == 1 and " OR " not in brand, brand
    # scans of one table under different semijoins: an OR, which falls back to the plain
    # filter (a subplan per row where the keys are too many to hash)
    two = ("SELECT a.lk FROM line a JOIN part p ON p.pk = a.pk JOIN line b ON b.lk = a.lk + 1 "
           "JOIN part r ON r.pk = b.pk WHERE p.brand = 'B3' AND r.size = 1")
    assert "KEYS_OF" not in _fold_filters(two).get("line", "")
    anti = ("SELECT l.lk FROM line l WHERE NOT EXISTS (SELECT 1 FROM part p "
            "WHERE p.pk = l.pk AND p.brand = 'B3')")
    assert "line" not in _fold_filters(anti)
    outer = ("SELECT l.lk, p.size FROM line l LEFT JOIN (SELECT pk, size FROM part "
             "WHERE brand = 'B3') p ON p.pk = l.pk")
    assert "line" not in _fold_filters(outer)


# -- PostgreSQL ------------------------------------------------------------------------------

N_PARTS = 2 * MIN_TABLE_ROWS  # large enough for its statistics to count


def _fill(conn: psycopg.Connection[Any]) -> None:
    conn.execute(DDL)
    conn.execute(f"INSERT INTO part SELECT i, 'B' || (i % 40), i % 50 "
                 f"FROM generate_series(1, {N_PARTS}) i")
    conn.execute("INSERT INTO line SELECT i, 1 + (i * 7919) % 2000 * 10, i % 13, i % 97 "
                 "FROM generate_series(1, 6000) i")
    conn.execute("ANALYZE part; ANALYZE line")


def _batch(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    with conn.transaction():
        for _ in range(rng.randrange(5, 40)):
            op = rng.random()
            part = rng.randrange(1, N_PARTS + 1, 10)  # the parts the line items read
            if op < 0.3:
                conn.execute("INSERT INTO line VALUES (%s, %s, %s, %s) ON CONFLICT (lk) DO "
                             "UPDATE SET qty = EXCLUDED.qty",
                             (rng.randrange(1, 9000), part, rng.randrange(13),
                              rng.randrange(97)))
            elif op < 0.5:
                conn.execute("UPDATE line SET qty = %s, pk = CASE WHEN %s THEN %s ELSE pk END "
                             "WHERE lk = %s", (rng.randrange(13), rng.random() < 0.3, part,
                                               rng.randrange(1, 9000)))
            elif op < 0.6:
                conn.execute("DELETE FROM line WHERE lk = %s", (rng.randrange(1, 9000),))
            elif op < 0.85:  # a part moves in or out of φ, or changes size
                conn.execute("UPDATE part SET brand = %s, size = %s WHERE pk = %s",
                             (f"B{rng.choice([3, 3, 7])}", rng.randrange(10), part))
            elif op < 0.92:
                conn.execute("DELETE FROM part WHERE pk = %s AND NOT EXISTS (SELECT FROM line "
                             "WHERE line.pk = part.pk)", (part,))
            else:  # a part's key changes (no line item reads the new key yet)
                conn.execute("UPDATE part SET pk = pk + 1 WHERE pk = %s AND NOT EXISTS "
                             "(SELECT FROM part p2 WHERE p2.pk = part.pk + 1)", (part,))


@pytest.fixture
def db(pg_db: Any) -> Any:
    _fill(pg_db[1])
    return pg_db


def test_pg_statistics(db: Any) -> None:
    m, conn, schema = db
    stats = PgStatistics(m.conn, schema)
    p = plan(JOINED, _cat(), name="v")
    (c,) = candidates(p.root, p.infos)
    f = stats.selectivity(c)
    assert f is not None and f <= SELECTIVE_FRACTION  # one brand of 40
    # a small table is never worth a cache; a condition PostgreSQL refuses is no estimate
    conn.execute("CREATE TABLE small (pk int PRIMARY KEY, brand text)")
    assert stats.selectivity(Candidate(0, "small", c.predicate)) is None
    assert stats.selectivity(Candidate(0, "no_such_table", c.predicate)) is None


def test_pg_selectivity_is_counted_on_a_repeatable_sample(db: Any) -> None:
    """φ's fraction is counted on a block sample, not taken from the planner's histogram:
    close to the true fraction whatever the last ANALYZE sampled, and the same at every ask
    (the same choice for the same data); where the sample holds too few rows (a table far
    smaller than its statistics say) the planner's estimate is used."""
    m, conn, schema = db
    stats = PgStatistics(m.conn, schema)
    # 1 part in 40 has brand 'B7' ('B' || i % 40); the rows are in i order, the brands cycle
    brand = Candidate(0, "part", sqlglot.parse_one("brand = 'B7'", read="postgres"))
    wide = Candidate(0, "part", sqlglot.parse_one("size < 10", read="postgres"))  # 1 in 5
    got = [stats.selectivity(brand) for _ in range(3)]
    assert got[0] == pytest.approx(1 / 40, rel=0.1) and len(set(got)) == 1
    assert stats.selectivity(wide) == pytest.approx(0.2, rel=0.1)
    # the table emptied since its statistics: the sample reads nothing, the planner answers
    conn.execute("DELETE FROM line")
    conn.execute("DELETE FROM part")
    f = stats.selectivity(brand)
    assert f is not None and f == pytest.approx(1 / 40, rel=0.5)  # (ANALYZE's, as before)


@pytest.mark.parametrize("sql", [BRAND, JOINED, SEMI, ORED], ids=["q17", "join", "semi", "or"])
def test_pg_differential(db: Any, sql: str) -> None:
    m, conn, schema = db
    made = {st: m.create_view(f"v_{st}", sql, strategy=st) for st in ("id", "auto")}
    for p in made.values():
        assert "cache: selective input" in _roles(p), _roles(p)
    # recorded: a new maintainer re-plans the same caches from the registry
    other = PostgresMaintainer(m.dsn, schema)
    try:
        assert [x.name for x in other.plan_of("v_id").materialized] == \
            [x.name for x in made["id"].materialized]
    finally:
        other.close()
    rng = random.Random(7)
    want = Counter(map(tuple, conn.execute(sql).fetchall()))
    for st in made:
        assert Counter(map(tuple, conn.execute(f"SELECT * FROM v_{st}").fetchall())) == want
    seen: list[Any] = []
    for r in range(8):
        _batch(conn, rng)
        for st in made:
            m.maintain(f"v_{st}", strategy="recompute" if st == "auto" and r == 3 else None)
        want = Counter(map(tuple, conn.execute(sql).fetchall()))
        for st in made:
            got = Counter(map(tuple, conn.execute(f"SELECT * FROM v_{st}").fetchall()))
            assert got == want, (st, r)
        seen.append(sum(want.values()) if sql != BRAND else next(iter(want))[0] is not None)
    assert all(seen[4:]), seen  # the view reads rows (parts moved into φ) after a few rounds


def test_pg_over_a_view(db: Any) -> None:
    """A σ of an upstream view (a pipeline) read by its key: cached from that view's logged
    changes, and the downstream view equals its query after every batch."""
    m, conn, _ = db
    m.create_view("up", "SELECT pk, brand, size FROM part WHERE size < 40")
    down = ("SELECT l.lk, l.qty, u.size FROM line l JOIN up u ON u.pk = l.pk "
            "WHERE u.brand = 'B3'")
    p = m.create_view("down", down)
    assert "cache: selective input" in _roles(p), _roles(p)
    rng = random.Random(11)
    for r in range(6):
        _batch(conn, rng)
        m.maintain("down")  # (maintains up first, in the same transaction)
        want = Counter(map(tuple, conn.execute(down).fetchall()))
        assert Counter(map(tuple, conn.execute("SELECT * FROM down").fetchall())) == want, r


def test_pg_fold_keeps_line_items_of_parts_the_view_can_see(db: Any) -> None:
    """Plan shape: the fold of ``line`` reads the stored σ(part)'s keys, so a batch of line
    items of parts outside φ folds to nothing; a part moved into φ in the same batch as a new
    line item of it counts that line item, and the view equals its query."""
    m, conn, _ = db
    outside = [r[0] for r in conn.execute(
        "SELECT pk FROM part WHERE brand <> 'B3' ORDER BY pk LIMIT 40").fetchall()]
    inside = [r[0] for r in conn.execute(
        "SELECT pk FROM part WHERE brand = 'B3' ORDER BY pk LIMIT 3").fetchall()]
    conn.execute("INSERT INTO line SELECT 40000 + i, %s, i, 1 FROM generate_series(1, 5) i",
                 (inside[1],))
    m.create_view("v", JOINED, strategy="id")
    with conn.transaction():
        for k, pk in enumerate(outside[:30]):
            conn.execute("INSERT INTO line VALUES (%s, %s, 5, 1)", (20000 + k, pk))
        conn.execute("UPDATE line SET qty = qty + 1 WHERE pk = ANY(%s)", (outside[:30],))
    stats = m.maintain("v")
    assert stats.changes.get("line", 0) == 0, stats.changes
    moved = conn.execute("SELECT count(*) FROM line WHERE pk = %s AND qty <> 9",
                         (inside[1],)).fetchone()
    assert moved is not None and moved[0] > 0
    with conn.transaction():
        conn.execute("INSERT INTO line VALUES (30000, %s, 5, 1), (30001, %s, 6, 1), "
                     "(30002, %s, 7, 1)", (outside[30], inside[0], outside[31]))
        conn.execute("UPDATE part SET brand = 'B3' WHERE pk = %s", (outside[31],))
        conn.execute("UPDATE part SET brand = 'B9' WHERE pk = %s", (inside[1],))
        conn.execute("UPDATE line SET qty = 9 WHERE pk = %s", (inside[1],))
    stats = m.maintain("v")
    # the new line items of a part in φ before or after (not of the one outside both), and
    # the updated ones of the part that left φ
    assert stats.changes.get("line", 0) == 2 + int(moved[0]), stats.changes
    want = Counter(map(tuple, conn.execute(JOINED).fetchall()))
    assert Counter(map(tuple, conn.execute("SELECT * FROM v").fetchall())) == want
