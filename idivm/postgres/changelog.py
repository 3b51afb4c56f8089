"""Modification logging for deferred view maintenance on PostgreSQL.

Every base table used by a deferred view gets one log table in the companion schema
``"<schema>__idivm"``, filled by statement-level triggers, shared by all views over the table.
Each view consumes the log from its own watermark (registry table ``log_users``).
"""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus
from sqlglot import exp

from idivm.catalog import Table
from idivm.errors import BackendError, CatalogError

__all__ = [
    "HAS_POST",
    "HAS_PRE",
    "OP",
    "OP_DELETE",
    "OP_INSERT",
    "SEQ",
    "companion_schema",
    "fold_into_temp",
    "fold_query",
    "install",
    "log_table_name",
    "max_seq",
    "prune",
    "q",
    "set_watermark",
    "uninstall",
    "watermark",
]

SEQ = "__seq"
OP = "__op"
HAS_PRE = "__has_pre"
HAS_POST = "__has_post"
OP_DELETE = "D"
OP_INSERT = "I"

_REGISTRY = "log_users"
_NEW_ROWS = "__idivm_new"
_OLD_ROWS = "__idivm_old"
_MAX_IDENT = 63  # NAMEDATALEN - 1: longer names would be silently truncated (and may collide)

# function-name suffix -> trigger name on the base table
_KINDS = {
    "ins": "idivm_log_insert",
    "upd": "idivm_log_update",
    "del": "idivm_log_delete",
    "trunc": "idivm_no_truncate",
}


def q(name: str) -> str:
    """Quote one identifier for PostgreSQL."""
    return exp.to_identifier(name, quoted=True).sql("postgres")


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _col(name: str, table: str | None = None) -> exp.Column:
    return exp.column(_ident(name), table=_ident(table) if table else None)


def _check_len(name: str) -> str:
    if len(name.encode()) > _MAX_IDENT:
        raise CatalogError(f"identifier {name!r} is longer than {_MAX_IDENT} bytes")
    return name


def companion_schema(schema: str) -> str:
    """Name of the schema holding idivm's internal objects for ``schema``."""
    return _check_len(f"{schema}__idivm")


def log_table_name(table_name: str) -> str:
    """Unqualified name of the log table of ``table_name`` (in the companion schema)."""
    return _check_len(f"log__{table_name}")


def _function_name(table_name: str, kind: str) -> str:
    return _check_len(f"log__{table_name}__{kind}")


def _qualified(schema: str, name: str) -> str:
    return f"{q(schema)}.{q(name)}"


def _log_ref(schema: str, table_name: str) -> str:
    return _qualified(companion_schema(schema), log_table_name(table_name))


def _registry_ref(schema: str) -> str:
    return _qualified(companion_schema(schema), _REGISTRY)


# --------------------------------------------------------------------------- installation


