import { quoteIdent, quoteLiteral, wakeChannel } from '../sql.js';
import { queueLockKey, schemaLockKey } from '../storage/locks.js';

/**
 * Forward-only, numbered migrations. Each is a function of the schema name so one database can
 * hold several berth installations (tests use a schema per file). Never edit a shipped migration:
 * add the next number.
 *
 * docs/architecture.md explains every table and index defined here and which statement uses it.
 */
export interface Migration {
  version: number;
  name: string;
  sql(schema: string): string;
}

/** Ring partitions of the ready storage. Fixed per installation at migration 1. */
export const RING_SLOTS = 16;

const core: Migration = {
  version: 1,
  name: 'core storage: lanes, ready ring, leases, settlements, deferred, dead letters',
  sql(schema) {
    const s = quoteIdent(schema);
    const lockNs = schemaLockKey(schema);
    const channel = quoteLiteral(wakeChannel(schema));
    const schemaLit = quoteLiteral(schema);
    const taskSeq = quoteLiteral(`${s}.task_id_seq`);
    const ringTables = ['ready', 'leases', 'settlements', 'tombstones'];
    const partitions = Array.from({ length: RING_SLOTS }, (_, slot) =>
      ringTables
        .map(
          (t) =>
            `CREATE TABLE ${s}.${quoteIdent(`${t}_${slot}`)} PARTITION OF ${s}.${t} FOR VALUES IN (${slot});`,
        )
        .join('\n'),
    ).join('\n');
    return `
CREATE SEQUENCE ${s}.task_id_seq;

-- A lane is (queue, priority, shard). Its row is also the claim lock: a claim takes it
-- FOR UPDATE SKIP LOCKED, so one lane's entries are leased by one claimer at a time, in order.
CREATE TABLE ${s}.lanes (
  lane_id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL CHECK (shard BETWEEN 0 AND 63),
  -- Bumped by anything that tombstones an entry of the lane; see the claim for why.
  version bigint NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (queue, priority, shard)
);

-- Which ring partition new ready entries go to. One row; updated only on rotation.
CREATE TABLE ${s}.ring_state (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  current_slot smallint NOT NULL,
  slot_count smallint NOT NULL,
  generation bigint NOT NULL,
  rotated_at timestamptz NOT NULL
);
INSERT INTO ${s}.ring_state (current_slot, slot_count, generation, rotated_at)
VALUES (0, ${RING_SLOTS}, 0, now());

-- Ready entries: append-only, lane-ordered (lane_seq from the lane's own sequence, reserved
-- under the lane lock). Never updated or deleted; a whole slot is reclaimed by TRUNCATE.
CREATE TABLE ${s}.ready (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  attempts integer NOT NULL,
  max_attempts integer,  -- NULL: the task type's setting, resolved at claim
  dedupe_key text,
  last_error text,
  created_at timestamptz NOT NULL,
  run_at timestamptz NOT NULL,
  appended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON ${s}.ready (id);

-- One row per claimed attempt, in the slot of the entry it leases. Insert-only.
-- max(lane_seq) per lane is the lane's claim cursor: claims lease entries in lane order.
CREATE TABLE ${s}.leases (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  type text NOT NULL,
  attempt integer NOT NULL,
  max_attempts integer NOT NULL,  -- effective limit for this attempt, resolved at claim
  token uuid NOT NULL,
  claimed_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL,
  worker text,
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON ${s}.leases (expires_at);

-- The end of an attempt: completed, failed, released, advanced, rescued. Insert-only; the
-- primary key is the fence arbiter: whoever inserts first for a lease settles it.
CREATE TABLE ${s}.settlements (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  outcome text NOT NULL,
  settled_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);

-- An unleased ready entry that no longer stands for its task (cancelled, removed inline, moved).
CREATE TABLE ${s}.tombstones (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  reason text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (lane_id, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON ${s}.tombstones (id);

${partitions}

-- Future work: scheduled (run_at ahead) and retryable (backing off or rescued) tasks.
CREATE TABLE ${s}.deferred (
  id bigint PRIMARY KEY,
  state text NOT NULL CHECK (state IN ('scheduled', 'retryable')),
  type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  attempts integer NOT NULL,
  max_attempts integer,  -- NULL: the task type's setting, resolved at claim
  dedupe_key text,
  last_error text,
  created_at timestamptz NOT NULL,
  last_attempted_at timestamptz,
  run_at timestamptz NOT NULL
);
CREATE INDEX ON ${s}.deferred (run_at, priority, id);
CREATE INDEX ON ${s}.deferred (queue, priority, shard, run_at, id);

-- Exhausted tasks. History, not pending work: never blocks a new enqueue with the same key.
CREATE TABLE ${s}.dead_letters (
  id bigint PRIMARY KEY,
  type text NOT NULL,
  payload jsonb NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  attempts integer NOT NULL,
  max_attempts integer,  -- NULL: the task type's setting, resolved at claim
  dedupe_key text,
  last_error text,
  created_at timestamptz NOT NULL,
  last_attempted_at timestamptz NOT NULL,
  died_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON ${s}.dead_letters (last_attempted_at);
CREATE INDEX ON ${s}.dead_letters (type);

-- At most one live task per dedupe key. Deleted when the task completes or dies.
CREATE TABLE ${s}.dedupe (
  dedupe_key text PRIMARY KEY,
  id bigint NOT NULL
);
CREATE INDEX ON ${s}.dedupe (id);

-- Lane provisioning runs as the schema owner (SECURITY DEFINER, fixed search_path), so a
-- runtime role without CREATE can open a lane and every runtime role can use its sequence.
CREATE FUNCTION ${s}.provision_lane(p_queue text, p_priority smallint, p_shard smallint)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_id integer;
BEGIN
  IF p_queue IS NULL OR p_priority IS NULL OR p_shard IS NULL THEN
    RAISE EXCEPTION 'berth: provision_lane arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_shard < 0 OR p_shard > 63 THEN
    RAISE EXCEPTION 'berth: shard % is outside 0-63', p_shard USING ERRCODE = '22023';
  END IF;
  SELECT lane_id INTO v_id FROM ${s}.lanes
   WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
  IF FOUND THEN RETURN v_id; END IF;
  INSERT INTO ${s}.lanes (queue, priority, shard) VALUES (p_queue, p_priority, p_shard)
  ON CONFLICT DO NOTHING RETURNING lane_id INTO v_id;
  IF v_id IS NULL THEN
    SELECT lane_id INTO v_id FROM ${s}.lanes
     WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
    RETURN v_id;
  END IF;
  EXECUTE format('CREATE SEQUENCE %I.%I', ${schemaLit}, 'lane_seq_' || v_id);
  RETURN v_id;
END $fn$;

-- Append entries to one lane, in array order. Takes the lane lock (held to commit) before
-- reserving sequence numbers, so a lane's entries become visible in lane_seq order.
CREATE FUNCTION ${s}.append_ready(
  p_lane integer, p_ids bigint[], p_types text[], p_payloads jsonb[], p_attempts integer[],
  p_max_attempts integer[], p_dedupe text[], p_last_error text[], p_created_at timestamptz[],
  p_run_at timestamptz[])
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_seq regclass; v_n integer;
BEGIN
  PERFORM pg_advisory_xact_lock(${lockNs}, p_lane);
  v_seq := format('%I.%I', ${schemaLit}, 'lane_seq_' || p_lane)::regclass;
  INSERT INTO ${s}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard,
                          attempts, max_attempts, dedupe_key, last_error, created_at, run_at)
  SELECT (SELECT current_slot FROM ${s}.ring_state), p_lane, nextval(v_seq), u.id, u.type,
         u.payload, l.queue, l.priority, l.shard, u.attempts, u.max_attempts, u.dedupe_key,
         u.last_error, u.created_at, u.run_at
    FROM (SELECT * FROM unnest(p_ids, p_types, p_payloads, p_attempts, p_max_attempts, p_dedupe,
                               p_last_error, p_created_at, p_run_at) WITH ORDINALITY
            AS x(id, type, payload, attempts, max_attempts, dedupe_key, last_error, created_at,
                 run_at, ord)
          ORDER BY ord) u
    CROSS JOIN (SELECT queue, priority, shard FROM ${s}.lanes WHERE lane_id = p_lane) l;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  -- The payload names the lane, so a woken worker can claim from it without a discovery
  -- round trip. Identical notifications still collapse: one per lane per transaction.
  IF v_n > 0 THEN PERFORM pg_notify(${channel}, p_lane::text); END IF;
  RETURN v_n;
END $fn$;

-- Promote one lane's oldest due deferred rows (up to p_limit): take the lane lock (subject to
-- the caller's lock_timeout), delete the rows (skipping any another transaction holds), and
-- append them in due order. Choosing the rows under the lane lock, rather than taking the ids a
-- batch selected earlier, keeps lane order = due order even when two promoters overlap.
CREATE FUNCTION ${s}.promote_lane(p_queue text, p_priority smallint, p_shard smallint,
                                  p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_lane integer; v_n integer;
BEGIN
  v_lane := ${s}.provision_lane(p_queue, p_priority, p_shard);
  PERFORM pg_advisory_xact_lock(${lockNs}, v_lane);
  -- Locked first so a busy lane times out before any row is taken; append_ready re-takes it.
  WITH moved AS (
    DELETE FROM ${s}.deferred d
     WHERE d.id IN (SELECT x.id FROM ${s}.deferred x
                     WHERE x.queue = p_queue AND x.priority = p_priority AND x.shard = p_shard
                       AND x.run_at <= now()
                     ORDER BY x.run_at, x.priority, x.id
                     LIMIT p_limit
                     FOR UPDATE SKIP LOCKED)
    RETURNING d.*
  )
  SELECT ${s}.append_ready(v_lane,
           array_agg(m.id ORDER BY m.run_at, m.id), array_agg(m.type ORDER BY m.run_at, m.id),
           array_agg(m.payload ORDER BY m.run_at, m.id), array_agg(m.attempts ORDER BY m.run_at, m.id),
           array_agg(m.max_attempts ORDER BY m.run_at, m.id), array_agg(m.dedupe_key ORDER BY m.run_at, m.id),
           array_agg(m.last_error ORDER BY m.run_at, m.id), array_agg(m.created_at ORDER BY m.run_at, m.id),
           array_agg(m.run_at ORDER BY m.run_at, m.id))
    INTO v_n
    FROM moved m;
  RETURN coalesce(v_n, 0);
END $fn$;

-- Remove a task no worker holds (Dequeue with an empty token; admin cancel). A deferred row is
-- deleted; a ready entry gets a tombstone, under the lane row lock so no claim can lease it
-- between the check and the tombstone.
CREATE FUNCTION ${s}.remove_unleased(p_id bigint, p_reason text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  DELETE FROM ${s}.deferred WHERE id = p_id;
  IF FOUND THEN
    DELETE FROM ${s}.dedupe WHERE id = p_id;
    RETURN 'removed';
  END IF;
  SELECT e.slot, e.lane_id, e.lane_seq INTO r FROM ${s}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                      WHERE st.lane_id = e.lane_id AND st.lane_seq = e.lane_seq AND st.slot = e.slot)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  -- Row-locks the lane (claims skip it meanwhile) and bumps its version, so a claim whose
  -- snapshot predates this tombstone sees the version change and leaves the lane alone.
  UPDATE ${s}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM ${s}.leases l
              WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq AND l.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO ${s}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, p_reason) ON CONFLICT DO NOTHING;
  DELETE FROM ${s}.dedupe WHERE id = p_id;
  RETURN 'removed';
END $fn$;

-- The producer's one statement: ids, dedupe, ready-or-deferred, and the wake NOTIFY (which
-- PostgreSQL delivers only on commit, once per transaction however many rows).
-- p_shard NULL picks the shard from the transaction id, so one transaction's batch shares a
-- lane (one lane lock) while concurrent producers spread over p_shards lanes.
CREATE FUNCTION ${s}.enqueue(
  p_queue text, p_priority smallint, p_shard smallint, p_shards smallint, p_types text[],
  p_payloads jsonb[], p_run_at timestamptz[], p_max_attempts integer[], p_dedupe text[])
RETURNS TABLE (ord integer, id bigint, state text, duplicate_of bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_lane integer;
  v_shard smallint;
  v_ids bigint[];
  v_won bigint[] := '{}';
  v_n integer := coalesce(array_length(p_types, 1), 0);
BEGIN
  IF p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: enqueue queue and priority must not be null' USING ERRCODE = '22004';
  END IF;
  v_shard := coalesce(p_shard, (txid_current() % greatest(coalesce(p_shards, 1), 1))::smallint);
  v_ids := ARRAY(SELECT nextval(${taskSeq}::regclass) FROM generate_series(1, v_n));
  IF EXISTS (SELECT 1 FROM unnest(p_dedupe) k WHERE k IS NOT NULL) THEN
    WITH cand AS (
      SELECT DISTINCT ON (x.k) x.k, x.id FROM unnest(p_dedupe, v_ids) WITH ORDINALITY AS x(k, id, o)
       WHERE x.k IS NOT NULL ORDER BY x.k, x.o),
    ins AS (
      INSERT INTO ${s}.dedupe AS d (dedupe_key, id) SELECT cand.k, cand.id FROM cand
      ON CONFLICT DO NOTHING RETURNING d.id)
    SELECT coalesce(array_agg(ins.id), '{}') INTO v_won FROM ins;
  END IF;

  RETURN QUERY
  WITH items AS (
    SELECT x.o::integer AS o, x.id, x.type, x.payload, coalesce(x.run_at, now()) AS run_at,
           x.max_attempts, x.k, (x.k IS NULL OR x.id = ANY (v_won)) AS accepted,
           coalesce(x.run_at, now()) <= now() AS due
      FROM unnest(v_ids, p_types, p_payloads, p_run_at, p_max_attempts, p_dedupe)
           WITH ORDINALITY AS x(id, type, payload, run_at, max_attempts, k, o)
  ), appended AS (
    SELECT ${s}.append_ready(${s}.provision_lane(p_queue, p_priority, v_shard),
             array_agg(i.id ORDER BY i.o), array_agg(i.type ORDER BY i.o),
             array_agg(i.payload ORDER BY i.o), array_agg(0 ORDER BY i.o),
             array_agg(i.max_attempts ORDER BY i.o), array_agg(i.k ORDER BY i.o),
             array_agg(NULL::text ORDER BY i.o), array_agg(now() ORDER BY i.o),
             array_agg(i.run_at ORDER BY i.o)) AS n
      FROM items i WHERE i.accepted AND i.due
    HAVING count(*) > 0
  ), scheduled AS (
    INSERT INTO ${s}.deferred (id, state, type, payload, queue, priority, shard, attempts,
                               max_attempts, dedupe_key, created_at, run_at)
    SELECT i.id, 'scheduled', i.type, i.payload, p_queue, p_priority, v_shard, 0, i.max_attempts,
           i.k, now(), i.run_at
      FROM items i WHERE i.accepted AND NOT i.due
    RETURNING 1
  )
  SELECT i.o, CASE WHEN i.accepted THEN i.id END,
         CASE WHEN NOT i.accepted THEN 'duplicate' WHEN i.due THEN 'ready' ELSE 'scheduled' END,
         CASE WHEN NOT i.accepted THEN (SELECT d.id FROM ${s}.dedupe d WHERE d.dedupe_key = i.k) END
    FROM items i
   WHERE (SELECT count(*) FROM appended) >= 0 AND (SELECT count(*) FROM scheduled) >= 0
   ORDER BY i.o;
END $fn$;
`;
  },
};

