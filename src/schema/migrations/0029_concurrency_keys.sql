-- name: concurrency keys: at most K running tasks per key across the fleet, the rest held in deferred storage
--
-- A task may carry a concurrency key (a tenant, an account, a document). At most K tasks with
-- the same key are in the ready ring or running at once, across every queue and worker; K is the
-- task type's key limit, else its queue's, else 1 (`key_limits`, set by operators).
--
-- The decision (docs/architecture.md, "Concurrency keys", has the alternatives rejected): a keyed
-- task waits for its key in deferred storage, never in a lane. A lane is FIFO and a range lease
-- takes a contiguous prefix, so a busy key's task at a lane's head could not be skipped without
-- breaking the claim cursor; kept out of the lanes, a busy key's backlog costs the lane nothing,
-- and the claim, the settlements and the rescue are unchanged. So:
--
-- * `task_keys (id, key)`: a task's key, by id, for the task's whole life: every move between
--   ready, deferred and dead letters keeps the id, so no statement that moves a task changes.
-- * A keyed task that is due and not yet admitted waits in `deferred` as state `held`, with
--   run_at 'infinity' (so promotion's due scan never reads it: a backlog of held tasks costs the
--   promoter nothing). A delayed keyed task waits as `scheduled` until it is due, like any
--   other; when promote_lane() finds a due keyed row (a delayed one, a retry, a snooze, a
--   release), it holds it instead of appending it.
-- * `key_holders (key, id)`: the tasks admitted under a key, each counted while its ring entry
--   stands (not settled, not tombstoned, its segment not pruned), so the count needs nothing of
--   the settlement paths: a task stops counting when whatever settles it commits.
-- * promote_held(keys) admits held tasks of each key up to its K, under the key's advisory lock
--   (try-lock: a key being admitted elsewhere is skipped, and the leader's next tick gets it),
--   oldest first by priority then id, into their own lanes through append_ready. Called by the
--   leader every promotion tick and when a keyed enqueue's NOTIFY (`keys`) wakes it, and by the
--   worker that settles a keyed task (release_keys), so the next task of a key starts at once.
-- * `held_keys (key)`: the keys that have held tasks, so the leader's tick reads only those.
--   Written only by promote_held, from `key_arrivals`: the paths that hold a task (a producer's
--   enqueue_keyed, promote_lane, retry_dead) append the key there, a table with no unique key, so
--   two producers of a new key never wait for each other's uncommitted row (a conflict on a
--   unique key would: an open transaction would hold up every producer of its key, and two
--   producers adding two new keys in opposite orders deadlocked).

ALTER TABLE {{schema}}.deferred DROP CONSTRAINT deferred_state_check;
ALTER TABLE {{schema}}.deferred ADD CONSTRAINT deferred_state_check
  CHECK (state IN ('scheduled', 'retryable', 'held')) NOT VALID;
ALTER TABLE {{schema}}.deferred VALIDATE CONSTRAINT deferred_state_check;

CREATE TABLE {{schema}}.task_keys (
  id bigint PRIMARY KEY,
  key text NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1024),
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON {{schema}}.task_keys (key, id);

