-- name: enqueue fast path: immediate batches go straight to append_ready, lane numbers reserved as a block
--
-- Issue 11 (bulk enqueue >= 100k tasks/s); measured with bench/enqueue-bulk.ts
-- (docs/benchmarks.md, "Bulk enqueue").
--
-- Same signatures, owners and grants (CREATE OR REPLACE keeps them); same rows, lanes, lane
-- order, dedupe and NOTIFY. Two changes, each measured on 1,000-task calls:
-- 1. enqueue(): a batch with no dedupe key and nothing due in the future (every task is accepted
--    and ready) passes its arrays to append_ready as they are, instead of unnesting them into a
--    CTE and re-aggregating ten sorted arrays from it. Other batches take the unchanged path.
-- 2. append_ready(): the lane's numbers for the whole call are reserved with one nextval and one
--    setval (the lane lock, taken first, keeps every other appender off the sequence until
--    commit), and entry k of the arrays gets base + k - 1, instead of one nextval per row over a
--    subquery sorted by ordinality.

CREATE OR REPLACE FUNCTION {{schema}}.append_ready(
  p_lane integer, p_ids bigint[], p_types text[], p_payloads jsonb[], p_attempts integer[],
  p_max_attempts integer[], p_dedupe text[], p_last_error text[], p_created_at timestamptz[],
  p_run_at timestamptz[])
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
                          attempts, max_attempts, dedupe_key, last_error, created_at, run_at)
  SELECT (SELECT current_slot FROM {{schema}}.ring_state), p_lane, v_base + x.ord - 1, x.id, x.type,
         x.payload, l.queue, l.priority, l.shard, x.attempts, x.max_attempts, x.dedupe_key,
         x.last_error, x.created_at, x.run_at
    FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe, p_last_error,
                p_created_at, p_run_at) WITH ORDINALITY
           AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                run_at, ord)
    CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  IF v_n > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, p_lane::text); END IF;
  RETURN v_n;
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.enqueue(
  p_queue text, p_priority smallint, p_shard smallint, p_shards smallint, p_types text[],
  p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[])
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
    IF v_n > 0 THEN
      PERFORM {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, v_shard), v_ids,
        p_types, p_payloads, array_fill(0, ARRAY[v_n]), p_max_attempts, p_dedupe, NULL,
        array_fill(now(), ARRAY[v_n]),
        CASE WHEN p_run_at IS NULL THEN array_fill(now(), ARRAY[v_n])
             ELSE ARRAY(SELECT coalesce(u.r, now()) FROM unnest(v_ids, p_run_at) WITH ORDINALITY AS u(i, r, o)
                         ORDER BY u.o) END);
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
             array_agg(i.run_at ORDER BY i.o)) AS n
      FROM items i WHERE i.accepted AND i.due
    HAVING count(*) > 0
  ), scheduled AS (
    INSERT INTO {{schema}}.deferred (id, state, type, payload, queue, priority, shard, attempts,
                               max_attempts, dedupe_key, created_at, run_at)
    SELECT i.id, 'scheduled', i.type, i.payload, p_queue, p_priority, v_shard, 0, i.max_attempts,
           i.k, now(), i.run_at
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
