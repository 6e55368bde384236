-- name: range leases: one lease row per claimed lane range, settlements as multiranges fenced by an exclusion constraint
--
-- Design and measurements: docs/design/range-leases.md. A claim leases a contiguous prefix of
-- each lane it locks, so one row can lease that prefix (`range_leases`), and a completion flush
-- settles many entries of the same few leases, so one row per lease per flush can settle them
-- (`range_settlements`, the entries as an int8multirange). The per-task `leases` / `settlements`
-- rows were ~630 bytes of WAL and ~47 µs of server time per task; the range rows are ~45 bytes
-- and ~10 µs (prototype, docs/design/range-leases.md "Measured").
--
-- The fence: an exclusion constraint per settlements partition refuses a second row that
-- overlaps any committed or in-progress row of the same lane, so exactly one writer settles
-- each entry, in one statement, at any isolation level, as the per-task primary key did.
-- Writers insert with ON CONFLICT DO NOTHING; a row that overlaps is dropped whole.
--
-- Rolling deploy: the rows an older berth wrote (per-task leases and settlements still in the
-- ring) are copied into the range tables here, as one-entry ranges, under a lock that keeps
-- older writers out meanwhile. Afterwards an older worker's claim fails loudly (the trigger on
-- `leases`: it would compute its cursor from `leases` alone and could lease entries a range
-- already holds), while its settlements of leases it already holds are forwarded into
-- `range_settlements` (the trigger on `settlements`), so its in-flight work finishes and is
-- fenced against rescue exactly as before.

LOCK TABLE {{schema}}.leases, {{schema}}.settlements IN SHARE ROW EXCLUSIVE MODE;

-- One row per claimed range: the non-tombstoned entries of (lane_id, slot) with
-- from_seq <= lane_seq <= to_seq. Insert-only; reclaimed with its ring slot.
-- A range never spans two slots, so a lease lives in the slot of every entry it covers.
-- Per entry: attempt = ready.attempts + 1; limit = coalesce(ready.max_attempts,
-- type_max_attempts[array_position(types, ready.type)]); deadline =
-- type_expires[array_position(types, ready.type)], stamped by the database at claim.
CREATE TABLE {{schema}}.range_leases (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  from_seq bigint NOT NULL,
  to_seq bigint NOT NULL,
  n integer NOT NULL,
  token uuid NOT NULL,
  claimed_at timestamptz NOT NULL,
  worker text,
  types text[] NOT NULL,
  type_expires timestamptz[] NOT NULL,
  type_max_attempts integer[] NOT NULL,
  -- min(type_expires): the first moment anything in the range can lapse (rescue's index).
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (lane_id, from_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON {{schema}}.range_leases (expires_at);

-- One row per settling statement per lease: the entries it settles and how. Insert-only.
-- n = the number of entries in seqs, so "is this lease fully settled" is sum(n) = lease.n.
CREATE TABLE {{schema}}.range_settlements (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lease_from bigint NOT NULL,
  seqs int8multirange NOT NULL,
  n integer NOT NULL,
  outcome text NOT NULL,
  settled_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX ON {{schema}}.range_settlements (lane_id, lease_from, slot);

-- PostgreSQL 15 has no exclusion constraint on a partitioned parent: one per partition. The
-- lane as an int4range point keeps btree_gist out (no extension needed).
DO $do$
DECLARE v_slot integer;
BEGIN
  FOR v_slot IN 0..15 LOOP
    EXECUTE format('CREATE TABLE %1$I.%2$I PARTITION OF %1$I.range_leases FOR VALUES IN (%3$s)',
                   {{schema_literal}}, 'range_leases_' || v_slot, v_slot);
    EXECUTE format('CREATE TABLE %1$I.%2$I PARTITION OF %1$I.range_settlements FOR VALUES IN (%3$s)',
                   {{schema_literal}}, 'range_settlements_' || v_slot, v_slot);
    EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT %3$I EXCLUDE USING gist '
                   '(int4range(lane_id, lane_id, ''[]'') WITH &&, seqs WITH &&)',
                   {{schema_literal}}, 'range_settlements_' || v_slot, 'range_settlements_' || v_slot || '_fence');
  END LOOP;
END $do$;

-- Everything an older berth left in the ring, as one-entry ranges.
INSERT INTO {{schema}}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker, types,
                                     type_expires, type_max_attempts, expires_at)
SELECT l.slot, l.lane_id, l.lane_seq, l.lane_seq, 1, l.token, l.claimed_at, l.worker, ARRAY[l.type],
       ARRAY[l.expires_at], ARRAY[l.max_attempts], l.expires_at
  FROM {{schema}}.leases l;
INSERT INTO {{schema}}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome, settled_at)
SELECT st.slot, st.lane_id, st.lane_seq, int8multirange(int8range(st.lane_seq, st.lane_seq + 1)), 1,
       st.outcome, st.settled_at
  FROM {{schema}}.settlements st;

-- One row per leased entry: the entry, its lease (per-entry attempt, limit and deadline) and its
-- settlement, if any. For point reads (by id, or by lane_id / lane_seq / slot: both push down
-- into `ready`'s indexes, then one backward primary-key probe finds the lease) and for operators;
-- statements that walk many leases start from range_leases instead. A tombstone inside a range
-- predates the claim (remove_unleased and move_task never tombstone a leased entry), so the
-- entry was never leased.
CREATE VIEW {{schema}}.leased_entries AS
SELECT r.slot, r.lane_id, r.lane_seq, r.id, r.type,
       r.attempts + 1 AS attempt,
       coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]) AS max_attempts,
       l.token, l.claimed_at,
       l.type_expires[array_position(l.types, r.type)] AS expires_at,
       l.worker, l.from_seq AS lease_from, st.outcome, st.settled_at
  FROM {{schema}}.ready r
 CROSS JOIN LATERAL (
   SELECT le.* FROM {{schema}}.range_leases le
    WHERE le.lane_id = r.lane_id AND le.slot = r.slot AND le.from_seq <= r.lane_seq
    ORDER BY le.from_seq DESC LIMIT 1) l
  LEFT JOIN LATERAL (
   SELECT x.outcome, x.settled_at FROM {{schema}}.range_settlements x
    WHERE x.lane_id = r.lane_id AND x.lease_from = l.from_seq AND x.slot = r.slot AND x.seqs @> r.lane_seq
    LIMIT 1) st ON true
 WHERE l.to_seq >= r.lane_seq
   AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                    WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot);

