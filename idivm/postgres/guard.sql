-- idivm's DDL guard: body of the event trigger function at ddl_command_end (ALTER TABLE).
-- %(first)s, %(triggers)s and %(reserved)s are filled in by changelog._guard_body().
DECLARE
  cmd record;
  args text;
  bad text;
BEGIN
  FOR cmd IN SELECT DISTINCT objid FROM pg_event_trigger_ddl_commands()
             WHERE classid = 'pg_class'::regclass LOOP
    SELECT encode(t.tgargs, 'escape') INTO args FROM pg_trigger t
     WHERE t.tgrelid = cmd.objid AND t.tgname = %(first)s AND t.tgnargs >= 2;
    IF NOT FOUND THEN
      CONTINUE;  -- not a table idivm logs
    END IF;
    SELECT min(t.tgname) INTO bad FROM pg_trigger t
     WHERE t.tgrelid = cmd.objid AND t.tgname IN (%(triggers)s) AND t.tgenabled <> 'A';
    IF bad IS NOT NULL THEN
      RAISE EXCEPTION 'idivm: trigger % on % logs changes for incrementally maintained views; it must stay enabled', bad, cmd.objid::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views over this table first (drop_view), or keep the trigger enabled (ENABLE ALWAYS TRIGGER)';
    END IF;
    IF to_regclass(split_part(args, '\000', 2)) IS DISTINCT FROM cmd.objid THEN
      RAISE EXCEPTION 'idivm: table % is read by incrementally maintained views; renaming it or moving it to another schema is not supported', cmd.objid::regclass
        USING ERRCODE = 'object_in_use',
              HINT = 'drop the idivm views over this table first (drop_view), then create them again';
    END IF;
    SELECT min(l.attname) INTO bad FROM pg_attribute l
     WHERE l.attrelid = to_regclass(split_part(args, '\000', 1))
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
  END LOOP;
END
