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

Nested aggregates become *derived relations*: an aggregate below the top (a scalar or IN
subquery after unnesting, the inner phase of COUNT(DISTINCT)) is translated on its own into a
stage whose output rows (group values, aggregate values) are a relation the outer query reads
as one more atom; the runtime publishes each stage's changed rows to the stages reading it as
insert/delete/update events, so every stage is maintained higher-order over its inputs (maps
over aggregate results, as DBToaster's nested-aggregate deltas). ``EXISTS``/``IN`` read the
derived relation of the subquery's distinct correlation values (one row per value, so the join
keeps multiplicities); ``NOT EXISTS``/``NOT IN`` multiply by ``1 − [that row]``: the query is a
signed sum over the positive body and the body joined with it.

A nested *global* aggregate (no GROUP BY) has its one row even over no input, as in SQL: its
count 0, its SUM/AVG/MIN/MAX NULL — exactly when the count is 0, values being NOT NULL
otherwise. The query above reads those NULLs through the row's count: a condition or probe over
them keeps ``count > 0`` (a NULL rejects the row), a view column over them is NULL where a
hidden group flag ``count > 0`` is false, and a view aggregate over them skips those rows
(``_null_guards``, ``_null_groups``, ``_null_arg``); where a NULL could become a value (OR,
CASE) or would be published by a nested stage, the view is refused.

Operators outside this shape are refused here, before any code exists, naming the construct.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
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
    # where ``arg`` is not NULL (it reads a nested global aggregate's row, NULL over no
    # input: ``count > 0`` of that row); the aggregate skips the other rows
    live: tuple[E.Expr, ...] = ()


@dataclass(frozen=True)
class Derived:
    """A relation computed by a nested aggregate (a stage): columns ``group…, aggregates…,
    __cnt``; the first ``n_keys`` columns are its key. A group's row exists while its count
    is positive; a global aggregate's one row always (``always``), its count then 0 and its
    SUM, AVG, MIN and MAX NULL (``nullable``). ``probe``: the distinct values an EXISTS/IN
    reads, whose rows are those values only (none over no input, even without any)."""

    name: str
    query: FreshQuery
    columns: tuple[str, ...]
    types: tuple[str, ...]
    n_keys: int
    probe: bool = False

    @property
    def always(self) -> bool:
        """A global aggregate has its one row even over no input (SQL's γ over ∅)."""
        return self.n_keys == 0 and not self.probe

    @property
    def nullable(self) -> tuple[str, ...]:
        """The columns NULL in the row of a global aggregate over no input: all but the
        counts. Values are NOT NULL otherwise, so such a column is NULL exactly when the
        row's count is 0 (the row holds a placeholder then)."""
        if not self.always:
            return ()
        return tuple(a.name for a in self.query.aggs if a.func != "count")


