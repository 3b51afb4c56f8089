"""Antisemijoin l ▷_φ r, tuple-based: changes of l pass; a new r row deletes the full
pre-images of the l rows it gives their first match; a deleted r row inserts the l rows it
touched that now match nothing (``semijoin.right_change``, the flips of the probe)."""

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
    return right_change(ctx, node, d, True, "▷")


RULE = OperatorRule(op=A.AntiJoin, paper="classical (tuple-based)", infer=id_anti.RULE.infer,
                    propagate=propagate, conditions=id_anti.RULE.conditions)
