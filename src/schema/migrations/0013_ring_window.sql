-- name: ring window: an appender that raced a rotation bumps the ring generation, so claims may read only the ring segments that hold entries
--
-- Issue 11 (pickup latency, cost per claim). A claim over the whole ring names all 16 partitions
-- of ready, range_leases and tombstones in its plan, for each lane it reads: the executor locks
-- and initialises them on every execution, and a session plans them on first use. Measured on
-- the 2-core development machine: a one-task claim's round trip after 10 ms idle (the pickup's
-- shape) 1.49 ms over the whole ring, 0.96 ms naming only the segment holding the entries; a
-- claim of 130 tasks 1.33 -> 1.03 ms of server CPU (docs/benchmarks.md, "Ring windows").
--
-- So a worker claims within a window: the segments that may hold entries (the current one and
-- every sealed one not yet pruned), read with the ring's generation in one snapshot
-- (ring_window() below), and each claim re-checks the generation in its own snapshot, reading
-- nothing and reporting itself stale once it moved. Entries outside a window are newer than
-- every entry inside it (a lane's entries are appended in lane order, and only the current
-- segment is appended to), so a window never makes a claim pass over an older entry, with one
-- exception, closed here: an appender reads current_slot, and if a rotation and then the prune
-- of that segment both complete before its INSERT reaches the partition (nothing locks the
-- partition until the row is routed), its entry lands in a segment a window read may have seen
-- empty. append_ready now keeps the segment its INSERT wrote to and reads current_slot again
-- after it, in a new snapshot (one more statement per append, ~20 µs): when it moved, the appender bumps ring_state.generation in its own transaction, so
-- any claim whose snapshot can see the entry (or any later entry of the lane, which commits
-- after it under the lane lock) sees the bump and refreshes its window first. A rotation in the
-- middle of an append is rare (one per ring interval, ringRotateAfterMs) and costs the workers
-- one stale claim each.
--
-- ring_window() is also the marker this code checks for (src/schema/migrate.ts): a worker of
-- this version needs the bump and refuses an older schema.

CREATE OR REPLACE FUNCTION {{schema}}.append_ready(
  p_lane integer, p_ids bigint[], p_types text[], p_payloads jsonb[], p_attempts integer[],
  p_max_attempts integer[], p_dedupe text[], p_last_error text[], p_created_at timestamptz[],
  p_run_at timestamptz[], p_trace_context text[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_seq regclass;
  -- The rows the unnest below makes: as many as the longest array (callers pass equal lengths).
  v_n integer := coalesce(greatest(cardinality(p_ids), cardinality(p_types), cardinality(p_payloads),
    cardinality(p_attempts), cardinality(p_max_attempts), cardinality(p_dedupe),
    cardinality(p_last_error), cardinality(p_created_at), cardinality(p_run_at)), 0);
  v_base bigint;
  v_slot smallint;
BEGIN
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
  IF v_n = 0 THEN RETURN 0; END IF;
  v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)::regclass;
  -- Every appender to the lane holds the lane lock (taken above, held to commit) while it draws
  -- from the lane's sequence, so v_base .. v_base + v_n - 1 are this call's alone.
  v_base := nextval(v_seq);
  IF v_n > 1 THEN PERFORM setval(v_seq, v_base + v_n - 1); END IF;
  WITH appended AS (
    INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                            attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                            trace_context)
    SELECT (SELECT current_slot FROM {{schema}}.ring_state), p_lane, v_base + x.ord - 1, x.id, x.type,
           x.payload, l.queue, l.priority, l.shard, x.attempts, x.max_attempts, x.dedupe_key,
           x.last_error, x.created_at, x.run_at, x.trace_context
      FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe, p_last_error,
                  p_created_at, p_run_at, p_trace_context) WITH ORDINALITY
             AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                  run_at, trace_context, ord)
      CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l
    RETURNING slot)
  SELECT min(a.slot), count(*) INTO v_slot, v_n FROM appended a;
  -- The ring rotated while this append ran (a new statement, a new snapshot): the entry may sit
  -- in a segment a claim's window left out. The bump, committed with the entry, makes every
  -- claim that can see the entry refresh its window (see the header).
  IF v_n > 0 AND (SELECT current_slot FROM {{schema}}.ring_state) IS DISTINCT FROM v_slot THEN
    UPDATE {{schema}}.ring_state SET generation = generation + 1;
  END IF;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  IF v_n > 0 THEN PERFORM pg_notify({{wake_channel_literal}}, p_lane::text); END IF;
  RETURN v_n;
END $fn$;

-- The ring's state (generation, current segment, size, last rotation) and the segments with a
-- row in ready, in one snapshot: a worker's claims read the filled ones and the current one while the generation
-- stands (a sealed segment gains rows only by becoming current again after its prune); the
-- leader's ring branch prunes the filled sealed ones and rotates. Each partition is probed by
-- name: an EXISTS on the parent with the segment as a parameter prunes at run time, and took
-- ~1 ms a call warm (8 ms on a new session) against ~0.3 ms for the 16 probes written out.
DO $do$
BEGIN
  EXECUTE format(
    'CREATE FUNCTION %1$I.ring_window() RETURNS TABLE (generation bigint, current_slot smallint, slot_count smallint, rotated_at timestamptz, filled smallint[]) '
    'LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$ '
    'SELECT rs.generation, rs.current_slot, rs.slot_count, rs.rotated_at, '
    '       ARRAY(SELECT (f.o - 1)::smallint FROM unnest(ARRAY[%2$s]) WITH ORDINALITY AS f(filled, o) '
    '              WHERE f.filled ORDER BY f.o) '
    '  FROM %1$I.ring_state rs $fn$',
    {{schema_literal}},
    (SELECT string_agg(format('EXISTS (SELECT 1 FROM %I.%I)', {{schema_literal}}, 'ready_' || g), ', ' ORDER BY g)
       FROM generate_series(0, 15) AS g));
END $do$;
REVOKE EXECUTE ON FUNCTION {{schema}}.ring_window() FROM PUBLIC;
