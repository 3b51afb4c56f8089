"""§5: the base-table i-diff schema generator.

One insert and one delete schema per table; one update schema per set of conditional attributes
C_op (the table's non-key attributes in some operator's condition) and one for the
non-conditional attributes the view uses. ``changes`` restricts the modification types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.planner.model import BaseSchema, NodeInfo, Strategy
from idivm.rules import rule_for

Changes = Mapping[str, Sequence[str]]


def parse_changes(changes: Changes | None, tables: Sequence[str], catalog: Catalog
                  ) -> dict[str, tuple[set[str], set[str] | None]]:
    """table → (kinds, update columns or None for all); tables not listed never change."""
    if changes is None:
        return {t: ({"insert", "delete", "update"}, None) for t in tables}
    out: dict[str, tuple[set[str], set[str] | None]] = {}
    for table, kinds in changes.items():
        if table not in tables:
            raise IdivmError(f"changes names table {table!r}, which the view does not read")
        ks: set[str] = set()
        cols: set[str] | None = None
        for k in kinds:
            kind, _, rest = k.partition(":")
            if kind not in ("insert", "delete", "update"):
                raise IdivmError(f"unknown modification type {k!r} for {table}: use insert, "
                                 "delete, update or update:col1,col2")
            ks.add(kind)
            if kind == "update" and rest:
                names = {c.strip() for c in rest.split(",") if c.strip()}
                for n in names:
                    catalog.table(table).column(n)
                cols = (cols or set()) | names
            elif kind == "update":
                cols = None if not rest else cols
        out[table] = (ks, cols)
    return out


def _base_cols(root: A.Node, infos: Mapping[int, NodeInfo], cols: set[str],
               nodes: Sequence[A.Node]) -> dict[str, set[str]]:
    """The base-table columns (per table) that ``cols`` of ``nodes`` derive from."""
    scans = {s.nid: s for s in A.scans(root)}
    out: dict[str, set[str]] = {}
    for n in nodes:
        lin = infos[n.nid].lineage
        for x in cols:
            for scan_nid, b in lin.get(x, frozenset()):
                out.setdefault(scans[scan_nid].table, set()).add(b)
    return out


def analyze(root: A.Node, infos: Mapping[int, NodeInfo]
            ) -> tuple[dict[str, list[tuple[frozenset[str], str]]], dict[str, set[str]]]:
    """Per table: the conditional attribute sets C_op (with the operator), and every attribute
    the view reads (in its output, a condition or an aggregate)."""
    tables = sorted({s.table for s in A.scans(root)})
    conditional: dict[str, list[tuple[frozenset[str], str]]] = {t: [] for t in tables}
    used: dict[str, set[str]] = {t: set() for t in tables}
    for node in A.walk(root):
        cond = rule_for(node).conditions(node)
        for table, cols in _base_cols(root, infos, cond, node.children).items():
            conditional[table].append((frozenset(cols), f"C_op of {node.label}"))
            used[table] |= cols
        if isinstance(node, A.Aggregate):
            args = {a.arg for a in node.aggs if a.arg}
            for table, cols in _base_cols(root, infos, args, [node.child]).items():
                used[table] |= cols
    for table, cols in _base_cols(root, infos, set(root.columns), [root]).items():
        used[table] |= cols
    return conditional, used


def generate(root: A.Node, infos: Mapping[int, NodeInfo], catalog: Catalog,
             changes: Changes | None = None, strategy: Strategy = "id"
             ) -> tuple[BaseSchema, ...]:
    tables = sorted({s.table for s in A.scans(root)})
    allowed = parse_changes(changes, tables, catalog)
    conditional, used = analyze(root, infos)
    out: list[BaseSchema] = []
    for table in tables:
        kinds, upd_cols = allowed.get(table, (set(), set()))
        t = catalog.table(table)
        nonkey = [c for c in t.non_key_columns if c in used[table]]
        if strategy == "tuple":
            out += _tuple_schemas(table, kinds, tuple(
                c for c in nonkey if "update" in kinds and (upd_cols is None or c in upd_cols)))
            continue
        if "insert" in kinds:
            out.append(BaseSchema(table, "ins", reason="insert i-diff Δ+(I, A_post)"))
        if "delete" in kinds:
            out.append(BaseSchema(table, "del", reason="delete i-diff Δ-(I, A_pre)"))
        if "update" not in kinds:
            continue
        seen: set[tuple[str, ...]] = set()
        cond_all: set[str] = set()
        for cols, why in conditional[table]:
            key_free = [c for c in nonkey if c in cols and (upd_cols is None or c in upd_cols)]
            cond_all |= set(c for c in nonkey if c in cols)
            if key_free and tuple(key_free) not in seen:
                seen.add(tuple(key_free))
                out.append(BaseSchema(table, "upd", tuple(key_free), why))
        nc = [c for c in nonkey if c not in cond_all and (upd_cols is None or c in upd_cols)]
        if nc:
            out.append(BaseSchema(table, "upd", tuple(nc), "non-conditional attributes NC"))
    return tuple(out)


def _tuple_schemas(table: str, kinds: set[str], upd: tuple[str, ...]) -> list[BaseSchema]:
    """t-diffs (the tuple-based baseline): an update of a used attribute is a Δ- of the
    pre-image and a Δ+ of the post-image, whatever the attribute; ``cols`` records which
    updates they carry."""
    out = []
    if "insert" in kinds or upd:
        out.append(BaseSchema(table, "ins", upd, "t-diff Δ+: inserts and update post-images",
                              tuple_based=True))
    if "delete" in kinds or upd:
        out.append(BaseSchema(table, "del", upd, "t-diff Δ-: deletes and update pre-images",
                              tuple_based=True))
    return out
