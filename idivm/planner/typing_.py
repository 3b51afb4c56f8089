"""The SQL type of a projected expression, where it follows from its inputs' types.

A ∪ pads the other branch's columns with NULLs, which must carry the column's type: an
untyped NULL materializes as ``text`` and then meets integers (fuzz seeds 203, 232, 251).
Only what PostgreSQL's rules make certain is inferred; anything else stays unknown (None) and
renders as before. Types are PostgreSQL type names as the catalog spells them.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

__all__ = ["aggregate_type", "common_type", "expression_type"]

_INTEGERS = ("SMALLINT", "INT2", "INT", "INTEGER", "INT4")
_BIGINTS = ("BIGINT", "INT8")
_FLOATS = ("DOUBLE PRECISION", "DOUBLE", "FLOAT8", "FLOAT", "REAL", "FLOAT4")


def _base(ty: str | None) -> str:
    return (ty or "").upper().split("(")[0].strip()


def expression_type(e: exp.Expr, types: Mapping[str, str | None]) -> str | None:
    """The type of ``e`` over input columns typed by ``types``; None where not certain."""
    if isinstance(e, exp.Paren):
        return expression_type(e.this, types)
    if isinstance(e, exp.Column):
        return types.get(e.name)
    if isinstance(e, exp.Cast):
        return e.to.sql("postgres")
    if isinstance(e, exp.Boolean) or isinstance(e, exp.Predicate | exp.Not | exp.And | exp.Or):
        return "BOOLEAN"
    if isinstance(e, exp.Literal):
        if e.is_string:
            return "TEXT"
        text = e.this
        if "." in text or "e" in text.lower():
            return "NUMERIC"
        return "INT" if abs(int(text)) < 2**31 else "BIGINT"
    if isinstance(e, exp.Neg):
        return expression_type(e.this, types)
    if isinstance(e, exp.Coalesce | exp.Case):
        branches = ([e.this, *e.expressions] if isinstance(e, exp.Coalesce)
                    else [*(i.args.get("true") for i in e.args.get("ifs") or []),
                          e.args.get("default")])
        return common_type([expression_type(b, types) for b in branches
                            if b is not None and not _is_null(b)])
    if isinstance(e, exp.Add | exp.Sub | exp.Mul | exp.Div):
        return _arithmetic_type(expression_type(e.this, types),
                                expression_type(e.expression, types))
    return None


def _is_null(e: exp.Expr) -> bool:
    """A NULL literal, parenthesized or not: a branch that takes the others' type (fuzz seed
    59010: an unnested scalar subquery's ``CASE WHEN p IS NULL THEN (NULL) ELSE v END``)."""
    while isinstance(e, exp.Paren):
        e = e.this
    return isinstance(e, exp.Null)


_DOUBLES = ("DOUBLE PRECISION", "DOUBLE", "FLOAT8", "FLOAT")


def _arithmetic_type(left: str | None, right: str | None) -> str | None:
    """The type of ``left op right`` for + - * / as PostgreSQL resolves it, where certain:
    an integer of equal types keeps it, with a bigint a bigint; with a numeric (and no
    double) a numeric; with a double precision a double precision (fuzz seed 10369:
    ``AVG(c1 * 2)`` of a double ``c1``). Anything else (real, text, dates) stays unknown."""
    if left is None or right is None:
        return None
    lb, rb = _base(left), _base(right)
    ints = (*_INTEGERS, *_BIGINTS)
    nums = (*ints, "NUMERIC", "DECIMAL")
    if left == right and lb in ints:
        return left
    if lb in ints and rb in ints:
        return "BIGINT" if lb in _BIGINTS or rb in _BIGINTS else None
    if lb in (*nums, *_DOUBLES) and rb in (*nums, *_DOUBLES):
        if lb in _DOUBLES or rb in _DOUBLES:
            return "DOUBLE PRECISION"
        return "NUMERIC"
    return None


def common_type(branches: list[str | None]) -> str | None:
    """The type PostgreSQL resolves for the branches of a COALESCE, a CASE or a UNION, where
    certain: one type, or numbers of several (an integer type widens to a wider integer, to
    numeric, or to double precision; fuzz seed 10579: ``COALESCE(numeric(8,2) column,
    -0.75)`` is numeric). Anything else (unknown branches, text of several kinds, real) stays
    unknown."""
    if not branches or any(b is None for b in branches):
        return None
    distinct = set(branches)
    if len(distinct) == 1:
        return branches[0]
    out: str | None = branches[0]
    for b in branches[1:]:
        if out is None:
            return None
        lo, lb = _base(out), _base(b)
        if lo in _INTEGERS and lb in _INTEGERS:  # smallint with integer: integer
            small = ("SMALLINT", "INT2")
            out = out if lo in small and lb in small else "INT"
            continue
        out = _arithmetic_type(out, b)
    return out


def widened(arg_type: str | None) -> str | None:
    """The type a difference of two values of ``arg_type`` is computed in so that it cannot
    overflow where the values themselves do not (BIGINT for the 2- and 4-byte integers)."""
    return "BIGINT" if _base(arg_type) in _INTEGERS else None


def aggregate_type(func: str, arg_type: str | None) -> str | None:
    """The type of ``func`` (sum, avg, min, max, count, count_star) over ``arg_type``."""
    base = _base(arg_type)
    if func in ("count", "count_star"):
        return "BIGINT"
    if func in ("min", "max"):
        return arg_type or None
    if func == "sum":
        if base in _INTEGERS:
            return "BIGINT"
        if base in _BIGINTS or base in ("NUMERIC", "DECIMAL"):
            return "NUMERIC"
        if base in _FLOATS:
            return "DOUBLE PRECISION"
    if func == "avg":
        if base in (*_INTEGERS, *_BIGINTS, "NUMERIC", "DECIMAL"):
            return "NUMERIC"
        if base in _FLOATS:
            return "DOUBLE PRECISION"
    return None
