-- name: cancel a running task (a fenced settlement with its actor, and a notification to the holder); snooze counts
--
-- Issue 13, items 2 and 4. Self-contained on top of migration 9.
--
-- Cancel: `cancel_tasks(ids, actor)` removes a pending task as `remove_unleased` does, and
-- settles a running one as `cancelled`: one `range_settlements` row for the entry, so the
-- exclusion constraint is the arbiter between the cancel and the holder's own settlement
-- (completion, failure, release, snooze) or rescue: exactly one of them is written, whoever
-- comes first. The row carries who cancelled it (`actor`, null for every settlement a worker or
-- rescue writes). The holder is told on the wake channel (`cancel:<lane>:<lane_seq>`, after
-- commit), and polls its in-flight leases as the fallback. A settled entry is never rescued,
-- so a cancel against a dead worker's lease never runs again.
--
-- Snooze: `snoozes` counts, per task, the snoozes that were not charged an attempt, so a task
-- that snoozes forever cannot be immortal (seed 000's warning about refunds): past its type's
-- `maxSnoozes`, a snooze keeps the attempt its claim burnt, and the attempt limit applies. One
-- row per task that snoozed; written only by a snooze (never on the completion path), removed
-- by the leader's retention once the task is neither deferred nor waiting in the ring.

-- Nullable, no default: no rewrite, and no byte on a row that leaves it null (the null bitmap
-- of an 8-column row fits in the header's alignment padding).
ALTER TABLE {{schema}}.range_settlements ADD COLUMN actor text;

CREATE TABLE {{schema}}.snoozes (
  id bigint PRIMARY KEY,
  snoozes integer NOT NULL,
  last_snoozed_at timestamptz NOT NULL DEFAULT now()
);

-- Per id, in order: a pending task is removed (a deferred row deleted, a ready entry past the
-- claim cursor tombstoned, as remove_unleased does, under its lane's row lock); a running one
-- (a leased entry with no settlement, its holder alive or not) is settled `cancelled`. Results:
-- removed, cancelled, already_settled (its latest attempt was settled first and nothing of it
-- is pending: it completed, died, or was cancelled already), not_found, isolation.
CREATE FUNCTION {{schema}}.cancel_tasks(p_ids bigint[], p_actor text)
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_id bigint;
  v_result text;
  v_n integer;
  e record;
BEGIN
  IF p_ids IS NULL THEN
    RAISE EXCEPTION 'berth: cancel_tasks ids must not be null' USING ERRCODE = '22004';
  END IF;
  FOREACH v_id IN ARRAY p_ids LOOP
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      id := v_id; result := 'isolation'; RETURN NEXT; CONTINUE;
    END IF;
    -- Pending: removed. Leased: remove_unleased has taken the lane's row lock, and this
    -- statement's fresh snapshot sees the lease.
    v_result := {{schema}}.remove_unleased(v_id, 'cancelled');
    IF v_result <> 'removed' THEN
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
                                  'data', jsonb_build_object('cancelledBy', p_actor)::text),
               NULL, false
          FROM {{schema}}.history_state hs, {{schema}}.ready r, {{schema}}.range_leases l
         WHERE hs.enabled
           AND r.slot = e.slot AND r.lane_id = e.lane_id AND r.lane_seq = e.lane_seq
           AND l.slot = e.slot AND l.lane_id = e.lane_id AND l.from_seq = e.lease_from;
        v_result := 'cancelled';
      ELSE
        -- Lost the race (the insert waited for the holder's settlement and was dropped), or no
        -- lease is open: a failure, release or rescue that won may have deferred the task.
        DELETE FROM {{schema}}.deferred d WHERE d.id = v_id;
        IF FOUND THEN
          DELETE FROM {{schema}}.dedupe d WHERE d.id = v_id;
          v_result := 'removed';
        ELSIF v_n = 0 OR EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                                  WHERE le.id = v_id AND le.outcome IS NOT NULL) THEN
          v_result := 'already_settled';
        ELSE
          v_result := 'not_found';
        END IF;
      END IF;
    END IF;
    id := v_id; result := v_result; RETURN NEXT;
  END LOOP;
END $fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.cancel_tasks(bigint[], text) FROM PUBLIC;

-- Existing worker roles (those migration 7 or grantRuntimeRole gave prune_slot) get what
-- src/schema/roles.ts gives a worker role now.
DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:prune_slot(smallint,integer)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.cancel_tasks(bigint[], text) TO %2$I', {{schema_literal}}, v_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE (snoozes, last_snoozed_at), DELETE ON %1$I.snoozes TO %2$I',
                   {{schema_literal}}, v_role);
  END LOOP;
END $do$;
