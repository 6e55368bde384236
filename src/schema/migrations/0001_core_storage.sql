-- name: core storage: lanes, ready ring, leases, settlements, deferred, dead letters
--
-- The ring tables have RING_SLOTS (src/schema/migrations.ts) partitions each, slots 0-15,
-- written out here; ring_state.slot_count records the same 16.

CREATE SEQUENCE {{schema}}.task_id_seq;

-- A lane is (queue, priority, shard). Its row is also the claim lock: a claim takes it
-- FOR UPDATE SKIP LOCKED, so one lane's entries are leased by one claimer at a time, in order.
CREATE TABLE {{schema}}.lanes (
  lane_id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL CHECK (shard BETWEEN 0 AND 63),
  -- Bumped by anything that tombstones an entry of the lane; see the claim for why.
  version bigint NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (queue, priority, shard)
);

-- Which ring partition new ready entries go to. One row; updated only on rotation.
CREATE TABLE {{schema}}.ring_state (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  current_slot smallint NOT NULL,
  slot_count smallint NOT NULL,
  generation bigint NOT NULL,
  rotated_at timestamptz NOT NULL
);
INSERT INTO {{schema}}.ring_state (current_slot, slot_count, generation, rotated_at)
VALUES (0, 16, 0, now());

-- Ready entries: append-only, lane-ordered (lane_seq from the lane's own sequence, reserved
-- under the lane lock). Never updated or deleted; a whole slot is reclaimed by TRUNCATE.
CREATE TABLE {{schema}}.ready (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  attempts integer NOT NULL,
  max_attempts integer,  -- NULL: the task type's setting, resolved at claim
  dedupe_key text,
  last_error text,
  created_at timestamptz NOT NULL,
  run_at timestamptz NOT NULL,
  appended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON {{schema}}.ready (id);

-- One row per claimed attempt, in the slot of the entry it leases. Insert-only.
-- max(lane_seq) per lane is the lane's claim cursor: claims lease entries in lane order.
CREATE TABLE {{schema}}.leases (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  type text NOT NULL,
  attempt integer NOT NULL,
  max_attempts integer NOT NULL,  -- effective limit for this attempt, resolved at claim
  token uuid NOT NULL,
  claimed_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL,
  worker text,
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON {{schema}}.leases (expires_at);

-- The end of an attempt: completed, failed, released, advanced, rescued. Insert-only; the
-- primary key is the fence arbiter: whoever inserts first for a lease settles it.
CREATE TABLE {{schema}}.settlements (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  outcome text NOT NULL,
  settled_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);

-- An unleased ready entry that no longer stands for its task (cancelled, removed inline, moved).
CREATE TABLE {{schema}}.tombstones (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  reason text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON {{schema}}.tombstones (id);

CREATE TABLE {{schema}}."ready_0" PARTITION OF {{schema}}.ready FOR VALUES IN (0);
CREATE TABLE {{schema}}."leases_0" PARTITION OF {{schema}}.leases FOR VALUES IN (0);
CREATE TABLE {{schema}}."settlements_0" PARTITION OF {{schema}}.settlements FOR VALUES IN (0);
CREATE TABLE {{schema}}."tombstones_0" PARTITION OF {{schema}}.tombstones FOR VALUES IN (0);
CREATE TABLE {{schema}}."ready_1" PARTITION OF {{schema}}.ready FOR VALUES IN (1);
CREATE TABLE {{schema}}."leases_1" PARTITION OF {{schema}}.leases FOR VALUES IN (1);
CREATE TABLE {{schema}}."settlements_1" PARTITION OF {{schema}}.settlements FOR VALUES IN (1);
CREATE TABLE {{schema}}."tombstones_1" PARTITION OF {{schema}}.tombstones FOR VALUES IN (1);
CREATE TABLE {{schema}}."ready_2" PARTITION OF {{schema}}.ready FOR VALUES IN (2);
CREATE TABLE {{schema}}."leases_2" PARTITION OF {{schema}}.leases FOR VALUES IN (2);
CREATE TABLE {{schema}}."settlements_2" PARTITION OF {{schema}}.settlements FOR VALUES IN (2);
CREATE TABLE {{schema}}."tombstones_2" PARTITION OF {{schema}}.tombstones FOR VALUES IN (2);
CREATE TABLE {{schema}}."ready_3" PARTITION OF {{schema}}.ready FOR VALUES IN (3);
CREATE TABLE {{schema}}."leases_3" PARTITION OF {{schema}}.leases FOR VALUES IN (3);
CREATE TABLE {{schema}}."settlements_3" PARTITION OF {{schema}}.settlements FOR VALUES IN (3);
CREATE TABLE {{schema}}."tombstones_3" PARTITION OF {{schema}}.tombstones FOR VALUES IN (3);
CREATE TABLE {{schema}}."ready_4" PARTITION OF {{schema}}.ready FOR VALUES IN (4);
CREATE TABLE {{schema}}."leases_4" PARTITION OF {{schema}}.leases FOR VALUES IN (4);
CREATE TABLE {{schema}}."settlements_4" PARTITION OF {{schema}}.settlements FOR VALUES IN (4);
CREATE TABLE {{schema}}."tombstones_4" PARTITION OF {{schema}}.tombstones FOR VALUES IN (4);
CREATE TABLE {{schema}}."ready_5" PARTITION OF {{schema}}.ready FOR VALUES IN (5);
CREATE TABLE {{schema}}."leases_5" PARTITION OF {{schema}}.leases FOR VALUES IN (5);
CREATE TABLE {{schema}}."settlements_5" PARTITION OF {{schema}}.settlements FOR VALUES IN (5);
CREATE TABLE {{schema}}."tombstones_5" PARTITION OF {{schema}}.tombstones FOR VALUES IN (5);
CREATE TABLE {{schema}}."ready_6" PARTITION OF {{schema}}.ready FOR VALUES IN (6);
CREATE TABLE {{schema}}."leases_6" PARTITION OF {{schema}}.leases FOR VALUES IN (6);
CREATE TABLE {{schema}}."settlements_6" PARTITION OF {{schema}}.settlements FOR VALUES IN (6);
CREATE TABLE {{schema}}."tombstones_6" PARTITION OF {{schema}}.tombstones FOR VALUES IN (6);
CREATE TABLE {{schema}}."ready_7" PARTITION OF {{schema}}.ready FOR VALUES IN (7);
CREATE TABLE {{schema}}."leases_7" PARTITION OF {{schema}}.leases FOR VALUES IN (7);
CREATE TABLE {{schema}}."settlements_7" PARTITION OF {{schema}}.settlements FOR VALUES IN (7);
CREATE TABLE {{schema}}."tombstones_7" PARTITION OF {{schema}}.tombstones FOR VALUES IN (7);
CREATE TABLE {{schema}}."ready_8" PARTITION OF {{schema}}.ready FOR VALUES IN (8);
CREATE TABLE {{schema}}."leases_8" PARTITION OF {{schema}}.leases FOR VALUES IN (8);
CREATE TABLE {{schema}}."settlements_8" PARTITION OF {{schema}}.settlements FOR VALUES IN (8);
CREATE TABLE {{schema}}."tombstones_8" PARTITION OF {{schema}}.tombstones FOR VALUES IN (8);
CREATE TABLE {{schema}}."ready_9" PARTITION OF {{schema}}.ready FOR VALUES IN (9);
CREATE TABLE {{schema}}."leases_9" PARTITION OF {{schema}}.leases FOR VALUES IN (9);
CREATE TABLE {{schema}}."settlements_9" PARTITION OF {{schema}}.settlements FOR VALUES IN (9);
CREATE TABLE {{schema}}."tombstones_9" PARTITION OF {{schema}}.tombstones FOR VALUES IN (9);
CREATE TABLE {{schema}}."ready_10" PARTITION OF {{schema}}.ready FOR VALUES IN (10);
CREATE TABLE {{schema}}."leases_10" PARTITION OF {{schema}}.leases FOR VALUES IN (10);
CREATE TABLE {{schema}}."settlements_10" PARTITION OF {{schema}}.settlements FOR VALUES IN (10);
CREATE TABLE {{schema}}."tombstones_10" PARTITION OF {{schema}}.tombstones FOR VALUES IN (10);
CREATE TABLE {{schema}}."ready_11" PARTITION OF {{schema}}.ready FOR VALUES IN (11);
CREATE TABLE {{schema}}."leases_11" PARTITION OF {{schema}}.leases FOR VALUES IN (11);
CREATE TABLE {{schema}}."settlements_11" PARTITION OF {{schema}}.settlements FOR VALUES IN (11);
CREATE TABLE {{schema}}."tombstones_11" PARTITION OF {{schema}}.tombstones FOR VALUES IN (11);
CREATE TABLE {{schema}}."ready_12" PARTITION OF {{schema}}.ready FOR VALUES IN (12);
CREATE TABLE {{schema}}."leases_12" PARTITION OF {{schema}}.leases FOR VALUES IN (12);
CREATE TABLE {{schema}}."settlements_12" PARTITION OF {{schema}}.settlements FOR VALUES IN (12);
CREATE TABLE {{schema}}."tombstones_12" PARTITION OF {{schema}}.tombstones FOR VALUES IN (12);
CREATE TABLE {{schema}}."ready_13" PARTITION OF {{schema}}.ready FOR VALUES IN (13);
CREATE TABLE {{schema}}."leases_13" PARTITION OF {{schema}}.leases FOR VALUES IN (13);
CREATE TABLE {{schema}}."settlements_13" PARTITION OF {{schema}}.settlements FOR VALUES IN (13);
CREATE TABLE {{schema}}."tombstones_13" PARTITION OF {{schema}}.tombstones FOR VALUES IN (13);
CREATE TABLE {{schema}}."ready_14" PARTITION OF {{schema}}.ready FOR VALUES IN (14);
CREATE TABLE {{schema}}."leases_14" PARTITION OF {{schema}}.leases FOR VALUES IN (14);
CREATE TABLE {{schema}}."settlements_14" PARTITION OF {{schema}}.settlements FOR VALUES IN (14);
CREATE TABLE {{schema}}."tombstones_14" PARTITION OF {{schema}}.tombstones FOR VALUES IN (14);
CREATE TABLE {{schema}}."ready_15" PARTITION OF {{schema}}.ready FOR VALUES IN (15);
CREATE TABLE {{schema}}."leases_15" PARTITION OF {{schema}}.leases FOR VALUES IN (15);
CREATE TABLE {{schema}}."settlements_15" PARTITION OF {{schema}}.settlements FOR VALUES IN (15);
CREATE TABLE {{schema}}."tombstones_15" PARTITION OF {{schema}}.tombstones FOR VALUES IN (15);

-- Future work: scheduled (run_at ahead) and retryable (backing off or rescued) tasks.
CREATE TABLE {{schema}}.deferred (
  id bigint PRIMARY KEY,
  state text NOT NULL CHECK (state IN ('scheduled', 'retryable')),
  type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  attempts integer NOT NULL,
  max_attempts integer,  -- NULL: the task type's setting, resolved at claim
  dedupe_key text,
  last_error text,
  created_at timestamptz NOT NULL,
  last_attempted_at timestamptz,
  run_at timestamptz NOT NULL
);
CREATE INDEX ON {{schema}}.deferred (run_at, priority, id);
CREATE INDEX ON {{schema}}.deferred (queue, priority, shard, run_at, id);

-- Exhausted tasks. History, not pending work: never blocks a new enqueue with the same key.
CREATE TABLE {{schema}}.dead_letters (
  id bigint PRIMARY KEY,
  type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  attempts integer NOT NULL,
  max_attempts integer,  -- NULL: the task type's setting, resolved at claim
  dedupe_key text,
  last_error text,
  created_at timestamptz NOT NULL,
  last_attempted_at timestamptz NOT NULL,
  died_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON {{schema}}.dead_letters (last_attempted_at);
CREATE INDEX ON {{schema}}.dead_letters (type);

-- At most one live task per dedupe key. Deleted when the task completes or dies.
CREATE TABLE {{schema}}.dedupe (
  dedupe_key text PRIMARY KEY,
  id bigint NOT NULL
);
CREATE INDEX ON {{schema}}.dedupe (id);

-- Lane provisioning runs as the schema owner (SECURITY DEFINER, fixed search_path), so a
-- runtime role without CREATE can open a lane and every runtime role can use its sequence.
CREATE FUNCTION {{schema}}.provision_lane(p_queue text, p_priority smallint, p_shard smallint)
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
  INSERT INTO {{schema}}.lanes (queue, priority, shard) VALUES (p_queue, p_priority, p_shard)
  ON CONFLICT DO NOTHING RETURNING lane_id INTO v_id;
  IF v_id IS NULL THEN
    SELECT lane_id INTO v_id FROM {{schema}}.lanes
     WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
    RETURN v_id;
  END IF;
  EXECUTE format('CREATE SEQUENCE %I.%I', {{schema_literal}}, 'lane_seq_' || v_id);
  RETURN v_id;
END $fn$;

-- Append entries to one lane, in array order. Takes the lane lock (held to commit) before
-- reserving sequence numbers, so a lane's entries become visible in lane_seq order.
CREATE FUNCTION {{schema}}.append_ready(
  p_lane integer, p_ids bigint[], p_types text[], p_payloads jsonb[], p_attempts integer[],
  p_max_attempts integer[], p_dedupe text[], p_last_error text[], p_created_at timestamptz[],
  p_run_at timestamptz[])
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_seq regclass; v_n integer;
BEGIN
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
  v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)::regclass;
  INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                          attempts, max_attempts, dedupe_key, last_error, created_at, run_at)
  SELECT (SELECT current_slot FROM {{schema}}.ring_state), p_lane, nextval(v_seq), u.id, u.type,
         u.payload, l.queue, l.priority, l.shard, u.attempts, u.max_attempts, u.dedupe_key,
         u.last_error, u.created_at, u.run_at
    FROM (SELECT * FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe,
                               p_last_error, p_created_at, p_run_at) WITH ORDINALITY
            AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                 run_at, ord)
          ORDER BY ord) u
    CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  IF v_n > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, p_lane::text); END IF;
  RETURN v_n;
