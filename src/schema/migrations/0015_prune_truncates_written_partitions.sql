-- name: ring prune: TRUNCATE only the segment's partitions that hold pages
--
-- Issue 11 (pickup latency). The prune's TRUNCATE of a drained segment took 22-30 ms of its
-- 30-45 ms, all of it under ACCESS EXCLUSIVE on the segment's six partitions, which every claim
-- still reading the segment waits behind: TRUNCATE gives each table and index a new file, and
-- building each new, empty index syncs its file (one fsync per index). Of the six partitions,
-- `tombstones` is usually empty and the per-task `leases` / `settlements` of berth before
-- migration 8 always are once no older worker runs: truncating ready, range_leases and
-- range_settlements alone took 8-10 ms and a 2.4-2.8 ms commit, against 15-17 ms and 4-5 ms for
-- all six (psql \timing on a 500-task drained segment, stock PostgreSQL 15 cluster). A partition
-- whose main fork has no page has no row, live or dead (every row, even one a rolled-back
-- insert left, is on a page), and no index entry or TOAST value, so it is left alone: it is
-- already what TRUNCATE would make it, and nothing can write it while the segment's lock is
-- held. Every check and the lock are as in migration 14.

CREATE OR REPLACE FUNCTION {{schema}}.prune_slot(p_slot smallint, p_lock_timeout_ms integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_tables text;
  v_old_timeout text := current_setting('lock_timeout');
  v_any boolean; v_claimable boolean; v_in_flight boolean;
  v_claimable_check text; v_rest_check text;
BEGIN
  IF p_slot IS NULL OR p_lock_timeout_ms IS NULL THEN
    RAISE EXCEPTION 'berth: prune_slot arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_slot < 0 OR p_slot >= (SELECT slot_count FROM {{schema}}.ring_state) THEN
    RAISE EXCEPTION 'berth: ring slot % does not exist', p_slot USING ERRCODE = '22023';
  END IF;
  IF (SELECT current_slot FROM {{schema}}.ring_state) = p_slot THEN RETURN 'current'; END IF;
  -- %1$s ready, %2$s range_leases, %3$s range_settlements, %4$s tombstones of the segment.
  v_claimable_check := format(
    'WITH RECURSIVE tops AS (
       (SELECT r.lane_id, r.lane_seq FROM %1$s r ORDER BY r.lane_id DESC, r.lane_seq DESC LIMIT 1)
       UNION ALL
       SELECT n.lane_id, n.lane_seq FROM tops t
        CROSS JOIN LATERAL (SELECT r.lane_id, r.lane_seq FROM %1$s r WHERE r.lane_id < t.lane_id
                             ORDER BY r.lane_id DESC, r.lane_seq DESC LIMIT 1) n
     ), unleased AS (
       SELECT t.lane_id, t.lane_seq,
              EXISTS (SELECT 1 FROM %4$s x WHERE x.lane_id = t.lane_id AND x.lane_seq = t.lane_seq) AS tombstoned
         FROM tops t
        WHERE NOT EXISTS (SELECT 1 FROM (SELECT l.to_seq FROM %2$s l
                                          WHERE l.lane_id = t.lane_id AND l.from_seq <= t.lane_seq
                                          ORDER BY l.from_seq DESC LIMIT 1) l
                           WHERE l.to_seq >= t.lane_seq)
     )
     SELECT EXISTS (SELECT 1 FROM unleased u
                     WHERE NOT u.tombstoned
                        OR EXISTS (SELECT 1 FROM %1$s r
                                    WHERE r.lane_id = u.lane_id
                                      AND NOT EXISTS (SELECT 1 FROM (SELECT l.to_seq FROM %2$s l
                                                                      WHERE l.lane_id = r.lane_id AND l.from_seq <= r.lane_seq
                                                                      ORDER BY l.from_seq DESC LIMIT 1) l
                                                       WHERE l.to_seq >= r.lane_seq)
                                      AND NOT EXISTS (SELECT 1 FROM %4$s x WHERE x.lane_id = r.lane_id AND x.lane_seq = r.lane_seq)))',
    format('%I.%I', {{schema_literal}}, 'ready_' || p_slot), format('%I.%I', {{schema_literal}}, 'range_leases_' || p_slot),
    format('%I.%I', {{schema_literal}}, 'range_settlements_' || p_slot), format('%I.%I', {{schema_literal}}, 'tombstones_' || p_slot));
  -- In flight: a lease with fewer settled entries than it holds. Newest leases first (the
  -- expires_at index, backwards): those are the ones still running, so a segment in use says so
  -- at its first lease instead of after every settled one.
  v_rest_check := format(
    'SELECT EXISTS (SELECT 1 FROM %1$s),
            coalesce((SELECT true FROM %2$s l
                       WHERE l.n > coalesce((SELECT sum(x.n) FROM %3$s x
                                              WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq), 0)
                       ORDER BY l.expires_at DESC LIMIT 1), false)',
    format('%I.%I', {{schema_literal}}, 'ready_' || p_slot), format('%I.%I', {{schema_literal}}, 'range_leases_' || p_slot),
    format('%I.%I', {{schema_literal}}, 'range_settlements_' || p_slot));
  -- Without the lock first: a segment still being drained is claimable, and says so at once.
  -- Every other answer is decided under the lock, as before.
  EXECUTE v_claimable_check INTO v_claimable;
  IF v_claimable THEN RETURN 'claimable'; END IF;
  SELECT string_agg(format('%I.%I', {{schema_literal}}, t || '_' || p_slot), ', ')
    INTO v_tables
    FROM unnest(ARRAY['ready', 'range_leases', 'range_settlements', 'tombstones', 'leases', 'settlements']) t;
  PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1) || 'ms', true);
  BEGIN
    EXECUTE 'LOCK TABLE ' || v_tables || ' IN ACCESS EXCLUSIVE MODE';
  EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', v_old_timeout, true);
    RETURN 'blocked';
  END;
  PERFORM set_config('lock_timeout', v_old_timeout, true);
  IF (SELECT current_slot FROM {{schema}}.ring_state) = p_slot THEN RETURN 'current'; END IF;
  EXECUTE v_rest_check INTO v_any, v_in_flight;
  IF NOT v_any THEN RETURN 'empty'; END IF;
  EXECUTE v_claimable_check INTO v_claimable;
  IF v_claimable THEN RETURN 'claimable'; END IF;
  IF v_in_flight THEN RETURN 'in_flight'; END IF;
  -- Only the partitions with pages: an empty one (never written since its last TRUNCATE) is
  -- left as it is, which is what its TRUNCATE would make it. Under the lock nothing can write one.
  SELECT string_agg(format('%I.%I', {{schema_literal}}, t || '_' || p_slot), ', ')
    INTO v_tables
    FROM unnest(ARRAY['ready', 'range_leases', 'range_settlements', 'tombstones', 'leases', 'settlements']) t
   WHERE pg_relation_size(format('%I.%I', {{schema_literal}}, t || '_' || p_slot)::regclass) > 0;
  EXECUTE 'TRUNCATE ' || v_tables;
  RETURN 'pruned';
END $fn$;
