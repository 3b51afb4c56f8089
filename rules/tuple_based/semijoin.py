"""Semijoin l ⋉_φ r, tuple-based: changes of l pass (Δ+ re-probes r_post, Δ- r_pre); a change
of r moves exactly the l rows whose probe it flips: a Δ+_r inserts the touched l rows that
matched no r_pre row, a Δ-_r deletes the touched l rows that match no r_post row."""

from __future__ import annotations

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
                 negate: bool, name: str) -> list[DiffNode]:
    """The l rows a change of r flips: those whose probe goes from no match to some (a Δ+_r
    touches them, and they matched no r_pre row) or from some match to none (a Δ-_r touches
    them, and they match no r_post row). ⋉ inserts the first and deletes the second; ▷ the
    other way round. A t-diff counts, so an l row that keeps a match (one more, one fewer, or
    the right side's projection repeating a value) must not move at all.

    Only l rows that are the same before and after are flipped here: an l row that changed
    is a Δ-_l of its old tuple and a Δ+_l of its new one, which ``left_change`` decides
    against r_pre and r_post; what this rule says of it is a subset of that (the same tuples,
    which the consumers of a t-diff merge as a set)."""
    nid = node.nid
    ids = ctx.info(nid).ids
    gained = d.schema.kind == "ins"  # r rows added: l rows may gain their first match
    touched = id_semi.affected_left(ctx, node, d, ["post" if gained else "pre"])
    before = "pre" if gained else "post"  # the other state, where the flipped rows match nothing
    other = id_semi.probe(ctx, node, "l", ctx.state(before, node.right.nid, "o"),
                          {k: c(k, "o") for k in node.right.columns})
    where = exp.and_(touched, exp.Not(this=other))
    comes_in = gained != negate  # ⋉ gaining, ▷ losing a match: post-state rows come in
    src = ctx.state("post" if comes_in else "pre", node.left.nid, "l")
    if comes_in:
        return [ctx.emit("ins", nid, ids, select([(k, c(k, "l")) for k in node.columns], src,
                                                 where),
                         f"t-diff {name}: Δ+ = the l rows Δ_r flips into the output", [d])]
    rest = [k for k in node.columns if k not in ids]
    return [ctx.emit("del", nid, ids, select(
        [(k, c(k, "l")) for k in ids] + [(pre_name(k), c(k, "l")) for k in rest], src, where),
        f"t-diff {name}: Δ- = the full l rows Δ_r flips out of the output", [d], rest)]


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.SemiJoin)
    check(d, "⋉")
    if idx == 0:
        return left_change(ctx, node, d, False, "⋉")
    return right_change(ctx, node, d, False, "⋉")


RULE = OperatorRule(op=A.SemiJoin, paper="classical (tuple-based)", infer=id_semi.infer,
                    propagate=propagate, conditions=id_semi.RULE.conditions)
