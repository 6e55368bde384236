-- name: ring prune: the claimable check looks at each lane's last entry in the segment, and runs once before the segment's lock
--
-- Issue 11 (scaling with work). prune_slot decided "claimable" with an EXISTS over the
-- segment's ready partition in physical order, probing each entry's lease: a sealed segment
-- still being drained is leased from its oldest entries up, so the probe read every leased entry
-- before the first unleased one, under ACCESS EXCLUSIVE on the segment's partitions. The leader
-- tries every second: a 200,000-task drain spent 200-470 ms a second with its claims and
-- completions of that segment waiting on the lock (auto_explain; the growth benchmark's 200k
-- drains fell from ~60k to 4-13k tasks/s in two runs of three, docs/benchmarks.md).
--
-- A lane's entries in one segment are leased as prefixes, in lane order, each range starting at
-- the first claimable entry past the lane's cursor (which lies below every entry of the
-- segment: entries of earlier segments are older), so when a lane's last entry in the segment
-- is leased, every entry of it in the segment is leased or tombstoned. The check reads each
-- lane's last entry (a skip scan down the primary key, one probe per lane) and its lease; only
-- a lane whose last entry is tombstoned is read whole. The cost follows the segment's lanes, not
-- its entries. It runs once without the lock, and a claimable segment is reported at once
-- without taking it; under the lock it runs again, as before, since only that answer may prune.
--
-- The in-flight check (a lease with fewer settled entries than it holds) read the segment's
-- leases in physical order too, settled ones first: it now reads them newest first (the
-- expires_at index, backwards), where the leases still running are.

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
  EXECUTE 'TRUNCATE ' || v_tables;
  RETURN 'pruned';
END $fn$;
