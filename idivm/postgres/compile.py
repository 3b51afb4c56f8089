"""Compile a Δ-script once into PL/pgSQL: the per-view maintenance function.

A pure pass (``Plan`` → source text); the backend installs the result. Maintenance is then one
``CALL`` with no statement rendering: PostgreSQL plans the function's statements and caches the
plans per session.

The rewrites, each a small function over the script, applied in order:

0. ``deletes_fill_snapshots`` — a cache's Input_pre snapshot no longer looks up the rows its Δ-
   i-diffs name: the DELETEs applying them return those rows into it (``DELETE … RETURNING``),
   so each is found once, not by the snapshot and again by its DELETE;
1. ``split_snapshot_or`` — a snapshot ``WHERE EXISTS(Δ1 …) OR EXISTS(Δ2 …)`` becomes a UNION of
   one semi-join per i-diff, so each branch is driven by its (small) i-diff through the stored
   relation's ID index instead of a scan of the whole cache;
2. ``semijoins_through_keys`` — an EXISTS that reaches a stored relation only through a base
   table's key has that semijoin moved out onto the i-diff's own column (an equivalent
   condition the planner can apply first);
3. ``distinct_conjuncts`` — a condition the rules' composition repeated in a WHERE is kept
   once (the planner would square its selectivity);
4. ``strict_null_tests`` — ``(a * (1 - b)) IS NULL`` becomes ``(a IS NULL OR b IS NULL)``: an
   arithmetic expression is NULL exactly when one of its columns is, and the non-null counts
   of SUM and AVG test every delta row's argument (computed again for the test);
5. ``rename_temporaries`` — i-diffs, snapshots and folded change tables get per-compilation
   names: the view's *scratch relations*, unlogged tables of the companion schema created with
   the code (not per session: a session's first maintain used to spend 100–200 ms creating
   them), used by one maintain of the view at a time (its lock) and emptied by it;
6. ``inline_single_use`` — a relation read by one later statement becomes a CTE of that
   statement (PostgreSQL inlines it), unless an APPLY between them changes what it reads.

What stays a scratch relation is filled once per run; its row count decides at run time whether
the statements reading it run at all (an i-diff that is empty yields nothing), and ANALYZE gives
the planner its true size, so plans follow the batch: a few changed keys are index probes on the
stored relations' ID indexes, a large batch a hash join.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from idivm import algebra as A
from idivm import pipeline
from idivm.catalog import Table
from idivm.plan import Plan
from idivm.planner.linear import linear_change_tables, merge_image_reads, read_from
from idivm.planner.log_filter import KeysOf, base_named, fold_filters, log_filters
from idivm.planner.model import change_table, fit, post_name, pre_name
from idivm.planner.prune import prune_empty
from idivm.planner.ruleapi import and_all, exists, match
from idivm.planner.selective import filter_candidates
from idivm.postgres import ddl_epoch
from idivm.postgres.changelog import (
    HAS_POST,
    HAS_PRE,
    PRUNE_ROWS,
    PRUNE_ROWS_SETTING,
    PRUNE_XIDS,
    PRUNE_XIDS_SETTING,
    XID,
    KeyFold,
    counted,
    dollar_quote,
    first_image_source,
    fold_by_key,
    folds_by_key,
    indent,
    lit,
    log_images,
    log_ref,
    pending_predicate,
    prune_due,
    prune_due_any,
    prune_statement,
    prune_threshold,
    q,
)
from idivm.render import deep_trees
from idivm.script import Apply, Compute, Statement, render

FORMAT_VERSION = 49  # bump when the compiled code's shape changes: installed views recompile
# the planner's ``merge`` for PostgreSQL: off, each Δ+ (Δ-) i-diff of an operator propagates
# apart. Merged, they reach the operators above as one UNION, which PostgreSQL plans as a
# barrier: the joins above it run after the union, not inside its branches (TPC-H SF 1 Q5's
# inserted line items, with the moved ones, probed `orders` before the region's filter
# applied). Apart, TPC-H SF 1 refreshes (views planned each way side by side, 14 batches,
# paired medians) took 64 ms less on Q20, 60 on Q21, 19 on Q3, 15 on Q7, 10 on Q18, within
# ±2 ms on the rest but Q5 (7.6 ms more in 7 of 14 batches, of ~158; its buffers read 22%
# fewer); at SF 0.1 (22 batches) 8.7 ms less on Q21 and 2.9 on Q20, up to 1.7 ms more on
# ten views (more statements run). The stored relations are the same either way (only the
# statements differ), so a view compiled either way recompiles in place.
MERGE = False
STATS_STALE = "stats_stale"  # the companion's check before a scratch relation's ANALYZE
RANDOM_PAGE_COST = 1.1  # the maintenance function's (see ``compile_view``'s header)
# the statistics target of the maintenance function's ANALYZEs — of its scratch relations
# only (``_analyze``): a sample of 3,000 rows instead of 30,000, and 10 MCVs and histogram
# buckets. Their plans need row counts and the keys' distinct counts, which the smaller sample
# still gives; an ANALYZE of a 15k-row relation took 1.6 ms instead of 4.3. TPC-H SF 1 (two
# copies, identical batches, 20 paired refreshes each way, the settings swapped between
# copies): Q3 1.9 ms, Q21 2.2 and Q5 1.2 faster a refresh, Q1, Q8, Q20 and Q22 within ±0.3
SCRATCH_STATISTICS_TARGET = 10
# the Δ-script's (``_delta_costs``): PostgreSQL's 0.01 prices a row scanned and hashed at
# 1/60 of a probe through an index; measured here it is 1/5–1/8 (TPC-H SF 1 Q12: 31k cache rows
# hashed against a 1.5k-row i-diff in 5.3 ms, probed by it in 1.7 ms)
DELTA_CPU_TUPLE_COST = 0.03

# SQLSTATEs of idivm's own refusals (class IV), mapped to Python errors by the maintainer
SCHEMA_CHANGED = "IV001"
UNDECLARED_CHANGE = "IV002"
NO_VIEW = "IV003"
STALE_CODE = "IV004"
NOT_REPEATABLE_READ = "IV005"
BAD_CHOICE = "IV006"
STALE_DECISION = "IV007"  # an auto decision made from an older refresh history
STALE_REGISTRY = "IV008"  # a maintain of a client that read the registry before it changed
# a scratch relation is truncated after a run when it has grown past both: a floor, and room
# for this many bytes per row the run put in it (``_emptied``)
SCRATCH_TRUNCATE_BYTES = 1 << 20
SCRATCH_BYTES_PER_ROW = 1024

HISTORY = "refresh_history"  # the companion's table of refreshes (``history_source``)
HISTORY_ROWS = 100  # refreshes kept per view (and its newest recomputation, however old)
# the history is trimmed at every HISTORY_TRIM-th run that read the logs: one DELETE of the
# rows past HISTORY_ROWS (three index scans of the view's rows, ~0.1 ms) in so many runs
# rather than one a run, so a view keeps between HISTORY_ROWS and HISTORY_ROWS + HISTORY_TRIM
HISTORY_TRIM = 16

PREV = "idivm__prev"  # the view's watermark (a pg_snapshot) inside the function


@dataclass(frozen=True)
class Relation:
    """A scratch relation of the compiled code: a folded change table or a Compute."""

    name: str  # the unlogged table of the companion schema
    label: str  # the name the Δ-script and the statistics use
    counter: str  # the PL/pgSQL variable holding its row count this run


@dataclass(frozen=True)
class Compiled:
    function: str
    prune_function: str
    source: tuple[str, ...]  # its scratch relations, CREATE OR REPLACE FUNCTION statements


def scratch_prefix(function: str) -> str:
    """The name prefix of the scratch relations of the code whose function is ``function``
    (``maintain__<tag>``): what dropping or recompiling the view drops with it."""
    return f"__iv{function.removeprefix('maintain__')}_"


# --------------------------------------------------------------------------- script rewrites


def _operands(e: exp.Expr, op: type[exp.Connector]) -> list[exp.Expr]:
    """The operands of a chain of ``op`` (AND, OR) through parentheses."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, op):
        return _operands(e.left, op) + _operands(e.right, op)
    return [e]


def _disjuncts(e: exp.Expr) -> list[exp.Expr]:
    return _operands(e, exp.Or)


def split_snapshot_or(statements: Sequence[Statement]) -> list[Statement]:
    """Snapshots over several i-diffs as a UNION of per-i-diff semi-joins (rows of a stored
    relation are unique, so UNION's duplicate elimination changes nothing)."""
    out: list[Statement] = []
    for s in statements:
        where = s.query.args.get("where") if isinstance(s, Compute) else None
        if isinstance(s, Compute) and s.phase == "snapshot" and where is not None:
            parts = _disjuncts(where.this)
            if len(parts) > 1 and all(isinstance(p, exp.Exists) for p in parts):
                branches = []
                for p in parts:
                    b = s.query.copy()
                    b.set("where", exp.Where(this=p.copy()))
                    branches.append(b)
                union: exp.Expr = branches[0]
                for b in branches[1:]:
                    union = exp.union(union, b, distinct=True)
                s = dataclasses.replace(s, query=union)
        out.append(s)
    return out


def _diff_sources(src: exp.Expr) -> list[tuple[str, exp.Expr]] | None:
    """The i-diffs an EXISTS part of a snapshot reads (``compose.touches``): each with its
    branch (a table aliased ``z``, or a branch of a UNION ALL of SELECTs of IDs); None for
    any other shape."""
    if isinstance(src, exp.Table):
        return [(src.name, src)]
    if not isinstance(src, exp.Subquery):
        return None
    out: list[tuple[str, exp.Expr]] = []
    stack: list[exp.Expr] = [src.this]
    while stack:
        q_ = stack.pop()
        if isinstance(q_, exp.Union) and not q_.args.get("distinct"):
            stack += [q_.right, q_.left]
            continue
        one = _single_table(q_)
        if one is None or q_.args.get("where"):
            return None
        table = q_.args["from_"].this
        out.append((table.name, q_))
    return out


def _rebuilt_source(parts: Sequence[tuple[str, exp.Expr]], alias: str) -> exp.Expr:
    """An EXISTS part's source from the branches left (``_diff_sources``)."""
    if len(parts) == 1 and isinstance(parts[0][1], exp.Table):
        return parts[0][1].copy()
    selects = [b.copy() if isinstance(b, exp.Select) else
               exp.select("*").from_(b.copy()) for _, b in parts]
    union: exp.Expr = selects[0]
    for b in selects[1:]:
        union = exp.union(union, b, distinct=False)
    return exp.Subquery(this=union, alias=exp.TableAlias(this=exp.to_identifier(alias,
                                                                                quoted=True)))


def deletes_fill_snapshots(statements: Sequence[Statement]) -> list[Statement]:
    """A cache's Input_pre snapshot (``compose._snapshot``: its rows the i-diffs name, read
    before the APPLYs) no longer looks up the rows its Δ- i-diffs name: the DELETE that
    applies each such i-diff puts the rows it deletes into the snapshot (``Apply.snapshot``,
    ``DELETE … RETURNING``) — the same rows, their pre-images (the deletes are the first
    APPLYs), found once instead of twice (TPC-H Q3, Q5: thousands of deleted line items whose
    keys the snapshot looked up in the cache, and the DELETE again). Left as it is: a
    snapshot of any other shape, or all of whose i-diffs are Δ-."""
    out = list(statements)
    for i, s in enumerate(statements):
        if not (isinstance(s, Compute) and s.phase == "snapshot"):
            continue
        one = _single_table(s.query)
        where = s.query.args.get("where")
        if one is None or where is None:
            continue
        target = one[0].args["from_"].this.name
        deletes = {a.diff: j for j, a in enumerate(statements) if j > i and
                   isinstance(a, Apply) and a.kind == "del" and a.target == target}
        if not deletes:
            continue
        kept: list[exp.Expr] = []
        moved: list[str] = []
        shapes_ok = True
        for part in _disjuncts(where.this):
            sub = part.this if isinstance(part, exp.Exists) else None
            src = sub.args.get("from_") if isinstance(sub, exp.Select) else None
            parts = _diff_sources(src.this) if src is not None else None
            if sub is None or src is None or parts is None or sub.args.get("joins"):
                shapes_ok = False
                break
            left = [(d, b) for d, b in parts if d not in deletes]
            moved += [d for d, _ in parts if d in deletes]
            if left:
                p = part.copy()
                p.this.set("from_", exp.From(this=_rebuilt_source(left, src.this.alias_or_name)))
                kept.append(p)
        if not shapes_ok or not moved or not kept:
            continue
        query = s.query.copy()
        cond: exp.Expr = kept[0]
        for p in kept[1:]:
            cond = exp.or_(cond, p)
        query.set("where", exp.Where(this=cond))
        out[i] = dataclasses.replace(s, query=query)
        columns = tuple(e.alias_or_name for e in s.query.expressions)
        for d in moved:
            a = statements[deletes[d]]
            assert isinstance(a, Apply)
            out[deletes[d]] = dataclasses.replace(a, snapshot=s.name, snapshot_columns=columns)
        applies = [a for a in statements[i + 1:] if isinstance(a, Apply) and a.target == target]
        for j, n in enumerate(statements):  # (the Input_post snapshot: the one reading this)
            if j > i and isinstance(n, Compute) and n.phase == "snapshot" and any(
                    t.name == s.name for t in n.query.find_all(exp.Table)):
                survived = _survivors(n.query, s.name, target, set(deletes), applies)
                if survived is not None:
                    out[j] = dataclasses.replace(n, query=survived)
    return out


def _survivors(query: exp.Expr, old: str, target: str, deletes: set[str],
               applies: Sequence[Apply]) -> exp.Expr | None:
    """The Input_post snapshot (``compose._post_of_touched``: the APPLYs replayed on the
    rows of ``old``) with its Δ- replayed by the rows of ``old`` still in ``target`` after
    the APPLYs, found by their key, instead of by an anti-join with every Δ- i-diff (each
    hashed whole, thousands of rows, for the tens of rows of the snapshot). The same rows: a
    row the Δ- deleted is not there, nor inserted again but by a Δ+, whose replay, after,
    puts its own row in its place; an UPDATE sets no key column (checked). None where the
    shape is other, or the key's nullability is unknown."""
    keyed = [a for a in applies if a.ids == a.key]
    if not keyed or any(set(a.columns) & set(a.key) for a in applies if a.kind == "upd"):
        return None
    key, nullable = keyed[0].key, keyed[0].nullable
    q_ = query.copy()
    bases = [sel for sel in q_.find_all(exp.Select) if isinstance(
        sel.args.get("from_") and sel.args["from_"].this, exp.Table)
        and sel.args["from_"].this.name == old]
    if len(bases) != 1 or bases[0].args.get("where") is None:
        return None
    sel = bases[0]
    alias = sel.args["from_"].this.alias_or_name
    keep: list[exp.Expr] = []
    for c in _operands(sel.args["where"].this, exp.And):
        inner = c.this if isinstance(c, exp.Not) else None
        sub = inner.this if isinstance(inner, exp.Exists) else None
        src = sub.args.get("from_") if isinstance(sub, exp.Select) else None
        if src is not None and isinstance(src.this, exp.Table) and src.this.name in deletes:
            continue
        keep.append(c)
    if len(keep) == len(_operands(sel.args["where"].this, exp.And)):
        return None
    probe = "__idivm_m"
    keep.append(exists(exp.table_(exp.to_identifier(target, quoted=True),
                                  alias=exp.to_identifier(probe, quoted=True)),
                       match([(k, k) for k in key], alias, probe,
                             {k: True for k in nullable})))
    sel.set("where", exp.Where(this=and_all(keep)))
    return q_


def _single_table(q_: exp.Expr) -> tuple[exp.Select, str] | None:
    """``q_`` as a SELECT from one aliased table, no joins, no grouping: it and the alias."""
    if not isinstance(q_, exp.Select) or q_.args.get("joins") or q_.args.get("group") \
            or q_.args.get("with_") or q_.args.get("limit") or q_.args.get("having"):
        return None
    src = q_.args.get("from_")
    t = src.this if src is not None else None
    if not isinstance(t, exp.Table) or not t.alias:
        return None
    return q_, t.alias


