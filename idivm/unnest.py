"""Subquery unnesting: pure rewrites of a qualified SQL tree, applied by the frontend.

Each rewrite turns a subquery form the algebra has no operator for into one it has, the standard
way (Kim; Dayal; Galindo-Legaria & Joshi), so the rules of the operators it lands on maintain it:

- ``x op ANY (S)`` / ``x op ALL (S)`` as a WHERE conjunct → ``EXISTS`` / ``NOT EXISTS`` with the
  comparison (ALL: its negation, NULL counting as not true) pushed into S: a semijoin or
  antijoin (``semijoin.py``, ``antijoin.py``).
- A scalar aggregate subquery compared in a conjunct, ``x < (SELECT 0.2*avg(y) FROM R WHERE
  R.k = outer.k AND …)`` → a derived table grouped by the correlation columns,
  ``(SELECT 0.2*avg(y) AS __v, R.k AS __k1 FROM R WHERE … GROUP BY R.k)``, joined on
  ``__k1 = outer.k``, with the conjunct reading ``__v``: an aggregate (``aggregate.py``) joined
  in (``join.py``), maintained by affected groups. Uncorrelated, it is a one-row global
  aggregate joined to every row.

The join is exact only when a missing subquery row and a NULL subquery value both make the
conjunct not true; the rewrite checks that (the value is NULL on no rows: SUM, AVG, MIN, MAX
under arithmetic; the conjunct is strict in it: comparisons and arithmetic), and refuses the
rest by name (COUNT, which is 0 on no rows; a subquery under OR, CASE, COALESCE, IS NULL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from idivm.errors import UnsupportedSQL

COMPARISONS: tuple[type[exp.Expr], ...] = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
# nodes through which a NULL operand makes the whole expression NULL
STRICT: tuple[type[exp.Expr], ...] = COMPARISONS + (
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Paren, exp.Cast, exp.Not)
NULL_ON_EMPTY_AGGS: tuple[type[exp.Expr], ...] = (exp.Sum, exp.Avg, exp.Min, exp.Max)


def _select_of(e: exp.Expr) -> exp.Expr:
    return e.this if isinstance(e, exp.Subquery) else e


def join_group(item: exp.Expr) -> exp.Table | None:
    """A parenthesised join, ``(a JOIN b ON …)`` as a FROM or JOIN item: its first table,
    holding the joins; None for any other item."""
    inner = item
    while isinstance(inner, exp.Subquery) and not inner.alias:
        inner = inner.this
    if inner is not item and isinstance(inner, exp.Table) and inner.args.get("joins"):
        return inner
    return None


def leaf_items(items: list[exp.Expr]) -> list[exp.Expr]:
    """FROM and JOIN items with parenthesised joins opened: tables and derived tables."""
    out: list[exp.Expr] = []
    for i in items:
        g = join_group(i)
        if g is None:
            out.append(i)
        else:
            head = g.copy()
            head.set("joins", None)
            out += [head, *leaf_items([j.this for j in g.args["joins"]])]
    return out


def _items(select: exp.Select) -> list[exp.Expr]:
    from_ = select.args.get("from_") or select.args.get("from")
    return leaf_items(([from_.this] if from_ is not None else []) + [
        j.this for j in select.args.get("joins") or []])


def own_aliases(select: exp.Select) -> set[str]:
    """The aliases a SELECT's own FROM and JOIN items introduce."""
    return {i.alias_or_name for i in _items(select)}


def own_sources(select: exp.Select) -> dict[str, exp.Expr]:
    """The FROM and JOIN items of a SELECT by alias (tables and derived tables)."""
    return {i.alias_or_name: i for i in _items(select)}


def outer_columns(e: exp.Expr, own: set[str]) -> list[exp.Column]:
    """Qualified columns of ``e`` naming neither ``own`` nor a source of a query nested in
    ``e`` (the references out of the query ``own`` belongs to)."""
    nested: set[str] = set()
    for q in e.find_all(exp.Select):
        nested |= own_aliases(q)
    return [c for c in e.find_all(exp.Column)
            if c.table and c.table not in own and c.table not in nested]


# -- constant subqueries -----------------------------------------------------------------


