"""``idivm`` command line: plan views, drive the PostgreSQL and Spark backends, run the demo and
benchmarks."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from rich.console import Console
from rich.table import Table

from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.plan import plan
from idivm.planner.model import STRATEGIES
from idivm.postgres import PostgresMaintainer
from idivm.refresh_cost import RefreshStrategy
from idivm.scripts_out import merges
from idivm.spark.session import driver_conf, spark_session

KINDS = ("insert", "delete", "update")


def parse_changes(specs: Sequence[str] | None) -> dict[str, list[str]] | None:
    """``["parts=update:price", "devices=insert,delete"]`` → ``{"parts": ["update:price"], ...}``.

    Commas separate modification types; a token that is not a type continues the column list of
    the preceding ``update:``, so ``parts=update:price,name,insert`` is an update of two columns
    plus inserts.
    """
    if not specs:
        return None
    out: dict[str, list[str]] = {}
    for spec in specs:
        table, eq, kinds = spec.partition("=")
        table = table.strip()
        if not eq or not table or not kinds.strip():
            raise IdivmError(f"--changes {spec!r}: expected TABLE=KIND[,KIND...], e.g. "
                             "parts=update:price or devices=insert,delete")
        items = out.setdefault(table, [])
        for token in (t.strip() for t in kinds.split(",")):
            if not token:
                continue
            if token.partition(":")[0] in KINDS:
                items.append(token)
            elif items and items[-1].startswith("update:"):
                items[-1] += f",{token}"
            else:
                raise IdivmError(f"--changes {spec!r}: unknown modification type {token!r} "
                                 "(use insert, delete, update or update:col1,col2)")
    return out


def _read(path: str, what: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as e:
        raise IdivmError(f"cannot read {what} {path!r}: {e.strerror or e}") from e


def _default_dsn() -> str:
    from idivm.demo import default_dsn

    return default_dsn()


# -- commands ---------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    if args.ddl == "-" and args.view == "-":
        raise IdivmError("--ddl and --view cannot both be read from stdin")
    catalog = Catalog.from_ddl(_read(args.ddl, "DDL file"))
    p = plan(_read(args.view, "view file"), catalog, name=args.name,
             changes=parse_changes(args.changes), strategy=args.strategy,
             merge=merges(args.dialect))  # the script as the dialect's backend plans it
    text = p.explain() if args.explain else p.script_text(args.dialect)
    sys.stdout.write(text.rstrip("\n") + "\n")
    return 0


def cmd_pg(args: argparse.Namespace) -> int:
    console = Console()
    if args.every is not None or args.times is not None:
        if args.action != "maintain":
            raise IdivmError("--every and --times go with maintain")
        if args.every is None or not args.every > 0:
            raise IdivmError("--every needs a positive number of seconds")
        if args.times is not None and args.times < 1:
            raise IdivmError("--times needs a positive count")
    with PostgresMaintainer(args.dsn, schema=args.schema) as m:
        if args.every is None:
            _pg_action(m, args, console)
            _end_transaction(m)
            return 0
        return _maintain_every(m, args, console)


def _end_transaction(m: PostgresMaintainer) -> None:
    # A registry read outside maintain()'s own transaction block leaves psycopg inside an
    # implicit transaction, which turns that block into a savepoint; commit the outer one.
    if m.conn.info.transaction_status == TransactionStatus.INTRANS:
        m.conn.commit()


def _wait(seconds: float) -> None:
    """The pause between two ``--every`` refreshes (its own name, so a test replaces this
    wait alone, not ``time.sleep`` for every thread in the process)."""
    time.sleep(seconds)


def _maintain_every(m: PostgresMaintainer, args: argparse.Namespace, console: Console) -> int:
    """``maintain --every S``: a refresh every S seconds (from one's start to the next's) in
    this one session, until ``--times`` refreshes or Ctrl-C. The session keeps the compiled
    code and its plans, which a scheduler connecting per refresh pays for at every run (the
    README's *Where a session's first refreshes go*). Nothing stays open between refreshes
    (no snapshot holds back the logs' pruning); a failed refresh rolls back and ends the
    loop with its error."""
    done = 0
    try:
        while True:
            started = time.monotonic()
            _pg_action(m, args, console)
            _end_transaction(m)
            done += 1
            if args.times is not None and done >= args.times:
                return 0
            _wait(max(0.0, args.every - (time.monotonic() - started)))
    except KeyboardInterrupt:  # (a refresh it interrupts is cancelled and rolls back)
        if not m.conn.closed and m.conn.info.transaction_status != TransactionStatus.IDLE:
            m.conn.rollback()
        # (on stderr: with --json, stdout holds only the refreshes' JSON lines)
        Console(stderr=True).print(f"stopped after {done} refresh(es)", style="dim")
        return 0


def _pg_action(m: PostgresMaintainer, args: argparse.Namespace, console: Console) -> None:
    """One ``idivm pg`` action; raises IdivmError on failure."""
    if args.action == "create-view":
        if not args.name:
            raise IdivmError("create-view needs the view NAME")
        if not args.sql_file:
            raise IdivmError("create-view needs --sql-file (a file with the view SQL, or -)")
        strategy: RefreshStrategy = args.strategy or "id"
        p = m.create_view(args.name, _read(args.sql_file, "view SQL file"),
                          changes=parse_changes(args.changes), strategy=strategy)
        console.print(f"created view {m.schema}.{p.name} ({strategy}) ({', '.join(p.columns)}): "
                      f"{len(p.materialized)} stored relation(s) in {m.companion}, "
                      f"{len(p.statements)} Δ-script statements")
    elif args.action == "maintain":
        if bool(args.name) == bool(args.all):
            raise IdivmError("maintain needs the view NAME, or --all (every view)")
        indent = None if args.every is not None else 2  # (--every: a line a refresh)
        if args.all:
            every = {k: v.as_dict() for k, v in m.maintain_all(args.strategy).items()}
            if args.json:
                sys.stdout.write(json.dumps(every, indent=indent, default=str) + "\n")
                sys.stdout.flush()
            for d in every.values() if not args.json else ():
                console.print(_stats_table(d))
            return
        stats = m.maintain(args.name, args.strategy)
        if args.json:
            sys.stdout.write(json.dumps(stats.as_dict(), indent=indent, default=str) + "\n")
            sys.stdout.flush()
        else:
            for up in stats.upstream.values():
                console.print(_stats_table(up.as_dict()))
            console.print(_stats_table(stats.as_dict()))
    elif args.action == "pipeline":
        from idivm.postgres import project_run

        if args.name not in ("run", "dry-run") or not args.path:
            raise IdivmError("usage: idivm pg pipeline run|dry-run DIR (a folder of SQL files "
                             "with CREATE MATERIALIZED VIEW statements)")
        out = project_run.run(m, Path(args.path), dry_run=args.name == "dry-run")
        if args.json:
            sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
        else:
            console.print(_datasets_table(out, f"pipeline {args.path} in schema {m.schema}"))
    elif args.action == "drop-view":
        if not args.name:
            raise IdivmError("drop-view needs the view NAME")
        m.drop_view(args.name, cascade=args.cascade)
        console.print(f"dropped view {m.schema}.{args.name}")
    else:
        rows = m.status(args.name)
        if args.json:
            sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
        elif args.name and not rows:
            raise IdivmError(f"no idivm view {args.name!r} in schema {m.schema!r}")
        else:
            console.print(_status_table(rows, m.schema))


def _datasets_table(out: dict[str, Any], title: str) -> Table:
    """What a pipeline run did (or, dry, would do) per dataset."""
    t = Table(title=title, title_style="bold")
    for c in ("dataset", "location", "refresh", "why", "seconds", "changes"):
        t.add_column(c)
    for d in out["datasets"]:
        changes = ", ".join(f"{k}: {v}" for k, v in (d.get("changes") or {}).items())
        secs = f"{d['seconds']:.3f}" if "seconds" in d else ""
        t.add_row(d["name"], d["location"], d["refresh"], d.get("why", ""), secs, changes)
    if out.get("left_alone"):
        t.caption = f"not in the project, left as they are: {', '.join(out['left_alone'])}"
    return t


def _stats_table(d: dict[str, Any]) -> Table:
    t = Table(title=f"maintenance of {d['view']}", title_style="bold")
    t.add_column("step")
    t.add_column("rows", justify="right")
    t.add_column("ms", justify="right")
    for table, n in d["changes"].items():
        t.add_row(f"effective changes of {table}", str(n), "")
    rows = {**d["idiff_rows"], **d["applied_rows"]}
    for name, secs in d["statement_seconds"]:
        label = name if name in d["idiff_rows"] else f"APPLY {name}"
        t.add_row(label, str(rows.get(name, "")), f"{secs * 1e3:.2f}")
    t.add_row("[bold]total[/bold]", "", f"[bold]{d['seconds'] * 1e3:.2f}[/bold]")
    decision = d.get("decision") or {}
    if decision.get("reason"):
        t.caption = f"{decision.get('strategy', decision.get('choice', ''))}: {decision['reason']}"
    return t


def _status_table(rows: list[dict[str, Any]], schema: str) -> Table:
    t = Table(title=f"idivm views in {schema}", title_style="bold")
    for c in ("view", "strategy", "reads views", "created", "last maintained", "runs",
              "pending log rows", "last refresh", "refreshes (id / recompute)"):
        t.add_column(c)
    for r in rows:
        pending = ", ".join(f"{k}: {v}" for k, v in r["pending_log_rows"].items())
        last = r.get("last_refresh") or {}
        eff = r.get("efficiency") or {}
        t.add_row(r["view"], r["strategy"], ", ".join(r.get("upstream") or ()) or "-",
                  r["created"], r["last_maintained"] or "never", str(r["runs"]), pending,
                  f"{last['strategy']}, {last['changes']} log rows, "
                  f"{last['seconds'] * 1e3:.1f} ms: {last['reason']}" if last else "-",
                  f"{eff.get('id_refreshes', 0)} / {eff.get('recompute_refreshes', 0)}")
    return t


def cmd_demo(args: argparse.Namespace) -> int:
    if args.postgres or args.dsn is not None:
        from idivm import demo

        return demo.run(args.dsn or _default_dsn())
    from idivm import demo_spark

    if args.scale <= 0:
        raise IdivmError("--scale must be positive")
    return demo_spark.run(warehouse=args.warehouse, master=args.master, scale=args.scale)


def cmd_bench(args: argparse.Namespace) -> int:
    from idivm.bench import plan_bench

    if args.repeat < 1:
        raise IdivmError("--repeat must be at least 1")
    plan_bench.run(args.repeat, args.out)
    return 0


def cmd_bench_sweep(args: argparse.Namespace) -> int:
    from idivm.bench import sweep

    if args.repeat < 1 or args.max_tables < 2:
        raise IdivmError("--repeat must be at least 1 and --max-tables at least 2")
    sweep.run(max_tables=args.max_tables, repeat=args.repeat, out=Path(args.out))
    return 0


def cmd_bench_tpch(args: argparse.Namespace) -> int:
    from idivm.bench import tpch_bench

    if args.sf <= 0 or args.rounds < 1 or args.warmup < 0:
        raise IdivmError("--sf must be positive, --rounds at least 1 and --warmup at least 0")
    return tpch_bench.run(sf=args.sf, queries=args.queries, rounds=args.rounds,
                          dsn=args.dsn, out=Path(args.out), keep=args.keep,
                          explain=args.explain, fk_indexes=not args.no_fk_indexes,
                          warmup=args.warmup)


def cmd_bench_dbt_suite(args: argparse.Namespace) -> int:
    from idivm.bench import dbt_suite

    root = Path(args.queries)
    if root.name == "queries" and root.parent.name == "test":  # its test/queries folder
        root = root.parent.parent
    if not (root / "test" / "queries").is_dir():
        raise IdivmError(f"{root} is not a dbtoaster-a5 checkout (no test/queries in it)")
    summary = dbt_suite.run(root, args.dsn, Path(args.out), verify_accepted=args.verify)
    return 1 if summary["verified"].get("no") else 0


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    from idivm.bench import pipeline_bench

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - {"pg", "spark"}:
        raise IdivmError("--backends is a comma-separated list of pg and spark")
    if args.sf <= 0 or args.rounds < 1:
        raise IdivmError("--sf must be positive and --rounds at least 1")
    return pipeline_bench.run(sf=args.sf, rounds=args.rounds, backends=backends, dsn=args.dsn,
                              out=args.out, driver_memory=args.driver_memory)


def cmd_bench_spark(args: argparse.Namespace) -> int:
    from idivm.bench import spark_bench

    if args.devices_parts < 100:
        raise IdivmError("--devices-parts must be at least 100")
    if args.fanout < 1 or not 0 < args.phones <= 1:
        raise IdivmError("--fanout must be at least 1 and --phones in (0, 1]")
    if args.buckets is not None and args.buckets < 1:
        raise IdivmError("--buckets must be at least 1")
    if args.repeat < 1:
        raise IdivmError("--repeat must be at least 1")
    return spark_bench.run(links=args.devices_parts, fanout=args.fanout, phones=args.phones,
                           updates=args.updates, repeat=args.repeat,
                           mixed_share=args.mixed_share, small_share=args.small_share,
                           out=args.out, buckets=args.buckets, master=args.master,
                           batches=args.batches,
                           driver_memory=args.driver_memory, warehouse=args.warehouse)


def cmd_bench_fresh(args: argparse.Namespace) -> int:
    from pathlib import Path

    from idivm.bench import fresh_bench

    unknown = [q for q in args.queries if q not in fresh_bench.QUERIES]
    if unknown:
        raise IdivmError(f"unknown queries {', '.join(unknown)}: choose from "
                         f"{', '.join(fresh_bench.QUERIES)}")
    if args.budget <= 0 or args.repeat < 1:
        raise IdivmError("--budget must be positive and --repeat at least 1")
    return fresh_bench.run(Path(args.out), args.queries or list(fresh_bench.QUERIES),
                           sf=args.sf, budget=args.budget, which=tuple(args.streams),
                           repeat=args.repeat)


def cmd_bench_pg(args: argparse.Namespace) -> int:
    from idivm.bench import pg_bench

    if any(n < 1000 for n in args.links):
        raise IdivmError("--links must be at least 1000")
    if args.repeat < 1 or args.floor_calls < 1:
        raise IdivmError("--repeat and --floor-calls must be at least 1")
    if args.scale <= 0:
        raise IdivmError("--scale must be positive")
    pg_bench.run(args.links, repeat=args.repeat, batches=args.batches, out=args.out,
                 dsn=args.dsn, keep=args.keep, scale=args.scale, floor_calls=args.floor_calls)
    return 0


# -- Spark (session helpers: idivm.spark.session) --------------------------------------------
CHANGE_COLUMNS = {"_change_type": "string", "_commit_version": "bigint"}


def read_data(spark: Any, path: str, table: Any, changes: bool = False) -> Any:
    """A DataFrame from a parquet or CSV file (or a directory of them); CSV columns are read
    with the catalog's types, named by the header line."""
    p = Path(path)
    if not p.exists():
        raise IdivmError(f"no such data file {path!r}")
    files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith(("_", ".")))\
        if p.is_dir() else [p]
    kinds = {f.suffix.lower() for f in files} & {".csv", ".parquet"}
    if len(kinds) != 1:
        raise IdivmError(f"{path!r}: expected .parquet or .csv file(s)")
    if kinds == {".parquet"}:
        return spark.read.parquet(str(p))
    first = next(f for f in files if f.suffix.lower() == ".csv")
    with first.open(newline="", encoding="utf-8-sig") as fh:
        header = next(csv.reader(fh), None)
    if not header:
        raise IdivmError(f"{str(first)!r}: empty CSV file (expected a header line)")
    from idivm.bench.data import spark_types

    types = spark_types(table) | (CHANGE_COLUMNS if changes else {})
    # a column the table lacks is read as text, so the maintainer can name it in its refusal
    fields = [f"`{n}` {types.get(n, 'string')}" for n in (h.strip() for h in header)]
    return (spark.read.option("header", True).option("mode", "FAILFAST")
            .schema(", ".join(fields)).csv(str(p)))


