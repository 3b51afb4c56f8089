"""Antisemijoin l ▷_φ r, tuple-based: changes of l pass; a new r row deletes the full
pre-images of the l rows it now matches; a deleted r row deletes and re-inserts the l rows it
touched, as they qualify now."""

from __future__ import annotations

from idivm import algebra as A
from idivm.planner.model import DiffNode
from idivm.planner.ruleapi import OperatorRule, RuleContext

from .. import antijoin as id_anti
from .semijoin import check, left_change, right_change


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.AntiJoin)
    check(d, "▷")
    if idx == 0:
        return left_change(ctx, node, d, True, "▷")
    # a new r row only removes l rows; a deleted one only lets l rows in
    gone = d.schema.kind == "del"
    return right_change(ctx, node, d, True, "▷", delete=not gone, insert=gone)


RULE = OperatorRule(op=A.AntiJoin, paper="classical (tuple-based)", infer=id_anti.RULE.infer,
                    propagate=propagate, conditions=id_anti.RULE.conditions)
