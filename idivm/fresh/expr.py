"""Scalar expressions of the fresh-view calculus: small immutable nodes over typed variables.

The core algebra keeps sqlglot expressions; the trigger compiler needs to substitute variables,
split products and emit C++, so it converts them once into these nodes. Values are 64-bit:
``int`` (also dates as yyyymmdd, booleans, and interned strings), or ``float``. NULL is outside
this backend (a fresh view is maintained over NOT NULL data; a NULL literal is refused).
"""

from __future__ import annotations

import dataclasses
import datetime
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from idivm.errors import UnsupportedSQL

# Value types: "int", "float", "str" (interned id), "date" (yyyymmdd int), "bool" (0/1 int).


def sql_type(type_sql: str, where: str) -> str:
    """The calculus type of a catalog column type; unsupported types are refused by name."""
    t = type_sql.upper()
    base = t.split("(")[0].strip()
    if base in ("INT", "INTEGER", "BIGINT", "SMALLINT", "TINYINT", "INT2", "INT4", "INT8"):
        return "int"
    if base in ("NUMERIC", "DECIMAL", "REAL", "DOUBLE PRECISION", "DOUBLE", "FLOAT", "FLOAT4",
                "FLOAT8", "MONEY"):
        return "float"
    if base in ("TEXT", "VARCHAR", "CHAR", "CHARACTER", "CHARACTER VARYING", "BPCHAR", "STRING"):
        return "str"
    if base == "DATE":
        return "date"
    if base in ("BOOLEAN", "BOOL"):
        return "bool"
    raise UnsupportedSQL(f"column type {type_sql}",
                         f"{where}: fresh views support integer, numeric, text, date and boolean "
                         "columns")


@dataclass(frozen=True)
class Expr:
    type: str

    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True)
class Var(Expr):
    """A query variable: an equivalence class of columns joined by equality."""

    name: str


@dataclass(frozen=True)
class Arg(Expr):
    """Column ``index`` of the tuple an event carries (``side`` 1 is the old tuple of an update)."""

    index: int
    side: int = 0


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | str


@dataclass(frozen=True)
class Arith(Expr):
    op: str  # + - * /
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Neg(Expr):
    arg: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Cmp(Expr):
    op: str  # = <> < <= > >=
    left: Expr
    right: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class BoolOp(Expr):
    op: str  # and / or
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class Not(Expr):
    arg: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Case(Expr):
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr

    def children(self) -> tuple[Expr, ...]:
        return tuple(x for w in self.whens for x in w) + (self.default,)


@dataclass(frozen=True)
class Extract(Expr):
    """EXTRACT(YEAR|MONTH|DAY FROM date): dates are yyyymmdd words, so this is arithmetic."""

    field: str  # year | month | day
    arg: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Like(Expr):
    """``arg LIKE pattern`` with a constant pattern (``%``, ``_``); text is interned, so the
    runtime memoizes the answer per string id."""

    arg: Expr
    pattern: str

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True)
class Substr(Expr):
    """SUBSTRING(arg FROM start FOR length) with constant bounds (PostgreSQL's rules for a
    start below 1); the result is interned, memoized per string id."""

    arg: Expr
    start: int
    length: int

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


def walk(e: Expr) -> Iterator[Expr]:
    yield e
    for c in e.children():
        yield from walk(c)