@dataclass(frozen=True)
class FreshQuery:
    """Σ over ``atoms`` with ``conds``, grouped by ``group`` (names → expressions over vars).

    ``output`` is the chain of projections and selections above the aggregate (top-down, as
    algebra nodes) evaluated when rows are read; ``bag`` marks a view without aggregate, whose
    rows repeat with their multiplicity. ``anti`` are atoms of NOT EXISTS: the body is
    ``atoms · conds · Π (1 − anti_i)``. ``derived`` are the relations of nested aggregates
    that atoms read (each translated into its own query).
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
    anti: tuple[Atom, ...] = ()
    derived: tuple[Derived, ...] = ()
    # (group column, flag column): the column is NULL where the hidden flag is 0 (a value
    # read from a nested global aggregate's row over no input, see ``_null_groups``)
    nulls: tuple[tuple[str, str], ...] = ()

    def terms(self) -> list[tuple[float, tuple[Atom, ...]]]:
        """The signed bodies: Π (1 − a_i) expanded over the anti atoms."""
        out: list[tuple[float, tuple[Atom, ...]]] = []
        for r in range(len(self.anti) + 1):
            for sub in itertools.combinations(self.anti, r):
                out.append(((-1.0) ** r, self.atoms + sub))
        return out


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
        self.anti: list[Atom] = []
        self.derived: list[Derived] = []
        # variables NULL where their row's count is 0: name → (variable, count variable)
        self.nulls: dict[str, tuple[E.Var, E.Var]] = {}

    def derive(self, node: A.Aggregate, name: str, probe: bool = False) -> Derived:
        """The relation of a nested aggregate, translated as a query of its own (a probe's
        NULL values never match: they have no row; a nested group's are refused)."""
        q = query_of(node, (*node.group_by, *(a.name for a in node.aggs), A.COUNT),
                     node.label, self.catalog, "guard" if probe else "refuse")
        self.derived.append(Derived(name, q, q.columns, tuple(q.col_types[c] for c in
                                                               q.columns), len(node.group_by),
                                    probe))
        return self.derived[-1]

    def derived_atom(self, node: A.Aggregate) -> None:
        """A nested aggregate read as an atom: its columns become variables of this query."""
        d = self.derive(node, f"__d{node.nid}")
        # plan column names are unique in a view, except the count every aggregate keeps
        vs = tuple(E.Var(t, f"{d.name}{c}" if c == A.COUNT else c)
                   for c, t in zip(d.columns, d.types, strict=True))
        self.env.update(zip(d.columns, vs, strict=True))
        by_name = dict(zip(d.columns, vs, strict=True))
        self.nulls.update((by_name[c].name, (by_name[c], by_name[A.COUNT]))
                          for c in d.nullable)
        if node.is_global:
            self.env["__g"] = E.Const("int", 1)
        self.atoms.append(Atom(d.name, vs))

    def probe(self, node: A.SemiJoin | A.AntiJoin) -> None:
        """l ⋉ r / l ▷ r on equalities l.x = r.y: r's distinct y as a derived relation, read
        with l's variables (a semijoin as a join with it, an antijoin as ``1 − [it]``)."""
        left = set(node.left.columns)
        right = set(node.right.columns)
        pairs: dict[str, str] = {}  # right column → left column
        local: list[exp.Expr] = []  # conditions on r alone: filter r first
        kind = "NOT EXISTS/NOT IN" if isinstance(node, A.AntiJoin) else "EXISTS/IN"
        for cj in A.conjuncts(node.predicate):
            refs = A.referenced(cj)
            if refs <= right:
                local.append(cj)
                continue
            cols = [cj.left, cj.right] if isinstance(cj, exp.EQ) else []
            if (len(cols) == 2 and all(isinstance(x, exp.Column) for x in cols)
                    and {cols[0].name, cols[1].name} & left and
                    {cols[0].name, cols[1].name} & right):
                lcol, rcol = sorted((x.name for x in cols), key=lambda n: n not in left)
                if rcol in pairs:
                    raise UnsupportedSQL(f"{kind} correlated twice by one column",
                                         cj.sql("postgres"))
                pairs[rcol] = lcol
                continue
            raise UnsupportedSQL(f"{kind} correlated by a non-equality", "fresh views read "
                                 "a subquery by equalities with the outer row: "
                                 + cj.sql("postgres"))
        if isinstance(node, A.SemiJoin) and _unique_on(node.right, set(pairs)):
            # r has one row per probe value already (an aggregate grouped by it): read r
            # itself, no distinct stage
            self.visit(node.right)
            for rcol, lcol in pairs.items():
                self.conds.append(E.Cmp("bool", "=", self.env[lcol], self.env[rcol]))
            self.conds += [self.convert(x) for x in local]
            return
        inner: A.Node = node.right
        if local:
            pred = local[0]
            for x in local[1:]:
                pred = exp.and_(pred, x)
            inner = A.Select(node.nid, inner, pred)
        d = self.derive(A.Aggregate(node.nid, inner, tuple(pairs), ()), f"__d{node.nid}",
                        probe=True)
        vs = []
        for rcol, t in zip(d.columns, d.types, strict=True):
            if rcol == A.COUNT:
                continue
            v = self.env[pairs[rcol]]
            if not isinstance(v, E.Var) or v.type != t:
                raise UnsupportedSQL(f"{kind} on an expression or across types",
                                     f"{pairs[rcol]} = {rcol}")
            vs.append(v)
        # the count column: a variable of its own (one row per value, so it is 1)
        atom = Atom(d.name, (*vs, E.Var("int", f"{d.name}__cnt")))
        (self.anti if isinstance(node, A.AntiJoin) else self.atoms).append(atom)

    def visit(self, node: A.Node) -> None:
        from idivm.rules import rule_for

        fn = rule_for(node).fresh
        if fn is None:
            _refuse_node(node)
        else:
            fn(self, node)

    def convert(self, e: exp.Expr) -> E.Expr:
        return E.from_sql(e, lambda name: self.env[name])


def _unify(atoms: Sequence[Atom], conds: Sequence[E.Expr], env: dict[str, E.Expr]
           ) -> tuple[list[Atom], list[E.Expr], dict[str, E.Expr], Callable[[E.Expr], E.Expr]]:
    # (anti atoms are passed after the atoms: they share the renaming)
    """Merge variables equated by a condition; the equality itself disappears. Also returns
    the renaming."""
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
    return new_atoms, new_conds, {k: sub(v) for k, v in env.items()}, sub


def translate(sql: str, catalog: Catalog) -> FreshQuery:
    """Parse and translate a view; raises UnsupportedSQL naming the construct it refuses."""
    vq = parse_view(sql, catalog)
    return query_of(vq.root, vq.columns, sql, catalog)


def query_of(root: A.Node, columns: tuple[str, ...], sql: str, catalog: Catalog,
             null_keys: str = "flag") -> FreshQuery:
    """The flat query of a plan: an aggregate under a chain of projections and selections
    (evaluated when rows are read), or a bag select-project-join. ``null_keys``: what becomes
    of a group value NULL where a nested global aggregate read no input (``_null_groups``)."""
    output: list[A.Node] = []
    node = root
    while isinstance(node, A.Project | A.Select):
        output.append(node)
        node = node.children[0]
    if not isinstance(node, A.Aggregate):
        output, node = [], root
    for n in A.walk(node):
        _refuse_node(n)
    f = Flattener(catalog)
    f.visit(node.child if isinstance(node, A.Aggregate) else node)
    n_anti = len(f.anti)
    guards = _null_guards(f)
    all_atoms, conds, env, sub = _unify(f.atoms + f.anti, f.conds + guards, f.env)
    atoms, anti = all_atoms[:len(all_atoms) - n_anti], all_atoms[len(all_atoms) - n_anti:]
    # the values still NULL-able: those of rows no condition guards (never unified, so
    # renaming them is a no-op kept for safety)
    nulls = {_name(sub(v)): sub(c) for v, c in f.nulls.values() if _live(c) not in guards}
    if isinstance(node, A.Aggregate):
        group, marks, more = _null_groups(tuple((g, env[g]) for g in node.group_by), nulls,
                                          null_keys)
        conds += [c for c in more if c not in conds]
        aggs = []
        for a in node.aggs:
            arg = env[a.arg] if a.arg is not None else None
            live = _null_arg(a.func, arg, nulls, null_keys)
            if arg is not None and arg.type == "str" and a.func != "count":
                raise UnsupportedSQL(f"{a.func.upper()} over text", "fresh views intern text, "
                                     "so it has no order and no sum")
            t = {"count": "int", "count_star": "int", "avg": "float"}.get(
                a.func, arg.type if arg is not None else "int")
            aggs.append(Agg(a.name, "count" if a.func == "count_star" else a.func, arg, t,
                            live))
        col_types = {g: e.type for g, e in group} | {a.name: a.type for a in aggs}
        col_types[A.COUNT] = "int"
        if node.is_global:
            col_types["__g"] = "int"
        return FreshQuery(sql, columns, group, tuple(aggs), tuple(atoms), tuple(conds),
                          tuple(output), False, _tables(atoms + anti), col_types,
                          tuple(anti), tuple(f.derived), marks)
    group, marks, more = _null_groups(tuple((c, env[c]) for c in node.columns), nulls,
                                      null_keys)
    conds += [c for c in more if c not in conds]
    return FreshQuery(sql, columns, group, (), tuple(atoms), tuple(conds), (), True,
                      _tables(atoms + anti), {c: e.type for c, e in group}, tuple(anti),
                      tuple(f.derived), marks)


# ----------------------------------------------------------------------------- NULL rows


def _name(e: E.Expr) -> str:
    assert isinstance(e, E.Var)
    return e.name


def _live(count: E.Expr) -> E.Expr:
    """A nested global aggregate's row holds values: its input was not empty."""
    return E.Cmp("bool", ">", count, E.Const("int", 0))


def _null_reads(names: set[str], nulls: Mapping[str, E.Expr]) -> dict[E.Expr, set[str]]:
    """Of ``names``, the variables that may be NULL, by the count variable of their row."""
    out: dict[E.Expr, set[str]] = {}
    for n in sorted(names & nulls.keys()):
        out.setdefault(nulls[n], set()).add(n)
    return out


def _rejection(cond: E.Expr, names: set[str]) -> str | None:
    """None when ``cond`` cannot hold while the variables ``names`` are NULL, else the operator
    that may let it hold (``OR``, ``CASE``, …)."""
    if isinstance(cond, E.BoolOp) and cond.op == "and":
        hows = [_rejection(x, names) for x in cond.args if E.variables(x) & names]
        return None if None in hows else hows[0]
    how = E.null_reads(cond, names)
    return None if how == "strict" else how


def _null_guards(f: Flattener) -> list[E.Expr]:
    """``count > 0`` for each nested global aggregate's row whose SUM/AVG/MIN/MAX a condition
    or an EXISTS/IN probe reads: a NULL rejects the row there, as no row did. Refused where it
    need not (under OR, CASE, …, or correlating a NOT EXISTS)."""
    guards: list[E.Expr] = []
    nulls = {n: c for n, (_, c) in f.nulls.items()}
    for cond in f.conds:
        for count, names in _null_reads(E.variables(cond), nulls).items():
            how = _rejection(cond, names)
            if how is not None:
                raise UnsupportedSQL(f"global aggregate subquery's value under {how}",
                                     f"NULL over no input: {E.show(cond)}")
            guards.append(_live(count))
    for atom in f.atoms + f.anti:
        names = {v.name for v in atom.vars}
        for count in _null_reads(names, nulls):
            if count in atom.vars:
                continue  # the row's own atom
            if atom in f.anti:
                raise UnsupportedSQL("NOT EXISTS correlated by a global aggregate subquery's "
                                     "value", f"NULL over no input: {atom.show()}")
            guards.append(_live(count))  # an EXISTS/IN probe: a NULL never matches
    return list(dict.fromkeys(guards))


def _null_arg(func: str, arg: E.Expr | None, nulls: Mapping[str, E.Expr],
              mode: str) -> tuple[E.Expr, ...]:
    """Where an aggregate's argument is not NULL, if it reads a nested global aggregate's row
    (the view's own aggregates only: a nested one would publish a NULL)."""
    reads = _null_reads(E.variables(arg), nulls) if arg is not None else {}
    if not reads:
        return ()
    assert arg is not None
    if mode != "flag":
        raise UnsupportedSQL(f"{func.upper()} over a global aggregate subquery's value in a "
                             "nested aggregate", f"NULL over no input: {E.show(arg)}")
    _strict(arg, reads)
    return tuple(_live(c) for c in reads)


def _strict(e: E.Expr, reads: Mapping[E.Expr, set[str]]) -> None:
    """Refuse ``e`` unless it is NULL whenever a nested global aggregate's row it reads is
    (``reads``: the variables of each row, by its count): under OR or CASE a NULL could
    become a value."""
    for names in reads.values():
        how = E.null_reads(e, names)
        if how != "strict":
            raise UnsupportedSQL(f"global aggregate subquery's value under {how}",
                                 f"NULL over no input: {E.show(e)}")


def _zero(t: str) -> E.Const:
    return E.Const(t, 0.0 if t == "float" else "" if t == "str" else 0)


def _null_groups(group: tuple[tuple[str, E.Expr], ...], nulls: Mapping[str, E.Expr],
                 mode: str) -> tuple[tuple[tuple[str, E.Expr], ...], tuple[tuple[str, str], ...],
                                     list[E.Expr]]:
    """Group values NULL where a nested global aggregate read no input (its row's count is
    0), in ``mode``: ``flag`` (the view's own rows) keeps ``CASE WHEN count > 0 THEN value ELSE
    0 END`` and a hidden group column ``__live…`` (``count > 0``) saying whether it is NULL;
    ``guard`` (a probe's values, which a NULL never matches) keeps rows with values only (the
    conditions returned); ``refuse`` (a nested aggregate, which publishes no NULL) refuses.
    Returns the group, the (column, flag column) pairs and the conditions."""
    out: list[tuple[str, E.Expr]] = []
    flags: dict[E.Expr, str] = {}
    marks: list[tuple[str, str]] = []
    conds: list[E.Expr] = []
    for name, e in group:
        reads = _null_reads(E.variables(e), nulls)
        if not reads:
            out.append((name, e))
            continue
        if mode == "refuse":
            raise UnsupportedSQL("GROUP BY a global aggregate subquery's value in a nested "
                                 "aggregate", f"NULL over no input: {E.show(e)}")
        _strict(e, reads)
        lives = [_live(c) for c in reads]
        if mode == "guard":
            conds += lives
            out.append((name, e))
            continue
        live = lives[0] if len(lives) == 1 else E.BoolOp("bool", "and", tuple(lives))
        flag = flags.setdefault(live, f"__live{len(flags)}")
        out.append((name, E.Case(e.type, ((live, e),), _zero(e.type))))
        marks.append((name, flag))
    return tuple(out) + tuple((f, x) for x, f in flags.items()), tuple(marks), conds


def _unique_on(node: A.Node, cols: set[str]) -> bool:
    """At most one row of ``node`` per value of ``cols``: an aggregate grouped by (a subset
    of) them, under selections and projections that rename its group columns."""
    while isinstance(node, A.Project | A.Select):
        if isinstance(node, A.Project):
            renames = {n: e.name for n, e in node.exprs if isinstance(e, exp.Column)}
            cols = {renames[c] for c in cols if c in renames}
        node = node.child
    return isinstance(node, A.Aggregate) and bool(node.group_by) and set(node.group_by) <= cols


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
