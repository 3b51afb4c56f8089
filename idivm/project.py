"""Pipeline projects: folders of SQL files declaring materialized views (dbt's habit, and Spark
Declarative Pipelines' SQL files), read into datasets and turned into a plan of what a run
does (pure: the backends' ``pipeline run`` commands carry it out).

A file holds statements separated by semicolons. ``CREATE [OR REFRESH | OR REPLACE]
MATERIALIZED VIEW name AS SELECT …`` declares a dataset; any other statement (a streaming
table, a flow, a temporary view, a setting) is refused by name, before anything runs. A
dataset reads tables and the other datasets; a run creates the new ones, re-creates those
whose query changed (and the datasets above them), and refreshes the rest, in dependency
order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from idivm import pipeline
from idivm.errors import UnsupportedSQL
from idivm.frontend import relations_read

__all__ = ["Dataset", "Refusal", "Step", "plan_run", "read_files", "refuse"]

# a statement's opening words idivm reads as a materialized view (sqlglot does not know
# SDP's OR REFRESH; it is what a run does anyway)
_MV = re.compile(r"^\s*CREATE\s+(?:OR\s+(?:REFRESH|REPLACE)\s+)?MATERIALIZED\s+VIEW\s+",
                 re.IGNORECASE)
_KIND = re.compile(r"^\s*CREATE\s+(?:OR\s+\w+\s+)?((?:TEMPORARY\s+|TEMP\s+)?"
                   r"(?:STREAMING\s+TABLE|MATERIALIZED\s+VIEW|VIEW|TABLE|FLOW|SINK))",
                   re.IGNORECASE)


@dataclass(frozen=True)
class Dataset:
    """A materialized view of a project: its name, its query (in the PostgreSQL dialect idivm
    plans in), the file declaring it and the datasets it reads."""

    name: str
    sql: str
    source: str
    reads: tuple[str, ...]


@dataclass(frozen=True)
class Refusal:
    """A statement of a project idivm does not run, and why."""

    source: str
    statement: str
    reason: str


@dataclass(frozen=True)
class Step:
    """What a run does with one dataset: ``create`` (new), ``recreate`` (its query changed,
    or a dataset it reads is re-created), ``refresh`` (incrementally), ``recompute``
    (``full_refresh``); ``why`` says so."""

    name: str
    action: Literal["create", "recreate", "refresh", "recompute"]
    why: str


def read_files(paths: Iterable[Path], dialect: str = "postgres", root: Path | None = None
               ) -> tuple[list[Dataset], list[Refusal]]:
    """The datasets the SQL files declare (queries transpiled from ``dialect`` to
    PostgreSQL's), and the statements refused."""
    found: dict[str, Dataset] = {}
    refused: list[Refusal] = []
    for path in sorted(paths):
        shown = str(path.relative_to(root)) if root is not None else str(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise UnsupportedSQL("SQL file", f"cannot read {shown}: {e}") from e
        for stmt in _statements(text):
            one = " ".join(stmt.split())[:80]
            if not _MV.match(stmt):
                kind = _KIND.match(stmt)
                what = " ".join(kind.group(1).upper().split()) if kind else \
                    (stmt.split(None, 1) or ["?"])[0].upper()
                refused.append(Refusal(shown, one, f"{what}: idivm maintains materialized "
                                                   "views (CREATE MATERIALIZED VIEW … AS "
                                                   "SELECT …) only"))
                continue
            try:
                tree = sqlglot.parse_one(_MV.sub("CREATE MATERIALIZED VIEW ", stmt, count=1),
                                         read=dialect)
            except ParseError as e:
                refused.append(Refusal(shown, one, f"does not parse: {e}"))
                continue
            query = tree.expression if isinstance(tree, exp.Create) else None
            target = tree.this if isinstance(tree, exp.Create) else None
            if isinstance(target, exp.Schema):  # a column list: not supported
                refused.append(Refusal(shown, one, "a column list after the view name: name "
                                                   "the columns in the SELECT instead"))
                continue
            if not isinstance(query, exp.Query) or not isinstance(target, exp.Table):
                refused.append(Refusal(shown, one, "not CREATE MATERIALIZED VIEW name AS "
                                                   "SELECT …"))
                continue
            name = normalize_identifiers(target.copy(), dialect=dialect).name
            if target.db:
                refused.append(Refusal(shown, one, f"{target.sql(dialect)}: a qualified name "
                                                   "(datasets live in the pipeline's own "
                                                   "schema or warehouse)"))
                continue
            sql = query.sql("postgres")
            if name in found:
                refused.append(Refusal(shown, one, f"{name} is also declared in "
                                                   f"{found[name].source}"))
                continue
            found[name] = Dataset(name, sql, shown, ())
    names = set(found)
    out = []
    for d in found.values():
        try:
            reads = relations_read(d.sql)
        except UnsupportedSQL as e:
            refused.append(Refusal(d.source, d.name, str(e)))
            continue
        out.append(Dataset(d.name, d.sql, d.source, tuple(sorted(reads & names))))
    return out, refused


def refuse(refused: Sequence[Refusal]) -> None:
    """Refuse a project with statements idivm does not run, naming each (nothing has run)."""
    if refused:
        lines = "; ".join(f"{r.source}: {r.statement} — {r.reason}" for r in refused)
        raise UnsupportedSQL("pipeline statement", f"nothing was run: {lines}")


def _statements(text: str) -> list[str]:
    """The statements of a SQL file, from their first token to their last (split by
    sqlglot's tokenizer: semicolons inside strings and comments do not split; comments
    between statements are dropped)."""
    try:
        tokens = sqlglot.tokenize(text)
    except Exception as e:  # an unterminated string or comment
        raise UnsupportedSQL("SQL file", f"does not tokenize: {e}") from e
    out: list[str] = []
    first = last = None
    for tok in [*tokens, None]:
        if tok is None or tok.token_type == sqlglot.TokenType.SEMICOLON:
            if first is not None and last is not None:
                out.append(text[first.start:last.end + 1])
            first = last = None
            continue
        first = first or tok
        last = tok
    return out


def plan_run(datasets: Sequence[Dataset], existing: Mapping[str, str],
             full_refresh: bool = False) -> list[Step]:
    """Each dataset's step, in dependency order (a dataset after those it reads).
    ``existing``: the datasets already maintained → the query each was created with."""
    by_name = {d.name: d for d in datasets}
    try:
        order = pipeline.order({d.name: d.reads for d in datasets}, by_name)
    except ValueError as e:
        raise UnsupportedSQL("a cycle of datasets", f"{e}: a pipeline is a graph without "
                             "cycles") from e
    steps: list[Step] = []
    recreated: set[str] = set()
    for n in order:
        d = by_name[n]
        ups = [u for u in d.reads if u in recreated]
        if n not in existing:
            steps.append(Step(n, "create", "new"))
            recreated.add(n)
        elif _normal(existing[n]) != _normal(d.sql):
            steps.append(Step(n, "recreate", f"its query in {d.source} changed"))
            recreated.add(n)
        elif ups:
            steps.append(Step(n, "recreate", f"it reads {', '.join(ups)}, re-created"))
            recreated.add(n)
        elif full_refresh:
            steps.append(Step(n, "recompute", "--full-refresh"))
        else:
            steps.append(Step(n, "refresh", "incrementally, from its inputs' changes"))
    return steps


def _normal(sql: str) -> str:
    """A query as compared across runs (formatting and comments aside)."""
    try:
        return sqlglot.parse_one(sql, read="postgres").sql("postgres")
    except ParseError:
        return " ".join(sql.split())
