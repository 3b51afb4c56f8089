"""Outer join l ⟕_φ r (and full ⟗_φ): IDs, i-diff rules, rendering, and the fresh refusal.

IDs (Table 1, extended): ID(l) ∪ ID(r), as for ⋈. A padded row holds NULL in the IDs of the
side it pads, and it is the only row with its preserved side's IDs (a row with a match has none),
so the IDs stay a key; they are compared null-safely (stores key them NULLS NOT DISTINCT). φ's
equalities are *not* equivalences here: a padded row has l.k but NULL for r.k. A left join whose
φ is only equalities binding every ID of r to an ID of l (``lookup``) gives each l row at most
one row: ID(l) alone is the key, and a Δu of r names its rows by the IDs of l it equals.

i-diff rules (in the style of Larson & Zhou's outer-join maintenance, by IDs):
- Δu on attributes φ does not read passes, named by the IDs of its side: matching is unchanged,
  and a padded row holds no attribute of the side it pads.
- Δ+ of the preserved side of a left join: Δ+_l ⟕_φ Input_r_post. Δ- of it passes by ID(l).
- Anything else changes which rows match which, so it *re-derives* the preserved rows it may
  touch: Δ- by their IDs (an over-estimate, as Table 10's Δu on join attributes) and
  Δ+ = Input_post ⋉_IDs (those IDs), where Input_post is the outer join itself. The touched
  preserved rows are those the changed rows name (the changed side preserved), and those joining
  a changed row's pre- or post-image (the other side): a row of r appearing or vanishing
  creates or removes the padded row of every l row it matches.
APPLY runs Δ- before Δ+ and a Δ+ is an upsert by the IDs, so a row re-derived by two i-diffs is
inserted once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo
from idivm.planner.ruleapi import (
    OperatorRule,
    RestrictStep,
    RuleContext,
    and_all,
    c,
    restrict_into,
    select,
    subquery,
)
from idivm.render import Flat, Renderer

from .join import combined


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.OuterJoin)
    li, ri = infos
    padded = set(node.right.columns) | (set(node.left.columns) if node.full else set())
    nullable = {**li.nullable, **ri.nullable}
    nullable.update({k: True for k in padded})
    # φ's equalities are no equivalences: they fail on padded rows
    # (the preserved side's constants stay: a padded one is NULL on the rows without a match)
    info = combined(li, ri, li.equiv + ri.equiv, nullable, True,
                    frozenset() if node.full else li.constant)
    if lookup(node, li.ids, ri.ids) is not None:
        info = dataclasses.replace(info, ids=li.ids)
    return node, info


def lookup(node: A.OuterJoin, l_ids: Sequence[str], r_ids: Sequence[str]
           ) -> dict[str, str] | None:
    """For a left join whose φ is only equalities l.a = r.b binding every ID of r to an ID of
    l: each ID of r → the ID of l it equals (each l row joins at most the one r row with those
    IDs). None otherwise."""
    if node.full or not r_ids:
        return None
    bound: dict[str, str] = {}
    for cj in A.conjuncts(node.predicate):
        if not (isinstance(cj, exp.EQ) and isinstance(cj.left, exp.Column)
                and isinstance(cj.right, exp.Column)):
            return None
        a, b = cj.left.name, cj.right.name
        if a in r_ids and b in l_ids:
            a, b = b, a
        if not (a in l_ids and b in r_ids):
            return None
        bound.setdefault(b, a)
    return bound if set(r_ids) <= set(bound) else None


def _preserved(node: A.OuterJoin) -> tuple[int, ...]:
    return (0, 1) if node.full else (0,)


def _sym(idx: int) -> str:
    return "l" if idx == 0 else "r"


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.OuterJoin)
    s, nid = d.schema, node.nid
    side = node.children[idx]
    sym = _sym(idx)
    on_side = A.referenced(node.predicate) & set(side.columns)
    if s.kind == "upd" and not on_side & set(s.post) and not _padded_ids_nullable(ctx, node, idx):
        named = lookup(node, ctx.info(node.left.nid).ids, ctx.info(node.right.nid).ids)
        if idx == 1 and named is not None and set(s.ids) <= set(named):
            return [_by_left_ids(ctx, node, d, named)]
        return [ctx.passthrough(d, nid, f"⟕: Δu_{sym} on attributes φ does not read passes")]
    if idx == 0 and not node.full and s.kind == "ins":
        return [ctx.emit("ins", nid, ctx.info(nid).ids, _pad_join(ctx, node, d),
                         "⟕: Δ+_l ⟕_φ Input_r_post", [d])]
    if idx == 0 and not node.full and s.kind == "del":
        return [ctx.passthrough(d, nid, "⟕: Δ-_l passes (by the IDs of l)")]
    out: list[DiffNode] = []
    for dele in touched(ctx, node, idx, d):
        out += [dele, rederive(ctx, node, dele, "⟕: Δ+ = Input_post ⋉_IDs Δ-")]
    return out


def _by_left_ids(ctx: RuleContext, node: A.OuterJoin, d: DiffNode, named: dict[str, str]
                 ) -> DiffNode:
    """Δu_r of a lookup join (φ binds r's IDs to l's): the l rows joining the changed r row
    are those whose IDs equal its IDs, so the Δu names them by those IDs of l."""
    s = d.schema
    ids = tuple(dict.fromkeys(named[k] for k in s.ids))
    cols = s.columns(ctx.cols(s.nid))
    items: dict[str, exp.Expr] = {}  # two IDs of r equal to one of l: equal values, one column
    for x in s.ids:
        items.setdefault(named[x], c(x, "i"))
    items.update({x: c(x, "i") for x in cols if x not in s.ids})
    q = select(list(items.items()), ctx.rel(d, "i"))
    return ctx.emit("upd", node.nid, ids, q, "⟕: Δu_r on attributes φ does not read passes, "
                    "named by the IDs of l that φ equals to r's", [d], s.pre, s.post)


def _padded_ids_nullable(ctx: RuleContext, node: A.OuterJoin, idx: int) -> bool:
    """Whether input ``idx`` is padded (r, or either side of ⟗) and one of its IDs may be
    NULL in its own rows (a group of NULLs below): then a padded row and that row share the
    NULL, so an i-diff named by its IDs would also name the padded rows (re-derive instead)."""
    if idx == 0 and not node.full:
        return False
    info = ctx.info(node.children[idx].nid)
    return any(info.nullable.get(k, True) for k in info.ids)


def touched(ctx: RuleContext, node: A.OuterJoin, idx: int, d: DiffNode) -> list[DiffNode]:
    """Per preserved input, a Δ- naming by its IDs the rows a change of input ``idx`` may
    touch (the changed rows themselves, or the rows joining their pre- or post-images)."""
    sym = _sym(idx)
    out = []
    for p in _preserved(node):
        if p == idx:
            out.append(ctx.ids_only_delete(d, node.nid, f"⟕: Δ{_mark(d.schema.kind)}_{sym} "
                                           f"re-derives its rows → Δ- by ID({sym})"))
        else:
            out.append(ctx.emit("del", node.nid, ctx.info(node.children[p].nid).ids,
                                _touched(ctx, node, idx, d), f"⟕: the {_sym(p)} rows a "
                                f"changed {sym} row joins (pre or post) → Δ- by ID({_sym(p)})",
                                [d]))
    return out


def _mark(kind: str) -> str:
    return {"ins": "+", "del": "-", "upd": "u"}[kind]


def rederive(ctx: RuleContext, node: A.OuterJoin, dele: DiffNode, rule: str) -> DiffNode:
    """Δ+: the rows of the outer join (post) that ``dele`` names."""
    q = select([(k, c(k, "f")) for k in node.columns], ctx.fetch("post", node.nid, dele, "f"))
    return ctx.emit("ins", node.nid, ctx.info(node.nid).ids, q, rule, [dele])


def _on(node: A.OuterJoin, vals: dict[str, exp.Expr | None]) -> exp.Expr:
    if node.predicate is None:
        return exp.true()
    bound = A.rename_columns(node.predicate, {k: v for k, v in vals.items() if v is not None})
    return and_all([bound])


def _pad_join(ctx: RuleContext, node: A.OuterJoin, d: DiffNode) -> exp.Select:
    """Δ+_l ⟕_φ Input_r_post."""
    vals: dict[str, exp.Expr | None] = {k: c(k, "i") for k in node.left.columns}
    vals.update({k: c(k, "o") for k in node.right.columns})
    q = select([(k, vals[k]) for k in node.columns], ctx.rel(d, "i"))  # type: ignore[misc]
    return q.join(ctx.state("post", node.right.nid, "o"), on=_on(node, vals), join_type="left")


def _images(ctx: RuleContext, node: A.OuterJoin, idx: int, d: DiffNode
            ) -> list[tuple[exp.Expr, dict[str, exp.Expr | None]]]:
    """The changed rows of input ``idx``: their pre-images (Δ-, Δu) and post-images (Δ+, Δu),
    from the i-diff where it holds φ's attributes, else from Input_pre / Input_post ⋉ Δ."""
    side = node.children[idx]
    need = A.referenced(node.predicate) & set(side.columns)
    out: list[tuple[exp.Expr, dict[str, exp.Expr | None]]] = []
    for which, kinds in (("pre", ("del", "upd")), ("post", ("ins", "upd"))):
        if d.schema.kind not in kinds:
            continue
        alias = f"i{which}"
        vals = ctx.pre_values(d, alias) if which == "pre" else ctx.post_values(d, alias)
        if all(vals.get(k) is not None for k in need):
            out.append((ctx.rel(d, alias), vals))
        else:
            out.append((ctx.fetch(which, side.nid, d, alias),
                        {k: c(k, alias) for k in side.columns}))
    return out


