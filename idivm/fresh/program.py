"""The viewlet transform: a fresh query → a trigger program of maps that maintain each other.

For an event on relation R carrying tuple t, the delta of a map's monomial replaces each
nonempty subset S of its R-atoms by t (sign^|S|: a self-join's Δ is tΔ⋈R + R⋈Δt + Δt⋈Δt).
What remains is split by the variables t does not bind into connected components (query
decomposition); conditions and values that read t and remaining variables together are kept in
the trigger, their remaining variables becoming map keys (avoidance of input variables); each
component becomes a map keyed by the variables the trigger binds or needs, deduplicated by a
canonical form (duplicate view elimination), and is maintained the same way, recursively, until
deltas are constant: DBToaster's higher-order IVM (seed 000 §4–5, seed 002 Figure 2).

``depth`` bounds materialization: ``None`` is the full higher-order program; ``1`` maintains the
view maps with first-order deltas evaluated over the base relations (classical IVM in the same
runtime); ``0`` re-evaluates the view from the base relations (``recompute`` statements).

A statement is ``target[keys] += coef · Π factors`` under ``guards`` (event-only conditions),
inside nested ``loops`` over map slices whose bound key positions are looked up with values
known at that point. Statements of one trigger run in decreasing order of their target's atom
count: a map is read only by statements targeting larger maps, so every delta reads the state
before the event, as the delta rules require.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fresh import expr as E
from idivm.fresh.query import Atom, Derived, FreshQuery, Mono, expand

KINDS = ("insert", "delete", "update")


@dataclass(frozen=True)
class MapDef:
    """A materialized map: ``keys`` → Σ monos. View maps key by expressions, others by vars."""

    name: str
    keys: tuple[E.Expr, ...]
    monos: tuple[Mono, ...]
    role: str  # view | aux | base

    @property
    def arity(self) -> int:
        return len(self.keys)

    @property
    def order(self) -> int:
        """Atoms of the defining query (a delta reads only maps of lower order)."""
        return max((len(m.atoms) for m in self.monos), default=0)

    def show(self) -> str:
        keys = ", ".join(E.show(k) for k in self.keys)
        body = " + ".join(m.show() for m in self.monos)
        return f"{self.name}[{keys}] := Σ {body}"


@dataclass(frozen=True)
class Loop:
    """For each entry of ``map`` whose bound key positions equal ``bound`` (None = free):
    ``binds[i]`` names the statement variable taking key position i."""

    map: str
    bound: tuple[E.Expr | None, ...]
    binds: tuple[str | None, ...]


@dataclass(frozen=True)
class Stmt:
    target: str
    keys: tuple[E.Expr, ...]
    coef: float
    guards: tuple[E.Expr, ...] = ()
    loops: tuple[Loop, ...] = ()
    conds: tuple[E.Expr, ...] = ()
    factors: tuple[E.Expr, ...] = ()

    def show(self, maps: dict[str, MapDef]) -> str:
        lines = []
        ind = ""
        if self.guards:
            lines.append(f"if {' and '.join(E.show(g) for g in self.guards)}:")
            ind = "  "
        for lp in self.loops:
            keys = ", ".join(E.show(b) if b is not None else f"{n}" for b, n in
                             zip(lp.bound, lp.binds, strict=True))
            if all(b is not None for b in lp.bound):
                lines.append(f"{ind}with {lp.map}[{keys}]:")
            else:
                lines.append(f"{ind}for {lp.map}[{keys}]:")
            ind += "  "
        if self.conds:
            lines.append(f"{ind}if {' and '.join(E.show(c) for c in self.conds)}:")
            ind += "  "
        val = [f"{self.coef:g}"] + [E.show(f) for f in self.factors] + [
            f"{lp.map}[…]" for lp in self.loops]
        keys = ", ".join(E.show(k) for k in self.keys)
        lines.append(f"{ind}{self.target}[{keys}] += {' · '.join(val)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class TableInfo:
    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    key: tuple[int, ...]


@dataclass(frozen=True)
class Program:
    query: FreshQuery
    depth: int | None
    tables: tuple[TableInfo, ...]
    maps: tuple[MapDef, ...]
    triggers: dict[str, dict[str, tuple[Stmt, ...]]]
    recompute: tuple[Stmt, ...]
    inplace: dict[str, frozenset[int]]  # value-only columns an update may change in place
    count_map: str
    agg_maps: tuple[str | None, ...] = field(default=())  # per aggregate: sum or value-count map
    # per table: columns read only by conditions on that table alone, and those conditions
    # over the event (``Arg``): an update changing only these columns, under which every
    # condition keeps its truth value, changes no map
    filtered: dict[str, tuple[frozenset[int], tuple[E.Expr, ...]]] = field(default_factory=dict)
    # per aggregate skipping NULL arguments (``Agg.live``): the map counting the rows it reads
    live_counts: tuple[str | None, ...] = field(default=())

    def listing(self) -> str:
        maps = {m.name: m for m in self.maps}
        out = [f"-- fresh view program (depth {self.depth if self.depth is not None else 'hi'})"]
        out += ["-- " + m.show() for m in self.maps]
        for rel, kinds in self.triggers.items():
            for kind, stmts in kinds.items():
                out.append(f"ON {kind} {rel}:")
                out += ["  " + s.show(maps).replace("\n", "\n  ") for s in stmts]
        if self.recompute:
            out.append("RECOMPUTE:")
            out += ["  " + s.show(maps).replace("\n", "\n  ") for s in self.recompute]
        return "\n".join(out)


def _components(atoms: Sequence[Atom], bound: set[str],
                links: Sequence[set[str]] = ()) -> list[list[Atom]]:
    """Connected components of atoms linked by shared variables the event does not bind.

    A condition over the variables of several components the event binds nothing of
    (``links``: ``a.volume > 0.0001 · total``) merges them: kept inside one map, it is a lookup,
    where two maps would be a nested loop over two full scans. Components the event keys are
    left apart (their loops are slices already, and one map over both would be maintained on
    every event of either)."""
    comps: list[tuple[list[Atom], set[str]]] = []
    for a in atoms:
        vs = {v.name for v in a.vars} - bound
        merged: tuple[list[Atom], set[str]] = ([a], vs)
        keep = []
        for c in comps:
            if c[1] & vs:
                merged = (c[0] + merged[0], c[1] | merged[1])
            else:
                keep.append(c)
        comps = keep + [merged]

    def keyed(c: tuple[list[Atom], set[str]]) -> bool:
        return any(v.name in bound for a in c[0] for v in a.vars)

    for link in links:
        touched = [c for c in comps if c[1] & link]
        if len(touched) > 1 and not any(keyed(c) for c in touched):
            rest = [c for c in comps if not c[1] & link]
            comps = rest + [([a for c in touched for a in c[0]],
                             set().union(*(c[1] for c in touched)))]
    order = {id(a): i for i, a in enumerate(atoms)}
    return sorted((sorted(c[0], key=lambda a: order[id(a)]) for c in comps),
                  key=lambda c: order[id(c[0])])


class _Compiler:
    def __init__(self, query: FreshQuery, depth: int | None, tables: dict[str, TableInfo]):
        self.query = query
        self.depth = depth
        self.tables = tables
        self.maps: dict[str, MapDef] = {}
        self.canon: dict[str, str] = {}

    # -------------------------------------------------------------------------- maps

    def add_map(self, keys: Sequence[E.Var], mono: Mono, role: str) -> tuple[str, list[E.Var]]:
        """The map of ``mono`` keyed by ``keys``, created or found again up to variable names
        and key order (duplicate view elimination). Returns its name and the keys in the
        map's order: keys are ordered by first appearance in the atoms, so the same query
        asked with its keys permuted is the same map."""
        key_names = {k.name for k in keys}
        types = {v.name: v.type for a in mono.atoms for v in a.vars} | {k.name: k.type
                                                                        for k in keys}
        ordered: list[str] = []
        for a in mono.atoms:
            for v in a.vars:
                if v.name in key_names and v.name not in ordered:
                    ordered.append(v.name)
        ordered += [k.name for k in keys if k.name not in ordered]
        names: dict[str, str] = {n: f"k{i}" for i, n in enumerate(ordered)}
        for a in mono.atoms:
            for v in a.vars:
                names.setdefault(v.name, f"v{len(names)}")
        ren = {old: E.Var(types[old], new) for old, new in names.items()}
        cm = Mono(mono.coef, tuple(Atom(a.rel, tuple(ren[v.name] for v in a.vars))
                                   for a in mono.atoms),
                  tuple(sorted((E.rename(c, ren) for c in mono.conds), key=E.show)),
                  tuple(sorted((E.rename(f, ren) for f in mono.factors), key=E.show)))
        ckeys = tuple(E.Var(types[n], f"k{i}") for i, n in enumerate(ordered))
        key_order = [E.Var(types[n], n) for n in ordered]
        text = f"{role}|{[k.type for k in ckeys]}|{cm.show()}"
        if text in self.canon:
            return self.canon[text], key_order
        name = f"base_{mono.atoms[0].rel}" if role == "base" else f"m{len(self.canon) + 1}"
        self.canon[text] = name
        self.maps[name] = MapDef(name, ckeys, (cm,), role)
        return name, key_order

    def base_map(self, rel: str) -> str:
        t = self.tables[rel]
        vs = tuple(E.Var(ty, f"c{i}") for i, ty in enumerate(t.types))
        return self.add_map(vs, Mono(1, (Atom(rel, vs),)), "base")[0]

    # -------------------------------------------------------------------------- deltas

    def derive(self, m: MapDef, rel: str, sign: int) -> list[Stmt]:
        out = []
        for mono in m.monos:
            idx = [i for i, a in enumerate(mono.atoms) if a.rel == rel]
            for r in range(1, len(idx) + 1):
                for subset in itertools.combinations(idx, r):
                    out.append(self.delta(m, mono, subset, sign))
        return out

    def delta(self, m: MapDef, mono: Mono, subset: Sequence[int], sign: int) -> Stmt:
        binding: dict[str, E.Expr] = {}
        guards: list[E.Expr] = []
        for i in subset:
            for pos, v in enumerate(mono.atoms[i].vars):
                arg = E.Arg(v.type, pos)
                if v.name in binding:
                    if binding[v.name] != arg:
                        guards.append(E.Cmp("bool", "=", binding[v.name], arg))
                else:
                    binding[v.name] = arg
        rest = [a for j, a in enumerate(mono.atoms) if j not in subset]
        keys = tuple(E.rename(k, binding) for k in m.keys)
        conds = [E.rename(c, binding) for c in mono.conds]
        factors = [E.rename(f, binding) for f in mono.factors]
        coef = mono.coef * sign ** len(subset)
        materialize = self.depth is None or m.role != "view"
        return self.statement(m.name, keys, coef, guards, conds, factors, rest, binding,
                              materialize)

    def statement(self, target: str, keys: tuple[E.Expr, ...], coef: float,
                  guards: list[E.Expr], conds: list[E.Expr], factors: list[E.Expr],
                  rest: Sequence[Atom], binding: dict[str, E.Expr],
                  materialize: bool) -> Stmt:
        guards = guards + [c for c in conds if not E.variables(c)]
        scalars = [f for f in factors if not E.variables(f)]
        conds = [c for c in conds if E.variables(c)]
        factors = [f for f in factors if E.variables(f)]
        comps = _components(rest, set(binding), [E.variables(c) - set(binding) for c in conds
                                                  if not E.has_args(c)])
        comp_of = {v.name: ci for ci, comp in enumerate(comps) for a in comp for v in a.vars
                   if v.name not in binding}
        inner: list[tuple[list[E.Expr], list[E.Expr]]] = [([], []) for _ in comps]
        loop_conds: list[E.Expr] = []
        loop_factors: list[E.Expr] = []
        for terms, slot, outer in ((conds, 0, loop_conds), (factors, 1, loop_factors)):
            for t in terms:
                cs = {comp_of[v] for v in E.variables(t)}
                if len(cs) == 1 and not E.has_args(t):
                    inner[cs.pop()][slot].append(t)
                else:
                    outer.append(t)
        needed: set[str] = set()
        for x in (*keys, *loop_conds, *loop_factors):
            needed |= E.variables(x)
        loops: list[Loop] = []
        for ci, comp in enumerate(comps):
            if materialize:
                vars_in = {v.name: v for a in comp for v in a.vars}
                key_vars = [vars_in[n] for n in sorted(n for n in vars_in if n in binding)]
                key_vars += [vars_in[n] for n in sorted(n for n in vars_in
                                                         if n in needed and n not in binding)]
                name, key_vars = self.add_map(key_vars, Mono(1, tuple(comp),
                                                             tuple(inner[ci][0]),
                                                             tuple(inner[ci][1])), "aux")
                loops.append(Loop(name, tuple(binding.get(v.name) for v in key_vars),
                                  tuple(None if v.name in binding else v.name
                                        for v in key_vars)))
            else:
                base_loops, extra = self.base_loops(comp, binding, loops)
                loops += base_loops
                loop_conds += inner[ci][0] + extra
                loop_factors += inner[ci][1]
        if materialize:
            # point lookups first: keyed by the event alone, they skip the slice loops when
            # the event's row joins nothing (a filtered dimension row, say)
            loops.sort(key=lambda lp: any(b is None for b in lp.bound))
        return Stmt(target, keys, coef, tuple(guards), tuple(loops), tuple(loop_conds),
                    tuple(scalars + loop_factors))

    def base_loops(self, comp: Sequence[Atom], binding: dict[str, E.Expr],
                   outer: Sequence[Loop]) -> tuple[list[Loop], list[E.Expr]]:
        """A component evaluated over the base relations: nested loops, most-bound first."""
        known = {n for lp in outer for n in lp.binds if n is not None}
        remaining = list(comp)
        loops: list[Loop] = []
        extra: list[E.Expr] = []
        while remaining:
            bound_now = set(binding) | known
            atom = max(remaining, key=lambda a: sum(v.name in bound_now for v in a.vars))
            remaining.remove(atom)
            bound: list[E.Expr | None] = []
            binds: list[str | None] = []
            seen: set[str] = set()
            for pos, v in enumerate(atom.vars):
                if v.name in binding:
                    bound.append(binding[v.name])
                    binds.append(None)
                elif v.name in known:
                    bound.append(v)
                    binds.append(None)
                elif v.name in seen:
                    tmp = f"{v.name}__{pos}"
                    bound.append(None)
                    binds.append(tmp)
                    extra.append(E.Cmp("bool", "=", E.Var(v.type, tmp), v))
                else:
                    bound.append(None)
                    binds.append(v.name)
                    seen.add(v.name)
            known |= seen
            loops.append(Loop(self.base_map(atom.rel), tuple(bound), tuple(binds)))
        return loops, extra


def view_maps(c: _Compiler, q: FreshQuery) -> tuple[str, list[str | None], list[str | None]]:
    """The view's maps: the count per group, per aggregate its sum or value counts, and per
    aggregate skipping NULL arguments (``Agg.live``) the count of the rows it reads."""
    keys = tuple(e for _, e in q.group)
    terms = q.terms()
    c.maps["v_count"] = MapDef("v_count", keys, tuple(Mono(sign, atoms, q.conds)
                                                      for sign, atoms in terms), "view")
    agg_maps: list[str | None] = []
    live_counts: list[str | None] = []
    by_live: dict[tuple[E.Expr, ...], str] = {}
    for i, a in enumerate(q.aggs):
        conds = q.conds + a.live
        body = tuple(Mono(sign, atoms, conds) for sign, atoms in terms)
        if a.live and a.live not in by_live:
            by_live[a.live] = f"v_live{i}"
            c.maps[by_live[a.live]] = MapDef(by_live[a.live], keys, body, "view")
        live_counts.append(by_live.get(a.live) if a.live else None)
        if a.func in ("sum", "avg"):
            assert a.arg is not None
            monos = tuple(Mono(sign * coef, atoms, conds, fs) for sign, atoms in terms
                          for coef, fs in expand(a.arg, atoms))
            name = f"v_sum{i}"
            c.maps[name] = MapDef(name, keys, monos or (Mono(0, q.atoms, conds),), "view")
        elif a.func in ("min", "max"):
            assert a.arg is not None
            name = f"v_vals{i}"
            c.maps[name] = MapDef(name, keys + (a.arg,), body, "view")
        else:
            agg_maps.append(None)  # COUNT reads its count: values are NOT NULL there
            continue
        agg_maps.append(name)
    return "v_count", agg_maps, live_counts


def _value_only(maps: Sequence[MapDef], rel: str, arity: int) -> frozenset[int]:
    """Columns of ``rel`` read only as values (never as key, join or condition): an update
    changing only these adjusts the maps in place. Empty under a self-join."""
    cols = set(range(arity))
    for m in maps:
        key_vars = set().union(*(E.variables(k) for k in m.keys)) if m.keys else set()
        for mono in m.monos:
            own = [a for a in mono.atoms if a.rel == rel]
            if len(own) > 1:
                return frozenset()
            if not own:
                continue
            atom = own[0]
            elsewhere = set(key_vars)
            for c in mono.conds:
                elsewhere |= E.variables(c)
            for a in mono.atoms:
                if a is not atom:
                    elsewhere |= {v.name for v in a.vars}
            names = [v.name for v in atom.vars]
            for pos, n in enumerate(names):
                if n in elsewhere or names.count(n) > 1:
                    cols.discard(pos)
    return frozenset(cols)


def _filter_only(maps: Sequence[MapDef], rel: str,
                 arity: int) -> tuple[frozenset[int], tuple[E.Expr, ...]]:
    """Columns of ``rel`` read only by conditions over ``rel``'s own atom (never a key, a join
    variable or a value), and those conditions over the event tuple. Empty under a
    self-join."""
    cols = set(range(arity))
    guards: list[E.Expr] = []
    for m in maps:
        key_vars = set().union(*(E.variables(k) for k in m.keys)) if m.keys else set()
        for mono in m.monos:
            own = [a for a in mono.atoms if a.rel == rel]
            if len(own) > 1:
                return frozenset(), ()
            if not own:
                continue
            atom = own[0]
            names = [v.name for v in atom.vars]
            mine = set(names)
            local = [c for c in mono.conds if E.variables(c) <= mine]
            elsewhere = set(key_vars)
            for x in (*mono.factors, *(c for c in mono.conds if c not in local)):
                elsewhere |= E.variables(x)
            for a in mono.atoms:
                if a is not atom:
                    elsewhere |= {v.name for v in a.vars}
            for pos, n in enumerate(names):
                if n in elsewhere or names.count(n) > 1:
                    cols.discard(pos)
            args = {v.name: E.Arg(v.type, pos) for pos, v in enumerate(atom.vars)}
            for c in local:
                g = E.rename(c, args)
                if g not in guards:
                    guards.append(g)
    keep = tuple(g for g in guards if {n.index for n in E.walk(g) if isinstance(n, E.Arg)}
                 & cols)
    return frozenset(cols), keep


def _in_place(stmt: Stmt, cols: frozenset[int]) -> Stmt | None:
    """The statement of an insert rewritten for an in-place update: Π f(new) − Π f(old)."""
    with_args = [f for f in stmt.factors if E.has_args(f)]
    reads = {n.index for f in with_args for n in E.walk(f) if isinstance(n, E.Arg)}
    if not reads & cols:
        return None  # a change of value-only columns leaves this contribution unchanged

    def prod(fs: Sequence[E.Expr]) -> E.Expr:
        out = fs[0]
        for f in fs[1:]:
            out = E.Arith("float", "*", out, f)
        return out

    p = prod(with_args)
    diff = E.Arith("float", "-", p, E.old_tuple(p))
    rest = tuple(f for f in stmt.factors if not E.has_args(f))
    return Stmt(stmt.target, stmt.keys, stmt.coef, stmt.guards, stmt.loops, stmt.conds,
                (diff,) + rest)


def table_info(catalog: Catalog, name: str) -> TableInfo:
    t = catalog.table(name)
    if len(t.columns) > 64:
        raise UnsupportedSQL(f"table {name} with {len(t.columns)} columns",
                             "fresh views read tables of at most 64 columns")
    types = tuple(E.sql_type(c.type, f"{name}.{c.name}") for c in t.columns)
    return TableInfo(name, tuple(c.name for c in t.columns), types,
                     tuple(t.column_names.index(k) for k in t.primary_key))


def derived_info(d: Derived) -> TableInfo:
    return TableInfo(d.name, d.columns, d.types, tuple(range(d.n_keys)))


def compile_program(q: FreshQuery, catalog: Catalog, depth: int | None = None) -> Program:
    """One stage: the trigger program of ``q`` over base tables and the derived relations of
    its nested aggregates (their rows arrive as events, like a base table's)."""
    if depth is not None and depth not in (0, 1):
        raise ValueError(f"depth must be None (higher-order), 1 or 0, not {depth!r}")
    derived = {d.name: derived_info(d) for d in q.derived}
    tables = {t: derived[t] if t in derived else table_info(catalog, t) for t in q.tables}
    c = _Compiler(q, depth, tables)
    count_map, agg_maps, live_counts = view_maps(c, q)
    recompute: list[Stmt] = []
    triggers: dict[str, dict[str, list[Stmt]]] = {t: {k: [] for k in KINDS} for t in q.tables}
    if depth == 0:
        for m in list(c.maps.values()):
            for mono in m.monos:
                recompute.append(c.statement(m.name, m.keys, mono.coef, [], list(mono.conds),
                                             list(mono.factors), mono.atoms, {}, False))
        for t in q.tables:
            c.base_map(t)
    done: set[str] = set()
    while True:
        todo = [m for m in c.maps.values() if m.name not in done
                and (depth != 0 or m.role == "base")]
        if not todo:
            break
        for m in todo:
            done.add(m.name)
            for rel in {a.rel for mono in m.monos for a in mono.atoms}:
                triggers[rel]["insert"] += c.derive(m, rel, 1)
                triggers[rel]["delete"] += c.derive(m, rel, -1)
    maps = tuple(c.maps.values())
    order = {m.name: m.order for m in maps}
    inplace: dict[str, frozenset[int]] = {}
    filtered = {t: _filter_only(maps, t, len(tables[t].types)) for t in q.tables}
    for t in q.tables:
        for k in ("insert", "delete"):
            triggers[t][k].sort(key=lambda s: -order[s.target])
        cols = _value_only(maps, t, len(tables[t].types)) if depth is None else frozenset()
        inplace[t] = cols
        if cols:
            triggers[t]["update"] = [s for s in (_in_place(st, cols)
                                                 for st in triggers[t]["insert"]) if s]
    return Program(q, depth, tuple(tables.values()), maps,
                   {t: {k: tuple(v) for k, v in ks.items()} for t, ks in triggers.items()},
                   tuple(recompute), inplace, count_map, tuple(agg_maps), filtered,
                   tuple(live_counts))


# ----------------------------------------------------------------------------- stages

AUTO_MAPS_PER_ATOM = 4


@dataclass(frozen=True)
class Stage:
    """A trigger program and the derived relation whose rows it publishes (None: the view)."""

    program: Program
    publishes: Derived | None


@dataclass(frozen=True)
class Pipeline:
    """The stages of a view, inner first and the view last: a base event runs every stage
    reading its table, then each stage publishes its changed rows, in order, to the stages
    reading them (each stage's delta rules see one relation change at a time, so the state
    they read is always consistent)."""

    stages: tuple[Stage, ...]

    @property
    def view(self) -> Program:
        return self.stages[-1].program

    @property
    def base_tables(self) -> tuple[TableInfo, ...]:
        derived = {s.publishes.name for s in self.stages if s.publishes is not None}
        out: dict[str, TableInfo] = {}
        for s in self.stages:
            for t in s.program.tables:
                if t.name not in derived:
                    out.setdefault(t.name, t)
        return tuple(out.values())

    def listing(self) -> str:
        if len(self.stages) == 1:
            return self.view.listing()
        out = []
        for s in self.stages:
            head = f"-- stage {s.publishes.name}: {s.program.query.sql}" if s.publishes \
                else "-- stage view"
            out += [head, s.program.listing()]
        return "\n".join(out)


def _stage_queries(q: FreshQuery, d: Derived | None = None) -> list[tuple[FreshQuery,
                                                                      Derived | None]]:
    out: list[tuple[FreshQuery, Derived | None]] = []
    for sub in q.derived:
        out += _stage_queries(sub.query, sub)
    return out + [(q, d)]


def compile_stage(q: FreshQuery, catalog: Catalog, depth: int | str | None) -> Program:
    """``depth`` ``"auto"``: higher-order unless it needs more than ``AUTO_MAPS_PER_ATOM``
    maps per relation atom (then every base event updates that many large maps, and
    first-order deltas over indexed base relations are cheaper)."""
    if depth == "auto":
        prog = compile_program(q, catalog, None)
        if len(prog.maps) > AUTO_MAPS_PER_ATOM * len(q.atoms + q.anti):
            prog = compile_program(q, catalog, 1)
        return prog
    if depth is None or isinstance(depth, int):
        return compile_program(q, catalog, depth)
    raise ValueError(f"depth must be None, 0, 1 or 'auto', not {depth!r}")


def compile_pipeline(q: FreshQuery, catalog: Catalog,
                     depth: int | str | None = "auto") -> Pipeline:
    stages = _stage_queries(q)
    if depth == 0 and len(stages) > 1:
        raise UnsupportedSQL("re-evaluation (depth 0) of a nested aggregate",
                             "its stages publish their changes event by event; use depth 1 "
                             "or the higher-order program")
    return Pipeline(tuple(Stage(compile_stage(sq, catalog, depth), d) for sq, d in stages))