CREATE TABLE {{schema}}.held_keys (
  key text PRIMARY KEY,
  since timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.key_arrivals (
  key text NOT NULL,
  at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.key_holders (
  key text NOT NULL,
  id bigint NOT NULL,
  -- The task's queue when it was admitted: which queues hold keyed tasks (workers free the keys
  -- of the tasks they settle in those queues).
  queue text NOT NULL,
  admitted_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (key, id)
);

-- Queues that have had keyed tasks admitted (written by promote_held, the leader and the
-- releasing workers only): what a worker reads once per poll to know whose settled tasks may
-- free a key. Never read per task.
CREATE TABLE {{schema}}.keyed_queues (
  queue text PRIMARY KEY
);

CREATE TABLE {{schema}}.key_limits (
  scope text NOT NULL CHECK (scope IN ('queue', 'type')),
  name text NOT NULL,
  per_key integer NOT NULL CHECK (per_key BETWEEN 1 AND 1000000),
  updated_at timestamptz NOT NULL DEFAULT now(),
  updated_by text NOT NULL,
  PRIMARY KEY (scope, name)
);

-- Whether task p_id has a ring entry that still stands: not tombstoned, not settled (an entry
-- past its lane's cursor is unleased, so unsettled), its segment not pruned (a segment is
-- truncated only once every entry in it is settled).
CREATE FUNCTION {{schema}}.key_entry_live(p_id bigint)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  -- No SET clause: a plain SQL function is inlined into the statement that calls it (planned once
  -- there), where one with SET would be planned anew, over every ring partition, per call.
  SELECT EXISTS (
    SELECT 1 FROM {{schema}}.ready r
     WHERE r.id = p_id
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                        WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
       AND NOT EXISTS (SELECT 1
                         FROM (SELECT l.from_seq, l.to_seq FROM {{schema}}.range_leases l
                                WHERE l.lane_id = r.lane_id AND l.slot = r.slot AND l.from_seq <= r.lane_seq
                                ORDER BY l.from_seq DESC LIMIT 1) l
                         JOIN {{schema}}.range_settlements x
                           ON x.lane_id = r.lane_id AND x.lease_from = l.from_seq AND x.slot = r.slot
                        WHERE l.to_seq >= r.lane_seq AND x.seqs @> r.lane_seq))
$fn$;

-- Admit held tasks of each key (NULL: the keys with held tasks after p_after in key order, at
-- most 1000: the leader walks them round-robin, so no key waits behind the first thousand) up
-- to its limit. Returns how many tasks were admitted and the last key visited.
--
-- Locks: the key's advisory lock, tried (a key being admitted elsewhere is skipped: the next call
-- visits it); each lane's lock tried too (a lane a producer holds skips that key for this call),
-- so a call never waits for a lock while holding others. A key's held_keys row is deleted (by the
-- leader) once it has had no held task for a minute; a task held meanwhile by a transaction not
-- yet committed is not lost by that: its key_arrivals row lists the key again on the next call.
CREATE FUNCTION {{schema}}.promote_held(p_keys text[], p_after text, OUT admitted integer, OUT last_key text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_key text;
  v_live integer;
  v_k integer;
  v_lane integer;
  r record;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'berth: promote_held must run at READ COMMITTED (a snapshot older than the key lock would miss admissions)'
      USING ERRCODE = '25000';
  END IF;
  admitted := 0;
  IF p_keys IS NULL THEN
    -- The leader's walk. Keys held since its last call: into held_keys (the arrivals of
    -- transactions not yet committed are not seen, and stay for the next call). Only the leader
    -- writes held_keys, so nothing else waits on its rows.
    WITH arrived AS (DELETE FROM {{schema}}.key_arrivals RETURNING key)
    INSERT INTO {{schema}}.held_keys (key)
    SELECT DISTINCT a.key FROM arrived a ORDER BY a.key
    ON CONFLICT DO NOTHING;
  END IF;
  FOR v_key IN
    (SELECT hk.key FROM {{schema}}.held_keys hk
      WHERE p_keys IS NULL AND (p_after IS NULL OR hk.key > p_after)
      ORDER BY hk.key LIMIT 1000)
    UNION ALL
    -- A releasing worker's keys, whether or not the leader has listed them yet.
    (SELECT DISTINCT u.k FROM unnest(p_keys) AS u(k) WHERE p_keys IS NOT NULL)
  LOOP
    last_key := v_key;
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended({{schema_literal}} || ':key:' || v_key, 0));
    -- Statements after the lock: each sees every admission committed before it was granted.
    DELETE FROM {{schema}}.key_holders h WHERE h.key = v_key AND NOT {{schema}}.key_entry_live(h.id);
    SELECT count(*) INTO v_live FROM {{schema}}.key_holders h WHERE h.key = v_key;
    LOOP
      -- The key's next held task, by priority then id, in a queue not paused (a paused queue's
      -- task admitted would hold its key until the resume).
      SELECT d.* INTO r FROM {{schema}}.task_keys tk JOIN {{schema}}.deferred d ON d.id = tk.id
       WHERE tk.key = v_key AND d.state = 'held'
         AND NOT EXISTS (SELECT 1 FROM {{schema}}.queue_pauses qp WHERE qp.queue = d.queue)
       ORDER BY d.priority, d.id LIMIT 1
       FOR UPDATE OF d SKIP LOCKED;
      EXIT WHEN NOT FOUND;
      -- K applies at admission: the task being admitted says which (its type's, else its queue's).
      v_k := coalesce((SELECT kl.per_key FROM {{schema}}.key_limits kl WHERE kl.scope = 'type' AND kl.name = r.type),
                      (SELECT kl.per_key FROM {{schema}}.key_limits kl WHERE kl.scope = 'queue' AND kl.name = r.queue),
                      1);
      EXIT WHEN v_live >= v_k;
      v_lane := {{schema}}.provision_lane(r.queue, r.priority, r.shard);
      EXIT WHEN NOT pg_try_advisory_xact_lock({{schema_lock_key}}, v_lane);
      DELETE FROM {{schema}}.deferred d WHERE d.id = r.id;
      PERFORM {{schema}}.append_ready(v_lane, ARRAY[r.id],
                ARRAY[r.type], ARRAY[r.payload], ARRAY[r.attempts], ARRAY[r.max_attempts], ARRAY[r.dedupe_key],
                ARRAY[r.last_error], ARRAY[r.created_at], ARRAY[now()], ARRAY[r.trace_context]);
      INSERT INTO {{schema}}.key_holders (key, id, queue) VALUES (v_key, r.id, r.queue) ON CONFLICT DO NOTHING;
      INSERT INTO {{schema}}.keyed_queues (queue) VALUES (r.queue) ON CONFLICT DO NOTHING;
      v_live := v_live + 1;
      admitted := admitted + 1;
    END LOOP;
    DELETE FROM {{schema}}.held_keys hk
     WHERE p_keys IS NULL AND hk.key = v_key AND hk.since < now() - interval '1 minute'
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.task_keys tk JOIN {{schema}}.deferred d ON d.id = tk.id
                        WHERE tk.key = v_key AND d.state = 'held');
  END LOOP;
