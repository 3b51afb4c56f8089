"""Semijoin l ⋉_φ r, tuple-based: changes of l pass (Δ+ re-probes r_post); a change of r
deletes the full pre-image of every l row it may flip (from l_pre) and inserts the touched l
rows that qualify now."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from idivm import algebra as A
from idivm.errors import IdivmError
from idivm.planner.model import DiffNode, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, exists, select

from .. import semijoin as id_semi


def check(d: DiffNode, name: str) -> None:
    if d.schema.kind not in ("ins", "del"):
        raise IdivmError(f"tuple-based {name} got a {d.schema.describe()}: t-diffs are Δ+ and "
                         "Δ- only")


def left_change(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode, negate: bool,
                name: str) -> list[DiffNode]:
    """Changes of l: a Δ+ re-probes r_post; a Δ- is a change of the output only for the l
    rows that were in it — those whose pre-image passed the probe against r_pre (a t-diff
    counts: an aggregate above decrements its group for every Δ- row)."""
    s = d.schema
    if s.kind == "ins":
        return id_semi.left_side(ctx, node, d, negate, name)
    vals: dict[str, exp.Expr | None] = {k: ctx.pre_val(d, k, "i") for k in node.left.columns}
    vals.update({k: c(k, "o") for k in node.right.columns})
    bound = ctx.bind(node.predicate, vals)
    assert bound is not None, "a t-diff Δ- carries the full pre-image"
    cond: exp.Expr = exists(ctx.state("pre", node.right.nid, "o"), bound)
    if negate:
        cond = exp.Not(this=cond)
    cols = s.columns(ctx.cols(s.nid))
    q = select([(k, c(k, "i")) for k in cols], ctx.rel(d, "i"), cond)
    return [ctx.emit("del", node.nid, s.ids, q,
                     f"t-diff {name}: Δ-_l of the rows in the output (probed against r_pre)",
                     [d], s.pre, s.post)]


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
        return left_change(ctx, node, d, False, "⋉")
    # a new r row only adds l rows; a deleted one may remove some (others still qualify)
    gone = d.schema.kind == "del"
    return right_change(ctx, node, d, False, "⋉", delete=gone, insert=True)


RULE = OperatorRule(op=A.SemiJoin, paper="classical (tuple-based)", infer=id_semi.infer,
                    propagate=propagate, conditions=id_semi.RULE.conditions)
