-- name: task dependencies: a task that waits for other tasks to complete, released by the completion that frees it
--
-- A task enqueued with `dependsOn` is not claimable until every task it depends on (its
-- parents) has completed. docs/architecture.md, "Task dependencies", has the decision, the
-- alternatives rejected and the invariants; in short:
--
-- * A dependent that still waits lives in `deferred` as state `waiting`, run_at 'infinity', as a
--   keyed task waits as `held`: promotion's due scan never reads it, no lane holds it, so the
--   claim, the cursor and rescue do not change, and a backlog of waiting tasks costs nothing.
-- * `task_deps (parent_id, child_id)`: one row per edge, written with the child in the same
--   transaction and never added later (a child's parents are fixed when it is enqueued).
--   `satisfied_at` is set once, when the parent's completion is counted: the once-token.
--   `watched`: the edge is not sure to be released by the parent's own completion (below), so
--   the leader looks at its parent every tick.
-- * `task_waits (id, pending)`: a waiting child's count of unsatisfied edges, decremented under
--   its row lock, so of two parents completing at once on two sessions exactly one sees zero.
-- * A ring entry whose task has unsatisfied dependents carries `ready.has_dependents` (NULL for
--   every other entry: no byte). The claim returns it; the worker's completion of such a task
--   calls release_completed() in the completion's own transaction, so a dependent is freed
--   exactly when the completion commits, never before and never lost to a crash in between.
--   The mark is written by the append: enqueue_graph() for a parent of the same call, and
--   promote_lane() (one probe of task_deps per promoted row) for every later append, so a
--   parent retried, snoozed or delayed is marked again.
-- * Edges whose parent's entry cannot be sure to carry the mark are `watched`: a parent that
--   existed before the call (its entry may be in the ring already, unmarked), a keyed parent
--   (promote_held appends without the probe), a parent that died, was cancelled, deleted or
--   moved (the trigger and hooks below flip the flag). The leader's `deps` branch reads the fate
--   of each watched parent every promotion tick: completed → release; dead → its dependents'
--   policy; cancelled, deleted or unknown → its dependents are cancelled.
-- * The backstop: a BEFORE TRUNCATE trigger on each `ready` partition releases, in the prune's
--   transaction and before its entries go, every completed parent of the segment that still has
--   an unsatisfied edge (an older worker's completion, a watch the leader had not reached). A
--   producer that names a parent in the ring key-share-locks its entry, which holds the prune of
--   the segment (TRUNCATE needs the partition to itself) until the producer commits.

ALTER TABLE {{schema}}.deferred DROP CONSTRAINT deferred_state_check;
ALTER TABLE {{schema}}.deferred ADD CONSTRAINT deferred_state_check
  CHECK (state IN ('scheduled', 'retryable', 'held', 'waiting')) NOT VALID;
ALTER TABLE {{schema}}.deferred VALIDATE CONSTRAINT deferred_state_check;

-- NULL for every entry without dependents: adds no byte (the null bitmap exists already).
ALTER TABLE {{schema}}.ready ADD COLUMN has_dependents boolean;

CREATE TABLE {{schema}}.task_deps (
  parent_id bigint NOT NULL,
  child_id bigint NOT NULL,
  parent_type text NOT NULL,
  satisfied_at timestamptz,
  watched boolean NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX task_deps_child ON {{schema}}.task_deps (child_id, parent_id);
CREATE INDEX task_deps_watched ON {{schema}}.task_deps (parent_id) WHERE watched AND satisfied_at IS NULL;

CREATE TABLE {{schema}}.task_waits (
  id bigint PRIMARY KEY,
  pending integer NOT NULL CHECK (pending >= 0),
  on_parent_failure text NOT NULL CHECK (on_parent_failure IN ('cancel', 'wait')),
  -- Its own runAt or delay (the run time it will have once released), NULL: due at release.
  run_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now()
);


-- append_ready_marked: append_ready as in migration 18, with a 12th argument: which entries have
-- dependents (`ready.has_dependents`); called by promote_lane, enqueue_graph and the release.
-- A function of its own, not append_ready with a new argument: dropping append_ready to add one
-- broke every live session of the previous version (its cached plans of enqueue() and the rest
-- named the dropped function: "cache lookup failed for function", migration-22.test.ts's fleet).
-- append_ready stays as migration 18 made it, for every caller that marks nothing.
CREATE FUNCTION {{schema}}.append_ready_marked(
  p_lane integer, p_ids bigint[], p_types text[], p_payloads jsonb[], p_attempts integer[],
  p_max_attempts integer[], p_dedupe text[], p_last_error text[], p_created_at timestamptz[],
  p_run_at timestamptz[], p_trace_context text[] DEFAULT NULL, p_has_dependents boolean[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_seq regclass;
  -- The rows the unnest below makes: as many as the longest array (callers pass equal lengths).
  v_n integer := coalesce(greatest(cardinality(p_ids), cardinality(p_types), cardinality(p_payloads),
    cardinality(p_attempts), cardinality(p_max_attempts), cardinality(p_dedupe),
    cardinality(p_last_error), cardinality(p_created_at), cardinality(p_run_at)), 0);
  v_base bigint;
  v_slot smallint;
  v_now smallint;
  v_done integer;
BEGIN
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
  IF v_n = 0 THEN RETURN 0; END IF;
  v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)::regclass;
  -- Every appender to the lane holds the lane lock (taken above, held to commit) while it draws
  -- from the lane's sequence, so v_base .. v_base + v_n - 1 are this call's alone.
  v_base := nextval(v_seq);
  IF v_n > 1 THEN PERFORM setval(v_seq, v_base + v_n - 1); END IF;
  -- The segment is the epoch's, read outside the snapshot (see the header), once per INSERT (an
  -- uncorrelated subquery: one InitPlan, so every row of the call goes to the same segment).
  -- Every caller passes whole rows (promotion, the release, enqueue_graph): no three-array path.
  WITH appended AS (
    INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                            attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                            trace_context, has_dependents)
    SELECT (SELECT (e.last_value % rs.slot_count)::smallint FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs),
           p_lane,
           v_base + x.ord - 1, x.id, x.type, x.payload, l.queue, l.priority, l.shard, coalesce(x.attempts, 0),
           x.max_attempts, x.dedupe_key, x.last_error, coalesce(x.created_at, now()), coalesce(x.run_at, now()),
           x.trace_context, CASE WHEN x.has_dependents THEN true END
      FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe, p_last_error,
                  p_created_at, p_run_at, p_trace_context, p_has_dependents) WITH ORDINALITY
             AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                  run_at, trace_context, has_dependents, ord)
      CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l
    RETURNING slot)
  SELECT min(a.slot), count(*) INTO v_slot, v_done FROM appended a;
  -- Every row or none: the lane's row is always visible here (provision_lane returned it), but a
  -- task that vanished silently would be a lost one.
  IF v_done <> v_n THEN
    RAISE EXCEPTION 'berth: append_ready wrote % of % entries of lane %', v_done, v_n, p_lane
      USING ERRCODE = '40001', HINT = 'retry the transaction';
  END IF;
  -- The ring rotated while this append ran: its rows move to the segment that is current now
  -- (they are this transaction's own, seen by nobody else), until two reads agree.
  LOOP
    SELECT (e.last_value % rs.slot_count)::smallint INTO v_now FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs;
    EXIT WHEN v_now = v_slot;
    WITH moved AS (
      DELETE FROM {{schema}}.ready r
       WHERE r.slot = v_slot AND r.lane_id = p_lane AND r.lane_seq BETWEEN v_base AND v_base + v_n - 1
      RETURNING r.*)
    INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                                  attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                                  appended_at, trace_context, has_dependents)
    SELECT v_now, m.lane_id, m.lane_seq, m.id, m.type, m.payload, m.queue, m.priority, m.shard, m.attempts,
           m.max_attempts, m.dedupe_key, m.last_error, m.created_at, m.run_at, m.appended_at, m.trace_context,
           m.has_dependents
      FROM moved m;
    v_slot := v_now;
  END LOOP;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  PERFORM pg_notify({{wake_channel_literal}}, p_lane::text);
  RETURN v_n;
END $fn$;


-- promote_lane as in migration 29, with each promoted row's mark: one probe of task_deps's primary
-- key per row (beside the probe of task_keys), so a parent retried, snoozed, delayed or released
-- comes back to its lane marked and its completion releases its dependents.
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
  v_marks boolean[];
  v_marked bigint[];
  v_held integer := 0;
BEGIN
  v_lane := {{schema}}.provision_lane(p_queue, p_priority, p_shard);
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, v_lane);
  -- Locked first so a busy lane times out before any row is taken; append_ready re-takes it.
  SELECT array_agg(x.id ORDER BY x.run_at, x.id), array_agg(k.key ORDER BY x.run_at, x.id),
         array_agg(dp.marked ORDER BY x.run_at, x.id)
    INTO v_ids, v_keys, v_marks
    FROM (SELECT d.id, d.run_at FROM {{schema}}.deferred d
           WHERE d.queue = p_queue AND d.priority = p_priority AND d.shard = p_shard
             AND d.run_at <= now()
           ORDER BY d.run_at, d.priority, d.id
           LIMIT p_limit
           FOR UPDATE SKIP LOCKED) x
    LEFT JOIN LATERAL (SELECT tk.key FROM {{schema}}.task_keys tk WHERE tk.id = x.id LIMIT 1) k ON true
    LEFT JOIN LATERAL (SELECT true AS marked FROM {{schema}}.task_deps td
                        WHERE td.parent_id = x.id AND td.satisfied_at IS NULL LIMIT 1) dp ON true;
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
  v_marked := ARRAY(SELECT u.id FROM unnest(v_ids, v_marks) AS u(id, m) WHERE u.m);
  WITH moved AS (
    DELETE FROM {{schema}}.deferred d WHERE d.id = ANY (v_plain) RETURNING d.*
  )
  SELECT {{schema}}.append_ready_marked(v_lane,
           array_agg(m.id ORDER BY m.run_at, m.id), array_agg(m.type ORDER BY m.run_at, m.id),
           array_agg(m.payload ORDER BY m.run_at, m.id), array_agg(m.attempts ORDER BY m.run_at, m.id),
           array_agg(m.max_attempts ORDER BY m.run_at, m.id), array_agg(m.dedupe_key ORDER BY m.run_at, m.id),
           array_agg(m.last_error ORDER BY m.run_at, m.id), array_agg(m.created_at ORDER BY m.run_at, m.id),
           array_agg(m.run_at ORDER BY m.run_at, m.id), array_agg(m.trace_context ORDER BY m.run_at, m.id),
           CASE WHEN cardinality(v_marked) > 0
                THEN array_agg(m.id = ANY (v_marked) ORDER BY m.run_at, m.id) END)
    INTO v_n
    FROM moved m;
  RETURN coalesce(v_n, 0) + v_held;
