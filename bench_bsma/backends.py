"""The two backends the runner drives: the same calls on PostgreSQL and on Spark.

A backend loads a generated data set, creates a view under a strategy, applies a change batch to
the base tables (DML on PostgreSQL, a Delta-CDF feed on Spark), maintains a view (returning the
time per phase) and verifies a view against its recomputation.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from sqlglot import exp

from bench_bsma.generate import Dataset, value
from bench_bsma.schema import DDL, TABLES, catalog
from bench_bsma.workloads import KEYS, Change
from idivm.plan import Plan
from idivm.planner.model import Strategy
from idivm.script import Compute

PHASES = ("i-diff computation", "cache update", "view update", "recomputation",
          "folding and bookkeeping")


def phases(p: Plan, statement_seconds: Sequence[tuple[str, float]], total: float
           ) -> dict[str, float]:
    """Statement times summed per phase of Figure 12 (i-diffs, caches, view); the rest of
    ``total`` (folding the change log, watermarks, commits) is bookkeeping."""
    store = p.store.name
    kinds: dict[str, str] = {}
    for s in p.statements:
        if isinstance(s, Compute):
            kinds[s.name] = "recomputation" if s.phase == "recompute" else "i-diff computation"
        else:
            kinds[f"{s.kind} {s.diff}→{s.target}"] = \
                "view update" if s.target == store else "cache update"
            kinds[f"{s.kind} → {s.target}"] = kinds[f"{s.kind} {s.diff}→{s.target}"]
            kinds[f"stage {s.target}"] = "view update" if s.target == store else "cache update"
    out = dict.fromkeys(PHASES, 0.0)
    for name, secs in statement_seconds:
        if name.startswith("fold "):  # folding the change log: bookkeeping, counted below
            continue
        out[kinds.get(name, "i-diff computation")] += secs
    out["folding and bookkeeping"] = max(0.0, total - sum(out.values()))
    return out


def applied_to_view(p: Plan, applied: dict[str, int]) -> int:
    """Diff rows applied to the stored view (t-diff or i-diff rows: the paper's |Δ|)."""
    return sum(n for k, n in applied.items() if k.endswith(f"→{p.store.name}")
               or k.endswith(f"→ {p.store.name}"))


def base_reads(p: Plan, ran: set[str]) -> int:
    """Base-table references in the Δ-script statements that produced rows."""
    tables = set(p.tables)
    return sum(1 for s in p.statements if isinstance(s, Compute) and s.name in ran
               for tb in s.query.find_all(exp.Table) if tb.name in tables)


def pg_equal(conn: Any, p: Plan, view: str) -> bool:
    """The view equals its recomputation as a multiset (EXCEPT ALL both ways is empty)."""
    cols = [exp.column(c, quoted=True) for c in p.columns]
    stored = exp.select(*cols).from_(exp.table_(exp.to_identifier(view, quoted=True)))
    fresh = p.recompute_query()
    diff = exp.union(exp.except_(stored, fresh.copy(), distinct=False),
                     exp.except_(fresh, stored.copy(), distinct=False), distinct=False)
    q = exp.select(exp.func("COUNT", exp.Star())).from_(diff.subquery("x"))
    row = conn.execute(q.sql("postgres")).fetchone()
    return row is not None and int(row[0]) == 0


def spark_equal(m: Any, view: str) -> bool:
    """Same rows and the same sum of row hashes as the recomputation."""
    from idivm.bench.spark_bench import fingerprint

    fresh = m.recompute(view)
    types = {f.name: f.dataType for f in fresh.schema.fields}
    return bool(fingerprint(m.read_view(view), types) == fingerprint(fresh, types))


class Backend(Protocol):
    name: str

    def load(self, ds: Dataset) -> dict[str, float]: ...
    def create(self, view: str, sql: str, strategy: str) -> Plan: ...
    def apply(self, batch: Sequence[Change]) -> None: ...
    def maintain(self, view: str) -> dict[str, Any]: ...
    def verify(self, view: str) -> bool: ...
    def rows(self, view: str) -> int: ...
    def make_cold(self) -> bool: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------------------- PostgreSQL


class PostgresBackend:
    name = "postgres"

    def __init__(self, dsn: str, schema: str = "bsma_bench") -> None:
        import psycopg

        from idivm.postgres import PostgresMaintainer

        self.dsn, self.schema = dsn, schema
        self._psycopg = psycopg
        self.conn = psycopg.connect(dsn, autocommit=True)
        self._drop_schemas()
        self.conn.execute(f"CREATE SCHEMA {_q(schema)}")
        self.conn.execute(f"SET search_path = {_q(schema)}")
        self.m = PostgresMaintainer(dsn, schema=schema)
        self._maintainer_cls = PostgresMaintainer
        self._plans: dict[str, Plan] = {}

    def load(self, ds: Dataset) -> dict[str, float]:
        out: dict[str, float] = {}
        for stmt in DDL.split(";"):
            if stmt.strip():
                self.conn.execute(stmt)
        cat = catalog()
        for t in TABLES:
            t0 = time.perf_counter()
            cols = cat.table(t).column_names
            copy = f"COPY {_q(t)} ({', '.join(_q(c) for c in cols)}) FROM STDIN"
            with self.conn.cursor() as cur, cur.copy(copy) as cp:
                for row in ds.records(t):
                    cp.write_row([value(t, c, v) for c, v in zip(cols, row, strict=True)])
            out[f"load {t} s"] = time.perf_counter() - t0
        self.conn.execute("ANALYZE")
        return out

    def create(self, view: str, sql: str, strategy: str) -> Plan:
        p = self.m.create_view(view, sql, strategy=cast(Strategy, strategy))
        self.m.conn.commit()
        self._plans[view] = p
        self.conn.execute("ANALYZE")
        return p

    def apply(self, batch: Sequence[Change]) -> None:
        """The batch as DML in one transaction, runs of one table and kind batched."""
        cat = catalog()
        with self.conn.transaction(), self.conn.cursor() as cur:
            i = 0
            while i < len(batch):
                j = i
                while j < len(batch) and (batch[j].table, batch[j].kind) == \
                        (batch[i].table, batch[i].kind):
                    j += 1
                t, kind = batch[i].table, batch[i].kind
                cols, key = cat.table(t).column_names, KEYS[t]
                if kind == "insert":
                    stmt = (f"INSERT INTO {_q(t)} ({', '.join(_q(c) for c in cols)}) VALUES "
                            f"({', '.join(['%s'] * len(cols))})")
                    params = [c.new for c in batch[i:j]]
                elif kind == "delete":
                    stmt = f"DELETE FROM {_q(t)} WHERE " + " AND ".join(
                        f"{_q(k)} = %s" for k in key)
                    params = [tuple(c.old[cols.index(k)] for k in key)  # type: ignore[index]
                              for c in batch[i:j]]
                else:
                    rest = [c for c in cols if c not in key]
                    stmt = (f"UPDATE {_q(t)} SET " + ", ".join(f"{_q(c)} = %s" for c in rest)
                            + " WHERE " + " AND ".join(f"{_q(k)} = %s" for k in key))
                    params = [tuple(c.new[cols.index(x)] for x in (*rest, *key))  # type: ignore
                              for c in batch[i:j]]
                cur.executemany(stmt, params)  # type: ignore[arg-type]
                i = j

    def maintain(self, view: str) -> dict[str, Any]:
        st = self.m.maintain(view)
        p = self.m.plan_of(view)
        ran = {k for k, n in st.idiff_rows.items() if n}
        return {"seconds": st.seconds, "phases": phases(p, st.statement_seconds, st.seconds),
                "changes": st.changes, "idiff_rows": sum(st.idiff_rows.values()),
                "view_diff_rows": applied_to_view(p, st.applied_rows),
                "base_reads": base_reads(p, ran)}

    def verify(self, view: str) -> bool:
        return pg_equal(self.conn, self.m.plan_of(view), view)

    def rows(self, view: str) -> int:
        row = self.conn.execute(f"SELECT count(*) FROM {_q(view)}").fetchone()
        return int(row[0]) if row else 0

    def make_cold(self) -> bool:
        """Restart the server (empties shared buffers) and drop the OS page cache; False when
        this machine does not allow it (then there are no cold figures)."""
        ctl = shutil.which("pg_ctlcluster")
        versions = sorted(Path("/etc/postgresql").glob("*/main")) if ctl else []
        if not ctl or not versions:
            return False
        self.conn.close()
        self.m.close()
        v = versions[-1].parent.name
        r = subprocess.run([ctl, v, "main", "restart"], capture_output=True, text=True)
        if r.returncode != 0:
            return False
        try:
            subprocess.run(["sync"], check=False)
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        except OSError:
            pass
        for _ in range(50):  # the server takes a moment to accept connections again
            try:
                self.conn = self._psycopg.connect(self.dsn, autocommit=True)
                break
            except self._psycopg.OperationalError:
                time.sleep(0.2)
        self.conn.execute(f"SET search_path = {_q(self.schema)}")
        self.m = self._maintainer_cls(self.dsn, schema=self.schema)
        return True

    def close(self) -> None:
        self.m.close()
        self._drop_schemas()
        self.conn.close()

    def _drop_schemas(self) -> None:
        for s in (self.schema, f"{self.schema}__idivm"):
            drop = exp.Drop(tables=[exp.Table(db=exp.to_identifier(s, quoted=True))],
                            kind="SCHEMA", exists=True, cascade=True)
            self.conn.execute(drop.sql("postgres"))


def _q(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql("postgres")


# ---------------------------------------------------------------------------- Spark


class SparkBackend:
    name = "spark"

    def __init__(self, warehouse: Path, master: str | None = None,
                 driver_memory: str = "6g", spark: Any = None) -> None:
        from idivm.spark import SparkMaintainer
        from idivm.spark.session import driver_conf, spark_session

        if warehouse.exists():
            shutil.rmtree(warehouse)
        self.owned = spark is None  # a session handed in is the caller's to stop
        self.spark = spark if spark is not None else spark_session(
            master, conf={"spark.driver.memory": driver_memory, **driver_conf(False)})
        self.m = SparkMaintainer(catalog(), warehouse, spark=self.spark)
        self.root = warehouse

    def _schema(self, table: str) -> str:
        t = catalog().table(table)
        return ", ".join(
            f"{exp.to_identifier(c.name, quoted=True).sql('spark')} "
            f"{exp.DataType.build(c.type, dialect='postgres').sql('spark')}" for c in t.columns)

    def load(self, ds: Dataset) -> dict[str, float]:
        out: dict[str, float] = {}
        cat = catalog()
        for t in TABLES:
            t0 = time.perf_counter()
            cols = cat.table(t).column_names
            rows = [tuple(value(t, c, v) for c, v in zip(cols, r, strict=True))
                    for r in ds.records(t)]
            self.m.load_table(t, self.spark.createDataFrame(rows, self._schema(t)))
            out[f"load {t} s"] = time.perf_counter() - t0
        return out

    def create(self, view: str, sql: str, strategy: str) -> Plan:
        p: Plan = self.m.create_view(view, sql, strategy=cast(Strategy, strategy))
        return p

    def apply(self, batch: Sequence[Change]) -> None:
        """One commit per table: the batch's net effect per key as CDF rows."""
        cat = catalog()
        by_table: dict[str, dict[tuple[Any, ...], list[Any]]] = {}
        for ch in batch:  # first pre-image and last post-image per key
            cols = cat.table(ch.table).column_names
            row = ch.old if ch.old is not None else ch.new
            assert row is not None
            k = tuple(row[cols.index(x)] for x in KEYS[ch.table])
            entry = by_table.setdefault(ch.table, {}).setdefault(k, [ch.old, ch.new, True])
            if entry[2]:
                entry[0], entry[2] = ch.old, False
            entry[1] = ch.new
        for t, entries in by_table.items():
            rows: list[tuple[Any, ...]] = []
            for old, new, _ in entries.values():
                if old is None and new is not None:
                    rows.append((*new, "insert"))
                elif new is None and old is not None:
                    rows.append((*old, "delete"))
                elif old is not None and new is not None and old != new:
                    rows += [(*old, "update_preimage"), (*new, "update_postimage")]
            if rows:
                df = self.spark.createDataFrame(rows, self._schema(t) + ", _change_type string")
                self.m.apply_changes(t, df)

    def maintain(self, view: str) -> dict[str, Any]:
        st = self.m.maintain(view)
        p = self.m.plan_of(view)
        applied = {k: n for k, n in st.idiff_rows.items() if " → " in k}
        ran = {k for k, n in st.idiff_rows.items() if n and " → " not in k}
        ran |= {s.name for s in p.statements if isinstance(s, Compute)
                and s.phase == "recompute"}
        return {"seconds": st.seconds, "phases": phases(p, st.statements, st.seconds),
                "changes": st.changes,
                "idiff_rows": sum(n for k, n in st.idiff_rows.items() if " → " not in k),
                "view_diff_rows": applied_to_view(p, applied), "base_reads": base_reads(p, ran)}

    def verify(self, view: str) -> bool:
        return spark_equal(self.m, view)

    def rows(self, view: str) -> int:
        return int(self.m.read_view(view).count())

    def make_cold(self) -> bool:
        return False  # one JVM for the whole run: no cold start per maintenance

    def close(self) -> None:
        if self.owned:
            self.spark.stop()
        shutil.rmtree(self.root, ignore_errors=True)

