-- name: enqueue fast path: a batch of plain new tasks is inserted from three arrays, not ten
--
-- Issue 11 (bulk enqueue). enqueue()'s fast path (migration 9) handed append_ready ten arrays
-- for 1,000 plain tasks, three of them built only to say "0", "now()" and "now()" per row
-- (attempts, created_at, run_at), and append_ready unnested all ten into its INSERT. A
-- PL/pgSQL function also turns each array argument it is given into an expanded array on entry
-- (pl_exec.c: "force any array-valued parameter to be stored in expanded form"). Measured in a
-- DO block on a stock PostgreSQL 15 cluster (2-core development machine, 30 calls of 1,000 a
-- side, interleaved, three runs): append_ready as called 5.6-7.0 ms per 1,000, the same body
-- taking only ids, types and payloads 4.7-5.5 ms; the INSERT inline with ten arrays 5.0-6.8 ms
-- against 4.3-6.0 with three (docs/benchmarks.md, "Bulk enqueue").
--
-- So append_ready reads a NULL attempts, created_at or run_at array (or element) as 0, now()
-- and now(), and when every optional array is NULL inserts from ids, types and payloads alone;
-- enqueue()'s fast path passes those NULLs. No caller passed NULL there before (the columns are
-- NOT NULL, so such a call failed), so every other caller's rows are unchanged: promotion,
-- retries, moves and settlements pass their arrays and take the general INSERT, as before.
-- Same signatures, so CREATE OR REPLACE keeps owner and grants; producers and workers of
-- either version call both alike. Migrations 12 and 13's bodies otherwise word for word.

CREATE OR REPLACE FUNCTION {{schema}}.append_ready(
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
  v_slot smallint;
BEGIN
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
  IF v_n = 0 THEN RETURN 0; END IF;
  v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)::regclass;
  -- Every appender to the lane holds the lane lock (taken above, held to commit) while it draws
  -- from the lane's sequence, so v_base .. v_base + v_n - 1 are this call's alone.
  v_base := nextval(v_seq);
  IF v_n > 1 THEN PERFORM setval(v_seq, v_base + v_n - 1); END IF;
  IF p_attempts IS NULL AND p_max_attempts IS NULL AND p_dedupe IS NULL AND p_last_error IS NULL
     AND p_created_at IS NULL AND p_run_at IS NULL AND p_trace_context IS NULL THEN
    -- New tasks with nothing but a type and a payload (enqueue's fast path): three arrays.
    WITH appended AS (
      INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                              attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                              trace_context)
      SELECT (SELECT current_slot FROM {{schema}}.ring_state), p_lane, v_base + x.ord - 1, x.id, x.type,
             x.payload, l.queue, l.priority, l.shard, 0, NULL, NULL, NULL, now(), now(), NULL
        FROM unnest(p_ids, p_types, p_payloads) WITH ORDINALITY AS x(id, type, payload, ord)
        CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l
      RETURNING slot)
    SELECT min(a.slot), count(*) INTO v_slot, v_n FROM appended a;
  ELSE
    WITH appended AS (
      INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                              attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                              trace_context)
      SELECT (SELECT current_slot FROM {{schema}}.ring_state), p_lane, v_base + x.ord - 1, x.id, x.type,
             x.payload, l.queue, l.priority, l.shard, coalesce(x.attempts, 0), x.max_attempts, x.dedupe_key,
             x.last_error, coalesce(x.created_at, now()), coalesce(x.run_at, now()), x.trace_context
        FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe, p_last_error,
                    p_created_at, p_run_at, p_trace_context) WITH ORDINALITY
               AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                    run_at, trace_context, ord)
        CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l
      RETURNING slot)
    SELECT min(a.slot), count(*) INTO v_slot, v_n FROM appended a;
  END IF;
  -- The ring rotated while this append ran (a new statement, a new snapshot): the entry may sit
  -- in a segment a claim's window left out. The bump, committed with the entry, makes every
  -- claim that can see the entry refresh its window (migration 13's header).
  IF v_n > 0 AND (SELECT current_slot FROM {{schema}}.ring_state) IS DISTINCT FROM v_slot THEN
    UPDATE {{schema}}.ring_state SET generation = generation + 1;
  END IF;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  IF v_n > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, p_lane::text); END IF;
  RETURN v_n;
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

-- Kept by CREATE OR REPLACE; said again so neither is ever executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION {{schema}}.append_ready(integer, bigint[], text[], jsonb[], integer[], integer[], text[],
  text[], timestamptz[], timestamptz[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[],
  integer[], text[], text) FROM PUBLIC;
