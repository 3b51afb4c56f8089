"""The core algebra of a view → a flat aggregate query over relation atoms (the fresh frontend).

DBToaster compiles sums of products of relation atoms, conditions and values (its AGCA). The
same shape is reached here from idivm's algebra: the select-project-join part is flattened into
relation atoms whose columns are variables (columns joined by equality share one variable, so
an equi-join needs no condition), the remaining predicates become conditions, and every
aggregate of the top γ becomes one or more sums over that body:

* ``SUM(x)``: a sum of ``x``, polynomially expanded across atoms (``a.v - b.v`` becomes two
  monomials, so each monomial's values factor by relation: DBToaster's polynomial expansion);
* ``COUNT(*)``/``COUNT(x)``: a sum of 1; ``AVG(x)``: SUM and COUNT;
* ``MIN(x)``/``MAX(x)``: a count grouped additionally by ``x`` (a map of value multiplicities;
  the extreme is read off the group's slice, so deletions never need a rescan);
* DISTINCT and bag SPJ views: a count per output row.

Operators outside this shape are refused here, before any code exists, naming the construct.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fresh import expr as E
from idivm.frontend import parse_view


@dataclass(frozen=True)
class Atom:
    """A relation atom R(v1, …, vn): one alias of a base table, column i bound to ``vars[i]``."""

    rel: str
    vars: tuple[E.Var, ...]

    def show(self) -> str:
        return f"{self.rel}({', '.join(v.name for v in self.vars)})"


@dataclass(frozen=True)
class Mono:
    """coef · Π atoms · Π [conds] · Π factors — one monomial of a map's defining sum."""

    coef: float
    atoms: tuple[Atom, ...]
    conds: tuple[E.Expr, ...] = ()
    factors: tuple[E.Expr, ...] = ()

    def show(self) -> str:
        parts = [a.show() for a in self.atoms] + [f"[{E.show(c)}]" for c in self.conds]
        parts += [E.show(f) for f in self.factors]
        head = "" if self.coef == 1 else ("-" if self.coef == -1 else f"{self.coef:g}·")
        return head + (" · ".join(parts) or "1")


@dataclass(frozen=True)
class Agg:
    """One output aggregate and the sums it reads (``sum``: a SUM map; ``mm``: value counts)."""

    name: str
    func: str  # sum, count, avg, min, max
    arg: E.Expr | None
    type: str


@dataclass(frozen=True)
class FreshQuery:
    """Σ over ``atoms`` with ``conds``, grouped by ``group`` (names → expressions over vars).

    ``output`` is the chain of projections and selections above the aggregate (top-down, as
    algebra nodes) evaluated when rows are read; ``bag`` marks a view without aggregate, whose
    rows repeat with their multiplicity.
    """

    sql: str
    columns: tuple[str, ...]
    group: tuple[tuple[str, E.Expr], ...]
    aggs: tuple[Agg, ...]
    atoms: tuple[Atom, ...]
    conds: tuple[E.Expr, ...]
    output: tuple[A.Node, ...]
    bag: bool
    tables: tuple[str, ...]
    col_types: dict[str, str]


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _refuse_node(node: A.Node) -> None:
    """Refuse an operator its rule gives fresh views no translation for."""
    from idivm.rules import rule_for

    rule = rule_for(node)
    if rule.fresh is None:
        raise UnsupportedSQL(*(rule.fresh_refusal or (node.label,
                                                      "not maintained by fresh views")))


