"""Seeded generators of initial data and random DML rounds for the differential schemas.

A :class:`Workload` keeps an in-memory model of every base table (rows by primary key) and only
emits statements that are valid against that model: keys stay unique, foreign keys resolve
(dependents are deleted first, or cascade where the DDL says so), NOT NULL columns stay filled.
The model mirrors PostgreSQL exactly, so statements never fail and the same seed always yields the
same statements. Randomness comes from a private ``random.Random(seed)``; iteration only walks
dicts and tuples (never sets), so ``PYTHONHASHSEED`` does not matter.

Statements are ``(psycopg.sql.Composed, params)`` pairs; identifiers are schema-qualified through
``sql.Identifier`` and every value travels as a parameter.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from psycopg import sql

Row = dict[str, Any]
Key = tuple[Any, ...]
Statement = tuple[sql.Composed, tuple[Any, ...]]
Gen = Callable[[random.Random], Any]


@dataclass(frozen=True)
class ForeignKey:
    """``columns`` of the child reference ``parent(parent_columns)``."""

    columns: tuple[str, ...]
    parent: str
    parent_columns: tuple[str, ...]
    on_delete_cascade: bool = False
    on_update_cascade: bool = False


@dataclass(frozen=True)
class ColumnSpec:
    """A column's value domain.

    ``gen`` draws a non-NULL value (unused for columns filled from a foreign key or ``fresh``);
    ``fresh`` maps a counter to a new key value for single-column surrogate keys; ``nullable``
    columns are drawn as NULL now and then; ``is_int`` columns take part in arithmetic updates and
    range predicates.
    """

    name: str
    gen: Gen | None = None
    nullable: bool = False
    fresh: Callable[[int], Any] | None = None
    is_int: bool = False


@dataclass(frozen=True)
class TableSpec:
    """Model of one base table: columns, primary key, foreign keys and default initial size."""

    name: str
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...]
    foreign_keys: tuple[ForeignKey, ...] = ()
    initial_rows: int = 30

    @property
    def column_names(self) -> tuple[str, ...]:
        """Column names in DDL order."""
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> ColumnSpec:
        """The spec of column ``name``."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def fk_of(self, column: str) -> ForeignKey | None:
        """The foreign key that ``column`` belongs to, if any."""
        for fk in self.foreign_keys:
            if column in fk.columns:
                return fk
        return None


def _pick(*values: Any) -> Gen:
    return lambda rng: rng.choice(values)


def _ints(lo: int, hi: int) -> Gen:
    return lambda rng: rng.randint(lo, hi)


def _cents(lo: int, hi: int) -> Gen:
    """Fixed-point values with two decimals, ``lo``..``hi`` in cents."""
    return lambda rng: Decimal(rng.randint(lo, hi)).scaleb(-2)


def _int_col(name: str, lo: int, hi: int, nullable: bool = False) -> ColumnSpec:
    return ColumnSpec(name, _ints(lo, hi), nullable=nullable, is_int=True)


def _int_key(name: str) -> ColumnSpec:
    return ColumnSpec(name, fresh=lambda n: n, is_int=True)


def _text_key(name: str, prefix: str) -> ColumnSpec:
    return ColumnSpec(name, fresh=lambda n: f"{prefix}{n}")


def _fk_col(name: str, is_int: bool = True, nullable: bool = False) -> ColumnSpec:
    return ColumnSpec(name, nullable=nullable, is_int=is_int)


_NAMES = _pick("Ann", "bob", "Cy", "DEE", "eve", "Fay")