-- An older worker's claim: refused, loudly (its claim loop logs and backs off).
CREATE FUNCTION {{schema}}.refuse_legacy_lease() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RAISE EXCEPTION 'berth: this schema leases ranges since migration 8; upgrade the worker'
    USING ERRCODE = '55000';
END $fn$;
CREATE TRIGGER refuse_legacy_lease BEFORE INSERT ON {{schema}}.leases
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.refuse_legacy_lease();

-- An older worker's (or leader's) settlement of a per-task lease: written into
-- range_settlements, where the fence is; the old row is kept only when that insert won, so the
-- old statement's RETURNING (its own fence result) says exactly what happened.
CREATE FUNCTION {{schema}}.forward_legacy_settlement() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  INSERT INTO {{schema}}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
  SELECT NEW.slot, NEW.lane_id, l.from_seq, int8multirange(int8range(NEW.lane_seq, NEW.lane_seq + 1)), 1,
         NEW.outcome
    FROM {{schema}}.range_leases l
   WHERE l.lane_id = NEW.lane_id AND l.slot = NEW.slot AND l.from_seq = NEW.lane_seq
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n = 0 THEN RETURN NULL; END IF;
  RETURN NEW;
END $fn$;
CREATE TRIGGER forward_legacy_settlement BEFORE INSERT ON {{schema}}.settlements
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.forward_legacy_settlement();

