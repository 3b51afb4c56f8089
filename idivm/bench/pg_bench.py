"""``idivm bench pg``: maintenance cost on PostgreSQL against REFRESH and the physical limit.

The paper's parts/devices example (``idivm.examples``): devices_parts has ``links`` rows,
devices and parts ``links / fanout`` each, 20% of devices are phones, each device links to
``fanout`` distinct pseudo-random parts (generated in SQL from ``hashtext``, so every run loads
the same data). Per size two schemas:

- **A** holds the base tables and six idivm views, V and V′ under each strategy (``id``,
  ``tuple``, ``recompute``), created without a changes restriction;
- **B** holds an identical plain copy of the base tables (no triggers), a ``MATERIALIZED VIEW``
  of V and of V′ (the ``refresh`` column) and a plain table copy of each view's rows, indexed on
  its keys (V: ``(did, pid)`` and ``pid``; V′: ``did``) — the ``limit`` column.

Every batch is applied identically to A and B. Per batch and round, side by side, in an order
rotated each round:

- ``id`` / ``tuple`` / ``recompute``: ``maintain`` of that strategy's view (maintain only; the
  base-table update on A, which fires idivm's change-logging triggers, is timed separately);
- ``refresh``: ``REFRESH MATERIALIZED VIEW`` on B;
- ``limit``: the plain base-table update on B plus the minimal hand-written statements that
  apply just the view's final changes to B's copy (DELETE / UPDATE / INSERT, each only when it
  has rows). The changes are computed untimed, after B's update and before the timed apply: the
  view's rows for the affected keys are recomputed into temporary tables and compared with the
  copy's. For V a price change is one ``UPDATE … FROM … WHERE copy.pid = d.pid``, for V′ an
  ``UPDATE`` of the affected phones' cost.

- ``pg_ivm`` (when the pg_ivm extension is installed on the server: ``LOAD 'pg_ivm'`` works):
  the same batch on a schema of its own per view (``<prefix>_<links>_c_<view>``: a plain copy
  of the base tables and an IMMV of the view, ``pgivm.create_immv``), timed whole — pg_ivm
  maintains the view in the statements' AFTER triggers, so its column is the update plus the
  maintenance, to compare with idivm's update on A plus ``id`` maintain
  (``(update+id)/pg_ivm``). idivm neither ships nor builds pg_ivm; without it the column is
  left out and said so.

After each round every idivm view, the materialized views, the copies and the IMMVs are compared
with the view query recomputed in their schema (``EXCEPT ALL`` both ways); a difference aborts
the run.

Batches: ``1`` one price update; ``200`` / ``20000`` that many price updates in one UPDATE;
``200x1`` 200 single-row UPDATE statements in one transaction (sent pipelined by psycopg's
``executemany``; the statement-level triggers fire once per statement); ``mixed`` 300 new
links, 300 deleted links, 300 price updates and 100 category flips (phone ↔ other) in one
transaction. Each batch picks parts and devices no earlier batch of the run picked (until the
run has gone through them all). Prices change by +1, so no update is a no-op.

Also measured: the floor (``maintain`` of each id view with nothing pending, and after a
single price update), and the writer wait: a single-row price update on another connection,
started ~10 ms into an id ``maintain`` of V′ after a 20,000-update batch.

Every connection of the benchmark runs with ``jit = off``, as idivm's maintain does.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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

from idivm.bench import pgivm, pyplot, step
from idivm.bench.pgivm import drop_schemas
from idivm.errors import IdivmError
from idivm.examples import V_PRIME_SQL, V_SQL
from idivm.planner.model import Strategy
from idivm.postgres import PostgresMaintainer

Conn: TypeAlias = "psycopg.Connection[Any]"

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_LINKS = (500_000, 2_000_000)
BATCHES = ("1", "200", "20000", "200x1", "mixed")
STRATEGIES: tuple[Strategy, ...] = ("id", "tuple", "recompute")
COLUMNS = ("id", "tuple", "recompute", "refresh", "limit", "pg_ivm")
MIXED = {"insert": 300, "delete": 300, "price": 300, "flip": 100}
WRITER_BATCH = 20_000
WRITER_DELAY = 0.010
MODE_200X1 = ("one transaction of single-row UPDATE statements (200 at scale 1), sent by "
              "psycopg's executemany ({})")


class BenchMismatch(IdivmError):
    """A maintained view, materialized view or limit copy differs from its recomputation."""


@dataclass(frozen=True)
class ViewDef:
    label: str  # as printed: V, V'
    name: str  # prefix of the relations: v, vp
    sql: str
    columns: tuple[str, ...]

    def idivm(self, strategy: str) -> str:
        return f"{self.name}_{strategy}"

    @property
    def matview(self) -> str:
        return f"mv_{self.name}"

    @property
    def copy(self) -> str:
        return f"lim_{self.name}"

    @property
    def immv(self) -> str:
        return f"ivm_{self.name}"


VIEWS = (ViewDef("V", "v", V_SQL, ("did", "pid", "price")),
         ViewDef("V'", "vp", V_PRIME_SQL, ("did", "cost")))

# The paper's schema (idivm.examples.PAPER_DDL), loaded without constraints, which are added
# afterwards (an index build and one foreign-key check per key are faster than per-row ones).
CREATE_TABLES = (
    "CREATE TABLE devices (did text, category text)",
    "CREATE TABLE parts (pid text, price int NOT NULL)",
    "CREATE TABLE devices_parts (did text NOT NULL, pid text NOT NULL)",
)
ADD_CONSTRAINTS = (
    "ALTER TABLE devices ADD PRIMARY KEY (did)",
    "ALTER TABLE parts ADD PRIMARY KEY (pid)",
    "ALTER TABLE devices_parts ADD PRIMARY KEY (did, pid), "
    "ADD FOREIGN KEY (did) REFERENCES devices (did), "
    "ADD FOREIGN KEY (pid) REFERENCES parts (pid)",
)
TABLES = ("devices", "parts", "devices_parts")

# H(x): a deterministic pseudo-random integer in [0, 2^32) (hashtext is stable for a server
# version; abs() would overflow on -2^31).
GEN_DEVICES = """
INSERT INTO devices
SELECT 'D' || i,
       CASE WHEN (hashtext('c' || i)::bigint + 2147483648) %% 10000 < %(phones)s::bigint
            THEN 'phone' ELSE 'other' END
FROM generate_series(0, %(devices)s::bigint - 1) i
"""
GEN_PARTS = """
INSERT INTO parts
SELECT 'P' || i, 1 + ((hashtext('p' || i)::bigint + 2147483648) %% 1000)::int
FROM generate_series(0, %(parts)s::bigint - 1) i
"""
# Link j of device d goes to slice j of the parts (slices of parts / fanout, rotated by a
# per-device offset), at a pseudo-random place in it: a device's parts are distinct.
GEN_LINKS = """
INSERT INTO devices_parts
SELECT 'D' || d,
       'P' || ((b.base + j * %(step)s::bigint
                + (hashtext('l' || d || ':' || j)::bigint + 2147483648) %% %(step)s::bigint)
               %% %(parts)s::bigint)