END $fn$;


-- Where task p_id stands, for its dependents, in one snapshot: `pending` (deferred in any state,
-- or a ring entry not settled), `completed` (its latest entry settled completed, or tombstoned by
-- a dequeue: the producer did the work; or, its segment reclaimed, a success in attempt history
-- or a stored result), `dead` (a dead letter), `cancelled` (an operator's cancel), `deleted` (a
-- pending task deleted), `unknown` (nowhere: never enqueued, a dead letter deleted, or gone
-- without a trace).
CREATE FUNCTION {{schema}}.task_fate(p_id bigint)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT CASE
    WHEN EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = p_id) THEN 'pending'
    WHEN EXISTS (SELECT 1 FROM {{schema}}.dead_letters d WHERE d.id = p_id) THEN 'dead'
    ELSE coalesce(
      (SELECT CASE WHEN t.reason = 'dequeued' THEN 'completed'
                   WHEN t.reason = 'cancelled' THEN 'cancelled'
                   WHEN t.reason = 'moved' THEN 'pending'
                   WHEN t.reason IS NOT NULL THEN 'deleted'
                   WHEN s.outcome = 'completed' THEN 'completed'
                   -- Only cancel_tasks writes this outcome, with or without an actor.
                   WHEN s.outcome = 'cancelled' THEN 'cancelled'
                   -- Settled otherwise (failed, rescued, snoozed, released), yet neither deferred
                   -- nor a dead letter in this snapshot (every such settlement moves its task in
                   -- its own statement): its dead letter was deleted, purged or pruned, or its
                   -- retry was cancelled. Attempt history says which, else `unknown`.
                   WHEN s.outcome IS NOT NULL THEN NULL
                   ELSE 'pending' END
         FROM {{schema}}.ready e
         LEFT JOIN {{schema}}.tombstones t ON t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot
         LEFT JOIN LATERAL (
           SELECT x.outcome, x.actor
             FROM (SELECT l.from_seq, l.to_seq FROM {{schema}}.range_leases l
                    WHERE l.lane_id = e.lane_id AND l.slot = e.slot AND l.from_seq <= e.lane_seq
                    ORDER BY l.from_seq DESC LIMIT 1) l
             JOIN {{schema}}.range_settlements x
               ON x.lane_id = e.lane_id AND x.lease_from = l.from_seq AND x.slot = e.slot
            WHERE l.to_seq >= e.lane_seq AND x.seqs @> e.lane_seq
            LIMIT 1) s ON true
        WHERE e.id = p_id
        ORDER BY e.appended_at DESC LIMIT 1),
      (SELECT CASE WHEN h.outcome = 'success' THEN 'completed' ELSE 'cancelled' END
         FROM {{schema}}.attempt_history h
        WHERE h.bucket = p_id >> 10 AND p_id = ANY (h.ids)
          AND (h.outcome = 'success' OR (h.outcome = 'cancelled' AND (h.error ->> 'name') = 'Cancel'))
        ORDER BY (h.outcome = 'cancelled') DESC, h.settled_at DESC LIMIT 1),
      (SELECT 'completed' FROM {{schema}}.task_results r WHERE r.id = p_id),
      'unknown')
  END
