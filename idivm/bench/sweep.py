"""``idivm bench sweep``: how planning grows with the number of joined tables.

Chain joins (t1 ⋈ t2 ⋈ … ⋈ tn, each table's foreign key the next one's key) and star joins
(a fact table and n-1 dimensions), each as a select-project-join view and as an aggregate over
it, for n = 2 … N tables; every table may be inserted into, deleted from and updated (all
modification kinds). Per point: median plan time and the Δ-script's size (statements, lines of
the PostgreSQL script as ``explain``/``script_text`` prints it). The growth exponent is the slope
of log(size) over log(n) between the last points.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from idivm.bench import pyplot
from idivm.catalog import Catalog
from idivm.plan import plan

SHAPES = ("chain", "star", "chain+γ", "star+γ")


def chain(n: int) -> tuple[str, str]:
    """t1 … tn, t_i.fk = t_{i+1}.k; the view reads every table's value and filters one."""
    ddl = "".join(f"create table t{i}(k int primary key, fk int not null, v int not null, "
                  f"w int not null);" for i in range(1, n + 1))
    cols = ", ".join(f"t{i}.v AS v{i}" for i in range(1, n + 1))
    joins = " ".join(f"JOIN t{i} ON t{i - 1}.fk = t{i}.k" for i in range(2, n + 1))
    return ddl, f"SELECT t1.k, {cols} FROM t1 {joins} WHERE t{n}.w > 0"


def star(n: int) -> tuple[str, str]:
    """A fact table f with n-1 foreign keys to dimensions d1 … d_{n-1}."""
    dims = range(1, n)
    ddl = (f"create table f(k int primary key, {', '.join(f'd{i} int not null' for i in dims)}, "
           "m int not null);" + "".join(f"create table d{i}(k int primary key, a int not null, "
                                        "b int not null);" for i in dims))
    cols = ", ".join(f"d{i}.a AS a{i}" for i in dims)
    joins = " ".join(f"JOIN d{i} ON f.d{i} = d{i}.k" for i in dims)
    return ddl, f"SELECT f.k, f.m, {cols} FROM f {joins} WHERE d1.b > 0"


def aggregate(shape: str, n: int) -> tuple[str, str]:
    if shape == "chain+γ":
        ddl, _ = chain(n)
        joins = " ".join(f"JOIN t{i} ON t{i - 1}.fk = t{i}.k" for i in range(2, n + 1))
        return ddl, (f"SELECT t{n}.w AS g, count(*) AS c, sum(t1.v) AS s FROM t1 {joins} "
                     f"WHERE t{n}.v > 0 GROUP BY t{n}.w")
    ddl, _ = star(n)
    joins = " ".join(f"JOIN d{i} ON f.d{i} = d{i}.k" for i in range(1, n))
    return ddl, (f"SELECT d1.a AS g, count(*) AS c, sum(f.m) AS s FROM f {joins} "
                 "WHERE d1.b > 0 GROUP BY d1.a")


def view(shape: str, n: int) -> tuple[str, str]:
    if shape == "chain":
        return chain(n)
    if shape == "star":
        return star(n)
    return aggregate(shape, n)


def measure(shape: str, n: int, repeat: int) -> dict[str, Any]:
    ddl, sql = view(shape, n)
    catalog = Catalog.from_ddl(ddl)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = plan(sql, catalog, name="v")
        times.append(time.perf_counter() - t0)
    text = p.script_text()
    return {"shape": shape, "tables": n, "plan_s": statistics.median(times),
            "plan_s_min": min(times), "plan_s_max": max(times),
            "statements": len(p.statements), "lines": len(text.splitlines()),
            "bytes": len(text.encode()), "idiff_schemas": len(p.idiff_schemas)}


def exponent(points: list[dict[str, Any]], key: str) -> float | None:
    """Slope of log(key) over log(tables) between the last two thirds' ends."""
    pts = [p for p in points if p[key] > 0]
    if len(pts) < 3:
        return None
    a, b = pts[len(pts) // 3], pts[-1]
    return math.log(b[key] / a[key]) / math.log(b["tables"] / a["tables"])


def run(max_tables: int = 12, repeat: int = 3, out: Path = Path("bench_out/sweep"),
        console: Console | None = None) -> dict[str, Any]:
    c = console or Console()
    points: list[dict[str, Any]] = []
    sizes = range(2, max_tables + 1)
    with Progress(console=c, transient=True) as progress:
        task = progress.add_task("planning", total=len(SHAPES) * len(sizes))
        for shape in SHAPES:
            for n in sizes:
                progress.update(task, description=f"{shape} n={n}")
                points.append(measure(shape, n, repeat))
                progress.advance(task)
    table = Table(title=f"planner sweep (median of {repeat} plans)", title_style="bold")
    for col in ("shape", "tables", "plan s", "statements", "lines", "KB"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for p in points:
        table.add_row(p["shape"], str(p["tables"]), f"{p['plan_s']:.3f}", str(p["statements"]),
                      f"{p['lines']:,}", f"{p['bytes'] / 1024:.0f}")
    c.print(table)
    growth = {}
    for shape in SHAPES:
        pts = [p for p in points if p["shape"] == shape]
        growth[shape] = {k: exponent(pts, k) for k in ("lines", "plan_s")}
        g = growth[shape]
        c.print(f"{shape}: lines ~ n^{_fmt(g['lines'])}, plan time ~ n^{_fmt(g['plan_s'])}")
    report = {"repeat": repeat, "max_tables": max_tables, "points": points, "growth": growth}
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(report, indent=2) + "\n")
    plt = pyplot(c)
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for shape in SHAPES:
            pts = [p for p in points if p["shape"] == shape]
            xs = [p["tables"] for p in pts]
            axes[0].plot(xs, [p["lines"] for p in pts], marker="o", label=shape)
            axes[1].plot(xs, [p["plan_s"] for p in pts], marker="o", label=shape)
        for ax, what in zip(axes, ("Δ-script lines", "plan time (s)"), strict=True):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("joined tables")
            ax.set_ylabel(what)
            ax.legend()
        fig.suptitle("idivm planner: growth with the number of joined tables")
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=120)
        plt.close(fig)
    c.print(f"JSON and PNG written to {out}")
    return report


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"
