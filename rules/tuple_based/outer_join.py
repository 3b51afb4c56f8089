"""Outer join ⟕_φ / ⟗_φ, tuple-based: every change re-derives the preserved rows it may touch
(as the ID-based rule's general case), as full tuples: Δ- = the outer join's pre-state rows with
those IDs, Δ+ = its post-state rows with those IDs."""

from __future__ import annotations

from idivm import algebra as A
from idivm.errors import IdivmError
from idivm.planner.model import DiffNode, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select

from .. import outer_join as id_outer


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.OuterJoin)
    if d.schema.kind not in ("ins", "del"):
        raise IdivmError(f"tuple-based ⟕ got a {d.schema.describe()}: t-diffs are Δ+ and Δ- "
                         "only")
    ids = ctx.info(node.nid).ids
    out: list[DiffNode] = []
    for named in id_outer.touched(ctx, node, idx, d):
        q = select([(k, c(k, "f")) for k in ids] + [
            (pre_name(k), c(k, "f")) for k in node.columns if k not in ids],
            ctx.fetch("pre", node.nid, named, "f"))
        out.append(ctx.emit("del", node.nid, ids, q, "t-diff ⟕: Δ- = Input_pre ⋉_IDs the "
                            "touched rows (full tuples)", [named],
                            [k for k in node.columns if k not in ids]))
        out.append(id_outer.rederive(ctx, node, named, "t-diff ⟕: Δ+ = Input_post ⋉_IDs the "
                                     "touched rows"))
    return out


RULE = OperatorRule(op=A.OuterJoin, paper="classical (tuple-based)", infer=id_outer.infer,
                    propagate=propagate, conditions=id_outer.RULE.conditions)
