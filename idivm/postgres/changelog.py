"""Modification logging for deferred view maintenance on PostgreSQL.

Every base table used by a deferred view gets one log table in the companion schema
``"<schema>__idivm"``, filled by statement-level triggers, shared by all views over the table.
A log row carries the writing transaction's id (``__xid``); each consumer (a view, a fresh
view's feed) keeps as its watermark the *snapshot* it last consumed at (registry
``log_users``). A consumer running in a REPEATABLE READ transaction reads exactly the log rows
of transactions its snapshot sees and its previous snapshot did not — commit order, not the
order in which rows were written — and reads the base tables in that same snapshot, so no
writer is ever locked out and no committed change is lost or consumed twice (the PgQ-style
queue design). The fold of the pending rows does not rely on their order (the order rows are
logged in is not the order of the row changes when statements nest: cascades, triggers writing
the table): each row change logs its old and new image exactly once, so the images that do not
cancel out per key are its row before and after (``fold_select``). An UPDATE's old and new
images equal in every logged column cancel in the trigger already (an UPDATE of up to
``CANCEL_ROWS`` rows): neither is logged.

Tables with inheritance children, inheritance children, partitioned tables and partitions are
refused: a statement naming one of them changes rows of another without firing that one's
statement triggers.

The log holds the table's key and the columns some view reads; DDL on other columns is
absorbed. It holds the row images some consumer can see: each registers the condition its
rows must meet (``planner.log_filter``; none: every row), and the triggers log an image only
if it meets one of them (a condition whose meaning depends on the session — time zones, date
styles — is not used: a trigger runs in the writer's session).

The triggers also count what each statement logged (``log_counts``, pruned with the log):
a consumer counts its pending rows from those counts, not by reading the rows twice.

The triggers fire ``ALWAYS`` (also under ``session_replication_role = replica``), a
TRUNCATE is logged as the deletion of every row, and a database-wide event trigger refuses
DDL that would leave a view silently wrong (dropping, renaming or retyping a logged column,
renaming the table, disabling the logging triggers).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import sqlglot
from sqlglot import exp

from idivm.catalog import Table
from idivm.errors import BackendError, CatalogError, UnsupportedSQL
from idivm.planner.model import fit

__all__ = [
    "HAS_POST",
    "HAS_PRE",
    "OP",
    "OP_DELETE",
    "OP_INSERT",
    "SEQ",
    "XID",
    "KeyFold",
    "advance",
    "companion_schema",
    "counted",
    "equal_images_cancel",
    "fit",
    "indent",
    "fold_into_temp",
    "fold_query",
    "fold_by_key",
    "folds_by_key",
    "fold_select",
    "first_image_source",
    "install",
    "install_guard",
    "log_columns",
    "log_images",
    "trigger_safe",
    "log_table_name",
    "pending_predicate",
    "prune",
    "prune_due",
    "prune_threshold",
    "q",
    "uninstall",
    "watermark",
]

SEQ = "__seq"
OP = "__op"
XID = "__xid"
HAS_PRE = "__has_pre"
HAS_POST = "__has_post"
OP_DELETE = "D"
OP_INSERT = "I"
RESERVED = (SEQ, OP, XID)
# the compiled maintenance's PL/pgSQL variables begin so (``compile``): a base-table column of
# such a name would make its unqualified references in the log's scans ambiguous
RESERVED_PREFIX = "idivm__"

_REGISTRY = "log_users"
_PRUNED = "log_tables"  # per log: the xid below which every row was pruned
_PRUNE_LOG = "prune_log"
# per (table, writing transaction): how many rows its statements logged (``_function_bodies``),
# so a consumer counts its pending log rows by reading a row per statement, not every log row
COUNTS = "log_counts"
_SEEN = "seen"  # registry column: the row images a consumer can see
_NEW_ROWS = "__idivm_new"
_OLD_ROWS = "__idivm_old"

# an UPDATE of more rows than this logs every old and new image (``_function_bodies``)
CANCEL_ROWS = 10_000

# function-name suffix -> trigger name on the base table
_KINDS = {
    "ins": "idivm_log_insert",
    "upd": "idivm_log_update",
    "del": "idivm_log_delete",
    "trunc": "idivm_log_truncate",
}
TRIGGERS = tuple(_KINDS.values())

LOCK_CLASS = 0x1D1  # first key of idivm's advisory locks (the second: what is locked)

# the companion's aggregate that keeps the first non-NULL value it is given: the fold's image
# of a column over a key's (at most one) 'D' or 'I' log row. array_agg(c)[1] did the same with
# an array state per column and key (PostgreSQL sizes one at 8 kB: a sorted grouping, or a
# hashed one spilling past work_mem); this one's state is the value itself
FIRST_IMAGE = "first_image"


def first_image_source(companion: str) -> str:
    """``<companion>.first_image(anyelement)``: the first non-NULL value of its group (its
    step, strict, runs only from the second non-NULL value on: never for a fold's images)."""
    step = _qualified(companion, FIRST_IMAGE + "_step")
    return (f"CREATE OR REPLACE FUNCTION {step}(anyelement, anyelement) RETURNS anyelement "
            f"LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS 'SELECT $1';\n"
            f"CREATE OR REPLACE AGGREGATE {_qualified(companion, FIRST_IMAGE)}(anyelement) "
            f"(SFUNC = {step}, STYPE = anyelement)")


GUARD_SCHEMA = "idivm"
GUARD_FUNCTION = "guard_ddl"
GUARD_TRIGGER = "idivm_guard_ddl"


@functools.lru_cache(maxsize=8192)
def q(name: str) -> str:
    """Quote one identifier for PostgreSQL (cached: a compile quotes the same few names
    tens of thousands of times)."""
    return exp.to_identifier(name, quoted=True).sql("postgres")


@functools.lru_cache(maxsize=8192)
def lit(value: str) -> str:
    """A string literal for PostgreSQL (rendered by sqlglot, quotes escaped; cached)."""
    return exp.Literal.string(value).sql("postgres")


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _col(name: str, table: str | None = None) -> exp.Column:
    return exp.column(_ident(name), table=_ident(table) if table else None)


def companion_schema(schema: str) -> str:
    """Name of the schema holding idivm's internal objects for ``schema``."""
    return fit(f"{schema}__idivm")


def log_table_name(table_name: str) -> str:
    """Unqualified name of the log table of ``table_name`` (in the companion schema)."""
    return fit(f"log__{table_name}")


def _function_name(table_name: str, kind: str) -> str:
    return fit(f"log__{table_name}__{kind}")


def _qualified(schema: str, name: str) -> str:
    return f"{q(schema)}.{q(name)}"


def _log_ref(schema: str, table_name: str) -> str:
    return _qualified(companion_schema(schema), log_table_name(table_name))


def _registry_ref(schema: str) -> str:
    return _qualified(companion_schema(schema), _REGISTRY)


# --------------------------------------------------------------------------- installation


def install_shared(conn: psycopg.Connection, schema: str) -> None:
    """The companion's objects every log shares: the consumers' registry (``log_users``), the
    pruned xid per log (``log_tables``), the statements' counts of logged rows
    (``log_counts``) and ``prune_log``. Idempotent; run by ``install`` and by the
    maintainer's registry setup (a view recompiled by a newer idivm reads ``log_counts``
    before any new view installs a log)."""
    comp = companion_schema(schema)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(comp)}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {_registry_ref(schema)} ("
        "tbl text NOT NULL, view text NOT NULL, watermark pg_snapshot NOT NULL, "
        "PRIMARY KEY (tbl, view))"
    )
    # the images the consumer can see (SQL over the table's columns; NULL: every one)
    conn.execute(f"ALTER TABLE {_registry_ref(schema)} ADD COLUMN IF NOT EXISTS {_SEEN} text")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {_qualified(comp, _PRUNED)} ("
        "tbl text PRIMARY KEY, pruned xid8 NOT NULL)")
    # a queue as the logs are (vacuumed early); read by (tbl, __xid) as a log by __xid
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {_qualified(comp, COUNTS)} (tbl text NOT NULL, "
        f"{q(XID)} xid8 NOT NULL DEFAULT pg_current_xact_id(), n bigint NOT NULL) "
        "WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000)")
    conn.execute(f"CREATE INDEX IF NOT EXISTS {q(fit(COUNTS + '__tbl_xid'))} ON "
                 f"{_qualified(comp, COUNTS)} (tbl, {q(XID)})")
    conn.execute(f"CREATE OR REPLACE FUNCTION {_qualified(comp, _PRUNE_LOG)}(tbl text, "
                 f"log regclass) RETURNS bigint LANGUAGE plpgsql AS "
                 f"{dollar_quote(_prune_body(comp))}")


