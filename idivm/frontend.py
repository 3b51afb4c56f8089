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


def parse_view(sql: str, catalog: Catalog, dialect: str = "postgres") -> ViewQuery:
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
    tree = normalize_identifiers(tree, dialect=dialect)
    _refuse(tree)
    tree = unnest.inline_constants(_inline_ctes(tree))
    for t in tree.find_all(exp.Table):
        if t.name and not catalog.has_table(t.name):
            raise CatalogError(f"unknown table {t.name!r} in the view")
    try:
        tree = qualify(tree, schema=catalog.sqlglot_mapping_schema(dialect), dialect=dialect,
                       quote_identifiers=False, validate_qualify_columns=True)
    except SqlglotError as e:
        raise UnsupportedSQL("name resolution", str(e)) from e
    conv = _Converter(catalog)
    root, names = conv.query(tree, outer=None)
    if len(set(names)) != len(names):
        raise UnsupportedSQL("duplicate output column", "every view column needs its own name")
    return ViewQuery(root=root, columns=tuple(names), sql=sql)


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


def _inline_ctes(tree: exp.Expr) -> exp.Expr:
    """Non-recursive WITH: substitute each CTE as a FROM subquery (pure rewrite)."""
    w = tree.args.get("with_") or tree.args.get("with")
    if not w:
        return tree
    tree = tree.copy()
    ctes = {c.alias: c.this for c in w.expressions}
    tree.set("with_" if "with_" in tree.args else "with", None)

    def sub(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Table) and not n.db and n.name in ctes:
            return exp.Subquery(this=ctes[n.name].copy(), alias=exp.TableAlias(
                this=exp.to_identifier(n.alias_or_name)))
        return n

    return tree.transform(sub)


