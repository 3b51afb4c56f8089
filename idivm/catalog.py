"""Schema catalog: tables, columns, keys and foreign keys, read from DDL or a live database.

Identifiers follow PostgreSQL: unquoted names are folded to lower case, quoted names keep their
case. Column types are kept as PostgreSQL type names rendered by sqlglot (``INT``, ``TEXT``,
``NUMERIC(10, 2)``, ``DOUBLE PRECISION``, ``TIMESTAMPTZ`` ...), whether they come from DDL or
from reflection, so both routes give equal catalogs for the same schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError
from sqlglot.schema import MappingSchema

from idivm.errors import CatalogError

__all__ = ["Catalog", "Column", "ForeignKey", "Table"]

# serial types are integer columns with a sequence default; the catalog keeps the data type only.
_SERIAL_TYPES = {
    exp.DataType.Type.SMALLSERIAL: "SMALLINT",
    exp.DataType.Type.SERIAL: "INT",
    exp.DataType.Type.BIGSERIAL: "BIGINT",
}
_DECIMAL_WORD = re.compile(r"\bDECIMAL\b")
_CREATE_TABLE_TEXT = re.compile(
    r"\s*CREATE\s+(?:(?:OR\s+REPLACE|GLOBAL|LOCAL|TEMP|TEMPORARY|UNLOGGED)\s+)*TABLE\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Column:
    """A table column. ``nullable`` is False for NOT NULL and primary-key columns."""

    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class ForeignKey:
    """``columns`` reference ``ref_columns`` of ``ref_table``.

    ``ref_columns`` is empty for ``REFERENCES t`` when t's primary key is not known.
    """

    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "ref_columns", tuple(self.ref_columns))


@dataclass(frozen=True)
class Table:
    """A base table. ``primary_key`` is ``()`` when the table has none."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    foreign_keys: tuple[ForeignKey, ...] = ()

    def __post_init__(self) -> None:
        columns = tuple(self.columns)
        primary_key = tuple(self.primary_key)
        names = [c.name for c in columns]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise CatalogError(f"table {self.name!r} has column {name!r} more than once")
            seen.add(name)
        if not columns:
            raise CatalogError(f"table {self.name!r} has no columns")
        for key in (primary_key, *(fk.columns for fk in self.foreign_keys)):
            for name in key:
                if name not in seen:
                    raise CatalogError(
                        f"table {self.name!r} has no column {name!r} (used in a key)"
                    )
        if len(set(primary_key)) != len(primary_key):
            raise CatalogError(f"table {self.name!r} repeats a column in its primary key")
        # Primary-key columns are NOT NULL in SQL whatever the column definition said.
        columns = tuple(
            replace(c, nullable=False) if c.name in primary_key and c.nullable else c
            for c in columns
        )
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "primary_key", primary_key)
        object.__setattr__(self, "foreign_keys", tuple(self.foreign_keys))

    def column(self, name: str) -> Column:
        """The column called ``name``; CatalogError if the table has none."""
        for col in self.columns:
            if col.name == name:
                return col
        raise CatalogError(f"table {self.name!r} has no column {name!r}")

    def has_column(self, name: str) -> bool:
        """Whether the table has a column called ``name``."""
        return any(col.name == name for col in self.columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        """Column names in definition order."""
        return tuple(col.name for col in self.columns)

    @property
    def non_key_columns(self) -> tuple[str, ...]:
        """Names of the columns outside the primary key, in definition order."""
        return tuple(col.name for col in self.columns if col.name not in self.primary_key)

    @property
    def not_null_non_key_columns(self) -> tuple[str, ...]:
        """Names of the NOT NULL columns outside the primary key, in definition order."""
        return tuple(col.name for col in self.columns
                     if not col.nullable and col.name not in self.primary_key)


@dataclass(frozen=True)
class Catalog:
    """Immutable set of tables keyed by name (unhashable: ``tables`` is a read-only mapping)."""

    tables: Mapping[str, Table] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tables = dict(self.tables)
        for key, table in tables.items():
            if key != table.name:
                raise CatalogError(f"catalog key {key!r} does not match table name {table.name!r}")
        object.__setattr__(self, "tables", MappingProxyType(tables))

    @classmethod
    def of(cls, tables: Iterable[Table]) -> Catalog:
        """Catalog of ``tables``; CatalogError if two share a name."""
        by_name: dict[str, Table] = {}
        for table in tables:
            if table.name in by_name:
                raise CatalogError(f"table {table.name!r} is defined more than once")
            by_name[table.name] = table
        return cls(by_name)

    @classmethod
    def from_ddl(cls, ddl: str, dialect: str = "postgres") -> Catalog:
        """Catalog of every ``CREATE TABLE`` in ``ddl``; other statements are ignored."""
        try:
            statements = sqlglot.parse(ddl, read=dialect)
        except ParseError as err:
            raise CatalogError(f"malformed DDL: {_parse_error_message(err)}") from None
        except SqlglotError as err:
            raise CatalogError(f"malformed DDL: {err}") from None
        tables: list[Table] = []
        for stmt in statements:
            if isinstance(stmt, exp.Create) and str(stmt.args.get("kind") or "").upper() == "TABLE":
                tables.append(_table_from_create(stmt, dialect))
            elif isinstance(stmt, exp.Command):
                # sqlglot falls back to an opaque Command on syntax it does not know; a table
                # silently missing from the catalog would be worse than an error.
                text = f"{stmt.this} {stmt.expression}" if stmt.expression else str(stmt.this)
                if _CREATE_TABLE_TEXT.match(text):
                    raise CatalogError(f"malformed DDL: cannot parse {_shorten(text)!r}")
        return cls.of(_resolve_implicit_references(tables))

    @classmethod
    def reflect(cls, url: str, schema: str | None = None) -> Catalog:
        """Catalog of the tables of the database at ``url``, in ``schema`` or the default one.

        ``postgresql://`` URLs use the psycopg 3 driver; CatalogError if it cannot be reached.
        """
        return _reflect(url, schema)

    def table(self, name: str) -> Table:
        """The table called ``name``; CatalogError if unknown."""
        try:
            return self.tables[name]
        except KeyError:
            raise CatalogError(f"unknown table {name!r}") from None

    def has_table(self, name: str) -> bool:
        """Whether the catalog has a table called ``name``."""
        return name in self.tables

    def sqlglot_schema(self) -> dict[str, dict[str, str]]:
        """``{table: {column: type}}`` for ``sqlglot.optimizer.qualify(schema=...)``.

        sqlglot lower-cases these names again unless told not to, which loses quoted mixed-case
        names; prefer :meth:`sqlglot_mapping_schema` when the catalog may hold such names.
        """
        return {
            name: {col.name: col.type for col in table.columns}
            for name, table in self.tables.items()
        }

    def sqlglot_mapping_schema(self, dialect: str = "postgres") -> MappingSchema:
        """The catalog as a sqlglot schema for ``qualify(schema=...)``; names are used as stored."""
        # Names here are already folded the PostgreSQL way; normalizing again would lower-case
        # quoted names such as "Orders" and make sqlglot miss them.
        schema: dict[str, object] = dict(self.sqlglot_schema())
        return MappingSchema(schema, dialect=dialect, normalize=False)

    def ddl(self, dialect: str = "postgres") -> list[str]:
        """``CREATE TABLE`` statements, referenced tables before the tables referencing them."""
        return [_create_table(table).sql(dialect=dialect) for table in self._dependency_order()]

    def _dependency_order(self) -> list[Table]:
        ordered: list[Table] = []
        state: dict[str, bool] = {}  # False while visiting, True when done; cycles keep input order

        def visit(table: Table) -> None:
            if table.name in state:
                return
            state[table.name] = False
            for fk in table.foreign_keys:
                if fk.ref_table in self.tables:
                    visit(self.tables[fk.ref_table])
            state[table.name] = True
            ordered.append(table)

        for table in self.tables.values():
            visit(table)
        return ordered


# --- DDL parsing -------------------------------------------------------------------------------


def _shorten(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_error_message(err: ParseError) -> str:
    if not err.errors:
        return str(err)
    first = err.errors[0]
    near = f"{first.get('start_context') or ''}{first.get('highlight') or ''}"
    where = f"line {first.get('line')}, column {first.get('col')}"
    return f"{first.get('description')} at {where}, near {_shorten(near)!r}"


def _ident_name(node: exp.Expression) -> str:
    """PostgreSQL name of an identifier: unquoted names fold to lower case."""
    if isinstance(node, exp.Identifier):
        return node.name if node.quoted else node.name.lower()
    if isinstance(node, (exp.Column, exp.Table)):
        ident = node.this
        if isinstance(ident, exp.Identifier):
            return _ident_name(ident)
    return node.name.lower()


def _ident_names(nodes: Iterable[exp.Expression]) -> tuple[str, ...]:
    return tuple(_ident_name(n) for n in nodes)


def _type_sql(datatype: exp.DataType) -> str:
    """Canonical PostgreSQL spelling of a parsed type."""
    if datatype.this in _SERIAL_TYPES:
        return _SERIAL_TYPES[datatype.this]
    text = datatype.sql(dialect="postgres")
    if any(
        isinstance(node, exp.DataType) and node.this == exp.DataType.Type.DECIMAL
        for node in datatype.walk()
    ):
        # sqlglot renders NUMERIC as DECIMAL; PostgreSQL (and its catalogs) say NUMERIC.
        text = _DECIMAL_WORD.sub("NUMERIC", text)
    return text


def normalize_type(type_text: str) -> str:
    """Canonical spelling of a type given as text; unknown (user-defined) types are kept."""
    try:
        return _type_sql(exp.DataType.build(type_text, dialect="postgres"))
    except (SqlglotError, ValueError):
        return type_text


def _reference(ref: exp.Reference) -> tuple[str, tuple[str, ...]]:
    target = ref.this
    if isinstance(target, exp.Schema):
        table = target.this
        if not isinstance(table, exp.Table):
            raise CatalogError(f"cannot read REFERENCES clause {ref.sql()!r}")
        return _ident_name(table), _ident_names(target.expressions)
    if isinstance(target, exp.Table):
        return _ident_name(target), ()
    raise CatalogError(f"cannot read REFERENCES clause {ref.sql()!r}")


def _table_from_create(create: exp.Create, dialect: str) -> Table:
    schema = create.this
    if not isinstance(schema, exp.Schema) or not isinstance(schema.this, exp.Table):
        raise CatalogError(
            f"CREATE TABLE without a column list is not supported: {create.sql(dialect=dialect)}"
        )
    table_name = _ident_name(schema.this)
    columns: list[Column] = []
    primary_key: tuple[str, ...] = ()
    foreign_keys: list[ForeignKey] = []

    def set_primary_key(key: tuple[str, ...]) -> None:
        nonlocal primary_key
        if primary_key:
            raise CatalogError(f"table {table_name!r} declares more than one primary key")
        primary_key = key

    def table_constraint(node: exp.Expression) -> None:
        if isinstance(node, exp.PrimaryKey):
            set_primary_key(_ident_names(node.expressions))
        elif isinstance(node, exp.ForeignKey):
            ref = node.args.get("reference")
            if not isinstance(ref, exp.Reference):
                raise CatalogError(f"table {table_name!r}: FOREIGN KEY without REFERENCES")
            ref_table, ref_columns = _reference(ref)
            foreign_keys.append(ForeignKey(_ident_names(node.expressions), ref_table, ref_columns))
        # UNIQUE, CHECK, EXCLUDE ... do not matter to the catalog.

    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            name = _ident_name(item.this)
            kind = item.args.get("kind")
            if not isinstance(kind, exp.DataType):
                raise CatalogError(f"column {table_name}.{name} has no type")
            nullable = kind.this not in _SERIAL_TYPES
            for constraint in item.args.get("constraints") or []:
                ckind = constraint.args.get("kind")
                if isinstance(ckind, exp.NotNullColumnConstraint):
                    nullable = bool(ckind.args.get("allow_null"))
                elif isinstance(ckind, exp.GeneratedAsIdentityColumnConstraint):
                    nullable = False
                elif isinstance(ckind, exp.PrimaryKeyColumnConstraint):
                    set_primary_key((name,))
                elif isinstance(ckind, exp.Reference):
                    ref_table, ref_columns = _reference(ckind)
                    foreign_keys.append(ForeignKey((name,), ref_table, ref_columns))
            columns.append(Column(name, _type_sql(kind), nullable))
        elif isinstance(item, (exp.Identifier, exp.Column)):
            raise CatalogError(f"column {table_name}.{_ident_name(item)} has no type")
        elif isinstance(item, exp.Constraint):
            for node in item.expressions:
                table_constraint(node)
        else:
            table_constraint(item)
    return Table(table_name, tuple(columns), primary_key, tuple(foreign_keys))


def _resolve_implicit_references(tables: list[Table]) -> list[Table]:
    """Fill ``REFERENCES t`` (no column list) with t's primary key when t is in the same DDL."""
    pks = {t.name: t.primary_key for t in tables}
    resolved: list[Table] = []
    for table in tables:
        fks = tuple(
            replace(fk, ref_columns=pks[fk.ref_table])
            if not fk.ref_columns and pks.get(fk.ref_table)
            else fk
            for fk in table.foreign_keys
        )
        resolved.append(replace(table, foreign_keys=fks))
    return resolved


# --- DDL generation ----------------------------------------------------------------------------


def _quoted(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _table_ref(name: str) -> exp.Table:
    return exp.Table(this=_quoted(name))


def _datatype(type_text: str) -> exp.DataType:
    try:
        return exp.DataType.build(type_text, dialect="postgres")
    except (SqlglotError, ValueError):
        return exp.DataType.build(type_text, dialect="postgres", udt=True)


def _create_table(table: Table) -> exp.Create:
    items: list[exp.Expression] = []
    for col in table.columns:
        constraints = (
            [] if col.nullable else [exp.ColumnConstraint(kind=exp.NotNullColumnConstraint())]
        )
        items.append(
            exp.ColumnDef(this=_quoted(col.name), kind=_datatype(col.type), constraints=constraints)
        )
    if table.primary_key:
        items.append(exp.PrimaryKey(expressions=[_quoted(c) for c in table.primary_key]))
    for fk in table.foreign_keys:
        target: exp.Expression = _table_ref(fk.ref_table)
        if fk.ref_columns:
            target = exp.Schema(this=target, expressions=[_quoted(c) for c in fk.ref_columns])
        items.append(
            exp.ForeignKey(
                expressions=[_quoted(c) for c in fk.columns],
                reference=exp.Reference(this=target),
            )
        )
    return exp.Create(this=exp.Schema(this=_table_ref(table.name), expressions=items), kind="TABLE")


# --- reflection --------------------------------------------------------------------------------


def _reflect(url: str, schema: str | None) -> Catalog:
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as err:
        raise CatalogError(f"could not reach the database: malformed URL ({err})") from None
    shown = parsed.render_as_string(hide_password=True)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    connect_args: dict[str, Any] = {}
    if parsed.drivername == "postgresql+psycopg":
        connect_args["connect_timeout"] = 10
    try:
        engine = create_engine(parsed, connect_args=connect_args)
    except (ArgumentError, NoSuchModuleError) as err:
        raise CatalogError(f"could not reach the database at {shown}: {err}") from None
    try:
        try:
            insp = inspect(engine)
        except SQLAlchemyError as err:
            reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
            raise CatalogError(f"could not reach the database at {shown}: {reason}") from None
        try:
            if schema is not None and schema not in insp.get_schema_names():
                raise CatalogError(f"schema {schema!r} does not exist in the database at {shown}")
            tables = [
                _reflect_table(insp, engine.dialect, name, schema)
                for name in insp.get_table_names(schema=schema)
            ]
        except SQLAlchemyError as err:
            raise CatalogError(f"reflection failed on the database at {shown}: {err}") from None
    finally:
        engine.dispose()
    return Catalog.of(tables)


def _reflect_table(insp: Any, dialect: Any, name: str, schema: str | None) -> Table:
    pk = tuple(insp.get_pk_constraint(name, schema=schema).get("constrained_columns") or ())
    columns = []
    for col in insp.get_columns(name, schema=schema):
        sa_type = col["type"]
        try:
            type_text = sa_type.compile(dialect=dialect)
        except Exception:  # NullType and some exotic types cannot compile
            type_text = str(sa_type)
        columns.append(Column(col["name"], normalize_type(type_text), bool(col["nullable"])))
    fks = tuple(
        ForeignKey(
            tuple(fk["constrained_columns"]), fk["referred_table"], tuple(fk["referred_columns"])
        )
        for fk in insp.get_foreign_keys(name, schema=schema)
    )
    return Table(name, tuple(columns), pk, fks)
