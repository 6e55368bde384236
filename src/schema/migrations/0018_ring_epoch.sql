-- name: ring epoch: appends read the current ring segment outside any snapshot, and the prune checks every entry
--
-- A committed task must run whatever the isolation level of the transaction that enqueued it.
-- append_ready read ring_state.current_slot, and re-read it after its INSERT ("did the ring
-- rotate meanwhile?"), in its transaction's snapshot. At READ COMMITTED each statement has a new
-- snapshot, but a REPEATABLE READ or SERIALIZABLE producer whose snapshot predates a rotation
-- appended into the old segment, and its re-check read the same stale value. Its entry then sat
-- between entries of the same lane in a later segment: the claim leased them as one range and
-- its cursor passed the stale entry for good, or the old segment was already pruned and left out
-- of every ring window. An independent review lost 10 of 983 committed tasks in 20 s this way,
-- READ COMMITTED producers' tasks among them (a stale append breaks the lane for everyone on it).
--
-- The current segment is now held outside MVCC: the sequence `ring_epoch` counts rotations, and
-- the current segment is its value modulo the ring's size. A sequence is not versioned: every
-- transaction, at any isolation level, reads its latest value. Rotation still updates ring_state
-- (the compare-and-set on current_slot, the generation that claims check); the trigger below
-- moves the epoch with it, inside the rotating statement, so an older leader's plain UPDATE
-- rotates the ring too. The epoch moves when the rotating statement runs and its generation bump
-- is seen when it commits; rotators queue on the ring_state row, so the epoch is at most one
-- rotation ahead of what has committed. A ring window therefore holds both segments, the epoch's
-- and the one ring_state shows in the window's snapshot (ring_window()'s new `committed_slot`),
-- with every segment holding a committed entry: with the epoch's alone, a window read while a
-- rotation was between its statement and its commit left out the segment the rotation sealed,
-- whose entry had committed after the window's snapshot, and a claim leased the next entry of its
-- lane past it (found by review; docs/architecture.md, "Invariants" 3).
--
-- append_ready reads the epoch inside its INSERT and again after it. When the ring rotated in
-- between, it moves its own rows (uncommitted, seen by nobody else) to the new current segment
-- and looks again, until the two reads agree: its entries always commit in the segment that was
-- current after they were written. Until now the appender bumped ring_state.generation in that
-- case instead, which under REPEATABLE READ cannot work (the row was updated after its snapshot)
-- and which held the ring_state row, and so the next rotation, until the producer committed. No
-- producer writes ring_state any more: a rotation never waits for a producer.
--
-- prune_slot reads the epoch too, and it now checks every entry of the segment (settled or
-- tombstoned) before it truncates, not only each lane's last one (migration 14). An entry that is
-- neither, when no lane's last entry is claimable and no lease is in flight, was passed by its
-- lane's cursor and would never run: it is copied to deferred (due now, its attempts kept) in the
-- transaction that truncates the segment, the prune answers `recovered:<n>`, and the leader logs
-- an error. A lane's last entry counts as claimable only above the lane's cursor (over every
-- segment's leases): below it, an unleased entry is one no claim will take, and reporting it
-- claimable kept the segment, and in time the whole ring, from ever moving on. The entry-by-entry
-- check reads the whole segment, so it runs before the lock (as the claimable check does); under
-- the lock only the entries of lanes whose last entry moved since are read again (a sealed
-- segment gains an entry only as its lane's last: an append that raced the rotation), and the
-- whole check again only when the first pass found something. It is a last line of defence; the
-- claim's segment stop and the fresh epoch are what keep it from happening. Two prunes of one
-- segment at once answer `blocked` instead of failing on the deadlock their locks make.
--
-- rotate_ring() is the rotation, every condition checked under the row lock; repair_ring_state()
-- brings current_slot to the epoch's segment after a rotation whose statement ran and whose
-- transaction was lost (a server crash between the two).
--
-- ring_window() is SECURITY DEFINER now, so a worker role granted before this migration reads the
-- sequence without a new grant.

-- An older leader's rotation (a plain UPDATE) waits for this migration to commit: the epoch is
-- read from the committed current_slot, and the trigger is in place before any later rotation.
LOCK TABLE {{schema}}.ring_state IN SHARE ROW EXCLUSIVE MODE;

CREATE SEQUENCE {{schema}}.ring_epoch AS bigint MINVALUE 0 START WITH 0;
SELECT setval({{qualified_literal:ring_epoch}}, (SELECT current_slot FROM {{schema}}.ring_state), true);

-- The epoch follows ring_state.current_slot: forward to the next value that is the new segment
-- modulo the ring's size (one step for a rotation). Definer, so a worker role's rotation may
-- move a sequence it has no privilege on. A change of segment always changes the generation.
CREATE FUNCTION {{schema}}.ring_epoch_follows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_epoch bigint;
BEGIN
  IF NEW.current_slot IS DISTINCT FROM OLD.current_slot THEN
    IF NEW.current_slot IS NULL OR NEW.current_slot < 0 OR NEW.current_slot >= NEW.slot_count THEN
      RAISE EXCEPTION 'berth: ring segment % does not exist', NEW.current_slot USING ERRCODE = '22023';
    END IF;
    SELECT last_value INTO v_epoch FROM {{schema}}.ring_epoch;
    IF v_epoch % NEW.slot_count <> NEW.current_slot THEN
      PERFORM setval({{qualified_literal:ring_epoch}},
                     v_epoch + ((NEW.current_slot - v_epoch % NEW.slot_count) + NEW.slot_count) % NEW.slot_count,
                     true);
    END IF;
    IF NEW.generation <= OLD.generation THEN NEW.generation := OLD.generation + 1; END IF;
  END IF;
  RETURN NEW;
END $fn$;
REVOKE EXECUTE ON FUNCTION {{schema}}.ring_epoch_follows() FROM PUBLIC;

CREATE TRIGGER ring_epoch_follows BEFORE UPDATE ON {{schema}}.ring_state
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.ring_epoch_follows();

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
  v_now smallint;
  v_done integer;
BEGIN
  PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
  IF v_n = 0 THEN RETURN 0; END IF;
  v_seq := format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)::regclass;
  -- Every appender to the lane holds the lane lock (taken above, held to commit) while it draws
  -- from the lane's sequence, so v_base .. v_base + v_n - 1 are this call's alone.
  v_base := nextval(v_seq);
  IF v_n > 1 THEN PERFORM setval(v_seq, v_base + v_n - 1); END IF;
  -- The segment is the epoch's, read outside the snapshot (see the header), once per INSERT (an
  -- uncorrelated subquery: one InitPlan, so every row of the call goes to the same segment).
  IF p_attempts IS NULL AND p_max_attempts IS NULL AND p_dedupe IS NULL AND p_last_error IS NULL
     AND p_created_at IS NULL AND p_run_at IS NULL AND p_trace_context IS NULL THEN
    -- New tasks with nothing but a type and a payload (enqueue's fast path): three arrays.
    WITH appended AS (
      INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                              attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                              trace_context)
      SELECT (SELECT (e.last_value % rs.slot_count)::smallint FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs),
             p_lane,
             v_base + x.ord - 1, x.id, x.type, x.payload, l.queue, l.priority, l.shard, 0, NULL, NULL, NULL,
             now(), now(), NULL
        FROM unnest(p_ids, p_types, p_payloads) WITH ORDINALITY AS x(id, type, payload, ord)
        CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l
      RETURNING slot)
    SELECT min(a.slot), count(*) INTO v_slot, v_done FROM appended a;
  ELSE
    WITH appended AS (
      INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                              attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                              trace_context)
      SELECT (SELECT (e.last_value % rs.slot_count)::smallint FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs),
             p_lane,
             v_base + x.ord - 1, x.id, x.type, x.payload, l.queue, l.priority, l.shard, coalesce(x.attempts, 0),
             x.max_attempts, x.dedupe_key, x.last_error, coalesce(x.created_at, now()), coalesce(x.run_at, now()),
             x.trace_context
        FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe, p_last_error,
                    p_created_at, p_run_at, p_trace_context) WITH ORDINALITY
               AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                    run_at, trace_context, ord)
        CROSS JOIN (SELECT queue, priority, shard FROM {{schema}}.lanes WHERE lane_id = p_lane) l
      RETURNING slot)
    SELECT min(a.slot), count(*) INTO v_slot, v_done FROM appended a;
  END IF;
  -- Every row or none: the lane's row is always visible here (provision_lane returned it), but a
  -- task that vanished silently would be a lost one.
  IF v_done <> v_n THEN
    RAISE EXCEPTION 'berth: append_ready wrote % of % entries of lane %', v_done, v_n, p_lane
      USING ERRCODE = '40001', HINT = 'retry the transaction';
  END IF;
  -- The ring rotated while this append ran: its rows move to the segment that is current now
  -- (they are this transaction's own, seen by nobody else), until two reads agree.
  LOOP
    SELECT (e.last_value % rs.slot_count)::smallint INTO v_now FROM {{schema}}.ring_epoch e, {{schema}}.ring_state rs;
    EXIT WHEN v_now = v_slot;
    WITH moved AS (
      DELETE FROM {{schema}}.ready r
       WHERE r.slot = v_slot AND r.lane_id = p_lane AND r.lane_seq BETWEEN v_base AND v_base + v_n - 1
      RETURNING r.*)
    INSERT INTO {{schema}}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                                  attempts, max_attempts, dedupe_key, last_error, created_at, run_at,
                                  appended_at, trace_context)
    SELECT v_now, m.lane_id, m.lane_seq, m.id, m.type, m.payload, m.queue, m.priority, m.shard, m.attempts,
           m.max_attempts, m.dedupe_key, m.last_error, m.created_at, m.run_at, m.appended_at, m.trace_context
      FROM moved m;
    v_slot := v_now;
  END LOOP;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  PERFORM pg_notify({{wake_channel_literal}}, p_lane::text);
  RETURN v_n;