def inline_constants(tree: exp.Expr) -> exp.Expr:
    """``(SELECT <constant>)`` — a subquery with no FROM, WHERE or aggregate, one column of
    literals — as its value (DBToaster's ``(SELECT 3)``); ``EXISTS (SELECT … WHERE φ)``
    without FROM as ``(φ) IS TRUE``."""

    def constant(q: exp.Expr) -> exp.Expr | None:
        if (isinstance(q, exp.Select) and not (q.args.get("from_") or q.args.get("from"))
                and len(q.expressions) == 1 and not any(
                    q.args.get(a) for a in ("where", "group", "having", "distinct", "limit"))
                and not q.expressions[0].find(exp.Column, exp.AggFunc, exp.Query)):
            return exp.paren(q.expressions[0].unalias().copy())
        return None

    def sub(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Exists) and isinstance(n.this, exp.Select) and not (
                n.this.args.get("from_") or n.this.args.get("from")) and not any(
                n.this.args.get(a) for a in ("group", "having", "distinct", "limit")) and not any(
                x.find(exp.AggFunc) for x in n.this.expressions):
            # EXISTS (SELECT … WHERE φ) without FROM: one row where φ holds
            where = n.this.args.get("where")
            return exp.paren(exp.Is(this=exp.paren(where.this.copy()), expression=exp.true())) \
                if where is not None else exp.true()
        if isinstance(n, exp.In) and n.args.get("query") is not None:
            q = n.args["query"]
            v = constant(q.this if isinstance(q, exp.Subquery) else q)
            return exp.EQ(this=n.this.copy(), expression=v) if v is not None else n
        if not isinstance(n, exp.Subquery) or isinstance(n.parent, exp.From | exp.Join):
            return n
        v = constant(n.this)
        if v is None or isinstance(n.parent, exp.Exists | exp.Any | exp.All):
            return n
        return v

    return tree.transform(sub)


# -- ANY / ALL --------------------------------------------------------------------------------


def quantified(conjunct: exp.Expr, fresh: Callable[[str], str]) -> exp.Expr | None:
    """``[NOT] x op ANY|SOME|ALL (S)`` as ``[NOT] EXISTS (…)``; None when ``conjunct`` is not
    one. Valid as a WHERE conjunct (where NULL and FALSE both drop the row)."""
    negated = False
    inner = conjunct
    while isinstance(inner, exp.Paren | exp.Not):
        if isinstance(inner, exp.Not):
            negated = not negated
        inner = inner.this
    if not isinstance(inner, COMPARISONS):
        return None
    quant = inner.expression
    if not isinstance(quant, exp.Any | exp.All):
        return None
    sub = _select_of(quant.this)
    if not isinstance(sub, exp.Query):
        return None  # x = ANY (ARRAY[…]) is a plain predicate
    is_all = isinstance(quant, exp.All)
    x = inner.this
    if (isinstance(sub, exp.Select) and sub.find(exp.AggFunc) and not sub.args.get("group")
            and not sub.args.get("having") and len(sub.expressions) == 1):
        # a one-row aggregate: x op ALL/ANY {v} is x op v (NULL when v is)
        cmp1: exp.Expr = type(inner)(this=x.copy(), expression=exp.Subquery(this=sub.copy()))
        return exp.not_(cmp1) if negated else cmp1

    def compare(y: exp.Expr) -> exp.Expr:
        return type(inner)(this=exp.paren(x.copy()), expression=exp.paren(y))

    if (isinstance(sub, exp.Select) and not sub.args.get("group") and not sub.args.get("having")
            and not sub.args.get("distinct") and not sub.find(exp.AggFunc)
            and not sub.args.get("limit") and len(sub.expressions) == 1):
        body = sub.copy()
        y = body.expressions[0].unalias()
    else:
        if len(sub.selects) != 1:
            raise UnsupportedSQL("ANY/ALL (subquery)", "the subquery must return one column")
        alias = fresh("__quant")
        name = sub.selects[0].alias_or_name
        body = exp.select("1").from_(exp.Subquery(
            this=sub.copy(), alias=exp.TableAlias(this=exp.to_identifier(alias))))
        y = exp.column(name, table=alias)
    # x op ANY S holds iff some comparison is true; x op ALL S iff none is not true;
    # NOT (x op ANY S) iff none is not false; NOT (x op ALL S) iff some is false
    cmp = compare(y)
    if not is_all and not negated:
        test, exists = cmp, True
    elif is_all and not negated:
        test, exists = exp.not_(exp.Is(this=exp.paren(cmp), expression=exp.true())), False
    elif not is_all:
        test, exists = exp.not_(exp.Is(this=exp.paren(cmp), expression=exp.false())), False
    else:
        test, exists = exp.Is(this=exp.paren(cmp), expression=exp.false()), True
    body.set("expressions", [exp.Literal.number(1)])
    body = body.where(test, copy=False)
    probe = exp.Exists(this=body)
    return probe if exists else exp.not_(probe)


