"""Differential driver: maintain views with idivm and compare them with recomputation.

After every round of random DML the content of each maintained view (``SELECT * FROM
schema.view``) must equal, as a multiset, the result of running the view's SQL from scratch.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from idivm.fuzz import oracle

from .schemas import SCHEMAS, SchemaDef
from .views import VIEWS_BY_NAME, ViewDef
from .workload import Statement, Workload

# Decimals are compared after rounding to this many places: AVG and other divisions may be
# computed incrementally with a different (but equally valid) number of trailing digits.
DECIMAL_PLACES = 9
DIFF_LIMIT = 10

RowMultiset = Counter[tuple[Any, ...]]


def normalize_value(value: Any) -> Any:
    """Canonical form of a value for multiset comparison (Decimals and floats by value)."""
    return oracle.normalize_value(value, DECIMAL_PLACES)


def normalize_rows(rows: Iterable[Sequence[Any]]) -> RowMultiset:
    """The rows as a multiset of normalized tuples."""
    return oracle.normalize_rows(rows, DECIMAL_PLACES)


def run_query(
    conn: psycopg.Connection[Any], schema: str, query: str | sql.SQL | sql.Composed
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``query`` with ``search_path`` set to ``schema``; return column names and rows."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        cur.execute(query)
        names = [d.name for d in cur.description or ()]
        return names, list(cur.fetchall())


def recompute_rows(conn: psycopg.Connection[Any], schema: str, view_sql: str) -> RowMultiset:
    """The view query evaluated from scratch over the base tables in ``schema``, as a multiset."""
    return normalize_rows(run_query(conn, schema, view_sql)[1])


def maintained_rows(conn: psycopg.Connection[Any], schema: str, view: str) -> RowMultiset:
    """The current content of the maintained view ``schema.view``, as a multiset."""
    query = sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, view))
    return normalize_rows(run_query(conn, schema, query)[1])


def render_statement(conn: psycopg.Connection[Any], stmt: Statement) -> str:
    """A statement with its parameters merged in, for error messages."""
    query, params = stmt
    try:
        return psycopg.ClientCursor(conn).mogrify(query, params)
    except Exception:  # rendering must never hide the real failure
        return f"{query.as_string(conn)}  -- params {params!r}"


def _format_rows(rows: RowMultiset) -> list[str]:
    lines = []
    for row, count in sorted(rows.items(), key=repr)[:DIFF_LIMIT]:
        lines.append(f"    {row!r}" + (f"  x{count}" if count > 1 else ""))
    total = sum(rows.values())
    if total > DIFF_LIMIT:
        lines.append(f"    ... ({total} rows in all)")
    return lines


def _context(
    conn: psycopg.Connection[Any],
    view: ViewDef,
    seed: int,
    round_no: int,
    statements: Sequence[Statement],
) -> list[str]:
    lines = [
        f"view {view.name!r} (schema {view.schema!r}), seed {seed}, round {round_no}",
        f"view SQL: {' '.join(view.sql.split())}",
    ]
    if round_no == 0:
        lines.append("(round 0 = right after create_view on the initial data)")
    else:
        lines.append(f"statements of round {round_no}:")
        lines.extend(f"    {render_statement(conn, s)};" for s in statements)
    return lines


def compare_view(
    conn: psycopg.Connection[Any],
    schema: str,
    view: ViewDef,
    seed: int,
    round_no: int,
    statements: Sequence[Statement],
) -> None:
    """Raise AssertionError with a readable diff if the view differs from its recomputation."""
    expected_cols, expected_raw = run_query(conn, schema, view.sql)
    actual_cols, actual_raw = run_query(
        conn, schema, sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, view.name))
    )
    expected, actual = normalize_rows(expected_raw), normalize_rows(actual_raw)
    if expected_cols == actual_cols and expected == actual:
        return
    lines = ["maintained view differs from recomputation:"]
    lines += _context(conn, view, seed, round_no, statements)
    if expected_cols != actual_cols:
        lines.append(f"columns: view has {actual_cols}, query yields {expected_cols}")
    missing, extra = expected - actual, actual - expected
    if missing or extra:
        lines.append(
            f"{sum(expected.values())} rows expected, {sum(actual.values())} rows maintained"
        )
        lines.append(f"missing rows (in recomputation, not in view): {sum(missing.values())}")
        lines += _format_rows(missing)
        lines.append(f"extra rows (in view, not in recomputation): {sum(extra.values())}")
        lines += _format_rows(extra)
    raise AssertionError("\n".join(lines))


def reset_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Drop and recreate ``schema`` (and idivm's ``<schema>__idivm``), leaving it empty."""
    for name in (f"{schema}__idivm", schema):
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


