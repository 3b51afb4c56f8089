"""A pass over a view's SQL: the WITH queries it reads more than once, held as views of their own.

The frontend inlines a CTE at every reference, so a CTE the view reads twice is planned twice: an
aggregate CTE gets one cache per reference, each maintained from the same changes (TPC-H Q15
reads ``revenue`` twice — two caches of the same per-supplier sums, each recomputed from the
line items' log). A backend with views over views can hold such a CTE as a view of its own,
maintained once, whose net changes the view then reads from its log like a table's:
``shared_ctes`` finds them, ``read_from`` rewrites the view to read those views instead.

Only what pays and is safe is taken: a top-level, non-recursive CTE, read at least twice, whose
query is one ``SELECT … GROUP BY`` (planned as an aggregate, cached below the view either way)
that reads no other CTE of its WITH, and whose name no nested WITH redefines. Pure functions of
the SQL text; the backend decides the rest (a name for the view, whether its IDs can key it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlglot import exp

from idivm.errors import UnsupportedSQL
from idivm.frontend import parsed
from idivm.planner.model import MAX_IDENT

P = TypeVar("P")

__all__ = ["SharedCte", "as_written", "chosen", "create_with_views", "read_from",
           "shared_ctes"]

DIALECT = "postgres"


@dataclass(frozen=True)
class SharedCte:
    """A CTE the view reads more than once."""

    alias: str  # its name, folded as PostgreSQL folds it
    body: str  # its query (PostgreSQL SQL), the CTE's column list applied as output names
    references: int  # how often the view reads it


def _with(tree: exp.Expr) -> exp.With | None:
    w = tree.args.get("with_")
    return w if isinstance(w, exp.With) and not w.args.get("recursive") else None


def _references(tree: exp.Expr, ctes: list[exp.CTE]) -> dict[str, list[exp.Table]]:
    """CTE name → the unqualified table references that read it: in the main query and in the
    bodies of the CTEs after it (the earlier ones, and its own body, read a table of that
    name)."""
    inside = {id(x): k for k, c in enumerate(ctes) for x in c.this.walk()}
    index = {c.alias: k for k, c in enumerate(ctes)}
    out: dict[str, list[exp.Table]] = {c.alias: [] for c in ctes}
    for t in tree.find_all(exp.Table):
        if t.args.get("db") or t.args.get("catalog") or t.name not in index:
            continue
        k = inside.get(id(t))
        if k is None or k > index[t.name]:
            out[t.name].append(t)
    return out


def _body(cte: exp.CTE) -> exp.Select | None:
    """The CTE's query with its column list (if any) as output names; None when it is not one
    ``SELECT … GROUP BY``."""
    body = cte.this
    if not isinstance(body, exp.Select) or not body.args.get("group"):
        return None
    alias = cte.args.get("alias")
    names = [c for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
    if not names:
        return body.copy()
    items = body.expressions
    if len(items) != len(names) or any(isinstance(e, exp.Star) for e in items):
        return None
    out = body.copy()
    out.set("expressions", [exp.alias_(e.unalias().copy(), n.copy())
                            for e, n in zip(items, names, strict=True)])
    return out


def shared_ctes(sql: str) -> tuple[SharedCte, ...]:
    """The CTEs of the view (top-level WITH) worth holding as views of their own (see the
    module's docstring), in WITH order."""
    tree = parsed(sql, DIALECT)
    w = _with(tree)
    if w is None:
        return ()
    ctes = list(w.expressions)
    names = [c.alias for c in ctes]
    nested = {c.alias for c in tree.find_all(exp.CTE) if c.parent is not w}
    refs = _references(tree, ctes)
    out = []
    for k, cte in enumerate(ctes):
        body = _body(cte)
        if body is None or cte.alias in nested or len(refs[cte.alias]) < 2 \
                or names.count(cte.alias) > 1:
            continue
        earlier = set(names[:k])
        if any(not t.args.get("db") and t.name in earlier for t in body.find_all(exp.Table)):
            continue  # (it reads another CTE: kept inline with it)
        out.append(SharedCte(cte.alias, body.sql(DIALECT), len(refs[cte.alias])))
    return tuple(out)


def read_from(sql: str, views: Mapping[str, str]) -> str:
    """The view's SQL with the CTEs named in ``views`` (CTE name → the view holding it) taken
    out of its WITH and every reference to them reading that view instead, under the CTE's
    name (or the reference's own alias), so the rest of the query reads as before."""
    tree = parsed(sql, DIALECT)
    w = _with(tree)
    if w is None or not views:
        return tree.sql(DIALECT)
    ctes = list(w.expressions)
    for alias, refs in _references(tree, ctes).items():
        if alias not in views:
            continue
        for t in refs:
            name = t.args.get("alias") or exp.TableAlias(this=exp.to_identifier(alias))
            t.replace(exp.Table(this=exp.to_identifier(views[alias], quoted=True),
                                alias=name.copy()))
    kept = [c for c in ctes if c.alias not in views]
    if kept:
        w.set("expressions", kept)
    else:
        tree.set("with_", None)
    return tree.sql(DIALECT)


def chosen(name: str, sql: str, holdable: Callable[[str, str], bool]
           ) -> dict[str, tuple[str, str]]:
    """The shared CTEs of view ``name`` a backend holds as views of their own: CTE name →
    (the view's name, ``<name>__<cte>``; its query), for those ``holdable(view, query)``
    accepts (the backend's say: the name free, the query planned as a view its IDs key). SQL
    that does not parse gives none (creating the view then says why)."""
    try:
        shared = shared_ctes(sql)
    except UnsupportedSQL:
        return {}
    out: dict[str, tuple[str, str]] = {}
    for cte in shared:
        view = f"{name}__{cte.alias}"
        if len(view.encode()) <= MAX_IDENT and view != name \
                and all(v != view for v, _ in out.values()) and holdable(view, cte.body):
            out[cte.alias] = (view, cte.body)
    return out


def create_with_views(name: str, sql: str, hoisted: Mapping[str, tuple[str, str]],
                      create: Callable[[str, str], P], annotate: Callable[..., None],
                      drop: Callable[[str], None]) -> P:
    """Create view ``name`` over the views of its CTEs (``hoisted``, from ``chosen``): each CTE
    view first (``create(view, query)``; its ``owner`` recorded at once, so a create killed
    halfway leaves views the next create of ``name`` can tell are its own), then the view
    reading them, its query as written recorded (``annotate(view, **entries)``). On any
    failure the CTE views made are dropped (``drop``) and the error re-raised. The backends'
    side effects come in as callbacks; the order is the same on every backend."""
    created: list[str] = []
    try:
        for view, body in hoisted.values():
            create(view, body)
            created.append(view)
            annotate(view, owner=name)
        out = create(name, read_from(sql, {a: v for a, (v, _) in hoisted.items()}))
        annotate(name, written=sql)
    except BaseException:
        for v in reversed(created):  # nothing of the attempt stays
            drop(v)
        raise
    return out


def as_written(views: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Registry entries (view → its ``sql``, ``owner``, ``written``) → the query each view was
    created with, leaving out the views made of CTEs."""
    return {v: str(e.get("written") or e["sql"]) for v, e in views.items() if not e.get("owner")}
