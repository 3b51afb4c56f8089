"""``idivm bench dbt-suite``: how much of DBToaster's public query suite idivm accepts.

Reads the queries of a dbtoaster-a5 checkout (``test/queries/{tpch,finance,simple}``): each file
declares its relations (``CREATE STREAM|TABLE name (cols) FROM FILE …``, possibly through
``INCLUDE``) and holds one or more SELECTs. DBToaster's relations are bags; ID-based IVM needs
keys, so keys are added: TPC-H's specification keys, the order id of the finance books, and
every column elsewhere (a key of the whole row: the relation becomes a set, the queries stay
as they are). DBToaster's dialect is rewritten to the SQL it means before anything reads the
query (``to_postgres``): ``x IN LIST (…)`` is ``x IN (…)``, ``LISTMAX``/``LISTMIN`` are
``GREATEST``/``LEAST``, ``COUNT(DISTINCT)`` counts distinct rows, ``cast_int`` truncates,
``cast_float``/``cast_date``/``cast_string`` are casts, ``SUBSTRING(s, start, n)`` counts
from 0, and a function declared ``CREATE FUNCTION f (…) RETURNS t AS EXTERNAL 'ATOI'`` is the C
library function it names (``atoi``/``atol``/``atof``: a cast to ``t``; ``sqrt``, ``cos``, …: the
SQL function of that name; any other external stays as written). Each SELECT is then
planned; a refusal is *legitimate* when PostgreSQL itself rejects the query (an unknown
external function, an aggregate in WHERE, …) or when the query cannot be a view (duplicate
output column names).
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import sqlglot
from psycopg import sql
from rich.console import Console
from rich.table import Table as RichTable
from sqlglot import exp

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
    queries: tuple[tuple[str, tuple[str, ...]], ...]  # (PostgreSQL SQL, dialect rewrites)


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


_CASTS = {"CAST_FLOAT": "DOUBLE PRECISION", "CAST_DATE": "DATE", "CAST_STRING": "TEXT"}
# C library functions a query may declare as EXTERNAL, and the SQL that means them: the string
# conversions cast to the declared type, the math functions are PostgreSQL's of the same meaning.
_C_PARSE = ("ATOI", "ATOL", "ATOLL", "ATOF", "STRTOD")
_C_MATH = {"SQRT": "SQRT", "COS": "COS", "SIN": "SIN", "TAN": "TAN", "EXP": "EXP", "LOG": "LN",
           "LOG10": "LOG", "FLOOR": "FLOOR", "CEIL": "CEIL", "FABS": "ABS", "POW": "POWER"}


@dataclass(frozen=True)
class External:
    """``CREATE FUNCTION name (…) RETURNS returns AS EXTERNAL 'symbol'``."""
    symbol: str
    returns: str


def _external(stmt: str) -> tuple[str, External] | None:
    m = re.match(r"CREATE\s+FUNCTION\s+(\w+)\s*\(.*?\)\s*RETURNS\s+(\w+(?:\s+\w+)?)\s+AS\s+"
                 r"EXTERNAL\s+'(\w+)'\s*$", stmt, flags=re.IGNORECASE | re.DOTALL)
    if m is None:
        return None
    return m.group(1).lower(), External(m.group(3).upper(),
                                        TYPES.get(m.group(2).lower(), m.group(2)))


def _call_external(ext: External, args: list[exp.Expression]) -> exp.Expression | None:
    if ext.symbol in _C_PARSE and len(args) == 1:
        return exp.cast(args[0], ext.returns)
    if ext.symbol in _C_MATH:
        return exp.Anonymous(this=_C_MATH[ext.symbol], expressions=args)
    return None


def _dialect_rewrite(node: exp.Expression, applied: set[str],
                     externals: Mapping[str, External]) -> exp.Expression:
    """One node of DBToaster's dialect as the PostgreSQL expression it means."""
    if isinstance(node, exp.Anonymous) and node.name.lower() in externals:
        ext = externals[node.name.lower()]
        call = _call_external(ext, list(node.expressions))
        if call is not None:
            applied.add(f"EXTERNAL '{ext.symbol}'")
            return call
    if isinstance(node, exp.In) and isinstance(node.args.get("field"), exp.List):
        applied.add("IN LIST")
        return exp.In(this=node.this, expressions=node.args["field"].expressions)
    if isinstance(node, exp.Anonymous):
        name, args = node.name.upper(), node.expressions
        if name in ("LISTMAX", "LISTMIN"):
            applied.add(name)
            ctor = exp.Greatest if name == "LISTMAX" else exp.Least
            return ctor(this=args[0], expressions=args[1:])
        if name == "CAST_INT" and len(args) == 1:  # a C cast: truncates toward zero
            applied.add(name)
            return exp.cast(exp.func("TRUNC", args[0]), "BIGINT")
        if name in _CASTS and len(args) == 1:
            applied.add(name)
            return exp.cast(args[0], _CASTS[name])
    if (isinstance(node, exp.Select) and not node.args.get("group")
            and [type(e) for e in node.selects] == [exp.Count]
            and isinstance(node.selects[0].this, exp.Distinct)
            and not node.selects[0].this.expressions):
        applied.add("COUNT(DISTINCT) of rows")  # the number of distinct rows
        rows = node.copy().select(exp.Star(), append=False).distinct()
        return exp.select(exp.Count(this=exp.Star())).from_(rows.subquery("d"))
    if isinstance(node, exp.Substring) and node.args.get("start") is not None:
        applied.add("SUBSTRING from 0")
        start = node.args["start"]
        shifted = (exp.Literal.number(int(start.this) + 1)
                   if isinstance(start, exp.Literal) and start.is_int
                   else exp.Paren(this=exp.Add(this=start, expression=exp.Literal.number(1))))
        return exp.Substring(this=node.this, start=shifted, length=node.args.get("length"))
    return node


