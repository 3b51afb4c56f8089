"""Fresh views vs recomputation: random single-tuple event streams (inserts, deletes, updates of
value columns and of keys/join columns), then the view read from the C++ maps must equal the
same SQL evaluated by PostgreSQL over the final tables. Higher-order, first-order (depth 1) and
re-evaluation (depth 0) programs alike."""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from idivm.catalog import Catalog
from idivm.fresh import FreshView

CHAIN = """
create table r(id int primary key, a int not null, b int not null);
create table s(id int primary key, b int not null, c int not null, name text not null);
create table t(id int primary key, c int not null, d numeric(10,2) not null);
"""
BOOK = """
create table bids(t int not null, id int primary key, broker_id int not null,
                  volume numeric not null, price numeric not null);
create table asks(t int not null, id int primary key, broker_id int not null,
                  volume numeric not null, price numeric not null);
"""
SHOP = """
create table customer(c_custkey int primary key, c_mktsegment text not null,
                      c_nationkey int not null);
create table orders(o_orderkey int primary key, o_custkey int not null,
                    o_orderdate date not null, o_shippriority int not null);
create table lineitem(l_orderkey int not null, l_linenumber int not null,
                      l_extendedprice numeric(12,2) not null, l_discount numeric(4,2) not null,
                      l_shipdate date not null, primary key (l_orderkey, l_linenumber));
"""

SCHEMAS = {"chain": CHAIN, "book": BOOK, "shop": SHOP}

# (name, schema, sql)
VIEWS = [
    ("sum_ad", "chain", "select sum(r.a * t.d) as q from r, s, t where r.b = s.b and s.c = t.c"),
    ("count_cross", "chain", "select count(*) as n from r, s"),
    ("group_aggs", "chain", "select s.c, sum(r.a) as sa, count(*) as n, avg(r.a) as av "
     "from r join s on r.b = s.b group by s.c"),
    ("min_max", "chain", "select r.b, min(r.a) as lo, max(r.a) as hi, count(*) as n "
     "from r group by r.b"),
    ("distinct", "chain", "select distinct r.b, s.c from r join s on r.b = s.b"),
    ("bag_spj", "chain", "select r.a, s.c, s.name from r, s where r.b = s.b and r.a > 2"),
    ("theta", "chain", "select r.b, sum(r.a - s.c) as x from r, s where r.a < s.c group by r.b"),
    ("self_equi", "chain", "select x.b, sum(x.a * y.a) as x from r x, r y where x.b = y.b "
     "group by x.b"),
    ("self_theta", "chain", "select x.b, sum(x.a - y.a) as x, count(*) as n from r x, r y "
     "where x.b = y.b and x.id > y.id group by x.b"),
    ("case_arith", "chain", "select r.a + r.b as k, sum(case when r.a > 4 then r.a * 2 else 1 "
     "end) as x from r where case when r.b > 2 then 1 else 0 end = 1 group by r.a + r.b"),
    ("text_filter", "chain", "select s.name, count(*) as n, sum(t.d) as sd from s, t "
     "where s.c = t.c and s.name <> 'z' group by s.name"),
    ("disconnected", "chain", "select r.b, sum(t.d) as sd, count(*) as n from r, t "
     "group by r.b"),
    ("having", "chain", "select r.b, sum(r.a) as sa from r group by r.b having count(*) > 1"),
    ("axf", "book", "select b.broker_id, sum(a.volume - b.volume) as axf from bids b, asks a "
     "where b.broker_id = a.broker_id and (a.price - b.price > 3 or b.price - a.price > 3) "
     "group by b.broker_id"),
    ("bsp", "book", "select x.broker_id, sum(x.volume * x.price - y.volume * y.price) as bsp "
     "from bids x, bids y where x.broker_id = y.broker_id and x.t > y.t group by x.broker_id"),
    ("q3", "shop", "select l.l_orderkey, o.o_orderdate, o.o_shippriority, "
     "sum(l.l_extendedprice * (1 - l.l_discount)) as revenue "
     "from customer c, orders o, lineitem l where c.c_mktsegment = 'BUILDING' "
     "and c.c_custkey = o.o_custkey and l.l_orderkey = o.o_orderkey "
     "and o.o_orderdate < date '1995-03-15' and l.l_shipdate > date '1995-03-15' "
     "group by l.l_orderkey, o.o_orderdate, o.o_shippriority"),
]


# ------------------------------------------------------------------------------ generators


def _day(rng: random.Random, first: int = 10) -> datetime.date:
    return datetime.date(1995, 3, first) + datetime.timedelta(days=rng.randint(0, 10))