END $fn$;

-- The worker that settled keyed tasks frees their keys: admit the next held tasks of the keys of
-- p_ids (ids that carry no key are ignored).
CREATE FUNCTION {{schema}}.release_keys(p_ids bigint[])
RETURNS integer LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT (SELECT p.admitted FROM {{schema}}.promote_held(
            ARRAY(SELECT DISTINCT tk.key FROM {{schema}}.task_keys tk WHERE tk.id = ANY (p_ids)), NULL) p)
   WHERE EXISTS (SELECT 1 FROM {{schema}}.task_keys tk WHERE tk.id = ANY (p_ids))
$fn$;

-- A keyed enqueue: enqueue() itself (its checks, ids, dedupe), told every task is due at the
-- end of time so each lands in deferred storage and none in a lane; then each accepted task gets
-- its key, a due one is held (a later one stays scheduled at its own time), and the leader is
-- woken (`keys`) to admit what its key allows. Admitting here, under the producer's transaction,
-- would take key locks and lane locks in the producer's own order and hold them to its commit.
CREATE FUNCTION {{schema}}.enqueue_keyed(
  p_queue text, p_priority smallint, p_shard smallint, p_shards smallint, p_types text[],
  p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[],
  p_trace_context text, p_keys text[])
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_n integer := coalesce(cardinality(p_types), 0);
  v_ords integer[];
  v_ids bigint[];
  v_states text[];
  v_dups bigint[];
