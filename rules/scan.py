"""SCAN(R): Table 1 (IDs = key(R)); base-table i-diffs enter the plan here, renamed to the scan's
column names (one copy per alias, §4 footnote 5)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo, post_name, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select, t
from idivm.render import Flat, Renderer

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.Scan)
    table = cat.table(node.table)
    key = tuple(node.col_of(k) for k in table.primary_key)
    cols = frozenset(node.cols)
    return node, NodeInfo(
        ids=key,
        scan_ids={node.nid: key},
        equiv=(),
        fds=((frozenset(key), cols),),
        lineage={p: frozenset({(node.nid, b)}) for p, b in zip(node.cols, node.base_cols,
                                                                  strict=True)},
        nullable={p: table.column(b).nullable and b not in table.primary_key
                  for p, b in zip(node.cols, node.base_cols, strict=True)},
        carry=key,
        multivalued=False,
        types={p: table.column(b).type for p, b in zip(node.cols, node.base_cols, strict=True)},
    )


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    """Rename a base-table i-diff (base column names) to this scan's columns."""
    assert isinstance(node, A.Scan)
    s = d.schema
    ids = tuple(node.col_of(k) for k in s.ids)
    if s.kind == "ins":
        items = [(p, c(b, "i")) for p, b in zip(node.cols, node.base_cols, strict=True)]
    else:
        items = [(node.col_of(k), c(k, "i")) for k in s.ids]
        items += [(pre_name(node.col_of(a)), c(pre_name(a), "i")) for a in s.pre]
        items += [(post_name(node.col_of(a)), c(post_name(a), "i")) for a in s.post]
    q = select(items, ctx.rel(d, "i"))
    return [ctx.emit(s.kind, node.nid, ids, q, "SCAN: base i-diff as the scan's i-diff", [d],
                     [node.col_of(a) for a in s.pre], [node.col_of(a) for a in s.post])]


def render(r: Renderer, node: A.Node) -> Flat:
    assert isinstance(node, A.Scan)
    a = r.alias()
    return Flat([(t(node.table, a), None, None)], [], {
        p: c(b, a) for p, b in zip(node.cols, node.base_cols, strict=True)})


def fresh(f: Flattener, node: A.Node) -> None:
    """A relation atom whose variables are the scan's columns."""
    from idivm.fresh import expr as E
    from idivm.fresh.query import Atom

    assert isinstance(node, A.Scan)
    table = f.catalog.table(node.table)
    vs = []
    for col, base in zip(node.cols, node.base_cols, strict=True):
        v = E.Var(E.sql_type(table.column(base).type, f"{node.table}.{base}"), col)
        f.env[col] = v
        vs.append(v)
    f.atoms.append(Atom(node.table, tuple(vs)))


RULE = OperatorRule(op=A.Scan, paper="Table 1", infer=infer, propagate=propagate,
                    tuple_safe=True, render=render, fresh=fresh)
