"""Algebraic rewrites of the view's algebra before pass 1: small pure functions, each
``(node, context) -> node``, tried in order on every operator bottom-up (sqlglot's optimizer
``RULES``). A rule returns its input unchanged when it does not apply; the result is
equivalent to the input on every database state, so every strategy and backend may plan it.

- ``aggregate_below_outer_join``: γ_{G; f(r.x)}(l ⟕_{l.k = r.k ∧ φ_r} r), G holding the IDs
  of l and only l's columns, is π_{G, f'}(l ⟕_{l.k = r.k} γ_{r.k; f(r.x)}(σ_φr r)) — each row
  of l is one group, and its aggregate is the aggregate of the r rows it matches, which the
  pushed-down γ computes per join key (COUNT coalesced to 0 where no row matches, COUNT(*) to
  1: the padded row). The pushed-down γ is linear in r's changes, where the γ above the outer
  join re-derives every l row a changed r row touches from all of its matches (TPC-H Q13's
  orders per customer).
- ``semijoin_below_join``: (A ⋈ B) ⋉_φ P with φ reading no column of B is (A ⋉_φ P) ⋈ B:
  the rows of A a semi-join drops join nothing (TPC-H Q20: the partsupp rows of forest
  parts, before the join with each row's shipped quantity).
- ``grouped_join_magic``: a γ_K joined on K = s (a correlated scalar subquery decorrelated into
  a grouped aggregate) where s comes from a filtered scan σ(T) of the other input computes
  only the groups whose keys σ(T) holds: γ_K(R ⋉_{K = s} σ(T)) (a magic set, Mumick et al.).
  Changes of R outside those keys stop at the semi-join instead of updating groups no row
  joins, whose changed values would make the join re-derive its rows (TPC-H Q17: the average
  quantity of every part, for the parts of one brand and container).
- ``implied_filter_below_join``: an inner join whose condition is a disjunction of
  conjunctions — σ over a join after the optimizer folded it in — keeps it, and also filters
  each side that is a (filtered) scan by the part of it on that side's columns alone
  (``log_filter.implied``: of each disjunct its conjuncts on those columns, OR'd): every row
  the condition keeps meets it, and it is a σ directly over the scan, which a selective cache
  may store (TPC-H Q19's parts of three brands and containers, 0.2% of ``part``: a batch's
  line items of other parts stop at the fold).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.log_filter import implied


@dataclass(frozen=True)
class Context:
    """What a rewrite may use: the catalog, fresh operator ids, and the column names in use."""

    catalog: Catalog
    nids: Iterator[int]
    taken: set[str]

    def fresh(self, base: str) -> str:
        return A.fresh_name(base, self.taken)


Rewrite = Callable[[A.Node, Context], A.Node]


def _ids_of(node: A.Node, catalog: Catalog) -> tuple[str, ...]:
    from idivm.planner.ids import infer_ids

    _, infos = infer_ids(node, catalog)
    return infos[node.nid].ids


def aggregate_below_outer_join(node: A.Node, ctx: Context) -> A.Node:
    if not (isinstance(node, A.Aggregate) and node.group_by):
        return node
    child, rename = node.child, {c: c for c in node.child.columns}
    if isinstance(child, A.Project):  # a projection of plain columns between γ and ⟕
        if not all(isinstance(e, exp.Column) for _, e in child.exprs) or child.hidden:
            return node
        rename = {n: e.name for n, e in child.exprs}
        child = child.child
    if not (isinstance(child, A.OuterJoin) and not child.full):
        return node
    left, right = child.left, child.right
    lcols, rcols = set(left.columns), set(right.columns)
    group = [rename[g] for g in node.group_by]
    if not set(group) <= lcols:
        return node
    if any(a.arg is not None and rename[a.arg] not in rcols for a in node.aggs):
        return node
    pairs: list[tuple[str, str]] = []
    l_only: list[exp.Expr] = []
    r_only: list[exp.Expr] = []
    for c in A.conjuncts(child.predicate):
        refs = A.referenced(c)
        if (isinstance(c, exp.EQ) and isinstance(c.left, exp.Column)
                and isinstance(c.right, exp.Column)
                and {c.left.name, c.right.name} & lcols and {c.left.name, c.right.name} & rcols):
            lc, rc = (c.left.name, c.right.name) if c.left.name in lcols else (
                c.right.name, c.left.name)
            pairs.append((lc, rc))
        elif refs <= rcols:
            r_only.append(c)
        elif refs <= lcols:
            l_only.append(c)
        else:
            return node
    if not pairs or not set(_ids_of(left, ctx.catalog)) <= set(group):
        return node
    r_in: A.Node = right
    if r_only:
        r_in = A.Select(next(ctx.nids), right, A.conjoin(r_only))  # type: ignore[arg-type]
    keys = tuple(dict.fromkeys(rc for _, rc in pairs))
    pushed = tuple(A.AggCall(ctx.fresh(f"{a.name}__r"), a.func,
                             rename[a.arg] if a.arg is not None else None) for a in node.aggs)
    below = A.Aggregate(next(ctx.nids), r_in, keys, pushed)
    on = A.conjoin([exp.EQ(this=A.col(lc), expression=A.col(rc)) for lc, rc in pairs] + l_only)
    joined = A.OuterJoin(next(ctx.nids), left, below, on)
    exprs: list[tuple[str, exp.Expr]] = [(g, A.col(rename[g])) for g in node.group_by]
    for a, p in zip(node.aggs, pushed, strict=True):
        value: exp.Expr = A.col(p.name)
        if a.func in ("count", "count_star"):  # no match: 0 rows counted, or the padded one
            value = exp.Coalesce(this=value, expressions=[
                exp.Literal.number(0 if a.func == "count" else 1)])
        exprs.append((a.name, value))
    return A.Project(next(ctx.nids), joined, tuple(exprs))


def _through_projections(node: A.Node) -> tuple[A.Aggregate, dict[str, str]] | None:
    """``node`` as π*(γ): the γ and {column of node: the γ column it is}, plain columns only."""
    names = {c: c for c in node.columns}
    while isinstance(node, A.Project):
        below = {n: e.name for n, e in node.exprs if isinstance(e, exp.Column)}
        names = {k: below[v] for k, v in names.items() if v in below}
        node = node.child
    if not isinstance(node, A.Aggregate) or not node.group_by:
        return None
    return node, {k: v for k, v in names.items() if v in node.group_by}


def _filters(node: A.Node) -> bool | None:
    """For a tree of σ and semi-joins over scans: whether it filters its scan (True) or
    not (False); None for any other tree (which ``_copy`` cannot copy)."""
    if isinstance(node, A.Scan):
        return False
    if isinstance(node, A.Select):
        return None if _filters(node.child) is None else True
    if isinstance(node, A.SemiJoin):
        if _filters(node.left) is None or _filters(node.right) is None:
            return None
        return True
    return None


def _filtered_source(node: A.Node, cols: set[str]) -> A.Node | None:
    """Below ``node``, a filtered scan (σ and semi-joins over it) holding every column of
    ``cols``, whose rows bound the values those columns take in ``node`` (down through inner
    joins, σ and the left side of semi-joins); None when there is none."""
    while True:
        if _filters(node):
            return node
        nxt = None
        if isinstance(node, A.Select):
            nxt = node.child
        elif isinstance(node, A.SemiJoin):
            nxt = node.left
        elif isinstance(node, A.Join):
            nxt = next((ch for ch in node.children if cols <= set(ch.columns)), None)
        if nxt is None or not cols <= set(nxt.columns):
            return None
        node = nxt


def _copy(node: A.Node, ctx: Context) -> tuple[A.Node, dict[str, str]]:
    """A copy of a tree of σ and semi-joins over scans under fresh operator ids and column
    names (the plan's column names stay unique)."""
    if isinstance(node, A.Scan):
        cols = tuple(ctx.fresh(f"{c}__m") for c in node.cols)
        return (A.Scan(next(ctx.nids), node.table, f"{node.alias}__m", cols, node.base_cols),
                dict(zip(node.cols, cols, strict=True)))
    if isinstance(node, A.Select):
        child, names = _copy(node.child, ctx)
        pred = A.rename_columns(node.predicate, {k: A.col(v) for k, v in names.items()})
        return A.Select(next(ctx.nids), child, pred), names
    assert isinstance(node, A.SemiJoin)
    left, lnames = _copy(node.left, ctx)
    right, rnames = _copy(node.right, ctx)
    both = {**lnames, **rnames}
    pred = A.rename_columns(node.predicate, {k: A.col(v) for k, v in both.items()})
    return A.SemiJoin(next(ctx.nids), left, right, pred), lnames


def semijoin_below_join(node: A.Node, ctx: Context) -> A.Node:
    if not (isinstance(node, A.SemiJoin) and isinstance(node.left, A.Join)):
        return node
    join = node.left
    reads = A.referenced(node.predicate) & set(join.columns)
    for i, side in enumerate(join.children):
        if reads <= set(side.columns):
            pushed = A.SemiJoin(next(ctx.nids), side, node.right, node.predicate)
            return A.replace_child(join, i, pushed)
    return node


def grouped_join_magic(node: A.Node, ctx: Context) -> A.Node:
    if not isinstance(node, A.Join | A.OuterJoin) or getattr(node, "full", False):
        return node
    for gi in (0, 1) if isinstance(node, A.Join) else (1,):
        grouped, other = node.children[gi], node.children[1 - gi]
        found = _through_projections(grouped)
        if found is None:
            continue
        agg, keys = found
        pairs = []  # (γ group column, column of the other input)
        for a, b in A.equalities(node.predicate):
            if a in other.columns:
                a, b = b, a
            if a in keys and b in other.columns:
                pairs.append((keys[a], b))
        if not pairs:
            continue
        source = _filtered_source(other, {b for _, b in pairs})
        if source is None:
            continue
        magic, names = _copy(source, ctx)
        on = A.conjoin([exp.EQ(this=A.col(k), expression=A.col(names[b])) for k, b in pairs])
        assert on is not None
        restricted = A.SemiJoin(next(ctx.nids), agg.child, magic, on)
        new_agg = A.replace_child(agg, 0, restricted)
        return A.replace_child(node, gi, _replaced(grouped, agg, new_agg))
    return node


def _replaced(node: A.Node, old: A.Node, new: A.Node) -> A.Node:
    if node is old:
        return new
    return A.replace_child(node, 0, _replaced(node.children[0], old, new))


def implied_filter_below_join(node: A.Node, ctx: Context) -> A.Node:
    if not isinstance(node, A.Join) or node.predicate is None:
        return node
    on = node.predicate
    if not any(isinstance(c, exp.Or) for c in A.conjuncts(on)):
        return node  # (a conjunction's parts on one side are pushed down already)
    out: A.Node = node
    for i, side in enumerate(node.children):
        scan = side.child if isinstance(side, A.Select) else side
        if not isinstance(scan, A.Scan):
            continue
        cond = implied(on, frozenset(side.columns))
        if cond is None:
            continue
        have = A.conjuncts(side.predicate) if isinstance(side, A.Select) else []
        if cond.sql() in {c.sql() for c in have}:
            continue
        pred = A.conjoin([*have, exp.paren(cond.copy())])
        assert pred is not None
        out = A.replace_child(out, i, A.Select(next(ctx.nids), scan, pred))
    return out


RULES: tuple[Rewrite, ...] = (aggregate_below_outer_join, semijoin_below_join,
                              grouped_join_magic, implied_filter_below_join)


def _hidden_read(root: A.Node) -> set[str]:
    """The aggregates' hidden columns (COUNT, Table 12 state) some operator reads: a rewrite
    replacing an aggregate must keep them, so it leaves those aggregates alone."""
    hidden = {s for n in A.walk(root) if isinstance(n, A.Aggregate)
              for s in (A.COUNT, *(x for a in n.aggs for x in a.state))}
    read: set[str] = set()
    for n in A.walk(root):
        for v in vars(n).values():
            if isinstance(v, exp.Expr):
                read |= A.referenced(v)
        if isinstance(n, A.Project):
            read |= {c for _, e in n.exprs for c in A.referenced(e)}
        if isinstance(n, A.Aggregate):
            read |= set(n.group_by) | {a.arg for a in n.aggs if a.arg}
        if isinstance(n, A.UnionAll):
            read |= set(n.left_cols) | set(n.right_cols)
    return hidden & read


def rewrite(root: A.Node, catalog: Catalog, rules: tuple[Rewrite, ...] = RULES) -> A.Node:
    """``root`` with every rule applied to every operator, children first."""
    if _hidden_read(root):
        return root
    ctx = Context(catalog, itertools.count(max(n.nid for n in A.walk(root)) + 1),
                  {c for n in A.walk(root) for c in n.columns})

    def go(node: A.Node) -> A.Node:
        for i, child in enumerate(node.children):
            new = go(child)
            if new is not child:
                node = A.replace_child(node, i, new)
        for rule in rules:
            node = rule(node, ctx)
        return node

    return go(root)