END $fn$;


-- Migration 16's query, with the epoch's segment as the current one and, beside it, the
-- current segment ring_state shows in the statement's snapshot (see the header). A new column,
-- so the function is made again (and granted again below); a worker of migration 13-17 reads
-- it by its columns' names and is unaffected.
DROP FUNCTION {{schema}}.ring_window();
DO $do$
BEGIN
  EXECUTE format(
    'CREATE FUNCTION %1$I.ring_window() RETURNS TABLE (generation bigint, current_slot smallint, slot_count smallint, rotated_at timestamptz, filled smallint[], committed_slot smallint) '
    'LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$ BEGIN RETURN QUERY '
    'SELECT rs.generation, (SELECT (e.last_value %% rs.slot_count)::smallint FROM %1$I.ring_epoch e), rs.slot_count, '
    '       rs.rotated_at, '
    '       ARRAY(SELECT (f.o - 1)::smallint FROM unnest(ARRAY[%2$s]) WITH ORDINALITY AS f(filled, o) '
    '              WHERE f.filled ORDER BY f.o), '
    '       rs.current_slot '
    '  FROM %1$I.ring_state rs; END $fn$',
    {{schema_literal}},
    (SELECT string_agg(format('EXISTS (SELECT 1 FROM %I.%I)', {{schema_literal}}, 'ready_' || g), ', ' ORDER BY g)
       FROM generate_series(0, 15) AS g));
