"""Pass 4: minimize the Δ-script under the i-diff constraints C1–C3 (Figure 8).

Each rewrite is a small pure function; ``FETCH_REWRITES`` are tried in order on every
Input ⋉_IDs Δ before it is read from the (base or cached) relation:

- C1 (Δ+ ⊆ R):           R ⋉_I Δ+  → Δ+
- C3 (Δu agrees with R):  R ⋉_I Δu  → π_{I, A''_post → A} Δu   when Δu carries every attribute
- C2 (Δ- ∩ R = ∅):        R ⋉_I Δ-  → ∅                       for a base table's Δ-
- pre-images:             R_pre ⋉_I Δ → π_{I, A'_pre → A} Δ    when Δ carries every pre-state

After resolution, an i-diff read by exactly one other i-diff query is inlined into it (the
composition of rules up to the next cache, §4), and i-diffs nobody reads are dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from sqlglot import exp

from idivm import algebra as A
from idivm.planner.model import DiffNode, post_name, pre_name
from idivm.planner.ruleapi import c, select, subquery, t
from idivm.script import Apply, Compute, Statement

FetchRewrite = Callable[[str, A.Node, DiffNode], "exp.Expr | None"]


def c1_insert(which: str, node: A.Node, d: DiffNode) -> exp.Expr | None:
    if which == "post" and d.schema.kind == "ins":
        return select([(k, c(k, "z")) for k in node.columns], t(d.name, "z"))
    return None


def c3_full_update(which: str, node: A.Node, d: DiffNode) -> exp.Expr | None:
    s = d.schema
    if which == "post" and s.kind == "upd" and set(node.columns) <= set(s.ids) | set(s.post):
        return select([(k, c(k if k in s.ids else post_name(k), "z")) for k in node.columns],
                      t(d.name, "z"))
    return None


def c2_base_delete(which: str, node: A.Node, d: DiffNode) -> exp.Expr | None:
    if which == "post" and d.schema.kind == "del" and isinstance(node, A.Scan):
        return select([(k, c(k, "z")) for k in node.columns], t(d.name, "z"), exp.false())
    return None


def pre_images(which: str, node: A.Node, d: DiffNode) -> exp.Expr | None:
    s = d.schema
    if which == "pre" and s.kind in ("del", "upd") and set(node.columns) <= set(s.ids) | set(
            s.pre):
        return select([(k, c(k if k in s.ids else pre_name(k), "z")) for k in node.columns],
                      t(d.name, "z"))
    return None


FETCH_REWRITES: tuple[FetchRewrite, ...] = (c1_insert, c3_full_update, c2_base_delete,
                                            pre_images)


def rewrite_fetch(nodes: Mapping[int, A.Node]) -> Callable[[str, int, DiffNode],
                                                           exp.Expr | None]:
    def go(which: str, nid: int, d: DiffNode) -> exp.Expr | None:
        for rw in FETCH_REWRITES:
            out = rw(which, nodes[nid], d)
            if out is not None:
                return out
        return None

    return go


def _refs(stmt: Statement) -> list[str]:
    if isinstance(stmt, Apply):
        return [stmt.diff]
    return [tb.name for tb in stmt.query.find_all(exp.Table)]


def inline_single_use(stmts: Sequence[Statement]) -> list[Statement]:
    """Compose an i-diff query into its only reader (no temporary relation for it).

    One pass in statement order: a reader always comes after what it reads, so by the time a
    statement is considered, everything composed into it already is.
    """
    out: list[Statement | None] = list(stmts)
    refs = [_refs(st) for st in stmts]
    uses = Counter(r for rs in refs for r in rs)
    reader = {r: j for j, rs in enumerate(refs) for r in rs}
    for i, st in enumerate(out):
        if not isinstance(st, Compute) or st.phase != "idiff" or uses[st.name] != 1:
            continue
        j = reader[st.name]
        target = out[j]
        if not isinstance(target, Compute) or target.phase != "idiff":
            continue

        def sub(n: exp.Expr, st: Compute = st) -> exp.Expr:
            if isinstance(n, exp.Table) and n.name == st.name:
                return subquery(st.query, n.alias or st.name)
            return n

        out[j] = Compute(target.name, target.query.transform(sub, copy=False),
                         f"{target.comment}\n  ∘ {st.comment}", target.phase)
        refs[j] = [r for r in refs[j] if r != st.name] + refs[i]
        for r in refs[i]:
            reader[r] = j
        out[i] = None
    return [st for st in out if st is not None]


def drop_unread(stmts: Sequence[Statement]) -> list[Statement]:
    """Remove i-diffs that no statement reads (e.g. rules whose output was not needed)."""
    out = list(stmts)
    refs = {id(st): _refs(st) for st in out}
    while True:
        uses = Counter(r for st in out for r in refs[id(st)])
        keep = [st for st in out if not (isinstance(st, Compute)
                                         and st.phase in ("idiff", "instance")
                                         and uses[st.name] == 0)]
        if len(keep) == len(out):
            return keep
        out = keep


def _simple(q: exp.Expr) -> bool:
    return isinstance(q, exp.Select) and not any(
        q.args.get(k) for k in ("group", "having", "distinct", "limit", "order", "qualify",
                                "with_", "with")) and not any(
        isinstance(p.unalias(), exp.AggFunc) or p.find(exp.AggFunc, exp.Window)
        for p in q.expressions)


def _nested(node: exp.Expr, top: exp.Expr) -> bool:
    """Whether ``node`` lies in a subquery scope of ``top`` (not in ``top``'s own)."""
    p = node.parent
    while p is not None and p is not top:
        if isinstance(p, exp.Select):
            return True
        p = p.parent
    return False


def merge_subquery(q: exp.Expr) -> exp.Expr:
    """SELECT f(s.x) … FROM (SELECT g AS x … FROM R WHERE p) AS s WHERE w
    → SELECT f(g) … FROM R WHERE p AND w[s.x := g]   (composition of two rules' queries)."""
    if not isinstance(q, exp.Select) or q.args.get("joins") or q.args.get("group") or \
            q.args.get("having"):
        return q
    from_ = q.args.get("from_")
    src = from_.this if from_ is not None else None
    if not isinstance(src, exp.Subquery) or not _simple(src.this):
        return q
    inner = src.this
    alias = src.alias
    defs = {p.alias_or_name: p.unalias() for p in inner.expressions}
    inside = {id(n) for n in src.walk()}
    # nested scopes of the outer query must not bind the aliases the merged expressions use
    bound = {n.alias for n in q.find_all(exp.Table, exp.Subquery) if id(n) not in inside}
    used = {c.table for e in defs.values() for c in e.find_all(exp.Column)} | {alias}
    used |= {inner.args["from_"].this.alias} if inner.args.get("from_") else set()
    if bound & used:
        return q
    for col in q.find_all(exp.Column):
        if id(col) in inside:
            continue
        if not col.table or (col.table == alias and col.name not in defs):
            return q  # unqualified references would lose their source
        if col.table == alias and _nested(col, q) and any(
                not x.table for x in defs[col.name].find_all(exp.Column)):
            return q  # inside EXISTS (…) an unqualified column may bind to the inner table

    def sub(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and n.table == alias and id(n) not in inside:
            e = defs[n.name].copy()
            return exp.paren(e) if isinstance(e, exp.Binary | exp.Not | exp.Predicate) else e
        return n

    out = inner.copy()
    out.set("expressions", [exp.alias_(p.unalias().copy().transform(sub),
                                       exp.to_identifier(p.alias_or_name, quoted=True))
                            for p in q.expressions])
    where = q.args.get("where")
    if where is not None:
        out = out.where(where.this.copy().transform(sub))
    if q.args.get("distinct"):
        out = out.distinct()
    return out


def merge_projections(q: exp.Expr) -> tuple[exp.Expr, bool]:
    """One top-down sweep of ``merge_subquery``; also says whether anything merged."""
    changed = False

    def go(n: exp.Expr) -> exp.Expr:
        nonlocal changed
        before: exp.Expr | None = None
        while isinstance(n, exp.Select) and before is not n:
            before = n
            n = merge_subquery(n)
            changed = changed or n is not before
        return n

    return q.transform(go, copy=False), changed


def compose_queries(stmts: Sequence[Statement]) -> list[Statement]:
    """Flatten every composed query (sqlglot visits parents first: sweep to a fixpoint)."""
    out: list[Statement] = []
    for st in stmts:
        if isinstance(st, Compute):
            q, changed = st.query.copy(), True
            while changed:
                q, changed = merge_projections(q)
            st = Compute(st.name, q, st.comment, st.phase)
        out.append(st)
    return out
