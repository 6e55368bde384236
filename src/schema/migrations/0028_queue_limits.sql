-- name: queue limits: at most N running tasks of a queue, and at most N starts per interval, across the fleet
--
-- A limit is a row of `queue_limits`, set by an operator through set_queue_limit(). Every lane of
-- a limited queue is marked `lanes.limited`, and the two ordinary claims skip such lanes (`NOT
-- l.limited`, re-checked on the locked row, as `NOT l.paused` is; setting or clearing a limit
-- bumps the lanes' version too, so a claim whose snapshot predates it drops the lane). A limited
-- queue is claimed only through the limited claim, one transaction of three statements:
--
--   1. limit_capacity(queue, want): locks the queue's `queue_limits` row, SKIP LOCKED (claims of
--      one limited queue are serialised; a claimer finding it locked looks again in 50 ms rather
--      than wait, so one stalled session cannot hold up a worker's fetch of every other queue;
--      claims of other queues are not touched), forgets the holders that
--      hold nothing any more, and answers how many tasks may start now: the least of `want`,
--      max_running minus the tasks still running, and rate_limit minus the starts within the
--      last rate_interval_ms. Each of those reads runs in its own statement of this VOLATILE
--      function, so under READ COMMITTED each takes a snapshot after the row lock was granted
--      and sees every holder and start a competing claim committed before releasing it.
--   2. the ordinary claim statement, over the queue's limited lanes, for at most that many.
--   3. hold_leases(queue, leases…): records each new range lease as a holder (for max_running)
--      and the number of tasks started (for rate_limit), in the claim's transaction, so a claim
--      and its holders commit together or not at all (a claim lost to a server crash loses both).
--
-- A holder is one range lease of the queue. It counts as many running tasks as the lease has
-- entries without a settlement; it holds nothing once every entry is settled or the lease is
-- gone with its ring segment (a segment is truncated only when every entry in it is settled).
-- So nothing on the settlement, rescue or prune paths changes: a running task stops counting
-- when the settlement that ends it (complete, fail, release, snooze, cancel, rescue) commits,
-- whoever writes it. A lease that lapsed with its worker still counts until rescue settles it,
-- as its handler may still be running.
--
-- A queue must exist (a lane or a pause of it) to be limited, so a misspelt name is refused.
-- Limits are an operator's: no runtime role may call set_queue_limit or write queue_limits.

CREATE TABLE {{schema}}.queue_limits (
  queue text PRIMARY KEY,
  max_running integer CHECK (max_running BETWEEN 1 AND 1000000),
  rate_limit integer CHECK (rate_limit BETWEEN 1 AND 1000000),
  rate_interval_ms integer CHECK (rate_interval_ms BETWEEN 1 AND 86400000),
  updated_at timestamptz NOT NULL DEFAULT now(),
  updated_by text NOT NULL,
  CHECK ((rate_limit IS NULL) = (rate_interval_ms IS NULL)),
  CHECK (max_running IS NOT NULL OR rate_limit IS NOT NULL)
);

ALTER TABLE {{schema}}.lanes ADD COLUMN limited boolean NOT NULL DEFAULT false;

CREATE TABLE {{schema}}.limit_holders (
  queue text NOT NULL,
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lease_from bigint NOT NULL,
  n integer NOT NULL,
  held_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue, lane_id, lease_from, slot)
);

-- One row per lease a rate-limited queue's claim took: a hold repeated for the same lease counts
-- its starts once.
CREATE TABLE {{schema}}.limit_starts (
  queue text NOT NULL,
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lease_from bigint NOT NULL,
  started_at timestamptz NOT NULL,
  n integer NOT NULL,
  PRIMARY KEY (queue, lane_id, lease_from, slot)
);
CREATE INDEX ON {{schema}}.limit_starts (queue, started_at);

-- The tasks a holder (alias h) still runs: its lease's entries without a settlement; 0 when the
-- lease is gone. One probe of the lease's primary key and one of the settlements' index.
CREATE FUNCTION {{schema}}.holder_running(h {{schema}}.limit_holders)
RETURNS integer LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT coalesce((SELECT l.n - coalesce((SELECT sum(x.n) FROM {{schema}}.range_settlements x
                                           WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq
                                             AND x.slot = l.slot), 0)::integer
                     FROM {{schema}}.range_leases l
                    WHERE l.lane_id = h.lane_id AND l.from_seq = h.lease_from AND l.slot = h.slot), 0)
$fn$;

