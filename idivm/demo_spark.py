"""``idivm demo``: two BSMA-like views maintained on Spark from a change feed, then verified.

A seeded BSMA-like data set (``idivm.bench.data``) is loaded into a ``SparkMaintainer``; the views
follow BSMA's Q7 (mentioned users in a time range, with their tweetsnum and favornum) and the
idIVM paper's Q*2 (per user, sums over the users who retweeted their posts). One change batch per
table arrives in Delta CDF shape — the paper's 100 user updates of tweetsnum/favornum, new posts
with mentions and retweets, a few deleted posts — and both views are maintained, timed against a
recomputation and compared with it as multisets of rows.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.syntax import Syntax
from rich.table import Table

from idivm.bench.data import (
    BSMA_DDL,
    BSMA_TABLES,
    DAY_MS,
    Bsma,
    bsma_changes,
    bsma_frames,
    generate_bsma,
)
from idivm.catalog import Catalog
from idivm.errors import IdivmError

MARKER = ".idivm-demo"  # a warehouse holding this file may be wiped by the next demo run

# BSMA Q7, extended as in the paper: per user mentioned by a post in the time range, how often,
# with the user's tweetsnum and favornum (ORDER BY/LIMIT dropped).
Q7_SQL = """SELECT u.uid, u.tweetsnum, u.favornum, c.mentioned
FROM users u
JOIN (SELECT mn.uid, count(*) AS mentioned
      FROM microblog m JOIN mention mn ON m.mid = mn.mid
      WHERE m.time >= {start} AND m.time < {end}
      GROUP BY mn.uid) c ON u.uid = c.uid"""

# The paper's Q*2: per author, the retweets of their posts and the sums of tweetsnum and favornum
# of the retweeting users (one term per retweet).
QSTAR2_SQL = """SELECT o.uid, count(*) AS retweets,
       sum(ru.tweetsnum) AS rt_tweetsnum, sum(ru.favornum) AS rt_favornum
FROM retweet r
JOIN microblog o ON o.mid = r.remid
JOIN microblog rp ON rp.mid = r.mid
JOIN users ru ON ru.uid = rp.uid
GROUP BY o.uid"""


@dataclass
class ViewRun:
    """One view's maintenance next to its recomputation."""

    name: str
    stats: Any  # SparkMaintenanceStats
    recompute_seconds: float
    rows: int
    equal: bool


def demo_views(data: Bsma) -> list[tuple[str, str, str]]:
    """(name, caption, SQL) of the demo's views; Q7's range is the window's last 7 days."""
    _, end = data.window
    return [("mentioned_users", "Q7: users mentioned in the last 7 days",
             Q7_SQL.format(start=end - 7 * DAY_MS, end=end)),
            ("retweeters", "Q*2: per author, sums over their retweeters", QSTAR2_SQL)]


def stats_table(stats: Any, title: str | None = None) -> Table:
    """A SparkMaintenanceStats as a table: changes, statements with rows and time, buckets."""
    t = Table(title=title or f"maintenance of {stats.view}", title_style="bold")
    t.add_column("step")
    t.add_column("rows", justify="right")
    t.add_column("buckets rewritten", justify="right")
    t.add_column("ms", justify="right")
    for table, n in stats.changes.items():
        t.add_row(f"effective changes of {table}", str(n), "", "")
    applied: dict[str, int] = {}
    for name, n in stats.idiff_rows.items():
        if " → " in name:
            target = name.split(" → ", 1)[1]
            applied[target] = applied.get(target, 0) + n
    for name, secs in stats.statements:
        if name.startswith("stage "):
            target = name.removeprefix("stage ")
            done, total = stats.partitions_rewritten.get(target, (0, 0))
            t.add_row(f"APPLY → {target} (staged)", str(applied.get(target, "")),
                      f"{done}/{total}", f"{secs * 1e3:.0f}")
        else:
            n = stats.idiff_rows.get(name)
            t.add_row(f"i-diff {name}", "" if n is None else str(n), "", f"{secs * 1e3:.0f}")
    t.add_row("[bold]total (fold, statements, publish)[/bold]", "", "",
              f"[bold]{stats.seconds * 1e3:.0f}[/bold]")
    if stats.decision:
        t.caption = (f"refresh: {stats.decision['choice']} ({stats.decision['reason']}); "
                     f"engine: {stats.decision.get('engine', 'spark')} "
                     f"({stats.decision.get('engine_reason', '')})")
    return t


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(finished_text="[green]✓[/green]"),
                    TextColumn("{task.description}"), BarColumn(bar_width=20),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console)


