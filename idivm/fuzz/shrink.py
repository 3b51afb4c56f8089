"""Shrinking a finding to a minimal view and change sequence.

Greedy, in order: cut the rounds after the failing one, drop rounds, transactions and
statements, drop initial rows, drop tables nothing reads any more, then simplify the view
(drop WHERE conjuncts, select items, joins, HAVING, DISTINCT, subquery predicates; a set
operation or CASE/COALESCE replaced by one side) — each step kept only while the finding still
reproduces the same way. ``still_fails`` is any predicate (the oracle, or a fake in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

import sqlglot
from sqlglot import exp

from idivm.fuzz.schema import SchemaDef, TableDef
from idivm.fuzz.workload import Round, Txn

T = TypeVar("T")


@dataclass(frozen=True)
class Repro:
    """One view under one strategy over a schema, its initial rows and change rounds."""

    schema: SchemaDef
    setup: tuple[str, ...]
    view: str
    strategy: str
    rounds: tuple[Round, ...]

    @property
    def size(self) -> int:
        return (len(self.setup) + sum(len(t.statements) for r in self.rounds for t in r)
                + len(self.rounds) + len(self.view) // 8)


class _Budget:
    def __init__(self, seconds: float, max_tries: int) -> None:
        self.end = time.monotonic() + seconds
        self.tries = max_tries

    def spent(self) -> bool:
        return self.tries <= 0 or time.monotonic() > self.end

    def take(self) -> None:
        self.tries -= 1


def shrink(repro: Repro, still_fails: Callable[[Repro], bool], fail_round: int = -1,
           seconds: float = 120.0, max_tries: int = 400) -> Repro:
    """The smallest variant of ``repro`` found for which ``still_fails`` holds."""
    budget = _Budget(seconds, max_tries)

    def test(r: Repro) -> bool:
        if budget.spent():
            return False
        budget.take()
        return still_fails(r)

    cur = repro
    keep = max(fail_round, 0)
    if keep < len(cur.rounds):
        cut = replace(cur, rounds=cur.rounds[:keep])
        if test(cut):
            cur = cut
    for _ in range(3):
        before = cur
        cur = _shrink_view(cur, test, budget)  # the view first: what a reader needs most
        cur = _shrink_rounds(cur, test)
        cur = _shrink_setup(cur, test)
        cur = _drop_tables(cur, test)
        cur = _shrink_view(cur, test, budget)
        if cur == before or budget.spent():
            break
    return cur


def _reduce(items: list[T], ok: Callable[[list[T]], bool]) -> list[T]:
    """Remove chunks (halves, quarters, … single items) while ``ok`` holds (ddmin-like)."""
    n = max(len(items) // 2, 1)
    while items and n >= 1:
        i = 0
        changed = False
        while i < len(items):
            cand = items[:i] + items[i + n:]
            if ok(cand):
                items = cand
                changed = True
            else:
                i += n
        if n == 1 and not changed:
            break
        n = n // 2 if n > 1 else (1 if changed else 0)
    return items


def _shrink_setup(start: Repro, test: Callable[[Repro], bool]) -> Repro:
    def ok(rows: list[str]) -> bool:
        return test(replace(start, setup=tuple(rows)))

    return replace(start, setup=tuple(_reduce(list(start.setup), ok)))


def _shrink_rounds(start: Repro, test: Callable[[Repro], bool]) -> Repro:
    def rounds_ok(rs: list[Round]) -> bool:
        return test(replace(start, rounds=tuple(rs)))

    out: list[Round] = _reduce(list(start.rounds), rounds_ok)
    for i in range(len(out)):
        def txns_ok(ts: list[Txn], i: int = i) -> bool:
            return test(replace(start, rounds=tuple(out[:i] + [tuple(ts)] + out[i + 1:])))

        out[i] = tuple(_reduce(list(out[i]), txns_ok))
        for j in range(len(out[i])):
            txn = out[i][j]

            def stmts_ok(ss: list[str], i: int = i, j: int = j, txn: Txn = txn) -> bool:
                r = out[i][:j] + (Txn(tuple(ss), txn.commit),) + out[i][j + 1:]
                return test(replace(start, rounds=tuple(out[:i] + [r] + out[i + 1:])))

            stmts = _reduce(list(txn.statements), stmts_ok)
            out[i] = out[i][:j] + (Txn(tuple(stmts), txn.commit),) + out[i][j + 1:]
    return replace(start, rounds=tuple(out))


def _mentions(text: str, table: str) -> bool:
    import re

    return re.search(rf"\b{re.escape(table)}\b", text) is not None


def _simplify_schema(cur: Repro, test: Callable[[Repro], bool]) -> Repro:
    """Drop the triggers, then each foreign key, while the finding stays."""
    s = cur.schema
    if s.triggers:
        cand = replace(cur, schema=SchemaDef(s.tables, (), s.children, s.config))
        if test(cand):
            cur = cand
    for t in cur.schema.tables:
        for fk in t.foreign_keys:
            s = cur.schema
            tables = tuple(TableDef(o.name, o.columns, o.primary_key,
                                    tuple(f for f in o.foreign_keys if f != fk))
                           if o.name == t.name else o for o in s.tables)
            cand = replace(cur, schema=SchemaDef(tables, s.triggers, s.children, s.config))
            if test(cand):
                cur = cand
    return cur


def _drop_tables(cur: Repro, test: Callable[[Repro], bool]) -> Repro:
    """Drop tables neither the view nor another table (foreign key, trigger) refers to."""
    cur = _simplify_schema(cur, test)
    for t in list(cur.schema.tables):
        s = cur.schema
        if _mentions(cur.view, t.name) or any(trg.target == t.name or trg.table == t.name
                                              for trg in s.triggers):
            continue
        if any(fk.ref_table == t.name for o in s.tables if o.name != t.name
               for fk in o.foreign_keys) or any(p == t.name for _, p in s.children):
            continue
        schema = SchemaDef(tuple(o for o in s.tables if o.name != t.name), s.triggers,
                           s.children, s.config)
        rounds = tuple(tuple(Txn(tuple(st for st in txn.statements if not _mentions(st, t.name)),
                                 txn.commit) for txn in r) for r in cur.rounds)
        cand = replace(cur, schema=schema,
                       setup=tuple(st for st in cur.setup if not _mentions(st, t.name)),
                       rounds=rounds)
        if test(cand):
            cur = cand
    return cur


# -- the view --------------------------------------------------------------------------------
def view_candidates(view_sql: str) -> Iterator[str]:
    """Simpler variants of ``view_sql``, one transformation each, biggest cuts first."""
    try:
        tree = sqlglot.parse_one(view_sql, read="postgres")
    except sqlglot.errors.ParseError:
        return
    n = sum(1 for _ in tree.walk())
    seen = {view_sql}
    for pass_ in ("set", "join", "pred", "item", "expr"):
        for k in range(n):
            for variant in _variants(tree, k, pass_):
                if variant not in seen:
                    seen.add(variant)
                    yield variant


def _nth(tree: exp.Expr, k: int) -> exp.Expr | None:
    for i, node in enumerate(tree.walk()):
        if i == k:
            return node
    return None


def _pop_expression(i: int) -> Callable[[exp.Expr], object]:
    def edit(x: exp.Expr) -> object:
        return x.expressions[i].pop()

    return edit


def _variants(tree: exp.Expr, k: int, pass_: str) -> Iterator[str]:
    node = _nth(tree, k)
    if node is None:
        return
    edits: list[Callable[[exp.Expr], object]] = []
    if pass_ == "set" and isinstance(node, exp.Union | exp.Except | exp.Intersect):
        edits += [lambda x: x.replace(x.this), lambda x: x.replace(x.expression)]
    if pass_ == "set" and isinstance(node, exp.With) and len(node.expressions) > 1:
        edits += [_pop_expression(i) for i in range(len(node.expressions))]
    if pass_ == "join" and isinstance(node, exp.Join):
        edits.append(lambda x: x.pop())
        if node.side:
            edits.append(lambda x: x.set("side", None))
    if pass_ == "pred":
        if isinstance(node, exp.Where | exp.Having):
            edits.append(lambda x: x.pop())
        if isinstance(node, exp.And | exp.Or):
            edits += [lambda x: x.replace(x.this), lambda x: x.replace(x.expression)]
        if isinstance(node, exp.Not):
            edits.append(lambda x: x.replace(x.this))
        if isinstance(node, exp.Exists | exp.In) or (
                isinstance(node, exp.Binary) and isinstance(node.expression, exp.Subquery)):
            edits.append(lambda x: x.replace(exp.true()))
    if pass_ == "item" and isinstance(node, exp.Select):
        if len(node.expressions) > 1:
            edits += [_pop_expression(i) for i in range(len(node.expressions))]
        if node.args.get("distinct"):
            edits.append(lambda x: x.set("distinct", None))
        if node.args.get("group"):
            edits.append(lambda x: x.set("group", None))
    if pass_ == "expr":
        if isinstance(node, exp.Case) and node.args.get("default") is not None:
            edits.append(lambda x: x.replace(x.args["default"]))
        if isinstance(node, exp.Coalesce):
            edits.append(lambda x: x.replace(x.this))
        if isinstance(node, exp.Add | exp.Sub | exp.Mul):
            edits.append(lambda x: x.replace(x.this))
        if isinstance(node, exp.Subquery) and isinstance(node.parent, exp.Alias):
            edits.append(lambda x: x.replace(exp.null()))
    for edit in edits:
        copy = tree.copy()
        target = _nth(copy, k)
        if target is None:
            continue
        try:
            result = edit(target)
            if target is copy and isinstance(result, exp.Expr):  # the root replaced
                yield result.sql(dialect="postgres")
            else:
                yield copy.sql(dialect="postgres")
        except Exception:  # noqa: BLE001 - a variant that cannot be built is skipped
            continue


def _shrink_view(cur: Repro, test: Callable[[Repro], bool], budget: _Budget) -> Repro:
    progress = True
    while progress and not budget.spent():
        progress = False
        for cand in view_candidates(cur.view):
            if budget.spent():
                break
            nxt = replace(cur, view=cand)
            if test(nxt):
                cur = nxt
                progress = True
                break
    return cur