CREATE FUNCTION {{schema}}.limit_capacity(p_queue text, p_want integer, OUT free integer, OUT retry_ms integer,
                                          OUT guard_ms integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v {{schema}}.queue_limits;
  v_running integer;
  v_started integer;
  v_oldest timestamptz;
  v_window interval;
BEGIN
  IF p_queue IS NULL THEN
    RAISE EXCEPTION 'berth: limit_capacity: queue must not be null' USING ERRCODE = '22004';
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'berth: limit_capacity must run at READ COMMITTED (a snapshot older than the limit row lock would miss a competing claim)'
      USING ERRCODE = '25000';
  END IF;
  free := greatest(coalesce(p_want, 0), 0);
  -- SKIP LOCKED: a claimer that holds the row (another worker mid-claim, paused by a GC or the
  -- network) must not hold up this one's fetch, which claims the other queues on the same
  -- session. A locked row answers "no room now, look again shortly".
  SELECT * INTO v FROM {{schema}}.queue_limits WHERE queue = p_queue FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    free := 0;
    -- Cleared since the caller looked: nothing is started by this path (the lanes are ordinary
    -- again and the ordinary claim takes them). Locked: retry soon.
    IF EXISTS (SELECT 1 FROM {{schema}}.queue_limits WHERE queue = p_queue) THEN retry_ms := 50; END IF;
    RETURN;
  END IF;
  IF v.max_running IS NOT NULL THEN
    -- One statement over the queue's holders: each lease's entries less its settled ones (0 when
    -- the lease is gone with its segment); the empty ones are forgotten, the rest summed.
    WITH h AS MATERIALIZED (
      SELECT h.lane_id, h.lease_from, h.slot,
             coalesce(l.n - coalesce((SELECT sum(x.n) FROM {{schema}}.range_settlements x
                                       WHERE x.lane_id = h.lane_id AND x.lease_from = h.lease_from
                                         AND x.slot = h.slot), 0), 0)::integer AS running
        FROM {{schema}}.limit_holders h
        LEFT JOIN {{schema}}.range_leases l
          ON l.lane_id = h.lane_id AND l.from_seq = h.lease_from AND l.slot = h.slot
       WHERE h.queue = p_queue
    ), gone AS (
      DELETE FROM {{schema}}.limit_holders d USING h
       WHERE d.queue = p_queue AND d.lane_id = h.lane_id AND d.lease_from = h.lease_from AND d.slot = h.slot
         AND h.running <= 0
    )
    SELECT coalesce(sum(h.running) FILTER (WHERE h.running > 0), 0) INTO v_running FROM h;
    free := least(free, v.max_running - v_running);
  END IF;
  IF v.rate_limit IS NOT NULL THEN
    -- A start is recorded when its claim takes it (hold_leases); its handler starts after the
    -- claim commits and returns, a few ms later, or hundreds on a busy host, and not by the same
    -- delay for every claim. So a start stays in the window for the interval plus a guard (a
    -- tenth of the interval, at most 250 ms), and the worker hands back, unstarted, a task it
    -- could not start within the guard of sending the hold (ClaimedTask.startBy): every handler
    -- then starts within the guard after its recorded start, and any window of the interval
    -- measured at the handlers' own starts holds at most the limit. The price is a steady rate
    -- up to a tenth below the limit for intervals under 2.5 s.
    guard_ms := least(v.rate_interval_ms / 10, 250);
    v_window := make_interval(secs => (v.rate_interval_ms + guard_ms) / 1000.0);
    DELETE FROM {{schema}}.limit_starts s WHERE s.queue = p_queue AND s.started_at <= clock_timestamp() - v_window;
    SELECT coalesce(sum(s.n), 0), min(s.started_at) INTO v_started, v_oldest
      FROM {{schema}}.limit_starts s WHERE s.queue = p_queue;
    IF v.rate_limit - v_started < free THEN
      free := v.rate_limit - v_started;
      -- When the oldest start in the window leaves it, the rate frees: the caller may come back
      -- then rather than at its next poll (nothing else tells it).
      IF v_oldest IS NOT NULL THEN
        retry_ms := greatest(1, ceil(extract(epoch FROM v_oldest + v_window - clock_timestamp()) * 1000))::integer;
      END IF;
    END IF;
  END IF;
  free := greatest(free, 0);
END $fn$;

-- Called in the limited claim's transaction after the claim, with the leases it took. Only a
-- lease of a lane of this queue that exists is recorded: a forged call can only lower the
-- queue's capacity until its fake holders are found empty.
CREATE FUNCTION {{schema}}.hold_leases(p_queue text, p_slots smallint[], p_lanes integer[], p_froms bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v {{schema}}.queue_limits;
  v_n integer := 0;
BEGIN
  SELECT * INTO v FROM {{schema}}.queue_limits WHERE queue = p_queue;
  IF NOT FOUND THEN RETURN 0; END IF;
  -- Holders only under a running limit: a rate-only queue's leases would pile up unread (a
  -- running limit set later counts the leases then running itself, set_queue_limit()).
  IF v.max_running IS NOT NULL THEN
    INSERT INTO {{schema}}.limit_holders (queue, slot, lane_id, lease_from, n)
    SELECT p_queue, l.slot, l.lane_id, l.from_seq, l.n
      FROM unnest(p_slots, p_lanes, p_froms) AS u(slot, lane_id, lease_from)
      JOIN {{schema}}.range_leases l ON l.lane_id = u.lane_id AND l.from_seq = u.lease_from AND l.slot = u.slot
      JOIN {{schema}}.lanes ln ON ln.lane_id = l.lane_id AND ln.queue = p_queue
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
  END IF;
  -- Starts: only of leases of this queue's lanes, once per lease.
  IF v.rate_limit IS NOT NULL THEN
    INSERT INTO {{schema}}.limit_starts (queue, slot, lane_id, lease_from, started_at, n)
    SELECT p_queue, l.slot, l.lane_id, l.from_seq, clock_timestamp(), l.n
      FROM unnest(p_slots, p_lanes, p_froms) AS u(slot, lane_id, lease_from)
      JOIN {{schema}}.range_leases l ON l.lane_id = u.lane_id AND l.from_seq = u.lease_from AND l.slot = u.slot
      JOIN {{schema}}.lanes ln ON ln.lane_id = l.lane_id AND ln.queue = p_queue
    ON CONFLICT DO NOTHING;
  END IF;
  RETURN v_n;
END $fn$;

-- Set (any of the three values given) or clear (all null) a queue's limits; p_keep_max and
-- p_keep_rate keep the running limit or the rate as they are (read under the queue lock, so two
-- changes of different limits at once both hold). Holds the queue's lock (the key provision_lane
-- and set_queue_paused take), so a lane opened while a limit commits cannot come out unlimited.
-- A new running limit counts the queue's tasks already running: their leases become holders in
-- the same transaction.
CREATE FUNCTION {{schema}}.set_queue_limit(
  p_queue text, p_max_running integer, p_rate_limit integer, p_rate_interval_ms integer, p_actor text,
  p_keep_max boolean, p_keep_rate boolean)
RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_limited boolean;
  v_cur {{schema}}.queue_limits;
  v_n integer;
  v_lane integer;
BEGIN
  IF p_queue IS NULL OR p_actor IS NULL THEN
    RAISE EXCEPTION 'berth: set_queue_limit: queue and actor must not be null' USING ERRCODE = '22004';
  END IF;
  -- An operator's change waits at most this long for a claim holding the queue's limit row
  -- (a claim holds it for milliseconds; a session holding it longer is broken or hostile).
  PERFORM set_config('lock_timeout', '2s', true);
  PERFORM pg_advisory_xact_lock(hashtextextended({{queue_lock_prefix_literal}} || p_queue, 0));
  IF coalesce(p_keep_max, false) OR coalesce(p_keep_rate, false) THEN
    SELECT * INTO v_cur FROM {{schema}}.queue_limits WHERE queue = p_queue;
    IF coalesce(p_keep_max, false) THEN p_max_running := v_cur.max_running; END IF;
    IF coalesce(p_keep_rate, false) THEN
      p_rate_limit := v_cur.rate_limit;
      p_rate_interval_ms := v_cur.rate_interval_ms;
    END IF;
  END IF;
  IF (p_rate_limit IS NULL) <> (p_rate_interval_ms IS NULL) THEN
    RAISE EXCEPTION 'berth: set_queue_limit: a rate limit needs both a count and an interval' USING ERRCODE = '22023';
  END IF;
  v_limited := p_max_running IS NOT NULL OR p_rate_limit IS NOT NULL;
  IF v_limited AND NOT EXISTS (SELECT 1 FROM {{schema}}.lanes WHERE queue = p_queue)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.queue_pauses WHERE queue = p_queue)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.deferred WHERE queue = p_queue) THEN
    RAISE EXCEPTION 'berth: set_queue_limit: queue "%" does not exist (no task was ever enqueued to it)', p_queue
      USING ERRCODE = '22023';
  END IF;
  -- The lanes first: the UPDATE waits for an ordinary claim holding a lane, so every lease it
  -- commits is visible to the holders' read below (a later statement, a later snapshot), and
  -- every claim after it sees the lane limited.
  UPDATE {{schema}}.lanes SET limited = v_limited, version = version + 1
   WHERE queue = p_queue AND limited IS DISTINCT FROM v_limited;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_limited THEN
    INSERT INTO {{schema}}.queue_limits (queue, max_running, rate_limit, rate_interval_ms, updated_at, updated_by)
    VALUES (p_queue, p_max_running, p_rate_limit, p_rate_interval_ms, now(), p_actor)
    ON CONFLICT (queue) DO UPDATE
      SET max_running = EXCLUDED.max_running, rate_limit = EXCLUDED.rate_limit,
          rate_interval_ms = EXCLUDED.rate_interval_ms, updated_at = EXCLUDED.updated_at,
          updated_by = EXCLUDED.updated_by;
    IF p_max_running IS NOT NULL THEN
      -- The queue's tasks running now count against the limit.
      INSERT INTO {{schema}}.limit_holders (queue, slot, lane_id, lease_from, n)
      SELECT p_queue, l.slot, l.lane_id, l.from_seq, l.n
        FROM {{schema}}.lanes ln
        JOIN {{schema}}.range_leases l ON l.lane_id = ln.lane_id
       WHERE ln.queue = p_queue
         AND l.n > coalesce((SELECT sum(x.n) FROM {{schema}}.range_settlements x
                              WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq AND x.slot = l.slot), 0)
      ON CONFLICT DO NOTHING;
    ELSE
      DELETE FROM {{schema}}.limit_holders WHERE queue = p_queue;
    END IF;
    IF p_rate_limit IS NULL THEN DELETE FROM {{schema}}.limit_starts WHERE queue = p_queue; END IF;
  ELSE
    DELETE FROM {{schema}}.queue_limits WHERE queue = p_queue;
    DELETE FROM {{schema}}.limit_holders WHERE queue = p_queue;
    DELETE FROM {{schema}}.limit_starts WHERE queue = p_queue;
  END IF;
  -- Workers learn which queues are limited from this notice (and on every poll); each lane is
  -- named too, so its waiting tasks are claimed by whichever path now owns it.
  PERFORM pg_notify({{wake_channel_literal}}, 'limits');
  FOR v_lane IN SELECT lane_id FROM {{schema}}.lanes WHERE queue = p_queue LOOP
    PERFORM pg_notify({{wake_channel_literal}}, v_lane::text);
  END LOOP;
  RETURN v_n;
