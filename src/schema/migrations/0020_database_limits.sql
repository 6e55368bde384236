-- name: database limits and audit: the functions a producer or worker may call check what the client checks, and audit every cancel and removal with the session's role
--
-- A security probe called the definer functions directly, as the producer and the worker roles:
-- enqueue(), move_task() and provision_lane() took a 50,000-character queue and type,
-- max_attempts -7 and a 100,000-character trace context, and the lanes they opened were
-- permanent (every overview carried them: /api/overview grew to 255 KB); a worker role could
-- cancel or remove any pending task under any actor name it passed, and no audit row said so.
--
-- Now every function a producer or a worker may call refuses what the client refuses
-- (src/limits.ts), with SQLSTATE 22023 and a message naming the function, the field and the
-- task: a queue over 255 UTF-8 bytes; a type empty or over 200 characters; a payload that is
-- null; a run time outside years 1 to 9999; max_attempts outside 1 to 1,000,000; a dedupe key
-- empty or over 1,024 bytes; a trace context over 1,024 characters; a shard outside 0-63 and a
-- shard count outside 1-64; arrays of different lengths; an actor over 200 characters; a
-- removal reason over 64. A NUL character never reaches a function: PostgreSQL refuses it in
-- text (22021) and in jsonb (22P05) before the call. Priorities are any smallint, as the
-- client allows.
--
-- cancel_tasks() and remove_unleased() write an audit_log row of their own, whoever calls them,
-- with the session's role (`db:<role>`) beside the actor the caller named: the client's own row
-- (`audited()`) names the person; this one, which the caller cannot shape, names the role.
-- cancel_tasks() removes pending tasks through remove_unleased_quietly() (the removal without its
-- audit row, which only the owner may call), so a cancel writes one row.

