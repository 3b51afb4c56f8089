"""Regenerate ``scripts_out/``: the Δ-scripts of the paper's running-example views.

Run ``python -m idivm.scripts_out`` (``--check`` compares instead of writing; exit 1 on drift).
V is Figure 1's view, V' Figure 5's; both are planned for price updates on parts (Figure 2's
Δ^u_parts) and for all modification types.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from idivm.catalog import Catalog
from idivm.examples import PAPER_DDL, V_PRIME_SQL, V_SQL
from idivm.plan import plan
from idivm.postgres.compile import MERGE
from idivm.script import Dialect

V = V_SQL
V_PRIME = V_PRIME_SQL
VIEWS = {"v": V, "v_prime": V_PRIME}
CHANGES = {"price_updates": {"parts": ["update:price"]}, "all_changes": None}
DIALECTS: tuple[Dialect, ...] = ("postgres", "spark")


def merges(dialect: Dialect) -> bool:
    """The planner's ``merge`` as ``dialect``'s backend plans: PostgreSQL's each i-diff apart
    (``postgres.compile.MERGE``), Spark's merged."""
    return MERGE if dialect == "postgres" else True


def generated() -> dict[str, str]:
    """File name → content for every view × change set × dialect (PostgreSQL's planned as its
    backend plans it: each i-diff apart, ``postgres.compile.MERGE``)."""
    cat = Catalog.from_ddl(PAPER_DDL)
    out = {}
    for vname, sql in VIEWS.items():
        for cname, changes in CHANGES.items():
            p = plan(sql, cat, name=vname, changes=changes)
            for dialect in DIALECTS:
                planned = p if merges(dialect) else \
                    plan(sql, cat, name=vname, changes=changes, merge=False)
                out[f"{vname}.{cname}.{dialect}.sql"] = planned.script_text(dialect) + "\n"
            out[f"{vname}.{cname}.explain.txt"] = p.explain() + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent.parent
                    / "scripts_out")
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args(argv)
    drift = []
    for name, text in generated().items():
        path = args.dir / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                drift.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if drift:
        print("planner output drifted from scripts_out/: " + ", ".join(drift), file=sys.stderr)
        print("regenerate with: python -m idivm.scripts_out", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
