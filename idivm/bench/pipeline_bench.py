"""``idivm bench pipeline``: a three-level pipeline over TPC-H refreshed by idivm against
recomputing every dataset (what open-source Spark Declarative Pipelines does), on PostgreSQL and
on Spark, verified every round.

The pipeline (``PIPELINE``): cleaned line items → per-order totals → per-customer totals, and a
report joining orders, their customers and both aggregates. Each round commits one TPC-H batch
(``tpch_bench.Refresher``: RF1 new orders with their line items, RF2 deleted orders, price,
discount, date, flag, supplier and customer-key updates; 0.1% of the orders each) to
PostgreSQL's tables, and the same net changes to the Spark side's Delta tables (captured from
PostgreSQL by an idivm change log). Then, interleaved (which goes first alternates):

- PostgreSQL: idivm's ``maintain`` of the report (its three upstream views with it, one
  transaction) against ``REFRESH MATERIALIZED VIEW`` of the same four queries as native
  materialized views, in dependency order; every idivm view is compared with its materialized
  twin (``EXCEPT ALL`` both ways, in the server);
- Spark: ``maintain`` of the report's id pipeline against the same pipeline created with
  ``strategy="recompute"`` (every dataset recomputed and written as Delta); every dataset of the
  two pipelines is compared by row count and a multiset hash.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from idivm.bench import pyplot, step, write_results
from idivm.bench.tpch import TPCH_DDL
from idivm.bench.tpch_bench import BenchError, Refresher, _connect, apply_batch, drop_schema, load
from idivm.catalog import Catalog
from idivm.refresh_cost import RefreshStrategy

# name → query over the base tables and the datasets before it ({x}: dataset x's name)
PIPELINE = {
    "clean_items": "SELECT l_orderkey, l_linenumber, l_partkey, l_quantity, "
                   "l_extendedprice * (1 - l_discount) AS revenue, l_shipdate "
                   "FROM lineitem WHERE l_returnflag <> 'R'",
    "order_totals": "SELECT l_orderkey, count(*) AS items, sum(revenue) AS revenue "
                    "FROM {clean_items} GROUP BY l_orderkey",
    "customer_totals": "SELECT o.o_custkey, count(*) AS orders, sum(t.revenue) AS revenue "
                       "FROM {order_totals} t JOIN orders o ON o.o_orderkey = t.l_orderkey "
                       "GROUP BY o.o_custkey",
    "report": "SELECT t.l_orderkey, o.o_custkey, c.c_name, t.revenue AS order_revenue, "
              "ct.revenue AS customer_revenue FROM {order_totals} t "
              "JOIN orders o ON o.o_orderkey = t.l_orderkey "
              "JOIN customer c ON c.c_custkey = o.o_custkey "
              "JOIN {customer_totals} ct ON ct.o_custkey = o.o_custkey "
              "WHERE t.revenue > 300000",
}
SOURCES = ("lineitem", "orders", "customer")
CAPTURE = "bench_spark_capture"  # the change-log consumer that feeds the Spark side
SINK = "report"


def queries(suffix: str) -> dict[str, str]:
    """The pipeline with every dataset named ``<name><suffix>``."""
    names = {k: f"{k}{suffix}" for k in PIPELINE}
    return {names[k]: sql.format(**names) for k, sql in PIPELINE.items()}


def run(sf: float = 1.0, rounds: int = 2, backends: Sequence[str] = ("pg", "spark"),
        dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres",
        out: Path = Path("bench_out/pipeline"), seed: int = 2026,
        driver_memory: str = "8g") -> int:
    c = Console()
    schema = f"idivm_pipeline_sf{str(sf).replace('.', '_')}"
    report: dict[str, Any] = {"config": {
        "sf": sf, "rounds": rounds, "backends": list(backends), "seed": seed,
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "pipeline": PIPELINE}, "setup": {}, "rounds": []}
    c.rule(f"[bold]idivm bench pipeline: TPC-H SF {sf:g}, {rounds} rounds, "
           f"{', '.join(backends)}[/bold]")
    progress = Progress(SpinnerColumn(finished_text="[green]✓[/green]"),
                        TextColumn("{task.description}"), TimeElapsedColumn(), console=c)
    drop_schema(dsn, schema)
    conn = _connect(dsn)
    try:
        with progress:
            with step(progress, f"generate TPC-H SF {sf:g} and load it into PostgreSQL"):
                conn.execute(f'CREATE SCHEMA "{schema}"')
                conn.execute(f'SET search_path = "{schema}"')
                report["setup"]["load"] = load(conn, sf)
            pg = _Pg(c, dsn, schema) if "pg" in backends else None
            sp = _Spark(sf, driver_memory) if "spark" in backends else None
            if pg is not None:
                with step(progress, "PostgreSQL: create the idivm pipeline and its "
                          "materialized-view twin"):
                    report["setup"]["pg"] = pg.create()
            if sp is not None:
                with step(progress, "Spark: load the sources as Delta tables, create the id "
                          "and recompute pipelines"):
                    _capture_start(conn, schema)
                    report["setup"]["spark"] = sp.create()
            refresher = Refresher(conn, seed)
            for r in range(rounds):
                with step(progress, f"round {r + 1}: commit a TPC-H batch (RF1, RF2, updates; "
                          "0.1%) to PostgreSQL"):
                    batch = refresher.build()
                    write = apply_batch(conn, batch)
                rec: dict[str, Any] = {"round": r + 1, "batch": batch.counts, "write_s": write}
                if pg is not None:
                    with step(progress, f"round {r + 1}: PostgreSQL — maintain vs REFRESH "
                              "MATERIALIZED VIEW, verify"):
                        rec["pg"] = pg.round(first_id=r % 2 == 0)
                if sp is not None:
                    with step(progress, f"round {r + 1}: Spark — commit the net changes, "
                              "maintain vs recompute, verify"):
                        changes = _capture(conn, schema)
                        rec["spark"] = sp.round(changes, first_id=r % 2 == 0)
                report["rounds"].append(rec)
    finally:
        conn.close()
        drop_schema(dsn, schema)
    report["results"] = _summary(report)
    ok = _print(c, report)
    write_results(c, report, out)
    _plot(c, report, out / "pipeline_bench.png")
    return 0 if ok else 1


class _Pg:
    """The PostgreSQL side: idivm's pipeline and its materialized-view twin in one schema."""

    def __init__(self, c: Console, dsn: str, schema: str) -> None:
        from idivm.postgres import PostgresMaintainer

        self.c = c
        self.m = PostgresMaintainer(dsn, schema)
        self.conn = _connect(dsn, schema)
        self.ids = queries("")
        self.mvs = queries("_mv")

    def create(self) -> dict[str, float]:
        out = {}
        for name, sql in self.ids.items():
            t0 = time.perf_counter()
            self.m.create_view(name, sql)
            out[f"create {name} s"] = time.perf_counter() - t0
        for name, sql in self.mvs.items():
            t0 = time.perf_counter()
            self.conn.execute(f'CREATE MATERIALIZED VIEW "{name}" AS {sql}')
            out[f"create {name} s"] = time.perf_counter() - t0
        return out

    def round(self, first_id: bool) -> dict[str, Any]:
        def idivm_() -> tuple[float, dict[str, Any]]:
            t0 = time.perf_counter()
            st = self.m.maintain(SINK)
            secs = time.perf_counter() - t0
            per = {k: v.changes for k, v in st.upstream.items()} | {SINK: st.changes}
            return secs, per

        def recompute() -> float:
            t0 = time.perf_counter()
            with self.conn.transaction():
                for name in self.mvs:
                    self.conn.execute(f'REFRESH MATERIALIZED VIEW "{name}"')
            return time.perf_counter() - t0

        if first_id:
            id_s, changes = idivm_()
            rec_s = recompute()
        else:
            rec_s = recompute()
            id_s, changes = idivm_()
        bad = {}
        for name in self.ids:
            q = (f'SELECT (SELECT count(*) FROM (SELECT * FROM "{name}" EXCEPT ALL SELECT * '
                 f'FROM "{name}_mv") a), (SELECT count(*) FROM (SELECT * FROM "{name}_mv" '
                 f'EXCEPT ALL SELECT * FROM "{name}") b)')
            row = self.conn.execute(q).fetchone()
            if row is None or row[0] or row[1]:
                bad[name] = row
        return {"id_s": id_s, "recompute_s": rec_s, "changes": changes, "verified": not bad,
                "mismatch": bad}


