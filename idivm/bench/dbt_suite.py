"""``idivm bench dbt-suite``: how much of DBToaster's public query suite idivm accepts.

Reads the queries of a dbtoaster-a5 checkout (``test/queries/{tpch,finance,simple}``): each file
declares its relations (``CREATE STREAM|TABLE name (cols) FROM FILE …``, possibly through
``INCLUDE``) and holds one or more SELECTs. DBToaster's relations are bags; ID-based IVM needs
keys, so keys are added: TPC-H's specification keys, the order id of the finance books, and
every column elsewhere (a key of the whole row: the relation becomes a set, the queries stay
as they are). Each SELECT is planned; a refusal is *legitimate* when PostgreSQL itself rejects
the query (DBToaster's dialect: ``LISTMAX``, ``vec_length``, …) or when the query cannot be a
view (duplicate output column names).
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table as RichTable

import idivm
from idivm.errors import IdivmError, UnsupportedSQL

GROUPS = ("tpch", "finance", "simple")
TPCH_KEYS = {"lineitem": ("orderkey", "linenumber"), "orders": ("orderkey",),
             "customer": ("custkey",), "part": ("partkey",), "supplier": ("suppkey",),
             "partsupp": ("partkey", "suppkey"), "nation": ("nationkey",),
             "region": ("regionkey",)}
FINANCE_KEYS = {"bids": ("id",), "asks": ("id",)}
TYPES = {"string": "text", "float": "double precision", "double": "double precision"}


@dataclass(frozen=True)
class SuiteFile:
    group: str
    name: str
    ddl: str  # CREATE TABLE statements with keys added
    queries: tuple[str, ...]


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", re.sub(r"--[^\n]*", "", text), flags=re.DOTALL)


def _resolve(text: str, root: Path) -> str:
    def include(m: re.Match[str]) -> str:
        return _resolve(_strip_comments((root / m.group(1)).read_text()), root)

    return re.sub(r"INCLUDE\s+'([^']+)'\s*;", include, text, flags=re.IGNORECASE)


def _statements(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, False
    for ch in text:
        if ch == "'":
            quote = not quote
        elif not quote and ch == "(":
            depth += 1
        elif not quote and ch == ")":
            depth -= 1
        if ch == ";" and not quote and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return [s for s in out if s]


def _table(stmt: str, group: str) -> str:
    """``CREATE STREAM R (cols) FROM FILE …`` as ``CREATE TABLE r (cols, PRIMARY KEY (…))``."""
    m = re.match(r"CREATE\s+(?:STREAM|TABLE)\s+(\w+)\s*\(", stmt, flags=re.IGNORECASE)
    assert m is not None
    name = m.group(1).lower()
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(stmt[i], 0)
        i += 1
    cols = []
    for part in re.split(r",(?![^()]*\))", stmt[m.end():i - 1]):
        words = part.split()
        if words:
            ty = " ".join(words[1:])
            cols.append((words[0].lower(), TYPES.get(ty.lower(), ty)))
    keys = (TPCH_KEYS if group == "tpch" else FINANCE_KEYS if group == "finance" else {}).get(
        name, tuple(c for c, _ in cols))
    body = ", ".join(f"{c} {t} NOT NULL" for c, t in cols)
    return f"CREATE TABLE {name} ({body}, PRIMARY KEY ({', '.join(keys)}))"


def load(root: Path, groups: tuple[str, ...] = GROUPS) -> list[SuiteFile]:
    out = []
    for group in groups:
        for path in sorted((root / "test" / "queries" / group).glob("*.sql")):
            text = _resolve(_strip_comments(path.read_text()), root)
            ddl, queries = [], []
            for stmt in _statements(text):
                if re.match(r"CREATE\s+(STREAM|TABLE)", stmt, flags=re.IGNORECASE):
                    ddl.append(_table(stmt, group))
                elif re.match(r"SELECT\b", stmt, flags=re.IGNORECASE):
                    queries.append(stmt)
            if queries:
                out.append(SuiteFile(group, path.stem, ";\n".join(ddl), tuple(queries)))
    return out


def _pg_error(conn: psycopg.Connection[Any], f: SuiteFile, query: str) -> str | None:
    """PostgreSQL's own verdict on the query over the file's tables (None: it runs)."""
    schema = f"idivm_dbt_{uuid.uuid4().hex[:8]}"
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
            for stmt in f.ddl.split(";\n"):
                conn.execute(stmt.encode())  # DDL built here from the suite's declarations
            try:
                with conn.transaction():
                    # the suite's query text is what is under test: PostgreSQL parses it
                    conn.execute(b"EXPLAIN " + query.encode())
            except psycopg.Error as e:
                return str(e).strip().splitlines()[0]
            raise _Rollback
    except _Rollback:
        return None


class _Rollback(Exception):
    pass


def run(root: Path, dsn: str, out: Path, console: Console | None = None) -> dict[str, Any]:
    c = console or Console()
    files = load(root)
    results: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for f in files:
            catalog = idivm.Catalog.from_ddl(f.ddl)
            for i, q in enumerate(f.queries):
                name = f.name if len(f.queries) == 1 else f"{f.name}#{i + 1}"
                r: dict[str, Any] = {"group": f.group, "query": name}
                pg = _pg_error(conn, f, q)
                try:
                    idivm.plan(q, catalog, name="v")
                    r["status"] = "accepted"
                except UnsupportedSQL as e:
                    r["construct"], r["message"] = e.construct, str(e)
                    r["status"] = ("refused: not a view (duplicate output columns)"
                                   if "duplicate output column" in str(e) else "refused")
                except IdivmError as e:
                    r["status"], r["message"] = "error", str(e)
                if pg is not None:  # DBToaster's dialect, not SQL PostgreSQL runs
                    r["planner"], r["status"], r["postgres"] = (
                        r["status"], "refused: PostgreSQL rejects it", pg)
                results.append(r)
    counts = Counter(r["status"] for r in results)
    by_group = {g: Counter(r["status"] for r in results if r["group"] == g) for g in GROUPS}
    constructs = Counter(r.get("construct", "") for r in results if r["status"] == "refused")
    total = len(results)
    legit = sum(n for s, n in counts.items() if s.startswith("refused:"))
    summary = {"queries": total, "accepted": counts["accepted"],
               "accepted_share": counts["accepted"] / total if total else 0.0,
               "accepted_or_legitimately_refused": counts["accepted"] + legit,
               "by_status": dict(counts), "by_group": {g: dict(v) for g, v in by_group.items()},
               "refused_constructs": dict(constructs.most_common())}
    t = RichTable(title="DBToaster query suite (tpch, finance, simple; keys added)")
    for col in ("group", "queries", "accepted", "refused: PostgreSQL rejects / not a view",
                "refused", "error"):
        t.add_column(col)
    for g in GROUPS:
        v = by_group[g]
        t.add_row(g, str(sum(v.values())), str(v["accepted"]),
                  str(sum(n for s, n in v.items() if s.startswith("refused:"))),
                  str(v["refused"]), str(v["error"]))
    c.print(t)
    c.print(f"accepted {counts['accepted']} of {total} ({summary['accepted_share']:.0%}); "
            f"with the legitimate refusals {counts['accepted'] + legit} of {total}")
    for k, n in constructs.most_common():
        c.print(f"  refused {n}: {k}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "dbt_suite.json").write_text(json.dumps({"summary": summary, "queries": results},
                                                   indent=2, default=str))
    c.print(f"wrote {out / 'dbt_suite.json'}")
    return summary