BEGIN
  IF coalesce(cardinality(p_keys), -1) <> v_n OR coalesce(array_ndims(p_keys), 1) > 1 THEN
    RAISE EXCEPTION 'berth: enqueue_keyed: keys must be a one-dimensional array with one element per task (% types)', v_n
      USING ERRCODE = '22023';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(p_keys) k WHERE k IS NULL OR octet_length(k) NOT BETWEEN 1 AND 1024) THEN
    RAISE EXCEPTION 'berth: enqueue_keyed: every concurrency key must be a non-empty string of at most 1024 UTF-8 bytes'
      USING ERRCODE = '22023';
  END IF;
  -- The run times as given are checked here; enqueue() checks the rest.
  PERFORM {{schema}}.check_tasks('enqueue_keyed', p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe, p_trace_context);
  -- Separate statements: each one after enqueue() sees the rows it wrote (one statement's CTEs
  -- share a snapshot taken before the function ran).
  SELECT array_agg(x.ord ORDER BY x.ord), array_agg(x.id ORDER BY x.ord), array_agg(x.state ORDER BY x.ord),
         array_agg(x.duplicate_of ORDER BY x.ord)
    INTO v_ords, v_ids, v_states, v_dups
    FROM {{schema}}.enqueue(p_queue, p_priority, p_shard, p_shards, p_types, p_payloads,
                            array_fill('9999-12-31 00:00:00+00'::timestamptz, ARRAY[v_n]),
                            p_max_attempts, p_dedupe, p_trace_context) x;
  INSERT INTO {{schema}}.task_keys (id, key)
  SELECT u.id, u.k FROM unnest(v_ids, p_keys) AS u(id, k) WHERE u.id IS NOT NULL;
  UPDATE {{schema}}.deferred d
     SET state = CASE WHEN u.run_at <= now() THEN 'held' ELSE 'scheduled' END,
         run_at = CASE WHEN u.run_at <= now() THEN 'infinity'::timestamptz ELSE u.run_at END
    FROM (SELECT v.id, coalesce(v.r, now()) AS run_at
            FROM unnest(v_ids, coalesce(p_run_at, array_fill(NULL::timestamptz, ARRAY[v_n]))) AS v(id, r)) u
   WHERE d.id = u.id AND u.id IS NOT NULL;
  INSERT INTO {{schema}}.key_arrivals (key)
  SELECT DISTINCT u.k FROM unnest(v_ids, p_keys) AS u(id, k)
    JOIN {{schema}}.deferred d ON d.id = u.id AND d.state = 'held';
  RETURN QUERY
  SELECT u.o, u.i,
         CASE WHEN u.i IS NULL THEN u.s ELSE (SELECT d.state FROM {{schema}}.deferred d WHERE d.id = u.i) END,
         u.dup
    FROM unnest(v_ords, v_ids, v_states, v_dups) AS u(o, i, s, dup)
   ORDER BY u.o;
  PERFORM pg_notify({{wake_channel_literal}}, 'keys');
END $fn$;

