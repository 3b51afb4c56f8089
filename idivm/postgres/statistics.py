"""PostgreSQL's estimates for the planner (``planner.selective.Statistics``).

Whether a σ over a scan that a join reads is stored as a cache depends on how many of the
table's rows φ keeps: asked of PostgreSQL's planner — ``EXPLAIN`` of ``SELECT * FROM t WHERE
φ`` against ``EXPLAIN`` of ``SELECT * FROM t`` — at ``create_view``, from the statistics the
tables have then. Reads only; a statement that fails (a column type the condition does not
fit, a permission) is no estimate, and nothing is cached for it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlglot import exp

from idivm.planner.selective import Candidate

__all__ = ["MIN_TABLE_ROWS", "PgStatistics"]

# a smaller table is read in well under a millisecond: no cache of it pays for its statements
MIN_TABLE_ROWS = 10_000


class PgStatistics:
    """Estimates from PostgreSQL's planner for the tables of ``schema``."""

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

    def selectivity(self, candidate: Candidate) -> float | None:
        table = exp.table_(candidate.table, db=self.schema, quoted=True)
        everything = self._rows(exp.select("*").from_(table.copy()))
        if everything is None or everything < MIN_TABLE_ROWS:
            return None
        kept = self._rows(candidate.query(table))
        return None if kept is None else kept / everything