def _implied_semijoin(e: exp.Exists) -> tuple[exp.Exists, exp.Exists] | None:
    """For ``EXISTS(SELECT … FROM T a WHERE EXISTS(SELECT … FROM C b WHERE a.c = b.k …) AND
    o.x = a.c …)``, the semijoin it implies on the outer row: ``EXISTS(SELECT 1 FROM C b
    WHERE o.x = b.k …)`` — the inner EXISTS with each column of ``a`` it reads replaced by the
    outer column ``a``'s is equated with (both equalities hold for the rows that make ``e``
    true, so ``e`` implies it) — and ``e`` without that inner EXISTS: for a row ``a`` meeting
    ``e``'s other conjuncts (its equalities among them) the inner EXISTS is the implied one,
    so ``e`` is the two together. None when the shape differs, or a column of ``a`` in the
    inner EXISTS has no such outer equal."""
    outer = _single_table(e.this)
    if outer is None:
        return None
    sub, a = outer
    parts = A.conjuncts(sub.args["where"].this) if sub.args.get("where") else []
    equal: dict[str, exp.Column] = {}  # a's column → an outer column equal to it
    for p in parts:
        if isinstance(p, exp.EQ) and isinstance(p.this, exp.Column) and \
                isinstance(p.expression, exp.Column):
            for mine, other in ((p.this, p.expression), (p.expression, p.this)):
                if mine.table == a and other.table and other.table != a:
                    equal.setdefault(mine.name, other)
    for p in parts:
        inner = _single_table(p.this) if isinstance(p, exp.Exists) else None
        if inner is None:
            continue
        isub, b = inner
        cols = [c for c in isub.find_all(exp.Column)]
        if b == a or any(not c.table for c in cols) or any(
                c.table == b for c in equal.values()) or any(
                c.table == a and c.name not in equal for c in cols) or not any(
                c.table == a for c in cols) or isub.find(exp.Subquery, exp.Exists):
            continue

        def outer_of(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.table == a:
                return equal[node.name].copy()
            return node

        implied = isub.transform(outer_of)
        assert isinstance(implied, exp.Select)
        rest = sub.copy()
        rest.set("where", exp.Where(this=A.conjoin([x.copy() for x in parts if x is not p])))
        return exp.Exists(this=implied), exp.Exists(this=rest)
    return None


def _rewritten(statements: Sequence[Statement], rw: Callable[[exp.Expr], exp.Expr],
               touches: Callable[[exp.Expr], bool]) -> list[Statement]:
    """Each computed relation's query through ``rw`` (sqlglot's transform, on a copy), for
    the queries with a node ``touches`` accepts (those ``rw`` may change); the others are
    kept as they are rather than copied — every pass copied every statement, a large part of
    a view's compile."""
    return [dataclasses.replace(s, query=s.query.transform(rw))
            if isinstance(s, Compute) and any(map(touches, s.query.walk())) else s
            for s in statements]


def _null_test(n: exp.Expr) -> bool:
    return isinstance(n, exp.Is) and isinstance(n.expression, exp.Null)


def images_not_null(statements: Sequence[Statement], change: str,
                    not_null: Iterable[str]) -> list[Statement]:
    """``x IS NULL`` is false for a column ``x`` of change table ``change`` that is the image
    (``c__pre`` or ``c__post``) of a NOT NULL column ``c``: for a change table read as its
    log's rows, unfolded (``log_images``: each row one image, its values under both names),
    never for a folded one (a deleted row's ``__post`` values are NULL). SUM's and AVG's
    non-null counts test their arguments in every log row: over NOT NULL columns each count
    becomes the row count, which PostgreSQL computes once for all of them (TPC-H SF 1 Q1's
    delta aggregate of 17k line-item images, by hand: 15.7 → 13.1 ms)."""
    names = {f(c) for c in not_null for f in (pre_name, post_name)}
    if not names:
        return list(statements)

    def rw(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Select):
            return node
        from_ = node.args.get("from_")
        aliases = {src.alias_or_name for src in (
            from_.this if from_ else None, *(j.this for j in node.args.get("joins") or []))
            if isinstance(src, exp.Table) and src.name == change and not src.args.get("db")}
        if not aliases:
            return node

        def false(n: exp.Expr) -> exp.Expr:
            # (``x IS NOT NULL`` is sqlglot's ``Is`` with ``negate``: TRUE, not FALSE — fuzz
            # seed 39300, a count under ``WHERE c IS NOT NULL`` that never changed)
            if isinstance(n, exp.Is) and isinstance(n.expression, exp.Null) and \
                    isinstance(n.this, exp.Column) and n.this.table in aliases and \
                    n.this.name in names:
                return exp.true() if n.args.get("negate") else exp.false()
            return n

        return node.transform(false)

    return _rewritten(statements, rw, lambda n: _null_test(n) and isinstance(n.this, exp.Column)
                      and n.this.name in names)


def semijoins_through_keys(statements: Sequence[Statement]) -> list[Statement]:
    """Each top-level ``EXISTS`` conjunct of a computed relation's WHERE that reaches a stored
    relation only through another table (``_implied_semijoin``: a row of the i-diff whose key
    joins a base table's row whose key is in a cache) has that inner semijoin moved out, on
    the i-diff's own column: an equivalent condition the planner can apply first, through the
    cache, before probing the base table (TPC-H Q20: 979 changed line items probed `partsupp`
    one by one, 4,970 buffers, before its part's membership in the cache of the view's parts —
    1% of parts — was tested). Moved, not repeated beside the EXISTS: the planner multiplies
    the two semijoins' selectivities as if they were independent — Q20's line items of the
    cached parts, 760, estimated at 7, were read through `partsupp` first, 10 ms, to meet a
    one-row i-diff that drives the same statement in 0.08 ms."""
    def rw(node: exp.Expr) -> exp.Expr:
        where = node.args.get("where") if isinstance(node, exp.Select) else None
        if where is None:
            return node
        parts = A.conjuncts(where.this)
        moved = {id(p): x for p in parts if isinstance(p, exp.Exists)
                 and (x := _implied_semijoin(p)) is not None}
        if not moved:
            return node
        new = node.copy()
        new.set("where", exp.Where(this=A.conjoin(
            [y for p in parts for y in ((moved[id(p)][1], moved[id(p)][0]) if id(p) in moved
                                        else (p.copy(),))])))
        return new

    return _rewritten(statements, rw, lambda n: isinstance(n, exp.Exists))


def distinct_conjuncts(statements: Sequence[Statement]) -> list[Statement]:
    """A WHERE's conjuncts each once: composing the rules can repeat one (Table 13's
    ``Input_l_post ⋉_I Δu_l`` reads the touched rows of an input already restricted to them:
    ``EXISTS(Δu …) AND φ AND EXISTS(Δu …)``), and the planner takes the repeat for a second,
    independent condition — its selectivity squared — which turns the plan away from the
    small i-diff that should drive it. (A view's conditions hold no volatile function, which
    the frontend refuses: a condition twice is the condition once.)"""
    def rw(node: exp.Expr) -> exp.Expr:
        where = node.args.get("where") if isinstance(node, exp.Select) else None
        if where is None:
            return node
        parts = A.conjuncts(where.this)
        kept: list[exp.Expr] = []
        for p in parts:
            if not any(p == k for k in kept):
                kept.append(p)
        if len(kept) == len(parts):
            return node
        new = node.copy()
        new.set("where", exp.Where(this=A.conjoin([k.copy() for k in kept])))
        # (its subqueries too: transform does not visit a node it replaced; rw leaves ``new``)
        return new.transform(rw)

    return _rewritten(statements, rw, lambda n: isinstance(n, exp.Where)
                      and isinstance(n.this, exp.And))


def strict_columns(e: exp.Expr) -> list[exp.Column] | None:
    """The columns of ``e`` when ``e`` is NULL exactly when one of them is: ``e`` built from
    columns, non-NULL literals and strict arithmetic (+, −, ×, /, %, unary minus, CAST — each
    NULL on a NULL operand, never on non-NULL ones: it errors instead); else None."""
    if isinstance(e, exp.Column):
        return [e]
    if isinstance(e, exp.Literal):
        return []
    if isinstance(e, (exp.Paren, exp.Neg)) or type(e) is exp.Cast:  # (not TryCast: NULL)
        return strict_columns(e.this)
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Mod)) or \
            (isinstance(e, exp.Div) and not e.args.get("safe")):
        left, right = strict_columns(e.left), strict_columns(e.right)
        return None if left is None or right is None else left + right
    return None


def strict_null_tests(statements: Sequence[Statement]) -> list[Statement]:
    """``x IS NULL`` over a strict arithmetic ``x`` (``strict_columns``) becomes the
    disjunction of its columns' NULL tests: the same truth value without computing ``x``.
    SUM's and AVG's non-null counts test their argument in every delta row, and the argument
    is often a product of numerics (TPC-H Q1: ``l_extendedprice * (1 - l_discount) * (1 +
    l_tax)``, computed twice per log row: the fold's grouping of 17k line-item images 23.5 →
    18.5 ms)."""
    def rw(node: exp.Expr) -> exp.Expr:
        if not (isinstance(node, exp.Is) and isinstance(node.expression, exp.Null)):
            return node
        x = node.this
        while isinstance(x, exp.Paren):
            x = x.this
        cols = strict_columns(x)
        if isinstance(x, exp.Column) or not cols:
            return node
        unique = list({col.sql("postgres"): col for col in cols}.values())
        anynull = exp.paren(exp.or_(*[exp.Is(this=col.copy(), expression=exp.Null())
                                      for col in unique]))
        # (``x IS NOT NULL``: sqlglot's ``Is`` with ``negate``)
        return exp.Not(this=anynull) if node.args.get("negate") else anynull

    return _rewritten(statements, rw, lambda n: rw(n) is not n)


def _rename_tables(e: exp.Expr, names: Mapping[str, str]) -> exp.Expr:
    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table) and not node.args.get("db") and node.name in names:
            new = node.copy()
            new.set("this", exp.to_identifier(names[node.name], quoted=True))
            return new
        return node

    return e.transform(rw)


def rename_temporaries(statements: Sequence[Statement], names: Mapping[str, str]
                       ) -> list[Statement]:
    out: list[Statement] = []
    for s in statements:
        if isinstance(s, Compute):
            renamed = any(isinstance(n, exp.Table) and not n.args.get("db") and n.name in names
                          for n in s.query.walk())  # (else kept, not copied)
            out.append(dataclasses.replace(s, name=names.get(s.name, s.name),
                                           query=_rename_tables(s.query, names) if renamed
                                           else s.query))
        else:
            out.append(dataclasses.replace(
                s, diff=names.get(s.diff, s.diff),
                snapshot=names.get(s.snapshot, s.snapshot) if s.snapshot else None))
    return out


def reads(s: Statement) -> set[str]:
    """Relations a statement reads (inlined CTE bodies included)."""
    if isinstance(s, Apply):
        return {s.diff}
    return {tb.name for tb in s.query.find_all(exp.Table)}


@dataclass(frozen=True)
class Inlined:
    """A statement with the relations inlined into it as CTEs (in dependency order)."""

    statement: Statement
    ctes: tuple[tuple[str, exp.Expr], ...] = ()

    def reads(self) -> frozenset[str]:
        return self._reads

    @functools.cached_property
    def _reads(self) -> frozenset[str]:  # (the trees are not changed once inlined)
        out = reads(self.statement)
        for _, q_ in self.ctes:
            out |= {tb.name for tb in q_.find_all(exp.Table)}
        return frozenset(out - {n for n, _ in self.ctes})


def _cheap(item: Inlined) -> bool:
    """A projection or filter of one relation — or of such CTEs inlined into it, a chain
    down to one relation: as a CTE it costs no more than reading that relation, and the
    planner estimates it from that relation's statistics. A join stays a
    table: with its true size known (and empty ones skipped), a many-way Δ-script statement
    is not planned over guesses (BSMA Q*1: 3.7 s inlined against 1.2 s)."""
    s = item.statement
    return isinstance(s, Compute) and len(item.reads()) == 1 and \
        all(q_.find(exp.Join) is None for q_ in (s.query, *(q_ for _, q_ in item.ctes)))


def inline_single_use(statements: Sequence[Statement], keep: frozenset[str]) -> list[Inlined]:
    """Cheap computes read by exactly one later statement become CTEs of it, when no APPLY in
    between changes a relation they read (``keep``: relations that stay materialized)."""
    items = [Inlined(s) for s in statements]
    i = 0
    while i < len(items):
        s = items[i].statement
        if isinstance(s, Compute) and s.name not in keep and _cheap(items[i]):
            readers = [j for j in range(i + 1, len(items)) if s.name in items[j].reads()]
            if len(readers) == 1:
                r = readers[0]
                mine = items[i].reads()
                between = [x.statement for x in items[i + 1:r]]
                if not any(isinstance(b, Apply) and (b.target in mine or b.snapshot in mine)
                           for b in between):
                    target = items[r]
                    items[r] = Inlined(target.statement,
                                       (*items[i].ctes, (s.name, s.query), *target.ctes))
                    del items[i]
                    continue
        i += 1
    return items


# --------------------------------------------------------------------------- types without =

# PostgreSQL has no equality operator for these: the Δ-script's comparisons of a value before
# and after a change, and the duplicate elimination of its UNION / EXCEPT / DISTINCT, compare
# them as text (json and xml keep their input text, so the cast back is exact)
NO_EQUALITY = frozenset({exp.DataType.Type.JSON, exp.DataType.Type.XML})
Fix = Callable[[exp.Expr], exp.Expr]
Types = dict[str, dict[str, exp.DataType]]
TypesOf = Mapping[str, Mapping[str, exp.DataType]]  # (read only: ``RelationTypes`` too)


def _same(e: exp.Expr) -> exp.Expr:
    return e


def _dtype(server_type: str) -> exp.DataType:
    try:
        return exp.DataType.build(server_type, dialect="postgres")
    except Exception:  # noqa: BLE001 - a type sqlglot does not know: compared as is
        return exp.DataType.build("unknown")


def _no_equality(t: exp.DataType | None) -> bool:
    return t is not None and t.this in NO_EQUALITY


@functools.lru_cache(maxsize=4096)
def _type_text(t: exp.DataType) -> str:
    return t.sql("postgres")


def _annotated(tree: exp.Expr, types: Mapping[str, Mapping[str, exp.DataType]]) -> exp.Expr | None:
    """A typed copy of ``tree``; ``types``: column types of the relations it may read (only
    those it names go into the schema; ``RelationTypes`` types them when asked)."""
    from sqlglot.optimizer.annotate_types import annotate_types

    read = {t.name for t in tree.find_all(exp.Table)}
    try:
        return annotate_types(tree.copy(), schema={
            k: {c: _type_text(t) for c, t in types[k].items()} for k in read if k in types},
            dialect="postgres")
    except Exception:  # noqa: BLE001 - not annotatable: left as it is
        return None


def _leaves(q_: exp.Expr) -> list[exp.Select]:
    while isinstance(q_, exp.Subquery):
        q_ = q_.this
    if isinstance(q_, exp.SetOperation):
        return _leaves(q_.left) + _leaves(q_.right)
    return [q_] if isinstance(q_, exp.Select) else []


def _star_expanded(leaf: exp.Select, types: Mapping[str, Mapping[str, exp.DataType]]) -> None:
    """A ``SELECT *`` of one relation whose columns ``types`` knows, with the star replaced by
    them in order (in place): a branch of a set operation whose json/xml columns the others
    compare as text casts its own too (``b EXCEPT SELECT * FROM snapshot``: EXCEPT types text
    and json cannot be matched — fuzz seed 55008)."""
    frm = leaf.args.get("from_")
    if len(leaf.expressions) != 1 or not isinstance(leaf.expressions[0], exp.Star) \
            or leaf.args.get("joins") or frm is None or not isinstance(frm.this, exp.Table) \
            or frm.this.args.get("db") or frm.this.name not in types:
        return
    table = frm.this
    ref = table.alias_or_name
    leaf.set("expressions", [exp.column(c, table=ref, quoted=True) for c in types[table.name]])


def comparable(tree: exp.Expr, types: Mapping[str, Mapping[str, exp.DataType]]) -> exp.Expr:
    """``tree`` with values of types that have no ``=`` (json, xml) compared as text: in
    comparisons, and in the duplicate elimination of UNION / EXCEPT / INTERSECT / DISTINCT,
    whose text output is cast back. ``types``: column types of the relations it reads."""
    t = _annotated(tree, types)
    if t is None:
        return tree
    text = exp.DataType.build("text")
    for cmp in list(t.find_all(exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ)):
        if isinstance(cmp.parent, (exp.Update, exp.OnConflict)):
            continue  # an assignment
        if _no_equality(cmp.left.type) or _no_equality(cmp.right.type):
            cmp.set("this", exp.cast(cmp.this, text))
            cmp.set("expression", exp.cast(cmp.expression, text))
    for w in list(t.find_all(exp.Window)):  # partitions: by equal text
        parts = w.args.get("partition_by") or []
        if any(_no_equality(p.type) for p in parts):
            w.set("partition_by", [exp.cast(p, text) if _no_equality(p.type) else p
                                   for p in parts])
    # every deduplicating query with such an output column, innermost first
    plans: list[tuple[exp.Query, dict[int, exp.DataType], list[str]]] = []
    for node in t.find_all(exp.Select, exp.SetOperation):
        dedup = (isinstance(node, exp.SetOperation) and node.args.get("distinct")) or \
            (isinstance(node, exp.Select) and isinstance(node.args.get("distinct"), exp.Distinct)
             and not node.args["distinct"].args.get("on"))
        parent = node.parent
        if not dedup or (isinstance(parent, exp.SetOperation) and parent.args.get("distinct")):
            # (a branch of a deduplicating set operation: handled with it; a DISTINCT branch
            # of a UNION ALL deduplicates on its own)
            continue
        outs = node.selects
        bad: dict[int, exp.DataType] = {}
        for leaf in _leaves(node):  # any branch typing a column json/xml makes it json/xml
            for i, o in enumerate(leaf.selects):
                if o.type is not None and _no_equality(o.type):
                    bad.setdefault(i, o.type)
        names = node.named_selects
        if bad and len(names) == len(outs) and all(names):
            plans.append((node, bad, names))
    for node, bad, names in reversed(plans):
        for leaf in _leaves(node):
            _star_expanded(leaf, types)  # (a SELECT * of a relation: its columns, cast too)
            projections = list(leaf.expressions)
            for i in bad:
                if i < len(projections):
                    p = projections[i]
                    projections[i] = exp.alias_(exp.cast(p.unalias(), text), names[i],
                                                quoted=True)
            leaf.set("expressions", projections)
        alias = "__idivm_eq"
        outer = exp.select(*[
            exp.alias_(exp.cast(exp.column(n, alias, quoted=True), bad[i]), n, quoted=True)
            if i in bad else exp.column(n, alias, quoted=True) for i, n in enumerate(names)])
        with_ = node.args.get("with_")
        inner = node.copy()
        inner.set("with_", None)
        outer = outer.from_(exp.Subquery(this=inner, alias=exp.TableAlias(
            this=exp.to_identifier(alias, quoted=True))))
        if with_ is not None:
            outer.set("with_", with_.copy())
        if node is t:
            t = outer
        else:
            node.replace(outer)
    return t


class RelationTypes(Mapping[str, dict[str, exp.DataType]]):
    """Column types of every relation the compiled code reads, typed when first asked for:
    a relation's query is annotated (``_annotated``, sqlglot's ``annotate_types``: the
    costliest part of a compile when done for every statement) only when a rewrite needs its
    types (``comparable`` where json/xml columns are read, ``cut_unions``), after the
    relations it reads, in the script's order."""

    def __init__(self, known: Types, queries: Sequence[tuple[str, exp.Expr]]) -> None:
        self._known = known
        self._queries = dict(queries)
        self._order = [n for n, _ in queries]

    def __getitem__(self, name: str) -> dict[str, exp.DataType]:
        if name not in self._known:
            if name not in self._queries:
                raise KeyError(name)
            self._type(name)
        return self._known[name]

    def __contains__(self, name: object) -> bool:
        return name in self._known or name in self._queries

    def __iter__(self) -> Iterator[str]:
        yield from self._known
        yield from (n for n in self._order if n not in self._known)

    def __len__(self) -> int:
        return len(self._known) + sum(1 for n in self._order if n not in self._known)

    def _type(self, name: str) -> None:
        needed: set[str] = set()
        stack = [name]
        while stack:  # the untyped relations ``name`` reads, transitively
            n = stack.pop()
            if n in needed or n in self._known:
                continue
            needed.add(n)
            stack.extend(t.name for t in self._queries[n].find_all(exp.Table)
                         if t.name in self._queries)
        for n in self._order:  # each after those it reads
            if n in needed and n not in self._known:
                a = _annotated(self._queries[n], self)
                self._known[n] = {} if a is None or not isinstance(a, exp.Query) else {
                    c: (o.type or exp.DataType.build("unknown"))
                    for c, o in zip(a.named_selects, a.selects, strict=False)}


