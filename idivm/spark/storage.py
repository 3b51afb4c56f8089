"""What the Spark maintainer needs of its storage, and APPLY (§2) as Spark SQL.

``Store`` is the small interface: create, read, stage the effect of a list of APPLY operations
durably (the post-state of what they touch, not yet visible), expose the staged post-state,
publish it idempotently. ``idivm.spark.delta.DeltaStore`` implements it over Delta tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlglot import exp

from idivm.planner.ruleapi import and_all, c, select, subquery, t, union_all

MATCH = "__m"


@dataclass(frozen=True)
class ApplyOp:
    """One APPLY of the Δ-script: an i-diff (a DataFrame) and how it names the target's rows."""

    kind: str  # "del", "upd", "ins"; "replace": the diff is the whole new relation
    diff: Any  # pyspark DataFrame
    ids: tuple[str, ...]
    columns: tuple[str, ...]  # upd: the columns set (from c__post); ins: every column
    nullable: frozenset[str] = frozenset()


@dataclass
class StageResult:
    touched: list[int] = field(default_factory=list)  # buckets rewritten
    total: int = 0  # buckets in all
    rows: list[int] = field(default_factory=list)  # rows each operation names
    post: Callable[[], Any] | None = None  # builds the relation after the operations

    @property
    def post_state(self) -> Any:
        """The relation after the operations (a DataFrame; built on demand, as only a cache
        that later statements read needs it)."""
        assert self.post is not None
        return self.post()


class Store(Protocol):
    def exists(self, name: str) -> bool: ...
    def create(self, name: str, df: Any, key: Sequence[str], bucket_col: str | None) -> None: ...
    def read(self, name: str, version: int | None = None) -> Any: ...
    def version(self, name: str) -> int: ...
    def drop(self, name: str) -> None: ...
    def stage(self, run: str, name: str, ops: Sequence[ApplyOp]) -> StageResult: ...
    def publish(self, run: str, name: str) -> None: ...
    def discard(self, run: str, published: bool = False) -> None: ...
    def partitions(self, name: str) -> int: ...


def on_ids(ids: Sequence[str], left: str, right: str, nullable: frozenset[str]) -> exp.Expr:
    parts: list[exp.Expr] = []
    for k in ids:
        a, b = c(k, left), c(k, right)
        parts.append(exp.NullSafeEQ(this=a, expression=b) if k in nullable
                     else exp.EQ(this=a, expression=b))
    return and_all(parts)


def apply_sql(q: exp.Select, op: ApplyOp, d: str, cols: Sequence[str], key: Sequence[str],
              alias: str) -> exp.Select:
    """APPLY (§2) as SQL over the rows so far: DELETE by IDs, UPDATE … SET by IDs, or
    insert-or-replace by the key."""
    cur = subquery(q, alias)
    if op.kind == "del":
        ids = select([(k, c(k, "x")) for k in op.ids], t(d, "x"), distinct=True)
        return select([(k, c(k, alias)) for k in cols], cur).join(
            subquery(ids, "d"), on=on_ids(op.ids, alias, "d", op.nullable), join_type="left anti")
    if op.kind == "upd":
        posts = [(f"{k}__post", c(f"{k}__post", "x")) for k in op.columns]
        ids = select([(k, c(k, "x")) for k in op.ids] + posts + [(MATCH, exp.true())],
                     t(d, "x"), distinct=True)
        items = [(k, exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Is(
            this=c(MATCH, "d"), expression=exp.null())), true=c(f"{k}__post", "d"))],
            default=c(k, alias)) if k in op.columns else c(k, alias)) for k in cols]
        return select(items, cur).join(subquery(ids, "d"),
                                       on=on_ids(op.ids, alias, "d", op.nullable), join_type="left")
    rows = select([(k, c(k, "x")) for k in cols], t(d, "x"), distinct=True)
    keys = select([(k, c(k, "x")) for k in key], t(d, "x"), distinct=True)
    kept = select([(k, c(k, alias)) for k in cols], cur).join(
        subquery(keys, "d"), on=on_ids(key, alias, "d", op.nullable), join_type="left anti")
    return select([(k, c(k, "y")) for k in cols], subquery(union_all([kept, rows]), "y"))
