"""The passes one at a time: IDs (Table 1 + FDs), §5 schemas, rule registry, Figure 8."""

from __future__ import annotations

import re
import sys

import sqlglot
from idivm.rules import registry
from sqlglot import exp

import idivm
from idivm import algebra as A
from idivm.examples import PAPER_DDL
from idivm.frontend import parse_view
from idivm.planner import minimize
from idivm.planner.ids import infer_ids
from idivm.planner.model import DiffNode, DiffSchema

SOCIAL = idivm.Catalog.from_ddl("""
CREATE TABLE users (uid INT PRIMARY KEY, name TEXT, city INT, tweetsnum INT, favornum INT);
CREATE TABLE microblog (mid INT PRIMARY KEY, uid INT NOT NULL REFERENCES users (uid), t INT);
CREATE TABLE friendlist (uid INT REFERENCES users (uid), followee_id INT REFERENCES users (uid),
                         PRIMARY KEY (uid, followee_id));
""")
PAPER = idivm.Catalog.from_ddl(PAPER_DDL)


def root_ids(sql: str, cat: idivm.Catalog) -> tuple[str, ...]:
    root, infos = infer_ids(parse_view(sql, cat).root, cat)
    return infos[root.nid].ids


def test_ids_follow_table_1() -> None:
    assert set(root_ids("SELECT did, pid, price FROM parts NATURAL JOIN devices_parts "
                        "NATURAL JOIN devices", PAPER)) == {"did", "pid"}
    assert root_ids("SELECT did, count(*) AS n FROM devices_parts GROUP BY did", PAPER) == (
        "did",)


def test_attributes_determined_by_an_id_are_not_ids() -> None:
    """microblog ⋈ users on the FK: users.uid is determined by mid, so IDs = {mid}."""
    ids = root_ids("SELECT m.mid, u.name FROM microblog m JOIN users u ON u.uid = m.uid", SOCIAL)
    assert ids == ("mid",)


def test_projection_is_extended_with_missing_ids() -> None:
    root, infos = infer_ids(parse_view("SELECT price FROM parts", PAPER).root, PAPER)
    assert isinstance(root, A.Project)
    assert root.hidden and "pid" not in root.columns
    assert infos[root.nid].ids == tuple(root.hidden)


def test_many_to_many_join_is_flagged() -> None:
    """friends of friends: no intermediate cache below the aggregate (§4 footnote 6)."""
    sql = ("SELECT f1.uid, count(*) AS n FROM friendlist f1 JOIN friendlist f2 "
           "ON f1.followee_id = f2.uid GROUP BY f1.uid")
    p = idivm.plan(sql, SOCIAL)
    assert [m.role for m in p.materialized] == ["view"]
    fk = idivm.plan("SELECT u.city, count(*) AS n FROM microblog m JOIN users u "
                    "ON u.uid = m.uid GROUP BY u.city", SOCIAL)
    assert [m.role for m in fk.materialized] == ["cache: input of γ", "view"]


def test_idiff_schemas_split_conditional_and_non_conditional() -> None:
    sql = ("SELECT u.uid, u.tweetsnum, count(*) AS n FROM users u JOIN microblog m "
           "ON m.uid = u.uid WHERE u.city = 3 GROUP BY u.uid, u.tweetsnum")
    schemas = {(s.table, s.kind, s.cols) for s in idivm.plan(sql, SOCIAL).idiff_schemas}
    assert ("users", "upd", ("city",)) in schemas
    assert ("users", "upd", ("tweetsnum",)) in schemas  # a group-by column is conditional
    assert ("microblog", "upd", ("uid",)) in schemas
    assert not any(s[0] == "users" and "name" in s[2] for s in schemas)  # unused: no schema
    restricted = idivm.plan(sql, SOCIAL, changes={"users": ["update:tweetsnum"]}).idiff_schemas
    assert [(s.table, s.kind, s.cols) for s in restricted] == [("users", "upd", ("tweetsnum",))]


