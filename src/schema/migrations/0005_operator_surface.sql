-- name: operator surface: queue pause, worker heartbeats, per-minute outcome counts, dead-letter retry, audit log

-- A paused queue's lanes carry paused = true: discovery and the claim skip them (the claim
-- re-reads the column on the locked row, and pausing bumps version, so a claim with an older
-- snapshot leaves the lane alone too). queue_pauses is the queue-level record, so a lane
-- opened later for a paused queue starts paused.
ALTER TABLE {{schema}}.lanes ADD COLUMN paused boolean NOT NULL DEFAULT false;

CREATE TABLE {{schema}}.queue_pauses (
  queue text PRIMARY KEY,
  paused_at timestamptz NOT NULL DEFAULT now(),
  paused_by text NOT NULL,
  reason text
);

-- Same as migration 1's, plus: a new lane takes its queue's pause state, under the queue lock
-- set_queue_paused holds, so a lane opened while a pause commits cannot come out unpaused.
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

-- Pause or resume a queue. Returns the number of lanes whose state changed. Resuming wakes the
-- workers with one notification per lane (delivered at commit).
CREATE FUNCTION {{schema}}.set_queue_paused(p_queue text, p_paused boolean, p_actor text, p_reason text)
RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer; v_lane integer;
BEGIN
  IF p_queue IS NULL OR p_paused IS NULL OR p_actor IS NULL THEN
    RAISE EXCEPTION 'berth: set_queue_paused arguments must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended({{queue_lock_prefix_literal}} || p_queue, 0));
  IF p_paused THEN
    INSERT INTO {{schema}}.queue_pauses (queue, paused_by, reason) VALUES (p_queue, p_actor, p_reason)
    ON CONFLICT (queue) DO NOTHING;
  ELSE
    DELETE FROM {{schema}}.queue_pauses WHERE queue = p_queue;
  END IF;
  UPDATE {{schema}}.lanes SET paused = p_paused, version = version + 1
   WHERE queue = p_queue AND paused IS DISTINCT FROM p_paused;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF NOT p_paused THEN
    FOR v_lane IN SELECT lane_id FROM {{schema}}.lanes WHERE queue = p_queue LOOP
      PERFORM pg_notify({{wake_channel_literal}}, v_lane::text);
    END LOOP;
  END IF;
  RETURN v_n;
END $fn$;

-- One row per live worker process, upserted on its heartbeat and deleted on a clean stop. The
-- leader's row carries its maintenance branch statistics and the lanes its promoter waits on.
CREATE TABLE {{schema}}.workers (
  worker_id text PRIMARY KEY,
  host text NOT NULL,
  pid integer NOT NULL,
  queues text[],
  slots integer NOT NULL,
  busy integer NOT NULL,
  prefetched integer NOT NULL,
  leader boolean NOT NULL,
  maintenance jsonb NOT NULL DEFAULT '{}',
  started_at timestamptz NOT NULL,
  last_seen_at timestamptz NOT NULL
);

-- Handler outcomes per minute, per worker (each worker writes only its own rows, so there is
-- no shared hot row): what throughput and failure charts and rates read. Pruned by retention.
CREATE TABLE {{schema}}.outcome_counts (
  minute timestamptz NOT NULL,
  worker_id text NOT NULL,
  queue text NOT NULL,
  type text NOT NULL,
  outcome text NOT NULL,
  count bigint NOT NULL,
  PRIMARY KEY (minute, worker_id, queue, type, outcome)
);

-- Every operator action (CLI or dashboard): who, what, on what, with what result.
CREATE TABLE {{schema}}.audit_log (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  actor text NOT NULL,
  action text NOT NULL,
  target jsonb NOT NULL,
  result jsonb NOT NULL
);
CREATE INDEX ON {{schema}}.audit_log (at);
CREATE INDEX ON {{schema}}.dead_letters (queue, id);

-- Retry dead letters: each goes back to the ready ring with a fresh attempt budget (attempts 0,
-- its last error kept). A dead letter whose dedupe key is now held by a live task stays where it
-- is ('duplicate'): at most one live task per key. Of several dead letters sharing a key only
-- the newest is retried. Returns one row per id: 'retried', 'duplicate' or 'not_found'.
CREATE FUNCTION {{schema}}.retry_dead(p_ids bigint[])
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
               array_agg(now() ORDER BY g.id)) AS n,
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

-- Operators only, except what a worker's heartbeat needs (granted by grantRuntimeRole).
REVOKE EXECUTE ON FUNCTION {{schema}}.set_queue_paused(text, boolean, text, text), {{schema}}.retry_dead(bigint[]) FROM PUBLIC;