def _touched(ctx: RuleContext, node: A.OuterJoin, idx: int, d: DiffNode) -> exp.Select:
    """The IDs of the other input's rows (post) that a changed row of input ``idx`` joins."""
    other = node.children[1 - idx]
    ids = ctx.info(other.nid).ids
    parts = []
    for src, vals in _images(ctx, node, idx, d):
        both = dict(vals)
        both.update({k: c(k, "o") for k in other.columns})
        q = select([(k, c(k, "o")) for k in ids], src, distinct=True)
        parts.append(q.join(ctx.state("post", other.nid, "o"), on=_on(node, both)))
    if len(parts) == 1:
        return parts[0]
    out: exp.Expr = parts[0]
    for q in parts[1:]:
        out = exp.union(out, q, distinct=True, copy=False)
    return select([(k, c(k, "t")) for k in ids], subquery(out, "t"))


def render(r: Renderer, node: A.Node) -> Flat:
    """The preserved side's sources, then the other side as one relation joined LEFT (or
    FULL) on φ, so conditions of the padded side stay inside it."""
    assert isinstance(node, A.OuterJoin)
    lf = r.as_flat(node.left) if node.full else r.flat(node.left)
    rs, ra = r.rel(node.right)
    cols = {**lf.cols, **{k: c(k, ra) for k in node.right.columns}}
    on = Flat([], [], cols).bind(node.predicate) if node.predicate is not None else exp.true()
    return Flat(lf.sources + [(rs, on, "full" if node.full else "left")], lf.where, cols)


