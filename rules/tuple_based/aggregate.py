"""γ, tuple-based: per-group deltas straight from the t-diffs (Δ+ rows count +1, Δ- rows −1 with
their pre-image values), so no touched-row snapshots are read; a group whose values change is
a Δ- of its old tuple and a Δ+ of its new one. MIN/MAX recompute the groups from Input_post."""

from __future__ import annotations

from sqlglot import exp

from idivm import algebra as A
from idivm.errors import IdivmError
from idivm.planner.model import DiffNode, post_name, pre_name
from idivm.planner.ruleapi import OperatorRule, RuleContext, c, select, subquery

from .. import aggregate as id_agg


def _rows(ctx: RuleContext, node: A.Aggregate, d: DiffNode, cols: list[str]) -> exp.Select:
    """The t-diff's tuples as ``cols`` of γ's input (a Δ- gives its pre-image)."""
    s = d.schema
    if s.kind not in ("ins", "del"):
        raise IdivmError(f"tuple-based γ got a {s.describe()}: t-diffs are Δ+ and Δ- only")
    vals = ctx.post_values(d, "r") if s.kind == "ins" else ctx.pre_values(d, "r")
    missing = [k for k in cols if vals.get(k) is None]
    if missing:
        raise IdivmError(f"tuple-based γ: {s.describe()} lacks {', '.join(missing)} "
                         "(not a t-diff)")
    return select([(k, vals[k]) for k in cols], ctx.rel(d, "r"))  # type: ignore[misc]


def _signed(ctx: RuleContext, node: A.Aggregate, diffs: list[DiffNode], sign: int,
            alias: str) -> exp.Select | None:
    """The distinct tuples of the t-diffs of one sign: a join derives a tuple whose both sides
    changed from each side's diff, and a bag delta would count it twice."""
    if not diffs:
        return None
    cols = list(dict.fromkeys([*ctx.info(node.child.nid).ids, *node.group_by,
                               *id_agg.aggregated_args(node)]))
    parts = [_rows(ctx, node, d, cols) for d in diffs]
    rows: exp.Expr = parts[0] if len(parts) == 1 else parts[0].distinct()
    for p in parts[1:]:
        rows = exp.union(rows, p, distinct=True)
    return id_agg.signed_rows(node, subquery(rows, alias), sign, lambda x: c(x, alias))


def propagate_all(ctx: RuleContext, node: A.Node, inputs: list[tuple[int, DiffNode]]
                  ) -> list[DiffNode]:
    assert isinstance(node, A.Aggregate)
    diffs = [d for _, d in inputs]
    sides = [_signed(ctx, node, [d for d in diffs if d.schema.kind == "ins"], 1, "ti"),
             _signed(ctx, node, [d for d in diffs if d.schema.kind != "ins"], -1, "td")]
    delta = id_agg.group_deltas(node, [x for x in sides if x is not None])
    state = id_agg.group_state(ctx, node, delta, diffs)
    keys, nonkey = node.keys, list(state.schema.post)
    existed, alive = id_agg.group_existed("s"), id_agg.group_alive("s")
    changed = id_agg.group_changed(nonkey, "s")
    if node.is_global:  # the single group always exists: it moves when a value changes
        gone, came = changed, changed.copy()
    else:
        gone = exp.and_(existed, exp.paren(exp.or_(exp.Not(this=alive), changed)))
        came = exp.and_(alive.copy(), exp.paren(exp.or_(exp.Not(this=existed.copy()),
                                                        changed.copy())))
    dele = ctx.emit("del", node.nid, keys, select(
        [(k, c(k, "s")) for k in keys] + [(pre_name(k), c(pre_name(k), "s")) for k in nonkey],
        ctx.rel(state, "s"), gone), "t-diff γ: Δ- of the old tuple of every changed group",
        [state], nonkey)
    ins = ctx.emit("ins", node.nid, keys, select(
        [(k, c(k, "s") if k in keys else c(post_name(k), "s")) for k in node.columns],
        ctx.rel(state, "s"), came), "t-diff γ: Δ+ of the new tuple of every changed group",
        [state])
    return [dele, ins]


RULE = OperatorRule(op=A.Aggregate, paper="classical (tuple-based)", infer=id_agg.infer,
                    propagate_all=propagate_all, conditions=id_agg.RULE.conditions)
