"""``python -m bench_bsma sweep``: the §7.2 parts/devices experiment (Figures 11 and 12).

devices(did, category), parts(pid, price), devices_parts(did, pid); the view V joins them and
keeps phones. The paper's sizes are 5M / 5M / 50M; here devices and parts hold ``links / 10``
rows each (default 1M links: 100k devices and parts), which fits this 2-core machine with room
for the 4 extra tables of the j sweep. Defaults are the paper's: d = 200 price updates,
s = 20% phones, f = 10 parts per device, j = 2 joins. One parameter moves at a time:

- d (diff size) 100–500;
- j (joins) 2–6: tables x1… x4 (did, pid, v_i), one row per link, natural-joined on (did, pid);
  the selection is off (every device counts) so that only the joins vary;
- s (selectivity) 6%–100% (log steps): the share of phones;
- f (fanout) 5–25 parts per device (devices fixed, so links = devices × f).

For every point, ID-based and tuple-based maintenance run on the same data and the same
batches, in alternating order, each repeated (median, min–max), each verified equal to the
recomputation; the phases (i-diff computation, cache update, view update) are the stacks of
Figure 12.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlglot import exp

from bench_bsma.backends import PHASES, pg_equal, phases, spark_equal
from bench_bsma.run import progress_bar
from idivm.catalog import Catalog

DEFAULTS = {"d": 200, "j": 2, "s": 0.2, "f": 10}
VALUES: dict[str, list[Any]] = {"d": [100, 200, 300, 400, 500], "j": [2, 3, 4, 5, 6],
                                "s": [0.06, 0.125, 0.25, 0.5, 1.0], "f": [5, 10, 15, 20, 25]}
STRATEGIES = ("id", "tuple")


def ddl(extra: int) -> str:
    out = ["CREATE TABLE devices (did text PRIMARY KEY, category text)",
           "CREATE TABLE parts (pid text PRIMARY KEY, price int NOT NULL)",
           "CREATE TABLE devices_parts (did text NOT NULL REFERENCES devices (did), "
           "pid text NOT NULL REFERENCES parts (pid), PRIMARY KEY (did, pid))"]
    for i in range(1, extra + 1):
        out.append(f"CREATE TABLE x{i} (did text NOT NULL, pid text NOT NULL, v{i} int NOT NULL,"
                   " PRIMARY KEY (did, pid))")
    return ";\n".join(out) + ";"


def view_sql(j: int, selection: bool) -> str:
    extra = j - 2
    cols = ", ".join(["did", "pid", "price", *[f"v{i}" for i in range(1, extra + 1)]])
    joins = "parts NATURAL JOIN devices_parts NATURAL JOIN devices" + "".join(
        f" NATURAL JOIN x{i}" for i in range(1, extra + 1))
    where = " WHERE category = 'phone'" if selection else ""
    return f"SELECT {cols} FROM {joins}{where}"


def _points(params: Sequence[str]) -> list[tuple[str, Any, dict[str, Any]]]:
    out = []
    for p in params:
        for v in VALUES[p]:
            cfg = dict(DEFAULTS, **{p: v})
            out.append((p, v, cfg))
    return out


class _PgSweep:
    """parts/devices on PostgreSQL, generated server-side (generate_series)."""

    def __init__(self, dsn: str, schema: str = "bsma_sweep") -> None:
        import psycopg

        from idivm.postgres import PostgresMaintainer

        self.dsn, self.schema = dsn, schema
        self.conn = psycopg.connect(dsn, autocommit=True)
        self._cls = PostgresMaintainer
        self.m: Any = None

    def _drop(self) -> None:
        for s in (self.schema, f"{self.schema}__idivm"):
            self.conn.execute(exp.Drop(tables=[exp.Table(db=exp.to_identifier(s, quoted=True))],
                                       kind="SCHEMA", exists=True, cascade=True).sql("postgres"))

    def setup(self, devices: int, f: int, s: float, extra: int) -> None:
        if self.m is not None:
            self.m.close()
        self._drop()
        sch = exp.to_identifier(self.schema, quoted=True).sql("postgres")
        self.conn.execute(f"CREATE SCHEMA {sch}")
        self.conn.execute(f"SET search_path = {sch}")
        for stmt in ddl(extra).split(";"):
            if stmt.strip():
                self.conn.execute(stmt)
        # phones: a fixed pseudo-random share s of the devices; parts of device i: f distinct
        # pseudo-random parts ((i·7919 + k·104729) mod P, distinct for k < P as 104729 is prime)
        self.conn.execute(
            "INSERT INTO devices SELECT 'D' || i, CASE WHEN (i::bigint * 2654435761) %% 100000 "
            "< %s THEN 'phone' ELSE 'tablet' END FROM generate_series(0, %s - 1) i",
            (int(s * 100000), devices))
        self.conn.execute("INSERT INTO parts SELECT 'P' || i, 1 + (i * 37) %% 100 "
                          "FROM generate_series(0, %s - 1) i", (devices,))
        self.conn.execute(
            "INSERT INTO devices_parts SELECT 'D' || i, 'P' || ((i::bigint * 7919 + "
            "k::bigint * 104729) %% %s) FROM generate_series(0, %s - 1) i, "
            "generate_series(0, %s - 1) k", (devices, devices, f))
        for i in range(1, extra + 1):
            self.conn.execute(f"INSERT INTO x{i} SELECT did, pid, {i} FROM devices_parts")
        self.conn.execute("ANALYZE")
        self.m = self._cls(self.dsn, schema=self.schema)
        self.devices = devices

    def create(self, name: str, sql: str, strategy: str) -> Any:
        p = self.m.create_view(name, sql, strategy=strategy)
        self.m.conn.commit()
        return p

    def update_prices(self, d: int, seed: int) -> None:
        import random

        rnd = random.Random(seed)
        pids = [f"P{i}" for i in rnd.sample(range(self.devices), d)]
        with self.conn.transaction():
            self.conn.execute("UPDATE parts SET price = price + 1 WHERE pid = ANY(%s)", (pids,))

    def maintain(self, name: str) -> tuple[float, dict[str, float], int]:
        st = self.m.maintain(name)
        p = self.m.plan_of(name)
        applied = sum(n for k, n in st.applied_rows.items() if k.endswith(p.store.name))
        return st.seconds, phases(p, st.statement_seconds, st.seconds), applied

    def verify(self, name: str) -> bool:
        return pg_equal(self.conn, self.m.plan_of(name), name)

    def close(self) -> None:
        if self.m is not None:
            self.m.close()
        self._drop()
        self.conn.close()


class _SparkSweep:
    """parts/devices on Spark (the generator of ``idivm bench spark``)."""

    def __init__(self, root: Path, master: str | None) -> None:
        from idivm.spark.session import driver_conf, spark_session

        self.spark = spark_session(master, conf={"spark.driver.memory": "6g",
                                                 **driver_conf(False)})
        self.root = root
        self.m: Any = None
        self.n = 0

    def setup(self, devices: int, f: int, s: float, extra: int) -> None:
        import shutil

        from pyspark.sql import functions as F

        from idivm.bench.data import PartsDevices, parts_devices
        from idivm.spark import SparkMaintainer

        if self.root.exists():
            shutil.rmtree(self.root)
        self.m = SparkMaintainer(Catalog.from_ddl(ddl(extra)), self.root, spark=self.spark)
        self.pd = PartsDevices(devices * f, f, s)
        frames = parts_devices(self.spark, self.pd)
        for t in ("devices", "parts", "devices_parts"):
            self.m.load_table(t, frames[t])
        for i in range(1, extra + 1):
            self.m.load_table(f"x{i}", self.spark.table("devices_parts").select(
                "did", "pid", F.lit(i).alias(f"v{i}")))

    def create(self, name: str, sql: str, strategy: str) -> Any:
        return self.m.create_view(name, sql, strategy=strategy)

    def update_prices(self, d: int, seed: int) -> None:
        from idivm.bench.data import price_updates

        df = price_updates(self.spark, self.spark.table("parts"), d, self.pd, salt=seed)
        self.m.apply_changes("parts", df.localCheckpoint(eager=True))

    def maintain(self, name: str) -> tuple[float, dict[str, float], int]:
        st = self.m.maintain(name)
        p = self.m.plan_of(name)
        applied = sum(n for k, n in st.idiff_rows.items() if k.endswith(f"→ {p.store.name}"))
        return st.seconds, phases(p, st.statements, st.seconds), applied

    def verify(self, name: str) -> bool:
        return spark_equal(self.m, name)

    def close(self) -> None:
        import shutil

        self.spark.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def sweep(backend: str, params: Sequence[str], out: Path, links: int | None = None,
          repeat: int = 3, dsn: str | None = None, master: str | None = None,
          pg_schema: str = "bsma_sweep", console: Console | None = None) -> dict[str, Any]:
    c = console or Console()
    links = links or 1_000_000
    devices = links // DEFAULTS["f"]
    if backend == "postgres":
        from idivm.demo import default_dsn

        be: Any = _PgSweep(dsn or default_dsn(), pg_schema)
    else:
        be = _SparkSweep(out / "_warehouse", master)
    c.rule(f"[bold]parts/devices sweeps on {backend}: {devices:,} devices and parts, "
           f"{links:,} links at f=10[/bold]")
    report: dict[str, Any] = {"config": {"backend": backend, "devices": devices,
                                         "links_at_default": links, "repeat": repeat,
                                         "defaults": DEFAULTS, "values": VALUES},
                              "sweeps": {}, "measurements": []}
    t_start = time.perf_counter()
    points = _points(params)
    try:
        with progress_bar(c) as prog:
            task = prog.add_task("sweep", total=len(points) * repeat * len(STRATEGIES))
            built: tuple[Any, ...] | None = None
            for n, (param, value, cfg) in enumerate(points):
                shape = (cfg["f"], cfg["s"], cfg["j"], param == "j")
                if shape != built:
                    prog.update(task, description=f"{param}={value}: generate and load")
                    be.setup(devices, cfg["f"], cfg["s"] if param != "j" else 1.0, cfg["j"] - 2)
                    sql = view_sql(cfg["j"], selection=param != "j")
                    for s in STRATEGIES:
                        be.create(f"v_{s}", sql, s)
                    built = shape
                entry: dict[str, Any] = {"param": param, "value": value, "strategies": {}}
                runs: dict[str, list[tuple[float, dict[str, float], int]]] = {
                    s: [] for s in STRATEGIES}
                for r in range(repeat):
                    be.update_prices(cfg["d"], seed=1000 * n + r)
                    order = STRATEGIES if r % 2 == 0 else tuple(reversed(STRATEGIES))
                    for s in order:
                        prog.update(task, description=f"{param}={value}: round {r + 1}, {s}")
                        res = be.maintain(f"v_{s}")
                        if not be.verify(f"v_{s}"):
                            raise AssertionError(f"v_{s} differs from its recomputation at "
                                                 f"{param}={value}: not reported")
                        runs[s].append(res)
                        report["measurements"].append({
                            "param": param, "value": value, "strategy": s, "round": r + 1,
                            "seconds": res[0], "phases": res[1], "view_diff_rows": res[2]})
                        prog.advance(task)
                for s, rs in runs.items():
                    xs = [x[0] for x in rs]
                    med = statistics.median(xs)
                    entry["strategies"][s] = {
                        "median": med, "min": min(xs), "max": max(xs),
                        "spread": (max(xs) - min(xs)) / med if med else 0.0,
                        "phases": {p: statistics.median(x[1][p] for x in rs) for p in PHASES},
                        "view_diff_rows": statistics.median(x[2] for x in rs)}
                entry["speedup_vs_tuple"] = entry["strategies"]["tuple"]["median"] / \
                    entry["strategies"]["id"]["median"]
                report["sweeps"].setdefault(param, []).append(entry)
    finally:
        be.close()
    report["verified"] = True
    report["total_seconds"] = time.perf_counter() - t_start
    _write(c, report, out)
    return report


def _write(c: Console, report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    backend = report["config"]["backend"]
    (out / f"sweeps_{backend}.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"# parts/devices sweeps on {backend}", "",
             f"{report['config']['devices']:,} devices and parts; defaults d=200, j=2, s=20%, "
             "f=10; ms, median (min–max) over the repeats; every run verified equal to the "
             "recomputation.", "", "| parameter | value | id ms | tuple ms | × (tuple/id) |",
             "|---|---|---|---|---|"]
    t = Table(title=f"parts/devices sweeps on {backend} (ms, median (min–max))",
              title_style="bold")
    for col in ("param", "value", "id", "tuple", "×"):
        t.add_column(col, justify="right")
    for param, entries in report["sweeps"].items():
        for e in entries:
            cells = [f"{e['strategies'][s]['median'] * 1e3:.1f} "
                     f"({e['strategies'][s]['min'] * 1e3:.0f}–"
                     f"{e['strategies'][s]['max'] * 1e3:.0f})" for s in STRATEGIES]
            sp = f"{e['speedup_vs_tuple']:.1f}×"
            lines.append(f"| {param} | {e['value']} | {cells[0]} | {cells[1]} | {sp} |")
            t.add_row(param, str(e["value"]), *cells, sp)
    (out / f"sweeps_{backend}.md").write_text("\n".join(lines) + "\n")
    c.print(t)
    from bench_bsma.plots import plot_sweep

    for path in plot_sweep(report, out):
        c.print(f"wrote {path}")
    c.print(f"wrote {out / f'sweeps_{backend}.json'} ({report['total_seconds']:.0f} s in all)")
