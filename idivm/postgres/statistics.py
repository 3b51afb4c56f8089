"""PostgreSQL's estimates for the planner (``planner.selective.Statistics``).

Whether a σ over a scan that a join reads is stored as a cache (or filters a fold) depends on
how many of the table's rows φ keeps, asked at ``create_view``: the table's size from
PostgreSQL's planner (``EXPLAIN`` of ``SELECT * FROM t``), the fraction φ keeps counted on a
block sample of about ``SAMPLE_ROWS`` rows (``TABLESAMPLE SYSTEM … REPEATABLE``: the same
blocks for the same table, so the same choice for the same data). The planner's own estimate
of φ — from a histogram of ~100 values sampled by the last ANALYZE — moved TPC-H's
``p_name LIKE '%green%'`` (5.4% of the rows) between 3% and 8% over eight ANALYZEs of SF 1's
``part``, and past the cache threshold (10%) in one benchmark run: Q9 then refreshed without
its cache of ``part`` (by hand, side by side: 233 ms against 79 with it). The planner's
estimate stays where the sample cannot be read (a view: no TABLESAMPLE) or holds too few
rows. Reads only; a statement that fails (a column type the condition does not fit, a
permission) is no estimate, and nothing is cached for it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlglot import exp

from idivm.planner.selective import Candidate

__all__ = ["MIN_TABLE_ROWS", "SAMPLE_ROWS", "PgStatistics"]

# a smaller table is read in well under a millisecond: no cache of it pays for its statements
MIN_TABLE_ROWS = 10_000

# rows of the block sample φ is counted on (ANALYZE's own sample at the default statistics
# target): the fraction's standard error at 10% is ~0.2% for rows in random order; below
# MIN_SAMPLED rows read (a table much smaller than the planner thinks) the planner's estimate
SAMPLE_ROWS = 30_000
MIN_SAMPLED = 1_000


class PgStatistics:
    """Selectivities for the tables of ``schema``: counted on a block sample, or PostgreSQL's
    planner's estimates."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn, self.schema = conn, schema

    def _rows(self, query: exp.Select) -> float | None:
        try:
            with self.conn.transaction():
                row = self.conn.execute("EXPLAIN (FORMAT JSON) " + query.sql("postgres")
                                        ).fetchone()
        except psycopg.Error:
            return None
        if not row:
            return None
        plan = row[0]
        plan = plan[0] if isinstance(plan, list) else plan
        return float(plan["Plan"]["Plan Rows"])

    def _sampled(self, candidate: Candidate, table: exp.Table, rows: float) -> float | None:
        """The fraction of a block sample's rows φ keeps (None: unreadable, or too few)."""
        pct = min(100.0, 100.0 * SAMPLE_ROWS / rows)
        sampled = table.copy()
        sampled.set("sample", exp.TableSample(
            method=exp.var("SYSTEM"), percent=exp.Literal.number(f"{pct:.6g}"),
            seed=exp.Literal.number(0)))
        query = exp.select(
            exp.Filter(this=exp.Count(this=exp.Star()),
                       expression=exp.Where(this=candidate.predicate.copy())),
            exp.Count(this=exp.Star())).from_(sampled)
        try:
            with self.conn.transaction():
                row = self.conn.execute(query.sql("postgres")).fetchone()
        except psycopg.Error:
            return None
        if not row or not row[1] or row[1] < MIN_SAMPLED:
            return None
        return float(row[0]) / float(row[1])

    def selectivity(self, candidate: Candidate) -> float | None:
        table = exp.table_(candidate.table, db=self.schema, quoted=True)
        everything = self._rows(exp.select("*").from_(table.copy()))
        if everything is None or everything < MIN_TABLE_ROWS:
            return None
        sampled = self._sampled(candidate, table, everything)
        if sampled is not None:
            return sampled
        kept = self._rows(candidate.query(table))
        return None if kept is None else kept / everything
