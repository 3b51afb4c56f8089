"""What an operator's rule file (``rules/*.py``) is given and returns.

A rule file defines ``RULE = OperatorRule(...)`` with the operator's ID-inference rule (Table 1)
and its i-diff propagation rules (Tables 4–13). Non-blocking operators give ``propagate``, called
once per input i-diff; blocking operators give ``propagate_all``, called once with every input
i-diff (§4, "non-blocking and blocking operators").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import (
    DiffNode,
    DiffSchema,
    Kind,
    NodeInfo,
    placeholder,
    post_name,
    pre_name,
)

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener
    from idivm.render import Flat, Renderer

InferFn = Callable[[A.Node, "Sequence[NodeInfo]", Catalog], "tuple[A.Node, NodeInfo]"]
PropagateFn = Callable[["RuleContext", A.Node, int, DiffNode], "list[DiffNode]"]
PropagateAllFn = Callable[["RuleContext", A.Node, "list[tuple[int, DiffNode]]"], "list[DiffNode]"]
RenderFn = Callable[["Renderer", A.Node], "Flat | exp.Select"]
# where a semi-join can be repeated below an operator: (input index, {column: its name there})
RestrictStep = tuple[int, dict[str, str]]
RestrictFn = Callable[[A.Node, "tuple[str, ...]"], "tuple[RestrictStep, ...]"]
FreshFn = Callable[["Flattener", A.Node], None]
# an input the operator's rules read by range or lookup on some of its columns, which pass 3
# materializes as an operator cache with an index on them: (input index, the columns)
CacheFn = Callable[[A.Node, "Mapping[int, NodeInfo]"], "tuple[int, tuple[str, ...]] | None"]
# the inputs whose rows the operator's rules find by the value of some of their columns (not by
# IDs): (input index, the columns) — ``planner/lookups.py`` traces them to the scanned tables
LookupFn = Callable[[A.Node, "Mapping[int, NodeInfo]"], "tuple[tuple[int, tuple[str, ...]], ...]"]


@dataclass(frozen=True)
class OperatorRule:
    op: type[A.Node]
    paper: str  # where the rules come from, e.g. "Table 6"
    infer: InferFn
    propagate: PropagateFn | None = None
    propagate_all: PropagateAllFn | None = None
    conditions: Callable[[A.Node], set[str]] = field(default=lambda n: set())
    # conditions(): the columns of the operator's condition (its C_op, §5)
    tuple_safe: bool = False
    # tuple_safe: on t-diffs (full-tuple Δ+ and Δ-, no Δu) these rules are the classical
    # tuple-based rules, so the tuple strategy uses them as they are
    render: RenderFn | None = None
    # render(): the operator as SQL over its inputs (idivm.render.Renderer gives them as flat
    # parts or relations): to materialize, recompute, and read Input_pre / Input_post
    combines: bool = False
    # combines: the operator combines rows of several inputs, so a γ above it keeps its input
    # as an operator cache (§5; re-joining on every change would cost what the cache saves)
    fresh: FreshFn | None = None
    # fresh(): the operator into a fresh view's flat query (idivm.fresh.query.Flattener adds
    # relation atoms, conditions and column values); None: fresh views refuse it, naming
    # ``fresh_refusal`` (construct, reason)
    fresh_refusal: tuple[str, str] | None = None
    keeps_output: bool = False
    # keeps_output: the operator's rows are its input's, renamed (π), so the view read through
    # it can be the cache of an aggregate below; every other operator drops the columns its
    # input carries only for that (``NodeInfo.output_carry``)
    # restrict(): where a semi-join on some of the operator's output columns can be repeated
    # below it: per input it can go into, (the input, {column: its name there} for the
    # columns it can be on there — a subset is a weaker semi-join, implied by the one that
    # stays above); none when it cannot go below. Reading
    # Input ⋉_IDs Δ, the resolver repeats the semi-join at the scan or cache the IDs come from
    # (sideways information passing), so an engine reads only the named rows of a state it
    # cannot push a semi-join into by itself (a UNION ALL of kept and old rows, the preserved
    # side of an outer join probed on both sides' IDs)
    restrict: RestrictFn | None = None
    # caches(): an input to materialize as an operator cache indexed on some of its columns
    # (the other side of a ⋈ over a one-row input: the rows φ's comparisons flip are read
    # through that index as a range), or None
    caches: CacheFn | None = None
    # lookups(): the inputs the rules find rows of by value (a MAX re-derived from its input, the
    # rows equal to a one-row input's old or new value); a backend that owns the storage of the
    # table such a column comes from (a view another view reads) indexes it
    lookups: LookupFn | None = None

    @property
    def blocking(self) -> bool:
        return self.propagate_all is not None


def restrict_passes(node: A.Node, cols: tuple[str, ...]) -> tuple[RestrictStep, ...]:
    """``restrict`` of an operator that keeps its input's rows and names (σ)."""
    return ((0, {k: k for k in cols}),)


