"""Trigger program → C++17 source (one translation unit including ``runtime.hpp``).

Every map becomes a ``fv::Map<K, NS>`` member, with one secondary index per slice pattern its
readers use; every trigger a member function whose statements are nested lambdas over map
slices (g++ inlines them: the loops are plain loops). Arguments are the event tuple's 64-bit
words (``t`` the new tuple, ``o`` the old one of an in-place update); text is interned, so
string constants become ids looked up once when the view is created.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from idivm.fresh import expr as E
from idivm.fresh.program import MapDef, Pipeline, Program, Stage, Stmt
from idivm.fresh.query import Mono

TYPE_CODE = {"int": 0, "float": 1, "str": 2, "date": 3, "bool": 4}
OPS = {"insert": 0, "delete": 1, "update": 2, "upsert": 3}
FORMATS = {"events": 0, "orderbook": 1, "tpch": 2}


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _family_key(m: MapDef) -> tuple[object, ...]:
    """Maps over the same keys, atoms and conditions, differing only in their values, share
    one physical map with a value per member (F-IVM's payloads in their simplest form): one
    probe or one slice loop then serves all of them."""
    mono = m.monos[0]
    body = Mono(1, mono.atoms, mono.conds).show()
    if m.role == "view":
        return ("view", tuple(E.show(k) for k in m.keys), tuple(k.type for k in m.keys), body)
    return (m.role, tuple(k.type for k in m.keys), body)


@dataclass
class _Ctx:
    prog: Program
    strings: list[str] = field(default_factory=list)
    masks: dict[str, list[int]] = field(default_factory=dict)  # family → secondary masks
    counter: int = 0
    slot: dict[str, tuple[str, int]] = field(default_factory=dict)  # map → (family, value)
    families: dict[str, list[MapDef]] = field(default_factory=dict)
    touch: int = -1  # a publishing stage: group words its view-map updates record (else -1)
    patterns: list[str] = field(default_factory=list)  # LIKE patterns, registered as P[i]
    substrs: list[tuple[int, int]] = field(default_factory=list)  # SUBSTRING bounds, Q[i]

    def __post_init__(self) -> None:
        by_key: dict[tuple[object, ...], str] = {}
        for m in self.prog.maps:
            fam = by_key.setdefault(_family_key(m), f"F_{_ident(m.name)}")
            members = self.families.setdefault(fam, [])
            self.slot[m.name] = (fam, len(members))
            members.append(m)

    def string(self, s: str) -> str:
        if s not in self.strings:
            self.strings.append(s)
        return f"S[{self.strings.index(s)}]"

    def mask_index(self, m: str, mask: int) -> int:
        ms = self.masks.setdefault(m, [])
        if mask not in ms:
            ms.append(mask)
        return ms.index(mask)

    def fresh(self) -> int:
        self.counter += 1
        return self.counter


def cexpr(e: E.Expr, ctx: _Ctx, env: dict[str, str]) -> str:
    """A C++ expression; floats as double, everything else as int64_t."""
    if isinstance(e, E.Var):
        return env[e.name]
    if isinstance(e, E.Arg):
        w = f"{'o' if e.side else 't'}[{e.index}]"
        return f"fv::dec({w})" if e.type == "float" else w
    if isinstance(e, E.Const):
        if isinstance(e.value, str):
            return ctx.string(e.value)
        if e.type == "float":
            return repr(float(e.value))
        return f"INT64_C({int(e.value)})"
    if isinstance(e, E.Arith):
        a, b = cexpr(e.left, ctx, env), cexpr(e.right, ctx, env)
        if e.op == "/" and e.type == "int":
            return f"fv::idiv({a}, {b})"
        if e.op == "/":
            return f"(static_cast<double>({a}) / {b})"
        return f"({a} {e.op} {b})"
    if isinstance(e, E.Neg):
        return f"(-{cexpr(e.arg, ctx, env)})"
    if isinstance(e, E.Cmp):
        op = {"=": "==", "<>": "!="}.get(e.op, e.op)
        return f"({cexpr(e.left, ctx, env)} {op} {cexpr(e.right, ctx, env)})"
    if isinstance(e, E.BoolOp):
        op = " && " if e.op == "and" else " || "
        return "(" + op.join(cexpr(a, ctx, env) for a in e.args) + ")"
    if isinstance(e, E.Not):
        return f"(!{cexpr(e.arg, ctx, env)})"
    if isinstance(e, E.Extract):
        x = cexpr(e.arg, ctx, env)
        return {"year": f"({x} / INT64_C(10000))", "month": f"({x} / 100 % 100)",
                "day": f"({x} % 100)"}[e.field]
    if isinstance(e, E.Like):
        if e.pattern not in ctx.patterns:
            ctx.patterns.append(e.pattern)
        return f"strs.like({cexpr(e.arg, ctx, env)}, P[{ctx.patterns.index(e.pattern)}])"
    if isinstance(e, E.Substr):
        bounds = (e.start, e.length)
        if bounds not in ctx.substrs:
            ctx.substrs.append(bounds)
        return f"strs.substr({cexpr(e.arg, ctx, env)}, Q[{ctx.substrs.index(bounds)}])"
    if isinstance(e, E.Case):
        ctype = "double" if e.type == "float" else "int64_t"
        out = f"static_cast<{ctype}>({cexpr(e.default, ctx, env)})"
        for c, v in reversed(e.whens):
            out = f"({cexpr(c, ctx, env)} ? static_cast<{ctype}>({cexpr(v, ctx, env)}) : {out})"
        return out
    raise TypeError(e)


def _word(e: E.Expr, ctx: _Ctx, env: dict[str, str]) -> str:
    x = cexpr(e, ctx, env)
    return f"fv::enc({x})" if e.type == "float" else f"static_cast<int64_t>({x})"


def _key(fam: str, words: Sequence[str]) -> str:
    return f"{fam}_t::Key{{{{{', '.join(words)}}}}}"


def _signature(s: Stmt, ctx: _Ctx) -> str:
    loops = [(ctx.slot[lp.map][0], [E.show(b) if b is not None else None for b in lp.bound],
              lp.binds) for lp in s.loops]
    return repr(([E.show(g) for g in s.guards], loops, [E.show(c) for c in s.conds]))


def _group(stmts: Sequence[Stmt], ctx: _Ctx) -> list[list[Stmt]]:
    """Statements with the same guards, loops (over the same physical maps) and conditions
    share one loop nest. Reordering is safe within one target order: such statements never
    read each other's targets (a delta reads only maps of lower order)."""
    order = {m.name: m.order for m in ctx.prog.maps}
    keyed = sorted(((-order[st.target], _signature(st, ctx)), i, st) for i, st in
                   enumerate(stmts))
    groups: list[list[Stmt]] = []
    last = None
    for key, _, st in keyed:
        if key != last:
            groups.append([])
            last = key
        groups[-1].append(st)
    return groups


def _stmt(group: Sequence[Stmt], ctx: _Ctx, ind: str) -> list[str]:
    """One loop nest: guards, nested loops (conditions placed as soon as their variables are
    bound), then ``target.add(key, slot, coef · factors · loop values)`` per statement."""
    s = group[0]
    maps = {m.name: m for m in ctx.prog.maps}
    env: dict[str, str] = {}
    lines: list[str] = []
    stack: list[str] = []  # closers of the open blocks
    known: set[str] = set()
    placed: set[int] = set()

    def cur() -> str:
        return ind + "  " * len(stack)

    def open_block(line: str, closer: str) -> None:
        lines.append(cur() + line)
        stack.append(closer)

    def place_conds() -> None:
        ready = [i for i, c in enumerate(s.conds) if i not in placed
                 and E.variables(c) <= known]
        if ready:
            placed.update(ready)
            open_block(f"if ({' && '.join(cexpr(s.conds[i], ctx, env) for i in ready)}) {{",
                       "}")

    if s.guards:
        open_block(f"if ({' && '.join(cexpr(g, ctx, env) for g in s.guards)}) {{", "}")
    place_conds()
    loop_vals: list[str] = []
    for lp in s.loops:
        m = maps[lp.map]
        fam = ctx.slot[lp.map][0]
        n = ctx.fresh()
        bound_words = [_word(b, ctx, env) if b is not None else "0" for b in lp.bound]
        mask = sum(1 << i for i, b in enumerate(lp.bound) if b is not None)
        if mask == (1 << m.arity) - 1:
            open_block(f"if (const double* lv{n} = {fam}.find({_key(fam, bound_words)})) {{",
                       "}")
        elif mask == 0:
            open_block(f"{fam}.scan([&](const {fam}_t::Key& k{n}, const double* lv{n}) {{",
                       "});")
        else:
            si = ctx.mask_index(fam, mask)
            open_block(f"{fam}.template slice<{si}>({_key(fam, bound_words)}, "
                       f"[&](const {fam}_t::Key& k{n}, const double* lv{n}) {{", "});")
        for i, name in enumerate(lp.binds):
            if name is None:
                continue
            c_name = f"x{n}_{i}"
            if m.keys[i].type == "float":
                lines.append(f"{cur()}const double {c_name} = fv::dec(k{n}[{i}]);")
            else:
                lines.append(f"{cur()}const int64_t {c_name} = k{n}[{i}];")
            env[name] = c_name
            known.add(name)
        loop_vals.append(f"lv{n}")
        place_conds()
    assert len(placed) == len(s.conds), "a condition reads a variable no loop binds"
    # (family, key) → per-member delta expressions; in the loop, or summed in registers and
    # applied after it when the key does not depend on the loops
    inner: dict[tuple[str, str], dict[int, list[str]]] = {}
    outer: dict[tuple[str, str], dict[int, list[str]]] = {}
    decls: list[str] = []
    for st in group:
        vals = [f"{lv}[{ctx.slot[lp.map][1]}]" for lv, lp in zip(loop_vals, st.loops,
                                                                   strict=True)]
        value = " * ".join([repr(float(st.coef))] + [
            f"static_cast<double>({cexpr(f, ctx, env)})" for f in st.factors] + vals)
        fam, slot = ctx.slot[st.target]
        looped = set().union(*(E.variables(k) for k in st.keys)) & known if st.keys else set()
        if s.loops and not looped:
            acc = f"acc{ctx.fresh()}"
            decls.append(f"{ind}double {acc} = 0.0;")
            lines.append(f"{cur()}{acc} += {value};")
            key = _key(fam, [_word(k, ctx, {}) for k in st.keys])
            outer.setdefault((fam, key), {}).setdefault(slot, []).append(acc)
        else:
            key = _key(fam, [_word(k, ctx, env) for k in st.keys])
            inner.setdefault((fam, key), {}).setdefault(slot, []).append(value)
    lines += _adds(inner, ctx, cur())
    while stack:
        closer = stack.pop()
        lines.append(cur() + closer)
    return decls + lines + _adds(outer, ctx, ind)


def _adds(adds: dict[tuple[str, str], dict[int, list[str]]], ctx: _Ctx, ind: str) -> list[str]:
    """One map update per (family, key): several members' deltas share one probe."""
    out = []
    for (fam, key), by_slot in adds.items():
        sums = {slot: " + ".join(vs) for slot, vs in by_slot.items()}
        touch = ctx.touch >= 0 and ctx.families[fam][0].role == "view"
        k = "tk" if touch else key
        if len(sums) == 1:
            ((slot, v),) = sums.items()
            add = f"{fam}.add({k}, {slot}, {v});"
        else:
            width = len(ctx.families[fam])
            vec = ", ".join(f"({sums[j]})" if j in sums else "0.0" for j in range(width))
            add = f"{fam}.addv({k}, {{{{{vec}}}}});"
        out.append(f"{ind}{{ const auto tk = {key}; {add} touch(tk); }}" if touch
                   else f"{ind}{add}")
    return out


def _stage_struct(si: int, stage: Stage, ctx: _Ctx) -> list[str]:
    """``Stage{si}``: one trigger program's maps and triggers (tables by stage-local index);
    a publishing stage records the groups its view maps touch and reads a group's row."""
    prog = stage.program
    tables = prog.tables
    body: list[str] = []
    for ti, t in enumerate(tables):
        for kind in ("insert", "delete"):
            body.append(f"  void {kind[:3]}_{ti}(const int64_t* t) {{  // {kind} {t.name}")
            body.append("    const int64_t* o = nullptr; (void)o;")
            for g in _group(prog.triggers[t.name][kind], ctx):
                body += _stmt(g, ctx, "    ")
            body.append("  }")
        cols = prog.inplace.get(t.name, frozenset())
        body.append(f"  void upd_{ti}(const int64_t* o, const int64_t* t) {{  // update "
                    f"{t.name}")
        quiet, guards = prog.filtered.get(t.name, (frozenset(), ()))
        if quiet:
            kept = [f"o[{i}] == t[{i}]" for i in range(len(t.types)) if i not in quiet]
            kept += [f"{cexpr(g, ctx, {})} == {cexpr(E.old_tuple(g), ctx, {})}" for g in guards]
            body.append(f"    if ({' && '.join(kept) or 'true'}) return;  // only filtered "
                        "columns changed, and no filter flips: no map changes")
        fixed = [i for i in range(len(t.types)) if i not in cols]
        if cols and prog.triggers[t.name]["update"] is not None:
            same = " && ".join(f"o[{i}] == t[{i}]" for i in fixed) or "true"
            body.append(f"    if ({same}) {{  // only value columns changed: adjust in place")
            for g in _group(prog.triggers[t.name]["update"], ctx):
                body += _stmt(g, ctx, "      ")
            body.append("      return;")
            body.append("    }")
        body.append(f"    del_{ti}(o);")
        body.append(f"    ins_{ti}(t);")
        body.append("  }")
    body.append("  void recompute() {")
    if prog.recompute:
        for fam, family in ctx.families.items():
            if family[0].role == "view":
                body.append(f"    {fam}.clear();")
        for g in _group(prog.recompute, ctx):
            body += _stmt(g, ctx, "    ")
    body.append("  }")
    published: list[str] = []
    if stage.publishes is not None:
        published = _row_reader(stage, ctx)

    members: list[str] = []
    for fam, ms in ctx.families.items():
        masks = ctx.masks.get(fam, [])
        init = ", ".join(f"{x}u" for x in masks)
        members += [f"  // [{i}] {m.show()}" for i, m in enumerate(ms)]
        members.append(f"  using {fam}_t = fv::Map<{ms[0].arity}, {len(masks)}, {len(ms)}>;")
        members.append(f"  {fam}_t {fam}{{{{{{{init}}}}}}};")
    width = ctx.touch
    return [
        f"struct Stage{si} {{",
        "  fv::Strings& strs;",
        f"  int64_t S[{max(len(ctx.strings), 1)}];",
        f"  int P[{max(len(ctx.patterns), 1)}];  // LIKE patterns",
        f"  int Q[{max(len(ctx.substrs), 1)}];  // SUBSTRING bounds",
        *members,
        *([f"  std::vector<std::array<int64_t, {width}>> touched;  // groups an event changed",
           "  template <size_t K> void touch(const std::array<int64_t, K>& k) {",
           f"    std::array<int64_t, {width}> p{{}};",
           f"    for (size_t i = 0; i < {width}; ++i) p[i] = k[i];",
           "    touched.push_back(p);",
           "  }"] if width >= 0 else []),
        "",
        f"  explicit Stage{si}(fv::Strings& s) : strs(s) {{",
        *[f"    S[{i}] = strs.intern({json.dumps(s)});" for i, s in enumerate(ctx.strings)],
        *[f"    P[{i}] = strs.pattern({json.dumps(s)});" for i, s in enumerate(ctx.patterns)],
        *[f"    Q[{i}] = strs.substring_of({a}, {b});" for i, (a, b) in enumerate(ctx.substrs)],
        "  }",
        "",
        *body,
        *published,
        "",
        "  void on(int table, int op, const int64_t* t, const int64_t* o) {",
        "    switch (table) {",
        *[f"      case {ti}: if (op == 0) ins_{ti}(t); else if (op == 1) del_{ti}(t); "
          f"else upd_{ti}(o, t); break;" for ti in range(len(tables))],
        "      default: break;",
        "    }",
        "  }",
        "",
        "  size_t bytes() const {",
        "    size_t b = 0;",
        *[f"    b += {fam}.bytes();" for fam in ctx.families],
        "    return b;",
        "  }",
        "  int64_t map_size(int m) const {",
        "    switch (m) {",
        *[f"      case {i}: {{ int64_t n = 0; {ctx.slot[m.name][0]}.scan([&](const auto&, "
          f"const double* v) {{ n += v[{ctx.slot[m.name][1]}] != 0.0; }}); return n; }}"
          for i, m in enumerate(prog.maps)],
        "      default: return -1;",
        "    }",
        "  }",
        "  void map_dump(int m, int64_t* keys, double* vals) const {",
        "    size_t i = 0;",
        "    switch (m) {",
        *[f"      case {i}: {ctx.slot[m.name][0]}.scan([&](const auto& k, const double* v) {{ "
          f"if (v[{ctx.slot[m.name][1]}] == 0.0) return; "
          f"for (size_t j = 0; j < {m.arity}; ++j) keys[i * {max(m.arity, 1)} + j] = k[j]; "
          f"vals[i++] = v[{ctx.slot[m.name][1]}]; }}); break;"
          for i, m in enumerate(prog.maps)],
        "      default: break;",
        "    }",
        "  }",
        "};",
        "",
    ]


def _row_reader(stage: Stage, ctx: _Ctx) -> list[str]:
    """``row(k, out)``: the derived relation's row of group ``k`` (group words, aggregate
    values, count) from the view maps; false when the group has no row."""
    prog = stage.program
    d = stage.publishes
    assert d is not None
    q = prog.query
    g = d.n_keys
    fam, slot = ctx.slot[prog.count_map]
    lines = [f"  bool row(const std::array<int64_t, {g}>& k, int64_t* out) {{",
             f"    for (size_t i = 0; i < {g}; ++i) out[i] = k[i];",
             f"    const double* c = {fam}.find(k);",
             f"    const double n = c ? c[{slot}] : 0.0;"]
    for i, (a, m) in enumerate(zip(q.aggs, prog.agg_maps, strict=True)):
        pos = g + i
        if m is None:  # count
            lines.append(f"    out[{pos}] = static_cast<int64_t>(std::llround(n));")
            continue
        mf, ms = ctx.slot[m]
        if a.func in ("sum", "avg"):
            lines.append(f"    {{ const double* p = {mf}.find(k); double s = p ? p[{ms}] : 0.0;")
            if a.func == "avg":
                lines.append(f"      out[{pos}] = fv::enc(n > 0.5 ? s / n : 0.0); }}")
            elif a.type == "float":
                lines.append(f"      out[{pos}] = fv::enc(s); }}")
            else:
                lines.append(f"      out[{pos}] = static_cast<int64_t>(std::llround(s)); }}")
            continue
        lines.append(f"    {{ {mf}_t::Key p{{}}; for (size_t i = 0; i < {g}; ++i) p[i] = k[i];")
        lines.append("      bool any = false; int64_t best = 0;")
        better = {"min": "<", "max": ">"}[a.func]
        val = f"fv::dec(e[{g}])" if a.type == "float" else f"e[{g}]"
        cur = "fv::dec(best)" if a.type == "float" else "best"
        visit = (f"[&](const {mf}_t::Key& e, const double* v) {{ if (v[{ms}] <= 0.5) return; "
                 f"if (!any || {val} {better} {cur}) {{ best = e[{g}]; any = true; }} }}")
        if g == 0:
            lines.append(f"      {mf}.scan({visit});")
        else:
            si = ctx.mask_index(mf, (1 << g) - 1)
            lines.append(f"      {mf}.template slice<{si}>(p, {visit});")
        lines.append(f"      out[{pos}] = best; }}")
    lines.append(f"    out[{g + len(q.aggs)}] = static_cast<int64_t>(std::llround(n));")
    lines.append(f"    return {'true' if d.always else 'n > 0.5'};")
    lines.append("  }")
    return lines


def generate(pipe: Pipeline | Program) -> str:
    """The C++ source of a view's pipeline (or of a single program): a struct per stage and
    ``View``, which routes base events to the stages reading them and publishes each stage's
    changed rows to the stages reading its derived relation."""
    if isinstance(pipe, Program):
        pipe = Pipeline((Stage(pipe, None),))
    stages = pipe.stages
    base = pipe.base_tables
    base_idx = {t.name: i for i, t in enumerate(base)}
    structs: list[str] = []
    for si, st in enumerate(stages):
        ctx = _Ctx(st.program, touch=st.publishes.n_keys if st.publishes else -1)
        structs += _stage_struct(si, st, ctx)
    top = len(stages) - 1
    # base table → (stage, local index); derived relation → its readers
    routes: dict[int, list[str]] = {}
    readers: dict[str, list[tuple[int, int]]] = {}
    for si, st in enumerate(stages):
        for ti, t in enumerate(st.program.tables):
            if t.name in base_idx:
                routes.setdefault(base_idx[t.name], []).append(f"s{si}.on({ti}, op, t, o);")
            else:
                readers.setdefault(t.name, []).append((si, ti))
    view: list[str] = []
    pubs = [(si, st.publishes) for si, st in enumerate(stages) if st.publishes is not None]
    for si, d in pubs:
        n = len(d.columns)
        emit = " ".join(f"s{r}.on({ti}, op, t, o);" for r, ti in readers.get(d.name, []))
        view += [
            f"  void emit{si}(int op, const int64_t* t, const int64_t* o) {{ {emit} }}",
            f"  void publish{si}(const std::array<int64_t, {d.n_keys}>& k) {{  // {d.name}",
            f"    int64_t r[{n}];",
            f"    const bool live = s{si}.row(k, r);",
            f"    const int64_t* cur = pub{si}.find(r);",
            "    if (cur) {",
            f"      if (live && std::memcmp(cur, r, {n * 8}) == 0) return;",
            f"      int64_t old[{n}];",
            f"      std::memcpy(old, cur, {n * 8});",
            f"      if (live) {{ std::memcpy(const_cast<int64_t*>(cur), r, {n * 8}); "
            f"emit{si}(2, r, old); }}",
            f"      else {{ pub{si}.erase(old); emit{si}(1, old, nullptr); }}",
            f"    }} else if (live) {{ pub{si}.insert(r); emit{si}(0, r, nullptr); }}",
            "  }",
        ]
    flush = []
    for si, _ in pubs:
        flush += [f"    for (size_t i = 0; i < s{si}.touched.size(); ++i) "
                  f"publish{si}(s{si}.touched[i]);",
                  f"    s{si}.touched.clear();"]
    order = [top] + list(range(top))  # map numbering: the view's maps first
    offsets: list[tuple[int, int]] = []
    acc = 0
    for si in order:
        offsets.append((si, acc))
        acc += len(stages[si].program.maps)
    src: list[str] = [
        "// Generated by idivm.fresh: a higher-order IVM trigger program (C++17, std only).",
        f"// View: {' '.join(pipe.view.query.sql.split())}",
        "//",
        *["// " + ln for ln in pipe.listing().splitlines()],
        '#include "runtime.hpp"',
        "",
        "namespace {",
        "",
        *structs,
        "struct View {",
        "  fv::Strings strs;",
        *[f"  Stage{si} s{si}{{strs}};" for si in range(len(stages))],
        *[f"  fv::Rows pub{si}{{{len(d.columns)}, std::vector<int>{{"
          f"{', '.join(str(i) for i in range(d.n_keys))}}}}};  // {d.name} as published"
          for si, d in pubs],
        "  std::vector<fv::Rows> rows;  // by primary key, per base table",
        "  bool track = true;",
        "",
        "  View() {",
        *[f"    rows.emplace_back({len(t.types)}, "
          f"std::vector<int>{{{', '.join(map(str, t.key))}}});" for t in base],
        # a global aggregate has its one row before any input (SQL's γ over ∅)
        *[f"    publish{si}({{}});  // {d.name}: a global aggregate's row"
          for si, d in pubs if d.always],
        "    flush();",
        "  }",
        "",
        "  void on(int table, int op, const int64_t* t, const int64_t* o) {",
        "    switch (table) {",
        *[f"      case {bi}: {' '.join(routes.get(bi, []))} break;" for bi in range(len(base))],
        "      default: break;",
        "    }",
        "    flush();",
        "  }",
        "  void flush() {  // each stage, inner first, publishes the groups an event touched",
        *flush,
        "  }",
        *view,
        f"  void recompute() {{ s{top}.recompute(); }}",
        "  size_t bytes() const {",
        "    return " + " + ".join([f"s{si}.bytes()" for si in range(len(stages))]
                               + [f"pub{si}.bytes()" for si, _ in pubs]) + ";",
        "  }",
        "  int64_t map_size(int m) const {",
        *[f"    if (m >= {off} && m < {off + len(stages[si].program.maps)}) "
          f"return s{si}.map_size(m - {off});" for si, off in offsets],
        "    return -1;",
        "  }",
        "  void map_dump(int m, int64_t* keys, double* vals) const {",
        *[f"    if (m >= {off} && m < {off + len(stages[si].program.maps)}) "
          f"s{si}.map_dump(m - {off}, keys, vals);" for si, off in offsets],
        "  }",
        "};",
        "",
        "const int N_TABLES = " + str(len(base)) + ";",
        "const char* TABLE_NAMES[] = {" + ", ".join(json.dumps(t.name) for t in base) + "};",
        "const int TABLE_ARITY[] = {" + ", ".join(str(len(t.types)) for t in base) + "};",
        "const int TABLE_TYPES[][64] = {" + ", ".join(
            "{" + ", ".join(str(TYPE_CODE[x]) for x in t.types) + "}" for t in base) + "};",
        f"const bool DEPTH0 = {'true' if pipe.view.depth == 0 else 'false'};",
        "",
        "}  // namespace",
        "",
        '#include "abi.hpp"',
        "",
    ]
    return "\n".join(src)


__all__ = ["generate", "OPS", "FORMATS"]
