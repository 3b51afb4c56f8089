"""Fresh views over nested aggregates, EXISTS/IN and NOT EXISTS/NOT IN (stages publishing derived
relations) vs recomputation by PostgreSQL, over random single-tuple event streams that make
groups empty and refill, subquery results flip predicates and probes appear and vanish."""

from __future__ import annotations

import pytest

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fresh import FreshView

from .test_differential import SCHEMAS, assert_same, random_stream, recompute

NESTED = [
    ("correlated_avg", "chain", "select r.b, sum(r.a) as sa, count(*) as n from r "
     "where r.a > (select avg(x.a) from r x where x.b = r.b) group by r.b"),
    ("uncorrelated_having", "chain", "select r.b, sum(r.a) as sa from r group by r.b "
     "having sum(r.a) > (select sum(t.d) * 0.2 from t)"),
    ("global_count", "chain", "select r.b, count(*) as n from r "
     "where r.a < (select count(*) from s) group by r.b"),
    ("exists", "chain", "select s.c, count(*) as n, sum(s.b) as sb from s "
     "where exists (select 1 from r where r.b = s.b and r.a > 2) group by s.c"),
    ("not_exists", "chain", "select s.c, count(*) as n, sum(s.b) as sb from s "
     "where not exists (select 1 from r where r.b = s.b and r.a > 3) group by s.c"),
    ("not_in_bag", "chain", "select s.id, s.name from s where s.c not in (select t.c from t "
     "where t.d > 2)"),
    ("in_having", "chain", "select r.b, count(*) as n from r where r.b in "
     "(select s.b from s group by s.b having count(*) > 1) group by r.b"),
    ("max_of_sums", "chain", "select s.id, s.c, v.tot from s, (select r.b, sum(r.a) as tot "
     "from r group by r.b) v where s.b = v.b and v.tot = (select max(w.tot) from "
     "(select r.b, sum(r.a) as tot from r group by r.b) w)"),
    ("count_distinct", "chain", "select s.c, count(distinct s.b) as nb, count(*) as n from s "
     "group by s.c"),
    ("min_per_group", "chain", "select s.c, s.id from s where s.b = "
     "(select min(x.b) from s x where x.c = s.c)"),
    ("nested_twice", "shop", "select o.o_shippriority, count(*) as n from orders o "
     "where o.o_orderkey in (select l.l_orderkey from lineitem l where l.l_extendedprice > "
     "(select avg(l2.l_extendedprice) from lineitem l2 where l2.l_orderkey = l.l_orderkey)) "
     "group by o.o_shippriority"),
    ("exists_one_row", "chain", "select r.b, count(*) as n from r where exists (select 1 from "
     "(select sum(s.c) as q from s where s.b = r.b) n where n.q > 3) group by r.b"),
    ("grouped_scalar_item", "chain", "select r.b, (select count(*) from s) * count(*) as x "
     "from r group by r.b"),
    ("vwap", "book", "select sum(b1.price * b1.volume) as vwap from bids b1 "
     "where 0.25 * (select sum(b3.volume) from bids b3) "
     "> (select sum(b2.volume) from bids b2 where b2.price > b1.price)"),
    ("mst", "book", "select b.broker_id, sum(a.price * a.volume - b.price * b.volume) as mst "
     "from bids b, asks a where 0.25 * (select sum(a1.volume) from asks a1) "
     "> (select sum(a2.volume) from asks a2 where a2.price > a.price) "
     "and 0.25 * (select sum(b1.volume) from bids b1) "
     "> (select sum(b2.volume) from bids b2 where b2.price > b.price) group by b.broker_id"),
    ("psp", "book", "select sum(a.price - b.price) as psp from bids b, asks a "
     "where b.volume > 0.2 * (select sum(b1.volume) from bids b1) "
     "and a.volume > 0.2 * (select sum(a1.volume) from asks a1)"),
    ("q17_like", "shop", "select sum(l.l_extendedprice) / 7.0 as avg_yearly "
     "from lineitem l, orders o where o.o_orderkey = l.l_orderkey and o.o_shippriority = 1 "
     "and l.l_extendedprice < (select 1.5 * avg(l2.l_extendedprice) from lineitem l2 "
     "where l2.l_orderkey = o.o_orderkey)"),
]


@pytest.mark.parametrize("name,depth", [(v[0], None) for v in NESTED] + [
    (n, 1) for n in ("correlated_avg", "not_exists", "max_of_sums", "vwap", "nested_twice")])
def test_nested_equals_recompute(name: str, depth: int | None, pg_dsn: str, pg_schema: str,
                                 cxx: None) -> None:
    _, schema, view_sql = next(v for v in NESTED if v[0] == name)
    for seed in range(2 if depth is None else 1):
        fv = FreshView.compile(view_sql, Catalog.from_ddl(SCHEMAS[schema]), depth)
        assert len(fv.pipeline.stages) > 1
        model = random_stream(fv, schema, seed, 200)
        assert_same(fv.rows(), recompute(pg_dsn, pg_schema, schema, view_sql, model),
                    f"{name} seed {seed} depth {depth}")
        fv.close()


def test_nested_refusals_name_the_construct() -> None:
    cat = Catalog.from_ddl(SCHEMAS["chain"])
    with pytest.raises(UnsupportedSQL, match="correlated by a non-equality"):
        FreshView.compile("select r.a from r where exists (select 1 from s where s.b < r.a)",
                          cat)
    with pytest.raises(UnsupportedSQL, match="depth 0"):
        FreshView.compile("select r.b, count(*) from r where r.b in (select s.b from s) "
                          "group by r.b", cat, 0)
