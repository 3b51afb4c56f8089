"""PNG plots in the style of the paper's Figures 10 (per-view times, log scale) and 12 (stacked
phases: i-diff computation, cache update, view update)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_bsma.backends import PHASES

COLORS = {"id": "#1f77b4", "tuple": "#ff7f0e", "recompute": "#7f7f7f"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bsma(report: dict[str, Any], out: Path) -> list[Path]:
    plt = _plt()
    cfg = report["config"]
    paths = []
    main = [e for e in report["summary"] if e["workload"] == "users" and e["d"] == cfg["d"]
            and e["cache"] == "warm"]
    strategies = [s for s in ("id", "tuple", "recompute") if s in cfg["strategies"]]
    if main:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / len(strategies)
        for i, s in enumerate(strategies):
            xs = [j + (i - (len(strategies) - 1) / 2) * w for j in range(len(main))]
            med = [e["strategies"][s]["median"] * 1e3 for e in main]
            lo = [m - e["strategies"][s]["min"] * 1e3 for m, e in zip(med, main, strict=True)]
            hi = [e["strategies"][s]["max"] * 1e3 - m for m, e in zip(med, main, strict=True)]
            ax.bar(xs, med, w, yerr=[lo, hi], label=s, color=COLORS[s], capsize=2)
        ax.set_yscale("log")
        ax.set_xticks(range(len(main)), [e["view"] for e in main])
        ax.set_ylabel("maintenance time, ms (log)")
        ax.set_title(f"BSMA on {cfg['backend']}, SF {cfg['sf']}: {cfg['d']} User updates "
                     "(tweetsnum, favornum); median, min–max", fontsize=10)
        ax.legend()
        fig.tight_layout()
        paths.append(out / f"fig10_{cfg['backend']}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
        paths.append(_stacks(plt, main, strategies, out / f"phases_{cfg['backend']}.png",
                             f"BSMA on {cfg['backend']}: where the time goes (User workload)"))
    warm = [e for e in report["summary"] if e["cache"] == "warm" and "speedup_vs_tuple" in e
            and e["d"] == cfg["d"]]
    if warm:
        workloads = list(dict.fromkeys(e["workload"] for e in warm))
        views = list(dict.fromkeys(e["view"] for e in warm))
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / len(workloads)
        for i, wl in enumerate(workloads):
            by = {e["view"]: e["speedup_vs_tuple"] for e in warm if e["workload"] == wl}
            xs = [j + (i - (len(workloads) - 1) / 2) * w for j in range(len(views))]
            ax.bar(xs, [by.get(v, 0) for v in views], w, label=wl)
        ax.axhline(1, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(views)), views)
        ax.set_ylabel("speedup of ID-based over tuple-based (log)")
        ax.set_title(f"BSMA on {cfg['backend']}, SF {cfg['sf']}: per workload", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / f"speedups_{cfg['backend']}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def _stacks(plt: Any, entries: Sequence[dict[str, Any]], strategies: Sequence[str], path: Path,
            title: str, labels: Sequence[str] | None = None, xlabel: str = "") -> Path:
    """Stacked phases per entry and strategy (Figure 12's bars)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    w = 0.8 / len(strategies)
    hatches = {"id": "", "tuple": "//", "recompute": ".."}
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(strategies):
        xs = [j + (i - (len(strategies) - 1) / 2) * w for j in range(len(entries))]
        bottom = [0.0] * len(entries)
        for k, ph in enumerate(PHASES):
            vals = [e["strategies"][s]["phases"][ph] * 1e3 if s in e["strategies"] else 0.0
                    for e in entries]
            ax.bar(xs, vals, w, bottom=bottom, color=cmap(k), hatch=hatches.get(s, ""),
                   edgecolor="white", label=ph if i == 0 else None)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(entries)), labels or [e["view"] for e in entries])
    ax.set_ylabel("ms (stacked phases)")
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_title(title + "  — bars: " + ", ".join(
        f"{s}{' (' + hatches[s] + ')' if hatches.get(s) else ''}" for s in strategies),
        fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_sweep(report: dict[str, Any], out: Path) -> list[Path]:
    """Per swept parameter: stacked phases of id and tuple (Figure 12), and the speedup."""
    plt = _plt()
    paths = []
    backend = report["config"]["backend"]
    for param, entries in report["sweeps"].items():
        strategies = [s for s in ("id", "tuple") if all(s in e["strategies"] for e in entries)]
        labels = [str(e["value"]) for e in entries]
        paths.append(_stacks(plt, entries, strategies, out / f"sweep_{param}_{backend}.png",
                             f"parts/devices on {backend}: sweep of {param}", labels, param))
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(labels, [e.get("speedup_vs_tuple", 0) for e in entries], marker="o")
        ax.set_xlabel(param)
        ax.set_ylabel("speedup of ID-based over tuple-based")
        ax.set_ylim(bottom=0)
        ax.set_title(f"parts/devices on {backend}: {param}", fontsize=10)
        fig.tight_layout()
        paths.append(out / f"sweep_{param}_{backend}_speedup.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths
