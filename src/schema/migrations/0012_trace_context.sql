-- name: trace context: the producer's OpenTelemetry context stored with each task and carried through every move
--
-- Issue 13, item 6 (traces). A nullable text column `trace_context` on ready, deferred and
-- dead_letters holds the producer's propagation carrier as JSON (src/tracing.ts), written at
-- enqueue only when a span is active there, and NULL otherwise: a NULL column costs no bytes
-- in the row (the null bitmap already exists for these tables' nullable columns), so an
-- untraced task's WAL is unchanged. Adding a nullable column with no default rewrites nothing.
--
-- The column rides along every statement that moves a task: enqueue (ready or deferred),
-- promote_lane (deferred -> ready), retry_dead (dead_letters -> ready), move_task (ready ->
-- ready; deferred rows are updated in place), and the settle tail in src/storage (ready ->
-- deferred / dead_letters). append_ready takes it as an 11th argument, defaulted to NULL so a
-- caller that does not pass it still works. enqueue takes it as a 10th, scalar argument (one
-- context per call: every task of an enqueueMany shares the producer's active context); the
-- 9-argument enqueue stays, as a wrapper passing NULL, so producers of the previous version
-- keep working through a rolling deploy (its grants are kept; the new function's are copied
-- from it).

ALTER TABLE {{schema}}.ready ADD COLUMN trace_context text;
ALTER TABLE {{schema}}.deferred ADD COLUMN trace_context text;
ALTER TABLE {{schema}}.dead_letters ADD COLUMN trace_context text;

DROP FUNCTION {{schema}}.append_ready(integer, bigint[], text[], jsonb[], integer[], integer[], text[], text[],
  timestamptz[], timestamptz[]);

CREATE FUNCTION {{schema}}.append_ready(
  p_lane integer, p_ids bigint[], p_types text[], p_payloads jsonb[], p_attempts integer[],
  p_max_attempts integer[], p_dedupe text[], p_last_error text[], p_created_at timestamptz[],
  p_run_at timestamptz[], p_trace_context text[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_seq regclass;
  -- The rows the unnest below makes: as many as the longest array (callers pass equal lengths).
  v_n integer := coalesce(greatest(cardinality(p_ids), cardinality(p_types), cardinality(p_payloads),
    cardinality(p_attempts), cardinality(p_max_attempts), cardinality(p_dedupe),
    cardinality(p_last_error), cardinality(p_created_at), cardinality(p_run_at)), 0);
  v_base bigint;
BEGIN
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
  IF v_n = 0 THEN RETURN 0; END IF;
  v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)::regclass;
  -- Every appender to the lane holds the lane lock (taken above, held to commit) while it draws
  -- from the lane's sequence, so v_base .. v_base + v_n - 1 are this call's alone.
  v_base := nextval(v_seq);
  IF v_n > 1 THEN PERFORM setval(v_seq, v_base + v_n - 1); END IF;
  INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                          attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                          trace_context)
  SELECT (SELECT current_slot FROM {{schema}}.ring_state), p_lane, v_base + x.ord - 1, x.id, x.type,
         x.payload, l.queue, l.priority, l.shard, x.attempts, x.max_attempts, x.dedupe_key,
         x.last_error, x.created_at, x.run_at, x.trace_context
    FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe, p_last_error,
                p_created_at, p_run_at, p_trace_context) WITH ORDINALITY
           AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                run_at, trace_context, ord)
    CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  IF v_n > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, p_lane::text); END IF;
  RETURN v_n;
END $fn$;

CREATE FUNCTION {{schema}}.enqueue(
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
      PERFORM {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, v_shard), v_ids,
        p_types, p_payloads, array_fill(0, ARRAY[v_n]), p_max_attempts, p_dedupe, NULL,
        array_fill(now(), ARRAY[v_n]),
        CASE WHEN p_run_at IS NULL THEN array_fill(now(), ARRAY[v_n])
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

-- The previous version's producers call this one: same rows, no trace context.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue(
  p_queue text, p_priority smallint, p_shard smallint, p_shards smallint, p_types text[],
  p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[])
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT e.ord, e.id, e.state, e.duplicate_of
    FROM {{schema}}.enqueue(p_queue, p_priority, p_shard, p_shards, p_types, p_payloads, p_run_at,
                            p_max_attempts, p_dedupe, NULL::text) AS e
$fn$;

