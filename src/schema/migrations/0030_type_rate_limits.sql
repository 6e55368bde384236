-- name: type rate limits: at most N starts of a task type per interval, across the fleet
--
-- A queue's rate (migration 28) is enforced by the limited claim, because a queue owns its lanes.
-- A task type does not: its tasks share lanes with every other type of their queue, and a claim
-- leases a lane's prefix in order, so a claim that stopped at a rate-limited type's task would
-- stop every type behind it. So a type's rate is enforced where its task starts, not where it is
-- claimed: a worker about to start a task of a rate-limited type asks take_type_starts() for a
-- start, and a task refused one is handed back unstarted (its attempt refunded) to deferred
-- storage, due when the type's window will have room for it. Claims, settlements, rescue and
-- prune are unchanged, and other types in the same lanes are never held up.
--
--   take_type_starts(type, ids): locks the type's `type_limits` row (callers for one type wait for
--   each other; the row is held for one statement), forgets starts older than the window, and
--   grants the first `granted` of the tasks asked for: the limit less the starts within the last
--   interval plus a guard (as a queue's rate: a tenth of the interval, at most 250 ms, and here at
--   least 20 ms; the worker
--   starts a granted task within the guard or hands it back). The starts granted are recorded
--   (one row per call, with its count). The tasks refused are paced: the first is told to come
--   back when the oldest start leaves the window, or a step after the type's pacing horizon (the
--   latest time a task still waiting was told) when that is later, and each next one a step
--   ((interval + guard) / limit) after it. So a backlog handed back returns at about the limit's
--   rate instead of all at once. Each refused task is listed in `type_paced` until a start is
--   granted to it, so a change or a clear of the limit can make the tasks it paced due again at
--   once (release_paced, from set_type_limit and the leader's rescue branch), and the gauges can
--   count what the limit holds back.
--
-- A start counts when it is granted: a granted task that is then handed back (it could not start
-- within the guard) has spent its start. Limits are an operator's: no runtime role may call
-- set_type_limit or write type_limits.

CREATE TABLE {{schema}}.type_limits (
  type text PRIMARY KEY,
  rate_limit integer NOT NULL CHECK (rate_limit BETWEEN 1 AND 1000000),
  rate_interval_ms integer NOT NULL CHECK (rate_interval_ms BETWEEN 1 AND 86400000),
  -- Starts refused since the limit was set: the gauges' counter.
  refused bigint NOT NULL DEFAULT 0,
  updated_at timestamptz NOT NULL DEFAULT now(),
  updated_by text NOT NULL
);

CREATE TABLE {{schema}}.type_starts (
  type text NOT NULL,
  started_at timestamptz NOT NULL,
  n integer NOT NULL CHECK (n > 0)
);
CREATE INDEX ON {{schema}}.type_starts (type, started_at);

-- The tasks a type's limit refused and told to come back at `until`, refused at `refused_at`. The
-- latest `until` of a task still waiting is the type's pacing horizon. A row outlives its task
-- when the task is cancelled or deleted meanwhile; such rows are skipped (and deleted) when the
-- horizon is read, and forgotten an hour past their time. A refused task's hand-back commits a
-- round trip after its refusal: when the horizon is read, a row younger than 2 s with no deferred
-- row yet is taken as on its way, not as gone (a slower hand-back only lets a later refusal be
-- told an earlier time, refused again if the window is still full); release_paced waits 10 s.
CREATE TABLE {{schema}}.type_paced (
  id bigint PRIMARY KEY,
  type text NOT NULL,
  until timestamptz NOT NULL,
  refused_at timestamptz NOT NULL
);
CREATE INDEX ON {{schema}}.type_paced (type, until);

CREATE FUNCTION {{schema}}.take_type_starts(p_type text, p_ids bigint[], OUT granted integer, OUT guard_ms integer,
                                            OUT retry_ms integer, OUT step_ms integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v {{schema}}.type_limits;
  v_n integer := coalesce(cardinality(p_ids), 0);
  v_started integer;
  v_oldest timestamptz;
  v_window interval;
  v_now timestamptz;
  v_first timestamptz;
  v_last timestamptz;
  v_refused integer;
BEGIN
  IF p_type IS NULL OR p_ids IS NULL THEN
    RAISE EXCEPTION 'berth: take_type_starts: type and ids must not be null' USING ERRCODE = '22004';
  END IF;
  IF v_n < 1 OR v_n > 10000 THEN
    RAISE EXCEPTION 'berth: take_type_starts: from 1 to 10000 ids a call (got %)', v_n USING ERRCODE = '22023';
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'berth: take_type_starts must run at READ COMMITTED (a snapshot older than the limit row lock would miss a competing start)'
      USING ERRCODE = '25000';
  END IF;
  granted := v_n;
  -- Waits for another caller of this type (each holds the row for one statement). Under READ
  -- COMMITTED each statement below takes a snapshot after the lock was granted, so it sees every
  -- start a competing call committed before releasing it.
  SELECT * INTO v FROM {{schema}}.type_limits WHERE type = p_type FOR UPDATE;
  IF NOT FOUND THEN RETURN; END IF;  -- no limit (cleared since the caller looked): start freely
  -- A tenth of the interval, at least 20 ms and at most 250: the ask's own round trip (1.7 ms
  -- p50, 4 ms p99 bare, more on a worker busy handing tasks back) spent every grant of a 5 ms
  -- guard (5 starts per 50 ms: none started in 5 s, found by review). The floor only lowers a
  -- short interval's steady rate (5 per 50 ms runs at most 5 per 70 ms).
  guard_ms := least(greatest(v.rate_interval_ms / 10, 20), 250);
  v_window := make_interval(secs => (v.rate_interval_ms + guard_ms) / 1000.0);
  v_now := clock_timestamp();
  DELETE FROM {{schema}}.type_starts s WHERE s.type = p_type AND s.started_at <= v_now - v_window;
  SELECT coalesce(sum(s.n), 0), min(s.started_at) INTO v_started, v_oldest
    FROM {{schema}}.type_starts s WHERE s.type = p_type;
  granted := greatest(0, least(v_n, v.rate_limit - v_started));
  IF granted > 0 THEN
    INSERT INTO {{schema}}.type_starts (type, started_at, n) VALUES (p_type, v_now, granted);
    DELETE FROM {{schema}}.type_paced t WHERE t.id = ANY (p_ids[1:granted]) AND t.type = p_type;
  END IF;
  v_refused := v_n - granted;
  IF v_refused > 0 THEN
    -- The window's own pace: `limit` starts per interval plus guard. A step of interval / limit
    -- would send them back faster than the window frees, and the surplus would be refused again.
    step_ms := greatest(1, ceil((v.rate_interval_ms + guard_ms)::numeric / v.rate_limit))::integer;
    -- The window has room again when its oldest start leaves it (the start just granted, when it
    -- was empty before); no earlier than the horizon of the tasks refused before these.
    -- The horizon: the latest time a task still waiting was told, read from the top of the
    -- (type, until) index down to the first row whose task waits (or whose hand-back may be on
    -- its way: refused in the last 2 s). Rows above it are of tasks cancelled or deleted meanwhile: deleted, so they are read
    -- once. Refused again, a task's own row is replaced below.
    SELECT t.until INTO v_last FROM {{schema}}.type_paced t
     WHERE t.type = p_type AND t.until > v_now
       AND (t.refused_at > v_now - interval '2 seconds'
            OR EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = t.id))
     ORDER BY t.until DESC LIMIT 1;
    IF EXISTS (SELECT 1 FROM {{schema}}.type_paced t
                WHERE t.type = p_type AND t.until > coalesce(v_last, v_now)) THEN
      DELETE FROM {{schema}}.type_paced t
       WHERE t.type = p_type AND t.until > coalesce(v_last, v_now) AND t.refused_at <= v_now - interval '2 seconds'
         AND NOT EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = t.id);
    END IF;
    v_first := greatest(coalesce(v_oldest, v_now) + v_window,
                        v_last + make_interval(secs => step_ms / 1000.0));
    retry_ms := greatest(1, ceil(extract(epoch FROM v_first - v_now) * 1000))::integer;
    INSERT INTO {{schema}}.type_paced AS t (id, type, until, refused_at)
    SELECT u.id, p_type, v_first + make_interval(secs => (u.o - 1) * step_ms / 1000.0), v_now
      FROM unnest(p_ids[granted + 1:v_n]) WITH ORDINALITY AS u(id, o)
    ON CONFLICT (id) DO UPDATE SET type = EXCLUDED.type, until = EXCLUDED.until, refused_at = EXCLUDED.refused_at;
    UPDATE {{schema}}.type_limits SET refused = refused + v_refused WHERE type = p_type;
    DELETE FROM {{schema}}.type_paced t WHERE t.type = p_type AND t.until < v_now - interval '1 hour';
  END IF;