# -- EXISTS / IN inside a condition ------------------------------------------------------


def counted(conjunct: exp.Expr) -> exp.Expr:
    """``EXISTS (S)`` inside a WHERE conjunct (under OR, NOT, CASE …) as
    ``(SELECT count(*) FROM S) > 0``, and under AND / OR only, ``x IN (SELECT y FROM S)`` as
    ``(SELECT count(*) FROM S WHERE y = x) > 0``, ``x op ANY (…)`` as the count where
    ``x op y`` is positive, ``x op ALL (…)`` as the count where ``x op y`` is not true being
    0: compared scalar aggregates, which ``scalar`` decorrelates (a COUNT is 0 over no rows:
    joined LEFT, read as 0 where no row joins). Exact: EXISTS is two-valued, as the
    comparison is; an IN / ANY / ALL that is NULL rather than false rejects the row as false
    does wherever only AND and OR are above it. A top-level EXISTS / IN conjunct is left to
    the semijoin."""
    conjunct = conjunct.copy()

    def plain(sub: exp.Expr) -> bool:
        return isinstance(sub, exp.Select) and bool(
            sub.args.get("from_") or sub.args.get("from")) and not any(
            sub.args.get(a) for a in ("group", "having", "distinct", "limit")) and not any(
            x.find(exp.AggFunc) for x in sub.expressions)

    def positive(n: exp.Expr) -> bool:
        p = n.parent
        while p is not None and n is not conjunct:
            if not isinstance(p, exp.And | exp.Or | exp.Paren):
                return False
            n, p = p, p.parent
        return True

    for e in list(conjunct.find_all(exp.Exists, exp.In, *COMPARISONS)):
        if e is conjunct or e.find_ancestor(exp.Query) is not None:
            continue  # the conjunct itself; or inside a subquery, its own scope
        zero = False  # the count must be 0 (ALL) rather than positive
        if isinstance(e, COMPARISONS):  # x op ANY / ALL (SELECT y …) under AND / OR
            quant = e.expression
            if not isinstance(quant, exp.Any | exp.All) or not positive(e):
                continue
            body = _select_of(quant.this).copy()
            if not isinstance(body, exp.Select) or not plain(body) or len(
                    body.expressions) != 1:
                continue
            test: exp.Expr = type(e)(this=_wrapped(e.this),
                                     expression=_wrapped(body.expressions[0].unalias()))
            if isinstance(quant, exp.All):  # no y for which x op y is not true
                zero = True
                test = exp.not_(exp.Is(this=exp.paren(test), expression=exp.true()))
            body = body.where(test, copy=False)
        elif isinstance(e, exp.Exists) and plain(e.this):
            body = e.this.copy()
        elif isinstance(e, exp.In) and e.args.get("query") is not None and positive(e):
            body = _select_of(e.args["query"]).copy()
            if not isinstance(body, exp.Select) or not plain(body) or len(
                    body.expressions) != 1:
                continue
            y, x = body.expressions[0].unalias(), e.this
            body = body.where(exp.EQ(this=_wrapped(y), expression=_wrapped(x)), copy=False)
        else:
            continue
        body.set("expressions", [exp.Count(this=exp.Star())])
        cmp = exp.EQ if zero else exp.GT
        e.replace(exp.paren(cmp(this=exp.Subquery(this=body), expression=exp.Literal.number(0))))
    return conjunct


def _wrapped(e: exp.Expr) -> exp.Expr:
    return e.copy() if isinstance(e, exp.Column | exp.Literal) else exp.paren(e.copy())


