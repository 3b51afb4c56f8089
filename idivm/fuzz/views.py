"""Random view SQL over what the README lists as supported: inner, θ-, self- and outer joins,
WHERE with AND/OR/NOT, comparisons, IS NULL, BETWEEN, IN-lists, CASE, COALESCE, GROUP BY/HAVING
with SUM/COUNT/AVG/MIN/MAX, DISTINCT, EXISTS/IN/NOT EXISTS/NOT IN and scalar subqueries,
derived tables, WITH, UNION [ALL]/EXCEPT/INTERSECT — nested to a bounded depth; for PostgreSQL and
Spark (not fresh views) also GROUP BY expressions, an aggregate over DISTINCT values,
``op ANY/ALL``, ``LIKE``, ``EXTRACT`` and ``SUBSTRING``.

Every column reference is qualified, every output column is named (``c0``, ``c1``, … unique),
and types are tracked so comparisons, aggregates and set operations are valid.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from idivm.fuzz.schema import SchemaDef, TableDef, kind_value, literal

COMPARE = ("=", "<>", "<", "<=", ">", ">=")
ORDERED = ("int", "num", "text", "date")


@dataclass(frozen=True)
class Col:
    qual: str
    name: str
    kind: str
    nullable: bool

    @property
    def ref(self) -> str:
        return f"{self.qual}.{self.name}"


@dataclass(frozen=True)
class OutCol:
    name: str
    kind: str
    nullable: bool


@dataclass(frozen=True)
class Source:
    """A relation a FROM clause can read: a base table or a CTE in scope."""

    name: str
    cols: tuple[OutCol, ...]
    is_cte: bool = False


@dataclass
class _Ctx:
    rng: random.Random
    schema: SchemaDef
    n: int = 0
    ctes: list[Source] = field(default_factory=list)

    def alias(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


def random_view(rng: random.Random, schema: SchemaDef) -> str:
    """One view's SQL (a SELECT, a set operation or a WITH)."""
    ctx = _Ctx(rng, schema)
    depth = schema.config.max_depth
    return _query(ctx, depth, None, top=True)[0]


def _fresh(ctx: _Ctx) -> bool:
    return ctx.schema.config.profile == "fresh"


def _full(ctx: _Ctx) -> bool:
    """Every construct the README lists (PostgreSQL's and Spark's profiles)."""
    return ctx.schema.config.profile in ("pg", "spark")


def _query(ctx: _Ctx, depth: int, sig: list[str] | None, top: bool = False
           ) -> tuple[str, list[OutCol]]:
    """A query: a WITH, a set operation or a select block (``sig``: the output kinds)."""
    r = ctx.rng.random()
    fresh = _fresh(ctx)
    nested_ok = top or ctx.schema.config.nested_with
    if depth > 0 and not fresh and nested_ok and r < 0.12:
        return _with(ctx, depth, sig)
    if depth > 0 and not fresh and r < 0.24:
        return _setop(ctx, depth, sig)
    return _select(ctx, depth, sig)


def _with(ctx: _Ctx, depth: int, sig: list[str] | None) -> tuple[str, list[OutCol]]:
    saved = list(ctx.ctes)
    parts = []
    for _ in range(1 if ctx.rng.random() < 0.8 else 2):
        name = ctx.alias("w")
        body, cols = _query(ctx, depth - 1, None)
        parts.append(f"{name} AS ({body})")
        ctx.ctes.append(Source(name, tuple(cols), True))
    main, cols = _select(ctx, depth - 1, sig, prefer_cte=True)
    ctx.ctes = saved
    return f"WITH {', '.join(parts)} {main}", cols


def _setop(ctx: _Ctx, depth: int, sig: list[str] | None) -> tuple[str, list[OutCol]]:
    if sig is None:
        sig = [ctx.rng.choice(["int", "int", "text", "num", "date"])
               for _ in range(ctx.rng.randint(1, 2))]
    op = ctx.rng.choice(["UNION ALL", "UNION ALL", "UNION", "EXCEPT", "INTERSECT"])
    left, lcols = _select(ctx, depth - 1, sig, allow_agg=True)
    right, rcols = _select(ctx, depth - 1, sig, allow_agg=True)
    cols = [OutCol(lc.name, lc.kind, lc.nullable or rc.nullable)
            for lc, rc in zip(lcols, rcols, strict=True)]
    return f"{left} {op} {right}", cols