FROM generate_series(0, %(devices)s::bigint - 1) d
CROSS JOIN LATERAL (SELECT (hashtext('b' || d)::bigint + 2147483648) %% %(parts)s::bigint
                    AS base) b
CROSS JOIN generate_series(0, %(fanout)s::bigint - 1) j
"""

PRICE_ANY = "UPDATE parts SET price = price + 1 WHERE pid = ANY(%s::text[])"
PRICE_ONE = "UPDATE parts SET price = price + 1 WHERE pid = %s"
LINK_INSERT = ("INSERT INTO devices_parts (did, pid) "
               "SELECT * FROM unnest(%s::text[], %s::text[])")
LINK_DELETE = ("DELETE FROM devices_parts WHERE (did, pid) IN "
               "(SELECT * FROM unnest(%s::text[], %s::text[]))")
FLIP = ("UPDATE devices SET category = CASE WHEN category = 'phone' THEN 'other' "
        "ELSE 'phone' END WHERE did = ANY(%s::text[])")

# The limit: the view's rows for the affected keys, recomputed (untimed) after B's update.
# %(pids)s: parts whose price changed, %(dids)s: devices whose category flipped,
# %(ld)s / %(lp)s: inserted and deleted links.
_AFFECTED_V = ("(pid = ANY(%(pids)s::text[]) OR did = ANY(%(dids)s::text[]) OR (did, pid) IN "
               "(SELECT * FROM unnest(%(ld)s::text[], %(lp)s::text[])))")
LIMIT_PREP = {
    "v": (
        "CREATE TEMP TABLE d_new AS SELECT did, pid, price FROM parts NATURAL JOIN devices_parts "
        "NATURAL JOIN devices WHERE category = 'phone' AND " + _AFFECTED_V,
        "CREATE TEMP TABLE d_old AS SELECT did, pid, price FROM lim_v WHERE " + _AFFECTED_V,
        "CREATE TEMP TABLE d_del AS SELECT did, pid FROM d_old EXCEPT SELECT did, pid FROM d_new",
        "CREATE TEMP TABLE d_ins AS SELECT n.did, n.pid, n.price FROM d_new n WHERE NOT EXISTS "
        "(SELECT 1 FROM d_old o WHERE o.did = n.did AND o.pid = n.pid)",
        # price is a function of pid: one row per changed part
        "CREATE TEMP TABLE d_upd AS SELECT DISTINCT n.pid, n.price FROM d_new n "
        "JOIN d_old o USING (did, pid) WHERE n.price <> o.price",
    ),
    "vp": (
        "CREATE TEMP TABLE d_keys AS SELECT did FROM devices_parts "
        "WHERE pid = ANY(%(pids)s::text[]) UNION SELECT unnest(%(dids)s::text[]) "
        "UNION SELECT unnest(%(ld)s::text[])",
        "CREATE TEMP TABLE d_new AS SELECT did, sum(price) AS cost FROM parts NATURAL JOIN "
        "devices_parts NATURAL JOIN devices WHERE category = 'phone' AND did IN "
        "(SELECT did FROM d_keys) GROUP BY did",
        "CREATE TEMP TABLE d_old AS SELECT did, cost FROM lim_vp WHERE did IN "
        "(SELECT did FROM d_keys)",
        "CREATE TEMP TABLE d_del AS SELECT did FROM d_old EXCEPT SELECT did FROM d_new",
        "CREATE TEMP TABLE d_ins AS SELECT n.did, n.cost FROM d_new n WHERE NOT EXISTS "
        "(SELECT 1 FROM d_old o WHERE o.did = n.did)",
        "CREATE TEMP TABLE d_upd AS SELECT n.did, n.cost FROM d_new n JOIN d_old o USING (did) "
        "WHERE n.cost <> o.cost",
    ),
}
LIMIT_APPLY = {  # (delta table, statement), run in this order, each only if its delta has rows
    "v": (("d_del", "DELETE FROM lim_v c USING d_del d WHERE c.did = d.did AND c.pid = d.pid"),
          ("d_upd", "UPDATE lim_v c SET price = d.price FROM d_upd d WHERE c.pid = d.pid"),
          ("d_ins", "INSERT INTO lim_v (did, pid, price) SELECT did, pid, price FROM d_ins")),
    "vp": (("d_del", "DELETE FROM lim_vp c USING d_del d WHERE c.did = d.did"),
           ("d_upd", "UPDATE lim_vp c SET cost = d.cost FROM d_upd d WHERE c.did = d.did"),
           ("d_ins", "INSERT INTO lim_vp (did, cost) SELECT did, cost FROM d_ins")),
}
LIMIT_TEMPS = ("d_keys", "d_new", "d_old", "d_del", "d_ins", "d_upd")
LIMIT_INDEXES = {"v": ("ALTER TABLE lim_v ADD PRIMARY KEY (did, pid)",
                       "CREATE INDEX ON lim_v (pid)"),
                 "vp": ("ALTER TABLE lim_vp ADD PRIMARY KEY (did)",)}
# pg_ivm indexes an IMMV itself only when its target list has every base table's key or it
# groups (V′: by did); V's NATURAL JOIN merges the keys' columns, so it gets the limit copy's
# indexes by hand, as pg_ivm's notice advises (without them its maintenance scans the IMMV).
# Its delta queries join the changed parts to devices_parts by pid, which the key (did, pid)
# does not serve: that index too, as a pg_ivm user would add (idivm's cache needs none)
IMMV_INDEXES = {"v": ("CREATE UNIQUE INDEX ON ivm_v (did, pid)", "CREATE INDEX ON ivm_v (pid)",
                      "CREATE INDEX ON devices_parts (pid)"),
                "vp": ("CREATE INDEX ON devices_parts (pid)",)}


# -- data and batches ---------------------------------------------------------------------------
class Picker:
    """Keys ``<prefix>0 … <prefix>{n-1}`` in a fixed pseudo-random order, handed out in turn:
    no key comes back before all others have."""

    def __init__(self, prefix: str, n: int, start: int = 0) -> None:
        self.prefix, self.n, self.cursor = prefix, n, start
        step = max(1, int(n * 0.6180339887))
        while math.gcd(step, n) != 1:
            step += 1
        self.step = step

    def take(self, k: int) -> list[str]:
        out = [f"{self.prefix}{(t * self.step + 7) % self.n}"
               for t in range(self.cursor, self.cursor + k)]
        self.cursor += k
        return out


@dataclass
class Batch:
    """One change batch: the statements to run (identically on A and B) and what they change."""

    key: str
    caption: str
    steps: list[tuple[str, Any, bool]] = field(default_factory=list)  # sql, params, many
    prices: list[str] = field(default_factory=list)
    flips: list[str] = field(default_factory=list)
    inserted: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.prices) + len(self.flips) + len(self.inserted) + len(self.deleted)

    def affected(self) -> dict[str, list[str]]:
        links = self.inserted + self.deleted
        return {"pids": self.prices, "dids": self.flips, "ld": [d for d, _ in links],
                "lp": [p for _, p in links]}


def batch_sizes(scale: float, parts: int) -> dict[str, int]:
    """Changes per batch at ``scale`` (at least one each; price updates at most ``parts``)."""
    def n(x: int) -> int:
        return max(1, round(x * scale))
    return {"1": 1, "200": min(n(200), parts), "20000": min(n(20_000), parts),
            "200x1": min(n(200), parts), **{f"mixed {k}": n(v) for k, v in MIXED.items()}}


@dataclass
class Size:
    links: int
    fanout: int
    phone_share: float
    scale: float
    schema_a: str
    schema_b: str
    devices: int = 0
    parts: int = 0

    def __post_init__(self) -> None:
        self.devices = self.parts = self.links // self.fanout
        self.part_picker = Picker("P", self.parts)
        self.device_picker = Picker("D", self.devices, start=self.devices // 3)
        self.sizes = batch_sizes(self.scale, self.parts)

    @property
    def companion(self) -> str:
        return f"{self.schema_a}__idivm"

    def schema_c(self, view: ViewDef) -> str:
        """The schema of ``view``'s pg_ivm IMMV and its own copy of the base tables."""
        return f"{self.schema_b.removesuffix('_b')}_c_{view.name}"


