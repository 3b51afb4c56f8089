"""σ_φ(X): Table 1 (IDs of the input) and Table 6 (i-diff rules)."""

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
    is_true,
    merge_equiv,
    minimize_key,
    not_true,
    restrict_passes,
    select,
)
from idivm.render import Flat, Renderer

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.Select)
    ci = infos[0]
    equiv = merge_equiv(ci.equiv, A.equalities(node.predicate))
    consts: tuple[tuple[frozenset[str], frozenset[str]], ...] = tuple(
        (frozenset(), frozenset((p.left.name,)))
        for p in A.conjuncts(node.predicate)
        if isinstance(p, exp.EQ) and isinstance(p.left, exp.Column)
        and isinstance(p.right, exp.Literal)
    )
    fds = ci.fds + consts
    return node, dataclasses.replace(
        ci, ids=minimize_key(ci.ids, fds, equiv), equiv=equiv, fds=fds)


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.Select)
    s, phi, nid = d.schema, node.predicate, node.nid
    x = A.referenced(phi)
    cols = ctx.cols(nid)
    if s.kind == "ins":
        post = ctx.bind(phi, ctx.post_values(d, "i"))
        assert post is not None
        q = select([(k, c(k, "i")) for k in cols], ctx.rel(d, "i"), is_true(post))
        return [ctx.emit("ins", nid, s.ids, q, "Table 6 σ: Δ+ → σ_φ Δ+", [d])]
    pre = ctx.bind(phi, ctx.pre_values(d, "i"))
    if s.kind == "del":
        return [_filtered(ctx, d, nid, is_true(pre) if pre is not None else None,
                          "Table 6 σ: Δ- → σ_φ(X_pre) Δ-" if pre is not None
                          else "Table 6 σ: Δ- passes (overestimates)")]
    if not x & set(s.post):
        # the update leaves the condition alone: the rows stay in (or out of) the output
        return [_filtered(ctx, d, nid, is_true(pre) if pre is not None else None,
                          "Table 6 σ: Δu on non-conditional attributes passes")]
    post = ctx.bind(phi, ctx.post_values(d, "i"))
    if pre is not None and post is not None:
        upd = _filtered(ctx, d, nid, exp.and_(is_true(pre), is_true(post)),
                        "Table 6 σ: Δu → σ_φ(X_pre) σ_φ(X) Δu")
        dele = ctx.emit(
            "del", nid, s.ids,
            select([(k, c(k, "i")) for k in s.columns(cols) if not k.endswith("__post")],
                   ctx.rel(d, "i"), exp.and_(is_true(pre), not_true(post))),
            "Table 6 σ: Δu → Δ- = σ_φ(X_pre) σ_¬φ(X) Δu", [d], s.pre)
        entering = ctx.emit(
            "upd", node.child.nid, s.ids,
            select([(k, c(k, "i")) for k in s.columns(cols)], ctx.rel(d, "i"),
                   exp.and_(not_true(pre), is_true(post))),
            "Table 6 σ: rows entering σ_¬φ(X_pre) σ_φ(X) Δu", [d], s.pre, s.post)
        return [upd, dele, _insert_fetched(ctx, node, entering)]
    # the condition cannot be decided from the i-diff: delete by ID, re-insert what qualifies
    dele = ctx.ids_only_delete(d, nid, "Table 6 σ: Δu → Δ- by IDs (overestimates)")
    return [dele, _insert_fetched(ctx, node, d)]


def _filtered(ctx: RuleContext, d: DiffNode, nid: int, where: exp.Expr | None,
              rule: str) -> DiffNode:
    s = d.schema
    q = select([(k, c(k, "i")) for k in s.columns(ctx.cols(nid))], ctx.rel(d, "i"), where)
    return ctx.emit(s.kind, nid, s.ids, q, rule, [d], s.pre, s.post)


def _insert_fetched(ctx: RuleContext, node: A.Select, d: DiffNode) -> DiffNode:
    """Δ+ = σ_φ(Input_post ⋉_I Δ): the full post-state rows now satisfying φ."""
    cols = ctx.cols(node.nid)
    post = ctx.bind(node.predicate, {k: c(k, "f") for k in cols})
    assert post is not None
    q = select([(k, c(k, "f")) for k in cols],
               ctx.fetch("post", node.child.nid, d, "f"), is_true(post))
    return ctx.emit("ins", node.nid, ctx.info(node.child.nid).ids, q,
                    "Table 6 σ: Δ+ = σ_φ(Input_post ⋉_I Δu)", [d])


def render(r: Renderer, node: A.Node) -> Flat:
    assert isinstance(node, A.Select)
    f = r.flat(node.child)
    f.where.append(f.bind(node.predicate))
    return f


def fresh(f: Flattener, node: A.Node) -> None:
    """φ's conjuncts as conditions."""
    assert isinstance(node, A.Select)
    f.visit(node.child)
    f.conds += [f.convert(x) for x in A.conjuncts(node.predicate)]


RULE = OperatorRule(op=A.Select, paper="Table 6", infer=infer, propagate=propagate,
                    conditions=lambda n: A.referenced(n.predicate),  # type: ignore[attr-defined]
                    tuple_safe=True, render=render, fresh=fresh,
                    restrict=restrict_passes)