def to_postgres(query: str, externals: Mapping[str, External] | None = None
                ) -> tuple[str, tuple[str, ...]]:
    """``query`` in DBToaster's dialect as PostgreSQL SQL, and the dialect forms rewritten
    (none: the text is returned as it is); ``externals`` are the functions its file declares."""
    applied: set[str] = set()
    tree = sqlglot.parse_one(query, read="postgres")
    out = tree.transform(lambda n: _dialect_rewrite(n, applied, externals or {}))
    if not applied:
        return query, ()
    return out.sql(dialect="postgres"), tuple(sorted(applied))


def load(root: Path, groups: tuple[str, ...] = GROUPS) -> list[SuiteFile]:
    out = []
    for group in groups:
        for path in sorted((root / "test" / "queries" / group).glob("*.sql")):
            text = _resolve(_strip_comments(path.read_text()), root)
            ddl, queries = [], []
            externals: dict[str, External] = {}
            for stmt in _statements(text):
                if re.match(r"CREATE\s+(STREAM|TABLE)", stmt, flags=re.IGNORECASE):
                    ddl.append(_table(stmt, group))
                elif (ext := _external(stmt)) is not None:
                    externals[ext[0]] = ext[1]
                elif re.match(r"SELECT\b", stmt, flags=re.IGNORECASE):
                    queries.append(to_postgres(stmt, externals))
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


def _cast_text(query: str) -> dict[str, str]:
    """The columns ``query`` casts to another type (``cast_date(s)``), by name, with that
    type: their random values must be strings the cast reads."""
    out: dict[str, str] = {}
    for cast in sqlglot.parse_one(query, read="postgres").find_all(exp.Cast):
        if isinstance(cast.this, exp.Column):
            out[cast.this.name.lower()] = cast.to.sql(dialect="postgres").lower()
    return out


def _value(rng: random.Random, ty: str, cast_to: str | None = None) -> Any:
    t = ty.lower()
    if ("char" in t or t == "text") and cast_to not in (None, "text"):
        return str(_value(rng, cast_to))  # a string the query's cast reads
    if "char" in t or t == "text":
        v = rng.choice(["a", "b", "Brand#23", "MED BOX", "forest green"])
        n = re.search(r"\((\d+)\)", t)
        return v[:int(n.group(1))] if n else v
    if t == "date":
        return rng.choice(["1994-01-01", "1995-06-17", "1996-01-02", "1997-12-31"])
    if t.startswith(("decimal", "numeric", "double", "float")):
        return rng.choice([0.5, 1, 2, 3.25, 5])
    return rng.randint(1, 5)  # (no 0: the suite divides by columns)