def build_batch(key: str, size: Size, cb: Conn) -> Batch:
    """The next batch ``key`` (untimed); link choices are checked against B's current links."""
    n = size.sizes
    if key in ("1", "200", "20000"):
        k = n[key]
        pids = size.part_picker.take(k)
        if k == 1:
            return Batch(key, "1 price update", [(PRICE_ONE, (pids[0],), False)], prices=pids)
        return Batch(key, f"{k:,} price updates, one UPDATE", [(PRICE_ANY, (pids,), False)],
                     prices=pids)
    if key == "200x1":
        pids = size.part_picker.take(n[key])
        return Batch(key, f"{len(pids)} single-row UPDATEs, one transaction",
                     [(PRICE_ONE, [(p,) for p in pids], True)], prices=pids)
    if key != "mixed":
        raise IdivmError(f"unknown batch {key!r}: choose from {', '.join(BATCHES)}")
    devs = size.device_picker.take(n["mixed delete"])
    deleted = [(str(d), str(p)) for d, p in cb.execute(
        "SELECT DISTINCT ON (did) did, pid FROM devices_parts WHERE did = ANY(%s::text[]) "
        "ORDER BY did, pid", (devs,)).fetchall()]
    pairs = list(dict.fromkeys(zip(size.device_picker.take(n["mixed insert"]),
                                   size.part_picker.take(n["mixed insert"]), strict=True)))
    existing = {(str(d), str(p)) for d, p in cb.execute(
        "SELECT did, pid FROM devices_parts WHERE (did, pid) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([d for d, _ in pairs], [p for _, p in pairs])).fetchall()}
    inserted = [x for x in pairs if x not in existing and x not in set(deleted)]
    prices = size.part_picker.take(n["mixed price"])
    flips = size.device_picker.take(n["mixed flip"])
    b = Batch(key, "", [
        (LINK_INSERT, ([d for d, _ in inserted], [p for _, p in inserted]), False),
        (LINK_DELETE, ([d for d, _ in deleted], [p for _, p in deleted]), False),
        (PRICE_ANY, (prices,), False), (FLIP, (flips,), False)],
        prices=prices, flips=flips, inserted=inserted, deleted=deleted)
    b.caption = (f"{b.changes:,} mixed changes: +{len(inserted)} / -{len(deleted)} links, "
                 f"{len(prices)} price updates, {len(flips)} category flip"
                 + ("s" if len(flips) != 1 else ""))
    return b


def apply_batch(conn: Conn, batch: Batch) -> float:
    """Run the batch's statements in one transaction; seconds including the commit."""
    t0 = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        for query, params, many in batch.steps:
            if many:
                cur.executemany(query, params)
            else:
                cur.execute(query, params)
    return time.perf_counter() - t0


# -- helpers ------------------------------------------------------------------------------------
def _connect(dsn: str, schema: str | None = None) -> Conn:
    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    conn.execute("SET jit = off")
    if schema is not None:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    return conn


def _timed(conn: Conn, query: sql.Composed) -> float:
    t0 = time.perf_counter()
    conn.execute(query)
    return time.perf_counter() - t0


def _maintain(m: PostgresMaintainer, name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    s = m.maintain(name)
    return {"s": time.perf_counter() - t0, "stats_s": s.seconds, "changes": s.changes}


def _diff(conn: Conn, cols: Sequence[str], a: sql.Composable, b: sql.Composable) -> int:
    """Rows in one relation and not the other, as multisets."""
    c = sql.SQL(", ").join(sql.Identifier(x) for x in cols)
    q = sql.SQL("SELECT count(*) FROM ((SELECT {c} FROM {a} EXCEPT ALL SELECT {c} FROM {b}) "
                "UNION ALL (SELECT {c} FROM {b} EXCEPT ALL SELECT {c} FROM {a})) d"
                ).format(c=c, a=a, b=b)
    row = conn.execute(q).fetchone()
    return int(row[0]) if row else -1


def _check(conn: Conn, view: ViewDef, targets: Sequence[str]) -> dict[str, Any]:
    """Compare each relation in ``targets`` (in the connection's schema) with the view query
    recomputed there. Returns the expected row count and the differing rows per target."""
    conn.execute("DROP TABLE IF EXISTS pg_temp.expected")
    conn.execute(sql.SQL("CREATE TEMP TABLE expected AS {}").format(sql.SQL(view.sql)))
    row = conn.execute("SELECT count(*) FROM pg_temp.expected").fetchone()
    out: dict[str, Any] = {"rows": int(row[0]) if row else -1, "diff": {}}
    for t in targets:
        out["diff"][t] = _diff(conn, view.columns, sql.Identifier(t),
                               sql.Identifier("pg_temp", "expected"))
    conn.execute("DROP TABLE pg_temp.expected")
    return out


def _stats(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


# -- one size -----------------------------------------------------------------------------------
class SizeRun:
    """Schemas A and B of one size, and the measurements on them."""

    def __init__(self, size: Size, dsn: str, progress: Progress) -> None:
        self.size, self.dsn, self.progress = size, dsn, progress
        self.ca: Conn | None = None
        self.cb: Conn | None = None
        self.cc: dict[str, Conn] = {}  # per view: its pg_ivm schema's connection
        self.m: PostgresMaintainer | None = None
        self.setup: dict[str, float | int] = {}
        self.pg_ivm = ""  # why pg_ivm is not measured ("" when it is)

    # connections, set up in ``prepare``
    @property
    def a(self) -> Conn:
        assert self.ca is not None
        return self.ca

    @property
    def b(self) -> Conn:
        assert self.cb is not None
        return self.cb

    @property
    def maintainer(self) -> PostgresMaintainer:
        assert self.m is not None
        return self.m

    def close(self) -> None:
        for c in (self.ca, self.cb, *self.cc.values()):
            if c is not None:
                c.close()
        if self.m is not None:
            self.m.close()
        self.ca = self.cb = self.m = None
        self.cc = {}

    def drop(self) -> None:
        self.close()
        s = self.size
        drop_schemas(self.dsn, s.schema_a, s.companion, s.schema_b,
                     *(s.schema_c(v) for v in VIEWS))

    # -- setup --------------------------------------------------------------------------------
    def prepare(self) -> None:
        s, p = self.size, self.progress
        drop_schemas(self.dsn, s.schema_a, s.companion, s.schema_b,
                     *(s.schema_c(v) for v in VIEWS))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for schema in (s.schema_a, s.schema_b):
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        self.ca, self.cb = _connect(self.dsn, s.schema_a), _connect(self.dsn, s.schema_b)
        params = {"devices": s.devices, "parts": s.parts, "fanout": s.fanout,
                  "step": s.parts // s.fanout, "phones": round(s.phone_share * 10_000)}
        with step(p, f"{s.links:,} links: generate A (devices, parts, devices_parts)"):
            t0 = time.perf_counter()
            with self.a.transaction():
                for q in CREATE_TABLES:
                    self.a.execute(q)
                for q in (GEN_DEVICES, GEN_PARTS, GEN_LINKS):
                    self.a.execute(q, params)
                for q in ADD_CONSTRAINTS:
                    self.a.execute(q)
            self.a.execute("ANALYZE devices, parts, devices_parts")
            self.setup["load A s"] = time.perf_counter() - t0
        with step(p, f"{s.links:,} links: copy the base tables into B"):
            t0 = time.perf_counter()
            with self.b.transaction():
                for q in CREATE_TABLES:
                    self.b.execute(q)
                for t in TABLES:
                    self.b.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
                        sql.Identifier(s.schema_b, t), sql.Identifier(s.schema_a, t)))
                for q in ADD_CONSTRAINTS:
                    self.b.execute(q)
            self.b.execute("ANALYZE devices, parts, devices_parts")
            self.setup["load B s"] = time.perf_counter() - t0
        for t in TABLES:
            row = self.a.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))
                                 ).fetchone()
            self.setup[f"{t} rows"] = int(row[0]) if row else 0
        self.m = PostgresMaintainer(self.dsn, schema=s.schema_a)
        for v in VIEWS:
            for strategy in STRATEGIES:
                with step(p, f"{s.links:,} links: create idivm view {v.label} ({strategy})"):
                    t0 = time.perf_counter()
                    self.maintainer.create_view(v.idivm(strategy), v.sql, changes=None,
                                                strategy=strategy)
                    self.setup[f"create {v.label} {strategy} s"] = time.perf_counter() - t0
        self._analyze(s.companion)

    def _analyze(self, schema: str) -> None:
        """ANALYZE every table of ``schema`` (so no plan depends on when autovacuum ran)."""
        names = [str(r[0]) for r in self.a.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()]
        for n in names:
            self.a.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, n)))

    def prepare_pg_ivm(self) -> None:
        """Per view, a schema with a copy of the base tables and the view as a pg_ivm IMMV;
        when pg_ivm cannot be loaded, say why (``self.pg_ivm``) and measure without it."""
        s = self.size
        self.pg_ivm = pgivm.unavailable(self.dsn)
        if self.pg_ivm:
            return
        for v in VIEWS:
            schema = s.schema_c(v)
            with step(self.progress, f"{s.links:,} links: pg_ivm: copy the base tables and "
                      f"create the IMMV of {v.label}"):
                t0 = time.perf_counter()
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                c = self.cc[v.name] = pgivm.connect(self.dsn, schema)
                with c.transaction():
                    for q in CREATE_TABLES:
                        c.execute(q)
                    for t in TABLES:
                        c.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
                            sql.Identifier(schema, t), sql.Identifier(s.schema_b, t)))
                    for q in ADD_CONSTRAINTS:
                        c.execute(q)
                pgivm.create_immv(c, v.immv, v.sql, [sql.SQL(q) for q in IMMV_INDEXES[v.name]])
                c.execute("ANALYZE devices, parts, devices_parts")
                self.setup[f"create pg_ivm {v.label} s"] = time.perf_counter() - t0

    def prepare_b_views(self) -> None:
        """B's materialized views and the plain copies of the views' rows."""
        s = self.size
        with step(self.progress, f"{s.links:,} links: B: materialized views and limit copies"):
            t0 = time.perf_counter()
            for v in VIEWS:
                self.b.execute(sql.SQL("CREATE MATERIALIZED VIEW {} AS {}").format(
                    sql.Identifier(v.matview), sql.SQL(v.sql)))
                self.b.execute(sql.SQL("CREATE TABLE {} AS {}").format(
                    sql.Identifier(v.copy), sql.SQL(v.sql)))
                for q in LIMIT_INDEXES[v.name]:
                    self.b.execute(q)
                self.b.execute(sql.SQL("ANALYZE {}, {}").format(sql.Identifier(v.matview),
                                                                 sql.Identifier(v.copy)))
            self.setup["create B views s"] = time.perf_counter() - t0

    # -- catching up and verifying ------------------------------------------------------------
    def catch_up(self) -> None:
        for v in VIEWS:
            for strategy in STRATEGIES:
                self.maintainer.maintain(v.idivm(strategy))

    def verify(self, where: str, b_too: bool = True) -> dict[str, Any]:
        """Every idivm view on A (and the matviews and copies on B) against the query; raises
        ``BenchMismatch`` on a difference."""
        out: dict[str, Any] = {}
        bad: list[str] = []
        for v in VIEWS:
            ra = _check(self.a, v, [v.idivm(st) for st in STRATEGIES])
            out[v.label] = {"rows": ra["rows"], "diff": ra["diff"]}
            if b_too:
                rb = _check(self.b, v, [v.matview, v.copy])
                out[v.label]["rows B"] = rb["rows"]
                out[v.label]["diff"].update(rb["diff"])
                if v.name in self.cc:
                    out[v.label]["diff"].update(_check(self.cc[v.name], v, [v.immv])["diff"])
            bad += [f"{v.label}: {t} ({n} rows differ)" for t, n in out[v.label]["diff"].items()
                    if n]
        if bad:
            raise BenchMismatch(f"{self.size.links:,} links, {where}: " + "; ".join(bad))
        return out

    def verify_base(self) -> None:
        """A's and B's base tables are equal."""
        s = self.size
        cols = {"devices": ("did", "category"), "parts": ("pid", "price"),
                "devices_parts": ("did", "pid")}
        bad = [t for t in TABLES if _diff(self.a, cols[t], sql.Identifier(s.schema_a, t),
                                           sql.Identifier(s.schema_b, t))]
        if bad:
            raise BenchMismatch(f"{s.links:,} links: base tables differ between A and B: "
                                f"{', '.join(bad)}")

    # -- measurements -------------------------------------------------------------------------
    def floor(self, calls: int) -> dict[str, Any]:
        """``maintain`` of each id view with nothing pending, and after one price update."""
        s = self.size
        self.catch_up()
        out: dict[str, Any] = {v.label: {"none_s": [], "one_s": []} for v in VIEWS}
        with step(self.progress, f"{s.links:,} links: floor, {calls} × nothing pending"):
            for _ in range(calls):
                for v in VIEWS:
                    out[v.label]["none_s"].append(_maintain(self.maintainer, v.idivm("id"))["s"])
        with step(self.progress, f"{s.links:,} links: floor, {calls} × one pending update"):
            for _ in range(calls):
                pid = s.part_picker.take(1)[0]
                for conn in (self.a, self.b):
                    conn.execute(PRICE_ONE, (pid,))
                for v in VIEWS:
                    out[v.label]["one_s"].append(_maintain(self.maintainer, v.idivm("id"))["s"])
        self.catch_up()
        self.verify("after the floor", b_too=False)
        for v in VIEWS:
            for k in ("none", "one"):
                out[v.label][k] = _stats(out[v.label][f"{k}_s"])
        return out

    def round(self, key: str, rep: int) -> dict[str, Any]:
        """One batch on A and B, then every column in a rotated order, then verification."""
        s = self.size
        batch = build_batch(key, s, self.b)
        shift = rep + BATCHES.index(key)  # each batch's order moves on by one each round
        cols = COLUMNS if self.cc else COLUMNS[:-1]
        order = list(cols[shift % len(cols):] + cols[:shift % len(cols)])
        views = VIEWS if shift % 2 == 0 else VIEWS[::-1]
        rec: dict[str, Any] = {"links": s.links, "batch": key, "caption": batch.caption,
                               "round": rep + 1, "changes": batch.changes, "order": order,
                               "views": {v.label: {} for v in VIEWS}}
        if shift % 2 == 0:
            rec["update_a_s"], rec["update_b_s"] = apply_batch(self.a, batch), \
                apply_batch(self.b, batch)
        else:
            rec["update_b_s"] = apply_batch(self.b, batch)
            rec["update_a_s"] = apply_batch(self.a, batch)
        for col in order:
            for v in views:
                r = rec["views"][v.label]
                if col in STRATEGIES:
                    run = _maintain(self.maintainer, v.idivm(col))
                    r[f"{col}_s"], r[f"{col}_stats_s"] = run["s"], run["stats_s"]
                    if col == "id":
                        r["effective_changes"] = run["changes"]
                elif col == "refresh":
                    r["refresh_s"] = _timed(self.b, sql.SQL("REFRESH MATERIALIZED VIEW {}")
                                            .format(sql.Identifier(v.matview)))
                elif col == "pg_ivm":  # the batch itself, its IMMV maintained in its triggers
                    r["pg_ivm_s"] = apply_batch(self.cc[v.name], batch)
                else:
                    r["apply_s"], r["apply_rows"] = self._limit_apply(v, batch)
                    r["limit_s"] = rec["update_b_s"] + r["apply_s"]
        check = self.verify(f"batch {key}, round {rep + 1}")
        for v in VIEWS:
            rec["views"][v.label]["rows"] = check[v.label]["rows"]
        rec["verified"] = True
        return rec

    def _limit_apply(self, v: ViewDef, batch: Batch) -> tuple[float, dict[str, int]]:
        """Compute the view's final changes (untimed), then apply them to B's copy (timed)."""
        b = self.b
        params = batch.affected()
        for t in LIMIT_TEMPS:
            b.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("pg_temp", t)))
        for q in LIMIT_PREP[v.name]:
            b.execute(q, params)
        rows: dict[str, int] = {}
        for t, _ in LIMIT_APPLY[v.name]:
            b.execute(sql.SQL("ANALYZE {}").format(sql.Identifier("pg_temp", t)))
            row = b.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier("pg_temp", t))).fetchone()
            rows[t[2:]] = int(row[0]) if row else 0
        todo = [q for t, q in LIMIT_APPLY[v.name] if rows[t[2:]]]
        t0 = time.perf_counter()
        if todo:
            with b.transaction():
                for q in todo:
                    b.execute(q)
        took = time.perf_counter() - t0
        for t in LIMIT_TEMPS:
            b.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("pg_temp", t)))
        return took, rows

    def writer_wait(self, rounds: int) -> dict[str, Any]:
        """A single-row price update on another connection, started ~10 ms into an id maintain
        of V′ after a large price batch (A only: B is not used after this)."""
        s = self.size
        k = min(s.sizes["20000"], s.parts - 1)
        view = VIEWS[1]
        runs: list[dict[str, Any]] = []
        writer = _connect(self.dsn, s.schema_a)
        try:
            for _ in range(rounds):
                self.catch_up()
                alone = []  # the same update with nothing running, on a warm connection
                for pid in s.part_picker.take(3):
                    t0 = time.perf_counter()
                    writer.execute(PRICE_ONE, (pid,))
                    alone.append(time.perf_counter() - t0)
                batch = Batch("writer", f"{k:,} price updates",
                              [(PRICE_ANY, (s.part_picker.take(k),), False)])
                update = apply_batch(self.a, batch)
                pid = s.part_picker.take(1)[0]  # not in the batch (k < parts)
                runs.append(self._contend(writer, view, pid) | {
                    "alone_ms": statistics.median(alone) * 1000, "batch_update_s": update})
            self.catch_up()
            self.verify("after the writer-wait runs", b_too=False)
        finally:
            writer.close()
        return {"batch": k, "view": view.label, "delay_ms": WRITER_DELAY * 1000, "runs": runs,
                "wait_ms": _stats([r["wait_ms"] for r in runs]),
                "alone_ms": _stats([r["alone_ms"] for r in runs])}

    def _contend(self, writer: Conn, view: ViewDef, pid: str) -> dict[str, Any]:
        started = threading.Event()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                started.set()
                box["t0"] = time.perf_counter()
                box["stats"] = self.maintainer.maintain(view.idivm("id"))
                box["t1"] = time.perf_counter()
            except BaseException as e:  # re-raised in the caller
                box["error"] = e
                started.set()

        th = threading.Thread(target=work, name="idivm-bench-maintain")
        th.start()
        started.wait()
        time.sleep(WRITER_DELAY)
        w0 = time.perf_counter()
        writer.execute(PRICE_ONE, (pid,))
        w1 = time.perf_counter()
        th.join()
        if "error" in box:
            raise box["error"]
        return {"wait_ms": (w1 - w0) * 1000, "maintain_s": box["t1"] - box["t0"],
                "writer_started_ms": (w0 - box["t0"]) * 1000,
                "overlapped": w0 < box["t1"], "effective_changes": box["stats"].changes}


