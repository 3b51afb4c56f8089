"""Oracles: create each view under each strategy, run the change rounds, maintain, and compare
the maintained view with its recomputation as a multiset — right after ``create_view`` and
after every round.

Outcomes per (view, strategy): ``ok``; ``invalid`` (PostgreSQL rejects the query: not a
finding); ``refused`` (``UnsupportedSQL`` naming a construct on the README's refused list);
and the findings ``refusal`` (an ``UnsupportedSQL`` outside that list), ``crash`` (any other
exception), ``mismatch`` and ``hang`` (a statement timeout).
"""

from __future__ import annotations

import re
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fuzz.schema import SchemaDef
from idivm.fuzz.workload import CONTROL, Round

FINDINGS = ("mismatch", "crash", "hang", "refusal")
PLACES = 6  # decimals compared after rounding: AVG and float sums may differ in the last digits

# Constructs the README's "Refused SQL" list documents (matched against
# ``UnsupportedSQL.construct``, lower case). Keep in step with README.md.
DOCUMENTED_REFUSALS: tuple[str, ...] = (
    r"window function", r"order by", r"limit/offset", r"lateral", r"with recursive",
    r"grouping sets", r"distinct on", r"aggregate filter", r"^aggregate ",
    r"distinct aggregates over several", r"\(distinct over several columns\)",
    r"\w\(\)$", r"except all", r"intersect all", r"non-equality correlation",
    r"correlated scalar subquery in having", r"scalar subquery with group by",
    r"scalar subquery over a set operation", r"scalar subquery without an aggregate",
    r"correlated aggregate$", r"subquery in an? (left|right|full) join's on",
    r"subquery in an on condition before an outer join", r"^not in( over a nullable column)?$",
    r"without a primary key", r"tablesample", r"data-modifying", r"inherit", r"partition",
    r"non-immutable", r"volatile", r"function in from", r"values in from", r"^\*$",
    r"column aliases", r"with query in a parenthesised join", r"exists over an aggregate subquery",
    r"table of another schema", r" under (or|and|not|case|is)", r"nested subquery predicate",
    r"correlated two levels up", r"correlated subquery in from", r"outer join's on",
    r"correlated on condition in a subquery with an outer join",
)


def documented(construct: str) -> bool:
    c = construct.lower()
    return any(re.search(p, c) for p in DOCUMENTED_REFUSALS)


@dataclass(frozen=True)
class Outcome:
    """What happened to one view under one strategy."""

    status: str  # ok, invalid, refused, mismatch, crash, hang, refusal
    strategy: str = ""
    round_no: int = -1  # -1: at create_view; 0: right after it; n: after round n
    detail: str = ""
    construct: str = ""

    @property
    def finding(self) -> bool:
        return self.status in FINDINGS

    def same_kind(self, other: Outcome) -> bool:
        """Used by the shrinker: a smaller case must fail the same way."""
        if self.status != other.status:
            return False
        if self.status == "refusal":
            return self.construct == other.construct
        if self.status == "crash":
            return _error_class(self.detail) == _error_class(other.detail)
        return True


def _error_class(detail: str) -> str:
    return detail.split(":", 1)[0]


