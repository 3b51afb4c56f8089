"""Which filtered scans a join reads are worth a cache: σ_φ(T) stored, indexed on T's key.

A join's rules read the other input's Input_post for every change of this one: TPC-H Q17 joins
12k changed line items with ``σ(part: Brand#23, MED BOX)`` — 204 of 200k parts — and
PostgreSQL reads them by scanning ``part`` (twice per refresh: the magic set's copy too), or by
12k probes of its key. Stored as a cache (the parts σ keeps, with their key's index), that
input is a relation of 204 rows, maintained from ``part``'s log rows that meet φ (the log
filter keeps no others), which is cheap where φ keeps few of T's rows.

``candidates`` names each σ directly over a scan that is an input of a join (inner, outer,
semi, anti) reading it by its whole key, with a condition of the plain, deterministic operators
the log filter takes (its cache is maintained from the log rows that filter keeps); ``chosen``
keeps those whose estimated fraction of the table's rows is at most
``SELECTIVE_FRACTION``, asked of a ``Statistics`` — a backend's estimates (PostgreSQL:
``EXPLAIN``), or the choices a view was created with (``Recorded``), so a re-plan from the
registry makes the same caches. Without statistics nothing is chosen: plans, and the
Δ-scripts in ``scripts_out/``, are as before. A candidate is named by its ``signature`` (the
table and φ over its columns), so a σ and its copies (a magic set's) are chosen together.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from sqlglot import exp

from idivm import algebra as A
from idivm.planner.log_filter import SAFE, base_named, read_by_key
from idivm.planner.model import NodeInfo

__all__ = ["FILTER_FRACTION", "SELECTIVE_FRACTION", "Candidate", "Recorded", "Statistics",
           "candidates", "chosen", "chosen_filters", "filter_candidates"]

# at most this fraction of the table's rows kept by φ: the cache pays (an estimate's error of
# a few × still leaves it far smaller than the table)
SELECTIVE_FRACTION = 0.1

# at most this fraction of the table's rows kept by φ: the fold filters the other input's log
# by the keys of σ_φ(S) (``filter_candidates``) — a lookup of S's key index per distinct value
# of the log, which pays where it leaves out more than half the log rows
FILTER_FRACTION = 0.5
FILTER_PREFIX = "fold filter of "

# the inputs of these operators are read as Input_post for the other input's changes
_JOINS = (A.Join, A.OuterJoin, A.SemiJoin, A.AntiJoin)


@dataclass(frozen=True)
class Candidate:
    """A σ directly over a scan of ``table``, read by a join (``kind`` "cache"); or one a join
    reads by its whole key, directly or through other inputs' inner joins, whose keys may
    filter the other input's change log before the fold (``kind`` "filter",
    ``filter_candidates``)."""

    nid: int
    table: str
    predicate: exp.Expr  # φ over the table's own column names
    kind: str = "cache"

    @property
    def signature(self) -> str:
        """The table and φ, as PostgreSQL SQL over the table's columns: what names the choice
        (a filter's prefixed ``FILTER_PREFIX``)."""
        head = FILTER_PREFIX if self.kind == "filter" else ""
        return f"{head}{self.table}: {self.predicate.sql('postgres')}"

    def query(self, table: exp.Table) -> exp.Select:
        """``SELECT * FROM table WHERE φ`` (``table``: how the backend names it)."""
        return exp.select("*").from_(table).where(self.predicate.copy())


class Statistics(Protocol):
    """Estimates a backend gives the planner."""

    def selectivity(self, candidate: Candidate) -> float | None:
        """The estimated fraction of ``candidate.table``'s rows φ keeps; None: unknown, or the
        table too small for a cache to matter (not cached)."""


@dataclass(frozen=True)
class Recorded:
    """The choices a view was created with: its chosen signatures are selective, no other."""

    signatures: frozenset[str]

    def selectivity(self, candidate: Candidate) -> float | None:
        return 0.0 if candidate.signature in self.signatures else None


def _equated(join: A.Node, child: A.Node) -> set[str]:
    """The columns of ``child`` that ``join``'s condition equates with the other input's."""
    mine = set(child.columns)
    pred = getattr(join, "predicate", None)
    return {a if a in mine else b for a, b in A.equalities(pred) if (a in mine) != (b in mine)}


def candidates(root: A.Node, infos: Mapping[int, NodeInfo]) -> tuple[Candidate, ...]:
    """Each σ over a scan that a join reads by its whole key (the join's condition equates
    every ID of the σ with a column of the other input: each row of the other input meets at
    most one of its rows — a dimension's rows, read for the other input's changes), with a
    deterministic φ. A σ read by other columns (line items by ``l_partkey``) is left alone:
    its table is read through that column's index, and its changes — a fact table's, many —
    would each be applied to the cache as well."""
    out = []
    for n in A.walk(root):
        if not isinstance(n, _JOINS):
            continue
        for child in n.children:
            if not (isinstance(child, A.Select) and isinstance(child.child, A.Scan)):
                continue
            info = infos[child.nid]
            if not info.ids or not set(info.ids) <= _equated(n, child) \
                    or info.multivalued or info.one_row \
                    or any(info.nullable.get(k, True) for k in info.ids) \
                    or not all(isinstance(x, SAFE) for x in child.predicate.walk()):
                continue
            out.append(Candidate(child.nid, child.child.table,
                                 base_named(child.child, child.predicate)))
    return tuple(out)


def _keyed_ids(infos: Mapping[int, NodeInfo]) -> Callable[[A.Select], tuple[str, ...] | None]:
    """A σ's IDs where they are a key a join can read it by: never NULL, one row each."""
    def key(sel: A.Select) -> tuple[str, ...] | None:
        info = infos[sel.nid]
        if not info.ids or info.multivalued or info.one_row \
                or any(info.nullable.get(k, True) for k in info.ids):
            return None
        return tuple(info.ids)
    return key


def filter_candidates(root: A.Node, infos: Mapping[int, NodeInfo]) -> tuple[Candidate, ...]:
    """Each σ over a scan with a deterministic φ that a join reads by its whole key through
    one input (``planner.log_filter.read_by_key``: the σ is the input, or reaches it through
    inner joins) where the fold filters the other input's log by it (the inputs
    ``log_filter.fold_filters`` gives such semijoins): a log row of the other input whose
    values are no key of σ_φ(S), before or after the changes, joins nothing there. TPC-H Q5:
    the 1994 orders (15% of them) keep ~15% of the line-item log rows."""
    key = _keyed_ids(infos)
    out: dict[int, Candidate] = {}
    for n in A.walk(root):
        if isinstance(n, A.Join | A.SemiJoin):
            sides = [(n.children[0], n.children[1]), (n.children[1], n.children[0])]
        elif isinstance(n, A.OuterJoin | A.AntiJoin):
            sides = [] if getattr(n, "full", False) else [(n.children[0], n.children[1])]
        else:
            continue
        for sibling, child in sides:
            for sel, cols in read_by_key(n, sibling, child, key):
                # (a key of one column: the fold looks each value up, ``fold_visible``)
                if len(cols) != 1 or not all(isinstance(x, SAFE) for x in sel.predicate.walk()):
                    continue
                assert isinstance(sel.child, A.Scan)
                out.setdefault(sel.nid, Candidate(sel.nid, sel.child.table,
                                                  base_named(sel.child, sel.predicate),
                                                  "filter"))
    return tuple(out.values())


def _verdicts(cands: tuple[Candidate, ...], stats: Statistics, fraction: float
              ) -> dict[int, str]:
    out: dict[int, str] = {}
    verdicts: dict[str, bool] = {}
    for cand in cands:
        sig = cand.signature
        if sig not in verdicts:
            f = stats.selectivity(cand)
            verdicts[sig] = f is not None and f <= fraction
        if verdicts[sig]:
            out[cand.nid] = sig
    return out


def chosen(root: A.Node, infos: Mapping[int, NodeInfo], stats: Statistics | None
           ) -> dict[int, str]:
    """The candidates to cache: nid → signature."""
    if stats is None:
        return {}
    return _verdicts(candidates(root, infos), stats, SELECTIVE_FRACTION)


def chosen_filters(root: A.Node, infos: Mapping[int, NodeInfo], stats: Statistics | None,
                   cached: Collection[int] = ()) -> dict[int, str]:
    """The filter candidates whose φ keeps at most ``FILTER_FRACTION`` of the table's rows,
    but those ``cached`` (``chosen``: a stored σ filters the fold as it is): nid →
    signature. Without statistics none: the Δ-scripts in ``scripts_out/`` are as before."""
    if stats is None:
        return {}
    return _verdicts(tuple(c for c in filter_candidates(root, infos) if c.nid not in cached),
                     stats, FILTER_FRACTION)