def relation_types(plan: Plan, names: Mapping[str, str], tables: Mapping[str, Table],
                   column_types: Mapping[str, Mapping[str, str]],
                   statements: Sequence[Statement]) -> RelationTypes:
    """Column types of every relation the compiled code reads: base tables (as the server
    names them), change tables, the stored relations and the temporaries (these typed when
    first read: ``RelationTypes``)."""
    out: Types = {t: {c: _dtype(v) for c, v in column_types[t].items()} for t in tables}
    for t, tb in tables.items():
        col = out[t]
        change = {k: col[k] for k in tb.primary_key if k in col}
        for suffix in ("__pre", "__post"):
            change.update({c + suffix: col[c] for c in tb.non_key_columns if c in col})
        change.update({HAS_PRE: exp.DataType.build("boolean"),
                       HAS_POST: exp.DataType.build("boolean")})
        out[names[change_table(t)]] = change
    queries: list[tuple[str, exp.Expr]] = [(m.name, q_) for m, q_ in plan.materialize_queries()]
    queries += [(s.name, s.query) for s in statements if isinstance(s, Compute)]
    return RelationTypes(out, queries)


# --------------------------------------------------------------------------- code generation


def _with(ctes: Sequence[tuple[str, exp.Expr]]) -> exp.With | None:
    if not ctes:
        return None
    return exp.With(expressions=[
        exp.CTE(this=q_.copy(), alias=exp.TableAlias(this=exp.to_identifier(n, quoted=True)))
        for n, q_ in ctes])


def _statement_sql(item: Inlined, fix: Fix = _same) -> str:
    s = item.statement
    w = _with(item.ctes)
    if isinstance(s, Compute):
        query = s.query.copy()
        if w is not None:
            query.set("with_", w)
        # every tree here is this function's own copy: neither builder nor generator copies it
        return fix(exp.insert(query, exp.table_(exp.to_identifier(s.name, quoted=True)),
                              copy=False)).sql("postgres", copy=False)
    tree = render(s, "postgres")
    if w is not None:
        if isinstance(tree, exp.Insert):
            tree.expression.set("with_", w)
        else:
            tree.set("with_", w)
    text = fix(tree).sql("postgres", copy=False)
    if s.kind == "replace":  # PostgreSQL has no INSERT OVERWRITE: empty the table first
        text = f"{exp.delete(exp.to_identifier(s.target, quoted=True)).sql('postgres')};\n" \
               f"    {text}"
    return text


GONE, KEPT = "__idivm_gone", "__idivm_kept"


def _deleting_into_snapshot(item: Inlined, fix: Fix = _same) -> str:
    """A Δ- APPLY that fills its snapshot (``deletes_fill_snapshots``): the DELETE returns
    the rows it deletes, which go into the snapshot unless there already; the count of rows
    deleted into ``idivm__n``, of rows the snapshot gained into ``idivm__kept``."""
    s = item.statement
    assert isinstance(s, Apply) and s.snapshot is not None
    cols = [exp.column(k, table="v", quoted=True) for k in s.snapshot_columns]
    delete = render(s, "postgres")
    assert isinstance(delete, exp.Delete)
    delete.set("returning", exp.Returning(expressions=cols))
    snap = exp.table_(exp.to_identifier(s.snapshot, quoted=True))
    new_rows = exp.except_(exp.select("*").from_(exp.to_identifier(GONE, quoted=True)),
                           exp.select("*").from_(snap.copy()))
    insert = fix(exp.insert(new_rows, snap.copy()))
    insert.set("returning", exp.Returning(expressions=[exp.Literal.number(1)]))

    def count(name: str) -> exp.Expr:
        return exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(
            exp.to_identifier(name, quoted=True)))

    ctes = [*((n, q_) for n, q_ in item.ctes), (GONE, delete), (KEPT, insert)]
    query = exp.select(count(GONE), count(KEPT))
    query.set("with_", _with(ctes))
    return f"{fix(query).sql('postgres', copy=False)} INTO idivm__n, idivm__kept"


def _outside(query: exp.Expr) -> exp.Expr:
    """``query`` (the caller's own copy, rewritten in place) as SQL outside the function
    (creating a scratch relation from its shape): the watermark variable a read of the log
    compares with becomes a typed NULL."""
    def rw(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table and node.name == PREV:
            return exp.Cast(this=exp.Null(), to=exp.DataType.build("pg_snapshot", udt=True))
        return node
    return query.transform(rw, copy=False)


def _comment(text: str) -> str:
    return "\n".join(f"-- {line.strip()}" for line in text.splitlines() if line.strip())


def _pruned(item: Inlined, empty: frozenset[str]) -> Inlined:
    """The statement with the tests over ``empty`` relations folded away (``prune_empty``)."""
    s = item.statement
    if isinstance(s, Compute):
        s = dataclasses.replace(s, query=prune_empty(s.query, empty))
    return Inlined(s, tuple((n, prune_empty(q_, empty)) for n, q_ in item.ctes))


@dataclass(frozen=True)
class Run:
    """A statement's PL/pgSQL, and where the count of rows it wrote is right after it: the
    ``ROW_COUNT`` of ``GET DIAGNOSTICS`` (``rows`` None), or a variable (a prepared
    statement's run, ``_prepared``, leaves no ``ROW_COUNT``)."""

    text: str
    rows: str | None = None

    def count_into(self, var: str) -> str:
        """PL/pgSQL setting ``var`` to the rows the statement wrote."""
        if self.rows is None:
            return f"GET DIAGNOSTICS {var} = ROW_COUNT;"
        return f"{var} := {self.rows};"


def _variants(item: Inlined, changes: Sequence[str], rels: Mapping[str, Relation],
              most: int = 3, fix: Fix = _same, types: TypesOf | None = None) -> Run:
    """The statement, and a variant per subset of the base tables' change tables it reads
    being empty (up to ``most`` tables), picked at run time by their row counts: the old
    runtime's pruning, compiled. With no changes to friendlist, BSMA Q*1's pre-state
    ``friendlist − Δ ∪ pre-images`` is just friendlist, which the planner can probe."""
    gated = _exists_over(item, rels)
    if len(gated) > most or (gated and len(changes) > most):
        return Run(_dynamic(item, gated, rels, fix, types), PREPARED_ROWS)
    whole = _statement_sql(item, fix) + ";"
    if not changes or len(changes) > most:
        return Run(whole)
    branches: list[str] = []
    seen = {whole}
    for mask in range(1, 2 ** len(changes)):
        empty = frozenset(c for k, c in enumerate(changes) if mask >> k & 1)
        text = _statement_sql(_pruned(item, empty), fix) + ";"
        if text in seen:
            continue
        seen.add(text)
        cond = " AND ".join(f"{rels[c].counter} {'=' if c in empty else '>'} 0"
                            for c in changes)
        branches.append(f"{'IF' if not branches else 'ELSIF'} {cond} THEN\n  {text}")
    if not branches:
        return Run(whole)
    return Run("\n".join(branches) + f"\nELSE\n  {whole}\nEND IF;")


def scratch_only(item: Inlined, rels: Mapping[str, Relation]) -> bool:
    """A statement that joins scratch relations only (i-diffs, snapshots: tables without
    indexes, filled by this run). A nested loop over them rescans its inner input once per
    outer row, and the planner picks one when a chain of anti-joins on composite IDs has
    driven its estimate to one row (TPC-H Q9's cache snapshot: 237 outer rows × a 6k-row
    i-diff, 1.4M rows compared, 125 ms); hashing costs a pass over each input. Such
    statements run with ``enable_nestloop`` off (``_hashed``)."""
    s = item.statement
    read = item.reads()
    return isinstance(s, Compute) and len(read) > 1 and read <= rels.keys()


def _hashed(text: str, merge: bool = False) -> str:
    """``text`` run with nested-loop joins disabled for it alone (and with ``merge``, merge
    joins too), by SET LOCAL, put back to the caller's value after (an error rolls the
    setting back with the transaction). Not a plan-cache key: each run plans or reuses the
    statement under the same setting. For the statements ``scratch_only`` finds and for the
    folds of the logs."""
    joins = ("mergejoin", "nestloop") if merge else ("nestloop",)  # (nested loops off last)
    # put back by an assignment: a PERFORM would set ROW_COUNT, which the caller reads next
    return ("".join(f"PERFORM set_config('enable_{j}', 'off', true);\n" for j in joins) + text
            + "".join(f"\nidivm__setting := set_config('enable_{j}', idivm__{j}, true);"
                      for j in joins))


def _noted(kind: str, label: str, value: str) -> str:
    """Append ``label`` and ``value`` to the run's ``kind`` record (``rows``: an i-diff's row
    count, ``applied``: an APPLY's, ``secs``: a statement's seconds): two PL/pgSQL arrays,
    which an append extends in place, made the returned jsonb once at the end
    (``_records_jsonb``). A jsonb appended to per statement is copied whole each time: 150
    statements' records cost 4.4 ms that way, 0.9 ms as arrays."""
    return (f"idivm__{kind}_k := idivm__{kind}_k || {lit(label)}::text; "
            f"idivm__{kind}_v := idivm__{kind}_v || ({value});")


def _seconds_noted(label: str) -> str:
    """The seconds since ``idivm__ts`` as ``label``'s (``_noted``)."""
    return _noted("secs", label, "extract(epoch FROM clock_timestamp() - idivm__ts)::float8")


RECORDS = (("rows", "bigint"), ("applied", "bigint"), ("secs", "float8"))


def _records_jsonb(kind: str) -> str:
    """A ``_noted`` record as the jsonb the run returns: an object of counts (a label noted
    twice keeps its last value; the counts as text, as ``jsonb_object`` makes them) or, for
    ``secs``, ``{"labels": [...], "seconds": [...]}`` in run order
    (``MaintenanceStats.of``). Plain functions of the arrays, no subquery: the RETURN is a
    simple expression (an aggregate over ``unnest`` of each, ordered, was a query of its own:
    ~0.2 ms of a 4 ms refresh, TPC-H SF 0.1 Q20)."""
    k, v = f"idivm__{kind}_k", f"idivm__{kind}_v"
    if kind == "secs":
        return f"jsonb_build_object('labels', to_jsonb({k}), 'seconds', to_jsonb({v}))"
    return f"jsonb_object({k}, {v}::text[])"


def _skipped_zeros(kind: str, labels: Sequence[str]) -> str:
    """The ``kind`` records (``_noted``) of the Δ-script's guarded statements before any of
    them runs: each label at 0, put first when the script starts, so that a count a run of
    the statement notes comes later and wins (``_records_jsonb`` keeps a label's last value).
    A 0 noted by each skipped statement was two array appends in PL/pgSQL per statement:
    0.32 ms of a 1.9 ms function run of TPC-H SF 0.1 Q2 over three changed suppliers (its
    117 statements). Both arrays are constants PL/pgSQL folds when it first plans them."""
    k, v = f"idivm__{kind}_k", f"idivm__{kind}_v"
    typ = dict(RECORDS)[kind]
    labels = list(dict.fromkeys(labels))
    return (f"{k} := ARRAY[{', '.join(lit(x) for x in labels)}]::text[] || {k}; "
            f"{v} := array_fill(0::{typ}, ARRAY[{len(labels)}]) || {v};")


def _delta_costs(text: str) -> str:
    """``text`` (the Δ-script's branch) planned at ``DELTA_CPU_TUPLE_COST``: SET LOCAL before
    it, the caller's value put back after (an error rolls the setting back with the
    transaction). Each statement is planned under one setting whichever run plans it: the
    Δ-script's under this one, the recomputation's under the caller's. Its statements join
    an i-diff of a few thousand IDs with stored relations of tens of thousands of rows or
    more, which the default prices as one scan and hash of the relation rather than a probe
    per ID (the plan-shape test ``test_a_larger_batch_still_probes_by_ids``)."""
    return (f"PERFORM set_config('cpu_tuple_cost', {lit(str(DELTA_CPU_TUPLE_COST))}, true);\n"
            + text +
            "\nidivm__setting := set_config('cpu_tuple_cost', idivm__cputuple, true);")


def one_time_guards(tree: exp.Expr, counters: Mapping[str, str],
                    tests: Mapping[str, str] | None = None) -> exp.Expr:
    """Each SELECT that inner-joins scratch relations (or derived tables over them) also
    tests their row counts (``counters``: an expression per relation; ``_dynamic`` makes them
    marks it replaces by TRUE or FALSE at run time, so PostgreSQL drops what an empty i-diff
    feeds when it plans). An empty i-diff joined to the post-state of a large subtree
    otherwise costs that subtree whenever the planner puts the i-diff on the inner side of a
    nested loop (TPC-H Q20: 73 ms of a 128 ms refresh for a branch of no nation changes).
    Always equivalent: the SELECT yields nothing when one of them is empty. Not in the
    statements planned once per session (a test of a PL/pgSQL variable makes a statement with
    no other parameter a custom plan, planned again at every run: TPC-H Q8's 8-way join 36 →
    73 ms), not inside a CTE (its readers carry its test), and not per scanned relation: a
    constant FALSE costs planning (Q8's EXECUTEd statement: 28 ms without tests, 90 ms with one
    per scanned i-diff, 71 ms with those of derived tables, 10 ms were they all TRUE)."""
    ctes = {c.alias: c.this for c in tree.find_all(exp.CTE)}  # (inlined single-use reads)

    def nonempty(e: exp.Expr) -> exp.Expr | None:
        """A condition that holds when ``e`` may have rows (None: no such test)."""
        if isinstance(e, exp.Table):
            if e.args.get("db"):
                return None
            if e.name in counters:
                return exp.GT(this=exp.column(counters[e.name]),
                              expression=exp.Literal.number(0))
            return nonempty(ctes[e.name]) if e.name in ctes else None
        if isinstance(e, exp.Subquery):
            return nonempty(e.this)
        if isinstance(e, exp.Union):
            left, right = nonempty(e.left), nonempty(e.right)
            return exp.paren(exp.or_(left, right)) if left is not None and right is not None \
                else None
        if isinstance(e, exp.Intersect):
            return A.conjoin([x for x in (nonempty(e.left), nonempty(e.right)) if x is not None])
        if isinstance(e, exp.Except):
            return nonempty(e.left)
        if isinstance(e, exp.Select):
            return A.conjoin(required(e) + tested(e))
        return None

    def tested(node: exp.Select) -> list[exp.Expr]:
        """The counters of the relations its WHERE tests with EXISTS (a conjunct that is a
        mark of ``tests``: EXISTS over an empty relation is FALSE)."""
        where = node.args.get("where")
        rels = [tests[c.name] for c in A.conjuncts(where.this) if isinstance(c, exp.Column)
                and not c.table and c.name in tests] if where is not None and tests else []
        return [exp.GT(this=exp.column(counters[r]), expression=exp.Literal.number(0))
                for r in rels if r in counters]

    def inner_items(node: exp.Select) -> list[exp.Expr]:
        """What the SELECT inner-joins: none when it yields rows without them (an aggregate
        without GROUP BY, the padded side of a RIGHT or FULL join)."""
        if not node.args.get("group") and any(e.find(exp.AggFunc) for e in node.expressions):
            return []
        joins = node.args.get("joins") or []
        if any(j.side for j in joins if j.side != "LEFT"):
            return []
        frm = node.args.get("from_")
        return ([frm.this] if frm is not None else []) + [j.this for j in joins if not j.side]

    def required(node: exp.Select) -> list[exp.Expr]:
        return [x for x in map(nonempty, inner_items(node)) if x is not None]

    def derived(node: exp.Select) -> list[exp.Expr]:
        """The tests of the derived tables and CTEs it inner-joins, not of the scratch
        relations it scans (an empty one costs nothing to scan, and a FALSE costs planning)."""
        items = [i for i in inner_items(node) if isinstance(i, exp.Subquery) or i.name in ctes]
        return [x for x in map(nonempty, items) if x is not None]

    def rw(node: exp.Expr) -> exp.Expr:
        # not inside a CTE: the SELECTs reading the CTE carry its test
        if isinstance(node, exp.Select) and node.find_ancestor(exp.CTE) is None:
            tests = derived(node)
            if tests:
                node.where(*[t.copy() for t in tests], copy=False)
        return node

    return tree.transform(rw, copy=False)


@dataclass(frozen=True)
class Cut:
    """A UNION of an EXECUTEd statement rendered as ``mark``, filled at run time with the
    branches that may have rows: ``branches`` are (the PL/pgSQL condition a branch needs,
    None when it needs none; its SQL); ``separator`` joins them."""

    mark: str
    separator: str
    branches: tuple[tuple[str | None, str], ...]

    def fill(self) -> str:
        """PL/pgSQL putting the live branches in place of ``mark`` (the first branch when
        none is: it yields no rows, as the union would)."""
        parts = ", ".join(f"CASE WHEN {cond} THEN {lit(sql)} END" if cond else lit(sql)
                          for cond, sql in self.branches)
        return (f"idivm__sql := replace(idivm__sql, {lit(self.mark)}, coalesce(nullif("
                f"concat_ws({lit(self.separator)}, {parts}), ''), "
                f"{lit(self.branches[0][1])}));")


def _passed_union(tree: exp.Expr) -> tuple[exp.Subquery, exp.Union] | None:
    """The UNION an INSERT's SELECT reads as its only FROM item (through derived tables
    read the same way), with the derived table holding it."""
    node = tree.expression if isinstance(tree, exp.Insert) else None
    while isinstance(node, exp.Select):
        frm = node.args.get("from_")
        if frm is None or node.args.get("joins") or not isinstance(frm.this, exp.Subquery):
            return None
        sub = frm.this
        if isinstance(sub.this, exp.Union):
            return sub, sub.this
        node = sub.this
    return None


def _is_mark(c: exp.Column) -> bool:
    return not c.table and c.name.startswith("idivm__") and c.name.endswith("__")


def _union_branches(union: exp.Union) -> list[exp.Select] | None:
    """The SELECTs of a chain of UNIONs of one kind (DISTINCT or ALL), None for another
    shape."""
    distinct = bool(union.args.get("distinct"))
    out: list[exp.Select] = []

    def flatten(e: exp.Expr) -> bool:
        if isinstance(e, exp.Union) and bool(e.args.get("distinct")) == distinct and \
                not any(e.args.get(k) for k in ("order", "limit", "offset", "with_")):
            return flatten(e.left) and flatten(e.right)
        if not isinstance(e, exp.Select):
            return False
        out.append(e)
        return True

    return out if flatten(union) else None


def _same_types(branches: Sequence[exp.Select]) -> bool:
    """Every output column typed alike (and known) in every annotated branch, none a bare
    NULL or string (untyped, PostgreSQL resolves them from the other branches)."""
    rows = [[x for x in b.expressions] for b in branches]
    if len({len(r) for r in rows}) != 1:
        return False
    for col in zip(*rows, strict=True):
        if any(isinstance(x.unalias(), exp.Null) or
               (isinstance(x.unalias(), exp.Literal) and x.unalias().is_string) for x in col):
            return False
        kinds = {x.type.sql("postgres") if x.type is not None else None for x in col}
        if len(kinds) != 1 or None in kinds or any(
                x.type is not None and x.type.this in (exp.DataType.Type.UNKNOWN,
                                                       exp.DataType.Type.NULL) for x in col):
            return False
    return True


def cut_unions(tree: exp.Expr, needs: Callable[[exp.Expr], str | None],
               cuts: list[Cut], types: TypesOf) -> exp.Expr:
    """``tree`` (an INSERT … SELECT) with the UNION its SELECT reads (``_passed_union``)
    rendered as a mark, appended to ``cuts`` with its branches, each with what its WHERE
    needs (``needs``: the PL/pgSQL condition of one conjunct made of marks, None when it
    needs nothing): at run time the branches of empty i-diffs are left out of the text
    rather than planned under a FALSE (TPC-H Q8's 8-way statement: 53 → 27 ms of planning
    with its nation and region branches gone). Only where every branch's output columns
    have the same types (``types``: the relations' column types; ``_same_types`` on the
    annotated statement), so that the union's values and types do not depend on which
    branches remain."""
    found = _passed_union(tree)
    if found is None:
        return tree
    sub, union = found
    branches = _union_branches(union)
    if branches is None or len(branches) < 2:
        return tree
    needed = []
    for b in branches:
        where = b.args.get("where")
        conds = [x for x in map(needs, A.conjuncts(where.this))
                 if x is not None] if where is not None else []
        needed.append(" AND ".join(f"({x})" for x in conds) or None)
    if all(cond is None for cond in needed):
        return tree
    # (typed last: annotating the statement is the costliest step, and most have no union
    # whose branches need anything)
    annotated = _annotated(tree, types)
    twin = _passed_union(annotated) if annotated is not None else None
    typed = _union_branches(twin[1]) if twin is not None else None
    if typed is None or len(branches) != len(typed) or not _same_types(typed):
        return tree
    out = [(cond, "(" + b.sql("postgres") + ")") for cond, b in zip(needed, branches, strict=True)]
    mark = f"idivm__union{len(cuts)}__"
    cuts.append(Cut(mark, " UNION " if union.args.get("distinct") else " UNION ALL ",
                    tuple(out)))
    sub.set("this", exp.column(mark))
    return tree


def _exists_over(item: Inlined, rels: Mapping[str, Relation]) -> set[str]:
    """The temporary relations a statement tests with EXISTS (directly over them)."""
    out = set()
    for q_ in [item.statement.query] if isinstance(item.statement, Compute) else []:
        for e in q_.find_all(exp.Exists):
            src = e.this.args.get("from_") if isinstance(e.this, exp.Select) else None
            if src is not None and isinstance(src.this, exp.Table) and src.this.name in rels \
                    and not e.this.args.get("joins"):
                out.add(src.this.name)
    return out


def _dynamic(item: Inlined, gated: set[str], rels: Mapping[str, Relation],
             fix: Fix = _same, types: TypesOf | None = None) -> str:
    """A statement testing many i-diffs, run as dynamic SQL: each EXISTS over an i-diff is a
    placeholder replaced at run time by the test, or by FALSE when that i-diff is empty, and
    PostgreSQL's constant folding drops what only an empty i-diff fed (the branches of a
    snapshot union, NOT EXISTS over nothing): the runtime pruning of ``prune_empty``, with
    the text rendered once. Each text the run arrives at is planned once a session, as a
    prepared statement (``_prepared``): its rows into ``PREPARED_ROWS``."""
    s = item.statement
    assert isinstance(s, Compute)
    tests: dict[str, tuple[str, str]] = {}

    def rw(node: exp.Expr) -> exp.Expr:
        src = node.this.args.get("from_") if isinstance(node, exp.Exists) and \
            isinstance(node.this, exp.Select) else None
        if src is None or not isinstance(src.this, exp.Table) or src.this.name not in gated \
                or node.this.args.get("joins"):
            return node
        mark = f"idivm__test{len(tests)}__"  # no mark is a prefix of another
        tests[mark] = (src.this.name, node.sql("postgres"))
        return exp.column(mark)

    # the one-time guards of ``one_time_guards`` as marks, each replaced by TRUE or FALSE
    nonzero = {n: f"idivm__nz{k}__" for k, n in enumerate(rels)}  # no mark prefixes another
    counted = {mark: rels[rel].counter for rel, mark in nonzero.items()}

    def needs(e: exp.Expr) -> str | None:
        """What a conjunct of marks needs at run time (None: nothing known)."""
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.Column) and _is_mark(e) and e.name in tests:
            return f"{rels[tests[e.name][0]].counter} > 0"  # EXISTS over an i-diff
        if isinstance(e, exp.GT) and isinstance(e.this, exp.Column) and e.this.name in \
                counted and e.expression == exp.Literal.number(0):
            return f"{counted[e.this.name]} > 0"
        if isinstance(e, (exp.And, exp.Or)):
            left, right = needs(e.left), needs(e.right)
            if isinstance(e, exp.Or):
                return f"({left} OR {right})" if left is not None and right is not None \
                    else None
            both = [x for x in (left, right) if x is not None]
            return f"({' AND '.join(both)})" if both else None
        return None

    cuts: list[Cut] = []

    def guarded(e: exp.Expr) -> exp.Expr:
        out = one_time_guards(fix(e), nonzero, {m: rel for m, (rel, _) in tests.items()})
        return cut_unions(out, needs, cuts, types) if types is not None else out

    text = _statement_sql(Inlined(dataclasses.replace(s, query=s.query.transform(rw)),
                                  item.ctes), guarded)
    lines = [f"idivm__sql := {lit(text)};", *(c.fill() for c in cuts)]
    text = " ".join([text, *(sql for c in cuts for _, sql in c.branches)])
    for mark, (rel, test) in tests.items():
        lines.append(f"idivm__sql := replace(idivm__sql, {lit(mark)}, CASE WHEN "
                     f"{rels[rel].counter} > 0 THEN {lit('(' + test + ')')} ELSE 'FALSE' END);")
    for rel, mark in nonzero.items():
        if mark in text:
            lines.append(f"idivm__sql := replace(idivm__sql, {lit(mark + ' > 0')}, CASE WHEN "
                         f"{rels[rel].counter} > 0 THEN 'TRUE' ELSE 'FALSE' END);")
    lines.append(_prepared("idivm__sql", PREPARED_ROWS))
    return "\n".join(lines)


