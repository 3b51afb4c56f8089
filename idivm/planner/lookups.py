"""A pass after composition: the columns of the tables the Δ-script finds rows of by value.

Most rules reach a stored relation through IDs, and every stored relation is indexed on them.
A few find rows by the value of another column: a MIN/MAX whose extreme row goes is
re-derived from Input_post (``SELECT max(x) FROM input``, per group: on the group's columns,
then x), and a ⋈ over a one-row input whose
φ is ``x = v`` flips the rows whose x equals v's old or new value (TPC-H Q15: the suppliers
whose revenue is the old or the new maximum). Each rule says which input and columns
(``OperatorRule.lookups``); this pass follows those columns down to the table they are read
from — through operators that pass them on unchanged (``OperatorRule.restrict``), never into a
materialized cache (the rule reads the cache, not the table) — and returns (table, its columns).

Only a backend that owns a table's storage acts on it: on PostgreSQL a view another view reads
is such a table (its store gets the index, ``postgres/maintainer.py``); the user's own tables are
never indexed behind their back. An index serves the rules; it never decides what they compute.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from idivm import algebra as A
from idivm.planner.model import NodeInfo

__all__ = ["Lookup", "input_lookups"]

Lookup = tuple[str, tuple[str, ...]]  # (table, its columns, in index order)


def _source(node: A.Node, col: str, materialized: Collection[int]) -> tuple[A.Scan, str] | None:
    """The scan ``col`` of ``node`` is read from unchanged, and its name there; None when it is
    computed, or read from a cache."""
    from idivm.rules import rule_for

    while True:
        if node.nid in materialized:
            return None
        if isinstance(node, A.Scan):
            return node, col
        restrict = rule_for(node).restrict
        steps = restrict(node, (col,)) if restrict is not None else ()
        step = next(((i, on[col]) for i, on in steps if col in on), None)
        if step is None:
            return None
        node, col = node.children[step[0]], step[1]


def input_lookups(root: A.Node, infos: Mapping[int, NodeInfo],
                  materialized: Collection[int]) -> tuple[Lookup, ...]:
    """(table, columns) per set of columns of one table the rules find rows by, sorted; the
    rules of the ID-based strategy say which (the tuple baseline gets the same indexes, so the
    two compare rules, not physical designs)."""
    from idivm.rules import rule_for

    out: set[Lookup] = set()
    for n in A.walk(root):
        hook = rule_for(n).lookups
        for idx, cols in hook(n, infos) if hook is not None else ():
            found = [_source(n.children[idx], c, materialized) for c in cols]
            scans = {f[0].nid for f in found if f is not None}
            if found and None not in found and len(scans) == 1:
                scan = next(f[0] for f in found if f is not None)
                out.add((scan.table, tuple(f[0].base_of(f[1]) for f in found if f)))
    return tuple(sorted(out))