# -- multiset comparison ---------------------------------------------------------------------
def normalize_value(value: Any, places: int = PLACES) -> Any:
    """Canonical form of a value: numbers by value, rounded to ``places`` decimals."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        value = Decimal(repr(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            return str(value)
        rounded = round(value, places)
        if rounded == rounded.to_integral_value():
            return int(rounded)
        return rounded.normalize()
    if isinstance(value, dict | list):
        return repr(value)
    return value


def normalize_rows(rows: Iterable[Sequence[Any]], places: int = PLACES
                   ) -> Counter[tuple[Any, ...]]:
    """The rows as a multiset of normalized tuples."""
    return Counter(tuple(normalize_value(v, places) for v in row) for row in rows)


def diff_text(got: Counter[tuple[Any, ...]], want: Counter[tuple[Any, ...]]) -> str:
    extra = got - want
    missing = want - got
    parts = []
    if extra:
        parts.append("view has extra " + ", ".join(
            f"{r!r}" + (f" x{n}" if n > 1 else "")
            for r, n in sorted(extra.items(), key=repr)[:6]))
    if missing:
        parts.append("view lacks " + ", ".join(
            f"{r!r}" + (f" x{n}" if n > 1 else "")
            for r, n in sorted(missing.items(), key=repr)[:6]))
    return "; ".join(parts) + f" (view {sum(got.values())} rows, query {sum(want.values())})"


# -- PostgreSQL plumbing ---------------------------------------------------------------------
def with_timeout(dsn: str, timeout_ms: int) -> str:
    """``dsn`` with a server-side statement_timeout for every statement of its sessions."""
    return psycopg.conninfo.make_conninfo(dsn, options=f"-c statement_timeout={timeout_ms}")


def new_schema_name(prefix: str = "idivm_fuzz") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def create_schema(conn: psycopg.Connection[Any], name: str, schema: SchemaDef,
                  setup: Sequence[str]) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
    for stmt in (*schema.ddl(), *setup):
        conn.execute(stmt.encode())


def drop_schema(conn: psycopg.Connection[Any], name: str) -> None:
    for s in (name, f"{name}__idivm"):
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


def validate(conn: psycopg.Connection[Any], view_sql: str) -> str | None:
    """PostgreSQL's error for the query (EXPLAIN it, then create it as a view in a rolled-back
    transaction: duplicate column names and the like), or None when it is valid."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(("EXPLAIN " + view_sql).encode())
            conn.execute(("CREATE VIEW idivm_fuzz_probe AS " + view_sql).encode())
    except psycopg.Error as e:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return None


def query_rows(conn: psycopg.Connection[Any], query: str | sql.Composed
               ) -> Counter[tuple[Any, ...]]:
    cur = conn.execute(query.encode() if isinstance(query, str) else query)
    return normalize_rows(cur.fetchall())


def run_round(conn: psycopg.Connection[Any], rnd: Round) -> None:
    """Run a round's transactions; a failing statement is rolled back to a savepoint taken
    just before it; a failing savepoint command aborts its transaction."""
    for txn in rnd:
        conn.execute("BEGIN")
        aborted = False
        for stmt in txn.statements:
            if stmt.startswith(CONTROL):
                try:
                    conn.execute(stmt.encode())
                except psycopg.Error:
                    aborted = True
                    break
                continue
            conn.execute("SAVEPOINT idivm_fuzz_stmt")
            try:
                conn.execute(stmt.encode())
            except psycopg.Error:
                conn.execute("ROLLBACK TO SAVEPOINT idivm_fuzz_stmt")
            conn.execute("RELEASE SAVEPOINT idivm_fuzz_stmt")
        conn.execute("COMMIT" if txn.commit and not aborted else "ROLLBACK")


def classify(e: BaseException, strategy: str, round_no: int) -> Outcome:
    if isinstance(e, UnsupportedSQL):
        status = "refused" if documented(e.construct) else "refusal"
        return Outcome(status, strategy, round_no, str(e), e.construct)
    if isinstance(e, Hang | psycopg.errors.QueryCanceled) or (
            isinstance(e.__cause__, psycopg.errors.QueryCanceled)) or \
            "canceling statement due to statement timeout" in str(e):
        return Outcome("hang", strategy, round_no, f"{type(e).__name__}: {_first(e)}")
    detail = f"{type(e).__name__}: {_first(e)}"
    if e.__cause__ is not None:
        detail += f" (cause: {type(e.__cause__).__name__}: {_first(e.__cause__)[:200]})"
    return Outcome("crash", strategy, round_no, detail)


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return " ".join(text.split())[:400]


