"""``idivm bench tpch``: the TPC-H queries as idivm views on PostgreSQL.

TPC-H at scale factor ``sf`` is generated with DuckDB (``CALL dbgen``), exported as CSV and
loaded with ``COPY`` into a fresh schema (``tpch_bench``) with the specification's primary
keys, then ANALYZEd. Each of the 22 queries (ORDER BY / LIMIT removed) is planned with
``idivm.plan``: a refusal (``IdivmError``) is listed with its message; any other exception is a
planner bug, recorded as a "planner exception" with its type and message, and the run goes on.

Per accepted query: the plan time (median of 3), the Δ-script's lines, the create time of an
``id`` and a ``tuple`` view (``q<N>_id``, ``q<N>_tuple``), then ``rounds`` refresh rounds. A
round is one batch in TPC-H's shape, applied in one transaction:

- RF1: 0.1% new orders (keys beyond the largest) copied from random existing orders with a
  perturbed date, customer and price, each with its source order's 1–7 lineitems;
- updates of non-key columns: lineitem price / discount / ship date / return flag, order status
  and date, customer segment and balance, part retail price, supplier balance; and of foreign
  keys: ``o_custkey`` to another customer that may have orders, ``l_suppkey`` to another
  supplier of the same part (one with a ``partsupp`` row);
- RF2: 0.1% of the existing orders deleted with their lineitems.

Then, in an order rotated each round: ``maintain`` of the id view, of the tuple view, and the
recomputation (``CREATE TEMP TABLE … AS <query>``, timed). After every round (and once after
creating) both views are compared with the recomputed rows as multisets; columns holding
fractions (floats, or numerics with more than 8 decimals: averages, ratios) are compared to 6
significant digits. A difference is a correctness failure: shown in the table and the JSON, and
the exit code is 1.

A maintain over ``MAINTAIN_LIMIT_S`` (or a ``create_view`` over ``CREATE_LIMIT_S``) is recorded
as a timeout and the query's remaining rounds are skipped; the limits are also the
``statement_timeout`` of the maintainer's connection. Every benchmark connection runs with
``jit = off``, as idivm's compiled maintenance does.

Exit code: 0 when every maintained view verified, 1 on a mismatch, a planner exception or an
error creating or maintaining a view (timeouts alone are reported, not failed).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeAlias

import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import idivm
from idivm.bench import pyplot, step
from idivm.bench.tpch import TABLES, TPCH_DDL, load_tpch_extension
from idivm.bench.tpch import queries as tpch_queries
from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.planner.model import Strategy
from idivm.postgres import PostgresMaintainer

Conn: TypeAlias = "psycopg.Connection[Any]"

DEFAULT_SCHEMA = "tpch_bench"
SEED = 20150531
PLAN_REPEAT = 3
MAINTAIN_LIMIT_S = 60.0
CREATE_LIMIT_S = 120.0
RECOMPUTE_TIMEOUT_S = 600.0
STRATEGIES: tuple[Strategy, ...] = ("id", "tuple")
COLUMNS = ("id", "tuple", "recompute")
SIGNIFICANT = 6  # digits compared in fractional columns
FRACTION_EXPONENT = -8  # a numeric with more decimals than this is a fraction (avg, ratio)

SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
ORDER_STATUS = ("F", "O", "P")
RETURN_FLAGS = ("A", "N", "R")


class BenchError(IdivmError):
    """The benchmark could not set up (DuckDB missing, data not loaded, ...)."""


# -- data -------------------------------------------------------------------------------------
def _connect(dsn: str, schema: str | None = None) -> Conn:
    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    # no server-side prepared statements: the same text (SELECT * FROM pg_temp.expected)
    # returns another row type for every query
    conn.prepare_threshold = None
    conn.execute("SET jit = off")
    if schema is not None:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    return conn


def drop_schema(dsn: str, schema: str) -> None:
    """Drop the benchmark schema and its idivm companion."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for s in (schema, f"{schema}__idivm"):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


# dbgen at a small SF (below ~0.005) repeats some (ps_partkey, ps_suppkey): keep one of each
EXPORT = {"partsupp": "SELECT * FROM partsupp QUALIFY row_number() OVER (PARTITION BY "
                      "ps_partkey, ps_suppkey ORDER BY ps_availqty, ps_supplycost, ps_comment) = 1"}


def load(conn: Conn, sf: float) -> dict[str, Any]:
    """Generate TPC-H at ``sf`` with DuckDB and COPY it (as CSV) into the connection's schema;
    returns the seconds per phase and the rows per table."""
    try:
        import duckdb
    except ImportError as e:
        raise BenchError("duckdb is not installed (pip install duckdb duckdb-ext-tpch)") from e
    out: dict[str, Any] = {"rows": {}}
    t0 = time.perf_counter()
    dk = duckdb.connect()
    try:
        dk.execute("SET enable_progress_bar = false")
        load_tpch_extension(dk)
        dk.execute(f"CALL dbgen(sf={float(sf)!r})")
        out["generate_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="idivm_tpch_") as tmp, conn.transaction():
            conn.execute(TPCH_DDL)
            for t in TABLES:
                path = Path(tmp) / f"{t}.csv"
                dk.execute(f"COPY ({EXPORT.get(t, f'SELECT * FROM {t}')}) TO '{path}' "
                           "(FORMAT csv, HEADER false)")
                with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT csv)")
                                                    .format(sql.Identifier(t))) as cp, \
                        path.open("rb") as f:
                    while chunk := f.read(1 << 20):
                        cp.write(chunk)
                path.unlink()
        out["copy_s"] = time.perf_counter() - t1
    finally:
        dk.close()
    t2 = time.perf_counter()
    for t in TABLES:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(t)))
    out["analyze_s"] = time.perf_counter() - t2
    for t in TABLES:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))
                           ).fetchone()
        out["rows"][t] = int(row[0]) if row else 0
    if not out["rows"]["orders"] or not out["rows"]["lineitem"]:
        raise BenchError(f"TPC-H at SF {sf:g} has no orders or lineitems: use a larger --sf")
    return out