const moves: Migration = {
  version: 2,
  name: 'move a pending task to another queue or priority (tombstone and re-append)',
  sql(schema) {
    const s = quoteIdent(schema);
    return `
-- Move a task no worker holds to another (queue, priority). A deferred row is rewritten in
-- place (deferred storage is not the ring). A ready entry is tombstoned (under its lane's row
-- lock, version bumped so no claim with an older snapshot can lease it) and re-appended to the
-- target lane with the same id, payload and attempts. Returns 'moved', 'leased' or 'not_found'.
CREATE FUNCTION ${s}.move_task(p_id bigint, p_queue text, p_priority smallint)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE r record;
BEGIN
  IF p_id IS NULL OR p_queue IS NULL OR p_priority IS NULL THEN
    RAISE EXCEPTION 'berth: move_task arguments must not be null' USING ERRCODE = '22004';
  END IF;
  UPDATE ${s}.deferred SET queue = p_queue, priority = p_priority WHERE id = p_id;
  IF FOUND THEN RETURN 'moved'; END IF;
  SELECT e.* INTO r FROM ${s}.ready e
   WHERE e.id = p_id
     AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                      WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq AND t.slot = e.slot)
     AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                      WHERE st.lane_id = e.lane_id AND st.lane_seq = e.lane_seq AND st.slot = e.slot)
   ORDER BY e.appended_at DESC LIMIT 1;
  IF NOT FOUND THEN RETURN 'not_found'; END IF;
  UPDATE ${s}.lanes SET version = version + 1 WHERE lane_id = r.lane_id;
  IF EXISTS (SELECT 1 FROM ${s}.leases l
              WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq AND l.slot = r.slot) THEN
    RETURN 'leased';
  END IF;
  INSERT INTO ${s}.tombstones (slot, lane_id, lane_seq, id, reason)
  VALUES (r.slot, r.lane_id, r.lane_seq, p_id, 'moved') ON CONFLICT DO NOTHING;
  PERFORM ${s}.append_ready(${s}.provision_lane(p_queue, p_priority, r.shard), ARRAY[r.id],
            ARRAY[r.type], ARRAY[r.payload], ARRAY[r.attempts], ARRAY[r.max_attempts],
            ARRAY[r.dedupe_key], ARRAY[r.last_error], ARRAY[r.created_at], ARRAY[r.run_at]);
  RETURN 'moved';
END $fn$;
`;
  },
};

