"""The Δ-script: i-diff queries, snapshots and APPLY statements (§2), and their SQL per dialect.

This is the only place statement text is produced, always through sqlglot's generator. One
abstract APPLY becomes PostgreSQL's UPDATE … FROM / INSERT … ON CONFLICT / DELETE, or Spark
SQL's MERGE INTO, from the same expression trees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

from idivm.planner.model import Kind, post_name, pre_name
from idivm.planner.ruleapi import c, exists, match, select, t

Dialect = Literal["postgres", "spark"]


@dataclass(frozen=True)
class Compute:
    """CREATE a temporary relation ``name`` from ``query`` (an i-diff or a snapshot)."""

    name: str
    query: exp.Expr
    comment: str
    phase: str  # "instance", "idiff", "snapshot"


ApplyKind = Kind | Literal["replace"]


@dataclass(frozen=True)
class Apply:
    """APPLY Δ to a cache or the view, by the i-diff's IDs (§2); ``replace`` (the recompute
    strategy) swaps all rows for the diff's."""

    kind: ApplyKind
    target: str
    diff: str
    ids: tuple[str, ...]  # the i-diff's ID columns (match the target's same-named columns)
    columns: tuple[str, ...]  # insert: every target column; update: the columns set
    key: tuple[str, ...]  # the target's IDs (the conflict target of an insert)
    nullable: frozenset[str]  # ID columns that may be NULL (matched null-safely)
    comment: str
    phase: str = "apply"
    # a delete whose rows go into this snapshot of the target as they are deleted (their
    # pre-images: ``postgres.compile.deletes_fill_snapshots``), with its columns in order
    snapshot: str | None = None
    snapshot_columns: tuple[str, ...] = ()


Statement = Compute | Apply


def reads(stmt: Statement) -> list[str]:
    """The relations a statement reads (i-diffs, snapshots, change tables, stored tables)."""
    if isinstance(stmt, Apply):
        return [stmt.diff]
    return [tb.name for tb in stmt.query.find_all(exp.Table)]


def apply_run(statements: Sequence[Statement], i: int) -> tuple[list[Apply], int]:
    """The APPLYs from ``statements[i]`` on that are consecutive and share its target (what a
    backend stages together), and the index after them."""
    first = statements[i]
    assert isinstance(first, Apply)
    out: list[Apply] = []
    while i < len(statements):
        a = statements[i]
        if not isinstance(a, Apply) or a.target != first.target:
            break
        out.append(a)
        i += 1
    return out, i


def render(stmt: Statement, dialect: Dialect) -> exp.Expr:
    if isinstance(stmt, Compute):
        kind = "TABLE" if dialect == "postgres" else "VIEW"
        props = exp.Properties(expressions=[exp.TemporaryProperty()])
        return exp.Create(this=t(stmt.name), kind=kind, expression=stmt.query.copy(),
                          properties=props, replace=dialect == "spark")
    nulls = {k: True for k in stmt.nullable}
    pairs = [(k, k) for k in stmt.ids]
    if stmt.kind == "replace":
        rows = select([(k, c(k, "d")) for k in stmt.columns], t(stmt.diff, "d"))
        return exp.Insert(this=exp.Schema(this=t(stmt.target), expressions=[
            exp.to_identifier(k, quoted=True) for k in stmt.columns]), expression=rows,
            overwrite=dialect == "spark")
    if dialect == "spark":
        return _merge(stmt, pairs, nulls)
    if stmt.kind == "del":
        return exp.delete(t(stmt.target, "v"), where=exists(t(stmt.diff, "d"),
                                                             match(pairs, "v", "d", nulls)))
    if stmt.kind == "upd":
        return exp.Update(
            this=t(stmt.target, "v"),
            expressions=[exp.EQ(this=c(k), expression=c(post_name(k), "d"))
                         for k in stmt.columns],
            from_=exp.From(this=t(stmt.diff, "d")),
            where=exp.Where(this=match(pairs, "v", "d", nulls)))
    rest = [k for k in stmt.columns if k not in stmt.key]
    action = exp.var("DO UPDATE") if rest else exp.var("DO NOTHING")
    conflict = exp.OnConflict(
        conflict_keys=[exp.to_identifier(k, quoted=True) for k in stmt.key],
        action=action,
        expressions=[exp.EQ(this=c(k), expression=c(k, "excluded")) for k in rest] or None)
    return exp.Insert(
        this=exp.Schema(this=t(stmt.target),
                        expressions=[exp.to_identifier(k, quoted=True) for k in stmt.columns]),
        expression=select([(k, c(k, "d")) for k in stmt.columns], t(stmt.diff, "d"),
                          distinct=True),
        conflict=conflict)