END $fn$;

-- What each limit is and how full it is: the dashboard, `berth stats`, the gauges.
CREATE FUNCTION {{schema}}.limit_usage()
RETURNS TABLE (queue text, max_running integer, running integer, rate_limit integer, rate_interval_ms integer,
               started integer, updated_at timestamptz, updated_by text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT q.queue, q.max_running,
         (SELECT coalesce(sum({{schema}}.holder_running(h)), 0)::integer
            FROM {{schema}}.limit_holders h WHERE h.queue = q.queue),
         q.rate_limit, q.rate_interval_ms,
         -- Over the window the claim counts (the interval plus its guard: limit_capacity), so a
         -- queue reads as at its rate exactly when a claim would find no room.
         (SELECT coalesce(sum(s.n), 0)::integer FROM {{schema}}.limit_starts s
           WHERE s.queue = q.queue AND q.rate_limit IS NOT NULL
             AND s.started_at > clock_timestamp()
                                - make_interval(secs => (q.rate_interval_ms + least(q.rate_interval_ms / 10, 250)) / 1000.0)),
         q.updated_at, q.updated_by
    FROM {{schema}}.queue_limits q
   ORDER BY q.queue
$fn$;

-- A lane opened for a limited queue is limited from its first entry (provision_lane as in
-- migration 21, plus the limited column, read under the same queue lock).
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
  INSERT INTO {{schema}}.lanes (queue, priority, shard, paused, limited)
  VALUES (p_queue, p_priority, p_shard,
          EXISTS (SELECT 1 FROM {{schema}}.queue_pauses q WHERE q.queue = p_queue),
          EXISTS (SELECT 1 FROM {{schema}}.queue_limits q WHERE q.queue = p_queue))
  ON CONFLICT DO NOTHING RETURNING lane_id INTO v_id;
  IF v_id IS NULL THEN
    SELECT lane_id INTO v_id FROM {{schema}}.lanes
     WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
    RETURN v_id;
  END IF;
  EXECUTE format('CREATE SEQUENCE %I.%I', {{schema_literal}}, 'lane_seq_' || v_id);
  RETURN v_id;
END $fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.holder_running({{schema}}.limit_holders),
  {{schema}}.limit_capacity(text, integer), {{schema}}.hold_leases(text, smallint[], integer[], bigint[]),
  {{schema}}.set_queue_limit(text, integer, integer, integer, text, boolean, boolean), {{schema}}.limit_usage(),
  {{schema}}.provision_lane(text, smallint, smallint) FROM PUBLIC;
