"""``python -m bench_bsma run``: the BSMA views under every strategy, side by side (Figure 10).

One data set, one set of base tables; each view is created once per strategy (``q7_id``,
``q7_tuple``, ``q7_recompute``) over the same tables, so every strategy maintains the same
change batches. Per workload and repeat: one batch is applied to the base tables, then every
view is maintained under every strategy — strategies in rotating order, so none always runs
first on a warm cache — and every maintained view is verified equal to its recomputation before
its time is recorded. Medians over the repeats are quoted with their min–max spread; a workload
with a case spreading more than 30% is run again and the rerun is quoted (both are kept in the
JSON). On PostgreSQL a cold pass follows: for each view and strategy, the server is restarted
and the OS page cache dropped before maintaining a fresh User batch.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench_bsma.backends import PHASES, Backend, PostgresBackend, SparkBackend
from bench_bsma.generate import generate
from bench_bsma.views import VIEWS_BY_NAME
from bench_bsma.workloads import WORKLOADS, State
from idivm.bench import gc_paused

STRATEGIES = ("id", "tuple", "recompute")
SPREAD_LIMIT = 0.30


def _seed(*parts: object) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "big")


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def run(backend: str, sf: float, out: Path, seed: int = 42, views: Sequence[str] = (),
        workloads: Sequence[str] = WORKLOADS, strategies: Sequence[str] = STRATEGIES,
        repeat: int = 3, d: int = 100, d_sweep: Sequence[int] = (), cold: bool = True,
        warmup: int = 0,
        dsn: str | None = None, master: str | None = None, pg_schema: str = "bsma_bench",
        spark: Any = None, console: Console | None = None) -> dict[str, Any]:
    c = console or Console()
    names = list(views) or list(VIEWS_BY_NAME)
    t_start = time.perf_counter()
    c.rule(f"[bold]BSMA on {backend}: SF {sf}, views {', '.join(names)}, strategies "
           f"{', '.join(strategies)}[/bold]")
    ds = generate(sf, seed)
    sizes = {t: ds.rows(t) for t in ds.tables}
    c.print("data: " + ", ".join(f"{t} {n:,}" for t, n in sizes.items()))
    state = State(ds)
    be: Backend
    if backend == "postgres":
        from idivm.demo import default_dsn

        be = PostgresBackend(dsn or default_dsn(), pg_schema)
    elif backend == "spark":
        be = SparkBackend(out / "_warehouse", master, spark=spark)
    else:
        raise ValueError(f"unknown backend {backend!r}: use postgres or spark")
    report: dict[str, Any] = {
        "config": {"backend": backend, "sf": sf, "seed": seed, "views": names,
                   "workloads": list(workloads), "strategies": list(strategies),
                   "repeat": repeat, "warmup": warmup, "d": d, "d_sweep": list(d_sweep),
                   "cpus": os.cpu_count(),
                   "python": platform.python_version()},
        "sizes": sizes, "setup": {}, "view_rows": {}, "measurements": []}
    plans = {}
    try:
        with progress_bar(c) as prog:
            task = prog.add_task("load base tables", total=1)
            report["setup"].update(be.load(ds))
            prog.advance(task)
            task = prog.add_task("create views", total=len(names) * len(strategies))
            for v in names:
                for s in strategies:
                    t0 = time.perf_counter()
                    plans[(v, s)] = be.create(f"{v}_{s}", VIEWS_BY_NAME[v].sql, s)
                    report["setup"][f"create {v}_{s} s"] = time.perf_counter() - t0
                    prog.advance(task)
                report["view_rows"][v] = be.rows(f"{v}_id")
            # warm-up batches (User workload, d changes), every view maintained and verified,
            # not measured: a refresh job's session plans each view's statements at its first
            # refreshes and reuses the plans at the later ones, under either strategy
            if warmup:
                task = prog.add_task("warm-up", total=warmup * len(names) * len(strategies))
                _rounds(be, state, prog, task, "users", d, warmup, names, strategies, seed,
                        "warm-up", -1)
            jobs = [(w, d) for w in workloads] + [("users", x) for x in d_sweep if x != d]
            task = prog.add_task("maintain and verify",
                                 total=len(jobs) * repeat * len(names) * len(strategies))
            for w, size in jobs:
                rows = _rounds(be, state, prog, task, w, size, repeat, names, strategies, seed,
                               "warm", 0)
                if _spread_exceeded(rows):
                    prog.update(task, total=(prog.tasks[task].total or 0)
                                + repeat * len(names) * len(strategies))
                    for r in rows:
                        r["superseded"] = True
                    rows += _rounds(be, state, prog, task, w, size, repeat, names, strategies,
                                    seed, "warm", 1)
                report["measurements"] += rows
            if cold and backend == "postgres":
                task = prog.add_task("cold: restart PostgreSQL, drop OS caches, maintain",
                                     total=len(names) * len(strategies))
                batch = state.batch("users", d, _seed(seed, "cold"))
                be.apply(batch)
                for v in names:
                    for s in strategies:
                        if not be.make_cold():
                            report["config"]["cold"] = "not possible on this machine"
                            break
                        with gc_paused():  # (collected before the timed maintain, not in it)
                            res = be.maintain(f"{v}_{s}")
                        ok = be.verify(f"{v}_{s}")
                        report["measurements"].append(_row(v, s, "users", d, 0, "cold", res,
                                                           ok, 0))
                        prog.advance(task)
    finally:
        be.close()
    report["summary"] = summarize(report["measurements"])
    report["cost"] = cost_report(report["measurements"])
    report["total_seconds"] = time.perf_counter() - t_start
    write(c, report, out)
    return report


def _rounds(be: Backend, state: State, prog: Progress, task: Any, w: str, size: int,
            repeat: int, names: Sequence[str], strategies: Sequence[str], seed: int,
            cache: str, attempt: int) -> list[dict[str, Any]]:
    rows = []
    for r in range(repeat):
        batch = state.batch(w, size, _seed(seed, w, size, r, attempt))
        be.apply(batch)
        order = list(strategies[r % len(strategies):]) + list(strategies[:r % len(strategies)])
        for v in names:
            for s in order:
                prog.update(task, description=f"{w} (d={size}) round {r + 1}: {v} {s}")
                with gc_paused():  # (collected before the timed maintain, not in it)
                    res = be.maintain(f"{v}_{s}")
                ok = be.verify(f"{v}_{s}")
                if not ok:
                    raise AssertionError(f"{v}_{s} differs from its recomputation after "
                                         f"workload {w} round {r + 1}: not reported")
                rows.append(_row(v, s, w, size, r, cache, res, ok, attempt))
                prog.advance(task)
    return rows


def _row(v: str, s: str, w: str, d: int, r: int, cache: str, res: dict[str, Any], ok: bool,
         attempt: int) -> dict[str, Any]:
    return {"view": v, "strategy": s, "workload": w, "d": d, "round": r + 1, "cache": cache,
            "attempt": attempt, "verified": ok, **res}


def _spread(xs: Sequence[float]) -> float:
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / med if med > 0 else 0.0


def _spread_exceeded(rows: Sequence[dict[str, Any]]) -> bool:
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["view"], r["strategy"]), []).append(r["seconds"])
    return any(len(xs) > 1 and _spread(xs) > SPREAD_LIMIT for xs in groups.values())


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (view, workload, d, cache, strategy): median, min, max, spread, phases (medians);
    plus the speedups of ID-based over the others, ratios of medians."""
    groups: dict[tuple[str, str, int, str], dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        if r.get("superseded"):
            continue
        groups.setdefault((r["view"], r["workload"], r["d"], r["cache"]), {}) \
            .setdefault(r["strategy"], []).append(r)
    out = []
    for (v, w, d, cache), by in groups.items():
        entry: dict[str, Any] = {"view": v, "workload": w, "d": d, "cache": cache,
                                 "strategies": {}}
        for s, rs in by.items():
            xs = [x["seconds"] for x in rs]
            entry["strategies"][s] = {
                "median": statistics.median(xs), "min": min(xs), "max": max(xs),
                "spread": _spread(xs), "n": len(xs), "rerun": any(x["attempt"] for x in rs),
                "phases": {p: statistics.median(x["phases"][p] for x in rs) for p in PHASES},
                "view_diff_rows": statistics.median(x["view_diff_rows"] for x in rs),
                "idiff_rows": statistics.median(x["idiff_rows"] for x in rs),
                "base_reads": statistics.median(x["base_reads"] for x in rs),
                "verified": all(x["verified"] for x in rs)}
        st = entry["strategies"]
        if "id" in st:
            for other in ("tuple", "recompute"):
                if other in st and st["id"]["median"] > 0:
                    entry[f"speedup_vs_{other}"] = st[other]["median"] / st["id"]["median"]
        out.append(entry)
    return out


def cost_report(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """§6's parameters where measurable, next to the measured speedup: the compression factor
    p = |t-diff| / |i-diff| of the diffs reaching the view, and the base-table reads of the
    statements that ran."""
    out = []
    for e in summarize(rows):
        st = e["strategies"]
        if e["cache"] != "warm" or "id" not in st or "tuple" not in st:
            continue
        i_rows, t_rows = st["id"]["view_diff_rows"], st["tuple"]["view_diff_rows"]
        out.append({"view": e["view"], "workload": e["workload"], "d": e["d"],
                    "idiff_rows_at_view": i_rows, "tdiff_rows_at_view": t_rows,
                    "p": t_rows / i_rows if i_rows else None,
                    "base_reads_id": st["id"]["base_reads"],
                    "base_reads_tuple": st["tuple"]["base_reads"],
                    "speedup_vs_tuple": e.get("speedup_vs_tuple")})
    return out


# ---------------------------------------------------------------------------- output


def _fmt(s: dict[str, Any]) -> str:
    mark = "*" if s["rerun"] else ""
    return f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.0f}–{s['max'] * 1e3:.0f}){mark}"


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [f"# BSMA on {cfg['backend']}: SF {cfg['sf']}, seed {cfg['seed']}", "",
             "Data: " + ", ".join(f"{t} {n:,}" for t, n in report["sizes"].items()) + ".", "",
             "Maintenance time in ms, median over the repeats (min–max); `*` = the workload "
             "was rerun because a case spread more than 30%, and the rerun is quoted. "
             "Speedup = strategy's median / ID-based median. Every maintained view was "
             "verified equal to its recomputation.", "",
             "| view | workload | d | cache | id ms | tuple ms | recompute ms | × vs tuple "
             "| × vs recompute |", "|---|---|---|---|---|---|---|---|---|"]
    for e in report["summary"]:
        st = e["strategies"]
        cells = [_fmt(st[s]) if s in st else "–" for s in STRATEGIES]
        vt = f"{e['speedup_vs_tuple']:.1f}×" if "speedup_vs_tuple" in e else "–"
        vr = f"{e['speedup_vs_recompute']:.1f}×" if "speedup_vs_recompute" in e else "–"
        lines.append(f"| {e['view']} | {e['workload']} | {e['d']} | {e['cache']} | "
                     + " | ".join(cells) + f" | {vt} | {vr} |")
    lines += ["", "## Cost report (§6)", "",
              "p = |t-diff| / |i-diff|: diff rows applied to the view under tuple-based vs "
              "ID-based maintenance; base reads: base-table references in the Δ-script "
              "statements that produced rows.", "",
              "| view | workload | d | i-diff rows | t-diff rows | p | base reads id | "
              "base reads tuple | measured × vs tuple |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["cost"]:
        p = f"{r['p']:.1f}" if r["p"] is not None else "–"
        sp = f"{r['speedup_vs_tuple']:.1f}×" if r["speedup_vs_tuple"] else "–"
        lines.append(f"| {r['view']} | {r['workload']} | {r['d']} | "
                     f"{r['idiff_rows_at_view']:.0f} | {r['tdiff_rows_at_view']:.0f} | {p} | "
                     f"{r['base_reads_id']:.0f} | {r['base_reads_tuple']:.0f} | {sp} |")
    return "\n".join(lines) + "\n"


def write(c: Console, report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "results.md").write_text(markdown(report))
    t = Table(title=f"BSMA on {report['config']['backend']}: maintenance ms, median "
              "(min–max)", title_style="bold")
    for col in ("view", "workload", "d", "cache", *STRATEGIES, "× vs tuple", "× vs recompute"):
        t.add_column(col, justify="left" if col in ("view", "workload", "cache") else "right")
    for e in report["summary"]:
        st = e["strategies"]
        t.add_row(e["view"], e["workload"], str(e["d"]), e["cache"],
                  *[_fmt(st[s]) if s in st else "–" for s in STRATEGIES],
                  f"{e['speedup_vs_tuple']:.1f}×" if "speedup_vs_tuple" in e else "–",
                  f"{e['speedup_vs_recompute']:.1f}×" if "speedup_vs_recompute" in e else "–")
    c.print(t)
    from bench_bsma.plots import plot_bsma

    for path in plot_bsma(report, out):
        c.print(f"wrote {path}")
    c.print(f"wrote {out / 'results.json'}, {out / 'results.md'} "
            f"({report['total_seconds']:.0f} s in all)")
