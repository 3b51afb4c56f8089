"""``idivm bench tpch``: the TPC-H queries as idivm views on PostgreSQL.

TPC-H at scale factor ``sf`` is generated with DuckDB (``CALL dbgen``), exported as CSV and
loaded with ``COPY`` into a fresh schema (``tpch_bench``) with the specification's primary
keys, then vacuumed (FREEZE, ANALYZE) and checkpointed. Each of the 22 queries (ORDER BY /
LIMIT removed) is planned with ``idivm.plan``: a refusal (``IdivmError``) is listed with its
message; any other exception is a planner bug, recorded as a "planner exception" with its
type and message, and the run goes on.

Per accepted query: the plan time (median of 3), the Δ-script's lines, the create time of an
``id`` and a ``tuple`` view (``q<N>_id``, ``q<N>_tuple``), then ``warmup`` rounds and
``rounds`` timed refresh rounds; the warm-up rounds run and verify every column as a timed
round does, but stay out of the medians (``QueryRun.rounds``). A round is one batch in
TPC-H's shape, applied in one transaction:

- RF1: 0.1% new orders (keys beyond the largest) copied from random existing orders with a
  perturbed date, customer and price, each with its source order's 1–7 lineitems;
- updates of non-key columns: lineitem price / discount / ship date / return flag, order status
  and date, customer segment and balance, part retail price, supplier balance; and of foreign
  keys: ``o_custkey`` to another customer that may have orders, ``l_suppkey`` to another
  supplier of the same part (one with a ``partsupp`` row);
- RF2: 0.1% of the existing orders deleted with their lineitems.

Then, side by side, in the order ``round_order`` gives (a full read of the batch's rows first):

- ``id`` / ``tuple``: ``maintain`` of that view (the batch itself, applied to the schema whose
  triggers log the changes, is timed on its own: ``apply``);
- ``recompute``: ``CREATE TEMP TABLE … AS <query>``;
- ``refresh``: ``REFRESH MATERIALIZED VIEW`` of a materialized view of the query in the same
  schema (``q<N>_mv``, created ``WITH NO DATA``: its first refresh fills it);
- ``pg_ivm`` (when the server has pg_ivm, ``LOAD 'pg_ivm'`` works, and it accepts the query):
  the same batch applied, timed whole, to pg_ivm's own copy of the base tables, where an IMMV
  of the query (``q<N>_ivm``, ``pgivm.create_immv``) is maintained inside the statements' AFTER
  triggers. It compares with idivm's ``apply + id``. The copy is one schema for the run,
  ``<schema>_pgivm``: the TPC-H tables with the same primary keys, copied right after the load
  and given every batch the benchmark schema gets (also while no IMMV lives on it). It holds
  only the IMMV of the query being measured — created before the query's rounds, dropped after —
  because pg_ivm maintains every IMMV over a table in each statement on it: an IMMV per query
  on one copy would time them all, and a copy per query would copy the data 22 times. pg_ivm
  indexes an IMMV itself when it groups (or its target list holds every base table's key); when
  it cannot, its notice (kept in the JSON) advises an index by hand. A query pg_ivm refuses gets
  its error message and no column. When pg_ivm cannot be loaded the run says why and leaves the
  column out (``scripts/install_pg_ivm.sh`` builds it from its source).

After every round (and once after creating) every view — id, tuple, the materialized view and
the IMMV — is compared with the recomputed rows as multisets; columns holding fractions
(floats, or numerics with more than 8 decimals: averages, ratios) are compared to 6
significant digits. A difference is a correctness failure: shown in the table and the JSON, and
the exit code is 1. A peer that fails or times out (``MAINTAIN_LIMIT_S`` for pg_ivm's batch, as
for a maintain) is recorded and left out of the query's later rounds; pg_ivm's copy then gets
the batch again without the IMMV, so it stays equal to the benchmark schema.

With ``explain``, after its rounds each query gets one more batch (untimed, outside the
figures), and its id view's maintain runs under ``auto_explain`` (``idivm.bench.explain``):
every statement the compiled function runs, with its time, rows, buffers and costliest plan
node, goes into the JSON, the slowest are printed; the view is verified after it as after a
round.

A maintain over ``MAINTAIN_LIMIT_S`` is recorded as a timeout and its column leaves the query's
later rounds (the query's remaining rounds are skipped when no view is left to maintain, and
all of them when a ``create_view`` took over ``CREATE_LIMIT_S``); the limits are also the
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
from idivm.bench import explain as explain_
from idivm.bench import gc_paused, pgivm, pyplot, step
from idivm.bench.tpch import FK_INDEXES, TABLES, TPCH_DDL, load_tpch_extension
from idivm.bench.tpch import queries as tpch_queries
from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.postgres import PostgresMaintainer
from idivm.postgres.compile import MERGE
from idivm.refresh_cost import RefreshStrategy

Conn: TypeAlias = "psycopg.Connection[Any]"

DEFAULT_SCHEMA = "tpch_bench"
SEED = 20150531
PLAN_REPEAT = 3
MAINTAIN_LIMIT_S = 60.0
CREATE_LIMIT_S = 120.0
RECOMPUTE_TIMEOUT_S = 600.0
# id and tuple: the planner's strategies; auto: the id view whose every refresh chooses the
# Δ-script or a recomputation (``refresh_cost.decide``)
STRATEGIES: tuple[RefreshStrategy, ...] = ("id", "tuple", "auto")
COLUMNS = ("id", "tuple", "auto", "recompute", "refresh", "pg_ivm")  # see round_order
# the columns that may read a batch's rows first (``round_order``)
FIRST_READERS = ("recompute", "tuple", "refresh")
PEERS = ("refresh", "pg_ivm")
EXPLAIN_TOP = 5  # statements printed per query under --explain
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


def pg_ivm_schema(schema: str) -> str:
    """The schema of pg_ivm's copy of the base tables."""
    return f"{schema}_pgivm"


def drop_schema(dsn: str, schema: str) -> None:
    """Drop the benchmark schema, its idivm companion and pg_ivm's copy."""
    pgivm.drop_schemas(dsn, schema, f"{schema}__idivm", pg_ivm_schema(schema))