const privileges: Migration = {
  version: 3,
  name: 'runtime roles: no berth function is executable by PUBLIC',
  sql(schema) {
    return `
-- Functions are executable by PUBLIC by default; berth's run as the schema owner, so only the
-- roles grantRuntimeRole() names may call them. Every later migration that adds a function must
-- revoke it too: per-schema default privileges cannot take PUBLIC's EXECUTE away.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA ${quoteIdent(schema)} FROM PUBLIC;
`;
  },
};

/** Where lane sequences live and what they are called: `lane_seq_<lane_id>` in the schema. */
const LANE_SEQUENCE_PREFIX = 'lane_seq_';

/**
 * How long a lane-sequence repair waits for a lock before reporting the sequence busy. ALTER
 * SEQUENCE ... OWNER takes ACCESS EXCLUSIVE, which queues behind every producer that has used
 * the sequence in a still-open transaction, and every later nextval would queue behind it.
 */
const LANE_SEQUENCE_LOCK_TIMEOUT = '300ms';

const laneSequences: Migration = {
  version: 4,
  name: 'lane sequences: problems view, repair under a short lock timeout',
  sql(schema) {
    const s = quoteIdent(schema);
    const lockNs = schemaLockKey(schema);
    const schemaLit = quoteLiteral(schema);
    const prefix = quoteLiteral(LANE_SEQUENCE_PREFIX);
    const timeout = quoteLiteral(LANE_SEQUENCE_LOCK_TIMEOUT);
    // The role every lane sequence must belong to: provision_lane runs as it and creates them,
    // and append_ready (same owner, same migration) runs as it and calls nextval on them.
    const definer = quoteLiteral(`${s}.provision_lane(text,smallint,smallint)`);
    const provisionSeq = quoteLiteral(`${s}.provision_lane_sequence(integer)`);
    return `
-- Recreate a lane's missing sequence, as the definer role (so it is owned right), starting past
-- every lane_seq the lane has used: the claim cursor is max(leases.lane_seq), so a new entry
-- numbered at or below it would never be claimed. The lane lock keeps appends out meanwhile.
-- Returns 'created', 'ok' (it exists), 'not_found' (no such lane) or 'busy' (a lock was not
-- granted within the timeout; nothing changed).
CREATE FUNCTION ${s}.provision_lane_sequence(p_lane integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET lock_timeout = ${timeout} AS $fn$
DECLARE v_next bigint;
BEGIN
  IF p_lane IS NULL THEN
    RAISE EXCEPTION 'berth: provision_lane_sequence lane must not be null' USING ERRCODE = '22004';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM ${s}.lanes WHERE lane_id = p_lane) THEN RETURN 'not_found'; END IF;
  BEGIN
    PERFORM pg_advisory_xact_lock(${lockNs}, p_lane);
    IF to_regclass(format('%I.%I', ${schemaLit}, ${prefix} || p_lane)) IS NOT NULL THEN
      RETURN 'ok';
    END IF;
    v_next := greatest(
      coalesce((SELECT max(r.lane_seq) FROM ${s}.ready r WHERE r.lane_id = p_lane), 0),
      coalesce((SELECT max(l.lane_seq) FROM ${s}.leases l WHERE l.lane_id = p_lane), 0)) + 1;
    EXECUTE format('CREATE SEQUENCE %I.%I START WITH %s', ${schemaLit}, ${prefix} || p_lane, v_next);
    RETURN 'created';
  EXCEPTION WHEN lock_not_available THEN
    RETURN 'busy';
  END;
END $fn$;

-- Repair one lane's sequence with the caller's own rights (SECURITY INVOKER: reassigning a
-- sequence needs its current owner's rights, which the definer role usually lacks). Call it as
-- its own statement outside a transaction: ALTER ... OWNER holds ACCESS EXCLUSIVE on the
-- sequence until commit, and every append to the lane waits behind it.
-- Returns 'reassigned', 'created', 'ok', 'not_found', 'busy' or 'not_permitted'.
CREATE FUNCTION ${s}.repair_lane_sequence(p_lane integer)
RETURNS text LANGUAGE plpgsql SECURITY INVOKER
SET search_path = pg_catalog, pg_temp SET lock_timeout = ${timeout} AS $fn$
DECLARE v_seq regclass; v_want name;
BEGIN
  IF p_lane IS NULL THEN
    RAISE EXCEPTION 'berth: repair_lane_sequence lane must not be null' USING ERRCODE = '22004';
  END IF;
  v_want := (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p WHERE p.oid = ${definer}::regprocedure);
  v_seq := to_regclass(format('%I.%I', ${schemaLit}, ${prefix} || p_lane));
  IF v_seq IS NULL THEN
    BEGIN
      RETURN ${s}.provision_lane_sequence(p_lane);
    EXCEPTION WHEN insufficient_privilege THEN
      RETURN 'not_permitted';
    END;
  END IF;
  IF (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = v_seq) = v_want THEN
    RETURN 'ok';
  END IF;
  BEGIN
    EXECUTE format('ALTER SEQUENCE %I.%I OWNER TO %I', ${schemaLit}, ${prefix} || p_lane, v_want);
  EXCEPTION
    WHEN lock_not_available THEN RETURN 'busy';
    WHEN insufficient_privilege THEN RETURN 'not_permitted';
  END;
  RETURN 'reassigned';
END $fn$;

-- Every lane whose sequence is missing, and every lane sequence not owned by the definer role,
-- with the login roles able to repair it and the statement they would run. Reassigning needs
-- (PostgreSQL 15) the rights of the current owner, membership in the new owner, and CREATE on
-- the schema for the new owner; superusers need none of it. Recreating needs EXECUTE on
-- provision_lane_sequence.
CREATE VIEW ${s}.lane_sequence_problems AS
WITH want AS (
  SELECT p.proowner AS owner, p.pronamespace AS nsp FROM pg_catalog.pg_proc p
   WHERE p.oid = ${definer}::regprocedure
), seqs AS (
  SELECT c.relowner, substr(c.relname, length(${prefix}) + 1)::bigint AS n
    FROM pg_catalog.pg_class c, want w
   WHERE c.relnamespace = w.nsp AND c.relkind = 'S'
     AND c.relname ~ ('^' || ${prefix} || '[1-9][0-9]{0,9}$')
), problems AS (
  SELECT coalesce(l.lane_id, q.n::integer) AS lane_id,
         CASE WHEN q.n IS NULL THEN 'missing' ELSE 'wrong_owner' END AS problem,
         q.relowner
    FROM ${s}.lanes l
    FULL JOIN (SELECT * FROM seqs WHERE n <= 2147483647) q ON q.n = l.lane_id
   WHERE q.n IS NULL OR q.relowner <> (SELECT owner FROM want)
)
SELECT p.lane_id,
       ${prefix} || p.lane_id AS sequence_name,
       p.problem,
       pg_catalog.pg_get_userbyid(p.relowner)::text AS current_owner,
       pg_catalog.pg_get_userbyid(w.owner)::text AS expected_owner,
       ARRAY(SELECT r.rolname::text FROM pg_catalog.pg_roles r
              WHERE r.rolcanlogin
                AND CASE WHEN p.problem = 'missing'
                         THEN has_function_privilege(r.oid, ${provisionSeq}::regprocedure, 'EXECUTE')
                         ELSE r.rolsuper
                              OR (pg_has_role(r.oid, p.relowner, 'USAGE')
                                  AND pg_has_role(r.oid, w.owner, 'MEMBER')
                                  AND has_schema_privilege(w.owner, w.nsp, 'CREATE')) END
              ORDER BY r.rolname) AS repair_roles,
       CASE WHEN p.problem = 'missing'
            THEN format('SELECT %I.provision_lane_sequence(%s)', ${schemaLit}, p.lane_id)
            ELSE format('ALTER SEQUENCE %I.%I OWNER TO %I', ${schemaLit}, ${prefix} || p.lane_id,
                        pg_catalog.pg_get_userbyid(w.owner)) END AS repair_statement
  FROM problems p CROSS JOIN want w;

-- Operators only (see migration 3).
REVOKE EXECUTE ON FUNCTION ${s}.provision_lane_sequence(integer), ${s}.repair_lane_sequence(integer) FROM PUBLIC;
`;
  },
};

