"""Semijoin l ⋉_φ r, tuple-based: changes of l pass (Δ+ re-probes r_post); a change of r
deletes the full pre-image of every l row it may flip (from l_pre) and inserts the touched l
rows that qualify now."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from idivm import algebra as A
from idivm.errors import IdivmError
from idivm.planner.model import DiffNode, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select

from .. import semijoin as id_semi


def check(d: DiffNode, name: str) -> None:
    if d.schema.kind not in ("ins", "del"):
        raise IdivmError(f"tuple-based {name} got a {d.schema.describe()}: t-diffs are Δ+ and "
                         "Δ- only")


def right_change(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode,
                 negate: bool, name: str, delete: bool, insert: bool) -> list[DiffNode]:
    """For the l rows φ-joining a changed r row (its pre- or post-image): (``delete``) Δ- of
    the full pre-images of those in the output before, (``insert``) Δ+ of those, post-state,
    that qualify now."""
    nid = node.nid
    ids = ctx.info(nid).ids
    which: Sequence[str] = ["pre"] if d.schema.kind == "del" else ["post"]
    touched = id_semi.affected_left(ctx, node, d, which)
    lpre = ctx.state("pre", node.left.nid, "l")
    cond_pre: exp.Expr = id_semi.probe(ctx, node, "l", ctx.state("pre", node.right.nid, "o"),
                                       {k: c(k, "o") for k in node.right.columns})
    if negate:
        cond_pre = exp.Not(this=cond_pre)
    rest = [k for k in node.columns if k not in ids]
    out = [] if not delete else [ctx.emit("del", nid, ids, select(
        [(k, c(k, "l")) for k in ids] + [(pre_name(k), c(k, "l")) for k in rest], lpre,
        exp.and_(touched, cond_pre)),
        f"t-diff {name}: Δ- = the full l_pre rows in the output that Δ_r touches", [d], rest)]
    if insert:
        lpost = ctx.state("post", node.left.nid, "l")
        cond: exp.Expr = id_semi.probe(ctx, node, "l", *id_semi.right_state(ctx, node, "o"))
        if negate:
            cond = exp.Not(this=cond)
        out.append(ctx.emit("ins", nid, ids, select(
            [(k, c(k, "l")) for k in node.columns], lpost, exp.and_(touched.copy(), cond)),
            f"t-diff {name}: Δ+ = the touched l_post rows that qualify now", [d]))
    return out


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.SemiJoin)
    check(d, "⋉")
    if idx == 0:
        return id_semi.left_side(ctx, node, d, False, "⋉")
    # a new r row only adds l rows; a deleted one may remove some (others still qualify)
    gone = d.schema.kind == "del"
    return right_change(ctx, node, d, False, "⋉", delete=gone, insert=True)


RULE = OperatorRule(op=A.SemiJoin, paper="classical (tuple-based)", infer=id_semi.infer,
                    propagate=propagate, conditions=id_semi.RULE.conditions)