# dbgen at a small SF (below ~0.005) repeats some (ps_partkey, ps_suppkey): keep one of each
EXPORT = {"partsupp": "SELECT * FROM partsupp QUALIFY row_number() OVER (PARTITION BY "
                      "ps_partkey, ps_suppkey ORDER BY ps_availqty, ps_supplycost, ps_comment) = 1"}


def settle(conn: Conn) -> None:
    """VACUUM (FREEZE, ANALYZE) the freshly loaded tables (of the connection's schema) and
    CHECKPOINT: no insert-triggered autovacuum of lineitem, no hint bits set by the first
    reads, no checkpoint writing the load's pages back while the rounds are timed."""
    for t in TABLES:
        conn.execute(sql.SQL("VACUUM (FREEZE, ANALYZE) {}").format(sql.Identifier(t)))
    conn.execute("CHECKPOINT")


def load(conn: Conn, sf: float, fk_indexes: bool = True) -> dict[str, Any]:
    """Generate TPC-H at ``sf`` with DuckDB and COPY it (as CSV) into the connection's schema,
    with indexes on the foreign keys unless not ``fk_indexes``; returns the seconds per phase
    and the rows per table."""
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
    if fk_indexes:
        t3 = time.perf_counter()
        conn.execute(FK_INDEXES)
        out["fk_indexes_s"] = time.perf_counter() - t3
    t2 = time.perf_counter()
    settle(conn)
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


