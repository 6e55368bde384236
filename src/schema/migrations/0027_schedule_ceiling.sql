-- name: schedule ceiling: a schedule may shorten its task type's ceiling for the tasks it fires
--
-- `schedules.ceiling_ms`: the handler's ceiling for the tasks a schedule fires (and its
-- triggers), NULL for the task type's own. It may only shorten the type's ceiling, never lengthen
-- it: the claim stamps the lease from the claiming worker's ceiling for the type (now() +
-- ceiling + margin), which is also the crash-recovery wait, and the claim does not change. The
-- worker running such a task reads the column (a point read by name, cached for 30 s) and brings
-- the handler's deadline forward from that same stamp by the difference between the two ceilings.
--
-- A worker of the previous version neither writes nor reads the column: its declaration leaves
-- the stored ceiling as it was, and the tasks it runs keep their type's deadline.
--
-- A role that may update a schedule's declaration (a worker role: UPDATE on its columns, by
-- column) gets the new column too, so a worker of this version can upsert its declaration on a
-- role granted before this migration without a regrant.

ALTER TABLE {{schema}}.schedules ADD COLUMN ceiling_ms integer CHECK (ceiling_ms >= 1);

DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_attribute att
      JOIN pg_class c ON c.oid = att.attrelid,
           aclexplode(att.attacl) a
     WHERE att.attrelid = {{qualified_literal:schedules}}::regclass AND att.attname = 'cron'
       AND a.privilege_type = 'UPDATE' AND a.grantee <> 0 AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT UPDATE (ceiling_ms) ON %1$I.schedules TO %2$I', {{schema_literal}}, v_role);
  END LOOP;
END $do$;