def test_every_operator_has_a_rule_file() -> None:
    ops = {A.Scan, A.Select, A.Project, A.Join, A.SemiJoin, A.AntiJoin, A.UnionAll, A.Aggregate,
           A.OuterJoin}
    assert ops <= set(registry())
    assert registry()[A.Aggregate].blocking and not registry()[A.Join].blocking


def test_an_operators_whole_maintenance_is_its_rule_file() -> None:
    """Rendering, the cache policy and the fresh-view translation come from the rule: the
    shared modules name no operator to dispatch on."""
    from pathlib import Path

    import idivm.render

    for op, rule in registry().items():
        assert rule.render is not None, op
        assert rule.fresh is not None or rule.fresh_refusal is not None, op
    text = Path(idivm.render.__file__).read_text()
    assert not [op.__name__ for op in registry() if f"A.{op.__name__}" in text]
    assert {op for op, r in registry().items() if r.combines} == {
        A.Join, A.SemiJoin, A.AntiJoin, A.UnionAll, A.OuterJoin}


ORDERS = idivm.Catalog.from_ddl("""
CREATE TABLE customers (custkey INT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE orders (orderkey INT PRIMARY KEY, custkey INT REFERENCES customers (custkey),
                     qty INT NOT NULL);
""")


def test_outer_join_ids_are_both_sides_and_the_padded_ones_nullable() -> None:
    p = idivm.plan("SELECT c.name, o.qty FROM customers c LEFT JOIN orders o "
                   "ON o.custkey = c.custkey", ORDERS)
    oj = next(n for n in A.walk(p.root) if isinstance(n, A.OuterJoin))
    info = p.infos[oj.nid]
    assert set(info.ids) == {"c__custkey", "o__orderkey"}
    assert info.nullable["o__orderkey"] and not info.nullable["c__custkey"]
    assert not info.same("c__custkey", "o__custkey")  # φ's equality fails on padded rows
    assert p.store.nullable == frozenset({"__id_o__orderkey"})  # keyed NULLS NOT DISTINCT
    sql = idivm.plan("SELECT c.name FROM orders o RIGHT JOIN customers c "
                     "ON o.custkey = c.custkey AND o.qty > 2", ORDERS)
    oj = next(n for n in A.walk(sql.root) if isinstance(n, A.OuterJoin))
    assert isinstance(oj.left, A.Scan) and oj.left.table == "customers"  # preserved side left
    assert isinstance(oj.right, A.Select)  # the padded side's ON condition filters it first


def test_an_aggregate_by_the_preserved_key_is_pushed_below_the_left_join() -> None:
    """TPC-H Q13's shape: γ by the customer over customers ⟕ orders counts per customer what
    a γ of orders by custkey counts per key; the outer join then looks one row up per
    customer (its IDs: the customer's), and a Δu of a count names the customer by its key."""
    p = idivm.plan("SELECT c.custkey, count(o.orderkey) AS n, count(*) AS r, sum(o.qty) AS q "
                   "FROM customers c LEFT JOIN orders o ON c.custkey = o.custkey AND o.qty > 1 "
                   "GROUP BY c.custkey", ORDERS)
    [oj] = [n for n in A.walk(p.root) if isinstance(n, A.OuterJoin)]
    assert isinstance(oj.right, A.Aggregate) and oj.right.group_by == ("o__custkey",)
    assert isinstance(oj.right.child, A.Select)  # the padded side's ON condition below γ
    assert p.infos[oj.nid].ids == ("c__custkey",)
    [top] = [n for n in A.walk(p.root) if isinstance(n, A.Project) and n.child is oj]
    values = {k: e.sql() for k, e in top.exprs}
    assert values["agg__count"] == 'COALESCE("agg__count__r", 0)'
    assert values["agg__count_star"] == 'COALESCE("agg__count_star__r", 1)'  # the padded row
    assert values["agg__sum"] == '"agg__sum__r"'
    # a condition on the preserved side, or a group without the preserved key: not pushed
    for sql in ("SELECT c.custkey, count(o.orderkey) AS n FROM customers c LEFT JOIN orders o "
                "ON c.custkey = o.custkey AND c.name > 'a' AND o.qty > c.custkey "
                "GROUP BY c.custkey",
                "SELECT c.name, count(o.orderkey) AS n FROM customers c LEFT JOIN orders o "
                "ON c.custkey = o.custkey GROUP BY c.name"):
        p = idivm.plan(sql, ORDERS)
        [oj] = [n for n in A.walk(p.root) if isinstance(n, A.OuterJoin)]
        assert not isinstance(oj.right, A.Aggregate)


