"""Runtime pruning: drop the parts of a Δ-script query that read i-diffs known to be empty.

The planner cannot know which i-diffs a round will leave empty; a backend that has counted them
(the Spark backend sizes every §5 instance before running a rule) removes ``EXISTS`` tests over
empty relations and folds the boolean connectives around them. A snapshot such as
``v__cache__old`` tests one ``EXISTS`` per i-diff applied to the cache; after 200 price updates
only one of them is not empty, and every ``EXISTS`` left is a join an engine would run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlglot import exp


def _empty_select(node: exp.Expr, empty: Collection[str]) -> bool:
    """A SELECT that returns no rows because its first source is empty (and nothing, such as
    an aggregate without GROUP BY or an outer join keeping the other side, adds a row)."""
    if not isinstance(node, exp.Select):
        return False
    src = node.args.get("from_")
    if src is None or not isinstance(src.this, exp.Table) or src.this.name not in empty:
        return False
    if any(j.side not in ("", "LEFT") for j in node.args.get("joins") or []):
        return False
    return bool(node.args.get("group")) or not any(
        isinstance(e.unalias(), exp.AggFunc) or e.find(exp.AggFunc) for e in node.expressions)


def _is(node: exp.Expr, value: bool) -> bool:
    return isinstance(node, exp.Boolean) and node.this is value


def _nothing(node: exp.Expr) -> bool:
    """A plain SELECT whose WHERE folded to FALSE (no aggregate: it returns no row)."""
    if not isinstance(node, exp.Select) or node.args.get("group"):
        return False
    where = node.args.get("where")
    return where is not None and _is(where.this, False) and not any(
        e.find(exp.AggFunc) for e in node.expressions)


def _fold(node: exp.Expr) -> exp.Expr | None:
    """The node with a boolean constant operand folded away, or None when nothing folds."""
    if isinstance(node, exp.Union):  # a branch that returns nothing adds nothing (the
        # snapshots' branches hold rows unique by IDs, so DISTINCT has nothing to remove)
        if _nothing(node.right):
            return node.left.copy()
        if _nothing(node.left):
            return node.right.copy()
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.Boolean):
        return node.this.copy()
    if isinstance(node, exp.Not) and isinstance(node.this, exp.Boolean):
        return exp.Boolean(this=not node.this.this)
    if isinstance(node, exp.Or | exp.And):
        left, right = node.left, node.right
        absorbing = isinstance(node, exp.Or)  # TRUE absorbs OR, FALSE absorbs AND
        if _is(left, absorbing) or _is(right, absorbing):
            return exp.Boolean(this=absorbing)
        if _is(left, not absorbing):
            return right.copy()
        if _is(right, not absorbing):
            return left.copy()
    return None


def prune_empty(query: exp.Expr, empty: Collection[str]) -> exp.Expr:
    """A copy of the query with ``EXISTS`` over empty i-diffs replaced by FALSE, folded."""
    if not empty:
        return query
    q = query.copy()
    # children before parents: every fold sees its operands already folded
    for node in reversed(list(q.walk(bfs=False))):
        if isinstance(node, exp.Exists) and _empty_select(node.this, empty):
            node.replace(exp.false())
            continue
        folded = _fold(node)
        if folded is not None:
            node.replace(folded)
    return q


def reads_only_empty(reads: Collection[str], known: Mapping[str, int],
                     computed: Collection[str]) -> bool:
    """Whether a statement reading ``reads`` returns no rows because every i-diff it reads is
    known to be empty: the relations counted (``known``) or computed by the Δ-script
    (``computed``) among its inputs are all counted 0. A statement that reads only stored
    relations and base tables is never idle; nor is one reading a computed relation that was
    not counted (fuzz seeds 30067, 30070: γ's per-group deltas read the cache's replayed
    Input_post snapshot, uncounted, beside its empty Input_pre snapshot)."""
    inputs = [r for r in reads if r in known or r in computed]
    return bool(inputs) and all(known.get(r) == 0 for r in inputs)