TABLE_SPECS: dict[str, tuple[TableSpec, ...]] = {
    "paper": (
        TableSpec(
            "devices",
            (
                _text_key("did", "d"),
                ColumnSpec("category", _pick("phone", "phone", "tablet", "laptop"), nullable=True),
            ),
            ("did",),
            initial_rows=20,
        ),
        TableSpec(
            "parts",
            (_text_key("pid", "p"), _int_col("price", 1, 20)),
            ("pid",),
            initial_rows=25,
        ),
        TableSpec(
            "devices_parts",
            (_fk_col("did", is_int=False), _fk_col("pid", is_int=False)),
            ("did", "pid"),
            (
                ForeignKey(("did",), "devices", ("did",)),
                ForeignKey(("pid",), "parts", ("pid",)),
            ),
            initial_rows=50,
        ),
    ),
    "social": (
        TableSpec(
            "users",
            (
                _int_key("uid"),
                ColumnSpec("name", _NAMES),
                _int_col("city", 1, 4, nullable=True),
                _int_col("tweetsnum", 0, 50),
                _int_col("favornum", 0, 10),
            ),
            ("uid",),
            initial_rows=20,
        ),
        TableSpec(
            "microblog",
            (
                _int_key("mid"),
                _fk_col("uid"),
                _int_col("time", 0, 30),
                ColumnSpec("content", _pick("hi", "lol", "news", "cats"), nullable=True),
            ),
            ("mid",),
            (ForeignKey(("uid",), "users", ("uid",)),),
            initial_rows=50,
        ),
        TableSpec(
            "mention",
            (_fk_col("mid"), _fk_col("uid")),
            ("mid", "uid"),
            (
                ForeignKey(("mid",), "microblog", ("mid",), on_delete_cascade=True),
                ForeignKey(("uid",), "users", ("uid",)),
            ),
            initial_rows=40,
        ),
        TableSpec(
            "friendlist",
            (_fk_col("uid"), _fk_col("followee_id")),
            ("uid", "followee_id"),
            (
                ForeignKey(("uid",), "users", ("uid",)),
                ForeignKey(("followee_id",), "users", ("uid",)),
            ),
            initial_rows=50,
        ),
    ),
    "orders": (
        TableSpec(
            "customers",
            (
                _int_key("custkey"),
                ColumnSpec("name", _NAMES),
                ColumnSpec("nation", _pick("DE", "FR", "US", "JP")),
                ColumnSpec("segment", _pick("AUTO", "Building", "machinery"), nullable=True),
                ColumnSpec("acctbal", _cents(-5000, 90000), nullable=True),
            ),
            ("custkey",),
            initial_rows=20,
        ),
        TableSpec(
            "orders",
            (
                _int_key("orderkey"),
                _fk_col("custkey", nullable=True),
                ColumnSpec("status", _pick("O", "F", "P")),
                _int_col("orderdate", 1, 20),
                _int_col("priority", 1, 3, nullable=True),
            ),
            ("orderkey",),
            (ForeignKey(("custkey",), "customers", ("custkey",)),),
            initial_rows=30,
        ),
        TableSpec(
            "lineitem",
            (
                _fk_col("orderkey"),
                _int_col("linenumber", 1, 6),
                _int_col("partno", 1, 10),
                _int_col("quantity", 1, 10),
                ColumnSpec("extendedprice", _cents(100, 9999), nullable=True),
                ColumnSpec("discount", _cents(0, 10), nullable=True),
            ),
            ("orderkey", "linenumber"),
            (
                ForeignKey(
                    ("orderkey",),
                    "orders",
                    ("orderkey",),
                    on_delete_cascade=True,
                    on_update_cascade=True,
                ),
            ),
            initial_rows=60,
        ),
    ),
    "setops": (
        TableSpec(
            "r",
            (_int_key("a"), _int_col("b", 1, 6), _int_col("c", 1, 4, nullable=True)),
            ("a",),
            initial_rows=25,
        ),
        TableSpec(
            "s",
            (_int_key("x"), _int_col("y", 1, 6), _int_col("z", 1, 4, nullable=True)),
            ("x",),
            initial_rows=25,
        ),
    ),
}

NULL_PROBABILITY = 0.2


def _matches(columns: Sequence[str], values: Key) -> Callable[[Row], bool]:
    """Predicate: the row's ``columns`` equal ``values``."""
    return lambda row: tuple(row[c] for c in columns) == values


@dataclass
class _TableState:
    spec: TableSpec
    rows: dict[Key, Row] = field(default_factory=dict)
    counter: int = 0
    graveyard: list[Key] = field(default_factory=list)