# -- FROM ------------------------------------------------------------------------------------
def _table_source(ctx: _Ctx, t: TableDef) -> Source:
    return Source(t.name, tuple(OutCol(c.name, c.kind, c.nullable) for c in t.columns))


def _from_item(ctx: _Ctx, depth: int, prefer_cte: bool) -> tuple[str, list[Col]]:
    rng = ctx.rng
    if ctx.ctes and (prefer_cte or rng.random() < 0.3):
        src = rng.choice(ctx.ctes)
    elif depth > 0 and rng.random() < 0.15:
        alias = ctx.alias("d")
        body, cols = _query(ctx, depth - 1, None)
        return f"({body}) AS {alias}", [Col(alias, c.name, c.kind, c.nullable) for c in cols]
    else:
        src = _table_source(ctx, rng.choice(ctx.schema.tables))
    alias = ctx.alias("a")
    return f"{src.name} AS {alias}", [Col(alias, c.name, c.kind, c.nullable) for c in src.cols]


def _pairs(left: list[Col], right: list[Col]) -> list[tuple[Col, Col]]:
    return [(a, b) for a in left for b in right
            if a.kind == b.kind and a.kind in ORDERED]


def _join_cond(ctx: _Ctx, left: list[Col], right: list[Col], theta: bool) -> str | None:
    pairs = _pairs(left, right)
    ints = [p for p in pairs if p[0].kind == "int"]
    if not pairs:
        return None
    keyed = [p for p in pairs if p[0] in _first_key(ctx, left)]
    a, b = ctx.rng.choice(keyed if keyed and ctx.rng.random() < 0.3 else
                          ints if ints and ctx.rng.random() < 0.8 else pairs)
    op = ctx.rng.choice(["<", "<=", ">", "<>"]) if theta and a.kind != "text" else "="
    cond = f"{a.ref} {op} {b.ref}"
    if ctx.rng.random() < 0.15:
        cond += f" AND {_simple_pred(ctx, right)}"
    return cond


def _from(ctx: _Ctx, depth: int, prefer_cte: bool) -> tuple[str, list[Col], list[str]]:
    """FROM text, the columns in scope and extra WHERE conjuncts (of comma joins)."""
    rng = ctx.rng
    text, env = _from_item(ctx, depth, prefer_cte)
    where: list[str] = []
    n = rng.choices([1, 2, 3], [35, 42, 23])[0]
    fresh = _fresh(ctx)
    comma = False
    for _ in range(n - 1):
        item, cols = _from_item(ctx, depth, False)
        kind = rng.choices(["comma", "inner", "theta", "left", "right", "full", "cross"],
                           [18, 42, 7, 17, 5, 6, 3] if not fresh else [30, 50, 10, 0, 0, 0, 3])[0]
        if comma:
            kind = "comma"  # JOIN … ON after a comma join sees only the last FROM item
        cond = _join_cond(ctx, env, cols, kind == "theta")
        comma = comma or kind == "comma"
        if cond is None or kind == "cross":
            text += f" CROSS JOIN {item}"
        elif kind == "comma":
            text += f", {item}"
            where.append(cond)
        elif kind in ("inner", "theta"):
            text += f" JOIN {item} ON {cond}"
        else:
            text += f" {kind.upper()} JOIN {item} ON {cond}"
            if kind in ("left", "full"):
                cols = [Col(c.qual, c.name, c.kind, True) for c in cols]
            if kind in ("right", "full"):
                env = [Col(c.qual, c.name, c.kind, True) for c in env]
        env = env + cols
    return text, env, where


# -- expressions and predicates ---------------------------------------------------------------
def _lit(ctx: _Ctx, kind: str) -> str:
    ty = {"int": "int", "num": "numeric(8,2)", "text": "text", "date": "date",
          "bool": "boolean"}[kind]
    return literal(kind, kind_value(ctx.rng, ty))


def _cols(env: list[Col], *kinds: str) -> list[Col]:
    return [c for c in env if c.kind in kinds]


def _op(ctx: _Ctx, kind: str) -> str:
    if kind == "text" and _fresh(ctx):  # fresh views compare interned text by = and <> only
        return ctx.rng.choice(("=", "<>", "<>"))
    return ctx.rng.choices(COMPARE, (1, 2, 2, 2, 2, 2))[0]


