"""Algebra → SQL (a sqlglot SELECT producing exactly the operator's columns).

Used to materialize views and caches, to recompute, and for Input_pre / Input_post of operators
that are not materialized. ``leaf`` may substitute a relation for any operator (a cache, a
pre-state expression); returning None renders the operator itself.

How an operator renders is its rule's ``render`` (``rules/<operator>.py``), called with the
``Renderer`` and the node: it returns a ``Flat`` (a select-project-join part that operators
above may extend without a derived table) or a whole SELECT.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlglot import exp

from idivm import algebra as A
from idivm.planner.ruleapi import c, select, subquery, t

Leaf = Callable[[A.Node], "exp.Expr | None"]

# Python frames a backend may use while rendering (sqlglot's generator recurses per node)
DEEP_FRAMES = 20_000


@contextlib.contextmanager
def deep_trees() -> Iterator[None]:
    """Room for sqlglot's recursive SQL generation over deep trees, the interpreter's limit
    put back after (a context manager and a decorator). A Δ statement applies each i-diff of
    an input to its snapshot in a derived table of its own: fuzz seed 43016's view (EXISTS
    over a FULL JOIN with an outer-joined derived table) nests 73 UNIONs, ~300 expression
    levels — past Python's default 1,000 frames as sqlglot renders it."""
    old = sys.getrecursionlimit()
    if old < DEEP_FRAMES:
        sys.setrecursionlimit(DEEP_FRAMES)
    try:
        yield
    finally:
        if old < DEEP_FRAMES:
            sys.setrecursionlimit(old)


def render(node: A.Node, leaf: Leaf, types: Callable[[str], str | None] = lambda _: None
           ) -> exp.Select:
    return Renderer(leaf, types).node(node)


@dataclass
class Flat:
    """σ/π/⋈/⋉/▷/⟕ over sources as one SELECT: the sources (the first in FROM, each next
    joined on its condition: inner, or ``side`` "left" / "full"), the conditions, and each plan
    column's expression."""

    sources: list[tuple[exp.Expr, exp.Expr | None, str | None]]  # (source, on, side)
    where: list[exp.Expr]
    cols: dict[str, exp.Expr]

    def bind(self, e: exp.Expr) -> exp.Expr:
        """``e`` over plan columns, over the sources."""
        return A.rename_columns(e, {k: atom(v) for k, v in self.cols.items()})

    @property
    def outer(self) -> bool:
        """Whether an outer join is among the sources (then the sources end where a join
        condition may be placed only on the outer join's own ON)."""
        return any(side is not None for _, _, side in self.sources)

    def select(self, columns: tuple[str, ...]) -> exp.Select:
        q = select([(k, self.cols[k].copy()) for k in columns], self.sources[0][0])
        for src, on, side in self.sources[1:]:
            kind = side if side is not None else (None if on is not None else "cross")
            q = q.join(src, on=on if on is not None or side is None else exp.true(),
                       join_type=kind, copy=False)
        if self.where:
            q = q.where(exp.and_(*self.where) if len(self.where) > 1 else self.where[0],
                        copy=False)
        return q


def atom(e: exp.Expr) -> exp.Expr:
    """``e`` as an operand: parenthesized unless a column or a literal."""
    return e if isinstance(e, exp.Column | exp.Literal | exp.Paren) else exp.paren(e.copy())


class Renderer:
    """What an operator's ``render`` is given: its inputs as flat parts or relations."""

    def __init__(self, leaf: Leaf, types: Callable[[str], str | None]) -> None:
        self.leaf = leaf
        self.types = types
        self.n = 0

    def alias(self) -> str:
        self.n += 1
        return f"q{self.n}"

    def rel(self, node: A.Node) -> tuple[exp.Expr, str]:
        """``node`` as one aliased relation (a table or a derived table)."""
        a = self.alias()
        sub = self.leaf(node)
        if isinstance(sub, exp.Table):
            return t(sub.name, a), a
        if sub is not None:
            return subquery(sub, a), a
        return subquery(self.node(node), a), a

    def as_flat(self, node: A.Node) -> Flat:
        """``node`` as a flat part over one relation."""
        src, a = self.rel(node)
        return Flat([(src, None, None)], [], {k: c(k, a) for k in node.columns})

    def _own(self, node: A.Node) -> Flat | exp.Select | None:
        if self.leaf(node) is not None:
            return None
        from idivm.rules import rule_for

        fn = rule_for(node).render
        if fn is None:
            raise NotImplementedError(f"operator {type(node).__name__} has no render rule")
        return fn(self, node)

    def node(self, node: A.Node) -> exp.Select:
        own = self._own(node)
        if isinstance(own, Flat):
            return own.select(node.columns)
        if own is not None:
            return own
        src, a = self.rel(node)  # a relation the caller substitutes
        return select([(k, c(k, a)) for k in node.columns], src)

    def flat(self, node: A.Node) -> Flat:
        """A select-project-join subtree as one SELECT (no derived table per operator)."""
        own = self._own(node)
        if isinstance(own, Flat):
            return own
        if own is not None:
            a = self.alias()
            return Flat([(subquery(own, a), None, None)], [],
                        {k: c(k, a) for k in node.columns})
        return self.as_flat(node)
