"""∪ (bag union with a branch tag b), tuple-based: Δ+ as for i-diffs; a Δ- carries the whole
tuple — the positional columns (also those that are IDs of its branch) and the other branch's
carried IDs, which are NULL on its rows."""

from __future__ import annotations

from sqlglot import exp

from idivm import algebra as A
from idivm.errors import IdivmError
from idivm.planner.model import DiffNode, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, select

from .. import union_all as id_union


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.UnionAll)
    s = d.schema
    if s.kind == "ins":
        return id_union.propagate(ctx, node, idx, d)
    if s.kind != "del":
        raise IdivmError(f"tuple-based ∪ got a {s.describe()}: t-diffs are Δ+ and Δ- only")
    cols = node.left_cols if idx == 0 else node.right_cols
    own = node.left_ids if idx == 0 else node.right_ids
    vals = ctx.pre_values(d, "i")
    value: dict[str, exp.Expr] = {A.BRANCH: exp.Literal.number(idx)}
    for x, n in zip(cols, node.names, strict=True):
        v = vals.get(x)
        if v is None:
            raise IdivmError(f"tuple-based ∪: Δ- lacks {x} (not a t-diff)")
        value[n] = v
    for x in own:
        v = vals.get(x)
        assert v is not None
        value[node.carry(idx, x)] = v
    info = ctx.info(node.nid)
    for k in node.columns:
        if k not in value:  # the other branch's carried IDs: NULL, typed
            ty = info.types.get(k)
            value[k] = exp.cast(exp.null(), exp.DataType.build(ty, dialect="postgres")) \
                if ty else exp.null()
    ids = info.ids
    rest = [k for k in node.columns if k not in ids]
    q = select([(k, value[k]) for k in ids] + [(pre_name(k), value[k]) for k in rest],
               ctx.rel(d, "i"))
    return [ctx.emit("del", node.nid, ids, q, "t-diff ∪: Δ- tagged with b, the whole tuple",
                     [d], rest)]


RULE = OperatorRule(op=A.UnionAll, paper="classical (tuple-based)", infer=id_union.RULE.infer,
                    propagate=propagate)