def subquery_position(c: exp.Expr) -> str:
    """The first subquery of ``c`` as the user wrote it, and the operator it is under
    (``EXISTS under OR``), for a refusal."""
    q = c.find(exp.Query)
    if q is None:
        return "a subquery"
    node: exp.Expr = q.parent if isinstance(q.parent, exp.Subquery) else q
    what = "a scalar subquery"
    if isinstance(node.parent, exp.Exists):
        node, what = node.parent, "EXISTS"
    elif isinstance(node.parent, exp.In):
        node, what = node.parent, "IN (subquery)"
    elif isinstance(node.parent, exp.Any | exp.All):
        node = node.parent
        what = f"{node.key.upper()} (subquery)"
        if isinstance(node.parent, COMPARISONS):
            node = node.parent
            what = f"{_OPERATORS.get(node.key, node.key)} {what}"
    p = node.parent
    while isinstance(p, exp.Paren):
        p = p.parent
    if isinstance(p, exp.Not):
        what = f"NOT {what}"
        node = p
        p = p.parent
        while isinstance(p, exp.Paren):
            p = p.parent
    if p is None or node is c:
        return what
    return f"{what} under {_OPERATORS.get(p.key, p.key.upper())}"


_OPERATORS = {"eq": "=", "neq": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<=",
              "if": "CASE", "case": "CASE", "is": "IS", "coalesce": "COALESCE"}


# -- scalar aggregate subqueries ----------------------------------------------------------


def exists_one_row(conjunct: exp.Expr) -> exp.Expr | None:
    """``EXISTS (SELECT … FROM (SELECT <aggregates> FROM … WHERE …) n WHERE φ)`` → φ with n's
    columns read as scalar subqueries: an aggregate without GROUP BY has exactly one row, so
    the EXISTS holds when φ does over it (DBToaster's ``r_existsnestedagg``). None when
    ``conjunct`` is not of that shape."""
    e = conjunct.this if isinstance(conjunct, exp.Paren) else conjunct
    if not isinstance(e, exp.Exists) or not isinstance(e.this, exp.Select):
        return None
    sub = e.this
    from_ = sub.args.get("from_") or sub.args.get("from")
    if from_ is None or sub.args.get("joins") or not isinstance(from_.this, exp.Subquery):
        return None
    inner = from_.this.this
    if not isinstance(inner, exp.Select) or any(inner.args.get(a) for a in (
            "group", "having", "distinct", "limit")) or not inner.expressions or not all(
            x.find(exp.AggFunc) for x in inner.expressions):
        return None
    alias = from_.this.alias_or_name
    values = {x.alias_or_name: x.unalias() for x in inner.expressions}
    where = sub.args.get("where")
    if where is None:
        return exp.true()  # an aggregate without GROUP BY has its one row
    phi = where.this.copy()
    for col in list(phi.find_all(exp.Column)):
        if col.table == alias and col.name in values:
            one = inner.copy()
            one.set("expressions", [values[col.name].copy()])
            col.replace(exp.Subquery(this=one))
    return phi


def scalar_subqueries(e: exp.Expr) -> list[exp.Subquery]:
    """The outermost subqueries of ``e`` used as values (not IN / EXISTS / ANY / ALL)."""
    out: list[exp.Subquery] = []
    for sq in e.find_all(exp.Subquery):
        if any(sq is not o and o in _ancestors(sq) for o in out):
            continue
        parent = sq.parent
        if isinstance(parent, exp.Exists | exp.Any | exp.All) or (
                isinstance(parent, exp.In) and parent.args.get("query") is sq):
            continue
        if isinstance(parent, exp.From | exp.Join) or any(
                isinstance(a, exp.Subquery | exp.Query) for a in _ancestors(sq, stop=e)):
            continue  # a derived table, or inside another query (its own scope unnests it)
        out.append(sq)
    return out


def _ancestors(n: exp.Expr, stop: exp.Expr | None = None) -> list[exp.Expr]:
    out = []
    p = n.parent
    while p is not None and p is not stop:
        out.append(p)
        p = p.parent
    return out


@dataclass(frozen=True)
class Unnested:
    """An expression with its scalar subqueries replaced by columns of derived tables."""

    conjunct: exp.Expr
    sources: tuple[exp.Subquery, ...]  # the derived tables (aliased), to join in
    joins: tuple[exp.Expr, ...]  # correlation equalities between them and the outer sources
    padded: bool = False  # join the sources LEFT (the expression reads a missing row right)