# -- refresh batches --------------------------------------------------------------------------
INSERT_ORDERS = """
INSERT INTO orders
SELECT u.k, u.c, o.o_orderstatus, round(o.o_totalprice * u.f, 2), o.o_orderdate + u.shift,
       o.o_orderpriority, o.o_clerk, o.o_shippriority, o.o_comment
FROM unnest(%s::int[], %s::int[], %s::int[], %s::numeric[], %s::int[]) u(src, k, c, f, shift)
JOIN orders o ON o.o_orderkey = u.src
"""
INSERT_LINEITEMS = """
INSERT INTO lineitem
SELECT u.k, l.l_partkey, l.l_suppkey, l.l_linenumber, l.l_quantity,
       round(l.l_extendedprice * u.f, 2), l.l_discount, l.l_tax, l.l_returnflag,
       l.l_linestatus, l.l_shipdate + u.shift, l.l_commitdate + u.shift,
       l.l_receiptdate + u.shift, l.l_shipinstruct, l.l_shipmode, l.l_comment
FROM unnest(%s::int[], %s::int[], %s::numeric[], %s::int[]) u(src, k, f, shift)
JOIN lineitem l ON l.l_orderkey = u.src
"""
UPDATE_LINEITEMS = """
UPDATE lineitem l SET l_extendedprice = round(l.l_extendedprice * u.f, 2),
       l_discount = coalesce(u.d, l.l_discount), l_shipdate = l.l_shipdate + u.shift,
       l_returnflag = coalesce(u.rf, l.l_returnflag)
FROM unnest(%s::int[], %s::int[], %s::numeric[], %s::numeric[], %s::int[], %s::text[])
     u(ok, ln, f, d, shift, rf)
WHERE l.l_orderkey = u.ok AND l.l_linenumber = u.ln
"""
UPDATE_SUPPKEYS = """
UPDATE lineitem l SET l_suppkey = u.s
FROM unnest(%s::int[], %s::int[], %s::int[]) u(ok, ln, s)
WHERE l.l_orderkey = u.ok AND l.l_linenumber = u.ln
"""
UPDATE_ORDERS = """
UPDATE orders o SET o_orderstatus = coalesce(u.st, o.o_orderstatus),
       o_orderdate = o.o_orderdate + u.shift
FROM unnest(%s::int[], %s::text[], %s::int[]) u(k, st, shift) WHERE o.o_orderkey = u.k
"""
UPDATE_CUSTKEYS = """
UPDATE orders o SET o_custkey = u.c FROM unnest(%s::int[], %s::int[]) u(k, c)
WHERE o.o_orderkey = u.k
"""
UPDATE_CUSTOMERS = """
UPDATE customer c SET c_mktsegment = coalesce(u.seg, c.c_mktsegment), c_acctbal = u.bal
FROM unnest(%s::int[], %s::text[], %s::numeric[]) u(k, seg, bal) WHERE c.c_custkey = u.k
"""
UPDATE_PARTS = """
UPDATE part p SET p_retailprice = round(p.p_retailprice * u.f, 2)
FROM unnest(%s::int[], %s::numeric[]) u(k, f) WHERE p.p_partkey = u.k
"""
UPDATE_SUPPLIERS = """
UPDATE supplier s SET s_acctbal = u.bal
FROM unnest(%s::int[], %s::numeric[]) u(k, bal) WHERE s.s_suppkey = u.k
"""
DELETE_LINEITEMS = "DELETE FROM lineitem WHERE l_orderkey = ANY(%s::int[])"
DELETE_ORDERS = "DELETE FROM orders WHERE o_orderkey = ANY(%s::int[])"


