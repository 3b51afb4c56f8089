"""Per base table, a filter of its change log: the row images the view can ever see.

A row of a table T reaches a view only through the operators above T's scans; where those
filter it — a σ, an inner join's or a semijoin's condition, the ON of an outer join for its
null-supplying side — a row failing a condition on T's columns alone contributes nothing. Its
images in the change log can be left out before the fold: the fold of the remaining images is
the change table of σ_φ(T), and maintaining the view over σ_φ(T) gives the same view. Where
the Δ-script reads T itself (its post-state, or its pre-state rebuilt from the change table),
the rows that differ from σ_φ(T)'s are rows failing φ, which the same operators drop.

``log_filters`` derives φ per table: for each scan of T, the condition on T's columns implied
by the conditions on the way up to the view (``implied``: of a conjunction its parts on T
alone, of a disjunction the disjunction of its parts' — Q19's OR of three brands — else
nothing), stopping where rows are not just filtered: a γ, a union, the preserved side of an
outer join, the right side of an antijoin above its condition, and a cache (a stored
relation holds every row of its operator, filtered or not above it). Over all scans of T, φ is
the disjunction of theirs; a scan without one leaves T unfiltered. Conditions are kept only
when deterministic and made of plain operators (comparisons, arithmetic, CASE, casts,
LIKE/IN/BETWEEN and a few string functions), so a log row is judged as the table row would be.

``fold_filters`` adds, for the fold alone, the conditions a join with a keyed σ_φ(S) — a
stored one, or one the planner chose to read from S itself (``planner.selective``) — puts on
T's rows (``KeysOf``): where the join equates every key column of the σ with a column of T's
side, and the σ is that side's sibling input or reaches it through inner joins (``reaching``:
TPC-H Q5's line items joined with customers ⋈ σ_1994(orders)), a T row whose values are no
key of σ_φ(S) — in S's state before the changes or after them — joins nothing there, in
either state the Δ-script evaluates. The keys
of both states are among the stored relation's keys (in whichever state it is when read) and
the keys of S's pending log rows that meet φ (every key that changed in or out of σ_φ(S)): a
superset, fixed per run, decided per image, so the fold of the images kept is the change
table of σ_ψ(T) as for φ above (TPC-H Q8: 14k line-item log rows, 0.7% of them of a part
the view can see). The triggers do not use them (the keys are not the writer's to read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from sqlglot import exp

from idivm import algebra as A

# node types a condition pushed into the log may consist of (deterministic, no subqueries)
SAFE: tuple[type[exp.Expr], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.And, exp.Or,
    exp.Not, exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
    exp.Is, exp.In, exp.Between, exp.Like, exp.ILike, exp.Add, exp.Sub, exp.Mul, exp.Div,
    exp.Mod, exp.Neg, exp.Cast, exp.DataType, exp.DataTypeParam, exp.Tuple, exp.Case, exp.If,
    exp.Coalesce, exp.Substring, exp.Upper, exp.Lower, exp.Length, exp.Trim, exp.Abs,
    exp.Interval, exp.Var, exp.DPipe, exp.Concat, exp.Escape,
)


class KeysOf(exp.Expression, exp.Func):
    """The fold filter's semijoin (``fold_filters``): the values of ``expressions`` (T's
    columns, in the order of the stored relation's key) are a key of the stored σ_φ(S) whose
    node is ``this`` (an integer literal: its nid) or of S's pending log rows. Never rendered
    as is: the backend that compiles the fold replaces it."""

    arg_types = {"this": True, "expressions": True}

    @property
    def nid(self) -> int:
        return int(self.this.name)


def _bare(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def implied(e: exp.Expr, cols: frozenset[str],
            safe: tuple[type[exp.Expr], ...] = SAFE) -> exp.Expr | None:
    """A condition on ``cols`` alone that every row satisfying ``e`` satisfies (None: none
    but TRUE); made of ``safe`` nodes."""
    e = _bare(e)
    refs = A.referenced(e)
    if refs and refs <= cols and all(isinstance(n, safe) for n in e.walk()):
        return e
    if isinstance(e, exp.And):
        parts = [p for p in (implied(e.left, cols, safe), implied(e.right, cols, safe))
                 if p is not None]
        return exp.and_(*parts) if parts else None
    if isinstance(e, exp.Or):
        left, right = implied(e.left, cols, safe), implied(e.right, cols, safe)
        return None if left is None or right is None else exp.or_(left, right)
    return None


def _through(e: exp.Expr, exprs: Mapping[str, exp.Expr]) -> exp.Expr | None:
    """A condition on a projection's outputs as one on its input (None: it reads an output
    the projection does not define)."""
    if not A.referenced(e) <= set(exprs):
        return None

    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table:
            e = exprs[node.name].copy()
            return e if isinstance(e, exp.Column | exp.Literal | exp.Paren) else exp.paren(e)
        return node
    return e.transform(rw)


def base_named(scan: A.Scan, e: exp.Expr) -> exp.Expr:
    """``e``, a condition over ``scan``'s plan column names, over its table's own column names."""
    names = dict(zip(scan.cols, scan.base_cols, strict=True))

    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name in names:
            return exp.column(names[node.name], quoted=True)
        return node
    return e.transform(rw)


def reaching(node: A.Node) -> list[A.Select]:
    """The σ over a scan whose rows carry each row of ``node``, their columns unchanged where
    ``node`` outputs them: ``node`` itself, and those below it through operators that only
    filter or combine rows — an inner join (either input), a σ, the left input of a semijoin
    or an antijoin, a π (each of the σ's columns it outputs, a column passed on under its
    name). Every row of ``node``, in any state, holds the values of a row of each of them, in
    the same state."""
    out: list[A.Select] = []
    if isinstance(node, A.Select) and isinstance(node.child, A.Scan):
        out.append(node)
    if isinstance(node, A.Select):
        out += reaching(node.child)
    elif isinstance(node, A.Join):
        out += [s for child in node.children for s in reaching(child)]
    elif isinstance(node, A.SemiJoin | A.AntiJoin):
        out += reaching(node.left)
    elif isinstance(node, A.Project):
        # (its columns π outputs under their names must be theirs: the reader asks for the
        # key among the outputs)
        exprs = dict(node.exprs)
        passed = {k for k, e in node.exprs if isinstance(e, exp.Column) and e.name == k
                  and not e.table}
        out += [s for s in reaching(node.child)
                if all(k in passed for k in s.columns if k in exprs)]
    return out


def _pairs(join: A.Node, theirs: Iterable[str], mine: Iterable[str]) -> dict[str, str]:
    """The columns of ``theirs`` that ``join``'s condition equates with a column of ``mine``
    (a conjunct ``a = b``), each with the first such column."""
    ours, other = set(mine), set(theirs)
    pairs: dict[str, str] = {}
    for a, b in A.equalities(getattr(join, "predicate", None)):
        if a in other and b in ours:
            pairs.setdefault(a, b)
        elif b in other and a in ours:
            pairs.setdefault(b, a)
    return pairs


def carried(node: A.Node) -> list[tuple[A.Select, dict[str, str]]]:
    """``reaching``, and the σ over a scan whose key values a semijoin carries into its left
    input's columns: each with its columns → the column of ``node`` holding the same value in
    every row (its own, where ``reaching`` finds it). A semijoin keeps a left row only if its
    condition equates some of its columns with a right row's — a right row that holds, where
    the right input carries a σ's column, a value of that σ's rows in the same state: TPC-H
    Q20's magic set of line items ``⋉ (partsupp ⋉ σ_forest(part))`` on ``l_partkey =
    ps_partkey = p_partkey``, the keys of the parts it can see."""
    out = [(s, {c: c for c in s.columns}) for s in reaching(node)]
    if isinstance(node, A.SemiJoin):
        pairs = _pairs(node, node.right.columns, node.left.columns)
        for s, cols in carried(node.right):
            moved = {c: pairs[v] for c, v in cols.items() if v in pairs}
            if moved:
                out.append((s, moved))
    return out


def read_by_key(join: A.Node, sibling: A.Node, child: A.Node,
                key_of: Callable[[A.Select], tuple[str, ...] | None],
                through: Callable[[A.Node], list[tuple[A.Select, dict[str, str]]]] | None = None
                ) -> list[tuple[A.Select, tuple[str, ...]]]:
    """The σ over a scan reaching ``join``'s input ``sibling`` (``reaching``, or ``through``:
    ``carried``) whose every key column (``key_of``: None, not keyed) the join's condition
    equates with a column of its other input ``child`` (a conjunct ``k = c``), with those
    columns of ``child`` in key order: a row of ``child`` whose values there are no key of σ
    joins no row of ``sibling``."""
    pairs = _pairs(join, sibling.columns, child.columns)
    reached = through(sibling) if through is not None else [
        (s, {c: c for c in s.columns}) for s in reaching(sibling)]
    out: list[tuple[A.Select, tuple[str, ...]]] = []
    for sel, cols in reached:
        key = key_of(sel)
        if key and all(cols.get(k) in pairs for k in key):
            found = (sel, tuple(pairs[cols[k]] for k in key))
            if not any(sel is t and found[1] == c for t, c in out):
                out.append(found)
    return out


def _keyed(join: A.Node, sibling: A.Node, child: A.Node,
           keyed: Mapping[int, tuple[str, ...]], reach: frozenset[int]
           ) -> tuple[exp.Expr, ...]:
    """``KeysOf`` for the rows of ``child`` for each keyed σ over a scan that ``join`` reads
    through its sibling input by its whole key (``read_by_key``): directly (the sibling is
    the σ), or, for those in ``reach``, below the sibling's inner joins (TPC-H Q5: line items
    joined on ``l_orderkey`` with customers ⋈ σ_1994(orders))."""
    if not keyed:
        return ()
    # (and a stored σ a semijoin carries: the sibling itself, or below it through semijoins'
    # right inputs — no inner join, which a stored σ reaches a join's input by only as it)
    plain = {id(s) for s in reaching(sibling)}
    moved = {id(s) for s, _ in carried(sibling) if id(s) not in plain}
    return tuple(KeysOf(this=exp.Literal.number(sel.nid),
                        expressions=[exp.column(c, quoted=True) for c in cols])
                 for sel, cols in read_by_key(
                     join, sibling, child,
                     lambda n: keyed.get(n.nid) if n is sibling or n.nid in reach
                     or id(n) in moved else None, carried))


def _scans(node: A.Node, conds: tuple[exp.Expr, ...], cached: frozenset[int], root: A.Node,
           keyed: Mapping[int, tuple[str, ...]], reach: frozenset[int] = frozenset()
           ) -> Iterable[tuple[A.Scan, exp.Expr | None]]:
    """Each scan below ``node`` with the condition its rows must meet to reach the view
    (with ``keyed``, the semijoins of those stored relations too: ``fold_filters``)."""
    if node.nid in cached and node is not root:
        conds = ()  # a cache stores every row of its operator
    safe = (*SAFE, KeysOf) if keyed else SAFE

    def down(child: A.Node, cs: tuple[exp.Expr, ...]) -> Iterable[tuple[A.Scan, exp.Expr | None]]:
        return _scans(child, cs, cached, root, keyed, reach)

    def keys(sibling: A.Node, child: A.Node) -> tuple[exp.Expr, ...]:
        return _keyed(node, sibling, child, keyed, reach)

    if isinstance(node, A.Scan):
        cols = frozenset(node.cols)
        # (each conjunct once: a σ the rewrites derived from a join's condition repeats what
        # the condition implies)
        parts = list({c.sql(): c for p in (implied(c, cols, safe) for c in conds)
                      if p is not None for c in A.conjuncts(p)}.values())
        yield node, exp.and_(*parts) if parts else None
    elif isinstance(node, A.Select):
        yield from down(node.child, (*conds, node.predicate))
    elif isinstance(node, A.Project):
        exprs = dict(node.exprs)
        below = tuple(x for x in (_through(c, exprs) for c in conds) if x is not None)
        yield from down(node.child, below)
    elif isinstance(node, A.Join):
        on = (node.predicate,) if node.predicate is not None else ()
        yield from down(node.left, (*conds, *on, *keys(node.right, node.left)))
        yield from down(node.right, (*conds, *on, *keys(node.left, node.right)))
    elif isinstance(node, A.OuterJoin):
        on = (node.predicate,) if node.predicate is not None else ()
        yield from down(node.left, () if node.full else conds)
        yield from down(node.right, () if node.full else
                        (*on, *keys(node.left, node.right)))
    elif isinstance(node, A.SemiJoin):
        yield from down(node.left, (*conds, node.predicate,
                                    *keys(node.right, node.left)))
        yield from down(node.right, (node.predicate, *keys(node.left, node.right)))
    elif isinstance(node, A.AntiJoin):
        yield from down(node.left, conds)
        yield from down(node.right, (node.predicate, *keys(node.left, node.right)))
    else:  # γ, ∪ and the rest: their inputs' rows are not filtered by what is above
        for child in node.children:
            yield from down(child, ())


def log_filters(root: A.Node, cached: Iterable[int] = ()) -> dict[str, exp.Expr]:
    """Base table → a condition on its columns (base names) that the images of its change log
    must meet to matter to the view rooted at ``root`` (``cached``: the nids of its stored
    relations); tables with no such condition are left out."""
    return _per_table(_scans(root, (), frozenset(cached), root, {}))


def fold_filters(root: A.Node, cached: Iterable[int],
                 keyed: Mapping[int, tuple[str, ...]], reach: Iterable[int] = ()
                 ) -> dict[str, exp.Expr]:
    """``log_filters`` with the semijoins of keyed σ (``KeysOf``), for the fold: ``keyed``
    maps the nid of each stored σ over a scan, or σ chosen to filter, to its key columns
    (never NULL); those in ``reach`` filter through the inner joins above them too, the
    others only as a join's input."""
    stored = {nid: key for nid, key in keyed.items() if key}
    plain = _per_table(_scans(root, (), frozenset(cached), root, {}))
    per: dict[str, dict[str, exp.Expr | None]] = {}
    canon = _canonical(root, stored)
    for scan, cond in _scans(root, (), frozenset(cached), root, stored, frozenset(reach)):
        if cond is not None:
            cond = base_named(scan, cond).transform(
                lambda n: KeysOf(this=exp.Literal.number(canon[n.nid]),
                                 expressions=[e.copy() for e in n.expressions])
                if isinstance(n, KeysOf) else n)
        per.setdefault(scan.table, {})[cond.sql("postgres") if cond is not None else ""] = cond
    out = dict(plain)
    for table, conds in per.items():
        # one condition over the scans (copies alike: a magic set's): a semijoin in a
        # conjunction, which PostgreSQL runs as a join; under an OR it would be a subplan
        # per row where its keys are too many to hash — then the plain filter
        (_, cond), *more = conds.items()
        if not more and cond is not None and any(isinstance(n, KeysOf) for n in cond.walk()):
            out[table] = cond
    return out


