"""Per base table, a filter of its change log: the row images the view can ever see.

A row of a table T reaches a view only through the operators above T's scans; where those
filter it — a σ, an inner join's or a semijoin's condition, the ON of an outer join for its
null-supplying side — a row failing a condition on T's columns alone contributes nothing. Its
images in the change log can be left out before the fold: the fold of the remaining images is
the change table of σ_φ(T), and maintaining the view over σ_φ(T) gives the same view. Where
the Δ-script reads T itself (its post-state, or its pre-state rebuilt from the change table),
the rows that differ from σ_φ(T)'s are rows failing φ, which the same operators drop.

``log_filters`` derives φ per table: for each scan of T, the condition on T's columns implied
by the conditions on the way up to the view (``implied``: of a conjunction its parts on T
alone, of a disjunction the disjunction of its parts' — Q19's OR of three brands — else
nothing), stopping where rows are not just filtered: a γ, a union, the preserved side of an
outer join, the right side of an antijoin above its condition, and a cache (a stored
relation holds every row of its operator, filtered or not above it). Over all scans of T, φ is
the disjunction of theirs; a scan without one leaves T unfiltered. Conditions are kept only
when deterministic and made of plain operators (comparisons, arithmetic, CASE, casts,
LIKE/IN/BETWEEN and a few string functions), so a log row is judged as the table row would be.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlglot import exp

from idivm import algebra as A

# node types a condition pushed into the log may consist of (deterministic, no subqueries)
SAFE: tuple[type[exp.Expr], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.And, exp.Or,
    exp.Not, exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
    exp.Is, exp.In, exp.Between, exp.Like, exp.ILike, exp.Add, exp.Sub, exp.Mul, exp.Div,
    exp.Mod, exp.Neg, exp.Cast, exp.DataType, exp.DataTypeParam, exp.Tuple, exp.Case, exp.If,
    exp.Coalesce, exp.Substring, exp.Upper, exp.Lower, exp.Length, exp.Trim, exp.Abs,
    exp.Interval, exp.Var, exp.DPipe, exp.Concat, exp.Escape,
)


def _bare(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def implied(e: exp.Expr, cols: frozenset[str]) -> exp.Expr | None:
    """A condition on ``cols`` alone that every row satisfying ``e`` satisfies (None: none
    but TRUE)."""
    e = _bare(e)
    refs = A.referenced(e)
    if refs and refs <= cols and all(isinstance(n, SAFE) for n in e.walk()):
        return e
    if isinstance(e, exp.And):
        parts = [p for p in (implied(e.left, cols), implied(e.right, cols)) if p is not None]
        return exp.and_(*parts) if parts else None
    if isinstance(e, exp.Or):
        left, right = implied(e.left, cols), implied(e.right, cols)
        return None if left is None or right is None else exp.or_(left, right)
    return None


def _through(e: exp.Expr, exprs: Mapping[str, exp.Expr]) -> exp.Expr | None:
    """A condition on a projection's outputs as one on its input (None: it reads an output
    the projection does not define)."""
    if not A.referenced(e) <= set(exprs):
        return None

    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table:
            e = exprs[node.name].copy()
            return e if isinstance(e, exp.Column | exp.Literal | exp.Paren) else exp.paren(e)
        return node
    return e.copy().transform(rw)


def base_named(scan: A.Scan, e: exp.Expr) -> exp.Expr:
    """``e``, a condition over ``scan``'s plan column names, over its table's own column names."""
    names = dict(zip(scan.cols, scan.base_cols, strict=True))

    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name in names:
            return exp.column(names[node.name], quoted=True)
        return node
    return e.copy().transform(rw)


def _scans(node: A.Node, conds: tuple[exp.Expr, ...], cached: frozenset[int], root: A.Node
           ) -> Iterable[tuple[A.Scan, exp.Expr | None]]:
    """Each scan below ``node`` with the condition its rows must meet to reach the view."""
    if node.nid in cached and node is not root:
        conds = ()  # a cache stores every row of its operator
    if isinstance(node, A.Scan):
        cols = frozenset(node.cols)
        parts = [p for p in (implied(c, cols) for c in conds) if p is not None]
        yield node, exp.and_(*parts) if parts else None
    elif isinstance(node, A.Select):
        yield from _scans(node.child, (*conds, node.predicate), cached, root)
    elif isinstance(node, A.Project):
        exprs = dict(node.exprs)
        below = tuple(x for x in (_through(c, exprs) for c in conds) if x is not None)
        yield from _scans(node.child, below, cached, root)
    elif isinstance(node, A.Join):
        on = (node.predicate,) if node.predicate is not None else ()
        yield from _scans(node.left, (*conds, *on), cached, root)
        yield from _scans(node.right, (*conds, *on), cached, root)
    elif isinstance(node, A.OuterJoin):
        on = (node.predicate,) if node.predicate is not None else ()
        yield from _scans(node.left, () if node.full else conds, cached, root)
        yield from _scans(node.right, () if node.full else on, cached, root)
    elif isinstance(node, A.SemiJoin):
        yield from _scans(node.left, (*conds, node.predicate), cached, root)
        yield from _scans(node.right, (node.predicate,), cached, root)
    elif isinstance(node, A.AntiJoin):
        yield from _scans(node.left, conds, cached, root)
        yield from _scans(node.right, (node.predicate,), cached, root)
    else:  # γ, ∪ and the rest: their inputs' rows are not filtered by what is above
        for child in node.children:
            yield from _scans(child, (), cached, root)


def log_filters(root: A.Node, cached: Iterable[int] = ()) -> dict[str, exp.Expr]:
    """Base table → a condition on its columns (base names) that the images of its change log
    must meet to matter to the view rooted at ``root`` (``cached``: the nids of its stored
    relations); tables with no such condition are left out."""
    per: dict[str, list[exp.Expr | None]] = {}
    for scan, cond in _scans(root, (), frozenset(cached), root):
        if cond is not None:
            cond = base_named(scan, cond)
        per.setdefault(scan.table, []).append(cond)
    out: dict[str, exp.Expr] = {}
    for table, conds in per.items():
        if all(c is not None for c in conds):
            out[table] = exp.or_(*[exp.paren(c) for c in conds if c is not None]) \
                if len(conds) > 1 else conds[0]  # type: ignore[assignment]
    return out