def create_tables(conn: psycopg.Connection[Any], schema: str, schema_def: SchemaDef) -> None:
    """Create the base tables of ``schema_def`` inside ``schema``."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        for stmt in schema_def.statements():
            cur.execute(stmt)


def apply_statements(
    conn: psycopg.Connection[Any], statements: Sequence[Statement], single_transaction: bool
) -> None:
    """Execute a batch, either in one transaction or statement by statement (autocommit)."""
    if single_transaction:
        with conn.transaction(), conn.cursor() as cur:
            for query, params in statements:
                cur.execute(query, params)
    else:
        with conn.cursor() as cur:
            for query, params in statements:
                cur.execute(query, params)


def setup_base_tables(
    conn: psycopg.Connection[Any], schema: str, schema_key: str, seed: int, scale: float = 1.0
) -> Workload:
    """Fresh ``schema`` with the base tables and initial data; returns the positioned workload."""
    reset_schema(conn, schema)
    create_tables(conn, schema, SCHEMAS[schema_key])
    workload = Workload(schema_key, schema, seed, scale)
    apply_statements(conn, workload.initial_statements(), single_transaction=True)
    return workload


def run_differential(
    dsn: str,
    schema: str,
    schema_key: str,
    view_names: Sequence[str],
    seed: int,
    rounds: int,
    ops_per_round: int,
    strategy: str = "id",
) -> None:
    """Maintain ``view_names`` through ``rounds`` random DML rounds, checking after each round.

    ``schema`` is (re)created from scratch. Even rounds run as one transaction, odd rounds in
    autocommit mode. Raises AssertionError on the first divergence.
    """
    # Imported lazily: the rest of this package works without idivm's backend.
    maintainer_cls = importlib.import_module("idivm.postgres").PostgresMaintainer

    views = [VIEWS_BY_NAME[n] for n in view_names]
    for view in views:
        if view.schema != schema_key:
            raise ValueError(f"view {view.name} is over schema {view.schema}, not {schema_key}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        workload = setup_base_tables(conn, schema, schema_key, seed)
        maintainer = maintainer_cls(dsn, schema=schema)
        created: list[str] = []
        ok = False
        try:
            for view in views:
                maintainer.create_view(view.name, view.sql, strategy=strategy)
                created.append(view.name)
                compare_view(conn, schema, view, seed, 0, ())
            for round_no in range(1, rounds + 1):
                batch = workload.next_round(ops_per_round)
                apply_statements(conn, batch, single_transaction=round_no % 2 == 0)
                for view in views:
                    try:
                        maintainer.maintain(view.name)
                    except Exception as exc:
                        exc.add_note("\n".join(_context(conn, view, seed, round_no, batch)))
                        raise
                for view in views:
                    compare_view(conn, schema, view, seed, round_no, batch)
            ok = True
        finally:
            _cleanup(maintainer, created, raise_errors=ok)


def _cleanup(maintainer: Any, views: Sequence[str], raise_errors: bool) -> None:
    """Drop the views and close the maintainer; errors are swallowed while a failure propagates."""
    try:
        for name in reversed(views):
            maintainer.drop_view(name)
    except Exception:
        if raise_errors:
            raise
    finally:
        try:
            maintainer.close()
        except Exception:
            if raise_errors:
                raise