PREPARED_PREFIX = "idivm_"  # + the md5 of the statement's text: a session's prepared statement
PREPARED_ROWS = "idivm__n"  # where ``_prepared`` leaves the rows its statement wrote
PREPARED_CTE = "idivm__w"  # the prepared statement's CTE: the INSERT, its rows counted


def prepared_text(name: str, sql: str) -> str:
    """The PREPARE ``_prepared`` runs for the INSERT ``sql`` (what ``auto_explain`` reports
    as the statement's text at each of its runs)."""
    return (f"PREPARE {name} AS WITH {PREPARED_CTE} AS ({sql} RETURNING 1) "
            f"SELECT count(*) FROM {PREPARED_CTE}")


def _prepared(sql_var: str, rows_var: str) -> str:
    """PL/pgSQL running the INSERT in ``sql_var`` (text) as the session's prepared statement
    of that text — prepared by the first run that arrives at the text, each later run
    executing the plan kept with it — and putting the rows it wrote into ``rows_var``.
    A dynamic statement's EXECUTE was planned at every run: at TPC-H SF 1 (interleaved A/B,
    the same batches) Q20's Δ+ statement 6.1 → 5.2 ms and its refresh 34.5 → 31.2, Q8's
    Input_post snapshot 3.5 → 2.1 (a warm session plans these in 1–2 ms; a cold one in 5–11,
    once either way). A prepared plan lives as a static statement's does: PostgreSQL plans it again
    after an ANALYZE (``_analyze``) or a TRUNCATE of a relation it reads, and the statement
    runs under the same settings at every run (``_hashed``, ``_delta_costs``). The EXECUTE
    of a prepared statement leaves no ``ROW_COUNT``: the statement returns the count of the
    rows its INSERT returned. Prepared statements are the session's (named ``PREPARED_PREFIX``
    and the text's md5, listed in ``pg_prepared_statements``; a DISCARD or DEALLOCATE just
    makes the next run prepare again); a recompiled view's texts name other relations."""
    return (f"idivm__pname := {lit(PREPARED_PREFIX)} || md5({sql_var});\n"
            "IF NOT EXISTS (SELECT FROM pg_catalog.pg_prepared_statements p "
            "WHERE p.name = idivm__pname) THEN\n"
            f"  EXECUTE format({lit(prepared_text('%I', '%s'))}, idivm__pname, {sql_var});\n"
            "END IF;\n"
            f"EXECUTE format('EXECUTE %I', idivm__pname) INTO {rows_var};")


def _branches(q_: exp.Expr) -> list[exp.Expr]:
    if isinstance(q_, exp.Union):
        return _branches(q_.left) + _branches(q_.right)
    return [q_]


def _branched(item: Inlined, r: Relation, label: str, rels: Mapping[str, Relation],
              companion: str, fix: Fix = _same) -> str:
    """A snapshot filled one semi-join at a time, each run only if its i-diff holds rows (an
    empty i-diff's branch would still count in the planner's estimate of the whole UNION),
    without the rows an earlier branch brought."""
    assert isinstance(item.statement, Compute)
    lines = [_comment(item.statement.comment), "idivm__ts := clock_timestamp();",
             f"{r.counter} := 0;"]
    for b in _branches(item.statement.query):
        inputs = sorted({rels[t.name].counter for t in b.find_all(exp.Table)
                         if t.name in rels} | {rels[n].counter for n, _ in item.ctes
                                               if n in rels})
        query = exp.except_(b.copy(), exp.select("*").from_(
            exp.table_(exp.to_identifier(r.name, quoted=True))))
        w = _with(item.ctes)
        if w is not None:
            query.set("with_", w)
        ins = exp.insert(query, exp.table_(exp.to_identifier(r.name, quoted=True)))
        guard = " OR ".join(f"{c} > 0" for c in inputs) or "true"
        lines.append(f"IF {guard} THEN\n  {fix(ins).sql('postgres')};\n"
                     f"  GET DIAGNOSTICS idivm__n = ROW_COUNT;\n"
                     f"  {r.counter} := {r.counter} + idivm__n;\nEND IF;")
    lines += [_analyze(r, companion),
              _noted("rows", label, r.counter), _seconds_noted(label)]
    return "\n".join(lines)


def _analyze(r: Relation, companion: str) -> str:
    """Statistics for a filled scratch relation when its size moved by more than 4× from what
    the planner sees (or it sees more than twice its rows, and 1,000 more): plans follow the
    batch, and a run like the last one keeps the sessions' cached plans (an ANALYZE
    invalidates them). The check is the companion's ``stats_stale`` (``fingerprint_source``):
    a call PL/pgSQL evaluates as a simple expression, where the same check written inline (a
    query over ``pg_class`` reading the counter) was planned anew at each of a session's first
    five runs — 0.15–0.3 ms a relation, ~5 ms of a TPC-H SF 1 Q22 refresh. Read through its
    name, found on the function's search path (the companion schema first)."""
    return (f"IF {r.counter} > 0 AND {q(companion)}.{STATS_STALE}({lit(q(r.name))}::regclass, "
            f"{r.counter}) THEN\n  ANALYZE {q(r.name)};\nEND IF;")


def _emptied(r: Relation) -> str:
    """A filled scratch relation emptied at the end of the run. A DELETE keeps the cached
    plans, but scratch relations are never vacuumed and a DELETE's space is not reused (only
    VACUUM records it as free): each run's rows go to new pages, so the relation grows by a
    run's rows every run, and every scan of it reads the empty pages too (~0.5 ms per 1,000).
    Past ``SCRATCH_TRUNCATE_BYTES`` and ``SCRATCH_BYTES_PER_ROW`` per row of this run (some
    ten runs like it), it is truncated instead: a new file, and the statements reading it are
    planned again at their next run — rarely, so that a long-lived session keeps its
    relations near one run's size (a view of a few changes per run used to grow its scratch
    relations a page per run up to 8 MB, ~1,000 runs)."""
    return (f"IF {r.counter} > 0 THEN\n"
            f"  IF pg_relation_size({lit(q(r.name))}) > greatest({SCRATCH_TRUNCATE_BYTES}, "
            f"{r.counter} * {SCRATCH_BYTES_PER_ROW}::bigint) THEN\n"
            f"    TRUNCATE {q(r.name)};\n  ELSE\n    DELETE FROM {q(r.name)};\n  END IF;\n"
            "END IF;")


DECISION_ARG = "idivm__decision"  # the maintenance function's argument
PRUNE_ARG = "idivm__log_rows"  # the prune function's argument: log rows consumed per table


def _decision_block(name: str, refresh: str, planned: str) -> str:
    """``idivm__choice`` and ``idivm__reason`` from the function's argument: the decision the
    caller made (idivm's maintainer evaluates ``refresh_cost.decide`` for an ``auto`` view), or
    without one the Δ-script — for an ``auto`` view too: the cost model is not evaluated in
    SQL — or, for a view planned as a recomputation, that recomputation."""
    arg = DECISION_ARG
    if planned == "recompute":
        default, why = "recompute", "strategy='recompute': the view is recomputed"
    elif refresh == "auto":
        default, why = "id", ("strategy='auto', called without a decision (the cost model is "
                              "evaluated by idivm's maintainer): the Δ-script")
    else:
        default, why = "id", f"strategy={refresh!r}: the Δ-script"
    lines = [
        f"idivm__choice := CASE jsonb_typeof({arg}) WHEN 'string' THEN {arg} #>> '{{}}' "
        f"WHEN 'object' THEN {arg} ->> 'choice' END;",
        f"idivm__reason := CASE jsonb_typeof({arg}) WHEN 'object' THEN {arg} ->> 'reason' END;",
        f"IF idivm__choice IS NULL THEN\n  idivm__choice := {lit(default)};\n"
        f"  idivm__reason := coalesce(idivm__reason, {lit(why)});\n"
        "ELSIF idivm__choice NOT IN ('id', 'recompute') AND NOT (idivm__choice = 'auto' AND "
        f"{arg} ? 'max_changes') THEN\n"
        "  RAISE EXCEPTION 'idivm: the refresh of view % can be id or recompute, not % (auto "
        "comes from idivm''s maintainer, with the cost model''s threshold)', "
        f"{lit(name)}, idivm__choice USING ERRCODE = '{BAD_CHOICE}';\nEND IF;",
        "idivm__reason := coalesce(idivm__reason, 'asked for: ' || idivm__choice);"]
    if planned == "recompute":  # (its Δ-script is the recomputation)
        lines.append("idivm__choice := 'recompute';")
    return "\n".join(lines)


def _auto_block(name: str, companion: str) -> str:
    """An ``auto`` decision (``refresh_cost.threshold``: ``{"choice": "auto", "max_changes":
    N | null, "reason_id", "reason_recompute", "history_id"}``) applied to the log rows just
    counted: the Δ-script for at most N, the recomputation above — the cost model's choice
    with no round trip for the count. It was made from the view's refresh history up to row
    ``history_id``: a newer row (another session's refresh, a row written by hand) refuses it
    before anything runs (``STALE_DECISION``: the maintainer decides again)."""
    arg = DECISION_ARG
    hist = f"{q(companion)}.{q(HISTORY)}"
    limit = f"({arg} ->> 'max_changes')::bigint"
    return f"""IF idivm__choice = 'auto' AND idivm__logrows = 0 THEN
  idivm__choice := 'id';
  idivm__reason := 'no changes pending: nothing to refresh';
ELSIF idivm__choice = 'auto' THEN
  IF {arg} ? 'history_id' AND (SELECT max(h.id) FROM {hist} AS h WHERE h.view = {lit(name)})
      IS DISTINCT FROM ({arg} ->> 'history_id')::bigint THEN
    RAISE EXCEPTION 'idivm: the refresh history of view % changed since its refresh was decided',
      {lit(name)} USING ERRCODE = '{STALE_DECISION}';
  END IF;
  IF {limit} IS NULL OR idivm__logrows <= {limit} THEN
    idivm__choice := 'id';
    idivm__reason := format('%s change-log rows, maintained up to %s: %s', idivm__logrows,
      coalesce({limit}::text, 'any number'), {arg} ->> 'reason_id');
  ELSE
    idivm__choice := 'recompute';
    idivm__reason := format('%s change-log rows, more than the %s maintained: %s',
      idivm__logrows, {limit}, {arg} ->> 'reason_recompute');
  END IF;
END IF;"""