def _capture_start(conn: Any, schema: str) -> None:
    """Log the sources' changes for the Spark side (an idivm change log of its own consumer)."""
    from idivm.postgres import changelog

    cat = Catalog.from_ddl(TPCH_DDL)
    with conn.transaction():
        for t in SOURCES:
            changelog.install(conn, schema, cat.table(t), CAPTURE)


def _capture(conn: Any, schema: str) -> dict[str, list[dict[str, Any]]]:
    """The sources' net changes since the last capture, as change-feed rows (the post-image
    as ``insert`` or ``update_postimage``, the pre-image as ``delete``)."""
    from idivm.postgres import changelog

    cat = Catalog.from_ddl(TPCH_DDL)
    out: dict[str, list[dict[str, Any]]] = {}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for t in SOURCES:
            table = cat.table(t)
            changelog.fold_into_temp(conn, schema, table, CAPTURE, f"cap_{t}")
            cur = conn.execute(f'SELECT * FROM pg_temp."cap_{t}"')
            names = [d.name for d in cur.description or ()]
            rows = []
            for r in cur.fetchall():
                d = dict(zip(names, r, strict=True))
                key = {k: d[k] for k in table.primary_key}
                if d["__has_post"]:
                    rows.append(key | {k: d[f"{k}__post"] for k in table.non_key_columns}
                                | {"_change_type": "update_postimage" if d["__has_pre"]
                                   else "insert"})
                else:
                    rows.append(key | {k: d[f"{k}__pre"] for k in table.non_key_columns}
                                | {"_change_type": "delete"})
            out[t] = rows
        changelog.advance(conn, schema, CAPTURE)
    for t in SOURCES:
        conn.execute(changelog.prune_statement(schema, t))
    return out