def cmd_spark(args: argparse.Namespace) -> int:
    if args.action == "pipeline":
        return _spark_pipeline(args)
    catalog = Catalog.from_ddl(_read(args.ddl, "DDL file"))
    registry = Path(args.warehouse) / "_idivm" / "registry.json"
    if args.action not in ("load", "attach") and not registry.exists():
        raise IdivmError(f"no idivm warehouse at {args.warehouse!r} "
                         "(idivm spark load or attach first)")
    from idivm.spark import SparkMaintainer

    m = SparkMaintainer(catalog, args.warehouse,
                        spark=spark_session(args.master, conf=driver_conf(True)),
                        buckets=args.buckets)
    _spark_action(m, args, Console())
    return 0


def _spark_pipeline(args: argparse.Namespace) -> int:
    """``idivm spark pipeline run|dry-run --spec PATH``."""
    from idivm.spark import project_run

    spec = project_run.load_spec(args.spec)
    if args.what == "dry-run":
        out = project_run.dry_run(spec, args.full_refresh)
        if out["refused"]:
            lines = "; ".join(f"{r['source']}: {r['reason']}" for r in out["refused"])
            out_text = f"refused (a run would do nothing): {lines}"
        else:
            out_text = ""
    else:
        out = project_run.run(spec, args.strategy, args.full_refresh, args.master)
        out_text = ""
    if args.json:
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
        return 0
    console = Console()
    if out_text:
        console.print(out_text)
    for d in out["datasets"]:
        d.setdefault("location", "(not created yet)" if args.what == "dry-run" else "")
    console.print(_datasets_table(out, f"pipeline {spec.name} ({spec.path})"))
    return 0