# -- the run ------------------------------------------------------------------------------------
def run(links: Sequence[int] = DEFAULT_LINKS, *, repeat: int = 5,
        batches: Sequence[str] = BATCHES, out: str | Path = "bench_out/pg",
        dsn: str = DEFAULT_DSN, keep: bool = False, scale: float = 1.0, floor_calls: int = 20,
        fanout: int = 10, phone_share: float = 0.2, prefix: str = "idivm_bench_pg",
        console: Console | None = None) -> dict[str, Any]:
    """Run the benchmark for each size in ``links``; print the table and the targets, write
    ``pg_bench.json`` and ``pg_bench.png`` into ``out``, return the result. ``scale`` multiplies
    the batch sizes (for tests). Schemas ``<prefix>_<links>_a`` (with its ``__idivm``
    companion) and ``<prefix>_<links>_b`` are dropped at the end, also on error, unless
    ``keep``. Raises ``BenchMismatch`` if any view differs from its recomputation."""
    c = console or Console()
    unknown = [b for b in batches if b not in BATCHES]
    if unknown or not batches:
        raise IdivmError(f"unknown batches {unknown}: choose from {', '.join(BATCHES)}")
    if repeat < 1 or floor_calls < 1 or scale <= 0 or fanout < 1 or not 0 < phone_share <= 1:
        raise IdivmError("repeat and floor_calls must be at least 1, scale positive, fanout at "
                         "least 1 and phone_share in (0, 1]")
    for n in links:
        if n // fanout < max(fanout, 10):
            raise IdivmError(f"{n} links is too few: devices = parts = links / fanout must be "
                             f"at least {max(fanout, 10)}")
    if len(f"{prefix}_{max(links)}_a__idivm".encode()) > 63:
        raise IdivmError(f"schema prefix {prefix!r} is too long")
    batches = [b for b in BATCHES if b in batches]
    sizes = [Size(n, fanout, phone_share, scale, f"{prefix}_{n}_a", f"{prefix}_{n}_b")
             for n in sorted(dict.fromkeys(links))]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        server = {k: str(conn.execute(q).fetchone()[0])  # type: ignore[index]
                  for k, q in (("version", "SHOW server_version"),
                               ("shared_buffers", "SHOW shared_buffers"),
                               ("work_mem", "SHOW work_mem"))}
    result: dict[str, Any] = {"config": {
        "links": [s.links for s in sizes], "fanout": fanout, "phone_share": phone_share,
        "repeat": repeat, "batches": batches, "scale": scale, "floor_calls": floor_calls,
        "batch_sizes": {str(s.links): s.sizes for s in sizes}, "batch_200x1": MODE_200X1.format(
            "pipelined" if psycopg.Pipeline.is_supported() else "one round trip each"),
        "writer_delay_ms": WRITER_DELAY * 1000, "jit": "off on every benchmark connection",
        "server": server, "cpus": os.cpu_count(), "python": platform.python_version(),
        "times": "seconds; id/tuple/recompute: maintain only; limit: B's base update + apply",
    }, "sizes": []}
    c.rule("[bold]idivm bench pg: parts/devices on PostgreSQL, maintenance vs REFRESH vs the "
           "physical limit[/bold]")
    c.print(f"links {', '.join(f'{s.links:,}' for s in sizes)}; fanout {fanout}, "
            f"{phone_share:.0%} phones; batches {', '.join(batches)} (scale {scale:g}); "
            f"{repeat} round(s) each; PostgreSQL {server['version']}, shared_buffers "
            f"{server['shared_buffers']}")
    progress = Progress(SpinnerColumn(finished_text="[green]✓[/green]"),
                        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=c)
    with progress:
        for size in sizes:
            result["sizes"].append(_run_size(size, dsn, progress, batches, repeat,
                                             floor_calls, keep))
    result["summary"] = summarize([r for s in result["sizes"] for r in s["rounds"]])
    result["targets"] = targets(result)
    print_result(c, result)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "pg_bench.json").write_text(json.dumps(result, indent=2, default=str))
    c.print(f"wrote {path / 'pg_bench.json'}")
    plot(c, result, path / "pg_bench.png")
    if keep:
        c.print("kept schemas " + ", ".join(", ".join(s["schemas"]) for s in result["sizes"]))
    return result