CREATE OR REPLACE FUNCTION {{schema}}.promote_lane(p_queue text, p_priority smallint, p_shard smallint,
                                  p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_lane integer; v_n integer;
BEGIN
  v_lane := {{schema}}.provision_lane(p_queue, p_priority, p_shard);
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, v_lane);
  -- Locked first so a busy lane times out before any row is taken; append_ready re-takes it.
  WITH moved AS (
    DELETE FROM {{schema}}.deferred d
     WHERE d.id IN (SELECT x.id FROM {{schema}}.deferred x
                     WHERE x.queue = p_queue AND x.priority = p_priority AND x.shard = p_shard
                       AND x.run_at <= now()
                     ORDER BY x.run_at, x.priority, x.id
                     LIMIT p_limit
                     FOR UPDATE SKIP LOCKED)
    RETURNING d.*
  )
  SELECT {{schema}}.append_ready(v_lane,
           array_agg(m.id ORDER BY m.run_at, m.id), array_agg(m.type ORDER BY m.run_at, m.id),
           array_agg(m.payload ORDER BY m.run_at, m.id), array_agg(m.attempts ORDER BY m.run_at, m.id),
           array_agg(m.max_attempts ORDER BY m.run_at, m.id), array_agg(m.dedupe_key ORDER BY m.run_at, m.id),
           array_agg(m.last_error ORDER BY m.run_at, m.id), array_agg(m.created_at ORDER BY m.run_at, m.id),
           array_agg(m.run_at ORDER BY m.run_at, m.id), array_agg(m.trace_context ORDER BY m.run_at, m.id))
    INTO v_n
    FROM moved m;
  RETURN coalesce(v_n, 0);
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.retry_dead(p_ids bigint[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_lane record; v_done bigint[] := '{}'; v_part bigint[];
BEGIN
  FOR v_lane IN
    SELECT DISTINCT d.queue, d.priority, d.shard FROM {{schema}}.dead_letters d WHERE d.id = ANY (p_ids)
  LOOP
    -- Lock first (DISTINCT ON cannot be combined with FOR UPDATE): a concurrent retry of the
    -- same rows waits here, then finds them gone.
    PERFORM 1 FROM {{schema}}.dead_letters d
      WHERE d.id = ANY (p_ids) AND d.queue = v_lane.queue AND d.priority = v_lane.priority
        AND d.shard = v_lane.shard
      ORDER BY d.id FOR UPDATE;
    WITH cand AS (
      SELECT DISTINCT ON (coalesce(d.dedupe_key, d.id::text)) d.id
        FROM {{schema}}.dead_letters d
       WHERE d.id = ANY (p_ids) AND d.queue = v_lane.queue AND d.priority = v_lane.priority
         AND d.shard = v_lane.shard
         AND (d.dedupe_key IS NULL
              OR NOT EXISTS (SELECT 1 FROM {{schema}}.dedupe k WHERE k.dedupe_key = d.dedupe_key))
       ORDER BY coalesce(d.dedupe_key, d.id::text), d.id DESC
    ), gone AS (
      DELETE FROM {{schema}}.dead_letters d USING cand WHERE d.id = cand.id RETURNING d.*
    ), keys AS (
      INSERT INTO {{schema}}.dedupe (dedupe_key, id)
      SELECT g.dedupe_key, g.id FROM gone g WHERE g.dedupe_key IS NOT NULL
      ON CONFLICT DO NOTHING RETURNING 1
    ), appended AS (
      SELECT {{schema}}.append_ready({{schema}}.provision_lane(v_lane.queue, v_lane.priority, v_lane.shard),
               array_agg(g.id ORDER BY g.id), array_agg(g.type ORDER BY g.id),
               array_agg(g.payload ORDER BY g.id), array_agg(0 ORDER BY g.id),
               array_agg(g.max_attempts ORDER BY g.id), array_agg(g.dedupe_key ORDER BY g.id),
               array_agg(g.last_error ORDER BY g.id), array_agg(g.created_at ORDER BY g.id),
               array_agg(now() ORDER BY g.id), array_agg(g.trace_context ORDER BY g.id)) AS n,
             array_agg(g.id) AS ids
        FROM gone g
      HAVING count(*) > 0
    )
    SELECT a.ids INTO v_part FROM appended a WHERE (SELECT count(*) FROM keys) >= 0;
    v_done := v_done || coalesce(v_part, '{}');
  END LOOP;
  RETURN QUERY
    SELECT x.id,
           CASE WHEN x.id = ANY (v_done) THEN 'retried'
                WHEN EXISTS (SELECT 1 FROM {{schema}}.dead_letters d WHERE d.id = x.id) THEN 'duplicate'
                ELSE 'not_found' END
      FROM unnest(p_ids) AS x(id);
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.move_task(p_id bigint, p_queue text, p_priority smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  IF p_id IS NULL OR p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: move_task arguments must not be null' USING ERRCODE = '22004';
  END IF;
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

-- New functions are executable by PUBLIC by default (migration 3); take it away, then give the
-- new enqueue to every role that could run the old one.
REVOKE EXECUTE ON FUNCTION {{schema}}.append_ready(integer, bigint[], text[], jsonb[], integer[], integer[], text[],
  text[], timestamptz[], timestamptz[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[],
  integer[], text[], text) FROM PUBLIC;

DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:enqueue(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[])}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.enqueue(text, smallint, smallint, smallint, text[], jsonb[], '
                   'timestamptz[], integer[], text[], text) TO %2$I', {{schema_literal}}, v_role);
  END LOOP;
END $do$;
