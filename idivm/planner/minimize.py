"""Pass 4: minimize the Δ-script under the i-diff constraints C1–C3 (Figure 8).

Each rewrite is a small pure function; ``FETCH_REWRITES`` are tried in order on every
Input ⋉_IDs Δ before it is read from the (base or cached) relation:

- C1 (Δ+ ⊆ R):           R ⋉_I Δ+  → Δ+
- C3 (Δu agrees with R):  R ⋉_I Δu  → π_{I, A''_post → A} Δu   when Δu carries every attribute
                          and names only rows of R (not at or above a ⋉ / ▷)
- C2 (Δ- ∩ R = ∅):        R ⋉_I Δ-  → ∅                       for a base table's Δ-
- pre-images:             R_pre ⋉_I Δ → π_{I, A'_pre → A} Δ    when Δ carries every pre-state

After resolution, an i-diff read by exactly one other i-diff query is inlined into it (the
composition of rules up to the next cache, §4), and i-diffs nobody reads are dropped.
"""

from __future__ import annotations

import re
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
    if which == "post" and s.kind == "upd" and set(node.columns) <= set(s.ids) | set(
            s.post) and updates_name_output_rows(node):
        return select([(k, c(k if k in s.ids else post_name(k), "z")) for k in node.columns],
                      t(d.name, "z"))
    return None


def updates_name_output_rows(node: A.Node) -> bool:
    """Whether every Δu of ``node`` names rows of its output, as C3 assumes. Not so at or
    above a ⋉ / ▷ through π and σ: Table 13 passes a Δu of l's attributes outside φ for
    every l row it names, in the output or not (the probe is not re-run), and π and σ pass
    it on; read as ``Input ⋉_I Δu``, such a Δu would bring rows the probe filtered out."""
    while isinstance(node, A.Project | A.Select):
        node = node.child
    return not isinstance(node, A.SemiJoin | A.AntiJoin)


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