def restrict_into(*sides: int) -> RestrictFn:
    """``restrict`` of an operator whose rows each hold one row of each input in ``sides``
    under the same names (⋈: either, ⟕: the preserved one, ⋉/▷: the left one): into the one
    holding most of the columns, on those."""
    def go(node: A.Node, cols: tuple[str, ...]) -> tuple[RestrictStep, ...]:
        best = max(sides, key=lambda i: len(set(cols) & set(node.children[i].columns)))
        on = {k: k for k in cols if k in set(node.children[best].columns)}
        return ((best, on),) if on else ()

    return go


# -- functional dependencies ----------------------------------------------------------------


def closure(attrs: Iterable[str], fds: Iterable[tuple[frozenset[str], frozenset[str]]],
            equiv: Iterable[frozenset[str]]) -> set[str]:
    out = set(attrs)
    fds = list(fds) + [(frozenset((a,)), cls) for cls in equiv for a in cls]
    changed = True
    while changed:
        changed = False
        for lhs, rhs in fds:
            if lhs <= out and not rhs <= out:
                out |= rhs
                changed = True
    return out


def minimize_key(cands: Sequence[str], fds: Iterable[tuple[frozenset[str], frozenset[str]]],
                 equiv: Iterable[frozenset[str]]) -> tuple[str, ...]:
    """Drop IDs determined by the remaining ones (so dependent attributes are not IDs)."""
    fds, equiv = list(fds), list(equiv)
    key = list(dict.fromkeys(cands))
    for c in reversed(list(key)):
        rest = [k for k in key if k != c]
        if rest and c in closure(rest, fds, equiv):
            key = rest
    return tuple(key)


def merge_equiv(classes: Iterable[frozenset[str]], pairs: Iterable[tuple[str, str]]
                ) -> tuple[frozenset[str], ...]:
    groups = [set(c) for c in classes]
    for a, b in pairs:
        ga = next((g for g in groups if a in g), None)
        gb = next((g for g in groups if b in g), None)
        if ga is None and gb is None:
            groups.append({a, b})
        elif ga is None:
            assert gb is not None
            gb.add(a)
        elif gb is None:
            ga.add(b)
        elif ga is not gb:
            ga |= gb
            groups.remove(gb)
    return tuple(frozenset(g) for g in groups if len(g) > 1)


def keeps_input_cache(child: A.Node, info: NodeInfo) -> bool:
    """§5: a γ's input is materialized as an operator cache when it combines rows of several
    inputs (re-joining on every change would cost what the cache saves) and no many-to-many
    join makes the cache multi-valued (§4 footnote 6)."""
    from idivm.rules import rule_for

    return any(rule_for(n).combines for n in A.walk(child)) and not info.multivalued


# -- SQL builders (everything through sqlglot; identifiers always quoted) --------------------


def c(name: str, alias: str | None = None) -> exp.Column:
    return A.col(name, alias)