def _spark_action(m: Any, args: argparse.Namespace, console: Console) -> None:
    """One ``idivm spark`` action; raises IdivmError on failure."""
    from idivm.demo_spark import stats_table

    a = args.action
    if a == "load":
        table = m.catalog.table(args.table)
        m.load_table(table.name, read_data(m.spark, args.data, table))
        n = m.spark.table(table.name).count()
        console.print(f"loaded {table.name}: {n} rows into the Delta table "
                      f"{m.table_location(table.name)}")
    elif a == "attach":
        table = m.catalog.table(args.table)
        version = m.attach_delta(table.name, args.delta)
        console.print(f"attached {table.name}: the Delta table {m.table_location(table.name)} "
                      f"at version {version} (nothing copied; maintain reads its change feed)")
    elif a == "create-view":
        p = m.create_view(args.name, _read(args.sql_file, "view SQL file"),
                          changes=parse_changes(args.changes), strategy=args.strategy)
        console.print(f"created view {p.name} ({', '.join(p.columns)}): the Delta table "
                      f"{m.view_location(p.name)} (+ {len(p.materialized) - 1} cache(s)), "
                      f"{len(p.statements)} Δ-script statements, refresh {args.strategy}")
    elif a == "apply-changes":
        table = m.catalog.table(args.table)
        version = m.apply_changes(table.name, read_data(m.spark, args.data, table, changes=True))
        pending = [r["view"] for r in m.status() if r["pending_versions"].get(table.name)]
        console.print(f"committed the changes of {table.name} as version {version}; views to "
                      f"maintain: {', '.join(pending) or 'none'}")
    elif a == "maintain":
        if bool(args.name) == bool(args.all):
            raise IdivmError("maintain needs the view NAME, or --all (every view)")
        if args.all:
            every = m.maintain_all(strategy=args.strategy)
            if args.json:
                sys.stdout.write(json.dumps({k: v.as_dict() for k, v in every.items()},
                                            indent=2, default=str) + "\n")
            for st in every.values() if not args.json else ():
                console.print(stats_table(st))
            return
        stats = m.maintain(args.name, strategy=args.strategy)
        if args.json:
            sys.stdout.write(json.dumps(stats.as_dict(), indent=2, default=str) + "\n")
        else:
            for up in stats.upstream.values():
                console.print(stats_table(up))
            console.print(stats_table(stats))
    elif a == "read":
        if args.limit < 0:
            raise IdivmError("--limit must not be negative")
        df = m.read_view(args.name)
        rows = df.orderBy(*df.columns).limit(args.limit).collect()
        if args.json:
            sys.stdout.write(json.dumps([r.asDict() for r in rows], indent=2, default=str)
                             + "\n")
        else:
            t = Table(title=f"{args.name} (first {args.limit} rows, ordered)", title_style="bold")
            for c in df.columns:
                t.add_column(c)
            for r in rows:
                t.add_row(*("NULL" if v is None else str(v) for v in r))
            console.print(t)
    elif a == "drop-view":
        m.drop_view(args.name, cascade=args.cascade)
        console.print(f"dropped view {args.name}")
    else:
        rows = m.status()
        if args.name:
            rows = [r for r in rows if r["view"] == args.name]
            if not rows:
                raise IdivmError(f"no idivm view {args.name!r} in {args.warehouse!r}")
        tables = {t: {"version": m.table_version(t), "location": m.table_location(t),
                      "attached": bool(e.get("delta"))}
                  for t, e in sorted(m.registry()["tables"].items())}
        if args.json:
            sys.stdout.write(json.dumps({"tables": tables, "views": rows}, indent=2,
                                        default=str) + "\n")
            return
        t = Table(title=f"idivm views in {m.root}", title_style="bold")
        for c in ("view", "refresh", "watermarks (table: version)", "pending versions",
                  "last refresh"):
            t.add_column(c)
        for r in rows:
            last = r["last_refresh"]
            t.add_row(r["view"], r["strategy"],
                      ", ".join(f"{k}: {v}" for k, v in r["watermarks"].items()),
                      ", ".join(f"{k}: {v}" for k, v in r["pending_versions"].items() if v)
                      or "none",
                      f"{last['choice']} in {last['seconds']:.2f} s: {last['reason']}"
                      if last else "-")
        console.print(t)
        console.print("tables (Delta version): " + ", ".join(
            f"{k}: {e['version']}" + (f" (attached {e['location']})" if e["attached"] else "")
            for k, e in tables.items()))