END $fn$;

-- Make due at once the tasks a limit refused that no limit holds any more: of a type with no limit
-- now, or refused before the type's limit was last set (a changed limit paces them afresh as they
-- come back). Only a task still waiting where its refusal sent it: handed back (`retryable`), not
-- yet due, of that type, due about when it was told (a row outlives a task that failed since and
-- waits out its backoff). Rows of tasks whose hand-back is still on its way stay, so the
-- maintenance leader's rescue branch, which calls this for every type (p_type NULL), brings them
-- back once it lands. Returns the tasks made due.
CREATE FUNCTION {{schema}}.release_paced(p_type text)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  WITH stale AS MATERIALIZED (
    SELECT t.id, t.type, t.until, t.refused_at FROM {{schema}}.type_paced t
      LEFT JOIN {{schema}}.type_limits l ON l.type = t.type
     WHERE (p_type IS NULL OR t.type = p_type)
       AND (l.type IS NULL OR t.refused_at < l.updated_at)
  ), due AS (
    UPDATE {{schema}}.deferred d SET run_at = now()
      FROM stale t
     WHERE d.id = t.id AND d.type = t.type AND d.state = 'retryable' AND d.run_at > now()
       AND d.run_at <= t.until + interval '5 seconds'  -- the worker's delay, taken a round trip later
    RETURNING d.id
  ), gone AS (
    DELETE FROM {{schema}}.type_paced p USING stale t
     WHERE p.id = t.id AND p.refused_at = t.refused_at
       AND (t.refused_at <= now() - interval '10 seconds'
            OR EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = t.id))
  )
  SELECT count(*)::integer INTO v_n FROM due;
  RETURN v_n;
