-- name: lane sequences: problems view, repair under a short lock timeout
--
-- Lane sequences are `lane_seq_<lane_id>` in the schema ('lane_seq_' below).
-- The repairs wait at most 300 ms for a lock (lock_timeout '300ms') before reporting the
-- sequence busy: ALTER SEQUENCE ... OWNER takes ACCESS EXCLUSIVE, which queues behind every
-- producer that has used the sequence in a still-open transaction, and every later nextval would
-- queue behind it.
-- The role every lane sequence must belong to is the owner of provision_lane(text,smallint,smallint):
-- provision_lane runs as it and creates them, and append_ready (same owner, same migration) runs
-- as it and calls nextval on them.

-- Recreate a lane's missing sequence, as the definer role (so it is owned right), starting past
-- every lane_seq the lane has used: the claim cursor is max(leases.lane_seq), so a new entry
-- numbered at or below it would never be claimed. The lane lock keeps appends out meanwhile.
-- Returns 'created', 'ok' (it exists), 'not_found' (no such lane) or 'busy' (a lock was not
-- granted within the timeout; nothing changed).
CREATE FUNCTION {{schema}}.provision_lane_sequence(p_lane integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET lock_timeout = '300ms' AS $fn$
DECLARE v_next bigint;
BEGIN
  IF p_lane IS NULL THEN
    RAISE EXCEPTION 'berth: provision_lane_sequence lane must not be null' USING ERRCODE = '22004';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.lanes WHERE lane_id = p_lane) THEN RETURN 'not_found'; END IF;
  BEGIN
    PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
    IF to_regclass(format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)) IS NOT NULL THEN
      RETURN 'ok';
    END IF;
    v_next := greatest(
      coalesce((SELECT max(r.lane_seq) FROM {{schema}}.ready r WHERE r.lane_id = p_lane), 0),
      coalesce((SELECT max(l.lane_seq) FROM {{schema}}.leases l WHERE l.lane_id = p_lane), 0)) + 1;
    EXECUTE format('CREATE SEQUENCE %I.%I START WITH %s', {{schema_literal}}, 'lane_seq_' || p_lane, v_next);
    RETURN 'created';
  EXCEPTION WHEN lock_not_available THEN
    RETURN 'busy';
  END;
END $fn$;

-- Repair one lane's sequence with the caller's own rights (SECURITY INVOKER: reassigning a
-- sequence needs its current owner's rights, which the definer role usually lacks). Call it as
-- its own statement outside a transaction: ALTER ... OWNER holds ACCESS EXCLUSIVE on the
-- sequence until commit, and every append to the lane waits behind it.
-- Returns 'reassigned', 'created', 'ok', 'not_found', 'busy' or 'not_permitted'.
CREATE FUNCTION {{schema}}.repair_lane_sequence(p_lane integer)
RETURNS text LANGUAGE plpgsql SECURITY INVOKER
SET search_path = pg_catalog, pg_temp SET lock_timeout = '300ms' AS $fn$
DECLARE v_seq regclass; v_want name;
BEGIN
  IF p_lane IS NULL THEN
    RAISE EXCEPTION 'berth: repair_lane_sequence lane must not be null' USING ERRCODE = '22004';
  END IF;
  v_want := (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p WHERE p.oid = {{qualified_literal:provision_lane(text,smallint,smallint)}}::regprocedure);
  v_seq := to_regclass(format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane));
  IF v_seq IS NULL THEN
    BEGIN
      RETURN {{schema}}.provision_lane_sequence(p_lane);
    EXCEPTION WHEN insufficient_privilege THEN
      RETURN 'not_permitted';
    END;
  END IF;
  IF (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = v_seq) = v_want THEN
    RETURN 'ok';
  END IF;
  BEGIN
    EXECUTE format('ALTER SEQUENCE %I.%I OWNER TO %I', {{schema_literal}}, 'lane_seq_' || p_lane, v_want);
  EXCEPTION
    WHEN lock_not_available THEN RETURN 'busy';
    WHEN insufficient_privilege THEN RETURN 'not_permitted';
  END;
  RETURN 'reassigned';
END $fn$;

-- Every lane whose sequence is missing, and every lane sequence not owned by the definer role,
-- with the login roles able to repair it and the statement they would run. Reassigning needs
-- (PostgreSQL 15) the rights of the current owner, membership in the new owner, and CREATE on
-- the schema for the new owner; superusers need none of it. Recreating needs EXECUTE on
-- provision_lane_sequence.
CREATE VIEW {{schema}}.lane_sequence_problems AS
WITH want AS (
  SELECT p.proowner AS owner, p.pronamespace AS nsp FROM pg_catalog.pg_proc p
   WHERE p.oid = {{qualified_literal:provision_lane(text,smallint,smallint)}}::regprocedure
), seqs AS (
  SELECT c.relowner, substr(c.relname, length('lane_seq_') + 1)::bigint AS n
    FROM pg_catalog.pg_class c, want w
   WHERE c.relnamespace = w.nsp AND c.relkind = 'S'
     AND c.relname ~ ('^' || 'lane_seq_' || '[1-9][0-9]{0,9}$')
), problems AS (
  SELECT coalesce(l.lane_id, q.n::integer) AS lane_id,
         CASE WHEN q.n IS NULL THEN 'missing' ELSE 'wrong_owner' END AS problem,
         q.relowner
    FROM {{schema}}.lanes l
    FULL JOIN (SELECT * FROM seqs WHERE n <= 2147483647) q ON q.n = l.lane_id
   WHERE q.n IS NULL OR q.relowner <> (SELECT owner FROM want)
)
SELECT p.lane_id,
       'lane_seq_' || p.lane_id AS sequence_name,
       p.problem,
       pg_catalog.pg_get_userbyid(p.relowner)::text AS current_owner,
       pg_catalog.pg_get_userbyid(w.owner)::text AS expected_owner,
       ARRAY(SELECT r.rolname::text FROM pg_catalog.pg_roles r
              WHERE r.rolcanlogin
                AND CASE WHEN p.problem = 'missing'
                         THEN has_function_privilege(r.oid, {{qualified_literal:provision_lane_sequence(integer)}}::regprocedure, 'EXECUTE')
                         ELSE r.rolsuper
                              OR (pg_has_role(r.oid, p.relowner, 'USAGE')
                                  AND pg_has_role(r.oid, w.owner, 'MEMBER')
                                  AND has_schema_privilege(w.owner, w.nsp, 'CREATE')) END
              ORDER BY r.rolname) AS repair_roles,
       CASE WHEN p.problem = 'missing'
            THEN format('SELECT %I.provision_lane_sequence(%s)', {{schema_literal}}, p.lane_id)
            ELSE format('ALTER SEQUENCE %I.%I OWNER TO %I', {{schema_literal}}, 'lane_seq_' || p.lane_id,
                        pg_catalog.pg_get_userbyid(w.owner)) END AS repair_statement
  FROM problems p CROSS JOIN want w;

-- Operators only (see migration 3).
REVOKE EXECUTE ON FUNCTION {{schema}}.provision_lane_sequence(integer), {{schema}}.repair_lane_sequence(integer) FROM PUBLIC;
