-- name: roles split by need: ring prune, dead-letter retention and promotion selection as definer functions
--
-- The runtime roles split by need (producer, worker; see src/schema/roles.ts). The worker's
-- powers that could empty or rewrite storage at will move behind definer functions that check
-- the safety condition themselves: the ring prune (TRUNCATE), dead-letter retention (DELETE) and
-- promotion's row selection (FOR UPDATE, which needs UPDATE). Existing runtime roles (every role
-- granted EXECUTE on promote_lane, which only grantRuntimeRole grants) become worker roles here:
-- they gain the new functions and lose the table privileges these replace.
--
-- The bodies are frozen copies: the prune's checks are pruneSlot's before this migration, and
-- the retention predicate is `deadRowPredicate` (src/storage/predicates.ts) as of this version.
-- A later change to either needs a new migration.

-- Reclaim one sealed ring slot: under ACCESS EXCLUSIVE on its four partitions (taken within
-- p_lock_timeout_ms, else 'blocked' and nothing changes), truncate them only when the slot is
-- not the current one, holds something, has no claimable entry and no lease in flight. Returns
-- 'pruned', 'current', 'empty', 'claimable', 'in_flight' or 'blocked'. Every entry of a pruned
-- slot was settled or tombstoned, so no caller can lose a task through it.
CREATE FUNCTION {{schema}}.prune_slot(p_slot smallint, p_lock_timeout_ms integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_tables text;
  v_old_timeout text := current_setting('lock_timeout');
  v_any boolean; v_claimable boolean; v_in_flight boolean;
BEGIN
  IF p_slot IS NULL OR p_lock_timeout_ms IS NULL THEN
    RAISE EXCEPTION 'berth: prune_slot arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_slot < 0 OR p_slot >= (SELECT slot_count FROM {{schema}}.ring_state) THEN
    RAISE EXCEPTION 'berth: ring slot % does not exist', p_slot USING ERRCODE = '22023';
  END IF;
  -- Checked first too, so the current slot's partitions (every producer's) are never locked.
  IF (SELECT current_slot FROM {{schema}}.ring_state) = p_slot THEN RETURN 'current'; END IF;
  v_tables := concat_ws(', ', format('%I.%I', {{schema_literal}}, 'ready_' || p_slot), format('%I.%I', {{schema_literal}}, 'leases_' || p_slot), format('%I.%I', {{schema_literal}}, 'settlements_' || p_slot), format('%I.%I', {{schema_literal}}, 'tombstones_' || p_slot));
  PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1) || 'ms', true);
  BEGIN
    EXECUTE 'LOCK TABLE ' || v_tables || ' IN ACCESS EXCLUSIVE MODE';
  EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', v_old_timeout, true);
    RETURN 'blocked';
  END;
  PERFORM set_config('lock_timeout', v_old_timeout, true);
  -- Again under the lock: a rotation that committed meanwhile may have made it current.
  IF (SELECT current_slot FROM {{schema}}.ring_state) = p_slot THEN RETURN 'current'; END IF;
  EXECUTE format(
    'SELECT EXISTS (SELECT 1 FROM %1$s),
            EXISTS (SELECT 1 FROM %1$s r
                     WHERE NOT EXISTS (SELECT 1 FROM %2$s l WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq)
                       AND NOT EXISTS (SELECT 1 FROM %4$s x WHERE x.lane_id = r.lane_id AND x.lane_seq = r.lane_seq)),
            EXISTS (SELECT 1 FROM %2$s l
                     WHERE NOT EXISTS (SELECT 1 FROM %3$s x WHERE x.lane_id = l.lane_id AND x.lane_seq = l.lane_seq))',
    format('%I.%I', {{schema_literal}}, 'ready_' || p_slot), format('%I.%I', {{schema_literal}}, 'leases_' || p_slot), format('%I.%I', {{schema_literal}}, 'settlements_' || p_slot), format('%I.%I', {{schema_literal}}, 'tombstones_' || p_slot))
    INTO v_any, v_claimable, v_in_flight;
  IF NOT v_any THEN RETURN 'empty'; END IF;
  IF v_claimable THEN RETURN 'claimable'; END IF;
  IF v_in_flight THEN RETURN 'in_flight'; END IF;
  EXECUTE 'TRUNCATE ' || v_tables;
  RETURN 'pruned';
END $fn$;

