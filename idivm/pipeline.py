"""Pipelines: views that read other views of the same maintainer (pure helpers shared by the
backends).

A view read by another view is, to the views over it, a table keyed by its IDs: its declared
columns, with the IDs among them and never NULL (else its rows could not be named by the
i-diffs of the views over it). Its changes reach them as the net changes its refreshes applied
to its stored relation (PostgreSQL: logged by triggers on the stored table; Spark: the stored
Delta table's change feed), never by recomputing it. Refreshes run in dependency order: a view
after every view it reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from idivm.catalog import Column, Table, normalize_type
from idivm.errors import UnsupportedSQL
from idivm.plan import Plan

__all__ = ["check_input", "check_reads", "input_table", "order"]

GLOBAL_GROUP = "___g"  # how the hidden ID of an aggregate without GROUP BY ends


def check_reads(name: str, reads: Iterable[str]) -> None:
    """Refuse a view that reads itself (other cycles cannot be made: a view reads only views
    that exist before it)."""
    if name in set(reads):
        raise UnsupportedSQL("a view that reads itself",
                             f"view {name} reads {name}: a pipeline of views is a graph "
                             "without cycles")


def input_table(name: str, plan: Plan, types: Mapping[str, str]) -> Table:
    """View ``name`` (its ``plan``; ``types``: its columns' SQL types) as a table of the views
    over it: its declared columns, keyed by its IDs — refused, naming why, when its IDs are not
    among its columns or can be NULL (``check_input``)."""
    check_input(name, plan)
    key = tuple(plan.store.key)
    known = plan.infos[plan.root.nid].nullable  # (NOT NULL where the planner can tell)
    return Table(name, tuple(Column(c, normalize_type(types[c]),
                                    c not in key and known.get(c, True))
                             for c in plan.columns), key)


def check_input(name: str, plan: Plan) -> None:
    """Refuse, naming why, view ``name`` (its ``plan``) as an input of other views when its
    IDs are not among its columns or can be NULL."""
    key = tuple(plan.store.key)
    what = f"view {name} read by another view"
    hidden = [k for k in key if k not in plan.columns]
    if not key or (hidden and all(k.endswith(GLOBAL_GROUP) for k in hidden)):
        raise UnsupportedSQL(what, f"{name} has no IDs (one row: an aggregate without "
                             "GROUP BY), so a view over it cannot name the rows that change")
    if hidden:
        shown = ", ".join(k.removeprefix("__id_") for k in hidden)
        raise UnsupportedSQL(what, f"its rows are identified by IDs it does not show "
                             f"({shown}): add the key columns of the tables it reads to the "
                             f"SELECT list of {name}")
    nullable = [k for k in key if k in plan.store.nullable]
    if nullable:
        raise UnsupportedSQL(what, f"its IDs {', '.join(nullable)} can be NULL (declare the "
                             "columns they come from NOT NULL, or filter out their NULLs): a "
                             "view over it addresses its rows by them")


def order(upstream: Mapping[str, Sequence[str]], names: Iterable[str]) -> list[str]:
    """``names`` and every view they read (transitively), each once, every view after the
    views it reads (ties by name); ``upstream``: view → the views it reads. A cycle raises
    ``ValueError`` naming it."""
    out: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: placed

    def visit(n: str, path: tuple[str, ...]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError(" → ".join([*path[path.index(n):], n]))
        state[n] = 1
        for u in sorted(upstream.get(n, ())):
            visit(u, (*path, n))
        state[n] = 2
        out.append(n)

    for n in sorted(names):
        visit(n, ())
    return out
