"""The logical algebra idivm plans over: small immutable nodes (Q_SPJADU and friends).

Scalar expressions stay sqlglot expressions whose column references are unqualified
``exp.Column`` nodes naming a column of the operator's input (for binary operators: of either
input; column names are unique across a whole plan, the frontend sees to that).
Every node carries a plan-unique ``nid`` so annotations can be kept outside the nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

BRANCH = "__b"  # the union-all branch attribute b of §2, footnote 2
COUNT = "__cnt"  # count(*) kept by every aggregate so groups can be created and removed


@dataclass(frozen=True)
class Node:
    nid: int

    @property
    def columns(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def children(self) -> tuple[Node, ...]:
        return ()

    @property
    def label(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Scan(Node):
    """SCAN(R): one alias of a base table; ``cols[i]`` is the plan name of ``base_cols[i]``."""

    table: str
    alias: str
    cols: tuple[str, ...]
    base_cols: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.cols

    def base_of(self, col: str) -> str:
        return self.base_cols[self.cols.index(col)]

    def col_of(self, base_col: str) -> str:
        return self.cols[self.base_cols.index(base_col)]

    @property
    def label(self) -> str:
        return f"Scan({self.table} AS {self.alias})"


@dataclass(frozen=True)
class OneRow(Node):
    """The one-row relation a SELECT without FROM reads: one constant column ``name`` (its ID);
    it never changes."""

    name: str

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def label(self) -> str:
        return "{()}"


@dataclass(frozen=True)
class Select(Node):
    """σ_φ(child)."""

    child: Node
    predicate: exp.Expr

    @property
    def columns(self) -> tuple[str, ...]:
        return self.child.columns

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child,)

    @property
    def label(self) -> str:
        return f"σ[{self.predicate.sql('postgres')}]"


@dataclass(frozen=True)
class Project(Node):
    """Generalized projection π_{D, f(X)→c}: ``exprs`` maps each output name to an expression."""

    child: Node
    exprs: tuple[tuple[str, exp.Expr], ...]
    hidden: frozenset[str] = field(default_factory=frozenset)  # added by ID inference

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.exprs)

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child,)

    def passthrough(self) -> dict[str, str]:
        """Child column → output column for outputs that are plain column references."""
        out: dict[str, str] = {}
        for name, e in self.exprs:
            if isinstance(e, exp.Column) and e.name not in out:
                out[e.name] = name
        return out

    @property
    def label(self) -> str:
        shown = [n if isinstance(e, exp.Column) and e.name == n else f"{e.sql('postgres')}→{n}"
                 for n, e in self.exprs]
        return f"π[{', '.join(shown)}]"


@dataclass(frozen=True)
class _Pair(Node):
    """Two inputs joined on φ, with the columns of both."""

    left: Node
    right: Node
    predicate: exp.Expr | None

    @property
    def columns(self) -> tuple[str, ...]:
        return self.left.columns + self.right.columns

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Join(_Pair):
    """Inner θ-join ⋈_φ; ``predicate`` None is the cross product ×."""

    @property
    def label(self) -> str:
        if self.predicate is None:
            return "×"
        return f"⋈[{self.predicate.sql('postgres')}]"


@dataclass(frozen=True)
class OuterJoin(_Pair):
    """Left outer join l ⟕_φ r (``full``: full outer join ⟗_φ): the inner join's rows, plus
    each row of l (and, when full, of r) that joins no row of the other side, padded with
    NULLs. A RIGHT JOIN is a left one with its inputs swapped (columns are named, not placed).
    """

    full: bool = False

    @property
    def label(self) -> str:
        sym = "⟗" if self.full else "⟕"
        return f"{sym}[{self.predicate.sql('postgres') if self.predicate is not None else 'TRUE'}]"


@dataclass(frozen=True)
class _Probe(Node):
    """A left input filtered by whether its rows join some row of the right input."""

    left: Node
    right: Node
    predicate: exp.Expr
    symbol = "?"

    @property
    def columns(self) -> tuple[str, ...]:
        return self.left.columns

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    @property
    def label(self) -> str:
        return f"{self.symbol}[{self.predicate.sql('postgres')}]"


@dataclass(frozen=True)
class SemiJoin(_Probe):
    """Semijoin l ⋉_φ r (EXISTS, IN): the rows of l that join some row of r."""

    symbol = "⋉"


@dataclass(frozen=True)
class AntiJoin(_Probe):
    """Antisemijoin l ▷_φ r (NOT EXISTS, NOT IN, EXCEPT): the rows of l joining no row of r."""

    symbol = "▷"


@dataclass(frozen=True)
class UnionAll(Node):
    """Bag union with branch attribute b; ``names[i]`` takes ``left_cols[i]`` / ``right_cols[i]``.

    ``left_ids`` / ``right_ids`` are the branch columns carried (as hidden ``carry`` columns)
    so that i-diffs of either branch can still name the union's rows (Table 1).
    """

    left: Node
    right: Node
    names: tuple[str, ...]
    left_cols: tuple[str, ...]
    right_cols: tuple[str, ...]
    left_ids: tuple[str, ...] = ()
    right_ids: tuple[str, ...] = ()

    def carry(self, branch: int, col: str) -> str:
        return f"__u{branch}_{col}"

    @property
    def columns(self) -> tuple[str, ...]:
        return (
            self.names
            + (BRANCH,)
            + tuple(self.carry(0, c) for c in self.left_ids)
            + tuple(self.carry(1, c) for c in self.right_ids)
        )

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    @property
    def label(self) -> str:
        return f"∪all[{', '.join(self.names)}]"


AGG_FUNCS = ("sum", "count", "count_star", "avg", "min", "max")


@dataclass(frozen=True)
class AggCall:
    """One aggregate f(x)→name; ``arg`` is a child column (None for count(*))."""

    name: str
    func: str
    arg: str | None

    @property
    def state(self) -> tuple[str, ...]:
        """Hidden operator-cache columns kept next to the output (Table 12: AVG via SUM, COUNT)."""
        if self.func == "sum":
            return (f"__nn_{self.name}",)
        if self.func == "avg":
            return (f"__sum_{self.name}", f"__nn_{self.name}")
        return ()

    def sql(self) -> str:
        f = "count" if self.func == "count_star" else self.func
        return f"{f}({self.arg or '*'})"


@dataclass(frozen=True)
class Aggregate(Node):
    """γ_{G, f(X)→c}; DISTINCT is γ with no aggregates; ``group_by == ()`` is a global aggregate.

    A global aggregate exposes a constant id column ``__g`` so its single row has an ID.
    """

    child: Node
    group_by: tuple[str, ...]
    aggs: tuple[AggCall, ...]

    @property
    def is_global(self) -> bool:
        return not self.group_by

    @property
    def keys(self) -> tuple[str, ...]:
        return self.group_by if self.group_by else ("__g",)

    @property
    def columns(self) -> tuple[str, ...]:
        state = tuple(s for a in self.aggs for s in a.state)
        return self.keys + tuple(a.name for a in self.aggs) + (COUNT,) + state

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child,)

    @property
    def label(self) -> str:
        aggs = ", ".join(f"{a.sql()}→{a.name}" for a in self.aggs)
        return f"γ[{', '.join(self.group_by)}; {aggs}]"


def walk(node: Node) -> Iterator[Node]:
    """Post-order traversal (children before parents)."""
    for c in node.children:
        yield from walk(c)
    yield node


def scans(node: Node) -> list[Scan]:
    return [n for n in walk(node) if isinstance(n, Scan)]


def referenced(e: exp.Expr | None) -> set[str]:
    """Column names an expression reads."""
    if e is None:
        return set()
    return {c.name for c in e.find_all(exp.Column)}


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3`` … — the first not in ``taken``, which it joins."""
    name = base
    for i in itertools.count(2):
        if name not in taken:
            break
        name = f"{base}_{i}"
    taken.add(name)
    return name


