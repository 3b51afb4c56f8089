"""Semijoin l ⋉_φ r (EXISTS, IN): Table 1 (ID(l)); i-diff rules mirroring Table 13."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo
from idivm.planner.ruleapi import (
    OperatorRule,
    RuleContext,
    c,
    exists,
    match,
    restrict_into,
    select,
    subquery,
    union_all,
)
from idivm.render import Flat, Renderer, atom

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    li, ri = infos
    return node, dataclasses.replace(li, multivalued=li.multivalued)


def probe(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, left_alias: str,
          right: exp.Expr, right_vals: dict[str, exp.Expr | None]) -> exp.Exists:
    """EXISTS (SELECT 1 FROM right WHERE φ(left, right))."""
    vals: dict[str, exp.Expr | None] = {k: c(k, left_alias) for k in node.left.columns}
    vals.update({k: right_vals.get(k) for k in node.right.columns})
    bound = ctx.bind(node.predicate, vals)
    assert bound is not None
    return exists(right, bound)


def right_state(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, alias: str
                ) -> tuple[exp.Expr, dict[str, exp.Expr | None]]:
    return ctx.state("post", node.right.nid, alias), {k: c(k, alias) for k in node.right.columns}


def right_rows(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode, which: str,
               alias: str) -> tuple[exp.Expr, dict[str, exp.Expr | None]]:
    """The pre- or post-state rows of r that ``d`` names, from the i-diff when it has φ's
    attributes, else from Input_r (Input_pre ⋉ Δ / Input_post ⋉ Δ)."""
    y = A.referenced(node.predicate) & set(node.right.columns)
    vals = ctx.pre_values(d, alias) if which == "pre" else ctx.post_values(d, alias)
    if all(vals.get(k) is not None for k in y):
        return ctx.rel(d, alias), vals
    return (ctx.fetch(which, node.right.nid, d, alias),
            {k: c(k, alias) for k in node.right.columns})


def left_side(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode, negate: bool,
              name: str) -> list[DiffNode]:
    """Changes of l: Δ+ and conditional Δu re-probe r_post; Δ- and other Δu pass (Table 13)."""
    s, nid = d.schema, node.nid
    rv = right_state(ctx, node, "o")
    if s.kind == "del":
        return [ctx.passthrough(d, nid, f"Table 13 {name}: Δ-_l passes")]
    if s.kind == "upd":
        x = A.referenced(node.predicate) & set(node.left.columns)
        if not x & set(s.post):
            return [ctx.passthrough(d, nid, f"Table 13 {name}: Δu_l on non-conditional "
                                    "attributes passes")]
    src = ctx.rel(d, "i") if s.kind == "ins" else ctx.fetch("post", node.left.nid, d, "i")
    cond: exp.Expr = probe(ctx, node, "i", *rv)
    if negate:
        cond = exp.Not(this=cond)
    q = select([(k, c(k, "i")) for k in node.columns], src, cond)
    ins = ctx.emit("ins", nid, ctx.info(nid).ids, q,
                   f"Table 13 {name}: Δ+ = (Δ+_l | Input_l_post ⋉_I Δu_l) {name} Input_r_post",
                   [d])
    if s.kind == "ins":
        return [ins]
    return [ctx.ids_only_delete(d, nid, f"Table 13 {name}: Δu_l on φ's attributes → Δ- by IDs"),
            ins]


def affected_left(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode,
                  which: Sequence[str]) -> exp.Expr:
    """l_post rows joining an old (pre) or new (post) row of r that ``d`` names: one EXISTS
    over the union of those r rows, which an engine runs as a semi-join driven by the
    (small) i-diff, where an OR of two EXISTS makes it scan the whole l side."""
    if len(which) == 1:
        return equi_prefilter(probe(ctx, node, "l", *right_rows(ctx, node, d, which[0], "o")))
    y = sorted(A.referenced(node.predicate) & set(node.right.columns))
    sides = []
    for w in which:
        rel, vals = right_rows(ctx, node, d, w, "o")
        sides.append(select([(k, vals[k] or exp.null()) for k in y], rel))
    rows = subquery(union_all(sides), "o")
    return equi_prefilter(probe(ctx, node, "l", rows, {k: c(k, "o") for k in y}))


def equi_prefilter(e: exp.Exists) -> exp.Expr:
    """EXISTS (Δ WHERE l.k = Δ.k AND l.x <> Δ.x) → EXISTS (Δ WHERE l.k = Δ.k) AND …: implied,
    and a semi-join on equalities alone can be driven from the distinct keys of the (small)
    i-diff through l's index, which one with a non-equality condition cannot (PostgreSQL hashes
    it against a scan of l)."""
    where = e.this.args.get("where")
    conj = A.conjuncts(where.this if where is not None else None)
    eqs = [x for x in conj if isinstance(x, exp.EQ) and isinstance(x.this, exp.Column)
           and isinstance(x.expression, exp.Column) and x.this.table != x.expression.table]
    if not eqs or len(eqs) == len(conj):
        return e
    src = e.this.args["from_"].this
    return exp.and_(exists(src.copy(), A.conjoin([x.copy() for x in eqs]) or exp.true()), e)


def recompute(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode,
              which: Sequence[str], negate: bool, name: str) -> list[DiffNode]:
    """Δ- by l's IDs for every l row an r change may flip, and Δ+ of those that qualify now:
    the rows Δ- names (l's IDs are the operator's, a key of Input_l_post), found again by
    their IDs rather than by matching the r change to l a second time — a change to r
    usually touches few of the l rows it is matched against (TPC-H Q22's o_custkey updates).
    Under Δu_r (an r row's old values and new ones); Δ-_r only removes rows from ⋉ (``leaving``)
    and only adds them to ▷ (``antijoin.entering``)."""
    nid = node.nid
    ids = ctx.info(nid).ids
    touched = affected_left(ctx, node, d, which)
    lstate = ctx.state("post", node.left.nid, "l")
    dele = ctx.emit("del", nid, ids, select([(k, c(k, "l")) for k in ids], lstate, touched),
                    f"Table 13 {name}: Δ_r → Δ- of the l rows it touches", [d])
    cond: exp.Expr = probe(ctx, node, "l", *right_state(ctx, node, "o"))
    if negate:
        cond = exp.Not(this=cond)
    nullable = ctx.info(node.left.nid).nullable
    named = exists(ctx.rel(dele, "z"), match([(k, k) for k in ids], "l", "z",
                                             {k: nullable.get(k, True) for k in ids}))
    ins = ctx.emit("ins", nid, ids,
                   select([(k, c(k, "l")) for k in node.columns], lstate.copy(),
                          exp.and_(named, cond)),
                   f"Table 13 {name}: Δ_r → Δ+ of the touched l rows (those Δ- names) that "
                   "qualify", [d, dele])
    return [dele, ins]


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.SemiJoin)
    if idx == 0:
        return left_side(ctx, node, d, False, "⋉")
    s = d.schema
    y = A.referenced(node.predicate) & set(node.right.columns)
    if s.kind == "upd" and not y & set(s.post):
        return []  # r's update leaves φ alone: not triggered
    if s.kind == "ins":  # new r rows can only add l rows
        lstate = ctx.state("post", node.left.nid, "l")
        q = select([(k, c(k, "l")) for k in node.columns], lstate,
                   affected_left(ctx, node, d, ["post"]))
        return [ctx.emit("ins", node.nid, ctx.info(node.nid).ids, q,
                         "Table 13 ⋉: Δ+ = Input_l_post ⋉_φ Δ+_r", [d])]
    if s.kind == "del":  # old r rows gone can only remove l rows
        return [leaving(ctx, node, d)]
    return recompute(ctx, node, d, ["pre", "post"], False, "⋉")


def leaving(ctx: RuleContext, node: A.SemiJoin, d: DiffNode) -> DiffNode:
    """Δ-_r's Δ- = π_I((Input_l_post ⋉_φ Δ-_r) ▷_φ Input_r_post): the l rows a gone r row
    matched that no r row matches now — with no Δ+ of the touched rows that still qualify
    (``recompute``'s), as such a row was in the output before and stays. A touched row whose φ
    attributes kept their values matched that r row before it went, so was in; one whose φ
    attributes changed, or that is new, comes through the left side's rules (a Δ- by its IDs
    and a re-probe, or Δ+_l's probe); one that qualifies only now is added by the rule of the
    new or changed r row it matches. Safe with an overestimating Δ-_r (values of no old r
    row): a row it names is deleted only where no r row matches it now, which the output
    cannot hold. The mirror of ``antijoin.entering``."""
    ids = ctx.info(node.nid).ids
    q = select([(k, c(k, "l")) for k in ids], ctx.state("post", node.left.nid, "l"),
               unmatched_now(ctx, node, d))
    return ctx.emit("del", node.nid, ids, q,
                    "Table 13 ⋉: Δ- = π_I((Input_l_post ⋉_φ Δ-_r) ▷ Input_r_post)", [d])


def unmatched_now(ctx: RuleContext, node: A.SemiJoin | A.AntiJoin, d: DiffNode) -> exp.Expr:
    """The condition on an Input_l_post row (alias ``l``) of (Input_l_post ⋉_φ Δ-_r) ▷_φ
    Input_r_post: a gone r row matched it, no r row matches it now."""
    return exp.and_(affected_left(ctx, node, d, ["pre"]),
                    exp.Not(this=probe(ctx, node, "l", *right_state(ctx, node, "o"))))


def render(r: Renderer, node: A.Node) -> Flat:
    """l with [NOT] EXISTS (SELECT 1 FROM r WHERE φ) added to its conditions."""
    assert isinstance(node, A.SemiJoin | A.AntiJoin)
    f = r.flat(node.left)
    rs, ra = r.rel(node.right)
    on = A.rename_columns(node.predicate, {**{k: atom(v) for k, v in f.cols.items()},
                                           **{k: c(k, ra) for k in node.right.columns}})
    if isinstance(node, A.AntiJoin):
        # NOT EXISTS over a UNION ALL (a pre-state: kept rows ∪ old rows) as one NOT EXISTS
        # per branch: each an anti-join an engine can drive through an index on φ's columns
        f.where += [exp.Not(this=exists(b, on.copy())) for b in _branches(rs, ra)]
    else:
        f.where.append(exists(rs, on))
    return f


def _branches(rel: exp.Expr, alias: str) -> list[exp.Expr]:
    """The branches of a derived table that is a UNION ALL, each under ``alias``."""
    inner = rel.this if isinstance(rel, exp.Subquery) else None
    if not isinstance(inner, exp.Union) or inner.args.get("distinct"):
        return [rel]
    return [b for x in (inner.this, inner.expression)
            for b in _branches(subquery(x.copy(), alias), alias)]


def fresh(f: Flattener, node: A.Node) -> None:
    """l's atoms, and r's distinct correlation values as a derived relation read with l's
    variables: joined (⋉), or subtracted as ``1 − [it]`` (▷)."""
    assert isinstance(node, A.SemiJoin | A.AntiJoin)
    f.visit(node.left)
    f.probe(node)


RULE = OperatorRule(op=A.SemiJoin, paper="Table 13 (mirrored)", infer=infer, propagate=propagate,
                    conditions=lambda n: A.referenced(n.predicate),  # type: ignore[attr-defined]
                    render=render, combines=True, fresh=fresh,
                    restrict=restrict_into(0))