END $fn$;

-- Set (a count and an interval) or clear (both null) a task type's rate limit, as p_actor.
-- Returns whether a limit was there before. The tasks the old limit paced and handed back are
-- due again at once (release_paced; the new limit paces them afresh as they come back), so a
-- raised or cleared limit takes effect on the backlog too. Workers learn of the change from the `limits` notice
-- (and on every poll).
CREATE FUNCTION {{schema}}.set_type_limit(p_type text, p_rate_limit integer, p_rate_interval_ms integer, p_actor text)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_had boolean;
BEGIN
  IF p_type IS NULL OR p_actor IS NULL THEN
    RAISE EXCEPTION 'berth: set_type_limit: type and actor must not be null' USING ERRCODE = '22004';
  END IF;
  IF (p_rate_limit IS NULL) <> (p_rate_interval_ms IS NULL) THEN
    RAISE EXCEPTION 'berth: set_type_limit: a rate limit needs both a count and an interval' USING ERRCODE = '22023';
  END IF;
  -- A start being granted holds the row for one statement; an operator's change waits at most this long.
  PERFORM set_config('lock_timeout', '2s', true);
  PERFORM 1 FROM {{schema}}.type_limits WHERE type = p_type FOR UPDATE;
  v_had := FOUND;
  IF p_rate_limit IS NULL THEN
    DELETE FROM {{schema}}.type_limits WHERE type = p_type;
    DELETE FROM {{schema}}.type_starts WHERE type = p_type;
  ELSE
    -- The starts kept from the old window count against a changed limit (a longer interval does
    -- not bring back starts older than the old window); the pacing starts afresh.
    INSERT INTO {{schema}}.type_limits (type, rate_limit, rate_interval_ms, updated_at, updated_by)
    VALUES (p_type, p_rate_limit, p_rate_interval_ms, now(), p_actor)
    ON CONFLICT (type) DO UPDATE
      SET rate_limit = EXCLUDED.rate_limit, rate_interval_ms = EXCLUDED.rate_interval_ms,
          updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by;
  END IF;
  PERFORM {{schema}}.release_paced(p_type);
  PERFORM pg_notify({{wake_channel_literal}}, 'limits');
  RETURN v_had;
END $fn$;


-- What each type limit is and how full it is: the starts in the window a start is counted over
-- (the interval plus its guard, as take_type_starts), the starts refused so far, and the tasks
-- it refused that are still waiting to come back.
CREATE FUNCTION {{schema}}.type_limit_usage()
RETURNS TABLE (type text, rate_limit integer, rate_interval_ms integer, started integer, refused bigint,
               paced integer, updated_at timestamptz, updated_by text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT t.type, t.rate_limit, t.rate_interval_ms,
         (SELECT coalesce(sum(s.n), 0)::integer FROM {{schema}}.type_starts s
           WHERE s.type = t.type
             AND s.started_at > clock_timestamp()
                                - make_interval(secs => (t.rate_interval_ms + least(greatest(t.rate_interval_ms / 10, 20), 250)) / 1000.0)),
         t.refused,
         (SELECT count(*)::integer FROM {{schema}}.type_paced p
           WHERE p.type = t.type AND p.until > clock_timestamp()
             AND (p.refused_at > clock_timestamp() - interval '10 seconds'
                  OR EXISTS (SELECT 1 FROM {{schema}}.deferred d WHERE d.id = p.id))),
         t.updated_at, t.updated_by
    FROM {{schema}}.type_limits t
   ORDER BY t.type
$fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.take_type_starts(text, bigint[]), {{schema}}.release_paced(text),
  {{schema}}.set_type_limit(text, integer, integer, text), {{schema}}.type_limit_usage() FROM PUBLIC;
