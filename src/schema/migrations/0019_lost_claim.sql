-- name: lost claim: a claim a server crash took back is counted as an attempt
--
-- The claim commits asynchronously (synchronous_commit off, local to its transaction: a pickup
-- does not wait for a WAL flush; src/processor/claim.ts). A server crash (not a clean restart)
-- within the WAL writer's delay of a claim can therefore lose its lease row while the worker
-- already runs the task. The entry is unleased again, another claim may run it beside the first
-- (allowed by at-least-once), and the first run's settlement is refused by the token fence. Its
-- attempt was not counted anywhere: the next claim of the entry carried the same attempt number,
-- so a task whose run crashes the database could run for ever, never reaching its limit.
--
-- count_lost_claim() is what the worker calls when its settlement was refused and its lease row
-- is gone (not settled by someone else: gone). Under the lane's row lock (claims skip the lane
-- meanwhile; its version bump fences a claim with an older snapshot), for the entry the worker
-- ran:
-- - not leased by another claim: it is tombstoned and moved to deferred (due now) with the
--   attempt counted, or, at the attempt limit, to the dead letters: 'counted' or 'dead';
-- - leased by another claim already: it runs again there under the same attempt number (the
--   limit still bounds every attempt that settles): 'running';
-- - no longer there (settled, removed, its segment reclaimed): 'gone'.
-- Either way but 'gone', attempt history gets a `lost` row for the run, with why. READ COMMITTED
-- only (the re-check after the lane lock must see a claim committed meanwhile), as
-- remove_unleased.

CREATE FUNCTION {{schema}}.count_lost_claim(
  p_slot smallint, p_lane integer, p_seq bigint, p_attempt integer, p_max_attempts integer, p_worker text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  r record;
  v_result text;
  v_dead boolean := false;
  v_message text;
BEGIN
  IF p_slot IS NULL OR p_lane IS NULL OR p_seq IS NULL OR p_attempt IS NULL OR p_max_attempts IS NULL THEN
    RAISE EXCEPTION 'berth: count_lost_claim arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN RETURN 'isolation'; END IF;
  SELECT e.* INTO r FROM {{schema}}.ready e
   WHERE e.slot = p_slot AND e.lane_id = p_lane AND e.lane_seq = p_seq AND e.attempts + 1 = p_attempt
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot);
  IF NOT FOUND THEN RETURN 'gone'; END IF;
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = p_lane;
  IF EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
              WHERE le.lane_id = p_lane AND le.lane_seq = p_seq AND le.slot = p_slot AND le.outcome IS NOT NULL) THEN
    -- Settled under another lease since (it ran again and finished, or was cancelled).
    RETURN 'gone';
  ELSIF EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                 WHERE le.lane_id = p_lane AND le.lane_seq = p_seq AND le.slot = p_slot) THEN
    v_result := 'running';
    v_message := format('its claim (attempt %s by worker %s) was lost in a database crash; it was claimed again and runs again under that attempt',
                        p_attempt, coalesce(p_worker, 'unknown'));
  ELSE
    v_dead := p_attempt >= p_max_attempts;
    v_result := CASE WHEN v_dead THEN 'dead' ELSE 'counted' END;
    v_message := format('its claim (attempt %s by worker %s) was lost in a database crash after the handler started',
                        p_attempt, coalesce(p_worker, 'unknown'));
    INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
    VALUES (p_slot, p_lane, p_seq, r.id, 'lost claim') ON CONFLICT DO NOTHING;
    IF v_dead THEN
      INSERT INTO {{schema}}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
                                           last_error, created_at, last_attempted_at, trace_context)
      VALUES (r.id, r.type, r.payload, r.queue, r.priority, r.shard, p_attempt, r.max_attempts, r.dedupe_key,
              v_message, r.created_at, now(), r.trace_context)
      ON CONFLICT (id) DO UPDATE SET
        payload = EXCLUDED.payload, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
        last_attempted_at = EXCLUDED.last_attempted_at, died_at = now();
      DELETE FROM {{schema}}.dedupe WHERE id = r.id;
    ELSE
      INSERT INTO {{schema}}.deferred (state, run_at, id, type, payload, queue, priority, shard, attempts, max_attempts,
                                       dedupe_key, last_error, created_at, last_attempted_at, trace_context)
      VALUES ('retryable', now(), r.id, r.type, r.payload, r.queue, r.priority, r.shard, p_attempt, r.max_attempts,
              r.dedupe_key, v_message, r.created_at, now(), r.trace_context)
      ON CONFLICT (id) DO NOTHING;
    END IF;
  END IF;
  INSERT INTO {{schema}}.attempt_history (part, bucket, outcome, lane_id, type, worker, claimed_at, ids, attempts,
                                          created_at, run_ms, error, cursor, dead)
  SELECT hs.current_part, r.id >> 10, 'lost', p_lane, r.type, p_worker, now(), ARRAY[r.id], ARRAY[p_attempt],
         ARRAY[r.created_at], ARRAY[NULL::integer], jsonb_build_object('message', v_message), NULL, v_dead
    FROM {{schema}}.history_state hs WHERE hs.enabled;
  RETURN v_result;
END $fn$;
REVOKE EXECUTE ON FUNCTION {{schema}}.count_lost_claim(smallint, integer, bigint, integer, integer, text) FROM PUBLIC;

-- Worker roles granted before this migration (they can execute prune_slot) call it.
DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:prune_slot(smallint,integer)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.count_lost_claim(smallint, integer, bigint, integer, integer, text) TO %2$I',
                   {{schema_literal}}, v_role);
  END LOOP;
END $do$;