def _run_size(size: Size, dsn: str, progress: Progress, batches: Sequence[str], repeat: int,
              floor_calls: int, keep: bool) -> dict[str, Any]:
    sr = SizeRun(size, dsn, progress)
    try:
        sr.prepare()
        floor = sr.floor(floor_calls)
        sr.prepare_b_views()
        sr.prepare_pg_ivm()
        sr.verify("after setup")
        task = progress.add_task(f"{size.links:,} links: batches", total=repeat * len(batches))
        rounds = []
        for rep in range(repeat):
            for key in batches:
                progress.update(task, description=f"{size.links:,} links: batch {key}, round "
                                f"{rep + 1}/{repeat}")
                rounds.append(sr.round(key, rep))
                progress.advance(task)
        progress.update(task, description=f"{size.links:,} links: batches, all verified")
        sr.verify_base()
        with step(progress, f"{size.links:,} links: writer wait, {repeat} run(s)"):
            writer = sr.writer_wait(repeat)
        return {"links": size.links, "devices": size.devices, "parts": size.parts,
                "schemas": [size.schema_a, size.companion, size.schema_b,
                            *(size.schema_c(v) for v in VIEWS if v.name in sr.cc)],
                "pg_ivm": sr.pg_ivm or "measured",
                "setup": sr.setup, "floor": floor, "writer": writer, "rounds": rounds}
    finally:
        if keep:
            sr.close()
        else:
            sr.drop()