const operatorSurface: Migration = {
  version: 5,
  name: 'operator surface: queue pause, worker heartbeats, per-minute outcome counts, dead-letter retry, audit log',
  sql(schema) {
    const s = quoteIdent(schema);
    const channel = quoteLiteral(wakeChannel(schema));
    const queueLockPrefix = quoteLiteral(queueLockKey(schema));
    return `
-- A paused queue's lanes carry paused = true: discovery and the claim skip them (the claim
-- re-reads the column on the locked row, and pausing bumps version, so a claim with an older
-- snapshot leaves the lane alone too). queue_pauses is the queue-level record, so a lane
-- opened later for a paused queue starts paused.
ALTER TABLE ${s}.lanes ADD COLUMN paused boolean NOT NULL DEFAULT false;

CREATE TABLE ${s}.queue_pauses (
  queue text PRIMARY KEY,
  paused_at timestamptz NOT NULL DEFAULT now(),
  paused_by text NOT NULL,
  reason text
);

-- Same as migration 1's, plus: a new lane takes its queue's pause state, under the queue lock
-- set_queue_paused holds, so a lane opened while a pause commits cannot come out unpaused.
CREATE OR REPLACE FUNCTION ${s}.provision_lane(p_queue text, p_priority smallint, p_shard smallint)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_id integer;
BEGIN
  IF p_queue IS NULL OR p_priority IS NULL OR p_shard IS NULL THEN
    RAISE EXCEPTION 'berth: provision_lane arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_shard < 0 OR p_shard > 63 THEN
    RAISE EXCEPTION 'berth: shard % is outside 0-63', p_shard USING ERRCODE = '22023';
  END IF;
  SELECT lane_id INTO v_id FROM ${s}.lanes
   WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
  IF FOUND THEN RETURN v_id; END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended(${queueLockPrefix} || p_queue, 0));
  INSERT INTO ${s}.lanes (queue, priority, shard, paused)
  VALUES (p_queue, p_priority, p_shard,
          EXISTS (SELECT 1 FROM ${s}.queue_pauses q WHERE q.queue = p_queue))
  ON CONFLICT DO NOTHING RETURNING lane_id INTO v_id;
  IF v_id IS NULL THEN
    SELECT lane_id INTO v_id FROM ${s}.lanes
     WHERE queue = p_queue AND priority = p_priority AND shard = p_shard;
    RETURN v_id;
  END IF;
  EXECUTE format('CREATE SEQUENCE %I.%I', ${quoteLiteral(schema)}, 'lane_seq_' || v_id);
  RETURN v_id;
END $fn$;

-- Pause or resume a queue. Returns the number of lanes whose state changed. Resuming wakes the
-- workers with one notification per lane (delivered at commit).
CREATE FUNCTION ${s}.set_queue_paused(p_queue text, p_paused boolean, p_actor text, p_reason text)
RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer; v_lane integer;
BEGIN
  IF p_queue IS NULL OR p_paused IS NULL OR p_actor IS NULL THEN
    RAISE EXCEPTION 'berth: set_queue_paused arguments must not be null' USING ERRCODE = '22004';
  END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended(${queueLockPrefix} || p_queue, 0));
  IF p_paused THEN
    INSERT INTO ${s}.queue_pauses (queue, paused_by, reason) VALUES (p_queue, p_actor, p_reason)
    ON CONFLICT (queue) DO NOTHING;
  ELSE
    DELETE FROM ${s}.queue_pauses WHERE queue = p_queue;
  END IF;
  UPDATE ${s}.lanes SET paused = p_paused, version = version + 1
   WHERE queue = p_queue AND paused IS DISTINCT FROM p_paused;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF NOT p_paused THEN
    FOR v_lane IN SELECT lane_id FROM ${s}.lanes WHERE queue = p_queue LOOP
      PERFORM pg_notify(${channel}, v_lane::text);
    END LOOP;
  END IF;
  RETURN v_n;
END $fn$;

-- One row per live worker process, upserted on its heartbeat and deleted on a clean stop. The
-- leader's row carries its maintenance branch statistics and the lanes its promoter waits on.
CREATE TABLE ${s}.workers (
  worker_id text PRIMARY KEY,
  host text NOT NULL,
  pid integer NOT NULL,
  queues text[],
  slots integer NOT NULL,
  busy integer NOT NULL,
  prefetched integer NOT NULL,
  leader boolean NOT NULL,
  maintenance jsonb NOT NULL DEFAULT '{}',
  started_at timestamptz NOT NULL,
  last_seen_at timestamptz NOT NULL
);

-- Handler outcomes per minute, per worker (each worker writes only its own rows, so there is
-- no shared hot row): what throughput and failure charts and rates read. Pruned by retention.
CREATE TABLE ${s}.outcome_counts (
  minute timestamptz NOT NULL,
  worker_id text NOT NULL,
  queue text NOT NULL,
  type text NOT NULL,
  outcome text NOT NULL,
  count bigint NOT NULL,
  PRIMARY KEY (minute, worker_id, queue, type, outcome)
);

-- Every operator action (CLI or dashboard): who, what, on what, with what result.
CREATE TABLE ${s}.audit_log (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  actor text NOT NULL,
  action text NOT NULL,
  target jsonb NOT NULL,
  result jsonb NOT NULL
);
CREATE INDEX ON ${s}.audit_log (at);
CREATE INDEX ON ${s}.dead_letters (queue, id);

-- Retry dead letters: each goes back to the ready ring with a fresh attempt budget (attempts 0,
-- its last error kept). A dead letter whose dedupe key is now held by a live task stays where it
-- is ('duplicate'): at most one live task per key. Of several dead letters sharing a key only
-- the newest is retried. Returns one row per id: 'retried', 'duplicate' or 'not_found'.
CREATE FUNCTION ${s}.retry_dead(p_ids bigint[])
RETURNS TABLE (id bigint, result text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_lane record; v_done bigint[] := '{}'; v_part bigint[];
BEGIN
  FOR v_lane IN
    SELECT DISTINCT d.queue, d.priority, d.shard FROM ${s}.dead_letters d WHERE d.id = ANY (p_ids)
  LOOP
    -- Lock first (DISTINCT ON cannot be combined with FOR UPDATE): a concurrent retry of the
    -- same rows waits here, then finds them gone.
    PERFORM 1 FROM ${s}.dead_letters d
      WHERE d.id = ANY (p_ids) AND d.queue = v_lane.queue AND d.priority = v_lane.priority
        AND d.shard = v_lane.shard
      ORDER BY d.id FOR UPDATE;
    WITH cand AS (
      SELECT DISTINCT ON (coalesce(d.dedupe_key, d.id::text)) d.id
        FROM ${s}.dead_letters d
       WHERE d.id = ANY (p_ids) AND d.queue = v_lane.queue AND d.priority = v_lane.priority
         AND d.shard = v_lane.shard
         AND (d.dedupe_key IS NULL
              OR NOT EXISTS (SELECT 1 FROM ${s}.dedupe k WHERE k.dedupe_key = d.dedupe_key))
       ORDER BY coalesce(d.dedupe_key, d.id::text), d.id DESC
    ), gone AS (
      DELETE FROM ${s}.dead_letters d USING cand WHERE d.id = cand.id RETURNING d.*
    ), keys AS (
      INSERT INTO ${s}.dedupe (dedupe_key, id)
      SELECT g.dedupe_key, g.id FROM gone g WHERE g.dedupe_key IS NOT NULL
      ON CONFLICT DO NOTHING RETURNING 1
    ), appended AS (
      SELECT ${s}.append_ready(${s}.provision_lane(v_lane.queue, v_lane.priority, v_lane.shard),
               array_agg(g.id ORDER BY g.id), array_agg(g.type ORDER BY g.id),
               array_agg(g.payload ORDER BY g.id), array_agg(0 ORDER BY g.id),
               array_agg(g.max_attempts ORDER BY g.id), array_agg(g.dedupe_key ORDER BY g.id),
               array_agg(g.last_error ORDER BY g.id), array_agg(g.created_at ORDER BY g.id),
               array_agg(now() ORDER BY g.id)) AS n,
             array_agg(g.id) AS ids
        FROM gone g
      HAVING count(*) > 0
    )
    SELECT a.ids INTO v_part FROM appended a WHERE (SELECT count(*) FROM keys) >= 0;
    v_done := v_done || coalesce(v_part, '{}');
  END LOOP;
  RETURN QUERY
    SELECT x.id,
           CASE WHEN x.id = ANY (v_done) THEN 'retried'
                WHEN EXISTS (SELECT 1 FROM ${s}.dead_letters d WHERE d.id = x.id) THEN 'duplicate'
                ELSE 'not_found' END
      FROM unnest(p_ids) AS x(id);
END $fn$;

-- Operators only, except what a worker's heartbeat needs (granted by grantRuntimeRole).
REVOKE EXECUTE ON FUNCTION ${s}.set_queue_paused(text, boolean, text, text), ${s}.retry_dead(bigint[]) FROM PUBLIC;
`;
  },
};