-- promote_lane as in migration 12, except that a due keyed row is held (state `held`, run_at
-- 'infinity', its key in held_keys) instead of appended: only promote_held admits a keyed task.
-- The key of each row is one primary-key probe of
-- task_keys (LATERAL … LIMIT 1: a generic plan must not turn it into a hashed read of the table).
CREATE OR REPLACE FUNCTION {{schema}}.promote_lane(p_queue text, p_priority smallint, p_shard smallint,
                                  p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_lane integer;
  v_n integer;
  v_ids bigint[];
  v_keys text[];
  v_plain bigint[];
  v_hold bigint[] := '{}';
  v_held integer := 0;
BEGIN
  v_lane := {{schema}}.provision_lane(p_queue, p_priority, p_shard);
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, v_lane);
  -- Locked first so a busy lane times out before any row is taken; append_ready re-takes it.
  SELECT array_agg(x.id ORDER BY x.run_at, x.id), array_agg(k.key ORDER BY x.run_at, x.id)
    INTO v_ids, v_keys
    FROM (SELECT d.id, d.run_at FROM {{schema}}.deferred d
           WHERE d.queue = p_queue AND d.priority = p_priority AND d.shard = p_shard
             AND d.run_at <= now()
           ORDER BY d.run_at, d.priority, d.id
           LIMIT p_limit
           FOR UPDATE SKIP LOCKED) x
    LEFT JOIN LATERAL (SELECT tk.key FROM {{schema}}.task_keys tk WHERE tk.id = x.id LIMIT 1) k ON true;
  IF v_ids IS NULL THEN RETURN 0; END IF;
  v_plain := ARRAY(SELECT u.id FROM unnest(v_ids, v_keys) AS u(id, k) WHERE u.k IS NULL);
  IF cardinality(v_plain) < cardinality(v_ids) THEN
    v_hold := ARRAY(SELECT u.id FROM unnest(v_ids, v_keys) AS u(id, k) WHERE u.k IS NOT NULL);
    UPDATE {{schema}}.deferred d SET state = 'held', run_at = 'infinity' WHERE d.id = ANY (v_hold);
    GET DIAGNOSTICS v_held = ROW_COUNT;
    INSERT INTO {{schema}}.key_arrivals (key)
    SELECT DISTINCT tk.key FROM {{schema}}.task_keys tk WHERE tk.id = ANY (v_hold);
    IF v_held > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, 'keys'); END IF;
  END IF;
  WITH moved AS (
    DELETE FROM {{schema}}.deferred d WHERE d.id = ANY (v_plain) RETURNING d.*
  )
  SELECT {{schema}}.append_ready(v_lane,
           array_agg(m.id ORDER BY m.run_at, m.id), array_agg(m.type ORDER BY m.run_at, m.id),
           array_agg(m.payload ORDER BY m.run_at, m.id), array_agg(m.attempts ORDER BY m.run_at, m.id),
           array_agg(m.max_attempts ORDER BY m.run_at, m.id), array_agg(m.dedupe_key ORDER BY m.run_at, m.id),
           array_agg(m.last_error ORDER BY m.run_at, m.id), array_agg(m.created_at ORDER BY m.run_at, m.id),
           array_agg(m.run_at ORDER BY m.run_at, m.id), array_agg(m.trace_context ORDER BY m.run_at, m.id))
    INTO v_n
    FROM moved m;
  RETURN coalesce(v_n, 0) + v_held;
END $fn$;

