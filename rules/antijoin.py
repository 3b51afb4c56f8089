"""Antisemijoin l ▷_φ r (NOT EXISTS, NOT IN, EXCEPT): Table 1 (ID(l)) and Table 13."""

from __future__ import annotations

from sqlglot import exp

from idivm import algebra as A
from idivm.planner.model import DiffNode
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select

from .semijoin import RULE as SEMI
from .semijoin import affected_left, infer, left_side, recompute, render, unmatched_now


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.AntiJoin)
    if idx == 0:
        return left_side(ctx, node, d, True, "▷")
    s = d.schema
    y = A.referenced(node.predicate) & set(node.right.columns)
    if s.kind == "upd" and not y & set(s.post):
        return []  # r's update leaves φ alone: not triggered
    if s.kind == "ins":  # new r rows can only remove l rows
        return [leaving(ctx, node, d)]
    if s.kind == "del":  # old r rows gone can only add l rows
        return [entering(ctx, node, d)]
    # Δu_r on φ's attributes: its new values name the l rows leaving only where they are an r
    # row's (an i-diff may name rows it leaves alone: a Δu by l's IDs through a ⋈ names l rows
    # that join nothing) — the touched rows are deleted and the qualifying ones put back
    return recompute(ctx, node, d, ["pre", "post"], True, "▷")


def leaving(ctx: RuleContext, node: A.AntiJoin, d: DiffNode) -> DiffNode:
    """Δ+_r's Δ- = π_I(Input_l_post ⋉_φ Δ+_r): the l rows a new r row matches leave the
    output, or were not in it (a Δ- of an absent row deletes nothing)."""
    named = named_by_right(ctx, node, d)
    if named is not None:
        return named
    ids = ctx.info(node.nid).ids
    q = select([(k, c(k, "l")) for k in ids], ctx.state("post", node.left.nid, "l"),
               affected_left(ctx, node, d, ["post"]), distinct=True)
    return ctx.emit("del", node.nid, ids, q, "Table 13 ▷: Δ- = π_I(Input_l_post ⋉_φ Δ+_r)", [d])


def entering(ctx: RuleContext, node: A.AntiJoin, d: DiffNode) -> DiffNode:
    """Δ-_r's Δ+ = (Input_l_post ⋉_φ Δ-_r) ▷_φ Input_r_post: the l rows a gone r row matched
    that no r row matches now — with no Δ- of the rows it touches first (``recompute``'s), as
    a row it touches was not in the output before. A touched row whose φ attributes kept their
    values matched that r row before it went, so was left out; one whose φ attributes changed,
    or that is new, left or comes through Δu_l on φ's attributes / Δ-_l / Δ+_l (the left
    side's rules: a Δ- by its IDs, a re-probe); one that stays out now because another r row
    matches it was either left out before too (that row is old) or is deleted by the rule of
    the new or changed r row. So the Δ+ names the rows entering the output, or rows already in
    it (a gone r row an i-diff overestimates: Δ+ of a row present is an upsert by IDs, as two
    Δ+ of one row from the two sides are); a Δ- would delete nothing the output holds — but
    cost a statement per level up to the next store and an index probe there per touched row
    (TPC-H Q22: 1,500 deleted orders' customers). Safe with an overestimating Δ-_r (values
    of no old r row): each row it names is re-probed against Input_r_post."""
    q = select([(k, c(k, "l")) for k in node.columns], ctx.state("post", node.left.nid, "l"),
               unmatched_now(ctx, node, d))
    return ctx.emit("ins", node.nid, ctx.info(node.nid).ids, q,
                    "Table 13 ▷: Δ+ = (Input_l_post ⋉_φ Δ-_r) ▷ Input_r_post", [d])


def named_by_right(ctx: RuleContext, node: A.AntiJoin, d: DiffNode) -> DiffNode | None:
    """Δ+_r's Δ- by the IDs of l that φ equates to r's columns, read off the new r rows alone,
    when φ is such equalities and conditions on r only: Δ- = π_{I'}(σ(Δ+_r)), I' ⊆ ID(l), each
    l row it names joins a new r row (the equalities are all φ asks of l), and a name of no l
    row deletes nothing — Input_l_post is not read (TPC-H Q22: 1,500 new orders' customers
    deleted from the view by key, not matched against the 42,000 customers of the view's
    countries first). None for any other φ (an l column other than an ID, an ID equated twice,
    an expression of l, a disjunction): the rule matches Input_l_post then."""
    ids = set(ctx.info(node.nid).ids)
    left, right = set(node.left.columns), set(node.right.columns)
    vals = ctx.post_values(d, "i")
    named: dict[str, exp.Expr] = {}
    kept: list[exp.Expr] = []
    for x in A.conjuncts(node.predicate):
        refs = A.referenced(x)
        if refs and refs <= right:
            kept.append(x)
            continue
        if not isinstance(x, exp.EQ):
            return None
        sides = [(x.this, x.expression), (x.expression, x.this)]
        pair = next(((a.name, b) for a, b in sides if isinstance(a, exp.Column)
                     and a.name in ids and a.name in left and isinstance(b, exp.Column)
                     and b.name in right), None)
        if pair is None or pair[0] in named:
            return None
        named[pair[0]] = pair[1]
    if not named:
        return None
    keys = sorted(named)
    bound = {k: ctx.bind(named[k], vals) for k in keys}
    cond = [ctx.bind(x, vals) for x in kept]
    values = {k: v for k, v in bound.items() if v is not None}
    filters = [x for x in cond if x is not None]
    if len(values) < len(keys) or len(filters) < len(cond):
        return None
    filters += [exp.Not(this=exp.Is(this=values[k].copy(), expression=exp.null())) for k in keys]
    q = select([(k, values[k]) for k in keys], ctx.rel(d, "i"), A.conjoin(filters),
               distinct=True)
    return ctx.emit("del", node.nid, keys, q,
                    "Table 13 ▷: Δ- = π_I'(Δ+_r), I' the IDs of l φ equates to r", [d])


RULE = OperatorRule(op=A.AntiJoin, paper="Table 13", infer=infer, propagate=propagate,
                    conditions=lambda n: A.referenced(n.predicate),  # type: ignore[attr-defined]
                    render=render, combines=True, fresh=SEMI.fresh,
                    restrict=SEMI.restrict)