def t(name: str, alias: str | None = None) -> exp.Table:
    return exp.table_(exp.to_identifier(name, quoted=True),
                      alias=exp.to_identifier(alias, quoted=True) if alias else None)


def select(items: Sequence[tuple[str, exp.Expr]], from_: exp.Expr,
           where: exp.Expr | None = None, distinct: bool = False,
           owned: bool = False) -> exp.Select:
    """SELECT items FROM from_ [WHERE where]. Each input is copied once (the items by
    alias_; from_ and where as sqlglot's builders would have copied them — from_ only when a
    WHERE or DISTINCT follows), the query itself never: the builders' default copies of the
    growing query were a large part of planning. ``owned``: from_ and where are the
    caller's fresh trees, handed over uncopied (a query nested in the next one's FROM)."""
    q = exp.select(*[exp.alias_(e, exp.to_identifier(n, quoted=True)) for n, e in items])
    q = q.from_(from_.copy() if (where is not None or distinct) and not owned else from_,
                copy=False)
    if where is not None:
        q = q.where(where if owned else where.copy(), copy=False)
    if distinct:
        q = q.distinct(copy=False)
    return q


def is_true(p: exp.Expr) -> exp.Expr:
    """φ IS TRUE: a NULL condition counts as false, as in WHERE."""
    return exp.Is(this=exp.paren(p), expression=exp.true())


def not_true(p: exp.Expr) -> exp.Expr:
    return exp.Not(this=is_true(p))


def and_all(parts: Sequence[exp.Expr]) -> exp.Expr:
    out = A.conjoin(list(parts))
    return out if out is not None else exp.true()


def match(pairs: Sequence[tuple[str, str]], left: str, right: str,
          nullable: Mapping[str, bool] | None = None) -> exp.Expr:
    """left.a = right.b for each pair (null-safe where the left column may be NULL)."""
    parts: list[exp.Expr] = []
    for a, b in pairs:
        la, rb = c(a, left), c(b, right)
        if nullable and nullable.get(a, False):
            parts.append(exp.paren(exp.or_(exp.EQ(this=la, expression=rb), exp.and_(
                exp.Is(this=la.copy(), expression=exp.null()),
                exp.Is(this=rb.copy(), expression=exp.null())))))
        else:
            parts.append(exp.EQ(this=la, expression=rb))
    return and_all(parts)


def exists(from_: exp.Expr, where: exp.Expr) -> exp.Exists:
    return exp.Exists(this=exp.select(exp.Literal.number(1)).from_(from_).where(where))


def union_all(queries: Sequence[exp.Select]) -> exp.Expr:
    out: exp.Expr = queries[0]
    for q in queries[1:]:
        out = exp.union(out, q, distinct=False, copy=False)  # fresh trees: no copies
    return out


def subquery(q: exp.Expr, alias: str) -> exp.Subquery:
    return exp.Subquery(this=q, alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))


# -- the rule context -----------------------------------------------------------------------