class PgIvmPeer:
    """pg_ivm's copy of the base tables (``<schema>_pgivm``) and the IMMV of the query being
    measured: one at a time, so a batch maintains that one only (see the module docstring)."""

    def __init__(self, dsn: str, source: str, fk_indexes: bool = True) -> None:
        self.dsn, self.source, self.schema = dsn, source, pg_ivm_schema(source)
        self.fk_indexes = fk_indexes
        self.conn: Conn | None = None
        self.immv: str | None = None
        self.columns: list[str] = []
        self._limit_s: float | None = None

    @property
    def c(self) -> Conn:
        assert self.conn is not None
        return self.conn

    def _limit(self, seconds: float) -> None:
        """The connection's ``statement_timeout`` (set only when it changes)."""
        if seconds != self._limit_s:
            self.c.execute(f"SET statement_timeout = '{int(seconds * 1000)}ms'")
            self._limit_s = seconds

    def setup(self) -> dict[str, Any]:
        """The copy: the TPC-H tables with the same keys, filled from the benchmark schema
        (before any batch) and settled (``settle``)."""
        t0 = time.perf_counter()
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as c0:
            c0.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
        self.conn = pgivm.connect(self.dsn, self.schema)
        self.c.prepare_threshold = None  # as the benchmark schema's connection
        with self.c.transaction():
            self.c.execute(TPCH_DDL)
            for t in TABLES:
                self.c.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
                    sql.Identifier(self.schema, t), sql.Identifier(self.source, t)))
            if self.fk_indexes:
                self.c.execute(FK_INDEXES)
        settle(self.c)
        row = self.c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_ivm'"
                             ).fetchone()
        return {"schema": self.schema, "version": str(row[0]) if row else None,
                "copy_s": time.perf_counter() - t0}

    def create(self, nr: int, query: str) -> dict[str, Any]:
        """The query's IMMV ``q<N>_ivm``: accepted (create seconds, pg_ivm's notices, whether
        it indexed the IMMV), refused (pg_ivm's message) or a timeout."""
        name = f"q{nr}_ivm"
        self._limit(CREATE_LIMIT_S)
        try:
            immv = pgivm.create_immv(self.c, name, query)
        except psycopg.errors.QueryCanceled as e:
            return {"status": "timeout", "message": _err(e)}
        except psycopg.Error as e:
            hint = e.diag.message_hint
            return {"status": "refused", "error": type(e).__name__,
                    "message": (e.diag.message_primary or str(e)).strip()
                    + (f" ({hint.strip()})" if hint else "")}
        self.immv, self.columns = name, pgivm.visible_columns(self.c, name)
        return {"status": "accepted", "immv": name, "create_s": immv.seconds,
                "notices": list(immv.notices), "indexed": immv.indexed}

    def apply(self, batch: Batch, timed: bool = False) -> float:
        """The batch on the copy: with an IMMV, the statements plus pg_ivm's maintenance
        (``timed``: within ``MAINTAIN_LIMIT_S``, as a maintain)."""
        self._limit(MAINTAIN_LIMIT_S if timed else RECOMPUTE_TIMEOUT_S)
        return apply_batch(self.c, batch)

    def rows(self) -> list[tuple[Any, ...]]:
        assert self.immv is not None
        self._limit(RECOMPUTE_TIMEOUT_S)
        return self.c.execute(sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(x) for x in self.columns),
            sql.Identifier(self.immv))).fetchall()

    def drop_immv(self) -> None:
        if self.immv is not None:
            self._limit(RECOMPUTE_TIMEOUT_S)
            pgivm.drop_immv(self.c, self.immv)
            self.immv, self.columns = None, []

    def differs(self) -> list[str]:
        """The base tables whose copy differs from the benchmark schema's (multisets)."""
        out = []
        self._limit(RECOMPUTE_TIMEOUT_S)
        for t in TABLES:
            row = self.c.execute(sql.SQL(
                "SELECT count(*) FROM ((TABLE {a} EXCEPT ALL TABLE {b}) UNION ALL "
                "(TABLE {b} EXCEPT ALL TABLE {a})) d").format(
                    a=sql.Identifier(self.schema, t), b=sql.Identifier(self.source, t))
            ).fetchone()
            if not row or row[0]:
                out.append(t)
        return out

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class QueryRun:
    """One accepted query: its id and tuple views, its peers (materialized view, pg_ivm's
    IMMV), the rounds, verification."""

    def __init__(self, nr: int, view_sql: str, conn: Conn, m: PostgresMaintainer,
                 catalog: Catalog, schema: str, refresher: Refresher, progress: Progress,
                 task: Any, peer: PgIvmPeer | None = None) -> None:
        self.nr, self.sql, self.conn, self.m = nr, view_sql, conn, m
        self.catalog, self.schema, self.refresher = catalog, schema, refresher
        self.progress, self.task, self.peer = progress, task, peer
        # peer_failures: errors and timeouts of the peers (refresh, pg_ivm), reported apart:
        # they are not idivm's (a peer's wrong result is a mismatch, like a view's)
        self.rec: dict[str, Any] = {"create_s": {}, "rounds": [], "errors": [],
                                    "timeouts": [], "mismatches": [], "peer_failures": []}
        self.created: list[str] = []
        self.matview: str | None = None

    def name(self, column: str) -> str:
        """The relation a column maintains: ``q<N>_id``, ``q<N>_tuple``, ``q<N>_mv``
        (refresh), ``q<N>_ivm`` (pg_ivm)."""
        return f"q{self.nr}_" + {"refresh": "mv", "pg_ivm": "ivm"}.get(column, column)

    def _say(self, what: str) -> None:
        self.progress.update(self.task, description=f"q{self.nr}: {what}")

    def create(self) -> list[str]:
        """Both views and the peers; returns the columns to maintain: those created (an error
        is recorded and the others still run), none when a view's create took too long."""
        live: list[str] = []
        slow = False
        self.m.conn.execute("SET jit = off")  # (each query's on a session of its own: drop)
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
        if slow:
            if live:
                self.rec["skipped_rounds"] = "all (a create took too long)"
            return []
        self._say("create (materialized view)")
        try:  # filled by its first REFRESH, in round 1
            self.conn.execute(sql.SQL("CREATE MATERIALIZED VIEW {} AS {} WITH NO DATA").format(
                sql.Identifier(self.name("refresh")), sql.SQL(self.sql)))
            self.matview = self.name("refresh")
            live.append("refresh")
        except psycopg.Error as e:  # recorded, the run goes on
            self.rec["peer_failures"].append(f"create refresh: {_err(e)}")
        if self.peer is not None:
            self._say("create (pg_ivm IMMV)")
            self.rec["pg_ivm"] = info = self.peer.create(self.nr, self.sql)
            if info["status"] == "accepted":
                self.rec["create_s"]["pg_ivm"] = info["create_s"]
                live.append("pg_ivm")
            elif info["status"] == "timeout":
                self.rec["peer_failures"].append(f"create pg_ivm: {info['message']}")
        return live

    def reads(self) -> dict[str, int]:
        """Rows read so far from each table of the schema and its companion (sequential
        scans' tuples plus index fetches), as the statistics collector counts them; the
        maintainer's session flushes its counts at its next commit, this connection's (the
        recomputation's reads, whose flush PostgreSQL otherwise defers up to a second, into
        the next window) before the count."""
        self.flush_statistics()
        with self.conn.transaction():
            self.conn.execute("SELECT pg_stat_clear_snapshot()")
            rows = self.conn.execute(
                "SELECT schemaname || '.' || relname, coalesce(seq_tup_read, 0) + "
                "coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables WHERE schemaname IN "
                "(%s, %s)", (self.schema, f"{self.schema}__idivm")).fetchall()
        return {str(k): int(v) for k, v in rows}

    def flush_statistics(self) -> None:
        """Flush both sessions' pending statistics now. A session flushes them when it goes
        idle at least a second after its last flush, before the client has its answer, so a
        maintain would pay for a flush or not by the time since the last one: every timed
        maintain starts just after a flush, so none pays it."""
        self.m.conn.execute("SELECT pg_stat_force_next_flush()")
        self.conn.execute("SELECT pg_stat_force_next_flush()")

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
               columns: Sequence[str]) -> dict[str, bool]:
        out = {}
        for col in columns:
            if col == "pg_ivm":
                assert self.peer is not None
                got = self.peer.rows()
            else:
                got = self.conn.execute(sql.SQL("SELECT * FROM {}").format(
                    sql.Identifier(self.schema, self.name(col)))).fetchall()
            cmp = compare(got, expected)
            out[col] = bool(cmp["equal"])
            if not cmp["equal"]:
                self.rec["mismatches"].append({"view": self.name(col), "where": where, **cmp})
        return out

    def _failed(self, where: str, what: str, e: BaseException, took: float, limit: float,
                into: list[str] | None = None) -> None:
        """A failed maintain (or, ``into`` ``peer_failures``, a failed peer), recorded."""
        if _timed_out(e):
            msg = f"{where} {what}: cancelled after {took:.0f} s (statement_timeout " \
                  f"{limit:g} s)"
            (self.rec["timeouts"] if into is None else into).append(msg)
        else:
            (self.rec["errors"] if into is None else into).append(
                f"{where} {what}: {_err(e)}")

    def _peer(self, where: str, col: str, batch: Batch, live: list[str]) -> dict[str, float] | None:
        """One peer's turn: ``REFRESH MATERIALIZED VIEW``, or the batch on pg_ivm's copy
        (its IMMV maintained in the triggers). A failure is recorded and the peer leaves the
        query's rounds; pg_ivm's copy then gets the batch without the IMMV."""
        t0 = time.perf_counter()
        try:
            if col == "refresh":
                self.conn.execute(sql.SQL("REFRESH MATERIALIZED VIEW {}").format(
                    sql.Identifier(self.name(col))))
                return {"s": time.perf_counter() - t0}
            assert self.peer is not None
            return {"s": self.peer.apply(batch, timed=True)}
        except psycopg.Error as e:  # recorded (not idivm's failure), the run goes on
            took = time.perf_counter() - t0
            self._failed(where, col, e, took,
                         RECOMPUTE_TIMEOUT_S if col == "refresh" else MAINTAIN_LIMIT_S,
                         self.rec["peer_failures"])
            live.remove(col)
            if col == "pg_ivm" and self.peer is not None:
                self.peer.drop_immv()
                self.peer.apply(batch)  # rolled back with the failure: the copy stays equal
            return None

    def rounds(self, rounds: int, live: list[str], warmup: int = 0) -> None:
        """``live``: the columns maintained (until one fails or times out). ``warmup`` rounds
        first, each a batch and every column maintained and verified as in a timed round, kept
        apart (``warmup``) and out of the medians: a refresh job's session plans its
        statements at its first refreshes and reuses the plans at the later ones (the
        README's *Where a session's first refreshes go*); the first of them is the view's
        cold refresh (``where_time_goes``)."""
        self._say("verify after create")
        _, expected = self.recompute()
        self.rec["rows_initial"] = len(expected)
        self.rec["verified_initial"] = self.verify(  # (the materialized view is not filled)
            "after create", expected, [c for c in live if c != "refresh"])
        self.rec["warmup"] = []
        for r in range(warmup + rounds):
            timed = r >= warmup
            k = r - warmup if timed else r
            where = f"round {k + 1}" if timed else f"warm-up {k + 1}"
            self._say(f"{where}/{rounds if timed else warmup}")
            batch = self.refresher.build()
            order = round_order(k, live)
            with gc_paused():  # (the round's timed steps)
                rec, expected_rows = self._round(k, where, batch, order, live)
            assert expected_rows is not None
            rec["verified"] = self.verify(where, expected_rows, [c for c in live if c in rec])
            (self.rec["rounds"] if timed else self.rec["warmup"]).append(rec)
            if not any(c in live for c in STRATEGIES):
                if k + 1 < rounds or not timed:
                    self.rec["skipped_rounds"] = rounds - (k + 1 if timed else 0)
                break

    def _round(self, r: int, where: str, batch: Batch, order: Sequence[str],
               live: list[str]) -> tuple[dict[str, Any], list[tuple[Any, ...]] | None]:
        """Round ``r``'s timed steps: the batch, then the columns in ``order``; its record and
        the recomputed rows. A column whose maintain fails or times out leaves ``live`` (the
        others go on: Q21's tuple maintain cancelled at 60 s had ended its rounds after the
        first, leaving its id column one cold refresh)."""
        rec: dict[str, Any] = {"round": r + 1, "batch": batch.counts, "order": list(order),
                               "apply_s": apply_batch(self.conn, batch)}
        if self.peer is not None and "pg_ivm" not in live:  # untimed: the copy follows
            rec["pg_ivm_copy_s"] = self.peer.apply(batch)
        expected_rows: list[tuple[Any, ...]] | None = None
        for col in order:
            if col == "recompute":
                rec["recompute_s"], expected_rows = self.recompute()
                rec["rows"] = len(expected_rows)
                continue
            if col not in live:
                continue
            if col in PEERS:
                took_peer = self._peer(where, col, batch, live)
                if took_peer is not None:
                    rec[col] = took_peer
                continue
            # every timed maintain after the same steps: the statistics flushed and the rows
            # read so far counted (a maintain started a few ms later, after the count, took
            # 0.1–0.4 ms more at SF 0.1 than one started right after a flush)
            before = self.reads()
            t0 = time.perf_counter()
            try:
                stats = self.m.maintain(self.name(col))
            except Exception as e:  # recorded, the run goes on
                self._failed(where, f"maintain {col}", e, time.perf_counter() - t0,
                             MAINTAIN_LIMIT_S)
                live.remove(col)
                continue
            took = time.perf_counter() - t0
            rec[col] = {"s": took, "stats_s": stats.seconds,
                        "function_s": stats.function_seconds, "changes": stats.changes,
                        "log_rows": stats.log_rows,
                        "idiff_rows": stats.idiff_rows, "applied_rows": stats.applied_rows,
                        "statement_seconds": stats.statement_seconds}
            if col == "auto":
                rec[col]["decision"] = stats.decision
            rec[col]["rows_read"] = read_since(before, self.reads())
            if took > MAINTAIN_LIMIT_S:
                self.rec["timeouts"].append(f"{where} maintain {col}: {took:.0f} s > "
                                            f"{MAINTAIN_LIMIT_S:.0f} s")
                live.remove(col)
        return rec, expected_rows

    def explain(self, live: list[str]) -> None:
        """One more batch (untimed), the id view's maintain under ``auto_explain``: every
        statement of its compiled function with its plan; then the id view verified. (pg_ivm's
        IMMV is dropped first: the copy gets the batch without it.) When auto_explain cannot
        be loaded, that is recorded (``explain.error``) and nothing runs."""
        if "id" not in live:
            return
        self._say("explain the id maintain")
        try:
            self.m.conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as e:  # not idivm's failure: said, the run goes on
            self.rec["explain"] = {"error": f"auto_explain cannot be loaded: {_err(e)}"}
            return
        batch = self.refresher.build()
        rec: dict[str, Any] = {"batch": batch.counts, "apply_s": apply_batch(self.conn, batch)}
        self.rec["explain"] = rec
        if self.peer is not None:
            if "pg_ivm" in live:
                self.peer.drop_immv()  # not verified below: the batch without its work
                live.remove("pg_ivm")
            self.peer.apply(batch)
        t0 = time.perf_counter()
        try:
            with explain_.captured(self.m.conn) as cap:
                stats = self.m.maintain(self.name("id"))
        except Exception as e:  # recorded, the run goes on
            rec["error"] = _err(e)
            self.rec["errors"].append(f"explain: maintain id: {_err(e)}")
            return
        rec["s"] = time.perf_counter() - t0
        rec["changes"] = stats.changes
        rec["statements"] = [s.as_dict() for s in cap.statements]
        rec["top"] = [s.as_dict() for s in explain_.top(cap.statements, EXPLAIN_TOP)]
        _, expected = self.recompute()
        rec["verified"] = self.verify("after the explained maintain", expected, ["id"])

    def drop(self, keep_failed: bool) -> None:
        """Drop the views and the peers (with ``keep_failed``, the idivm views and the
        materialized view that failed to verify stay; pg_ivm's IMMV always goes: it would be
        maintained in the next queries' batches)."""
        bad = {m["view"] for m in self.rec["mismatches"]}
        if self.peer is not None:
            try:
                self.peer.drop_immv()
            except psycopg.Error as e:  # recorded
                self.rec["peer_failures"].append(f"drop {self.name('pg_ivm')}: {_err(e)}")
        if self.matview is not None:
            if keep_failed and self.matview in bad:
                self.rec.setdefault("kept", []).append(self.matview)
            else:
                self.conn.execute(sql.SQL("DROP MATERIALIZED VIEW IF EXISTS {}").format(
                    sql.Identifier(self.matview)))
        for n in self.created:
            if keep_failed and n in bad:
                self.rec.setdefault("kept", []).append(n)
                continue
            try:  # (each drop_view leaves the maintainer on a new session)
                self.m.conn.execute(f"SET statement_timeout = '{int(CREATE_LIMIT_S * 1000)}ms'")
                self.m.drop_view(n)
            except Exception as e:  # recorded
                self.rec["errors"].append(f"drop {n}: {_err(e)}")


