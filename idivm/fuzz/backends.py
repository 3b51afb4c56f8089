"""Oracles of the fresh (C++) and Spark backends. PostgreSQL holds the base tables: each round
runs there, the net change per key of every table (before vs after the round) is fed to the
backend, and the reference is the view's query in PostgreSQL."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fuzz.oracle import (
    Outcome,
    _first,
    classify,
    create_schema,
    create_views,
    diff_text,
    drop_schema,
    new_schema_name,
    normalize_rows,
    query_rows,
    run_round,
    validate,
    with_timeout,
)
from idivm.fuzz.schema import SchemaDef
from idivm.fuzz.workload import Case, Round

if TYPE_CHECKING:
    from idivm.fuzz.run import FuzzOptions
    from idivm.fuzz.shrink import Repro

Rows = dict[tuple[Any, ...], tuple[Any, ...]]


def _snapshot(conn: psycopg.Connection[Any], schema: SchemaDef) -> dict[str, Rows]:
    out: dict[str, Rows] = {}
    for t in schema.tables:
        idx = [i for i, c in enumerate(t.columns) if c.name in t.primary_key]
        cur = conn.execute(sql.SQL("SELECT {} FROM ONLY {}").format(
            sql.SQL(", ").join(sql.Identifier(c.name) for c in t.columns),
            sql.Identifier(t.name)))
        out[t.name] = {tuple(r[i] for i in idx): tuple(r) for r in cur.fetchall()}
    return out


def _changes(before: Rows, after: Rows) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]],
                                                 list[tuple[tuple[Any, ...], tuple[Any, ...]]]]:
    deletes = [r for k, r in before.items() if k not in after]
    inserts = [r for k, r in after.items() if k not in before]
    updates = [(r, after[k]) for k, r in before.items() if k in after and after[k] != r]
    return deletes, inserts, updates


class _PgState:
    """The case's tables in a throwaway PostgreSQL schema."""

    def __init__(self, dsn: str, timeout_ms: int, schema: SchemaDef, setup: Sequence[str]
                 ) -> None:
        self.schema = schema
        self.name = new_schema_name()
        self.conn = psycopg.connect(with_timeout(dsn, timeout_ms), autocommit=True)
        create_schema(self.conn, self.name, schema, setup)

    def close(self) -> None:
        try:
            drop_schema(self.conn, self.name)
        finally:
            self.conn.close()

    def snapshot(self) -> dict[str, Rows]:
        return _snapshot(self.conn, self.schema)

    def reference(self, view_sql: str) -> Any:
        return query_rows(self.conn, view_sql)


# -- fresh views -----------------------------------------------------------------------------
def run_fresh(dsn: str, schema: SchemaDef, setup: Sequence[str], views: Sequence[str],
              rounds: Sequence[Round], timeout_ms: int = 20_000) -> list[list[Outcome]]:
    from idivm.fresh import FreshView

    state = _PgState(dsn, timeout_ms, schema, setup)
    catalog = Catalog.from_ddl(schema.catalog_ddl())
    try:
        results: list[list[Outcome]] = []
        live: list[tuple[int, Any]] = []
        snap = state.snapshot()
        for i, view_sql in enumerate(views):
            error = validate(state.conn, view_sql)
            if error is not None:
                results.append([Outcome("invalid", "", -1, error)])
                continue
            try:
                fv = FreshView.compile(view_sql, catalog)
                for table, rows in snap.items():
                    for row in rows.values():
                        fv.insert(table, row)
            except UnsupportedSQL as e:  # fresh views refuse by name; that is fine
                results.append([Outcome("refused", "auto", -1, str(e), e.construct)])
                continue
            except Exception as e:  # noqa: BLE001
                results.append([classify(e, "auto", -1)])
                continue
            results.append([Outcome("ok", "auto")])
            live.append((i, fv))
        for round_no in range(len(rounds) + 1):
            if round_no:
                run_round(state.conn, rounds[round_no - 1])
                new = state.snapshot()
                deltas = {t: _changes(snap[t], new[t]) for t in new}
                snap = new
            for i, fv in list(live):
                try:
                    if round_no:
                        for table, (dels, ins, ups) in deltas.items():
                            for r in dels:
                                fv.delete(table, r)
                            for old, r in ups:
                                fv.update(table, old, r)
                            for r in ins:
                                fv.insert(table, r)
                    got = normalize_rows(fv.rows())
                except Exception as e:  # noqa: BLE001
                    results[i][0] = classify(e, "auto", round_no)
                    live.remove((i, fv))
                    continue
                want = state.reference(views[i])
                if got != want:
                    results[i][0] = Outcome("mismatch", "auto", round_no, diff_text(got, want))
                    live.remove((i, fv))
        for _, fv in live:
            fv.close()
        return results
    finally:
        state.close()


