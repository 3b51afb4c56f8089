"""The one-row relation of a SELECT without FROM (``SELECT 1 WHERE 5 IN (SELECT a FROM r)``):
IDs = its one constant column; no base table, so no i-diff ever reaches it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo
from idivm.planner.ruleapi import OperatorRule, RuleContext, select
from idivm.render import Renderer


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.OneRow)
    k = node.name
    return node, NodeInfo(ids=(k,), scan_ids={}, equiv=(), fds=((frozenset((k,)),
                                                                   frozenset((k,))),),
                          lineage={k: frozenset()}, nullable={k: False}, carry=(k,),
                          multivalued=False, types={k: "INT"}, constant=frozenset((k,)))


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    raise AssertionError("the one-row relation has no input to change")


def render(r: Renderer, node: A.Node) -> exp.Select:
    assert isinstance(node, A.OneRow)
    q = select([(node.name, exp.Literal.number(1))], exp.Values(
        expressions=[exp.Tuple(expressions=[exp.Literal.number(1)])],
        alias=exp.TableAlias(this=exp.to_identifier("one", quoted=True))))
    return q


RULE = OperatorRule(op=A.OneRow, paper="(SELECT without FROM)", infer=infer,
                    propagate=propagate, tuple_safe=True, render=render,
                    fresh_refusal=("SELECT without FROM", "fresh views read base tables"))