def round_order(r: int, live: Sequence[str]) -> list[str]:
    """The order of round ``r``'s columns (0-based). The first to read the benchmark schema
    after a batch reads the batch's rows first and sets their hint bits — work the writers
    leave to their first reader, tens of milliseconds at SF 1 (Q14's refresh: 18 ms, 67 ms
    when first). That reader is one of ``FIRST_READERS`` (rotating, the next live one; the
    recomputation always runs): columns of hundreds of milliseconds to seconds, which it
    moves by a few percent. ``id`` and ``auto``, which the ``auto ÷ best`` ratio compares
    and whose refresh job would pay it right after a batch, come next, side by side, the
    one that goes first alternating; pg_ivm reads its own copy of the tables."""
    rot = FIRST_READERS[r % len(FIRST_READERS):] + FIRST_READERS[:r % len(FIRST_READERS)]
    first = next(c for c in rot if c == "recompute" or c in live)
    pair = ["id", "auto"] if r % 2 == 0 else ["auto", "id"]
    rest = [c for c in (*rot, "pg_ivm") if c != first]
    return [first, *pair, *rest]


def read_since(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Rows read per relation between two ``QueryRun.reads`` (those read at all), as
    ``base``/``stored``/``log`` relation kinds: ``<kind>:<name>``."""
    out = {}
    for rel, n in after.items():
        d = n - before.get(rel, 0)
        if d > 0:
            schema, _, name = rel.partition(".")
            if name.startswith("__iv"):  # the view's scratch relations: its i-diffs
                continue
            kind = "log" if name.startswith("log__") else \
                "stored" if schema.endswith("__idivm") else "base"
            out[f"{kind}:{name}"] = d
    return out


def where_time_goes(q: dict[str, Any]) -> dict[str, Any] | None:
    """The id maintain of the last round: changes consumed (the log rows it consumed: the
    images of the rows it can see), rows read (base tables, stored relations, logs), a lower
    bound of what a refresh must read (those log rows plus the view rows it changes), and its
    slowest statements."""
    rounds = [r for r in q.get("rounds", []) if "id" in r and "rows_read" in r["id"]]
    if not rounds:
        return None
    r = rounds[-1]["id"]
    read: dict[str, int] = r["rows_read"]
    by_kind = {k: sum(v for n, v in read.items() if n.startswith(k + ":"))
               for k in ("base", "stored", "log")}
    changes = sum((r.get("log_rows") or r["changes"]).values())
    view_rows = sum(v for k, v in r["applied_rows"].items() if k.endswith("__store"))
    top = sorted(r["statement_seconds"], key=lambda x: -x[1])[:3]
    # the first maintain of a view in a session plans its statements, the later ones reuse
    # the plans: the first refresh (of the warm-up rounds when there were any) against the
    # timed rounds after it
    ids = [x["id"]["s"] for x in (*q.get("warmup", ()), *q["rounds"]) if "id" in x]
    timed = [x["id"]["s"] for x in q["rounds"] if "id" in x]
    later = timed if q.get("warmup") else timed[1:]
    warm = statistics.median(later) if later else None
    return {"changes": changes, "read": by_kind, "read_total": sum(by_kind.values()),
            "view_rows_changed": view_rows, "must_read": changes + view_rows,
            "seconds": r["s"], "cold_s": ids[0], "warm_s": warm,
            "top": [[n, round(sec, 4)] for n, sec in top],
            "read_by_relation": dict(sorted(read.items(), key=lambda kv: -kv[1])[:5])}


def _time(r: Mapping[str, Any], col: str) -> float | None:
    """Round ``r``'s seconds of ``col`` (a strategy or peer, ``recompute``, ``apply``,
    ``apply_id``: the batch plus the id maintain), None where the round has none."""
    if col in ("recompute", "apply"):
        v = r.get(f"{col}_s")
        return float(v) if v else None
    if col == "apply_id":
        a, i = _time(r, "apply"), _time(r, "id")
        return a + i if a and i else None
    x = r.get(col)
    return float(x["s"]) if isinstance(x, Mapping) and x.get("s") else None


# the ratios ``summarize`` pairs round by round: name → (numerator, denominator); ``best``
# stands for the better of id and recompute over the run (their medians)
PAIRED = {"speedup": ("recompute", "id"), "tuple_over_id": ("tuple", "id"),
          "auto_over_best": ("auto", "best"), "pg_ivm_over_apply_id": ("pg_ivm", "apply_id")}


def paired_ratios(rounds: Sequence[Mapping[str, Any]], best: str
                  ) -> dict[str, dict[str, float] | None]:
    """Each of ``PAIRED``'s ratios taken within each round — both sides after the same batch,
    side by side — then their median and spread (min, max) over the rounds: the round-to-round
    swings of the batch (its commit, the rows it touched, the server) that move both sides
    alike cancel, which a ratio of two medians, each over the rounds, keeps. ``best``: the
    column ``auto`` is compared with in every round (id or recompute, the better over the
    run)."""
    out: dict[str, dict[str, float] | None] = {}
    for name, (a, b) in PAIRED.items():
        b = best if b == "best" else b
        xs = [x / y for r in rounds
              if (x := _time(r, a)) is not None and (y := _time(r, b)) is not None]
        out[name] = _stats(xs)
    return out


def summarize(q: dict[str, Any]) -> dict[str, Any]:
    """Per column median / min / max over the rounds (``apply_id``: the batch applied to the
    logged schema plus the id maintain, what pg_ivm's column compares with), the ratios of the
    medians (``speedup``: recompute ÷ id; ``tuple_over_id``; ``pg_ivm_over_apply_id`` and its
    inverse ``apply_id_over_pg_ivm``), the same ratios taken round by round (``paired``: their
    median and spread), the verdict, and where the id refresh's time goes."""
    rounds = q.get("rounds", [])
    s: dict[str, Any] = {}
    for col in (*STRATEGIES, *PEERS):
        s[col] = _stats([r[col]["s"] for r in rounds if col in r])
    s["recompute"] = _stats([r["recompute_s"] for r in rounds if "recompute_s" in r])
    s["apply"] = _stats([r["apply_s"] for r in rounds if "apply_s" in r])
    s["apply_id"] = _stats([r["apply_s"] + r["id"]["s"] for r in rounds if "id" in r])
    med = {k: (v["median"] if v else None) for k, v in s.items()}

    def ratio(a: str, b: str) -> float | None:
        x, y = med[a], med[b]
        return x / y if x and y else None

    s["speedup"] = ratio("recompute", "id")
    best = min((x for x in (med["id"], med["recompute"]) if x), default=None)
    s["auto_over_best"] = med["auto"] / best if med["auto"] and best else None
    s["tuple_over_id"] = ratio("tuple", "id")
    s["refresh_over_id"] = ratio("refresh", "id")
    s["pg_ivm_over_apply_id"] = ratio("pg_ivm", "apply_id")
    s["apply_id_over_pg_ivm"] = ratio("apply_id", "pg_ivm")
    s["paired"] = paired_ratios(rounds, "recompute" if med["recompute"] and (
        not med["id"] or med["recompute"] < med["id"]) else "id")
    if q["mismatches"]:
        verdict = "FAIL"
    elif q["errors"]:
        verdict = "ERROR"
    elif q["timeouts"]:
        verdict = "timeout"
    elif rounds and all(all(r["verified"].values()) and set(STRATEGIES) <= set(r["verified"])
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


def _paired_cell(s: Mapping[str, Any], name: str, digits: int = 1) -> str:
    """A ratio's cell: its paired median over the rounds with their spread (``paired``), or
    the ratio of the medians for a record without it."""
    st = (s.get("paired") or {}).get(name)
    if not st:
        return _x(s.get(name), digits)
    if st["min"] == st["max"]:
        return _x(st["median"], digits)
    return f"{_x(st['median'], digits)}\n({st['min']:.{digits}f}–{st['max']:.{digits}f})"


HEADER = ("query", "plan s", "script lines", "create s (id)", "recompute ms", "refresh ms",
          "tuple ms", "id ms", "auto ms", "apply + id ms", "pg_ivm ms", "recompute ÷ id",
          "tuple ÷ id", "auto ÷ best", "pg_ivm ÷ (apply+id)", "verified")
CAPTION = ("ms, median (min–max) over the rounds; each round one batch: RF1 + RF2 (0.1% of "
           "orders each) + non-key and foreign-key updates; recompute: CREATE TEMP TABLE AS the "
           "query; refresh: REFRESH MATERIALIZED VIEW; tuple / id / auto: maintain (auto: the "
           "Δ-script or a recomputation, as refresh_cost decides; auto ÷ best: against the "
           "better of id and recompute); the ratios: within each round (both sides after the "
           "same batch), median (min–max) over the rounds; apply + id: the "
           "batch on the logged schema plus the id maintain; pg_ivm: the same batch with "
           "pg_ivm's immediate maintenance of an IMMV of the query (– when pg_ivm refuses the "
           "query or is not installed)")


def _pg_ivm_cell(q: dict[str, Any], n: int) -> str:
    st = q["summary"].get("pg_ivm")
    if st is not None:
        return _cell(st, n)
    return {"refused": "refused", "timeout": "timeout"}.get(
        (q.get("pg_ivm") or {}).get("status", ""), "–")


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
                  _cell(s["recompute"], n), _cell(s.get("refresh"), n), _cell(s["tuple"], n),
                  _cell(s["id"], n), _cell(s.get("auto"), n), _cell(s.get("apply_id"), n),
                  _pg_ivm_cell(q, n), _paired_cell(s, "speedup"),
                  _paired_cell(s, "tuple_over_id", 2), _paired_cell(s, "auto_over_best", 2),
                  _paired_cell(s, "pg_ivm_over_apply_id", 2),
                  f"[{color}]{s['verified']}[/{color}]")
    c.print(t)
    ivm = result.get("pg_ivm") or {}
    if ivm.get("unavailable"):
        c.print(f"[yellow]no pg_ivm column: {ivm['unavailable']}[/yellow]")
    elif ivm:
        accepted = [nr for nr, q in result["queries"].items()
                    if (q.get("pg_ivm") or {}).get("status") == "accepted"]
        c.print(f"[dim]pg_ivm {ivm.get('version')} on its copy {ivm.get('schema')} (copied in "
                f"{ivm.get('copy_s', 0):.1f} s): IMMVs of "
                f"{', '.join(f'Q{n}' for n in sorted(accepted, key=int)) or 'no query'}[/dim]")
        if ivm.get("copy_differs"):
            c.print(f"[bold red]pg_ivm's copy differs from the benchmark schema in "
                    f"{', '.join(ivm['copy_differs'])}[/bold red]")
    for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0])):
        x = q.get("pg_ivm") or {}
        if x.get("status") in ("refused", "timeout"):
            c.print(f"[dim]Q{nr} pg_ivm {x['status']}: {x['message']}[/dim]")
        elif x.get("status") == "accepted" and not x["indexed"]:
            c.print(f"[yellow]Q{nr} pg_ivm could not index its IMMV: "
                    f"{'; '.join(x['notices'])}[/yellow]")
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
        for e in q.get("peer_failures", []):
            c.print(f"[yellow]Q{nr} peer left out: {e}[/yellow]")
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
    print_explained(c, result)
    setup = result["setup"]
    c.print(f"[dim]setup: generate {setup['generate_s']:.1f} s, copy {setup['copy_s']:.1f} s, "
            f"vacuum (freeze, analyze) {setup['analyze_s']:.1f} s; rows " + ", ".join(
                f"{k} {v:,}" for k, v in setup["rows"].items()) + "[/dim]")
    c.print("[dim]batch per round: " + ", ".join(
        f"{k} {v:,}" for k, v in result["config"]["batch_sizes"].items()) + "[/dim]")
    ok = result["ok"]
    c.print(f"[bold {'green' if ok else 'red'}]"
            + ("every maintained view equalled its recomputation after every round"
               if ok else "FAILED: see the mismatches / errors above")
            + f"[/bold {'green' if ok else 'red'}] (total {result['total_s']:.0f} s)")