-- The ring prune, range-aware. As in migration 7, under ACCESS EXCLUSIVE on the slot's
-- partitions (now six: the per-task tables are truncated with the rest until a later migration
-- drops them): a slot is reclaimed only when no entry is claimable (no covering lease, no
-- tombstone) and no lease is in flight. In flight is `n > sum(settled n)`: exact, because the
-- exclusion constraint keeps a lease's settlements disjoint and every settlement names only
-- entries its lease covers (the writers build them from claimed entries).
CREATE OR REPLACE FUNCTION {{schema}}.prune_slot(p_slot smallint, p_lock_timeout_ms integer)
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
  IF (SELECT current_slot FROM {{schema}}.ring_state) = p_slot THEN RETURN 'current'; END IF;
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
  EXECUTE format(
    'SELECT EXISTS (SELECT 1 FROM %1$s),
            EXISTS (SELECT 1 FROM %1$s r
                     WHERE NOT EXISTS (SELECT 1 FROM (SELECT l.to_seq FROM %2$s l
                                                       WHERE l.lane_id = r.lane_id AND l.from_seq <= r.lane_seq
                                                       ORDER BY l.from_seq DESC LIMIT 1) l
                                        WHERE l.to_seq >= r.lane_seq)
                       AND NOT EXISTS (SELECT 1 FROM %4$s x WHERE x.lane_id = r.lane_id AND x.lane_seq = r.lane_seq)),
            EXISTS (SELECT 1 FROM %2$s l
                     WHERE l.n > coalesce((SELECT sum(x.n) FROM %3$s x
                                            WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq), 0))',
    format('%I.%I', {{schema_literal}}, 'ready_' || p_slot), format('%I.%I', {{schema_literal}}, 'range_leases_' || p_slot),
    format('%I.%I', {{schema_literal}}, 'range_settlements_' || p_slot), format('%I.%I', {{schema_literal}}, 'tombstones_' || p_slot))
    INTO v_any, v_claimable, v_in_flight;
  IF NOT v_any THEN RETURN 'empty'; END IF;
  IF v_claimable THEN RETURN 'claimable'; END IF;
  IF v_in_flight THEN RETURN 'in_flight'; END IF;
  EXECUTE 'TRUNCATE ' || v_tables;
  RETURN 'pruned';
END $fn$;

-- Dead-letter retention with the dead gauge's predicate (deadRowPredicate,
-- src/storage/predicates.ts, as of this version): no live, unsettled lease carries the id. The
-- ids under live leases come from the ranges with unsettled entries, once, not from a probe of
-- leased_entries per dead letter (which expanded the whole settled history).
CREATE OR REPLACE FUNCTION {{schema}}.prune_dead_letters(p_retention_ms double precision, p_limit integer)
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
                   AND NOT EXISTS (
                     SELECT 1 FROM (
                       SELECT e.id FROM {{schema}}.range_leases l
                        CROSS JOIN LATERAL (
                          SELECT r.id, r.type FROM {{schema}}.ready r
                           WHERE r.lane_id = l.lane_id AND r.slot = l.slot
                             AND r.lane_seq BETWEEN l.from_seq AND l.to_seq
                             AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                                              WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
                             AND NOT EXISTS (SELECT 1 FROM {{schema}}.range_settlements x
                                              WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq
                                                AND x.slot = l.slot AND x.seqs @> r.lane_seq)
                           OFFSET 0) e
                        WHERE l.n > coalesce((SELECT sum(x.n) FROM {{schema}}.range_settlements x
                                               WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq
                                                 AND x.slot = l.slot), 0)
                          AND l.type_expires[array_position(l.types, e.type)] > now()) live
                      WHERE live.id = d.id)
                 LIMIT p_limit);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN
    INSERT INTO {{schema}}.audit_log (actor, action, target, result)
    VALUES ('maintenance:' || session_user, 'dead.retention',
            jsonb_build_object('retentionMs', p_retention_ms), jsonb_build_object('pruned', v_n));
  END IF;
  RETURN v_n;
END $fn$;

