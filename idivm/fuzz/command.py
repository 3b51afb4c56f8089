"""``idivm fuzz``: the parser entry and the command (the CLI only registers it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from idivm.fuzz.run import BACKENDS, FuzzOptions, Summary, fuzz
from idivm.fuzz.schema import FuzzConfig


def add_parser(sub: Any) -> None:
    """Register ``fuzz`` on the CLI's sub-parsers."""
    p = sub.add_parser("fuzz", help="random-view differential fuzzing of a backend: random "
                       "schemas, views and change rounds, each view compared with its "
                       "recomputation")
    p.add_argument("--backend", choices=BACKENDS, default="pg")
    p.add_argument("--seed", type=int, default=0, help="first seed (default: 0)")
    p.add_argument("--views", type=int, default=20, help="views to generate (default: 20)")
    p.add_argument("--rounds", type=int, default=3, help="change rounds per seed (default: 3)")
    p.add_argument("--views-per-seed", type=int, default=5,
                   help="views sharing one seed's schema and rounds (default: 5)")
    p.add_argument("--strategy", nargs="+", choices=("id", "tuple", "auto"),
                   help="strategies (default: id tuple auto on pg, id auto on spark)")
    p.add_argument("--dsn", default=os.environ.get(
        "IDIVM_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL DSN (the pg backend; the reference of spark and fresh)")
    p.add_argument("--out", metavar="DIR", help="directory of summary.json and the findings")
    p.add_argument("--markdown", metavar="FILE", help="append each distinct finding to FILE")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="statement timeout in seconds: longer is a hang (default: 20)")
    p.add_argument("--no-shrink", action="store_true", help="report findings unshrunk")
    p.add_argument("--shrink-seconds", type=float, default=90.0,
                   help="time budget per finding's shrinking (default: 90)")
    p.add_argument("--depth", type=int, default=2, help="subquery nesting depth (default: 2)")
    p.add_argument("--json-columns", action="store_true", help="generate json columns")
    p.add_argument("--inheritance", action="store_true", help="generate inheritance children")
    p.add_argument("--no-nested-with", action="store_true",
                   help="no WITH inside derived tables, CTEs or subqueries")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_fuzz)


def cmd_fuzz(args: argparse.Namespace) -> int:
    opts = FuzzOptions(
        backend=args.backend, seed=args.seed, views=args.views, rounds=args.rounds,
        views_per_seed=args.views_per_seed, strategies=tuple(args.strategy or ()),
        dsn=args.dsn, out=Path(args.out) if args.out else None,
        timeout_ms=int(args.timeout * 1000), shrink=not args.no_shrink,
        shrink_seconds=args.shrink_seconds,
        markdown=Path(args.markdown) if args.markdown else None,
        config=FuzzConfig(json=args.json_columns, inheritance=args.inheritance,
                          max_depth=args.depth, nested_with=not args.no_nested_with))
    console = Console(stderr=args.json)
    with Progress(TextColumn("[bold]fuzz {task.fields[backend]}[/] seed {task.fields[seed]}"),
                  BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}"), console=console,
                  transient=args.json) as bar:
        task = bar.add_task("fuzz", total=opts.views, backend=opts.backend, seed=opts.seed,
                            status="")

        def progress(seed: int, s: Summary) -> None:
            status = f"accepted {s.accepted}/{s.valid}, findings {len(s.findings)}"
            bar.update(task, completed=s.generated, seed=seed, status=status)
            if not console.is_terminal:
                print(f"seed {seed}: {s.generated}/{opts.views} views, {status}",
                      file=sys.stderr, flush=True)

        summary = fuzz(opts, progress)
    if args.json:
        sys.stdout.write(json.dumps(summary.as_dict(), indent=2, default=str) + "\n")
    else:
        console.print(summary_table(summary))
        for f in summary.findings:
            console.print(f"[red]{f['kind']}[/red] seed {f['seed']} {f['strategy']}: "
                          f"{f['detail'][:160]}\n  {f['view']}")
    return 1 if summary.findings else 0


def summary_table(s: Summary) -> Table:
    t = Table(title=f"idivm fuzz --backend {s.backend}: seeds {s.seeds[0]}–{s.seeds[1]}, "
              f"{s.seconds:.0f} s", title_style="bold")
    t.add_column("count")
    t.add_column("views", justify="right")
    share = f" ({s.accepted / s.valid:.0%} of valid)" if s.valid else ""
    rows = [("generated", s.generated), ("invalid (PostgreSQL rejects)", s.invalid),
            ("valid", s.valid), ("accepted" + share, s.accepted),
            ("refused (documented construct)", s.refused)]
    for label, n in rows:
        t.add_row(label, str(n))
    t.add_section()
    t.add_row("[bold]per view and strategy[/bold]", "")
    for kind in ("mismatch", "crash", "hang", "refusal"):
        label = {"refusal": "refusals outside the README's list", "mismatch": "mismatches",
                 "crash": "crashes", "hang": "hangs"}[kind]
        t.add_row(label, str(s.count(kind)))
    t.add_row("distinct findings (shrunk)", str(len(s.findings)))
    if s.harness_errors:
        t.add_row("[yellow]seeds skipped (the harness's setup failed)[/yellow]",
                  str(len(s.harness_errors)))
    for construct, n in s.refused_by.most_common(8):
        t.add_row(f"  refused: {construct}", str(n))
    return t
