"""The database's DDL, logged: a maintain re-checks its tables' catalogs only after some.

Every maintain checks that its base tables are still what the view was planned over (the
catalog fingerprint of ``compile._catalog_check``: columns and types, the logging triggers,
inheritance, the key, NOT NULL) — ~0.1 ms a table in a refresh of 1–8 ms (TPC-H SF 0.1 Q5,
six tables: 0.5 ms of its function's 7). Those catalogs change only by DDL, and DDL fires
event triggers: ``EPOCH_TRIGGER`` (``ddl_command_end`` and ``sql_drop``, ENABLE ALWAYS — also
in replica mode, where the guard's do not fire) inserts a row into ``DDL_LOG`` for every
command that touches an object other than a temporary relation (a temporary table inheriting
from another is logged: its parent gained a child; a drop is logged unless everything it
dropped was temporary — a session's scratch relations and ``CREATE TEMP TABLE … AS`` are not
the catalogs a view rests on —, and ``REFRESH MATERIALIZED VIEW`` is not: a materialized view
has no triggers, so it is no view's table). A row carries its transaction's id, as the change
logs do.

After a full check, the maintain keeps in its session (a setting, reverted with its
transaction if that aborts) the identity of the triggers and the snapshot it checked under;
its next maintain in the session checks again only if that identity differs (a trigger
dropped, disabled or re-created — ``ALTER EVENT TRIGGER`` fires no event trigger, but rewrites
its row) or if the log holds a row that snapshot did not see (a DDL that had not ended before
it — committed since, or still running, whose catalog changes the next check sees once it
commits). Usually the log's newest row is older than the snapshot's xmin, and nothing more is
read. Without the triggers (a role that may not create event triggers, or they were dropped)
every maintain checks, as before.

``install`` creates the log, the function and the trigger with the DDL guard (superusers
only; the function runs as its owner — the role whose DDL fires it may not write the log —
and every role may read the log). The log is pruned by the trigger itself: past
``PRUNE_EVERY`` rows, the older ones go and ``DDL_PRUNED`` records the newest transaction id
removed, which a session whose kept xmin is not past it answers with a full check.
"""

from __future__ import annotations

import psycopg

from idivm.postgres.changelog import GUARD_SCHEMA, dollar_quote, lit, lock_guard, q

EPOCH_FUNCTION = "ddl_epoch"
EPOCH_TRIGGER = "idivm_ddl_epoch"
EPOCH_DROP_TRIGGER = "idivm_ddl_epoch_drop"
DDL_LOG = "ddl_log"
DDL_PRUNED = "ddl_pruned"
PRUNE_EVERY = 10_000  # rows of the log kept; every so many, the older are deleted

_LOG = f"{q(GUARD_SCHEMA)}.{q(DDL_LOG)}"
_PRUNED = f"{q(GUARD_SCHEMA)}.{q(DDL_PRUNED)}"

# (the function's body: an error here would fail every DDL statement of the database, so it
# reads nothing but the event's own functions, the catalogs and its two tables)
_BODY = f"""DECLARE
  n bigint;  -- (idivm's DDL log: see idivm/postgres/ddl_epoch.py)
BEGIN
  IF TG_EVENT = 'sql_drop' THEN
    IF NOT EXISTS (SELECT FROM pg_event_trigger_dropped_objects() d
                    WHERE NOT d.is_temporary) THEN
      RETURN;
    END IF;
  ELSIF TG_TAG LIKE 'DROP %' THEN
    RETURN;  -- (what it dropped: at sql_drop)
  ELSIF TG_TAG = 'REFRESH MATERIALIZED VIEW' THEN
    RETURN;  -- (its rows only: a materialized view has no triggers, so is no view's table)
  ELSIF EXISTS (SELECT FROM pg_event_trigger_ddl_commands())
        AND NOT EXISTS (
          SELECT FROM pg_event_trigger_ddl_commands() c
           WHERE c.classid IS DISTINCT FROM 'pg_catalog.pg_class'::regclass
              OR NOT EXISTS (SELECT FROM pg_catalog.pg_class r
                              WHERE r.oid = c.objid AND r.relpersistence = 't')
              OR EXISTS (SELECT FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.objid)) THEN
    RETURN;  -- temporary relations only, none a child of another
  END IF;
  INSERT INTO {_LOG} (xid) VALUES (pg_current_xact_id()) RETURNING id INTO n;
  IF n % {PRUNE_EVERY} = 0 THEN
    UPDATE {_PRUNED} SET horizon = greatest(horizon, (SELECT max(d.xid) FROM {_LOG} d
                                                      WHERE d.id <= n - {PRUNE_EVERY}));
    DELETE FROM {_LOG} d WHERE d.id <= n - {PRUNE_EVERY};
  END IF;
END"""