def _merge(stmt: Apply, pairs: Sequence[tuple[str, str]], nulls: dict[str, bool]) -> exp.Merge:
    """Spark SQL: every APPLY is a MERGE INTO (on table formats that support it)."""
    if stmt.kind == "ins":
        pairs = [(k, k) for k in stmt.key]
        using: exp.Expr = exp.Subquery(
            this=select([(k, c(k)) for k in stmt.columns], t(stmt.diff), distinct=True),
            alias=exp.TableAlias(this=exp.to_identifier("d", quoted=True)))
    else:
        using = t(stmt.diff, "d")
    on = match(pairs, "v", "d", nulls)
    whens: list[exp.When] = []
    if stmt.kind == "del":
        whens.append(exp.When(matched=True, then=exp.var("DELETE")))
    elif stmt.kind == "upd":
        whens.append(exp.When(matched=True, then=exp.Update(expressions=[
            exp.EQ(this=c(k, "v"), expression=c(post_name(k), "d")) for k in stmt.columns])))
    else:
        rest = [k for k in stmt.columns if k not in stmt.key]
        if rest:
            whens.append(exp.When(matched=True, then=exp.Update(expressions=[
                exp.EQ(this=c(k, "v"), expression=c(k, "d")) for k in rest])))
        whens.append(exp.When(matched=False, then=exp.Insert(
            this=exp.Tuple(expressions=[c(k) for k in stmt.columns]),
            expression=exp.Tuple(expressions=[c(k, "d") for k in stmt.columns]))))
    return exp.Merge(this=t(stmt.target, "v"), using=using, on=on,
                     whens=exp.Whens(expressions=whens))


def to_sql(stmt: Statement, dialect: Dialect, pretty: bool = False) -> str:
    text = adapt(render(stmt, dialect), dialect).sql(dialect=dialect, pretty=pretty)
    if isinstance(stmt, Apply) and stmt.kind == "replace" and dialect == "postgres":
        # PostgreSQL has no INSERT OVERWRITE: empty the table first, in the same transaction
        text = f"{exp.delete(t(stmt.target)).sql(dialect=dialect)};\n{text}"
    return text


def query_sql(query: exp.Expr, dialect: Dialect) -> str:
    """A query alone (no CREATE around it), adapted to the dialect."""
    return adapt(query.copy(), dialect).sql(dialect=dialect)


def _spark_unbounded_numeric(e: exp.Expr) -> exp.Expr:
    """PostgreSQL's unconstrained NUMERIC (exact division for AVG) has no Spark equivalent:
    Spark's DECIMAL defaults to (10, 0). Spark's own AVG of integers is a DOUBLE."""
    if isinstance(e, exp.Cast) and e.to.this == exp.DataType.Type.DECIMAL and \
            not e.to.expressions:
        return exp.cast(e.this, exp.DataType.build("DOUBLE"))
    return e


DIALECT_REWRITES: dict[str, tuple[Callable[[exp.Expr], exp.Expr], ...]] = {
    "postgres": (),
    "spark": (_spark_unbounded_numeric,),
}


def adapt(e: exp.Expr, dialect: Dialect) -> exp.Expr:
    """Apply the dialect's small pure rewrites (sqlglot transpiles the rest)."""
    for rw in DIALECT_REWRITES[dialect]:
        e = e.transform(rw)
    return e


def comment(stmt: Statement) -> str:
    return stmt.comment


__all__ = ["Apply", "Compute", "Statement", "render", "to_sql", "pre_name"]
