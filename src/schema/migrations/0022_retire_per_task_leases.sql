-- name: per-task leases and settlements retired: their triggers dropped, no runtime grant, and the ring prune locks and truncates a segment's four range-era partitions only
--
-- `leases` and `settlements` (migration 1, one row per task, 16 partitions each) have held
-- nothing any statement reads since migration 8 (range leases): their rows were copied into
-- `range_leases` / `range_settlements`, and two triggers kept workers older than 8 safe during
-- that deploy (`refuse_legacy_lease`: an old claim fails loudly; `forward_legacy_settlement`: an
-- old settlement is written into `range_settlements`, where the fence is). A worker older than 8
-- is twelve migrations back and runs in no fleet of 21 (a deploy rolls over the version before).
-- Yet every prune still took ACCESS EXCLUSIVE on six partitions of its segment, not four, and
-- checked two more for pages: two more locks that a claim reading the segment may queue behind,
-- for tables nothing writes any more.
--
-- Here: both triggers and their functions are dropped; prune_slot is migration 18's, word for
-- word, but for its two table lists (the lock and the TRUNCATE): ready, range_leases,
-- range_settlements, tombstones; every privilege a runtime role holds on the two tables and
-- their partitions is revoked (src/schema/roles.ts no longer grants any).
--
-- The tables themselves are kept as they are (empty but for any settlement a worker older than 8
-- wrote through the trigger into a segment not pruned since, which range_settlements holds too),
-- unused, and dropped by a later migration, in a release after this one. Why not here: a fleet of
-- the previous version (migration 21) must survive this migration, and its leader's prune names
-- `leases_<n>` and `settlements_<n>`. Not in its TypeScript (`pruneSegment` calls prune_slot by
-- name), but in prune_slot's migration-18 body, which builds its LOCK TABLE list from those names.
-- CREATE OR REPLACE below takes effect for calls that start after this migration commits; a call
-- that started before runs the old body to its end (PL/pgSQL compiles a function when a call
-- starts). Its checks run before the lock, so an old prune that was checking a segment when this
-- migration committed would then LOCK `leases_<n>`: with the tables dropped here, that is "relation
-- leases_<n> does not exist" (42P01, measured: this migration with a DROP of the two tables added
-- at its end, and a prune held in its checks, by a lock on tombstones_0, across its commit), not
-- caught by the prune, and the old leader logs "maintenance branch failed". No lock this migration
-- could take closes that window: before its LOCK an old prune holds only ACCESS SHARE on the
-- segment's partitions, which only ACCESS EXCLUSIVE on every ring partition would wait for
-- (stalling every claim and append), and a call that started meanwhile, blocked behind it, would
-- still run the old body once this commits. With the tables kept, that old prune locks and (when
-- they have pages) truncates them as before, and answers as before. test/migration-22.test.ts runs
-- exactly that prune across this migration's commit. The later migration has no such window: by
-- then no call of migration 18's body can still be running.
--
-- Under a running fleet of migration 21, then: no statement of a worker, leader, producer,
-- dashboard or the CLI of that version reads or writes the two tables, directly or through a
-- function or view (leased_entries reads the range tables); only prune_slot named them. A
-- DROP TRIGGER takes ACCESS EXCLUSIVE on its table and its 16 partitions: it waits for a prune
-- holding one (a few ms), and a prune that asks for one meanwhile waits its own lock timeout and
-- answers `blocked`, or gets the lock once this commits and goes on (the tables are still there).
-- `leases` is locked before `settlements`, in the order a prune locks them, so the two never
-- deadlock. Nothing else here locks a table.

DROP TRIGGER refuse_legacy_lease ON {{schema}}.leases;
DROP TRIGGER forward_legacy_settlement ON {{schema}}.settlements;
DROP FUNCTION {{schema}}.refuse_legacy_lease();
DROP FUNCTION {{schema}}.forward_legacy_settlement();