$fn$;

-- A task's type wherever it stands (for an edge to a parent enqueued earlier), else NULL.
CREATE FUNCTION {{schema}}.task_type_of(p_id bigint)
RETURNS text LANGUAGE sql STABLE AS $fn$
  SELECT coalesce(
    (SELECT d.type FROM {{schema}}.deferred d WHERE d.id = p_id),
    (SELECT e.type FROM {{schema}}.ready e WHERE e.id = p_id ORDER BY e.appended_at DESC LIMIT 1),
    (SELECT d.type FROM {{schema}}.dead_letters d WHERE d.id = p_id),
    (SELECT h.type FROM {{schema}}.attempt_history h WHERE h.bucket = p_id >> 10 AND p_id = ANY (h.ids)
      ORDER BY h.settled_at DESC LIMIT 1))
$fn$;

-- The lane lock order every producer shares: the client's (src/producer/enqueue.ts, `groupKey`:
-- JSON.stringify([queue, priority, shard, 0]) sorted as JavaScript sorts strings, by UTF-16 code
-- unit), as add_task_rows() computes it. Not (queue, priority, shard): shard 10 sorts before shard
-- 2 as text, and a graph enqueue that took two lanes in the other order than a plain multi-lane
-- enqueueMany deadlocked with it (40P01, deps-review-locks.test.ts).
CREATE FUNCTION {{schema}}.lane_lock_key(p_queue text, p_priority integer, p_shard integer)
RETURNS integer[] LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT ARRAY(SELECT w.unit
                 FROM regexp_split_to_table('[' || to_json(p_queue)::text || ',' || p_priority || ',' || p_shard || ',0]', '')
                      WITH ORDINALITY AS c(ch, i),
                      unnest(CASE WHEN ascii(c.ch) > 65535
                                  THEN ARRAY[55296 + ((ascii(c.ch) - 65536) >> 10), 56320 + ((ascii(c.ch) - 65536) & 1023)]
                                  ELSE ARRAY[ascii(c.ch)] END) WITH ORDINALITY AS w(unit, j)
                ORDER BY c.i, w.j)
$fn$;

-- Move due deferred rows among p_ids (state `scheduled`) into their lanes, a lane at a time in
-- the producers' lane order, each entry marked when it has a dependent still waiting for it (one probe of
-- task_deps per row). p_try: the lane's lock is tried, and a lane held by someone else (or not
-- provisioned yet) is left for the leader's promotion (the release from a completion never waits
-- on a producer); else it is waited for, as every producer's append does. Returns how many were
-- appended.
CREATE FUNCTION {{schema}}.append_from_deferred(p_ids bigint[], p_try boolean)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_lane integer;
  v_appended integer;
  v_n integer := 0;
  g record;
BEGIN
  FOR g IN
    SELECT l.queue, l.priority, l.shard
      FROM (SELECT DISTINCT d.queue, d.priority, d.shard FROM {{schema}}.deferred d
             WHERE d.id = ANY (p_ids) AND d.state = 'scheduled' AND d.run_at <= now()) l
     ORDER BY {{schema}}.lane_lock_key(l.queue, l.priority, l.shard)
  LOOP
    IF p_try THEN
      -- A lane not provisioned yet: provision_lane waits for the queue's lock, which a producer
      -- that opened another lane of the queue holds to its commit, so that lock is tried first
      -- (re-taken inside); held by someone else, the row is left to promotion too.
      SELECT l.lane_id INTO v_lane FROM {{schema}}.lanes l
       WHERE l.queue = g.queue AND l.priority = g.priority AND l.shard = g.shard;
      IF v_lane IS NULL AND pg_try_advisory_xact_lock(hashtextextended({{queue_lock_prefix_literal}} || g.queue, 0)) THEN
        v_lane := {{schema}}.provision_lane(g.queue, g.priority, g.shard);
      END IF;
      CONTINUE WHEN v_lane IS NULL OR NOT pg_try_advisory_xact_lock({{schema_lock_key}}, v_lane);
    ELSE
      v_lane := {{schema}}.provision_lane(g.queue, g.priority, g.shard);
      PERFORM pg_advisory_xact_lock({{schema_lock_key}}, v_lane);
    END IF;
    WITH pick AS (
      SELECT d.id FROM {{schema}}.deferred d
       WHERE d.id = ANY (p_ids) AND d.queue = g.queue AND d.priority = g.priority AND d.shard = g.shard
         AND d.state = 'scheduled' AND d.run_at <= now()
       ORDER BY d.id FOR UPDATE SKIP LOCKED
    ), moved AS (
      DELETE FROM {{schema}}.deferred d USING pick WHERE d.id = pick.id RETURNING d.*
    )
    SELECT {{schema}}.append_ready_marked(v_lane,
             array_agg(m.id ORDER BY m.id), array_agg(m.type ORDER BY m.id), array_agg(m.payload ORDER BY m.id),
             array_agg(m.attempts ORDER BY m.id), array_agg(m.max_attempts ORDER BY m.id),
             array_agg(m.dedupe_key ORDER BY m.id), array_agg(m.last_error ORDER BY m.id),
             array_agg(m.created_at ORDER BY m.id), array_agg(now() ORDER BY m.id),
             array_agg(m.trace_context ORDER BY m.id),
             array_agg(EXISTS (SELECT 1 FROM {{schema}}.task_deps td
                                WHERE td.parent_id = m.id AND td.satisfied_at IS NULL) ORDER BY m.id))
      INTO v_appended
      FROM moved m HAVING count(*) > 0;
    v_n := v_n + coalesce(v_appended, 0);
  END LOOP;
  RETURN v_n;
END $fn$;