END $fn$;

-- Promote one lane's oldest due deferred rows (up to p_limit): take the lane lock (subject to
-- the caller's lock_timeout), delete the rows (skipping any another transaction holds), and
-- append them in due order. Choosing the rows under the lane lock, rather than taking the ids a
-- batch selected earlier, keeps lane order = due order even when two promoters overlap.
CREATE FUNCTION {{schema}}.promote_lane(p_queue text, p_priority smallint, p_shard smallint,
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
           array_agg(m.run_at ORDER BY m.run_at, m.id))
    INTO v_n
    FROM moved m;
  RETURN coalesce(v_n, 0);
END $fn$;

-- Remove a task no worker holds (Dequeue with an empty token; admin cancel). A deferred row is
-- deleted; a ready entry gets a tombstone, under the lane row lock so no claim can lease it
-- between the check and the tombstone.
CREATE FUNCTION {{schema}}.remove_unleased(p_id bigint, p_reason text)
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
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.settlements st
                      WHERE st.lane_id = e.lane_id AND st.lane_seq = e.lane_seq AND st.slot = e.slot)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  -- Row-locks the lane (claims skip it meanwhile) and bumps its version, so a claim whose
  -- snapshot predates this tombstone sees the version change and leaves the lane alone.
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM {{schema}}.leases l
              WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq AND l.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, p_reason) ON CONFLICT DO NOTHING;
  DELETE FROM {{schema}}.dedupe WHERE id = p_id;
  RETURN 'removed';
END $fn$;

-- The producer's one statement: ids, dedupe, ready-or-deferred, and the wake NOTIFY (which
-- PostgreSQL delivers only on commit, once per transaction however many rows).
-- p_shard NULL picks the shard from the transaction id, so one transaction's batch shares a
-- lane (one lane lock) while concurrent producers spread over p_shards lanes.
CREATE FUNCTION {{schema}}.enqueue(
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
