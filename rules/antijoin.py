"""Antisemijoin l ▷_φ r (NOT EXISTS, NOT IN, EXCEPT): Table 1 (ID(l)) and Table 13."""

from __future__ import annotations

from idivm import algebra as A
from idivm.planner.model import DiffNode
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select

from .semijoin import RULE as SEMI
from .semijoin import affected_left, infer, left_side, recompute, render


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.AntiJoin)
    if idx == 0:
        return left_side(ctx, node, d, True, "▷")
    s = d.schema
    y = A.referenced(node.predicate) & set(node.right.columns)
    if s.kind == "upd" and not y & set(s.post):
        return []  # r's update leaves φ alone: not triggered
    if s.kind == "ins":  # new r rows can only remove l rows
        ids = ctx.info(node.nid).ids
        q = select([(k, c(k, "l")) for k in ids], ctx.state("post", node.left.nid, "l"),
                   affected_left(ctx, node, d, ["post"]), distinct=True)
        return [ctx.emit("del", node.nid, ids, q,
                         "Table 13 ▷: Δ- = π_I(Input_l_post ⋉_φ Δ+_r)", [d])]
    return recompute(ctx, node, d, ["pre"] if s.kind == "del" else ["pre", "post"], True, "▷")


RULE = OperatorRule(op=A.AntiJoin, paper="Table 13", infer=infer, propagate=propagate,
                    conditions=lambda n: A.referenced(n.predicate),  # type: ignore[attr-defined]
                    render=render, combines=True, fresh=SEMI.fresh,
                    restrict=SEMI.restrict)
