"""``python -m bench_bsma run|sweep …`` (see README.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from bench_bsma.views import VIEWS_BY_NAME
from bench_bsma.workloads import WORKLOADS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench_bsma",
                                 description="BSMA views and the paper's §7 experiments: "
                                 "ID-based vs tuple-based vs recompute, side by side")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the eight BSMA views under every strategy (Figure 10)")
    r.add_argument("--backend", choices=("postgres", "spark"), required=True)
    r.add_argument("--sf", type=float, default=None,
                   help="scale factor (default: 0.002 on PostgreSQL, 0.001 on Spark)")
    r.add_argument("--out", type=Path, default=None, help="output directory "
                   "(default: bench_out/bsma_<backend>)")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--views", nargs="*", choices=sorted(VIEWS_BY_NAME), default=[])
    r.add_argument("--workloads", nargs="*", choices=WORKLOADS, default=None,
                   help="default: all on PostgreSQL; the paper's User workload on Spark (each "
                   "Spark maintenance costs a few Spark jobs whatever the data size, so every "
                   "added workload costs minutes)")
    r.add_argument("--strategies", nargs="*", choices=("id", "tuple", "recompute"),
                   default=["id", "tuple", "recompute"])
    r.add_argument("--repeat", type=int, default=3, help="batches per workload (median)")
    r.add_argument("-d", type=int, default=100, help="changes per batch (default: 100, "
                   "the paper's User workload)")
    r.add_argument("--d-sweep", type=int, nargs="*", default=None,
                   help="also run the User workload at these diff sizes (default on "
                   "PostgreSQL: 500)")
    r.add_argument("--warmup", type=int, default=None,
                   help="User-workload batches before the measured ones, every view maintained "
                   "and verified, not measured (default: 1 on PostgreSQL, 0 on Spark)")
    r.add_argument("--no-cold", action="store_true",
                   help="PostgreSQL: skip the cold pass (server restart, OS caches dropped)")
    r.add_argument("--dsn", help="PostgreSQL DSN (default: $IDIVM_DSN or the local server)")
    r.add_argument("--master", help="Spark master (default: embedded local[*])")
    s = sub.add_parser("sweep", help="the §7.2 parts/devices sweeps (Figures 11, 12)")
    s.add_argument("--backend", choices=("postgres", "spark"), required=True)
    s.add_argument("--params", nargs="*", choices=("d", "j", "s", "f"),
                   default=["d", "j", "s", "f"])
    s.add_argument("--links", type=int, default=None,
                   help="devices_parts rows (default: 1M on PostgreSQL, 1M on Spark)")
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--out", type=Path, default=None,
                   help="output directory (default: bench_out/sweep_<backend>)")
    s.add_argument("--dsn")
    s.add_argument("--master")
    args = ap.parse_args(argv)
    console = Console()
    if args.command == "run":
        from bench_bsma.run import run

        sf = args.sf if args.sf is not None else (0.002 if args.backend == "postgres" else 0.001)
        d_sweep = args.d_sweep if args.d_sweep is not None else (
            [500] if args.backend == "postgres" else [])
        report = run(args.backend, sf, args.out or Path(f"bench_out/bsma_{args.backend}"),
                     seed=args.seed, views=args.views,
                     workloads=args.workloads if args.workloads is not None else (
                         list(WORKLOADS) if args.backend == "postgres" else ["users"]),
                     strategies=args.strategies, repeat=args.repeat, d=args.d,
                     d_sweep=d_sweep, cold=not args.no_cold, dsn=args.dsn,
                     master=args.master, console=console,
                     warmup=args.warmup if args.warmup is not None else (
                         1 if args.backend == "postgres" else 0))
        bad = [m for m in report["measurements"] if not m["verified"]]
        return 1 if bad else 0
    from bench_bsma.sweeps import sweep

    report = sweep(args.backend, args.params, args.out or Path(f"bench_out/sweep_{args.backend}"),
                   links=args.links, repeat=args.repeat, dsn=args.dsn, master=args.master,
                   console=console)
    return 0 if report["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
