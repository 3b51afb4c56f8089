"""Inner θ-join ⋈_φ and ×, tuple-based: Δ(l ⋈ r) = Δ+_l ⋈ r_post ∪ l_post ⋈ Δ+_r (inserts)
and Δ-_l ⋈ r_pre ∪ l_pre ⋈ Δ-_r (deletes), applied deletes first."""

from __future__ import annotations

from idivm import algebra as A
from idivm.errors import IdivmError
from idivm.planner.model import DiffNode, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, and_all, c, select

from .. import join as id_join


def propagate(ctx: RuleContext, node: A.Node, idx: int, d: DiffNode) -> list[DiffNode]:
    assert isinstance(node, A.Join)
    sym = "l" if idx == 0 else "r"
    if d.schema.kind == "ins":
        return id_join.propagate(ctx, node, idx, d)  # Δ+ ⋈ Input_other_post: the same rule
    if d.schema.kind != "del":
        raise IdivmError(f"tuple-based ⋈ got a {d.schema.describe()}: t-diffs are Δ+ and Δ- only")
    side, other = node.children[idx], node.children[1 - idx]
    vals = ctx.pre_values(d, "i")
    missing = [k for k in side.columns if vals.get(k) is None]
    if missing:
        raise IdivmError(f"tuple-based ⋈: Δ-_{sym} lacks {', '.join(missing)} (not a t-diff)")
    ids = ctx.info(node.nid).ids
    value = {k: vals[k] if k in side.columns else c(k, "o") for k in node.columns}
    items = [(k, value[k]) for k in ids] + [(pre_name(k), value[k]) for k in node.columns
                                            if k not in ids]
    q = select(items, ctx.rel(d, "i"))  # type: ignore[arg-type]
    on = A.rename_columns(node.predicate, {k: v for k, v in value.items() if v is not None}) \
        if node.predicate is not None else None
    q = q.join(ctx.state("pre", other.nid, "o"), on=and_all([on]) if on is not None else None,
               join_type="cross" if on is None else None)
    return [ctx.emit("del", node.nid, ids, q,
                     f"t-diff ⋈: Δ- = Δ-_{sym} ⋈_φ Input_other_pre (the full deleted tuples)",
                     [d], [k for k in node.columns if k not in ids])]


RULE = OperatorRule(op=A.Join, paper="classical (tuple-based)", infer=id_join.infer,
                    propagate=propagate, conditions=id_join.RULE.conditions)
