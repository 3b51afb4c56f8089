"""Pass 2: instantiate each operator's rules for every base-table i-diff schema (§4).

Starting from each base-table i-diff at every scan of its table, a bottom-up walk applies the
operators' rules; an operator may emit several i-diffs for one input (e.g. σ turns an update into
Δu, Δ- and Δ+), and blocking operators combine all their inputs, so the result is a DAG.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import (
    BaseSchema,
    DiffNode,
    DiffSchema,
    NodeInfo,
    Strategy,
    change_table,
    post_name,
    pre_name,
)
from idivm.planner.ruleapi import RuleContext, c, select, subquery, t
from idivm.rules import rule_for


@dataclass(frozen=True)
class RuleDag:
    diffs: Mapping[str, DiffNode]  # every instantiated rule, in creation (topological) order
    base: tuple[DiffNode, ...]  # the base-table i-diffs (§5 instances)
    by_node: Mapping[int, tuple[DiffNode, ...]]  # the i-diffs each operator outputs
    root: int
    # operator → its i-diffs the rule above reads straight, outside the snapshots of its cache
    direct: Mapping[int, frozenset[str]] = field(default_factory=dict)


def base_query(schema: BaseSchema, catalog: Catalog) -> tuple[DiffSchema, exp.Select]:
    """§5 instance generator: the effective changes of a table as one i-diff schema."""
    table = catalog.table(schema.table)
    key, nonkey = table.primary_key, table.non_key_columns
    src = t(change_table(table.name), "g")
    has_pre, has_post = c("__has_pre", "g"), c("__has_post", "g")
    keys = [(k, c(k, "g")) for k in key]
    pre = [(pre_name(x), c(pre_name(x), "g")) for x in nonkey]
    if schema.tuple_based:  # t-diff: an update of ``cols`` is a delete and an insert
        moved = exp.or_(*[exp.NullSafeNEQ(this=c(pre_name(x), "g"),
                                          expression=c(post_name(x), "g"))
                          for x in schema.cols]) if schema.cols else exp.false()
        if schema.kind == "ins":
            q = select(keys + [(x, c(post_name(x), "g")) for x in nonkey], src, exp.and_(
                has_post, exp.paren(exp.or_(exp.Not(this=has_pre), exp.and_(has_pre, moved)))))
            return DiffSchema("ins", -1, key), q
        q = select(keys + pre, src, exp.and_(has_pre, exp.paren(exp.or_(
            exp.Not(this=has_post), exp.and_(has_post, moved)))))
        return DiffSchema("del", -1, key, nonkey), q
    if schema.kind == "ins":
        q = select(keys + [(x, c(post_name(x), "g")) for x in nonkey], src,
                   exp.and_(has_post, exp.Not(this=has_pre)))
        return DiffSchema("ins", -1, key), q
    if schema.kind == "del":
        q = select(keys + pre, src, exp.and_(has_pre, exp.Not(this=has_post)))
        return DiffSchema("del", -1, key, nonkey), q
    changed = exp.or_(*[exp.NullSafeNEQ(this=c(pre_name(x), "g"), expression=c(post_name(x), "g"))
                        for x in schema.cols])
    q = select(keys + pre + [(post_name(x), c(post_name(x), "g")) for x in schema.cols], src,
               exp.and_(has_pre, has_post, changed))
    return DiffSchema("upd", -1, key, nonkey, schema.cols), q


def merge_alike(ctx: RuleContext, node: A.Node, outs: Sequence[DiffNode],
                origin: Callable[[DiffNode], int | None]) -> tuple[DiffNode, ...]:
    """One i-diff per Δ+ (Δ-) schema of an operator: the Δ+ i-diffs an operator outputs for
    different base-table i-diffs (an insert, an update entering σ, a join-attribute update)
    have one schema and propagate through every operator above by the same rules, so their
    union propagates once (every rule is linear in a Δ+ or Δ- input), instead of once per
    base-table i-diff schema. Rows are unique by the operator's IDs, so the union drops
    only copies (the same new row reached from two changes).

    A join keeps apart the i-diffs that come from different scans (``origin``): each then
    reaches the next cache as one flat join of its scan's i-diff with the other relations,
    where a union per join would nest every join below it."""
    groups: dict[tuple[DiffSchema, int | None], list[DiffNode]] = {}

    def key(o: DiffNode) -> tuple[DiffSchema, int | None]:
        return o.schema, origin(o) if len(node.children) > 1 else None

    for o in outs:
        if o.schema.kind in ("ins", "del"):
            groups.setdefault(key(o), []).append(o)
    out: list[DiffNode] = []
    for o in outs:
        same = groups.get(key(o), [o])
        if len(same) == 1:
            out.append(o)
        elif o is same[0]:
            cols = o.schema.columns(node.columns)
            u: exp.Expr = select([(x, c(x, "i")) for x in cols], ctx.rel(same[0], "i"))
            for d in same[1:]:
                u = exp.union(u, select([(x, c(x, "i")) for x in cols], ctx.rel(d, "i")),
                              distinct=True, copy=False)
            q = select([(x, c(x, "u")) for x in cols], subquery(u, "u"))
            out.append(ctx.emit(o.schema.kind, o.schema.nid, o.schema.ids, q,
                                "∪: the i-diffs of one schema merged (their union)", same,
                                o.schema.pre,
                                o.schema.post))
    return tuple(out)


def instantiate(root: A.Node, infos: Mapping[int, NodeInfo], schemas: Sequence[BaseSchema],
                catalog: Catalog, strategy: Strategy = "id", merge: bool = True) -> RuleDag:
    """The rule DAG; ``merge``: an operator's Δ+ (Δ-) i-diffs of one schema merged into one
    (``merge_alike``), else each propagates apart."""
    nodes = {n.nid: n for n in A.walk(root)}
    parent: dict[int, tuple[A.Node, int]] = {}
    for n in nodes.values():
        for i, ch in enumerate(n.children):
            parent[ch.nid] = (n, i)
    ctx = RuleContext(nodes, infos)
    incoming: dict[int, list[tuple[int, DiffNode]]] = {nid: [] for nid in nodes}
    base = []
    for bs in schemas:
        schema, q = base_query(bs, catalog)
        d = ctx.base(schema, q, f"§5 instance generator: {schema.describe()} of {bs.table}"
                     f" ({bs.reason})", bs.name)
        base.append(d)
        for s in A.scans(root):
            if s.table == bs.table:
                incoming[s.nid].append((0, d))
    by_node: dict[int, tuple[DiffNode, ...]] = {}
    origins: dict[str, int | None] = {}

    def origin(d: DiffNode) -> int | None:
        """The scan an i-diff descends from (None: several)."""
        if d.name not in origins:
            if isinstance(nodes.get(d.schema.nid), A.Scan):
                origins[d.name] = d.schema.nid
            else:
                found = {origin(ctx.diffs[i]) for i in d.inputs if i in ctx.diffs}
                origins[d.name] = found.pop() if len(found) == 1 else None
        return origins[d.name]

    for n in A.walk(root):
        rule = rule_for(n, strategy)
        outs: list[DiffNode] = []
        if rule.propagate_all is not None:
            if incoming[n.nid]:
                outs = rule.propagate_all(ctx, n, incoming[n.nid])
        else:
            assert rule.propagate is not None
            for idx, d in incoming[n.nid]:
                outs += rule.propagate(ctx, n, idx, d)
        mine = [o for o in outs if o.schema.nid == n.nid]
        by_node[n.nid] = merge_alike(ctx, n, mine, origin) if merge else tuple(mine)
        if n.nid in parent:
            p, i = parent[n.nid]
            incoming[p.nid] += [(i, o) for o in by_node[n.nid]]
    return RuleDag(dict(ctx.diffs), tuple(base), by_node, root.nid, dict(ctx.direct))