def test_a_correlated_aggregate_groups_only_the_keys_the_filtered_outer_side_holds() -> None:
    """TPC-H Q17's shape: the average per customer key is computed for the keys of the
    customers the outer query keeps (a semi-join with a copy of its filtered scan)."""
    p = idivm.plan("SELECT o.orderkey FROM orders o JOIN customers c ON c.custkey = o.custkey "
                   "WHERE c.name = 'x' AND o.qty > (SELECT avg(o2.qty) FROM orders o2 "
                   "WHERE o2.custkey = c.custkey)", ORDERS)
    [agg] = [n for n in A.walk(p.root) if isinstance(n, A.Aggregate) and n.group_by]
    assert isinstance(agg.child, A.SemiJoin)
    magic = agg.child.right
    assert isinstance(magic, A.Select) and isinstance(magic.child, A.Scan)
    assert magic.child.table == "customers" and "'x'" in magic.predicate.sql()
    # an unfiltered outer source bounds nothing: no semi-join
    p = idivm.plan("SELECT o.orderkey FROM orders o WHERE o.qty > (SELECT avg(o2.qty) FROM "
                   "orders o2 WHERE o2.custkey = o.custkey)", ORDERS)
    [agg] = [n for n in A.walk(p.root) if isinstance(n, A.Aggregate) and n.group_by]
    assert not isinstance(agg.child, A.SemiJoin)


def test_a_left_join_on_the_other_sides_key_names_a_change_by_the_preserved_ids() -> None:
    p = idivm.plan("SELECT o.orderkey, c.name FROM orders o LEFT JOIN customers c "
                   "ON c.custkey = o.orderkey", ORDERS)
    [oj] = [n for n in A.walk(p.root) if isinstance(n, A.OuterJoin)]
    assert p.infos[oj.nid].ids == ("o__orderkey",)
    upd = [d for d in p.dag.diffs.values() if d.schema.nid == oj.nid and d.schema.kind == "upd"]
    assert upd and all(d.schema.ids == ("o__orderkey",) for d in upd)


def test_correlated_scalar_subquery_becomes_a_grouped_aggregate_joined_in() -> None:
    p = idivm.plan("SELECT o.orderkey FROM orders o WHERE o.qty > "
                   "(SELECT avg(o2.qty) FROM orders o2 WHERE o2.custkey = o.custkey)", ORDERS)
    [agg] = [n for n in A.walk(p.root) if isinstance(n, A.Aggregate)]
    assert len(agg.group_by) == 1 and agg.aggs[0].func == "avg"
    join = next(n for n in A.walk(p.root) if isinstance(n, A.Join))
    assert [e for e in A.equalities(join.predicate) if "o__custkey" in e]  # an equi-join


def test_a_changed_uncorrelated_scalar_changes_only_the_rows_whose_predicate_flips() -> None:
    p = idivm.plan("SELECT o.orderkey FROM orders o WHERE o.qty > "
                   "(SELECT avg(o2.qty) FROM orders o2)", ORDERS)
    rules = set(re.findall(r"-- ∘ ([^\n\[]*?)\s*(?:\[|\(×|$)", p.script_text(), re.M))
    assert "⋈ over a one-row r: Δ+ where φ starts holding ⋈ Input_other_post" in rules
    assert any(r.startswith("⋈ over a one-row r: Δu_r on join attributes → Δ- where φ stops")
               for r in rules)
    # the general rule (delete every joined row by IDs, re-insert it) is left to the outer
    # side's own updates; the scalar's value is not stored in the view
    assert "Table 10 ⋈: Δu_r on join attributes → Δ- by IDs" not in rules
    assert not any("avg" in col for col in p.store.columns)