def scalar(conjunct: exp.Expr, outer_own: set[str], fresh: Callable[[str], str],
           padded: bool = False,
           outer_sources: Mapping[str, exp.Expr] | None = None) -> Unnested:
    """Unnest every scalar subquery of ``conjunct`` (a WHERE or HAVING conjunct of the query
    whose own sources are ``outer_own``).

    Joined as an inner join where a missing subquery row and a NULL value both reject the row
    (a strict conjunct over a value NULL over no rows); otherwise, or when ``padded`` (a SELECT
    item), joined LEFT, the expression reading the value the subquery has over no rows where
    no row joins (``COUNT`` 0, ``SUM`` NULL, …). ``outer_sources``: the outer query's FROM items
    by alias, for correlations other than equalities (magic sets, see ``_grouped``)."""
    conjunct = conjunct.copy()
    subs = scalar_subqueries(conjunct)
    grouped = []
    for sq in subs:
        alias = fresh("__scalar")
        grouped.append((sq, alias, *_grouped(sq.this, alias, outer_own, outer_sources or {})))
    if not any(corr for _, _, _, corr, _ in grouped):
        padded = False  # uncorrelated: a global γ, always exactly one row with the true value
    elif not padded:
        try:
            for sq in subs:
                _check_strict(sq, conjunct)
                _check_null_on_empty(sq.this)
        except UnsupportedSQL:
            padded = True
    sources: list[exp.Subquery] = []
    joins: list[exp.Expr] = []
    for sq, alias, derived, corr, empty in grouped:
        sources.append(derived)
        joins += corr
        value: exp.Expr = exp.column("__v", table=alias)
        if padded and corr:
            value = exp.Case(ifs=[exp.If(this=exp.Is(this=exp.column("__p", table=alias),
                                                      expression=exp.null()), true=empty)],
                             default=value)
        sq.replace(value)
    return Unnested(conjunct, tuple(sources), tuple(joins), padded)


def _check_strict(sq: exp.Subquery, conjunct: exp.Expr) -> None:
    node: exp.Expr = sq
    while node is not conjunct:
        parent = node.parent
        assert parent is not None
        if not isinstance(parent, STRICT) and not (isinstance(parent, exp.In)
                                                   and parent.this is node):
            raise UnsupportedSQL(
                "scalar subquery under " + parent.key.upper(),
                "a scalar subquery is maintained as a compared value (comparisons and "
                "arithmetic over it in a WHERE or HAVING conjunct), where no row and a NULL "
                "value both reject the row")
        node = parent


def _check_null_on_empty(sub: exp.Expr) -> None:
    """The subquery's value is NULL over no rows: arithmetic over SUM, AVG, MIN, MAX."""
    if not isinstance(sub, exp.Select) or len(sub.expressions) != 1:
        return  # refused, by name, where it is unnested
    value = sub.expressions[0].unalias()
    for n in value.walk(prune=lambda n: isinstance(n, exp.AggFunc | exp.Column | exp.DataType)):
        if isinstance(n, exp.AggFunc) and not isinstance(n, NULL_ON_EMPTY_AGGS):
            raise UnsupportedSQL(f"scalar subquery with {n.key.upper()}", "not NULL over no rows")
        if not isinstance(n, STRICT + NULL_ON_EMPTY_AGGS + (exp.Column, exp.Literal,
                                                           exp.DataType)):
            raise UnsupportedSQL(f"scalar subquery over {n.key.upper()}", "not strict")


def empty_value(value: exp.Expr) -> exp.Expr:
    """An aggregate expression's value over no rows: COUNT 0, every other aggregate NULL."""
    def sub(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Count):
            return exp.Literal.number(0)
        if isinstance(n, exp.AggFunc):
            return exp.null()
        return n

    return exp.paren(value.transform(sub))


