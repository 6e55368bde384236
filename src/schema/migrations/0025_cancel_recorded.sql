-- name: a cancelled task stays visible: cancel_tasks() records the cancel of a pending task in attempt history, with its actor; a partial index finds cancels by id
--
-- Until now a cancel wrote to attempt history only when it settled a running task (migration
-- 11's `cancelled` row, with the actor in its error). A pending task (ready, scheduled,
-- retryable) was removed and nothing said so: getTask, listTasks, `berth tasks show` and the
-- dashboard called it "not found", and `berth history` knew nothing of the cancel. The same held
-- for a cancel that found the holder's failure or release first and took the task out of
-- deferred storage instead.
--
-- Now every cancel that removes a task also inserts one `cancelled` row in attempt history, in
-- the same statement and so the same transaction as the removal: worker null (no worker ran
-- it), claimed_at = settled_at = the cancel's time by the clock (no claim: a duration of 0; the
-- clock, so that a cancel that waited for the holder's failure is recorded after it), attempt = the
-- attempts the task had had (0 for one that never ran: the cancel is not an attempt, so the
-- count stays what it was), the error `{message: "cancelled by <actor> while <state>", name:
-- "Cancel", data: {"cancelledBy": <actor>, "state": <state>}}`. A running task's cancel row is
-- migration 20's, its data now also saying `"state": "running"`. What a cancel removes is what it
-- records: a deferred row is deleted by one statement that returns it (promotion skips a row a
-- cancel holds, and a cancel that waited for promotion finds the row gone and the task in the
-- ring), a ready entry is the one the removal tombstoned. The removal of a ready entry is
-- `tombstone_unleased()`, remove_unleased_quietly()'s second half made a function of its own, so
-- that a cancel never deletes a deferred row it did not read: a first version looked in deferred
-- storage and then called remove_unleased_quietly(), whose own DELETE (a later snapshot) could
-- take a retry the holder's failure committed in between, answer `removed` and record nothing
-- (the task then read as not found; cancel-races.test.ts forces that interleaving). Nothing is
-- recorded while attempt history is turned off, as for every other attempt.
--
-- Which of a cancel and the holder's own settlement is written is unchanged: the running path
-- is migration 20's, word for word but for the data's `state`.
--
-- An operator's cancel row is `outcome = 'cancelled' AND error ->> 'name' = 'Cancel'`: a worker
-- records `cancelled` too, for a run that its own stop interrupted and released (migration 10;
-- the task runs again), with the abort's error. `attempt_history (bucket) WHERE <that>`:
-- `listTasks({ state: 'cancelled' })` reads cancels only (docs/explain-admin.md); without it, the
-- walk read every history row past the page when few are cancels. Only cancel rows are in it,
-- so the hot settlements' inserts only test the predicate. Building it reads each history partition once
-- (an index build holds inserts into the partition it reads, i.e. settlements, for that long:
-- measured at about 30 ms per 100,000 history rows).

CREATE INDEX attempt_history_cancelled_idx ON {{schema}}.attempt_history (bucket)
  WHERE outcome = 'cancelled' AND (error ->> 'name') = 'Cancel';