class Hang(Exception):
    """idivm's own code (planning, compiling) ran past the per-view deadline."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in this thread after ``seconds`` (SIGALRM; main thread only — the
    server-side statement_timeout covers the database's part everywhere)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal,
                                                                               "setitimer"):
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise Hang(f"no answer within {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- the PostgreSQL oracle -------------------------------------------------------------------
def run_pg(dsn: str, schema: SchemaDef, setup: Sequence[str], views: Sequence[str],
           strategies: Sequence[str], rounds: Sequence[Round], timeout_ms: int = 20_000,
           keep: bool = False) -> list[list[Outcome]]:
    """Outcomes per view, per strategy (views PostgreSQL rejects: one ``invalid`` outcome)."""
    from idivm.postgres import PostgresMaintainer

    name = new_schema_name()
    tdsn = with_timeout(dsn, timeout_ms)
    catalog = Catalog.from_ddl(schema.catalog_ddl())
    with psycopg.connect(tdsn, autocommit=True) as conn:
        try:
            create_schema(conn, name, schema, setup)
            with PostgresMaintainer(tdsn, name) as m:

                def create(vname: str, view_sql: str, strategy: str) -> None:
                    with deadline(3 * timeout_ms / 1000):
                        m.create_view(vname, view_sql, catalog=catalog,
                                      strategy=strategy)  # type: ignore[arg-type]

                results, live = create_views(conn, views, strategies, create,
                                             lambda: _reset(m))
                for round_no in range(len(rounds) + 1):
                    if round_no:
                        run_round(conn, rounds[round_no - 1])
                    for i, j, vname in list(live):
                        outcome = _check(m, conn, name, vname, views[i], strategies[j], round_no,
                                         timeout_ms)
                        if outcome is not None:
                            results[i][j] = outcome
                            live.remove((i, j, vname))
            return results
        finally:
            if not keep:
                try:
                    conn.execute("ROLLBACK") if conn.info.transaction_status else None
                    drop_schema(conn, name)
                except psycopg.Error:
                    pass


def _reset(m: Any) -> None:
    from psycopg.pq import TransactionStatus

    if m.conn.info.transaction_status != TransactionStatus.IDLE:
        m.conn.rollback()


# an ``auto`` view's refreshes, round by round: both branches forced in turn (the model would
# keep one), so a recomputation of the view alone leaves its caches stale, the next refresh
# rebuilds them, the one after runs the Δ-script over the rebuilt caches
AUTO_ROUNDS = ("recompute", "id", "id", "recompute", "auto")


def _check(m: Any, conn: psycopg.Connection[Any], schema: str, vname: str, view_sql: str,
           strategy: str, round_no: int, timeout_ms: int) -> Outcome | None:
    """None when the view matches its recomputation, else the finding."""
    try:
        if round_no:
            with deadline(3 * timeout_ms / 1000):
                if strategy == "auto":
                    m.maintain(vname, strategy=AUTO_ROUNDS[(round_no - 1) % len(AUTO_ROUNDS)])
                else:
                    m.maintain(vname)
        _reset(m)
        got = query_rows(conn, sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, vname)))
    except Exception as e:  # noqa: BLE001
        _reset(m)
        return classify(e, strategy, round_no)
    try:
        want = query_rows(conn, view_sql)
    except psycopg.Error as e:  # the reference itself timed out: not idivm's finding
        return Outcome("invalid", strategy, round_no, f"reference: {_first(e)}")
    if got != want:
        return Outcome("mismatch", strategy, round_no, diff_text(got, want))
    return None


def create_views(conn: psycopg.Connection[Any], views: Sequence[str], strategies: Sequence[str],
                 create: Callable[[str, str, str], None],
                 after_failure: Callable[[], None] | None = None
                 ) -> tuple[list[list[Outcome]], list[tuple[int, int, str]]]:
    """Create every view PostgreSQL accepts under every strategy (``create(name, sql,
    strategy)``): the outcomes per view, and the created ones as (view, strategy index,
    idivm view name)."""
    results: list[list[Outcome]] = []
    live: list[tuple[int, int, str]] = []
    for i, view_sql in enumerate(views):
        error = validate(conn, view_sql)
        if error is not None:
            results.append([Outcome("invalid", "", -1, error)])
            continue
        outs = []
        for j, strategy in enumerate(strategies):
            vname = f"v{i}_{strategy}"
            try:
                create(vname, view_sql, strategy)
                outs.append(Outcome("ok", strategy))
                live.append((i, j, vname))
            except Exception as e:  # noqa: BLE001 - every failure is an outcome
                outs.append(classify(e, strategy, -1))
                if after_failure is not None:
                    after_failure()
        results.append(outs)
    return results, live