def _column_types(conn: psycopg.Connection, schema: str, table: Table) -> list[tuple[str, str]]:
    # Types come from the server so the log matches the base table exactly (typmods, domains,
    # enums, arrays); format_type returns them already quoted where needed.
    found = conn.execute("SELECT to_regclass(%s)", (_qualified(schema, table.name),)).fetchone()
    if found is None or found[0] is None:
        raise CatalogError(f"table {schema}.{table.name} does not exist")
    rows = conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_attribute a
        WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
        """,
        (_qualified(schema, table.name),),
    ).fetchall()
    types = {name: typ for name, typ in rows}
    missing = [c for c in table.column_names if c not in types]
    if missing:
        raise CatalogError(f"table {schema}.{table.name} has no column(s) {', '.join(missing)}")
    return [(c, types[c]) for c in table.column_names]


def _log_insert(log: exp.Table, columns: list[str], op: str, source: str) -> str:
    select = exp.select(exp.Literal.string(op), *[_col(c) for c in columns]).from_(
        exp.Table(this=_ident(source))
    )
    stmt = exp.insert(select, log, columns=[_ident(OP), *[_ident(c) for c in columns]])
    return stmt.sql("postgres")


def _dollar_quote(body: str) -> str:
    tag = "idivm"
    n = 0
    while f"${tag}$" in body:
        n += 1
        tag = f"idivm{n}"
    return f"${tag}${body}${tag}$"


def _function_bodies(schema: str, table: Table) -> dict[str, str]:
    log = exp.Table(this=_ident(log_table_name(table.name)), db=_ident(companion_schema(schema)))
    cols = list(table.column_names)
    ins_new = _log_insert(log, cols, OP_INSERT, _NEW_ROWS)
    ins_old = _log_insert(log, cols, OP_DELETE, _OLD_ROWS)
    return {
        "ins": f"BEGIN\n  {ins_new};\n  RETURN NULL;\nEND",
        # Old images first so every 'D' of a statement gets a smaller __seq than its 'I'.
        "upd": f"BEGIN\n  {ins_old};\n  {ins_new};\n  RETURN NULL;\nEND",
        "del": f"BEGIN\n  {ins_old};\n  RETURN NULL;\nEND",
        "trunc": (
            "BEGIN\n"
            "  RAISE EXCEPTION 'TRUNCATE of table %.% is not supported: it is maintained by "
            "idivm (delete the rows instead)', TG_TABLE_SCHEMA, TG_TABLE_NAME\n"
            "    USING ERRCODE = 'feature_not_supported';\n"
            "END"
        ),
    }


def _trigger_ddl(schema: str, table_name: str, kind: str) -> str:
    base = _qualified(schema, table_name)
    func = _qualified(companion_schema(schema), _function_name(table_name, kind))
    trig = q(_KINDS[kind])
    if kind == "trunc":
        return (
            f"CREATE OR REPLACE TRIGGER {trig} BEFORE TRUNCATE ON {base} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {func}()"
        )
    event, refs = {
        "ins": ("INSERT", f"NEW TABLE AS {q(_NEW_ROWS)}"),
        "upd": ("UPDATE", f"OLD TABLE AS {q(_OLD_ROWS)} NEW TABLE AS {q(_NEW_ROWS)}"),
        "del": ("DELETE", f"OLD TABLE AS {q(_OLD_ROWS)}"),
    }[kind]
    return (
        f"CREATE OR REPLACE TRIGGER {trig} AFTER {event} ON {base} "
        f"REFERENCING {refs} FOR EACH STATEMENT EXECUTE FUNCTION {func}()"
    )


def _lock_log(conn: psycopg.Connection, schema: str, table_name: str) -> None:
    # Waits for every writer transaction holding an uncommitted __seq to finish and blocks new
    # ones until we commit, so no row with __seq <= the max we read can appear later.
    # SHARE ROW EXCLUSIVE (not SHARE) so a later prune in the same transaction cannot deadlock
    # with another maintenance run.
    conn.execute(f"LOCK TABLE {_log_ref(schema, table_name)} IN SHARE ROW EXCLUSIVE MODE")


def install(conn: psycopg.Connection, schema: str, table: Table, view: str) -> None:
    """Log changes of ``table`` for ``view``; the view consumes changes from now on.

    Reinstalling an already registered view resets its watermark to the current end of the log.
    """
    comp = companion_schema(schema)
    log_name = log_table_name(table.name)
    for kind in _KINDS:
        _function_name(table.name, kind)
    typed = _column_types(conn, schema, table)
    reserved = sorted({SEQ, OP} & set(table.column_names))
    if reserved:
        raise CatalogError(
            f"table {schema}.{table.name}: column name(s) {', '.join(reserved)} are reserved"
        )

    # Atomic: a savepoint inside a caller's transaction, else a transaction of its own.
    with conn.transaction():
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(comp)}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_registry_ref(schema)} ("
            "tbl text NOT NULL, view text NOT NULL, watermark bigint NOT NULL, "
            "PRIMARY KEY (tbl, view))"
        )
        col_defs = ", ".join(f"{q(c)} {typ}" for c, typ in typed)
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_qualified(comp, log_name)} ("
            f'{q(SEQ)} bigserial PRIMARY KEY, {q(OP)} "char" NOT NULL, {col_defs})'
        )
        for kind, body in _function_bodies(schema, table).items():
            func = _qualified(comp, _function_name(table.name, kind))
            conn.execute(
                f"CREATE OR REPLACE FUNCTION {func}() RETURNS trigger LANGUAGE plpgsql "
                f"AS {_dollar_quote(body)}"
            )
            conn.execute(_trigger_ddl(schema, table.name, kind))

        _lock_log(conn, schema, table.name)
        conn.execute(
            f"INSERT INTO {_registry_ref(schema)} (tbl, view, watermark) VALUES (%s, %s, %s) "
            "ON CONFLICT (tbl, view) DO UPDATE SET watermark = EXCLUDED.watermark",
            (table.name, view, max_seq(conn, schema, table.name)),
        )


def _exists(conn: psycopg.Connection, schema: str, name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s)", (_qualified(schema, name),)).fetchone()
    return row is not None and row[0] is not None


def uninstall(conn: psycopg.Connection, schema: str, table_name: str, view: str) -> None:
    """Stop logging for ``view``; drop the log machinery once no view uses the table."""
    comp = companion_schema(schema)
    with conn.transaction():
        if not _exists(conn, comp, _REGISTRY):
            return
        conn.execute(
            f"DELETE FROM {_registry_ref(schema)} WHERE tbl = %s AND view = %s",
            (table_name, view),
        )
        row = conn.execute(
            f"SELECT count(*) FROM {_registry_ref(schema)} WHERE tbl = %s", (table_name,)
        ).fetchone()
        if row is not None and row[0] > 0:
            return
        for kind in _KINDS:
            func = _qualified(comp, _function_name(table_name, kind))
            # CASCADE drops the trigger on the base table too (and copes with it being gone).
            conn.execute(f"DROP FUNCTION IF EXISTS {func}() CASCADE")
        conn.execute(f"DROP TABLE IF EXISTS {_log_ref(schema, table_name)}")


# --------------------------------------------------------------------------- watermarks


def watermark(conn: psycopg.Connection, schema: str, table_name: str, view: str) -> int:
    """Highest __seq of ``table_name``'s log already consumed by ``view``."""
    comp = companion_schema(schema)
    row = None
    if _exists(conn, comp, _REGISTRY):
        row = conn.execute(
            f"SELECT watermark FROM {_registry_ref(schema)} WHERE tbl = %s AND view = %s",
            (table_name, view),
        ).fetchone()
    if row is None:
        raise BackendError(f"view {view!r} is not registered on table {schema}.{table_name}")
    return int(row[0])