class _Spark:
    """The Spark side: the sources as Delta tables loaded through idivm, the pipeline twice
    (``_id``: maintained; ``_rec``: recomputed), in one warehouse."""

    def __init__(self, sf: float, driver_memory: str) -> None:
        from idivm.spark import SparkMaintainer
        from idivm.spark.session import driver_conf, spark_session

        self.sf = sf
        self.tmp = tempfile.TemporaryDirectory(prefix="idivm_pipeline_")
        self.spark = spark_session(None, conf={"spark.driver.memory": driver_memory,
                                               **driver_conf(False)})
        cat = Catalog.from_ddl(TPCH_DDL)
        self.cat = Catalog.of([cat.table(t) for t in SOURCES])
        self.m = SparkMaintainer(self.cat, Path(self.tmp.name) / "wh", spark=self.spark)

    def create(self) -> dict[str, Any]:
        import duckdb

        from idivm.bench.tpch import load_tpch_extension

        out: dict[str, Any] = {}
        dk = duckdb.connect()
        try:
            load_tpch_extension(dk)
            dk.execute(f"CALL dbgen(sf={float(self.sf)!r})")
            for t in SOURCES:
                path = Path(self.tmp.name) / f"{t}.parquet"
                dk.execute(f"COPY {t} TO '{path}' (FORMAT parquet)")
                t0 = time.perf_counter()
                self.m.load_table(t, self.spark.read.parquet(str(path)))
                out[f"load {t} s"] = time.perf_counter() - t0
        finally:
            dk.close()
        plan: tuple[tuple[str, RefreshStrategy], ...] = (("_id", "id"), ("_rec", "recompute"))
        for suffix, strategy in plan:
            for name, sql in queries(suffix).items():
                t0 = time.perf_counter()
                self.m.create_view(name, sql, strategy=strategy)
                out[f"create {name} s"] = time.perf_counter() - t0
        return out

    def round(self, changes: Mapping[str, list[dict[str, Any]]], first_id: bool
              ) -> dict[str, Any]:
        from idivm.bench.spark_bench import fingerprint

        write = 0.0
        for t, rows in changes.items():
            if not rows:
                continue
            schema = self.spark.table(t).schema.add("_change_type", "string")
            df = self.spark.createDataFrame([tuple(r[f.name] for f in schema.fields)
                                             for r in rows], schema)
            t0 = time.perf_counter()
            self.m.apply_changes(t, df)
            write += time.perf_counter() - t0
        runs: dict[str, Any] = {}
        for suffix in (("_id", "_rec") if first_id else ("_rec", "_id")):
            t0 = time.perf_counter()
            st = self.m.maintain(f"{SINK}{suffix}")
            runs[suffix] = (time.perf_counter() - t0, st)
        id_s, st = runs["_id"]
        rec_s, _ = runs["_rec"]
        bad = {}
        for name in PIPELINE:
            a, b = self.m.read_view(f"{name}_id"), self.m.read_view(f"{name}_rec")
            types = {f.name: f.dataType for f in a.schema.fields}
            fa, fb = fingerprint(a, types), fingerprint(b.select(*a.columns), types)
            if fa != fb:
                bad[name] = [fa, fb]
        per = {k.removesuffix("_id"): v.changes for k, v in st.upstream.items()} \
            | {SINK: st.changes}
        engines = {k.removesuffix("_id"): v.decision.get("engine")
                   for k, v in st.upstream.items()} | {SINK: st.decision.get("engine")}
        return {"write_s": write, "id_s": id_s, "recompute_s": rec_s, "changes": per,
                "engines": engines, "source_changes": {t: len(r) for t, r in changes.items()},
                "verified": not bad, "mismatch": bad}