def _row_text(alias: str, columns: Sequence[str]) -> str:
    """A row of ``alias`` as text: rows compared by their text need no equality operator (json,
    xml), and values that are equal but print differently (numeric 1.0 and 1.00) are
    replaced by the recomputed one, as the view's query would show it."""
    return f"ROW({', '.join(f'{q(alias)}.{q(c)}' for c in columns)})::text"


def checked_setting(tag: str) -> str:
    """The session setting in which the code tagged ``tag`` keeps its last catalog check
    (``ddl_epoch.checked``)."""
    return f"idivm.checked_{tag}"


def warm_setting(tag: str) -> str:
    """The session setting a view's code sets after its first run in the session."""
    return f"idivm.warm_{tag}"


def _recomputed(tag: str, k: int) -> str:
    """The scratch relation the recomputing branch fills with stored relation ``k``'s rows."""
    return f"__iv{tag}_r{k}"


def _recompute_block(plan: Plan, companion: str, tag: str, view_only: bool = False) -> str:
    """The recomputing branch: every stored relation (caches bottom-up, then the view) is
    computed anew from its query over the base tables (and the caches below it, recomputed
    first) — or, ``view_only``, the view alone from the base tables (``Plan.store_query``:
    the caches are neither read nor written, and are then stale) — into its scratch relation
    (``_recomputed``: created with the code, like the Δ-script's — no temporary table
    created, committed and planned again per run), then brought to it by deleting the rows
    the recomputation lacks and inserting the rows the relation lacks — so only rows that
    changed are written, and the logging triggers of a view read by other views log exactly
    its net changes (an update as the deletion of the old row and the insertion of the new:
    the fold nets them). Runs only if log rows are pending; the caller moves the watermark
    as the Δ-script's branch does."""
    queries = list(enumerate(plan.materialize_queries()))
    if view_only:
        k, (m, _) = queries[-1]
        queries = [(k, (m, plan.store_query()))]
    lines = []
    for k, (m, query) in queries:
        r = Relation(_recomputed(tag, k), f"recompute {m.name}", "idivm__n")
        tmp = q(r.name)
        target = f"{q(companion)}.{q(m.name)}"
        cols = ", ".join(q(c) for c in m.columns)
        new, old = "__new", "__old"
        lines.append(f"""idivm__ts := clock_timestamp();
INSERT INTO {tmp} ({cols}) {query.sql('postgres')};
GET DIAGNOSTICS idivm__n = ROW_COUNT;
{_analyze(r, companion)}
DELETE FROM {target} AS {q(old)} WHERE NOT EXISTS (SELECT FROM {tmp} AS {q(new)}
  WHERE {_row_text(new, m.columns)} = {_row_text(old, m.columns)});
GET DIAGNOSTICS idivm__n = ROW_COUNT;
{_noted("applied", f"delete recomputed→{m.name}", "idivm__n")}
INSERT INTO {target} ({cols}) SELECT {cols} FROM {tmp} AS {q(new)}
  WHERE NOT EXISTS (SELECT FROM {target} AS {q(old)}
                    WHERE {_row_text(old, m.columns)} = {_row_text(new, m.columns)});
GET DIAGNOSTICS idivm__n = ROW_COUNT;
{_noted("applied", f"insert recomputed→{m.name}", "idivm__n")}
DELETE FROM {tmp};
IF pg_relation_size({lit(tmp)}) > {SCRATCH_TRUNCATE_BYTES} THEN TRUNCATE {tmp}; END IF;
{_seconds_noted(f"recompute {m.name}")}""")
    return "IF idivm__logrows > 0 THEN\n" + indent("\n".join(lines), 2) + "\nEND IF;"


REBUILD_REASON = ("; the caches were stale (a recomputation had refreshed the view alone): "
                  "every stored relation recomputed")


def _history_block(name: str, companion: str, ran: str, relations: Sequence[str]) -> str:
    """A run that consumed log rows records itself in ``refresh_history`` (in the maintenance
    transaction: rolled back with it) — what ran, the log rows, the seconds so far, the
    tables' sizes, the reason. Every ``HISTORY_TRIM``-th run that read the logs (the view's
    ``runs``, counted by the same runs: at most that many rows come between two trims) trims
    the view's history to its newest ``HISTORY_ROWS`` rows, its newest recomputation and its
    newest rebuild (the cost model's measurements)."""
    comp = q(companion)
    hist = f"{comp}.{q(HISTORY)}"
    rels = f"ARRAY[{', '.join(lit(r) for r in relations)}]::text[]"
    return f"""IF idivm__logrows > 0 THEN
  idivm__base := {comp}.relation_rows({rels});
  INSERT INTO {hist} (view, strategy, changes, seconds, base_rows, reason, cold)
  VALUES ({lit(name)}, {ran}, idivm__logrows, extract(epoch FROM clock_timestamp() - idivm__t0),
          idivm__base, idivm__reason, idivm__cold) RETURNING id INTO idivm__hid;
END IF;
IF idivm__runs % {HISTORY_TRIM} = 0 THEN
  DELETE FROM {hist} AS h WHERE h.view = {lit(name)}
    AND h.id <= (SELECT k.id FROM {hist} AS k WHERE k.view = {lit(name)}
                 ORDER BY k.id DESC OFFSET {HISTORY_ROWS} LIMIT 1)
    AND h.id IS DISTINCT FROM (SELECT max(r.id) FROM {hist} AS r WHERE r.view = {lit(name)}
                               AND r.strategy IN ('recompute', 'create'))
    AND h.id IS DISTINCT FROM (SELECT max(r.id) FROM {hist} AS r WHERE r.view = {lit(name)}
                               AND r.strategy = 'rebuild');
END IF;"""


def visible(plan: Plan) -> dict[str, exp.Expr]:
    """Per base table, the condition (on its columns) every row image the view can see meets
    (``planner.log_filter``); none for a table whose changes are checked against the declared
    ones (the checks read every change), nor for a recomputed view."""
    if plan.strategy == "recompute":
        return {}
    return {t: f for t, f in log_filters(plan.root, [m.nid for m in plan.materialized]).items()
            if not plan.undeclared_changes(t)}


@dataclass(frozen=True)
class FoldFilter:
    """A table's fold filter (``fold_visible``) in two forms where it has semijoins of stored
    σ: ``hashed`` reads every key of the stored relations (a hash join: for a log that is not
    small against them); ``probe`` looks each distinct value of the log's pending rows up in
    the stored relation's key index, and hashes those found with S's changed keys, an array
    ``arrays`` fill first (PL/pgSQL variable, its type, the query) — for a log small against
    them, whose refresh then costs in proportion to its rows, not to the stored relations'
    (None: a key of several columns).
    ``stored``: the stored relations read (their ``pg_class`` names)."""

    hashed: exp.Expr
    probe: exp.Expr | None = None
    arrays: tuple[ChangedKeys, ...] = ()
    stored: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChangedKeys:
    """The keys of S's pending log rows a probing fold filter reads, filled first by
    ``query`` (one row: ``m``, ``c``) into two PL/pgSQL arrays of ``type``: ``meeting`` — of
    the images that meet φ (the keys that are in σ_φ(S) before or after the batch among the
    changed ones) — and ``changed``, every one, which the probe leaves out (their log rows
    decide: a line item of an order inserted or deleted in the batch is not looked up)."""

    meeting: str
    changed: str
    type: str
    query: exp.Select


def _clustered(filtering: Collection[int], key: Sequence[str]
               ) -> Callable[[exp.Expr], exp.Expr]:
    """A semijoin of a σ read from its table (``filtering``) kept only where T's columns it
    reads are part of T's key, not all of it — T's log rows come several to a value (line
    items by their order's key): each value is probed once, so a log whose rows each have a
    value of their own (orders by their customer: TPC-H SF 1 Q22, 3.3k orders log rows of
    ~2.9k customers, read twice and probed for 28% kept) pays a probe per row to leave out
    rows that cost about as much; elsewhere TRUE."""
    def rw(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, KeysOf) or node.nid not in filtering:
            return node
        cols = {c.name for c in node.expressions if isinstance(c, exp.Column)}
        whole = len(cols) == len(node.expressions)
        return node if whole and cols < set(key) else exp.true()
    return rw


def fold_visible(plan: Plan, schema: str, companion: str, prev: exp.Expr,
                 key_types: Mapping[str, Mapping[str, str]] | None = None
                 ) -> dict[str, FoldFilter]:
    """``visible`` with the semijoins of the σ over a scan that joins read by their whole key
    (``planner.log_filter.fold_filters``), stored or chosen as filters (``plan.selective``),
    for the fold: a ``KeysOf`` of a stored σ is ``(c…) IN (the stored relation's keys UNION
    ALL the keys of S's log rows pending since ``prev`` that meet φ)`` (``FoldFilter.hashed``),
    or ``c IN (the distinct c of the pending log rows with a stored row of key c UNION ALL S's
    changed keys)`` (``FoldFilter.probe``; ``key_types``: the server types of S's columns,
    for the array); of a σ read from S, the probing form with S's rows that meet φ, always
    (``unhashed``), and only where the table's fold has no stored σ's semijoin."""
    if plan.strategy == "recompute":
        return {}
    nodes = {n.nid: n for n in A.walk(plan.root)}
    stored = {m.nid: m for m in plan.materialized if m.role != "view" and not m.nullable}
    cached = [m.nid for m in plan.materialized]
    # the σ whose keys filter the fold though not stored: read from their table itself
    filtering = {c.nid for c in filter_candidates(plan.root, plan.infos)
                 if c.signature in plan.selective and c.nid not in stored}
    keys = {nid: m.key for nid, m in stored.items()} | {
        nid: tuple(plan.infos[nid].ids) for nid in filtering}
    found = {t: f.transform(_clustered(filtering, plan.catalog.tables[t].primary_key))
             for t, f in fold_filters(plan.root, cached, keys, filtering).items()}

    def scan_of(nid: int) -> tuple[A.Select, A.Scan]:
        sel = nodes[nid]
        assert isinstance(sel, A.Select) and isinstance(sel.child, A.Scan)
        return sel, sel.child

    def held_key(nid: int) -> str:
        """The key's first column as the held relation names it."""
        return keys[nid][0] if nid in stored else scan_of(nid)[1].base_of(keys[nid][0])

    def held_rel(nid: int) -> str:
        """The relation the held keys are read from (its ``pg_class`` name)."""
        return (q(companion) + "." + q(stored[nid].name) if nid in stored
                else q(schema) + "." + q(scan_of(nid)[1].table))

    def parts(node: KeysOf) -> tuple[exp.Select, exp.Select, A.Scan]:
        sel, scan = scan_of(node.nid)
        phi = base_named(scan, sel.predicate)
        if node.nid in stored:  # the stored σ's rows: its keys
            m = stored[node.nid]
            held = exp.select(*[exp.column(k, table="s", quoted=True) for k in m.key]).from_(
                exp.Table(this=exp.to_identifier(m.name, quoted=True),
                          db=exp.to_identifier(companion, quoted=True),
                          alias=exp.TableAlias(this=exp.to_identifier("s"))))
        else:  # σ_φ(S) read from S: the keys of its rows that meet φ
            held = exp.select(*[exp.column(scan.base_of(k), table="s", quoted=True)
                                for k in keys[node.nid]]).from_(
                exp.Table(this=exp.to_identifier(scan.table, quoted=True),
                          db=exp.to_identifier(schema, quoted=True),
                          alias=exp.TableAlias(this=exp.to_identifier("s")))).where(
                phi.transform(lambda n: exp.column(n.name, table="s", quoted=True)
                              if isinstance(n, exp.Column) else n))
        log = log_ref(schema, scan.table)
        log.set("alias", exp.TableAlias(this=exp.to_identifier("g")))
        # the changed keys: of S's pending images that meet φ (an image failing it is of
        # no row of σ_φ(S), before or after)
        phi_g = phi.transform(lambda n: exp.column(n.name, table="g", quoted=True)
                              if isinstance(n, exp.Column) else n)
        changed = exp.select(*[exp.column(scan.base_of(k), table="g", quoted=True)
                               for k in keys[node.nid]]).from_(log).where(exp.and_(
            pending_predicate(prev, exp.column(XID, table="g", quoted=True)), exp.paren(phi_g)))
        return held, changed, scan

    def hashed(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, KeysOf):
            return node
        held, changed, _ = parts(node)
        cols = node.expressions
        return exp.In(this=cols[0] if len(cols) == 1 else exp.Tuple(expressions=cols),
                      query=exp.Subquery(this=exp.union(held, changed, distinct=False)))

    def array(node: KeysOf) -> ChangedKeys:
        """The PL/pgSQL arrays of S's changed keys the probing form reads."""
        assert key_types is not None
        _, changed, scan = parts(node)
        key = keys[node.nid][0]
        typ = f"{key_types[scan.table][scan.base_of(key)]}[]"
        # (``changed`` is the keys' SELECT over the pending rows AND φ: its parts, as
        # aggregates of one pass over the pending rows)
        where = changed.args["where"].this
        assert isinstance(where, exp.And)  # (``parts``: the pending rows AND φ)
        pending, phi_g = where.left, where.right
        col = changed.expressions[0]

        def agg(e: exp.Expr) -> exp.Expr:
            return exp.Coalesce(this=e, expressions=[exp.cast(exp.Literal.string("{}"), typ)])

        query = exp.select(
            exp.alias_(agg(exp.Filter(this=exp.ArrayAgg(this=col.copy()),
                                      expression=exp.Where(this=phi_g.copy()))), "m"),
            exp.alias_(agg(exp.ArrayAgg(this=exp.Distinct(expressions=[col.copy()]))), "c")
        ).from_(changed.args["from_"].this.copy()).where(pending.copy())
        return ChangedKeys(f"idivm__ks{node.nid}", f"idivm__kc{node.nid}", typ, query)

    def probe(t: str) -> Callable[[exp.Expr], exp.Expr]:
        """The probing form of ``t``'s fold filter: the distinct values of the column among
        t's pending log rows, each looked up once in the stored relation's key index (a
        subplan per value, never a hash of every stored key), hashed for the log rows to
        find theirs in (TPC-H SF 1 Q4, 11.7k line-item log rows of ~4.8k orders: a lookup
        per log row, 11.0–11.2 ms a fold, → 9.2)."""
        def rw(node: exp.Expr) -> exp.Expr:
            if not isinstance(node, KeysOf):
                return node
            held, _, _ = parts(node)
            key, col = held_key(node.nid), node.expressions[0]
            # (the value over the log's own columns, as the fold's filter reads them)
            bare = col.transform(lambda n: exp.column(n.name, quoted=True)
                                        if isinstance(n, exp.Column) else n)
            log = log_ref(schema, t)
            log.set("alias", exp.TableAlias(this=exp.to_identifier("h")))
            values = (exp.select(exp.alias_(bare.copy(), "k", quoted=True)).distinct()
                      .from_(log).where(pending_predicate(prev)))
            keys_of = array(node)
            # (OFFSET 0: a subplan per value, never hashed — the point is not reading every
            # stored key)
            here = held.where(exp.EQ(this=exp.column(key, table="s", quoted=True),
                                     expression=exp.column("k", table="d", quoted=True))
                              ).offset(0)
            # a value that is a changed key of S is not looked up: its log rows decide
            # (``listed``) — TPC-H's line items of orders inserted or deleted in the batch
            # (a NOT IN a hashed subplan; the keys are a primary key's: never NULL)
            unchanged = exp.Not(this=exp.In(
                this=exp.column("k", table="d", quoted=True), query=exp.Subquery(
                    this=exp.select(exp.Unnest(expressions=[exp.column(keys_of.changed)])))))
            found = (exp.select(exp.column("k", table="d", quoted=True))
                     .from_(exp.Subquery(this=values, alias=exp.TableAlias(
                         this=exp.to_identifier("d"))))
                     .where(exp.and_(unchanged, exp.Exists(this=here))))
            # and S's changed keys (the array the function filled), in the same hashed set: a
            # = ANY(array) is a scan of the array per log row once PL/pgSQL has cached the
            # plan with the array as a parameter (TPC-H SF 1 Q4's ~350 keys: 9 → 17 ms)
            listed = exp.select(exp.Unnest(expressions=[exp.column(keys_of.meeting)]))
            return exp.In(this=col.copy(), query=exp.Subquery(
                this=exp.union(found, listed, distinct=False)))
        return rw

    def unhashed(t: str) -> Callable[[exp.Expr], exp.Expr]:
        """``t``'s fold filter of σ read from their tables: probed, always (hashing their keys
        is a scan of the table, a recomputation's read: TPC-H SF 1 Q8, 1.5M orders read for
        16k line-item log rows, 29 → 577 ms), or left out (TRUE) where they cannot be (a key
        of several columns)."""
        probed = probe(t)

        def rw(node: exp.Expr) -> exp.Expr:
            if not isinstance(node, KeysOf) or node.nid in stored:
                return hashed(node)
            return probed(node) if key_types is not None and len(node.expressions) == 1 \
                else exp.true()
        return rw

    out: dict[str, FoldFilter] = {}
    for t, f in found.items():
        if plan.undeclared_changes(t):
            continue
        semis = {n.nid: n for n in f.find_all(KeysOf)}
        if not semis:
            out[t] = FoldFilter(f)
            continue
        if any(n in stored for n in semis):
            # the stored σ's semijoins alone (a σ is stored where it keeps at most a tenth of
            # its table: one read from its table, probed for each distinct value of the whole
            # log, would cost more than it leaves out — TPC-H SF 1 Q8, line items of a part
            # the view can see, then of orders of its two years: 35 → 64 ms)
            f = f.transform(lambda n: exp.true() if isinstance(n, KeysOf)
                            and n.nid not in stored else n)
            semis = {n.nid: n for n in f.find_all(KeysOf)}
            probing = key_types is not None and all(len(n.expressions) == 1
                                                    for n in semis.values())
            out[t] = FoldFilter(
                f.transform(hashed), f.transform(probe(t)) if probing else None,
                tuple(array(semis[n]) for n in sorted(semis)) if probing else (),
                tuple(held_rel(n) for n in sorted(semis)))
        else:  # σ read from their tables only: probed
            out[t] = FoldFilter(f.transform(unhashed(t)), None, tuple(
                array(k) for n, k in sorted(semis.items())
                if key_types is not None and len(k.expressions) == 1))
    return out