class Flattener:
    """SPJ subtree → atoms, conditions and an environment plan column → expression; each
    operator's rule (``fresh``) adds its part."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.atoms: list[Atom] = []
        self.conds: list[E.Expr] = []
        self.env: dict[str, E.Expr] = {}

    def visit(self, node: A.Node) -> None:
        from idivm.rules import rule_for

        fn = rule_for(node).fresh
        if fn is None:
            _refuse_node(node)
        else:
            fn(self, node)

    def convert(self, e: exp.Expr) -> E.Expr:
        return E.from_sql(e, lambda name: self.env[name])


def _unify(atoms: Sequence[Atom], conds: Sequence[E.Expr],
           env: dict[str, E.Expr]) -> tuple[list[Atom], list[E.Expr], dict[str, E.Expr]]:
    """Merge variables equated by a condition; the equality itself disappears."""
    uf = _UnionFind()
    rest = []
    for c in conds:
        if (isinstance(c, E.Cmp) and c.op == "=" and isinstance(c.left, E.Var)
                and isinstance(c.right, E.Var) and c.left.type == c.right.type):
            uf.union(c.left.name, c.right.name)
        else:
            rest.append(c)

    def sub(e: E.Expr) -> E.Expr:
        return E.substitute(e, lambda n: E.Var(n.type, uf.find(n.name))
                            if isinstance(n, E.Var) else None)

    new_atoms = [Atom(a.rel, tuple(E.Var(v.type, uf.find(v.name)) for v in a.vars))
                 for a in atoms]
    new_conds = []
    for c in (sub(c) for c in rest):
        if isinstance(c, E.Cmp) and c.op == "=" and c.left == c.right:
            continue
        if c not in new_conds:
            new_conds.append(c)
    return new_atoms, new_conds, {k: sub(v) for k, v in env.items()}


def translate(sql: str, catalog: Catalog) -> FreshQuery:
    """Parse and translate a view; raises UnsupportedSQL naming the construct it refuses."""
    vq = parse_view(sql, catalog)
    output: list[A.Node] = []
    node = vq.root
    while isinstance(node, A.Project | A.Select) and _has_aggregate_below(node):
        output.append(node)
        node = node.children[0]
    for n in A.walk(node):
        if n is not node or not isinstance(n, A.Aggregate):
            _refuse_node(n)
    f = Flattener(catalog)
    if isinstance(node, A.Aggregate):
        f.visit(node.child)
        atoms, conds, env = _unify(f.atoms, f.conds, f.env)
        group = tuple((g, env[g]) for g in node.group_by)
        aggs = []
        for a in node.aggs:
            arg = env[a.arg] if a.arg is not None else None
            if arg is not None and arg.type == "str" and a.func != "count":
                raise UnsupportedSQL(f"{a.func.upper()} over text", "fresh views intern text, "
                                     "so it has no order and no sum")
            t = {"count": "int", "count_star": "int", "avg": "float"}.get(
                a.func, arg.type if arg is not None else "int")
            aggs.append(Agg(a.name, "count" if a.func == "count_star" else a.func, arg, t))
        col_types = {g: e.type for g, e in group} | {a.name: a.type for a in aggs}
        col_types[A.COUNT] = "int"
        if node.is_global:
            col_types["__g"] = "int"
        return FreshQuery(sql, vq.columns, group, tuple(aggs), tuple(atoms), tuple(conds),
                          tuple(output), False, _tables(atoms), col_types)
    f.visit(node)
    atoms, conds, env = _unify(f.atoms, f.conds, f.env)
    group = tuple((c, env[c]) for c in node.columns)
    return FreshQuery(sql, vq.columns, group, (), tuple(atoms), tuple(conds), (), True,
                      _tables(atoms), {c: e.type for c, e in group})


def _has_aggregate_below(node: A.Node) -> bool:
    return any(isinstance(n, A.Aggregate) for n in A.walk(node))


def _tables(atoms: Sequence[Atom]) -> tuple[str, ...]:
    out: list[str] = []
    for a in atoms:
        if a.rel not in out:
            out.append(a.rel)
    return tuple(out)


# ----------------------------------------------------------------------------- expansion


def expand(e: E.Expr, atoms: Sequence[Atom]) -> list[tuple[float, tuple[E.Expr, ...]]]:
    """Polynomial expansion of a value across atoms: a sum of coef · Π factors in which each
    factor reads the variables of one atom only, where + − × allow it (factorization: a value
    local to one atom, like ``price * (1 - discount)``, stays one factor)."""
    var_sets = [{v.name for v in a.vars} for a in atoms]

    def local(x: E.Expr) -> bool:
        vs = E.variables(x)
        return any(vs <= s for s in var_sets)

    def go(x: E.Expr) -> list[tuple[float, tuple[E.Expr, ...]]]:
        if isinstance(x, E.Const):
            assert not isinstance(x.value, str)
            return [(x.value, ())]
        if local(x):
            return [(1, (x,))]
        if isinstance(x, E.Arith) and x.op in "+-":
            right = go(x.right)
            if x.op == "-":
                right = [(-c, f) for c, f in right]
            return go(x.left) + right
        if isinstance(x, E.Arith) and x.op == "*":
            return [(c1 * c2, f1 + f2) for c1, f1 in go(x.left) for c2, f2 in go(x.right)]
        if isinstance(x, E.Neg):
            return [(-c, f) for c, f in go(x.arg)]
        return [(1, (x,))]

    merged: dict[tuple[E.Expr, ...], float] = {}
    for c, fs in go(e):
        key = tuple(sorted(fs, key=E.show))
        merged[key] = merged.get(key, 0) + c
    return [(c, fs) for fs, c in merged.items() if c != 0]
