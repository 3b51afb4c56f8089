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
from idivm.fresh.program import MapDef, Program, Stmt
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
        if len(sums) == 1:
            ((slot, v),) = sums.items()
            out.append(f"{ind}{fam}.add({key}, {slot}, {v});")
        else:
            width = len(ctx.families[fam])
            vec = ", ".join(f"({sums[j]})" if j in sums else "0.0" for j in range(width))
            out.append(f"{ind}{fam}.addv({key}, {{{{{vec}}}}});")
    return out


def generate(prog: Program) -> str:
    """The C++ source of ``prog``."""
    ctx = _Ctx(prog)
    tables = prog.tables
    body: list[str] = []
    # triggers
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

    members: list[str] = []
    for fam, ms in ctx.families.items():
        masks = ctx.masks.get(fam, [])
        init = ", ".join(f"{x}u" for x in masks)
        members += [f"  // [{i}] {m.show()}" for i, m in enumerate(ms)]
        members.append(f"  using {fam}_t = fv::Map<{ms[0].arity}, {len(masks)}, {len(ms)}>;")
        members.append(f"  {fam}_t {fam}{{{{{{{init}}}}}}};")
    src: list[str] = [
        "// Generated by idivm.fresh: a higher-order IVM trigger program (C++17, std only).",
        f"// View: {' '.join(prog.query.sql.split())}",
        "//",
        *["// " + ln for ln in prog.listing().splitlines()],
        '#include "runtime.hpp"',
        "",
        "namespace {",
        "",
        "struct View {",
        "  fv::Strings strs;",
        f"  int64_t S[{max(len(ctx.strings), 1)}];",
        *members,
        "  std::vector<fv::Rows> rows;  // by primary key, per table",
        "  bool track = true;",
        "",
        "  View() {",
        *[f"    S[{i}] = strs.intern({json.dumps(s)});" for i, s in enumerate(ctx.strings)],
        *[f"    rows.emplace_back({len(t.types)}, "
          f"std::vector<int>{{{', '.join(map(str, t.key))}}});" for t in tables],
        "  }",
        "",
        *body,
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
        "",
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
        "const int N_TABLES = " + str(len(tables)) + ";",
        "const char* TABLE_NAMES[] = {" + ", ".join(json.dumps(t.name) for t in tables) + "};",
        "const int TABLE_ARITY[] = {" + ", ".join(str(len(t.types)) for t in tables) + "};",
        "const int TABLE_TYPES[][64] = {" + ", ".join(
            "{" + ", ".join(str(TYPE_CODE[x]) for x in t.types) + "}" for t in tables) + "};",
        f"const bool DEPTH0 = {'true' if prog.depth == 0 else 'false'};",
        "",
        "}  // namespace",
        "",
        '#include "abi.hpp"',
        "",
    ]
    return "\n".join(src)


__all__ = ["generate", "OPS", "FORMATS"]
