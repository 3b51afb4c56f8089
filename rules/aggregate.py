"""γ_{G, f(X)→c}: Table 1 (IDs = G) and Tables 7, 9, 11, 12 as one blocking rule.

SUM, COUNT and AVG are maintained from per-group deltas of the input (Tables 9, 11): a Δu of
attributes only they read gives x_post − x_pre straight from the i-diff joined to the input
cache on its IDs; the rows other i-diffs touch are read before and after the changes (the
cache's snapshots of those rows). AVG keeps SUM and COUNT as operator caches
(Table 12). MIN and MAX recompute the affected groups from Input_post (Table 7). Unlike the paper
("do not handle group creation/deletion"), the hidden count(*) tells when a group appears (Δ+)
or empties (Δ-).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import DiffNode, NodeInfo, placeholder, post_name, pre_name
from idivm.planner.ruleapi import (
    OperatorRule,
    RestrictStep,
    RuleContext,
    c,
    exists,
    keeps_input_cache,
    match,
    select,
    subquery,
    t,
    union_all,
)
from idivm.planner.typing_ import aggregate_type, widened
from idivm.render import Renderer

if TYPE_CHECKING:
    from idivm.fresh.query import Flattener

FLOAT_TYPES = ("REAL", "FLOAT", "DOUBLE", "FLOAT4", "FLOAT8")


def infer(node: A.Node, infos: Sequence[NodeInfo], cat: Catalog) -> tuple[A.Node, NodeInfo]:
    assert isinstance(node, A.Aggregate)
    ci = infos[0]
    lineage: dict[str, frozenset[tuple[int, str]]] = {
        g: ci.lineage.get(g, frozenset()) for g in node.group_by}
    nullable = {g: ci.nullable.get(g, True) for g in node.group_by}
    types: dict[str, str | None] = {g: ci.types.get(g) for g in node.group_by}
    for a in node.aggs:
        for k in (a.name, *a.state):
            lineage[k] = ci.lineage.get(a.arg, frozenset()) if a.arg else frozenset()
            nullable[k] = True
            types[k] = None
        # where the result type is certain (a typed NULL for it is needed where a ∪ pads it)
        arg_type = ci.types.get(a.arg) if a.arg else None
        for k in a.state:
            if k.startswith("__nn_"):
                types[k] = "BIGINT"
            elif k.startswith("__sum_"):
                types[k] = aggregate_type("sum", arg_type)
        types[a.name] = aggregate_type(a.func, arg_type)
    for k in ("__g", A.COUNT):
        lineage[k], nullable[k], types[k] = frozenset(), False, "BIGINT"
    return node, NodeInfo(
        ids=node.keys, scan_ids={}, equiv=(), fds=((frozenset(node.keys),
                                                     frozenset(node.columns)),),
        lineage=lineage, nullable=nullable, carry=node.columns, multivalued=False, types=types,
        output_carry=tuple(k for k in node.columns if k not in node.keys),
        one_row=not node.group_by, constant=frozenset(() if node.group_by else ("__g",)))


def _delta(ctx: RuleContext, node: A.Aggregate, diffs: Sequence[DiffNode],
           moved: DiffNode | None = None) -> exp.Select:
    """Per-group deltas. Table 9: a Δu of attributes only SUM, COUNT and AVG read gives them
    straight, Σ(post − pre) over the i-diff joined to the input cache on its IDs; ``moved``
    (``moved_idiff``), a Δu moving rows between groups, gives −1 at the old group and +1 at
    the new one straight from the i-diff; the rows the other i-diffs touch count +1 as they
    are after the changes, −1 as they were before (the snapshots of those rows, which leave
    the i-diffs read straight out)."""
    child = node.child.nid
    direct = direct_idiffs(node, diffs, ctx.infos) if moved is None else [moved]
    rest = [d for d in diffs if d.name not in {e.name for e in direct}]
    sides: list[exp.Select] = []
    if rest:
        sides += [signed_rows(node, t(placeholder(which, child), "r"), sign,
                              lambda x: c(x, "r")) for which, sign in (("new", 1), ("old", -1))]
    if direct:
        ctx.read_directly(child, direct)
    if moved is not None:
        sides += _moved_rows(ctx, node, moved, rest)
    else:
        sides += [_direct_rows(ctx, node, d, exclude=bool(rest)) for d in direct]
    return group_deltas(node, sides)


def _touched_by_idiff(child: A.Node) -> bool:
    """Whether the snapshots of γ's uncached input hold only the rows the i-diffs they are
    made of name (a semi-join per i-diff, leaving out those γ reads straight): a join below.
    An input of σ/π over one table reads the log's images for its snapshots (a superset of
    the touched rows), and a γ below is cached with snapshots of every row it changes: an
    i-diff read straight would count those rows again."""
    from idivm.rules import rule_for

    return not isinstance(child, A.Aggregate) and any(rule_for(n).combines
                                                      for n in A.walk(child))


def moved_idiff(node: A.Aggregate, diffs: Sequence[DiffNode], infos: Mapping[int, NodeInfo]
                ) -> DiffNode | None:
    """The Δu that moves rows of γ's uncached input between groups, when its rows' changes
    can be read from it alone (Table 9 carried over to group columns): the one i-diff changing
    group columns, and only those; naming one row per i-diff row (by all the input's IDs);
    carrying every group column and every argument of SUM, COUNT and AVG before the change;
    no MIN/MAX (re-derived from Input_post); and the other i-diffs name rows by columns it
    carries, so that the rows they also touch are left to their snapshots. TPC-H Q13: a
    customer's order count moves it from one ``c_count`` group to another."""
    child = node.child
    cinfo = infos[child.nid]
    if not node.group_by or keeps_input_cache(child, cinfo) or not _touched_by_idiff(child) \
            or any(a.func in ("min", "max") for a in node.aggs):
        return None
    groups = set(node.group_by)
    moving = [d for d in diffs if d.schema.kind == "upd" and set(d.schema.post) & groups]
    if len(moving) != 1:
        return None
    d = moving[0]
    s = d.schema
    known = set(s.ids) | set(s.pre)
    if not set(s.post) <= groups or not set(cinfo.ids) <= set(s.ids) \
            or not groups <= known or not set(aggregated_args(node)) <= known:
        return None
    for e in diffs:
        named = cinfo.ids if e.schema.kind == "ins" else e.schema.ids
        if e is not d and not (named and set(named) <= set(s.ids)):
            return None
    return d


def _moved_rows(ctx: RuleContext, node: A.Aggregate, d: DiffNode, rest: Sequence[DiffNode]
                ) -> list[exp.Select]:
    """``d``'s rows as delta rows: −1 with their values before, +1 with those after (one pass
    over the i-diff, crossed with the two signs); only rows of the input (a Δu may name an
    ID no row has) that no other i-diff names."""
    child = node.child.nid
    cinfo = ctx.info(child)
    s = d.schema
    nullable = {k: cinfo.nullable.get(k, True) for k in s.ids}
    needed = sorted(set(node.group_by) | set(aggregated_args(node)))
    pre = {k: ctx.pre_val(d, k, "i") for k in needed}
    post = {k: ctx.post_val(d, k, "i") or pre[k] for k in needed}
    cols = [(k, c(k, "i")) for k in s.ids] + \
        [(pre_name(k), v) for k, v in pre.items() if v is not None and k not in s.ids] + \
        [(post_name(k), c(post_name(k), "i")) for k in s.post]
    conds: list[exp.Expr] = [exists(ctx.state("post", child, "p"), match(
        [(k, k) for k in cinfo.ids], "p", "i", {k: cinfo.nullable.get(k, True)
                                                 for k in cinfo.ids}))]
    for e in rest:
        by = cinfo.ids if e.schema.kind == "ins" else e.schema.ids
        conds.append(exp.Not(this=exists(ctx.rel(e, "z"), match(
            [(k, k) for k in by], "i", "z", {k: nullable.get(k, True) for k in by}))))
    named = subquery(select(cols, ctx.rel(d, "i"), exp.and_(*conds), distinct=True), "i")
    sign = c("__sign", "m")
    signs = subquery(union_all([exp.select(exp.alias_(exp.Literal.number(v), "__sign",
                                                      quoted=True))
                                for v in (-1, 1)]), "m")

    def value(x: str) -> exp.Expr:
        before, after = pre[x], post[x]
        assert before is not None and after is not None
        return exp.Case(ifs=[exp.If(this=exp.LT(this=sign.copy(),
                                                expression=exp.Literal.number(0)),
                                    true=before.copy())], default=after.copy())

    return [signed_rows(node, named, sign, value).join(signs, join_type="cross")]


def direct_idiffs(node: A.Aggregate, diffs: Sequence[DiffNode],
                  infos: Mapping[int, NodeInfo]) -> list[DiffNode]:
    """The Δu i-diffs of γ's input Table 9 applies to: they change only attributes SUM,
    COUNT and AVG read — not a group, MIN/MAX or ID attribute — carry their pre-values, and
    no other Δu changes the same attributes. The input is cached, or a join left uncached
    (a many-to-many one, §4 footnote 6): Σ(post − pre) over Input_post ⋈ the i-diff on its
    IDs, driven from the i-diff, where the snapshots would derive the rows it names twice,
    before and after (BSMA Q*1: the friend-of-friend paths through each updated user). Not
    over σ/π of one table nor over a γ, whose snapshots hold every changed row whatever
    i-diff names it (``_touched_by_idiff``): they would count those rows again."""
    child = node.child
    if not keeps_input_cache(child, infos[child.nid]) and not _touched_by_idiff(child):
        return []
    summed = set(aggregated_args(node))
    other = set(node.group_by) | set(infos[child.nid].ids)
    other |= {a.arg for a in node.aggs if a.arg and a.func not in ("sum", "count", "avg")}
    other |= {k for d in diffs for k in d.schema.ids}
    out = []
    for d in diffs:
        s = d.schema
        post = set(s.post)
        if s.kind != "upd" or not post or not post <= summed or post & other \
                or not post <= set(s.pre):
            continue
        if any(post & set(e.schema.post) for e in diffs if e is not d):
            continue
        out.append(d)
    return out


def _direct_rows(ctx: RuleContext, node: A.Aggregate, d: DiffNode, exclude: bool
                 ) -> exp.Select:
    """Σ(post − pre) rows of the cache rows ``d`` names (the cache after its APPLYs gives
    their groups); with ``exclude``, but rows the snapshots hold (touched by another i-diff
    too: their whole change is counted there)."""
    child = node.child.nid
    info = ctx.info(child)
    s = d.schema
    nullable = {k: info.nullable.get(k, True) for k in s.ids}
    named = select([(k, c(k, "i")) for k in s.ids]
                   + [(pre_name(k), c(pre_name(k), "i")) for k in s.post]
                   + [(post_name(k), c(post_name(k), "i")) for k in s.post],
                   ctx.rel(d, "i"), distinct=True)
    q = changed_rows(node, ctx.state("post", child, "r"), lambda g: c(g, "r"),
                     {k: c(pre_name(k), "i") for k in s.post},
                     {k: c(post_name(k), "i") for k in s.post},
                     {k: widened(info.types.get(k)) for k in s.post})
    q = q.join(subquery(named, "i"), on=match([(k, k) for k in s.ids], "r", "i", nullable))
    if exclude:
        q = q.where(exp.Not(this=exists(t(placeholder("new", child), "n"), match(
            [(k, k) for k in info.ids], "r", "n",
            {k: info.nullable.get(k, True) for k in info.ids}))))
    return q


def _summed(node: A.Aggregate) -> list[A.AggCall]:
    """The aggregates maintained from deltas (SUM, COUNT and AVG of a column)."""
    return [a for a in node.aggs if a.arg is not None and a.func in ("sum", "count", "avg")]


def aggregated_args(node: A.Aggregate) -> list[str]:
    """The input columns SUM, COUNT and AVG read (their deltas are maintained)."""
    return sorted({a.arg for a in _summed(node) if a.arg})


def signed_rows(node: A.Aggregate, src: exp.Expr, sign: int | exp.Expr,
                value: Callable[[str], exp.Expr]) -> exp.Select:
    """Rows of ``src`` as delta rows counting +1 (``sign`` 1) or −1 (or as a column of ±1
    says): group columns, ``__dcnt``, and per maintained aggregate ``__dnn_`` (non-null
    count) and ``__dsum_``."""
    one = exp.Literal.number(1)
    sgn: exp.Expr = sign if isinstance(sign, exp.Expr) else one if sign > 0 else \
        exp.Neg(this=one)
    items: list[tuple[str, exp.Expr]] = [(g, value(g)) for g in node.group_by]
    items.append(("__dcnt", sgn.copy()))
    for a in _summed(node):
        x = value(a.arg or "")
        items.append((f"__dnn_{a.name}", exp.Case(ifs=[exp.If(
            this=exp.Is(this=x, expression=exp.null()), true=exp.Literal.number(0))],
            default=sgn.copy())))
        if a.func != "count":
            items.append((f"__dsum_{a.name}", exp.Mul(this=exp.paren(x.copy()),
                                                      expression=sgn.copy())
                          if isinstance(sign, exp.Expr) else x.copy() if sign > 0
                          else exp.Neg(this=exp.paren(x.copy()))))
    return select(items, src)


def changed_rows(node: A.Aggregate, src: exp.Expr, group: Callable[[str], exp.Expr],
                 pre: Mapping[str, exp.Expr], post: Mapping[str, exp.Expr],
                 wide: Mapping[str, str | None]) -> exp.Select:
    """Table 9: rows of ``src`` whose aggregated attributes changed from ``pre`` to ``post``
    as delta rows: count 0, per aggregate Δ(non-null count) and post − pre (NULL as 0; in
    the ``wide`` type where one is given, so that the difference cannot overflow)."""
    def known(x: exp.Expr) -> exp.Expr:
        return exp.Case(ifs=[exp.If(this=exp.Is(this=x, expression=exp.null()),
                                    true=exp.Literal.number(0))], default=exp.Literal.number(1))

    def zero(x: exp.Expr, ty: str | None) -> exp.Expr:
        return exp.Coalesce(this=exp.cast(x, ty) if ty else x,
                            expressions=[exp.Literal.number(0)])

    items: list[tuple[str, exp.Expr]] = [(g, group(g)) for g in node.group_by]
    items.append(("__dcnt", exp.Literal.number(0)))
    for a in _summed(node):
        x = a.arg or ""
        moved = x in pre
        items.append((f"__dnn_{a.name}", exp.Sub(this=known(post[x].copy()),
                                                 expression=known(pre[x].copy()))
                      if moved else exp.Literal.number(0)))
        if a.func != "count":
            ty = wide.get(x)
            items.append((f"__dsum_{a.name}", exp.Sub(this=zero(post[x].copy(), ty),
                                                      expression=zero(pre[x].copy(), ty))
                          if moved else exp.Literal.number(0)))
    return select(items, src)


def group_deltas(node: A.Aggregate, rows: Sequence[exp.Select]) -> exp.Select:
    """Σ of delta rows per group: Δcount, Δ(non-null count) and Δsum of every aggregate."""
    u = subquery(union_all(list(rows)), "u")
    items: list[tuple[str, exp.Expr]] = [(g, c(g, "u")) for g in node.group_by]
    if node.is_global:
        items.append(("__g", exp.Literal.number(0)))
    items.append(("__dcnt", exp.Sum(this=c("__dcnt", "u"))))
    for a in _summed(node):
        items.append((f"__dnn_{a.name}", exp.Sum(this=c(f"__dnn_{a.name}", "u"))))
        if a.func != "count":
            items.append((f"__dsum_{a.name}", exp.Sum(this=c(f"__dsum_{a.name}", "u"))))
    q = select(items, u)
    if node.group_by:
        q = q.group_by(*[c(g, "u") for g in node.group_by])
    return q


def _new_values(node: A.Aggregate, avg_float: dict[str, bool]) -> list[tuple[str, exp.Expr]]:
    """The post-state of every non-ID column, from Output (o), the deltas (d) and, for
    MIN/MAX, the recomputed groups (m)."""
    def zero(e: exp.Expr) -> exp.Expr:
        return exp.Coalesce(this=e, expressions=[exp.Literal.number(0)])

    def null_if_empty(nn: exp.Expr, v: exp.Expr) -> exp.Expr:
        return exp.Case(ifs=[exp.If(this=exp.EQ(this=nn, expression=exp.Literal.number(0)),
                                    true=exp.null())], default=v)

    # a global aggregate's delta row exists even when nothing changed: its sums are NULL
    cnt = exp.Add(this=zero(c(A.COUNT, "o")), expression=zero(c("__dcnt", "d")))
    out: dict[str, exp.Expr] = {A.COUNT: cnt}
    for a in node.aggs:
        nn = exp.paren(exp.Add(this=zero(c(f"__nn_{a.name}" if a.func != "count" else a.name,
                                           "o")), expression=zero(c(f"__dnn_{a.name}", "d"))))
        s_old = a.name if a.func == "sum" else f"__sum_{a.name}"
        total = exp.Add(this=zero(c(s_old, "o")), expression=zero(c(f"__dsum_{a.name}", "d")))
        if a.func == "count_star":
            out[a.name] = cnt.copy()
        elif a.func == "count":
            out[a.name] = nn
        elif a.func == "sum":
            out[f"__nn_{a.name}"] = nn
            out[a.name] = null_if_empty(nn.copy(), total)
        elif a.func == "avg":
            out[f"__nn_{a.name}"] = nn
            out[f"__sum_{a.name}"] = null_if_empty(nn.copy(), total)
            num: exp.Expr = exp.paren(total.copy())
            if not avg_float.get(a.name):
                num = exp.cast(num, "NUMERIC")
            out[a.name] = null_if_empty(nn.copy(), exp.Div(this=num, expression=nn.copy()))
        else:
            out[a.name] = c(a.name, "m")
    return [(k, out[k]) for k in node.columns if k not in node.keys]


PER_GROUP = "Tables 7/9/11/12 γ: per-group deltas ⋈ Output (+ Input_post for MIN/MAX)"
MOVED = "Table 9 γ: the rows a Δu of group columns moves, −1/+1 straight from it"


def group_state(ctx: RuleContext, node: A.Aggregate, delta: exp.Select,
                inputs: Sequence[DiffNode], rule: str = PER_GROUP) -> DiffNode:
    """Pre- and post-state of every group the deltas touch (a Δu over all non-ID columns):
    the deltas joined with Output, and for MIN/MAX the groups recomputed from Input_post."""
    nid, child = node.nid, node.child.nid
    keys = node.keys
    nullable = dict(ctx.info(nid).nullable)
    cinfo = ctx.info(child)
    avg_float = {a.name: any(f in (cinfo.types.get(a.arg or "") or "").upper()
                             for f in FLOAT_TYPES) for a in node.aggs}
    items: list[tuple[str, exp.Expr]]
    minmax = [a for a in node.aggs if a.func in ("min", "max")]
    if minmax:  # Table 7: recompute the affected groups from Input_post
        items = [(g, c(g, "p")) for g in node.group_by]
        items += [(a.name, (exp.Min if a.func == "min" else exp.Max)(this=c(a.arg or "", "p")))
                  for a in minmax]
        src = ctx.state("post", child, "p")
        m = select(items, src)
        if node.group_by:
            touched = exp.Exists(this=exp.select(exp.Literal.number(1)).from_(
                subquery(delta.copy(), "d2")).where(
                match([(g, g) for g in node.group_by], "p", "d2",
                      {g: nullable.get(g, True) for g in node.group_by})))
            m = m.where(touched).group_by(*[c(g, "p") for g in node.group_by])
    values = _new_values(node, avg_float)
    items = [(k, c(k, "d")) for k in keys]
    items += [(pre_name(k), c(k, "o")) for k, _ in values]
    items += [(post_name(k), v) for k, v in values]
    q2 = select(items, subquery(delta, "d"))
    q2 = q2.join(ctx.state("output", nid, "o"), on=match([(k, k) for k in keys], "d", "o",
                                                          nullable), join_type="left")
    if minmax:
        if node.group_by:
            q2 = q2.join(subquery(m, "m"), on=match([(g, g) for g in node.group_by], "d", "m",
                                                    nullable), join_type="left")
        else:
            q2 = q2.join(subquery(m, "m"), join_type="cross")
    nonkey = [k for k, _ in values]
    return ctx.emit("upd", nid, keys, q2, rule, inputs, nonkey, nonkey)


def touched_groups(ctx: RuleContext, node: A.Aggregate, diffs: Sequence[DiffNode]
                   ) -> exp.Expr | None:
    """The groups the i-diffs touch, when recomputing them from Input_post is cheaper than
    per-group deltas; else None. So when γ's input has no cache (its pre-state would be
    re-derived from the base tables' pre-states), some Δ- or Δu names whole groups (its IDs are
    group columns: the input's rows were re-derived, as an outer join or a probe does, so the
    deltas would read those groups twice, before and after), and every i-diff carries the group
    columns of the rows it names (as IDs, post-values of a Δ+, pre- and post-values of a Δu)."""
    child = node.child
    if not node.group_by or keeps_input_cache(child, ctx.info(child.nid)):
        return None
    g = set(node.group_by)
    if not any(d.schema.kind != "ins" and d.schema.ids and set(d.schema.ids) <= g
               for d in diffs):
        return None
    parts: list[exp.Select] = []
    for d in diffs:
        s = d.schema
        images: list[dict[str, exp.Expr]] = []
        for which in (("post",) if s.kind == "ins" else ("pre",) if s.kind == "del"
                      else ("pre", "post")):
            vals = {k: ctx.pre_val(d, k, "i") if which == "pre" else ctx.post_val(d, k, "i")
                    for k in node.group_by}
            if s.kind == "upd":  # a group column the Δu leaves alone is the same before/after
                vals = {k: v if v is not None else ctx.pre_val(d, k, "i")
                        for k, v in vals.items()}
            if any(v is None for v in vals.values()):
                return None
            images.append(vals)  # type: ignore[arg-type]
        parts += [select([(k, v[k]) for k in node.group_by], ctx.rel(d, "i")) for v in images]
    return union_all(parts)


def regroup_state(ctx: RuleContext, node: A.Aggregate, groups: exp.Expr,
                  inputs: Sequence[DiffNode]) -> DiffNode:
    """Pre- and post-state of every touched group (a Δu over all non-ID columns): Output
    before, the group recomputed from Input_post after (absent: it emptied)."""
    nid, child = node.nid, node.child.nid
    keys = node.keys
    nullable = {g: ctx.info(nid).nullable.get(g, True) for g in node.group_by}
    on_g = [(g, g) for g in node.group_by]
    t_ = select([(g, c(g, "t")) for g in node.group_by], subquery(groups, "t"), distinct=True)
    m = select(aggregate_items(node, lambda x: c(x, "p")), ctx.state("post", child, "p"),
               exp.Exists(this=exp.select(exp.Literal.number(1)).from_(
                   subquery(t_.copy(), "t")).where(match(on_g, "p", "t", nullable))))
    m = m.group_by(*[c(g, "p") for g in node.group_by])
    nonkey = [k for k in node.columns if k not in keys]
    items: list[tuple[str, exp.Expr]] = [(k, c(k, "t")) for k in keys]
    items += [(pre_name(k), c(k, "o")) for k in nonkey]
    items += [(post_name(k), exp.Coalesce(this=c(k, "m"), expressions=[exp.Literal.number(0)])
               if k == A.COUNT else c(k, "m")) for k in nonkey]
    q = select(items, subquery(t_, "t"))
    q = q.join(ctx.state("output", nid, "o"), on=match(on_g, "t", "o", nullable),
               join_type="left")
    q = q.join(subquery(m, "m"), on=match(on_g, "t", "m", nullable), join_type="left")
    return ctx.emit("upd", nid, keys, q, "γ: the touched groups recomputed from Input_post "
                    "(whole groups re-derived below) ⋈ Output", inputs, nonkey, nonkey)


def group_existed(alias: str) -> exp.Expr:
    return exp.Not(this=exp.Is(this=c(pre_name(A.COUNT), alias), expression=exp.null()))


def group_alive(alias: str) -> exp.Expr:
    return exp.GT(this=c(post_name(A.COUNT), alias), expression=exp.Literal.number(0))


def group_changed(nonkey: Sequence[str], alias: str) -> exp.Expr:
    return exp.or_(*[exp.NullSafeNEQ(this=c(pre_name(k), alias), expression=c(post_name(k),
                                                                                alias))
                     for k in nonkey])


def propagate_all(ctx: RuleContext, node: A.Node, inputs: list[tuple[int, DiffNode]]
                  ) -> list[DiffNode]:
    assert isinstance(node, A.Aggregate)
    nid = node.nid
    keys = node.keys
    diffs = [d for _, d in inputs]
    groups = touched_groups(ctx, node, diffs)
    if groups is not None:
        state = regroup_state(ctx, node, groups, diffs)
    else:
        moved = moved_idiff(node, diffs, ctx.infos)
        state = group_state(ctx, node, _delta(ctx, node, diffs, moved), diffs,
                            PER_GROUP if moved is None else f"{MOVED} ({PER_GROUP})")
    nonkey = list(state.schema.post)
    out = []
    existed, alive, changed = group_existed("s"), group_alive("s"), group_changed(nonkey, "s")
    upd_where = exp.and_(existed, changed) if node.is_global else exp.and_(existed, alive, changed)
    out.append(ctx.emit("upd", nid, keys, select(
        [(k, c(k, "s")) for k in state.schema.columns(node.columns)], ctx.rel(state, "s"),
        upd_where), "γ: Δu for groups that stay (σ_isupd)", [state], nonkey, nonkey,
        exact=True))
    if not node.is_global:
        born = exp.and_(exp.Is(this=c(pre_name(A.COUNT), "s"), expression=exp.null()), alive)
        out.append(ctx.emit("ins", nid, keys, select(
            [(k, c(k, "s") if k in keys else c(post_name(k), "s")) for k in node.columns],
            ctx.rel(state, "s"), born), "γ: Δ+ for groups created (count(*) from 0)", [state],
            exact=True))
        died = exp.and_(existed.copy(), exp.Not(this=alive.copy()))
        out.append(ctx.emit("del", nid, keys, select(
            [(k, c(k, "s")) for k in keys] + [(pre_name(k), c(pre_name(k), "s"))
                                              for k in nonkey],
            ctx.rel(state, "s"), died), "γ: Δ- for groups emptied (count(*) to 0)", [state],
            nonkey, exact=True))
    return out


def render(r: Renderer, node: A.Node) -> exp.Select:
    """GROUP BY with the output, count(*) and the hidden state of SUM and AVG (Table 12)."""
    assert isinstance(node, A.Aggregate)
    src, a = r.rel(node.child)
    q = select(aggregate_items(node, lambda x: c(x, a)), src)
    if node.group_by:
        q = q.group_by(*[c(g, a) for g in node.group_by])
    return q


def aggregate_items(node: A.Aggregate, col: Callable[[str], exp.Expr]
                    ) -> list[tuple[str, exp.Expr]]:
    """γ's columns over its input's columns (``col``): the groups, the aggregates, count(*)
    and the hidden state of SUM and AVG (Table 12)."""
    items: list[tuple[str, exp.Expr]] = [(g, col(g)) for g in node.group_by]
    if node.is_global:
        items.append(("__g", exp.Literal.number(0)))
    for agg in node.aggs:
        x = col(agg.arg) if agg.arg else None
        f: exp.Expr
        if agg.func == "count_star":
            f = exp.Count(this=exp.Star())
        else:
            assert x is not None
            f = {"sum": exp.Sum, "count": exp.Count, "avg": exp.Avg, "min": exp.Min,
                 "max": exp.Max}[agg.func](this=x)
        items.append((agg.name, f))
    items.append((A.COUNT, exp.Count(this=exp.Star())))
    for agg in node.aggs:
        if agg.func in ("sum", "avg"):
            if agg.func == "avg":
                items.append((f"__sum_{agg.name}", exp.Sum(this=col(agg.arg or ""))))
            items.append((f"__nn_{agg.name}", exp.Count(this=col(agg.arg or ""))))
    return [(k, dict(items)[k]) for k in node.columns]


def fresh(f: Flattener, node: A.Node) -> None:
    """A nested aggregate (the top one is the fresh query itself): a derived relation, a
    stage of its own whose rows the stages above read as an atom."""
    assert isinstance(node, A.Aggregate)
    f.derived_atom(node)


def restrict(node: A.Node, cols: tuple[str, ...]) -> tuple[RestrictStep, ...]:
    """A semi-join on group-by columns names whole groups: it goes below γ (on those)."""
    assert isinstance(node, A.Aggregate)
    on = {k: k for k in cols if k in set(node.group_by)}
    return ((0, on),) if on else ()


def lookups(node: A.Node, infos: Mapping[int, NodeInfo]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """A MIN/MAX whose extreme row goes is re-derived from Input_post, per group: by the
    group's columns and the argument (an index on them reads one end of the group's rows
    instead of the input)."""
    assert isinstance(node, A.Aggregate)
    return tuple((0, (*node.group_by, a.arg)) for a in node.aggs
                 if a.func in ("min", "max") and a.arg)


RULE = OperatorRule(op=A.Aggregate, paper="Tables 7, 9, 11, 12", infer=infer,
                    propagate_all=propagate_all,
                    conditions=lambda n: set(n.group_by),  # type: ignore[attr-defined]
                    render=render, fresh=fresh, restrict=restrict, lookups=lookups)