# -- parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idivm", description="ID-based incremental view maintenance (SIGMOD 2015 idIVM).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    changes_help = ("declared modifications, TABLE=KIND[,KIND...] with KIND insert, delete, "
                    "update or update:col1,col2; repeatable; tables not named never change "
                    "(default: every modification of every table)")
    strategy_help = ("maintenance strategy: id (ID-based i-diffs, the default), tuple "
                     "(tuple-based t-diffs, the paper's baseline) or recompute")

    p = sub.add_parser("plan", help="print a view's Δ-script (or its annotated plan)")
    p.add_argument("--ddl", required=True, help="file with the CREATE TABLE statements (or -)")
    p.add_argument("--view", required=True, help="file with the view's SELECT (or - for stdin)")
    p.add_argument("--name", default="v", help="view name (default: v)")
    p.add_argument("--dialect", choices=("postgres", "spark"), default="postgres",
                   help="SQL dialect of the Δ-script (the view is read as PostgreSQL)")
    p.add_argument("--explain", action="store_true",
                   help="print IDs per operator, i-diff schemas and rules instead of SQL")
    p.add_argument("--changes", action="append", metavar="TABLE=KINDS", help=changes_help)
    p.add_argument("--strategy", choices=STRATEGIES, default="id", help=strategy_help)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("pg", help="maintain views on PostgreSQL")
    p.add_argument("action", choices=("create-view", "maintain", "drop-view", "status",
                                      "pipeline"))
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="view name (optional for status); pipeline: run or dry-run")
    p.add_argument("path", nargs="?", metavar="DIR",
                   help="pipeline: a folder whose **/*.sql files declare the views "
                   "(CREATE MATERIALIZED VIEW name AS SELECT …), maintained in dependency "
                   "order")
    p.add_argument("--dsn", default=_default_dsn(),
                   help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    p.add_argument("--schema", help="schema of the base tables and view (default: current)")
    p.add_argument("--sql-file", help="create-view: file with the view SQL (or -)")
    p.add_argument("--changes", action="append", metavar="TABLE=KINDS", help=changes_help)
    p.add_argument("--json", action="store_true", help="maintain/status: print JSON")
    p.add_argument("--strategy", choices=("auto", *STRATEGIES),
                   help="create-view: " + strategy_help + ", or auto (each maintain runs the "
                   "ID-based Δ-script or recomputes, whichever the cost model estimates "
                   "cheaper); maintain: this refresh's strategy (default: the view's)")
    p.add_argument("--all", action="store_true",
                   help="maintain: every view, in dependency order, in one transaction")
    p.add_argument("--every", type=float, metavar="SECONDS",
                   help="maintain: again every SECONDS in this one session (its compiled "
                   "code and plans stay warm) until Ctrl-C or --times; with --json, one "
                   "line of JSON a refresh")
    p.add_argument("--times", type=int, metavar="N", help="maintain --every: stop after N")
    p.add_argument("--cascade", action="store_true",
                   help="drop-view: also drop the views that read it")
    p.set_defaults(func=cmd_pg)

    spark_common = argparse.ArgumentParser(add_help=False)
    spark_common.add_argument("--warehouse", required=True, metavar="DIR",
                              help="directory of idivm's Delta tables (base tables loaded "
                              "through idivm, caches, views) and its registry")
    spark_common.add_argument("--ddl", required=True,
                              help="file with the CREATE TABLE statements (or -)")
    spark_common.add_argument("--master", metavar="URL",
                              help="Spark master (default: embedded local[*] on loopback; "
                              "other masters need --warehouse on storage every node shares)")
    spark_common.add_argument("--buckets", type=int, metavar="N",
                              help="create-view: hash buckets per cache or view "
                              "(default: one per 2000 rows, a power of two, at most 1024)")
    p = sub.add_parser("spark", help="maintain views on Spark from change feeds (Delta CDF shape)")
    sp = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = sp.add_parser("load", parents=[spark_common], help="initial contents of a base table")
    a.add_argument("table", metavar="TABLE")
    a.add_argument("--data", required=True, help="a .parquet or .csv file (CSV with a header)")
    a = sp.add_parser("attach", parents=[spark_common],
                      help="register your Delta table (Change Data Feed on) as a base table")
    a.add_argument("table", metavar="TABLE")
    a.add_argument("--delta", required=True, metavar="PATH", help="the Delta table's location")
    refresh_help = ("refresh strategy: auto (the default: each refresh maintains or "
                    "recomputes, whichever is estimated cheaper), id (always the ID-based "
                    "Δ-script), tuple (t-diffs, the paper's baseline) or recompute")
    a = sp.add_parser("create-view", parents=[spark_common], help="materialize a view")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--sql-file", required=True, help="file with the view SQL (or -)")
    a.add_argument("--changes", action="append", metavar="TABLE=KINDS", help=changes_help)
    a.add_argument("--strategy", choices=("auto", *STRATEGIES), default="auto",
                   help=refresh_help)
    a = sp.add_parser("apply-changes", parents=[spark_common],
                      help="commit a change batch (columns + _change_type [+ _commit_version]) to "
                      "a table loaded through idivm")
    a.add_argument("table", metavar="TABLE")
    a.add_argument("--data", required=True, help="a .parquet or .csv file (CSV with a header)")
    a = sp.add_parser("maintain", parents=[spark_common],
                      help="bring a view up to date (and the views it reads, first)")
    a.add_argument("name", nargs="?", metavar="NAME")
    a.add_argument("--all", action="store_true",
                   help="every view, in dependency order, at one set of base-table versions")
    a.add_argument("--strategy", choices=("auto", "id", "recompute"),
                   help="this refresh only: force maintenance (id) or recomputation, or "
                   "estimate (auto); default: the view's")
    a.add_argument("--json", action="store_true", help="print the statistics as JSON")
    a = sp.add_parser("status", parents=[spark_common], help="watermarks and pending changes")
    a.add_argument("name", nargs="?", metavar="NAME")
    a.add_argument("--json", action="store_true", help="print JSON")
    a = sp.add_parser("read", parents=[spark_common], help="print a view's rows")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--limit", type=int, default=20, help="rows to print (default: 20)")
    a.add_argument("--json", action="store_true", help="print JSON")
    a = sp.add_parser("pipeline", help="a Spark Declarative Pipelines project "
                      "(spark-pipeline.yml + SQL files), refreshed incrementally")
    a.add_argument("what", choices=("run", "dry-run"),
                   help="run: create, re-create and refresh its datasets; dry-run: print the "
                   "graph and what a run would do, and why")
    a.add_argument("--spec", required=True, metavar="PATH",
                   help="the project folder, or its spark-pipeline.yml/.yaml")
    a.add_argument("--strategy", choices=("auto", "id", "recompute"),
                   help="refresh strategy of the datasets it creates (default: auto) and of "
                   "this run's refreshes (default: each dataset's own)")
    a.add_argument("--full-refresh", action="store_true",
                   help="recompute every dataset (as spark-pipelines' flag does)")
    a.add_argument("--master", metavar="URL", help="Spark master (default: embedded)")
    a.add_argument("--json", action="store_true", help="print JSON")
    a = sp.add_parser("drop-view", parents=[spark_common], help="drop a view and its caches")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--cascade", action="store_true", help="also drop the views that read it")
    p.set_defaults(func=cmd_spark)

    p = sub.add_parser("demo", help="BSMA-like views maintained on Spark, verified "
                       "(--postgres: the paper's running example on PostgreSQL)")
    p.add_argument("--postgres", action="store_true",
                   help="run the paper's running example on PostgreSQL instead")
    p.add_argument("--dsn", default=None,
                   help="PostgreSQL DSN, implies --postgres (default: $IDIVM_DSN or the local "
                   "server)")
    p.add_argument("--warehouse", metavar="DIR",
                   help="Spark warehouse directory (default: a temporary one, removed after)")
    p.add_argument("--master", metavar="URL", help="Spark master (default: embedded local[*])")
    p.add_argument("--scale", type=float, default=10.0,
                   help="data size, 1 = 2,000 users and 20,000 posts (default: 10)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    b = bench.add_parser("plan", help="median planning time per view")
    b.add_argument("--repeat", type=int, default=20, help="runs per view (default: 20)")
    b.add_argument("--out", default="bench_out/plan.json", help="JSON report path")
    b.set_defaults(func=cmd_bench)
    b = bench.add_parser("sweep", help="planner growth: chain and star joins of 2…N tables, "
                         "plan time and Δ-script size")
    b.add_argument("--max-tables", type=int, default=12, help="largest join (default: 12)")
    b.add_argument("--repeat", type=int, default=3, help="plans per point, median reported "
                   "(default: 3)")
    b.add_argument("--out", default="bench_out/sweep", help="directory of the JSON and PNG")
    b.set_defaults(func=cmd_bench_sweep)
    b = bench.add_parser("tpch", help="TPC-H views on PostgreSQL: plan, create, maintain "
                         "(id / tuple) vs recompute, REFRESH MATERIALIZED VIEW and pg_ivm under "
                         "RF1/RF2 refresh batches and updates")
    b.add_argument("--sf", type=float, default=0.1, help="TPC-H scale factor (default: 0.1)")
    b.add_argument("--queries", type=int, nargs="+", default=None, metavar="N",
                   help="query numbers (default: all 22)")
    b.add_argument("--rounds", type=int, default=3, help="refresh rounds per query (default: 3)")
    b.add_argument("--warmup", type=int, default=2,
                   help="rounds before the timed ones, every column maintained and verified, "
                   "out of the medians: a refresh job's session is warm after its first "
                   "refreshes (default: 2)")
    b.add_argument("--out", default="bench_out/tpch", help="directory of the JSON and PNG")
    b.add_argument("--dsn", default=_default_dsn(),
                   help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    b.add_argument("--keep", action="store_true",
                   help="keep the benchmark schema (default: dropped at the end and on error)")
    b.add_argument("--explain", action="store_true",
                   help="after its rounds, maintain each query's id view once more (untimed) "
                   "under auto_explain: every statement's plan, rows and buffers in the JSON")
    b.add_argument("--no-fk-indexes", action="store_true",
                   help="no indexes on the foreign keys (default: indexed, as TPC-H allows, "
                   "for every strategy and pg_ivm's copy)")
    b.set_defaults(func=cmd_bench_tpch)
    b = bench.add_parser("dbt-suite", help="acceptance of DBToaster's query suite (tpch, "
                         "finance, simple; keys added), refusals checked against PostgreSQL")
    b.add_argument("--queries", required=True, metavar="DIR",
                   help="a checkout of github.com/dbtoaster/dbtoaster-a5")
    b.add_argument("--out", default="bench_out/dbt_suite", help="directory of the JSON")
    b.add_argument("--dsn", default=_default_dsn(),
                   help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    b.add_argument("--verify", action="store_true",
                   help="maintain every accepted query on PostgreSQL over random changes and "
                   "compare it with its recomputation")
    b.set_defaults(func=cmd_bench_dbt_suite)
    b = bench.add_parser("pipeline", help="a three-level TPC-H pipeline (views over views): "
                         "idivm vs recomputing every dataset, on PostgreSQL and Spark")
    b.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default: 1)")
    b.add_argument("--rounds", type=int, default=2, help="batches (default: 2)")
    b.add_argument("--backends", default="pg,spark", help="pg, spark or both (default)")
    b.add_argument("--dsn", default=_default_dsn(), help="PostgreSQL DSN")
    b.add_argument("--driver-memory", default="8g", help="Spark driver memory (default: 8g)")
    b.add_argument("--out", type=Path, default=Path("bench_out/pipeline"),
                   help="directory of the JSON and PNG (default: bench_out/pipeline)")
    b.set_defaults(func=cmd_bench_pipeline)
    b = bench.add_parser("spark", help="parts/devices (paper §7.2): maintain vs recompute on "
                         "Spark")
    b.add_argument("--devices-parts", type=int, default=5_000_000, metavar="N",
                   help="devices_parts rows (default: 5,000,000; devices = parts = N / fanout)")
    b.add_argument("--fanout", type=int, default=10, help="parts per device (default: 10)")
    b.add_argument("--repeat", type=int, default=3,
                   help="rounds of each batch, each a fresh batch; times are medians "
                   "(default: 3)")
    b.add_argument("--phones", type=float, default=0.2,
                   help="share of devices that are phones (default: 0.2)")
    b.add_argument("--updates", type=int, default=200,
                   help="price updates in batch (a) (default: 200)")
    b.add_argument("--small-share", type=float, default=0.001,
                   help="batch (b) size as a share of devices_parts rows (default: 0.001)")
    b.add_argument("--mixed-share", type=float, default=0.01,
                   help="batch (c) size as a share of devices_parts rows (default: 0.01)")
    b.add_argument("--batches", default="abc",
                   help="which batches to run, any of: (a) price updates, (b) small mixed, "
                   "(c) large mixed (default: abc)")
    b.add_argument("--buckets", type=int, metavar="N",
                   help="hash buckets per stored relation (default: one per 2000 rows, "
                   "at most 1024)")
    b.add_argument("--out", default="bench_out/spark", help="directory of the JSON and PNG")
    b.add_argument("--warehouse", metavar="DIR",
                   help="warehouse directory (default: a temporary one, removed after)")
    b.add_argument("--master", metavar="URL", help="Spark master (default: embedded local[*])")
    b.add_argument("--driver-memory", default="8g",
                   help="spark.driver.memory of the embedded session (default: 8g)")
    b.set_defaults(func=cmd_bench_spark)
    b = bench.add_parser("fresh", help="fresh views (C++ triggers) on DBToaster's finance and "
                         "TPC-H streams: higher-order vs first-order vs re-evaluation")
    b.add_argument("queries", nargs="*", metavar="QUERY",
                   help="Q3 Q11core SSB4 Q11 Q17 Q18 Q22 AXF BSP BSV PSP VWAP MST (default: "
                   "all)")
    b.add_argument("--sf", type=float, default=0.1,
                   help="also replay TPC-H at this scale, generated with DuckDB (0 = only the "
                   "shipped streams; default: 0.1)")
    b.add_argument("--budget", type=float, default=5.0,
                   help="seconds per depth-0 / depth-1 replay before it stops (default: 5)")
    b.add_argument("--repeat", type=int, default=3,
                   help="replays per program and stream; the median rate is quoted (default 3)")
    b.add_argument("--streams", nargs="*", default=["finance", "tpch"],
                   choices=("finance", "tpch"))
    b.add_argument("--out", default="bench_out/fresh", help="directory of the JSON and PNG")
    b.set_defaults(func=cmd_bench_fresh)
    b = bench.add_parser("pg", help="parts/devices on PostgreSQL: id / tuple / recompute "
                         "maintenance vs REFRESH MATERIALIZED VIEW vs the physical limit")
    b.add_argument("--links", "--sizes", type=int, nargs="+", default=[500_000, 2_000_000],
                   metavar="N", help="devices_parts rows per size (devices = parts = N / 10; "
                   "default: 500000 2000000)")
    b.add_argument("--repeat", type=int, default=5,
                   help="rounds per batch, each a fresh batch; medians and min–max are "
                   "reported (default: 5)")
    b.add_argument("--batches", nargs="+", default=["1", "200", "20000", "200x1", "mixed"],
                   choices=("1", "200", "20000", "200x1", "mixed"), metavar="BATCH",
                   help="1, 200, 20000 (price updates in one UPDATE), 200x1 (200 single-row "
                   "UPDATEs in one transaction), mixed (~1,000 link inserts/deletes, price "
                   "updates, category flips) (default: all)")
    b.add_argument("--scale", type=float, default=1.0,
                   help="multiply the batch sizes (default: 1)")
    b.add_argument("--floor-calls", type=int, default=20,
                   help="maintain calls per floor measurement (default: 20)")
    b.add_argument("--out", default="bench_out/pg", help="directory of the JSON and PNG")
    b.add_argument("--dsn", default=_default_dsn(),
                   help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    b.add_argument("--keep", action="store_true",
                   help="keep the benchmark schemas (default: dropped at the end and on error)")
    b.set_defaults(func=cmd_bench_pg)

    from idivm.fuzz.command import add_parser as add_fuzz_parser

    add_fuzz_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for idivm errors, printed without a traceback)."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except IdivmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except psycopg.Error as e:
        print(f"error: PostgreSQL: {str(e).strip()}", file=sys.stderr)
        return 2
    except Exception as e:
        if not _is_spark_error(e):
            raise
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        print(f"error: Spark: {' '.join(lines[:3])}", file=sys.stderr)
        return 2
    return code


def _is_spark_error(e: BaseException) -> bool:
    """A failure Spark reports (bad data, an unreadable file), not a bug of idivm's."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark.errors import PySparkException

    return isinstance(e, PySparkException)


if __name__ == "__main__":
    sys.exit(main())
