"""View SQL → logical algebra, through sqlglot's parser and ``qualify``.

Every refusal is raised here, before any I/O: a construct outside what idivm maintains raises
``UnsupportedSQL`` naming it, a table without a primary key raises ``UnsupportedSQL`` naming the
table.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.optimizer.qualify import qualify

from idivm import algebra as A
from idivm import unnest
from idivm.catalog import Catalog
from idivm.errors import CatalogError, UnsupportedSQL

VOLATILE = {
    "now", "random", "clock_timestamp", "statement_timestamp", "transaction_timestamp",
    "timeofday", "nextval", "currval", "setval", "gen_random_uuid", "uuid_generate_v4",
    "setseed", "txid_current", "pg_backend_pid", "rand", "uuid", "current_timestamp",
    "current_date", "current_time", "localtimestamp", "localtime", "unix_timestamp",
    "monotonically_increasing_id",
}
VOLATILE_NODES: tuple[type[exp.Expr], ...] = (
    exp.Rand, exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.CurrentDatetime,
)
AGG_NODES: dict[type[exp.Expr], str] = {
    exp.Sum: "sum", exp.Count: "count", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
}


@dataclass(frozen=True)
class ViewQuery:
    """The algebra of a view and its declared output columns (the root's columns, in order)."""

    root: A.Node
    columns: tuple[str, ...]
    sql: str


def relations_read(sql: str, dialect: str = "postgres", schema: str | None = None
                   ) -> set[str]:
    """The names of the tables (or views) ``sql`` reads, folded as the dialect folds them
    (WITH names are not among them)."""
    tree = parsed(sql, dialect)
    tree = _inline_ctes(tree)
    out = set()
    for t in tree.find_all(exp.Table):
        _unqualify(t, schema)
        if t.name:
            out.add(t.name)
    return out


def parsed(sql: str, dialect: str) -> exp.Expr:
    """The one SELECT query of ``sql``, its unquoted identifiers folded."""
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as e:
        raise UnsupportedSQL("syntax", f"the view SQL does not parse: {e}") from e
    if len(statements) != 1:
        raise UnsupportedSQL("multiple statements", "a view is exactly one SELECT query")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise UnsupportedSQL(tree.key.upper(), "a view is a SELECT query")
    # unquoted identifiers fold to lower case, quoted ones stay, as PostgreSQL reads them
    return normalize_identifiers(tree, dialect=dialect)


def parse_view(sql: str, catalog: Catalog, dialect: str = "postgres",
               narrow: Catalog | None = None, schema: str | None = None) -> ViewQuery:
    """The view's algebra. ``narrow``: the catalog restricted to the columns the view reads
    (``plan.read_catalog``): names resolve in ``catalog``, scans carry ``narrow``'s columns
    only, and a column outside them (a derived table's column nothing above reads) is a typed
    NULL there, its value never reaching the view. ``schema``: the schema the catalog
    describes; a table qualified by it is the catalog's, one qualified by another is refused."""
    tree = parsed(sql, dialect)
    _refuse(tree)
    tree = _alias_tables(unnest.inline_constants(_inline_ctes(tree)))
    for t in tree.find_all(exp.Table):
        _unqualify(t, schema)
        if t.name and not catalog.has_table(t.name):
            raise CatalogError(f"unknown table {t.name!r} in the view")
    try:
        tree = qualify(tree, schema=catalog.sqlglot_mapping_schema(dialect), dialect=dialect,
                       quote_identifiers=False, validate_qualify_columns=True)
    except SqlglotError as e:
        raise UnsupportedSQL("name resolution", str(e)) from e
    conv = _Converter(catalog, narrow)
    root, names = conv.query(tree, outer=None)
    if len(set(names)) != len(names):
        raise UnsupportedSQL("duplicate output column", "every view column needs its own name")
    return ViewQuery(root=root, columns=tuple(names), sql=sql)


def _unqualify(t: exp.Table, schema: str | None) -> None:
    """Drop a qualification naming the catalog's own schema; refuse any other (the catalog
    holds one schema's tables: ``other.t`` must not silently read the catalog's ``t``)."""
    if not t.db and not t.catalog:
        return
    shown = ".".join(p for p in (t.catalog, t.db, t.name) if p)
    if t.catalog or schema is None or t.db != schema:
        raise UnsupportedSQL("table of another schema",
                             f"{shown}: a view reads the tables of its maintainer's schema"
                             + (f" ({schema})" if schema else "; write the table unqualified"))
    t.set("db", None)


def _with_equality(type_name: str) -> str:
    """A type for a NULL standing for a column nothing reads: its own, unless that type has
    no ``=`` (the NULL is still de-duplicated and compared by the i-diffs that carry it):
    json becomes jsonb (same operators), xml text."""
    base = type_name.strip().lower()
    return {"json": "jsonb", "xml": "text"}.get(base, type_name)


def _refuse(tree: exp.Expr) -> None:
    """Name the first construct idivm does not maintain, with the reason."""
    for node in tree.walk():
        if isinstance(node, exp.Window):
            raise UnsupportedSQL("window function", "window functions are not maintained")
        if isinstance(node, exp.Order) and not isinstance(node.parent, exp.Window):
            raise UnsupportedSQL("ORDER BY", "a materialized view is an unordered relation")
        if isinstance(node, exp.Limit | exp.Offset | exp.Fetch):
            raise UnsupportedSQL("LIMIT/OFFSET", "top-k views are not maintained")
        if isinstance(node, exp.Join):
            side = (node.side or "").upper()
            kind = (node.kind or "").upper()
            if kind == "OUTER" and side not in ("LEFT", "RIGHT", "FULL"):
                raise UnsupportedSQL("OUTER JOIN", "say LEFT, RIGHT or FULL")
            if side and isinstance(node.args.get("on"), exp.Expr) and node.args["on"].find(
                    exp.Select):
                raise UnsupportedSQL(f"subquery in a {side} JOIN's ON", "not maintained; "
                                     "join the subquery's result instead")
            if kind in ("SEMI", "ANTI", "ASOF"):
                raise UnsupportedSQL(f"{kind} JOIN", "write EXISTS / NOT EXISTS instead")
            method = str(node.args.get("method") or "").upper()
            if method and method != "NATURAL":
                raise UnsupportedSQL(f"{method} JOIN", "not maintained")
        if isinstance(node, exp.Lateral):
            raise UnsupportedSQL("LATERAL", "lateral subqueries are not maintained")
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise UnsupportedSQL("WITH RECURSIVE", "recursive queries are not maintained")
        if isinstance(node, exp.CTE) and not isinstance(node.this, exp.Query):
            raise UnsupportedSQL("data-modifying WITH", f"the WITH query {node.alias} is "
                                 f"{node.this.key.upper()} … RETURNING; a view cannot change "
                                 "data (PostgreSQL refuses it as a view)")
        if isinstance(node, exp.TableSample):
            raise UnsupportedSQL("TABLESAMPLE", "a sample is non-deterministic input: its "
                                 "rows change without a data change")
        if isinstance(node, exp.Table) and (node.args.get("rows_from") or not isinstance(
                node.this, exp.Identifier)) or isinstance(node, exp.Unnest) and isinstance(
                node.parent, exp.From | exp.Join):
            raise UnsupportedSQL("function in FROM", "a set-returning or table function "
                                 f"({node.sql('postgres')[:60]}) is not a base table; only "
                                 "tables, subqueries and views over them are maintained")
        if isinstance(node, exp.Values) and isinstance(node.parent, exp.From | exp.Join):
            raise UnsupportedSQL("VALUES in FROM", "a constant relation is not maintained; "
                                 "join a table holding the rows")
        if isinstance(node, exp.Rollup | exp.Cube | exp.GroupingSets):
            raise UnsupportedSQL("GROUPING SETS/ROLLUP/CUBE", "not maintained")
        if isinstance(node, exp.Distinct) and node.args.get("on"):
            raise UnsupportedSQL("DISTINCT ON", "not maintained")
        if isinstance(node, exp.Filter):
            raise UnsupportedSQL("aggregate FILTER", "not maintained")
        if isinstance(node, exp.AggFunc) and isinstance(node.this, exp.Distinct) and len(
                node.this.expressions) != 1:
            raise UnsupportedSQL(f"{node.key.upper()}(DISTINCT over several columns)",
                                 "not maintained; use a DISTINCT subquery")
        if isinstance(node, VOLATILE_NODES):
            raise UnsupportedSQL(node.sql(), "volatile functions make a view not maintainable")
        if isinstance(node, exp.Func):
            name = (node.sql_name() if not isinstance(node, exp.Anonymous) else node.name).lower()
            if name in VOLATILE:
                raise UnsupportedSQL(f"{name}()", "volatile functions make a view not "
                                     "maintainable (its value changes without a data change)")
            if isinstance(node, exp.AggFunc) and type(node) not in AGG_NODES:
                raise UnsupportedSQL(f"aggregate {name}", "only SUM, COUNT, AVG, MIN, MAX")
        if isinstance(node, exp.Except | exp.Intersect) and not node.args.get("distinct", True):
            raise UnsupportedSQL(f"{node.key.upper()} ALL", "bag difference is not maintained")


def _alias_tables(tree: exp.Expr) -> exp.Expr:
    """``FROM "Orders"`` as ``FROM "Orders" AS "Orders"`` (the name a table without an alias
    is referred to by): sqlglot's ``qualify`` would alias it by its name folded to lower case,
    and then not resolve ``"Orders".col``."""
    for t in tree.find_all(exp.Table):
        if t.args.get("alias") is None and not t.db and isinstance(t.this, exp.Identifier) \
                and t.this.quoted:
            t.set("alias", exp.TableAlias(this=t.this.copy()))
    return tree


def _inline_ctes(tree: exp.Expr) -> exp.Expr:
    """Non-recursive WITH, at any depth: substitute each CTE as a FROM subquery (pure
    rewrite). A CTE sees the CTEs listed before it and those of the queries enclosing its
    WITH; a nested WITH shadows an outer CTE or table of the same name."""
    return _inline_with(tree.copy(), {})


def _inline_with(e: exp.Expr, env: dict[str, tuple[exp.Expr, exp.TableAlias]]) -> exp.Expr:
    """``e`` (a copy, rewritten in place) with the CTEs of ``env`` and of its own WITH inlined;
    ``env``: CTE name → (its body, already inlined; its alias, for a column list)."""
    w = e.args.get("with_") if isinstance(e, exp.Query) else None
    if w is not None:
        env = dict(env)
        for cte in w.expressions:
            if not isinstance(cte.this, exp.Query):
                continue  # data-modifying: refused by _refuse
            env[cte.alias] = (_inline_with(cte.this, env), cte.args["alias"])
        e.set("with_", None)
    for child in list(e.iter_expressions()):
        if isinstance(child, exp.Table) and not child.db and child.name in env \
                and isinstance(child.this, exp.Identifier):
            if child.args.get("joins"):
                raise UnsupportedSQL("WITH query in a parenthesised join",
                                     "not maintained; join the WITH query outside parentheses")
            body, cte_alias = env[child.name]
            alias = child.args.get("alias")
            if alias is None or not alias.columns:  # the CTE's column list, if any
                alias = exp.TableAlias(this=exp.to_identifier(child.alias_or_name),
                                       columns=[c.copy() for c in cte_alias.columns])
            child.replace(exp.Subquery(this=body.copy(), alias=alias.copy()))
        else:
            _inline_with(child, env)
    return e


@dataclass
class _Scope:
    """Source alias → {column → plan column}; ``outer`` for correlated references."""

    sources: dict[str, dict[str, str]]
    outer: _Scope | None = None
    nullable: dict[str, bool] = field(default_factory=dict)
    unit: dict[str, str] = field(default_factory=dict)  # alias → the outer join holding it
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # table alias → its key

    def user_names(self) -> dict[str, str]:
        """Plan column → ``alias.column`` as the query names it (enclosing queries too)."""
        out = self.outer.user_names() if self.outer is not None else {}
        out.update({p: f"{a}.{c}" for a, cols in self.sources.items() for c, p in cols.items()})
        return out

    def resolve(self, table: str, column: str) -> tuple[str, bool]:
        """Plan column, and whether it came from an enclosing scope."""
        if table in self.sources and column in self.sources[table]:
            return self.sources[table][column], False
        if self.outer is not None:
            name, _ = self.outer.resolve(table, column)
            return name, True
        raise UnsupportedSQL("column reference", f"cannot resolve {table}.{column}" if not (
            table.startswith("__") or column.startswith("__")) else
            "cannot resolve the value of a subquery where it is read")


def _shown(e: exp.Expr, limit: int = 80) -> str:
    """``e`` for a message, as the user wrote it as far as it shows: a value idivm derived
    from a subquery (a column of an internal derived table, starting ``__``) reads
    ``(subquery)``, and a long text is cut."""

    def internal(n: exp.Expr) -> bool:
        return isinstance(n, exp.Column) and (n.table.startswith("__")
                                              or n.name.startswith("__"))

    def sub(n: exp.Expr) -> exp.Expr:
        if internal(n) or isinstance(n, exp.Case) and any(
                internal(c) for c in n.find_all(exp.Column)):
            return exp.var("(subquery)")
        if isinstance(n, exp.Alias) and n.alias.startswith("_col_"):  # named by qualify
            return n.this
        return n

    text = e.transform(sub).sql("postgres")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _nests_local_subqueries(c: exp.Expr) -> bool:
    """Whether ``c``, a [NOT] EXISTS / IN conjunct over a correlated subquery, holds a
    subquery of its own in a condition (a scalar subquery, an EXISTS under OR, …) that
    reads only the subquery's tables: then ``c`` is planned as a compared COUNT
    (``unnest.counted``), its subquery a derived table planned like a FROM clause, rather
    than as a semijoin, whose subquery is read flat."""
    inner = c
    while isinstance(inner, exp.Not | exp.Paren):
        inner = inner.this
    q = inner.this if isinstance(inner, exp.Exists) else inner.args.get("query")
    sub = q.this if isinstance(q, exp.Subquery) else q
    if not isinstance(sub, exp.Select):
        return False
    own = unnest.own_aliases(sub)
    where = sub.args.get("where")
    conds = A.conjuncts(where.this if where is not None else None) + [
        x for j in sub.args.get("joins") or [] for x in A.conjuncts(j.args.get("on"))]
    nested = [p for p in conds if p.find(exp.Query)]
    return bool(nested) and bool(unnest.outer_columns(sub, own)) and not all(
        _Converter.is_subquery_predicate(p) for p in nested) and not any(
        unnest.outer_columns(p, own) for p in nested)


def _resolves(scope: _Scope, table: str, column: str) -> bool:
    try:
        scope.resolve(table, column)
    except UnsupportedSQL:
        return False
    return True


def _own_aggregate(e: exp.Expr) -> bool:
    """An aggregate call of this query level (not one inside a subquery)."""
    return any(isinstance(n, exp.AggFunc) for n in e.walk(
        prune=lambda n: isinstance(n, exp.Subquery | exp.Select) and n is not e))


def _outer_reference(query: exp.Expr, scope: _Scope) -> str | None:
    """A qualified column of ``query`` naming no source of its own but one of an enclosing
    query (``scope`` and its outer scopes), as ``alias.column``."""
    own = {t.alias_or_name for t in query.find_all(exp.Table)} | {
        s.alias for s in query.find_all(exp.Subquery) if s.alias}
    derived = [c for s in query.find_all(exp.Subquery) for c in s.find_all(exp.Column)]
    for col in [*derived, *query.find_all(exp.Column)]:  # a derived table's first
        if col.table and col.table not in own:
            try:
                scope.resolve(col.table, col.name)
            except UnsupportedSQL:
                continue
            return f"{col.table}.{col.name}"
    return None


def _factor_or(c: exp.Expr) -> list[exp.Expr]:
    """(A AND B) OR (A AND C) → A, (B OR C): conjuncts common to every disjunct of an OR
    come out of it (TPC-H Q19 repeats its join predicate in each disjunct; factored, the join
    is an equi-join along a foreign key instead of a filtered cross product)."""
    inner = c.this if isinstance(c, exp.Paren) else c
    if not isinstance(inner, exp.Or):
        return [c]
    disjuncts = list(inner.flatten())
    parts = [A.conjuncts(d.this if isinstance(d, exp.Paren) else d) for d in disjuncts]
    common = [x for x in parts[0] if all(any(x == y for y in p) for p in parts[1:])]
    if not common:
        return [c]
    rests = [[y for y in p if not any(y == x for x in common)] for p in parts]
    if any(not r for r in rests):  # a disjunct is just the common part: the OR is true
        return [x.copy() for x in common]
    ors = [exp.paren(exp.and_(*[y.copy() for y in r])) if len(r) > 1 else r[0].copy()
           for r in rests]
    return [x.copy() for x in common] + [exp.paren(exp.or_(*ors))]


def _connected_order(aliases: list[str], conjuncts: list[set[str | None]]) -> list[int]:
    """An order of the FROM items (inner joins commute) in which every item but the first is
    joined to those before it by some conjunct, where the predicates allow: at each step the
    first remaining item in FROM order that a conjunct connects to the joined ones. A cross
    product is left only where no predicate connects the rest."""
    joined: set[str | None] = set()
    order: list[int] = []
    rest = list(range(len(aliases)))
    while rest:
        pick = rest[0]
        if order:
            for i in rest:
                a = aliases[i]
                if any(a in srcs and srcs & joined and srcs <= joined | {a}
                       for srcs in conjuncts):
                    pick = i
                    break
        order.append(pick)
        joined.add(aliases[pick])
        rest.remove(pick)
    return order


class _Converter:
    def __init__(self, catalog: Catalog, narrow: Catalog | None = None) -> None:
        self.catalog = catalog
        self.narrow = narrow
        self.nids = itertools.count(1)
        self.used: set[str] = set()
        self.absent: dict[str, str] = {}  # plan column of a column not in narrow → its type

    # -- naming --------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        return A.fresh_name(base, self.used)

    def nid(self) -> int:
        return next(self.nids)

    # -- queries -------------------------------------------------------------------------
    def query(self, e: exp.Expr, outer: _Scope | None) -> tuple[A.Node, list[str]]:
        """A query's algebra: its root has exactly the output columns, in order."""
        if isinstance(e, exp.Subquery):
            return self.query(e.this, outer)
        if isinstance(e, exp.Union):
            return self.union(e, outer)
        if isinstance(e, exp.Except | exp.Intersect):
            return self.except_intersect(e, outer)
        if isinstance(e, exp.Select):
            return self.select(e, outer)
        raise UnsupportedSQL(e.key.upper(), "not a query idivm maintains")

    def branch(self, e: exp.Expr, outer: _Scope | None) -> tuple[A.Node, list[str]]:
        """A set-operation input, renamed to fresh plan names."""
        node, names = self.query(e, outer)
        fresh = [self.fresh(f"s__{n}") for n in names]
        cols = node.columns
        return A.Project(self.nid(), node, tuple(
            (f, A.col(c)) for f, c in zip(fresh, cols, strict=True))), fresh

    def union(self, e: exp.Union, outer: _Scope | None) -> tuple[A.Node, list[str]]:
        left, lnames = self.branch(e.left, outer)
        right, rnames = self.branch(e.right, outer)
        if len(lnames) != len(rnames):
            raise UnsupportedSQL("UNION", "both sides need the same number of columns")
        out_names = [n for n in self.query_names(e.left)]
        names = tuple(self.fresh(f"u__{n}") for n in out_names)
        node: A.Node = A.UnionAll(self.nid(), left, right, names, tuple(lnames), tuple(rnames))
        if e.args.get("distinct", True):
            node = A.Aggregate(self.nid(), node, names, ())
        return self.rename(node, list(names), out_names)

    def except_intersect(self, e: exp.SetOperation, outer: _Scope | None
                         ) -> tuple[A.Node, list[str]]:
        left, lnames = self.branch(e.left, outer)
        right, rnames = self.branch(e.right, outer)
        if len(lnames) != len(rnames):
            raise UnsupportedSQL(e.key.upper(), "both sides need the same number of columns")
        distinct = A.Aggregate(self.nid(), left, tuple(lnames), ())
        pred = A.conjoin([exp.NullSafeEQ(this=A.col(a), expression=A.col(b))
                          for a, b in zip(lnames, rnames, strict=True)])
        assert pred is not None
        cls = A.AntiJoin if isinstance(e, exp.Except) else A.SemiJoin
        node = cls(self.nid(), distinct, right, pred)
        return self.rename(node, lnames, self.query_names(e.left))

    def query_names(self, e: exp.Expr) -> list[str]:
        while isinstance(e, exp.Subquery | exp.SetOperation):
            e = e.this if isinstance(e, exp.Subquery) else e.left
        assert isinstance(e, exp.Select)
        return [s.alias_or_name for s in e.expressions]

    def rename(self, node: A.Node, cols: list[str], names: list[str]
               ) -> tuple[A.Node, list[str]]:
        return A.Project(self.nid(), node, tuple(
            (n, A.col(c)) for n, c in zip(names, cols, strict=True))), names

    # -- SELECT ------------------------------------------------------------------------------
    def source(self, item: exp.Expr, scope: _Scope) -> A.Node:
        alias = item.alias_or_name
        if isinstance(item, exp.Table):
            table = self.catalog.table(item.name)
            if not table.primary_key:
                raise UnsupportedSQL(
                    f"table {table.name} without a primary key",
                    f"ID-based maintenance needs a key on every base table; "
                    f"add PRIMARY KEY to {table.name}")
            cols = tuple(self.fresh(f"{alias}__{c.name}") for c in table.columns)
            scope.sources[alias] = {c.name: p for c, p in zip(table.columns, cols, strict=True)}
            renamed = [i.name for i in item.args["alias"].columns] if item.args.get(
                "alias") else []
            if len(renamed) > len(cols):
                raise UnsupportedSQL("column aliases", f"{alias} has {len(cols)} columns")
            for i, new_name in enumerate(renamed):  # t AS x(a, b): the first columns renamed
                if new_name in table.column_names[len(renamed):]:
                    raise UnsupportedSQL("column aliases", f"{alias}.{new_name} would name "
                                         "two columns")
                scope.sources[alias][new_name] = cols[i]
                if new_name != table.columns[i].name and table.columns[i].name not in renamed:
                    del scope.sources[alias][table.columns[i].name]
            scope.keys[alias] = tuple(cols[table.column_names.index(k)]
                                      for k in table.primary_key)
            for c, p in zip(table.columns, cols, strict=True):
                scope.nullable[p] = c.nullable
            read = self.narrow.table(table.name) if self.narrow is not None else table
            scanned = [(p, c.name) for c, p in zip(table.columns, cols, strict=True)
                       if read.has_column(c.name)]
            self.absent.update({p: c.type for c, p in zip(table.columns, cols, strict=True)
                                if not read.has_column(c.name)})
            return A.Scan(self.nid(), table.name, alias, tuple(p for p, _ in scanned),
                          tuple(c for _, c in scanned))
        if isinstance(item, exp.Subquery):
            try:
                node, names = self.query(item.this, None)
            except UnsupportedSQL as e:
                ref = _outer_reference(item.this, scope)
                if ref is None:
                    raise
                raise UnsupportedSQL(
                    "correlated subquery in FROM",
                    f"{'a subquery' if alias.startswith('__') else 'the derived table ' + alias}"
                    f" refers to {ref} of an enclosing query, which "
                    "is not maintained; join its aggregate on the correlation columns "
                    "instead") from e
            fresh = [self.fresh(f"{alias}__{n}") for n in names]
            scope.sources[alias] = dict(zip(names, fresh, strict=True))
            scope.nullable.update(zip(fresh, self.nullable(node), strict=True))
            return A.Project(self.nid(), node, tuple(
                (f, A.col(c)) for f, c in zip(fresh, node.columns, strict=True)))
        raise UnsupportedSQL(item.key.upper(), "only tables and subqueries may appear in FROM")

    def translate(self, e: exp.Expr, scope: _Scope) -> tuple[exp.Expr, bool]:
        """Rewrite qualified column references to plan columns; also report correlation."""
        correlated = False

        def sub(n: exp.Expr) -> exp.Expr:
            nonlocal correlated
            if isinstance(n, exp.Query):
                raise UnsupportedSQL("subquery in this position", f"{_shown(e)}: "
                                     "not maintained")
            if isinstance(n, exp.Column) and n.table:
                name, outer = scope.resolve(n.table, n.name)
                correlated = correlated or outer
                if name in self.absent:  # read by nothing that reaches the view
                    return exp.Cast(this=exp.null(), to=exp.DataType.build(
                        _with_equality(self.absent[name]), dialect="postgres", udt=True))
                return A.col(name)
            if isinstance(n, exp.Column):
                raise UnsupportedSQL("column reference", f"unresolved column {n.sql()}")
            return n

        return e.transform(sub), correlated

    def select(self, s: exp.Select, outer: _Scope | None) -> tuple[A.Node, list[str]]:
        scope = _Scope({}, outer)
        from_ = s.args.get("from_") or s.args.get("from")
        joins = list(s.args.get("joins") or [])
        for j in joins:
            if j.args.get("using"):
                raise UnsupportedSQL("JOIN USING", "could not be resolved")  # qualify rewrites it
        where = s.args.get("where")
        pool = [f for c in A.conjuncts(where.this if where else None) for f in _factor_or(c)]
        pool = [unnest.quantified(c, self.fresh) or unnest.exists_one_row(c) or c
                for c in pool]
        pool = [unnest.counted(exp.paren(c)).this if not self.is_subquery_predicate(c)
                or _nests_local_subqueries(c) else c for c in pool]
        own = unnest.own_aliases(s)
        scalars: list[exp.Expr] = []
        padded: list[unnest.Unnested] = []  # joined LEFT after the rest, read above
        for i, c in enumerate(list(pool)):
            if not unnest.scalar_subqueries(c):  # (an IN probe may be one)
                continue
            u = unnest.scalar(c, own, self.fresh, outer_sources=unnest.own_sources(s))
            if u.padded:
                padded.append(u)
                pool[i] = exp.true()
                continue
            pool[i] = u.conjunct
            pool += list(u.joins)
            scalars += list(u.sources)
        items_out = []
        grouped = s.args.get("group") is not None or any(
            _own_aggregate(i) for i in s.expressions)
        for item in s.expressions:  # SELECT items: their subqueries' rows joined LEFT
            if unnest.scalar_subqueries(item):
                u = unnest.scalar(item, own, self.fresh, padded=True,
                                  outer_sources=unnest.own_sources(s))
                if grouped and not u.joins and all(  # one row whatever the groups:
                        q.find_ancestor(exp.AggFunc) is None  # joined above γ
                        for q in unnest.scalar_subqueries(item)):
                    items_out.append(item)
                    continue
                padded.append(dataclasses.replace(u, conjunct=exp.true()))
                item = u.conjunct
            items_out.append(item)
        if padded:
            s = s.copy()
            s.set("expressions", items_out)
        if from_ is None:  # SELECT without FROM reads the one-row relation
            alias = self.fresh("__one")
            nodes: list[A.Node] = [A.OneRow(self.nid(), alias)]
            scope.sources[alias] = {}
            aliases = [alias]
            inner_on: list[exp.Expr] = []
        else:
            nodes, aliases, inner_on, pool = self.from_clause(from_.this, joins, pool, scope, own)
        pool += inner_on
        nodes += [self.source(item, scope) for item in scalars]
        aliases += [item.alias_or_name for item in scalars]
        subqueries = [c for c in pool if self.is_subquery_predicate(c)]
        plain = [c for c in pool if not self.is_subquery_predicate(c)]
        for c in [*plain, *(u.conjunct for u in padded)]:
            if c.find(exp.Select):
                raise UnsupportedSQL("subquery in a predicate", f"{unnest.subquery_position(c)}"
                                     " is not maintained; subqueries are maintained in FROM, "
                                     "as [NOT] EXISTS / [NOT] IN / ANY / ALL conditions (also "
                                     "EXISTS anywhere in WHERE, and IN / ANY / ALL under AND /"
                                     " OR) and as compared scalar aggregates")
        node = self.join_tree(nodes, aliases, plain, scope)
        for c in subqueries:
            node = self.subquery_predicate(node, c, scope)
        late = []
        for u in padded:
            for src in u.sources:
                right = self.source(src, scope)
                on = [j for j in u.joins if j.find(exp.Column) is not None and any(
                    col.table == src.alias_or_name for col in j.find_all(exp.Column))]
                pred = A.conjoin([self.translate(j, scope)[0] for j in on])
                node = A.OuterJoin(self.nid(), node, right, pred)
            if not isinstance(u.conjunct, exp.Boolean):
                late.append(self.translate(u.conjunct, scope)[0])
        if late:
            node = A.Select(self.nid(), node, A.conjoin(late))  # type: ignore[arg-type]
        return self.select_list(s, node, scope)

    def from_clause(self, first: exp.Expr, joins: list[exp.Join], pool: list[exp.Expr],
                    scope: _Scope, own: set[str]
                    ) -> tuple[list[A.Node], list[str], list[exp.Expr], list[exp.Expr]]:
        """FROM in order: inner joins gather (their ON conditions are returned, to join the
        pool); an outer join takes everything before it as one input, with the conjuncts of
        ``pool`` (WHERE) that read only its preserved side. Returns the inputs still to join,
        their aliases, the inner ON conjuncts and the rest of the pool."""
        node, alias = self.from_item(first, scope, own)
        nodes, aliases = [node], [alias]
        inner_on: list[exp.Expr] = []
        sides = [(j.side or "").upper() for j in joins]
        for i, j in enumerate(joins):
            side = sides[i]
            on = [f for c in A.conjuncts(j.args.get("on")) for f in _factor_or(c)]
            if side not in ("LEFT", "RIGHT", "FULL"):
                node, alias = self.from_item(j.this, scope, own)
                nodes.append(node)
                aliases.append(alias)
                inner_on += on
                continue
            below = list(inner_on)
            # WHERE on the preserved side may filter before the join, unless a later RIGHT or
            # FULL join pads that side (then WHERE must see the padded rows)
            if side == "LEFT" and not {"RIGHT", "FULL"} & set(sides[i + 1:]):
                below += [c for c in pool if not self.is_subquery_predicate(c)
                          and not c.find(exp.Select) and self.within(c, aliases, scope, own)]
                pool = [c for c in pool if not any(c is b for b in below)]
            if any(self.is_subquery_predicate(c) or c.find(exp.Select) for c in below):
                raise UnsupportedSQL("subquery in an ON condition before an outer join",
                                     "not maintained; move it to WHERE")
            left = self.join_tree(nodes, aliases, below, scope)
            inner_on = []
            right, alias = self.from_item(j.this, scope, own)
            node = self.outer_join(left, aliases, right, alias, side, on, scope)
            nodes, aliases = [node], [self.merge(scope, [*aliases, alias])]
        return nodes, aliases, inner_on, pool

    def from_item(self, item: exp.Expr, scope: _Scope, own: set[str]) -> tuple[A.Node, str]:
        """A FROM or JOIN item's algebra and alias; a parenthesised join is one input, under
        one alias standing for its tables."""
        group = unnest.join_group(item)
        if group is None:
            if isinstance(item, exp.Subquery) and not item.alias:
                raise UnsupportedSQL("subquery in FROM without an alias", "name it")
            return self.source(item, scope), item.alias_or_name
        head = group.copy()
        head.set("joins", None)
        nodes, aliases, inner_on, _ = self.from_clause(head, list(group.args["joins"]), [],
                                                        scope, own)
        for c in inner_on:
            if not self.within(c, aliases, scope, own):
                raise UnsupportedSQL("parenthesised join reading a table outside it",
                                     _shown(c))
        node = self.join_tree(nodes, aliases, inner_on, scope)
        return node, self.merge(scope, aliases)

    def merge(self, scope: _Scope, aliases: list[str]) -> str:
        """A fresh alias standing for the sources ``aliases`` (and those they stand for),
        joined into one input (by an outer join or parentheses)."""
        unit = self.fresh("__outer")
        members = set(aliases)
        for a in scope.sources:
            if scope.unit.get(a, a) in members:
                scope.unit[a] = unit
        return unit

    def owner(self, scope: _Scope) -> dict[str, str]:
        """Plan column → the FROM item (or the outer join) it belongs to."""
        return {p: scope.unit.get(a, a) for a, cols in scope.sources.items()
                for p in cols.values()}

    @staticmethod
    def within(c: exp.Expr, aliases: list[str], scope: _Scope, own: set[str]) -> bool:
        """Whether ``c`` reads only the sources ``aliases`` (or enclosing queries); ``own``:
        every source alias of the query, joined yet or not."""
        for col in c.find_all(exp.Column):
            if col.table in scope.sources:
                if scope.unit.get(col.table, col.table) not in aliases:
                    return False
            elif col.table in own or scope.outer is None or not _resolves(
                    scope.outer, col.table, col.name):
                return False  # a source not joined yet (or a scalar subquery's, joined last)
        return True

    def outer_join(self, left: A.Node, left_aliases: list[str], right: A.Node, alias: str,
                   side: str, on: list[exp.Expr], scope: _Scope) -> A.Node:
        """``left`` ⟕/⟖/⟗ ``right`` on the ON conjuncts; a conjunct reading only the padded
        side filters that side before the join."""
        owner = self.owner(scope)
        padded_left = side in ("RIGHT", "FULL")
        padded_right = side in ("LEFT", "FULL")
        keep: list[exp.Expr] = []
        lf: list[exp.Expr] = []
        rf: list[exp.Expr] = []
        for c in on:
            t, _ = self.translate(c, scope)
            srcs = {owner.get(n) for n in A.referenced(t)} - {None}
            if srcs and srcs <= {alias} and padded_right and not padded_left:
                rf.append(t)
            elif srcs and srcs <= set(left_aliases) and padded_left and not padded_right:
                lf.append(t)
            else:
                keep.append(t)
        if lf:
            left = A.Select(self.nid(), left, A.conjoin(lf))  # type: ignore[arg-type]
        if rf:
            right = A.Select(self.nid(), right, A.conjoin(rf))  # type: ignore[arg-type]
        for n, padded in ((left, padded_left), (right, padded_right)):
            if padded:
                scope.nullable.update(dict.fromkeys(n.columns, True))
        pred = A.conjoin(keep)
        if side == "RIGHT":
            return A.OuterJoin(self.nid(), right, left, pred)
        return A.OuterJoin(self.nid(), left, right, pred, full=side == "FULL")

    def join_tree(self, nodes: list[A.Node], aliases: list[str], pool: list[exp.Expr],
                  scope: _Scope) -> A.Node:
        """Left-deep joins, in FROM order as far as each next relation joins what is already
        joined (a relation with no join predicate to it waits: ``FROM part, supplier, lineitem``
        joins part ⋈ lineitem ⋈ supplier, not part × supplier); each conjunct goes as low as
        its columns allow."""
        owner = self.owner(scope)
        translated = []
        for c in pool:
            t, _ = self.translate(c, scope)
            srcs = {owner.get(n) for n in A.referenced(t)}
            translated.append((t, srcs))
        used = [False] * len(translated)

        def take(pred: set[str | None], local: str | None) -> list[exp.Expr]:
            out = []
            for i, (t, srcs) in enumerate(translated):
                if used[i] or not srcs <= pred:
                    continue
                if local is not None and local not in srcs:
                    continue
                used[i] = True
                out.append(t)
            return out

        def with_filters(n: A.Node, alias: str) -> A.Node:
            local = take({alias}, alias)
            p = A.conjoin(local)
            return A.Select(self.nid(), n, p) if p is not None else n

        order = _connected_order(aliases, [srcs for _, srcs in translated])
        nodes = [nodes[i] for i in order]
        aliases = [aliases[i] for i in order]
        cur = with_filters(nodes[0], aliases[0])
        seen: set[str | None] = {aliases[0]}
        for n, alias in zip(nodes[1:], aliases[1:], strict=True):
            right = with_filters(n, alias)
            seen.add(alias)
            cur = A.Join(self.nid(), cur, right, A.conjoin(take(seen, alias)))
        rest = take(seen | {None}, None)
        for u, c in zip(used, pool, strict=True):
            if not u:  # never silently: a conjunct no input holds
                raise UnsupportedSQL("predicate", f"{_shown(c)}: its columns are "
                                     "not all available where it applies")
        p = A.conjoin(rest)
        return A.Select(self.nid(), cur, p) if p is not None else cur

    @staticmethod
    def is_subquery_predicate(c: exp.Expr) -> bool:
        inner = c.this if isinstance(c, exp.Not) else c
        if isinstance(inner, exp.Paren):
            inner = inner.this
        return isinstance(inner, exp.Exists) or (
            isinstance(inner, exp.In) and inner.args.get("query") is not None)

    def subquery_predicate(self, node: A.Node, c: exp.Expr, scope: _Scope) -> A.Node:
        negated = isinstance(c, exp.Not)
        inner = c.this if negated else c
        if isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Exists):
            sub = inner.this
            probe: exp.Expr | None = None
        else:
            assert isinstance(inner, exp.In)
            q = inner.args["query"]
            sub = q.this if isinstance(q, exp.Subquery) else q
            probe = inner.this
        nested = isinstance(sub, exp.Select) and any(
            q is not sub for q in sub.find_all(exp.Select))
        if not isinstance(sub, exp.Select) or sub.args.get("group") or sub.args.get(
                "having") or any(_own_aggregate(x) for x in sub.expressions) or sub.args.get(
                "distinct") or (nested and _outer_reference(sub, scope) is None):
            try:
                right, names = self.query(sub, None)
            except UnsupportedSQL as e:
                ref = _outer_reference(sub, scope)
                if ref is None:
                    raise
                raise UnsupportedSQL(
                    "correlated aggregate subquery",
                    f"the subquery of {inner.key.upper()} refers to {ref} of the enclosing "
                    "query through an aggregate or derived table, which is not maintained"
                    ) from e
            pred_parts: list[exp.Expr] = []
            if probe is not None:
                if len(names) != 1:
                    raise UnsupportedSQL("IN (subquery)", "the subquery must return one column")
                pt, _ = self.translate(probe, scope)
                if negated:  # NULL on either side makes NOT IN NULL, where ▷ keeps the row
                    self.require_not_null(pt, scope, "NOT IN")
                    if self.nullable(right)[0]:
                        raise UnsupportedSQL("NOT IN over a nullable column",
                                             "NOT IN is NULL-sensitive; declare the column NOT "
                                             "NULL or write NOT EXISTS")
                pred_parts.append(exp.EQ(this=pt, expression=A.col(right.columns[0])))
            elif sub.find(exp.AggFunc) or (isinstance(sub, exp.Select) and sub.args.get("group")):
                raise UnsupportedSQL("EXISTS over an aggregate subquery", "not maintained")
            pred = A.conjoin(pred_parts)
        else:
            inner_scope = _Scope({}, scope)
            if unnest.has_outer_join(sub):  # its joins into a derived table, planned as FROM
                assert isinstance(sub, exp.Select)
                sub = unnest.outer_join_probe(sub, self.fresh)
            from_ = sub.args.get("from_") or sub.args.get("from")
            if from_ is None:
                raise UnsupportedSQL("subquery without FROM", "not maintained")
            items = [from_.this] + [j.this for j in sub.args.get("joins") or []]
            nodes = [self.source(item, inner_scope) for item in items]
            aliases = [item.alias_or_name for item in items]
            pool: list[exp.Expr] = []
            for j in sub.args.get("joins") or []:
                pool += A.conjuncts(j.args.get("on"))
            where = sub.args.get("where")
            pool += A.conjuncts(where.this if where else None)
            local: list[exp.Expr] = []
            correlated: list[exp.Expr] = []
            nested_preds: list[exp.Expr] = []  # EXISTS / IN of the subquery's own rows
            for p in pool:
                if self.is_subquery_predicate(p) and not unnest.outer_columns(
                        p, unnest.own_aliases(sub)):
                    nested_preds.append(p)
                    continue
                if self.is_subquery_predicate(p) or p.find(exp.Select):
                    raise UnsupportedSQL("nested subquery predicate", f"{_shown(p)}: a "
                                         "subquery inside a correlated subquery is maintained "
                                         "as an EXISTS / IN condition reading only the tables "
                                         "of the subquery it is in")
                _, corr = self.translate(p, inner_scope)
                (correlated if corr else local).append(p)
            right = self.join_tree(nodes, aliases, local, inner_scope)
            for p in nested_preds:
                right = self.subquery_predicate(right, p, inner_scope)
            preds = [self.translate(p, inner_scope)[0] for p in correlated]
            if probe is not None:
                if len(sub.expressions) != 1:
                    raise UnsupportedSQL("IN (subquery)", "the subquery must return one column")
                pt, _ = self.translate(probe, scope)
                st, _ = self.translate(sub.expressions[0].unalias(), inner_scope)
                if negated:
                    self.require_not_null(pt, scope, "NOT IN")
                    self.require_not_null(st, inner_scope, "NOT IN")
                preds.append(exp.EQ(this=pt, expression=st))
            pred = A.conjoin(preds)
            scope.nullable.update(inner_scope.nullable)
        if pred is None:
            pred = exp.true()
        if probe is not None and negated and not isinstance(sub, exp.Select):
            raise UnsupportedSQL("NOT IN", "over a set operation")
        cls = A.AntiJoin if negated else A.SemiJoin
        return cls(self.nid(), node, right, pred)

    def nullable(self, node: A.Node) -> list[bool]:
        """Whether each column of ``node`` may hold NULL (pass 1's inference, Table 1)."""
        from idivm.planner.ids import infer_ids  # (the rules import the planner's model)

        info = infer_ids(node, self.catalog)[1][node.nid]
        return [info.nullable.get(c, True) for c in node.columns]

    def require_not_null(self, e: exp.Expr, scope: _Scope, what: str) -> None:
        for n in A.referenced(e):
            s: _Scope | None = scope
            while s is not None and n not in s.nullable:
                s = s.outer
            if s is None or s.nullable[n]:
                raise UnsupportedSQL(f"{what} over a nullable column",
                                     "NOT IN is NULL-sensitive; declare the column NOT NULL "
                                     "or write NOT EXISTS")
        if not isinstance(e, exp.Column):
            raise UnsupportedSQL(f"{what} over an expression", "compare plain columns")

    def select_list(self, s: exp.Select, node: A.Node, scope: _Scope
                    ) -> tuple[A.Node, list[str]]:
        items = list(s.expressions)
        if any(isinstance(i, exp.Star) or isinstance(i, exp.Column) and isinstance(
                i.this, exp.Star) for i in items):
            raise UnsupportedSQL("*", "its columns could not be listed (a source has two "
                                 "columns of one name); list the columns")
        names = [i.alias_or_name for i in items]
        group = s.args.get("group")
        having_sql = s.args.get("having")
        having = having_sql.this if having_sql is not None else None
        # uncorrelated scalar subqueries of a grouped SELECT list and of HAVING: one-row
        # aggregates, joined above γ
        scalars: list[A.Node] = []
        if any(i.find(exp.Select) for i in items):
            read = []
            for i in items:
                if unnest.scalar_subqueries(i):
                    u = unnest.scalar(i, unnest.own_aliases(s), self.fresh)
                    assert not u.joins  # correlated ones were joined LEFT below
                    scalars += [self.source(src, scope) for src in u.sources]
                    i = u.conjunct
                if i.find(exp.Select):
                    raise UnsupportedSQL("scalar subquery", "subqueries in the SELECT list "
                                         "are not maintained; join the subquery in FROM")
                read.append(i)
            items = read
            s = s.copy()
            s.set("expressions", items)
        if having is not None and having.find(exp.Select):
            parts = []
            for c in A.conjuncts(having):
                if not unnest.scalar_subqueries(c):
                    parts.append(c)
                    continue
                u = unnest.scalar(c, unnest.own_aliases(s), self.fresh)
                if u.joins:
                    raise UnsupportedSQL("correlated scalar subquery in HAVING",
                                         "not maintained")
                scalars += [self.source(src, scope) for src in u.sources]
                parts.append(u.conjunct)
            having = A.conjoin(parts)
            if having is not None and having.find(exp.Select):
                raise UnsupportedSQL("subquery predicate in HAVING", "not maintained; "
                                     "move it to WHERE")
        has_agg = any(i.find(exp.AggFunc) for i in items) or (
            having is not None and having.find(exp.AggFunc) is not None)
        if group is not None or has_agg:
            node, post_scope = self.aggregate(s, having, node, scope)
            for sq in scalars:
                node = A.Join(self.nid(), node, sq, None)
                post_scope.update({A.col(c).sql(): c for c in sq.columns})
            names_of = scope.user_names()
            exprs = [self.post_agg(self.translate(i.unalias(), scope)[0], post_scope, names_of)
                     for i in items]
            if having is not None:
                hv = self.post_agg(self.translate(having, scope)[0], post_scope, names_of)
                node = A.Select(self.nid(), node, hv)
        else:
            exprs = [self.translate(i.unalias(), scope)[0] for i in items]
        if s.args.get("distinct"):
            inner = [self.fresh(f"d__{n}") for n in names]
            node = A.Project(self.nid(), node, tuple(zip(inner, exprs, strict=True)))
            node = A.Aggregate(self.nid(), node, tuple(inner), ())
            exprs = [A.col(c) for c in inner]
        return A.Project(self.nid(), node, tuple(zip(names, exprs, strict=True))), names

    def aggregate(self, s: exp.Select, having: exp.Expr | None, node: A.Node, scope: _Scope
                  ) -> tuple[A.Node, dict[str, str]]:
        """γ with a projection below computing group keys and arguments.

        Returns the aggregate and a map from the SQL of each group expression / aggregate call
        (in plan names) to the output column holding it.
        """
        group = s.args.get("group")
        group_exprs = [self.translate(g, scope)[0] for g in (group.expressions if group else [])]
        group_exprs += self.dependent_columns(s, having, group_exprs, scope)
        below: list[tuple[str, exp.Expr]] = []
        post: dict[str, str] = {}
        gcols = []
        for g in group_exprs:
            if isinstance(g, exp.Column):
                name = g.name
            else:
                name = self.fresh("g__expr")
            below.append((name, g))
            post[g.sql()] = name
            gcols.append(name)
        aggs: list[A.AggCall] = []
        distinct: list[bool] = []
        sources = list(s.expressions) + ([having] if having is not None else [])
        for src in sources:
            for call in src.find_all(exp.AggFunc):
                t, corr = self.translate(call, scope)
                if corr:
                    raise UnsupportedSQL("correlated aggregate", "not maintained")
                if t.sql() in post:
                    continue
                func = AGG_NODES[type(call)]
                arg_e = t.this
                is_distinct = isinstance(arg_e, exp.Distinct)
                if is_distinct:
                    arg_e = arg_e.expressions[0]
                if func == "count" and isinstance(arg_e, exp.Star):
                    func, arg = "count_star", None
                elif isinstance(arg_e, exp.Column):
                    arg = arg_e.name
                    if arg not in [b[0] for b in below]:
                        below.append((arg, arg_e))
                else:
                    arg = self.fresh("a__expr")
                    below.append((arg, arg_e))
                name = self.fresh(f"agg__{func}")
                aggs.append(A.AggCall(name, func, arg))
                distinct.append(is_distinct)
                post[t.sql()] = name
        proj = A.Project(self.nid(), node, tuple(below))
        if any(distinct):
            return self.distinct_aggregate(proj, gcols, aggs, distinct, post)
        agg = A.Aggregate(self.nid(), proj, tuple(gcols), tuple(aggs))
        return agg, post

    def dependent_columns(self, s: exp.Select, having: exp.Expr | None,
                          group_exprs: list[exp.Expr], scope: _Scope) -> list[exp.Expr]:
        """Columns read outside aggregates of a table whose primary key is grouped on (as
        PostgreSQL allows: they are functionally dependent on it), as more group keys, which
        leaves the groups as they are."""
        grouped = {g.name for g in group_exprs if isinstance(g, exp.Column)}
        dependent = {p for alias, key in scope.keys.items() if key and set(key) <= grouped
                     for p in scope.sources[alias].values()} - grouped
        if not dependent:
            return []
        out: list[exp.Expr] = []
        for e in [*s.expressions, *([having] if having is not None else [])]:
            try:
                t, _ = self.translate(e.unalias(), scope)
            except UnsupportedSQL:
                continue  # refused where it is translated
            for c in t.find_all(exp.Column):
                if c.name in dependent and c.find_ancestor(exp.AggFunc) is None:
                    dependent.discard(c.name)
                    out.append(A.col(c.name))
        return out

    def distinct_aggregate(self, proj: A.Project, gcols: list[str], aggs: list[A.AggCall],
                           distinct: list[bool], post: dict[str, str]
                           ) -> tuple[A.Node, dict[str, str]]:
        """f(DISTINCT x) per group as f(x) over γ_{G, x}, two-phase: the inner γ counts the
        rows per (group, x), which tells when a value enters or leaves a group, and keeps
        partial SUM / COUNT / MIN / MAX of the other aggregates; the outer γ adds them up.
        Where an output is not the outer γ's column, a π above it computes it: an AVG beside
        them is its partial sums' sum over its partial counts' sum (NULL over no values; the
        sums' types are AVG's: numeric over integers and numerics, double precision over
        floats); a COUNT is the sum of its partial counts as a bigint, COUNT's type (a sum of
        bigints is a numeric), and in a global γ 0 over no rows (where the sum is NULL: fuzz
        seed 45018's view read NULL where its query read 0)."""
        args = {a.arg for a, d in zip(aggs, distinct, strict=True) if d}
        if len(args) > 1:
            raise UnsupportedSQL("DISTINCT aggregates over several arguments",
                                 "one query may aggregate DISTINCT over one argument; compute "
                                 "the others in another subquery")
        x = next(iter(args))
        assert x is not None
        partial: list[A.AggCall] = []
        final: list[A.AggCall] = []
        finish: dict[str, exp.Expr] = {}  # an output → its expression over the outer γ
        for a, d in zip(aggs, distinct, strict=True):
            if d:
                final.append(A.AggCall(a.name, a.func, x))
                continue
            if a.func == "avg":
                total = A.AggCall(self.fresh(f"p__{a.name}__sum"), "sum", a.arg)
                count = A.AggCall(self.fresh(f"p__{a.name}__count"), "count", a.arg)
                partial += [total, count]
                final += [A.AggCall(self.fresh(f"{a.name}__sum"), "sum", total.name),
                          A.AggCall(self.fresh(f"{a.name}__count"), "sum", count.name)]
                finish[a.name] = exp.Div(this=A.col(final[-2].name), expression=exp.Nullif(
                    this=A.col(final[-1].name), expression=exp.Literal.number(0)), typed=True)
                continue
            part = A.AggCall(self.fresh(f"p__{a.name}"), a.func, a.arg)
            partial.append(part)
            if a.func in ("count", "count_star"):
                final.append(A.AggCall(self.fresh(f"{a.name}__sum"), "sum", part.name))
                total_count: exp.Expr = A.col(final[-1].name)
                if not gcols:
                    total_count = exp.Coalesce(this=total_count,
                                               expressions=[exp.Literal.number(0)])
                finish[a.name] = exp.cast(total_count, "BIGINT")
                continue
            final.append(A.AggCall(a.name, a.func if a.func in ("min", "max") else "sum",
                                   part.name))
        keys = list(dict.fromkeys([*gcols, x]))
        inner = A.Aggregate(self.nid(), proj, tuple(keys), tuple(partial))
        ren = {k: self.fresh(f"dx__{k}") for k in keys + [p.name for p in partial]}
        mid = A.Project(self.nid(), inner, tuple((ren[k], A.col(k)) for k in ren))
        outer = A.Aggregate(self.nid(), mid, tuple(ren[g] for g in gcols), tuple(
            A.AggCall(f.name, f.func, ren[f.arg] if f.arg else None) for f in final))
        out: A.Node = outer
        if finish:
            out = A.Project(self.nid(), outer, (
                *((g, A.col(g)) for g in outer.group_by),
                *((a.name, finish.get(a.name, A.col(a.name))) for a in aggs)))
        return out, {k: ren.get(v, v) for k, v in post.items()}

    @staticmethod
    def post_agg(e: exp.Expr, post: dict[str, str], names_of: dict[str, str]) -> exp.Expr:
        """An expression above γ (already in plan names): aggregate calls and group
        expressions become the aggregate's output columns; anything else is an error
        (naming the column as the query does: ``names_of``, plan column → ``alias.column``)."""

        def rewrite(n: exp.Expr) -> exp.Expr:
            key = n.sql()
            return A.col(post[key]) if key in post else n

        out = e.transform(rewrite)
        allowed = set(post.values())
        for c in out.find_all(exp.Column):
            if c.name not in allowed:
                raise UnsupportedSQL("ungrouped column", f"{names_of.get(c.name, c.name)} "
                                     "must appear in GROUP BY or an aggregate")
        return out