@deep_trees()
def compile_view(plan: Plan, schema: str, companion: str, tag: str,
                 tables: Mapping[str, Table], fingerprints: Mapping[str, str],
                 column_types: Mapping[str, Mapping[str, str]],
                 sources: Mapping[str, tuple[str, str]] | None = None,
                 refresh: str | None = None, ddl_logged: bool = False) -> Compiled:
    """The view's maintenance and prune functions. ``tables``: each base table as the view
    reads it (key and read columns); ``fingerprints``: what ``table_fingerprint`` returned for
    each at creation (of its ``sources`` relation, if it has one: the stored table of a view
    read as a table); ``column_types``: server type names of those columns; ``refresh``: the
    view's refresh strategy (``auto`` too; default the plan's); ``ddl_logged``: the database
    logs its DDL (``ddl_epoch``), so a session checks the fingerprints again only after some.

    The maintenance function takes the refresh's decision (``{"choice": "id" | "recompute",
    "reason": …}``, or just the choice as a jsonb string; NULL: the Δ-script, or the
    recomputation of a view planned as one): a plan of the Δ-script is compiled with a second
    branch that recomputes every stored relation instead (``_recompute_block``). Either
    branch consumes the pending log rows, and a run that consumed any records itself in the
    companion's ``refresh_history`` in the same transaction (``_history_block``)."""
    name = plan.name
    prefix = f"__iv{tag}_"
    function, prune_function = f"maintain__{tag}", f"prune__{tag}"
    base = sorted(tables)

    names: dict[str, str] = {}
    rels: dict[str, Relation] = {}
    for i, t in enumerate(base):
        names[change_table(t)] = f"{prefix}c{i}"
        rels[names[change_table(t)]] = Relation(names[change_table(t)], t, f"idivm__c{i}")
    for k, s in enumerate(plan.statements):
        if isinstance(s, Compute):
            names[s.name] = f"{prefix}t{k}"

    labels = {v: k for k, v in names.items()}
    no_equality = any(_no_equality(_dtype(column_types[t][c])) for t in base
                      for c in tables[t].column_names if c in column_types[t])
    # change tables read only as sums of per-image contributions (``planner.linear``): the
    # Δ-script reads their pending log rows, unfolded (no fold, no scratch table); not where a
    # table's changes are checked against the declared ones (the checks read the fold)
    summed = frozenset() if no_equality else linear_change_tables(
        plan.statements, {change_table(t): tables[t].primary_key for t in base
                          if not plan.undeclared_changes(t)})
    linear = frozenset(t for t in base if change_table(t) in summed)
    # the log images of each table the view can see: the others are left out of the fold
    seen = {} if no_equality else {t: f for t, f in visible(plan).items() if t in tables}
    # the fold's: with the semijoins of stored σ (not in the linear reads: a Δ-script
    # statement, where the planner's estimate of one pending log row could make a nested
    # loop of them over a scan of another log)
    folded = {} if no_equality else {t: f for t, f in fold_visible(
        plan, schema, companion, exp.column(PREV), column_types).items() if t in tables}

    def pending(t: str, f: exp.Expr | None = None) -> exp.Expr:
        """The pending log rows of ``t`` the view can see (``f``: by that filter)."""
        p = pending_predicate(exp.column(PREV))
        f = seen.get(t) if f is None else f
        return exp.and_(p, exp.paren(f.copy())) if f is not None else p

    source: Sequence[Statement] = plan.statements
    for t in sorted(linear):
        # each log row one image: a mirrored pair of branches reads it once
        source = images_not_null(strict_null_tests(
            merge_image_reads(source, change_table(t), tables[t].primary_key)),
            change_table(t), tables[t].not_null_non_key_columns)
        source = read_from(source, change_table(t), log_images(tables[t], log_ref(schema, t),
                                                               pending(t)))
    statements = rename_temporaries(
        strict_null_tests(distinct_conjuncts(semijoins_through_keys(split_snapshot_or(
            # (the snapshot's EXCEPT compares whole rows: not over values without equality)
            source if no_equality else deletes_fill_snapshots(source))))), names)
    base_changes = {names[change_table(t)] for t in base}
    # snapshots split into per-i-diff branches stay tables filled branch by branch
    branched = frozenset(s.name for s in statements if isinstance(s, Compute)
                         and s.phase == "snapshot" and isinstance(s.query, exp.Union))
    items = inline_single_use(statements, branched)
    for k, it in enumerate(items):
        s = it.statement
        if isinstance(s, Compute):
            rels[s.name] = Relation(s.name, labels[s.name], f"idivm__n{k}")
    fix: Fix = _same
    # (also what cut_unions compares the branches of a union by)
    types = relation_types(plan, names, tables, column_types, statements)
    if no_equality:

        def fix(e: exp.Expr) -> exp.Expr:
            return comparable(e, types)

    decl = [f"{PREV} pg_snapshot;", "idivm__t0 timestamptz := clock_timestamp();",
            "idivm__ts timestamptz;", "idivm__n bigint;", "idivm__kept bigint;",
            "idivm__bad text;",
            "idivm__altered boolean;", "idivm__lost text;", "idivm__k bigint[];",
            "idivm__guard text;", "idivm__checked text;", "idivm__recheck boolean;",
            "idivm__sql text;", "idivm__pname text;",
            "idivm__nestloop text := current_setting('enable_nestloop');",
            "idivm__mergejoin text := current_setting('enable_mergejoin');",
            "idivm__cputuple text := current_setting('cpu_tuple_cost');",
            "idivm__setting text;",
            "idivm__total bigint := 0;", "idivm__folded boolean := false;",
            "idivm__changes jsonb := '{}';",
            *[f"idivm__{kind}_{part} {typ}[] := '{{}}';" for kind, vt in RECORDS
              for part, typ in (("k", "text"), ("v", vt))],
            "idivm__choice text;", "idivm__reason text;", "idivm__logrows bigint := 0;",
            "idivm__log jsonb := '{}';", "idivm__hid bigint;", "idivm__base bigint;",
            "idivm__runs bigint;", "idivm__watermark pg_snapshot;",
            # the session's first run of this code: PL/pgSQL plans each statement then
            f"idivm__cold boolean := current_setting({lit(warm_setting(tag))}, true) "
            "IS DISTINCT FROM 'on';"]
    decl += [f"{r.counter} bigint := 0;" for r in rels.values()]
    logged = {t: f"idivm__l{i}" for i, t in enumerate(base)}  # pending log rows per table
    decl += [f"{v} bigint := 0;" for v in logged.values()]
    refresh = refresh or plan.strategy
    recomputes = plan.strategy != "recompute" and bool(base)  # a second, recomputing branch
    run_label = plan.strategy  # what the Δ-script is: id, tuple or recompute
    cached = recomputes and len(plan.materialized) > 1  # caches below the view
    decl += ["idivm__rebuilt boolean := false;", "idivm__stale boolean := false;",
             "idivm__prune boolean := false;"]

    body: list[str] = []
    body.append(
        "IF current_setting('transaction_isolation') <> 'repeatable read' THEN\n"
        "  RAISE EXCEPTION 'idivm: maintenance of view % must run in a REPEATABLE READ "
        f"transaction (CALL %.maintain(...) sets it up)', {lit(name)}, {lit(q(companion))}\n"
        f"    USING ERRCODE = '{NOT_REPEATABLE_READ}';\nEND IF;")
    body.append(_decision_block(name, refresh, plan.strategy))
    # the base tables must still be what the view was planned over
    if base:  # (where DDL is logged, after a check only once DDL has committed: ddl_epoch)
        check = _catalog_check(name, schema, base, tables, fingerprints, sources or {})
        body.append(ddl_epoch.checked(checked_setting(tag), "idivm__guard", "idivm__checked",
                                      "idivm__recheck", check) if ddl_logged else check)
    if base:  # (a view over no table — SELECT 1 WHERE … — never changes)
        body.append(f"SELECT watermark INTO {PREV} FROM {q(companion)}.log_users "
                    f"WHERE view = {lit(name)} AND tbl = {lit(base[0])};")

    # count the pending log rows of every table (one probe when nothing waits): what this run
    # consumes, whichever branch runs — by the logging statements' counts (``log_counts``, a
    # row a statement), else, for a log its triggers filled before they counted (an idivm
    # before format 32), by its rows. Whether a fold runs never rests on the counts: the
    # newest log row decides, and a count of 0 is checked against the log itself
    prev = exp.column(PREV)
    for t in base:
        # the newest log row by ORDER BY … DESC LIMIT 1, not max(): with statistics from an
        # emptier log (reltuples 0 after a prune, the log grown since) the planner costs
        # max() as an aggregate over a whole index scan of the "one" row — TPC-H SF 0.1 Q1,
        # 51k log rows: 7.2 ms of a 11 ms refresh — where LIMIT 1 is one backward step of
        # the xid index whatever the estimate (a scan and sort are costed at the log's pages)
        newest = exp.select(exp.column(XID, quoted=True)).from_(log_ref(schema, t)).order_by(
            exp.Ordered(this=exp.column(XID, quoted=True), desc=True, nulls_first=True)).limit(1)
        count = exp.select(exp.Count(this=exp.Star())).from_(log_ref(schema, t)).where(
            pending_predicate(prev))
        body.append(
            # the newest log row (a backward scan of the xid index) against the watermark
            f"IF ({newest.sql('postgres')}) >= pg_snapshot_xmin({PREV}) THEN\n"
            # log rows were read (even if they cancel out): the watermark moves past them
            f"  idivm__folded := true;\n"
            f"  {logged[t]} := ({counted(schema, t, prev).sql('postgres')});\n"
            f"  IF {logged[t]} = 0 THEN\n"
            f"    {logged[t]} := ({count.sql('postgres')});\n"
            f"  END IF;\n"
            f"  idivm__logrows := idivm__logrows + {logged[t]};\n"
            f"END IF;\n"
            f"idivm__log := idivm__log || jsonb_build_object({lit(t)}, {logged[t]});")

    # the Δ-script's branch: fold the pending log of every table into its change table
    delta: list[str] = []
    decl_arrays: list[str] = []  # the folds' arrays of changed keys (``FoldFilter.arrays``)
    for t in base:
        r = rels[names[change_table(t)]]
        if t in linear:  # read unfolded by the Δ-script: its log rows are its changes
            delta.append(f"IF {logged[t]} > 0 THEN\n  {r.counter} := {logged[t]};\n"
                         f"  idivm__total := idivm__total + {r.counter};\nEND IF;\n"
                         f"idivm__changes := idivm__changes || "
                         f"jsonb_build_object({lit(t)}, {r.counter});")
            continue
        ff = folded.get(t)

        def fold_into(f: exp.Expr | None, t: str = t, r: Relation = r) -> str:
            # (the keys logged more than once or twice: their images by the filter without
            # the semijoins — those keys passed them, and an image they would drop is one
            # that cannot matter)
            into = exp.table_(exp.to_identifier(r.name, quoted=True))
            fold = fold_by_key(tables[t], log_ref(schema, t), pending(t, f), companion, into,
                               server_types=column_types[t], again=pending(t))
            # hashed: the planner estimates the log's pending rows (one transaction id, past
            # its statistics) at one, and a nested loop of them over the keys logged more
            # often rescans those keys per log row (TPC-H Q8 with a second view's rows kept in
            # the log, when they were the per-key grouping: 12 s for 18k rows)
            text = (_hashed(exp.insert(fold.first, into).sql("postgres") + ";") +
                    f"\nGET DIAGNOSTICS {r.counter} = ROW_COUNT;")
            if fold.rest is None:
                return text
            # the keys logged more often: their fold in, their placeholders out — hashed,
            # merge joins off too: against the log's pending rows estimated at one, a merge
            # join sorted every pending row to meet the few keys (TPC-H SF 1 Q5: 17k line-item
            # log rows sorted for 3 keys, 5.0 of the statement's 6.5 ms)
            return text + (
                f"\nIF EXISTS ({KeyFold.placeholders(into).sql('postgres')}) THEN\n"
                + indent(_hashed(exp.insert(fold.rest, into).sql("postgres") + ";", merge=True),
                         2) +
                f"\n  GET DIAGNOSTICS idivm__n = ROW_COUNT;\n"
                f"  {r.counter} := {r.counter} + idivm__n;\n"
                f"  {KeyFold.drop_placeholders(into).sql('postgres')};\n"
                f"  GET DIAGNOSTICS idivm__n = ROW_COUNT;\n"
                f"  {r.counter} := {r.counter} - idivm__n;\nEND IF;")

        run = fold_into(ff.hashed if ff is not None else None)
        if ff is not None and ff.probe is not None:
            # a log small against the stored relations its semijoins read (fewer than half
            # their rows, by their last ANALYZE): each of its rows finds its key in their
            # index rather than every stored key hashed (TPC-H Q4: 11.5k line-item log rows
            # against 57k stored orders, 53 ms hashed)
            sizes = ", ".join(f"{lit(x)}::regclass" for x in ff.stored)
            run = (f"IF {logged[t]} * 2 < (SELECT min(c.reltuples) FROM pg_class c "
                   f"WHERE c.oid IN ({sizes})) THEN\n"
                   f"{indent(fold_into(ff.probe), 2)}\n"
                   f"ELSE\n{indent(run, 2)}\nEND IF;")
        if ff is not None and ff.arrays:  # S's changed keys, which the probing forms read
            decl_arrays.extend(f"{v} {a.type};" for a in ff.arrays
                               for v in (a.meeting, a.changed))
            run = "\n".join(f"SELECT q.m, q.c INTO {a.meeting}, {a.changed} FROM "
                             f"({a.query.sql('postgres')}) AS q;" for a in ff.arrays) + "\n" + run
        delta.append(
            f"IF {logged[t]} > 0 THEN\n"
            f"  idivm__ts := clock_timestamp();\n"
            f"{indent(run, 2)}\n"
            f"  idivm__total := idivm__total + {r.counter};\n"
            f"{indent(_analyze(r, companion), 2)}\n"
            f"  {_seconds_noted('fold ' + t)}\n"
            f"END IF;\n"
            f"idivm__changes := idivm__changes || jsonb_build_object({lit(t)}, {r.counter});")
        checks = plan.undeclared_changes(t)
        if checks:  # one scan counts every kind of change the plan was not made for
            counts = exp.select(exp.Array(expressions=[
                exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=pred.copy()))
                for _, pred in checks])).from_(exp.to_identifier(r.name, quoted=True))
            lines = [f"IF {r.counter} > 0 THEN",
                     f"  idivm__k := ({fix(counts).sql('postgres')});"]
            for k, (what, _) in enumerate(checks, 1):
                msg = lit(f"% {what}(s) on {t}, but the view {name} was planned without them "
                          "(changes=...)")
                lines.append(f"  IF idivm__k[{k}] > 0 THEN\n    RAISE EXCEPTION {msg}, "
                             f"idivm__k[{k}] USING ERRCODE = '{UNDECLARED_CHANGE}';\n  END IF;")
            lines.append("END IF;")
            delta.append("\n".join(lines))

    # the Δ-script, only if some change is effective
    script: list[str] = []
    # the statements a guard may skip: their records, 0 until a run of theirs notes its
    # count (``_skipped_zeros``), rather than a 0 noted by every skip
    zeros: dict[str, list[str]] = {"rows": [], "applied": []}
    last_filler = {it.statement.snapshot: it.statement for it in items
                   if isinstance(it.statement, Apply) and it.statement.snapshot}
    for it in items:
        s = it.statement
        inputs = sorted(rels[x].counter for x in it.reads() if x in rels)
        guard = " OR ".join(f"{c} > 0" for c in inputs)
        if isinstance(s, Apply) and s.kind == "replace":
            guard = ""
        label = (rels[s.name].label if isinstance(s, Compute)
                 else f"{s.kind} {labels.get(s.diff, s.diff)}→{s.target}")
        ctes = "".join(f"\n-- CTE {labels.get(n, n)}" for n, _ in it.ctes)
        if isinstance(s, Compute) and s.name in branched:
            script.append(_branched(it, rels[s.name], label, rels, companion, fix))
            continue
        changes = sorted(x for x in it.reads() if x in rels and x in base_changes)
        step = _variants(it, changes, rels, fix=fix, types=types) if not (
            isinstance(s, Apply) and s.snapshot) else Run(_deleting_into_snapshot(it, fix) + ";")
        lines = [_comment(s.comment) + ctes, "idivm__ts := clock_timestamp();",
                 _hashed(step.text) if scratch_only(it, rels) else step.text]
        if isinstance(s, Compute):
            r = rels[s.name]
            lines += [step.count_into(r.counter),
                      _analyze(r, companion), _noted("rows", r.label, r.counter)]
        elif s.snapshot:  # (its rows counted as its snapshot's, for the statements it gates)
            r = rels[s.snapshot]
            lines += [f"{r.counter} := {r.counter} + idivm__kept;",
                      _noted("applied", label, "idivm__n")]
        else:
            lines += [step.count_into("idivm__n"),
                      _noted("applied", label, "idivm__n")]
        lines.append(_seconds_noted(label))
        block = "\n".join(lines)
        if guard:
            zeros["rows" if isinstance(s, Compute) else "applied"].append(label)
            block = f"IF {guard} THEN\n{indent(block, 2)}\nEND IF;"
        script.append(block)
        if isinstance(s, Apply) and s.snapshot and s is last_filler[s.snapshot]:
            # the snapshot's statistics, now that the deletes have filled it too
            script.append(_analyze(rels[s.snapshot], companion))
    script[:0] = [_skipped_zeros(kind, labels) for kind, labels in zeros.items() if labels]

    # scratch relations: created with the code, unlogged (nothing in them outlives a run, so
    # nothing to recover after a crash), never autovacuumed (an autovacuum's ANALYZE of the
    # emptied table would make every run re-ANALYZE and re-plan); emptied by the run that
    # filled them (a TRUNCATE gives the table a new file, invalidating the cached plans)
    create_temps = []
    recomputed: list[str] = []
    unlogged = (f"CREATE UNLOGGED TABLE {q(companion)}.{{}} WITH (autovacuum_enabled = false, "
                "toast.autovacuum_enabled = false)")
    for t in base:
        r = rels[names[change_table(t)]]
        tb = tables[t]
        defs = [f"{q(k)} {column_types[t][k]}" for k in tb.primary_key]
        defs += [f"{q(c + suffix)} {column_types[t][c]}" for suffix in ("__pre", "__post")
                 for c in tb.non_key_columns]
        defs += [f"{q(HAS_PRE)} boolean", f"{q(HAS_POST)} boolean"]
        create_temps.append(f"CREATE UNLOGGED TABLE {q(companion)}.{q(r.name)} "
                            f"({', '.join(defs)}) WITH (autovacuum_enabled = false, "
                            "toast.autovacuum_enabled = false);")
        if t not in linear and folds_by_key(tb, column_types[t]):
            # (TPC-H SF 1 Q5's fold of ~16k line-item log rows, views made by the code before
            # and after side by side over 20 batches: 26.5 → 22.3 ms)
            target = exp.table_(exp.to_identifier(r.name, quoted=True),
                                db=exp.to_identifier(companion, quoted=True))
            create_temps.append(KeyFold.placeholder_index(fit(f"{r.name}__logged_more"),
                                                          target, tb.primary_key) + ";")
    for it in items:
        s = it.statement
        if isinstance(s, Compute):
            query = s.query.copy()
            w = _with(it.ctes)
            if w is not None:
                query.set("with_", w)
            create_temps.append(f"{unlogged.format(q(s.name))} AS "
                                f"{fix(_outside(query)).sql('postgres')} WITH NO DATA;")
    if recomputes:  # the recomputing branch's: the stored relations' shapes
        for k, (m, _) in enumerate(plan.materialize_queries()):
            stored = f"{q(companion)}.{q(m.name)}"
            create_temps.append(
                f"{unlogged.format(q(_recomputed(tag, k)))} AS SELECT "
                f"{', '.join(q(c) for c in m.columns)} FROM {stored} WITH NO DATA;")
            recomputed.append(_recomputed(tag, k))
    if base:  # (a view over no table has no change table, nothing to fold or apply)
        first = rels[names[change_table(base[0])]].name
        # analyzed empty: never-analyzed tables are planned as 10 pages (~850 rows), which
        # turns the probes of an empty i-diff into whole scans of the stored relations
        every = ", ".join(f"{q(companion)}.{q(r)}" for r in [*(x.name for x in rels.values()),
                                                                  *recomputed])
        create_temps.append(f"ANALYZE {every};")
        # after the isolation and fingerprint checks: a scratch relation dropped by hand
        # makes the code stale (the maintainer recompiles it, which creates them again)
        body.insert(3, f"IF to_regclass({lit(q(first))}) IS NULL THEN\n"
                    f"  RAISE EXCEPTION 'idivm: the scratch relations of view % are missing', "
                    f"{lit(name)} USING ERRCODE = '{STALE_CODE}';\nEND IF;")

    unfolded = {names[change_table(t)] for t in linear}  # (no scratch rows to delete)
    empty = "\n".join(_emptied(r) for r in rels.values() if r.name not in unfolded)
    script.append(empty)
    delta.append("IF idivm__total > 0 THEN\n" + indent("\n".join(script), 2) + "\nEND IF;")
    delta = [_delta_costs("\n".join(delta))]
    body.append(_auto_block(name, companion))
    views = f"{q(companion)}.views"
    if cached:
        # a recomputation refreshes the view alone, from the base tables, and leaves the
        # caches stale (the registry's ``caches_stale``): the next run that maintains first
        # recomputes every stored relation (a *rebuild*), and only then does the Δ-script
        # run again — it never reads a stale cache
        body.append(f"SELECT caches_stale INTO idivm__stale FROM {views} "
                    f"WHERE name = {lit(name)};")
        rebuilt = ("IF idivm__logrows > 0 THEN\n  idivm__stale := false;\n"
                   "  idivm__rebuilt := true;\n  idivm__reason := idivm__reason || "
                   f"{lit(REBUILD_REASON)};\nEND IF;")
        body.append("IF idivm__choice = 'recompute' THEN\n"
                    + indent(_recompute_block(plan, companion, tag, view_only=True), 2)
                    + "\n  IF idivm__logrows > 0 THEN\n    idivm__stale := true;\n  END IF;"
                    + "\nELSIF idivm__stale THEN\n"
                    + indent(_recompute_block(plan, companion, tag), 2) + "\n"
                    + indent(rebuilt, 2) + "\nELSE\n"
                    + indent("\n".join(delta), 2) + "\nEND IF;")
    elif recomputes:
        body.append("IF idivm__choice = 'recompute' THEN\n"
                    + indent(_recompute_block(plan, companion, tag), 2) + "\nELSE\n"
                    + indent("\n".join(delta), 2) + "\nEND IF;")
    else:
        body.extend(delta)
    ran = lit(run_label)
    if recomputes:  # (a tuple-based Δ-script is recorded as one)
        ran = ("CASE WHEN idivm__rebuilt THEN 'rebuild' WHEN idivm__choice = 'recompute' "
               f"THEN 'recompute' ELSE {lit(run_label)} END")
    # the watermark computed once (consumed() is a SQL function, planned at each call: per
    # row of an UPDATE calling it, one row per table the view reads)
    # whether the procedure is to call the prune function after the commit (one of the logs
    # this run consumed rows of is due: ``changelog.prune_due``, which the prune checks
    # again): most runs are not, and skip its call and subtransaction (0.1–0.2 ms)
    due = prune_due_any(schema, logged, prune_threshold(PRUNE_ROWS_SETTING, PRUNE_ROWS),
                        prune_threshold(PRUNE_XIDS_SETTING, PRUNE_XIDS)) if logged else "false"
    body.append("IF idivm__folded THEN\n"
                f"  idivm__watermark := {q(companion)}.consumed();\n"
                f"  UPDATE {q(companion)}.log_users SET watermark = idivm__watermark "
                f"WHERE view = {lit(name)};\n"
                f"  idivm__prune := {due};\n"
                f"  UPDATE {views} SET last_maintained = now(), runs = runs + 1"
                + (", caches_stale = idivm__stale" if cached else "")
                + f" WHERE name = {lit(name)} RETURNING runs INTO idivm__runs;\nEND IF;")
    relations = [".".join(q(x) for x in (sources or {}).get(t, (schema, t))) for t in base]
    body.append(_history_block(name, companion, ran, relations))
    # the session is warm once the Δ-script has run over changes: PL/pgSQL plans a statement
    # at its first execution, and a recomputation, a rebuild or a run with nothing pending
    # executes none of the Δ-script's (transactional: a run rolled back leaves it cold)
    warm = f"PERFORM set_config({lit(warm_setting(tag))}, 'on', false);"
    body.append(f"IF idivm__total > 0 THEN\n  {warm}\nEND IF;" if recomputes else warm)
    body.append("RETURN jsonb_build_object('view', " + lit(name) + ", 'changes', idivm__changes,"
                f" 'idiff_rows', {_records_jsonb('rows')}, "
                f"'applied_rows', {_records_jsonb('applied')}, "
                f"'statement_seconds', {_records_jsonb('secs')}, 'consumed', idivm__folded, "
                "'prune', idivm__prune, "
                "'log_rows', idivm__log, 'strategy', " + ran + ", "
                "'decision', (CASE jsonb_typeof(idivm__decision) WHEN 'object' THEN "
                "idivm__decision ELSE '{}' END) || jsonb_build_object('choice', idivm__choice, "
                "'reason', idivm__reason), "
                "'history_id', idivm__hid, 'base_rows', idivm__base, 'cold', idivm__cold, "
                "'caches_stale', idivm__stale, "
                "'seconds', extract(epoch FROM clock_timestamp() - idivm__t0));")

    decl += list(dict.fromkeys(decl_arrays))
    # (a variable and a column of one name are an error, whatever the server's
    # plpgsql.variable_conflict says: base-table columns named as variables are refused)
    src = ("#variable_conflict error\nDECLARE\n" + indent("\n".join(decl), 2) + "\nBEGIN\n"
           + indent("\n\n".join(body), 2) + "\nEND")
    header = (f"CREATE OR REPLACE FUNCTION {q(companion)}.{q(function)}({DECISION_ARG} jsonb "
              "DEFAULT NULL) RETURNS jsonb "
              f"LANGUAGE plpgsql SET search_path = {q(companion)}, {q(schema)} "
              # statements run once per batch over small i-diffs: a JIT compile of a plan
              # costed over many-way joins takes seconds (12.7 s of a 15.8 s BSMA Q*1 run)
              "SET jit = off "
              # a Δ-script statement joins an i-diff with up to every relation of the view:
              # past the default limit of 8 the planner keeps the written join order, and an
              # 8-way join then runs whole before its semi-join with a small i-diff
              "SET join_collapse_limit = 16 SET from_collapse_limit = 16 "
              # an i-diff of a few hundred IDs probes a stored relation through its ID index;
              # at the default random_page_cost (4: an uncached disk read per probe) the
              # planner costs 200 probes of a 100k-row cache above one scan of it and hashes
              # the whole cache (V′, 200 price updates: 16–99 ms of a 60 ms maintain in the
              # snapshot and the cache's UPDATE). The pages a batch touches are the hot ones;
              # a large batch still hashes (its probes cost more than the scan)
              f"SET random_page_cost = {RANDOM_PAGE_COST} "
              f"SET default_statistics_target = {SCRATCH_STATISTICS_TARGET} AS ")
    comment = (f"COMMENT ON FUNCTION {q(companion)}.{q(function)}(jsonb) IS "
               f"{lit(f'idivm: compiled Δ-script of view {schema}.{name} ({refresh})')}")
    # the logs this run consumed rows of (its ``log_rows``; NULL: every log, now). A log it
    # read nothing of holds no row its new watermark frees but those an earlier run had
    # consumed and the xmin bound kept (transactions running then): the next run that
    # consumes rows of that table prunes them; each skipped log saves a call (0.3–1 ms). Of
    # the others, those whose prune is due (``changelog.prune_due``)
    def consumed(t: str) -> str:
        return f"coalesce(({PRUNE_ARG} ->> {lit(t)})::bigint, 1)"

    prune_src = (
        "DECLARE\n"
        f"  idivm__rows bigint := {prune_threshold(PRUNE_ROWS_SETTING, PRUNE_ROWS)};\n"
        f"  idivm__xids bigint := {prune_threshold(PRUNE_XIDS_SETTING, PRUNE_XIDS)};\n"
        "BEGIN\n" + "\n".join(
            f"  IF {PRUNE_ARG} IS NULL OR ({consumed(t)} > 0 AND "
            f"{prune_due(schema, t, consumed(t), 'idivm__rows', 'idivm__xids')}) THEN\n"
            f"    PERFORM {prune_statement(schema, t).removeprefix('SELECT ')};\n  END IF;"
            for t in base) + "\nEND")
    prune = (f"CREATE OR REPLACE FUNCTION {q(companion)}.{q(prune_function)}("
             f"{PRUNE_ARG} jsonb DEFAULT NULL) RETURNS void "
             f"LANGUAGE plpgsql AS {dollar_quote(prune_src)}")
    # the scratch relations' queries name the base tables and stored relations as the
    # function's do: on its search path
    path = f"{q(companion)}, {q(schema)}"
    scratch = ("DO " + dollar_quote(
        "DECLARE\n  idivm__path text := current_setting('search_path');\nBEGIN\n"
        f"  PERFORM set_config('search_path', {lit(path)}, true);\n"
        + indent("\n".join(create_temps), 2)
        + "\n  PERFORM set_config('search_path', idivm__path, true);\nEND"))
    return Compiled(function, prune_function,
                    (scratch, header + dollar_quote(src), comment, prune))