def batch_sizes(orders: int) -> dict[str, int]:
    """Rows per kind of change in one batch, for a database of ``orders`` orders."""
    n = max(1, round(orders * 0.001))
    return {"rf1 orders": n, "rf2 orders": n, "lineitem updates": 2 * n,
            "lineitem l_suppkey": max(1, n // 10), "orders updates": max(1, n // 2),
            "orders o_custkey": max(1, n // 10), "customer updates": max(1, n // 5),
            "part updates": max(1, n // 5), "supplier updates": max(1, n // 50)}


def _money(rng: random.Random, lo: float, hi: float) -> Decimal:
    return Decimal(f"{rng.uniform(lo, hi):.2f}")


def _factor(rng: random.Random) -> Decimal:
    return Decimal(f"{rng.uniform(0.9, 1.1):.4f}")


@dataclass
class Batch:
    """One refresh batch: statements (run in one transaction) and what they change."""

    steps: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


class Refresher:
    """Builds TPC-H-shaped refresh batches from a seeded generator; keeps track of the order
    keys that exist (RF1 adds, RF2 removes)."""

    def __init__(self, conn: Conn, seed: int) -> None:
        self.conn = conn
        self.rng = random.Random(seed)
        self.orderkeys = sorted(int(r[0]) for r in conn.execute(
            "SELECT o_orderkey FROM orders").fetchall())
        self.next_key = (self.orderkeys[-1] if self.orderkeys else 0) + 1
        self.n = {t: self._max(t, k) for t, k in (("customer", "c_custkey"),
                                                     ("part", "p_partkey"),
                                                     ("supplier", "s_suppkey"))}
        self.sizes = batch_sizes(len(self.orderkeys))

    def _max(self, table: str, key: str) -> int:
        row = self.conn.execute(sql.SQL("SELECT coalesce(max({}), 0) FROM {}").format(
            sql.Identifier(key), sql.Identifier(table))).fetchone()
        return int(row[0]) if row else 0

    def _customer(self) -> int:
        """A customer that may place orders (TPC-H: custkeys divisible by 3 have none)."""
        n = self.n["customer"]
        while True:
            c = self.rng.randint(1, n)
            if c % 3 or n < 3:
                return c

    def _sample(self, k: int) -> list[int]:
        return self.rng.sample(self.orderkeys, min(k, len(self.orderkeys)))

    def build(self) -> Batch:
        rng, sz, b = self.rng, self.sizes, Batch()
        # RF1: new orders copied from existing ones, with their lineitems
        src = self._sample(sz["rf1 orders"])
        new = list(range(self.next_key, self.next_key + len(src)))
        self.next_key += len(src)
        cust = [self._customer() for _ in src]
        fac = [_factor(rng) for _ in src]
        shift = [rng.randint(-60, 60) for _ in src]
        b.steps.append((INSERT_ORDERS, (src, new, cust, fac, shift)))
        b.steps.append((INSERT_LINEITEMS, (src, new, fac, shift)))
        # updates of lineitems: one line of each sampled order; each column changes or not
        lines = self._lines(self._sample(sz["lineitem updates"]))
        ok, ln, f, d, sh, rf = [], [], [], [], [], []
        for o, n_, _p, _s in lines:
            what = rng.choice(("price", "discount", "shipdate", "flag", "all"))
            ok.append(o)
            ln.append(n_)
            f.append(_factor(rng) if what in ("price", "all") else Decimal(1))
            d.append(Decimal(rng.randint(0, 10)) / 100 if what in ("discount", "all") else None)
            sh.append(rng.randint(-30, 30) if what in ("shipdate", "all") else 0)
            rf.append(rng.choice(RETURN_FLAGS) if what in ("flag", "all") else None)
        b.steps.append((UPDATE_LINEITEMS, (ok, ln, f, d, sh, rf)))
        # foreign key: l_suppkey to another supplier of the same part
        moved = self._new_suppliers(self._lines(self._sample(sz["lineitem l_suppkey"])))
        b.steps.append((UPDATE_SUPPKEYS, tuple(list(x) for x in zip(*moved, strict=True))
                        if moved else ([], [], [])))
        # orders: status and date; foreign key o_custkey
        keys = self._sample(sz["orders updates"])
        b.steps.append((UPDATE_ORDERS, (keys, [rng.choice(ORDER_STATUS) for _ in keys],
                                        [rng.randint(-45, 45) for _ in keys])))
        keys_c = self._sample(sz["orders o_custkey"])
        b.steps.append((UPDATE_CUSTKEYS, (keys_c, [self._customer() for _ in keys_c])))
        # dimensions
        custs = rng.sample(range(1, self.n["customer"] + 1),
                           min(sz["customer updates"], self.n["customer"]))
        b.steps.append((UPDATE_CUSTOMERS, (custs, [rng.choice(SEGMENTS) if rng.random() < 0.5
                                                   else None for _ in custs],
                                           [_money(rng, -999.99, 9999.99) for _ in custs])))
        parts = rng.sample(range(1, self.n["part"] + 1), min(sz["part updates"], self.n["part"]))
        b.steps.append((UPDATE_PARTS, (parts, [_factor(rng) for _ in parts])))
        supps = rng.sample(range(1, self.n["supplier"] + 1),
                           min(sz["supplier updates"], self.n["supplier"]))
        b.steps.append((UPDATE_SUPPLIERS, (supps, [_money(rng, -999.99, 9999.99)
                                                   for _ in supps])))
        # RF2: existing orders deleted with their lineitems (some were updated above)
        gone = self._sample(sz["rf2 orders"])
        b.steps.append((DELETE_LINEITEMS, (gone,)))
        b.steps.append((DELETE_ORDERS, (gone,)))
        gone_set = set(gone)
        self.orderkeys = [k for k in self.orderkeys if k not in gone_set] + new
        b.counts = {"rf1 orders": len(new), "rf2 orders": len(gone),
                    "lineitem updates": len(ok), "lineitem l_suppkey": len(moved),
                    "orders updates": len(keys), "orders o_custkey": len(keys_c),
                    "customer updates": len(custs), "part updates": len(parts),
                    "supplier updates": len(supps)}
        return b

    def _lines(self, orders: Sequence[int]) -> list[tuple[int, int, int, int]]:
        """One random lineitem (orderkey, linenumber, partkey, suppkey) of each order."""
        by: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
        for o, n, p, s in self.conn.execute(
                "SELECT l_orderkey, l_linenumber, l_partkey, l_suppkey FROM lineitem "
                "WHERE l_orderkey = ANY(%s::int[]) ORDER BY 1, 2", (list(orders),)).fetchall():
            by[int(o)].append((int(o), int(n), int(p), int(s)))
        return [self.rng.choice(by[o]) for o in orders if by.get(o)]

    def _new_suppliers(self, lines: Sequence[tuple[int, int, int, int]]
                       ) -> list[tuple[int, int, int]]:
        """(orderkey, linenumber, another supplier of the line's part)."""
        alt: dict[int, list[int]] = defaultdict(list)
        for p, s in self.conn.execute(
                "SELECT ps_partkey, ps_suppkey FROM partsupp WHERE ps_partkey = ANY(%s::int[]) "
                "ORDER BY 1, 2", ([x[2] for x in lines],)).fetchall():
            alt[int(p)].append(int(s))
        out = []
        for o, n, p, s in lines:
            others = [x for x in alt.get(p, []) if x != s]
            if others:
                out.append((o, n, self.rng.choice(others)))
        return out


def apply_batch(conn: Conn, batch: Batch) -> float:
    """Run the batch in one transaction; seconds including the commit."""
    t0 = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        for query, params in batch.steps:
            cur.execute(query, params)
    return time.perf_counter() - t0


# -- verification -----------------------------------------------------------------------------
def _is_fraction(v: object) -> bool:
    if isinstance(v, float):
        return True
    if isinstance(v, Decimal) and v.is_finite():
        exp_ = v.as_tuple().exponent
        return isinstance(exp_, int) and exp_ < FRACTION_EXPONENT
    return False


def _round(v: object) -> object:
    if v is None:
        return None
    if isinstance(v, float | Decimal):
        x = float(v)
        return float(f"{x:.{SIGNIFICANT}g}") if math.isfinite(x) else x
    return v


def _close(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, float | int | Decimal) and isinstance(b, float | int | Decimal):
        return math.isclose(float(a), float(b), rel_tol=10.0 ** (1 - SIGNIFICANT),
                            abs_tol=1e-9)
    return a == b


def compare(got: Sequence[Sequence[Any]], want: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """``got`` and ``want`` as multisets of rows. Columns with a fraction anywhere (a float, or
    a numeric with more than 8 decimals) are compared to 6 significant digits; the others
    exactly. Returns ``{"equal", "only_view", "only_expected", "examples"}``."""
    width = len(want[0]) if want else len(got[0]) if got else 0
    if any(len(r) != width for r in (*got, *want)):
        return {"equal": False, "only_view": len(got), "only_expected": len(want),
                "examples": ["the view and the query have different columns"]}
    frac = [any(_is_fraction(r[i]) for r in (*got, *want)) for i in range(width)]

    def key(r: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(_round(v) if f else v for v, f in zip(r, frac, strict=True))

    cg, cw = Counter(key(r) for r in got), Counter(key(r) for r in want)
    left_g, left_w = list((cg - cw).elements()), list((cw - cg).elements())
    # rounding puts near-equal values on either side of a digit: pair what is left within
    # the tolerance, by the exact columns
    if left_g and left_w:
        def exact(r: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(v for v, f in zip(r, frac, strict=True) if not f)
        pool: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
        for r in left_w:
            pool[exact(r)].append(r)
        unmatched = []
        for r in left_g:
            cands = pool.get(exact(r), [])
            hit = next((i for i, w in enumerate(cands)
                        if all(_close(a, b) for a, b in zip(r, w, strict=True))), None)
            if hit is None:
                unmatched.append(r)
            else:
                cands.pop(hit)
        left_g, left_w = unmatched, [r for rs in pool.values() for r in rs]
    return {"equal": not left_g and not left_w, "only_view": len(left_g),
            "only_expected": len(left_w),
            "examples": [f"view only: {r!r}" for r in left_g[:3]]
            + [f"expected only: {r!r}" for r in left_w[:3]]}


# -- measurements -----------------------------------------------------------------------------
def _stats(xs: Sequence[float]) -> dict[str, float] | None:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None


def _timed_out(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, psycopg.errors.QueryCanceled):
            return True
        e = e.__cause__  # type: ignore[assignment]
    return False


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip()}"


class QueryRun:
    """One accepted query: its two views, rounds, verification."""

    def __init__(self, nr: int, view_sql: str, conn: Conn, m: PostgresMaintainer,
                 catalog: Catalog, schema: str, refresher: Refresher, progress: Progress,
                 task: Any) -> None:
        self.nr, self.sql, self.conn, self.m = nr, view_sql, conn, m
        self.catalog, self.schema, self.refresher = catalog, schema, refresher
        self.progress, self.task = progress, task
        self.rec: dict[str, Any] = {"create_s": {}, "rounds": [], "errors": [],
                                    "timeouts": [], "mismatches": []}
        self.created: list[str] = []

    def name(self, strategy: str) -> str:
        return f"q{self.nr}_{strategy}"

    def _say(self, what: str) -> None:
        self.progress.update(self.task, description=f"q{self.nr}: {what}")

    def create(self) -> list[str]:
        """Both views; returns the strategies to maintain: those created (an error is recorded
        and the other strategy still runs), none when a create took too long."""
        live: list[str] = []
        slow = False
        for st in STRATEGIES:
            self._say(f"create ({st})")
            self.m.conn.execute(f"SET statement_timeout = '{int(CREATE_LIMIT_S * 1000)}ms'")
            t0 = time.perf_counter()
            try:
                self.m.create_view(self.name(st), self.sql, catalog=self.catalog, strategy=st)
            except Exception as e:  # recorded, the run goes on
                took = time.perf_counter() - t0
                if _timed_out(e):
                    self.rec["timeouts"].append(f"create {st}: cancelled after {took:.0f} s "
                                                f"(statement_timeout {CREATE_LIMIT_S:.0f} s)")
                    slow = True
                else:
                    self.rec["errors"].append(f"create {st}: {_err(e)}")
                continue
            took = time.perf_counter() - t0
            self.created.append(self.name(st))
            self.rec["create_s"][st] = took
            live.append(st)
            if took > CREATE_LIMIT_S:
                self.rec["timeouts"].append(f"create {st}: {took:.0f} s > "
                                            f"{CREATE_LIMIT_S:.0f} s")
                slow = True
        self.m.conn.execute(f"SET statement_timeout = '{int(MAINTAIN_LIMIT_S * 1000)}ms'")
        if slow and live:
            self.rec["skipped_rounds"] = "all (a create took too long)"
        return [] if slow else live

    def reads(self) -> dict[str, int]:
        """Rows read so far from each table of the schema and its companion (sequential
        scans' tuples plus index fetches), as the statistics collector counts them; the
        maintainer's session flushes its counts at its next commit."""
        self.m.conn.execute("SELECT pg_stat_force_next_flush()")
        with self.conn.transaction():
            self.conn.execute("SELECT pg_stat_clear_snapshot()")
            rows = self.conn.execute(
                "SELECT schemaname || '.' || relname, coalesce(seq_tup_read, 0) + "
                "coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables WHERE schemaname IN "
                "(%s, %s)", (self.schema, f"{self.schema}__idivm")).fetchall()
        return {str(k): int(v) for k, v in rows}

    def recompute(self) -> tuple[float, list[tuple[Any, ...]]]:
        """The query's rows, into a temp table (timed), then fetched."""
        self.conn.execute("DROP TABLE IF EXISTS pg_temp.expected")
        t0 = time.perf_counter()
        self.conn.execute(sql.SQL("CREATE TEMP TABLE expected AS {}").format(sql.SQL(self.sql)))
        took = time.perf_counter() - t0
        rows = self.conn.execute("SELECT * FROM pg_temp.expected").fetchall()
        self.conn.execute("DROP TABLE pg_temp.expected")
        return took, rows

    def verify(self, where: str, expected: Sequence[tuple[Any, ...]],
               strategies: Sequence[str]) -> dict[str, bool]:
        out = {}
        for st in strategies:
            got = self.conn.execute(sql.SQL("SELECT * FROM {}").format(
                sql.Identifier(self.schema, self.name(st)))).fetchall()
            cmp = compare(got, expected)
            out[st] = bool(cmp["equal"])
            if not cmp["equal"]:
                self.rec["mismatches"].append({"view": self.name(st), "where": where, **cmp})
        return out

    def rounds(self, rounds: int, live: list[str]) -> None:
        """``live``: the strategies maintained (until one fails or times out)."""
        self._say("verify after create")
        _, expected = self.recompute()
        self.rec["rows_initial"] = len(expected)
        self.rec["verified_initial"] = self.verify("after create", expected, live)
        for r in range(rounds):
            self._say(f"round {r + 1}/{rounds}")
            batch = self.refresher.build()
            shift = r % len(COLUMNS)
            order = list(COLUMNS[shift:] + COLUMNS[:shift])
            rec: dict[str, Any] = {"round": r + 1, "batch": batch.counts, "order": order,
                                   "apply_s": apply_batch(self.conn, batch)}
            stop = False
            expected_rows: list[tuple[Any, ...]] | None = None
            for col in order:
                if col == "recompute":
                    rec["recompute_s"], expected_rows = self.recompute()
                    rec["rows"] = len(expected_rows)
                    continue
                if col not in live:
                    continue
                before = self.reads() if col == "id" else None
                t0 = time.perf_counter()
                try:
                    stats = self.m.maintain(self.name(col))
                except Exception as e:  # recorded, the run goes on
                    took = time.perf_counter() - t0
                    if _timed_out(e):
                        self.rec["timeouts"].append(
                            f"round {r + 1} maintain {col}: cancelled after {took:.0f} s "
                            f"(statement_timeout {MAINTAIN_LIMIT_S:.0f} s)")
                    else:
                        self.rec["errors"].append(f"round {r + 1} maintain {col}: {_err(e)}")
                    live.remove(col)
                    stop = True
                    continue
                took = time.perf_counter() - t0
                rec[col] = {"s": took, "stats_s": stats.seconds, "changes": stats.changes,
                            "idiff_rows": stats.idiff_rows, "applied_rows": stats.applied_rows,
                            "statement_seconds": stats.statement_seconds}
                if before is not None:
                    rec[col]["rows_read"] = read_since(before, self.reads())
                if took > MAINTAIN_LIMIT_S:
                    self.rec["timeouts"].append(f"round {r + 1} maintain {col}: {took:.0f} s > "
                                                f"{MAINTAIN_LIMIT_S:.0f} s")
                    stop = True
            assert expected_rows is not None
            rec["verified"] = self.verify(f"round {r + 1}", expected_rows,
                                          [c for c in live if c in rec])
            self.rec["rounds"].append(rec)
            if stop or not live:
                if r + 1 < rounds:
                    self.rec["skipped_rounds"] = rounds - r - 1
                break

    def drop(self, keep_failed: bool) -> None:
        """Drop the views (with ``keep_failed``, those that failed to verify stay)."""
        bad = {m["view"] for m in self.rec["mismatches"]}
        self.m.conn.execute(f"SET statement_timeout = '{int(CREATE_LIMIT_S * 1000)}ms'")
        for n in self.created:
            if keep_failed and n in bad:
                self.rec.setdefault("kept", []).append(n)
                continue
            try:
                self.m.drop_view(n)
            except Exception as e:  # recorded
                self.rec["errors"].append(f"drop {n}: {_err(e)}")


def read_since(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Rows read per relation between two ``QueryRun.reads`` (those read at all), as
    ``base``/``stored``/``log`` relation kinds: ``<kind>:<name>``."""
    out = {}
    for rel, n in after.items():
        d = n - before.get(rel, 0)
        if d > 0:
            schema, _, name = rel.partition(".")
            kind = "log" if name.startswith("log__") else \
                "stored" if schema.endswith("__idivm") else "base"
            out[f"{kind}:{name}"] = d
    return out


def where_time_goes(q: dict[str, Any]) -> dict[str, Any] | None:
    """The id maintain of the last round: changes consumed, rows read (base tables, stored
    relations, logs), a lower bound of what a refresh must read (the changes plus the view
    rows it changes), and its slowest statements."""
    rounds = [r for r in q.get("rounds", []) if "id" in r and "rows_read" in r["id"]]
    if not rounds:
        return None
    r = rounds[-1]["id"]
    read: dict[str, int] = r["rows_read"]
    by_kind = {k: sum(v for n, v in read.items() if n.startswith(k + ":"))
               for k in ("base", "stored", "log")}
    changes = sum(r["changes"].values())
    view_rows = sum(v for k, v in r["applied_rows"].items() if k.endswith("__store"))
    top = sorted(r["statement_seconds"], key=lambda x: -x[1])[:3]
    # the first maintain of a view in a session creates its temporary tables and plans its
    # statements; the later ones reuse both
    ids = [x["id"]["s"] for x in q["rounds"] if "id" in x]
    warm = statistics.median(ids[1:]) if len(ids) > 1 else None
    return {"changes": changes, "read": by_kind, "read_total": sum(by_kind.values()),
            "view_rows_changed": view_rows, "must_read": changes + view_rows,
            "seconds": r["s"], "cold_s": ids[0], "warm_s": warm,
            "top": [[n, round(sec, 4)] for n, sec in top],
            "read_by_relation": dict(sorted(read.items(), key=lambda kv: -kv[1])[:5])}


def summarize(q: dict[str, Any]) -> dict[str, Any]:
    rounds = q.get("rounds", [])
    s: dict[str, Any] = {}
    for col in STRATEGIES:
        s[col] = _stats([r[col]["s"] for r in rounds if col in r])
    s["recompute"] = _stats([r["recompute_s"] for r in rounds if "recompute_s" in r])
    med = {k: (v["median"] if v else None) for k, v in s.items()}
    s["speedup"] = med["recompute"] / med["id"] if med["id"] and med["recompute"] else None
    s["id_over_tuple"] = med["id"] / med["tuple"] if med["id"] and med["tuple"] else None
    if q["mismatches"]:
        verdict = "FAIL"
    elif q["errors"]:
        verdict = "ERROR"
    elif q["timeouts"]:
        verdict = "timeout"
    elif rounds and all(all(r["verified"].values()) and len(r["verified"]) == len(STRATEGIES)
                        for r in rounds):
        verdict = "yes"
    else:
        verdict = "n/a"
    s["verified"] = verdict
    s["where_time_goes"] = where_time_goes(q)
    return s


# -- output -----------------------------------------------------------------------------------
def _fms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _cell(st: dict[str, float] | None, rounds: int) -> str:
    if st is None:
        return "–"
    if rounds <= 1:
        return _fms(st["median"])
    return f"{_fms(st['median'])}\n({_fms(st['min'])}–{_fms(st['max'])})"


def _x(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}×"


HEADER = ("query", "plan s", "script lines", "create s (id)", "id ms", "tuple ms",
          "recompute ms", "speedup", "id ÷ tuple", "verified")
CAPTION = ("maintain / recompute in ms, median (min–max) over the rounds; each round one "
           "batch: RF1 + RF2 (0.1% of orders each) + non-key and foreign-key updates; "
           "recompute: CREATE TEMP TABLE AS the query; speedup: recompute ÷ id maintain")


def print_result(c: Console, result: dict[str, Any]) -> None:
    t = Table(title=f"idivm TPC-H on PostgreSQL, SF {result['config']['sf']:g}",
              title_style="bold", caption=CAPTION)
    for h in HEADER:
        t.add_column(h, justify="left" if h in ("query", "verified") else "right")
    for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0])):
        if q["status"] != "accepted":
            continue
        s = q["summary"]
        n = len(q["rounds"])
        color = {"yes": "green", "FAIL": "bold red", "ERROR": "bold red",
                 "timeout": "yellow"}.get(s["verified"], "yellow")
        t.add_row(f"Q{nr}", f"{q['plan_s']['median']:.2f}", f"{q['script_lines']:,}",
                  f"{q['create_s']['id']:.2f}" if "id" in q["create_s"] else "–",
                  _cell(s["id"], n), _cell(s["tuple"], n), _cell(s["recompute"], n),
                  _x(s["speedup"]), _x(s["id_over_tuple"], 2),
                  f"[{color}]{s['verified']}[/{color}]")
    c.print(t)
    for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0])):
        if q["status"] == "refused":
            c.print(f"[dim]Q{nr} refused: {q['message']}[/dim]")
        elif q["status"] == "planner exception":
            c.print(f"[bold red]Q{nr} planner exception: {q['message']}[/bold red]")
    for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0])):
        for m in q.get("mismatches", []):
            c.print(f"[bold red]Q{nr} {m['view']} differs from the query {m['where']}: "
                    f"{m['only_view']} row(s) only in the view, {m['only_expected']} only in "
                    f"the query[/bold red]")
            for ex in m["examples"]:
                c.print(f"[red]    {ex}[/red]")
        for e in q.get("errors", []):
            c.print(f"[bold red]Q{nr} error: {e}[/bold red]")
        for e in q.get("timeouts", []):
            c.print(f"[yellow]Q{nr} timeout: {e}[/yellow]")
        if q.get("skipped_rounds"):
            c.print(f"[yellow]Q{nr}: rounds skipped: {q['skipped_rounds']}[/yellow]")
    w = Table(title="where the id refresh goes (last round)", title_style="bold",
              caption="changes: effective changes consumed; rows read: sequential-scan tuples "
              "plus index fetches counted by PostgreSQL's statistics, per kind of relation "
              "(base tables / idivm's stored views and caches / change logs); must read: the "
              "changes plus the view rows changed, a lower bound; id ms: the first maintain in "
              "the session (it creates the temporary tables and plans the statements of the "
              "compiled function) / the median of the later ones; slowest: its three slowest "
              "statements")
    for h in ("query", "changes", "rows read (base / stored / log)", "must read",
              "read ÷ must", "id ms first / later", "slowest statements (ms)"):
        w.add_column(h, justify="left" if h in ("query", "slowest statements (ms)") else "right")
    for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0])):
        x = (q.get("summary") or {}).get("where_time_goes")
        if not x:
            continue
        rd = x["read"]
        w.add_row(f"Q{nr}", f"{x['changes']:,}", f"{x['read_total']:,} ({rd['base']:,} / "
                  f"{rd['stored']:,} / {rd['log']:,})", f"{x['must_read']:,}",
                  _x(x["read_total"] / max(x["must_read"], 1), 0),
                  f"{_fms(x['cold_s'])} / {_fms(x['warm_s'])}",
                  ", ".join(f"{n} {sec * 1000:.0f}" for n, sec in x["top"]))
    c.print(w)
    setup = result["setup"]
    c.print(f"[dim]setup: generate {setup['generate_s']:.1f} s, copy {setup['copy_s']:.1f} s, "
            f"analyze {setup['analyze_s']:.1f} s; rows " + ", ".join(
                f"{k} {v:,}" for k, v in setup["rows"].items()) + "[/dim]")
    c.print("[dim]batch per round: " + ", ".join(
        f"{k} {v:,}" for k, v in result["config"]["batch_sizes"].items()) + "[/dim]")
    ok = result["ok"]
    c.print(f"[bold {'green' if ok else 'red'}]"
            + ("every maintained view equalled its recomputation after every round"
               if ok else "FAILED: see the mismatches / errors above")
            + f"[/bold {'green' if ok else 'red'}] (total {result['total_s']:.0f} s)")


def plot(c: Console, result: dict[str, Any], path: Path) -> None:
    """Bars per accepted query (log scale): id maintain, tuple maintain, recompute."""
    plt = pyplot(c)
    if plt is None:
        return
    rows = [(nr, q) for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0]))
            if q["status"] == "accepted"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(rows) + 2), 4.2))
    w = 0.27
    x = list(range(len(rows)))
    for k, (col, label) in enumerate((("id", "id maintain"), ("tuple", "tuple maintain"),
                                      ("recompute", "recompute"))):
        med, lo, hi = [], [], []
        for _, q in rows:
            st = q["summary"][col]
            m = st["median"] * 1000 if st else 0.0
            med.append(m)
            lo.append(m - st["min"] * 1000 if st else 0.0)
            hi.append(st["max"] * 1000 - m if st else 0.0)
        ax.bar([p + (k - 1) * w for p in x], med, w, yerr=[lo, hi], capsize=2, label=label)
    ax.set_yscale("log")
    ax.set_xticks(x, [f"Q{nr}" + ("" if q["summary"]["verified"] == "yes" else "\n"
                                  + q["summary"]["verified"]) for nr, q in rows])
    ax.set_ylabel("ms (median, min–max)")
    ax.set_title(f"idivm TPC-H on PostgreSQL, SF {result['config']['sf']:g}, "
                 f"{result['config']['rounds']} round(s)", fontsize=10)
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    c.print(f"wrote {path}")


# -- the run ----------------------------------------------------------------------------------
def _server(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        out = {}
        for k, q in (("version", "SHOW server_version"), ("shared_buffers", "SHOW shared_buffers"),
                     ("work_mem", "SHOW work_mem"), ("full_version", "SELECT version()")):
            row = conn.execute(q).fetchone()
            out[k] = str(row[0]) if row else ""
        return out


def _plan_query(nr: int, view_sql: str, catalog: Catalog) -> dict[str, Any]:
    """Plan ``PLAN_REPEAT`` times: accepted (with times and script lines), refused, or a planner
    exception."""
    times = []
    try:
        for _ in range(PLAN_REPEAT):
            t0 = time.perf_counter()
            p = idivm.plan(view_sql, catalog, name=f"q{nr}_id")
            times.append(time.perf_counter() - t0)
    except IdivmError as e:
        construct = getattr(e, "construct", None)
        return {"status": "refused", "error": type(e).__name__, "construct": construct,
                "message": str(e)}
    except Exception as e:  # a planner bug: recorded, the run goes on
        return {"status": "planner exception", "error": type(e).__name__,
                "message": _err(e)}
    return {"status": "accepted", "plan_s": _stats(times), "plan_runs_s": times,
            "script_lines": len(p.script_text().splitlines()), "columns": list(p.columns)}


def run(sf: float = 0.1, queries: list[int] | None = None, rounds: int = 3,
        dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        out: Path = Path("bench_out/tpch"), keep: bool = False, *,
        schema: str = DEFAULT_SCHEMA, seed: int = SEED, console: Console | None = None) -> int:
    """Run the benchmark; print the table, write ``tpch.json`` and ``tpch.png`` into ``out``.
    Returns the exit code: 0 when every view verified, 1 on a mismatch, a planner exception
    or an error (timeouts are reported, not failed). The schema (and its ``__idivm``
    companion) is dropped at the end, also on error, unless ``keep`` (then views that failed
    to verify are kept too)."""
    c = console or Console()
    start = time.perf_counter()
    all_sql = tpch_queries()
    wanted = sorted(dict.fromkeys(queries)) if queries else sorted(all_sql)
    unknown = [n for n in wanted if n not in all_sql]
    if unknown:
        raise IdivmError(f"unknown TPC-H queries {unknown}: choose from 1–22")
    if sf <= 0 or rounds < 1:
        raise IdivmError("sf must be positive and rounds at least 1")
    if len(f"{schema}__idivm".encode()) > 63:
        raise IdivmError(f"schema name {schema!r} is too long")
    server = _server(dsn)
    import duckdb

    result: dict[str, Any] = {"config": {
        "sf": sf, "rounds": rounds, "queries": wanted, "seed": seed, "schema": schema,
        "plan_repeat": PLAN_REPEAT, "maintain_limit_s": MAINTAIN_LIMIT_S,
        "create_limit_s": CREATE_LIMIT_S, "jit": "off on every benchmark connection",
        "compare": f"multisets; fractional columns to {SIGNIFICANT} significant digits",
        "server": server, "cpus": os.cpu_count(), "python": platform.python_version(),
        "idivm": idivm.__version__, "duckdb": duckdb.__version__,
        "times": "seconds; id/tuple: maintain (the CALL, client-side); recompute: CREATE TEMP "
                 "TABLE AS the query",
    }, "queries": {}}
    c.rule(f"[bold]idivm bench tpch: TPC-H SF {sf:g} on PostgreSQL {server['version']}[/bold]")
    c.print(f"queries {', '.join(map(str, wanted))}; {rounds} round(s) each; schema {schema}")
    progress = Progress(SpinnerColumn(finished_text="[green]✓[/green]"),
                        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=c)
    drop_schema(dsn, schema)
    conn: Conn | None = None
    m: PostgresMaintainer | None = None
    try:
        with progress:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as c0:
                c0.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn = _connect(dsn, schema)
            with step(progress, f"generate TPC-H SF {sf:g} (DuckDB) and COPY it into {schema}"):
                result["setup"] = load(conn, sf)
            conn.execute(f"SET statement_timeout = '{int(RECOMPUTE_TIMEOUT_S * 1000)}ms'")
            m = PostgresMaintainer(dsn, schema=schema)
            m.conn.execute("SET jit = off")
            catalog = m.catalog()
            refresher = Refresher(conn, seed)
            result["config"]["batch_sizes"] = refresher.sizes
            task = progress.add_task("plan", total=len(wanted))
            for nr in wanted:
                progress.update(task, description=f"q{nr}: plan")
                q = _plan_query(nr, all_sql[nr], catalog)
                q["sql"] = all_sql[nr]
                result["queries"][str(nr)] = q
                if q["status"] == "accepted":
                    run_ = QueryRun(nr, all_sql[nr], conn, m, catalog, schema, refresher,
                                    progress, task)
                    try:
                        live = run_.create()
                        if live:
                            run_.rounds(rounds, live)
                    except (psycopg.Error, IdivmError) as e:  # recorded, the run goes on
                        run_.rec["errors"].append(f"benchmark: {_err(e)}")
                    finally:
                        run_.drop(keep_failed=keep)
                    q.update(run_.rec)
                    q["summary"] = summarize(q)
                progress.advance(task)
            progress.update(task, description="queries")
    finally:
        if m is not None:
            m.close()
        if conn is not None:
            conn.close()
        if not keep:
            drop_schema(dsn, schema)
    result["total_s"] = time.perf_counter() - start
    qs = result["queries"].values()
    result["ok"] = not any(q["status"] == "planner exception" for q in qs) and all(
        q["summary"]["verified"] in ("yes", "timeout") for q in qs if q["status"] == "accepted")
    print_result(c, result)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tpch.json").write_text(json.dumps(result, indent=2, default=str))
    c.print(f"wrote {path / 'tpch.json'}")
    plot(c, result, path / "tpch.png")
    if keep:
        c.print(f"kept schema {schema}" + "".join(
            f"; kept {', '.join(q['kept'])}" for q in qs if q.get("kept")))
    return 0 if result["ok"] else 1
