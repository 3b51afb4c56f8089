"""Random schemas: 2–6 tables with single or composite primary keys, nullable and NOT NULL
columns of small value domains (so joins match), foreign keys (some cascading) and optionally a
row trigger writing another table or an inheritance child."""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

# type name -> kind; kinds decide which comparisons, aggregates and joins are valid
TYPES: dict[str, str] = {
    "int": "int", "bigint": "int", "numeric(8,2)": "num", "double precision": "num",
    "text": "text", "date": "date", "boolean": "bool", "json": "json",
}
KEY_DOMAIN = 8  # primary-key values 1..KEY_DOMAIN (plus a few outside it from changes)
DAY0 = datetime.date(2024, 1, 1)
TEXTS = ("a", "b", "c", "d")


@dataclass(frozen=True)
class FuzzConfig:
    """What the generators may produce. ``profile``: ``pg`` (everything supported),
    ``fresh`` (NOT NULL columns, no outer joins or set operations), ``spark``."""

    profile: str = "pg"
    json: bool = False
    inheritance: bool = False
    triggers: bool = True
    cascades: bool = True
    max_depth: int = 2
    nested_with: bool = True


@dataclass(frozen=True)
class ColumnDef:
    name: str
    type: str
    nullable: bool

    @property
    def kind(self) -> str:
        return TYPES[self.type]


@dataclass(frozen=True)
class ForeignKeyDef:
    column: str
    ref_table: str
    ref_column: str
    on_update: str = ""  # "", "CASCADE", "SET NULL"
    on_delete: str = ""


@dataclass(frozen=True)
class TableDef:
    name: str
    columns: tuple[ColumnDef, ...]
    primary_key: tuple[str, ...]
    foreign_keys: tuple[ForeignKeyDef, ...] = ()

    def column(self, name: str) -> ColumnDef:
        return next(c for c in self.columns if c.name == name)

    @property
    def non_key(self) -> tuple[ColumnDef, ...]:
        return tuple(c for c in self.columns if c.name not in self.primary_key)

    def create(self) -> str:
        cols = [f"{c.name} {c.type}" + ("" if c.nullable else " NOT NULL") for c in self.columns]
        cols.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        for fk in self.foreign_keys:
            clause = f"FOREIGN KEY ({fk.column}) REFERENCES {fk.ref_table} ({fk.ref_column})"
            if fk.on_update:
                clause += f" ON UPDATE {fk.on_update}"
            if fk.on_delete:
                clause += f" ON DELETE {fk.on_delete}"
            cols.append(clause)
        return f"CREATE TABLE {self.name} ({', '.join(cols)})"


@dataclass(frozen=True)
class TriggerDef:
    """AFTER INSERT/UPDATE/DELETE FOR EACH ROW on ``table``: count rows per value of
    ``column`` in ``target`` (``target(k int PRIMARY KEY, n int NOT NULL)``)."""

    table: str
    column: str
    target: str

    def ddl(self) -> list[str]:
        fn = f"{self.table}_cnt"
        body = (
            "BEGIN "
            "IF TG_OP IN ('INSERT', 'UPDATE') THEN "
            f"INSERT INTO {self.target} AS x VALUES (coalesce(NEW.{self.column}, 0), 1) "
            "ON CONFLICT (k) DO UPDATE SET n = x.n + 1; END IF; "
            "IF TG_OP IN ('DELETE', 'UPDATE') THEN "
            f"UPDATE {self.target} SET n = n - 1 WHERE k = coalesce(OLD.{self.column}, 0); "
            "END IF; RETURN NULL; END")
        return [
            f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $f$ {body} $f$",
            f"CREATE TRIGGER {fn} AFTER INSERT OR UPDATE OR DELETE ON {self.table} "
            f"FOR EACH ROW EXECUTE FUNCTION {fn}()",
        ]


@dataclass(frozen=True)
class SchemaDef:
    tables: tuple[TableDef, ...]
    triggers: tuple[TriggerDef, ...] = ()
    children: tuple[tuple[str, str], ...] = ()  # (child, parent): child INHERITS (parent)
    config: FuzzConfig = field(default_factory=FuzzConfig)

    def table(self, name: str) -> TableDef:
        return next(t for t in self.tables if t.name == name)

    def ddl(self) -> list[str]:
        """Every statement creating the schema (search_path set to it), in order."""
        out = [t.create() for t in self.tables]
        out += [f"CREATE TABLE {c} (extra text) INHERITS ({p})" for c, p in self.children]
        for trig in self.triggers:
            out += trig.ddl()
        return out

    def catalog_ddl(self) -> str:
        return ";\n".join(t.create() for t in self.tables) + ";"