-- Dead-letter retention: delete up to p_limit dead letters whose last attempt is older than
-- p_retention_ms and that no live, unsettled lease carries (the dead gauge's predicate). Each
-- call that deletes something leaves a row in the audit log, so a role that can run it cannot
-- empty the dead letters without a trace. Returns the number deleted.
CREATE FUNCTION {{schema}}.prune_dead_letters(p_retention_ms double precision, p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  IF p_retention_ms IS NULL OR p_limit IS NULL THEN
    RAISE EXCEPTION 'berth: prune_dead_letters arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_retention_ms < 0 OR p_limit < 1 THEN
    RAISE EXCEPTION 'berth: prune_dead_letters needs a retention >= 0 and a limit >= 1' USING ERRCODE = '22023';
  END IF;
  DELETE FROM {{schema}}.dead_letters
   WHERE id IN (SELECT d.id FROM {{schema}}.dead_letters d
                 WHERE d.last_attempted_at < now() - make_interval(secs => p_retention_ms / 1000.0)
                   AND NOT EXISTS (SELECT 1 FROM {{schema}}.ready rr
                                     JOIN {{schema}}.leases l
                                       ON l.lane_id = rr.lane_id AND l.lane_seq = rr.lane_seq AND l.slot = rr.slot
                                    WHERE rr.id = d.id AND l.expires_at > now()
                                      AND NOT EXISTS (SELECT 1 FROM {{schema}}.settlements st
                                                       WHERE st.lane_id = l.lane_id AND st.lane_seq = l.lane_seq
                                                         AND st.slot = l.slot))
                 LIMIT p_limit);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN
    INSERT INTO {{schema}}.audit_log (actor, action, target, result)
    VALUES ('maintenance:' || session_user, 'dead.retention',
            jsonb_build_object('retentionMs', p_retention_ms), jsonb_build_object('pruned', v_n));
  END IF;
  RETURN v_n;
END $fn$;

-- Promotion's batch selection: the oldest due deferred rows (optionally of one state), lanes in
-- the skip arrays left out, locked FOR UPDATE SKIP LOCKED for the caller's transaction. A row
-- lock needs UPDATE on the table, which a worker role must not have.
CREATE FUNCTION {{schema}}.due_deferred(p_state text, p_limit integer, p_skip_queues text[],
                                  p_skip_priorities smallint[], p_skip_shards smallint[])
RETURNS TABLE (id bigint, queue text, priority smallint, shard smallint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT d.id, d.queue, d.priority, d.shard
    FROM {{schema}}.deferred d
   WHERE d.run_at <= now()
     AND (p_state IS NULL OR d.state = p_state)
     AND NOT EXISTS (SELECT 1 FROM unnest(p_skip_queues, p_skip_priorities, p_skip_shards) AS k(q, p, sh)
                      WHERE k.q = d.queue AND k.p = d.priority AND k.sh = d.shard)
   ORDER BY d.run_at, d.priority, d.id
   LIMIT p_limit
   FOR UPDATE OF d SKIP LOCKED
$fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.prune_slot(smallint, integer), {{schema}}.prune_dead_letters(double precision, integer),
  {{schema}}.due_deferred(text, integer, text[], smallint[], smallint[]) FROM PUBLIC;

-- Existing runtime roles become worker roles (the owner's grants; the owner itself is skipped).
DO $do$
DECLARE v_role text; v_slot integer;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:promote_lane(text,smallint,smallint,integer)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.prune_slot(smallint, integer), %1$I.prune_dead_letters(double precision, integer), '
                   '%1$I.due_deferred(text, integer, text[], smallint[], smallint[]) TO %2$I', {{schema_literal}}, v_role);
    FOR v_slot IN 0..15 LOOP
      EXECUTE format('REVOKE TRUNCATE ON %1$I.%2$I, %1$I.%3$I, %1$I.%4$I, %1$I.%5$I FROM %6$I', {{schema_literal}},
                     'ready_' || v_slot, 'leases_' || v_slot, 'settlements_' || v_slot, 'tombstones_' || v_slot, v_role);
    END LOOP;
    EXECUTE format('REVOKE DELETE ON %I.dead_letters FROM %I', {{schema_literal}}, v_role);
    EXECUTE format('REVOKE UPDATE (run_at) ON %I.deferred FROM %I', {{schema_literal}}, v_role);
  END LOOP;
END $do$;
