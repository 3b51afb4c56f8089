"""Inner θ-join ⋈_φ and cross product ×: Table 1 (ID(l) ∪ ID(r)), Tables 4 and 10."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo
from idivm.planner.ruleapi import (
    OperatorRule,
    RuleContext,
    and_all,
    c,
    closure,
    match,
    merge_equiv,
    minimize_key,
    not_true,
    restrict_into,
    select,
    subquery,
    union_all,
)
from idivm.render import Flat, Renderer

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.Join)
    li, ri = infos
    equiv = merge_equiv(li.equiv + ri.equiv, A.equalities(node.predicate))
    fds = li.fds + ri.fds
    # many-to-one when one side's columns determine the other side's key (FK-style joins), or
    # the other side has at most one row (a scalar subquery's γ: each row meets that one)
    l_det = ri.ids and (ri.one_row or set(ri.ids) <= closure(node.left.columns, fds, equiv))
    r_det = li.ids and (li.one_row or set(li.ids) <= closure(node.right.columns, fds, equiv))
    many_to_many = not (l_det or r_det)
    return node, combined(li, ri, equiv, {**li.nullable, **ri.nullable},
                          li.multivalued or ri.multivalued or bool(many_to_many),
                          li.constant | ri.constant)


def combined(li: NodeInfo, ri: NodeInfo, equiv: tuple[frozenset[str], ...],
             nullable: dict[str, bool], multivalued: bool,
             constant: frozenset[str] = frozenset()) -> NodeInfo:
    """The annotations of a node with both inputs' columns: IDs ID(l) ∪ ID(r) (minimized
    under both sides' FDs and ``equiv``), the rest merged (``constant``: the columns that
    stay constant, which the caller knows: an outer join pads some with NULLs)."""
    fds = li.fds + ri.fds
    return NodeInfo(
        ids=minimize_key(li.ids + ri.ids, fds, equiv),
        scan_ids={**li.scan_ids, **ri.scan_ids},
        equiv=equiv,
        fds=fds,
        lineage={**li.lineage, **ri.lineage},
        nullable=nullable,
        carry=tuple(dict.fromkeys(li.carry + ri.carry)),
        multivalued=multivalued,
        types={**li.types, **ri.types},
        constant=constant,
    )


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.Join)
    s, nid = d.schema, node.nid
    side = node.children[idx]
    sym = "l" if idx == 0 else "r"
    if s.kind == "ins":
        return [ctx.emit("ins", nid, ctx.info(nid).ids, _join_other(ctx, node, idx, d, "i"),
                         f"Table 10 ⋈: Δ+_{sym} ⋈_φ Input_other_post", [d])]
    if s.kind == "del":
        return [ctx.passthrough(d, nid, f"Table 10 ⋈: Δ-_{sym} passes (by the IDs of {sym})")]
    x_side = A.referenced(node.predicate) & set(side.columns)
    if not x_side & set(s.post):
        return [ctx.passthrough(d, nid, f"Table 10 ⋈: Δu_{sym} on non-join attributes passes")]
    if ctx.info(side.nid).one_row:
        flips = _flips(ctx, node, idx, d)
        if flips is not None:
            return flips
    dele = ctx.ids_only_delete(d, nid, f"Table 10 ⋈: Δu_{sym} on join attributes → Δ- by IDs")
    ins = ctx.emit("ins", nid, ctx.info(nid).ids, _join_other(ctx, node, idx, d, "f", fetch=True),
                   f"Table 10 ⋈: Δ+ = (Input_{sym}_post ⋉_I Δu) ⋈_φ Input_other_post", [d])
    return [dele, ins]


def _flips(ctx: RuleContext, node: A.Join, idx: int, d: DiffNode) -> list[DiffNode] | None:
    """Δu of a one-row side (an uncorrelated scalar subquery's value) on join attributes: only
    the rows whose φ flips change — Δ- where φ held before and not after, Δ+ where it holds
    only after (both over Input_other_post), and the rows where φ holds throughout take the
    new values as a Δu by the side's IDs (a projection above drops it when it keeps none of
    them). None when the i-diff lacks a pre-value φ reads (the general rule applies)."""
    side, other = node.children[idx], node.children[1 - idx]
    s, sym = d.schema, "l" if idx == 0 else "r"
    mine = A.referenced(node.predicate) & set(side.columns)
    if any(x in s.post and ctx.pre_val(d, x, "i") is None for x in mine):
        return None
    o = {k: c(k, "o") for k in other.columns}
    post = {k: c(k, "f") for k in side.columns}
    pre = {k: ctx.pre_val(d, k, "i") if k in s.post else c(k, "f") for k in side.columns}
    assert node.predicate is not None
    phi_post = ctx.bind(node.predicate, {**o, **post})
    phi_pre = ctx.bind(node.predicate, {**o, **pre})
    assert phi_post is not None and phi_pre is not None

    ranged = _ranged(node, idx)

    def rows(items: list[tuple[str, A.exp.Expr]], now: A.exp.Expr, was: A.exp.Expr,
             distinct: bool = False, ranges: list[A.exp.Expr] | None = None) -> A.exp.Select:
        def branch(on: A.exp.Expr) -> A.exp.Select:
            q = select(items, ctx.fetch("post", side.nid, d, "f"), distinct=distinct)
            nullable = ctx.info(side.nid).nullable
            q = q.join(ctx.rel(d, "i"), on=match(
                [(k, k) for k in s.ids], "f", "i",
                {k: True for k in s.ids if nullable.get(k, True)}))
            return q.join(ctx.state("post", other.nid, "o"), on=on)

        if not ranges:  # (φ, not φ IS TRUE: in an ON both mean "holds"; bare, x = v probes x)
            return branch(and_all([now, not_true(was)]))
        both = union_all([branch(r) for r in ranges])
        return select([(k, c(k, "b")) for k, _ in items], subquery(both, "b"),
                      distinct=distinct)

    def flipped(x: str, op: type[A.exp.Expr], v: str, now: dict[str, A.exp.Expr],
                was: dict[str, A.exp.Expr]) -> list[A.exp.Expr]:
        """x op v holds with ``now``'s v and not with ``was``'s: x op v_now where v_was is
        NULL, else x op v_now ∧ x (not op) v_was — two ranges of x an index reads."""
        holds = op(this=c(x, "o"), expression=now[v].copy())
        return [and_all([holds, A.exp.Is(this=was[v].copy(), expression=A.exp.null())]),
                and_all([holds.copy(), NEGATED[op](this=c(x, "o"), expression=was[v].copy())])]

    ids = ctx.info(node.nid).ids
    where = {k: "o" if k in other.columns else "f" for k in node.columns}
    stops = starts = None
    if ranged is not None:
        x, op, v = ranged
        stops, starts = flipped(x, op, v, pre, post), flipped(x, op, v, post, pre)  # type: ignore[arg-type]
    dele = ctx.emit("del", node.nid, ids, rows([(k, c(k, where[k])) for k in ids], phi_pre,
                                                phi_post, distinct=True, ranges=stops),
                    f"⋈ over a one-row {sym}: Δu_{sym} on join attributes → Δ- where φ stops "
                    "holding", [d])
    ins = ctx.emit("ins", node.nid, ids, rows([(k, c(k, where[k])) for k in node.columns],
                                              phi_post, phi_pre, ranges=starts),
                   f"⋈ over a one-row {sym}: Δ+ where φ starts holding ⋈ Input_other_post", [d])
    upd = ctx.passthrough(d, node.nid, f"⋈ over a one-row {sym}: Δu_{sym} passes to the rows "
                                       "where φ holds throughout")
    return [dele, ins, upd]


# x op v and the negation of it where neither x nor v is NULL
NEGATED: dict[type[A.exp.Expr], type[A.exp.Expr]] = {
    A.exp.GT: A.exp.LTE, A.exp.GTE: A.exp.LT, A.exp.LT: A.exp.GTE, A.exp.LTE: A.exp.GT}
MIRRORED: dict[type[A.exp.Expr], type[A.exp.Expr]] = {
    A.exp.GT: A.exp.LT, A.exp.GTE: A.exp.LTE, A.exp.LT: A.exp.GT, A.exp.LTE: A.exp.GTE}


def _ranged(node: A.Join, idx: int) -> tuple[str, type[A.exp.Expr], str] | None:
    """φ as one comparison x op v of a column x of the other input with a column v of input
    ``idx`` (a one-row input): (x, op, v); None for any other φ. The rows such a φ flips for
    are a range of x."""
    return _compared(node, idx, NEGATED)


def _compared(node: A.Join, idx: int, ops: Collection[type[A.exp.Expr]]
              ) -> tuple[str, type[A.exp.Expr], str] | None:
    """φ as one comparison x op v (op among ``ops``) of a column x of the other input with a
    column v of input ``idx``: (x, op, v), op mirrored when φ is written v op x; else None."""
    side, other = node.children[idx], node.children[1 - idx]
    p = node.predicate
    while isinstance(p, A.exp.Paren):
        p = p.this
    if p is None or type(p) not in ops or not (
            isinstance(p.this, A.exp.Column) and isinstance(p.expression, A.exp.Column)):
        return None
    a, b, op = p.this.name, p.expression.name, type(p)
    if a in side.columns and b in other.columns:
        a, b, op = b, a, MIRRORED.get(op, op)  # (= is its own mirror)
    if a in other.columns and b in side.columns:
        return a, op, b
    return None


def caches(node: A.Node, infos: Mapping[int, NodeInfo]) -> tuple[int, tuple[str, ...]] | None:
    """The other input of a ⋈ over a one-row input whose φ compares it with the one row: a
    cache indexed on the compared column, so the rows a change of the one row flips are read
    as a range of it (TPC-H Q22: the customers whose balance lies between the old and the new
    average) instead of by scanning the input."""
    assert isinstance(node, A.Join)
    for idx in (0, 1):
        other = node.children[1 - idx]
        ranged = _ranged(node, idx)
        if ranged is None or not infos[node.children[idx].nid].one_row \
                or infos[other.nid].one_row or infos[other.nid].multivalued:
            continue
        return 1 - idx, (ranged[0],)
    return None


def lookups(node: A.Node, infos: Mapping[int, NodeInfo]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """The other input of a ⋈ over a one-row input whose φ is x = v: a change of the one row
    flips the rows whose x equals its old or its new value (TPC-H Q15: the suppliers whose
    revenue is the old or the new maximum), found by the value of x. (A range φ has its
    indexed cache: ``caches``.)"""
    assert isinstance(node, A.Join)
    for idx in (0, 1):
        eq = _compared(node, idx, (A.exp.EQ,))
        if eq is not None and infos[node.children[idx].nid].one_row \
                and not infos[node.children[1 - idx].nid].one_row:
            return ((1 - idx, (eq[0],)),)
    return ()


def _join_other(ctx: RuleContext, node: A.Join, idx: int, d: DiffNode, alias: str,
                fetch: bool = False) -> A.exp.Select:
    side, other = node.children[idx], node.children[1 - idx]
    src = ctx.fetch("post", side.nid, d, alias) if fetch else ctx.rel(d, alias)
    q = select([(k, c(k, alias if k in side.columns else "o")) for k in node.columns], src)
    on = A.rename_columns(node.predicate, {k: c(k, alias) for k in side.columns} | {
        k: c(k, "o") for k in other.columns}) if node.predicate is not None else None
    return q.join(ctx.state("post", other.nid, "o"), on=and_all([on]) if on is not None else None,
                  join_type="cross" if on is None else None)


def render(r: Renderer, node: A.Node) -> Flat:
    """Both sides' sources in one FROM, φ on the right side's last source."""
    assert isinstance(node, A.Join)
    lf, rf = r.flat(node.left), r.flat(node.right)
    if rf.outer:  # φ must not land on an outer join's ON: the right side as one relation
        rf = r.as_flat(node.right)
    both = Flat(lf.sources, lf.where + rf.where, {**lf.cols, **rf.cols})
    right = list(rf.sources)
    right[0] = (right[0][0], None, None)
    if node.predicate is not None:
        src, on, side = right[-1]
        pred = both.bind(node.predicate)
        right[-1] = (src, pred if on is None else A.exp.and_(on, pred), side)
    both.sources = lf.sources + right
    return both


def fresh(f: Flattener, node: A.Node) -> None:
    """Both sides' atoms; φ's conjuncts as conditions (equalities unify variables)."""
    assert isinstance(node, A.Join)
    f.visit(node.left)
    f.visit(node.right)
    f.conds += [f.convert(x) for x in A.conjuncts(node.predicate)]


RULE = OperatorRule(op=A.Join, paper="Tables 4, 10", infer=infer, propagate=propagate,
                    conditions=lambda n: A.referenced(n.predicate),  # type: ignore[attr-defined]
                    render=render, combines=True, fresh=fresh,
                    restrict=restrict_into(0, 1), caches=caches,
                    lookups=lookups)