def literal(kind: str, value: Any) -> str:
    """SQL text of a generated value (values are the generator's own, never user text)."""
    if value is None:
        return "NULL"
    if kind == "text":
        return f"'{value}'"
    if kind == "date":
        return f"DATE '{value.isoformat()}'"
    if kind == "bool":
        return "TRUE" if value else "FALSE"
    if kind == "json":
        return f"'{value}'::json"
    return str(value)


def random_value(rng: random.Random, col: ColumnDef, null_share: float = 0.15) -> Any:
    if col.nullable and rng.random() < null_share:
        return None
    return kind_value(rng, col.type)


def kind_value(rng: random.Random, type_: str) -> Any:
    kind = TYPES[type_]
    if kind == "int":
        return rng.randint(0, KEY_DOMAIN)
    if type_ == "double precision":
        return rng.randint(-4, 16) / 4
    if kind == "num":
        return Decimal(rng.randint(-4, 40)) / 4
    if kind == "text":
        return rng.choice(TEXTS)
    if kind == "date":
        return DAY0 + datetime.timedelta(days=rng.randint(0, 5))
    if kind == "bool":
        return rng.random() < 0.5
    return f'{{"a": {rng.randint(0, 3)}}}'


def _types(config: FuzzConfig) -> list[str]:
    types = ["int", "int", "int", "bigint", "numeric(8,2)", "double precision", "text", "text",
             "date", "boolean"]
    if config.json:
        types.append("json")
    return types


def random_schema(rng: random.Random, config: FuzzConfig) -> SchemaDef:
    """2–6 tables ``t0…``; a counter table for the trigger when there is one."""
    n = rng.randint(2, 5)
    fresh = config.profile == "fresh"
    tables: list[TableDef] = []
    for i in range(n):
        name = f"t{i}"
        composite = rng.random() < 0.25
        key_types = ["int", "int"] if composite else [rng.choice(["int", "int", "bigint", "text"])]
        cols = [ColumnDef(f"k{j}", ty, False) for j, ty in enumerate(key_types)]
        for j in range(rng.randint(1, 4)):
            ty = rng.choice(_types(config))
            nullable = not fresh and rng.random() < 0.45
            cols.append(ColumnDef(f"c{j}", ty, nullable))
        if not any(c.type == "int" and c.name.startswith("c") for c in cols):
            cols.append(ColumnDef(f"c{len(cols) - len(key_types)}", "int",
                                  not fresh and rng.random() < 0.4))
        fks: list[ForeignKeyDef] = []
        parents = [t for t in tables if len(t.primary_key) == 1
                   and t.column(t.primary_key[0]).type == "int"]
        if parents and rng.random() < 0.5:
            parent = rng.choice(parents)
            col = rng.choice([c for c in cols if c.type == "int" and c.name.startswith("c")])
            fks.append(_fk(rng, config, col, parent.name, parent.primary_key[0]))
        tables.append(TableDef(name, tuple(cols), tuple(c.name for c in cols[:len(key_types)]),
                               tuple(fks)))
    # a self-referencing foreign key (the cascade that re-keys rows twice)
    if config.cascades and not fresh and rng.random() < 0.15:
        i = rng.randrange(len(tables))
        t = tables[i]
        if len(t.primary_key) == 1 and t.column(t.primary_key[0]).type == "int" \
                and not t.foreign_keys:
            refs = [c for c in t.non_key if c.type == "int" and c.nullable]
            if refs:
                fk = _fk(rng, config, refs[0], t.name, t.primary_key[0])
                tables[i] = TableDef(t.name, t.columns, t.primary_key, (fk,))
    triggers: list[TriggerDef] = []
    if config.triggers and not fresh and rng.random() < 0.2 and len(tables) < 6:
        target = f"t{len(tables)}"
        tables.append(TableDef(target, (ColumnDef("k", "int", False),
                                        ColumnDef("n", "int", False)), ("k",)))
        src = rng.choice(tables[:-1])
        col = rng.choice([c for c in src.columns if c.kind == "int"])
        triggers.append(TriggerDef(src.name, col.name, target))
    children: list[tuple[str, str]] = []
    if config.inheritance and rng.random() < 0.3:
        parent = rng.choice(tables)
        children.append((f"{parent.name}_child", parent.name))
    return SchemaDef(tuple(tables), tuple(triggers), tuple(children), config)


def _fk(rng: random.Random, config: FuzzConfig, col: ColumnDef, table: str,
        column: str) -> ForeignKeyDef:
    on_update = on_delete = ""
    if config.cascades and rng.random() < 0.6:
        on_update = "CASCADE"
        on_delete = rng.choice(["CASCADE", "CASCADE"] + (["SET NULL"] if col.nullable else []))
    return ForeignKeyDef(col.name, table, column, on_update, on_delete)
