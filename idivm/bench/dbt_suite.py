"""``idivm bench dbt-suite``: how much of DBToaster's public query suite idivm accepts.

Reads every query of a dbtoaster-a5 checkout (``test/queries/{tpch,finance,simple}``, their
subdirectories included: ``simple/case01``): each file declares its relations (``CREATE
STREAM|TABLE name (cols) FROM FILE …``, possibly through ``INCLUDE``) and holds one or more
SELECTs. Names stay as DBToaster writes them (``CREATE TABLE LINEITEM``, ``R.A``): unquoted,
PostgreSQL folds them, and so must idivm. DBToaster's relations are bags; ID-based IVM needs
keys, so keys are added: TPC-H's specification keys, the order id of the finance books, and
every column elsewhere (a key of the whole row: the relation becomes a set, the queries stay
as they are). DBToaster's dialect is rewritten to the SQL it means before anything reads the
query (``to_postgres``): ``x IN LIST (…)`` is ``x IN (…)``, ``LISTMAX``/``LISTMIN`` are
``GREATEST``/``LEAST``, ``COUNT(DISTINCT)`` counts distinct rows, ``cast_int`` truncates,
``cast_float``/``cast_date``/``cast_string`` are casts, ``SUBSTRING(s, start, n)`` counts
from 0, and a function declared ``CREATE FUNCTION f (…) RETURNS t AS EXTERNAL 'ATOI'`` is the C
library function it names (``atoi``/``atol``/``atof``: a cast to ``t``; ``sqrt``, ``cos``, …: the
SQL function of that name; any other external stays as written).

Each query then gets PostgreSQL's verdict (``CREATE VIEW`` over the file's tables) and idivm's
(``plan``). Its status: *PostgreSQL rejects it* (an unknown external function, an aggregate in
WHERE, …), *not a view* (two output columns the query names alike: ``SELECT * FROM R, S`` with
a column ``B`` in both), else idivm's *accepted*, *refused* (an ``UnsupportedSQL``, by its
construct) or *error*. Columns the query leaves unnamed do not make it "not a view" when
PostgreSQL's made-up names for them repeat (``SELECT COUNT(*), SUM(A)``, ``?column?`` twice):
idivm names them itself.
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
from idivm.plan import Strategy

GROUPS = ("tpch", "finance", "simple")
NOT_A_VIEW = "not a view (duplicate output columns)"
PG_REJECTS = "PostgreSQL rejects it"
STATUSES = ("accepted", "refused", "error", PG_REJECTS, NOT_A_VIEW)
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
    name = m.group(1)  # as DBToaster writes it: unquoted, PostgreSQL folds it
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(stmt[i], 0)
        i += 1
    cols = []
    for part in re.split(r",(?![^()]*\))", stmt[m.end():i - 1]):
        words = part.split()
        if words:
            ty = " ".join(words[1:])
            cols.append((words[0], TYPES.get(ty.lower(), ty)))
    known = (TPCH_KEYS if group == "tpch" else FINANCE_KEYS if group == "finance" else {}).get(
        name.lower())
    spelled = {c.lower(): c for c, _ in cols}
    keys = (tuple(spelled[k] for k in known) if known is not None
            else tuple(c for c, _ in cols))
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
        base = root / "test" / "queries" / group
        for path in sorted(base.rglob("*.sql")):  # with subdirectories (simple/case01)
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
                name = path.relative_to(base).with_suffix("").as_posix()
                out.append(SuiteFile(group, name, ";\n".join(ddl), tuple(queries)))
    return out


@dataclass(frozen=True)
class PgVerdict:
    """PostgreSQL's own verdict on a query as a view over the file's tables."""
    view: bool  # False: PostgreSQL cannot create it as a view
    duplicate_columns: bool  # the reason: two output columns the query names alike
    message: str
    named: bool = False  # a view once its unnamed columns get names (``?column?`` twice)


def _pg_verdict(conn: psycopg.Connection[Any], f: SuiteFile, query: str) -> PgVerdict:
    schema = f"idivm_dbt_{uuid.uuid4().hex[:8]}"
    verdict = PgVerdict(True, False, "")
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
            for stmt in f.ddl.split(";\n"):
                conn.execute(stmt.encode())  # DDL built here from the suite's declarations
            try:
                with conn.transaction():
                    # the suite's query text is what is under test: PostgreSQL parses it
                    conn.execute(b"CREATE VIEW idivm_dbt_v AS " + query.encode())
            except psycopg.errors.DuplicateColumn as e:
                dup = re.match(r'column "(.*)" specified more than once',
                               e.diag.message_primary or "")
                if dup is None or dup.group(1) in _written_names(query, f.ddl):
                    verdict = PgVerdict(False, True, str(e).strip().splitlines()[0])
                else:  # a name PostgreSQL makes up (?column?, sum): idivm names it itself
                    verdict = _pg_verdict_explain(conn, query)
            except psycopg.Error as e:
                verdict = PgVerdict(False, False, str(e).strip().splitlines()[0])
            raise _Rollback
    except _Rollback:
        pass
    return verdict


def _pg_verdict_explain(conn: psycopg.Connection[Any], query: str) -> PgVerdict:
    try:
        with conn.transaction():
            conn.execute(b"EXPLAIN " + query.encode())
    except psycopg.Error as e:
        return PgVerdict(False, False, str(e).strip().splitlines()[0])
    return PgVerdict(True, False, "", named=True)


def _written_names(query: str, ddl: str) -> set[str]:
    """The output column names ``query`` writes (aliases, column references, the columns a
    star reads), folded as PostgreSQL folds them; an unnamed expression writes none."""
    out: set[str] = set()
    tree = sqlglot.parse_one(query, read="postgres")
    selects = tree.selects if isinstance(tree, exp.Query) else []
    for e in selects:
        ident = (e.args.get("alias") if isinstance(e, exp.Alias)
                 else e.this if isinstance(e, exp.Column) else None)
        if isinstance(ident, exp.Identifier):
            out.add(ident.this if ident.quoted else ident.this.lower())
        if isinstance(e, exp.Star) or (isinstance(e, exp.Column)
                                       and isinstance(e.this, exp.Star)):
            out |= {c.name for t in idivm.Catalog.from_ddl(ddl).tables.values()
                    for c in t.columns}
    return out


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
           rounds: int = 3, strategy: Strategy = "id") -> str | None:
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
            m.create_view("v", query, strategy=strategy)
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


def _verify_all(conn: psycopg.Connection[Any], dsn: str, f: SuiteFile, query: str, seed: int,
                rounds: int, strategies: tuple[Strategy, ...]) -> dict[str, str]:
    """Per strategy: "yes" when ``query`` is maintained right, "refused: …" when the strategy
    refuses it (no failure: ``auto`` picks another), else what went wrong."""
    out: dict[str, str] = {}
    for strategy in strategies:
        try:
            out[strategy] = verify(conn, dsn, f, query, seed, rounds, strategy) or "yes"
        except UnsupportedSQL as e:
            out[strategy] = f"refused: {e.construct}"
        except Exception as e:  # a failed maintain is a finding, not the end of the run
            out[strategy] = f"error: {type(e).__name__}: {e}"
    return out


def _norm(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(round(float(v), 6) if isinstance(v, float | Decimal) else v for v in row)


def run(root: Path, dsn: str, out: Path, console: Console | None = None,
        verify_accepted: bool = False, strategies: tuple[Strategy, ...] = ("id",),
        rounds: int = 3, seed: int = 0) -> dict[str, Any]:
    """Count the suite under ``root``; with ``verify_accepted``, maintain each accepted query
    under each of ``strategies`` through ``rounds`` rounds of random changes (seeded from
    ``seed`` and the query's position)."""
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
                pg = _pg_verdict(conn, f, q)
                try:
                    idivm.plan(q, catalog, name="v")
                    r["status"] = "accepted"
                except UnsupportedSQL as e:
                    r["status"], r["construct"], r["message"] = "refused", e.construct, str(e)
                except IdivmError as e:
                    r["status"], r["message"] = "error", str(e)
                except Exception as e:  # a crash of the planner is a finding, not the end
                    r["status"], r["message"] = "error", f"{type(e).__name__}: {e}"
                if pg.named:
                    r["unnamed_columns"] = "named by idivm (PostgreSQL's names repeat)"
                if not pg.view:  # no view PostgreSQL creates: idivm's verdict is moot
                    r["planner"], r["postgres"] = r["status"], pg.message
                    r["status"] = NOT_A_VIEW if pg.duplicate_columns else PG_REJECTS
                if verify_accepted and r["status"] == "accepted":
                    by = _verify_all(conn, dsn, f, q, seed + len(results), rounds, strategies)
                    wrong = {k: v for k, v in by.items() if v != "yes"
                             and not v.startswith("refused: ")}
                    r["verified"] = ("yes" if not wrong and "yes" in by.values() else
                                     "; ".join(f"{k}: {v}" for k, v in (wrong or by).items()))
                    if len(strategies) > 1:
                        r["verified_by_strategy"] = by
                results.append(r)
    counts = Counter(r["status"] for r in results)
    by_group = {g: Counter(r["status"] for r in results if r["group"] == g) for g in GROUPS}
    constructs = Counter(r.get("construct", "") for r in results if r["status"] == "refused")
    total = len(results)
    verified = Counter("yes" if r.get("verified") == "yes" else "no" for r in results
                       if "verified" in r)
    views = total - counts[PG_REJECTS] - counts[NOT_A_VIEW]  # what PostgreSQL creates as a view
    summary = {"files": len(files), "queries": total, "views": views,
               "views_with_unnamed_columns_named": sum("unnamed_columns" in r for r in results
                                                       if r["status"] != PG_REJECTS),
               "accepted": counts["accepted"],
               "accepted_share": counts["accepted"] / total if total else 0.0,
               "accepted_of_views": counts["accepted"] / views if views else 0.0,
               "by_status": {s: counts[s] for s in STATUSES},
               "by_group": {g: {s: v[s] for s in STATUSES} for g, v in by_group.items()},
               "refused_constructs": dict(constructs.most_common()),
               "verified": dict(verified)}
    t = RichTable(title="DBToaster query suite (tpch, finance, simple as written; keys added)")
    for col in ("group", "files", "queries", "accepted", "refused", "error", "PostgreSQL "
                "rejects", "not a view"):
        t.add_column(col)
    for g in GROUPS:
        v = by_group[g]
        t.add_row(g, str(sum(f.group == g for f in files)), str(sum(v.values())),
                  str(v["accepted"]), str(v["refused"]), str(v["error"]), str(v[PG_REJECTS]),
                  str(v[NOT_A_VIEW]))
    c.print(t)
    named = sum("unnamed_columns" in r for r in results if r["status"] != PG_REJECTS)
    c.print(f"{total} queries in {len(files)} files; PostgreSQL runs {views} as views ({named} "
            f"once their unnamed columns are named); idivm accepts {counts['accepted']} "
            f"({summary['accepted_share']:.1%} of all, "
            f"{summary['accepted_of_views']:.1%} of the views)")
    for k, n in constructs.most_common():
        c.print(f"  refused {n}: {k}")
    for r in results:
        if r["status"] in ("refused", "error"):
            c.print(f"  {r['status']} {r['group']}/{r['query']}: {r['message']}")
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
