-- idivm's DDL guard: body of the event trigger function at ddl_command_end (ALTER TABLE), and
-- at table_rewrite (ALTER TABLE rewriting a table: a column retyped, maybe to its own type,
-- USING an expression that changes its values behind the change log).
-- %(first)s, %(triggers)s and %(reserved)s are filled in by changelog._guard_body().
DECLARE
  cmd record;
  raw bytea;
  log_name text;
  tbl_name text;
  bad text;
BEGIN
  IF TG_EVENT = 'table_rewrite' THEN
    -- 4: a column rewrite (not 1, 2, 8: persistence, a column added with a volatile default,
    -- the access method, which keep every value); a logged column retyped in this statement
    -- has its pg_attribute row written by this transaction (age <= 0: by it or later)
    IF pg_event_trigger_table_rewrite_reason() & 4 = 0 THEN
      RETURN;
    END IF;
    SELECT t.tgargs INTO raw FROM pg_trigger t
     WHERE t.tgrelid = pg_event_trigger_table_rewrite_oid() AND t.tgname = %(first)s
       AND t.tgnargs >= 2;
    IF NOT FOUND THEN
      RETURN;  -- not a table idivm logs
    END IF;
    log_name := convert_from(substring(raw FROM 1 FOR position(decode('00', 'hex') IN raw) - 1),
                             current_setting('server_encoding'));
    SELECT min(b.attname) INTO bad FROM pg_attribute b
     WHERE b.attrelid = pg_event_trigger_table_rewrite_oid() AND b.attnum > 0
       AND NOT b.attisdropped AND age(b.xmin) <= 0
       AND EXISTS (SELECT 1 FROM pg_attribute l
                    WHERE l.attrelid = to_regclass(log_name) AND l.attnum > 0
                      AND NOT l.attisdropped AND l.attname = b.attname);
    IF bad IS NOT NULL THEN
      RAISE EXCEPTION 'idivm: column "%" of table % is read by incrementally maintained views; rewriting its values (ALTER COLUMN ... TYPE ... USING) would leave them wrong', bad, pg_event_trigger_table_rewrite_oid()::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views that read it first (drop_view), alter the table, then create them again; or change the values with an UPDATE, which is logged (a column altered earlier in this transaction counts as retyped: alter it in a transaction of its own)';
    END IF;
    RETURN;
  END IF;
  FOR cmd IN SELECT DISTINCT objid FROM pg_event_trigger_ddl_commands()
             WHERE classid = 'pg_class'::regclass LOOP
    SELECT t.tgargs INTO raw FROM pg_trigger t
     WHERE t.tgrelid = cmd.objid AND t.tgname = %(first)s AND t.tgnargs >= 2;
    IF NOT FOUND THEN
      CONTINUE;  -- not a table idivm logs
    END IF;
    -- the log's and the table's quoted names, each ended by a zero byte, in the server's
    -- encoding (split as bytes: encode(..., 'escape') escapes non-ASCII and backslashes)
    log_name := convert_from(substring(raw FROM 1 FOR position(decode('00', 'hex') IN raw) - 1),
                             current_setting('server_encoding'));
    raw := substring(raw FROM position(decode('00', 'hex') IN raw) + 1);
    tbl_name := convert_from(substring(raw FROM 1 FOR position(decode('00', 'hex') IN raw) - 1),
                             current_setting('server_encoding'));
    SELECT min(t.tgname) INTO bad FROM pg_trigger t
     WHERE t.tgrelid = cmd.objid AND t.tgname IN (%(triggers)s) AND t.tgenabled <> 'A';
    IF bad IS NOT NULL THEN
      RAISE EXCEPTION 'idivm: trigger % on % logs changes for incrementally maintained views; it must stay enabled', bad, cmd.objid::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views over this table first (drop_view), or keep the trigger enabled (ENABLE ALWAYS TRIGGER)';
    END IF;
    IF to_regclass(tbl_name) IS DISTINCT FROM cmd.objid THEN
      RAISE EXCEPTION 'idivm: table % is read by incrementally maintained views; renaming it or moving it to another schema is not supported', cmd.objid::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views over this table first (drop_view), then create them again';
    END IF;
    SELECT min(l.attname) INTO bad FROM pg_attribute l
     WHERE l.attrelid = to_regclass(log_name)
       AND l.attnum > 0 AND NOT l.attisdropped AND l.attname NOT IN (%(reserved)s)
       AND NOT EXISTS (SELECT 1 FROM pg_attribute b
                        WHERE b.attrelid = cmd.objid AND b.attnum > 0 AND NOT b.attisdropped
                          AND b.attname = l.attname AND b.atttypid = l.atttypid
                          AND b.atttypmod = l.atttypmod);
    IF bad IS NOT NULL THEN
      RAISE EXCEPTION 'idivm: column "%" of table % is read by incrementally maintained views; dropping, renaming or retyping it would leave them wrong', bad, cmd.objid::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views that read it first (drop_view), alter the table, then create them again';
    END IF;
    -- the key the log is folded by: a primary key or unique index over logged NOT NULL
    -- columns must remain (dropped, a duplicate key would be folded as one row)
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i
         WHERE i.indrelid = cmd.objid AND i.indisunique AND i.indisvalid
           AND i.indpred IS NULL AND i.indexprs IS NULL
           AND NOT EXISTS (
             SELECT 1 FROM pg_attribute b
              WHERE b.attrelid = cmd.objid
                AND b.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])
                AND (NOT (b.attnotnull OR i.indnullsnotdistinct)
                     OR NOT EXISTS (SELECT 1 FROM pg_attribute l
                                     WHERE l.attrelid = to_regclass(log_name)
                                       AND l.attname = b.attname AND NOT l.attisdropped)))) THEN
      RAISE EXCEPTION 'idivm: table % is read by incrementally maintained views; it must keep its primary key (or a unique index over the same columns)', cmd.objid::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views over this table first (drop_view), then create them again';
    END IF;
  END LOOP;
END