END $do$;
REVOKE EXECUTE ON FUNCTION {{schema}}.ring_window() FROM PUBLIC;

-- The prune (see the header for what changed since migration 15, whose body this extends).
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
    FROM unnest(ARRAY['ready', 'range_leases', 'range_settlements', 'tombstones', 'leases', 'settlements']) t;
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
    FROM unnest(ARRAY['ready', 'range_leases', 'range_settlements', 'tombstones', 'leases', 'settlements']) t
   WHERE pg_relation_size(format('%I.%I', {{schema_literal}}, t || '_' || p_slot)::regclass) > 0;
  EXECUTE 'TRUNCATE ' || v_tables;
  IF v_recovered > 0 THEN RETURN 'recovered:' || v_recovered; END IF;
  RETURN 'pruned';
END $fn$;

-- A rotation whose statement moved the epoch and whose transaction was then lost (a server crash
-- between the two) leaves current_slot one segment behind it: appends go to the epoch's segment,
-- windows hold both. Brought level under the row lock (the trigger bumps the generation, so
-- every window is read again); true when there was something to repair. The leader calls it on
-- any ring tick whose window shows the two apart.
CREATE FUNCTION {{schema}}.repair_ring_state()
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_count smallint;
  v_mirror smallint;
  v_current smallint;