def _summary(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for backend in report["config"]["backends"]:
        rs = [r[backend] for r in report["rounds"] if backend in r]
        if not rs:
            continue
        ids = [r["id_s"] for r in rs]
        recs = [r["recompute_s"] for r in rs]
        out.append({"backend": backend, "rounds": len(rs),
                    "id_s": statistics.median(ids), "id_range": [min(ids), max(ids)],
                    "recompute_s": statistics.median(recs), "recompute_range": [min(recs),
                                                                                max(recs)],
                    "speedup": statistics.median(recs) / max(statistics.median(ids), 1e-9),
                    "verified": all(r["verified"] for r in rs)})
    return out


def _print(c: Console, report: Mapping[str, Any]) -> bool:
    t = Table(title="pipeline refresh per round: idivm (maintain the report and its three "
              "upstream datasets) vs recompute every dataset", title_style="bold",
              caption="batch: rows the TPC-H batch names (orders and line items inserted, "
              "deleted, updated); changes read: the effective changes the four datasets "
              "consumed, summed")
    for col in ("backend", "round", "batch", "changes read", "idivm s", "recompute s",
                "recompute / idivm", "verified"):
        t.add_column(col)
    for r in report["rounds"]:
        batch = sum(r["batch"].values())
        for backend in ("pg", "spark"):
            if backend not in r:
                continue
            x = r[backend]
            ch = sum(sum(v.values()) for v in x["changes"].values())
            t.add_row(backend, str(r["round"]), f"{batch:,} rows", f"{ch:,}", f"{x['id_s']:.2f}",
                      f"{x['recompute_s']:.2f}",
                      f"{x['recompute_s'] / max(x['id_s'], 1e-9):.1f}×",
                      "yes" if x["verified"] else f"[red]NO {x['mismatch']}[/red]")
    c.print(t)
    for s in report["results"]:
        c.print(f"{s['backend']}: median idivm {s['id_s']:.2f} s "
                f"({s['id_range'][0]:.2f}–{s['id_range'][1]:.2f}), recompute "
                f"{s['recompute_s']:.2f} s ({s['recompute_range'][0]:.2f}–"
                f"{s['recompute_range'][1]:.2f}): {s['speedup']:.1f}×")
    ok = all(s["verified"] for s in report["results"])
    c.print("every dataset equals its recomputation" if ok else
            "[red]a dataset differs from its recomputation[/red]")
    return ok


def _plot(c: Console, report: Mapping[str, Any], path: Path) -> None:
    plt = pyplot(c)
    if plt is None or not report["results"]:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    res = report["results"]
    xs = range(len(res))
    ax.bar([x - 0.2 for x in xs], [s["id_s"] for s in res], 0.4, label="idivm (id)")
    ax.bar([x + 0.2 for x in xs], [s["recompute_s"] for s in res], 0.4,
           label="recompute every dataset")
    ax.set_xticks(list(xs), [s["backend"] for s in res])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per refresh (median)")
    ax.set_title(f"TPC-H SF {report['config']['sf']:g} pipeline, 0.1% batches")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    c.print(f"wrote {path}")


__all__ = ["PIPELINE", "BenchError", "queries", "run"]