# --------------------------------------------------------------------------- fixed runtime


def _catalog_check(name: str, schema: str, base: Sequence[str], tables: Mapping[str, Table],
                   fingerprints: Mapping[str, str],
                   sources: Mapping[str, tuple[str, str]]) -> str:
    """One statement checking every base table against its fingerprint at creation and for
    its key (the first table, in name order, that fails is named)."""
    rows = []
    for i, t in enumerate(base):
        rel = lit(".".join(q(x) for x in sources.get(t, (schema, t))))
        cols = ", ".join(lit(c) for c in tables[t].column_names)
        keys = ", ".join(lit(k) for k in tables[t].primary_key)
        # a base table's columns NOT NULL at creation (the plan relies on it: NOT IN, the
        # non-null counts of SUM and AVG over the log's images — ``images_not_null``): still
        # so (an upstream view's stored table declares none)
        strict = "" if t in sources else ", ".join(
            lit(c) for c in tables[t].not_null_non_key_columns)
        rows.append(f"({i}, {lit(t)}, {rel}, ARRAY[{cols}]::text[], {lit(fingerprints[t])}, "
                    f"ARRAY[{keys}]::text[], ARRAY[{strict}]::text[])")
    hint = (f"USING ERRCODE = '{SCHEMA_CHANGED}', HINT = 'drop the view (drop_view) and "
            "create it again, which recomputes it';")
    return (
        "SELECT c.tbl, c.fp IS DISTINCT FROM c.want, c.lost INTO idivm__bad, idivm__altered, "
        "idivm__lost FROM (\n"
        "  SELECT v.ord, v.tbl, v.want, "
        f"{fingerprint_sql('v.rel', 'v.cols')} AS fp,\n"
        f"    {has_key_sql('v.rel', 'v.keys')} AS has_key,\n"
        f"    {lost_not_null_sql('v.rel', 'v.strict')} AS lost\n"
        f"  FROM (VALUES {', '.join(rows)}) AS v(ord, tbl, rel, cols, want, keys, strict)) "
        "AS c\n"
        "WHERE c.fp IS DISTINCT FROM c.want OR NOT c.has_key OR c.lost IS NOT NULL "
        "ORDER BY c.ord LIMIT 1;\n"
        "IF idivm__lost IS NOT NULL THEN\n"
        "  RAISE EXCEPTION 'idivm: column % of table %.% is no longer NOT NULL, which it was "
        "when view % was created: the view relies on it (NOT IN, or sums'' counts of "
        f"non-null values); it can no longer be maintained incrementally', idivm__lost, "
        f"{lit(schema)}, idivm__bad, {lit(name)}\n    {hint}\n"
        "ELSIF idivm__altered THEN\n"
        "  RAISE EXCEPTION 'idivm: table %.% was altered, dropped or re-created, or its "
        "change logging was disabled, since view % was created: it can no longer be "
        f"maintained incrementally', {lit(schema)}, idivm__bad, {lit(name)}\n    {hint}\n"
        "ELSIF idivm__bad IS NOT NULL THEN\n"
        "  RAISE EXCEPTION 'idivm: table %.% has lost its primary key (or a unique index "
        "over the same columns) since view % was created: it can no longer be maintained "
        f"incrementally', {lit(schema)}, idivm__bad, {lit(name)}\n    {hint}\n"
        "END IF;")


def fingerprint_sql(rel: str, cols: str) -> str:
    """A table's catalog fingerprint as an SQL expression over ``rel`` (text: the table's
    qualified name) and ``cols`` (text[]: the columns a view reads): its oid, those columns'
    names and types, its enabled logging triggers, its inheritance links. ``table_fingerprint``
    computes it at create_view; the compiled maintenance compares it inline (one statement
    for all its tables, planned once per session — a SQL function is planned at every call)."""
    return f"""coalesce(to_regclass({rel})::oid::text, 'missing') || ':' ||
    coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
                                ORDER BY a.attname)
              FROM pg_attribute a
              WHERE a.attrelid = to_regclass({rel}) AND a.attnum > 0 AND NOT a.attisdropped
                AND a.attname = ANY ({cols})), '') || ':' ||
    (SELECT count(*) FROM pg_trigger t
     WHERE t.tgrelid = to_regclass({rel}) AND t.tgenabled = 'A'
       AND t.tgname IN ('idivm_log_insert', 'idivm_log_update', 'idivm_log_delete',
                        'idivm_log_truncate'))::text || ':' ||
    -- an inheritance child or parent, or a partition, gained since (changelog.install
    -- refuses them at create_view): their writes fire none of the table's triggers
    (SELECT count(*) FROM pg_inherits i
     WHERE i.inhparent = to_regclass({rel}) OR i.inhrelid = to_regclass({rel}))::text"""


def lost_not_null_sql(rel: str, strict: str) -> str:
    """The first of the columns ``strict`` (text[]) of ``rel`` (text) that is no longer NOT
    NULL, as an SQL expression (NULL: none)."""
    return f"""(SELECT min(a.attname::text) FROM pg_attribute a
      WHERE a.attrelid = to_regclass({rel}) AND a.attnum > 0 AND NOT a.attisdropped
        AND a.attname = ANY ({strict}) AND NOT a.attnotnull)"""


def has_key_sql(rel: str, keys: str) -> str:
    """Whether the key the log is folded by is still unique, as an SQL expression over ``rel``
    (text) and ``keys`` (text[]): a primary key or a unique index over some of its columns,
    each NOT NULL (or the index NULLS NOT DISTINCT); a DEFERRABLE one too (the fold nets a
    key's row images over a transaction: duplicates that do not commit cancel)."""
    return f"""EXISTS (
    SELECT 1 FROM pg_index i
     WHERE i.indrelid = to_regclass({rel}) AND i.indisunique AND i.indisvalid
       AND i.indpred IS NULL AND i.indexprs IS NULL
       AND NOT EXISTS (
         SELECT 1 FROM pg_attribute a
          WHERE a.attrelid = i.indrelid
            AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])
            AND NOT (a.attname = ANY ({keys}) AND (a.attnotnull OR i.indnullsnotdistinct))))"""