def test_a_join_with_a_one_row_side_keeps_the_aggregates_input_cache() -> None:
    """Each row meets the one row of a scalar subquery's γ at most once: that ⋈ is
    many-to-one, not many-to-many, so a γ above it keeps its input cache — a change names
    its rows there by their IDs instead of re-deriving them (TPC-H Q22: the customers with
    no orders above the average balance, counted per country code)."""
    from idivm.planner.ids import infer_ids

    sql = ("SELECT city, count(*) AS n FROM users WHERE tweetsnum > "
           "(SELECT avg(tweetsnum) FROM users) GROUP BY city")
    root, infos = infer_ids(parse_view(sql, SOCIAL).root, SOCIAL)
    (join,) = [n for n in A.walk(root) if isinstance(n, A.Join)]
    assert not infos[join.nid].multivalued
    roles = {m.role for m in idivm.plan(sql, SOCIAL, name="s").materialized}
    assert "cache: input of γ" in roles


def test_any_all_become_semi_and_antijoins() -> None:
    p = idivm.plan("SELECT c.name FROM customers c WHERE c.custkey >= ALL "
                   "(SELECT o.qty FROM orders o WHERE o.custkey = c.custkey) "
                   "AND c.custkey < ANY (SELECT o.qty FROM orders o)", ORDERS)
    kinds = {type(n) for n in A.walk(p.root)}
    assert {A.SemiJoin, A.AntiJoin} <= kinds


def test_count_distinct_is_two_phase() -> None:
    p = idivm.plan("SELECT o.custkey, count(DISTINCT o.qty) AS n, count(*) AS m "
                   "FROM orders o GROUP BY o.custkey", ORDERS)
    outer, inner = [n for n in A.walk(p.root) if isinstance(n, A.Aggregate)][::-1]
    assert len(inner.group_by) == 2 and len(outer.group_by) == 1
    assert {a.func for a in outer.aggs} == {"count", "sum"}  # count(*) summed from partials


def _diff(kind: str, ids: tuple[str, ...], pre: tuple[str, ...] = (),
          post: tuple[str, ...] = ()) -> DiffNode:
    return DiffNode("d9", DiffSchema(kind, 1, ids, pre, post),  # type: ignore[arg-type]
                    exp.select("1"), "test", (), "")


def test_figure8_rewrites() -> None:
    scan = A.Scan(1, "parts", "p", ("p__pid", "p__price"), ("pid", "price"))
    ins = minimize.c1_insert("post", scan, _diff("ins", ("p__pid",)))
    assert ins is not None and ins.sql() == 'SELECT "z"."p__pid" AS "p__pid", ' \
        '"z"."p__price" AS "p__price" FROM "d9" AS "z"'
    assert minimize.c3_full_update("post", scan, _diff("upd", ("p__pid",), ("p__price",),
                                                       ("p__price",))) is not None
    assert minimize.c3_full_update("post", scan, _diff("upd", ("p__pid",), (), ())) is None
    empty = minimize.c2_base_delete("post", scan, _diff("del", ("p__pid",)))
    assert empty is not None and "FALSE" in empty.sql()
    assert minimize.pre_images("pre", scan, _diff("del", ("p__pid",), ("p__price",))) is not None


def test_merge_subquery_composes_two_queries() -> None:
    q = sqlglot.parse_one('SELECT "i"."a" + 1 AS "b" FROM (SELECT "j"."x" AS "a" FROM "d1" AS '
                          '"j" WHERE "j"."x" > 0) AS "i" WHERE "i"."a" < 5')
    out = minimize.merge_subquery(q).sql()
    assert out == ('SELECT "j"."x" + 1 AS "b" FROM "d1" AS "j" WHERE "j"."x" > 0 '
                   'AND "j"."x" < 5')