def install(conn: psycopg.Connection) -> bool:
    """Create (or bring up to date) the DDL log, its function and its event triggers;
    False when the role may not create event triggers (superusers only)."""
    fn = f"{q(GUARD_SCHEMA)}.{q(EPOCH_FUNCTION)}"
    try:
        with conn.transaction():
            current = lock_guard(conn, EPOCH_FUNCTION)
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(GUARD_SCHEMA)}")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {_LOG} (id bigint GENERATED ALWAYS AS "
                         "IDENTITY PRIMARY KEY, xid xid8 NOT NULL)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {q(DDL_LOG + '_xid')} ON {_LOG} (xid)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {_PRUNED} (horizon xid8 NOT NULL)")
            conn.execute(f"INSERT INTO {_PRUNED} SELECT '0'::xid8 WHERE NOT EXISTS "
                         f"(SELECT FROM {_PRUNED})")
            if current != _BODY:
                # (as its owner: an event trigger runs as the role whose DDL fires it, which
                # may not write the log — its DDL would fail)
                conn.execute(f"CREATE OR REPLACE FUNCTION {fn}() RETURNS event_trigger "
                             "LANGUAGE plpgsql SECURITY DEFINER "
                             "SET search_path = pg_catalog, pg_temp "
                             f"AS {dollar_quote(_BODY)}")
            # every role's maintain reads them (transaction ids only)
            conn.execute(f"GRANT USAGE ON SCHEMA {q(GUARD_SCHEMA)} TO PUBLIC")
            conn.execute(f"GRANT SELECT ON {_LOG}, {_PRUNED} TO PUBLIC")
            for name, event in ((EPOCH_TRIGGER, "ddl_command_end"),
                                (EPOCH_DROP_TRIGGER, "sql_drop")):
                row = conn.execute("SELECT evtenabled FROM pg_event_trigger WHERE evtname = %s",
                                   (name,)).fetchone()
                if row is None:
                    conn.execute(f"CREATE EVENT TRIGGER {q(name)} ON {event} "
                                 f"EXECUTE FUNCTION {fn}()")
                if row is None or row[0] != "A":  # (in replica mode too)
                    conn.execute(f"ALTER EVENT TRIGGER {q(name)} ENABLE ALWAYS")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def identity_sql() -> str:
    """A SQL expression: the triggers' identity (NULL when either is missing or not enabled
    always): what a kept check rests on. (The log cannot be dropped while they are enabled:
    ``sql_drop`` would log its own drop into it and fail.)"""
    return (
        "(SELECT string_agg(e.oid::text || ':' || e.xmin::text, ',' ORDER BY e.evtname) "
        "FROM pg_catalog.pg_event_trigger e "
        f"WHERE e.evtname IN ({lit(EPOCH_TRIGGER)}, {lit(EPOCH_DROP_TRIGGER)}) "
        "AND e.evtenabled = 'A' HAVING count(*) = 2)")


def installed(conn: psycopg.Connection) -> bool:
    """Whether the database logs its DDL (``install`` ran): compiled code reads the log then."""
    row = conn.execute(
        "SELECT count(*) = 2 AND to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL "
        "FROM pg_event_trigger WHERE evtname IN (%s, %s)",
        (_LOG, _PRUNED, EPOCH_TRIGGER, EPOCH_DROP_TRIGGER)).fetchone()
    return bool(row and row[0])


# the newest log rows a check reads to tell whether its kept snapshot saw them: more at or
# past that snapshot's xmin, and the session checks again
VISIBLE_ROWS = 1000


def checked(setting: str, identity: str, seen: str, recheck: str, full_check: str) -> str:
    """PL/pgSQL: ``full_check`` only when the session's ``setting`` does not show a check
    after which no DDL can have committed (see the module); after it, the setting is kept:
    the triggers' identity and the snapshot checked under. The log's newest row (an index's
    last entry) before that snapshot's xmin — the common case — and none pruned past it:
    every DDL logged had ended before that snapshot, which saw it. Otherwise the rows at or
    past the xmin (the newest ``VISIBLE_ROWS``; more, and it checks) are each asked whether
    that snapshot saw them (a transaction open across some DDL keeps the xmin of later
    snapshots below it). One statement (~0.05 ms of a refresh, against ~0.1 ms a table for
    the check), in a block that checks whenever the log is gone. ``identity``, ``seen``
    (text) and ``recheck`` (boolean) are the function's variables."""
    return (
        "BEGIN\n"
        f"  {seen} := current_setting({lit(setting)}, true);\n"
        f"  SELECT g.id, g.id IS DISTINCT FROM split_part({seen}, '/', 1) OR (\n"
        f"      SELECT CASE WHEN coalesce((SELECT p.horizon FROM {_PRUNED} p) >= k.x, true)\n"
        "                  THEN true\n"
        # (the newest row by ORDER BY … LIMIT 1, not max(): a backward step of the xid index
        # whatever the table's statistics say — see compile's newest log row)
        f"                  WHEN coalesce((SELECT d.xid FROM {_LOG} d ORDER BY d.xid DESC "
        "LIMIT 1) < k.x, true)\n"
        "                  THEN false\n"
        f"                  ELSE (SELECT count(*) = {VISIBLE_ROWS}\n"
        "                                 OR coalesce(bool_or(NOT pg_visible_in_snapshot(z.xid, "
        "k.s)), false)\n"
        f"                        FROM (SELECT d.xid FROM {_LOG} d WHERE d.xid >= k.x\n"
        f"                              ORDER BY d.xid DESC LIMIT {VISIBLE_ROWS}) AS z) END\n"
        f"      FROM (SELECT c.s, pg_snapshot_xmin(c.s) AS x FROM (SELECT split_part({seen}, "
        "'/', 2)::pg_snapshot AS s) AS c) AS k)\n"
        f"    INTO {identity}, {recheck} FROM (SELECT {identity_sql()} AS id OFFSET 0) AS g;\n"
        "EXCEPTION WHEN undefined_table OR invalid_text_representation THEN\n"
        "  -- (the log dropped with the triggers; a setting not of this code's making)\n"
        f"  {identity} := NULL;\n"
        f"  {recheck} := true;\n"
        "END;\n"
        f"IF {recheck} THEN\n"
        + "\n".join("  " + line if line else line for line in full_check.splitlines())
        + f"\n  IF {identity} IS NOT NULL THEN\n"
        f"    PERFORM set_config({lit(setting)}, {identity} || '/' || "
        "pg_current_snapshot()::text, false);\n"
        "  END IF;\n"
        "END IF;")