class Workload:
    """Seeded data and DML generator for one schema, with an exact in-memory model of the data.

    ``schema`` is the PostgreSQL schema the statements target; ``scale`` multiplies the default
    initial table sizes.
    """

    def __init__(self, schema_key: str, schema: str, seed: int, scale: float = 1.0) -> None:
        self.schema_key = schema_key
        self.schema = schema
        self.seed = seed
        self.rng = random.Random(seed)
        self.scale = scale
        self.tables: dict[str, _TableState] = {
            t.name: _TableState(t) for t in TABLE_SPECS[schema_key]
        }
        self._children: dict[str, list[tuple[TableSpec, ForeignKey]]] = {
            name: [] for name in self.tables
        }
        for state in self.tables.values():
            for fk in state.spec.foreign_keys:
                self._children[fk.parent].append((state.spec, fk))

    # ------------------------------------------------------------------ public API

    def initial_statements(self) -> list[Statement]:
        """INSERTs of the initial data, parents before children (one statement per row)."""
        out: list[Statement] = []
        for state in self.tables.values():
            target = max(1, round(state.spec.initial_rows * self.scale))
            attempts = 0
            while len(state.rows) < target and attempts < target * 20:
                attempts += 1
                row = self._new_row(state, allow_reuse=False)
                if row is not None:
                    out.append(self._insert(state, [row]))
        return out

    def next_round(self, n_statements: int) -> list[Statement]:
        """A batch of at least ``n_statements`` statements (composite operations may overshoot)."""
        out: list[Statement] = []
        stalls = 0
        while len(out) < n_statements and stalls < 200:
            produced = self._random_op()
            if produced:
                out.extend(produced)
            else:
                stalls += 1
        return out

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Model contents: table name -> rows as tuples in column order."""
        return {
            name: [tuple(r[c] for c in st.spec.column_names) for r in st.rows.values()]
            for name, st in self.tables.items()
        }

    # ------------------------------------------------------------------ SQL builders

    def _ident(self, table: str) -> sql.Identifier:
        return sql.Identifier(self.schema, table)

    @staticmethod
    def _cond(columns: Sequence[str]) -> sql.Composed:
        return sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns)

    def _insert(self, state: _TableState, rows: list[Row]) -> Statement:
        cols = state.spec.column_names
        one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(cols)))
        query = sql.SQL("INSERT INTO {} ({}) VALUES {}").format(
            self._ident(state.spec.name),
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join([one] * len(rows)),
        )
        params: list[Any] = []
        for row in rows:
            key = self._key(state.spec, row)
            assert key not in state.rows, (state.spec.name, key)
            state.rows[key] = dict(row)
            params.extend(row[c] for c in cols)
        return query, tuple(params)

    # ------------------------------------------------------------------ model helpers

    @staticmethod
    def _key(spec: TableSpec, row: Row) -> Key:
        return tuple(row[c] for c in spec.primary_key)

    def _parent_exists(self, fk: ForeignKey, values: Key) -> bool:
        if any(v is None for v in values):
            return True
        parent = self.tables[fk.parent]
        if fk.parent_columns == parent.spec.primary_key:
            return values in parent.rows
        return any(tuple(r[c] for c in fk.parent_columns) == values for r in parent.rows.values())

    def _dependents(self, table: str, row: Row) -> list[tuple[TableSpec, ForeignKey, list[Key]]]:
        """Child rows referencing ``row``, grouped by (child table, foreign key)."""
        out = []
        for child, fk in self._children[table]:
            ref = tuple(row[c] for c in fk.parent_columns)
            keys = [
                k
                for k, r in self.tables[child.name].rows.items()
                if tuple(r[c] for c in fk.columns) == ref
            ]
            if keys:
                out.append((child, fk, keys))
        return out

    def _update_blocked(self, table: str, row: Row, changed: Sequence[str]) -> bool:
        """Whether changing the columns ``changed`` of ``row`` is refused by a dependent row."""
        return any(
            set(fk.parent_columns) & set(changed) and not fk.on_update_cascade
            for _child, fk, _keys in self._dependents(table, row)
        )

    def _value(self, col: ColumnSpec, nullable_ok: bool = True) -> Any:
        assert col.gen is not None, col.name
        if col.nullable and nullable_ok and self.rng.random() < NULL_PROBABILITY:
            return None
        return col.gen(self.rng)

    def _fresh_key_value(self, state: _TableState, col: ColumnSpec) -> Any:
        assert col.fresh is not None
        state.counter += 1
        return col.fresh(state.counter)

    def _new_row(self, state: _TableState, allow_reuse: bool = True) -> Row | None:
        """A random row with a key not in the model and resolvable foreign keys, or None."""
        spec = state.spec
        for _ in range(10):
            row: Row = {}
            ok = True
            for fk in spec.foreign_keys:
                parent = self.tables[fk.parent]
                nullable = all(spec.column(c).nullable for c in fk.columns)
                if nullable and self.rng.random() < NULL_PROBABILITY or not parent.rows:
                    if not nullable:
                        ok = False
                        break
                    row.update(dict.fromkeys(fk.columns))
                    continue
                prow = parent.rows[self.rng.choice(list(parent.rows))]
                row.update({c: prow[p] for c, p in zip(fk.columns, fk.parent_columns, strict=True)})
            if not ok:
                return None
            reuse = (
                allow_reuse
                and state.graveyard
                and self.rng.random() < 0.3
                and len(spec.primary_key) == 1
            )
            for col in spec.columns:
                if col.name in row:
                    continue
                if col.fresh is not None:
                    if reuse:
                        row[col.name] = self.rng.choice(state.graveyard)[0]
                    else:
                        row[col.name] = self._fresh_key_value(state, col)
                else:
                    row[col.name] = self._value(col, nullable_ok=col.name not in spec.primary_key)
            if self._key(spec, row) not in state.rows:
                return row
        return None

    def _remove(self, table: str, key: Key) -> None:
        """Remove a row from the model, cascading like PostgreSQL's ON DELETE CASCADE."""
        state = self.tables[table]
        row = state.rows.pop(key)
        state.graveyard.append(key)
        for child, fk, keys in self._dependents(table, row):
            assert fk.on_delete_cascade, (table, child.name)
            for k in keys:
                if k in self.tables[child.name].rows:
                    self._remove(child.name, k)

    def _replace(self, table: str, key: Key, changes: Row) -> None:
        """Update a row in the model, cascading key changes like ON UPDATE CASCADE."""
        state = self.tables[table]
        old = state.rows[key]
        new = {**old, **changes}
        dependents = self._dependents(table, old)
        del state.rows[key]
        new_key = self._key(state.spec, new)
        assert new_key not in state.rows, (table, new_key)
        state.rows[new_key] = new
        if new_key != key:
            state.graveyard.append(key)
        for child, fk, keys in dependents:
            moved = {
                c: new[p]
                for c, p in zip(fk.columns, fk.parent_columns, strict=True)
                if new[p] != old[p]
            }
            if moved:
                assert fk.on_update_cascade, (table, child.name)
                for k in keys:
                    self._replace(child.name, k, moved)

    # ------------------------------------------------------------------ statement generators

    def _delete_where(
        self,
        table: str,
        where: sql.Composable,
        params: tuple[Any, ...],
        pred: Callable[[Row], bool],
    ) -> list[Statement]:
        """DELETE rows matching ``pred``; blocking dependents are deleted by earlier statements."""
        state = self.tables[table]
        keys = [k for k, r in state.rows.items() if pred(r)]
        out: list[Statement] = []
        for key in keys:
            row = state.rows.get(key)
            if row is not None:
                out.extend(self._predelete(table, row))
        query = sql.SQL("DELETE FROM {} WHERE {}").format(self._ident(table), where)
        out.append((query, params))
        for key in keys:
            if key in state.rows:
                self._remove(table, key)
        return out

    def _predelete(self, table: str, row: Row) -> list[Statement]:
        """Statements deleting the dependents of ``row`` that would block its deletion."""
        out: list[Statement] = []
        for child, fk, keys in self._dependents(table, row):
            if fk.on_delete_cascade:
                for k in keys:
                    crow = self.tables[child.name].rows.get(k)
                    if crow is not None:
                        out.extend(self._predelete(child.name, crow))
                continue
            ref = tuple(row[c] for c in fk.parent_columns)
            out.extend(
                self._delete_where(
                    child.name, self._cond(fk.columns), ref, _matches(fk.columns, ref)
                )
            )
        return out

    def _delete_key(self, table: str, key: Key) -> list[Statement]:
        spec = self.tables[table].spec
        return self._delete_where(
            table,
            self._cond(spec.primary_key),
            key,
            lambda r: self._key(spec, r) == key,
        )

    def _update(self, table: str, key: Key, changes: Row) -> tuple[list[Statement], Key]:
        """UPDATE one row by key; returns the statements ([] if refused) and the row's new key.

        A change that would break a key or foreign key is refused. Changes to the current value
        are usually dropped, but now and then kept as a no-op UPDATE.
        """
        state = self.tables[table]
        spec = state.spec
        old = state.rows[key]
        changes = {c: v for c, v in changes.items() if old[c] != v or self.rng.random() < 0.1}
        if not changes:
            return [], key
        new = {**old, **changes}
        new_key = self._key(spec, new)
        if new_key != key and new_key in state.rows:
            return [], key
        for fk in spec.foreign_keys:
            if set(fk.columns) & set(changes) and not self._parent_exists(
                fk, tuple(new[c] for c in fk.columns)
            ):
                return [], key
        if self._update_blocked(table, old, list(changes)):
            return [], key
        query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
            self._ident(table),
            sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in changes),
            self._cond(spec.primary_key),
        )
        self._replace(table, key, changes)
        return [(query, (*changes.values(), *key))], new_key

    def _update_key(self, table: str, key: Key, changes: Row) -> list[Statement]:
        """Like :meth:`_update`, statements only."""
        return self._update(table, key, changes)[0]

    def _random_change(self, spec: TableSpec, row: Row, column: str) -> Any:
        """A new value for ``row[column]`` that respects the column's domain and foreign key."""
        col = spec.column(column)
        fk = spec.fk_of(column)
        if fk is not None:
            parent = self.tables[fk.parent]
            if col.nullable and self.rng.random() < 0.25 or not parent.rows:
                return None if col.nullable else row[column]
            prow = parent.rows[self.rng.choice(list(parent.rows))]
            return prow[fk.parent_columns[fk.columns.index(column)]]
        if col.fresh is not None:
            state = self.tables[spec.name]
            if state.graveyard and self.rng.random() < 0.3:
                return self.rng.choice(state.graveyard)[0]
            return self._fresh_key_value(state, col)
        return self._value(col, nullable_ok=column not in spec.primary_key)

    # ------------------------------------------------------------------ operations

    def _random_op(self) -> list[Statement]:
        state = self.tables[self.rng.choice(list(self.tables))]
        target = max(1, round(state.spec.initial_rows * self.scale))
        size = len(state.rows)
        ops: list[tuple[Callable[[_TableState], list[Statement]], float]] = [
            (self._op_insert, 3.0 if size < target * 0.7 else 1.5),
            (self._op_insert_many, 0.4),
            (self._op_delete, 2.0 if size > target * 1.3 else 1.0),
            (self._op_update_column, 3.0),
            (self._op_update_key, 0.8),
            (self._op_update_two, 0.6),
            (self._op_burst, 0.8),
            (self._op_insert_then_change, 0.5),
            (self._op_delete_reinsert, 0.5),
            (self._op_null_and_back, 0.6),
            (self._op_range_update, 0.4),
            (self._op_range_delete, 0.25 if size > target * 0.8 else 0.05),
            (self._op_empty_group, 0.25 if size > target * 0.8 else 0.05),
        ]
        funcs = [f for f, _ in ops]
        op = self.rng.choices(funcs, weights=[w for _, w in ops])[0]
        return op(state)

    def _random_key(self, state: _TableState) -> Key | None:
        return self.rng.choice(list(state.rows)) if state.rows else None

    def _op_insert(self, state: _TableState) -> list[Statement]:
        row = self._new_row(state)
        return [self._insert(state, [row])] if row is not None else []

    def _op_insert_many(self, state: _TableState) -> list[Statement]:
        rows: list[Row] = []
        keys: list[Key] = []
        for _ in range(self.rng.randint(2, 4)):
            row = self._new_row(state, allow_reuse=False)
            if row is not None and self._key(state.spec, row) not in keys:
                rows.append(row)
                keys.append(self._key(state.spec, row))
        return [self._insert(state, rows)] if rows else []

    def _op_delete(self, state: _TableState) -> list[Statement]:
        """Delete one row, preferring rows without dependents; otherwise dependents go first."""
        candidates = list(state.rows)
        self.rng.shuffle(candidates)
        for key in candidates[:5]:
            if not self._dependents(state.spec.name, state.rows[key]):
                return self._delete_key(state.spec.name, key)
        if candidates and self.rng.random() < 0.35:
            return self._delete_key(state.spec.name, candidates[0])
        return []

    def _updatable_columns(self, spec: TableSpec, keys_too: bool) -> list[str]:
        return [c for c in spec.column_names if keys_too or c not in spec.primary_key]

    def _op_update_column(self, state: _TableState) -> list[Statement]:
        key = self._random_key(state)
        cols = self._updatable_columns(state.spec, keys_too=False)
        if key is None or not cols:
            return self._op_update_key(state)
        column = self.rng.choice(cols)
        row = state.rows[key]
        return self._update_key(
            state.spec.name, key, {column: self._random_change(state.spec, row, column)}
        )

    def _op_update_key(self, state: _TableState) -> list[Statement]:
        """Key-changing UPDATE (blocked by restricting dependents: then try another row)."""
        spec = state.spec
        candidates = list(state.rows)
        self.rng.shuffle(candidates)
        for key in candidates[:5]:
            row = state.rows[key]
            column = self.rng.choice(spec.primary_key)
            out = self._update_key(spec.name, key, {column: self._random_change(spec, row, column)})
            if out:
                return out
        return []

    def _op_update_two(self, state: _TableState) -> list[Statement]:
        key = self._random_key(state)
        cols = self._updatable_columns(state.spec, keys_too=True)
        if key is None or len(cols) < 2:
            return []
        row = state.rows[key]
        chosen = self.rng.sample(cols, 2)
        return self._update_key(
            state.spec.name, key, {c: self._random_change(state.spec, row, c) for c in chosen}
        )

    def _op_burst(self, state: _TableState) -> list[Statement]:
        """Several successive changes to the same row, sometimes ending with its deletion."""
        key = self._random_key(state)
        if key is None:
            return []
        spec = state.spec
        out: list[Statement] = []
        original = dict(state.rows[key])
        for _ in range(self.rng.randint(2, 4)):
            cols = self._updatable_columns(spec, keys_too=self.rng.random() < 0.3)
            if not cols or key not in state.rows:
                break
            column = self.rng.choice(cols)
            stmts, key = self._update(
                spec.name, key, {column: self._random_change(spec, state.rows[key], column)}
            )
            out.extend(stmts)
        if key in state.rows and self.rng.random() < 0.4:
            restore = {c: v for c, v in original.items() if c not in spec.primary_key}
            out.extend(self._update_key(spec.name, key, restore))
        elif key in state.rows and self.rng.random() < 0.3:
            out.extend(self._delete_key(spec.name, key))
        return out

    def _op_insert_then_change(self, state: _TableState) -> list[Statement]:
        """Insert a row, then update it and maybe delete it again in the same round."""
        row = self._new_row(state)
        if row is None:
            return []
        spec = state.spec
        out = [self._insert(state, [row])]
        key = self._key(spec, row)
        cols = self._updatable_columns(spec, keys_too=False) or list(spec.primary_key)
        column = self.rng.choice(cols)
        stmts, key = self._update(
            spec.name, key, {column: self._random_change(spec, state.rows[key], column)}
        )
        out.extend(stmts)
        if self.rng.random() < 0.5 and key in state.rows:
            out.extend(self._delete_key(spec.name, key))
        return out

    def _op_delete_reinsert(self, state: _TableState) -> list[Statement]:
        """Delete a row and insert a different row under the same key."""
        key = self._random_key(state)
        if key is None:
            return []
        spec = state.spec
        old = dict(state.rows[key])
        out = self._delete_key(spec.name, key)
        row = dict(old)
        for col in spec.columns:
            if col.name in spec.primary_key:
                continue
            row[col.name] = self._random_change(spec, old, col.name)
        for fk in spec.foreign_keys:
            if not self._parent_exists(fk, tuple(row[c] for c in fk.columns)):
                return out
        if key not in state.rows:
            out.append(self._insert(state, [row]))
        return out

    def _op_null_and_back(self, state: _TableState) -> list[Statement]:
        """Set a nullable column to NULL, touch another column, then restore the old value."""
        spec = state.spec
        nullable = [c.name for c in spec.columns if c.nullable and c.name not in spec.primary_key]
        key = self._random_key(state)
        if not nullable or key is None:
            return []
        column = self.rng.choice(nullable)
        old_value = state.rows[key][column]
        if old_value is None:
            old_value = self._random_change(spec, state.rows[key], column)
        out = self._update_key(spec.name, key, {column: None})
        others = [c for c in self._updatable_columns(spec, keys_too=False) if c != column]
        if others and self.rng.random() < 0.5:
            other = self.rng.choice(others)
            out.extend(
                self._update_key(
                    spec.name, key, {other: self._random_change(spec, state.rows[key], other)}
                )
            )
        if old_value is not None:
            out.extend(self._update_key(spec.name, key, {column: old_value}))
        return out

    def _range_column(self, spec: TableSpec) -> tuple[str, int] | None:
        """An int column for a range predicate and a range width (wider on surrogate keys)."""
        cols = [c for c in spec.columns if c.is_int]
        if not cols:
            return None
        col = self.rng.choice(cols)
        return col.name, self.rng.randint(0, 3 if col.fresh is not None else 1)

    def _op_range_update(self, state: _TableState) -> list[Statement]:
        """Multi-row UPDATE of a non-key column for rows whose int column lies in a range."""
        spec = state.spec
        picked = self._range_column(spec)
        settable = [
            c
            for c in spec.columns
            if c.gen is not None and c.name not in spec.primary_key and spec.fk_of(c.name) is None
        ]
        if picked is None or not settable or not state.rows:
            return []
        rcol, width = picked
        values = sorted(r[rcol] for r in state.rows.values() if r[rcol] is not None)
        if not values:
            return []
        lo = self.rng.choice(values)
        hi = lo + width
        target = self.rng.choice(settable)
        params: tuple[Any, ...]
        apply: Callable[[Any], Any]
        if target.is_int and self.rng.random() < 0.6:
            delta = self.rng.choice((-2, -1, 1, 2, 3))
            assign = sql.SQL("{0} = {0} + %s").format(sql.Identifier(target.name))
            apply = lambda old: None if old is None else old + delta  # noqa: E731
            params = (delta, lo, hi)
        else:
            value = self._value(target)
            assign = sql.SQL("{} = %s").format(sql.Identifier(target.name))
            apply = lambda old: value  # noqa: E731
            params = (value, lo, hi)
        query = sql.SQL("UPDATE {} SET {} WHERE {} BETWEEN %s AND %s").format(
            self._ident(spec.name), assign, sql.Identifier(rcol)
        )
        for key, row in list(state.rows.items()):
            if row[rcol] is not None and lo <= row[rcol] <= hi:
                self._replace(spec.name, key, {target.name: apply(row[target.name])})
        return [(query, params)]

    def _op_range_delete(self, state: _TableState) -> list[Statement]:
        """Multi-row DELETE by a narrow range on an int column (dependents deleted first)."""
        spec = state.spec
        picked = self._range_column(spec)
        if picked is None or not state.rows:
            return []
        rcol, width = picked
        values = sorted(r[rcol] for r in state.rows.values() if r[rcol] is not None)
        if not values:
            return []
        lo = self.rng.choice(values)
        hi = lo + width
        where = sql.SQL("{} BETWEEN %s AND %s").format(sql.Identifier(rcol))
        return self._delete_where(
            spec.name,
            where,
            (lo, hi),
            lambda r: r[rcol] is not None and lo <= r[rcol] <= hi,
        )

    def _op_empty_group(self, state: _TableState) -> list[Statement]:
        """Delete every child row referencing one parent row (empties a join/group partner)."""
        spec = state.spec
        if not spec.foreign_keys or not state.rows:
            return []
        fk = self.rng.choice(spec.foreign_keys)
        row = state.rows[self.rng.choice(list(state.rows))]
        ref = tuple(row[c] for c in fk.columns)
        if any(v is None for v in ref):
            return []
        return self._delete_where(spec.name, self._cond(fk.columns), ref, _matches(fk.columns, ref))