def _node(n: dict[str, Any] | None) -> str:
    if not n:
        return "–"
    on = n["relation"] or ""
    if n["index"]:
        on = f"{on} ({n['index']})" if on else n["index"]
    return (f"{n['node_type']}{' ' + on if on else ''}: {n['rows']:,} rows, "
            f"{_fms(n['self_ms'] / 1000)} ms")


def print_explained(c: Console, result: dict[str, Any], k: int = 3) -> None:
    """The ``k`` slowest statements of each query's explained id maintain."""
    queries = sorted(result["queries"].items(), key=lambda kv: int(kv[0]))
    for nr, q in queries:
        if (q.get("explain") or {}).get("error"):
            c.print(f"[yellow]Q{nr} not explained: {q['explain']['error']}[/yellow]")
    rows = [(nr, q["explain"]) for nr, q in queries if (q.get("explain") or {}).get("top")]
    if not rows:
        return
    t = Table(title="the id maintain's slowest statements (auto_explain, one more batch, "
              "untimed)", title_style="bold",
              caption="ms: the statement's time under auto_explain (which times every plan "
              "node: slower than the rounds); buffers: shared hit / read (local: temporary "
              "tables); costliest node: the plan node with the most time of its own")
    for h in ("query", "maintain ms", "statement ms", "rows", "shared hit / read",
              "local hit / read", "costliest node", "statement"):
        t.add_column(h, justify="left" if h in ("query", "costliest node", "statement")
                     else "right")
    for nr, x in rows:
        for i, st in enumerate(x["top"][:k]):
            t.add_row(f"Q{nr}" if i == 0 else "", _fms(x["s"]) if i == 0 else "",
                      _fms(st["ms"] / 1000), f"{st['rows']:,}",
                      f"{st['shared_hit']:,} / {st['shared_read']:,}",
                      f"{st['local_hit']:,} / {st['local_read']:,}", _node(st["costliest"]),
                      st["sql"][:70] + ("…" if len(st["sql"]) > 70 else ""))
        t.add_section()
    c.print(t)