-- No runtime role reads them any more: every grant on the two tables and their partitions is
-- revoked, from whichever roles hold one (an earlier grantRuntimeRole gave producers and workers
-- SELECT on the parents, workers on the partitions too).
DO $do$
DECLARE v_grantee text; v_tables text;
BEGIN
  SELECT string_agg(format('%I.%I', {{schema_literal}}, t), ', ' ORDER BY t) INTO v_tables
    FROM (SELECT unnest(ARRAY['leases', 'settlements']) AS t
          UNION ALL
          SELECT p || '_' || g FROM unnest(ARRAY['leases', 'settlements']) p, generate_series(0, 15) g) x;
  FOR v_grantee IN
    SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
      FROM pg_class c, aclexplode(c.relacl) a
     WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = {{schema_literal}})
       AND (c.relname IN ('leases', 'settlements') OR c.relname ~ '^(leases|settlements)_[0-9]+$')
       AND a.grantee <> c.relowner
  LOOP
    EXECUTE 'REVOKE ALL ON TABLE ' || v_tables || ' FROM ' || v_grantee;
  END LOOP;
END $do$;

COMMENT ON TABLE {{schema}}.leases IS
  'berth: unused since migration 8, untouched since migration 22 (no trigger, no grant, not pruned); a later migration drops it';
COMMENT ON TABLE {{schema}}.settlements IS
  'berth: unused since migration 8, untouched since migration 22 (no trigger, no grant, not pruned); a later migration drops it';