def _canonical(root: A.Node, keyed: Mapping[int, tuple[str, ...]]) -> dict[int, int]:
    """Each stored σ over a scan → the first stored σ of the same table, condition and key
    (their stored rows are the same)."""
    first: dict[tuple[str, str, tuple[str, ...]], int] = {}
    out: dict[int, int] = {}
    for n in A.walk(root):
        if n.nid in keyed and isinstance(n, A.Select) and isinstance(n.child, A.Scan):
            scan = n.child
            sig = (scan.table, base_named(scan, n.predicate).sql("postgres"),
                   tuple(scan.base_of(k) for k in keyed[n.nid]))
            out[n.nid] = first.setdefault(sig, n.nid)
    return out


def _per_table(scans: Iterable[tuple[A.Scan, exp.Expr | None]]) -> dict[str, exp.Expr]:
    """Per table, the disjunction of its scans' conditions (none if one scan has none)."""
    per: dict[str, list[exp.Expr | None]] = {}
    for scan, cond in scans:
        if cond is not None:
            cond = base_named(scan, cond)
        per.setdefault(scan.table, []).append(cond)
    out: dict[str, exp.Expr] = {}
    for table, conds in per.items():
        if all(c is not None for c in conds):
            out[table] = exp.or_(*[exp.paren(c) for c in conds if c is not None]) \
                if len(conds) > 1 else conds[0]  # type: ignore[assignment]
    return out