def _simple_pred(ctx: _Ctx, env: list[Col]) -> str:
    rng = ctx.rng
    ordered = _cols(env, *ORDERED)
    c = rng.choice(ordered) if ordered else None
    r = rng.random()
    if c is None:
        b = _cols(env, "bool")
        return f"{b[0].ref}" if b else "TRUE"
    if r < 0.40:
        return f"{c.ref} {_op(ctx, c.kind)} {_lit(ctx, c.kind)}"
    if r < 0.52:
        same = [d for d in ordered if d.kind == c.kind and d != c]
        if same:
            return f"{c.ref} {_op(ctx, c.kind)} {rng.choice(same).ref}"
        if _fresh(ctx):
            return f"{c.ref} {_op(ctx, c.kind)} {_lit(ctx, c.kind)}"
        return f"{c.ref} IS NOT NULL"
    if r < 0.62 and not _fresh(ctx):
        nullable = [d for d in env if d.nullable and d.kind != "json"] or [c]
        return f"{rng.choice(nullable).ref} IS {rng.choice(['', 'NOT '])}NULL"
    if r < 0.70 and c.kind in ("int", "num", "date"):
        lo, hi = sorted([_lit(ctx, c.kind), _lit(ctx, c.kind)])
        return f"{c.ref} BETWEEN {lo} AND {hi}"
    if r < 0.78:
        vals = sorted({_lit(ctx, c.kind) for _ in range(rng.randint(1, 3))})
        return f"{c.ref} {rng.choice(['', 'NOT '])}IN ({', '.join(vals)})"
    if r < 0.84 and not _fresh(ctx):
        texts = _cols(env, "text")
        if texts and _full(ctx) and rng.random() < 0.3:
            pattern = rng.choice(["a%", "%b", "_", "c", "%", "a_"])
            return f"{rng.choice(texts).ref} {rng.choice(['', 'NOT '])}LIKE '{pattern}'"
        return f"COALESCE({c.ref}, {_lit(ctx, c.kind)}) {_op(ctx, c.kind)} {_lit(ctx, c.kind)}"
    if r < 0.90:
        return (f"CASE WHEN {c.ref} {_op(ctx, c.kind)} {_lit(ctx, c.kind)} THEN 1 "
                f"ELSE 0 END = {rng.choice([0, 1])}")
    b = _cols(env, "bool")
    if b:
        return f"{rng.choice(['', 'NOT '])}{rng.choice(b).ref}"
    return f"{c.ref} {_op(ctx, c.kind)} {_lit(ctx, c.kind)}"


def _pred(ctx: _Ctx, env: list[Col], depth: int) -> str:
    rng = ctx.rng
    r = rng.random()
    if r < 0.12:
        return f"({_simple_pred(ctx, env)} OR {_simple_pred(ctx, env)})"
    if r < 0.17:
        return f"NOT ({_simple_pred(ctx, env)})"
    if r < 0.36 and depth > 0:
        return _subquery_pred(ctx, env, depth)
    return _simple_pred(ctx, env)


def _inner_block(ctx: _Ctx, depth: int, outer: list[Col], corr: Col | None
                 ) -> tuple[str, list[Col], list[str]]:
    """FROM text and WHERE conjuncts of a subquery, correlated on ``corr`` when given."""
    text, env, where = _from(ctx, depth - 1, False) if ctx.rng.random() < 0.3 else (
        *_from_item(ctx, depth - 1, False), [])
    if corr is not None:
        same = [c for c in env if c.kind == corr.kind]
        if same:
            where.append(f"{ctx.rng.choice(same).ref} = {corr.ref}")
    if ctx.rng.random() < 0.4:
        where.append(_simple_pred(ctx, env))
    return text, env, where


def _where(where: list[str]) -> str:
    return f" WHERE {' AND '.join(where)}" if where else ""


