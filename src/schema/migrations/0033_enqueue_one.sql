-- name: enqueue_one(): one plain task in scalar arguments, the client's single enqueue
--
-- Issue 35 (a new session's first enqueue, 10.8 ms against graphile-worker's 7.0 as each opens
-- its producer). What a new session's first call costs the server, backend CPU from
-- /proc/<pid>/schedstat, medians of 25 new sessions on the 2-core development machine, each
-- session after `SELECT 1` (docs/benchmarks-journal.md, "Issue 35's twelfth round"):
--
--   the client's one-task statement, calling enqueue() (migration 32)    15.7-15.9 ms
--   the same statement calling a PL/pgSQL function that only returns    5.8-5.9 ms
--     of which loading PL/pgSQL into the backend (LOAD 'plpgsql')       3.3-3.8 ms
--   graphile-worker's add_job, after the query its makeWorkerUtils()    13.1-13.2 ms
--     runs first on that session
--   this function, through the client's statement below                 12.6 ms
--
-- enqueue() takes arrays, so its one-task path still resolves and plans the array checks
-- (array_ndims, cardinality, array_lower on five arrays) and the client's statement builds
-- one-element arrays and reads the answer back as an array. enqueue_one() takes the task as
-- scalars: the checks are a handful of comparisons, and it returns the id. It is the fast path
-- of enqueue() for a task with a type, a payload and at most a trace context (no run time,
-- delay, max_attempts, dedupe key or concurrency key), with enqueue()'s rules kept exactly:
--
-- * The checks: the same conditions as enqueue() on the same values. When one fails,
--   check_queue() and check_tasks() raise the error enqueue() raises for that task, in
--   enqueue()'s order (same message, same SQLSTATE); the null, shard and shards refusals are
--   enqueue()'s own RAISEs, repeated word for word (test/enqueue-one.test.ts compares every
--   refusal with enqueue()'s).
-- * The shard: the caller's, or the transaction id modulo the shard count, as enqueue().
-- * The lane: looked up by (queue, priority, shard); provision_lane() only for a new one.
-- * The append (docs/architecture.md, "Invariants" 1 and 2): the lane's advisory lock taken
--   first and held to commit, the task's position drawn from the lane's sequence under it, the
--   ring segment read from the epoch inside the INSERT and again after it, the row moved to the
--   current segment until two reads agree, one wake per lane (pg_notify folds duplicates).
--
-- enqueue() and everything it calls are unchanged: SQL callers, add_task, the bulk path and a
-- previous version's producers keep using them. Granted to every role that may run enqueue()
-- (below), and by src/schema/roles.ts to producers and workers from now on.

CREATE FUNCTION {{schema}}.enqueue_one(
  p_queue text, p_priority smallint, p_shard smallint, p_shards smallint, p_type text, p_payload jsonb,
  p_trace_context text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_id bigint;
  v_shard smallint;
  v_lane integer;
  v_base bigint;
  v_slot smallint;
  v_now smallint;
BEGIN
  -- enqueue()'s checks on these values, as one expression (a NULL comparison is not a
  -- failure); only when one fails, the checks that raise, in enqueue()'s order.
  IF p_queue IS NULL OR p_priority IS NULL OR octet_length(p_queue) > 255
     OR p_shard < 0 OR p_shard > 63 OR p_shards < 1 OR p_shards > 64
     OR char_length(p_trace_context) > 1024
     OR p_type IS NULL OR char_length(p_type) NOT BETWEEN 1 AND 200 OR p_payload IS NULL THEN
    IF p_queue IS NULL OR p_priority IS NULL THEN
      RAISE EXCEPTION 'berth: enqueue queue and priority must not be null' USING ERRCODE = '22004';
    END IF;
    PERFORM {{schema}}.check_queue('enqueue', p_queue);
    IF p_shard IS NOT NULL AND (p_shard < 0 OR p_shard > 63) THEN
      RAISE EXCEPTION 'berth: enqueue: shard must be an integer from 0 to 63 (got %)', p_shard USING ERRCODE = '22023';
    END IF;
    IF p_shards IS NOT NULL AND (p_shards < 1 OR p_shards > 64) THEN
      RAISE EXCEPTION 'berth: enqueue: shards must be an integer from 1 to 64 (got %)', p_shards USING ERRCODE = '22023';
    END IF;
    PERFORM {{schema}}.check_tasks('enqueue', ARRAY[p_type], ARRAY[p_payload], NULL, NULL, NULL, p_trace_context);
  END IF;
  v_id := nextval({{qualified_literal:task_id_seq}}::regclass);
  v_shard := coalesce(p_shard, (txid_current() % greatest(coalesce(p_shards, 1), 1))::smallint);
  SELECT l.lane_id INTO v_lane FROM {{schema}}.lanes l
   WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = v_shard;
  IF NOT FOUND THEN v_lane := {{schema}}.provision_lane(p_queue, p_priority, v_shard); END IF;
  -- append_ready()'s rules, as enqueue()'s inline append keeps them (migration 32).
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, v_lane);
  v_base := nextval(({{qualified_literal:lane_seq_}} || v_lane)::regclass);
  INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                                attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                                trace_context)
  VALUES ((SELECT (e.last_value % rs.slot_count)::smallint FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs),
          v_lane, v_base, v_id, p_type, p_payload, p_queue, p_priority, v_shard, 0, NULL, NULL,
          NULL, now(), now(), p_trace_context)
  RETURNING slot INTO v_slot;
  LOOP
    SELECT (e.last_value % rs.slot_count)::smallint INTO v_now FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs;
    EXIT WHEN v_now = v_slot;
    WITH moved AS (
      DELETE FROM {{schema}}.ready r
       WHERE r.slot = v_slot AND r.lane_id = v_lane AND r.lane_seq = v_base
      RETURNING r.*)
    INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                                  attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                                  appended_at, trace_context)
    SELECT v_now, m.lane_id, m.lane_seq, m.id, m.type, m.payload, m.queue, m.priority, m.shard, m.attempts,
           m.max_attempts, m.dedupe_key, m.last_error, m.created_at, m.run_at, m.appended_at, m.trace_context
      FROM moved m;
    v_slot := v_now;
  END LOOP;
  PERFORM pg_notify({{wake_channel_literal}}, v_lane::text);
  RETURN v_id;
END $fn$;

-- New functions are executable by PUBLIC by default (migration 3): take it away, then give it to
-- every role that may run enqueue() (src/schema/roles.ts grants it from now on).
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue_one(text, smallint, smallint, smallint, text, jsonb, text) FROM PUBLIC;

DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:enqueue(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[],text)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.enqueue_one(text, smallint, smallint, smallint, text, jsonb, text) TO %I',
                   {{schema_literal}}, v_role);
  END LOOP;
END $do$;
