"""Algebra → SQL (a sqlglot SELECT producing exactly the operator's columns).

Used to materialize views and caches, to recompute, and for Input_pre / Input_post of operators
that are not materialized. ``leaf`` may substitute a relation for any operator (a cache, a
pre-state expression); returning None renders the operator itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from idivm import algebra as A
from idivm.planner.ruleapi import c, exists, select, subquery, t, union_all

Leaf = Callable[[A.Node], "exp.Expr | None"]


def render(node: A.Node, leaf: Leaf, types: Callable[[str], str | None] = lambda _: None
           ) -> exp.Select:
    return _Renderer(leaf, types).node(node)


@dataclass
class _Flat:
    """σ/π/⋈/⋉/▷ over sources as one SELECT: the sources (the first in FROM, each next inner-
    or cross-joined on its condition), the conditions, and each plan column's expression."""

    sources: list[tuple[exp.Expr, exp.Expr | None]]  # (source, join condition)
    where: list[exp.Expr]
    cols: dict[str, exp.Expr]

    def bind(self, e: exp.Expr) -> exp.Expr:
        """``e`` over plan columns, over the sources."""
        return A.rename_columns(e, {k: _atom(v) for k, v in self.cols.items()})

    def select(self, columns: tuple[str, ...]) -> exp.Select:
        q = select([(k, self.cols[k].copy()) for k in columns], self.sources[0][0])
        for src, on in self.sources[1:]:
            q = q.join(src, on=on, join_type=None if on is not None else "cross", copy=False)
        if self.where:
            q = q.where(exp.and_(*self.where) if len(self.where) > 1 else self.where[0],
                        copy=False)
        return q


def _atom(e: exp.Expr) -> exp.Expr:
    """``e`` as an operand: parenthesized unless a column or a literal."""
    return e if isinstance(e, exp.Column | exp.Literal | exp.Paren) else exp.paren(e.copy())


class _Renderer:
    def __init__(self, leaf: Leaf, types: Callable[[str], str | None]) -> None:
        self.leaf = leaf
        self.types = types
        self.n = 0

    def alias(self) -> str:
        self.n += 1
        return f"q{self.n}"

    def rel(self, node: A.Node) -> tuple[exp.Expr, str]:
        a = self.alias()
        sub = self.leaf(node)
        if isinstance(sub, exp.Table):
            return t(sub.name, a), a
        if sub is not None:
            return subquery(sub, a), a
        return subquery(self.node(node), a), a

    def node(self, node: A.Node) -> exp.Select:
        if self.leaf(node) is None and isinstance(node, A.Scan | A.Select | A.Project | A.Join |
                                                   A.SemiJoin | A.AntiJoin):
            return self.flat(node).select(node.columns)
        if isinstance(node, A.UnionAll):
            return self.union(node)
        if isinstance(node, A.Aggregate):
            return self.aggregate(node)
        src, a = self.rel(node)  # a relation the caller substitutes
        return select([(k, c(k, a)) for k in node.columns], src)

    def flat(self, node: A.Node) -> _Flat:
        """A select-project-join subtree as one SELECT (no derived table per operator)."""
        if self.leaf(node) is None:
            if isinstance(node, A.Scan):
                a = self.alias()
                return _Flat([(t(node.table, a), None)], [], {
                    p: c(b, a) for p, b in zip(node.cols, node.base_cols, strict=True)})
            if isinstance(node, A.Select):
                f = self.flat(node.child)
                f.where.append(f.bind(node.predicate))
                return f
            if isinstance(node, A.Project):
                f = self.flat(node.child)
                return _Flat(f.sources, f.where, {n: f.bind(e) for n, e in node.exprs})
            if isinstance(node, A.Join):
                lf, rf = self.flat(node.left), self.flat(node.right)
                both = _Flat(lf.sources, lf.where + rf.where, {**lf.cols, **rf.cols})
                right = list(rf.sources)
                right[0] = (right[0][0], None)
                if node.predicate is not None:  # on the last source of the right side
                    src, on = right[-1]
                    pred = both.bind(node.predicate)
                    right[-1] = (src, pred if on is None else exp.and_(on, pred))
                both.sources = lf.sources + right
                return both
            if isinstance(node, A.SemiJoin | A.AntiJoin):
                f = self.flat(node.left)
                rs, ra = self.rel(node.right)
                probe: exp.Expr = exists(rs, A.rename_columns(node.predicate, {
                    **{k: _atom(v) for k, v in f.cols.items()},
                    **{k: c(k, ra) for k in node.right.columns}}))
                f.where.append(exp.Not(this=probe) if isinstance(node, A.AntiJoin) else probe)
                return f
        src, a = self.rel(node)
        return _Flat([(src, None)], [], {k: c(k, a) for k in node.columns})

    def union(self, node: A.UnionAll) -> exp.Select:
        branches = []
        for b, child, cols, own in ((0, node.left, node.left_cols, node.left_ids),
                                    (1, node.right, node.right_cols, node.right_ids)):
            src, a = self.rel(child)
            items: list[tuple[str, exp.Expr]] = [
                (n, c(x, a)) for n, x in zip(node.names, cols, strict=True)]
            items.append((A.BRANCH, exp.Literal.number(b)))
            for bb, ids in ((0, node.left_ids), (1, node.right_ids)):
                for x in ids:
                    name = node.carry(bb, x)
                    if bb == b:
                        items.append((name, c(x, a)))
                    else:
                        ty = self.types(name)
                        null: exp.Expr = exp.null()
                        if ty:
                            null = exp.cast(null, exp.DataType.build(ty, dialect="postgres"))
                        items.append((name, null))
            del own
            branches.append(select(items, src))
        a = self.alias()
        return select([(k, c(k, a)) for k in node.columns], subquery(union_all(branches), a))

    def aggregate(self, node: A.Aggregate) -> exp.Select:
        src, a = self.rel(node.child)
        items: list[tuple[str, exp.Expr]] = [(g, c(g, a)) for g in node.group_by]  # noqa
        if node.is_global:
            items.append(("__g", exp.Literal.number(0)))
        for agg in node.aggs:
            x = c(agg.arg, a) if agg.arg else None
            f: exp.Expr
            if agg.func == "count_star":
                f = exp.Count(this=exp.Star())
            else:
                assert x is not None
                f = {"sum": exp.Sum, "count": exp.Count, "avg": exp.Avg, "min": exp.Min,
                     "max": exp.Max}[agg.func](this=x)
            items.append((agg.name, f))
        items.append((A.COUNT, exp.Count(this=exp.Star())))
        for agg in node.aggs:
            if agg.func in ("sum", "avg"):
                if agg.func == "avg":
                    items.append((f"__sum_{agg.name}", exp.Sum(this=c(agg.arg or "", a))))
                items.append((f"__nn_{agg.name}", exp.Count(this=c(agg.arg or "", a))))
        q = select([(k, dict(items)[k]) for k in node.columns], src)
        if node.group_by:
            q = q.group_by(*[c(g, a) for g in node.group_by])
        return q