@contextmanager
def _step(progress: Progress, what: str, total: int = 1) -> Iterator[Any]:
    """A progress line for ``what``; the body advances it with ``advance()``."""
    task = progress.add_task(what, total=total)

    def advance(label: str | None = None) -> None:
        progress.advance(task)
        if label:
            progress.update(task, description=f"{what}: {label}")

    yield advance
    progress.update(task, completed=total, description=what)
    progress.stop_task(task)


def _changed_rows(columns: Sequence[str], before: Counter[Any], after: Counter[Any],
                  limit: int = 5) -> Table | None:
    gone, new = before - after, after - before
    if not gone and not new:
        return None
    t = Table(title=f"rows that changed ({sum(gone.values())} out, {sum(new.values())} in; "
              f"first {limit} of each)", title_style="dim")
    t.add_column("")
    for c in columns:
        t.add_column(c, justify="right")
    for sign, rows in (("[red]-[/red]", gone), ("[green]+[/green]", new)):
        for r in sorted(rows.elements(), key=lambda r: tuple(str(v) for v in r))[:limit]:
            t.add_row(sign, *("NULL" if v is None else str(v) for v in r))
    return t


def _prepare_warehouse(warehouse: str | None) -> tuple[Path, bool]:
    """The warehouse directory, and whether to remove it afterwards."""
    if warehouse is None:
        return Path(tempfile.mkdtemp(prefix="idivm-demo-")), True
    root = Path(warehouse)
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            raise IdivmError(f"--warehouse {warehouse!r} is not empty (the demo needs an empty "
                             "directory, or one a previous demo used)")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("written by idivm demo; the next demo run replaces it\n")
    return root, False


def run(warehouse: str | None = None, master: str | None = None, scale: float = 10.0,
        console: Console | None = None, seed: int = 2015) -> int:
    """Run the demo; 0 when every view equals its recomputation, 1 otherwise."""
    c = console or Console()
    root, temporary = _prepare_warehouse(warehouse)
    try:
        return _run(c, root, master, scale, seed)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def _run(c: Console, root: Path, master: str | None, scale: float, seed: int) -> int:
    from idivm.spark import SparkMaintainer
    from idivm.spark.session import driver_conf, spark_session

    c.rule("[bold]idivm demo: BSMA-like views maintained on Spark from a change feed[/bold]")
    catalog = Catalog.from_ddl(BSMA_DDL)
    started = time.perf_counter()
    with _progress(c) as progress:
        with _step(progress, "start Spark (embedded, loopback only)"):
            spark = spark_session(master, conf=driver_conf(True))
        with _step(progress, f"generate BSMA-like data (scale {scale:g}, seed {seed})"):
            data = generate_bsma(scale, seed)
            batch = bsma_changes(data, seed=seed + 1)
        m = SparkMaintainer(catalog, root, spark=spark)
        with _step(progress, "load base tables", len(BSMA_TABLES)) as advance:
            for name, df in bsma_frames(spark, catalog, data.tables).items():
                m.load_table(name, df)
                advance(name)
        views = demo_views(data)
        with _step(progress, "create and materialize views", len(views)) as advance:
            plans = {}
            for name, _, sql in views:
                plans[name] = m.create_view(name, sql, strategy="id")
                advance(name)
        before = {name: Counter(m.read_view(name).collect()) for name, _, _ in views}
        with _step(progress, "record change batches (Delta CDF)", len(batch)) as advance:
            for name, df in bsma_frames(spark, catalog, batch, cdf=True).items():
                m.apply_changes(name, df)
                advance(name)

    sizes = Table(title=f"data set under {root}", title_style="bold")
    for col in ("table", "rows", "inserts", "deletes", "updates"):
        sizes.add_column(col, justify="left" if col == "table" else "right")
    for name, n in data.sizes().items():
        kinds = Counter(r[-1] for r in batch.get(name, []))
        sizes.add_row(name, f"{n:,}", str(kinds["insert"] or ""), str(kinds["delete"] or ""),
                      str(kinds["update_postimage"] or ""))
    c.print(sizes)
    for name, caption, sql in views:
        p = plans[name]
        c.print(Panel(Syntax(sql, "sql", word_wrap=True), title=f"{name} — {caption}",
                      subtitle=f"{len(p.statements)} Δ-script statements, "
                      f"{len(p.materialized) - 1} cache(s)", title_align="left"))

    runs = [_maintain_one(c, m, name, root, before[name]) for name, _, _ in views]
    _summary(c, runs)
    c.print(f"demo finished in {time.perf_counter() - started:.1f} s")
    if all(r.equal for r in runs):
        c.print("[bold green]all views equal their recomputation[/bold green]")
        return 0
    c.print("[bold red]some views differ from their recomputation[/bold red]")
    return 1