-- retry_dead as in migration 12, except that a keyed dead letter goes back to deferred storage,
-- held for its key, rather than straight into its lane.
CREATE OR REPLACE FUNCTION {{schema}}.retry_dead(p_ids bigint[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_lane record; v_done bigint[] := '{}'; v_part bigint[]; v_held bigint[];
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
      DELETE FROM {{schema}}.dead_letters d USING cand WHERE d.id = cand.id
      RETURNING d.*, EXISTS (SELECT 1 FROM {{schema}}.task_keys tk WHERE tk.id = d.id) AS keyed
    ), keys AS (
      INSERT INTO {{schema}}.dedupe (dedupe_key, id)
      SELECT g.dedupe_key, g.id FROM gone g WHERE g.dedupe_key IS NOT NULL
      ON CONFLICT DO NOTHING RETURNING 1
    ), held AS (
      INSERT INTO {{schema}}.deferred (id, state, run_at, type, payload, queue, priority, shard, attempts,
                                       max_attempts, dedupe_key, last_error, created_at, trace_context)
      SELECT g.id, 'held', 'infinity', g.type, g.payload, g.queue, g.priority, g.shard, 0, g.max_attempts,
             g.dedupe_key, g.last_error, g.created_at, g.trace_context
        FROM gone g WHERE g.keyed
      RETURNING deferred.id
    ), held_key AS (
      INSERT INTO {{schema}}.key_arrivals (key)
      SELECT DISTINCT tk.key FROM held h JOIN {{schema}}.task_keys tk ON tk.id = h.id
      RETURNING 1
    ), appended AS (
      SELECT {{schema}}.append_ready({{schema}}.provision_lane(v_lane.queue, v_lane.priority, v_lane.shard),
               array_agg(g.id ORDER BY g.id), array_agg(g.type ORDER BY g.id),
               array_agg(g.payload ORDER BY g.id), array_agg(0 ORDER BY g.id),
               array_agg(g.max_attempts ORDER BY g.id), array_agg(g.dedupe_key ORDER BY g.id),
               array_agg(g.last_error ORDER BY g.id), array_agg(g.created_at ORDER BY g.id),
               array_agg(now() ORDER BY g.id), array_agg(g.trace_context ORDER BY g.id)) AS n,
             array_agg(g.id) AS ids
        FROM gone g WHERE NOT g.keyed
      HAVING count(*) > 0
    )
    SELECT (SELECT a.ids FROM appended a), ARRAY(SELECT h.id FROM held h) INTO v_part, v_held
     WHERE (SELECT count(*) FROM keys) >= 0 AND (SELECT count(*) FROM held_key) >= 0;
    v_done := v_done || coalesce(v_part, '{}') || coalesce(v_held, '{}');
  END LOOP;
  IF EXISTS (SELECT 1 FROM {{schema}}.task_keys tk WHERE tk.id = ANY (v_done)) THEN
    PERFORM pg_notify({{wake_channel_literal}}, 'keys');
  END IF;
  RETURN QUERY
    SELECT x.id,
           CASE WHEN x.id = ANY (v_done) THEN 'retried'
                WHEN EXISTS (SELECT 1 FROM {{schema}}.dead_letters d WHERE d.id = x.id) THEN 'duplicate'
                ELSE 'not_found' END
      FROM unnest(p_ids) AS x(id);
END $fn$;

-- move_task as in migration 20, taking the destination queue's lock before any lane row lock.
CREATE OR REPLACE FUNCTION {{schema}}.move_task(p_id bigint, p_queue text, p_priority smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  IF p_id IS NULL OR p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: move_task arguments must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM {{schema}}.check_queue('move_task', p_queue);
  -- The destination queue's lock first, before any lane row: provision_lane takes it for a new
  -- lane, and set_queue_paused / set_queue_limit take it and then update the queue's lanes, so
  -- taking it after locking a lane row (the version bump below) deadlocked against them.
  PERFORM pg_advisory_xact_lock(hashtextextended({{queue_lock_prefix_literal}} || p_queue, 0));
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

-- Keys of tasks that are gone (completed, cancelled, deleted, pruned from the dead letters),
-- at most p_limit a call: the leader's retention branch.
CREATE FUNCTION {{schema}}.prune_task_keys(p_limit integer)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  WITH gone AS (
    SELECT tk.id FROM {{schema}}.task_keys tk
     WHERE tk.created_at < now() - interval '1 minute'
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = tk.id)
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.dead_letters d WHERE d.id = tk.id)
       AND NOT {{schema}}.key_entry_live(tk.id)
     ORDER BY tk.id LIMIT p_limit
  )
  DELETE FROM {{schema}}.task_keys tk USING gone WHERE tk.id = gone.id;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  DELETE FROM {{schema}}.key_holders h
   WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.task_keys tk WHERE tk.id = h.id);
  DELETE FROM {{schema}}.keyed_queues q
   WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.key_holders h WHERE h.queue = q.queue);
  RETURN v_n;
END $fn$;

-- Set (p_per_key) or clear (NULL) the key limit of a queue or a task type: an operator's.
CREATE FUNCTION {{schema}}.set_key_limit(p_scope text, p_name text, p_per_key integer, p_actor text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF p_scope IS NULL OR p_name IS NULL OR p_actor IS NULL THEN
    RAISE EXCEPTION 'berth: set_key_limit: scope, name and actor must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_per_key IS NULL THEN
    DELETE FROM {{schema}}.key_limits WHERE scope = p_scope AND name = p_name;
  ELSE
    INSERT INTO {{schema}}.key_limits (scope, name, per_key, updated_at, updated_by)
    VALUES (p_scope, p_name, p_per_key, now(), p_actor)
    ON CONFLICT (scope, name) DO UPDATE
      SET per_key = EXCLUDED.per_key, updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by;
  END IF;
  -- A raised limit may admit held tasks at once.
  PERFORM pg_notify({{wake_channel_literal}}, 'keys');
END $fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.key_entry_live(bigint), {{schema}}.promote_held(text[], text),
  {{schema}}.release_keys(bigint[]),
  {{schema}}.enqueue_keyed(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[], integer[], text[], text, text[]),
  {{schema}}.promote_lane(text, smallint, smallint, integer), {{schema}}.retry_dead(bigint[]),
  {{schema}}.prune_task_keys(integer), {{schema}}.set_key_limit(text, text, integer, text),
  {{schema}}.move_task(bigint, text, smallint) FROM PUBLIC;