-- Waiting tasks whose counters reached zero, freed: a due unkeyed one is appended to its lane at
-- once when the lane's lock can be had (tried: a producer holding the lane never makes a
-- completion wait; the row is then left due, and the leader's next promotion tick appends it), a
-- keyed one is held for its key (the leader admits it on the `keys` notice), a later one is
-- scheduled at its own time. Returns how many were freed.
CREATE FUNCTION {{schema}}.free_waiting(p_ids bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_freed bigint[];
  v_n integer := 0;
BEGIN
  IF coalesce(cardinality(p_ids), 0) = 0 THEN RETURN 0; END IF;
  WITH freed AS (
    DELETE FROM {{schema}}.task_waits w WHERE w.id = ANY (p_ids) AND w.pending = 0 RETURNING w.id, w.run_at
  ), upd AS (
    UPDATE {{schema}}.deferred d
       SET state = CASE WHEN k.keyed AND coalesce(f.run_at, now()) <= now() THEN 'held' ELSE 'scheduled' END,
           run_at = CASE WHEN k.keyed AND coalesce(f.run_at, now()) <= now() THEN 'infinity'::timestamptz
                         ELSE coalesce(f.run_at, now()) END
      FROM freed f
      LEFT JOIN LATERAL (SELECT true AS keyed FROM {{schema}}.task_keys tk WHERE tk.id = f.id LIMIT 1) k ON true
     WHERE d.id = f.id AND d.state = 'waiting'
    RETURNING d.id, d.state
  )
  SELECT coalesce(array_agg(u.id), '{}') INTO v_freed FROM upd u;
  v_n := cardinality(v_freed);
  IF v_n = 0 THEN RETURN 0; END IF;
  IF EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = ANY (v_freed) AND d.state = 'held') THEN
    INSERT INTO {{schema}}.key_arrivals (key)
    SELECT DISTINCT tk.key FROM {{schema}}.task_keys tk
      JOIN {{schema}}.deferred d ON d.id = tk.id AND d.state = 'held'
     WHERE tk.id = ANY (v_freed);
    PERFORM pg_notify({{wake_channel_literal}}, 'keys');
  END IF;
  PERFORM {{schema}}.append_from_deferred(v_freed, true);
  RETURN v_n;
END $fn$;