BEGIN
  SELECT rs.slot_count, rs.current_slot INTO v_count, v_mirror FROM {{schema}}.ring_state rs FOR UPDATE;
  SELECT (e.last_value % v_count)::smallint INTO v_current FROM {{schema}}.ring_epoch e;
  IF v_mirror = v_current THEN RETURN false; END IF;
  UPDATE {{schema}}.ring_state SET current_slot = v_current, rotated_at = now();
  RETURN true;
END $fn$;
REVOKE EXECUTE ON FUNCTION {{schema}}.repair_ring_state() FROM PUBLIC;

-- The rotation: move appends from segment p_from to p_to, the next one. Definer, with every
-- condition checked under the ring_state row lock that serializes rotators: the ring is still
-- at p_from (the epoch's segment), the current segment holds a committed entry (a segment left
-- empty could take an appender's uncommitted entry out of every ring window: see
-- docs/architecture.md, "Invariants"), and the next one holds none (it was pruned). When
-- current_slot disagrees with the epoch, it is repaired first (repair_ring_state, above) and the
-- call says 'raced'.
CREATE FUNCTION {{schema}}.rotate_ring(p_from smallint, p_to smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_count smallint;
  v_current smallint;
  v_filled boolean;
BEGIN
  IF p_from IS NULL OR p_to IS NULL THEN
    RAISE EXCEPTION 'berth: rotate_ring arguments must not be null' USING ERRCODE = '22004';
  END IF;
  SELECT rs.slot_count INTO v_count FROM {{schema}}.ring_state rs FOR UPDATE;
  IF p_from < 0 OR p_from >= v_count OR p_to <> (p_from + 1) % v_count THEN
    RAISE EXCEPTION 'berth: cannot rotate the ring from segment % to %', p_from, p_to USING ERRCODE = '22023';
  END IF;
  IF {{schema}}.repair_ring_state() THEN RETURN 'raced'; END IF;
  SELECT (e.last_value % v_count)::smallint INTO v_current FROM {{schema}}.ring_epoch e;
  IF v_current <> p_from THEN RETURN 'raced'; END IF;
  EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I)', {{schema_literal}}, 'ready_' || p_from) INTO v_filled;
  IF NOT v_filled THEN RETURN 'empty'; END IF;
  EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I)', {{schema_literal}}, 'ready_' || p_to) INTO v_filled;
  IF v_filled THEN RETURN 'next_slot_busy'; END IF;
  UPDATE {{schema}}.ring_state SET current_slot = p_to, generation = generation + 1, rotated_at = now();
  RETURN 'rotated';
END $fn$;
REVOKE EXECUTE ON FUNCTION {{schema}}.rotate_ring(smallint, smallint) FROM PUBLIC;

-- Worker roles granted before this migration (they can execute prune_slot) rotate through the
-- new functions and read the window made again above.
DO $do$
DECLARE v_role text;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:prune_slot(smallint,integer)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.rotate_ring(smallint, smallint), %1$I.repair_ring_state(), %1$I.ring_window() TO %2$I',
                   {{schema_literal}}, v_role);
  END LOOP;
END $do$;