def counted(schema: str, table_name: str, prev: exp.Expr) -> exp.Select:
    """The rows logged for ``table_name`` that the current snapshot sees and ``prev`` did not,
    as the logging statements counted them (``log_counts``): a row a statement read, not a
    row a change. A log filled by triggers that did not count (an idivm before compiled
    format 32) has no counts: 0 then, which callers check against the log itself."""
    c = exp.to_identifier("c")
    return exp.select(exp.func("coalesce", exp.Sum(this=exp.column("n", table=c)),
                               exp.Literal.number(0))).from_(
        exp.Table(this=_ident(COUNTS), db=_ident(companion_schema(schema)),
                  alias=exp.TableAlias(this=c))).where(exp.and_(
            exp.EQ(this=exp.column("tbl", table=c), expression=exp.Literal.string(table_name)),
            pending_predicate(prev, exp.column(XID, table=c, quoted=True))))


def column_types(conn: psycopg.Connection, schema: str, table: str) -> dict[str, str]:
    """The table's columns and their types as the server spells them (typmods, domains, enums,
    arrays; ``format_type`` quotes them where needed)."""
    found = conn.execute("SELECT to_regclass(%s)", (_qualified(schema, table),)).fetchone()
    if found is None or found[0] is None:
        raise CatalogError(f"table {schema}.{table} does not exist")
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (_qualified(schema, table),),
    ).fetchall()
    return {str(name): str(typ) for name, typ in rows}


def log_columns(conn: psycopg.Connection, schema: str, table_name: str) -> list[str]:
    """The base-table columns the log of ``table_name`` holds (empty when it has no log)."""
    comp = companion_schema(schema)
    if not _exists(conn, comp, log_table_name(table_name)):
        return []
    return [c for c in column_types(conn, comp, log_table_name(table_name)) if c not in RESERVED]


def _log_insert(log: exp.Table, columns: Sequence[str], op: str, source: str,
                where: exp.Expr | None = None, less: str | None = None) -> str:
    """Log the images of ``source`` (a statement's old or new rows), ``where``: those meeting
    it; ``less`` (an UPDATE's new or old rows): less those equal in every logged column to an
    image of ``less`` — a multiset difference (``EXCEPT ALL``), so an image cancels at most
    one equal image of the other side."""
    def images(rows: str) -> exp.Select:
        select = exp.select(*[_col(c) for c in columns]).from_(exp.Table(this=_ident(rows)))
        return select if where is None else select.where(where.copy())

    if less is None:
        select = images(source)
        select.set("expressions", [exp.Literal.string(op), *select.expressions])
    else:
        kept = "__idivm_kept"
        select = exp.select(exp.Literal.string(op), *[_col(c, kept) for c in columns]).from_(
            exp.Subquery(this=exp.Except(this=images(source), expression=images(less),
                                         distinct=False), alias=exp.TableAlias(this=_ident(kept))))
    stmt = exp.insert(select, log, columns=[_ident(OP), *[_ident(c) for c in columns]])
    return stmt.sql("postgres")


def dollar_quote(body: str) -> str:
    tag = "idivm"
    n = 0
    while f"${tag}$" in body:
        n += 1
        tag = f"idivm{n}"
    return f"${tag}${body}${tag}$"


def _function_bodies(schema: str, table_name: str, columns: Sequence[str],
                     source: tuple[str, str] | None = None, where: exp.Expr | None = None,
                     cancel: bool = False) -> dict[str, str]:
    """The logging triggers' bodies: every row image (``where``: only those meeting it).
    ``cancel``: an UPDATE of up to ``CANCEL_ROWS`` rows logs only the old and new images that
    do not cancel — an old image and a new one equal in every logged column (the key among
    them) are the same row image removed and put back, which every fold nets to nothing; not
    logging them spares the writer their log rows and every consumer reading, folding and
    pruning them (an UPDATE of columns no view reads logs nothing). Only where PostgreSQL can
    compare every logged column (``equal_images_cancel``). A larger UPDATE logs every image:
    the difference hashes both sides in memory (a hashed set operation does not spill, and
    PL/pgSQL keeps the plan it made for the session's first, perhaps small, UPDATE), and it
    costs the writer about as much again as the logging when the images do differ.

    Each statement that logs rows also adds their number to ``log_counts`` (a row: the table,
    the writer's xid, the count), so a maintain counts the rows it consumes by reading a row
    a statement rather than every log row (the count of 17k pending line-item rows was 2.9 ms
    of each TPC-H SF 1 refresh that read them; the paired-A/B figures are in the README)."""
    log = exp.Table(this=_ident(log_table_name(table_name)), db=_ident(companion_schema(schema)))
    ins_new = _log_insert(log, columns, OP_INSERT, _NEW_ROWS, where)
    ins_old = _log_insert(log, columns, OP_DELETE, _OLD_ROWS, where)
    upd_old = _log_insert(log, columns, OP_DELETE, _OLD_ROWS, where, _NEW_ROWS)
    upd_new = _log_insert(log, columns, OP_INSERT, _NEW_ROWS, where, _OLD_ROWS)
    home, rel = source or (schema, table_name)
    base = exp.Table(this=_ident(rel), db=_ident(home))
    every = exp.select(exp.Literal.string(OP_DELETE), *[_col(c) for c in columns]).from_(base)
    if where is not None:
        every = every.where(where.copy())
    truncated = exp.insert(every, log, columns=[_ident(OP), *[_ident(c) for c in columns]])

    def body(*inserts: str) -> str:
        # each INSERT's rows added up; the statement's count, if any, into ``log_counts``
        # (``use_column``: a logged column named as a variable is the column in the INSERTs;
        # the variables are read where no column is in scope)
        lines = []
        for k, ins in enumerate(inserts):
            lines += [f"{ins};", f"GET DIAGNOSTICS idivm__{'k' if k else 'n'} = ROW_COUNT;"]
            if k:
                lines.append("idivm__n := idivm__n + idivm__k;")
        return "\n".join(lines) + f"\nIF idivm__n > 0 THEN\n  {count};\nEND IF;"

    count = (f"INSERT INTO {_qualified(companion_schema(schema), COUNTS)} (tbl, n) "
             f"VALUES ({lit(table_name)}, idivm__n)")
    head = "#variable_conflict use_column\nDECLARE\n  idivm__n bigint;\n  idivm__k bigint;\nBEGIN"
    return {kind: f"{head}\n{indent(text, 2)}\n  RETURN NULL;\nEND" for kind, text in {
        "ins": body(ins_new),
        # (old images first; the fold does not depend on it)
        "upd": (f"IF EXISTS (SELECT FROM {q(_OLD_ROWS)} OFFSET {CANCEL_ROWS}) THEN\n"
                f"{indent(body(ins_old, ins_new), 2)}\nELSE\n"
                f"{indent(body(upd_old, upd_new), 2)}\nEND IF;") if cancel else
               body(ins_old, ins_new),
        "del": body(ins_old),
        # BEFORE TRUNCATE: every row still there is logged as deleted
        "trunc": body(truncated.sql("postgres")),
    }.items()}


