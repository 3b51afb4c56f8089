"""Algebra → SQL (a sqlglot SELECT producing exactly the operator's columns).

Used to materialize views and caches, to recompute, and for Input_pre / Input_post of operators
that are not materialized. ``leaf`` may substitute a relation for any operator (a cache, a
pre-state expression); returning None renders the operator itself.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from idivm import algebra as A
from idivm.planner.ruleapi import c, exists, select, subquery, t, union_all

Leaf = Callable[[A.Node], "exp.Expr | None"]


def render(node: A.Node, leaf: Leaf, types: Callable[[str], str | None] = lambda _: None
           ) -> exp.Select:
    return _Renderer(leaf, types).node(node)


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
        sub = self.leaf(node)
        if sub is not None:
            src, a = self.rel(node)
            return select([(k, c(k, a)) for k in node.columns], src)
        if isinstance(node, A.Scan):
            a = self.alias()
            return select([(p, c(b, a)) for p, b in zip(node.cols, node.base_cols, strict=True)],
                          t(node.table, a))
        if isinstance(node, A.Select):
            src, a = self.rel(node.child)
            return select([(k, c(k, a)) for k in node.columns], src, node.predicate.copy())
        if isinstance(node, A.Project):
            src, a = self.rel(node.child)
            return select([(n, e.copy()) for n, e in node.exprs], src)
        if isinstance(node, A.Join):
            ls, la = self.rel(node.left)
            rs, ra = self.rel(node.right)
            q = select([(k, c(k, la if k in node.left.columns else ra)) for k in node.columns], ls)
            if node.predicate is None:
                return q.join(rs, join_type="cross")
            return q.join(rs, on=node.predicate.copy())
        if isinstance(node, A.SemiJoin | A.AntiJoin):
            ls, la = self.rel(node.left)
            rs, _ = self.rel(node.right)
            probe: exp.Expr = exists(rs, node.predicate.copy())
            if isinstance(node, A.AntiJoin):
                probe = exp.Not(this=probe)
            return select([(k, c(k, la)) for k in node.columns], ls, probe)
        if isinstance(node, A.UnionAll):
            return self.union(node)
        if isinstance(node, A.Aggregate):
            return self.aggregate(node)
        raise NotImplementedError(type(node).__name__)

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
