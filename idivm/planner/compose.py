"""Pass 3: compose the rule DAG into a Δ-script, with intermediate caches (§4).

Caches: the input of an aggregate is materialized when it joins something and has no
many-to-many join (which would make the cache multi-valued, §4 footnote 6); an aggregate's
output is materialized unless only projections lie between it and the view (then the view,
which carries all of the aggregate's columns, is its cache). Statements are ordered per cache,
bottom-up: the i-diffs of a cache, a snapshot of the rows they touch, the APPLYs, a snapshot
after; placeholders then resolve against what is applied at that point.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.instantiate import RuleDag
from idivm.planner.minimize import c1_insert, c3_full_update, pre_images
from idivm.planner.model import DiffNode, NodeInfo, change_table, fit, post_name, pre_name
from idivm.planner.ruleapi import (
    c,
    exists,
    keeps_input_cache,
    match,
    select,
    subquery,
    t,
    union_all,
)
from idivm.render import render
from idivm.script import Apply, Compute, Statement

PLACEHOLDER = re.compile(r"^__(post|pre|output|old|new)__(\d+)$")
FETCH = re.compile(r"^__fetch__(post|pre)__(\d+)__(d\d+)$")


@dataclass(frozen=True)
class Materialized:
    nid: int
    name: str
    # "view", "cache: input of γ", "cache: output of γ", "cache: ranged input",
    # "cache: selective input" (a σ over a scan a join reads, ``planner/selective.py``)
    role: str
    key: tuple[str, ...]
    nullable: frozenset[str]
    columns: tuple[str, ...]
    lookups: tuple[tuple[str, ...], ...] = ()  # further columns the rules find rows by
    # IDs with one value in every row (a global γ's ``__g`` a ⋈ with its one row keeps): rows
    # are found by the other IDs (``_probed``)
    constant: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Composition:
    statements: tuple[Statement, ...]
    applied: tuple[frozenset[int], ...]  # per statement: materialized nodes applied before it
    materialized: tuple[Materialized, ...]  # bottom-up; the view last
    via_root: Mapping[int, Mapping[str, str]]  # γ kept in the view: γ column → view column
    # cache → its i-diffs read straight by the rule above, left out of its snapshots
    direct: Mapping[int, frozenset[str]] = field(default_factory=dict)


def store_name(view: str) -> str:
    return fit(f"{view}__store")


def cache_name(view: str, nid: int) -> str:
    return fit(f"{view}__cache{nid}")


SELECTIVE = "cache: selective input"


def decide_caches(root: A.Node, infos: Mapping[int, NodeInfo], view: str,
                  selective: Collection[int] = ()
                  ) -> tuple[list[Materialized], dict[int, dict[str, str]]]:
    parents: dict[int, A.Node] = {}
    for n in A.walk(root):
        for ch in n.children:
            parents[ch.nid] = n
    from idivm.rules import rule_for

    chosen: dict[int, str] = {}
    lookups: dict[int, tuple[tuple[str, ...], ...]] = {}
    via_root: dict[int, dict[str, str]] = {}
    for n in A.walk(root):
        hook = rule_for(n).caches
        ranged = hook(n, infos) if hook is not None else None
        if ranged is not None:
            child = n.children[ranged[0]]
            chosen.setdefault(child.nid, "cache: ranged input")
            lookups[child.nid] = lookups.get(child.nid, ()) + (ranged[1],)
        if not isinstance(n, A.Aggregate):
            continue
        child = n.child
        if keeps_input_cache(child, infos[child.nid]):
            chosen[child.nid] = "cache: input of γ"
        path, p = [], parents.get(n.nid)
        while p is not None and isinstance(p, A.Project):
            path.append(p)
            p = parents.get(p.nid)
        mapping: dict[str, str] | None = None
        if n is root or (p is None and path):
            mapping = {k: k for k in n.columns}
            for proj in path:
                through = proj.passthrough()
                if not all(v in through for v in mapping.values()):
                    # a γ column the projections above drop (fuzz seed 10915: the outer
                    # query reads one of two equal AVGs): the view cannot hold γ's output
                    mapping = None
                    break
                mapping = {k: through[v] for k, v in mapping.items()}
        if mapping is not None:
            via_root[n.nid] = mapping
        else:
            chosen[n.nid] = "cache: output of γ"
    for nid in selective:  # (a σ cached for another reason keeps that role)
        chosen.setdefault(nid, SELECTIVE)
    out = []
    for n in A.walk(root):
        if n.nid in chosen or n is root:
            info = infos[n.nid]
            out.append(Materialized(
                n.nid, store_name(view) if n is root else cache_name(view, n.nid),
                "view" if n is root else chosen[n.nid], info.ids,
                frozenset(k for k in info.ids if info.nullable.get(k, True)), n.columns,
                lookups.get(n.nid, ()), info.constant))
    return out, via_root


def compose(root: A.Node, infos: Mapping[int, NodeInfo], dag: RuleDag, view: str,
            selective: Collection[int] = ()) -> Composition:
    """``selective``: the σ over a scan to store as caches (``planner/selective.py``)."""
    mats, via_root = decide_caches(root, infos, view, selective)
    by_nid = {m.nid: m for m in mats}
    nodes = {n.nid: n for n in A.walk(root)}
    segment: dict[int, int] = {}  # operator → the materialized operator its i-diffs feed

    def assign(n: A.Node, target: int) -> None:
        here = n.nid if n.nid in by_nid else target
        segment[n.nid] = here
        for ch in n.children:
            assign(ch, here)

    assign(root, root.nid)
    stmts: list[Statement] = []
    applied: list[frozenset[int]] = []
    done: set[int] = set()

    def emit(s: Statement) -> None:
        stmts.append(s)
        applied.append(frozenset(done))

    for d in dag.base:
        emit(Compute(d.name, d.query, d.rule, "instance"))
    for m in mats:
        seg = [d for d in dag.diffs.values()
               if d.schema.nid >= 0 and segment.get(d.schema.nid) == m.nid]
        for d in seg:
            emit(Compute(d.name, d.query, f"{d.rule}  [{d.schema.describe()}]", "idiff"))
        target_diffs = dag.by_node.get(m.nid, ())
        direct = dag.direct.get(m.nid, frozenset()) if m.role != "view" else frozenset()
        rest = tuple(d for d in target_diffs if d.name not in direct)
        # a cache all of whose i-diffs the rule above reads straight has no snapshots
        snapshots = m.role != "view" and (bool(rest) or not direct)
        images = _images_of_exact(nodes[m.nid], m, rest) if snapshots and not direct \
            else None
        if images is not None:
            emit(Compute(f"{m.name}__old", images[0],
                         f"snapshot: rows of {m.name} its i-diffs touch (Input_pre), their "
                         "pre-images (exact i-diffs)", "snapshot"))
        elif snapshots:
            emit(Compute(f"{m.name}__old", _snapshot(m, rest),
                         f"snapshot: rows of {m.name} its i-diffs touch (Input_pre)"
                         + (" but those only i-diffs read straight touch" if direct else ""),
                         "snapshot"))
        for kind in ("del", "upd", "ins"):
            for d in target_diffs:
                if d.schema.kind == kind:
                    emit(_apply(m, d))
        done.add(m.nid)
        if images is not None:
            emit(Compute(f"{m.name}__new", images[1],
                         f"snapshot: rows of {m.name} its i-diffs touch (Input_post), their "
                         "post-images (exact i-diffs)", "snapshot"))
        elif snapshots:
            emit(Compute(f"{m.name}__new", _post_of_touched(m, target_diffs),
                         f"snapshot: rows of {m.name} its i-diffs touch (Input_post), the "
                         "APPLYs replayed on the Input_pre snapshot", "snapshot"))
    return Composition(tuple(stmts), tuple(applied), tuple(mats), via_root,
                       {m.nid: dag.direct[m.nid] for m in mats
                        if m.role != "view" and dag.direct.get(m.nid)})


def touches(m_cols: tuple[str, ...], diffs: tuple[DiffNode, ...], alias: str,
            nullable: frozenset[str], key: tuple[str, ...],
            constant: frozenset[str] = frozenset()) -> exp.Expr:
    """The rows of a relation named by any of the i-diffs (by their IDs, but ``constant``
    ones: ``_probed``): one semi-join per set of IDs, on the union of the IDs of the i-diffs
    naming rows by that set (an engine drives it from the small union through the IDs'
    index; an OR of semi-joins, one per i-diff, makes it scan the relation)."""
    by_ids: dict[tuple[str, ...], list[DiffNode]] = {}
    for d in diffs:
        by_ids.setdefault(key if d.schema.kind == "ins" else d.schema.ids, []).append(d)
    parts: list[exp.Expr] = []
    for all_ids, ds in by_ids.items():
        ids = _probed(all_ids, constant)
        named = union_all([select([(k, c(k, "z")) for k in ids], t(d.name, "z")) for d in ds])
        src = subquery(named, "z") if len(ds) > 1 else t(ds[0].name, "z")
        parts.append(exists(src, match([(k, k) for k in ids], alias, "z",
                                       {k: True for k in nullable})))
    if not parts:
        return exp.false()
    out = parts[0]
    for p in parts[1:]:
        out = exp.or_(out, p)
    return out


def _snapshot(m: Materialized, diffs: tuple[DiffNode, ...]) -> exp.Select:
    return select([(k, c(k, "x")) for k in m.columns], t(m.name, "x"),
                  touches(m.columns, diffs, "x", m.nullable, m.key, m.constant))


def _images_of_exact(node: A.Node, m: Materialized, diffs: tuple[DiffNode, ...]
                     ) -> tuple[exp.Expr, exp.Expr] | None:
    """A cache's two snapshots from its i-diffs alone, when every one is exact
    (``DiffNode.exact``: γ's per-group Δ+, Δ-, Δu, which read Output) and carries every
    column of the cache: before, the pre-images of the Δ- and Δu rows (a Δ+ names no row
    that was there); after, the Δu post-images and the Δ+ rows — pass 4's pre-images rewrite,
    C3 and C1 (``minimize.FETCH_REWRITES``) on the snapshots, which exactness makes hold for
    the union of the i-diffs: the cache is not read for them (TPC-H Q13: 3.2k groups, two
    probes of the cache each), and the after-snapshot replays no APPLY. None when any i-diff
    is not such."""
    if not diffs or not all(d.exact for d in diffs):
        return None
    before = [pre_images("pre", node, d) for d in diffs if d.schema.kind != "ins"]
    after = [(c3_full_update if d.schema.kind == "upd" else c1_insert)("post", node, d)
             for d in diffs if d.schema.kind != "del"]
    parts = [*before, *after]
    if any(p is None for p in parts):
        return None

    def rows(qs: list[exp.Expr | None]) -> exp.Expr:
        return union_all([q for q in qs if isinstance(q, exp.Select)]) if qs else select(
            [(k, c(k, "z")) for k in m.columns], t(m.name, "z"), exp.false())

    return rows(before), rows(after)


def _post_of_touched(m: Materialized, diffs: tuple[DiffNode, ...]) -> exp.Select:
    """The touched rows after the APPLYs, from the ``__old`` snapshot rather than from the
    relation again: each APPLY (DELETE, UPDATE … SET, insert-or-replace, in the script's order)
    replayed on those rows. The same rows as a second snapshot — a row no i-diff names is
    unchanged — and, where an UPDATE sets a column another i-diff names rows by, a superset
    with each row's pre- and post-image on the two sides, which cancel where unchanged; the
    stored relation is read once per refresh, by its i-diffs' IDs."""
    cols = m.columns
    q: exp.Select = select([(k, c(k, "x0")) for k in cols], t(f"{m.name}__old", "x0"))
    i = 0
    for kind in ("del", "upd", "ins"):
        for d in diffs:
            if d.schema.kind != kind:
                continue
            a = _apply(m, d)
            i += 1
            cur, x = subquery(q, f"x{i}"), f"x{i}"
            nulls = {k: True for k in a.nullable}
            pairs = [(k, k) for k in _probed(a.ids, m.constant)]
            if kind == "del":
                q = select([(k, c(k, x)) for k in cols], cur,
                           exp.Not(this=exists(t(d.name, "z"), match(pairs, x, "z", nulls))),
                           owned=True)
            elif kind == "upd":
                u = f"u{i}"
                posts = select([(k, c(k, "z")) for k in a.ids]
                               + [(post_name(k), c(post_name(k), "z")) for k in a.columns]
                               + [("__m", exp.true())], t(d.name, "z"), distinct=True)
                hit = exp.Not(this=exp.Is(this=c("__m", u), expression=exp.null()))
                q = select([(k, exp.Case(ifs=[exp.If(this=hit.copy(),
                                                     true=c(post_name(k), u))],
                                         default=c(k, x)) if k in a.columns else c(k, x))
                            for k in cols], cur).join(
                    subquery(posts, u), on=match(pairs, x, u, nulls), join_type="left")
            else:
                kept = select([(k, c(k, x)) for k in cols], cur, exp.Not(this=exists(
                    t(d.name, "z"), match(pairs, x, "z", nulls))), owned=True)
                rows = select([(k, c(k, "z")) for k in cols], t(d.name, "z"), distinct=True)
                q = select([(k, c(k, f"y{i}")) for k in cols],
                           subquery(union_all([kept, rows]), f"y{i}"))
    return q


def _apply(m: Materialized, d: DiffNode) -> Apply:
    s = d.schema
    cols = m.columns if s.kind == "ins" else s.post
    return Apply(s.kind, m.name, d.name, m.key if s.kind == "ins" else s.ids, cols, m.key,
                 m.nullable & frozenset(m.key if s.kind == "ins" else s.ids),
                 f"APPLY {s.describe()} to {m.name} ({m.role})")


def _probed(ids: tuple[str, ...], constant: frozenset[str]) -> tuple[str, ...]:
    """The IDs a probe for rows named by ``ids`` matches on: all but the constant ones (every
    row has their one value, and so has every row naming one), which only mislead a planner's
    estimates (a global γ's ``__g`` joined to its one row: estimated as a filter)."""
    return tuple(k for k in ids if k not in constant) or ids


def _row_wise_scan(node: A.Node) -> A.Scan | None:
    """The one scan below ``node`` when only σ and π lie between them."""
    while isinstance(node, A.Select | A.Project):
        node = node.children[0]
    return node if isinstance(node, A.Scan) else None


# -- placeholder resolution -----------------------------------------------------------------


class Resolver:
    """Turns Input_pre/Input_post/Output/old/new/fetch placeholders into relations, given which
    caches are already applied when the statement runs."""

    def __init__(self, root: A.Node, infos: Mapping[int, NodeInfo], dag: RuleDag,
                 comp: Composition, catalog: Catalog) -> None:
        self.root, self.infos, self.dag, self.comp, self.catalog = root, infos, dag, comp, catalog
        self.nodes = {n.nid: n for n in A.walk(root)}
        self.mats = {m.nid: m for m in comp.materialized}

    def types(self, col: str) -> str | None:
        for info in self.infos.values():
            if info.types.get(col):
                return info.types[col]
        return None

    # relations with all of a node's columns
    def state(self, nid: int, which: str, applied: frozenset[int],
              named: tuple[exp.Expr, tuple[str, ...]] | None = None) -> exp.Expr:
        """Input_pre / Input_post of ``nid``; with ``named`` (a relation and the IDs it
        names rows by), also the semi-join on those IDs, pushed down to the scan or cache the
        IDs come from where the operators between allow it (``OperatorRule.restrict``): the
        rows a semi-join above would keep, and those of no other IDs, are read."""
        node = self.nodes[nid]
        targets = self._restrict_targets(nid, named[1], which, applied) if named else {}

        def leaf(n: A.Node) -> exp.Expr | None:
            rel: exp.Expr | None = None
            if n.nid in self.mats and n.nid in applied:
                rel = t(self.mats[n.nid].name) if which == "post" else self.cache_pre(n.nid)
            elif which == "pre" and isinstance(n, A.Scan):
                rel = self.base_pre(n)
            elif n.nid in targets and isinstance(n, A.Scan):
                rel = select([(p, c(b, "r")) for p, b in zip(n.cols, n.base_cols, strict=True)],
                             t(self.catalog.table(n.table).name, "r"))
            if n.nid not in targets or rel is None or named is None:
                return rel
            info = self.infos[n.nid]
            on = list(targets[n.nid].items())
            nullable = {k: info.nullable.get(k, True) for k, _ in on}

            def semi(r: exp.Expr) -> exp.Expr:  # into each branch of a UNION ALL
                if isinstance(r, exp.Union) and not r.args.get("distinct"):
                    return exp.union(semi(r.this), semi(r.expression), distinct=False)
                return select([(k, c(k, "s")) for k in n.columns], subquery(r, "s") if not
                              isinstance(r, exp.Table) else t(r.name, "s"),
                              exists(subquery(named[0].copy(), "z"), match(on, "s", "z",
                                                                           nullable)))

            return semi(rel)

        return render(node, leaf, self.types)

    def _restrict_targets(self, nid: int, ids: tuple[str, ...], which: str,
                          applied: frozenset[int]) -> dict[int, dict[str, str]]:
        """The scans and applied caches a semi-join of ``nid``'s rows on ``ids`` can be
        repeated at, each with {its column: the ID it matches} for the IDs it can be on
        there (none when the semi-join cannot go below ``nid``)."""
        from idivm.rules import rule_for

        out: dict[int, dict[str, str]] = {}

        def go(node: A.Node, on: dict[str, str]) -> None:  # on: column here → the ID
            if node.nid in self.mats and node.nid in applied or isinstance(node, A.Scan):
                if node.nid != nid:
                    out[node.nid] = on
                return
            fn = rule_for(node).restrict
            for idx, step in fn(node, tuple(on)) if fn is not None else ():
                go(node.children[idx], {below: on[above] for above, below in step.items()})

        go(self.nodes[nid], {k: k for k in ids})
        return out

    def base_pre(self, scan: A.Scan) -> exp.Expr:
        """R_pre = (R minus the changed keys) ∪ the pre-images of the changes."""
        table = self.catalog.table(scan.table)
        key = table.primary_key
        pairs = list(zip(scan.cols, scan.base_cols, strict=True))
        kept = select([(p, c(b, "r")) for p, b in pairs], t(table.name, "r"),
                      exp.Not(this=exists(t(change_table(table.name), "g"),
                                          match([(k, k) for k in key], "r", "g"))))
        old = select([(p, c(b if b in key else pre_name(b), "g")) for p, b in pairs],
                     t(change_table(table.name), "g"), c("__has_pre", "g"))
        return union_all([kept, old])

    def base_side(self, scan: A.Scan, which: str) -> exp.Select:
        table = self.catalog.table(scan.table)
        name = pre_name if which == "old" else post_name
        flag = "__has_pre" if which == "old" else "__has_post"
        return select([(p, c(b if b in table.primary_key else name(b), "g"))
                       for p, b in zip(scan.cols, scan.base_cols, strict=True)],
                      t(change_table(table.name), "g"), c(flag, "g"))

    def cache_pre(self, nid: int) -> exp.Expr:
        m = self.mats[nid]
        if self.comp.direct.get(nid):
            # its snapshots leave out the rows only i-diffs read straight touch
            raise AssertionError(f"Input_pre of {m.name}, whose i-diffs are read straight")
        kept = select([(k, c(k, "x")) for k in m.columns], t(m.name, "x"),
                      exp.Not(this=exists(t(f"{m.name}__new", "n"),
                                          match([(k, k) for k in _probed(m.key, m.constant)],
                                                "x", "n",
                                                {k: True for k in m.nullable}))))
        old = select([(k, c(k, "o")) for k in m.columns], t(f"{m.name}__old", "o"))
        return union_all([kept, old])

    def output(self, nid: int) -> exp.Expr:
        if nid in self.mats:
            return t(self.mats[nid].name)
        mapping = self.comp.via_root[nid]
        view = self.mats[self.root.nid]
        return select([(k, c(v, "w")) for k, v in mapping.items()], t(view.name, "w"))

    def old_new(self, nid: int, which: str, applied: frozenset[int]) -> exp.Expr:
        """The rows of operator ``nid`` its i-diffs touch, before (``old``) or after
        (``new``) the changes."""
        node = self.nodes[nid]
        if isinstance(node, A.Scan):
            return self.base_side(node, which)
        if nid in self.mats:
            return t(f"{self.mats[nid].name}__{which}")
        scan = _row_wise_scan(node)
        if scan is not None:
            # σ/π over one table: the changed rows' pre- (post-) images through σ/π. A
            # superset of the touched rows, the same keys on both sides, so rows that did not
            # change cancel in what reads old against new.
            side = self.base_side(scan, which)
            return render(node, lambda n: side.copy() if n is scan else None, self.types)
        info = self.infos[nid]
        nullable = {k: True for k in node.columns if info.nullable.get(k, True)}
        # one semi-join per set of IDs the i-diffs name rows by, with the union of those
        # i-diffs' IDs: an engine drives it from the (small) union through the IDs' indexes,
        # and the state is written once per ID set, not once per i-diff
        # (not the i-diffs the rule above reads straight: ``read_directly``)
        direct = self.dag.direct.get(nid, frozenset())
        by_ids: dict[tuple[str, ...], list[DiffNode]] = {}
        for d in self.dag.by_node.get(nid, ()):
            if d.name not in direct:
                by_ids.setdefault(info.ids if d.schema.kind == "ins" else d.schema.ids,
                                  []).append(d)
        parts = []
        for all_ids, ds in by_ids.items():
            ids = _probed(all_ids, info.constant)
            named = union_all([select([(k, c(k, "z")) for k in ids], t(d.name, "z"))
                               for d in ds])
            probe = exists(subquery(named.copy(), "z"), match([(k, k) for k in ids], "s", "z",
                                                              nullable))
            pushed = self.state(nid, "pre" if which == "old" else "post", applied,
                                (named, ids))
            parts.append(select([(k, c(k, "s")) for k in node.columns],
                                subquery(pushed, "s"), probe))
        if not parts:
            state = self.state(nid, "pre" if which == "old" else "post", applied)
            return select([(k, c(k, "s")) for k in node.columns], subquery(state, "s"),
                          exp.false())
        out: exp.Expr = parts[0]
        for q in parts[1:]:  # rows are unique by the node's IDs: UNION loses nothing
            out = exp.union(out, q, distinct=True, copy=False)
        return out

    def fetch(self, which: str, nid: int, diff: str, applied: frozenset[int]) -> exp.Expr:
        node = self.nodes[nid]
        d = self.dag.diffs[diff]
        info = self.infos[nid]
        ids = _probed(info.ids if d.schema.kind == "ins" else d.schema.ids, info.constant)
        named = select([(k, c(k, "z")) for k in ids], t(diff, "z"))
        src = subquery(self.state(nid, which, applied, (named, ids)), "s")
        nullable = {k: True for k in ids if info.nullable.get(k, True)}
        return select([(k, c(k, "s")) for k in node.columns], src,
                      exists(t(diff, "z"), match([(k, k) for k in ids], "s", "z", nullable)),
                      owned=True)

    def resolve(self, q: exp.Expr, applied: frozenset[int],
                rewrite_fetch: Callable[[str, int, DiffNode], exp.Expr | None]
                ) -> exp.Expr:
        def sub(n: exp.Expr) -> exp.Expr:
            if not isinstance(n, exp.Table):
                return n
            alias = n.alias
            rel: exp.Expr | None = None
            m = PLACEHOLDER.match(n.name)
            f = FETCH.match(n.name)
            if m:
                kind, nid = m.group(1), int(m.group(2))
                if kind in ("post", "pre"):
                    rel = self.state(nid, kind, applied)
                elif kind == "output":
                    rel = self.output(nid)
                else:
                    rel = self.old_new(nid, kind, applied)
            elif f:
                which, nid, diff = f.group(1), int(f.group(2)), f.group(3)
                rel = rewrite_fetch(which, nid, self.dag.diffs[diff])
                if rel is None:
                    rel = self.fetch(which, nid, diff, applied)
            if rel is None:
                return n
            if isinstance(rel, exp.Table):
                return t(rel.name, alias or None)
            return subquery(rel, alias or n.name)

        return q.transform(sub)  # (a copy, rewritten)
