"""``FreshView``: a view kept fresh after every single change by compiled C++ triggers."""

from __future__ import annotations

import ctypes
import datetime
import decimal
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlglot import exp

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.errors import IdivmError
from idivm.fresh import codegen
from idivm.fresh import expr as E
from idivm.fresh.build import build, load
from idivm.fresh.program import (
    Pipeline,
    Program,
    Stage,
    TableInfo,
    compile_pipeline,
)
from idivm.fresh.query import translate

Row = Sequence[Any] | Mapping[str, Any]


class FreshError(IdivmError):
    """An event was refused (duplicate key, missing row); the view did not change."""


@dataclass(frozen=True)
class ReplayStats:
    events: int  # events processed inside the timed loop
    seconds: float  # timed part only (parsing excluded, as DBToaster's --preload)
    map_bytes: int  # memory of the maps (and row stores) at the end: they never shrink
    parse_seconds: float
    stream_events: int  # events in the file for the tables this view reads
    refused: int

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


def _date(v: Any) -> int:
    if isinstance(v, str):
        v = datetime.date.fromisoformat(v[:10])
    if isinstance(v, datetime.datetime):
        v = v.date()
    if isinstance(v, datetime.date):
        return v.year * 10000 + v.month * 100 + v.day
    return int(v)


class FreshView:
    """Compile with :meth:`compile`; feed events with insert/delete/update; read :meth:`rows`.

    ``program.depth`` is the maintenance program: ``None`` higher-order IVM, ``1``
    first-order IVM (deltas evaluated over base relations), ``0`` re-evaluation.
    """

    def __init__(self, pipeline: Pipeline | Program, source: str, lib: Path,
                 other_tables: Iterable[str] = ()) -> None:
        if isinstance(pipeline, Program):
            pipeline = Pipeline((Stage(pipeline, None),))
        self.pipeline = pipeline
        self.program = pipeline.view  # the view's own stage (its maps are read by rows())
        self._other = frozenset(other_tables)  # in the catalog, not read: events are no-ops
        self.source = source
        self.library = lib
        self._dll = load(lib)
        self._h = self._dll.fv_new()
        base = pipeline.base_tables
        self._tables = {t.name: i for i, t in enumerate(base)}
        self._info = {t.name: t for t in base}
        self._strings: dict[str, int] = {}

    @classmethod
    def compile(cls, view_sql: str, catalog: Catalog,
                depth: int | str | None = "auto") -> FreshView:
        """Translate (refusing unsupported SQL before any code exists), generate, compile
        (cached by source hash) and load.

        ``depth``: ``None`` the full higher-order program, ``1`` first-order IVM, ``0``
        re-evaluation, ``"auto"`` (default) higher-order unless it needs more than
        ``AUTO_MAPS_PER_ATOM`` maps per relation atom: then every base event updates that many
        large maps (a star join's fact table keys most of them) and first-order deltas over
        indexed base relations are cheaper — DBToaster's observation that a full viewlet
        transform can be too aggressive."""
        q = translate(view_sql, catalog)
        pipe = compile_pipeline(q, catalog, depth)
        source = codegen.generate(pipe)
        read = {t.name for t in pipe.base_tables}
        return cls(pipe, source, build(source), set(catalog.tables) - read)

    @property
    def columns(self) -> tuple[str, ...]:
        return self.program.query.columns

    @property
    def listing(self) -> str:
        return self.pipeline.listing()

    def close(self) -> None:
        if self._h:
            self._dll.fv_free(self._h)
            self._h = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    # ------------------------------------------------------------------------ events

    def _word(self, ty: str, v: Any) -> int:
        if v is None:
            raise FreshError("fresh views hold NOT NULL values only")
        if ty == "float":
            return struct.unpack("<q", struct.pack("<d", float(v) + 0.0))[0]
        if ty == "str":
            s = str(v)
            if s not in self._strings:
                self._strings[s] = int(self._dll.fv_intern(self._h, s.encode()))
            return self._strings[s]
        if ty == "date":
            return _date(v)
        if isinstance(v, decimal.Decimal | float):
            return int(v)
        return int(bool(v)) if ty == "bool" else int(v)

    def _encode(self, table: str, row: Row) -> ctypes.Array[ctypes.c_int64]:
        info = self._table(table)
        if isinstance(row, Mapping):
            missing = [c for c in info.columns if c not in row]
            if missing:
                raise FreshError(f"{table}: row lacks {', '.join(missing)}")
            vals = [row[c] for c in info.columns]
        else:
            vals = list(row)
            if len(vals) != len(info.columns):
                raise FreshError(f"{table} has {len(info.columns)} columns "
                                 f"({', '.join(info.columns)}), the row has {len(vals)}")
        return (ctypes.c_int64 * len(vals))(*(self._word(t, v) for t, v in
                                              zip(info.types, vals, strict=True)))

    def _table(self, table: str) -> TableInfo:
        if table not in self._info:
            raise FreshError(f"the view does not read table {table!r} "
                             f"(it reads {', '.join(self._info)})")
        return self._info[table]

    def _apply(self, table: str, op: int, row: Row, old: Row | None = None) -> None:
        if table in self._other:
            return
        info = self._table(table)
        r = self._encode(table, row)
        o = self._encode(table, old) if old is not None else None
        rc = self._dll.fv_apply(self._h, self._tables[table], op, r, o)
        if rc == 0:
            return
        key = ", ".join(info.columns[i] for i in info.key)
        why = {-1: f"duplicate key ({key})", -2: f"no row with this key ({key})",
               -3: "rows are not tracked after a tpch replay; give the old row",
               -4: "bad event"}.get(rc, f"error {rc}")
        raise FreshError(f"{table}: {why}; the view is unchanged")

    def insert(self, table: str, row: Row) -> None:
        self._apply(table, codegen.OPS["insert"], row)

    def delete(self, table: str, row: Row) -> None:
        """Delete the row with this row's key."""
        self._apply(table, codegen.OPS["delete"], row)

    def update(self, table: str, old_row: Row, new_row: Row) -> None:
        """Replace ``old_row`` (found by its key) by ``new_row``; a change of value columns
        only is applied in place, anything else as delete + insert."""
        self._apply(table, codegen.OPS["update"], new_row, old_row)

    def upsert(self, table: str, row: Row) -> None:
        """The row with this key now has these values (inserted if absent)."""
        self._apply(table, codegen.OPS["upsert"], row)

    def apply_changes(self, table: str, batch: Any) -> int:
        """Apply a change batch event by event; returns the events applied.

        ``batch``: a Spark or pandas DataFrame, an Arrow table, or rows (dicts), shaped as a
        Delta Change Data Feed (the table's columns, ``_change_type`` ∈ insert, delete,
        update_preimage, update_postimage, optionally ``_commit_version``) or as PostgreSQL's
        change log (``__op`` 'I'/'D', ordered by ``__seq``). Within a version old images go
        first; a pre-image and a post-image of one key become one update (applied in place
        when only value columns changed).
        """
        rows = _batch_rows(batch)
        if table in self._other:
            return 0
        info = self._table(table)
        events = _events(rows, info)
        for op, new, old in events:
            if op == "update":
                self.update(table, old, new)
            elif op == "insert":
                self.insert(table, new)
            else:
                self.delete(table, new)
        return len(events)

    def replay(self, path: str | Path, format: str = "events", budget_seconds: float = 0.0,
               max_events: int = 0) -> ReplayStats:
        """Process a whole file inside C++ (parsing untimed). ``format``: ``events`` (CSV
        ``op,table,values…``), ``orderbook`` (the finance trace), ``tpch`` (a directory)."""
        if format not in codegen.FORMATS:
            raise ValueError(f"format must be one of {', '.join(codegen.FORMATS)}")
        stats = (ctypes.c_double * 6)()
        err = ctypes.create_string_buffer(512)
        rc = self._dll.fv_replay(self._h, str(path).encode(), codegen.FORMATS[format],
                                 0 if format == "tpch" else 1, budget_seconds, max_events,
                                 stats, err, 512)
        if rc != 0:
            raise FreshError(f"replay {path}: {err.value.decode()}")
        return ReplayStats(int(stats[0]), stats[1], int(stats[2]), stats[3], int(stats[4]),
                           int(stats[5]))

    # ------------------------------------------------------------------------ reading

    def map_contents(self, name: str) -> dict[tuple[Any, ...], float]:
        """Entries of one map of the program (keys decoded), for inspection and tests."""
        idx = next(i for i, m in enumerate(self.program.maps) if m.name == name)
        m = self.program.maps[idx]
        n = int(self._dll.fv_map_size(self._h, idx))
        width = max(m.arity, 1)
        keys = (ctypes.c_int64 * (n * width))()
        vals = (ctypes.c_double * n)()
        self._dll.fv_map_dump(self._h, idx, keys, vals)
        types = [k.type for k in m.keys]
        return {tuple(self._decode(t, keys[i * width + j]) for j, t in enumerate(types)):
                vals[i] for i in range(n)}

    def _decode(self, ty: str, w: int) -> Any:
        if ty == "float":
            return struct.unpack("<d", struct.pack("<q", w))[0]
        if ty == "str":
            return self._dll.fv_string(self._h, w).decode()
        if ty == "date":
            return datetime.date(w // 10000, w // 100 % 100, w % 100)
        if ty == "bool":
            return bool(w)
        return w

    @property
    def map_bytes(self) -> int:
        return int(self._dll.fv_bytes(self._h))

    def rows(self) -> list[tuple[Any, ...]]:
        """The view's current contents, in its declared columns (bag semantics)."""
        prog = self.program
        q = prog.query
        if prog.depth == 0:
            self._dll.fv_recompute(self._h)
        counts = self.map_contents(prog.count_map)
        names = [g for g, _ in q.group]
        if q.bag:
            flags = {f for _, f in q.nulls}
            out = []
            for key, c in counts.items():
                if flags:
                    env = _with_nulls(key, names, q.nulls)
                    key = tuple(env[n] for n in names if n not in flags)
                out += [key] * int(round(c))
            return out
        sums: list[dict[tuple[Any, ...], float] | None] = []
        vals: list[dict[tuple[Any, ...], list[Any]] | None] = []
        for a, m in zip(q.aggs, prog.agg_maps, strict=True):
            if m is None:
                sums.append(None)
                vals.append(None)
            elif a.func in ("min", "max"):
                by: dict[tuple[Any, ...], list[Any]] = {}
                for key, c in self.map_contents(m).items():
                    if c > 0:
                        by.setdefault(key[:-1], []).append(key[-1])
                sums.append(None)
                vals.append(by)
            else:
                sums.append(self.map_contents(m))
                vals.append(None)
        # an aggregate skipping NULL arguments reads its own count of rows
        lives = [self.map_contents(m) if m else None for m in prog.live_counts or
                 (None,) * len(q.aggs)]
        if not names and not counts:
            counts = {(): 0.0}  # a global aggregate has its one row over empty input
        rows = []
        for key, c in counts.items():
            n = int(round(c))
            env = _with_nulls(key, names, q.nulls)
            env[A.COUNT] = n
            env["__g"] = 1
            for a, s, v, lv in zip(q.aggs, sums, vals, lives, strict=True):
                na = n if lv is None else int(round(lv.get(key, 0.0)))
                env[a.name] = _aggregate(a.func, a.type, na, s.get(key, 0.0) if s else 0.0,
                                         v.get(key, []) if v is not None else [])
            rows.append(env)
        return [tuple(r[c] for c in q.columns) for r in _output(q.output, rows, q.col_types)]


def _batch_rows(batch: Any) -> list[dict[str, Any]]:
    if hasattr(batch, "toLocalIterator") and hasattr(batch, "schema"):  # Spark DataFrame
        return [r.asDict() for r in batch.toLocalIterator()]
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return list(batch.to_dict("records"))
    if hasattr(batch, "to_pylist"):  # Arrow
        return list(batch.to_pylist())
    return [dict(r) for r in batch]


def _events(rows: list[dict[str, Any]], info: TableInfo) -> list[tuple[str, Any, Any]]:
    """Change rows → (op, row, old row) in order, pairing pre- and post-images by key."""
    key = [info.columns[i] for i in info.key]
    if rows and "__op" in rows[0]:
        ordered = sorted(rows, key=lambda r: r.get("__seq", 0))
        kinds = [("old" if r["__op"] == "D" else "new", r) for r in ordered]
    else:
        for r in rows:
            if r.get("_change_type") not in ("insert", "delete", "update_preimage",
                                             "update_postimage"):
                raise FreshError(f"change row without a valid _change_type: {r}")
        ordered = sorted(rows, key=lambda r: (r.get("_commit_version", 0),
                                              r["_change_type"] not in ("delete",
                                                                        "update_preimage")))
        kinds = [("old" if r["_change_type"] in ("delete", "update_preimage") else "new", r)
                 for r in ordered]
    out: list[tuple[str, Any, Any]] = []
    pending: dict[tuple[Any, ...], int] = {}  # key → index of a delete that may pair
    for kind, r in kinds:
        row = {c: r[c] for c in info.columns}
        k = tuple(row[c] for c in key)
        if kind == "old":
            pending[k] = len(out)
            out.append(("delete", row, None))
        elif k in pending:
            i = pending.pop(k)
            out[i] = ("update", row, out[i][1])
        else:
            out.append(("insert", row, None))
    return out


def _with_nulls(key: tuple[Any, ...], names: Sequence[str],
                nulls: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A view map's key by group column, NULL where its flag says the nested global aggregate
    it reads had no input."""
    env: dict[str, Any] = dict(zip(names, key, strict=True))
    for col, flag in nulls:
        if not env[flag]:
            env[col] = None
    return env


def _aggregate(func: str, ty: str, n: int, total: float, values: list[Any]) -> Any:
    if func == "count":
        return n
    if n == 0:
        return None
    if func == "avg":
        return total / n
    if func == "sum":
        return int(round(total)) if ty == "int" else total
    if not values:
        return None
    return min(values) if func == "min" else max(values)


def _output(chain: Sequence[A.Node], rows: list[dict[str, Any]],
            types: dict[str, str]) -> list[dict[str, Any]]:
    """The projections and selections above the aggregate (HAVING, expressions over
    aggregates), applied bottom-up to the aggregate rows."""
    types = dict(types)
    for node in reversed(chain):
        def conv(e: exp.Expr, types: dict[str, str] = types) -> E.Expr:
            return E.from_sql(e, lambda n: E.Var(types.get(n, "float"), n))
        if isinstance(node, A.Select):
            pred = conv(node.predicate)
            rows = [r for r in rows if _eval(pred, r)]
        elif isinstance(node, A.Project):
            exprs = [(name, conv(e)) for name, e in node.exprs]
            rows = [{name: _eval(x, r) for name, x in exprs} for r in rows]
            types = {name: x.type for name, x in exprs}
    return rows


def _eval(e: E.Expr, env: dict[str, Any]) -> Any:
    """``e`` over a row of Python values: dates are yyyymmdd words in the expression's
    constants and arithmetic (as in the compiled code), so they are compared and computed as
    such, and a date result is a date again."""
    if any(env.get(n) is None for n in E.variables(e)):
        return None if not isinstance(e, E.Var) else env.get(e.name)
    got = E.evaluate(e, {n: _date(v) if isinstance(v, datetime.date) else v
                         for n, v in env.items()})
    if e.type == "date" and isinstance(got, int):
        return datetime.date(got // 10000, got // 100 % 100, got % 100)
    return got


__all__ = ["FreshView", "FreshError", "ReplayStats"]