const overdueLeases: Migration = {
  version: 6,
  name: 'overdue leases: a handler still running past its deadline keeps its lease while its holder lives',
  sql(schema) {
    const s = quoteIdent(schema);
    return `
-- A lease whose handler is still running past its deadline, as its holder reports it. Written
-- only on that rare path (the handler ignored its AbortSignal), refreshed by the holder every
-- heartbeat interval while the handler runs, and deleted once the lease is settled. Rescue
-- leaves a lapsed lease alone while its row is fresh (seen_at within stale_after): the holder
-- is alive and still running it, so handing the task to another worker would run it twice.
-- A holder that dies stops refreshing, the row goes stale, and rescue takes the lease.
CREATE TABLE ${s}.overdue_leases (
  slot smallint NOT NULL,
  lane_id integer NOT NULL,
  lane_seq bigint NOT NULL,
  id bigint NOT NULL,
  type text NOT NULL,
  attempt integer NOT NULL,
  worker_id text NOT NULL,
  -- When the holder wrote the row (its handler was past its deadline), and when the handler
  -- counts as stuck (deadline + the worker's grace): what the dashboard marks.
  since timestamptz NOT NULL DEFAULT now(),
  stuck_at timestamptz NOT NULL,
  seen_at timestamptz NOT NULL DEFAULT now(),
  stale_after interval NOT NULL,
  PRIMARY KEY (lane_id, lane_seq, slot)
);
CREATE INDEX ON ${s}.overdue_leases (id);
`;
  },
};