def _grouped(sub: exp.Expr, alias: str, outer_own: set[str],
             sources: Mapping[str, exp.Expr]) -> tuple[exp.Subquery, list[exp.Expr], exp.Expr]:
    """The scalar subquery ``sub`` as a derived table grouped by its correlation columns,
    the equalities joining it to the outer query, and its value over no rows.

    A correlation other than an equality (``b2.price > b1.price``) is decorrelated with a
    magic set: the distinct values of the outer columns it reads (``SELECT DISTINCT price
    FROM bids``) join the subquery's sources under that condition, the derived table is
    grouped by them too, and it joins the outer query on equalities with them."""
    if isinstance(sub, exp.Select) and not (sub.args.get("from_") or sub.args.get("from")):
        raise UnsupportedSQL("scalar subquery without FROM",
                             "a constant subquery should be inlined by the caller")
    if not isinstance(sub, exp.Select):
        raise UnsupportedSQL("scalar subquery over a set operation", "not maintained")
    for arg, what in (("group", "GROUP BY"), ("having", "HAVING"), ("distinct", "DISTINCT"),
                      ("limit", "LIMIT")):
        if sub.args.get(arg):
            raise UnsupportedSQL(f"scalar subquery with {what}",
                                 "only single-row aggregate subqueries are maintained")
    if len(sub.expressions) != 1:
        raise UnsupportedSQL("scalar subquery", "the subquery must return one column")
    value = sub.expressions[0].unalias()
    if not value.find(exp.AggFunc):
        raise UnsupportedSQL("scalar subquery without an aggregate",
                             "a non-aggregate scalar subquery may return several rows; "
                             "join its table instead")
    for n in value.find_all(exp.AggFunc):
        if isinstance(n.this, exp.Distinct):
            raise UnsupportedSQL("DISTINCT aggregate in a scalar subquery", "not maintained")
    if outer_columns(value, own_aliases(sub)):
        raise UnsupportedSQL("correlated aggregate argument",
                             "the aggregate of a scalar subquery reads only its own tables")
    own = own_aliases(sub)
    where = sub.args.get("where")
    local: list[exp.Expr] = []
    theta: list[exp.Expr] = []  # correlations other than equalities
    keys: list[tuple[exp.Expr, exp.Expr]] = []  # (inner expression, outer expression)
    for c in _conjuncts(where.this if where is not None else None):
        refs = outer_columns(c, own)
        if not refs:
            local.append(c)
            continue
        pair = _correlation(c, own)
        if pair is None:
            theta.append(c)
            continue
        for col in outer_columns(pair[1], set()):
            if col.table not in outer_own:
                raise UnsupportedSQL("scalar subquery correlated two levels up",
                                     f"{col.sql('postgres')} is not a source of the query "
                                     "the subquery is compared in")
        keys.append(pair)
    body = sub.copy()
    body.set("where", None)
    if theta:
        magic, outer_keys = _magic_set(theta, own, alias, sources)
        body = body.join(magic, join_type="cross", copy=False)
        local += theta
        keys += outer_keys
    if local:
        body = body.where(exp.and_(*[x.copy() for x in local]), copy=False)
    items: list[exp.Expr] = [exp.alias_(value.copy(), "__v"),
                             exp.alias_(exp.Literal.number(1), "__p")]
    items += [exp.alias_(k.copy(), f"__k{i}") for i, (k, _) in enumerate(keys, 1)]
    body.set("expressions", items)
    if keys:
        body = body.group_by(*[k.copy() for k, _ in keys], copy=False)
    derived = exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(alias)))
    joins: list[exp.Expr] = [
        exp.EQ(this=exp.column(f"__k{i}", table=alias), expression=o.copy())
        for i, (_, o) in enumerate(keys, 1)]
    return derived, joins, empty_value(value)


def _magic_set(theta: list[exp.Expr], own: set[str], alias: str,
               sources: Mapping[str, exp.Expr]) -> tuple[exp.Subquery,
                                                         list[tuple[exp.Expr, exp.Expr]]]:
    """The distinct values of the outer columns ``theta`` reads, from the one outer source
    they belong to, as a derived table; ``theta`` is rewritten in place to read it. Returns
    the table and the (magic column, outer column) correlation pairs."""
    cols: dict[tuple[str, str], str] = {}
    for c in theta:
        for col in outer_columns(c, own):
            cols.setdefault((col.table, col.name), f"__m{len(cols) + 1}")
    tables = {t for t, _ in cols}
    what = " AND ".join(c.sql("postgres") for c in theta)
    if len(tables) != 1 or next(iter(tables)) not in sources:
        raise UnsupportedSQL("correlated scalar subquery with a non-equality correlation "
                             "across several outer sources or levels",
                             f"{what}: a non-equality correlation is decorrelated when it "
                             "reads one source of the query the subquery is compared in")
    (table,) = tables
    m_alias = f"{alias}_m"
    src = sources[table].copy()
    magic = exp.select(*[exp.alias_(exp.column(n, table=table), m) for (_, n), m in
                         cols.items()]).from_(src).distinct()
    for c in theta:
        for col in outer_columns(c, own):
            col.replace(exp.column(cols[(col.table, col.name)], table=m_alias))
    pairs: list[tuple[exp.Expr, exp.Expr]] = [
        (exp.column(m, table=m_alias), exp.column(n, table=t)) for (t, n), m in cols.items()]
    return exp.Subquery(this=magic, alias=exp.TableAlias(this=exp.to_identifier(m_alias))), \
        pairs