def col(name: str, table: str | None = None) -> exp.Column:
    """A quoted column reference."""
    return exp.column(name, table=table, quoted=True)


def conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    if e is None:
        return []
    if isinstance(e, exp.And):
        return conjuncts(e.left) + conjuncts(e.right)
    if isinstance(e, exp.Paren):
        return conjuncts(e.this)
    return [e]


def conjoin(parts: Sequence[exp.Expr]) -> exp.Expr | None:
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = exp.and_(out, p)
    return out


def equalities(e: exp.Expr | None) -> list[tuple[str, str]]:
    """Column = column conjuncts of a predicate (they make the two columns equivalent)."""
    pairs = []
    for c in conjuncts(e):
        if isinstance(c, exp.EQ) and isinstance(c.left, exp.Column) and isinstance(
            c.right, exp.Column
        ):
            pairs.append((c.left.name, c.right.name))
    return pairs


def rename_columns(e: exp.Expr, mapping: Mapping[str, exp.Expr]) -> exp.Expr:
    """Replace column references by expressions (a pure rewrite; ``e`` is not modified)."""

    def sub(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and n.name in mapping:
            return mapping[n.name].copy()
        return n

    return e.transform(sub)


def replace_child(node: Node, index: int, child: Node) -> Node:
    """A copy of ``node`` with child ``index`` replaced."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(node) if isinstance(getattr(node, f.name), Node)]
    return dataclasses.replace(node, **{names[index]: child})  # type: ignore[arg-type]