/**
 * The runtime roles split by need (producer, worker; see src/schema/roles.ts). The worker's
 * powers that could empty or rewrite storage at will move behind definer functions that check
 * the safety condition themselves: the ring prune (TRUNCATE), dead-letter retention (DELETE) and
 * promotion's row selection (FOR UPDATE, which needs UPDATE). Existing runtime roles (every role
 * granted EXECUTE on promote_lane, which only grantRuntimeRole grants) become worker roles here:
 * they gain the new functions and lose the table privileges these replace.
 *
 * The bodies are frozen copies: the prune's checks are pruneSlot's before this migration, and
 * the retention predicate is `deadRowPredicate` (src/storage/predicates.ts) as of this version.
 * A later change to either needs a new migration.
 */
const roleSplit: Migration = {
  version: 7,
  name: 'roles split by need: ring prune, dead-letter retention and promotion selection as definer functions',
  sql(schema) {
    const s = quoteIdent(schema);
    const schemaLit = quoteLiteral(schema);
    const ringTables = ['ready', 'leases', 'settlements', 'tombstones'];
    const partition = (t: string) => `format('%I.%I', ${schemaLit}, '${t}_' || p_slot)`;
    return `
-- Reclaim one sealed ring slot: under ACCESS EXCLUSIVE on its four partitions (taken within
-- p_lock_timeout_ms, else 'blocked' and nothing changes), truncate them only when the slot is
-- not the current one, holds something, has no claimable entry and no lease in flight. Returns
-- 'pruned', 'current', 'empty', 'claimable', 'in_flight' or 'blocked'. Every entry of a pruned
-- slot was settled or tombstoned, so no caller can lose a task through it.
CREATE FUNCTION ${s}.prune_slot(p_slot smallint, p_lock_timeout_ms integer)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  v_tables text;
  v_old_timeout text := current_setting('lock_timeout');
  v_any boolean; v_claimable boolean; v_in_flight boolean;
BEGIN
  IF p_slot IS NULL OR p_lock_timeout_ms IS NULL THEN
    RAISE EXCEPTION 'berth: prune_slot arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_slot < 0 OR p_slot >= (SELECT slot_count FROM ${s}.ring_state) THEN
    RAISE EXCEPTION 'berth: ring slot % does not exist', p_slot USING ERRCODE = '22023';
  END IF;
  -- Checked first too, so the current slot's partitions (every producer's) are never locked.
  IF (SELECT current_slot FROM ${s}.ring_state) = p_slot THEN RETURN 'current'; END IF;
  v_tables := concat_ws(', ', ${ringTables.map(partition).join(', ')});
  PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1) || 'ms', true);
  BEGIN
    EXECUTE 'LOCK TABLE ' || v_tables || ' IN ACCESS EXCLUSIVE MODE';
  EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', v_old_timeout, true);
    RETURN 'blocked';
  END;
  PERFORM set_config('lock_timeout', v_old_timeout, true);
  -- Again under the lock: a rotation that committed meanwhile may have made it current.
  IF (SELECT current_slot FROM ${s}.ring_state) = p_slot THEN RETURN 'current'; END IF;
  EXECUTE format(
    'SELECT EXISTS (SELECT 1 FROM %1$s),
            EXISTS (SELECT 1 FROM %1$s r
                     WHERE NOT EXISTS (SELECT 1 FROM %2$s l WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq)
                       AND NOT EXISTS (SELECT 1 FROM %4$s x WHERE x.lane_id = r.lane_id AND x.lane_seq = r.lane_seq)),
            EXISTS (SELECT 1 FROM %2$s l
                     WHERE NOT EXISTS (SELECT 1 FROM %3$s x WHERE x.lane_id = l.lane_id AND x.lane_seq = l.lane_seq))',
    ${ringTables.map(partition).join(', ')})
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
CREATE FUNCTION ${s}.prune_dead_letters(p_retention_ms double precision, p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_n integer;
BEGIN
  IF p_retention_ms IS NULL OR p_limit IS NULL THEN
    RAISE EXCEPTION 'berth: prune_dead_letters arguments must not be null' USING ERRCODE = '22004';
  END IF;
  IF p_retention_ms < 0 OR p_limit < 1 THEN
    RAISE EXCEPTION 'berth: prune_dead_letters needs a retention >= 0 and a limit >= 1' USING ERRCODE = '22023';
  END IF;
  DELETE FROM ${s}.dead_letters
   WHERE id IN (SELECT d.id FROM ${s}.dead_letters d
                 WHERE d.last_attempted_at < now() - make_interval(secs => p_retention_ms / 1000.0)
                   AND NOT EXISTS (SELECT 1 FROM ${s}.ready rr
                                     JOIN ${s}.leases l
                                       ON l.lane_id = rr.lane_id AND l.lane_seq = rr.lane_seq AND l.slot = rr.slot
                                    WHERE rr.id = d.id AND l.expires_at > now()
                                      AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                                                       WHERE st.lane_id = l.lane_id AND st.lane_seq = l.lane_seq
                                                         AND st.slot = l.slot))
                 LIMIT p_limit);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN
    INSERT INTO ${s}.audit_log (actor, action, target, result)
    VALUES ('maintenance:' || session_user, 'dead.retention',
            jsonb_build_object('retentionMs', p_retention_ms), jsonb_build_object('pruned', v_n));
  END IF;
  RETURN v_n;
END $fn$;

-- Promotion's batch selection: the oldest due deferred rows (optionally of one state), lanes in
-- the skip arrays left out, locked FOR UPDATE SKIP LOCKED for the caller's transaction. A row
-- lock needs UPDATE on the table, which a worker role must not have.
CREATE FUNCTION ${s}.due_deferred(p_state text, p_limit integer, p_skip_queues text[],
                                  p_skip_priorities smallint[], p_skip_shards smallint[])
RETURNS TABLE (id bigint, queue text, priority smallint, shard smallint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT d.id, d.queue, d.priority, d.shard
    FROM ${s}.deferred d
   WHERE d.run_at <= now()
     AND (p_state IS NULL OR d.state = p_state)
     AND NOT EXISTS (SELECT 1 FROM unnest(p_skip_queues, p_skip_priorities, p_skip_shards) AS k(q, p, sh)
                      WHERE k.q = d.queue AND k.p = d.priority AND k.sh = d.shard)
   ORDER BY d.run_at, d.priority, d.id
   LIMIT p_limit
   FOR UPDATE OF d SKIP LOCKED
$fn$;

REVOKE EXECUTE ON FUNCTION ${s}.prune_slot(smallint, integer), ${s}.prune_dead_letters(double precision, integer),
  ${s}.due_deferred(text, integer, text[], smallint[], smallint[]) FROM PUBLIC;

-- Existing runtime roles become worker roles (the owner's grants; the owner itself is skipped).
DO $do$
DECLARE v_role text; v_slot integer;
BEGIN
  FOR v_role IN
    SELECT DISTINCT pg_get_userbyid(a.grantee)
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = ${quoteLiteral(`${s}.promote_lane(text,smallint,smallint,integer)`)}::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %1$I.prune_slot(smallint, integer), %1$I.prune_dead_letters(double precision, integer), '
                   '%1$I.due_deferred(text, integer, text[], smallint[], smallint[]) TO %2$I', ${schemaLit}, v_role);
    FOR v_slot IN 0..${RING_SLOTS - 1} LOOP
      EXECUTE format('REVOKE TRUNCATE ON %1$I.%2$I, %1$I.%3$I, %1$I.%4$I, %1$I.%5$I FROM %6$I', ${schemaLit},
                     'ready_' || v_slot, 'leases_' || v_slot, 'settlements_' || v_slot, 'tombstones_' || v_slot, v_role);
    END LOOP;
    EXECUTE format('REVOKE DELETE ON %I.dead_letters FROM %I', ${schemaLit}, v_role);
    EXECUTE format('REVOKE UPDATE (run_at) ON %I.deferred FROM %I', ${schemaLit}, v_role);
  END LOOP;
END $do$;
`;
  },
};

export const MIGRATIONS: readonly Migration[] = [core, moves, privileges, laneSequences, operatorSurface, overdueLeases, roleSplit];