class RuleContext:
    """What rule instantiation (pass 2) gives a rule: annotations and diff construction."""

    def __init__(self, nodes: Mapping[int, A.Node], infos: Mapping[int, NodeInfo]) -> None:
        self.nodes = nodes
        self.infos = infos
        self.diffs: dict[str, DiffNode] = {}
        self.direct: dict[int, frozenset[str]] = {}
        self._n = 0

    def cols(self, nid: int) -> tuple[str, ...]:
        return self.nodes[nid].columns

    def info(self, nid: int) -> NodeInfo:
        return self.infos[nid]

    def emit(self, kind: Kind, nid: int, ids: Sequence[str], query: exp.Select, rule: str,
             inputs: Sequence[DiffNode], pre: Sequence[str] = (), post: Sequence[str] = (),
             exact: bool = False) -> DiffNode:
        """A new i-diff of operator ``nid``; ``exact``: see ``DiffNode.exact``."""
        self._n += 1
        schema = DiffSchema(kind, nid, tuple(ids), tuple(pre), tuple(post))
        source = inputs[0].source if inputs else ""
        d = DiffNode(f"d{self._n}", schema, query, rule, tuple(i.name for i in inputs), source,
                     exact)
        self.diffs[d.name] = d
        return d

    def base(self, schema: DiffSchema, query: exp.Select, rule: str, source: str) -> DiffNode:
        self._n += 1
        d = DiffNode(f"d{self._n}", schema, query, rule, (), source)
        self.diffs[d.name] = d
        return d

    def read_directly(self, nid: int, diffs: Sequence[DiffNode]) -> None:
        """The rules read these i-diffs of operator ``nid`` straight (joined to its cache on
        their IDs), not through the cache's before/after snapshots of the rows they touch
        (``__old__N`` / ``__new__N``): pass 3 leaves them out of those snapshots."""
        self.direct[nid] = frozenset(d.name for d in diffs)

    # relations
    def rel(self, d: DiffNode, alias: str) -> exp.Table:
        return t(d.name, alias)

    def state(self, which: str, nid: int, alias: str) -> exp.Table:
        """Input_pre / Input_post (``which`` = "pre" / "post") or Output ("output")."""
        return t(placeholder(which, nid), alias)

    def fetch(self, which: str, nid: int, d: DiffNode, alias: str) -> exp.Table:
        """Input_{pre|post} ⋉_IDs Δ: the rows of operator ``nid`` that ``d`` names."""
        return t(placeholder(f"fetch__{which}", nid, d.name), alias)

    # values of an input diff's row
    @staticmethod
    def pre_val(d: DiffNode, col: str, alias: str) -> exp.Expr | None:
        s = d.schema
        if col in s.ids:
            return c(col, alias)
        if s.kind == "ins":
            return None
        if col in s.pre:
            return c(pre_name(col), alias)
        return None

    @staticmethod
    def post_val(d: DiffNode, col: str, alias: str) -> exp.Expr | None:
        s = d.schema
        if s.kind == "ins":
            return c(col, alias)
        if col in s.ids:
            return c(col, alias)
        if s.kind == "upd" and col in s.post:
            return c(post_name(col), alias)
        return None

    def bind(self, pred: exp.Expr, values: Mapping[str, exp.Expr | None]
             ) -> exp.Expr | None:
        """φ with each column replaced by its value; None when some value is unknown."""
        needed = A.referenced(pred)
        if any(values.get(n) is None for n in needed):
            return None
        return A.rename_columns(pred, {n: v for n, v in values.items() if v is not None})

    def pre_values(self, d: DiffNode, alias: str) -> dict[str, exp.Expr | None]:
        return {x: self.pre_val(d, x, alias) for x in self.cols(d.schema.nid)}

    def post_values(self, d: DiffNode, alias: str) -> dict[str, exp.Expr | None]:
        return {x: self.post_val(d, x, alias) for x in self.cols(d.schema.nid)}

    def passthrough(self, d: DiffNode, nid: int, rule: str, alias: str = "i") -> DiffNode:
        """The input i-diff unchanged, as an i-diff of operator ``nid`` (same column names)."""
        s = d.schema
        cols = s.columns(self.cols(s.nid)) if s.kind != "ins" else self.cols(nid)
        q = select([(x, c(x, alias)) for x in cols], self.rel(d, alias))
        return self.emit(s.kind, nid, s.ids, q, rule, [d], s.pre, s.post)

    def ids_only_delete(self, d: DiffNode, nid: int, rule: str, ids: Sequence[str] | None = None,
                        alias: str = "i", where: exp.Expr | None = None) -> DiffNode:
        """Δ-(I') naming every row the input diff names (an overestimate, fixed by a Δ+)."""
        key = tuple(ids if ids is not None else d.schema.ids)
        q = select([(x, c(x, alias)) for x in key], self.rel(d, alias), where, distinct=True)
        return self.emit("del", nid, key, q, rule, [d])
