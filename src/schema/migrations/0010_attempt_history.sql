-- name: attempt history: every attempt's end, append-only, in a ring of partitions truncated by age
--
-- Issue 13, item 1. Each settling statement (complete, Dequeue, fail, release, AdvanceCursor,
-- rescue) also inserts what the attempt was into `attempt_history`, in the same statement, so
-- there is no extra round trip and nothing is written when the settlement loses its fence.
-- Successes are written compactly: one row per (range lease, task type, id bucket) of a
-- completion flush, the tasks as arrays (ids, attempts, created, handler ms); everything else
-- is one row per task with its error (message, stack, cause chain as JSON) or its cursor.
-- Measured cost: docs/benchmarks.md, "Attempt history cost".
--
-- Storage is append-only: rows are never updated or deleted. `history_state.part_count`
-- partitions form a ring; writers insert into `current_part`, and the maintenance leader's
-- `rotate_history()` truncates the next partition and makes it current once the current one is
-- `retention / (part_count - 1)` old. A row therefore lives at least the retention and at most
-- part_count / (part_count - 1) of it (8/7 at 8 partitions), plus one branch interval.
--
-- The setting is schema-wide because producers (getTask), workers (the writes) and the leader
-- (the rotation) must agree on it: `enabled = false` stops the writes (rows already kept age
-- out as before); `retention_ms` sets the rotation.

CREATE TABLE {{schema}}.history_state (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  enabled boolean NOT NULL DEFAULT true,
  retention_ms double precision NOT NULL DEFAULT 86400000 CHECK (retention_ms >= 1000),
  part_count smallint NOT NULL DEFAULT 8 CHECK (part_count >= 3),
  current_part smallint NOT NULL DEFAULT 0,
  generation bigint NOT NULL DEFAULT 0,
  rotated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{schema}}.history_state DEFAULT VALUES;

-- One row per attempt that ended (or, for successes, per group of them settled together).
-- bucket = id >> 10 of every task in the row: the point read by task id is one btree probe plus
-- an `= ANY (ids)` recheck. lane_id gives queue, priority and shard (lanes are never deleted).
-- outcome is seed 000's: success, failure, timeout, continued, cancelled, lost (a lapsed lease
-- rescued). run_ms: the handler's run time per task (NULL when it did not run or is not known).
CREATE TABLE {{schema}}.attempt_history (
  part smallint NOT NULL,
  bucket bigint NOT NULL,
  settled_at timestamptz NOT NULL DEFAULT now(),
  outcome text NOT NULL,
  lane_id integer NOT NULL,
  type text NOT NULL,
  worker text,
  claimed_at timestamptz NOT NULL,
  ids bigint[] NOT NULL,
  attempts integer[] NOT NULL,
  created_at timestamptz[] NOT NULL,
  run_ms integer[],
  error jsonb,
  cursor jsonb,
  dead boolean NOT NULL DEFAULT false
) PARTITION BY LIST (part);
CREATE INDEX ON {{schema}}.attempt_history (bucket);
CREATE INDEX ON {{schema}}.attempt_history (settled_at);

DO $do$
DECLARE v_part integer;
BEGIN
  FOR v_part IN 0..7 LOOP
    EXECUTE format('CREATE TABLE %1$I.%2$I PARTITION OF %1$I.attempt_history FOR VALUES IN (%3$s)',
                   {{schema_literal}}, 'attempt_history_' || v_part, v_part);
  END LOOP;
END $do$;

-- The leader's rotation. Serialised on the state row; the partition to reclaim is taken under a
-- short lock timeout (a reader scanning it reports 'blocked', tried again next run). Writers
-- only ever insert into the current partition, so the truncate never waits for the task path.
CREATE FUNCTION {{schema}}.rotate_history(p_lock_timeout_ms integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  st record;
  v_next smallint;
  v_old_timeout text := current_setting('lock_timeout');
BEGIN
  IF p_lock_timeout_ms IS NULL THEN
    RAISE EXCEPTION 'berth: rotate_history argument must not be null' USING ERRCODE = '22004';
  END IF;
  SELECT * INTO st FROM {{schema}}.history_state FOR UPDATE;
  IF now() < st.rotated_at + make_interval(secs => st.retention_ms / 1000.0 / (st.part_count - 1)) THEN
    RETURN 'not_due';
  END IF;
  v_next := (st.current_part + 1) % st.part_count;
  PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1) || 'ms', true);
  BEGIN
    EXECUTE format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', {{schema_literal}}, 'attempt_history_' || v_next);
  EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', v_old_timeout, true);
    RETURN 'blocked';
  END;
  PERFORM set_config('lock_timeout', v_old_timeout, true);
  EXECUTE format('TRUNCATE %I.%I', {{schema_literal}}, 'attempt_history_' || v_next);
  UPDATE {{schema}}.history_state
     SET current_part = v_next, generation = generation + 1, rotated_at = now();
  RETURN 'rotated';
END $fn$;
REVOKE EXECUTE ON FUNCTION {{schema}}.rotate_history(integer) FROM PUBLIC;

-- Existing roles: workers write history and rotate it; producers read it (getTask).
DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:prune_slot(smallint,integer)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT ON %1$I.attempt_history TO %2$I', {{schema_literal}}, v_role);
    EXECUTE format('GRANT SELECT ON %1$I.history_state TO %2$I', {{schema_literal}}, v_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.rotate_history(integer) TO %2$I', {{schema_literal}}, v_role);
  END LOOP;
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:enqueue(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[])}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT SELECT ON %1$I.attempt_history, %1$I.history_state, %1$I.lanes TO %2$I',
                   {{schema_literal}}, v_role);
  END LOOP;
END $do$;
