"""Catalog: DDL parsing, DDL generation and reflection from a live PostgreSQL."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify

from idivm.catalog import Catalog, Column, ForeignKey, Table
from idivm.errors import CatalogError

SHOP_DDL = """
-- a small shop
CREATE TABLE customers (
    id      BIGINT PRIMARY KEY,
    name    VARCHAR(20) NOT NULL,
    score   DOUBLE PRECISION,
    vip     BOOLEAN,
    born    DATE
);
CREATE TABLE orders (
    id        INTEGER,
    cust_id   BIGINT REFERENCES customers (id),
    amount    NUMERIC(10, 2) NOT NULL,
    placed_at TIMESTAMP,
    note      TEXT,
    PRIMARY KEY (id)
);
CREATE INDEX orders_cust ON orders (cust_id);
CREATE TABLE lines (
    order_id  INT NOT NULL,
    line_no   INT NOT NULL,
    qty       INT,
    CONSTRAINT lines_pk PRIMARY KEY (order_id, line_no),
    CONSTRAINT lines_order FOREIGN KEY (order_id) REFERENCES orders (id) ON DELETE CASCADE
);
"""


def shop() -> Catalog:
    return Catalog.from_ddl(SHOP_DDL)


# --- from_ddl --------------------------------------------------------------------------------


def test_from_ddl_reads_every_create_table_and_ignores_other_statements() -> None:
    cat = shop()
    assert set(cat.tables) == {"customers", "orders", "lines"}
    assert cat.table("customers") == Table(
        "customers",
        (
            Column("id", "BIGINT", False),
            Column("name", "VARCHAR(20)", False),
            Column("score", "DOUBLE PRECISION", True),
            Column("vip", "BOOLEAN", True),
            Column("born", "DATE", True),
        ),
        ("id",),
    )


def test_column_level_constraints() -> None:
    orders = shop().table("orders")
    assert orders.primary_key == ("id",)
    assert orders.column("id").nullable is False  # primary key implies NOT NULL
    assert orders.column("amount") == Column("amount", "NUMERIC(10, 2)", False)
    assert orders.column("note") == Column("note", "TEXT", True)
    assert orders.foreign_keys == (ForeignKey(("cust_id",), "customers", ("id",)),)


def test_table_level_named_constraints() -> None:
    lines = shop().table("lines")
    assert lines.primary_key == ("order_id", "line_no")
    assert lines.foreign_keys == (ForeignKey(("order_id",), "orders", ("id",)),)
    assert lines.non_key_columns == ("qty",)
    assert lines.column_names == ("order_id", "line_no", "qty")


def test_unnamed_table_level_keys_and_named_column_constraints() -> None:
    cat = Catalog.from_ddl(
        """
        CREATE TABLE p (a INT, b INT, PRIMARY KEY (a, b));
        CREATE TABLE c (
            id INT CONSTRAINT c_pk PRIMARY KEY,
            pa INT CONSTRAINT c_fk REFERENCES p,
            pb INT NULL,
            FOREIGN KEY (pa, pb) REFERENCES p (a, b)
        );
        """
    )
    c = cat.table("c")
    assert c.primary_key == ("id",)
    # REFERENCES p without columns means p's primary key.
    assert c.foreign_keys == (
        ForeignKey(("pa",), "p", ("a", "b")),
        ForeignKey(("pa", "pb"), "p", ("a", "b")),
    )
    assert c.column("pb").nullable is True
    assert cat.table("p").non_key_columns == ()


def test_foreign_key_to_unknown_table_is_kept() -> None:
    cat = Catalog.from_ddl(
        "CREATE TABLE t (id INT PRIMARY KEY, x INT REFERENCES elsewhere, y INT REFERENCES far(k))"
    )
    assert cat.table("t").foreign_keys == (
        ForeignKey(("x",), "elsewhere", ()),
        ForeignKey(("y",), "far", ("k",)),
    )
    assert not cat.has_table("elsewhere")


def test_unquoted_names_fold_to_lower_case_quoted_names_keep_case() -> None:
    cat = Catalog.from_ddl(
        'CREATE TABLE Person (ID INT PRIMARY KEY, "FullName" TEXT, Dept INT REFERENCES "Dept"(Id));'
        'CREATE TABLE "Dept" (Id INT PRIMARY KEY)'
    )
    assert set(cat.tables) == {"person", "Dept"}
    person = cat.table("person")
    assert person.column_names == ("id", "FullName", "dept")
    assert person.primary_key == ("id",)
    assert person.foreign_keys == (ForeignKey(("dept",), "Dept", ("id",)),)
    assert not cat.has_table("Person")


def test_type_spellings_are_normalised() -> None:
    cat = Catalog.from_ddl(
        """CREATE TABLE t (
            a integer PRIMARY KEY, b int4, c int8, d numeric, e decimal(5, 1), f float8, g real,
            h character varying(5), i timestamp without time zone, j timestamptz, k text[],
            l serial, m bigserial, n jsonb, o uuid
        )"""
    )
    types = {c.name: c.type for c in cat.table("t").columns}
    assert types == {
        "a": "INT",
        "b": "INT",
        "c": "BIGINT",
        "d": "NUMERIC",
        "e": "NUMERIC(5, 1)",
        "f": "DOUBLE PRECISION",
        "g": "REAL",
        "h": "VARCHAR(5)",
        "i": "TIMESTAMP",
        "j": "TIMESTAMPTZ",
        "k": "TEXT[]",
        "l": "INT",
        "m": "BIGINT",
        "n": "JSONB",
        "o": "UUID",
    }
    # serial columns are NOT NULL by definition.
    assert cat.table("t").column("l").nullable is False


def test_table_without_primary_key_is_allowed() -> None:
    t = Catalog.from_ddl("CREATE TABLE log (msg TEXT, at TIMESTAMP)").table("log")
    assert t.primary_key == ()
    assert t.non_key_columns == ("msg", "at")


def test_empty_ddl_gives_empty_catalog() -> None:
    assert Catalog.from_ddl("-- nothing here\nCREATE INDEX i ON t (a);").tables == {}
    assert Catalog.from_ddl("").tables == {}


@pytest.mark.parametrize(
    ("ddl", "fragment"),
    [
        ("CREATE TABLE t (a INT", "Expecting )"),
        ("CREATE TABLE (a INT)", "malformed DDL"),
        ("CREATE TABLE t (a)", "t.a has no type"),
        ("CREATE TEMP TABLE t (a INT) ON COMMIT DROP", "cannot parse"),
        ("CREATE TABLE t (a INT PRIMARY KEY, b INT PRIMARY KEY)", "more than one primary key"),
        ("CREATE TABLE t (a INT, PRIMARY KEY (z))", "no column 'z'"),
        ("CREATE TABLE t (a INT, FOREIGN KEY (z) REFERENCES u (b))", "no column 'z'"),
        ("CREATE TABLE t (a INT, a TEXT)", "column 'a' more than once"),
        ("CREATE TABLE t (a INT); CREATE TABLE T (b INT)", "table 't' is defined more than once"),
        ("CREATE TABLE t AS SELECT 1 AS a", "without a column list"),
    ],
)
def test_bad_ddl_raises_catalog_error(ddl: str, fragment: str) -> None:
    with pytest.raises(CatalogError) as info:
        Catalog.from_ddl(ddl)
    assert fragment in str(info.value)


# --- Table / Catalog API -----------------------------------------------------------------------


def test_unknown_table_and_column_errors_name_them() -> None:
    cat = shop()
    with pytest.raises(CatalogError, match="unknown table 'nope'"):
        cat.table("nope")
    with pytest.raises(CatalogError, match="'orders'.*'nope'"):
        cat.table("orders").column("nope")
    assert cat.has_table("orders") and not cat.has_table("nope")
    assert cat.table("orders").has_column("note")


def test_catalog_is_immutable() -> None:
    cat = shop()
    with pytest.raises(TypeError):
        cat.tables["x"] = cat.table("orders")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cat.tables = {}  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cat.table("orders").name = "x"  # type: ignore[misc]


def test_constructors_normalise_sequences_and_primary_key_nullability() -> None:
    t = Table("t", [Column("a", "INT", True), Column("b", "TEXT", True)], ["a"])  # type: ignore[arg-type]
    assert t.columns == (Column("a", "INT", False), Column("b", "TEXT", True))
    assert t.primary_key == ("a",)
    assert Catalog({"t": t}) == Catalog.of([t])
    with pytest.raises(CatalogError, match="does not match"):
        Catalog({"u": t})


def test_sqlglot_schema_lists_columns_and_types() -> None:
    schema = shop().sqlglot_schema()
    assert schema["orders"]["amount"] == "NUMERIC(10, 2)"
    assert list(schema["lines"]) == ["order_id", "line_no", "qty"]


def _star_columns(cat: Catalog, query: str) -> list[str]:
    qualified = qualify(
        sqlglot.parse_one(query, "postgres"),
        schema=cat.sqlglot_mapping_schema(),
        dialect="postgres",
    )
    assert isinstance(qualified, exp.Select)
    return [s.alias_or_name for s in qualified.selects]


def test_sqlglot_mapping_schema_feeds_qualify() -> None:
    query = "SELECT * FROM orders o JOIN lines l ON o.id = l.order_id"
    assert _star_columns(shop(), query) == [
        "id", "cust_id", "amount", "placed_at", "note", "order_id", "line_no", "qty",
    ]  # fmt: skip


def test_sqlglot_mapping_schema_keeps_quoted_mixed_case_names() -> None:
    cat = Catalog.from_ddl('CREATE TABLE "Orders" ("Id" INT PRIMARY KEY, Cust INT)')
    assert _star_columns(cat, 'SELECT * FROM "Orders"') == ["Id", "cust"]


# --- ddl() -----------------------------------------------------------------------------------


def test_ddl_round_trips() -> None:
    cat = shop()
    statements = cat.ddl()
    assert all(s.startswith('CREATE TABLE "') for s in statements)
    assert Catalog.from_ddl(";\n".join(statements)) == cat


def test_ddl_orders_referenced_tables_first_and_quotes_names() -> None:
    cat = Catalog.from_ddl(
        'CREATE TABLE "Child" (id INT PRIMARY KEY, p INT REFERENCES parent (id));'
        "CREATE TABLE parent (id INT PRIMARY KEY, self_ref INT REFERENCES parent (id))"
    )
    statements = cat.ddl()
    assert statements[0].startswith('CREATE TABLE "parent"')
    assert statements[1] == (
        'CREATE TABLE "Child" ("id" INT NOT NULL, "p" INT, PRIMARY KEY ("id"), '
        'FOREIGN KEY ("p") REFERENCES "parent" ("id"))'
    )
    assert Catalog.from_ddl(";".join(statements)) == cat


_names = st.text(alphabet="abcXYZ_ 1", min_size=1, max_size=6).filter(lambda s: s.strip() == s)
_types = st.sampled_from(
    ["INT", "BIGINT", "TEXT", "NUMERIC(10, 2)", "DOUBLE PRECISION", "VARCHAR(20)", "BOOLEAN",
     "DATE", "TIMESTAMP", "TIMESTAMPTZ", "TEXT[]"]
)  # fmt: skip


@st.composite
def _tables(draw: st.DrawFn) -> Catalog:
    table_names = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    tables: list[Table] = []
    for name in table_names:
        col_names = draw(st.lists(_names, min_size=1, max_size=5, unique=True))
        columns = tuple(Column(c, draw(_types), draw(st.booleans())) for c in col_names)
        pk = tuple(draw(st.lists(st.sampled_from(col_names), unique=True, max_size=2)))
        fks: tuple[ForeignKey, ...] = ()
        add_fk = draw(st.booleans())
        if tables and add_fk:
            target = tables[0]
            fks = (ForeignKey((col_names[0],), target.name, (target.columns[0].name,)),)
        tables.append(Table(name, columns, pk, fks))
    return Catalog.of(tables)


@given(_tables())
@settings(max_examples=60, deadline=None)
def test_ddl_round_trips_generated_catalogs(cat: Catalog) -> None:
    assert Catalog.from_ddl(";\n".join(cat.ddl())) == cat


# --- reflect ---------------------------------------------------------------------------------


REFLECT_DDL = """
CREATE TABLE customers (
    id BIGINT PRIMARY KEY, name VARCHAR(20) NOT NULL, score DOUBLE PRECISION, vip BOOLEAN,
    born DATE, seen TIMESTAMP, seen_tz TIMESTAMPTZ, tags TEXT[]
);
CREATE TABLE "Orders" (
    "Id" INTEGER, cust_id BIGINT REFERENCES customers, amount NUMERIC(10, 2) NOT NULL, note TEXT,
    PRIMARY KEY ("Id")
);
CREATE TABLE lines (
    order_id INT NOT NULL REFERENCES "Orders", line_no INT, qty SMALLINT, price REAL,
    CONSTRAINT lines_pk PRIMARY KEY (order_id, line_no)
);
CREATE TABLE log (msg TEXT, at TIMESTAMP);
"""


def _create_in_schema(dsn: str, schema: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in statements:
            conn.execute(statement.encode())


def test_reflect_matches_ddl(pg_dsn: str, pg_schema: str) -> None:
    expected = Catalog.from_ddl(REFLECT_DDL)
    _create_in_schema(pg_dsn, pg_schema, expected.ddl())
    reflected = Catalog.reflect(pg_dsn, schema=pg_schema)
    assert reflected == expected
    assert reflected.table("Orders").foreign_keys == (
        ForeignKey(("cust_id",), "customers", ("id",)),
    )
    assert reflected.table("log").primary_key == ()
    assert reflected.table("lines").column("line_no").nullable is False


def test_reflect_accepts_explicit_psycopg_driver(pg_dsn: str, pg_schema: str) -> None:
    _create_in_schema(pg_dsn, pg_schema, ["CREATE TABLE t (a INT PRIMARY KEY, b TEXT)"])
    url = pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    assert Catalog.reflect(url, schema=pg_schema) == Catalog.from_ddl(
        "CREATE TABLE t (a INT PRIMARY KEY, b TEXT)"
    )


def test_reflect_empty_schema(pg_dsn: str, pg_schema: str) -> None:
    assert Catalog.reflect(pg_dsn, schema=pg_schema).tables == {}


def test_reflect_unknown_schema(pg_dsn: str, pg_schema: str) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        Catalog.reflect(pg_dsn, schema=pg_schema + "_missing")


def test_reflect_unreachable_database_hides_password() -> None:
    url = "postgresql://someone:s3cret@127.0.0.1:1/nowhere"
    with pytest.raises(CatalogError) as info:
        Catalog.reflect(url)
    message = str(info.value)
    assert "could not reach the database" in message
    assert "someone" in message and "127.0.0.1:1/nowhere" in message
    assert "s3cret" not in message


@pytest.mark.parametrize("url", ["not a url", "nosuchdialect://x/y"])
def test_reflect_bad_url(url: str) -> None:
    with pytest.raises(CatalogError, match="could not reach the database"):
        Catalog.reflect(url)