GEN: dict[str, dict[str, Callable[[random.Random, int], tuple[Any, ...]]]] = {
    "chain": {
        "r": lambda g, k: (k, g.randint(0, 8), g.randint(0, 4)),
        "s": lambda g, k: (k, g.randint(0, 4), g.randint(0, 6), g.choice("xyz")),
        "t": lambda g, k: (k, g.randint(0, 6), Decimal(g.randint(-300, 900)) / 100),
    },
    "book": {
        "bids": lambda g, k: (g.randint(0, 50), k, g.randint(0, 3), Decimal(g.randint(1, 9)),
                              Decimal(g.randint(90, 110))),
        "asks": lambda g, k: (g.randint(0, 50), k, g.randint(0, 3), Decimal(g.randint(1, 9)),
                              Decimal(g.randint(90, 110))),
    },
    "shop": {
        "customer": lambda g, k: (k % 6, g.choice(["BUILDING", "AUTO"]), g.randint(0, 2)),
        "orders": lambda g, k: (k % 9, g.randint(0, 5), _day(g, 6), g.randint(0, 1)),
        "lineitem": lambda g, k: (g.randint(0, 7), k, Decimal(g.randint(100, 9000)) / 10,
                                  Decimal(g.randint(0, 9)) / 100, _day(g)),
    },
}
KEYS = {"chain": {"r": (0,), "s": (0,), "t": (0,)}, "book": {"bids": (1,), "asks": (1,)},
        "shop": {"customer": (0,), "orders": (0,), "lineitem": (0, 1)}}


@dataclass
class Model:
    tables: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]


def random_stream(fv: FreshView, schema: str, seed: int, n: int) -> Model:
    """Apply ``n`` random events to ``fv``; return the final base tables."""
    g = random.Random(seed)
    gens = GEN[schema]
    model = Model({t: {} for t in gens})
    next_key = 1000
    for _ in range(n):
        table = g.choice(sorted(gens))
        rows = model.tables[table]
        key_pos = KEYS[schema][table]
        r = g.random()
        if r < 0.55 or len(rows) < 3:
            next_key += 1
            row = gens[table](g, next_key)
            k = tuple(row[i] for i in key_pos)
            if k in rows:
                continue
            rows[k] = row
            fv.insert(table, row)
        elif r < 0.75:
            k = g.choice(sorted(rows, key=repr))
            fv.delete(table, rows.pop(k))
        else:
            k = g.choice(sorted(rows, key=repr))
            old = rows[k]
            fresh = gens[table](g, 0)
            if g.random() < 0.5:  # change one non-key column, keep the key
                col = g.choice([i for i in range(len(old)) if i not in key_pos])
                new = tuple(fresh[i] if i == col else old[i] for i in range(len(old)))
            else:  # anything, key included
                next_key += 1
                moved = gens[table](g, next_key)
                new = tuple(moved[i] if i in key_pos and len(key_pos) == 1 else
                            (fresh[i] if i not in key_pos else old[i]) for i in range(len(old)))
            nk = tuple(new[i] for i in key_pos)
            if nk != k and nk in rows:
                continue
            if g.random() < 0.5 and nk == k:
                fv.upsert(table, new)
            else:
                fv.update(table, old, new)
            del rows[k]
            rows[nk] = new
    return model


# ------------------------------------------------------------------------------ comparison


def _norm(v: Any) -> Any:
    if isinstance(v, Decimal | float):
        return round(float(v), 4) + 0.0
    return v


def recompute(dsn: str, pg_schema: str, schema: str, view_sql: str, model: Model) -> list[Any]:
    cat = Catalog.from_ddl(SCHEMAS[schema])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        for t in cat.tables.values():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t.name)))
        for ddl in cat.ddl():
            conn.execute(ddl)
        for table, rows in model.tables.items():
            if not rows:
                continue
            info = cat.table(table)
            with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                    sql.Identifier(table),
                    sql.SQL(", ").join(sql.Identifier(c) for c in info.column_names))) as cp:
                for row in rows.values():
                    cp.write_row(row)
        return conn.execute(view_sql).fetchall()


def assert_same(got: list[Any], want: list[Any], label: str) -> None:
    g = sorted((tuple(_norm(x) for x in r) for r in got), key=repr)
    w = sorted((tuple(_norm(x) for x in r) for r in want), key=repr)
    assert g == w, f"{label}: fresh view {g[:8]} … ({len(g)} rows) ≠ recomputed {w[:8]} … " \
                   f"({len(w)} rows)"


def compiled(name: str, depth: int | None) -> tuple[FreshView, str, str]:
    _, schema, view_sql = next(v for v in VIEWS if v[0] == name)
    return FreshView.compile(view_sql, Catalog.from_ddl(SCHEMAS[schema]), depth), schema, \
        view_sql


@pytest.mark.parametrize("name", [v[0] for v in VIEWS])
def test_higher_order_equals_recompute(name: str, pg_dsn: str, pg_schema: str,
                                       cxx: None) -> None:
    for seed in range(3):
        fv, schema, view_sql = compiled(name, None)
        model = random_stream(fv, schema, seed, 160)
        assert_same(fv.rows(), recompute(pg_dsn, pg_schema, schema, view_sql, model),
                    f"{name} seed {seed}")
        fv.close()


@pytest.mark.parametrize("name", ["sum_ad", "min_max", "self_theta", "axf", "q3"])
@pytest.mark.parametrize("depth", [1, 0])
def test_lower_depths_equal_recompute(name: str, depth: int, pg_dsn: str, pg_schema: str,
                                      cxx: None) -> None:
    fv, schema, view_sql = compiled(name, depth)
    model = random_stream(fv, schema, 7, 120)
    assert_same(fv.rows(), recompute(pg_dsn, pg_schema, schema, view_sql, model),
                f"{name} depth {depth}")
    fv.close()