def variables(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def has_args(e: Expr) -> bool:
    return any(isinstance(n, Arg) for n in walk(e))


def null_reads(e: Expr, names: set[str]) -> str | None:
    """How ``e`` reads the variables ``names``, all NULL together (a global aggregate's row over
    no input): None when it reads none of them, ``"strict"`` when ``e`` is then NULL
    (arithmetic, comparisons, NOT, LIKE, … propagate a NULL), else the operator that may make a
    value of it (``AND``, ``OR``, ``CASE``)."""
    if isinstance(e, Var):
        return "strict" if e.name in names else None
    kids = [null_reads(c, names) for c in e.children()]
    found = [k for k in kids if k is not None]
    if not found:
        return None
    hidden = next((k for k in found if k != "strict"), None)
    if hidden is not None:
        return hidden
    if isinstance(e, Case):
        return "CASE"
    if isinstance(e, BoolOp) and len(found) < len(kids):  # NULL AND false, NULL OR true
        return e.op.upper()
    return "strict"


def substitute(e: Expr, f: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up, replacing a node by ``f(node)`` where that is not None."""
    r = f(e)
    if r is not None:
        return r
    if isinstance(e, Arith):
        return Arith(e.type, e.op, substitute(e.left, f), substitute(e.right, f))
    if isinstance(e, Neg):
        return Neg(e.type, substitute(e.arg, f))
    if isinstance(e, Cmp):
        return Cmp(e.type, e.op, substitute(e.left, f), substitute(e.right, f))
    if isinstance(e, BoolOp):
        return BoolOp(e.type, e.op, tuple(substitute(a, f) for a in e.args))
    if isinstance(e, Not):
        return Not(e.type, substitute(e.arg, f))
    if isinstance(e, Case):
        return Case(e.type, tuple((substitute(c, f), substitute(v, f)) for c, v in e.whens),
                    substitute(e.default, f))
    if isinstance(e, Extract | Like | Substr):
        return dataclasses.replace(e, arg=substitute(e.arg, f))
    return e


def old_tuple(e: Expr) -> Expr:
    """``e`` over the old tuple of an update (its event arguments on side 1)."""
    return substitute(e, lambda n: Arg(n.type, n.index, 1) if isinstance(n, Arg) else None)


def rename(e: Expr, mapping: Mapping[str, Expr]) -> Expr:
    return substitute(e, lambda n: mapping.get(n.name) if isinstance(n, Var) else None)


# ----------------------------------------------------------------------------- from sqlglot

_ARITH = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/"}
_CMP = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}


def _date_value(text: str, what: str) -> int:
    try:
        d = datetime.date.fromisoformat(text.strip()[:10])
    except ValueError as e:
        raise UnsupportedSQL(what, f"{text!r} is not a date") from e
    return d.year * 10000 + d.month * 100 + d.day


def _arith_type(op: str, a: Expr, b: Expr) -> str:
    for x in (a, b):
        if x.type in ("str", "date") and not isinstance(x, Const):
            raise UnsupportedSQL(f"{op} over {x.type}", "fresh views do arithmetic on numbers "
                                 "only")
    return "float" if "float" in (a.type, b.type) else "int"


def _coerce(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    """A text literal compared with a date column is a date literal."""
    if isinstance(b, Const) and b.type == "str" and a.type == "date":
        return a, Const("date", _date_value(str(b.value), "date literal"))
    if isinstance(a, Const) and a.type == "str" and b.type == "date":
        return Const("date", _date_value(str(a.value), "date literal")), b
    return a, b


def from_sql(e: exp.Expr, column: Callable[[str], Expr]) -> Expr:
    """Convert a sqlglot scalar expression; ``column`` resolves a plan column name."""
    if isinstance(e, exp.Paren):
        return from_sql(e.this, column)
    if isinstance(e, exp.Column):
        return column(e.name)
    if isinstance(e, exp.Literal):
        if e.is_string:
            return Const("str", e.this)
        text = e.this
        return Const("int", int(text)) if text.lstrip("-").isdigit() else Const("float",
                                                                                float(text))
    if isinstance(e, exp.Boolean):
        return Const("bool", 1 if e.this else 0)
    if isinstance(e, exp.Null):
        raise UnsupportedSQL("NULL", "fresh views are maintained over NOT NULL values")
    if isinstance(e, exp.Cast | exp.TryCast):
        inner = from_sql(e.this, column)
        to = e.to.sql("postgres").upper()
        if to == "DATE" and isinstance(inner, Const):
            return Const("date", _date_value(str(inner.value), "DATE literal"))
        target = sql_type(to, "CAST")
        if target == inner.type or (target == "float" and inner.type == "int"):
            return inner if target == inner.type else Arith("float", "*", inner,
                                                            Const("float", 1.0))
        raise UnsupportedSQL(f"CAST({inner.type} AS {to})", "not supported in fresh views")
    if isinstance(e, exp.Date | exp.DateStrToDate | exp.TsOrDsToDate):
        inner = from_sql(e.this, column)
        if isinstance(inner, Const):
            return Const("date", _date_value(str(inner.value), "DATE literal"))
    for cls, op in _ARITH.items():
        if isinstance(e, cls):
            a, b = from_sql(e.left, column), from_sql(e.right, column)
            return Arith(_arith_type(op, a, b), op, a, b)
    if isinstance(e, exp.Neg):
        a = from_sql(e.this, column)
        if isinstance(a, Const) and not isinstance(a.value, str):
            return Const(a.type, -a.value)
        return Neg(a.type, a)
    for cls, op in _CMP.items():
        if isinstance(e, cls):
            a, b = _coerce(from_sql(e.left, column), from_sql(e.right, column))
            if (a.type == "str") != (b.type == "str"):
                raise UnsupportedSQL(f"comparison of {a.type} with {b.type}", e.sql("postgres"))
            if a.type == "str" and op not in ("=", "<>"):
                raise UnsupportedSQL(f"text comparison {op}", "fresh views compare text "
                                     "with = and <> only (strings are interned)")
            return Cmp("bool", op, a, b)
    if isinstance(e, exp.And | exp.Or):
        return BoolOp("bool", "and" if isinstance(e, exp.And) else "or",
                      (from_sql(e.left, column), from_sql(e.right, column)))
    if isinstance(e, exp.Not):
        return Not("bool", from_sql(e.this, column))
    if isinstance(e, exp.Between):
        x = from_sql(e.this, column)
        lo, hi = _coerce(x, from_sql(e.args["low"], column))[1], _coerce(
            x, from_sql(e.args["high"], column))[1]
        return BoolOp("bool", "and", (Cmp("bool", ">=", x, lo), Cmp("bool", "<=", x, hi)))
    if isinstance(e, exp.In) and not e.args.get("query"):
        x = from_sql(e.this, column)
        opts = [_coerce(x, from_sql(v, column))[1] for v in e.expressions]
        return BoolOp("bool", "or", tuple(Cmp("bool", "=", x, o) for o in opts))
    if isinstance(e, exp.Case):
        whens = []
        for w in e.args.get("ifs") or []:
            whens.append((from_sql(w.this, column), from_sql(w.args["true"], column)))
        default_sql = e.args.get("default")
        if default_sql is None:
            raise UnsupportedSQL("CASE without ELSE", "its NULL result is outside fresh views")
        default = from_sql(default_sql, column)
        types = {v.type for _, v in whens} | {default.type}
        t = "float" if types <= {"int", "float"} and "float" in types else default.type
        if len(types - {"int", "float"} if t == "float" else types) > 1:
            raise UnsupportedSQL("CASE with mixed result types", e.sql("postgres"))
        return Case(t, tuple(whens), default)
    if isinstance(e, exp.Extract):
        field = e.this.name.lower()
        x = from_sql(e.expression, column)
        if field not in ("year", "month", "day"):
            raise UnsupportedSQL(f"EXTRACT({field.upper()})", "fresh views extract YEAR, MONTH "
                                 "and DAY from dates")
        if x.type != "date":
            raise UnsupportedSQL(f"EXTRACT from {x.type}", "fresh views extract from dates")
        return Extract("int", field, x)
    if isinstance(e, exp.ILike):
        raise UnsupportedSQL("ILIKE", "fresh views match text with LIKE only")
    if isinstance(e, exp.Like):
        x = from_sql(e.this, column)
        pat = e.expression
        if not (isinstance(pat, exp.Literal) and pat.is_string):
            raise UnsupportedSQL("LIKE with a non-constant pattern", e.sql("postgres"))
        if x.type != "str":
            raise UnsupportedSQL(f"LIKE over {x.type}", e.sql("postgres"))
        out: Expr = Like("bool", x, pat.this)
        return Not("bool", out) if e.args.get("negate") else out
    if isinstance(e, exp.Substring):
        x = from_sql(e.this, column)
        start, length = e.args.get("start"), e.args.get("length")
        bounds = [from_sql(b, column) if b is not None else Const("int", 1 << 30)
                  for b in (start, length)]
        if x.type != "str" or not all(isinstance(b, Const) and b.type == "int"
                                      for b in bounds):
            raise UnsupportedSQL("SUBSTRING with non-constant bounds or over non-text",
                                 e.sql("postgres"))
        first, count = (int(b.value) for b in bounds if isinstance(b, Const))
        if count < 0:
            raise UnsupportedSQL("SUBSTRING with a negative length", e.sql("postgres"))
        return Substr("str", x, first, count)
    raise UnsupportedSQL(e.key.upper(), "this expression is not supported in fresh views")


def like_regex(pattern: str) -> re.Pattern[str]:
    """SQL LIKE (``%`` any run, ``_`` one character, no escape) as a regular expression."""
    return re.compile("".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch)
                              for ch in pattern), re.DOTALL)


def substring(s: str, start: int, length: int) -> str:
    """PostgreSQL's substring(s FROM start FOR length): positions from 1; a start below 1
    shortens the result by as much."""
    end = start + length
    return s[max(start, 1) - 1:max(end - 1, 0)]


# ----------------------------------------------------------------------------- evaluation


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge}


def evaluate(e: Expr, env: Mapping[str, Any]) -> Any:
    """Python evaluation (the output projections of rows(); tests)."""
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Arith):
        a, b = evaluate(e.left, env), evaluate(e.right, env)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.type == "int":
            q = abs(int(a)) // abs(int(b))
            return q if (a >= 0) == (b >= 0) else -q
        return a / b
    if isinstance(e, Neg):
        return -evaluate(e.arg, env)
    if isinstance(e, Cmp):
        a, b = evaluate(e.left, env), evaluate(e.right, env)
        return int(_COMPARE[e.op](a, b))
    if isinstance(e, BoolOp):
        vals = [bool(evaluate(a, env)) for a in e.args]
        return int(all(vals) if e.op == "and" else any(vals))
    if isinstance(e, Not):
        return int(not evaluate(e.arg, env))
    if isinstance(e, Case):
        for c, v in e.whens:
            if evaluate(c, env):
                return evaluate(v, env)
        return evaluate(e.default, env)
    if isinstance(e, Extract):
        d = evaluate(e.arg, env)
        if isinstance(d, datetime.date):
            return getattr(d, e.field)
        return {"year": d // 10000, "month": d // 100 % 100, "day": d % 100}[e.field]
    if isinstance(e, Like):
        return int(like_regex(e.pattern).fullmatch(evaluate(e.arg, env)) is not None)
    if isinstance(e, Substr):
        return substring(evaluate(e.arg, env), e.start, e.length)
    raise TypeError(e)


def show(e: Expr) -> str:
    """A compact SQL-like rendering (map definitions in the program listing)."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Arg):
        return f"{'old.' if e.side else ''}${e.index}"
    if isinstance(e, Const):
        return repr(e.value) if isinstance(e.value, str) else str(e.value)
    if isinstance(e, Arith):
        return f"({show(e.left)} {e.op} {show(e.right)})"
    if isinstance(e, Neg):
        return f"-{show(e.arg)}"
    if isinstance(e, Cmp):
        return f"{show(e.left)} {e.op} {show(e.right)}"
    if isinstance(e, BoolOp):
        return "(" + f" {e.op.upper()} ".join(show(a) for a in e.args) + ")"
    if isinstance(e, Not):
        return f"NOT {show(e.arg)}"
    if isinstance(e, Case):
        ws = " ".join(f"WHEN {show(c)} THEN {show(v)}" for c, v in e.whens)
        return f"CASE {ws} ELSE {show(e.default)} END"
    if isinstance(e, Extract):
        return f"EXTRACT({e.field.upper()} FROM {show(e.arg)})"
    if isinstance(e, Like):
        return f"{show(e.arg)} LIKE {e.pattern!r}"
    if isinstance(e, Substr):
        return f"SUBSTRING({show(e.arg)}, {e.start}, {e.length})"
    raise TypeError(e)
