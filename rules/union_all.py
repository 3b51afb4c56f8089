"""Bag union with branch attribute b: Table 1 (ID(l) ∪ ID(r) ∪ {b}) and Table 5."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo, post_name, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select, subquery, union_all
from idivm.planner.typing_ import common_type
from idivm.render import Renderer


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.UnionAll)
    li, ri = infos
    node = dataclasses.replace(node, left_ids=li.carry, right_ids=ri.carry)
    lmap, rmap = _maps(node)
    lineage = {n: li.lineage.get(lc, frozenset()) | ri.lineage.get(rc, frozenset())
               for n, lc, rc in zip(node.names, node.left_cols, node.right_cols, strict=True)}
    nullable = {n: li.nullable.get(lc, True) or ri.nullable.get(rc, True)
                for n, lc, rc in zip(node.names, node.left_cols, node.right_cols, strict=True)}
    # a positional column's type as PostgreSQL resolves the two branches', where certain: an
    # ID the branch below carries from it pads the other branch with a NULL of that type
    # (fuzz seed 57008: a DISTINCT branch over a union of two integers, its ID an untyped
    # NULL in the other branch's Δ+, which a CTE made text)
    types: dict[str, str | None] = {
        n: common_type([li.types.get(lc), ri.types.get(rc)])
        for n, lc, rc in zip(node.names, node.left_cols, node.right_cols, strict=True)}
    for branch, info, m in ((0, li, lmap), (1, ri, rmap)):
        for x in (li.carry if branch == 0 else ri.carry):
            lineage[m[x]] = info.lineage.get(x, frozenset())
            nullable[m[x]] = True
            types[m[x]] = info.types.get(x)
    lineage[A.BRANCH] = frozenset()
    nullable[A.BRANCH] = False
    types[A.BRANCH] = "INT"
    ids = (A.BRANCH,) + tuple(lmap[x] for x in li.ids) + tuple(rmap[x] for x in ri.ids)
    scan_ids = {k: tuple(lmap[x] for x in v) for k, v in li.scan_ids.items()}
    scan_ids |= {k: tuple(rmap[x] for x in v) for k, v in ri.scan_ids.items()}
    carry = (A.BRANCH,) + tuple(lmap[x] for x in li.carry) + tuple(rmap[x] for x in ri.carry)
    return node, NodeInfo(ids=ids, scan_ids=scan_ids, equiv=(), fds=(), lineage=lineage,
                          nullable=nullable, carry=carry,
                          multivalued=li.multivalued or ri.multivalued, types=types)


def _maps(node: A.UnionAll) -> tuple[dict[str, str], dict[str, str]]:
    """Branch column → union column: positional columns, then the carried IDs."""
    lmap = dict(zip(node.left_cols, node.names, strict=True))
    rmap = dict(zip(node.right_cols, node.names, strict=True))
    lmap.update({x: node.carry(0, x) for x in node.left_ids})
    rmap.update({x: node.carry(1, x) for x in node.right_ids})
    return lmap, rmap


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.UnionAll)
    s, nid = d.schema, node.nid
    cols = node.left_cols if idx == 0 else node.right_cols
    pos = dict(zip(cols, node.names, strict=True))  # branch column → positional union column
    own = node.left_ids if idx == 0 else node.right_ids
    carried = {x: node.carry(idx, x) for x in own}  # branch column → its carried ID column
    b = (A.BRANCH, exp.Literal.number(idx))
    info = ctx.info(nid)
    items: list[tuple[str, exp.Expr]]
    if s.kind == "ins":
        vals: dict[str, exp.Expr] = {n: c(x, "i") for x, n in pos.items()}
        vals |= {n: c(x, "i") for x, n in carried.items()}
        items = []
        for k in node.columns:
            if k == A.BRANCH:
                items.append(b)
            elif k in vals:
                items.append((k, vals[k]))
            else:  # the other branch's carried IDs are NULL (typed, so the insert matches)
                ty = info.types.get(k)
                null: exp.Expr = exp.null()
                if ty:
                    null = exp.cast(null, exp.DataType.build(ty, dialect="postgres"))
                items.append((k, null))
        q = select(items, ctx.rel(d, "i"))
        return [ctx.emit("ins", nid, info.ids, q, "Table 5 ∪: Δ+ tagged with b", [d])]
    ids = (A.BRANCH,) + tuple(carried[x] for x in s.ids)
    items = [b] + [(carried[x], c(x, "i")) for x in s.ids]
    pre = [x for x in s.pre if x in pos]
    items += [(pre_name(pos[x]), c(pre_name(x), "i")) for x in pre]
    post = [x for x in s.post if x in pos]
    if s.kind == "upd":
        if not post:
            return []
        items += [(post_name(pos[x]), c(post_name(x), "i")) for x in post]
    q = select(items, ctx.rel(d, "i"))
    return [ctx.emit(s.kind, nid, ids, q, f"Table 5 ∪: {s.kind} tagged with b", [d],
                     [pos[x] for x in pre], [pos[x] for x in post])]


def render(r: Renderer, node: A.Node) -> exp.Select:
    """UNION ALL of the branches, each with its branch number b and the carried IDs of both
    branches (the other branch's as typed NULLs)."""
    assert isinstance(node, A.UnionAll)
    branches = []
    for b, child, cols in ((0, node.left, node.left_cols), (1, node.right, node.right_cols)):
        src, a = r.rel(child)
        items: list[tuple[str, exp.Expr]] = [
            (n, c(x, a)) for n, x in zip(node.names, cols, strict=True)]
        items.append((A.BRANCH, exp.Literal.number(b)))
        for bb, ids in ((0, node.left_ids), (1, node.right_ids)):
            for x in ids:
                name = node.carry(bb, x)
                if bb == b:
                    items.append((name, c(x, a)))
                else:
                    ty = r.types(name)
                    null: exp.Expr = exp.null()
                    if ty:
                        null = exp.cast(null, exp.DataType.build(ty, dialect="postgres"))
                    items.append((name, null))
        branches.append(select(items, src))
    a = r.alias()
    return select([(k, c(k, a)) for k in node.columns], subquery(union_all(branches), a))


RULE = OperatorRule(op=A.UnionAll, paper="Table 5", infer=infer, propagate=propagate,
                    render=render, combines=True,
                    fresh_refusal=("UNION", "set operations are not maintained by fresh views"))