-- Count the completion of each parent in p_done (every caller has verified that it completed)
-- towards its dependents, once per edge (`satisfied_at` is the once-token), and free the
-- dependents whose last parent it was. Locks: the dependents' counters in id order, then their
-- edges; every caller takes them so. Not granted to anyone: release_completed checks what a worker
-- hands it, and remove_unleased_quietly counts the deferred task it has just dequeued.
CREATE FUNCTION {{schema}}.count_completions(p_done bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_freed bigint[];
BEGIN
  IF coalesce(cardinality(p_done), 0) = 0 THEN RETURN 0; END IF;
  PERFORM 1 FROM {{schema}}.task_waits w
   WHERE w.id IN (SELECT d.child_id FROM {{schema}}.task_deps d
                   WHERE d.parent_id = ANY (p_done) AND d.satisfied_at IS NULL)
   ORDER BY w.id FOR UPDATE;
  WITH sat AS (
    UPDATE {{schema}}.task_deps d SET satisfied_at = now(), watched = false
     WHERE d.parent_id = ANY (p_done) AND d.satisfied_at IS NULL
    RETURNING d.child_id
  ), per AS (
    SELECT s.child_id, count(*)::integer AS n FROM sat s GROUP BY s.child_id
  ), dec AS (
    UPDATE {{schema}}.task_waits w SET pending = w.pending - per.n FROM per
     WHERE w.id = per.child_id
    RETURNING w.id, w.pending
  )
  SELECT coalesce(array_agg(dec.id ORDER BY dec.id) FILTER (WHERE dec.pending = 0), '{}') INTO v_freed FROM dec;
  RETURN {{schema}}.free_waiting(v_freed);
END $fn$;

-- Count the completion of each parent in p_parents that has completed (verified here, in the
-- caller's snapshot: a worker's completion calls this in its own transaction, after the fenced
-- settlement, so a settlement the fence refused releases nothing) towards its dependents.
CREATE FUNCTION {{schema}}.release_completed(p_parents bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'berth: release_completed must run at READ COMMITTED (it counts under row locks)'
      USING ERRCODE = '25000';
  END IF;
  RETURN {{schema}}.count_completions(ARRAY(
    SELECT DISTINCT p.id FROM unnest(p_parents) AS p(id)
     WHERE EXISTS (SELECT 1 FROM {{schema}}.task_deps d WHERE d.parent_id = p.id AND d.satisfied_at IS NULL)
       AND {{schema}}.task_fate(p.id) = 'completed'));
END $fn$;

-- remove_unleased_quietly as in migration 20, with the removed task's dependents: a deferred task
-- removed by a dequeue (the caller did its work: `dequeue(executor, schema, id, '')`) counts as
-- completed for them, as a dequeued ring entry does (its tombstone says so, and task_fate reads
-- it; the deleted row leaves no trace task_fate could read, so they were cancelled as if it had
-- been deleted: deps-review-wakeup.test.ts); any other removal has their edges watched, so the
-- leader reads its fate. Here rather than in a statement of the client's own: a producer's inline
-- dequeue of a plain task costs an index probe, not a round trip.
CREATE OR REPLACE FUNCTION {{schema}}.remove_unleased_quietly(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_result text;
BEGIN
  DELETE FROM {{schema}}.deferred WHERE id = p_id;
  IF FOUND THEN
    DELETE FROM {{schema}}.dedupe WHERE id = p_id;
    IF p_reason = 'dequeued' THEN PERFORM {{schema}}.count_completions(ARRAY[p_id]); END IF;
    v_result := 'removed';
  ELSE
    v_result := {{schema}}.tombstone_unleased(p_id, p_reason);
  END IF;
  IF v_result = 'removed' THEN PERFORM {{schema}}.watch_parents(ARRAY[p_id]); END IF;
  RETURN v_result;
END $fn$;

-- The leader's look at watched edges (or, with p_all, at every unsatisfied edge: its slow sweep),
-- at most p_limit parents after p_after in id order: a completed parent is released; a dead one
-- cancels its dependents whose policy is `cancel` (a `wait` one keeps waiting, blocked, until the
-- parent is retried); a cancelled, deleted or unknown one cancels every dependent that waits on
-- it (nothing can complete it any more). A cancelled dependent's own dependents are watched in
-- turn, so a cancel goes down the graph a level a tick. Returns what it did and the last parent
-- it looked at (NULL when it reached the end: the next call starts again from the first).
CREATE FUNCTION {{schema}}.deps_tick(p_all boolean, p_after bigint, p_limit integer,
  OUT released integer, OUT cancelled integer, OUT last_parent bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_parents bigint[];
  v_done bigint[] := '{}';
  v_dead bigint[] := '{}';
  v_gone bigint[] := '{}';
  v_cancel bigint[];
  v_id bigint;
  v_fate text;
BEGIN
  released := 0;
  cancelled := 0;
  IF p_all THEN
    v_parents := ARRAY(SELECT DISTINCT d.parent_id FROM {{schema}}.task_deps d
                        WHERE d.satisfied_at IS NULL AND d.parent_id > coalesce(p_after, -1)
                        ORDER BY d.parent_id LIMIT p_limit);
  ELSE
    v_parents := ARRAY(SELECT DISTINCT d.parent_id FROM {{schema}}.task_deps d
                        WHERE d.watched AND d.satisfied_at IS NULL AND d.parent_id > coalesce(p_after, -1)
                        ORDER BY d.parent_id LIMIT p_limit);
  END IF;
  last_parent := CASE WHEN cardinality(v_parents) >= p_limit THEN v_parents[cardinality(v_parents)] END;
  FOREACH v_id IN ARRAY v_parents LOOP
    v_fate := {{schema}}.task_fate(v_id);
    IF v_fate = 'completed' THEN v_done := v_done || v_id;
    ELSIF v_fate = 'dead' THEN v_dead := v_dead || v_id;
    ELSIF v_fate <> 'pending' THEN v_gone := v_gone || v_id;
    END IF;
  END LOOP;
  released := {{schema}}.release_completed(v_done);
  IF cardinality(v_dead) + cardinality(v_gone) = 0 THEN RETURN; END IF;
  -- A failed parent's edges stay watched: a dead one may be retried, then complete.
  UPDATE {{schema}}.task_deps d SET watched = true
   WHERE d.parent_id = ANY (v_dead || v_gone) AND d.satisfied_at IS NULL AND NOT d.watched;
  v_cancel := ARRAY(
    SELECT DISTINCT w.id FROM {{schema}}.task_deps d JOIN {{schema}}.task_waits w ON w.id = d.child_id
     WHERE d.satisfied_at IS NULL
       AND (d.parent_id = ANY (v_gone) OR (d.parent_id = ANY (v_dead) AND w.on_parent_failure = 'cancel'))
     ORDER BY w.id LIMIT 10000);
  IF cardinality(v_cancel) = 0 THEN RETURN; END IF;
  -- The release's lock order: the dependents' counters (id order) before their deferred rows,
  -- which cancel_tasks deletes (the other order deadlocked with a release of the same dependent,
  -- deps-review-locks.test.ts). Under those locks the fates are read again: a parent read dead
  -- above may have been retried and completed since, its release committed (the counter is gone)
  -- or waiting for these locks.
  PERFORM 1 FROM {{schema}}.task_waits w WHERE w.id = ANY (v_cancel) ORDER BY w.id FOR UPDATE;
  v_cancel := ARRAY(
    WITH f AS MATERIALIZED (
      -- Each failed parent's fate once (a fan-out of 10,000 dependents has one parent).
      SELECT u.p, {{schema}}.task_fate(u.p) AS fate FROM unnest(v_dead || v_gone) AS u(p)
    )
    SELECT DISTINCT w.id FROM {{schema}}.task_deps d
      JOIN {{schema}}.task_waits w ON w.id = d.child_id
      JOIN f ON f.p = d.parent_id
     WHERE w.id = ANY (v_cancel) AND d.satisfied_at IS NULL
       AND CASE f.fate
             WHEN 'pending' THEN false WHEN 'completed' THEN false
             WHEN 'dead' THEN w.on_parent_failure = 'cancel'
             ELSE true END
     ORDER BY w.id);
  IF cardinality(v_cancel) = 0 THEN RETURN; END IF;
  SELECT count(*) FILTER (WHERE c.result = 'removed') INTO cancelled
    FROM {{schema}}.cancel_tasks(v_cancel, 'berth:dependency') c;
  DELETE FROM {{schema}}.task_waits w WHERE w.id = ANY (v_cancel)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = w.id);
  UPDATE {{schema}}.task_deps d SET watched = true
   WHERE d.parent_id = ANY (v_cancel) AND d.satisfied_at IS NULL AND NOT d.watched;
END $fn$;

-- Hooks: a parent removed, cancelled, moved or its dead letter deleted has its edges watched, so
-- the leader reads its fate (and the `deps` notice wakes it). An index probe for a task without
-- dependents.
CREATE FUNCTION {{schema}}.watch_parents(p_ids bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  UPDATE {{schema}}.task_deps d SET watched = true
   WHERE d.parent_id = ANY (p_ids) AND d.satisfied_at IS NULL AND NOT d.watched;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, 'deps'); END IF;
  RETURN v_n;
END $fn$;

-- Every path that buries a task (a failure, a release, a rescue or a snooze at its limit, a lost
-- claim, whatever process version wrote it) inserts into dead_letters, and every path that takes
-- a dead letter away (a retry, an operator's delete or purge, retention) deletes from it: the
-- dependents of those tasks are watched, so the leader reads what became of them (dead: their
-- policy; retried: pending; gone: they are cancelled). Row triggers: one probe of task_deps per
-- row inserted or deleted, nothing at all for a statement that changes no row. Every failure,
-- release, hand-back, AdvanceCursor and rescue statement inserts into dead_letters (its settle-
-- and-move tail), almost always no row: a statement trigger with a transition table ran for each
-- of them, plain tasks included (deps-review-enqueue.test.ts).
CREATE FUNCTION {{schema}}.watch_dead_parents()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_id bigint := CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.task_deps d WHERE d.parent_id = v_id AND d.satisfied_at IS NULL) THEN
    UPDATE {{schema}}.task_deps d SET watched = true
     WHERE d.parent_id = v_id AND d.satisfied_at IS NULL AND NOT d.watched;
    PERFORM pg_notify({{wake_channel_literal}}, 'deps');
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER watch_dead_parents AFTER INSERT ON {{schema}}.dead_letters
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.watch_dead_parents();
CREATE TRIGGER watch_removed_dead_parents AFTER DELETE ON {{schema}}.dead_letters
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.watch_dead_parents();

-- The backstop: before the prune truncates a segment, the completed parents in it whose edges are
-- still unsatisfied are released in the prune's transaction (an older worker's completion; a
-- watch the leader had not reached). Nothing but a probe of task_deps when no edge waits.
CREATE FUNCTION {{schema}}.release_before_prune()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.task_deps d WHERE d.satisfied_at IS NULL) THEN
    EXECUTE format('SELECT %1$I.release_completed(ARRAY(SELECT DISTINCT d.parent_id FROM %1$I.task_deps d
                      JOIN %2$I.%3$I r ON r.id = d.parent_id WHERE d.satisfied_at IS NULL))',
                   {{schema_literal}}, TG_TABLE_SCHEMA, TG_TABLE_NAME);
  END IF;
  RETURN NULL;
END $fn$;
DO $do$
DECLARE v_part text;
BEGIN
  FOR v_part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = {{qualified_literal:ready}}::regclass LOOP
    EXECUTE format('CREATE TRIGGER release_before_prune BEFORE TRUNCATE ON %I.%I FOR EACH STATEMENT EXECUTE FUNCTION %I.release_before_prune()',
                   {{schema_literal}}, v_part, {{schema_literal}});
  END LOOP;
END $do$;