def test_explain_mentions_every_pass() -> None:
    text = idivm.plan("SELECT did, avg(price) AS a FROM parts NATURAL JOIN devices_parts "
                      "GROUP BY did HAVING count(*) > 1", PAPER, name="x").explain()
    for part in ("IDs=", "base-table i-diff schemas", "rules fired", "Δ-script", "cache"):
        assert part in text


def test_spark_dialect_view_is_accepted() -> None:
    sql = ("SELECT `did`, SUM(price) AS cost FROM parts NATURAL JOIN devices_parts "
           "NATURAL JOIN devices WHERE category = 'phone' GROUP BY did")
    p = idivm.plan(sql, PAPER, name="v", dialect="spark")
    assert p.columns == ("did", "cost")
    assert any(s.startswith("MERGE INTO `v__store`") for s in p.script("spark"))


def test_table9_sums_an_update_straight_from_its_idiff() -> None:
    """V′ under price updates: Table 9's Σ(post − pre) over the Δu joined to γ's input cache
    on its IDs — no before/after snapshot of the cache's touched rows. Planned for every
    change type, the snapshots cover the other i-diffs and leave the price Δu out."""
    from idivm.examples import V_PRIME_SQL
    from idivm.script import Compute, reads

    prices = idivm.plan(V_PRIME_SQL, PAPER, name="vp", changes={"parts": ["update:price"]})
    assert not [s for s in prices.statements if isinstance(s, Compute)
                and s.phase == "snapshot"]
    (cache,) = [m for m in prices.materialized if m.role == "cache: input of γ"]
    (direct,) = prices.composition.direct[cache.nid]
    delta = [s for s in prices.statements if isinstance(s, Compute) and cache.name in reads(s)]
    assert len(delta) == 1 and direct in reads(delta[0])  # the i-diff ⋈ the cache, once

    every = idivm.plan(V_PRIME_SQL, PAPER, name="vp")
    (cache,) = [m for m in every.materialized if m.role == "cache: input of γ"]
    (direct,) = every.composition.direct[cache.nid]
    snaps = [s for s in every.statements if isinstance(s, Compute) and s.phase == "snapshot"]
    old = [s for s in snaps if s.name == f"{cache.name}__old"]
    # the snapshot before reads the cache by the other i-diffs only (the one after replays
    # every APPLY on those rows)
    assert len(snaps) == 2 and len(old) == 1 and direct not in reads(old[0])
    assert len(reads(old[0])) == len(every.dag.by_node[cache.nid])  # the cache and the rest


def test_a_cache_of_a_groupings_output_takes_its_snapshots_from_the_exact_idiffs() -> None:
    """γ's per-group Δ+, Δ-, Δu read Output: each names a group that is there (Δ-, Δu, with
    all of its values before) or is not (Δ+), so the snapshots of the cache of γ's output
    are those i-diffs' pre- and post-images — the cache is not read for them (a grouping of
    counts per user, counted again per count: TPC-H Q13's shape)."""
    from idivm.script import Compute, reads

    p = idivm.plan("SELECT n, count(*) AS users FROM (SELECT uid, count(*) AS n FROM microblog "
                   "GROUP BY uid) AS c GROUP BY n", SOCIAL, name="h")
    (cache,) = [m for m in p.materialized if m.role == "cache: output of γ"]
    snaps = {s.name: s for s in p.statements if isinstance(s, Compute) and s.phase == "snapshot"}
    assert set(snaps) == {f"{cache.name}__old", f"{cache.name}__new"}
    diffs = {d.name for d in p.dag.by_node[cache.nid]}
    assert all(d.exact for d in p.dag.by_node[cache.nid])
    for s in snaps.values():
        assert cache.name not in reads(s) and set(reads(s)) <= diffs