def _maintain_live(m: Any, name: str, progress: Progress) -> Any:
    """``m.maintain(name)`` with its current step shown, through the maintainer's step hook."""
    task = progress.add_task(f"  {name}: fold the change feeds", total=None)
    steps = 0

    def show(step: str) -> bool:
        nonlocal steps
        steps += 1
        what = f"i-diff {step}" if " " not in step and step != "fold" else step
        progress.update(task, description=f"  {name}: step {steps}, {what}")
        return False  # never fail: the hook is only watched

    saved, m.fail_at = m.fail_at, show
    try:
        return m.maintain(name)
    finally:
        m.fail_at = saved
        progress.update(task, total=1, completed=1,
                        description=f"  {name}: {steps} steps (fold, i-diffs, staged APPLYs, "
                        "manifest, publish, watermark)")
        progress.stop_task(task)


def _maintain_one(c: Console, m: Any, name: str, root: Path, before: Counter[Any]) -> ViewRun:
    c.rule(f"[bold]{name}[/bold]")
    scratch = root / "_scratch" / name
    with _progress(c) as progress:
        with _step(progress, f"maintain {name}"):
            stats = _maintain_live(m, name, progress)
        with _step(progress, f"recompute {name} from scratch (written to parquet)"):
            t0 = time.perf_counter()
            m.recompute(name).write.mode("overwrite").parquet(str(scratch))
            recompute = time.perf_counter() - t0
        with _step(progress, f"compare {name} with its recomputation (multisets of rows)"):
            view = m.read_view(name)
            after = Counter(view.collect())
            expected = Counter(tuple(r) for r in m.spark.read.parquet(str(scratch)).collect())
    c.print(stats_table(stats))
    location = m.view_location(name)
    from idivm.spark.delta import delta_rows

    outside = delta_rows(location, view.columns)
    version = stats.committed.get(m.plan_of(name).store.name, "-")
    same = Counter(outside) == Counter(tuple(r) for r in after.elements())
    c.print(f"{name} is the Delta table {location} (version {version}); read by delta-rs, "
            f"outside Spark: {len(outside):,} rows, "
            + ("the same as the view" if same else "[red]NOT the same as the view[/red]"))
    changed = _changed_rows(view.columns, before, after)
    if changed is not None:
        c.print(changed)
    equal = Counter(tuple(r) for r in after.elements()) == expected
    if equal:
        c.print(f"[green]verified: {name} equals its recomputation "
                f"({sum(after.values()):,} rows)[/green]")
    else:
        c.print(f"[red]MISMATCH: {name} differs from its recomputation[/red]")
        got = Counter(tuple(r) for r in after.elements())
        c.print(f"  only in the view:          {sorted(got - expected)[:10]}")
        c.print(f"  only in the recomputation: {sorted(expected - got)[:10]}")
    return ViewRun(name, stats, recompute, sum(after.values()), equal and same)


def _summary(c: Console, runs: Sequence[ViewRun]) -> None:
    t = Table(title="maintenance vs recomputation", title_style="bold")
    for col in ("view", "changes", "i-diff rows", "statements", "buckets", "engine",
                "maintain s", "recompute s", "recompute/maintain", "equal"):
        t.add_column(col, justify="left" if col == "view" else "right")
    for r in runs:
        s = r.stats
        done = sum(d for d, _ in s.partitions_rewritten.values())
        total = sum(n for _, n in s.partitions_rewritten.values())
        t.add_row(r.name, str(sum(s.changes.values())),
                  str(sum(v for k, v in s.idiff_rows.items() if " → " not in k)),
                  str(len(s.statements)), f"{done}/{total}", s.decision.get("engine", ""),
                  f"{s.seconds:.2f}", f"{r.recompute_seconds:.2f}",
                  f"{r.recompute_seconds / max(s.seconds, 1e-9):.1f}×",
                  "[green]yes[/green]" if r.equal else "[red]NO[/red]")
    c.print(t)
    c.print("[dim]changes: effective changes of the tables the view reads; buckets: rewritten "
            "out of all, over the view and its caches; engine: where the Δ-script ran (a batch "
            "this small runs in DuckDB on the driver, with no Spark job; a large one as Spark "
            "SQL). A recomputation is Spark jobs over every base table; `idivm bench spark` "
            "measures millions of rows.[/dim]")
