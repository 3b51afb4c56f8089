"""Generalized projection π_{D, f(X)→c}: Table 1 (IDs of the input, added when projected away)
and Table 8 (i-diff rules)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo, post_name, pre_name
from idivm.planner.ruleapi import (
    OperatorRule,
    RestrictStep,
    RuleContext,
    c,
    minimize_key,
    select,
)
from idivm.planner.typing_ import expression_type
from idivm.render import Flat, Renderer


def _simplify(e: exp.Expr, ci: NodeInfo) -> exp.Expr:
    """COALESCE(a, b) over columns equated by an inner join is just a (NATURAL JOIN, USING)."""
    if isinstance(e, exp.Coalesce):
        args = [e.this, *e.expressions]
        if all(isinstance(a, exp.Column) for a in args) and all(
                ci.same(args[0].name, a.name) for a in args):
            return args[0].copy()
    return e


def out_map(node: A.Project, ci: NodeInfo) -> dict[str, str]:
    """Input column → an output column holding its value (directly or through an equality)."""
    direct = node.passthrough()
    out: dict[str, str] = {}
    for x in set(ci.lineage) | set(ci.nullable):
        if x in direct:
            out[x] = direct[x]
            continue
        for y, name in direct.items():
            if ci.same(x, y):
                out[x] = name
                break
    return out

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.Project)
    ci = infos[0]
    exprs = [(n, _simplify(e, ci)) for n, e in node.exprs]
    names = {n for n, _ in exprs}
    hidden = set(node.hidden)
    for x in ci.carry:  # Table 1: the projection keeps the IDs of its input
        have = [e.name for _, e in exprs if isinstance(e, exp.Column)]
        if any(ci.same(x, h) for h in have):
            continue
        # hidden columns every γ (count, global id) or ∪ (branch) has by the same name get
        # the projection's nid, so two of them can meet in one join
        name = f"__id{node.nid}_{x}" if x in (A.COUNT, "__g", A.BRANCH) else f"__id_{x}"
        while name in names:
            name += "_"
        names.add(name)
        hidden.add(name)
        exprs.append((name, A.col(x)))
    node = dataclasses.replace(node, exprs=tuple(exprs), hidden=frozenset(hidden))
    m = out_map(node, ci)
    classes: dict[frozenset[str], set[str]] = {}
    for n, e in exprs:
        if isinstance(e, exp.Column):
            classes.setdefault(ci.klass(e.name), set()).add(n)
    equiv = tuple(frozenset(v) for v in classes.values() if len(v) > 1)
    fds: list[tuple[frozenset[str], frozenset[str]]] = []
    for lhs, rhs in ci.fds:
        if all(x in m for x in lhs):
            fds.append((frozenset(m[x] for x in lhs), frozenset(m[x] for x in rhs if x in m)))
    for n, e in exprs:
        refs = A.referenced(e)
        if not isinstance(e, exp.Column) and all(x in m for x in refs):
            fds.append((frozenset(m[x] for x in refs), frozenset((n,))))
    lineage = {n: frozenset().union(*[ci.lineage.get(x, frozenset()) for x in A.referenced(e)])
               for n, e in exprs}
    nullable = {n: ci.nullable.get(e.name, True) if isinstance(e, exp.Column) else True
                for n, e in exprs}
    types = {n: expression_type(e, ci.types) for n, e in exprs}
    ids = tuple(m[x] for x in ci.ids)
    return node, NodeInfo(
        ids=minimize_key(ids, fds, equiv),
        scan_ids={k: tuple(m[x] for x in v) for k, v in ci.scan_ids.items()},
        equiv=equiv,
        fds=tuple(fds),
        lineage=lineage,
        nullable=nullable,
        carry=tuple(dict.fromkeys(m[x] for x in ci.carry)),
        multivalued=ci.multivalued,
        types=types,
        output_carry=tuple(dict.fromkeys(m[x] for x in ci.output_carry)),
        one_row=ci.one_row,
        constant=frozenset(n for n, e in exprs
                           if isinstance(e, exp.Column) and e.name in ci.constant),
    )


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.Project)
    s, nid = d.schema, node.nid
    ci = ctx.info(node.child.nid)
    m = out_map(node, ci)
    # IDs equal by an equivalence map to one output column: name each once
    named = {m[x]: x for x in reversed(s.ids)}
    ids = tuple(dict.fromkeys(m[x] for x in s.ids))
    # ...and a row of the i-diff where they differ names no row of the output
    same = A.conjoin([exp.EQ(this=c(x, "i"), expression=c(named[m[x]], "i"))
                      for x in s.ids if named[m[x]] != x])
    id_outputs = set(ids)
    if s.kind == "ins":
        vals = ctx.post_values(d, "i")
        q = select([(n, _bound(ctx, e, vals)) for n, e in node.exprs], ctx.rel(d, "i"))
        return [ctx.emit("ins", nid, ctx.info(nid).ids, q, "Table 8 π: Δ+ → π_{D,f(X)} Δ+", [d])]
    pre_vals = ctx.pre_values(d, "i")
    pre = [(n, e) for n, e in node.exprs
           if n not in id_outputs and ctx.bind(e, pre_vals) is not None]
    items: list[tuple[str, exp.Expr]] = [(n, c(named[n], "i")) for n in ids]
    items += [(pre_name(n), _bound(ctx, e, pre_vals)) for n, e in pre]
    if s.kind == "del":
        q = select(items, ctx.rel(d, "i"), same)
        return [ctx.emit("del", nid, ids, q, "Table 8 π: Δ- → π_{D∩(I∪A'pre)} Δ-", [d],
                         [n for n, _ in pre])]
    changed = [(n, e) for n, e in node.exprs
               if n not in id_outputs and A.referenced(e) & set(s.post)]
    if not changed:
        return []  # no projected attribute depends on the update: not triggered
    post_vals = ctx.post_values(d, "i")
    if all(ctx.bind(e, post_vals) is not None for _, e in changed):
        items += [(post_name(n), _bound(ctx, e, post_vals)) for n, e in changed]
        q = select(items, ctx.rel(d, "i"), same)
        return [ctx.emit("upd", nid, ids, q, "Table 8 π: Δu → π_{D', f(X)} Δu", [d],
                         [n for n, _ in pre], [n for n, _ in changed])]
    # f needs attributes the i-diff lacks: read them from Input_post, by the input's full IDs
    fnamed = {m[x]: x for x in reversed(ci.ids)}
    full = tuple(dict.fromkeys(m[x] for x in ci.ids))
    fvals: dict[str, exp.Expr | None] = {k: c(k, "f") for k in ctx.cols(node.child.nid)}
    items = [(n, c(fnamed[n], "f")) for n in full]
    items += [(post_name(n), _bound(ctx, e, fvals)) for n, e in changed if n not in full]
    q = select(items, ctx.fetch("post", node.child.nid, d, "f"))
    return [ctx.emit("upd", nid, full, q, "Table 8 π: Δu → π_{D', f(X)}(Input_post ⋉_I Δu)",
                     [d], (), [n for n, _ in changed if n not in full])]


def _bound(ctx: RuleContext, e: exp.Expr, vals: Mapping[str, exp.Expr | None]
           ) -> exp.Expr:
    b = ctx.bind(e, vals)
    assert b is not None
    return b


def render(r: Renderer, node: A.Node) -> Flat:
    assert isinstance(node, A.Project)
    f = r.flat(node.child)
    return Flat(f.sources, f.where, {n: f.bind(e) for n, e in node.exprs})


def fresh(f: Flattener, node: A.Node) -> None:
    """Each output column as an expression over the input's variables."""
    assert isinstance(node, A.Project)
    f.visit(node.child)
    for name, e in node.exprs:
        f.env[name] = f.convert(e)


def restrict(node: A.Node, cols: tuple[str, ...]) -> tuple[RestrictStep, ...]:
    """A semi-join on output columns that are input columns renamed goes below π (on
    those)."""
    assert isinstance(node, A.Project)
    exprs = dict(node.exprs)
    on = {k: e.name for k in cols if isinstance(e := exprs[k], exp.Column)}
    return ((0, on),) if on else ()


RULE = OperatorRule(op=A.Project, paper="Table 8", infer=infer, propagate=propagate,
                    tuple_safe=True, render=render, fresh=fresh, keeps_output=True,
                    restrict=restrict)