def set_watermark(
    conn: psycopg.Connection, schema: str, table_name: str, view: str, seq: int
) -> None:
    """Record that ``view`` has consumed the log of ``table_name`` up to ``seq``."""
    watermark(conn, schema, table_name, view)  # raises if not registered
    conn.execute(
        f"UPDATE {_registry_ref(schema)} SET watermark = %s WHERE tbl = %s AND view = %s",
        (seq, table_name, view),
    )


def max_seq(conn: psycopg.Connection, schema: str, table_name: str) -> int:
    """Highest __seq in the log of ``table_name`` (0 when empty)."""
    row = conn.execute(
        f"SELECT coalesce(max({q(SEQ)}), 0) FROM {_log_ref(schema, table_name)}"
    ).fetchone()
    return int(row[0]) if row is not None else 0


def prune(conn: psycopg.Connection, schema: str, table_name: str) -> int:
    """Delete log rows every view has consumed; return how many."""
    cur = conn.execute(
        f"DELETE FROM {_log_ref(schema, table_name)} WHERE {q(SEQ)} <= "
        f"(SELECT min(watermark) FROM {_registry_ref(schema)} WHERE tbl = %s)",
        (table_name,),
    )
    return cur.rowcount


# --------------------------------------------------------------------------- folding


def _null_safe_eq(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    # Never NULL (unlike `a = b OR (a IS NULL AND b IS NULL)`), so NOT(...) stays two-valued.
    # IS NOT DISTINCT FROM is avoided: sqlglot does not render it as <=> for Spark.
    both_null = exp.and_(
        exp.Is(this=a.copy(), expression=exp.Null()), exp.Is(this=b.copy(), expression=exp.Null())
    )
    both_equal = exp.and_(
        exp.Not(this=exp.Is(this=a.copy(), expression=exp.Null())),
        exp.Not(this=exp.Is(this=b.copy(), expression=exp.Null())),
        exp.EQ(this=a.copy(), expression=b.copy()),
    )
    return exp.or_(exp.paren(both_null), exp.paren(both_equal))


def fold_query(table: Table, log: exp.Expr, since: int, upto: int) -> exp.Select:
    """Effective changes per key in the log rows with ``since < __seq <= upto``.

    Columns: key columns, ``c__pre`` per non-key column, ``c__post`` per non-key column,
    ``__has_pre``, ``__has_post``. Keys whose net change is nothing are left out.
    """
    keys = list(table.primary_key)
    if not keys:
        raise CatalogError(f"table {table.name} has no primary key")
    others = list(table.non_key_columns)

    def window(func: exp.Expr, desc: bool) -> exp.Window:
        order = exp.Order(expressions=[exp.Ordered(this=_col(SEQ), desc=desc)])
        return exp.Window(this=func, partition_by=[_col(k) for k in keys], order=order)

    first_op, last_op, rn = "__idivm_first_op", "__idivm_last_op", "__idivm_rn"
    inner = (
        exp.select(
            *[_col(k) for k in keys],
            exp.alias_(window(exp.RowNumber(), False), rn, quoted=True),
            exp.alias_(window(exp.FirstValue(this=_col(OP)), False), first_op, quoted=True),
            exp.alias_(window(exp.FirstValue(this=_col(OP)), True), last_op, quoted=True),
            *[
                exp.alias_(
                    window(exp.FirstValue(this=_col(c)), False), f"__idivm_f{i}", quoted=True
                )
                for i, c in enumerate(others)
            ],
            *[
                exp.alias_(window(exp.FirstValue(this=_col(c)), True), f"__idivm_l{i}", quoted=True)
                for i, c in enumerate(others)
            ],
        )
        .from_(log.copy())
        .where(
            exp.and_(
                exp.GT(this=_col(SEQ), expression=exp.Literal.number(since)),
                exp.LTE(this=_col(SEQ), expression=exp.Literal.number(upto)),
            )
        )
    )

    sub = "__idivm_fold"
    has_pre = exp.EQ(this=_col(first_op, sub), expression=exp.Literal.string(OP_DELETE))
    has_post = exp.EQ(this=_col(last_op, sub), expression=exp.Literal.string(OP_INSERT))

    def image(prefix: str, cond: exp.Expr, suffix: str) -> list[exp.Expr]:
        return [
            exp.alias_(
                exp.Case(ifs=[exp.If(this=cond.copy(), true=_col(f"{prefix}{i}", sub))]),
                f"{c}{suffix}",
                quoted=True,
            )
            for i, c in enumerate(others)
        ]

    unchanged = exp.and_(
        has_pre.copy(),
        has_post.copy(),
        *[
            _null_safe_eq(_col(f"__idivm_f{i}", sub), _col(f"__idivm_l{i}", sub))
            for i in range(len(others))
        ],
    )
    return (
        exp.select(
            *[_col(k, sub) for k in keys],
            *image("__idivm_f", has_pre, "__pre"),
            *image("__idivm_l", has_post, "__post"),
            exp.alias_(has_pre.copy(), HAS_PRE, quoted=True),
            exp.alias_(has_post.copy(), HAS_POST, quoted=True),
        )
        .from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=_ident(sub))))
        .where(
            exp.and_(
                exp.EQ(this=_col(rn, sub), expression=exp.Literal.number(1)),
                exp.paren(exp.or_(has_pre.copy(), has_post.copy())),
                exp.Not(this=exp.paren(unchanged)),
            )
        )
    )


def fold_into_temp(
    conn: psycopg.Connection, schema: str, table: Table, view: str, target: str
) -> tuple[int, int]:
    """Materialize ``view``'s pending effective changes of ``table`` into temp table ``target``.

    Returns ``(since, upto)``; the caller sets the watermark to ``upto`` in the same transaction.
    The log is locked against writers until that transaction ends.
    """
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise BackendError("fold_into_temp must run inside a transaction (ON COMMIT DROP)")
    _lock_log(conn, schema, table.name)
    since = watermark(conn, schema, table.name, view)
    upto = max_seq(conn, schema, table.name)
    log = exp.Table(this=_ident(log_table_name(table.name)), db=_ident(companion_schema(schema)))
    select = fold_query(table, log, since, upto).sql("postgres")
    conn.execute(f"DROP TABLE IF EXISTS pg_temp.{q(target)}")
    # sqlglot cannot render ON COMMIT DROP, hence the string around the rendered query.
    conn.execute(f"CREATE TEMP TABLE {q(target)} ON COMMIT DROP AS {select}")
    return since, upto
