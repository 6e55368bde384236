-- name: enqueue's common path in one function: a new session's first enqueue plans fewer statements
--
-- Issue 35 (a new process's first enqueue: berth 36 ms against graphile-worker's 20 ms). A
-- PL/pgSQL function is compiled on its first call in a session and each of its statements and
-- expressions is parsed and planned on its first run. A plain single-task enqueue went through
-- five functions (enqueue, check_queue, check_tasks, provision_lane, append_ready) and about 25
-- statements and expressions; on the 2-core development server a new session spent 9-12 ms of
-- server time in its first call (each function compiled and entered 0.2-1 ms, each first
-- statement 0.1-3 ms: docs/benchmarks-journal.md, "A new session's first enqueue").
--
-- enqueue() keeps its signature and its answers; its common path now runs in itself:
--
-- * The checks: every check on the arguments as a whole is one expression, the per-task checks
--   one EXISTS (for one task, an expression on its elements: no query to plan). Only when one
--   of them fails are check_queue() and check_tasks() called, in the order they were called
--   before, and they raise the error they always raised (same message, same SQLSTATE; the
--   messages stay defined once, in them). The conditions tested here are theirs, word for word
--   (or, for one task, wider: an array not subscripted from 1 goes to check_tasks()), so they
--   are true whenever check_queue() or check_tasks() would raise; when they are true and the
--   two raise nothing, the call goes on as before.
-- * The lane: looked up by (queue, priority, shard) here, as provision_lane() looked it up
--   first; provision_lane() is called only for a lane that does not exist yet.
-- * The append of tasks with nothing but a type, a payload and at most a trace context (the
--   client's single and bulk enqueue without runAt, delay or maxAttempts): inline, with
--   append_ready()'s rules kept exactly (docs/architecture.md, "Invariants" 1 and 2): the
--   lane's advisory lock taken first and held to commit, the call's positions drawn from the
--   lane's sequence under it, the ring segment read from the epoch inside the INSERT and again
--   after it, the rows moved to the current segment until two reads agree, one wake per lane.
--   The lane's queue, priority and shard are the ones it was looked up by, so the INSERT does
--   not join `lanes` (which was there only to fetch them); with no join it writes exactly one
--   row per task (the arrays' lengths were checked equal), so append_ready's count check has
--   nothing to catch. Any other common-path call (a runAt in the past, maxAttempts) still goes
--   through append_ready().
--
-- append_ready(), provision_lane(), check_queue() and check_tasks() are unchanged: every other
-- caller (enqueue_keyed, add_task, promotion, moves, enqueue_graph) and an older producer's
-- enqueue() body, still running across this migration's commit, keep calling them. Dedupe keys
-- and future run times take the general path of migration 20, word for word.

CREATE OR REPLACE FUNCTION {{schema}}.enqueue(
  p_queue text, p_priority smallint, p_shard smallint, p_shards smallint, p_types text[],
  p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[],
  p_trace_context text)
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_lane integer;
  v_shard smallint;
  v_ids bigint[];
  v_won bigint[] := '{}';
  v_n integer := coalesce(cardinality(p_types), 0);
  v_seq regclass;
  v_base bigint;
  v_slot smallint;
  v_now smallint;
BEGIN
  -- Every check on the arguments as a whole, as one expression; the checks that raise, in
  -- their order, only when one of them fails (a NULL comparison is not a failure).
  IF p_queue IS NULL OR p_priority IS NULL OR octet_length(p_queue) > 255
     OR p_shard < 0 OR p_shard > 63 OR p_shards < 1 OR p_shards > 64
     OR coalesce(array_ndims(p_types), 1) > 1 OR coalesce(array_ndims(p_payloads), 1) > 1
     OR coalesce(array_ndims(p_run_at), 1) > 1 OR coalesce(array_ndims(p_max_attempts), 1) > 1
     OR coalesce(array_ndims(p_dedupe), 1) > 1
     OR coalesce(cardinality(p_payloads), 0) <> v_n OR cardinality(p_run_at) <> v_n
     OR cardinality(p_max_attempts) <> v_n OR cardinality(p_dedupe) <> v_n
     OR char_length(p_trace_context) > 1024 THEN
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
    PERFORM {{schema}}.check_tasks('enqueue', p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe, p_trace_context);
  END IF;
  IF v_n = 1 THEN
    -- One task (the usual call): check_tasks()'s per-task condition on its elements, and its
    -- id, as two expressions, no query to plan. An array whose subscripts do not start at 1 is
    -- sent to check_tasks() (which reads its element by unnest) rather than read here.
    IF array_lower(p_types, 1) <> 1 OR array_lower(p_payloads, 1) <> 1 OR array_lower(p_run_at, 1) <> 1
       OR array_lower(p_max_attempts, 1) <> 1 OR array_lower(p_dedupe, 1) <> 1
       OR p_types[1] IS NULL OR char_length(p_types[1]) NOT BETWEEN 1 AND 200 OR p_payloads[1] IS NULL
       OR p_run_at[1] < '0001-01-01 00:00:00+00'::timestamptz - interval '1 day'
       OR p_run_at[1] >= '10000-01-01 00:00:00+00'::timestamptz
       OR p_max_attempts[1] NOT BETWEEN 1 AND 1000000 OR octet_length(p_dedupe[1]) NOT BETWEEN 1 AND 1024 THEN
      PERFORM {{schema}}.check_tasks('enqueue', p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe, p_trace_context);
    END IF;
    v_ids := ARRAY[nextval({{qualified_literal:task_id_seq}}::regclass)];
  ELSE
    -- check_tasks()'s per-task condition (its WHERE, word for word) as one EXISTS, then the ids
    -- as before. (The two in one statement, array_agg(nextval(…) ORDER BY o) with bool_or of the
    -- condition, cost a 1,000-task call 10.75 ms of backend CPU against 10.0-10.5: /proc CPU of
    -- 40 calls in a DO block, 6 rounds.)
    IF EXISTS (SELECT 1 FROM unnest(p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe) AS u(t, p, r, m, k)
                WHERE u.t IS NULL OR char_length(u.t) NOT BETWEEN 1 AND 200 OR u.p IS NULL
                   OR u.r < '0001-01-01 00:00:00+00'::timestamptz - interval '1 day' OR u.r >= '10000-01-01 00:00:00+00'::timestamptz
                   OR u.m NOT BETWEEN 1 AND 1000000 OR octet_length(u.k) NOT BETWEEN 1 AND 1024) THEN
      PERFORM {{schema}}.check_tasks('enqueue', p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe, p_trace_context);
    END IF;
    v_ids := ARRAY(SELECT nextval({{qualified_literal:task_id_seq}}::regclass) FROM generate_series(1, v_n));
  END IF;
  v_shard := coalesce(p_shard, (txid_current() % greatest(coalesce(p_shards, 1), 1))::smallint);
  IF cardinality(array_remove(p_dedupe, NULL)) > 0 THEN
    WITH cand AS (
      SELECT DISTINCT ON (x.k) x.k, x.id FROM unnest(p_dedupe, v_ids) WITH ORDINALITY AS x(k, id, o)
       WHERE x.k IS NOT NULL ORDER BY x.k, x.o),
    ins AS (
      INSERT INTO {{schema}}.dedupe AS d (dedupe_key, id) SELECT cand.k, cand.id FROM cand
      ON CONFLICT DO NOTHING RETURNING d.id)
    SELECT coalesce(array_agg(ins.id), '{}') INTO v_won FROM ins;
  ELSIF v_n = 0 THEN
    RETURN;
  ELSIF NOT coalesce(now() < ANY (p_run_at), false) THEN
    -- No dedupe key and nothing in the future: every task is accepted and ready, in input order.
    SELECT l.lane_id INTO v_lane FROM {{schema}}.lanes l
     WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = v_shard;
    IF NOT FOUND THEN v_lane := {{schema}}.provision_lane(p_queue, p_priority, v_shard); END IF;
    IF p_run_at IS NULL AND p_max_attempts IS NULL THEN
      -- append_ready()'s fast path, inline (this migration's header; its comments there).
      PERFORM pg_advisory_xact_lock({{schema_lock_key}}, v_lane);
      v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || v_lane)::regclass;
      v_base := nextval(v_seq);
      IF v_n > 1 THEN PERFORM setval(v_seq, v_base + v_n - 1); END IF;
      WITH appended AS (
        INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                                attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                                trace_context)
        SELECT (SELECT (e.last_value % rs.slot_count)::smallint FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs),
               v_lane, v_base + x.ord - 1, x.id, x.type, x.payload, p_queue, p_priority, v_shard, 0, NULL, NULL,
               NULL, now(), now(), p_trace_context
          FROM unnest(v_ids, p_types, p_payloads) WITH ORDINALITY AS x(id, type, payload, ord)
        RETURNING slot)
      SELECT min(a.slot) INTO v_slot FROM appended a;
      LOOP
        SELECT (e.last_value % rs.slot_count)::smallint INTO v_now FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs;
        EXIT WHEN v_now = v_slot;
        WITH moved AS (
          DELETE FROM {{schema}}.ready r
           WHERE r.slot = v_slot AND r.lane_id = v_lane AND r.lane_seq BETWEEN v_base AND v_base + v_n - 1
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
    ELSE
      PERFORM {{schema}}.append_ready(v_lane, v_ids, p_types, p_payloads, NULL, p_max_attempts, p_dedupe, NULL, NULL,
        CASE WHEN p_run_at IS NULL THEN NULL
             ELSE ARRAY(SELECT coalesce(u.r, now()) FROM unnest(v_ids, p_run_at) WITH ORDINALITY AS u(i, r, o)
                         ORDER BY u.o) END,
        CASE WHEN p_trace_context IS NULL THEN NULL ELSE array_fill(p_trace_context, ARRAY[v_n]) END);
    END IF;
    IF v_n = 1 THEN
      -- One task (the usual call): its row without a query to plan.
      ord := 1; id := v_ids[1]; state := 'ready'; duplicate_of := NULL;
      RETURN NEXT;
    ELSE
      RETURN QUERY SELECT u.o::integer, u.i, 'ready'::text, NULL::bigint
                     FROM unnest(v_ids) WITH ORDINALITY AS u(i, o) ORDER BY u.o;
    END IF;
    RETURN;
  END IF;

  RETURN QUERY
  WITH items AS (
    SELECT x.o::integer AS o, x.id, x.type, x.payload, coalesce(x.run_at, now()) AS run_at,
           x.max_attempts, x.k, (x.k IS NULL OR x.id = ANY (v_won)) AS accepted,
           coalesce(x.run_at, now()) <= now() AS due
      FROM unnest(v_ids, p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe)
           WITH ORDINALITY AS x(id, type, payload, run_at, max_attempts, k, o)
  ), appended AS (
    SELECT {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, v_shard),
             array_agg(i.id ORDER BY i.o), array_agg(i.type ORDER BY i.o),
             array_agg(i.payload ORDER BY i.o), array_agg(0 ORDER BY i.o),
             array_agg(i.max_attempts ORDER BY i.o), array_agg(i.k ORDER BY i.o),
             array_agg(NULL::text ORDER BY i.o), array_agg(now() ORDER BY i.o),
             array_agg(i.run_at ORDER BY i.o),
             CASE WHEN p_trace_context IS NULL THEN NULL
                  ELSE array_fill(p_trace_context, ARRAY[count(*)::integer]) END) AS n
      FROM items i WHERE i.accepted AND i.due
    HAVING count(*) > 0
  ), scheduled AS (
    INSERT INTO {{schema}}.deferred (id, state, type, payload, queue, priority, shard, attempts,
                               max_attempts, dedupe_key, created_at, run_at, trace_context)
    SELECT i.id, 'scheduled', i.type, i.payload, p_queue, p_priority, v_shard, 0, i.max_attempts,
           i.k, now(), i.run_at, p_trace_context
      FROM items i WHERE i.accepted AND NOT i.due
    RETURNING 1
  )
  SELECT i.o, CASE WHEN i.accepted THEN i.id END,
         CASE WHEN NOT i.accepted THEN 'duplicate' WHEN i.due THEN 'ready' ELSE 'scheduled' END,
         CASE WHEN NOT i.accepted THEN (SELECT d.id FROM {{schema}}.dedupe d WHERE d.dedupe_key = i.k) END
    FROM items i
   WHERE (SELECT count(*) FROM appended) >= 0 AND (SELECT count(*) FROM scheduled) >= 0
   ORDER BY i.o;
END $fn$;

-- Kept by CREATE OR REPLACE; said again so it is never executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[],
  integer[], text[], text) FROM PUBLIC;