def fresh_oracle(case: Case, strategies: Sequence[str], opts: FuzzOptions
                 ) -> list[list[Outcome]]:
    return run_fresh(opts.dsn, case.schema, case.setup, case.views, case.rounds,
                     opts.timeout_ms)


def fresh_reproducer(opts: FuzzOptions, target: Outcome) -> Callable[[Repro], bool]:
    def still_fails(r: Repro) -> bool:
        try:
            got = run_fresh(opts.dsn, r.schema, r.setup, [r.view], r.rounds, opts.timeout_ms)
        except psycopg.Error:
            return False
        return target.same_kind(got[0][0])

    return still_fails


# -- Spark -----------------------------------------------------------------------------------
_SESSION: list[Any] = []


def spark_session() -> Any:
    """One embedded session for the whole run (Spark starts slowly)."""
    if not _SESSION:
        from idivm.spark import embedded_session

        _SESSION.append(embedded_session("local[2]", conf={
            "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}))
    return _SESSION[0]


def _spark_schema(catalog: Catalog, table: str) -> str:
    from sqlglot import exp

    t = catalog.table(table)
    return ", ".join(f"`{c.name}` {exp.DataType.build(c.type, dialect='postgres').sql('spark')}"
                     for c in t.columns)


def run_spark(dsn: str, schema: SchemaDef, setup: Sequence[str], views: Sequence[str],
              strategies: Sequence[str], rounds: Sequence[Round], timeout_ms: int = 20_000,
              spark: Any = None) -> list[list[Outcome]]:
    from idivm.spark import SparkMaintainer

    spark = spark if spark is not None else spark_session()
    state = _PgState(dsn, timeout_ms, schema, setup)
    catalog = Catalog.from_ddl(schema.catalog_ddl())
    wh = Path(tempfile.mkdtemp(prefix="idivm_fuzz_wh_"))
    try:
        m = SparkMaintainer(catalog, wh, spark=spark)
        snap = state.snapshot()
        # only the tables some view reads: every load is a Delta commit (slow on Spark)
        read = [t for t in schema.tables if any(re.search(rf"\b{t.name}\b", v) for v in views)]
        for t in read:
            m.load_table(t.name, spark.createDataFrame(list(snap[t.name].values()),
                                                       _spark_schema(catalog, t.name)))
        results, live = create_views(
            state.conn, views, strategies,
            lambda vname, view_sql, strategy: m.create_view(
                vname, view_sql, strategy=strategy))  # type: ignore[arg-type]
        for round_no in range(len(rounds) + 1):
            if round_no:
                # the Δ-script runs on the driver (DuckDB) and as Spark SQL in turn: both
                # engines, and each finding the rows the other wrote ("auto": the driver for
                # these small batches where the view allows it — fuzz seed 30082: a view
                # bucketed by a decimal is refreshed on Spark, not refused)
                m.engine = ("auto", "spark")[(round_no - 1) % 2]
                run_round(state.conn, rounds[round_no - 1])
                new = state.snapshot()
                for t in read:
                    dels, ins, ups = _changes(snap[t.name], new[t.name])
                    feed = [(*r, "delete") for r in dels] + [(*r, "insert") for r in ins]
                    for old, r in ups:
                        feed += [(*old, "update_preimage"), (*r, "update_postimage")]
                    if feed:
                        m.apply_changes(t.name, spark.createDataFrame(
                            feed, _spark_schema(catalog, t.name) + ", _change_type string"))
                snap = new
            for i, j, vname in list(live):
                try:
                    if round_no:
                        m.maintain(vname)
                    got = normalize_rows(tuple(r) for r in m.read_view(vname).collect())
                except Exception as e:  # noqa: BLE001
                    results[i][j] = classify(e, strategies[j], round_no)
                    live.remove((i, j, vname))
                    continue
                try:
                    want = state.reference(views[i])
                except psycopg.Error as e:
                    results[i][j] = Outcome("invalid", strategies[j], round_no, _first(e))
                    live.remove((i, j, vname))
                    continue
                if got != want:
                    results[i][j] = Outcome("mismatch", strategies[j], round_no,
                                            diff_text(got, want))
                    live.remove((i, j, vname))
        return results
    finally:
        state.close()
        shutil.rmtree(wh, ignore_errors=True)


def spark_oracle(case: Case, strategies: Sequence[str], opts: FuzzOptions
                 ) -> list[list[Outcome]]:
    return run_spark(opts.dsn, case.schema, case.setup, case.views, strategies, case.rounds,
                     opts.timeout_ms)


def spark_reproducer(opts: FuzzOptions, target: Outcome) -> Callable[[Repro], bool]:
    def still_fails(r: Repro) -> bool:
        try:
            got = run_spark(opts.dsn, r.schema, r.setup, [r.view], [r.strategy], r.rounds,
                            opts.timeout_ms)
        except psycopg.Error:
            return False
        return target.same_kind(got[0][0])

    return still_fails
