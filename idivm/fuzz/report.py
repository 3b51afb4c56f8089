"""A shrunk finding as files: the view, the change script, and a ready-to-paste pytest
regression test (differential: maintained view == recomputation after every round)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from idivm.fuzz.oracle import Outcome
from idivm.fuzz.shrink import Repro
from idivm.fuzz.workload import round_text

TEST_TEMPLATE = '''"""Found by `idivm fuzz` (seed {seed}): {kind} under strategy={strategy}.

{detail}
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from idivm.catalog import Catalog
from idivm.errors import UnsupportedSQL
from idivm.fuzz.oracle import documented, normalize_rows, run_round
from idivm.fuzz.workload import Txn
from idivm.postgres import PostgresMaintainer

SCHEMA = {schema}
ROWS = {setup}
VIEW = {view!r}
ROUNDS = {rounds}


def test_{name}(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {{}}").format(sql.Identifier(pg_schema)))
        for stmt in SCHEMA + ROWS:
            conn.execute(stmt)
        catalog = Catalog.from_ddl(";\\n".join(s for s in SCHEMA if s.startswith("CREATE TABLE")))
        with PostgresMaintainer(pg_dsn, pg_schema) as m:
            try:
                m.create_view("v", VIEW, catalog=catalog, strategy={strategy!r})
            except UnsupportedSQL as e:  # a refusal is fine when the README documents it
                assert documented(e.construct), e
                return
            for i, rnd in enumerate([(), *ROUNDS]):
                run_round(conn, tuple(Txn(tuple(stmts), commit) for stmts, commit in rnd))
                if i:
                    m.maintain("v")
                got = normalize_rows(conn.execute(
                    sql.SQL("SELECT * FROM {{}}").format(sql.Identifier(pg_schema, "v"))))
                assert got == normalize_rows(conn.execute(VIEW)), f"after round {{i}}"
'''


def _pylist(items: list[str], indent: str = "    ") -> str:
    if not items:
        return "[]"
    return "[\n" + "".join(f"{indent}{s!r},\n" for s in items) + "]"


def test_text(repro: Repro, outcome: Outcome, seed: int, name: str) -> str:
    rounds = [[(list(t.statements), t.commit) for t in r] for r in repro.rounds]
    rounds_text = "[\n" + "".join(f"    {r!r},\n" for r in rounds) + "]" if rounds else "[]"
    detail = " ".join(outcome.detail.split())[:300]
    detail = "\n".join(detail[i:i + 96] for i in range(0, len(detail), 96))
    return TEST_TEMPLATE.format(
        seed=seed, kind=outcome.status, strategy=repro.strategy,
        detail=detail.replace('"""', "'''"),
        schema=_pylist(repro.schema.ddl()), setup=_pylist(list(repro.setup)), view=repro.view,
        rounds=rounds_text, name=name)


def script_text(repro: Repro) -> str:
    """DDL, initial rows and rounds as one psql script (maintain after each round)."""
    lines = ["-- schema"] + [f"{s};" for s in repro.schema.ddl()]
    lines += ["-- initial rows"] + [f"{s};" for s in repro.setup]
    for i, rnd in enumerate(repro.rounds, 1):
        lines += [f"-- round {i} (then maintain)", round_text(rnd)]
    return "\n".join(lines) + "\n"


def signature(outcome: Outcome, view: str) -> str:
    """What makes two findings the same: kind, error or construct, and the view's shape."""
    shape = re.sub(r"'[^']*'|\b\d+(\.\d+)?\b", "#", view)
    shape = re.sub(r"\b[a-z]+\d+\b", "x", shape)
    if outcome.status == "mismatch":
        return f"mismatch|{outcome.strategy}|{shape}"
    detail = re.sub(r"'[^']*'|\"[^\"]*\"|\b\d+\b", "#", outcome.construct or outcome.detail)
    return f"{outcome.status}|{detail[:120]}"


def write_finding(out: Path, index: int, seed: int, outcome: Outcome, repro: Repro,
                  original_view: str) -> dict[str, Any]:
    d = out / f"finding_{index:03d}"
    d.mkdir(parents=True, exist_ok=True)
    name = f"fuzz_seed{seed}_{index}_{repro.strategy}"
    (d / "view.sql").write_text(repro.view + "\n")
    (d / "changes.sql").write_text(script_text(repro))
    (d / f"test_{name}.py").write_text(test_text(repro, outcome, seed, name))
    info = {"index": index, "seed": seed, "kind": outcome.status, "strategy": repro.strategy,
            "round": outcome.round_no, "detail": outcome.detail, "construct": outcome.construct,
            "view": repro.view, "original_view": original_view, "dir": str(d),
            "statements": [list(t.statements) for r in repro.rounds for t in r]}
    (d / "finding.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def markdown(info: dict[str, Any], repro: Repro) -> str:
    return (f"\n### {info['kind']} — seed {info['seed']}, strategy {info['strategy']}, "
            f"round {info['round']}\n\n{info['detail'][:500]}\n\n```sql\n{script_text(repro)}"
            f"-- view\n{repro.view};\n```\n")