def _subquery_pred(ctx: _Ctx, env: list[Col], depth: int) -> str:
    rng = ctx.rng
    ordered = _cols(env, "int", "text", "date", "num")
    if not ordered:
        return _simple_pred(ctx, env)
    c = rng.choice(ordered)
    kind = rng.choices(["exists", "not exists", "in", "not in", "scalar", "any"],
                       [30, 15, 25, 10, 20, 8 if _full(ctx) else 0])[0]
    if kind == "any":  # x op ANY|ALL (S), perhaps correlated, perhaps negated
        corr = rng.choice(ordered) if rng.random() < 0.3 else None
        text, inner, where = _inner_block(ctx, depth, env, corr)
        cands = [d for d in inner if d.kind == c.kind]
        if not cands:
            return _simple_pred(ctx, env)
        neg = "NOT " if rng.random() < 0.2 else ""
        return (f"{neg}{c.ref} {_op(ctx, c.kind)} {rng.choice(['ANY', 'ALL', 'SOME'])} "
                f"(SELECT {rng.choice(cands).ref} FROM {text}{_where(where)})")
    if kind in ("exists", "not exists"):
        text, _, where = _inner_block(ctx, depth, env, c)
        neg = "NOT " if kind == "not exists" else ""
        return f"{neg}EXISTS (SELECT 1 FROM {text}{_where(where)})"
    if kind in ("in", "not in"):
        corr = rng.choice(ordered) if rng.random() < 0.25 else None
        text, inner, where = _inner_block(ctx, depth, env, corr)
        cands = [d for d in inner if d.kind == c.kind]
        if not cands:
            return _simple_pred(ctx, env)
        d = rng.choice(cands)
        if kind == "not in":
            if c.nullable or d.nullable:  # NOT IN over nullable columns is documented refused
                nn = [x for x in ordered if not x.nullable and x.kind == d.kind]
                if d.nullable or not nn:
                    anti = _where([*where, f"{d.ref} = {c.ref}"])
                    return f"NOT EXISTS (SELECT 1 FROM {text}{anti})"
                c = rng.choice(nn)
            return f"{c.ref} NOT IN (SELECT {d.ref} FROM {text}{_where(where)})"
        return f"{c.ref} IN (SELECT {d.ref} FROM {text}{_where(where)})"
    # scalar aggregate subquery, correlated by an equality or not
    corr = rng.choice(ordered) if rng.random() < 0.6 else None
    text, inner, where = _inner_block(ctx, depth, env, corr)
    nums = _cols(inner, "int", "num")
    if c.kind in ("int", "num") and nums:
        agg = f"{rng.choice(['SUM', 'AVG', 'MIN', 'MAX'])}({rng.choice(nums).ref})"
        if rng.random() < 0.2:
            agg = "COUNT(*)"
    else:
        same = [d for d in inner if d.kind == c.kind]
        if not same:
            return _simple_pred(ctx, env)
        agg = f"{rng.choice(['MIN', 'MAX'])}({rng.choice(same).ref})"
    return f"{c.ref} {_op(ctx, c.kind)} (SELECT {agg} FROM {text}{_where(where)})"


def _expr(ctx: _Ctx, env: list[Col], kind: str | None = None) -> tuple[str, str, bool]:
    """A generalized-projection expression: (text, kind, nullable)."""
    rng = ctx.rng
    cands = [c for c in env if kind is None or c.kind == kind]
    if not cands:
        return _lit(ctx, kind or "int"), kind or "int", False
    c = rng.choice(cands)
    r = rng.random()
    if c.kind in ("int", "num") and r < 0.15:
        others = _cols(env, "int", "num")
        o = rng.choice(others)
        return f"{c.ref} {rng.choice(['+', '-', '*'])} {o.ref}", "num" if "num" in (
            c.kind, o.kind) else c.kind, c.nullable or o.nullable
    if c.kind in ("int", "num") and r < 0.25:
        return f"{c.ref} + {rng.randint(1, 3)}", c.kind, c.nullable
    if r < 0.33 and c.kind in ORDERED and not _fresh(ctx):
        return f"COALESCE({c.ref}, {_lit(ctx, c.kind)})", c.kind, False
    if r < 0.40 and c.kind in ORDERED:
        return (f"CASE WHEN {_simple_pred(ctx, env)} THEN {c.ref} ELSE {_lit(ctx, c.kind)} END",
                c.kind, c.nullable)
    if r < 0.46 and c.kind in ("date", "text") and _full(ctx):
        return _function(ctx, c)
    return c.ref, c.kind, c.nullable


