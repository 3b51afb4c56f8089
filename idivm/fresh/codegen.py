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
from idivm.fresh.program import Loop, MapDef, Program, Stmt

TYPE_CODE = {"int": 0, "float": 1, "str": 2, "date": 3, "bool": 4}
OPS = {"insert": 0, "delete": 1, "update": 2, "upsert": 3}
FORMATS = {"events": 0, "orderbook": 1, "tpch": 2}


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


@dataclass
class _Ctx:
    prog: Program
    strings: list[str] = field(default_factory=list)
    masks: dict[str, list[int]] = field(default_factory=dict)  # map → secondary masks
    counter: int = 0

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


def _key(m: MapDef, words: Sequence[str]) -> str:
    return f"M_{_ident(m.name)}_t::Key{{{{{', '.join(words)}}}}}"


def _stmt(s: Stmt, ctx: _Ctx, ind: str) -> list[str]:
    """One statement: guards, nested loops (conditions placed as soon as their variables are
    bound), then ``target.add(key, coef · factors · loop values)``."""
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
    vals: list[str] = []
    for lp in s.loops:
        m = maps[lp.map]
        n = ctx.fresh()
        ktype = f"M_{_ident(m.name)}_t::Key"
        bound_words = [_word(b, ctx, env) if b is not None else "0" for b in lp.bound]
        mask = sum(1 << i for i, b in enumerate(lp.bound) if b is not None)
        if mask == (1 << m.arity) - 1:
            open_block(f"{{ const double lv{n} = {_ident(m.name)}.get({_key(m, bound_words)}); "
                       f"if (lv{n} != 0.0) {{", "}}")
        elif mask == 0:
            open_block(f"{_ident(m.name)}.scan([&](const {ktype}& k{n}, double lv{n}) {{", "});")
        else:
            si = ctx.mask_index(m.name, mask)
            open_block(f"{_ident(m.name)}.template slice<{si}>({_key(m, bound_words)}, "
                       f"[&](const {ktype}& k{n}, double lv{n}) {{", "});")
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
        vals.append(f"lv{n}")
        place_conds()
    assert len(placed) == len(s.conds), "a condition reads a variable no loop binds"
    value = " * ".join([repr(float(s.coef))] + [f"static_cast<double>({cexpr(f, ctx, env)})"
                                                  for f in s.factors] + vals)
    target = maps[s.target]
    words = [_word(k, ctx, env) for k in s.keys]
    lines.append(f"{cur()}{_ident(target.name)}.add({_key(target, words)}, {value});")
    while stack:
        closer = stack.pop()
        lines.append(cur() + closer)
    return lines


def generate(prog: Program) -> tuple[str, dict[str, object]]:
    """(C++ source, metadata for the loader: tables, maps with key types, ABI ids)."""
    ctx = _Ctx(prog)
    tables = prog.tables
    body: list[str] = []
    # triggers
    for ti, t in enumerate(tables):
        for kind in ("insert", "delete"):
            body.append(f"  void {kind[:3]}_{ti}(const int64_t* t) {{  // {kind} {t.name}")
            body.append("    const int64_t* o = nullptr; (void)o;")
            for s in prog.triggers[t.name][kind]:
                body += _stmt(s, ctx, "    ")
            body.append("  }")
        cols = prog.inplace.get(t.name, frozenset())
        body.append(f"  void upd_{ti}(const int64_t* o, const int64_t* t) {{  // update "
                    f"{t.name}")
        fixed = [i for i in range(len(t.types)) if i not in cols]
        if cols and prog.triggers[t.name]["update"] is not None:
            same = " && ".join(f"o[{i}] == t[{i}]" for i in fixed) or "true"
            body.append(f"    if ({same}) {{  // only value columns changed: adjust in place")
            for s in prog.triggers[t.name]["update"]:
                body += _stmt(s, ctx, "      ")
            body.append("      return;")
            body.append("    }")
        body.append(f"    del_{ti}(o);")
        body.append(f"    ins_{ti}(t);")
        body.append("  }")
    body.append("  void recompute() {")
    if prog.recompute:
        for m in prog.maps:
            if m.role == "view":
                body.append(f"    {_ident(m.name)}.clear();")
        for s in prog.recompute:
            body += _stmt(s, ctx, "    ")
    body.append("  }")

    members: list[str] = []
    for m in prog.maps:
        masks = ctx.masks.get(m.name, [])
        init = ", ".join(f"{x}u" for x in masks)
        members.append(f"  using M_{_ident(m.name)}_t = fv::Map<{m.arity}, {len(masks)}>;")
        members.append(f"  M_{_ident(m.name)}_t {_ident(m.name)}{{{{{{{init}}}}}}};  // "
                       + m.show().replace("\n", " "))
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
        f"  std::vector<fv::Rows> rows;  // by primary key, per table",
        "  bool track = true;",
        "",
        "  View() {",
        *[f"    S[{i}] = strs.intern({json.dumps(s)});" for i, s in enumerate(ctx.strings)],
        *[f"    rows.emplace_back({len(t.types)}, std::vector<int>{{{', '.join(map(str, t.key))}}});"
          for t in tables],
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
        *[f"    b += {_ident(m.name)}.bytes();" for m in prog.maps],
        "    return b;",
        "  }",
        "",
        "  fv::Stream* map_dump_target = nullptr;",
        "  int64_t map_size(int m) const {",
        "    switch (m) {",
        *[f"      case {i}: return static_cast<int64_t>({_ident(m.name)}.size());"
          for i, m in enumerate(prog.maps)],
        "      default: return -1;",
        "    }",
        "  }",
        "  void map_dump(int m, int64_t* keys, double* vals) const {",
        "    size_t i = 0;",
        "    switch (m) {",
        *[f"      case {i}: {_ident(m.name)}.scan([&](const M_{_ident(m.name)}_t::Key& k, "
          f"double v) {{ for (size_t j = 0; j < {m.arity}; ++j) keys[i * {max(m.arity, 1)} + j]"
          f" = k[j]; vals[i++] = v; }}); break;" for i, m in enumerate(prog.maps)],
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
    meta: dict[str, object] = {
        "tables": [{"name": t.name, "columns": list(t.columns), "types": list(t.types),
                    "key": list(t.key)} for t in tables],
        "maps": [{"name": m.name, "role": m.role, "key_types": [k.type for k in m.keys],
                  "definition": m.show()} for m in prog.maps],
    }
    return "\n".join(src), meta


__all__ = ["generate", "OPS", "FORMATS", "Loop"]
