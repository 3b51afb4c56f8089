"""Shared planner structures: per-operator annotations, i-diff schemas, the rule DAG nodes.

Rule queries are sqlglot SELECTs over *placeholders* (tables with reserved names) that pass 3
resolves once caches are decided:

- a diff name (``d12``): an i-diff relation of the rule DAG;
- ``__post__N`` / ``__pre__N``: Input_post / Input_pre, the post- or pre-state of operator N;
- ``__output__N``: Output, the stored pre-state of operator N (an aggregate's cache or the view);
- ``__old__N`` / ``__new__N``: the pre- and post-state rows of operator N that its i-diffs touch;
- ``__fetch__{post|pre}__N__D``: Input ⋉_IDs Δ — the rows of N named by diff D (pass 4 rewrites
  these under C1–C3 where the diff itself carries the row).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

Kind = Literal["ins", "del", "upd"]
Strategy = Literal["id", "tuple", "recompute"]
STRATEGIES: tuple[Strategy, ...] = ("id", "tuple", "recompute")
KIND_SYMBOL = {"ins": "Δ+", "del": "Δ-", "upd": "Δu"}


@dataclass(frozen=True)
class NodeInfo:
    """Pass-1 annotations of one operator (Table 1 plus the functional dependencies used)."""

    ids: tuple[str, ...]  # the operator's IDs: a minimal key of its output
    scan_ids: Mapping[int, tuple[str, ...]]  # scan nid → columns holding that scan's key
    equiv: tuple[frozenset[str], ...]  # columns equal on every row (join / selection equalities)
    fds: tuple[tuple[frozenset[str], frozenset[str]], ...]  # functional dependencies lhs → rhs
    lineage: Mapping[str, frozenset[tuple[int, str]]]  # column → {(scan nid, base column)}
    nullable: Mapping[str, bool]
    carry: tuple[str, ...]  # columns every projection above must keep
    multivalued: bool  # a many-to-many join below: no intermediate cache (§4 footnote 6)
    types: Mapping[str, str | None]  # SQL type where known (copies of base columns)
    # of ``carry``, the columns kept only so that an aggregate's Output below can be read
    # through projections (the view as the aggregate's cache): an operator that is no
    # projection has the aggregate cached below it and drops them
    output_carry: tuple[str, ...] = ()
    one_row: bool = False  # at most one row (a γ without GROUP BY, and σ/π over it)
    # columns holding one and the same value in every row of every state (a global γ's
    # ``__g``, and the copies of it an inner join or a π keeps): rows named by IDs are found
    # by the other IDs alone
    constant: frozenset[str] = frozenset()

    def same(self, a: str, b: str) -> bool:
        return a == b or any(a in c and b in c for c in self.equiv)

    def klass(self, a: str) -> frozenset[str]:
        for c in self.equiv:
            if a in c:
                return c
        return frozenset((a,))


@dataclass(frozen=True)
class DiffSchema:
    """An i-diff schema Δ^t(I', A'_pre, A''_post) over operator ``nid`` (§2)."""

    kind: Kind
    nid: int
    ids: tuple[str, ...]
    pre: tuple[str, ...] = ()
    post: tuple[str, ...] = ()

    def columns(self, node_columns: tuple[str, ...]) -> tuple[str, ...]:
        if self.kind == "ins":
            return node_columns
        cols = self.ids + tuple(pre_name(c) for c in self.pre)
        if self.kind == "upd":
            cols += tuple(post_name(c) for c in self.post)
        return cols

    def describe(self) -> str:
        parts = [", ".join(self.ids) or "∅"]
        if self.pre:
            parts.append(", ".join(f"{c}_pre" for c in self.pre))
        if self.post:
            parts.append(", ".join(f"{c}_post" for c in self.post))
        return f"{KIND_SYMBOL[self.kind]}({'; '.join(parts)})"


@dataclass(frozen=True)
class DiffNode:
    """A node of the rule DAG: an instantiated i-diff propagation rule and its output i-diff."""

    name: str
    schema: DiffSchema
    query: exp.Select
    rule: str
    inputs: tuple[str, ...]
    source: str  # the base-table i-diff schema it descends from
    # exact: each row names a row of the operator's Output by all of its IDs, once — a Δ-/Δu
    # one that is there (its pre-values that row's), a Δ+ one that is not — as γ's per-group
    # i-diffs do (they read Output); pass 3 then takes its cache's snapshots from the i-diffs
    exact: bool = False


@dataclass(frozen=True)
class BaseSchema:
    """A base-table i-diff schema from the §5 generator."""

    table: str
    kind: Kind
    cols: tuple[str, ...] = ()  # update: the attributes whose post-state it carries
    reason: str = ""
    # a t-diff (tuple-based strategy): updates of ``cols`` arrive as Δ- of the pre-image and
    # Δ+ of the post-image, full tuples both
    tuple_based: bool = False

    @property
    def name(self) -> str:
        if self.tuple_based:
            return f"{self.table}__t{self.kind}"
        suffix = "__" + "_".join(self.cols) if self.kind == "upd" else ""
        return f"{self.table}__{self.kind}{suffix}"


def pre_name(c: str) -> str:
    return f"{c}__pre"


def post_name(c: str) -> str:
    return f"{c}__post"


def placeholder(kind: str, nid: int, extra: str = "") -> str:
    return f"__{kind}__{nid}" + (f"__{extra}" if extra else "")


def change_table(table: str) -> str:
    """The folded effective changes of a base table (filled by the backend)."""
    return f"__chg__{table}"


MAX_IDENT = 63  # PostgreSQL's NAMEDATALEN - 1: a longer name is silently truncated


def fit(name: str) -> str:
    """``name`` if it fits in 63 bytes, else a prefix of it and a hash of the whole
    (deterministic, so every caller derives the same name)."""
    raw = name.encode()
    if len(raw) <= MAX_IDENT:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:10]
    head = raw[: MAX_IDENT - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"