def _function(ctx: _Ctx, c: Col) -> tuple[str, str, bool]:
    """EXTRACT of a date's field (numeric on PostgreSQL), SUBSTRING of a text."""
    if c.kind == "date":
        return (f"EXTRACT({ctx.rng.choice(['YEAR', 'MONTH', 'DAY'])} FROM {c.ref})", "num",
                c.nullable)
    return f"SUBSTRING({c.ref} FROM 1 FOR {ctx.rng.randint(1, 2)})", "text", c.nullable


def _group_expr(ctx: _Ctx, c: Col) -> tuple[str, str, bool]:
    """A GROUP BY key computed from ``c`` (the SELECT list repeats its text)."""
    if c.kind in ("int", "num") and ctx.rng.random() < 0.5:
        return f"{c.ref} + {ctx.rng.randint(1, 3)}", c.kind, c.nullable
    if c.kind in ("date", "text") and ctx.rng.random() < 0.6:
        return _function(ctx, c)
    if c.kind in ORDERED:
        return f"COALESCE({c.ref}, {_lit(ctx, c.kind)})", c.kind, False
    return c.ref, c.kind, c.nullable


# -- SELECT ----------------------------------------------------------------------------------
def _select(ctx: _Ctx, depth: int, sig: list[str] | None, prefer_cte: bool = False,
            allow_agg: bool = True) -> tuple[str, list[OutCol]]:
    rng = ctx.rng
    text, env, where = _from(ctx, depth, prefer_cte)
    if rng.random() < 0.6:
        for _ in range(rng.choices([1, 2, 3], [70, 24, 6])[0]):
            where.append(_pred(ctx, env, depth))
    mode = rng.choices(["plain", "distinct", "agg"], [50, 12, 38])[0]
    if not allow_agg and mode == "agg":
        mode = "plain"
    if mode == "agg":
        return _aggregate(ctx, depth, env, text, where, sig)
    items: list[str] = []
    out: list[OutCol] = []
    kinds = sig if sig is not None else [None] * rng.randint(1, 4)
    for i, k in enumerate(kinds):
        usable = [c for c in env if c.kind != "json" or mode == "plain"]
        if k is None and depth > 0 and rng.random() < 0.06 and sig is None \
                and not _fresh(ctx):
            e, kind, nullable = _scalar_item(ctx, env, depth)
        else:
            e, kind, nullable = _expr(ctx, usable, k)
        items.append(f"{e} AS c{i}")
        out.append(OutCol(f"c{i}", kind, nullable))
    distinct = "DISTINCT " if mode == "distinct" else ""
    return f"SELECT {distinct}{', '.join(items)} FROM {text}{_where(where)}", out


def _scalar_item(ctx: _Ctx, env: list[Col], depth: int) -> tuple[str, str, bool]:
    ordered = _cols(env, "int", "text", "date", "num")
    corr = ctx.rng.choice(ordered) if ordered and ctx.rng.random() < 0.6 else None
    text, inner, where = _inner_block(ctx, depth, env, corr)
    nums = _cols(inner, "int", "num")
    if nums and ctx.rng.random() < 0.8:
        return (f"(SELECT {ctx.rng.choice(['SUM', 'MAX', 'MIN'])}({ctx.rng.choice(nums).ref}) "
                f"FROM {text}{_where(where)})", "num", True)
    return f"(SELECT COUNT(*) FROM {text}{_where(where)})", "int", True


