"""Change tables a Δ-script reads only *linearly*: summed per group, never matched by key.

A base table's change table holds one row per changed key: its image before the batch
(``X__pre``, ``__has_pre``) and after it (``X__post``, ``__has_post``) — the *fold* of the
change log, which nets every key's logged images. Most i-diff rules need that: an i-diff
names view rows by IDs, and a key changed twice must be named once. One shape does not: the
per-group deltas of a γ whose aggregates are sums (Tables 7/9/11/12 over SUM, COUNT, AVG) of
σ/π over the table alone —

    SELECT g1, SUM(u.d) … FROM (SELECT f(g.X__post) AS d … FROM chg AS g
                                WHERE g.__has_post AND φ(g.X__post)
                                UNION ALL
                                SELECT -f(g.X__pre) AS d … FROM chg AS g
                                WHERE g.__has_pre AND φ(g.X__pre)) AS u GROUP BY g1

sums a contribution of every post-image and the negated contribution of every pre-image. The
log itself is such a list of images: every row change logs its old image ('D') and its new
one ('I'), so a key's images between its first and its last are logged once as new and once
as old, and their contributions cancel in the sums; what is left is the last image's
contribution less the first's — what the fold gives. Such a table needs no fold: the
statement can read its log rows, each a post-image ('I') or a pre-image ('D').

Read from the log, the two branches of a pair scan the same rows for their two kinds: where
each row is one image, its values under both names (``postgres.changelog.log_images``), the
pair is one branch — the post branch without its ``__has_post`` filter, each summed value the
post contribution for a post-image and the pre branch's (read under the post names, the same
values) for a pre-image (``merge_image_reads``) — and the log is scanned once, not twice.

``linear_change_tables`` finds the change tables read only that way, checking the shape
exactly: every reference is a branch of such a UNION ALL (one table, no join or subquery, a
filter on ``__has_post`` or ``__has_pre`` and columns of that side and the keys only), the
union is grouped directly by a SELECT of sums and grouping columns, and every post branch has
a pre branch that is its image with ``X__post`` read as ``X__pre`` — the same grouping values
and filter, the summed values negated. Anything else (a join, an EXISTS over the changes,
MIN/MAX, a cache updated by key, an APPLY) keeps the fold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence

from sqlglot import exp

from idivm.script import Apply, Compute, Statement

HAS_PRE, HAS_POST = "__has_pre", "__has_post"
PRE, POST = "__pre", "__post"


def _bare(e: exp.Expr) -> exp.Expr:
    """A copy of ``e`` without parentheses anywhere (the tree already holds the precedence)."""
    e = e.copy()
    while isinstance(e, exp.Paren):
        e = e.this
    for p in list(e.find_all(exp.Paren)):
        p.replace(p.this)
    return e


def _conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    if e is None:
        return []
    if isinstance(e, exp.Where):
        e = e.this
    e = _bare(e)
    if isinstance(e, exp.And):
        return _conjuncts(e.left) + _conjuncts(e.right)
    return [e]


def _neg(e: exp.Expr) -> exp.Expr:
    """``-e``, pushed into CASE results (0 stays 0, ``-x`` becomes ``x``)."""
    if isinstance(e, exp.Neg):
        return e.this.copy()
    if isinstance(e, exp.Literal) and e.is_number and float(e.this) == 0:
        return e.copy()
    if isinstance(e, exp.Null):
        return e.copy()
    if isinstance(e, exp.Case) and e.args.get("this") is None:
        out = e.copy()
        for w in out.args.get("ifs") or []:
            w.set("true", _neg(w.args["true"]))
        if out.args.get("default") is not None:
            out.set("default", _neg(out.args["default"]))
        return out
    return exp.Neg(this=e.copy())


def _as_post(e: exp.Expr) -> exp.Expr:
    """A pre branch read as a post branch: ``X__pre`` → ``X__post``, ``__has_pre`` →
    ``__has_post``."""
    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            name = node.name
            new = HAS_POST if name == HAS_PRE else (
                name[:-len(PRE)] + POST if name.endswith(PRE) else None)
            if new is not None:
                out = node.copy()
                out.this.set("this", new)  # (quoted as it was)
                return out
        return node
    return e.transform(rw)


def _refs(statements: Sequence[Statement], name: str) -> Iterator[exp.Table]:
    for s in statements:
        if isinstance(s, Compute):
            for tb in s.query.find_all(exp.Table):
                if tb.name == name and not tb.args.get("db"):
                    yield tb


def _refs_of(statements: Sequence[Statement], names: Collection[str]
             ) -> dict[str, list[exp.Table]]:
    """``_refs`` of every name in ``names`` at once: one walk of the statements, not one per
    name (a view's change tables are checked together)."""
    out: dict[str, list[exp.Table]] = {n: [] for n in names}
    for s in statements:
        if isinstance(s, Compute):
            for tb in s.query.find_all(exp.Table):
                found = out.get(tb.name)
                if found is not None and not tb.args.get("db"):
                    found.append(tb)
    return out


def _plain(sel: exp.Select) -> bool:
    """A SELECT with nothing but projections, one FROM and a WHERE (no join, grouping,
    DISTINCT, window, CTE, ordering or limit)."""
    return not any(sel.args.get(k) for k in ("joins", "group", "having", "distinct", "with_",
                                             "order", "limit", "offset", "qualify",
                                             "windows", "laterals", "pivots"))


def _branch_side(branch: exp.Expr, ref: exp.Table, keys: frozenset[str]) -> str | None:
    """``post`` or ``pre`` when ``branch`` reads ``ref`` as one side's images, else None."""
    if not isinstance(branch, exp.Select) or not _plain(branch):
        return None
    src = branch.args.get("from_")
    if src is None or src.this is not ref:
        return None
    if any(x is not branch for x in branch.find_all(exp.Select)) or \
            branch.find(exp.Subquery, exp.Exists, exp.Window, exp.AggFunc) is not None:
        return None
    if not all(isinstance(p, exp.Alias) for p in branch.expressions):
        return None
    flags = {c.name for c in _conjuncts(branch.args.get("where"))
             if isinstance(c, exp.Column)} & {HAS_POST, HAS_PRE}
    if len(flags) != 1:
        return None
    side = POST if flags == {HAS_POST} else PRE
    alias = ref.alias_or_name
    for col in branch.find_all(exp.Column):
        if col.table != alias:
            return None
        n = col.name
        if not (n in keys or n == (HAS_POST if side == POST else HAS_PRE)
                or (n.endswith(side) and n not in (HAS_PRE, HAS_POST))):
            return None
    return side


def _leaves(u: exp.Expr) -> list[exp.Expr]:
    if isinstance(u, exp.Union) and not u.args.get("distinct"):
        return _leaves(u.this) + _leaves(u.expression)
    return [u]


def _grouping(top: exp.Expr) -> tuple[set[str], set[str]] | None:
    """For the union ``top`` (or one branch): (summed, grouped) output columns when it is
    read directly by a grouping SELECT of sums and grouping columns, else None."""
    sub = top.parent
    if not isinstance(sub, exp.Subquery) or not isinstance(sub.parent, exp.From):
        return None
    g = sub.parent.parent
    if not isinstance(g, exp.Select) or g.args.get("from_") is not sub.parent:
        return None
    if any(g.args.get(k) for k in ("joins", "where", "having", "distinct", "with_", "qualify",
                                   "windows", "laterals")):
        return None
    alias = sub.alias_or_name
    grouped: set[str] = set()
    for e in (g.args["group"].expressions if g.args.get("group") else []):
        if not isinstance(e, exp.Column) or e.table != alias:
            return None
        grouped.add(e.name)
    summed: set[str] = set()
    for p in g.expressions:
        v = _bare(p.this if isinstance(p, exp.Alias) else p)
        if isinstance(v, exp.Literal):
            continue
        if isinstance(v, exp.Column) and v.table == alias and v.name in grouped:
            continue
        if isinstance(v, exp.Sum) and isinstance(v.this, exp.Column) and \
                v.this.table == alias and not v.args.get("distinct"):
            summed.add(v.this.name)
            continue
        return None
    if summed & grouped:
        return None
    return summed, grouped


def _mirrors(pre: exp.Select, post: exp.Select, names: Sequence[str], summed: set[str]
             ) -> bool:
    """``pre`` is ``post`` over pre-images: the same filter and grouping values, the summed
    values negated."""
    if len(pre.expressions) != len(post.expressions) or len(names) != len(post.expressions):
        return False
    if _bare(_as_post(pre.args["where"].this)) != _bare(post.args["where"].this):
        return False
    for n, a, b in zip(names, pre.expressions, post.expressions, strict=True):
        m, p = _bare(_as_post(a.this)), _bare(b.this)
        if m != (_bare(_neg(p)) if n in summed else p):
            return False
    return True


def _linear(statements: Sequence[Statement], name: str, keys: frozenset[str],
            refs: Sequence[exp.Table]) -> bool:
    if any(isinstance(s, Apply) and s.diff == name for s in statements):
        return False
    tops = _tops(statements, name, keys, refs)
    return tops is not None and all(_pairs(top, name, keys) is not None for top in tops)


def _pairs(top: exp.Expr, name: str, keys: frozenset[str]
           ) -> tuple[set[str], list[tuple[exp.Select, exp.Select]]] | None:
    """The union ``top``'s summed columns and its branches as (post, pre) mirror pairs
    (``_linear``'s check), None if they are not."""
    shape = _grouping(top)
    if shape is None:
        return None
    summed, _ = shape
    leaves = _leaves(top)
    sides: list[tuple[str, exp.Select]] = []
    for leaf in leaves:
        src = leaf.args.get("from_") if isinstance(leaf, exp.Select) else None
        tb = src.this if src is not None else None
        if not isinstance(tb, exp.Table) or tb.name != name or tb.args.get("db"):
            return None  # every branch of the union reads this table's changes
        side = _branch_side(leaf, tb, keys)
        if side is None:
            return None
        assert isinstance(leaf, exp.Select)
        sides.append((side, leaf))
    names = [p.alias_or_name for p in leaves[0].expressions]
    posts = [b for s, b in sides if s == POST]
    pres = [b for s, b in sides if s == PRE]
    if len(posts) != len(pres):
        return None
    out = []
    for p in posts:
        match = next((m for m in pres if _mirrors(m, p, names, summed)), None)
        if match is None:
            return None
        pres.remove(match)
        out.append((p, match))
    return summed, out


def _tops(statements: Sequence[Statement], name: str, keys: frozenset[str],
          refs: Sequence[exp.Table] | None = None) -> list[exp.Expr] | None:
    """The unions of branches reading ``name`` (each branch one side's images), None if a
    reference is not in such a branch. ``refs``: ``_refs(statements, name)``, when the
    caller has them."""
    refs = list(_refs(statements, name)) if refs is None else refs
    if not refs:
        return None
    tops: dict[int, exp.Expr] = {}
    for ref in refs:
        branch = ref.parent.parent if isinstance(ref.parent, exp.From) else None
        if branch is None or _branch_side(branch, ref, keys) is None:
            return None
        top: exp.Expr = branch
        while isinstance(top.parent, exp.Union) and not top.parent.args.get("distinct"):
            top = top.parent
        tops[id(top)] = top
    return list(tops.values())


def _merged(post: exp.Select, pre: exp.Select, summed: set[str]) -> exp.Select:
    """One branch for the pair over rows that each hold one image under both names: the
    post branch's filter less its ``__has_post``, each summed value the post contribution
    where the row is a post-image, else the pre branch's (read under the post names)."""
    conjuncts = _conjuncts(post.args.get("where"))
    flag = next(c for c in conjuncts if isinstance(c, exp.Column) and c.name == HAS_POST)
    out = post.copy()
    for p, q in zip(out.expressions, pre.expressions, strict=True):
        if p.alias_or_name in summed:
            p.set("this", exp.Case(ifs=[exp.If(this=flag.copy(), true=p.this.copy())],
                                   default=_as_post(q.this)))
    rest = [c for c in conjuncts if c is not flag]
    out.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
    return out


def merge_image_reads(statements: Sequence[Statement], name: str, keys: Sequence[str]
                      ) -> list[Statement]:
    """``statements`` (reading change table ``name`` linearly: ``linear_change_tables``)
    with each mirrored (post, pre) pair of union branches as one branch, for a ``name`` whose
    rows each hold one image under both names — a log's rows (``log_images``): each row is
    then read once. Not for a fold's change table, whose rows hold two different images."""
    out: list[Statement] = []
    for s in statements:
        if isinstance(s, Compute) and any(True for _ in _refs([s], name)):
            q = s.query.copy()
            for top in _tops([dataclasses.replace(s, query=q)], name, frozenset(keys)) or []:
                found = _pairs(top, name, frozenset(keys))
                if found is None:
                    raise ValueError(f"{name} is not read linearly by {s.name}")
                summed, pairs = found
                branches = [_merged(p, m, summed) for p, m in pairs]
                merged: exp.Expr = branches[0]
                for b in branches[1:]:
                    merged = exp.union(merged, b, distinct=False)
                top.replace(merged)
            s = dataclasses.replace(s, query=q)
        out.append(s)
    return out


def linear_change_tables(statements: Sequence[Statement], change_tables: Mapping[str, Sequence[str]]
                         ) -> frozenset[str]:
    """The change tables (``change_tables``: name → the base table's key columns) that
    ``statements`` read only as sums of per-image contributions (the module's shape): their
    statements give the same result over the table's log rows, each read as a post-image
    (an insert's, an update's new row) or a pre-image (a delete's, an update's old row)."""
    refs = _refs_of(statements, change_tables)
    return frozenset(n for n, keys in change_tables.items()
                     if _linear(statements, n, frozenset(keys), refs[n]))


def read_from(statements: Sequence[Statement], name: str, source: exp.Expr
              ) -> list[Statement]:
    """``statements`` with every reference to relation ``name`` replaced by the derived table
    ``source`` (under the reference's alias)."""
    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table) and node.name == name and not node.args.get("db"):
            return exp.Subquery(this=source.copy(),
                                alias=exp.TableAlias(this=exp.to_identifier(
                                    node.alias_or_name, quoted=True)))
        return node

    out: list[Statement] = []
    for s in statements:
        if isinstance(s, Compute):
            s = dataclasses.replace(s, query=s.query.transform(rw))
        out.append(s)
    return out