CREATE FUNCTION {{schema}}.check_queue(p_fn text, p_queue text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF p_queue IS NULL THEN
    RAISE EXCEPTION 'berth: %: queue must not be null', p_fn USING ERRCODE = '22004';
  END IF;
  IF octet_length(p_queue) > 255 THEN
    RAISE EXCEPTION 'berth: %: queue must be at most 255 UTF-8 bytes (got %)', p_fn, octet_length(p_queue)
      USING ERRCODE = '22023';
  END IF;
END $fn$;

CREATE FUNCTION {{schema}}.check_actor(p_fn text, p_actor text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF char_length(p_actor) > 200 THEN
    RAISE EXCEPTION 'berth: %: actor must be at most 200 characters (got %)', p_fn, char_length(p_actor)
      USING ERRCODE = '22023';
  END IF;
END $fn$;

-- The tasks of one enqueue call: the first one out of bounds is named (#n, from 1, as the
-- client's "task #n").
CREATE FUNCTION {{schema}}.check_tasks(
  p_fn text, p_types text[], p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[],
  p_trace_context text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_n integer := coalesce(cardinality(p_types), 0);
  x record;
BEGIN
  IF coalesce(cardinality(p_payloads), 0) <> v_n
     OR (p_run_at IS NOT NULL AND cardinality(p_run_at) <> v_n)
     OR (p_max_attempts IS NOT NULL AND cardinality(p_max_attempts) <> v_n)
     OR (p_dedupe IS NOT NULL AND cardinality(p_dedupe) <> v_n) THEN
    RAISE EXCEPTION 'berth: %: types, payloads, run_at, max_attempts and dedupe must have one element per task (% types)',
      p_fn, v_n USING ERRCODE = '22023';
  END IF;
  IF char_length(p_trace_context) > 1024 THEN
    RAISE EXCEPTION 'berth: %: trace_context must be at most 1024 characters (got %)', p_fn, char_length(p_trace_context)
      USING ERRCODE = '22023';
  END IF;
  SELECT u.o, u.t, u.p IS NULL AS no_payload, u.r, u.m, u.k INTO x
    FROM unnest(p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe) WITH ORDINALITY AS u(t, p, r, m, k, o)
   WHERE u.t IS NULL OR char_length(u.t) NOT BETWEEN 1 AND 200 OR u.p IS NULL
      OR u.r < '0001-01-01 00:00:00+00'::timestamptz OR u.r > '9999-12-31 23:59:59.999+00'::timestamptz
      OR u.m NOT BETWEEN 1 AND 1000000 OR octet_length(u.k) NOT BETWEEN 1 AND 1024
   ORDER BY u.o LIMIT 1;
  IF NOT FOUND THEN RETURN; END IF;
  IF x.t IS NULL OR char_length(x.t) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION 'berth: %: task #%: type must be a non-empty string of at most 200 characters (got %)',
      p_fn, x.o, CASE WHEN x.t IS NULL THEN 'null' ELSE char_length(x.t) || ' characters' END USING ERRCODE = '22023';
  ELSIF x.no_payload THEN
    RAISE EXCEPTION 'berth: %: task #%: payload must not be null', p_fn, x.o USING ERRCODE = '22023';
  ELSIF x.m NOT BETWEEN 1 AND 1000000 THEN
    RAISE EXCEPTION 'berth: %: task #%: max_attempts must be an integer from 1 to 1000000 (got %)', p_fn, x.o, x.m
      USING ERRCODE = '22023';
  ELSIF octet_length(x.k) NOT BETWEEN 1 AND 1024 THEN
    RAISE EXCEPTION 'berth: %: task #%: dedupe_key must be a non-empty string of at most 1024 UTF-8 bytes (got %)',
      p_fn, x.o, octet_length(x.k) USING ERRCODE = '22023';
  ELSE
    RAISE EXCEPTION 'berth: %: task #%: run_at must be within the years 1 to 9999 (got %)', p_fn, x.o, x.r
      USING ERRCODE = '22023';
  END IF;
END $fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.check_queue(text, text), {{schema}}.check_actor(text, text),
  {{schema}}.check_tasks(text, text[], jsonb[], timestamptz[], integer[], text[], text) FROM PUBLIC;

-- The removal as before (migration 8), for cancel_tasks, which audits the cancel itself.
CREATE FUNCTION {{schema}}.remove_unleased_quietly(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  DELETE FROM {{schema}}.deferred WHERE id = p_id;
  IF FOUND THEN
    DELETE FROM {{schema}}.dedupe WHERE id = p_id;
    RETURN 'removed';
  END IF;
  SELECT e.slot, e.lane_id, e.lane_seq INTO r FROM {{schema}}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                      WHERE le.id = p_id AND le.lane_id = e.lane_id AND le.lane_seq = e.lane_seq
                        AND le.slot = e.slot AND le.outcome IS NOT NULL)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  -- Row-locks the lane (claims skip it meanwhile) and bumps its version, so a claim whose
  -- snapshot predates this tombstone sees the version change and leaves the lane alone.
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
              WHERE le.id = p_id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, p_reason) ON CONFLICT DO NOTHING;
  DELETE FROM {{schema}}.dedupe WHERE id = p_id;
  RETURN 'removed';
END $fn$;

-- The removal a runtime role may call: its reason bounded, and an audit row written whenever it
-- removed something.
CREATE OR REPLACE FUNCTION {{schema}}.remove_unleased(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_result text;
BEGIN
  IF p_reason IS NULL OR char_length(p_reason) NOT BETWEEN 1 AND 64 THEN
    RAISE EXCEPTION 'berth: remove_unleased: reason must be a non-empty string of at most 64 characters'
      USING ERRCODE = '22023';
  END IF;
  v_result := {{schema}}.remove_unleased_quietly(p_id, p_reason);
  IF v_result = 'removed' THEN
    INSERT INTO {{schema}}.audit_log (actor, action, target, result)
    VALUES ('db:' || session_user, 'remove', jsonb_build_object('id', p_id, 'reason', p_reason),
            jsonb_build_object('result', v_result));
  END IF;
  RETURN v_result;
END $fn$;

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
  v_n integer := coalesce(array_length(p_types, 1), 0);
BEGIN
  IF p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: enqueue queue and priority must not be null' USING ERRCODE = '22004';
  END IF;
  -- What the client checks, checked again here: the function is called directly too.
  PERFORM {{schema}}.check_queue('enqueue', p_queue);
  IF p_shard IS NOT NULL AND (p_shard < 0 OR p_shard > 63) THEN
    RAISE EXCEPTION 'berth: enqueue: shard must be an integer from 0 to 63 (got %)', p_shard USING ERRCODE = '22023';
  END IF;
  IF p_shards IS NOT NULL AND (p_shards < 1 OR p_shards > 64) THEN
    RAISE EXCEPTION 'berth: enqueue: shards must be an integer from 1 to 64 (got %)', p_shards USING ERRCODE = '22023';
  END IF;
  PERFORM {{schema}}.check_tasks('enqueue', p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe, p_trace_context);
  v_shard := coalesce(p_shard, (txid_current() % greatest(coalesce(p_shards, 1), 1))::smallint);
  v_ids := ARRAY(SELECT nextval({{qualified_literal:task_id_seq}}::regclass) FROM generate_series(1, v_n));
  IF EXISTS (SELECT 1 FROM unnest(p_dedupe) k WHERE k IS NOT NULL) THEN
    WITH cand AS (
      SELECT DISTINCT ON (x.k) x.k, x.id FROM unnest(p_dedupe, v_ids) WITH ORDINALITY AS x(k, id, o)
       WHERE x.k IS NOT NULL ORDER BY x.k, x.o),
    ins AS (
      INSERT INTO {{schema}}.dedupe AS d (dedupe_key, id) SELECT cand.k, cand.id FROM cand
      ON CONFLICT DO NOTHING RETURNING d.id)
    SELECT coalesce(array_agg(ins.id), '{}') INTO v_won FROM ins;
  ELSIF NOT EXISTS (SELECT 1 FROM unnest(p_run_at) r WHERE r > now()) THEN
    -- No dedupe key and nothing in the future: every task is accepted and ready, in input order.
    -- An untraced call (p_trace_context NULL) passes NULL, which the unnest pads like NULLs.
    IF v_n > 0 THEN
      -- Attempts, creation and run times as NULL arrays: append_ready takes them as 0, now() and
      -- now(), and with no other array set it inserts from three.
      PERFORM {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, v_shard), v_ids,
        p_types, p_payloads, NULL, p_max_attempts, p_dedupe, NULL, NULL,
        CASE WHEN p_run_at IS NULL THEN NULL
             ELSE ARRAY(SELECT coalesce(u.r, now()) FROM unnest(v_ids, p_run_at) WITH ORDINALITY AS u(i, r, o)
                         ORDER BY u.o) END,
        CASE WHEN p_trace_context IS NULL THEN NULL ELSE array_fill(p_trace_context, ARRAY[v_n]) END);
    END IF;
    RETURN QUERY SELECT u.o::integer, u.i, 'ready'::text, NULL::bigint
                   FROM unnest(v_ids) WITH ORDINALITY AS u(i, o) ORDER BY u.o;
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

CREATE OR REPLACE FUNCTION {{schema}}.provision_lane(p_queue text, p_priority smallint, p_shard smallint)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_id integer;
BEGIN
  IF p_queue IS NULL OR p_priority IS NULL OR p_shard IS NULL THEN
    RAISE EXCEPTION 'berth: provision_lane arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_shard < 0 OR p_shard > 63 THEN
    RAISE EXCEPTION 'berth: shard % is outside 0-63', p_shard USING ERRCODE = '22023';
  END IF;
  PERFORM {{schema}}.check_queue('provision_lane', p_queue);
  SELECT lane_id INTO v_id FROM {{schema}}.lanes
   WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
  IF FOUND THEN RETURN v_id; END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended({{queue_lock_prefix_literal}} || p_queue, 0));
  INSERT INTO {{schema}}.lanes (queue, priority, shard, paused)
  VALUES (p_queue, p_priority, p_shard,
          EXISTS (SELECT 1 FROM {{schema}}.queue_pauses q WHERE q.queue = p_queue))
  ON CONFLICT DO NOTHING RETURNING lane_id INTO v_id;
  IF v_id IS NULL THEN
    SELECT lane_id INTO v_id FROM {{schema}}.lanes
     WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
    RETURN v_id;
  END IF;
  EXECUTE format('CREATE SEQUENCE %I.%I', {{schema_literal}}, 'lane_seq_' || v_id);
  RETURN v_id;
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.move_task(p_id bigint, p_queue text, p_priority smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  IF p_id IS NULL OR p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: move_task arguments must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM {{schema}}.check_queue('move_task', p_queue);
  UPDATE {{schema}}.deferred SET queue = p_queue, priority = p_priority WHERE id = p_id;
  IF FOUND THEN RETURN 'moved'; END IF;
  SELECT e.* INTO r FROM {{schema}}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                      WHERE le.id = p_id AND le.lane_id = e.lane_id AND le.lane_seq = e.lane_seq
                        AND le.slot = e.slot AND le.outcome IS NOT NULL)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
              WHERE le.id = p_id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, 'moved') ON CONFLICT DO NOTHING;
  PERFORM {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, r.shard), ARRAY[r.id],
            ARRAY[r.type], ARRAY[r.payload], ARRAY[r.attempts], ARRAY[r.max_attempts],
            ARRAY[r.dedupe_key], ARRAY[r.last_error], ARRAY[r.created_at], ARRAY[r.run_at],
            ARRAY[r.trace_context]);
  RETURN 'moved';
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.cancel_tasks(p_ids bigint[], p_actor text)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_id bigint;
  v_result text;
  v_n integer;
  e record;
  v_results jsonb := '{}';