def _agg(ctx: _Ctx, env: list[Col], kind: str | None, distinct: Col | None = None
         ) -> tuple[str, str, bool]:
    """An aggregate item: (text, kind, nullable). ``distinct``: the block's one argument an
    aggregate may take DISTINCT values of (the README's limit: one per query)."""
    rng = ctx.rng
    nums = _cols(env, "int", "num")
    ordered = _cols(env, *ORDERED)
    if distinct is not None and rng.random() < 0.35:
        if kind in ("int", None) and (rng.random() < 0.5 or distinct.kind not in ("int", "num")):
            return f"COUNT(DISTINCT {distinct.ref})", "int", False
        if kind in (None, "num") and distinct.kind in ("int", "num"):
            f = rng.choice(["SUM", "AVG"])
            return f"{f}(DISTINCT {distinct.ref})", "num", True
        if kind in (None, distinct.kind) and distinct.kind in ORDERED:
            return f"{rng.choice(['MIN', 'MAX'])}(DISTINCT {distinct.ref})", distinct.kind, True
    if kind in ("int", None) and (rng.random() < 0.3 or not nums):
        if rng.random() < 0.6 or not env:
            return "COUNT(*)", "int", False
        return f"COUNT({rng.choice(env).ref})", "int", False
    if kind in ("int", "num", None) and nums:
        f = rng.choice(["SUM", "SUM", "AVG", "MIN", "MAX"])
        if kind == "int":
            f = rng.choice(["MIN", "MAX"])
            cands = _cols(env, "int") or nums
        else:
            cands = nums
        c = rng.choice(cands)
        arg = c.ref if rng.random() < 0.8 else f"{c.ref} * 2"
        return f"{f}({arg})", "num" if f in ("SUM", "AVG") else c.kind, True
    cands = [c for c in ordered if kind is None or c.kind == kind]
    if cands:
        c = rng.choice(cands)
        return f"{rng.choice(['MIN', 'MAX'])}({c.ref})", c.kind, True
    return "COUNT(*)", "int", False


def _first_key(ctx: _Ctx, env: list[Col]) -> list[Col]:
    """The primary-key columns of the first FROM item when it is a base table (the preserved
    side of the left joins after it), else none."""
    if not env:
        return []
    mine = [c for c in env if c.qual == env[0].qual]
    names = {c.name for c in mine}
    for t in ctx.schema.tables:
        if {c.name for c in t.columns} == names:
            return [c for c in mine if c.name in t.primary_key]
    return []


def _aggregate(ctx: _Ctx, depth: int, env: list[Col], text: str, where: list[str],
               sig: list[str] | None) -> tuple[str, list[OutCol]]:
    rng = ctx.rng
    groupable = [c for c in env if c.kind not in ("json",)]
    n_group = rng.choices([0, 1, 2], [20, 55, 25])[0] if sig is None else 0
    keys = rng.sample(groupable, min(n_group, len(groupable)))
    first = _first_key(ctx, env)
    if sig is None and first and rng.random() < 0.25:  # by the first item's key (Q13's shape)
        keys = first
    # the key's text in GROUP BY and the SELECT list (an expression of it, on PostgreSQL)
    key_text = {c: (_group_expr(ctx, c) if _full(ctx) and sig is None and rng.random() < 0.25
                    else (c.ref, c.kind, c.nullable)) for c in keys}
    distinct = rng.choice(groupable) if groupable and _full(ctx) and rng.random() < 0.2 \
        else None
    items: list[str] = []
    out: list[OutCol] = []
    if sig is not None:
        for i, k in enumerate(sig):
            gk = [c for c in groupable if c.kind == k and c not in keys]
            if gk and rng.random() < 0.6:
                keys.append(rng.choice(gk))
                items.append(f"{keys[-1].ref} AS c{i}")
                out.append(OutCol(f"c{i}", k, keys[-1].nullable))
            else:
                e, kind, nullable = _agg(ctx, env, k, distinct)
                if kind != k:
                    e, kind, nullable = _lit(ctx, k), k, False
                items.append(f"{e} AS c{i}")
                out.append(OutCol(f"c{i}", kind, nullable))
    else:
        for c in keys:
            text_, kind_, nullable_ = key_text[c]
            items.append(f"{text_} AS c{len(items)}")
            out.append(OutCol(f"c{len(out)}", kind_, nullable_))
        for _ in range(rng.randint(1, 3)):
            e, kind, nullable = _agg(ctx, env, None, distinct)
            items.append(f"{e} AS c{len(items)}")
            out.append(OutCol(f"c{len(out)}", kind, nullable or not keys and kind != "int"))
    group = f" GROUP BY {', '.join(key_text[c][0] if c in key_text else c.ref for c in keys)}" \
        if keys else ""
    having = ""
    if rng.random() < 0.25:
        agg, kind, _ = _agg(ctx, env, None)
        lit = _lit(ctx, kind if kind in ORDERED else "int")
        having = f" HAVING {agg} {_op(ctx, kind)} {lit}"
    sql = f"SELECT {', '.join(items)} FROM {text}{_where(where)}{group}{having}"
    return sql, out