def indent(text: str, n: int) -> str:
    """``text`` with every non-empty line indented by ``n`` spaces."""
    pad = " " * n
    return "\n".join(pad + line if line else line for line in text.splitlines())


def _trigger_ddl(schema: str, table_name: str, kind: str,
                 source: tuple[str, str] | None = None) -> list[str]:
    base = _qualified(*(source or (schema, table_name)))
    func = _qualified(companion_schema(schema), _function_name(table_name, kind))
    trig = q(_KINDS[kind])
    # the arguments name the log and the table, for the DDL guard (pg_trigger.tgargs)
    args = f"{lit(_log_ref(schema, table_name))}, {lit(base)}"
    if kind == "trunc":
        create = (f"CREATE OR REPLACE TRIGGER {trig} BEFORE TRUNCATE ON {base} "
                  f"FOR EACH STATEMENT EXECUTE FUNCTION {func}({args})")
    else:
        event, refs = {
            "ins": ("INSERT", f"NEW TABLE AS {q(_NEW_ROWS)}"),
            "upd": ("UPDATE", f"OLD TABLE AS {q(_OLD_ROWS)} NEW TABLE AS {q(_NEW_ROWS)}"),
            "del": ("DELETE", f"OLD TABLE AS {q(_OLD_ROWS)}"),
        }[kind]
        create = (f"CREATE OR REPLACE TRIGGER {trig} AFTER {event} ON {base} "
                  f"REFERENCING {refs} FOR EACH STATEMENT EXECUTE FUNCTION {func}({args})")
    # ALWAYS: logical-replication apply workers and restores run with
    # session_replication_role = replica, where ordinary triggers do not fire
    return [create, f"ALTER TABLE {base} ENABLE ALWAYS TRIGGER {trig}"]


def equal_images_cancel(conn: psycopg.Connection, log: str, columns: Sequence[str]) -> bool:
    """Whether PostgreSQL can compare the values of every one of ``columns`` of ``log`` (an
    ``EXCEPT ALL`` over them plans: each type, and an array's elements and a composite's
    fields, has an equality operator): the logging triggers then cancel an UPDATE's equal
    images (``_function_bodies``). A type without one (json, xml, point …) logs every image,
    as before — its fold compares images by their text."""
    cols = ", ".join(q(c) for c in columns)
    try:
        with conn.transaction():  # (a savepoint: the failed EXPLAIN rolls back alone)
            conn.execute(f"EXPLAIN SELECT {cols} FROM {log} EXCEPT ALL SELECT {cols} FROM {log}")
    except psycopg.errors.UndefinedFunction:  # could not identify an equality operator
        return False
    return True


def install(conn: psycopg.Connection, schema: str, table: Table, view: str,
            columns: Sequence[str] | None = None,
            source: tuple[str, str] | None = None,
            seen: exp.Expr | None = None) -> None:
    """Log changes of ``table`` for ``view`` (the key and ``columns``, default all), from this
    transaction's snapshot on; the caller may move the watermark later (``advance``) within
    the transaction that reads the table's rows.

    ``source`` (schema, relation): where the rows of ``table`` are written when that is not
    ``schema.table`` itself — an idivm view read by another view is a PostgreSQL view over
    its stored table, whose triggers fill the log of the view's name.

    The log is widened when ``columns`` holds columns it does not have yet. Reinstalling an
    already registered view resets its watermark.

    ``seen``: a condition on the table's columns that every row image ``view`` can see meets
    (``planner.log_filter``). The triggers log only images some registered consumer can see —
    none left out while a consumer registered without one (or with one ``trigger_safe``
    rejects) uses the table; a consumer dropped leaves them as they are (logging more than
    needed) until the next install.
    """
    comp = companion_schema(schema)
    log_name = log_table_name(table.name)
    for kind in _KINDS:
        _function_name(table.name, kind)
    home, rel = source or (schema, table.name)
    typed = column_types(conn, home, rel)
    wanted = list(table.column_names if columns is None else columns)
    missing = [c for c in [*table.primary_key, *wanted] if c not in typed]
    if missing:
        raise CatalogError(f"table {home}.{rel} has no column(s) {', '.join(missing)}")
    reserved = sorted(c for c in typed if c in RESERVED or c.startswith(RESERVED_PREFIX))
    if reserved:
        raise CatalogError(
            f"table {schema}.{table.name}: column name(s) {', '.join(reserved)} are reserved "
            f"(idivm's log columns, and names beginning {RESERVED_PREFIX}: the variables of "
            "its compiled maintenance, which a column of the same name would be ambiguous with)"
        )
    # Atomic: a savepoint inside a caller's transaction, else a transaction of its own.
    with conn.transaction():
        refuse_inheritance(conn, home, rel)
        lock_companion(conn, schema)
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(comp)}")
        install_shared(conn, schema)
        conn.execute(first_image_source(comp))  # (the compiled fold's aggregate)
        conn.execute(f"INSERT INTO {_qualified(comp, _PRUNED)} VALUES (%s, '0') "
                     "ON CONFLICT (tbl) DO NOTHING", (table.name,))
        have = log_columns(conn, schema, table.name)
        logged = [c for c in typed if c in {*have, *table.primary_key, *wanted}]
        if not have:
            col_defs = ", ".join(f"{q(c)} {typed[c]}" for c in logged)
            # a queue: rows come and go, so vacuum it early (dead rows slow the prune's scan).
            # No sequence number: nothing reads the order of its rows (consumers read by
            # ``__xid`` and fold), and a nextval per row cost a 6,000-row log insert 23% (15.6
            # → 12.0 ms by hand); logs made by an earlier idivm keep their ``__seq``
            conn.execute(
                f"CREATE TABLE {_qualified(comp, log_name)} ("
                f'{q(XID)} xid8 NOT NULL DEFAULT pg_current_xact_id(), {q(OP)} "char" NOT NULL, '
                f"{col_defs}) WITH (autovacuum_vacuum_scale_factor = 0, "
                "autovacuum_vacuum_threshold = 10000)")
            conn.execute(f"CREATE INDEX ON {_qualified(comp, log_name)} ({q(XID)})")
        else:
            for c in logged:
                if c not in have:  # waits for writers with rows in the log, blocks new ones
                    conn.execute(f"ALTER TABLE {_qualified(comp, log_name)} ADD COLUMN "
                                 f"{q(c)} {typed[c]}")
        mine = seen if seen is not None and trigger_safe(seen, typed) else None
        conn.execute(
            f"INSERT INTO {_registry_ref(schema)} (tbl, view, watermark, {_SEEN}) "
            "VALUES (%s, %s, pg_current_snapshot(), %s) "
            f"ON CONFLICT (tbl, view) DO UPDATE SET watermark = EXCLUDED.watermark, "
            f"{_SEEN} = EXCLUDED.{_SEEN}",
            (table.name, view, None if mine is None else mine.sql("postgres")),
        )
        conds = _conditions(conn, schema, table.name)
        _index_conditions(conn, schema, table.name, conds)
        where = None if any(c is None for c in conds) else exp.or_(
            *[exp.paren(sqlglot.parse_one(c, dialect="postgres")) for c in dict.fromkeys(conds)
              if c is not None])
        # the trigger DDL waits for in-flight writers of the table: rows they wrote before it
        # are in the snapshot the view is materialized in
        cancel = equal_images_cancel(conn, _qualified(comp, log_name), logged)
        for kind, body in _function_bodies(schema, table.name, logged, source, where,
                                           cancel).items():
            func = _qualified(comp, _function_name(table.name, kind))
            conn.execute(
                f"CREATE OR REPLACE FUNCTION {func}() RETURNS trigger LANGUAGE plpgsql "
                f"AS {dollar_quote(body)}"
            )
            for ddl in _trigger_ddl(schema, table.name, kind, source):
                conn.execute(ddl)


