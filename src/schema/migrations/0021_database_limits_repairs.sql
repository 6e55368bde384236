-- name: database limits, second pass: a lane that exists keeps working, one-dimensional arrays, run times rounded by a day
--
-- A review of migration 20 found three places where its checks refused what they should not:
--
-- - provision_lane() checked the queue's size before it looked the lane up. Promotion appends
--   every scheduled or retried task through it, so a lane opened before the 255-byte queue limit
--   (by an older client, or in SQL before migration 20) could no longer take back its own
--   scheduled and retrying tasks: they stayed in deferred storage, due and never run. The check
--   now applies only when a lane is created; an existing lane is returned as before.
-- - check_tasks() compared cardinality(), which counts every element of a multi-dimensional
--   array, while enqueue() counts tasks along the first dimension: a 2x2 types array passed the
--   check and failed later with a not-null violation (23502) instead of a clear 22023. Arrays
--   must now be one-dimensional.
-- - The run-time bounds were exact to the millisecond, while the client bounds a delay against
--   its own clock and the server adds it to now() in floating point (the longest delay the
--   client accepts arrived as 9999-12-31 23:59:59.999916), and a client in a time zone whose
--   historical offset is not whole minutes sends year 1 a few seconds early. The database now
--   takes a run time from a day before year 1 up to the end of year 9999: the client's checks
--   stay the exact ones; the database's keep out what no client sends.
--
-- Running fleets of the previous version are unaffected: the signatures are unchanged, and
-- each function is replaced in place, keeping its grants.

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
  SELECT lane_id INTO v_id FROM {{schema}}.lanes
   WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
  IF FOUND THEN RETURN v_id; END IF;
  -- Only a new lane is checked: a lane that exists (one opened before the limit) keeps working.
  PERFORM {{schema}}.check_queue('provision_lane', p_queue);
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

CREATE OR REPLACE FUNCTION {{schema}}.check_tasks(
  p_fn text, p_types text[], p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[],
  p_trace_context text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_n integer := coalesce(cardinality(p_types), 0);
  x record;
BEGIN
  IF coalesce(array_ndims(p_types), 1) > 1 OR coalesce(array_ndims(p_payloads), 1) > 1
     OR coalesce(array_ndims(p_run_at), 1) > 1 OR coalesce(array_ndims(p_max_attempts), 1) > 1
     OR coalesce(array_ndims(p_dedupe), 1) > 1 THEN
    RAISE EXCEPTION 'berth: %: types, payloads, run_at, max_attempts and dedupe must be one-dimensional arrays', p_fn
      USING ERRCODE = '22023';
  END IF;
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
      OR u.r < '0001-01-01 00:00:00+00'::timestamptz - interval '1 day' OR u.r >= '10000-01-01 00:00:00+00'::timestamptz
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

