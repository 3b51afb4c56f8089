"""``idivm bench spark``: the paper's parts/devices experiment (§7.2, Figure 11 defaults) on Spark
over Delta tables, with the three refresh strategies side by side.

devices_parts has ``links`` rows (default 5M), devices and parts ``links / fanout`` each, 20% of
devices are phones. V and V' (``idivm.examples``) are each created three times in one
maintainer, without a changes restriction: ``v_id``/``v_prime_id`` (strategy ``id``: always the
Δ-script), ``v_rec``/``v_prime_rec`` (``recompute``: always a recomputation, which writes the
view and its caches anew as Delta tables) and ``v_auto``/``v_prime_auto`` (``auto``: each
refresh picks one of the two from a cost estimate, ``idivm.refresh_cost``).

Batches, selected by ``batches`` and each run ``repeat`` rounds (a fresh batch every round):
(a) ``updates`` price updates, (b) a mixed batch worth ``small_share`` (0.1%) of devices_parts'
rows, (c) one worth ``mixed_share`` (1%) — new and deleted links, price updates, category flips.
Each batch is committed once to the base tables (``apply_changes``: the writer's cost, reported
on its own), then all six copies are maintained, the strategy that goes first rotating from
round to round; each refresh is timed (``stats.seconds``) and auto's choice and reason kept.
The id copy is maintained a second time right after its refresh — nothing pending — for the
floor of a refresh. Every copy is then checked against the recomputation of its view (row count
and a sum of row hashes); a mismatch makes the run fail.

After each round every view's *limit copy* is refreshed (``idivm.bench.spark_limit``): the
change feeds read and just the final view changes committed, in the best layout for the batch —
the physical limit of a refresh on Delta — and checked equal to the view; ``id / limit`` says
how far the id copy's refresh is from it.
Last, devices_parts' Delta table is attached (``attach_delta``, no copy) to a second maintainer
in another warehouse, timed. Reported per view and batch: median refresh times (min–max over
the rounds), the speedup of id over recompute, auto's choices and its time against the faster of
the two, effective changes and buckets rewritten; plus the targets: auto ≤ 1.10 × the faster,
a refresh with nothing pending ≤ 0.3 s, attaching ≤ 2 s at 20M rows.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from idivm.bench import pyplot, step, write_results
from idivm.bench.data import PartsDevices, mixed_batch, parts_devices, price_updates
from idivm.bench.spark_limit import LimitCopy, limit_copies
from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL
from idivm.refresh_cost import RefreshStrategy

VIEWS = (("V", "v", V_SQL), ("V'", "v_prime", V_PRIME_SQL))
TABLES = ("devices", "parts", "devices_parts")
STRATEGIES: tuple[RefreshStrategy, ...] = ("id", "recompute", "auto")
SUFFIX = {"id": "id", "recompute": "rec", "auto": "auto"}
BATCHES = "abc"
AUTO_SLACK = 1.10  # target: auto within 10% of the faster of id and recompute
NOOP_TARGET = 0.3  # seconds: a refresh with nothing pending
ATTACH_TARGET = 2.0  # seconds: attaching devices_parts ...
ATTACH_TARGET_ROWS = 20_000_000  # ... at this many rows


def copy_name(view: str, strategy: str) -> str:
    """The copy of a view maintained with ``strategy`` (``v_id``, ``v_prime_rec``, …)."""
    return f"{view}_{SUFFIX[strategy]}"


def fingerprint(df: Any, types: dict[str, Any]) -> tuple[int, int]:
    """Rows and the sum of their hashes (a multiset checksum), values cast to ``types``."""
    from pyspark.sql import functions as F

    cols = [F.col(f"`{c}`").cast(types[c]) for c in df.columns]
    r = df.select(F.count(F.lit(1)).alias("n"),
                  F.sum(F.xxhash64(*cols).cast("decimal(38,0)")).alias("h")).collect()[0]
    return int(r["n"]), int(r["h"] or 0)


@dataclass(frozen=True)
class _Config:
    pd: PartsDevices
    updates: int
    small_share: float
    mixed_share: float
    repeat: int
    batches: str
    buckets: int | None


def run(links: int = 5_000_000, fanout: int = 10, phones: float = 0.2, updates: int = 200,
        repeat: int = 3,
        mixed_share: float = 0.01, out: str = "bench_out/spark", buckets: int | None = None,
        master: str | None = None, driver_memory: str = "8g", warehouse: str | None = None,
        batches: str = BATCHES, console: Console | None = None,
        small_share: float = 0.001) -> int:
    """Run the benchmark, print and write the results; 0 when every copy of every view was
    verified. ``batches``: any of ``a`` (``updates`` price updates), ``b`` (a mixed batch of
    ``small_share`` of devices_parts' rows), ``c`` (``mixed_share``), run in that order."""
    c = console or Console()
    unknown = sorted(set(batches) - set(BATCHES))
    if unknown or not batches:
        raise IdivmError(f"batches must be letters of {BATCHES!r} (a: price updates, b: "
                         f"small mixed, c: mixed), not {batches!r}")
    if repeat < 1:
        raise IdivmError("repeat must be at least 1")
    if warehouse is None:
        root, temporary = Path(tempfile.mkdtemp(prefix="idivm-bench-")), True
    else:
        root, temporary = Path(warehouse), False
        if root.exists():
            shutil.rmtree(root)
    cfg = _Config(PartsDevices(links, fanout, phones), updates, small_share, mixed_share,
                  repeat, "".join(b for b in BATCHES if b in batches), buckets)
    try:
        return _run(c, root, cfg, Path(out), master, driver_memory)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def _run(c: Console, root: Path, cfg: _Config, out: Path, master: str | None,
         driver_memory: str) -> int:
    from idivm.spark import SparkMaintainer
    from idivm.spark.delta import add_actions, open_table
    from idivm.spark.session import driver_conf, spark_session

    pd = cfg.pd
    c.rule("[bold]idivm bench spark: parts/devices (paper §7.2) on Delta — id vs recompute vs "
           "auto[/bold]")
    c.print(f"devices_parts {pd.devices * pd.fanout:,} rows, devices {pd.devices:,}, parts "
            f"{pd.parts:,}; {pd.phone_share:.0%} phones, fanout {pd.fanout}; warehouse {root}")
    report: dict[str, Any] = {"config": {
        "devices_parts": pd.devices * pd.fanout, "devices": pd.devices, "parts": pd.parts,
        "fanout": pd.fanout, "phone_share": pd.phone_share, "price_updates": cfg.updates,
        "small_share": cfg.small_share, "mixed_share": cfg.mixed_share, "repeat": cfg.repeat,
        "buckets": cfg.buckets, "batches": cfg.batches, "strategies": list(STRATEGIES),
        "master": master or "local[*]", "driver_memory": driver_memory, "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }, "setup": {}, "batches": [], "rounds": [], "results": []}
    progress = Progress(SpinnerColumn(finished_text="[green]✓[/green]"),
                        TextColumn("{task.description}"), TimeElapsedColumn(), console=c)
    with progress:
        with step(progress, "start Spark"):
            spark = spark_session(master, conf={"spark.driver.memory": driver_memory,
                                                **driver_conf(False)})
            report["config"]["spark"] = spark.version
        catalog = Catalog.from_ddl(PAPER_DDL)
        m = SparkMaintainer(catalog, root / "main", spark=spark, buckets=cfg.buckets)
        frames = parts_devices(spark, pd)
        setup = report["setup"]
        for name in TABLES:
            with step(progress, f"generate and load {name} (Delta)"):
                t0 = time.perf_counter()
                m.load_table(name, frames[name])
                setup[f"load {name} s"] = time.perf_counter() - t0
                setup[f"{name} files"] = len(add_actions(open_table(m.table_location(name))))
        for label, view, sql in VIEWS:
            for strategy in STRATEGIES:
                name = copy_name(view, strategy)
                with step(progress, f"create and materialize {label} as {name} "
                          f"(strategy {strategy})"):
                    t0 = time.perf_counter()
                    m.create_view(name, sql, strategy=strategy)
                    setup[f"create {name} s"] = time.perf_counter() - t0
                setup[f"{name} buckets"] = {r.name: m.store.partitions(r.name)
                                            for r in m.plan_of(name).materialized}
            setup[f"{label} rows"] = m.read_view(copy_name(view, "id")).count()

        with step(progress, "copy V and V' for the limit (a hand-written refresh)"):
            limits = limit_copies(root, {label: (m.view_location(copy_name(view, "id")),
                                                 m.plan_of(copy_name(view, "id")).columns)
                                         for label, view, _ in VIEWS})
        todo: dict[str, tuple[str, Callable[[int, int], dict[str, Any]]]] = {
            "a": (f"{cfg.updates} price updates", lambda rep, k: {
                "parts": price_updates(spark, spark.table("parts"), cfg.updates, pd,
                                       salt=rep)}),
            "b": (f"{cfg.small_share:.1%} mixed", lambda rep, k: mixed_batch(
                spark, {t: spark.table(t) for t in TABLES}, pd, cfg.small_share,
                salt=100 + k, slot=pd.fanout + k)),
            "c": (f"{cfg.mixed_share:.1%} mixed", lambda rep, k: mixed_batch(
                spark, {t: spark.table(t) for t in TABLES}, pd, cfg.mixed_share,
                salt=100 + k, slot=pd.fanout + k)),
        }
        g = 0  # rounds so far: which strategy goes first
        k = 0  # mixed batches so far: their salt and the part slot of their new links
        for key in cfg.batches:
            caption, build = todo[key]
            for rep in range(cfg.repeat):
                order = [*STRATEGIES[g % len(STRATEGIES):], *STRATEGIES[:g % len(STRATEGIES)]]
                batch_record, records = _round(progress, m, key, caption, rep, order,
                                               build(rep, k), limits)
                report["batches"].append(batch_record)
                report["rounds"] += records
                g += 1
                k += key != "a"
        report["attach"] = _attach(progress, m, root, cfg)
        report["results"] = _summarize(report["rounds"])
        report["targets"] = _targets(report)

    ok = _print(c, report)
    write_results(c, report, out)
    _plot(c, report, out / "spark_bench.png")
    return 0 if ok else 1


def _round(progress: Progress, m: Any, key: str, caption: str, rep: int,
           order: Sequence[RefreshStrategy], batch: dict[str, Any],
           limits: Mapping[str, LimitCopy]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One batch: commit it to the base tables, maintain the six copies in ``order`` (of the
    strategies; V before V' for each), time a refresh with nothing pending after each id copy's,
    verify every copy, then refresh each view's limit copy (``spark_limit``) and verify it.
    Returns the batch's record and a record per view."""
    what = f"batch ({key}) {caption}, round {rep + 1}"
    with step(progress, f"{what}: build the change feeds"):
        feeds = {t: df.localCheckpoint(eager=True)  # detached from the files it rewrites
                 for t, df in batch.items()}
        sizes = {t: df.count() for t, df in feeds.items()}
    write: dict[str, float] = {}
    with step(progress, f"{what}: commit them to the base tables (apply_changes)"):
        for t, df in feeds.items():
            t0 = time.perf_counter()
            m.apply_changes(t, df)
            write[t] = time.perf_counter() - t0
    stats: dict[tuple[str, str], Any] = {}
    noop: dict[str, float] = {}
    names = ", ".join(SUFFIX[s] for s in order)
    with step(progress, f"{what}: maintain the six copies ({names} first to last)"):
        task = progress.task_ids[-1]
        for strategy in order:
            for label, view, _ in VIEWS:
                name = copy_name(view, strategy)
                progress.update(task, description=f"{what}: maintain {name}")
                stats[(label, strategy)] = m.maintain(name)
                if strategy == "id":
                    progress.update(task, description=f"{what}: maintain {name} again "
                                    "(nothing pending)")
                    noop[label] = m.maintain(name).seconds
        progress.update(task, description=f"{what}: maintained the six copies ({names} first "
                        "to last)")
    checks: dict[tuple[str, str], tuple[tuple[int, int], tuple[int, int]]] = {}
    with step(progress, f"{what}: verify the six copies (count, hash sum vs recompute)"):
        task = progress.task_ids[-1]
        expected: dict[tuple[str, str], tuple[int, int]] = {}
        for label, view, _ in VIEWS:
            for strategy in STRATEGIES:
                name = copy_name(view, strategy)
                progress.update(task, description=f"{what}: verify {name}")
                fresh = m.recompute(name)
                types = {f.name: f.dataType for f in fresh.schema.fields}
                marks = json.dumps(m.registry()["views"][name]["watermarks"], sort_keys=True)
                if (label, marks) not in expected:  # the copies reflect the same versions
                    expected[(label, marks)] = fingerprint(fresh, types)
                checks[(label, strategy)] = (fingerprint(m.read_view(name), types),
                                             expected[(label, marks)])
        progress.update(task, description=f"{what}: verified the six copies (count, hash sum "
                        "vs recompute)")
    limit: dict[str, dict[str, Any]] = {}
    with step(progress, f"{what}: the limit — commit just the final view changes"):
        for label, _, _ in VIEWS:
            lc = limits[label]
            final = lc.prepare()
            versions = stats[(label, "id")].versions
            seconds = lc.refresh(m.catalog, {t: (m.table_location(t), int(a), int(b))
                                             for t, (a, b) in versions.items()})
            limit[label] = {"seconds": seconds, "final_changes": final,
                            "verified": lc.verify()}
    batch_record = {"batch": key, "batch_caption": caption, "round": rep + 1,
                    "change_rows": sizes, "write_seconds": sum(write.values()),
                    "write_by_table": write, "order": list(order)}
    records = []
    for label, _, _ in VIEWS:
        copies = {s: _copy_record(stats[(label, s)], *checks[(label, s)]) for s in STRATEGIES}
        records.append({
            "view": label, "batch": key, "batch_caption": caption, "round": rep + 1,
            "order": list(order), "change_rows": sizes, "write_seconds": sum(write.values()),
            "noop_seconds": noop[label], "copies": copies,
            "auto_choice": copies["auto"]["decision"].get("choice"),
            "auto_reason": copies["auto"]["decision"].get("reason"),
            "limit": limit[label],
            "verified": all(x["verified"] for x in copies.values())
            and limit[label]["verified"]})
    return batch_record, records


def _copy_record(s: Any, got: tuple[int, int], expected: tuple[int, int]) -> dict[str, Any]:
    """What one refresh of one copy did, and whether the copy equals the recomputation."""
    return {
        "seconds": s.seconds, "decision": dict(s.decision), "changes": dict(s.changes),
        "partitions_rewritten": [sum(r for r, _ in s.partitions_rewritten.values()),
                                 sum(n for _, n in s.partitions_rewritten.values())],
        "partitions_by_target": {k: list(v) for k, v in s.partitions_rewritten.items()},
        "idiff_rows": sum(n for k, n in s.idiff_rows.items() if " → " not in k),
        "applied_rows": sum(n for k, n in s.idiff_rows.items() if " → " in k),
        "statements": list(s.statements), "view_rows": got[0],
        "fingerprint": [list(got), list(expected)], "verified": got == expected}


def _attach(progress: Progress, m: Any, root: Path, cfg: _Config) -> dict[str, Any]:
    """Attach devices_parts' Delta table to a fresh maintainer (same catalog and session,
    another warehouse) ``repeat`` times, each into a new one: seconds of ``attach_delta``."""
    from idivm.spark import SparkMaintainer
    from idivm.spark.delta import add_actions, open_table

    src = m.table_location("devices_parts")
    actions = add_actions(open_table(src))
    rows = sum(int(a.get("num_records") or 0) for a in actions)
    times, version = [], None
    with step(progress, f"attach devices_parts ({rows:,} rows, {len(actions)} files) to a "
              f"second maintainer, {cfg.repeat}×"):
        for i in range(cfg.repeat):
            other = SparkMaintainer(m.catalog, root / f"attach_{i}", spark=m.spark,
                                    buckets=cfg.buckets)
            t0 = time.perf_counter()
            version = other.attach_delta("devices_parts", src)
            times.append(time.perf_counter() - t0)
    return {"table": "devices_parts", "location": src, "rows": rows, "files": len(actions),
            "version": version, "seconds": statistics.median(times),
            "spread": [min(times), max(times)], "all_seconds": times}


def _summarize(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per view and batch: median times per strategy with their min–max spread over the
    rounds, ratios of the medians, auto's choices, and the id copy's median round's details."""
    out = []
    for view, batch in dict.fromkeys((r["view"], r["batch"]) for r in rounds):
        rs = [r for r in rounds if r["view"] == view and r["batch"] == batch]
        mid = sorted(rs, key=lambda r: r["copies"]["id"]["seconds"])[len(rs) // 2]
        idc = mid["copies"]["id"]
        row: dict[str, Any] = {
            "view": view, "batch": batch, "batch_caption": rs[0]["batch_caption"],
            "rounds": len(rs), "effective_changes": idc["changes"],
            "partitions_rewritten": idc["partitions_rewritten"],
            "partitions_by_target": idc["partitions_by_target"],
            "idiff_rows": idc["idiff_rows"], "statements": idc["statements"]}
        for s in STRATEGIES:
            xs = [r["copies"][s]["seconds"] for r in rs]
            row[f"{s}_seconds"] = statistics.median(xs)
            row[f"{s}_spread"] = [min(xs), max(xs)]
        xs = [r["limit"]["seconds"] for r in rs]
        row["limit_seconds"], row["limit_spread"] = statistics.median(xs), [min(xs), max(xs)]
        row["final_changes"] = mid["limit"]["final_changes"]
        for k in ("write", "noop"):
            xs = [r[f"{k}_seconds"] for r in rs]
            row[f"{k}_seconds"] = statistics.median(xs)
            row[f"{k}_spread"] = [min(xs), max(xs)]
        best = min(row["id_seconds"], row["recompute_seconds"])
        row["speedup"] = row["recompute_seconds"] / row["id_seconds"]
        row["id_vs_limit"] = row["id_seconds"] / row["limit_seconds"]
        row["faster"] = "id" if row["id_seconds"] <= row["recompute_seconds"] else "recompute"
        row["auto_vs_best"] = row["auto_seconds"] / best
        row["auto_vs_best_rounds"] = [
            r["copies"]["auto"]["seconds"] / min(r["copies"]["id"]["seconds"],
                                                 r["copies"]["recompute"]["seconds"])
            for r in rs]
        row["auto_choices"] = [r["auto_choice"] for r in rs]
        row["auto_reasons"] = [r["auto_reason"] for r in rs]
        row["auto_target_met"] = row["auto_vs_best"] <= AUTO_SLACK
        row["verified"] = all(r["verified"] for r in rs)
        out.append(row)
    return out


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    res = report["results"]
    noops = [r["noop_seconds"] for r in report["rounds"]]
    att = report["attach"]
    return {
        "auto": {"target": f"auto ≤ {AUTO_SLACK:.2f} × min(id, recompute)",
                 "met": all(r["auto_target_met"] for r in res),
                 "worst": max(r["auto_vs_best"] for r in res)},
        "noop": {"target": f"maintain with nothing pending ≤ {NOOP_TARGET} s",
                 "median": statistics.median(noops), "max": max(noops),
                 "met": statistics.median(noops) <= NOOP_TARGET},
        "attach": {"target": f"attach_delta ≤ {ATTACH_TARGET} s at {ATTACH_TARGET_ROWS:,} rows",
                   "seconds": att["seconds"], "rows": att["rows"],
                   "met": att["seconds"] <= ATTACH_TARGET},
    }


def _seconds(median: float, spread: Sequence[float], n: int) -> str:
    return f"{median:.2f} ({spread[0]:.2f}–{spread[1]:.2f})" if n > 1 else f"{median:.2f}"


def _spread(r: dict[str, Any], k: str) -> str:
    return _seconds(r[f"{k}_seconds"], r[f"{k}_spread"], r["rounds"])


def _choices(choices: Sequence[str | None]) -> str:
    n = Counter(SUFFIX.get(x or "", "?") for x in choices)
    return " ".join(f"{k}×{v}" if len(choices) > 1 else k for k, v in sorted(n.items()))


def _met(ok: bool) -> str:
    return "[green]met[/green]" if ok else "[red]not met[/red]"


def _print(c: Console, report: dict[str, Any]) -> bool:
    t = Table(title="id vs recompute vs auto: refresh seconds per copy, median over the rounds "
              "(min–max)", title_style="bold",
              caption="write s: the batch's commit to the base tables (apply_changes, once for "
              "all copies); changes: effective changes of all tables; buckets rewritten: by the "
              "id copy, over the view and its caches; recompute s: the recompute copy's refresh "
              "(view and caches written anew as Delta); auto/min: auto's median over the faster "
              "of id and recompute; no-op s: the id copy maintained again, nothing pending; "
              "limit s: read the change feeds and commit just the final view changes (−removed "
              "+added rows) in the best layout for the batch (idivm/bench/spark_limit.py)")
    for col in ("view", "batch", "write s", "changes", "buckets rewritten", "id s",
                "recompute s", "speedup rec/id", "limit s", "final −/+", "id/limit", "auto s",
                "auto chose", "auto/min", "no-op s", "verified"):
        t.add_column(col, justify="left" if col in ("view", "batch", "auto chose") else "right")
    for r in report["results"]:
        ratio = f"{r['auto_vs_best']:.2f}×"
        t.add_row(r["view"], f"({r['batch']}) {r['batch_caption']}", _spread(r, "write"),
                  f"{sum(r['effective_changes'].values()):,}",
                  "{}/{}".format(*r["partitions_rewritten"]), _spread(r, "id"),
                  _spread(r, "recompute"), f"{r['speedup']:.1f}×", _spread(r, "limit"),
                  "{removed:,}/{added:,}".format(**r["final_changes"]),
                  f"{r['id_vs_limit']:.1f}×", _spread(r, "auto"),
                  _choices(r["auto_choices"]),
                  f"[green]{ratio}[/green]" if r["auto_target_met"] else f"[red]{ratio}[/red]",
                  _spread(r, "noop"),
                  "[green]yes[/green]" if r["verified"] else "[red]NO[/red]")
    width = c.width
    if not c.is_terminal:  # a log or a pipe: one line per row rather than wrapped cells
        c.width = max(width, 200)
    try:
        c.print(t)
    finally:
        c.width = width
    setup = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in report["setup"].items())
    c.print(f"[dim]setup: {setup}[/dim]")
    for r in report["results"]:
        c.print(f"[dim]auto on {r['view']} ({r['batch']}), last round: {r['auto_choices'][-1]} — "
                f"{r['auto_reasons'][-1]}[/dim]")
    for r in report["results"]:
        if r["batch"] == "a" and r["speedup"] < 10:
            c.print(f"[yellow]{r['view']} under ({r['batch']}) {r['batch_caption']}: maintain is "
                    f"only {r['speedup']:.1f}× faster than recompute; where its "
                    f"{r['id_seconds']:.2f} s go:[/yellow]")
            slow = sorted(r["statements"], key=lambda s: -s[1])[:8]
            other = r["id_seconds"] - sum(s for _, s in r["statements"])
            c.print("  " + ", ".join(f"{n} {s:.2f} s" for n, s in slow)
                    + f"; folding the feeds, sizing the i-diffs and committing: {other:.2f} s")
    tg = report["targets"]
    worst = max(report["results"], key=lambda r: r["auto_vs_best"])
    missed = [f"{r['view']} ({r['batch']}) {r['auto_vs_best']:.2f}×"
              for r in report["results"] if not r["auto_target_met"]]
    c.print(f"target {tg['auto']['target']}: {_met(tg['auto']['met'])} (worst "
            f"{worst['auto_vs_best']:.2f}×, {worst['view']} ({worst['batch']})"
            + (f"; over: {', '.join(missed)}" if missed else "") + ")")
    c.print(f"target {tg['noop']['target']}: {_met(tg['noop']['met'])} (median "
            f"{tg['noop']['median']:.3f} s, max {tg['noop']['max']:.3f} s)")
    att = report["attach"]
    c.print(f"target {tg['attach']['target']}: {_met(tg['attach']['met'])} "
            f"({_seconds(att['seconds'], att['spread'], len(att['all_seconds']))} s for "
            f"{att['rows']:,} rows in {att['files']} files)")
    bad = [f"{r['view']} ({r['batch']})" for r in report["results"] if not r["verified"]]
    if bad:
        copies = sorted({copy_name(v, s) for r in report["rounds"] if not r["verified"]
                         for lbl, v, _ in VIEWS if lbl == r["view"]
                         for s in STRATEGIES if not r["copies"][s]["verified"]})
        c.print(f"[bold red]MISMATCH: {', '.join(bad)} differ from the recomputation "
                f"({', '.join(copies)})[/bold red]")
        return False
    c.print("[bold green]every maintained view equals its recomputation[/bold green]")
    return True


def _plot(c: Console, report: dict[str, Any], path: Path) -> None:
    plt = pyplot(c)
    if plt is None:
        return
    rs = report["results"]
    labels = [f"{r['view']} ({r['batch']})" + ("" if r["verified"] else "\nMISMATCH")
              for r in rs]
    batches = ", ".join(dict.fromkeys(f"({r['batch']}) {r['batch_caption']}" for r in rs))
    x = list(range(len(rs)))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8),
                                  gridspec_kw={"width_ratios": [3, 1.4]})
    w = 0.2
    for i, (s, caption) in enumerate((("id", "id (Δ-script)"),
                                      ("recompute", "recompute (view + caches anew)"),
                                      ("auto", "auto (chooses)"),
                                      ("limit", "limit (final changes only)"))):
        med = [r[f"{s}_seconds"] for r in rs]
        err = [[m - r[f"{s}_spread"][0] for m, r in zip(med, rs, strict=True)],
               [r[f"{s}_spread"][1] - m for m, r in zip(med, rs, strict=True)]]
        bars = ax.bar([j + (i - 1.5) * w for j in x], med, w, yerr=err, capsize=2, label=caption)
        ax.bar_label(bars, labels=[f"{m:.2f}" if s != "auto" else
                                   f"{m:.2f}\n{_choices(r['auto_choices'])}"
                                   for m, r in zip(med, rs, strict=True)], fontsize=7)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlabel(batches, fontsize=8)
    ax.set_ylabel("refresh seconds (median, min–max)")
    cfg = report["config"]
    ax.set_title(f"parts/devices on Spark + Delta: devices_parts {cfg['devices_parts']:,} rows, "
                 f"{cfg['phone_share']:.0%} phones, f={cfg['fanout']}", fontsize=10)
    ax.margins(y=0.25)  # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper center", ncol=4)
    ax2.bar(x, [r["auto_vs_best"] for r in rs], 0.6,
            color=["tab:green" if r["auto_target_met"] else "tab:red" for r in rs])
    ax2.axhline(AUTO_SLACK, color="black", linestyle="--", linewidth=1,
                label=f"target {AUTO_SLACK:.2f}×")
    ax2.axhline(1.0, color="grey", linewidth=0.8)
    ax2.set_xticks(x, [f"{r['view']} ({r['batch']})" for r in rs], fontsize=8)
    ax2.set_ylabel("auto / min(id, recompute)")
    ax2.set_title("auto vs the faster strategy", fontsize=10)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    c.print(f"wrote {path}")