BEGIN
  IF p_ids IS NULL THEN
    RAISE EXCEPTION 'berth: cancel_tasks ids must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM {{schema}}.check_actor('cancel_tasks', p_actor);
  IF cardinality(p_ids) > 10000 THEN
    RAISE EXCEPTION 'berth: cancel_tasks: at most 10000 ids a call (got %)', cardinality(p_ids) USING ERRCODE = '22023';
  END IF;
  FOREACH v_id IN ARRAY p_ids LOOP
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      id := v_id; result := 'isolation'; RETURN NEXT; CONTINUE;
    END IF;
    -- Pending: removed. Leased: remove_unleased has taken the lane's row lock, and this
    -- statement's fresh snapshot sees the lease.
    v_result := {{schema}}.remove_unleased_quietly(v_id, 'cancelled');
    IF v_result <> 'removed' THEN
      SELECT le.slot, le.lane_id, le.lane_seq, le.lease_from INTO e
        FROM {{schema}}.leased_entries le
       WHERE le.id = v_id AND le.outcome IS NULL
       LIMIT 1;
      IF FOUND THEN
        INSERT INTO {{schema}}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome, actor)
        VALUES (e.slot, e.lane_id, e.lease_from, int8multirange(int8range(e.lane_seq, e.lane_seq + 1)), 1,
                'cancelled', p_actor)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
      ELSE
        v_n := -1;
      END IF;
      IF v_n = 1 THEN
        DELETE FROM {{schema}}.dedupe d WHERE d.id = v_id;
        -- Delivered at commit to every worker's LISTEN session; the holder aborts the handler.
        PERFORM pg_notify({{wake_channel_literal}}, format('cancel:%s:%s', e.lane_id, e.lane_seq));
        -- Attempt history (migration 10): the attempt ended here, and who ended it. The holder's
        -- own settlement is refused by the fence (or never written), so it records nothing.
        INSERT INTO {{schema}}.attempt_history (part, bucket, outcome, lane_id, type, worker, claimed_at,
                                                ids, attempts, created_at, run_ms, error, cursor, dead)
        SELECT hs.current_part, v_id >> 10, 'cancelled', r.lane_id, r.type, l.worker, l.claimed_at,
               ARRAY[v_id], ARRAY[r.attempts + 1], ARRAY[r.created_at], ARRAY[NULL::integer],
               jsonb_build_object('message', 'cancelled by ' || coalesce(p_actor, 'an operator'),
                                  'name', 'Cancel',
                                  'data', jsonb_build_object('cancelledBy', p_actor)::text),
               NULL, false
          FROM {{schema}}.history_state hs, {{schema}}.ready r, {{schema}}.range_leases l
         WHERE hs.enabled
           AND r.slot = e.slot AND r.lane_id = e.lane_id AND r.lane_seq = e.lane_seq
           AND l.slot = e.slot AND l.lane_id = e.lane_id AND l.from_seq = e.lease_from;
        v_result := 'cancelled';
      ELSE
        -- Lost the race (the insert waited for the holder's settlement and was dropped), or no
        -- lease is open: a failure, release or rescue that won may have deferred the task.
        DELETE FROM {{schema}}.deferred d WHERE d.id = v_id;
        IF FOUND THEN
          DELETE FROM {{schema}}.dedupe d WHERE d.id = v_id;
          v_result := 'removed';
        ELSIF v_n = 0 OR EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                                  WHERE le.id = v_id AND le.outcome IS NOT NULL) THEN
          v_result := 'already_settled';
        ELSE
          v_result := 'not_found';
        END IF;
      END IF;
    END IF;
    id := v_id; result := v_result; RETURN NEXT;
    v_results := v_results || jsonb_build_object(v_id::text, v_result);
  END LOOP;
  -- Every cancel is audited here, whoever calls the function: the session's role, beside the
  -- actor the caller named (which nothing can check).
  IF EXISTS (SELECT 1 FROM jsonb_each_text(v_results) x WHERE x.value IN ('removed', 'cancelled')) THEN
    INSERT INTO {{schema}}.audit_log (actor, action, target, result)
    VALUES ('db:' || session_user, 'cancel', jsonb_build_object('ids', to_jsonb(p_ids), 'actor', p_actor), v_results);
  END IF;
END $fn$;

-- Kept by CREATE OR REPLACE; said again so none is ever executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION {{schema}}.remove_unleased_quietly(bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[],
  integer[], text[], text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.provision_lane(text, smallint, smallint), {{schema}}.move_task(bigint, text, smallint),
  {{schema}}.remove_unleased(bigint, text), {{schema}}.cancel_tasks(bigint[], text) FROM PUBLIC;