-- remove_unleased and move_task as in migrations 1 and 2, with "settled" and "leased" read
-- through leased_entries.
CREATE OR REPLACE FUNCTION {{schema}}.remove_unleased(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  DELETE FROM {{schema}}.deferred WHERE id = p_id;
  IF FOUND THEN
    DELETE FROM {{schema}}.dedupe WHERE id = p_id;
    RETURN 'removed';
  END IF;
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

CREATE OR REPLACE FUNCTION {{schema}}.move_task(p_id bigint, p_queue text, p_priority smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  IF p_id IS NULL OR p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: move_task arguments must not be null' USING ERRCODE = '22004';
  END IF;
  UPDATE {{schema}}.deferred SET queue = p_queue, priority = p_priority WHERE id = p_id;
  IF FOUND THEN RETURN 'moved'; END IF;
  SELECT e.* INTO r FROM {{schema}}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
                      WHERE le.id = p_id AND le.lane_id = e.lane_id AND le.lane_seq = e.lane_seq
                        AND le.slot = e.slot AND le.outcome IS NOT NULL)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  UPDATE {{schema}}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM {{schema}}.leased_entries le
              WHERE le.id = p_id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO {{schema}}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, 'moved') ON CONFLICT DO NOTHING;
  PERFORM {{schema}}.append_ready({{schema}}.provision_lane(p_queue, p_priority, r.shard), ARRAY[r.id],
            ARRAY[r.type], ARRAY[r.payload], ARRAY[r.attempts], ARRAY[r.max_attempts],
            ARRAY[r.dedupe_key], ARRAY[r.last_error], ARRAY[r.created_at], ARRAY[r.run_at]);
  RETURN 'moved';
END $fn$;

-- A lane's missing sequence starts past every lane_seq the lane has used, leased ones included:
-- the claim cursor is now the last range's to_seq.
CREATE OR REPLACE FUNCTION {{schema}}.provision_lane_sequence(p_lane integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET lock_timeout = '300ms' AS $fn$
DECLARE v_next bigint;
BEGIN
  IF p_lane IS NULL THEN
    RAISE EXCEPTION 'berth: provision_lane_sequence lane must not be null' USING ERRCODE = '22004';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.lanes WHERE lane_id = p_lane) THEN RETURN 'not_found'; END IF;
  BEGIN
    PERFORM pg_advisory_xact_lock({{schema_lock_key}}, p_lane);
    IF to_regclass(format('%I.%I', {{schema_literal}}, 'lane_seq_' || p_lane)) IS NOT NULL THEN
      RETURN 'ok';
    END IF;
    v_next := greatest(
      coalesce((SELECT max(r.lane_seq) FROM {{schema}}.ready r WHERE r.lane_id = p_lane), 0),
      coalesce((SELECT max(l.to_seq) FROM {{schema}}.range_leases l WHERE l.lane_id = p_lane), 0)) + 1;
    EXECUTE format('CREATE SEQUENCE %I.%I START WITH %s', {{schema_literal}}, 'lane_seq_' || p_lane, v_next);
    RETURN 'created';
  EXCEPTION WHEN lock_not_available THEN
    RETURN 'busy';
  END;
END $fn$;

REVOKE EXECUTE ON FUNCTION {{schema}}.refuse_legacy_lease(), {{schema}}.forward_legacy_settlement() FROM PUBLIC;

-- Existing worker roles (those migration 7 or grantRuntimeRole gave prune_slot) get the new
-- tables; producer roles (enqueue only) get the view getTask reads.
DO $do$
DECLARE v_role text; v_slot integer;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:prune_slot(smallint,integer)}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT ON %1$I.range_leases, %1$I.range_settlements TO %2$I', {{schema_literal}}, v_role);
    EXECUTE format('GRANT SELECT ON %1$I.leased_entries TO %2$I', {{schema_literal}}, v_role);
    FOR v_slot IN 0..15 LOOP
      EXECUTE format('GRANT SELECT, INSERT ON %1$I.%2$I, %1$I.%3$I TO %4$I', {{schema_literal}},
                     'range_leases_' || v_slot, 'range_settlements_' || v_slot, v_role);
    END LOOP;
  END LOOP;
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = {{qualified_literal:enqueue(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[])}}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT SELECT ON %1$I.leased_entries, %1$I.range_leases, %1$I.range_settlements TO %2$I',
                   {{schema_literal}}, v_role);
  END LOOP;
END $do$;