-- The unleased ready entry of a task tombstoned (`removed`), or `leased` (a lease holds it;
-- the lane's row is locked and its version bumped either way), or `not_found`: what
-- remove_unleased_quietly() did after looking in deferred storage, now callable without that
-- look, by cancel_tasks(), which reads the deferred row it removes.
CREATE FUNCTION {{schema}}.tombstone_unleased(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  SELECT e.slot, e.lane_id, e.lane_seq INTO r FROM {{schema}}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                      WHERE le.id = p_id AND le.lane_id = e.lane_id AND le.lane_seq = e.lane_seq
                        AND le.slot = e.slot AND le.outcome IS NOT NULL)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  -- Row-locks the lane (claims skip it meanwhile) and bumps its version, so a claim whose
  -- snapshot predates this tombstone sees the version change and leaves the lane alone.
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
              WHERE le.id = p_id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, p_reason) ON CONFLICT DO NOTHING;
  DELETE FROM {{schema}}.dedupe WHERE id = p_id;
  RETURN 'removed';
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.remove_unleased_quietly(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  DELETE FROM {{schema}}.deferred WHERE id = p_id;
  IF FOUND THEN
    DELETE FROM {{schema}}.dedupe WHERE id = p_id;
    RETURN 'removed';
  END IF;
  RETURN {{schema}}.tombstone_unleased(p_id, p_reason);
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.cancel_tasks(p_ids bigint[], p_actor text)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_id bigint;
  v_result text;
  v_n integer;
  e record;
  v_results jsonb := '{}';
  -- What a removal took out, for its history row.
  v_deferred boolean;
  v_state text;
  v_type text;
  v_queue text;
  v_priority smallint;
  v_shard smallint;
  v_lane integer;
  v_attempts integer;
  v_created timestamptz;
  v_at timestamptz;
BEGIN
  IF p_ids IS NULL THEN
    RAISE EXCEPTION 'berth: cancel_tasks ids must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM {{schema}}.check_actor('cancel_tasks', p_actor);
  IF cardinality(p_ids) > 10000 THEN
    RAISE EXCEPTION 'berth: cancel_tasks: at most 10000 ids a call (got %)', cardinality(p_ids) USING ERRCODE = '22023';
  END IF;
  FOREACH v_id IN ARRAY p_ids LOOP
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      id := v_id; result := 'isolation'; RETURN NEXT; CONTINUE;
    END IF;
    v_lane := NULL;
    v_type := NULL;
    -- Deferred: removed and read by one statement, so what is recorded is what was deleted
    -- (promotion skips the row this holds; a cancel that waits for promotion finds it gone).
    DELETE FROM {{schema}}.deferred x WHERE x.id = v_id
      RETURNING x.state, x.type, x.queue, x.priority, x.shard, x.attempts, x.created_at
      INTO v_state, v_type, v_queue, v_priority, v_shard, v_attempts, v_created;
    v_deferred := FOUND;
    IF v_deferred THEN
      DELETE FROM {{schema}}.dedupe d WHERE d.id = v_id;
      v_result := 'removed';
    ELSE
      -- Ready: tombstoned. Leased: tombstone_unleased has taken the lane's row lock, and this
      -- statement's fresh snapshot sees the lease. Never remove_unleased_quietly here: its own
      -- look in deferred storage could delete a retry committed since the DELETE above, unread.
      v_result := {{schema}}.tombstone_unleased(v_id, 'cancelled');
    END IF;
    IF v_result = 'removed' AND NOT v_deferred THEN
      -- The ready entry the removal tombstoned (the ready index on id, then the tombstone's key).
      SELECT r.lane_id, r.type, r.attempts, r.created_at INTO v_lane, v_type, v_attempts, v_created
        FROM {{schema}}.ready r
        JOIN {{schema}}.tombstones t ON t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
       WHERE r.id = v_id AND t.reason = 'cancelled'
       ORDER BY r.appended_at DESC LIMIT 1;
      v_state := 'ready';
    ELSIF v_result <> 'removed' THEN
      SELECT le.slot, le.lane_id, le.lane_seq, le.lease_from INTO e
        FROM {{schema}}.leased_entries le
       WHERE le.id = v_id AND le.outcome IS NULL
       LIMIT 1;
      IF FOUND THEN
        INSERT INTO {{schema}}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome, actor)
        VALUES (e.slot, e.lane_id, e.lease_from, int8multirange(int8range(e.lane_seq, e.lane_seq + 1)), 1,
                'cancelled', p_actor)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
      ELSE
        v_n := -1;
      END IF;
      IF v_n = 1 THEN
        DELETE FROM {{schema}}.dedupe d WHERE d.id = v_id;
        -- Delivered at commit to every worker's LISTEN session; the holder aborts the handler.
        PERFORM pg_notify({{wake_channel_literal}}, format('cancel:%s:%s', e.lane_id, e.lane_seq));
        -- Attempt history (migration 10): the attempt ended here, and who ended it. The holder's
        -- own settlement is refused by the fence (or never written), so it records nothing.
        INSERT INTO {{schema}}.attempt_history (part, bucket, outcome, lane_id, type, worker, claimed_at,
                                                ids, attempts, created_at, run_ms, error, cursor, dead)
        SELECT hs.current_part, v_id >> 10, 'cancelled', r.lane_id, r.type, l.worker, l.claimed_at,
               ARRAY[v_id], ARRAY[r.attempts + 1], ARRAY[r.created_at], ARRAY[NULL::integer],
               jsonb_build_object('message', 'cancelled by ' || coalesce(p_actor, 'an operator'),
                                  'name', 'Cancel',
                                  'data', jsonb_build_object('cancelledBy', p_actor, 'state', 'running')::text),
               NULL, false
          FROM {{schema}}.history_state hs, {{schema}}.ready r, {{schema}}.range_leases l
         WHERE hs.enabled
           AND r.slot = e.slot AND r.lane_id = e.lane_id AND r.lane_seq = e.lane_seq
           AND l.slot = e.slot AND l.lane_id = e.lane_id AND l.from_seq = e.lease_from;
        v_result := 'cancelled';
      ELSE
        -- Lost the race (the insert waited for the holder's settlement and was dropped), or no
        -- lease is open: a failure, release or rescue that won may have deferred the task.
        DELETE FROM {{schema}}.deferred d WHERE d.id = v_id
          RETURNING d.state, d.type, d.queue, d.priority, d.shard, d.attempts, d.created_at
          INTO v_state, v_type, v_queue, v_priority, v_shard, v_attempts, v_created;
        IF FOUND THEN
          DELETE FROM {{schema}}.dedupe d WHERE d.id = v_id;
          v_deferred := true;
          v_result := 'removed';
        ELSIF v_n = 0 OR EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                                  WHERE le.id = v_id AND le.outcome IS NOT NULL) THEN
          v_result := 'already_settled';
        ELSE
          v_result := 'not_found';
        END IF;
      END IF;
    END IF;
    -- A pending task's cancel: no attempt ran, so no worker, a claim time of now and the
    -- attempts it had had. A deferred task's lane may not exist yet (a scheduled task's lane is
    -- opened when it is first appended): provision_lane opens it as promotion would have.
    IF v_result = 'removed' AND v_type IS NOT NULL
       AND (SELECT hs.enabled FROM {{schema}}.history_state hs) THEN
      IF v_deferred THEN
        v_lane := {{schema}}.provision_lane(v_queue, v_priority, v_shard);
      END IF;
      -- The clock, not the transaction's start: a cancel that waited for the holder's failure and
      -- then took the retry out of deferred storage comes after that failure's row.
      v_at := clock_timestamp();
      INSERT INTO {{schema}}.attempt_history (part, bucket, settled_at, outcome, lane_id, type, worker, claimed_at,
                                              ids, attempts, created_at, run_ms, error, cursor, dead)
      SELECT hs.current_part, v_id >> 10, v_at, 'cancelled', v_lane, v_type, NULL, v_at,
             ARRAY[v_id], ARRAY[v_attempts], ARRAY[v_created], ARRAY[NULL::integer],
             jsonb_build_object('message', 'cancelled by ' || coalesce(p_actor, 'an operator') || ' while ' || v_state,
                                'name', 'Cancel',
                                'data', jsonb_build_object('cancelledBy', p_actor, 'state', v_state)::text),
             NULL, false
        FROM {{schema}}.history_state hs;
    END IF;
    id := v_id; result := v_result; RETURN NEXT;
    v_results := v_results || jsonb_build_object(v_id::text, v_result);
  END LOOP;
  -- Every cancel is audited here, whoever calls the function: the session's role, beside the
  -- actor the caller named (which nothing can check).
  IF EXISTS (SELECT 1 FROM jsonb_each_text(v_results) x WHERE x.value IN ('removed', 'cancelled')) THEN
    INSERT INTO {{schema}}.audit_log (actor, action, target, result)
    VALUES ('db:' || session_user, 'cancel', jsonb_build_object('ids', to_jsonb(p_ids), 'actor', p_actor), v_results);
  END IF;
END $fn$;

-- Kept by CREATE OR REPLACE; said again so none is ever executable by PUBLIC. tombstone_unleased
-- is new: only the definer functions call it.
REVOKE EXECUTE ON FUNCTION {{schema}}.cancel_tasks(bigint[], text), {{schema}}.remove_unleased_quietly(bigint, text),
  {{schema}}.tombstone_unleased(bigint, text) FROM PUBLIC;