def _conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    if e is None:
        return []
    if isinstance(e, exp.And):
        return _conjuncts(e.left) + _conjuncts(e.right)
    if isinstance(e, exp.Paren) and isinstance(e.this, exp.And):
        return _conjuncts(e.this)
    return [e]


def _correlation(c: exp.Expr, own: set[str]) -> tuple[exp.Expr, exp.Expr] | None:
    """``inner = outer`` (either way round) as (inner, outer); None for anything else."""
    if isinstance(c, exp.Paren):
        return _correlation(c.this, own)
    if not isinstance(c, exp.EQ):
        return None
    for a, b in ((c.this, c.expression), (c.expression, c.this)):
        if a.find(exp.Select) or b.find(exp.Select):
            return None
        a_out, b_out = outer_columns(a, own), outer_columns(b, own)
        a_cols, b_cols = list(a.find_all(exp.Column)), list(b.find_all(exp.Column))
        if a_cols and not a_out and b_cols and len(b_out) == len(b_cols):
            return a, b
    return None


# -- outer joins in an IN / EXISTS subquery ------------------------------------------------


def has_outer_join(sub: exp.Expr) -> bool:
    """Whether a SELECT's own FROM joins anything LEFT, RIGHT or FULL (or parenthesised)."""
    if not isinstance(sub, exp.Select):
        return False
    from_ = sub.args.get("from_") or sub.args.get("from")
    joins = sub.args.get("joins") or []
    return any((j.side or "").upper() in ("LEFT", "RIGHT", "FULL") for j in joins) or any(
        join_group(i) is not None for i in [*([from_.this] if from_ else []),
                                            *[j.this for j in joins]])


def outer_join_probe(sub: exp.Select, fresh: Callable[[str], str]) -> exp.Select:
    """``IN (SELECT e FROM x LEFT JOIN y ON … WHERE local AND corr)`` (or EXISTS) →
    ``IN (SELECT e' FROM (SELECT <the columns e and corr read> FROM x LEFT JOIN y ON … WHERE
    local) AS __probe WHERE corr')``.

    An IN / EXISTS subquery without aggregates is read flat, its sources joined and its
    correlation conjuncts made the probe's condition: right for inner joins, but an outer join read
    so loses its padded rows. Moved into a derived table, the joins are planned as a FROM clause
    is (outer joins as outer joins) and only the correlation stays in the probe. Conjuncts of
    WHERE apply after every join, so the correlated ones may move above the derived table; a
    correlated ON condition may not (it decides which rows are padded): refused by name."""
    own = own_aliases(sub)
    for j in sub.args.get("joins") or []:
        on = j.args.get("on")
        if isinstance(on, exp.Expr) and outer_columns(on, own):
            raise UnsupportedSQL(
                "correlated ON condition in a subquery with an outer join",
                f"{on.sql('postgres')[:80]}: an outer join's padded rows depend on it; move "
                "the correlation to the subquery's WHERE")
    where = sub.args.get("where")
    local: list[exp.Expr] = []
    corr: list[exp.Expr] = []
    for c in _conjuncts(where.this if where is not None else None):
        (corr if outer_columns(c, own) else local).append(c)
    kept = [*sub.expressions, *corr]
    for e in kept:
        if e.find(exp.Query):
            raise UnsupportedSQL("nested subquery predicate", "not maintained")
    alias = fresh("__probe")
    cols: dict[tuple[str, str], str] = {}
    for e in kept:
        for col in e.find_all(exp.Column):
            if col.table in own:
                cols.setdefault((col.table, col.name), f"__c{len(cols) + 1}")
    body = sub.copy()
    body.set("where", None)
    if local:
        body = body.where(exp.and_(*[x.copy() for x in local]), copy=False)
    items = [exp.alias_(exp.column(n, table=t), name) for (t, n), name in cols.items()]
    body.set("expressions", items or [exp.alias_(exp.Literal.number(1), "__c0")])

    def reread(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and (n.table, n.name) in cols:
            return exp.column(cols[(n.table, n.name)], table=alias)
        return n

    out = exp.select(*[e.transform(reread) for e in sub.expressions]).from_(
        exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(alias))))
    if corr:
        out = out.where(exp.and_(*[x.transform(reread) for x in corr]), copy=False)
    return out