PLOTTED = (("recompute", "recompute"), ("refresh", "REFRESH MATERIALIZED VIEW"),
           ("tuple", "tuple maintain"), ("id", "id maintain"), ("auto", "auto maintain"),
           ("apply_id", "apply + id maintain"), ("pg_ivm", "pg_ivm (apply with maintenance)"))


def plot(c: Console, result: dict[str, Any], path: Path) -> None:
    """Bars per accepted query (log scale): recompute, refresh, tuple and id maintain, apply +
    id, pg_ivm (the columns measured at all)."""
    plt = pyplot(c)
    if plt is None:
        return
    rows = [(nr, q) for nr, q in sorted(result["queries"].items(), key=lambda kv: int(kv[0]))
            if q["status"] == "accepted"]
    cols = [(col, label) for col, label in PLOTTED
            if any((q["summary"].get(col)) for _, q in rows)]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.3 * len(cols) * len(rows) + 2), 5.2))
    w = 0.8 / max(len(cols), 1)
    x = list(range(len(rows)))
    for k, (col, label) in enumerate(cols):
        med, lo, hi = [], [], []
        for _, q in rows:
            st = q["summary"].get(col)
            m = st["median"] * 1000 if st else 0.0
            med.append(m)
            lo.append(m - st["min"] * 1000 if st else 0.0)
            hi.append(st["max"] * 1000 - m if st else 0.0)
        ax.bar([p + (k - (len(cols) - 1) / 2) * w for p in x], med, w, yerr=[lo, hi],
               capsize=2, label=label)
    ax.set_yscale("log")
    ax.set_xticks(x, [f"Q{nr}" + ("" if q["summary"]["verified"] == "yes" else "\n"
                                  + q["summary"]["verified"]) for nr, q in rows])
    ax.set_ylabel("ms (median, min–max)")
    ax.set_title(f"idivm TPC-H on PostgreSQL, SF {result['config']['sf']:g}, "
                 f"{result['config']['rounds']} round(s)", fontsize=10)
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    c.print(f"wrote {path}")