def test_table9_leaves_group_and_min_max_attributes_to_the_snapshots() -> None:
    """An update of a group attribute or of a MIN/MAX argument moves rows between groups or
    needs the group recomputed: those Δu keep the snapshots."""
    group = idivm.plan("SELECT price, count(*) AS n FROM parts NATURAL JOIN devices_parts "
                       "GROUP BY price", PAPER, name="g", changes={"parts": ["update:price"]})
    mx = idivm.plan("SELECT did, max(price) AS m FROM parts NATURAL JOIN devices_parts "
                    "GROUP BY did", PAPER, name="m", changes={"parts": ["update:price"]})
    for p in (group, mx):
        assert not p.composition.direct
        assert [s for s in p.statements if getattr(s, "phase", None) == "snapshot"]


# fuzz seed 13811: a CTE read three times (IN, and EXISTS over a FULL JOIN); its i-diffs
# propagated apart instantiated 2,056 rules — a 1,007-statement script, minutes to compile
SEED13811_DDL = (
    "CREATE TABLE t0 (k0 text NOT NULL, c0 boolean, c1 text NOT NULL, c2 int NOT NULL, "
    "PRIMARY KEY (k0)); CREATE TABLE t1 (k0 int NOT NULL, k1 int NOT NULL, c0 double precision"
    " NOT NULL, c1 numeric(8,2) NOT NULL, c2 date NOT NULL, c3 int NOT NULL, "
    "PRIMARY KEY (k0, k1)); CREATE TABLE t2 (k0 int NOT NULL, c0 text, c1 bigint, "
    "c2 numeric(8,2), c3 int NOT NULL, PRIMARY KEY (k0)); CREATE TABLE t3 (k0 int NOT NULL, "
    "c0 int, c1 date NOT NULL, c2 double precision, PRIMARY KEY (k0), "
    "FOREIGN KEY (c0) REFERENCES t2 (k0));")
SEED13811_VIEW = (
    "WITH w1 AS (SELECT (SELECT SUM(a10.c2) FROM t3 AS a8, t1 AS a9, t0 AS a10 "
    "WHERE a8.k0 = a9.c3 AND a9.k0 IS NOT NULL AND a8.k0 = a10.c2 AND a8.c2 = d2.c1) AS c0 "
    "FROM (SELECT a3.k0 AS c0, a4.c0 + 1 AS c1 FROM t0 AS a3, t1 AS a4 WHERE a3.c2 = a4.k0) "
    "AS d2 WHERE NOT EXISTS (SELECT 1 FROM t1 AS a5 RIGHT JOIN t0 AS a6 ON a5.k0 = a6.c2 "
    "JOIN t3 AS a7 ON a5.c3 = a7.c0 WHERE a6.k0 = d2.c0)) SELECT a11.c0 + 1 AS c0 "
    "FROM w1 AS a11 WHERE a11.c0 IN (SELECT a12.c0 FROM w1 AS a12 WHERE a12.c0 = a11.c0) "
    "AND EXISTS (SELECT 1 FROM w1 AS a13 FULL JOIN t3 AS a14 ON a13.c0 = a14.c2 "
    "WHERE a13.c0 = a11.c0)")


def test_unmerged_plan_falls_back_to_merged_past_the_rule_budget():
    """``merge=False`` (PostgreSQL's choice) is kept while the rules stay within
    ``plan.UNMERGED_RULES``; past it the i-diffs merge, as ``merge=True`` plans them."""
    from idivm.bench.tpch import TPCH_DDL, as_view, queries

    planning = sys.modules["idivm.plan"]  # the module: ``idivm.plan`` is the function
    catalog = idivm.Catalog.from_ddl(SEED13811_DDL)
    apart = planning.plan(SEED13811_VIEW, catalog, merge=False)
    assert len(apart.dag.diffs) <= planning.UNMERGED_RULES
    assert len(apart.statements) < 300
    q8 = planning.plan(as_view(queries()[8]), idivm.Catalog.from_ddl(TPCH_DDL), merge=False)
    merged = planning.plan(as_view(queries()[8]), idivm.Catalog.from_ddl(TPCH_DDL), merge=True)
    assert len(q8.dag.diffs) > len(merged.dag.diffs)  # TPC-H's largest stays apart
