"""``idivm`` command line: plan views, drive the PostgreSQL backend, run the demo and benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
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
from idivm.postgres import PostgresMaintainer

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
             changes=parse_changes(args.changes))
    text = p.explain() if args.explain else p.script_text(args.dialect)
    sys.stdout.write(text.rstrip("\n") + "\n")
    return 0


def cmd_pg(args: argparse.Namespace) -> int:
    console = Console()
    with PostgresMaintainer(args.dsn, schema=args.schema) as m:
        _pg_action(m, args, console)
        # A registry read outside maintain()'s own transaction block leaves psycopg inside an
        # implicit transaction, which turns that block into a savepoint; commit the outer one.
        if m.conn.info.transaction_status == TransactionStatus.INTRANS:
            m.conn.commit()
    return 0


def _pg_action(m: PostgresMaintainer, args: argparse.Namespace, console: Console) -> None:
    """One ``idivm pg`` action; raises IdivmError on failure."""
    if args.action == "create-view":
        if not args.name:
            raise IdivmError("create-view needs the view NAME")
        if not args.sql_file:
            raise IdivmError("create-view needs --sql-file (a file with the view SQL, or -)")
        p = m.create_view(args.name, _read(args.sql_file, "view SQL file"),
                          changes=parse_changes(args.changes))
        console.print(f"created view {m.schema}.{p.name} ({', '.join(p.columns)}): "
                      f"{len(p.materialized)} stored relation(s) in {m.companion}, "
                      f"{len(p.statements)} Δ-script statements")
    elif args.action == "maintain":
        if not args.name:
            raise IdivmError("maintain needs the view NAME")
        stats = m.maintain(args.name)
        if args.json:
            sys.stdout.write(json.dumps(stats.as_dict(), indent=2, default=str) + "\n")
        else:
            console.print(_stats_table(stats.as_dict()))
    elif args.action == "drop-view":
        if not args.name:
            raise IdivmError("drop-view needs the view NAME")
        m.drop_view(args.name)
        console.print(f"dropped view {m.schema}.{args.name}")
    else:
        rows = m.status(args.name)
        if args.json:
            sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
        elif args.name and not rows:
            raise IdivmError(f"no idivm view {args.name!r} in schema {m.schema!r}")
        else:
            console.print(_status_table(rows, m.schema))


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
    return t


def _status_table(rows: list[dict[str, Any]], schema: str) -> Table:
    t = Table(title=f"idivm views in {schema}", title_style="bold")
    for c in ("view", "created", "last maintained", "runs", "pending log rows"):
        t.add_column(c)
    for r in rows:
        pending = ", ".join(f"{k}: {v}" for k, v in r["pending_log_rows"].items())
        t.add_row(r["view"], r["created"], r["last_maintained"] or "never", str(r["runs"]),
                  pending)
    return t


def cmd_demo(args: argparse.Namespace) -> int:
    from idivm import demo

    return demo.run(args.dsn)


def cmd_bench(args: argparse.Namespace) -> int:
    from idivm.bench import plan_bench

    if args.repeat < 1:
        raise IdivmError("--repeat must be at least 1")
    plan_bench.run(args.repeat, args.out)
    return 0


# -- parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idivm", description="ID-based incremental view maintenance (SIGMOD 2015 idIVM).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    changes_help = ("declared modifications, TABLE=KIND[,KIND...] with KIND insert, delete, "
                    "update or update:col1,col2; repeatable; tables not named never change "
                    "(default: every modification of every table)")

    p = sub.add_parser("plan", help="print a view's Δ-script (or its annotated plan)")
    p.add_argument("--ddl", required=True, help="file with the CREATE TABLE statements (or -)")
    p.add_argument("--view", required=True, help="file with the view's SELECT (or - for stdin)")
    p.add_argument("--name", default="v", help="view name (default: v)")
    p.add_argument("--dialect", choices=("postgres", "spark"), default="postgres",
                   help="SQL dialect of the Δ-script (the view is read as PostgreSQL)")
    p.add_argument("--explain", action="store_true",
                   help="print IDs per operator, i-diff schemas and rules instead of SQL")
    p.add_argument("--changes", action="append", metavar="TABLE=KINDS", help=changes_help)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("pg", help="maintain views on PostgreSQL")
    p.add_argument("action", choices=("create-view", "maintain", "drop-view", "status"))
    p.add_argument("name", nargs="?", metavar="NAME", help="view name (optional for status)")
    p.add_argument("--dsn", default=_default_dsn(),
                   help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    p.add_argument("--schema", help="schema of the base tables and view (default: current)")
    p.add_argument("--sql-file", help="create-view: file with the view SQL (or -)")
    p.add_argument("--changes", action="append", metavar="TABLE=KINDS", help=changes_help)
    p.add_argument("--json", action="store_true", help="maintain/status: print JSON")
    p.set_defaults(func=cmd_pg)

    p = sub.add_parser("demo", help="the paper's running example on PostgreSQL")
    p.add_argument("--dsn", default=_default_dsn(),
                   help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    b = bench.add_parser("plan", help="median planning time per view")
    b.add_argument("--repeat", type=int, default=20, help="runs per view (default: 20)")
    b.add_argument("--out", default="bench_out/plan.json", help="JSON report path")
    b.set_defaults(func=cmd_bench)
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
    return code


if __name__ == "__main__":
    sys.exit(main())