# -- the run ----------------------------------------------------------------------------------
def _server(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        out = {}
        for k, q in (("version", "SHOW server_version"), ("shared_buffers", "SHOW shared_buffers"),
                     ("work_mem", "SHOW work_mem"), ("max_wal_size", "SHOW max_wal_size"),
                     ("checkpoint_timeout", "SHOW checkpoint_timeout"),
                     ("autovacuum", "SHOW autovacuum"),
                     ("full_version", "SELECT version()")):
            row = conn.execute(q).fetchone()
            out[k] = str(row[0]) if row else ""
        return out


def checkpoints(dsn: str) -> dict[str, int]:
    """The server's checkpoints so far (``pg_stat_bgwriter``): ``requested`` — for WAL volume
    past ``max_wal_size``, or by a CHECKPOINT command — and ``timed``."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT checkpoints_req, checkpoints_timed FROM pg_stat_bgwriter"
                           ).fetchone()
    return {"requested": int(row[0]), "timed": int(row[1])} if row else {}


def checkpoint_note(result: Mapping[str, Any]) -> str | None:
    """What a reader of the timings should know when the server checkpointed for WAL volume
    during the run (PostgreSQL's own log then says so, with its hint): each checkpoint
    writes the dirty pages while statements are timed, and a page's first change after it
    writes the whole page to the WAL — the maintained relations', not the recomputation's
    (a temporary table writes none)."""
    n = (result.get("checkpoints") or {}).get("requested", 0)
    if not n:
        return None
    size = result["config"]["server"].get("max_wal_size", "?")
    return (f"PostgreSQL started {n} checkpoint(s) for WAL volume during the run (max_wal_size "
            f"{size}): their writes shared the machine with the timed statements, and each "
            "page's first change after one wrote a full-page image to the WAL. For steadier "
            "figures: ALTER SYSTEM SET max_wal_size = '16GB'; SELECT pg_reload_conf();")


def _plan_query(nr: int, view_sql: str, catalog: Catalog) -> dict[str, Any]:
    """Plan ``PLAN_REPEAT`` times: accepted (with times and script lines), refused, or a planner
    exception."""
    times = []
    try:
        for _ in range(PLAN_REPEAT):
            t0 = time.perf_counter()
            p = idivm.plan(view_sql, catalog, name=f"q{nr}_id", merge=MERGE)  # (as created)
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
        schema: str = DEFAULT_SCHEMA, seed: int = SEED, explain: bool = False,
        fk_indexes: bool = True, warmup: int = 2, console: Console | None = None) -> int:
    """Run the benchmark; print the table, write ``tpch.json`` and ``tpch.png`` into ``out``.
    Returns the exit code: 0 when every view verified, 1 on a mismatch, a planner exception
    or an error (timeouts are reported, not failed). ``explain``: each query's id maintain
    once more under ``auto_explain`` after its rounds; ``fk_indexes``: index the foreign keys
    (``FK_INDEXES``) in the benchmark schema and pg_ivm's copy; ``warmup``: rounds before the
    timed ones, verified, out of the medians (``QueryRun.rounds``). The schema (with its ``__idivm``
    companion and pg_ivm's ``_pgivm`` copy) is dropped at the end, also on error, unless
    ``keep`` (then views that failed to verify are kept too)."""
    c = console or Console()
    start = time.perf_counter()
    all_sql = tpch_queries()
    wanted = sorted(dict.fromkeys(queries)) if queries else sorted(all_sql)
    unknown = [n for n in wanted if n not in all_sql]
    if unknown:
        raise IdivmError(f"unknown TPC-H queries {unknown}: choose from 1–22")
    if sf <= 0 or rounds < 1 or warmup < 0:
        raise IdivmError("sf must be positive, rounds at least 1 and warmup at least 0")
    if len(f"{schema}__idivm".encode()) > 63:
        raise IdivmError(f"schema name {schema!r} is too long")
    server = _server(dsn)
    import duckdb

    result: dict[str, Any] = {"config": {
        "sf": sf, "rounds": rounds, "warmup": warmup, "queries": wanted, "seed": seed,
        "schema": schema,
        "plan_repeat": PLAN_REPEAT, "maintain_limit_s": MAINTAIN_LIMIT_S,
        "create_limit_s": CREATE_LIMIT_S, "jit": "off on every benchmark connection",
        "compare": f"multisets; fractional columns to {SIGNIFICANT} significant digits",
        "server": server, "cpus": os.cpu_count(), "python": platform.python_version(),
        "idivm": idivm.__version__, "duckdb": duckdb.__version__,
        "explain": explain,
        "fk_indexes": fk_indexes,
        "times": "seconds; id/tuple: maintain (the CALL, client-side); recompute: CREATE TEMP "
                 "TABLE AS the query; refresh: REFRESH MATERIALIZED VIEW; apply: the batch on "
                 "the logged schema; pg_ivm: the batch on pg_ivm's copy with its IMMV",
    }, "queries": {}}
    c.rule(f"[bold]idivm bench tpch: TPC-H SF {sf:g} on PostgreSQL {server['version']}[/bold]")
    c.print(f"queries {', '.join(map(str, wanted))}; {rounds} timed round(s) each after "
            f"{warmup} warm-up round(s); schema {schema}")
    progress = Progress(SpinnerColumn(finished_text="[green]✓[/green]"),
                        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=c)
    drop_schema(dsn, schema)
    conn: Conn | None = None
    m: PostgresMaintainer | None = None
    peer: PgIvmPeer | None = None
    why = pgivm.unavailable(dsn)
    result["pg_ivm"] = {"unavailable": why} if why else {"schema": pg_ivm_schema(schema)}
    if why:
        c.print(f"[yellow]no pg_ivm column: {why}[/yellow]")
    try:
        with progress:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as c0:
                c0.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn = _connect(dsn, schema)
            with step(progress, f"generate TPC-H SF {sf:g} (DuckDB) and COPY it into {schema}"):
                result["setup"] = load(conn, sf, fk_indexes)
            conn.execute(f"SET statement_timeout = '{int(RECOMPUTE_TIMEOUT_S * 1000)}ms'")
            if not why:
                with step(progress, f"pg_ivm: copy the base tables into {pg_ivm_schema(schema)}"):
                    peer = PgIvmPeer(dsn, schema, fk_indexes)
                    result["pg_ivm"].update(peer.setup())
            m = PostgresMaintainer(dsn, schema=schema)
            catalog = m.catalog()
            refresher = Refresher(conn, seed)
            result["config"]["batch_sizes"] = refresher.sizes
            before = checkpoints(dsn)  # (after the load's own CHECKPOINTs: settle)
            task = progress.add_task("plan", total=len(wanted))
            for nr in wanted:
                progress.update(task, description=f"q{nr}: plan")
                q = _plan_query(nr, all_sql[nr], catalog)
                q["sql"] = all_sql[nr]
                result["queries"][str(nr)] = q
                if q["status"] == "accepted":
                    run_ = QueryRun(nr, all_sql[nr], conn, m, catalog, schema, refresher,
                                    progress, task, peer)
                    try:
                        live = run_.create()
                        if live:
                            run_.rounds(rounds, live, warmup)
                            if explain:
                                run_.explain(live)
                    except (psycopg.Error, IdivmError) as e:  # recorded, the run goes on
                        run_.rec["errors"].append(f"benchmark: {_err(e)}")
                    finally:
                        run_.drop(keep_failed=keep)
                    q.update(run_.rec)
                    q["summary"] = summarize(q)
                progress.advance(task)
            progress.update(task, description="queries")
            if peer is not None:
                with step(progress, "pg_ivm: its copy of the base tables against the schema's"):
                    result["pg_ivm"]["copy_differs"] = peer.differs()
    finally:
        if peer is not None:
            peer.close()
        if m is not None:
            m.close()
        if conn is not None:
            conn.close()
        if not keep:
            drop_schema(dsn, schema)
    result["total_s"] = time.perf_counter() - start
    after = checkpoints(dsn)
    result["checkpoints"] = {k: after[k] - before.get(k, 0) for k in after}
    qs = result["queries"].values()
    result["ok"] = not any(q["status"] == "planner exception" for q in qs) and all(
        q["summary"]["verified"] in ("yes", "timeout") for q in qs if q["status"] == "accepted"
    ) and not result["pg_ivm"].get("copy_differs")
    print_result(c, result)
    note = checkpoint_note(result)
    if note:
        c.print(f"[yellow]{note}[/yellow]")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tpch.json").write_text(json.dumps(result, indent=2, default=str))
    c.print(f"wrote {path / 'tpch.json'}")
    plot(c, result, path / "tpch.png")
    if keep:
        c.print(f"kept schema {schema}" + "".join(
            f"; kept {', '.join(q['kept'])}" for q in qs if q.get("kept")))
    return 0 if result["ok"] else 1