-- The parents of task p_id, with their state and result (ctx.parents(), berth tasks show).
CREATE FUNCTION {{schema}}.task_parents(p_id bigint)
RETURNS TABLE (id bigint, type text, fate text, satisfied_at timestamptz, result jsonb, has_result boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT d.parent_id, d.parent_type,
         CASE WHEN d.satisfied_at IS NOT NULL THEN 'completed' ELSE {{schema}}.task_fate(d.parent_id) END,
         d.satisfied_at, r.result, r.id IS NOT NULL
    FROM {{schema}}.task_deps d LEFT JOIN {{schema}}.task_results r ON r.id = d.parent_id
   WHERE d.child_id = p_id
   ORDER BY d.parent_id
$fn$;

-- The dependents of task p_id (at most p_limit, by id), with their state, and how many there are.
CREATE FUNCTION {{schema}}.task_dependents(p_id bigint, p_limit integer)
RETURNS TABLE (id bigint, fate text, waiting boolean, on_parent_failure text, satisfied_at timestamptz, total bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  -- Waiting: its deferred row says so (a cancelled dependent's counter row stays until
  -- prune_dep_edges; it waits for nothing).
  SELECT d.child_id, {{schema}}.task_fate(d.child_id),
         EXISTS (SELECT 1 FROM {{schema}}.deferred x WHERE x.id = d.child_id AND x.state = 'waiting'),
         (SELECT w.on_parent_failure FROM {{schema}}.task_waits w
            JOIN {{schema}}.deferred x ON x.id = w.id AND x.state = 'waiting'
           WHERE w.id = d.child_id),
         d.satisfied_at,
         (SELECT count(*) FROM {{schema}}.task_deps x WHERE x.parent_id = p_id)
    FROM {{schema}}.task_deps d
   WHERE d.parent_id = p_id
   ORDER BY d.child_id LIMIT p_limit
$fn$;

-- Tasks waiting on dependencies, per queue, and how many of them wait on a dead parent (blocked:
-- a parent to retry, or the dependent to cancel). The leader's gauges and berth stats.
CREATE FUNCTION {{schema}}.dependency_usage()
RETURNS TABLE (queue text, waiting bigint, blocked bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  -- The deferred row's state and queue, not the counter row's: a cancelled or deleted dependent
  -- leaves its counter until prune_dep_edges, and a moved one changes queue.
  SELECT x.queue, count(*),
         count(*) FILTER (WHERE EXISTS (SELECT 1 FROM {{schema}}.task_deps d
                                          JOIN {{schema}}.dead_letters y ON y.id = d.parent_id
                                         WHERE d.child_id = w.id AND d.satisfied_at IS NULL))
    FROM {{schema}}.task_waits w
    JOIN {{schema}}.deferred x ON x.id = w.id AND x.state = 'waiting'
   GROUP BY x.queue ORDER BY x.queue
$fn$;

-- Retention: edges and counters of dependents that are gone (completed, cancelled, deleted: no
-- longer deferred, dead or in the ring), after a minute. Kept while the dependent is pending,
-- running or dead (it may be retried and read its parents' results again), which is what keeps
-- those results (pruneResults skips a result an edge names).
CREATE FUNCTION {{schema}}.prune_dep_edges(p_limit integer)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  WITH gone AS (
    SELECT DISTINCT d.child_id FROM {{schema}}.task_deps d
     WHERE d.created_at < now() - interval '1 minute'
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.deferred x WHERE x.id = d.child_id)
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.dead_letters x WHERE x.id = d.child_id)
       AND NOT {{schema}}.key_entry_live(d.child_id)
     LIMIT p_limit
  )
  DELETE FROM {{schema}}.task_deps d USING gone WHERE d.child_id = gone.child_id;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  DELETE FROM {{schema}}.task_waits w
   WHERE w.created_at < now() - interval '1 minute'
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.deferred x WHERE x.id = w.id AND x.state = 'waiting');
  RETURN v_n;
END $fn$;

-- An enqueue with dependencies: the whole call in one statement, so nothing of it is written when
-- any part is refused. p_graph = {tasks: [...], edges: [[child, parent position | null, parent
-- id | null], ...], trace}: the tasks in an order where every parent of the call comes before its
-- children (the client sorts them; checked here, so an edge can only point backwards and the
-- graph cannot have a cycle), each {name (how errors name it), type, payload, queue, priority,
-- shard, shards, runAt, delayMs, maxAttempts, dedupeKey, key, policy}. Answers one row per task,
-- in the order sent: its id, and its state (`waiting` while a parent has not completed).
--
-- How: every task goes through enqueue() (or enqueue_keyed()) as due at the end of time, so ids,
-- checks and dedupe are theirs and each lands in deferred storage; then edges are written, tasks
-- with an unfinished parent wait, and the rest go where they would have gone (due: appended to
-- their lanes, marked when they have dependents; keyed: held; later: scheduled). A parent enqueued
-- earlier is looked up (task_fate) under a key-share lock on its row, which keeps promotion and
-- the ring prune off it until this transaction ends: completed → the edge is satisfied now;
-- pending → the edge is watched (the leader releases it within a tick of the parent's completion);
-- dead, cancelled, deleted or unknown → refused. A dependency on an entry of the call that was
-- a duplicate (its dedupe key held) is a dependency on the live task that holds the key.
CREATE FUNCTION {{schema}}.enqueue_graph(p_graph jsonb)
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_tasks jsonb := p_graph -> 'tasks';
  v_edges jsonb := coalesce(p_graph -> 'edges', '[]'::jsonb);
  v_trace text := p_graph ->> 'trace';
  v_far timestamptz := '9999-12-31 00:00:00+00';
  v_n integer;
  v_ids bigint[];
  v_dups bigint[];
  v_e_child bigint[];
  v_e_parent bigint[];
  v_e_sure boolean[];
  v_e_type text[];
  v_e_name text[];
  v_fates jsonb := '{}';
  v_types jsonb := '{}';
  v_fate text;
  v_due bigint[];
  g record;
  r record;
BEGIN
  IF jsonb_typeof(v_tasks) IS DISTINCT FROM 'array' OR jsonb_typeof(v_edges) <> 'array' THEN
    RAISE EXCEPTION 'berth: enqueue_graph: tasks and edges must be JSON arrays' USING ERRCODE = '22023';
  END IF;
  v_n := jsonb_array_length(v_tasks);
  IF v_n = 0 THEN RETURN; END IF;
  IF v_n > 100000 OR jsonb_array_length(v_edges) > 1000000 THEN
    RAISE EXCEPTION 'berth: enqueue_graph: at most 100000 tasks and 1000000 dependencies a call (got % and %)',
      v_n, jsonb_array_length(v_edges) USING ERRCODE = '22023';
  END IF;
  -- Every edge names a task of the call and either an earlier task of the call or an id.
  SELECT a.o INTO r FROM jsonb_array_elements(v_edges) WITH ORDINALITY AS a(e, o)
   WHERE jsonb_typeof(a.e) IS DISTINCT FROM 'array'
      OR jsonb_typeof(a.e -> 0) IS DISTINCT FROM 'number'
      OR (a.e ->> 0)::integer < 0 OR (a.e ->> 0)::integer >= v_n
      OR ((a.e -> 1) IS NULL OR jsonb_typeof(a.e -> 1) = 'null') = ((a.e -> 2) IS NULL OR jsonb_typeof(a.e -> 2) = 'null')
      OR (jsonb_typeof(a.e -> 1) = 'number'
          AND ((a.e ->> 1)::integer < 0 OR (a.e ->> 1)::integer >= (a.e ->> 0)::integer))
      OR (jsonb_typeof(a.e -> 2) = 'string' AND (a.e ->> 2) !~ '^[0-9]{1,19}$')
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'berth: enqueue_graph: dependency % is not [child position, earlier position or null, task id or null] (a task of the call may only depend on one sent before it)', r.o
      USING ERRCODE = '22023';
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(v_tasks) t
              WHERE coalesce(t ->> 'policy', 'cancel') NOT IN ('cancel', 'wait')) THEN
    RAISE EXCEPTION 'berth: enqueue_graph: a policy is ''cancel'' or ''wait''' USING ERRCODE = '22023';
  END IF;

  v_ids := array_fill(NULL::bigint, ARRAY[v_n]);
  v_dups := array_fill(NULL::bigint, ARRAY[v_n]);
  -- Every task into deferred storage, one enqueue() a lane, lanes in one order.
  FOR g IN
    SELECT t ->> 'queue' AS queue, (t ->> 'priority')::smallint AS priority, (t ->> 'shard')::smallint AS shard,
           (t ->> 'shards')::smallint AS shards, (t ->> 'key') IS NOT NULL AS keyed,
           array_agg(o::integer ORDER BY o) AS poss, array_agg(t ->> 'type' ORDER BY o) AS types,
           array_agg(t -> 'payload' ORDER BY o) AS payloads,
           array_agg((t ->> 'maxAttempts')::integer ORDER BY o) AS max_attempts,
           array_agg(t ->> 'dedupeKey' ORDER BY o) AS dedupe, array_agg(t ->> 'key' ORDER BY o) AS keys
      FROM jsonb_array_elements(v_tasks) WITH ORDINALITY AS a(t, o)
     GROUP BY 1, 2, 3, 4, 5
     ORDER BY 1, 2, 3 NULLS FIRST, 4, 5
  LOOP
    IF g.keyed THEN
      FOR r IN
        SELECT e.ord, e.id, e.duplicate_of FROM {{schema}}.enqueue_keyed(g.queue, g.priority, g.shard, g.shards, g.types,
                 g.payloads, array_fill(v_far, ARRAY[cardinality(g.poss)]), g.max_attempts, g.dedupe, v_trace, g.keys) e
      LOOP
        v_ids[g.poss[r.ord]] := r.id;
        v_dups[g.poss[r.ord]] := r.duplicate_of;
      END LOOP;
    ELSE
      FOR r IN
        SELECT e.ord, e.id, e.duplicate_of FROM {{schema}}.enqueue(g.queue, g.priority, g.shard, g.shards, g.types,
                 g.payloads, array_fill(v_far, ARRAY[cardinality(g.poss)]), g.max_attempts, g.dedupe, v_trace) e
      LOOP
        v_ids[g.poss[r.ord]] := r.id;
        v_dups[g.poss[r.ord]] := r.duplicate_of;
      END LOOP;
    END IF;
  END LOOP;

  -- The edges by ids: a parent of the call, or the live holder of a duplicate's key, or an id.
  SELECT array_agg(x.child), array_agg(x.parent), array_agg(x.sure), array_agg(x.ptype), array_agg(x.name)
    INTO v_e_child, v_e_parent, v_e_sure, v_e_type, v_e_name
    FROM (SELECT DISTINCT ON (c.child, c.parent) c.* FROM (
            SELECT v_ids[(a.e ->> 0)::integer + 1] AS child,
                   CASE WHEN jsonb_typeof(a.e -> 1) = 'number'
                        THEN coalesce(v_ids[(a.e ->> 1)::integer + 1], v_dups[(a.e ->> 1)::integer + 1])
                        ELSE (a.e ->> 2)::bigint END AS parent,
                   -- Sure: a parent of the call, written now, unkeyed (promote_held appends
                   -- without the mark), so its every entry carries the mark.
                   (jsonb_typeof(a.e -> 1) = 'number' AND v_ids[(a.e ->> 1)::integer + 1] IS NOT NULL
                    AND (v_tasks -> (a.e ->> 1)::integer ->> 'key') IS NULL) AS sure,
                   CASE WHEN jsonb_typeof(a.e -> 1) = 'number' AND v_ids[(a.e ->> 1)::integer + 1] IS NOT NULL
                        THEN v_tasks -> (a.e ->> 1)::integer ->> 'type' END AS ptype,
                   v_tasks -> (a.e ->> 0)::integer ->> 'name' AS name,
                   (jsonb_typeof(a.e -> 1) = 'number' AND v_ids[(a.e ->> 1)::integer + 1] IS NOT NULL) AS in_call
              FROM jsonb_array_elements(v_edges) AS a(e)) c
           WHERE c.child IS NOT NULL AND c.parent IS NOT NULL
           ORDER BY c.child, c.parent, c.in_call DESC) x;

  -- An edge to a task of this call points backwards in the sent order, however it was named: by
  -- position (checked above), by the id the call drew for it (a caller can guess the sequence's
  -- next value), or through a duplicate whose key another entry of the call holds. Else a task
  -- would wait on itself, or on a cycle, and nothing would ever release it.
  SELECT u.nm, u.p INTO r
    FROM unnest(v_e_child, v_e_parent, v_e_name) AS u(c, p, nm)
    JOIN unnest(v_ids) WITH ORDINALITY AS pc(id, o) ON pc.id = u.p
    JOIN unnest(v_ids) WITH ORDINALITY AS cc(id, o) ON cc.id = u.c
   WHERE pc.o >= cc.o
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'berth: enqueue: % depends on task %, which this same call enqueues (itself, or an entry it depends on in turn): name an earlier entry with { ref }', r.nm, r.p
      USING ERRCODE = '22023';
  END IF;

  -- Parents enqueued before this call: locked where they stand, then looked up.
  FOR r IN
    SELECT DISTINCT u.p, min(u.nm) AS name FROM unnest(v_e_parent, v_e_type, v_e_name) AS u(p, t, nm)
     WHERE u.t IS NULL GROUP BY u.p ORDER BY u.p
  LOOP
    PERFORM 1 FROM {{schema}}.deferred d WHERE d.id = r.p FOR KEY SHARE;
    IF NOT FOUND THEN
      PERFORM 1 FROM {{schema}}.ready e WHERE e.id = r.p FOR KEY SHARE;
    END IF;
    v_fate := {{schema}}.task_fate(r.p);
    IF v_fate NOT IN ('pending', 'completed') THEN
      RAISE EXCEPTION 'berth: enqueue: % depends on task %, which %', r.name, r.p,
        CASE v_fate WHEN 'dead' THEN 'is dead (a dead letter): retry it first'
                    WHEN 'cancelled' THEN 'was cancelled'
                    WHEN 'deleted' THEN 'was deleted'
                    ELSE 'does not exist (or finished longer ago than attempt history and results keep)' END
          -- An older snapshot than the statement's (REPEATABLE READ, SERIALIZABLE) sees a ring
          -- segment pruned since as empty, and not the completion that let it go.
          || CASE WHEN current_setting('transaction_isolation') <> 'read committed'
                  THEN ', as this transaction''s snapshot sees it: if it completed since the transaction began, retry the transaction'
                  ELSE '' END
        USING ERRCODE = '22023';
    END IF;
    v_fates := v_fates || jsonb_build_object(r.p::text, v_fate);
    v_types := v_types || jsonb_build_object(r.p::text, coalesce({{schema}}.task_type_of(r.p), ''));
  END LOOP;

  INSERT INTO {{schema}}.task_deps (parent_id, child_id, parent_type, satisfied_at, watched)
  SELECT u.p, u.c, coalesce(u.t, v_types ->> u.p::text, ''),
         CASE WHEN u.t IS NULL AND v_fates ->> u.p::text = 'completed' THEN now() END,
         NOT u.sure AND NOT (u.t IS NULL AND v_fates ->> u.p::text = 'completed')
    FROM unnest(v_e_child, v_e_parent, v_e_sure, v_e_type) AS u(c, p, sure, t);

  -- Tasks with a parent not yet completed wait, with their own run time kept for the release.
  INSERT INTO {{schema}}.task_waits (id, pending, on_parent_failure, run_at)
  SELECT c.child_id, c.pending, coalesce(v_tasks -> (x.o::integer - 1) ->> 'policy', 'cancel'),
         CASE WHEN v_tasks -> (x.o::integer - 1) ->> 'runAt' IS NOT NULL
              THEN (v_tasks -> (x.o::integer - 1) ->> 'runAt')::timestamptz
              WHEN v_tasks -> (x.o::integer - 1) ->> 'delayMs' IS NOT NULL
              THEN now() + make_interval(secs => (v_tasks -> (x.o::integer - 1) ->> 'delayMs')::float8 / 1000.0) END
    FROM (SELECT d.child_id, count(*)::integer AS pending FROM {{schema}}.task_deps d
           WHERE d.child_id = ANY (v_ids) AND d.satisfied_at IS NULL GROUP BY d.child_id) c
    JOIN unnest(v_ids) WITH ORDINALITY AS x(id, o) ON x.id = c.child_id;
  UPDATE {{schema}}.deferred d SET state = 'waiting', run_at = 'infinity'
    FROM {{schema}}.task_waits w WHERE w.id = d.id AND d.id = ANY (v_ids);

  -- The others where they would have gone: later ones scheduled at their time, due keyed ones
  -- held for their key, due ones appended to their lanes (marked when they have dependents).
  WITH t AS (
    SELECT x.id,
           CASE WHEN v_tasks -> (x.o::integer - 1) ->> 'runAt' IS NOT NULL
                THEN (v_tasks -> (x.o::integer - 1) ->> 'runAt')::timestamptz
                WHEN v_tasks -> (x.o::integer - 1) ->> 'delayMs' IS NOT NULL
                THEN now() + make_interval(secs => (v_tasks -> (x.o::integer - 1) ->> 'delayMs')::float8 / 1000.0)
                ELSE now() END AS run_at,
           (v_tasks -> (x.o::integer - 1) ->> 'key') IS NOT NULL AS keyed
      FROM unnest(v_ids) WITH ORDINALITY AS x(id, o)
     WHERE x.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {{schema}}.task_waits w WHERE w.id = x.id)
  )
  UPDATE {{schema}}.deferred d
     SET state = CASE WHEN t.keyed AND t.run_at <= now() THEN 'held' ELSE 'scheduled' END,
         run_at = CASE WHEN t.keyed AND t.run_at <= now() THEN 'infinity'::timestamptz ELSE t.run_at END
    FROM t WHERE d.id = t.id;
  IF EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = ANY (v_ids) AND d.state = 'held') THEN
    INSERT INTO {{schema}}.key_arrivals (key)
    SELECT DISTINCT tk.key FROM {{schema}}.task_keys tk
      JOIN {{schema}}.deferred d ON d.id = tk.id AND d.state = 'held'
     WHERE tk.id = ANY (v_ids);
    PERFORM pg_notify({{wake_channel_literal}}, 'keys');
  END IF;
  v_due := ARRAY(SELECT d.id FROM {{schema}}.deferred d
                  WHERE d.id = ANY (v_ids) AND d.state = 'scheduled' AND d.run_at <= now());
  PERFORM {{schema}}.append_from_deferred(v_due, false);
  IF EXISTS (SELECT 1 FROM unnest(v_e_child, v_e_parent) AS u(c, p)
               JOIN {{schema}}.task_deps d ON d.parent_id = u.p AND d.child_id = u.c AND d.watched) THEN
    PERFORM pg_notify({{wake_channel_literal}}, 'deps');
  END IF;

  RETURN QUERY
  SELECT x.o::integer - 1, x.id,
         CASE WHEN x.id IS NULL THEN 'duplicate'
              WHEN EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = x.id AND d.state = 'waiting') THEN 'waiting'
              ELSE coalesce((SELECT d.state FROM {{schema}}.deferred d WHERE d.id = x.id), 'ready') END,
         v_dups[x.o]
    FROM unnest(v_ids) WITH ORDINALITY AS x(id, o)
   ORDER BY x.o;
END $fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.append_ready_marked(integer, bigint[], text[], jsonb[], integer[], integer[], text[],
  text[], timestamptz[], timestamptz[], text[], boolean[]), {{schema}}.lane_lock_key(text, integer, integer),
  {{schema}}.task_fate(bigint), {{schema}}.task_type_of(bigint), {{schema}}.free_waiting(bigint[]),
  {{schema}}.append_from_deferred(bigint[], boolean),
  {{schema}}.count_completions(bigint[]), {{schema}}.release_completed(bigint[]), {{schema}}.deps_tick(boolean, bigint, integer),
  {{schema}}.watch_parents(bigint[]), {{schema}}.watch_dead_parents(), {{schema}}.release_before_prune(),
  {{schema}}.task_parents(bigint), {{schema}}.task_dependents(bigint, integer), {{schema}}.dependency_usage(),
  {{schema}}.prune_dep_edges(integer), {{schema}}.enqueue_graph(jsonb),
  {{schema}}.promote_lane(text, smallint, smallint, integer) FROM PUBLIC;