def verify(conn: psycopg.Connection[Any], dsn: str, f: SuiteFile, query: str, seed: int,
           rounds: int = 3) -> str | None:
    """Maintain ``query`` as a view over random rows through ``rounds`` rounds of random
    inserts, updates and deletes; None when it equals its recomputation after each, else
    what differed."""
    from idivm.postgres import PostgresMaintainer

    rng = random.Random(seed)
    schema = f"idivm_dbt_{uuid.uuid4().hex[:8]}"
    catalog = idivm.Catalog.from_ddl(f.ddl)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        for stmt in f.ddl.split(";\n"):
            conn.execute(stmt.encode())

        casts = _cast_text(query)

        def insert(t: idivm.Table, n: int) -> None:
            cols = sql.SQL(", ").join(map(sql.Identifier, t.column_names))
            marks = sql.SQL(", ").join(sql.Placeholder() * len(t.columns))
            for _ in range(n):
                conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT DO NOTHING")
                             .format(sql.Identifier(t.name), cols, marks),
                             [_value(rng, c.type, casts.get(c.name)) for c in t.columns])

        def change(t: idivm.Table, what: str) -> None:
            """Delete a random row, or set a random column of one (a key collision is
            skipped)."""
            name = sql.Identifier(t.name)
            rows = [r[0] for r in conn.execute(sql.SQL("SELECT ctid::text FROM {} ORDER BY "
                                                       "ctid").format(name)).fetchall()]
            if not rows:
                return
            ctid = rng.choice(rows)
            if what == "delete":
                conn.execute(sql.SQL("DELETE FROM {} WHERE ctid = %s::tid").format(name),
                             [ctid])
                return
            col = rng.choice(t.columns)
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("UPDATE {} SET {} = %s WHERE ctid = %s::tid").format(
                        name, sql.Identifier(col.name)),
                        [_value(rng, col.type, casts.get(col.name)), ctid])
            except psycopg.errors.UniqueViolation:
                pass

        for t in catalog.tables.values():
            insert(t, 12)
        with PostgresMaintainer(dsn, schema=schema) as m:
            m.create_view("v", query)
            for r in range(rounds):
                for t in catalog.tables.values():
                    insert(t, 3)
                    for what in ("delete", "delete", "update", "update"):
                        change(t, what)
                m.maintain("v")
                got = Counter(map(_norm, conn.execute("SELECT * FROM v").fetchall()))
                want = Counter(map(_norm, conn.execute(b"SELECT * FROM (" + query.encode() +
                                                       b") q").fetchall()))
                if got != want:
                    return f"round {r}: {sum((got - want).values())} extra, " \
                           f"{sum((want - got).values())} missing rows"
        return None
    finally:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(schema)))
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(f"{schema}__idivm")))


def _norm(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(round(float(v), 6) if isinstance(v, float | Decimal) else v for v in row)


def run(root: Path, dsn: str, out: Path, console: Console | None = None,
        verify_accepted: bool = False) -> dict[str, Any]:
    c = console or Console()
    files = load(root)
    results: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for f in files:
            catalog = idivm.Catalog.from_ddl(f.ddl)
            for i, (q, rewritten) in enumerate(f.queries):
                name = f.name if len(f.queries) == 1 else f"{f.name}#{i + 1}"
                r: dict[str, Any] = {"group": f.group, "query": name}
                if rewritten:
                    r["dialect_rewritten"] = list(rewritten)
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
                if verify_accepted and r["status"] == "accepted":
                    try:
                        r["verified"] = verify(conn, dsn, f, q, seed=len(results)) or "yes"
                    except IdivmError as e:
                        r["verified"] = f"error: {e}"
                results.append(r)
    counts = Counter(r["status"] for r in results)
    by_group = {g: Counter(r["status"] for r in results if r["group"] == g) for g in GROUPS}
    constructs = Counter(r.get("construct", "") for r in results if r["status"] == "refused")
    total = len(results)
    verified = Counter("yes" if r.get("verified") == "yes" else "no" for r in results
                       if "verified" in r)
    legit = sum(n for s, n in counts.items() if s.startswith("refused:"))
    summary = {"queries": total, "accepted": counts["accepted"],
               "accepted_share": counts["accepted"] / total if total else 0.0,
               "accepted_or_legitimately_refused": counts["accepted"] + legit,
               "by_status": dict(counts), "by_group": {g: dict(v) for g, v in by_group.items()},
               "refused_constructs": dict(constructs.most_common()),
               "verified": dict(verified)}
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
    c.print(f"accepted {counts['accepted']} of {total} ({summary['accepted_share']:.1%}); "
            f"with the legitimate refusals {counts['accepted'] + legit} of {total}")
    for k, n in constructs.most_common():
        c.print(f"  refused {n}: {k}")
    if verify_accepted:
        c.print(f"maintained = recomputed over random changes: {verified['yes']} of "
                f"{sum(verified.values())} accepted")
        for r in results:
            if r.get("verified") not in (None, "yes"):
                c.print(f"  [red]{r['group']}/{r['query']}: {r['verified']}[/red]")
    out.mkdir(parents=True, exist_ok=True)
    (out / "dbt_suite.json").write_text(json.dumps({"summary": summary, "queries": results},
                                                   indent=2, default=str))
    c.print(f"wrote {out / 'dbt_suite.json'}")
    return summary
