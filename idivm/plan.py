"""``plan()``: view SQL → the four passes → a ``Plan`` holding the Δ-script."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.frontend import ViewQuery, parse_view
from idivm.planner import minimize
from idivm.planner.compose import Composition, Materialized, Resolver, compose, store_name
from idivm.planner.idiff_schemas import Changes, analyze, generate
from idivm.planner.ids import infer_ids
from idivm.planner.instantiate import RuleDag, instantiate
from idivm.planner.lookups import Lookup, input_lookups
from idivm.planner.model import STRATEGIES, BaseSchema, NodeInfo, Strategy
from idivm.planner.rewrite import rewrite
from idivm.planner.selective import Statistics, chosen, chosen_filters
from idivm.render import render
from idivm.script import Apply, Compute, Dialect, Statement, to_sql


@dataclass(frozen=True)
class Plan:
    """A view's ID-based maintenance plan: annotated algebra, i-diff schemas, Δ-script."""

    name: str
    view: ViewQuery
    root: A.Node  # after pass 1 (projections extended with IDs)
    infos: Mapping[int, NodeInfo]
    idiff_schemas: tuple[BaseSchema, ...]
    dag: RuleDag
    composition: Composition
    statements: tuple[Statement, ...]  # the minimized Δ-script
    catalog: Catalog
    strategy: Strategy = "id"  # id: i-diffs; tuple: t-diffs (the baseline); recompute
    # the σ over a scan stored as caches, and those whose keys filter another table's log
    # before the fold (``planner/selective.py``), by signature
    selective: frozenset[str] = frozenset()
    # (table, columns) the Δ-script finds the table's rows by, other than its IDs
    # (``planner/lookups.py``): indexed by a backend that owns the table's storage
    input_lookups: tuple[Lookup, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """The view's declared columns (what SELECT * returns)."""
        return self.view.columns

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(sorted({s.table for s in A.scans(self.root)}))

    def uses(self, table: str, column: str) -> bool:
        """Whether the view reads ``table.column`` anywhere (output, condition, aggregate)."""
        return column in analyze(self.root, self.infos)[1].get(table, set())

    def undeclared_changes(self, table: str) -> list[tuple[str, exp.Expr]]:
        """Predicates over the table's folded changes that match changes the plan was not made
        for (``changes=``): (what, predicate). Such changes would otherwise be lost."""
        if self.strategy == "recompute":
            return []  # a recomputation sees every change
        kinds = {s.kind for s in self.idiff_schemas if s.table == table}
        cols = {c for s in self.idiff_schemas if s.table == table for c in s.cols}
        pre, post = exp.column("__has_pre"), exp.column("__has_post")
        out: list[tuple[str, exp.Expr]] = []
        if "ins" not in kinds:
            out.append(("insert", exp.and_(post.copy(), exp.Not(this=pre.copy()))))
        if "del" not in kinds:
            out.append(("delete", exp.and_(pre.copy(), exp.Not(this=post.copy()))))
        for c in self.catalog.table(table).non_key_columns:
            if c not in cols and self.uses(table, c):
                changed = exp.NullSafeNEQ(this=exp.column(f"{c}__pre", quoted=True),
                                          expression=exp.column(f"{c}__post", quoted=True))
                out.append((f"update of {c}", exp.and_(pre.copy(), post.copy(), changed)))
        return out

    @property
    def materialized(self) -> tuple[Materialized, ...]:
        return self.composition.materialized

    @property
    def store(self) -> Materialized:
        return self.composition.materialized[-1]

    def materialize_queries(self) -> list[tuple[Materialized, exp.Select]]:
        """Queries that fill the caches and the view from the base tables, bottom-up."""
        mats = {m.nid: m for m in self.materialized}
        out = []
        for m in self.materialized:
            below = {k: v for k, v in mats.items() if k != m.nid}
            node = next(n for n in A.walk(self.root) if n.nid == m.nid)

            def leaf(n: A.Node, below: dict[int, Materialized] = below) -> exp.Expr | None:
                return exp.table_(exp.to_identifier(below[n.nid].name, quoted=True)) \
                    if n.nid in below else None

            out.append((m, render(node, leaf, self._type)))
        return out

    def store_query(self) -> exp.Select:
        """The stored view relation (its declared columns and hidden IDs) computed from the
        base tables alone: a recomputation of the view that neither reads nor refreshes the
        caches below it."""
        return render(self.root, lambda n: None, self._type)

    def recompute_query(self) -> exp.Select:
        """The view's declared columns recomputed from the base tables (no caches)."""
        return exp.select(*[exp.column(k, quoted=True) for k in self.columns]).from_(
            self.store_query().subquery("r"))

    def _type(self, col: str) -> str | None:
        for info in self.infos.values():
            if info.types.get(col):
                return info.types[col]
        return None

    def script(self, dialect: Dialect = "postgres", pretty: bool = False) -> list[str]:
        """The Δ-script as ordered SQL statements: i-diff queries, then APPLYs, per cache."""
        return [to_sql(s, dialect, pretty) for s in self.statements]

    def script_text(self, dialect: Dialect = "postgres") -> str:
        """The Δ-script with a comment naming the rule behind each statement."""
        parts = [f"-- Δ-script for view {self.name} ({dialect}), generated by idivm"]
        for s in self.statements:
            for line in s.comment.splitlines():
                parts.append(f"-- {line.strip()}")
            parts.append(to_sql(s, dialect, pretty=True) + ";")
            parts.append("")
        return "\n".join(parts)

    def temporaries(self) -> list[str]:
        return [s.name for s in self.statements if isinstance(s, Compute)]

    def explain(self) -> str:
        """The annotated plan: IDs per operator, caches, i-diff schemas, rules fired."""
        mats = {m.nid: m for m in self.materialized}
        lines = [f"view {self.name}: {', '.join(self.columns)}", "", "plan (pass 1: IDs):"]

        def show(n: A.Node, depth: int) -> None:
            info = self.infos[n.nid]
            tag = f"  [{mats[n.nid].role}: {mats[n.nid].name}]" if n.nid in mats else ""
            mv = "  (many-to-many below)" if info.multivalued else ""
            lines.append(f"{'  ' * depth}#{n.nid} {n.label}  IDs={{{', '.join(info.ids)}}}"
                         f"{tag}{mv}")
            for ch in n.children:
                show(ch, depth + 1)

        show(self.root, 1)
        lines += ["", "base-table i-diff schemas (§5):"]
        for s in self.idiff_schemas:
            cols = f" on {', '.join(s.cols)}" if s.cols else ""
            lines.append(f"  {s.table}: {s.kind}{cols}  — {s.reason}")
        lines += ["", "rules fired (pass 2):"]
        for d in self.dag.diffs.values():
            src = f" ← {', '.join(d.inputs)}" if d.inputs else ""
            lines.append(f"  {d.name} = {d.schema.describe()} @#{d.schema.nid}: {d.rule}{src}")
        lines += ["", "Δ-script (passes 3–4):"]
        for i, st in enumerate(self.statements, 1):
            what = (f"APPLY {st.kind} {st.diff} → {st.target}" if isinstance(st, Apply)
                    else f"{st.phase} {st.name}")
            lines.append(f"  {i:2}. {what}")
        return "\n".join(lines)


# A view whose i-diffs, propagated apart, instantiate more rules than this is planned with
# them merged: apart, each read of a shared subquery multiplies the i-diffs of every read
# below it — a fuzz view reading a CTE three times (IN, EXISTS over a FULL JOIN) made 2,056
# rules, a 1,007-statement script, minutes of compiling; merged, 692 rules and 149
# statements. TPC-H's largest, Q8, instantiates 369.
UNMERGED_RULES = 1000


def plan(view_sql: str, catalog: Catalog, name: str = "v", changes: Changes | None = None,
         dialect: str = "postgres", strategy: Strategy = "id",
         schema: str | None = None, statistics: Statistics | None = None,
         merge: bool = True) -> Plan:
    """Plan deferred maintenance of ``view_sql``: ID-based (the four passes of §4), with the
    same passes over tuple-based rules (``strategy="tuple"``, the paper's baseline), or by
    recomputation (``strategy="recompute"``). ``schema``: the schema ``catalog`` describes
    (tables qualified by it are accepted; any other qualification is refused).
    ``statistics``: a backend's estimates, by which a σ over a scan that a join reads is
    stored as a cache where it keeps few of the table's rows (``planner/selective.py``;
    ``selective.Recorded``: the choices a view was created with). ``merge``: an operator's Δ+
    (Δ-) i-diffs of one schema propagate as one union (``planner/instantiate.py``): fewer
    statements, for a backend where each statement costs most; without it each propagates
    apart, planned on its own (PostgreSQL: ``postgres.compile.MERGE``) — unless that
    instantiates more than ``UNMERGED_RULES`` rules, where the i-diffs merge anyway."""
    if strategy not in STRATEGIES:
        raise IdivmError(f"unknown strategy {strategy!r}: use {', '.join(STRATEGIES)}")
    view = _rewritten(parse_view(view_sql, catalog, dialect, schema=schema), catalog)
    root, infos = infer_ids(view.root, catalog)  # pass 1
    narrow = read_catalog(root, infos, catalog)
    if narrow.tables != catalog.tables:  # plan over just the columns the view reads
        view = _rewritten(parse_view(view_sql, catalog, dialect, narrow=narrow, schema=schema),
                          narrow)
        catalog = narrow
        root, infos = infer_ids(view.root, catalog)
    if strategy == "recompute":
        return _recompute_plan(name, view, root, infos, catalog)
    schemas = generate(root, infos, catalog, changes, strategy)  # §5
    dag = instantiate(root, infos, schemas, catalog, strategy, merge)  # pass 2
    if not merge and len(dag.diffs) > UNMERGED_RULES:  # propagating apart multiplies the
        dag = instantiate(root, infos, schemas, catalog, strategy, True)  # script: merge
    selective = chosen(root, infos, statistics)
    comp = compose(root, infos, dag, name, selective)  # pass 3
    resolver = Resolver(root, infos, dag, comp, catalog)
    nodes = {n.nid: n for n in A.walk(root)}
    fetch = minimize.rewrite_fetch(nodes)  # pass 4 (Figure 8), then composition of queries
    stmts: list[Statement] = []
    st: Statement
    for st, applied in zip(comp.statements, comp.applied, strict=True):
        if isinstance(st, Compute):
            st = Compute(st.name, resolver.resolve(st.query, applied, fetch), st.comment,
                         st.phase)
        stmts.append(st)
    stmts, reads = minimize.inlined_with_refs(stmts)
    stmts = minimize.compose_queries(minimize.drop_unread(stmts, reads))
    filters = chosen_filters(root, infos, statistics, selective)  # (read by the folds)
    return Plan(name, view, root, infos, schemas, dag, comp, tuple(stmts), catalog, strategy,
                frozenset(selective.values()) | frozenset(filters.values()),
                input_lookups(root, infos, {m.nid for m in comp.materialized}))


def _rewritten(view: ViewQuery, catalog: Catalog) -> ViewQuery:
    """The view with its algebra rewritten (``planner/rewrite.py``) before pass 1."""
    return dataclasses.replace(view, root=rewrite(view.root, catalog))


def read_catalog(root: A.Node, infos: Mapping[int, NodeInfo], catalog: Catalog) -> Catalog:
    """The catalog restricted to what the view reads: the tables it scans, each with its key
    and the columns the view uses (in its output, a condition or an aggregate), and the
    foreign keys whose columns all stay. Scans, base-table i-diffs and change logs then carry
    no column the view never reads."""
    used = analyze(root, infos)[1]
    tables = []
    for t in sorted(used):
        table = catalog.table(t)
        keep = {*table.primary_key, *used[t]}
        cols = tuple(c for c in table.columns if c.name in keep)
        fks = tuple(fk for fk in table.foreign_keys
                    if set(fk.columns) <= keep and fk.ref_table in used and
                    set(fk.ref_columns) <= set(catalog.table(fk.ref_table).primary_key))
        tables.append(dataclasses.replace(table, columns=cols, foreign_keys=fks))
    return Catalog.of(tables)


def _recompute_plan(name: str, view: ViewQuery, root: A.Node, infos: Mapping[int, NodeInfo],
                    catalog: Catalog) -> Plan:
    """The view stored alone (no caches), refreshed from its query: the result replaces the
    stored rows in the same transaction (what REFRESH MATERIALIZED VIEW does)."""
    info = infos[root.nid]
    store = Materialized(root.nid, store_name(name), "view", info.ids,
                         frozenset(k for k in info.ids if info.nullable.get(k, True)),
                         root.columns)
    p = Plan(name, view, root, infos, (), RuleDag({}, (), {}, root.nid),
             Composition((), (), (store,), {}), (), catalog, "recompute")
    rows = f"{name}__recomputed"
    stmts: tuple[Statement, ...] = (
        Compute(rows, p.materialize_queries()[0][1], "recompute: the view's query over the "
                "base tables", "recompute"),
        Apply("replace", store.name, rows, (), store.columns, store.key, store.nullable,
              f"REPLACE the rows of {store.name} by the recomputed ones"))
    return dataclasses.replace(p, statements=stmts,
                               composition=Composition(stmts, (frozenset(),) * 2, (store,), {}))


def plan_many(views: Sequence[tuple[str, str]], catalog: Catalog, strategy: Strategy = "id"
              ) -> list[Plan]:
    return [plan(sql, catalog, name, strategy=strategy) for name, sql in views]