def fingerprint_source(companion: str) -> str:
    """The companion schema's helpers the compiled maintenance calls: a table's catalog
    fingerprint and key check (what maintenance checks), the watermark a run consumed to
    (``consumed``), tables' planner row counts (``relation_rows``), the scratch relations'
    statistics check (``stats_stale``) and the fold's ``first_image`` aggregate."""
    comp = q(companion)
    fingerprint = (f"CREATE OR REPLACE FUNCTION {comp}.table_fingerprint(rel text, cols text[])\n"
                   f"RETURNS text LANGUAGE sql STABLE AS $idivm$\n  SELECT "
                   f"{fingerprint_sql('rel', 'cols')}\n$idivm$")
    has_key = (f"CREATE OR REPLACE FUNCTION {comp}.table_has_key(rel text, keys text[])\n"
               f"RETURNS boolean LANGUAGE sql STABLE AS $idivm$\n  SELECT "
               f"{has_key_sql('rel', 'keys')}\n$idivm$")
    # a view's watermark after its maintain: the snapshot it read in, in which this
    # transaction's own writes count as seen — views maintained in one transaction read the
    # changes their upstream views applied in it (their log rows carry this xid), and their
    # next run must not read them again (xids between the snapshot's xmax and this one stay
    # unseen, as they were)
    # (PL/pgSQL, not SQL: a SQL function's query is parsed and planned at every call, a
    # PL/pgSQL one's once per session — TPC-H SF 1 Q6: 12% of a refresh went to these two)
    # (this transaction's xid the first after its snapshot — no transaction began between
    # them, the usual case — is the snapshot with its xmax one further, in text: no query)
    consumed = f"""CREATE OR REPLACE FUNCTION {comp}.consumed()
RETURNS pg_snapshot LANGUAGE plpgsql VOLATILE AS $idivm$
DECLARE
  s pg_snapshot := pg_current_snapshot();
  x xid8 := pg_current_xact_id_if_assigned();
BEGIN
  IF x IS NULL OR pg_visible_in_snapshot(x, s) THEN
    RETURN s;
  ELSIF x = pg_snapshot_xmax(s) THEN
    RETURN (split_part(s::text, ':', 1) || ':' || (x::text::numeric + 1)::text || ':'
            || split_part(s::text, ':', 3))::pg_snapshot;
  END IF;
  RETURN (SELECT CASE WHEN x IS NULL OR pg_visible_in_snapshot(x, s) THEN s ELSE (
    pg_snapshot_xmin(s)::text || ':' ||
    greatest(pg_snapshot_xmax(s)::text::numeric, x::text::numeric + 1)::text || ':' ||
    coalesce((SELECT string_agg(v::text, ',' ORDER BY v) FROM (
                SELECT i::text::numeric AS v FROM pg_snapshot_xip(s) AS i
                UNION
                SELECT generate_series(pg_snapshot_xmax(s)::text::numeric,
                                       x::text::numeric - 1)) AS z
              WHERE v <> x::text::numeric), ''))::pg_snapshot END);
END
$idivm$"""
    # the rows of relations as the planner knows them (pg_class.reltuples, kept by VACUUM,
    # ANALYZE and CREATE INDEX): NULL when one was never counted (the cost model then does
    # not scale the recomputation's measurement by the tables' growth)
    # (its one statement planned once a session: left to the plan cache, each call re-planned
    # it — a generic plan over ``unnest(rels)`` costs more than a custom one over its 2–8
    # names: 60–80 µs a call, 14–20 µs planned once, in every refresh that consumed changes)
    rows = f"""CREATE OR REPLACE FUNCTION {comp}.relation_rows(rels text[])
RETURNS bigint LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $idivm$
BEGIN
  RETURN (SELECT CASE WHEN count(*) = count(c.oid) AND bool_and(c.reltuples >= 0)
                      THEN sum(c.reltuples)::bigint END
          FROM unnest(rels) AS r(rel) LEFT JOIN pg_class c ON c.oid = to_regclass(r.rel));
END
$idivm$"""
    # whether the planner's row estimate for a filled scratch relation is 4× under or 2× over
    # its ``n`` rows (``_analyze``). Once analyzed with rows, that estimate is ``reltuples``
    # scaled by the pages the relation has now against those it had then: a scratch relation
    # is emptied by DELETE and never vacuumed, so its pages grow run by run while its rows stay
    # alike, and so would the estimate (TPC-H Q21: a 3.7k-row i-diff planned as 22k after five
    # runs turned a probe of 1.4k orders into a 156k-row read of line items, 60 → 1,200 ms;
    # already at 4×: those pages double between two ANALYZEs). Before (analyzed empty at
    # create, or truncated), the planner estimates its rows from its pages and its columns'
    # widths: asked here with an EXPLAIN rather than taken as the 0 rows ``reltuples`` says,
    # which had every scratch relation analyzed at a view's first run — and each ANALYZE
    # re-plans every cached statement reading the relation at the session's next run (its
    # invalidation comes back through the shared queue at the next transaction; TPC-H SF 1
    # Q22: 17 ANALYZEs, 7–15 ms, in its first run, then ~100 statements re-planned, 10–14 ms,
    # in its second)
    # That estimate is its pages (at least 10 while never analyzed) times a density from
    # the columns' widths, the same at every run: the EXPLAIN is asked once a session, its
    # density kept in a session setting per relation (``idivm.density_<oid>``; an EXPLAIN
    # each run was ~80 µs of a 4 ms refresh, TPC-H SF 0.1 Q20)
    stale = f"""CREATE OR REPLACE FUNCTION {comp}.{STATS_STALE}(rel regclass, n bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $idivm$
DECLARE
  pages integer;
  tuples real;
  cur float8 := pg_relation_size(rel) / current_setting('block_size')::int;
  seen float8;
  density float8;
  plan json;
BEGIN
  SELECT c.relpages, c.reltuples INTO pages, tuples FROM pg_class c WHERE c.oid = rel;
  IF pages > 0 AND tuples >= 0 THEN
    seen := tuples / pages * cur;
  ELSE
    IF tuples < 0 THEN
      cur := greatest(cur, 10);
    END IF;
    density := nullif(current_setting('idivm.density_' || rel::oid, true), '')::float8;
    IF density IS NULL OR cur = 0 THEN
      EXECUTE format('EXPLAIN (FORMAT JSON) SELECT FROM %s', rel) INTO plan;
      seen := (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8;
      IF cur > 0 THEN
        PERFORM set_config('idivm.density_' || rel::oid, (seen / cur)::text, false);
      END IF;
    ELSE
      seen := greatest(round(density * cur), 1);
    END IF;
  END IF;
  RETURN coalesce(seen NOT BETWEEN n / 4.0 AND greatest(n * 2.0, n + 1000), true);
END
$idivm$"""
    return (f"{fingerprint};\n{has_key};\n{consumed};\n{rows};\n{stale};\n"
            f"{first_image_source(companion)}")


def history_source(companion: str) -> str:
    """The companion's ``refresh_history`` (one row per refresh that consumed changes —
    ``id``, ``tuple``, ``recompute`` (the view alone) or ``rebuild`` (its stale caches and
    the view recomputed) — and, with no changes, the materialization by create_view:
    ``create``, the view's own, and for a view with caches ``rebuild``, all of it) and
    ``refresh_efficiency()``: per view, its refreshes (all), by the Δ-script (``id``; a
    tuple-based view's too) and by recomputation, their median seconds, the mean changes (log
    rows) and the ratio of the medians (below 1: the Δ-script is the faster)."""
    comp = q(companion)
    hist = f"{comp}.{q(HISTORY)}"
    return f"""CREATE TABLE IF NOT EXISTS {hist} (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, view text NOT NULL,
  finished_at timestamptz NOT NULL DEFAULT clock_timestamp(), strategy text NOT NULL,
  changes bigint NOT NULL, seconds double precision NOT NULL, base_rows bigint,
  reason text NOT NULL);
CREATE INDEX IF NOT EXISTS {q(HISTORY + '_view')} ON {hist} (view, id);
-- a session's first run of a view's code plans its statements (a companion from before has
-- no such column)
ALTER TABLE {hist} ADD COLUMN IF NOT EXISTS cold boolean NOT NULL DEFAULT false;
CREATE OR REPLACE FUNCTION {comp}.refresh_efficiency()
RETURNS TABLE (view text, refreshes bigint, id_refreshes bigint, recompute_refreshes bigint,
               id_median_seconds double precision, recompute_median_seconds double precision,
               avg_changes double precision, id_recompute_ratio double precision,
               last_refresh timestamptz)
LANGUAGE sql STABLE AS $idivm$
  SELECT v.name, count(h.id), count(h.id) FILTER (WHERE h.strategy IN ('id', 'tuple')),
         count(h.id) FILTER (WHERE h.strategy = 'recompute'),
         percentile_cont(0.5) WITHIN GROUP (ORDER BY h.seconds)
           FILTER (WHERE h.strategy IN ('id', 'tuple')),
         percentile_cont(0.5) WITHIN GROUP (ORDER BY h.seconds)
           FILTER (WHERE h.strategy = 'recompute'),
         avg(h.changes)::double precision,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY h.seconds)
           FILTER (WHERE h.strategy IN ('id', 'tuple'))
         / nullif(percentile_cont(0.5) WITHIN GROUP (ORDER BY h.seconds)
                    FILTER (WHERE h.strategy = 'recompute'), 0),
         max(h.finished_at)
  FROM {comp}.views AS v LEFT JOIN {hist} AS h ON h.view = v.name AND h.strategy <> 'create'
    AND h.changes > 0
  GROUP BY v.name ORDER BY v.name
$idivm$"""


COMMITTED_SETTING = "idivm.maintained"  # a maintain's statistics, set as it commits
# a session setting: ``on`` makes a maintenance transaction wait for its commit to reach the
# disk (the session's ``synchronous_commit``); by default it does not (``_run_block``)
SYNCHRONOUS_SETTING = "idivm.synchronous_refresh"


def registry_token(views: Iterable[tuple[str, str, Sequence[str]]]) -> str:
    """A digest of the registry as a client decides from it — each view's name, refresh
    strategy and the relations it reads — compiled into the ``maintain`` procedures
    (``dispatcher``): a client that kept the registry it read (``PostgresMaintainer``) sends
    its digest, and a procedure generated from another registry refuses the call before doing
    anything (``STALE_REGISTRY``), so the client reads it again."""
    text = json.dumps(sorted([str(n), str(s), [str(t) for t in ts]] for n, s, ts in views))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def lock_relation(view: str) -> str:
    """The companion's per-view relation whose lock serializes the view's maintains (a view
    over nothing: never vacuumed, never read; locked without a snapshot, unlike a function)."""
    return fit(f"{view}__lock")


@dataclass(frozen=True)
class Entry:
    """A registered view as the ``maintain`` procedure dispatches to it; ``tables``: the
    relations it reads, base tables and ``upstream`` views alike."""

    name: str
    function: str
    prune_function: str
    tables: tuple[str, ...]
    upstream: tuple[str, ...] = ()


def _run_block(schema: str, companion: str, views: Mapping[str, Entry], order: Sequence[str],
               result: str) -> str:
    """Maintain the views of ``order`` (upstream first) in one REPEATABLE READ transaction —
    one snapshot of the base tables for all of them; a view reads the changes its upstream
    views applied in this transaction from their logs — then prune their logs. ``result``:
    the statistics to return, from ``runs`` (view → its statistics)."""
    comp = q(companion)
    locks = ", ".join(f"{comp}.{q(lock_relation(v))}" for v in sorted(order))
    base = sorted({t for v in order for t in views[v].tables if t not in views})
    tables = ", ".join(f"{q(schema)}.{q(t)}" for t in base)
    lock = f"LOCK TABLE {tables} IN ACCESS SHARE MODE;" if base else "NULL;"
    # each view's function gets its refresh decision from ``choices`` (view → decision)
    runs = "\n".join(f"runs := runs || jsonb_build_object({lit(v)}, "
                     f"{comp}.{q(views[v].function)}(choices -> {lit(v)}));" for v in order)
    prunes = "\n".join(f"""IF (runs -> {lit(v)} ->> 'prune')::boolean THEN
  BEGIN
    PERFORM {comp}.{q(views[v].prune_function)}(runs -> {lit(v)} -> 'log_rows');
  EXCEPTION WHEN OTHERS OR query_canceled THEN
    RAISE WARNING 'idivm: view % was maintained, but pruning its change logs failed: %',
      {lit(v)}, SQLERRM;
  END;
END IF;""" for v in order)
    return f"""COMMIT;
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;
-- maintains of one view run one at a time: a second waits here, before its snapshot (a
-- static LOCK takes none), and the lock ends with the transaction, however it ends (views
-- in name order: two pipelines sharing views wait for each other, never deadlock)
LOCK TABLE {locks} IN EXCLUSIVE MODE;
-- before the snapshot: a TRUNCATE (not MVCC-safe) or a table rewrite waits for this
-- maintain, or commits before its snapshot and is seen whole; ordinary writers go on
{lock}
runs := '{{}}';
{runs}
stats := {result};
-- transactional: the session keeps it only if this transaction commits, which tells a
-- client interrupted from here on (statement_timeout, a cancel) that the run committed (the
-- client's tag of this call first: a value an earlier run left is not this run's)
PERFORM set_config({lit(COMMITTED_SETTING)}, coalesce(run, '') || ' ' || stats::text, false);
-- nor waits for the commit to reach the disk (unless the session's
-- {SYNCHRONOUS_SETTING} is on): a run a crash loses is undone whole — the view,
-- its caches and its watermark as one — and the next run applies its changes again, from
-- logs their writers committed durably; a later durable commit makes it durable too
IF current_setting({lit(SYNCHRONOUS_SETTING)}, true) IS DISTINCT FROM 'on' THEN
  PERFORM set_config('synchronous_commit', 'off', true);
END IF;
COMMIT;
-- consumed log rows go in a READ COMMITTED transaction of their own (where a concurrent
-- prune by another view's maintain is no serialization failure); the maintenance has
-- committed, so a failure here is only reported: the next run prunes (nor waits for its
-- commit to reach the disk: a prune lost in a crash is the next run's)
PERFORM set_config('synchronous_commit', 'off', true);
{prunes}
COMMIT;"""


def dispatcher(schema: str, companion: str, views: Sequence[Entry], registry: str) -> str:
    """The companion schema's ``maintain`` procedure, one static branch per view (regenerated
    whenever a view is created, dropped or recompiled), and ``maintain_all``. A view that
    reads other views is maintained with them, upstream first, in one transaction. Static,
    because a dynamically executed CALL cannot commit, and a dynamically executed LOCK takes
    the snapshot before locking. ``choices`` (jsonb, optional): view → its refresh decision
    (``"recompute"``, ``"id"`` or ``{"choice": …, "reason": …}``); a view not named gets its
    default (``_decision_block``). ``registry`` (optional): the ``registry_token`` of the
    registry the caller decided from, refused unless it is the one these procedures were
    generated from (``registry``, compiled in); ``run`` (optional): the caller's tag of
    this call, the prefix of ``COMMITTED_SETTING``. The procedures of an older format are
    dropped first: they would be overloads of these."""
    comp = q(companion)
    stale = f"""IF registry IS NOT NULL AND registry IS DISTINCT FROM {lit(registry)} THEN
  RAISE EXCEPTION 'idivm: the views of schema % changed since this session read them',
    {lit(schema)} USING ERRCODE = '{STALE_REGISTRY}';
END IF;"""
    by_name = {v.name: v for v in views}
    upstream = {v.name: v.upstream for v in views}
    branches = []
    for v in views:
        order = pipeline.order(upstream, [v.name])
        result = (f"(runs -> {lit(v.name)})" if len(order) == 1 else
                  f"(runs -> {lit(v.name)}) || jsonb_build_object('upstream', "
                  f"runs - {lit(v.name)})")
        names = ", ".join(lit(n) for n in order)
        branches.append(f"""IF view = {lit(v.name)} THEN
  IF version IS NOT NULL AND EXISTS (SELECT FROM {comp}.views v WHERE v.name IN ({names})
                                     AND v.format_version IS DISTINCT FROM version) THEN
    RAISE EXCEPTION 'idivm: view % (or a view it reads) was compiled by another idivm version',
      view USING ERRCODE = '{STALE_CODE}';
  END IF;
{indent(_run_block(schema, companion, by_name, order, result), 2)}
  RETURN;
END IF;""")
    body = f"""DECLARE
  runs jsonb;
BEGIN
{indent(stale, 2)}
{indent(chr(10).join(branches), 2)}
  -- (a view with code has a branch above: its registry row is made and dropped with it)
  IF NOT EXISTS (SELECT FROM {comp}.views v WHERE v.name = view) THEN
    RAISE EXCEPTION 'idivm: no view % in schema %', view, {lit(schema)}
      USING ERRCODE = '{NO_VIEW}';
  END IF;
  RAISE EXCEPTION 'idivm: view % of schema % has no compiled code (create it again)', view,
    {lit(schema)} USING ERRCODE = '{STALE_CODE}';
END"""
    every = pipeline.order(upstream, by_name)
    all_body = f"""DECLARE
  runs jsonb;
BEGIN
{indent(stale, 2)}
  IF version IS NOT NULL AND EXISTS (SELECT FROM {comp}.views v
                                     WHERE v.format_version IS DISTINCT FROM version) THEN
    RAISE EXCEPTION 'idivm: a view of schema % was compiled by another idivm version',
      {lit(schema)} USING ERRCODE = '{STALE_CODE}';
  END IF;
{indent(_run_block(schema, companion, by_name, every, "jsonb_build_object('views', runs)"), 2)
 if every else "  stats := jsonb_build_object('views', '{}'::jsonb);"}
END"""
    extra = ("version int DEFAULT NULL, choices jsonb DEFAULT NULL, registry text DEFAULT NULL, "
             "run text DEFAULT NULL")
    return (f"DROP PROCEDURE IF EXISTS {comp}.maintain(text, jsonb, int);\n"
            f"DROP PROCEDURE IF EXISTS {comp}.maintain_all(jsonb, int);\n"
            f"DROP PROCEDURE IF EXISTS {comp}.maintain(text, jsonb, int, jsonb);\n"
            f"DROP PROCEDURE IF EXISTS {comp}.maintain_all(jsonb, int, jsonb);\n"
            f"CREATE OR REPLACE PROCEDURE {comp}.maintain(view text, INOUT stats jsonb "
            f"DEFAULT NULL, {extra}) LANGUAGE plpgsql AS {dollar_quote(body)};\n"
            f"CREATE OR REPLACE PROCEDURE {comp}.maintain_all(INOUT stats jsonb DEFAULT NULL, "
            f"{extra}) LANGUAGE plpgsql AS {dollar_quote(all_body)}")

