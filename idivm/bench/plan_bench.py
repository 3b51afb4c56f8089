"""Planning-time benchmark: median wall time of ``idivm.plan`` over a fixed list of views.

The views cover the paper's V and V' and one view per family of operators the planner handles
(joins, θ- and self-joins, aggregates with HAVING, AVG, MIN/MAX, DISTINCT, global aggregates,
NOT EXISTS, EXISTS, UNION ALL, UNION, EXCEPT, aggregate subqueries in FROM).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from idivm.catalog import Catalog
from idivm.examples import PAPER_DDL, SOCIAL_DDL, V_PRIME_SQL, V_SQL
from idivm.plan import plan

SCHEMAS: dict[str, str] = {"paper": PAPER_DDL, "social": SOCIAL_DDL}


@dataclass(frozen=True)
class BenchView:
    """One benchmarked view: name, schema key, SQL and optional declared changes."""

    name: str
    schema: str
    sql: str
    changes: dict[str, list[str]] | None = None


VIEWS: tuple[BenchView, ...] = (
    BenchView("paper_V", "paper", V_SQL),
    BenchView("paper_V_price_only", "paper", V_SQL, {"parts": ["update:price"]}),
    BenchView("paper_V_prime", "paper", V_PRIME_SQL),
    BenchView("paper_V_prime_price_only", "paper", V_PRIME_SQL, {"parts": ["update:price"]}),
    BenchView("join_on_exprs", "paper", """
        SELECT dp.did, p.pid, upper(d.category) AS cat, p.price * 2 + 1 AS doubled,
               CASE WHEN p.price > 10 THEN 'expensive' ELSE 'cheap' END AS tier
        FROM devices d JOIN devices_parts dp ON d.did = dp.did JOIN parts p ON p.pid = dp.pid
        WHERE p.price >= 3"""),
    BenchView("self_theta_join", "paper", """
        SELECT p1.pid AS cheap, p2.pid AS pricey, p2.price - p1.price AS diff
        FROM parts p1 JOIN parts p2 ON p1.price < p2.price AND p2.price <= p1.price + 2"""),
    BenchView("group_having_avg_min_max", "paper", """
        SELECT d.category, count(*) AS n, avg(p.price) AS mean, min(p.price) AS lo,
               max(p.price) AS hi
        FROM devices_parts dp JOIN parts p USING (pid) JOIN devices d USING (did)
        GROUP BY d.category HAVING count(*) >= 2"""),
    BenchView("distinct", "paper", """
        SELECT DISTINCT d.category, p.price
        FROM devices d NATURAL JOIN devices_parts dp NATURAL JOIN parts p"""),
    BenchView("global_aggregate", "paper",
              "SELECT count(*) AS n, sum(price) AS total, min(price) AS lo, max(price) AS hi, "
              "avg(price) AS mean FROM parts"),
    BenchView("not_exists", "paper", """
        SELECT d.did, d.category FROM devices d
        WHERE NOT EXISTS (SELECT 1 FROM devices_parts dp WHERE dp.did = d.did)"""),
    BenchView("exists", "paper", """
        SELECT p.pid, p.price FROM parts p
        WHERE EXISTS (SELECT 1 FROM devices_parts dp WHERE dp.pid = p.pid)"""),
    BenchView("social_mentions_join", "social", """
        SELECT m.mid, m.uid, u.name, mb.time AS posted
        FROM mention m JOIN users u ON u.uid = m.uid JOIN microblog mb ON mb.mid = m.mid
        WHERE u.city = 1 AND mb.time > 5"""),
    BenchView("social_friends_self_join", "social", """
        SELECT f.uid, f.followee_id, u1.name AS follower, u2.name AS followee
        FROM friendlist f JOIN users u1 ON u1.uid = f.uid JOIN users u2 ON u2.uid = f.followee_id
        WHERE u1.city = u2.city"""),
    BenchView("social_union_all", "social", """
        SELECT uid, 'follower' AS role FROM friendlist
        UNION ALL SELECT followee_id, 'followee' FROM friendlist
        UNION ALL SELECT uid, 'author' FROM microblog WHERE time >= 20"""),
    BenchView("social_union", "social",
              "SELECT uid FROM mention UNION SELECT uid FROM microblog"),
    BenchView("social_except", "social",
              "SELECT uid FROM users EXCEPT SELECT uid FROM microblog WHERE time > 10"),
    BenchView("social_agg_subquery_from", "social", """
        SELECT u.uid, u.name, t.posts
        FROM (SELECT uid, count(*) AS posts FROM microblog GROUP BY uid) AS t
        JOIN users u ON u.uid = t.uid
        WHERE t.posts >= 3"""),
)


def bench_view(view: BenchView, catalog: Catalog, repeat: int) -> dict[str, Any]:
    """Median and min planning time of one view over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = plan(view.sql, catalog, name=view.name, changes=view.changes)
        times.append(time.perf_counter() - t0)
    return {"view": view.name, "schema": view.schema, "changes": view.changes,
            "median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "statements": len(p.statements), "repeat": repeat}


def run(repeat: int = 20, out: str | Path = "bench_out/plan.json",
        console: Console | None = None) -> dict[str, Any]:
    """Benchmark every view, print a table, write JSON to ``out`` and return the report."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    console = console or Console()
    catalogs = {k: Catalog.from_ddl(ddl) for k, ddl in SCHEMAS.items()}
    results = [bench_view(v, catalogs[v.schema], repeat) for v in VIEWS]
    table = Table(title=f"planning time (median of {repeat})", title_style="bold")
    table.add_column("view")
    table.add_column("schema")
    table.add_column("median ms", justify="right")
    table.add_column("Δ-script statements", justify="right")
    for r in results:
        table.add_row(r["view"], r["schema"], f"{r['median_ms']:.2f}", str(r["statements"]))
    console.print(table)
    worst = max(results, key=lambda r: r["median_ms"])
    report = {"repeat": repeat, "views": results,
              "max_median_ms": worst["median_ms"], "max_view": worst["view"]}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"max median planning time: [bold]{worst['median_ms']:.2f} ms[/bold] "
                  f"({worst['view']}); JSON written to {path}")
    return report