def restrict(node: A.Node, cols: tuple[str, ...]) -> tuple[RestrictStep, ...]:
    """A left join's rows named on columns of l: those of the named l rows, so the semi-join
    goes into l, and into r on each r column φ equates to one of those columns (the r rows
    such a row joins; a padded row stays padded, as none of its possible matches is left
    out)."""
    assert isinstance(node, A.OuterJoin)
    if node.full:
        return ()
    into_l = restrict_into(0)(node, cols)
    if not into_l:
        return ()
    on = into_l[0][1]
    into_r: dict[str, str] = {}
    for a, b in A.equalities(node.predicate):
        if a in set(node.right.columns):
            a, b = b, a
        if a in on and b in set(node.right.columns):
            into_r.setdefault(a, b)
    return into_l + (((1, into_r),) if into_r else ())


RULE = OperatorRule(
    op=A.OuterJoin, paper="Larson & Zhou; Gupta & Mumick (outer joins), by IDs", infer=infer,
    propagate=propagate,
    conditions=lambda n: A.referenced(n.predicate),  # type: ignore[attr-defined]
    render=render, combines=True, restrict=restrict,
    fresh_refusal=("outer join", "fresh views maintain inner select-project-join-aggregate "
                   "queries; a padded row is not a product of relation atoms"))