def _conditions(conn: psycopg.Connection, schema: str, table_name: str) -> list[str | None]:
    """The registered consumers' conditions on the table's row images (None: every image)."""
    return [r[0] for r in conn.execute(
        f"SELECT {_SEEN} FROM {_registry_ref(schema)} WHERE tbl = %s ORDER BY view",
        (table_name,))]


def _index_conditions(conn: psycopg.Connection, schema: str, table_name: str,
                      conds: Sequence[str | None], logging: bool = True) -> None:
    """A partial index on the log's ``__xid`` per consumer condition that does not hold for
    every logged image (another consumer sees other images: a second condition, or none),
    so a consumer's fold — its pending rows by its condition — reads only its own rows and
    not every consumer's (TPC-H SF 1 Q19's count of its pending line items beside Q5's view:
    0.48 ms through such an index, 2.92 ms through the log's); the indexes of conditions no
    consumer has any more are dropped. Writers pay an index entry per image meeting one. A
    condition PostgreSQL does not take as an index predicate (a function not IMMUTABLE) gets
    none: the index is a shortcut, its fold reads the log's rows as before. ``logging``: the
    triggers were just made to log what ``conds`` see (``install``); else (a consumer
    dropped: the triggers log as before) only the indexes of conditions gone are dropped."""
    comp = companion_schema(schema)
    log = _qualified(comp, log_table_name(table_name))
    distinct = list(dict.fromkeys(conds))
    wanted = {} if logging and len(distinct) < 2 else {
        fit(f"{log_table_name(table_name)}__seen_{_digest(c)}"): c
        for c in distinct if c is not None}
    # (the log's only partial indexes are these)
    have = {str(r[0]) for r in conn.execute(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) AND i.indpred IS NOT NULL", (log,))}
    for name in sorted(have - set(wanted)):
        conn.execute(f"DROP INDEX {_qualified(comp, name)}")
    for name in sorted(set(wanted) - have if logging else ()):
        try:
            with conn.transaction():  # (a savepoint: a refused predicate rolls back alone)
                pred = sqlglot.parse_one(wanted[name], dialect="postgres").sql("postgres")
                conn.execute(f"CREATE INDEX {q(name)} ON {log} ({q(XID)}) WHERE {pred}")
        except (psycopg.errors.InvalidObjectDefinition, psycopg.errors.FeatureNotSupported):
            continue


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


# server types whose comparisons and arithmetic do not depend on the session (TimeZone,
# DateStyle, IntervalStyle, extra_float_digits): a logging trigger judges a row image in the
# writer's session, the view in the maintainer's
_SESSION_FREE = re.compile(r"^(smallint|integer|bigint|numeric(\(.*\))?|real|double precision|"
                           r"boolean|text|character varying(\(.*\))?|character(\(.*\))?|"
                           r'"char"|date)$')
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def trigger_safe(cond: exp.Expr, types: Mapping[str, str]) -> bool:
    """Whether ``cond`` (over the columns ``types`` gives server types of) means the same in
    every session: columns of session-free types, casts of literals only (a date literal in
    ISO form), no string literal read as a date in another form."""
    for col in cond.find_all(exp.Column):
        t = types.get(col.name)
        if t is None or not _SESSION_FREE.match(t):
            return False
    for cast in cond.find_all(exp.Cast):
        if not isinstance(cast.this, exp.Literal):
            return False
        if cast.to.is_type(exp.DataType.Type.DATE) and not _ISO_DATE.match(cast.this.name):
            return False
        if not cast.to.is_type(exp.DataType.Type.DATE, *exp.DataType.NUMERIC_TYPES,
                               *exp.DataType.TEXT_TYPES):
            return False
    dates = {c for c, t in types.items() if t == "date"}
    if dates & {c.name for c in cond.find_all(exp.Column)}:
        for lit_ in cond.find_all(exp.Literal):
            if lit_.is_string and not isinstance(lit_.parent, exp.Cast) and \
                    not _ISO_DATE.match(lit_.name) and any(
                        isinstance(n, exp.Column) and n.name in dates
                        for n in (lit_.parent.args.values() if lit_.parent else ())):
                return False
    return not any(isinstance(n, exp.Interval) for n in cond.walk())


INHERITANCE_CHECK = """SELECT c.relkind = 'p', c.relispartition,
  EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = c.oid),
  EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
FROM pg_class c WHERE c.oid = to_regclass(%s)"""


def refuse_inheritance(conn: psycopg.Connection, schema: str, table_name: str) -> None:
    """Refuse a table whose rows other tables' statements change without firing its statement
    triggers: PostgreSQL's ``SELECT … FROM parent`` reads the children's rows too, and a
    statement naming a parent (or a partitioned table) fires the statement triggers of the
    table it names only, never those of its children (or partitions) whose rows it changes.
    A child created later (``INHERITS``, ``ALTER TABLE … INHERIT``, ``ATTACH PARTITION``) is
    caught by the catalog fingerprint maintenance checks (``compile.fingerprint_source``)."""
    row = conn.execute(INHERITANCE_CHECK, (_qualified(schema, table_name),)).fetchone()
    if row is None:
        return
    partitioned, partition, children, parents = row
    name = f"{schema}.{table_name}"
    if partitioned:
        raise UnsupportedSQL(
            "partitioned table",
            f"{name} is partitioned: writes straight into a partition fire no statement "
            "trigger of the partitioned table, so its change log would miss them")
    if partition:
        raise UnsupportedSQL(
            "partition",
            f"{name} is a partition: writes through its partitioned table fire no statement "
            "trigger of the partition, so its change log would miss them")
    if children:
        raise UnsupportedSQL(
            "table with inheritance children",
            f"{name} has inheritance children: PostgreSQL's SELECT … FROM {table_name} reads "
            "their rows too, and writes to them fire no trigger of the parent (read the parent "
            "alone with FROM ONLY … is not supported either)")
    if parents:
        raise UnsupportedSQL(
            "inheritance child table",
            f"{name} inherits from another table: writes through the parent fire no "
            "statement trigger of the child, so its change log would miss them")


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
            if _exists(conn, comp, log_table_name(table_name)):
                _index_conditions(conn, schema, table_name,
                                  _conditions(conn, schema, table_name), logging=False)
            return
        if _exists(conn, comp, _PRUNED):
            conn.execute(f"DELETE FROM {_qualified(comp, _PRUNED)} WHERE tbl = %s",
                         (table_name,))
        if _exists(conn, comp, COUNTS):
            conn.execute(f"DELETE FROM {_qualified(comp, COUNTS)} WHERE tbl = %s",
                         (table_name,))
        for kind in _KINDS:
            func = _qualified(comp, _function_name(table_name, kind))
            # CASCADE drops the trigger on the base table too (and copes with it being gone).
            conn.execute(f"DROP FUNCTION IF EXISTS {func}() CASCADE")
        conn.execute(f"DROP TABLE IF EXISTS {_log_ref(schema, table_name)}")


# --------------------------------------------------------------------------- watermarks


def watermark(conn: psycopg.Connection, schema: str, table_name: str, view: str) -> str:
    """The snapshot (``pg_snapshot`` text) up to which ``view`` consumed ``table_name``'s log."""
    comp = companion_schema(schema)
    row = None
    if _exists(conn, comp, _REGISTRY):
        row = conn.execute(
            f"SELECT watermark::text FROM {_registry_ref(schema)} WHERE tbl = %s AND view = %s",
            (table_name, view),
        ).fetchone()
    if row is None:
        raise BackendError(f"view {view!r} is not registered on table {schema}.{table_name}")
    return str(row[0])


def advance(conn: psycopg.Connection, schema: str, view: str,
            tables: Sequence[str] | None = None) -> None:
    """Record that ``view`` consumed its tables' logs up to this transaction's snapshot."""
    sql = (f"UPDATE {_registry_ref(schema)} SET watermark = pg_current_snapshot() "
           "WHERE view = %s")
    params: tuple[object, ...] = (view,)
    if tables is not None:
        sql += " AND tbl = ANY(%s)"
        params = (view, list(tables))
    if conn.execute(sql, params).rowcount == 0:
        raise BackendError(f"view {view!r} is not registered in schema {schema}")


def _prune_body(comp: str) -> str:
    """Delete the log rows every consumer's watermark sees: xids below every watermark's xmin
    (such a transaction had ended before each was taken). The scan starts where the last
    prune stopped, so the dead index entries below are never walked again; a READ COMMITTED
    caller (a concurrent prune of another view then just waits for the row lock)."""
    return f"""DECLARE
  lo xid8;
  hi xid8;
  n bigint;
BEGIN
  SELECT p.pruned INTO lo FROM {_qualified(comp, _PRUNED)} p WHERE p.tbl = prune_log.tbl
    FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  SELECT min(pg_snapshot_xmin(u.watermark)) INTO hi FROM {_qualified(comp, _REGISTRY)} u
   WHERE u.tbl = prune_log.tbl;
  IF hi IS NULL OR hi <= lo THEN
    RETURN 0;
  END IF;
  EXECUTE format('DELETE FROM %s WHERE {XID} >= $1 AND {XID} < $2', log) USING lo, hi;
  GET DIAGNOSTICS n = ROW_COUNT;
  DELETE FROM {_qualified(comp, COUNTS)} c WHERE c.tbl = prune_log.tbl AND c.{XID} >= lo
     AND c.{XID} < hi;
  UPDATE {_qualified(comp, _PRUNED)} p SET pruned = hi WHERE p.tbl = prune_log.tbl;
  RETURN n;
END"""


def prune_statement(schema: str, table_name: str) -> str:
    """The call that prunes the log of ``table_name`` (see ``_prune_body``)."""
    comp = companion_schema(schema)
    return (f"SELECT {_qualified(comp, _PRUNE_LOG)}({lit(table_name)}, "
            f"{lit(_log_ref(schema, table_name))}::regclass)")


# a maintain prunes a log only when that pays (``prune_due``): every prune is a transaction
# with a row lock, a DELETE planned anew and an UPDATE (0.6–0.8 ms of a 3.6 ms TPC-H Q6
# refresh at SF 1), so the rows of small runs wait for the run that has consumed at least
# PRUNE_ROWS of them, or that comes PRUNE_XIDS transactions after the last prune (a bound on
# what waits); the session settings of these names override them (0: prune at every run)
PRUNE_ROWS = 10_000
PRUNE_XIDS = 100
PRUNE_ROWS_SETTING = "idivm.prune_rows"
PRUNE_XIDS_SETTING = "idivm.prune_xids"


def prune_threshold(setting: str, default: int) -> str:
    """The threshold ``setting`` holds in the session (a whole number; anything else, or
    nothing: ``default``) as a SQL expression."""
    value = f"current_setting({lit(setting)}, true)"
    return f"coalesce(CASE WHEN {value} ~ '^[0-9]{{1,18}}$' THEN {value}::bigint END, {default})"


def prune_due(schema: str, table_name: str, consumed: str, rows: str, xids: str) -> str:
    """Whether a run that consumed ``consumed`` log rows of ``table_name`` (a SQL bigint) is
    to prune its log: ``rows`` of them or more, or ``xids`` transactions or more begun between
    the last prune's bound and the bound now (the oldest watermark's xmin: what a prune could
    reach; no bound recorded yet counts as due). The log rows a run leaves are read by no
    later fold (each reads the rows its own watermark has not seen, from the ``__xid`` index
    upwards) and go with the next prune."""
    return _prune_due(schema, lit(table_name), consumed, rows, xids)


def prune_due_any(schema: str, consumed: Mapping[str, str], rows: str, xids: str) -> str:
    """Whether the prune of any of the tables of ``consumed`` (table → the log rows a run
    consumed of it, a SQL bigint) is due (``prune_due``), as one SQL expression."""
    pairs = ", ".join(f"({lit(t)}, {n})" for t, n in consumed.items())
    return (f"EXISTS (SELECT FROM (VALUES {pairs}) AS c(tbl, n) WHERE c.n > 0 AND "
            f"{_prune_due(schema, 'c.tbl', 'c.n', rows, xids)})")


def _prune_due(schema: str, table: str, consumed: str, rows: str, xids: str) -> str:
    """``prune_due`` of the table named by the SQL text expression ``table``."""
    comp = companion_schema(schema)
    bound = (f"(SELECT min(pg_snapshot_xmin(u.watermark))::text::numeric FROM "
             f"{_registry_ref(schema)} u WHERE u.tbl = {table})")
    last = (f"(SELECT p.pruned::text::numeric FROM {_qualified(comp, _PRUNED)} p "
            f"WHERE p.tbl = {table})")
    return f"({consumed} >= {rows} OR coalesce({bound} - {last}, {xids}) >= {xids})"


def prune(conn: psycopg.Connection, schema: str, table_name: str) -> int:
    """Delete log rows every consumer has consumed; return how many."""
    row = conn.execute(prune_statement(schema, table_name)).fetchone()
    return int(row[0]) if row else 0


def lock_companion(conn: psycopg.Connection, schema: str) -> None:
    """Serialize installs into one companion schema (their CREATE OR REPLACE of shared
    functions would otherwise collide: 'tuple concurrently updated')."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                 (LOCK_CLASS, companion_schema(schema)))


# --------------------------------------------------------------------------- folding


def snapshot_literal(text: str) -> exp.Expr:
    """A ``pg_snapshot`` constant (a watermark read back as text)."""
    return exp.cast(exp.Literal.string(text), exp.DataType.build("pg_snapshot", udt=True))


def pending_predicate(prev: exp.Expr, xid: exp.Expr | None = None) -> exp.Expr:
    """Log rows the current snapshot sees and the snapshot ``prev`` did not (the index on
    ``__xid`` bounds the scan from below: an xid under prev's xmin had ended before it);
    ``xid``: the log row's ``__xid`` (default: the column, unqualified)."""
    xid = _col(XID) if xid is None else xid
    return exp.and_(
        exp.GTE(this=xid, expression=exp.Anonymous(this="pg_snapshot_xmin",
                                                   expressions=[prev.copy()])),
        exp.Not(this=exp.Anonymous(this="pg_visible_in_snapshot",
                                   expressions=[xid.copy(), prev.copy()])))


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
    """Effective changes per key in the log rows with ``since < __seq <= upto`` (the Spark
    backend's versioned change log)."""
    return fold_select(table, log, exp.and_(
        exp.GT(this=_col(SEQ), expression=exp.Literal.number(since)),
        exp.LTE(this=_col(SEQ), expression=exp.Literal.number(upto))), dialect="spark")


# Types without an equality operator (no btree or hash operator class): a fold groups their
# values by their text form, which is exact for these (json and xml keep their input text)
# and never coarser than the value. Spark's MAP has no equality either.
_NO_EQUALITY = frozenset({"json", "xml", "point", "line", "lseg", "box", "path", "polygon",
                          "circle", "map"})


def _without_equality(type_name: str) -> bool:
    t = type_name.strip().lower()
    while t.endswith("[]"):
        t = t[:-2].strip()
    if t.startswith("array<"):
        t = t[len("array<"):]
    return t.split("(")[0].split("<")[0].strip() in _NO_EQUALITY


def _fail(message: exp.Expr, dialect: str) -> exp.Expr:
    """A boolean expression that raises ``message`` when evaluated (never constant-folded:
    the message reads a column). PostgreSQL has no raise function in plain SQL: the cast of
    the message to an integer fails with it."""
    if dialect == "spark":
        return exp.Anonymous(this="raise_error", expressions=[message])
    if dialect == "duckdb":  # DuckDB's error() raises: true never comes back
        return exp.Is(this=exp.Anonymous(this="error", expressions=[message]),
                      expression=exp.null())
    return exp.EQ(this=exp.cast(message, exp.DataType.build("INT")),
                  expression=exp.Literal.number(0))


def fold_select(table: Table, log: exp.Expr, where: exp.Expr,
                dialect: str = "postgres",
                server_types: Mapping[str, str] | None = None) -> exp.Select:
    """Effective changes per key in the log rows satisfying ``where``.

    Columns: key columns, ``c__pre`` per non-key column, ``c__post`` per non-key column,
    ``__has_pre``, ``__has_post``. Keys whose net change is nothing are left out.

    The fold does not depend on the order of the log rows. Statement triggers log in the
    order statements *end*: a cascade or a row trigger writing the table runs nested
    statements whose rows are logged before the outer statement's, so the log's order is not
    the order of the row changes. But each row change logs its old image ('D') and its new
    image ('I') exactly once, nested or not (a rolled-back savepoint takes its log rows with
    it) — or, equal to each other in every logged column, neither (the trigger takes
    the pair out of both sides) — so per key, as multisets of row images,
    ``before + ΣI = after + ΣD``: grouped by
    (key, image) with +1 per 'I' and −1 per 'D', the image counting −1 is the key's row
    before, the one counting +1 its row after, and the rest cancel. Any other count means
    the log does not describe the table's changes (logging bypassed, or a key that is not
    unique): the fold raises "inconsistent change log" rather than return a wrong change.
    ``dialect`` ("postgres", "spark" or "duckdb") picks only how that error is raised;
    ``server_types`` (column → the server's type name) overrides the catalog's types where
    known (a reflected catalog may not know a type such as ``xml``).
    """
    keys = list(table.primary_key)
    if not keys:
        raise CatalogError(f"table {table.name} has no primary key")
    others = list(table.non_key_columns)
    types = {c.name: c.type for c in table.columns} | dict(server_types or {})
    text = exp.DataType.build("TEXT")

    def grouped(c: str) -> exp.Expr:
        return exp.cast(_col(c), text) if _without_equality(types[c]) else _col(c)

    def window(func: exp.Expr, by: Sequence[exp.Expr], order: exp.Expr | None = None,
               whole: bool = False) -> exp.Window:
        w = exp.Window(this=func, partition_by=[e.copy() for e in by])
        if order is not None:
            w.set("order", exp.Order(expressions=[exp.Ordered(this=order.copy())]))
        if whole:
            w.set("spec", exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
                                         end="UNBOUNDED", end_side="FOLLOWING"))
        return w

    net, rn, lo, hi, n = "__idivm_net", "__idivm_rn", "__idivm_lo", "__idivm_hi", "__idivm_n"
    one = exp.Literal.number(1)
    minus_one = exp.Literal.number(-1)
    sub1, sub = "__idivm_images", "__idivm_fold"
    # 1. per (key, image): its net count, and one row standing for it
    image = [*[_col(k) for k in keys], *[grouped(c) for c in others]]
    sign = exp.Case(ifs=[exp.If(this=exp.EQ(this=_col(OP),
                                            expression=exp.Literal.string(OP_INSERT)),
                                true=one.copy())], default=minus_one.copy())
    if any(_without_equality(types[c]) for c in others):
        # a window per image: its rows carry the values themselves
        images = (
            exp.select(
                *[_col(c) for c in [*keys, *others]],
                exp.alias_(window(exp.Sum(this=sign), image), net, quoted=True),
                # (any row of an image stands for it: PostgreSQL's log has no order column;
                # Spark's ROW_NUMBER needs one, and its change feed has __seq)
                exp.alias_(window(exp.RowNumber(), image,
                                  None if dialect == "postgres" else _col(SEQ)), rn, quoted=True),
            )
            .from_(log.copy())
            .where(where.copy())
        )
        kept = exp.and_(exp.EQ(this=_col(rn, sub1), expression=one.copy()),
                        exp.NEQ(this=_col(net, sub1), expression=exp.Literal.number(0)))
    else:
        # (a hashed grouping, no sort of the log by whole rows)
        images = (
            exp.select(*[_col(c) for c in [*keys, *others]],
                       exp.alias_(exp.Sum(this=sign), net, quoted=True))
            .from_(log.copy())
            .where(where.copy())
            .group_by(*image)
            .having(exp.NEQ(this=exp.Sum(this=sign.copy()), expression=exp.Literal.number(0)))
        )
        kept = None
    # 2. per key, over its images that did not cancel (the −1 one sorts first)
    by_key = [_col(k) for k in keys]
    netcol = _col(net)
    per_key = (
        exp.select(
            *[_col(k) for k in keys],
            *[exp.alias_(window(exp.FirstValue(this=_col(c)), by_key, netcol, whole=True),
                         f"__idivm_f{i}", quoted=True) for i, c in enumerate(others)],
            *[exp.alias_(window(exp.LastValue(this=_col(c)), by_key, netcol, whole=True),
                         f"__idivm_l{i}", quoted=True) for i, c in enumerate(others)],
            # (one window: the same frame as the images')
            exp.alias_(window(exp.Min(this=netcol.copy()), by_key, netcol, whole=True), lo,
                       quoted=True),
            exp.alias_(window(exp.Max(this=netcol.copy()), by_key, netcol, whole=True), hi,
                       quoted=True),
            exp.alias_(window(exp.Count(this=exp.Star()), by_key, netcol, whole=True), n,
                       quoted=True),
            exp.alias_(window(exp.RowNumber(), by_key, netcol), rn, quoted=True),
        )
        .from_(exp.Subquery(this=images, alias=exp.TableAlias(this=_ident(sub1))))
    )
    if kept is not None:
        per_key = per_key.where(kept)

    has_pre = exp.EQ(this=_col(lo, sub), expression=minus_one.copy())
    has_post = exp.EQ(this=_col(hi, sub), expression=one.copy())

    def image_of(prefix: str, cond: exp.Expr, suffix: str) -> list[exp.Expr]:
        return [
            exp.alias_(
                exp.Case(ifs=[exp.If(this=cond.copy(), true=_col(f"{prefix}{i}", sub))]),
                f"{c}{suffix}",
                quoted=True,
            )
            for i, c in enumerate(others)
        ]

    inconsistent = exp.or_(
        exp.LT(this=_col(lo, sub), expression=minus_one.copy()),
        exp.GT(this=_col(hi, sub), expression=one.copy()),
        exp.GT(this=_col(n, sub), expression=exp.Literal.number(2)),
        exp.paren(exp.and_(exp.EQ(this=_col(n, sub), expression=exp.Literal.number(2)),
                           exp.EQ(this=_col(lo, sub), expression=_col(hi, sub)))),
    )
    key_text: list[exp.Expr] = []
    for i, k in enumerate(keys):
        key_text += [exp.Literal.string(", ")] if i else []
        key_text.append(exp.cast(_col(k, sub), text))
    message = exp.Concat(expressions=[
        exp.Literal.string(f"idivm: inconsistent change log of table {table.name} at key ("),
        *key_text,
        exp.Literal.string("): its logged row images do not add up to one row before and "
                           "one after (was the table changed with its logging triggers off, "
                           "or is its primary key not enforced?)")])
    check = exp.Case(ifs=[exp.If(this=inconsistent, true=_fail(message, dialect))],
                     default=exp.true())
    return (
        exp.select(
            *[_col(k, sub) for k in keys],
            *image_of("__idivm_f", has_pre, "__pre"),
            *image_of("__idivm_l", has_post, "__post"),
            exp.alias_(has_pre.copy(), HAS_PRE, quoted=True),
            exp.alias_(has_post.copy(), HAS_POST, quoted=True),
        )
        .from_(exp.Subquery(this=per_key, alias=exp.TableAlias(this=_ident(sub))))
        .where(exp.and_(exp.EQ(this=_col(rn, sub), expression=one.copy()), check))
    )


@dataclass(frozen=True)
class KeyFold:
    """``fold_by_key``'s fold of a log into a relation, as statements run in order.

    ``first`` is the whole fold when ``rest`` is None. Otherwise ``first`` holds the rows of
    the keys a batch changed once and one *placeholder* row per key logged more often (its
    ``__has_pre`` NULL, which no change has); when the target has placeholders
    (``placeholders``), ``rest`` — ``fold_select`` over those keys' log rows, the keys read
    from the target's placeholders — is inserted into it and the placeholders deleted
    (``drop_placeholders``)."""

    first: exp.Query
    rest: exp.Query | None = None

    @staticmethod
    def placeholder() -> exp.Expr:
        """The condition a placeholder row meets."""
        return exp.Is(this=_col(HAS_PRE), expression=exp.null())

    @classmethod
    def placeholders(cls, target: exp.Table) -> exp.Select:
        """A query with a row when ``target`` holds a placeholder (for ``EXISTS``)."""
        return exp.select(exp.Literal.number(1)).from_(target.copy()).where(cls.placeholder())

    @classmethod
    def placeholder_index(cls, name: str, target: exp.Table, keys: Sequence[str]) -> str:
        """A partial index ``name`` of ``target``'s placeholder rows by ``keys``: writers of
        the fold's relation index only those few rows, and the test for them, the fold of
        their keys' log rows and their deletion read it rather than every row of the relation
        (a scratch relation's scans read the dead pages of its earlier runs too)."""
        return (f"CREATE INDEX {q(name)} ON {target.sql('postgres')} "
                f"({', '.join(q(k) for k in keys)}) WHERE {cls.placeholder().sql('postgres')}")

    @classmethod
    def drop_placeholders(cls, target: exp.Table) -> exp.Delete:
        """Delete ``target``'s placeholder rows."""
        return exp.delete(target.copy(), where=cls.placeholder())


def folds_by_key(table: Table, server_types: Mapping[str, str] | None = None) -> bool:
    """Whether ``fold_by_key`` folds ``table``'s log in two steps (a keyed grouping, then the
    keys logged more often): it has a key, and every other column an equality."""
    types = {c.name: c.type for c in table.columns} | dict(server_types or {})
    return bool(table.primary_key) and not any(_without_equality(types[c])
                                               for c in table.non_key_columns)


def fold_by_key(table: Table, log: exp.Expr, where: exp.Expr, companion: str,
                target: exp.Table, server_types: Mapping[str, str] | None = None,
                again: exp.Expr | None = None) -> KeyFold:
    """``fold_select``'s result (PostgreSQL) into ``target``: by one hashed grouping of the
    log by key for the keys a batch changes once — one row logged (an insert or a delete), or
    two (a 'D' and an 'I': an update, left out when both images are equal) — and
    ``fold_select``'s netting over row images only for the keys logged more often (changed
    again in the batch, or by nested statements), which also checks those (``KeyFold``: the
    grouping leaves a placeholder row in ``target`` per such key, whose log rows a second
    statement folds). The images of a key changed once are its log rows themselves, so the
    two folds agree; the common case skips ``fold_select``'s grouping by whole images and its
    sort by key, and the grouping is read once, as it is made (read by two parts of one
    statement, it would be materialized first). Tables with a column without equality fold
    by ``fold_select`` alone (the update test compares images). A key's images are its
    columns' values in its one 'D' and one 'I' row, by ``companion``'s ``first_image``
    aggregate (its value for the keys logged more often is not used). ``again``: the
    condition on the log rows of those keys (default ``where``) — any the rows ``where``
    keeps meet, weaker where ``where`` is costly per row: their fold is then of more of their
    images, which is exact as long as each image left out could not matter (the fold's
    semijoins, ``postgres.compile.fold_visible``)."""
    if not folds_by_key(table, server_types):
        return KeyFold(fold_select(table, log, where, server_types=server_types))
    keys, others = list(table.primary_key), list(table.non_key_columns)
    op = _col(OP)
    is_d = exp.EQ(this=op, expression=exp.Literal.string(OP_DELETE))
    is_i = exp.EQ(this=op, expression=exp.Literal.string(OP_INSERT))
    n, nd, k = "__idivm_n", "__idivm_nd", "__idivm_k"

    def image(c: str, cond: exp.Expr) -> exp.Expr:
        first = exp.Dot(this=_ident(companion),
                        expression=exp.Anonymous(this=FIRST_IMAGE, expressions=[_col(c)]))
        return exp.Filter(this=first, expression=exp.Where(this=cond.copy()))

    per_key = (exp.select(*[_col(c) for c in keys],
                          exp.alias_(exp.Count(this=exp.Star()), n, quoted=True),
                          exp.alias_(exp.Filter(this=exp.Count(this=exp.Star()),
                                                expression=exp.Where(this=is_d.copy())),
                                     nd, quoted=True),
                          *[exp.alias_(image(c, is_d), f"{c}__pre", quoted=True) for c in others],
                          *[exp.alias_(image(c, is_i), f"{c}__post", quoted=True)
                            for c in others])
               .from_(log.copy()).where(where.copy()).group_by(*[_col(c) for c in keys]))
    one = exp.Literal.number(1)
    two = exp.Literal.number(2)
    changed = exp.NullSafeNEQ(
        this=exp.Tuple(expressions=[_col(f"{c}__pre") for c in others]),
        expression=exp.Tuple(expressions=[_col(f"{c}__post") for c in others])) \
        if others else exp.false()
    once = exp.or_(exp.EQ(this=_col(n), expression=one.copy()),
                   exp.and_(exp.EQ(this=_col(n), expression=two.copy()),
                            exp.EQ(this=_col(nd), expression=one.copy()), changed))
    # the keys logged more often: a placeholder row each
    more = exp.GT(this=_col(n), expression=two.copy()) if not others else exp.or_(
        exp.GT(this=_col(n), expression=two.copy()),
        exp.and_(exp.EQ(this=_col(n), expression=two.copy()),
                 exp.NEQ(this=_col(nd), expression=one.copy())))

    def flag(value: exp.Expr, name: str) -> exp.Expr:
        return exp.alias_(exp.Case(ifs=[exp.If(this=exp.paren(more.copy()), true=exp.null())],
                                   default=value), name, quoted=True)

    first = (exp.select(*[_col(c) for c in keys],
                        *[_col(f"{c}__pre") for c in others],
                        *[_col(f"{c}__post") for c in others],
                        flag(exp.EQ(this=_col(nd), expression=one.copy()), HAS_PRE),
                        flag(exp.EQ(this=exp.paren(exp.Sub(this=_col(n), expression=_col(nd))),
                                    expression=one.copy()), HAS_POST))
             .from_(exp.Subquery(this=per_key, alias=exp.TableAlias(this=_ident(k))))
             .where(exp.or_(exp.paren(once), exp.paren(more))))
    logged_more = exp.In(
        this=exp.Tuple(expressions=[_col(c) for c in keys]),
        query=exp.Subquery(this=exp.select(*[_col(c) for c in keys]).from_(target.copy())
                           .where(KeyFold.placeholder())))
    rest = fold_select(table, log, exp.and_((where if again is None else again).copy(),
                                            logged_more), server_types=server_types)
    return KeyFold(first, rest)


def log_images(table: Table, log: exp.Expr, where: exp.Expr) -> exp.Select:
    """The pending log rows in a change table's columns, unfolded: each row one image — an
    'I' row a post-image (``X__post``, ``__has_post``), a 'D' row a pre-image (``X__pre``,
    ``__has_pre``), its values under both names (a reader of the shape
    ``planner.linear`` checks reads only the side its flag selects). What a change table
    read only by sums of per-image contributions reads instead of the fold."""
    others = list(table.non_key_columns)
    op = _col(OP)
    return (exp.select(*[_col(c) for c in table.primary_key],
                       *[exp.alias_(_col(c), f"{c}__pre", quoted=True) for c in others],
                       *[exp.alias_(_col(c), f"{c}__post", quoted=True) for c in others],
                       exp.alias_(exp.EQ(this=op.copy(), expression=exp.Literal.string(OP_DELETE)),
                                  HAS_PRE, quoted=True),
                       exp.alias_(exp.EQ(this=op.copy(), expression=exp.Literal.string(OP_INSERT)),
                                  HAS_POST, quoted=True))
            .from_(log.copy()).where(where.copy()))


def log_ref(schema: str, table_name: str) -> exp.Table:
    """The log of ``table_name`` as a sqlglot table reference."""
    return exp.Table(this=_ident(log_table_name(table_name)),
                     db=_ident(companion_schema(schema)))


def fold_into_temp(
    conn: psycopg.Connection, schema: str, table: Table, view: str, target: str,
    by_key: bool = False,
) -> int:
    """Materialize ``view``'s pending effective changes of ``table`` (the log rows this
    transaction's snapshot sees and the view's watermark does not) into temp table ``target``
    by ``fold_select`` (``by_key``: by ``fold_by_key``, as compiled maintenance folds);
    returns the number of keys. Used by tests and tools; maintenance runs compiled code."""
    prev = snapshot_literal(watermark(conn, schema, table.name, view))
    log, pending = log_ref(schema, table.name), pending_predicate(prev)
    into = exp.Table(this=_ident(target), db=_ident("pg_temp"))
    select = fold_select(table, log, pending)
    steps = fold_by_key(table, log, pending, companion_schema(schema), into) if by_key else \
        KeyFold(select)
    conn.execute(f"DROP TABLE IF EXISTS pg_temp.{q(target)}")
    # (shaped by fold_select either way; filled as compiled maintenance fills its relation)
    conn.execute(f"CREATE TEMP TABLE {q(target)} AS {select.sql('postgres')} WITH NO DATA")
    conn.execute(exp.insert(steps.first, into).sql("postgres"))
    if steps.rest is not None and conn.execute(
            f"SELECT EXISTS ({KeyFold.placeholders(into).sql('postgres')})").fetchone() == (True,):
        conn.execute(exp.insert(steps.rest, into).sql("postgres"))
        conn.execute(KeyFold.drop_placeholders(into).sql("postgres"))
    row = conn.execute(f"SELECT count(*) FROM pg_temp.{q(target)}").fetchone()
    return int(row[0]) if row else 0


# --------------------------------------------------------------------------- DDL guard

def _guard_body() -> str:
    text = (Path(__file__).parent / "guard.sql").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    for key, value in (("first", lit(TRIGGERS[0])),
                       ("triggers", ", ".join(lit(t) for t in TRIGGERS)),
                       ("reserved", ", ".join(lit(c) for c in RESERVED))):
        body = body.replace(f"%({key})s", value)
    return body


def lock_guard(conn: psycopg.Connection, function: str) -> str | None:
    """Take the guard schema's installation lock (for the transaction) and return the source
    of its function ``function`` (None: not there)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))
    row = conn.execute(
        "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = %s", (GUARD_SCHEMA, function)).fetchone()
    return str(row[0]) if row else None


def install_guard(conn: psycopg.Connection) -> bool:
    """Install the database-wide DDL guard (an event trigger at ``ddl_command_end``); returns
    False when the role may not create event triggers (superusers only) — maintenance still
    detects the change then, by the catalog fingerprint its compiled code checks."""
    body = _guard_body()
    try:
        with conn.transaction():
            current = lock_guard(conn, GUARD_FUNCTION)
            if current != body:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(GUARD_SCHEMA)}")
                conn.execute(
                    f"CREATE OR REPLACE FUNCTION {_qualified(GUARD_SCHEMA, GUARD_FUNCTION)}() "
                    f"RETURNS event_trigger LANGUAGE plpgsql AS {dollar_quote(body)}")
            row = conn.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = %s",
                               (GUARD_TRIGGER,)).fetchone()
            if row is None:
                conn.execute(
                    f"CREATE EVENT TRIGGER {q(GUARD_TRIGGER)} ON ddl_command_end "
                    "WHEN TAG IN ('ALTER TABLE') "
                    f"EXECUTE FUNCTION {_qualified(GUARD_SCHEMA, GUARD_FUNCTION)}()")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True