@dataclass
class _Scope:
    """Source alias → {column → plan column}; ``outer`` for correlated references."""

    sources: dict[str, dict[str, str]]
    outer: _Scope | None = None
    nullable: dict[str, bool] = field(default_factory=dict)
    unit: dict[str, str] = field(default_factory=dict)  # alias → the outer join holding it

    def resolve(self, table: str, column: str) -> tuple[str, bool]:
        """Plan column, and whether it came from an enclosing scope."""
        if table in self.sources and column in self.sources[table]:
            return self.sources[table][column], False
        if self.outer is not None:
            name, _ = self.outer.resolve(table, column)
            return name, True
        raise UnsupportedSQL("column reference", f"cannot resolve {table}.{column}")


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
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.nids = itertools.count(1)
        self.used: set[str] = set()

    # -- naming --------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = base
        for i in itertools.count(2):
            if name not in self.used:
                break
            name = f"{base}_{i}"
        self.used.add(name)
        return name

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
            for c, p in zip(table.columns, cols, strict=True):
                scope.nullable[p] = c.nullable
            return A.Scan(self.nid(), table.name, alias, cols, table.column_names)
        if isinstance(item, exp.Subquery):
            try:
                node, names = self.query(item.this, None)
            except UnsupportedSQL as e:
                ref = _outer_reference(item.this, scope)
                if ref is None:
                    raise
                raise UnsupportedSQL(
                    "correlated subquery in FROM",
                    f"the derived table {alias} refers to {ref} of an enclosing query, which "
                    "is not maintained; join its aggregate on the correlation columns "
                    "instead") from e
            fresh = [self.fresh(f"{alias}__{n}") for n in names]
            scope.sources[alias] = dict(zip(names, fresh, strict=True))
            return A.Project(self.nid(), node, tuple(
                (f, A.col(c)) for f, c in zip(fresh, node.columns, strict=True)))
        raise UnsupportedSQL(item.key.upper(), "only tables and subqueries may appear in FROM")

    def translate(self, e: exp.Expr, scope: _Scope) -> tuple[exp.Expr, bool]:
        """Rewrite qualified column references to plan columns; also report correlation."""
        correlated = False

        def sub(n: exp.Expr) -> exp.Expr:
            nonlocal correlated
            if isinstance(n, exp.Query):
                raise UnsupportedSQL("subquery in this position", f"{e.sql('postgres')[:80]}: "
                                     "not maintained")
            if isinstance(n, exp.Column) and n.table:
                name, outer = scope.resolve(n.table, n.name)
                correlated = correlated or outer
                return A.col(name)
            if isinstance(n, exp.Column):
                raise UnsupportedSQL("column reference", f"unresolved column {n.sql()}")
            return n

        return e.copy().transform(sub), correlated

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
        # FROM in order: inner joins gather (their ON conditions join the pool); an outer join
        # takes everything before it as one input
        if from_ is None:  # SELECT without FROM reads the one-row relation
            alias = self.fresh("__one")
            nodes: list[A.Node] = [A.OneRow(self.nid(), alias)]
            scope.sources[alias] = {}
            aliases = [alias]
        else:
            nodes = [self.source(from_.this, scope)]
            aliases = [from_.this.alias_or_name]
        inner_on: list[exp.Expr] = []
        for j in joins:
            side = (j.side or "").upper()
            on = [f for c in A.conjuncts(j.args.get("on")) for f in _factor_or(c)]
            if side not in ("LEFT", "RIGHT", "FULL"):
                nodes.append(self.source(j.this, scope))
                aliases.append(j.this.alias_or_name)
                inner_on += on
                continue
            below = list(inner_on)
            if side == "LEFT":  # WHERE on the preserved side may filter before the join
                below += [c for c in pool if not self.is_subquery_predicate(c)
                          and self.within(c, aliases, scope)]
                pool = [c for c in pool if not any(c is b for b in below)]
            if any(self.is_subquery_predicate(c) or c.find(exp.Select) for c in below):
                raise UnsupportedSQL("subquery in an ON condition before an outer join",
                                     "not maintained; move it to WHERE")
            left = self.join_tree(nodes, aliases, below, scope)
            inner_on = []
            right = self.source(j.this, scope)
            unit = self.fresh("__outer")
            node = self.outer_join(left, aliases, right, j.this.alias_or_name, side, on, scope)
            for a in [*aliases, j.this.alias_or_name]:
                scope.unit[a] = unit
            nodes, aliases = [node], [unit]
        pool += inner_on
        nodes += [self.source(item, scope) for item in scalars]
        aliases += [item.alias_or_name for item in scalars]
        subqueries = [c for c in pool if self.is_subquery_predicate(c)]
        plain = [c for c in pool if not self.is_subquery_predicate(c)]
        for c in plain:
            if c.find(exp.Select):
                raise UnsupportedSQL("subquery in a predicate", "subqueries are maintained in "
                                     "FROM, as [NOT] EXISTS / [NOT] IN / ANY / ALL predicates "
                                     "and as compared scalar aggregates")
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

    def owner(self, scope: _Scope) -> dict[str, str]:
        """Plan column → the FROM item (or the outer join) it belongs to."""
        return {p: scope.unit.get(a, a) for a, cols in scope.sources.items()
                for p in cols.values()}

    def within(self, c: exp.Expr, aliases: list[str], scope: _Scope) -> bool:
        """Whether ``c`` reads only the sources ``aliases`` (or enclosing queries)."""
        t, _ = self.translate(c, scope)
        owner = self.owner(scope)
        return {owner.get(n) for n in A.referenced(t)} <= set(aliases) | {None}

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
                pred_parts.append(exp.EQ(this=pt, expression=A.col(right.columns[0])))
            elif sub.find(exp.AggFunc) or (isinstance(sub, exp.Select) and sub.args.get("group")):
                raise UnsupportedSQL("EXISTS over an aggregate subquery", "not maintained")
            pred = A.conjoin(pred_parts)
        else:
            inner_scope = _Scope({}, scope)
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
            for p in pool:
                if self.is_subquery_predicate(p) or p.find(exp.Select):
                    raise UnsupportedSQL("nested subquery predicate", "not maintained")
                _, corr = self.translate(p, inner_scope)
                (correlated if corr else local).append(p)
            right = self.join_tree(nodes, aliases, local, inner_scope)
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
            exprs = [self.post_agg(self.translate(i.unalias(), scope)[0], post_scope)
                     for i in items]
            if having is not None:
                hv = self.post_agg(self.translate(having, scope)[0], post_scope)
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

    def distinct_aggregate(self, proj: A.Project, gcols: list[str], aggs: list[A.AggCall],
                           distinct: list[bool], post: dict[str, str]
                           ) -> tuple[A.Node, dict[str, str]]:
        """f(DISTINCT x) per group as f(x) over γ_{G, x}, two-phase: the inner γ counts the
        rows per (group, x), which tells when a value enters or leaves a group, and keeps
        partial SUM / COUNT / MIN / MAX of the other aggregates; the outer γ adds them up."""
        args = {a.arg for a, d in zip(aggs, distinct, strict=True) if d}
        if len(args) > 1:
            raise UnsupportedSQL("DISTINCT aggregates over several arguments",
                                 "one query may aggregate DISTINCT over one argument; compute "
                                 "the others in another subquery")
        x = next(iter(args))
        assert x is not None
        partial: list[A.AggCall] = []
        final: list[A.AggCall] = []
        for a, d in zip(aggs, distinct, strict=True):
            if d:
                final.append(A.AggCall(a.name, a.func, x))
                continue
            if a.func == "avg":
                raise UnsupportedSQL("AVG beside a DISTINCT aggregate",
                                     "not maintained; use SUM / COUNT")
            part = A.AggCall(self.fresh(f"p__{a.name}"), a.func, a.arg)
            partial.append(part)
            final.append(A.AggCall(a.name, a.func if a.func in ("min", "max") else "sum",
                                   part.name))
        keys = list(dict.fromkeys([*gcols, x]))
        inner = A.Aggregate(self.nid(), proj, tuple(keys), tuple(partial))
        ren = {k: self.fresh(f"dx__{k}") for k in keys + [p.name for p in partial]}
        mid = A.Project(self.nid(), inner, tuple((ren[k], A.col(k)) for k in ren))
        outer = A.Aggregate(self.nid(), mid, tuple(ren[g] for g in gcols), tuple(
            A.AggCall(f.name, f.func, ren[f.arg] if f.arg else None) for f in final))
        return outer, {k: ren.get(v, v) for k, v in post.items()}

    @staticmethod
    def post_agg(e: exp.Expr, post: dict[str, str]) -> exp.Expr:
        """An expression above γ (already in plan names): aggregate calls and group
        expressions become the aggregate's output columns; anything else is an error."""

        def rewrite(n: exp.Expr) -> exp.Expr:
            key = n.sql()
            return A.col(post[key]) if key in post else n

        out = e.copy().transform(rewrite)
        allowed = set(post.values())
        for c in out.find_all(exp.Column):
            if c.name not in allowed:
                raise UnsupportedSQL(
                    "ungrouped column", f"{c.sql()} must appear in GROUP BY or an aggregate")
        return out
