"""The ``idivm fuzz`` driver: generate cases from consecutive seeds, run them through a
backend's oracle, count, shrink and report findings, write a JSON summary."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from idivm.fuzz.oracle import Outcome, run_pg
from idivm.fuzz.schema import FuzzConfig
from idivm.fuzz.shrink import Repro, shrink
from idivm.fuzz.workload import Case, random_case

BACKENDS = ("pg", "spark", "fresh")
DEFAULT_STRATEGIES = {"pg": ("id", "tuple", "auto"), "spark": ("id", "auto"), "fresh": ("auto",)}


@dataclass
class FuzzOptions:
    backend: str = "pg"
    seed: int = 0
    views: int = 20
    rounds: int = 3
    views_per_seed: int = 5
    strategies: tuple[str, ...] = ()
    dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    out: Path | None = None
    timeout_ms: int = 20_000
    shrink: bool = True
    shrink_seconds: float = 90.0
    markdown: Path | None = None
    config: FuzzConfig = field(default_factory=FuzzConfig)

    def strategy_list(self) -> tuple[str, ...]:
        return self.strategies or DEFAULT_STRATEGIES[self.backend]


@dataclass
class Summary:
    backend: str
    seeds: tuple[int, int] = (0, -1)
    generated: int = 0
    invalid: int = 0
    accepted: int = 0  # valid views every strategy created and kept correct through the rounds
    refused: int = 0  # valid views refused (documented construct) by some strategy
    outcomes: Counter[str] = field(default_factory=Counter)  # per (view, strategy)
    refused_by: Counter[str] = field(default_factory=Counter)
    findings: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    harness_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def valid(self) -> int:
        return self.generated - self.invalid

    def count(self, kind: str) -> int:
        return self.outcomes[kind]

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "seeds": list(self.seeds), "generated": self.generated,
            "invalid": self.invalid, "valid": self.valid, "accepted": self.accepted,
            "refused": self.refused,
            "accepted_share": round(self.accepted / self.valid, 4) if self.valid else None,
            "outcomes": dict(self.outcomes), "refused_by": dict(self.refused_by),
            "mismatches": self.outcomes["mismatch"], "crashes": self.outcomes["crash"],
            "hangs": self.outcomes["hang"], "undocumented_refusals": self.outcomes["refusal"],
            "distinct_findings": len(self.findings), "duplicate_findings": self.duplicates,
            "harness_errors": self.harness_errors,
            "seconds": round(self.seconds, 1), "findings": self.findings,
        }


Oracle = Callable[[Case, Sequence[str], FuzzOptions], list[list[Outcome]]]


def pg_oracle(case: Case, strategies: Sequence[str], opts: FuzzOptions) -> list[list[Outcome]]:
    return run_pg(opts.dsn, case.schema, case.setup, case.views, strategies, case.rounds,
                  opts.timeout_ms)


def pg_reproducer(opts: FuzzOptions, target: Outcome) -> Callable[[Repro], bool]:
    from idivm.fuzz.oracle import run_pg as run

    def still_fails(r: Repro) -> bool:
        try:
            got = run(opts.dsn, r.schema, r.setup, [r.view], [r.strategy], r.rounds,
                      opts.timeout_ms)[0][0]
        except psycopg.Error:  # a shrunk setup that violates a constraint: not this finding
            return False
        return target.same_kind(got)

    return still_fails


def _oracle(opts: FuzzOptions) -> tuple[Oracle, Callable[[FuzzOptions, Outcome],
                                                         Callable[[Repro], bool]]]:
    if opts.backend == "pg":
        return pg_oracle, pg_reproducer
    if opts.backend == "fresh":
        from idivm.fuzz.backends import fresh_oracle, fresh_reproducer

        return fresh_oracle, fresh_reproducer
    from idivm.fuzz.backends import spark_oracle, spark_reproducer

    return spark_oracle, spark_reproducer


def config_for(backend: str, base: FuzzConfig) -> FuzzConfig:
    if backend == "fresh":
        return FuzzConfig("fresh", False, False, False, False, base.max_depth, False)
    if backend == "spark":
        # shallower views: every Spark job costs seconds on a small machine
        return FuzzConfig("spark", False, False, False, base.cascades, min(base.max_depth, 1),
                          base.nested_with)
    return base


def fuzz(opts: FuzzOptions, progress: Callable[[int, Summary], None] | None = None
         ) -> Summary:
    """Run ``opts.views`` views from seed ``opts.seed`` on, ``views_per_seed`` per seed."""
    started = time.monotonic()
    oracle, reproducer = _oracle(opts)
    config = config_for(opts.backend, opts.config)
    strategies = opts.strategy_list()
    summary = Summary(opts.backend, (opts.seed, opts.seed - 1))
    seen: set[str] = set()
    seed = opts.seed
    while summary.generated < opts.views:
        n = min(opts.views_per_seed, opts.views - summary.generated)
        case = random_case(seed, config, n, opts.rounds)
        try:
            results = oracle(case, strategies, opts)
        except psycopg.Error as e:  # the harness's own setup failed: say so, go on
            summary.harness_errors.append(f"seed {seed}: {type(e).__name__}: {e}"[:300])
            seed += 1
            continue
        summary.seeds = (opts.seed, seed)
        for view, outs in zip(case.views, results, strict=True):
            summary.generated += 1
            if outs and outs[0].status == "invalid" and not outs[0].strategy:
                summary.invalid += 1
                continue
            for o in outs:
                summary.outcomes[o.status] += 1
                if o.status == "refused":
                    summary.refused_by[o.construct] += 1
            if all(o.status == "ok" for o in outs):
                summary.accepted += 1
            elif any(o.status == "refused" for o in outs):
                summary.refused += 1
            for o in outs:
                if o.finding:
                    _record(opts, summary, seen, case, view, o, reproducer)
        if progress is not None:
            progress(seed, summary)
        seed += 1
    summary.seconds = time.monotonic() - started
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2,
                                                          default=str) + "\n")
    return summary


def _record(opts: FuzzOptions, summary: Summary, seen: set[str], case: Case, view: str,
            o: Outcome, reproducer: Callable[[FuzzOptions, Outcome], Callable[[Repro], bool]]
            ) -> None:
    from idivm.fuzz.report import markdown, signature, write_finding

    pre = signature(o, view)
    if o.status != "mismatch" and pre in seen:
        summary.duplicates += 1
        return
    repro = Repro(case.schema, case.setup, view, o.strategy, case.rounds)
    if opts.shrink:
        repro = shrink(repro, reproducer(opts, o), fail_round=o.round_no,
                       seconds=opts.shrink_seconds)
    sig = signature(o, repro.view)
    if sig in seen or pre in seen:
        summary.duplicates += 1
        return
    seen.update((sig, pre))
    info: dict[str, Any] = {"seed": case.seed, "kind": o.status, "strategy": o.strategy,
                            "round": o.round_no, "detail": o.detail, "construct": o.construct,
                            "view": repro.view, "original_view": view}
    if opts.out is not None:
        info = write_finding(opts.out, len(summary.findings) + 1, case.seed, o, repro, view)
    summary.findings.append(info)
    if opts.markdown is not None:
        with opts.markdown.open("a") as f:
            f.write(markdown(info, repro))