# -- results ------------------------------------------------------------------------------------
def summarize(rounds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, view and batch: median / min / max of every column, and the ratios of the
    medians."""
    out = []
    keys = dict.fromkeys((r["links"], v.label, r["batch"]) for v in VIEWS for r in rounds)
    for links, label, batch in sorted(keys, key=lambda k: (k[0], [v.label for v in VIEWS]
                                                           .index(k[1]), BATCHES.index(k[2]))):
        rs = [r for r in rounds if (r["links"], r["batch"]) == (links, batch)]
        vs = [r["views"][label] for r in rs]
        row: dict[str, Any] = {"links": links, "view": label, "batch": batch,
                               "caption": rs[0]["caption"], "rounds": len(rs),
                               "changes": statistics.median(r["changes"] for r in rs),
                               "update_a": _stats([r["update_a_s"] for r in rs]),
                               "update_b": _stats([r["update_b_s"] for r in rs]),
                               "id_with_update": _stats([r["update_a_s"] + v["id_s"]
                                                         for r, v in zip(rs, vs, strict=True)])}
        for col in (*STRATEGIES, "refresh", "limit", "apply", "pg_ivm"):
            if all(f"{col}_s" in v for v in vs):
                row[col] = _stats([v[f"{col}_s"] for v in vs])
        med = {k: row[k]["median"] for k in (*COLUMNS, "apply", "id_with_update") if k in row}
        row["id_over_limit"] = med["id_with_update"] / med["limit"]
        row["id_over_pg_ivm"] = med["id_with_update"] / med["pg_ivm"] if "pg_ivm" in med \
            else None
        row["maintain_over_apply"] = med["id"] / med["apply"] if med["apply"] else None
        row["tuple_over_id"] = med["tuple"] / med["id"]
        row["verified"] = all(r["verified"] for r in rs)
        out.append(row)
    return out


def _row(result: dict[str, Any], links: int, view: str, batch: str) -> dict[str, Any] | None:
    for r in result["summary"]:
        if (r["links"], r["view"], r["batch"]) == (links, view, batch):
            return dict(r)
    return None


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals, each with its figure and met / not met (``None``: not measured)."""
    sizes = {s["links"]: s for s in result["sizes"]}
    big, small = max(sizes), min(sizes)
    at = f" at {big:,} links"
    out: list[dict[str, Any]] = []

    def add(target: str, value: float | None, limit: float, figure: str,
            at_least: bool = False) -> None:
        met = None if value is None else (value >= limit if at_least else value <= limit)
        out.append({"target": target, "value": value, "limit": limit,
                    "figure": figure if value is not None else "not measured", "met": met})

    for view, bound in (("V'", 2.0), ("V", 1.5)):
        r = _row(result, big, view, "200")
        add(f"{view}, 200 price updates: id ≤ {bound:g}× limit{at}",
            r["id_over_limit"] if r else None, bound,
            f"{r['id_over_limit']:.2f}× (update+maintain {_fms(r['id_with_update']['median'])}"
            f" vs update+apply {_fms(r['limit']['median'])} ms; maintain/apply "
            f"{_ratio(r['maintain_over_apply'])})" if r else "")
    floor = sizes[big]["floor"]
    for k, bound, what in (("none", 10.0, "nothing pending"), ("one", 15.0, "one pending change")):
        worst = max((floor[v.label][k]["median"] * 1000, v.label) for v in VIEWS)
        add(f"floor, {what}: id maintain ≤ {bound:g} ms{at}", worst[0], bound,
            ", ".join(f"{v.label} {_fms(floor[v.label][k]['median'])} ms" for v in VIEWS))
    if big != small:
        ratios = []
        for r in result["summary"]:
            if r["links"] == big:
                s = _row(result, small, r["view"], r["batch"])
                if s:
                    ratios.append((r["id"]["median"] / s["id"]["median"], r["view"], r["batch"]))
        worst_r = max(ratios) if ratios else None
        add(f"same batch at {big:,} links ≤ 1.3× the {small:,}-link time (id, worst view × "
            "batch)", worst_r[0] if worst_r else None, 1.3,
            f"{worst_r[0]:.2f}× ({worst_r[1]}, batch {worst_r[2]}); all: " + ", ".join(
                f"{v} {b} {x:.2f}×" for x, v, b in ratios) if worst_r else "")
    else:
        add("same batch at the larger size ≤ 1.3× the smaller (id)", None, 1.3, "")
    for view in ("V'", "V"):
        r = _row(result, big, view, "200")
        x = r["id_over_pg_ivm"] if r else None
        add(f"{view}, 200 price updates: update + id maintain faster than pg_ivm's update with "
            f"immediate maintenance{at}", x, 1.0,
            f"{x:.2f}× (update+maintain {_fms(r['id_with_update']['median'])} ms vs pg_ivm "
            f"{_fms(r['pg_ivm']['median'])} ms)" if r and x is not None else "")
    r = _row(result, big, "V'", "200")
    add(f"V', 200 price updates: id ≥ 5× faster than tuple{at}",
        r["tuple_over_id"] if r else None, 5.0,
        f"{r['tuple_over_id']:.1f}× (id {_fms(r['id']['median'])} ms, tuple "
        f"{_fms(r['tuple']['median'])} ms)" if r else "", at_least=True)
    w = sizes[big]["writer"]
    add(f"writer wait during an id maintain of V' ({w['batch']:,} updates) ≤ 50 ms{at}",
        w["wait_ms"]["median"], 50.0,
        f"{w['wait_ms']['median']:.1f} ms (min–max {w['wait_ms']['min']:.1f}–"
        f"{w['wait_ms']['max']:.1f}; alone {w['alone_ms']['median']:.1f} ms; maintain "
        f"{statistics.median(x['maintain_s'] for x in w['runs']) * 1000:.0f} ms)")
    return out


def _fms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _cell(st: dict[str, float], rounds: int, sep: str = " ") -> str:
    if rounds == 1:
        return _fms(st["median"])
    return f"{_fms(st['median'])}{sep}({_fms(st['min'])}–{_fms(st['max'])})"


def _size(links: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if links >= div and links % (div // 10) == 0:
            return f"{links / div:g}{unit}"
    return f"{links:,}"


def _ratio(x: float | None) -> str:
    return "∞ (nothing to apply)" if x is None else f"{x:.2f}×"


HEADER = ("links", "view", "batch", "changes", "update A / B", "id", "tuple", "recompute",
          "refresh", "limit", "pg_ivm", "id/limit", "(update+id)/pg_ivm", "maintain/apply",
          "id vs tuple")


def _cells(r: dict[str, Any], sep: str = " ") -> list[str]:
    n = r["rounds"]
    ivm = r.get("id_over_pg_ivm")
    return [_size(r["links"]), r["view"], r["batch"], f"{r['changes']:,.0f}",
            f"{_fms(r['update_a']['median'])} / {_fms(r['update_b']['median'])}",
            *(_cell(r[c], n, sep) if c in r else "—" for c in COLUMNS),
            f"{r['id_over_limit']:.2f}×", "—" if ivm is None else f"{ivm:.2f}×",
            _ratio(r["maintain_over_apply"]), f"{r['tuple_over_id']:.1f}×"]


def _legend(result: dict[str, Any]) -> list[str]:
    """What each batch was, per size."""
    out = []
    for s in result["sizes"]:
        first: dict[str, str] = {}
        for r in s["rounds"]:
            first.setdefault(r["batch"], r["caption"])
        out.append(f"{_size(s['links'])} links: " + "; ".join(
            f"{b} = {c}" for b, c in first.items()) + " (round 1)")
    return out


CAPTION = ("times in ms, median (min–max) over the rounds; id / tuple / recompute: maintain "
           "only; refresh: REFRESH MATERIALIZED VIEW; limit: plain base update + hand-written "
           "apply of the view's changes; pg_ivm: the update with pg_ivm's immediate maintenance "
           "of an IMMV of the view (— when pg_ivm is not installed); id/limit: (update on A "
           "with idivm's logging triggers + id maintain) / limit; (update+id)/pg_ivm: the same "
           "over pg_ivm; maintain/apply: id maintain / apply alone; id vs tuple: tuple "
           "maintain / id maintain")


def markdown_table(result: dict[str, Any]) -> str:
    """The summary as a Markdown table (README-ready), with its caption below."""
    lines = ["| " + " | ".join(HEADER) + " |",
             "|" + "|".join("---" if h in ("view", "batch") else "---:" for h in HEADER) + "|"]
    for r in result["summary"]:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |")
    legend = "\n".join(f"- {x}" for x in _legend(result))
    return "\n".join(lines) + f"\n\n{CAPTION[0].upper()}{CAPTION[1:]}. Batches:\n\n{legend}\n"


def print_result(c: Console, result: dict[str, Any]) -> None:
    t = Table(title="idivm on PostgreSQL: maintain vs REFRESH vs the physical limit",
              title_style="bold", caption=CAPTION)
    for h in HEADER:
        t.add_column(h, justify="left" if h in ("view", "batch") else "right")
    prev = None
    for r in result["summary"]:
        if prev is not None and (r["links"], r["view"]) != prev:
            t.add_section()
        prev = (r["links"], r["view"])
        t.add_row(*_cells(r, "\n"))
    c.print(t)
    for line in _legend(result):
        c.print(f"[dim]batches, {line}[/dim]")
    for s in result["sizes"]:
        f, w = s["floor"], s["writer"]
        if s["pg_ivm"] != "measured":
            c.print(f"[yellow]{s['links']:,} links: no pg_ivm column: {s['pg_ivm']}[/yellow]")
        c.print(f"[bold]{s['links']:,} links[/bold] floor (id maintain, median of "
                f"{len(f[VIEWS[0].label]['none_s'])}): " + "; ".join(
                    f"{v.label} nothing pending {_fms(f[v.label]['none']['median'])} ms, one "
                    f"change {_fms(f[v.label]['one']['median'])} ms" for v in VIEWS))
        overlapped = sum(x["overlapped"] for x in w["runs"])
        c.print(f"[bold]{s['links']:,} links[/bold] writer wait: single-row UPDATE started "
                f"{w['delay_ms']:.0f} ms into an id maintain of {w['view']} ({w['batch']:,} "
                f"updates): {w['wait_ms']['median']:.1f} ms median ({w['wait_ms']['min']:.1f}–"
                f"{w['wait_ms']['max']:.1f}), alone {w['alone_ms']['median']:.1f} ms; the "
                f"maintain was still running in {overlapped}/{len(w['runs'])} runs")
        setup = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v:,}"
                          for k, v in s["setup"].items())
        c.print(f"[dim]setup: {setup}[/dim]")
    c.print("[bold]targets[/bold]")
    for tg in result["targets"]:
        word, color = {True: ("met", "green"), False: ("not met", "red"),
                       None: ("n/a", "yellow")}[tg["met"]]
        c.print(f"  [{color}]{word:<7}[/{color}]  {tg['target']}: {tg['figure']}")
    c.print("[bold green]every idivm view, materialized view and limit copy equalled its "
            "recomputation after every round[/bold green]")


def plot(c: Console, result: dict[str, Any], path: Path) -> None:
    """Grouped bars per batch (log scale), one panel per view × size."""
    plt = pyplot(c)
    if plt is None:
        return
    from matplotlib.ticker import FuncFormatter

    sizes = [s["links"] for s in result["sizes"]]
    fig, axes = plt.subplots(len(VIEWS), len(sizes), squeeze=False,
                             figsize=(max(7.0, 5.5 * len(sizes)), 0.6 + 3.9 * len(VIEWS)))
    w = 0.16
    for i, v in enumerate(VIEWS):
        for j, links in enumerate(sizes):
            ax = axes[i][j]
            rows = [r for r in result["summary"] if r["links"] == links and r["view"] == v.label]
            x = list(range(len(rows)))
            cols = [col for col in COLUMNS if all(col in r for r in rows)]
            for k, col in enumerate(cols):
                med = [r[col]["median"] * 1000 for r in rows]
                err = [[m - r[col]["min"] * 1000 for m, r in zip(med, rows, strict=True)],
                       [r[col]["max"] * 1000 - m for m, r in zip(med, rows, strict=True)]]
                ax.bar([p + (k - (len(cols) - 1) / 2) * w for p in x], med, w, yerr=err,
                       capsize=2, label=col)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(_tick))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: _tick(y, minor=True)))
            ax.set_xticks(x, [r["batch"] for r in rows])
            ax.set_xlabel("batch")
            ax.set_ylabel("ms (median, min–max)")
            ax.set_title(f"{v.label}, {links:,} links", fontsize=10)
            ax.grid(axis="y", which="major", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    names = {"id": "id maintain", "tuple": "tuple maintain", "recompute": "recompute maintain",
             "refresh": "REFRESH MATERIALIZED VIEW", "limit": "limit (update + apply)",
             "pg_ivm": "pg_ivm (update with immediate maintenance)"}
    fig.legend(handles, [names[k] for k in labels],
               loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 0.955))
    fig.suptitle("idivm on PostgreSQL: maintain vs REFRESH vs the physical limit", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    c.print(f"wrote {path}")


def _tick(y: float, pos: object = None, minor: bool = False) -> str:
    """A log-axis label as a plain number; minor ticks labelled at 2 and 5 only."""
    if y <= 0:
        return ""
    lead = round(y / 10 ** math.floor(math.log10(y) + 1e-9))
    return "" if minor and lead not in (2, 5) else f"{y:g}"