def inlined_with_refs(stmts: Sequence[Statement]
                      ) -> tuple[list[Statement], list[list[str]]]:
    """Compose an i-diff query into its only reader (no temporary relation for it); with the
    relations each statement returned reads (``_refs``' multiset, kept up to date as queries
    are composed: ``drop_unread`` needs no walk of its own).

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
    return ([Compute(st.name, st.query, summarize(st.comment), st.phase)
             if isinstance(st, Compute) else st for st in out if st is not None],
            [rs for st, rs in zip(out, refs, strict=True) if st is not None])


def summarize(comment: str) -> str:
    """A composed statement's comment: its own rule, then each rule composed into it once,
    in order, with how many times it was (their i-diff schemas are in ``explain``)."""
    lines = comment.splitlines()
    if len(lines) <= 2:
        return comment
    counts: dict[str, int] = {}
    for line in lines[1:]:
        rule = line.strip().removeprefix("∘").strip()
        rule = re.sub(r"\s+\[[^\]]*\]$", "", rule)
        counts[rule] = counts.get(rule, 0) + 1
    return "\n".join([lines[0]] + [f"  ∘ {r}" + (f" (×{n})" if n > 1 else "")
                                    for r, n in counts.items()])


def drop_unread(stmts: Sequence[Statement], reads: Sequence[Sequence[str]]
                ) -> list[Statement]:
    """Remove i-diffs that no statement reads (e.g. rules whose output was not needed).
    ``reads``: the relations each statement reads (``inlined_with_refs``)."""
    out = list(stmts)
    refs = {id(st): list(r) for st, r in zip(out, reads, strict=True)}
    while True:
        uses = Counter(r for st in out for r in refs[id(st)])
        keep = [st for st in out if not (isinstance(st, Compute)
                                         and st.phase in ("idiff", "instance")
                                         and uses[st.name] == 0)]
        if len(keep) == len(out):
            return keep
        out = keep


def _simple(q: exp.Expr) -> bool:
    """A SELECT whose rows are its sources' joined rows, filtered and computed row by row:
    inner (or cross) joins only, no grouping, aggregates, windows, DISTINCT or LIMIT."""
    return isinstance(q, exp.Select) and not any(
        q.args.get(k) for k in ("group", "having", "distinct", "limit", "order", "qualify",
                                "with_", "with", "laterals")) and not any(
        isinstance(p.unalias(), exp.AggFunc) or p.find(exp.AggFunc, exp.Window)
        for p in q.expressions) and all(_inner(j) for j in q.args.get("joins") or [])


def _inner(j: exp.Join) -> bool:
    return not j.args.get("side") and (j.args.get("kind") or "INNER").upper() in (
        "INNER", "CROSS") and not j.args.get("using") and not j.args.get("method")


def _sources(q: exp.Select) -> list[exp.Expr]:
    from_ = q.args.get("from_")
    out = [from_.this] if from_ is not None else []
    return out + [j.this for j in q.args.get("joins") or []]


def _aliases(q: exp.Expr) -> set[str]:
    return {n.alias for n in q.find_all(exp.Table, exp.Subquery) if n.alias}


def _nested(node: exp.Expr, top: exp.Expr) -> bool:
    """Whether ``node`` lies in a subquery scope of ``top`` (not in ``top``'s own)."""
    p = node.parent
    while p is not None and p is not top:
        if isinstance(p, exp.Select):
            return True
        p = p.parent
    return False


def merge_subquery(q: exp.Expr) -> exp.Expr:
    """``q`` with one derived table merged into it where ``_merge_once`` can (in place)."""
    _merge_once(q)
    return q


def _merge_once(q: exp.Expr) -> bool:
    """Merge one derived table of ``q`` into it (composition of two rules' queries):

    SELECT f(s.x) … FROM (SELECT g AS x … FROM R JOIN T ON p WHERE w) AS s JOIN U ON v(s.x) WHERE u
    → SELECT f(g) … FROM R JOIN T ON p JOIN U ON v(g) WHERE w AND u

    The derived table must be ``_simple``, in FROM or inner-joined (a derived table in FROM
    may be the preserved side of LEFT JOINs: its filter then commutes with them), and no RIGHT
    or FULL join may follow it (that one pads it: its WHERE would drop the padded rows, a
    constant it selects would fill them); its sources
    are renamed where their aliases are taken in ``q``. Says whether it merged one (``q`` is
    rewritten in place)."""
    if not isinstance(q, exp.Select) or q.args.get("laterals"):
        return False
    joins = q.args.get("joins") or []
    for pos, src in enumerate(_sources(q)):
        if not isinstance(src, exp.Subquery) or not _simple(src.this) or not src.alias:
            continue
        if pos > 0 and not _inner(joins[pos - 1]):
            continue
        if any((j.args.get("side") or "").upper() in ("RIGHT", "FULL") for j in joins[pos:]):
            continue  # a later join pads it: its filter and constants would apply to padding
        if _merge_at(q, pos, src):
            return True
    return False


def _merge_at(q: exp.Select, pos: int, src: exp.Subquery) -> bool:
    inner, alias = src.this, src.alias
    own = _sources(inner)
    own_aliases = [x.alias_or_name for x in own]
    if not own or len(set(own_aliases)) != len(own_aliases):
        return False
    # every column of the derived table names one of its own sources (none is correlated)
    nested_aliases: set[str] = set()
    for n in src.walk():
        if isinstance(n, exp.Column) and n.table not in own_aliases and not _nested(n, inner):
            return False
        if isinstance(n, exp.Table | exp.Subquery) and n.alias and n is not src and \
                _nested(n, inner):
            nested_aliases.add(n.alias)
    outside_cols: list[exp.Column] = []
    taken: set[str] = set()
    for n in q.walk(prune=lambda x: x is src):  # one pass over the rest of q
        if n is src:
            continue
        if isinstance(n, exp.Column):
            outside_cols.append(n)
        elif isinstance(n, exp.Table | exp.Subquery) and n.alias:
            taken.add(n.alias)
    # a qualifier q's columns read without q defining it is an enclosing query's source (q is
    # correlated to it): a merged source of that name would capture those references
    defined = taken | {alias}
    taken |= {col.table for col in outside_cols if col.table} - defined
    defs = {p.alias_or_name: p.unalias() for p in inner.expressions}
    for col in outside_cols:
        if not col.table:
            return False  # an unqualified reference could bind to a merged source
        if col.table == alias and col.name not in defs:
            return False
    if alias in taken:
        return False  # another scope of q binds the same alias
    # a GROUP BY key that becomes a constant: a bare literal is not an expression there
    # (PostgreSQL refuses a string, reads an integer as a select-list position; so does
    # Spark's ordinal) — dropped, grouping by it adds nothing; not merged when every key would
    group = q.args.get("group")
    keys = list(group.expressions) if group is not None else []
    constant = [_constant(defs[k.name]) if isinstance(k, exp.Column) and k.table == alias
                else _constant(k) for k in keys]
    if keys and all(constant):
        return False
    rename: dict[str, str] = {}
    for a in own_aliases:
        if a in taken:
            if a in nested_aliases:
                return False  # a nested scope might shadow it: leave the query as it is
            fresh, k = a, 1
            while fresh in taken or fresh in own_aliases or fresh in rename.values():
                k += 1
                fresh = f"{a}_{k}"
            rename[a] = fresh
    if rename:
        for x in _sources(inner):
            if x.alias_or_name in rename:
                x.set("alias", exp.TableAlias(this=exp.to_identifier(rename[x.alias_or_name],
                                                                     quoted=True)))
        for col in inner.find_all(exp.Column):
            if col.table in rename:
                col.set("table", exp.to_identifier(rename[col.table], quoted=True))
        defs = {p.alias_or_name: p.unalias() for p in inner.expressions}

    if any(constant):
        assert group is not None
        group.set("expressions", [k for k, c in zip(keys, constant, strict=True) if not c])
    for col in outside_cols:  # the derived table's columns by their definitions
        if col.table == alias:
            e = defs[col.name].copy()
            col.replace(exp.paren(e) if isinstance(e, exp.Binary | exp.Not | exp.Predicate)
                        else e)
    out = q  # rewritten in place: the caller owns it
    joins = list(out.args.get("joins") or [])
    where = out.args.get("where")
    outer_where = where.this if where is not None else None
    inner_from = inner.args["from_"].this
    inner_joins = list(inner.args.get("joins") or [])
    if pos == 0:
        out.set("from_", exp.From(this=inner_from))
        new_joins = inner_joins + joins
    else:
        on = joins[pos - 1].args.get("on")
        placed = [exp.Join(this=inner_from, kind="CROSS")] + inner_joins
        if on is not None:  # the join's condition goes where its sources are all joined
            names = [x.alias_or_name for x in _sources(inner)]
            needed = {col.table for col in on.find_all(exp.Column)} & set(names)
            at = next(i for i in range(len(names)) if needed <= set(names[:i + 1]))
            j_on = placed[at].args.get("on")
            placed[at] = exp.Join(this=placed[at].this,
                                  on=on if j_on is None else exp.and_(j_on, on))
        new_joins = joins[:pos - 1] + placed + joins[pos:]
    out.set("joins", new_joins or None)
    inner_where = inner.args.get("where")
    parts = ([inner_where.this] if inner_where is not None else []) + (
        [outer_where] if outer_where is not None else [])
    out.set("where", None)
    if parts:
        out.set("where", exp.Where(this=exp.and_(*parts) if len(parts) > 1 else parts[0]))
    return True


def _constant(e: exp.Expr) -> bool:
    """Whether ``e`` reads nothing: literals, NULL, TRUE/FALSE and casts or arithmetic of
    them (no column, query or function call)."""
    return not any(isinstance(n, exp.Column | exp.Query | exp.Placeholder | exp.Parameter)
                   or (isinstance(n, exp.Func) and not isinstance(n, exp.Cast))
                   for n in e.walk())


def flatten(q: exp.Expr) -> exp.Expr:
    """Merge every derived table that ``merge_subquery`` can, innermost first, so each
    query is merged once (composed rule queries nest one derived table per rule)."""
    for sel in reversed(list(q.find_all(exp.Select))):  # descendants before ancestors
        while _merge_once(sel):
            pass
    return q


def compose_queries(stmts: Sequence[Statement]) -> list[Statement]:
    """Flatten every composed query, in place: the queries are the caller's own (``plan``'s
    resolved copies, no subtree shared with another statement), not copied again (a copy of
    every statement of every view: ~4% of planning and compiling TPC-H's views)."""
    out: list[Statement] = []
    for st in stmts:
        if isinstance(st, Compute):
            st = Compute(st.name, flatten(st.query), st.comment, st.phase)
        out.append(st)
    return out