-- The prune: migration 18's (see its header), with the segment's four partitions in its two
-- table lists (the lock and the TRUNCATE). Same signature: CREATE OR REPLACE keeps its owner and
-- grants, and an older leader's `SELECT prune_slot(...)` runs this body from its next call.
CREATE OR REPLACE FUNCTION {{schema}}.prune_slot(p_slot smallint, p_lock_timeout_ms integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_tables text;
  v_old_timeout text := current_setting('lock_timeout');
  v_any boolean; v_claimable boolean; v_in_flight boolean;
  v_ready text; v_leases text; v_settlements text; v_tombstones text;
  v_tops_cte text; v_settled_cte text;
  v_claimable_check text; v_rest_check text; v_exact_check text; v_late_check text; v_recover text;
  v_unsettled bigint; v_late bigint; v_recovered integer := 0;
  v_lanes integer[]; v_tops bigint[];
BEGIN
  IF p_slot IS NULL OR p_lock_timeout_ms IS NULL THEN
    RAISE EXCEPTION 'berth: prune_slot arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_slot < 0 OR p_slot >= (SELECT slot_count FROM {{schema}}.ring_state) THEN
    RAISE EXCEPTION 'berth: ring slot % does not exist', p_slot USING ERRCODE = '22023';
  END IF;
  IF (SELECT e.last_value % rs.slot_count FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs) = p_slot THEN
    RETURN 'current';
  END IF;
  v_ready := format('%I.%I', {{schema_literal}}, 'ready_' || p_slot);
  v_leases := format('%I.%I', {{schema_literal}}, 'range_leases_' || p_slot);
  v_settlements := format('%I.%I', {{schema_literal}}, 'range_settlements_' || p_slot);
  v_tombstones := format('%I.%I', {{schema_literal}}, 'tombstones_' || p_slot);
  -- Each lane's last entry in the segment: a skip scan down the primary key, one probe a lane.
  v_tops_cte := format(
    'WITH RECURSIVE tops AS (
       (SELECT r.lane_id, r.lane_seq FROM %1$s r ORDER BY r.lane_id DESC, r.lane_seq DESC LIMIT 1)
       UNION ALL
       SELECT n.lane_id, n.lane_seq FROM tops t
        CROSS JOIN LATERAL (SELECT r.lane_id, r.lane_seq FROM %1$s r WHERE r.lane_id < t.lane_id
                             ORDER BY r.lane_id DESC, r.lane_seq DESC LIMIT 1) n
     )', v_ready);
  -- Each lane's settled entries, as one multirange.
  v_settled_cte := format('settled AS (SELECT x.lane_id, range_agg(x.seqs) AS seqs FROM %1$s x GROUP BY x.lane_id)',
                      v_settlements);
  -- Claimable: a lane's last entry in the segment that no
  -- lease of the segment covers, not tombstoned and above the lane's cursor over every segment;
  -- when the last entry is tombstoned, any such entry of the lane. Below the cursor an unleased
  -- entry is stranded, not claimable: the entry-by-entry check below takes it.
  -- %1$s ready, %2$s range_leases, %3$s tombstones of the segment, %4$I the schema.
  v_claimable_check := v_tops_cte || format(
    ', unleased AS (
       SELECT t.lane_id, t.lane_seq,
              EXISTS (SELECT 1 FROM %3$s x WHERE x.lane_id = t.lane_id AND x.lane_seq = t.lane_seq) AS tombstoned,
              coalesce((SELECT c.to_seq FROM %4$I.range_leases c WHERE c.lane_id = t.lane_id
                         ORDER BY c.from_seq DESC LIMIT 1), 0) AS cursor
         FROM tops t
        WHERE NOT EXISTS (SELECT 1 FROM (SELECT l.to_seq FROM %2$s l
                                          WHERE l.lane_id = t.lane_id AND l.from_seq <= t.lane_seq
                                          ORDER BY l.from_seq DESC LIMIT 1) l
                           WHERE l.to_seq >= t.lane_seq)
     )
     SELECT EXISTS (SELECT 1 FROM unleased u
                     WHERE (NOT u.tombstoned AND u.lane_seq > u.cursor)
                        OR (u.tombstoned
                            AND EXISTS (SELECT 1 FROM %1$s r
                                         WHERE r.lane_id = u.lane_id AND r.lane_seq > u.cursor
                                           AND NOT EXISTS (SELECT 1 FROM (SELECT l.to_seq FROM %2$s l
                                                                           WHERE l.lane_id = r.lane_id AND l.from_seq <= r.lane_seq
                                                                           ORDER BY l.from_seq DESC LIMIT 1) l
                                                            WHERE l.to_seq >= r.lane_seq)
                                           AND NOT EXISTS (SELECT 1 FROM %3$s x WHERE x.lane_id = r.lane_id AND x.lane_seq = r.lane_seq))))',
    v_ready, v_leases, v_tombstones, {{schema_literal}});
  -- In flight: a lease with fewer settled entries than it holds. Newest leases first (the
  -- expires_at index, backwards): those are the ones still running, so a segment in use says so
  -- at its first lease instead of after every settled one.
  v_rest_check := format(
    'SELECT EXISTS (SELECT 1 FROM %1$s),
            coalesce((SELECT true FROM %2$s l
                       WHERE l.n > coalesce((SELECT sum(x.n) FROM %3$s x
                                              WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq), 0)
                       ORDER BY l.expires_at DESC LIMIT 1), false)',
    v_ready, v_leases, v_settlements);
  -- Entry by entry: how many are neither covered by a settlement of their lane nor tombstoned,
  -- and each lane's last entry, from one pass over the segment (in one snapshot).
  v_exact_check := 'WITH ' || v_settled_cte || format(
    ', per_lane AS (
       SELECT r.lane_id, max(r.lane_seq) AS top,
              count(*) FILTER (WHERE NOT coalesce(s.seqs @> r.lane_seq, false) AND t.lane_id IS NULL) AS unsettled
         FROM %1$s r
         LEFT JOIN settled s ON s.lane_id = r.lane_id
         LEFT JOIN %3$s t ON t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq
        GROUP BY r.lane_id
     )
     SELECT coalesce(sum(p.unsettled), 0), coalesce(array_agg(p.lane_id), ''{}''), coalesce(array_agg(p.top), ''{}'')
       FROM per_lane p',
    v_ready, v_settlements, v_tombstones);
  -- Under the lock: the entries above their lane's last entry of the first pass (a lane new to
  -- the segment: all of them) that are neither settled nor tombstoned. One index range scan per
  -- lane whose last entry moved; none in the common case.
  v_late_check := v_tops_cte || format(
    ', moved AS (
       SELECT t.lane_id, coalesce(o.top, -1) AS old_top
         FROM tops t LEFT JOIN unnest($1::integer[], $2::bigint[]) AS o(lane_id, top) ON o.lane_id = t.lane_id
        WHERE t.lane_seq > coalesce(o.top, -1)
     )
     SELECT count(*) FROM moved m
      CROSS JOIN LATERAL (SELECT r.lane_seq FROM %1$s r WHERE r.lane_id = m.lane_id AND r.lane_seq > m.old_top) r
      WHERE NOT EXISTS (SELECT 1 FROM %2$s x WHERE x.lane_id = m.lane_id AND x.seqs @> r.lane_seq)
        AND NOT EXISTS (SELECT 1 FROM %3$s t WHERE t.lane_id = m.lane_id AND t.lane_seq = r.lane_seq)',
    v_ready, v_settlements, v_tombstones);
  -- The stranded entries, copied to deferred (due now, attempts kept; a task already deferred
  -- keeps its row) in the transaction that truncates them. %4$I the schema.
  v_recover := 'WITH ' || v_settled_cte || format(
    ', stranded AS MATERIALIZED (
       SELECT r.* FROM %1$s r LEFT JOIN settled s ON s.lane_id = r.lane_id
        WHERE NOT coalesce(s.seqs @> r.lane_seq, false)
          AND NOT EXISTS (SELECT 1 FROM %3$s t WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq)
     ), kept AS (
       INSERT INTO %4$I.deferred (state, run_at, id, type, payload, queue, priority, shard, attempts, max_attempts,
                                  dedupe_key, last_error, created_at, last_attempted_at, trace_context)
       SELECT ''retryable'', now(), s.id, s.type, s.payload, s.queue, s.priority, s.shard, s.attempts, s.max_attempts,
              s.dedupe_key,
              format(''recovered by the ring prune: entry %%s of lane %%s in segment %%s was neither claimable nor settled'',
                     s.lane_seq, s.lane_id, s.slot),
              s.created_at, NULL, s.trace_context
         FROM stranded s
       ON CONFLICT (id) DO NOTHING
     )
     SELECT count(*)::integer FROM stranded',
    v_ready, v_settlements, v_tombstones, {{schema_literal}});
  -- Before the lock: a segment still being drained says so at once, and the whole segment is
  -- read entry by entry without holding anyone up. Every answer is decided again under the lock.
  EXECUTE v_claimable_check INTO v_claimable;
  IF v_claimable THEN RETURN 'claimable'; END IF;
  EXECUTE v_rest_check INTO v_any, v_in_flight;
  IF v_in_flight THEN RETURN 'in_flight'; END IF;
  -- (An empty segment is said so under the lock, as before: nothing to read here.)
  v_unsettled := 0;
  IF v_any THEN EXECUTE v_exact_check INTO v_unsettled, v_lanes, v_tops; END IF;
  SELECT string_agg(format('%I.%I', {{schema_literal}}, t || '_' || p_slot), ', ')
    INTO v_tables
    FROM unnest(ARRAY['ready', 'range_leases', 'range_settlements', 'tombstones']) t;
  PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1) || 'ms', true);
  BEGIN
    EXECUTE 'LOCK TABLE ' || v_tables || ' IN ACCESS EXCLUSIVE MODE';
  EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    -- deadlock_detected: another prune of this segment holds the same read locks and waits too.
    PERFORM set_config('lock_timeout', v_old_timeout, true);
    RETURN 'blocked';
  END;
  PERFORM set_config('lock_timeout', v_old_timeout, true);
  IF (SELECT e.last_value % rs.slot_count FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs) = p_slot THEN
    RETURN 'current';
  END IF;
  EXECUTE v_rest_check INTO v_any, v_in_flight;
  IF NOT v_any THEN RETURN 'empty'; END IF;
  EXECUTE v_claimable_check INTO v_claimable;
  IF v_claimable THEN RETURN 'claimable'; END IF;
  IF v_in_flight THEN RETURN 'in_flight'; END IF;
  EXECUTE v_late_check INTO v_late USING v_lanes, v_tops;
  IF v_unsettled > 0 OR v_late > 0 THEN
    EXECUTE v_recover INTO v_recovered;
  END IF;
  -- Only the partitions with pages: an empty one (never written since its last TRUNCATE) is
  -- left as it is, which is what its TRUNCATE would make it. Under the lock nothing can write one.
  SELECT string_agg(format('%I.%I', {{schema_literal}}, t || '_' || p_slot), ', ')
    INTO v_tables
    FROM unnest(ARRAY['ready', 'range_leases', 'range_settlements', 'tombstones']) t
   WHERE pg_relation_size(format('%I.%I', {{schema_literal}}, t || '_' || p_slot)::regclass) > 0;
  EXECUTE 'TRUNCATE ' || v_tables;
  IF v_recovered > 0 THEN RETURN 'recovered:' || v_recovered; END IF;
  RETURN 'pruned';
END $fn$;

-- Kept by CREATE OR REPLACE; said again so it is never executable by PUBLIC.
REVOKE EXECUTE ON FUNCTION {{schema}}.prune_slot(smallint, integer) FROM PUBLIC;
