/**
 * Prototype (not product code): the range-lease tables and statements of
 * docs/design/range-leases.md, in two fence variants, so the drain, the EXPLAINs and the race
 * test run the same SQL.
 *
 * - `lock`: settlements carry no uniqueness; every writer of a lease's settlements takes an
 *   advisory xact lock on the lease first, inside a plpgsql function, and only its SECOND
 *   statement reads what is already settled (a fresh snapshot at READ COMMITTED).
 * - `gist`: each settlements partition has an exclusion constraint
 *   (lane WITH &&, seqs WITH &&); a writer inserts with ON CONFLICT DO NOTHING, the loser of a
 *   partial overlap writes nothing and recomputes.
 *
 * Tables are those of berth migration 1 reduced to what the hot path touches (no dedupe, no
 * overdue_leases, no roles), with the same 16 slot partitions.
 */
import { quoteIdent } from '../../../src/sql.js';

export type Variant = 'lock' | 'gist';
export const SLOTS = 16;

export function rangeSchemaSql(schema: string, variant: Variant): string {
  const s = quoteIdent(schema);
  const parts = (t: string, extra = (_slot: number) => '') =>
    Array.from(
      { length: SLOTS },
      (_, slot) =>
        `CREATE TABLE ${s}.${quoteIdent(`${t}_${slot}`)} PARTITION OF ${s}.${t} FOR VALUES IN (${slot});${extra(slot)}`,
    ).join('\n');
  const exclusion = (slot: number) =>
    variant === 'gist'
      ? `\nALTER TABLE ${s}.${quoteIdent(`settlements_${slot}`)} ADD CONSTRAINT ${quoteIdent(`settlements_${slot}_one_winner`)}
   EXCLUDE USING gist (int4range(lane_id, lane_id, '[]') WITH &&, seqs WITH &&);`
      : '';
  return `
DROP SCHEMA IF EXISTS ${s} CASCADE;
CREATE SCHEMA ${s};
CREATE TABLE ${s}.lanes (
  lane_id integer PRIMARY KEY, queue text NOT NULL, priority smallint NOT NULL, shard smallint NOT NULL,
  version bigint NOT NULL DEFAULT 0, paused boolean NOT NULL DEFAULT false);
CREATE TABLE ${s}.ready (
  slot smallint NOT NULL, lane_id integer NOT NULL, lane_seq bigint NOT NULL, id bigint NOT NULL,
  type text NOT NULL, payload jsonb NOT NULL, queue text NOT NULL, priority smallint NOT NULL,
  shard smallint NOT NULL, attempts integer NOT NULL, max_attempts integer, dedupe_key text,
  last_error text, created_at timestamptz NOT NULL, run_at timestamptz NOT NULL,
  appended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (lane_id, lane_seq, slot)) PARTITION BY LIST (slot);
CREATE INDEX ON ${s}.ready (id);
${parts('ready')}
CREATE TABLE ${s}.tombstones (
  slot smallint NOT NULL, lane_id integer NOT NULL, lane_seq bigint NOT NULL, id bigint NOT NULL,
  reason text NOT NULL, PRIMARY KEY (lane_id, lane_seq, slot)) PARTITION BY LIST (slot);
${parts('tombstones')}

-- One row per claimed range: the non-tombstoned entries of (lane, slot) with
-- from_seq <= lane_seq <= to_seq. from_seq is the first leased entry, so a claimer whose
-- snapshot missed a committed lease starts at that lease's from_seq and hits the PK.
-- Per type present in the range (usually one): its expiry (claimed_at + ceiling + margin) and
-- its attempt limit as the claiming worker resolved them; expires_at is their minimum, the
-- first moment any entry of the range can lapse (rescue's index).
CREATE TABLE ${s}.leases (
  slot smallint NOT NULL, lane_id integer NOT NULL, from_seq bigint NOT NULL, to_seq bigint NOT NULL,
  n integer NOT NULL, token uuid NOT NULL, claimed_at timestamptz NOT NULL, worker text,
  types text[] NOT NULL, type_expires timestamptz[] NOT NULL, type_max_attempts integer[] NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (lane_id, from_seq, slot)) PARTITION BY LIST (slot);
CREATE INDEX ON ${s}.leases (expires_at);
${parts('leases')}

-- One row per settling statement per lease: which entries (seqs) it settled, how many (n), and
-- how. Completions of one flush share one row; a failure / release / rescue row per entry or
-- per lapsed set.
CREATE TABLE ${s}.settlements (
  slot smallint NOT NULL, lane_id integer NOT NULL, lease_from bigint NOT NULL,
  seqs int8multirange NOT NULL, n integer NOT NULL, outcome text NOT NULL,
  settled_at timestamptz NOT NULL DEFAULT now()) PARTITION BY LIST (slot);
CREATE INDEX ON ${s}.settlements (lane_id, lease_from, slot);
${parts('settlements', exclusion)}

CREATE TABLE ${s}.deferred (
  id bigint PRIMARY KEY, state text NOT NULL, type text NOT NULL, payload jsonb NOT NULL,
  queue text NOT NULL, priority smallint NOT NULL, shard smallint NOT NULL, attempts integer NOT NULL,
  max_attempts integer, dedupe_key text, last_error text, created_at timestamptz NOT NULL,
  last_attempted_at timestamptz, run_at timestamptz NOT NULL);
CREATE TABLE ${s}.dead_letters (
  id bigint PRIMARY KEY, type text NOT NULL, payload jsonb NOT NULL, queue text NOT NULL,
  priority smallint NOT NULL, shard smallint NOT NULL, attempts integer NOT NULL, max_attempts integer,
  dedupe_key text, last_error text, created_at timestamptz NOT NULL,
  last_attempted_at timestamptz NOT NULL, died_at timestamptz NOT NULL DEFAULT now());

-- How many integers a multirange holds.
CREATE FUNCTION ${s}.mr_count(m int8multirange) RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN (SELECT coalesce(sum(upper(r) - lower(r)), 0)::integer FROM unnest(m) r);
-- The advisory key of a lease (lock variant): a hash of its random token, so the worker and
-- rescue derive the same key from the row and no two live leases share one in practice.
CREATE FUNCTION ${s}.lease_key(t uuid) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN hashtextextended(t::text, 7411);
${variant === 'lock' ? lockFunctions(s) : ''}
`;
}

/** lock variant: the settle and rescue functions (two statements each: lock, then read+write). */
function lockFunctions(s: string): string {
  return `
-- Complete, one function per slot so it names the slot's partitions (no tuple routing, no
-- run-time pruning: berth's completion writes partitions directly today for the same reason).
-- p_seqs[i] are the entries of lease (p_lane[i], p_from[i]) this flush settles. Returns what
-- was written (a subset: entries rescue took first are missing).
${Array.from({ length: SLOTS }, (_, slot) => completeFn(s, slot)).join('\n')}
-- Rescue: lapsed, not fully settled leases whose lock is free now (a settler holding it is
-- mid-write; the next run sees its result). Entries whose type's expiry passed and that carry
-- no settlement go back to deferred (attempt kept) or to the dead letters.
CREATE FUNCTION ${s}.rescue(p_limit integer) RETURNS TABLE (retried bigint, dead bigint)
LANGUAGE plpgsql AS $fn$
DECLARE v_slots smallint[]; v_lanes integer[]; v_froms bigint[];
BEGIN
  SELECT array_agg(c.slot), array_agg(c.lane_id), array_agg(c.from_seq) INTO v_slots, v_lanes, v_froms FROM (
    SELECT l.slot, l.lane_id, l.from_seq, l.token FROM ${s}.leases l
     WHERE l.expires_at < now()
       AND l.n > coalesce((SELECT sum(st.n) FROM ${s}.settlements st
                            WHERE st.lane_id = l.lane_id AND st.lease_from = l.from_seq AND st.slot = l.slot), 0)
     ORDER BY l.expires_at LIMIT p_limit) c
   WHERE pg_try_advisory_xact_lock(${s}.lease_key(c.token));
  IF v_slots IS NULL THEN retried := 0; dead := 0; RETURN NEXT; RETURN; END IF;
  RETURN QUERY
  WITH lapsed AS MATERIALIZED (
    SELECT l.slot, l.lane_id, l.from_seq, l.claimed_at, l.worker, r.lane_seq, r.id,
           r.attempts + 1 AS attempt,
           coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]) AS max_attempts,
           l.type_expires[array_position(l.types, r.type)] AS expired_at
      FROM unnest(v_slots, v_lanes, v_froms) AS c(slot, lane_id, from_seq)
      JOIN ${s}.leases l ON l.lane_id = c.lane_id AND l.from_seq = c.from_seq AND l.slot = c.slot
      -- LATERAL: one index range scan of ready per lease (a join let the planner sort all of ready).
      CROSS JOIN LATERAL (SELECT r.* FROM ${s}.ready r WHERE r.lane_id = l.lane_id AND r.slot = l.slot
                             AND r.lane_seq BETWEEN l.from_seq AND l.to_seq OFFSET 0) r
     WHERE l.expires_at < now()
       AND l.type_expires[array_position(l.types, r.type)] < now()
       AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                        WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
       AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                        WHERE st.lane_id = l.lane_id AND st.lease_from = l.from_seq AND st.slot = l.slot
                          AND st.seqs @> r.lane_seq)
  ), won AS (
    INSERT INTO ${s}.settlements (slot, lane_id, lease_from, seqs, n, outcome)
    SELECT slot, lane_id, from_seq, range_agg(int8range(lane_seq, lane_seq, '[]')), count(*), 'rescued'
      FROM lapsed GROUP BY slot, lane_id, from_seq
    RETURNING 1
  ), src AS MATERIALIZED (
    SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, r.dedupe_key, r.created_at,
           x.attempt, x.max_attempts, x.claimed_at, x.worker, x.expired_at,
           x.attempt >= coalesce(x.max_attempts, 20) AS is_dead
      FROM lapsed x JOIN ${s}.ready r ON r.lane_id = x.lane_id AND r.lane_seq = x.lane_seq AND r.slot = x.slot
     WHERE (SELECT count(*) FROM won) >= 0
  ), buried AS (
    INSERT INTO ${s}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
                                   last_error, created_at, last_attempted_at)
    SELECT id, type, payload, queue, priority, shard, attempt, max_attempts, dedupe_key,
           format('lease lapsed at %s on attempt %s (worker %s)', expired_at, attempt, coalesce(worker, 'unknown')),
           created_at, claimed_at FROM src WHERE is_dead
    ON CONFLICT (id) DO NOTHING
  ), retried AS (
    INSERT INTO ${s}.deferred (id, state, type, payload, queue, priority, shard, attempts, max_attempts,
                               dedupe_key, last_error, created_at, last_attempted_at, run_at)
    SELECT id, 'retryable', type, payload, queue, priority, shard, attempt, max_attempts, dedupe_key,
           format('lease lapsed at %s on attempt %s (worker %s)', expired_at, attempt, coalesce(worker, 'unknown')),
           created_at, claimed_at, now() FROM src WHERE NOT is_dead
    ON CONFLICT (id) DO NOTHING
  )
  SELECT count(*) FILTER (WHERE NOT is_dead), count(*) FILTER (WHERE is_dead) FROM src;
END $fn$;
`;
}

function completeFn(s: string, slot: number): string {
  const le = `${s}.${quoteIdent(`leases_${slot}`)}`;
  const st = `${s}.${quoteIdent(`settlements_${slot}`)}`;
  return `CREATE FUNCTION ${s}.${quoteIdent(`complete_ranges_${slot}`)}(p_lane integer[], p_from bigint[], p_token uuid[],
                                     p_seqs int8multirange[])
RETURNS TABLE (lane_id integer, lease_from bigint, seqs int8multirange)
LANGUAGE plpgsql AS $fn$
BEGIN
  -- In key order, so two settlers of overlapping lease sets never deadlock.
  PERFORM pg_advisory_xact_lock(k) FROM (SELECT DISTINCT ${s}.lease_key(t) AS k FROM unnest(p_token) t ORDER BY 1) x;
  -- A new statement: at READ COMMITTED it sees every settlement committed before the locks.
  RETURN QUERY
  WITH u AS (SELECT * FROM unnest(p_lane, p_from, p_token, p_seqs) AS u(lane_id, from_seq, token, seqs)),
  todo AS (
    SELECT l.slot, l.lane_id, l.from_seq,
           u.seqs - coalesce((SELECT range_agg(x.seqs) FROM ${st} x
                               WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq),
                             '{}'::int8multirange) AS seqs
      FROM u JOIN ${le} l ON l.lane_id = u.lane_id AND l.from_seq = u.from_seq AND l.token = u.token
  ), won AS (
    INSERT INTO ${st} AS w (slot, lane_id, lease_from, seqs, n, outcome)
    SELECT t.slot, t.lane_id, t.from_seq, t.seqs, ${s}.mr_count(t.seqs), 'completed' FROM todo t
     WHERE NOT isempty(t.seqs)
    RETURNING w.lane_id, w.lease_from, w.seqs)
  SELECT * FROM won;
END $fn$;`;
}

/**
 * The claim: as berth's today up to \`chosen\`, then one lease row per lane (its chosen prefix
 * within the slot of the lane's first chosen entry: a range never spans two slots, so a lease
 * always lives with every entry it covers and TRUNCATE of a slot never lowers a cursor).
 * $1 lanes, $2 limit, $3 types, $4 ceilings ms, $5 default ceiling ms, $6 margin ms, $7 worker,
 * $8 default max attempts, $9 per-type max attempts, $10 max lanes.
 */
export function claimSql(s: string): string {
  return `WITH locked AS MATERIALIZED (
       SELECT l.lane_id, l.version FROM ${s}.lanes l
        WHERE l.lane_id = ANY ($1::integer[]) AND NOT l.paused
        ORDER BY array_position($1::integer[], l.lane_id)
        LIMIT $10
        FOR UPDATE SKIP LOCKED
     ), current AS MATERIALIZED (
       SELECT k.lane_id FROM locked k
        WHERE k.version = (SELECT v.version FROM ${s}.lanes v WHERE v.lane_id = k.lane_id)
     ), picked AS MATERIALIZED (
       SELECT r.slot, r.lane_id, r.lane_seq, r.id, r.type, r.payload, r.priority, r.attempts,
              r.max_attempts, r.run_at,
              row_number() OVER (PARTITION BY r.lane_id ORDER BY r.lane_seq) AS rank_in_lane,
              first_value(r.slot) OVER (PARTITION BY r.lane_id ORDER BY r.lane_seq) AS first_slot
         FROM current k
         CROSS JOIN LATERAL (
           SELECT r.* FROM ${s}.ready r
            WHERE r.lane_id = k.lane_id
              AND r.lane_seq > coalesce((SELECT le.to_seq FROM ${s}.leases le
                                          WHERE le.lane_id = k.lane_id
                                          ORDER BY le.from_seq DESC LIMIT 1), 0)
              AND r.run_at <= now()
              AND r.attempts < coalesce(r.max_attempts, 2147483647)
              AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                               WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
                             OFFSET 0)
            ORDER BY r.lane_seq
            LIMIT $2) r
     ), chosen AS MATERIALIZED (
       SELECT * FROM picked WHERE slot = first_slot
        ORDER BY priority, rank_in_lane, run_at, lane_id LIMIT $2
     ), per_type AS MATERIALIZED (
       SELECT c.lane_id, c.type,
              now() + make_interval(secs => (coalesce(t.ceiling_ms, $5) + $6) / 1000.0) AS expires,
              coalesce(t.max_attempts, $8) AS max_attempts
         FROM (SELECT DISTINCT lane_id, type FROM chosen) c
         LEFT JOIN unnest($3::text[], $4::float8[], $9::integer[]) AS t(type, ceiling_ms, max_attempts)
           ON t.type = c.type
     ), leased AS (
       INSERT INTO ${s}.leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker,
                                types, type_expires, type_max_attempts, expires_at)
       SELECT min(c.slot), c.lane_id, min(c.lane_seq), max(c.lane_seq), count(*), gen_random_uuid(), now(), $7,
              (SELECT array_agg(p.type ORDER BY p.type) FROM per_type p WHERE p.lane_id = c.lane_id),
              (SELECT array_agg(p.expires ORDER BY p.type) FROM per_type p WHERE p.lane_id = c.lane_id),
              (SELECT array_agg(p.max_attempts ORDER BY p.type) FROM per_type p WHERE p.lane_id = c.lane_id),
              (SELECT min(p.expires) FROM per_type p WHERE p.lane_id = c.lane_id)
         FROM chosen c GROUP BY c.lane_id
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, from_seq, to_seq, token, types, type_expires, type_max_attempts
     )
     SELECT c.slot, c.lane_id, c.lane_seq::text AS lane_seq, l.from_seq::text AS lease_from, c.id::text AS id,
            c.type, c.payload, c.attempts + 1 AS attempt,
            coalesce(c.max_attempts, l.type_max_attempts[array_position(l.types, c.type)]) AS max_attempts,
            l.token::text AS token,
            (extract(epoch FROM l.type_expires[array_position(l.types, c.type)]) * 1000)::float8 AS expires_ms
       FROM leased l
       JOIN chosen c ON c.lane_id = l.lane_id AND c.lane_seq BETWEEN l.from_seq AND l.to_seq
      ORDER BY c.priority, c.rank_in_lane, c.run_at, c.lane_id`;
}

/** gist variant: one INSERT per slot, straight into the partition; overlap → row not written. */
export function completeGistSql(s: string, slot: number): string {
  const st = `${s}.${quoteIdent(`settlements_${slot}`)}`;
  const le = `${s}.${quoteIdent(`leases_${slot}`)}`;
  return `WITH u AS (SELECT * FROM unnest($1::integer[], $2::bigint[], $3::uuid[], $4::int8multirange[])
                     AS u(lane_id, from_seq, token, seqs))
     INSERT INTO ${st} (slot, lane_id, lease_from, seqs, n, outcome)
     SELECT l.slot, l.lane_id, l.from_seq, u.seqs, ${s}.mr_count(u.seqs), 'completed'
       FROM u JOIN ${le} l ON l.lane_id = u.lane_id AND l.from_seq = u.from_seq AND l.token = u.token
     ON CONFLICT DO NOTHING
     RETURNING lane_id, lease_from, seqs`;
}

/** gist variant: rescue in one statement; a row overlapping a concurrent settlement is dropped. */
export function rescueGistSql(s: string): string {
  return `WITH cand AS MATERIALIZED (
    SELECT l.* FROM ${s}.leases l
     WHERE l.expires_at < now()
       AND l.n > coalesce((SELECT sum(st.n) FROM ${s}.settlements st
                            WHERE st.lane_id = l.lane_id AND st.lease_from = l.from_seq AND st.slot = l.slot), 0)
     ORDER BY l.expires_at LIMIT $1
  ), lapsed AS MATERIALIZED (
    SELECT l.slot, l.lane_id, l.from_seq, l.claimed_at, l.worker, r.lane_seq,
           r.attempts + 1 AS attempt,
           coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]) AS max_attempts,
           l.type_expires[array_position(l.types, r.type)] AS expired_at
      FROM cand l
      -- LATERAL: one index range scan of ready per lease (a join let the planner sort all of ready).
      CROSS JOIN LATERAL (SELECT r.* FROM ${s}.ready r WHERE r.lane_id = l.lane_id AND r.slot = l.slot
                             AND r.lane_seq BETWEEN l.from_seq AND l.to_seq OFFSET 0) r
     WHERE l.type_expires[array_position(l.types, r.type)] < now()
       AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                        WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
       AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                        WHERE st.lane_id = l.lane_id AND st.lease_from = l.from_seq AND st.slot = l.slot
                          AND st.seqs @> r.lane_seq)
  ), won AS (
    INSERT INTO ${s}.settlements (slot, lane_id, lease_from, seqs, n, outcome)
    SELECT slot, lane_id, from_seq, range_agg(int8range(lane_seq, lane_seq, '[]')), count(*), 'rescued'
      FROM lapsed GROUP BY slot, lane_id, from_seq
    ON CONFLICT DO NOTHING
    RETURNING slot, lane_id, lease_from, seqs
  ), src AS MATERIALIZED (
    SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, r.dedupe_key, r.created_at,
           x.attempt, x.max_attempts, x.claimed_at, x.worker, x.expired_at,
           x.attempt >= coalesce(x.max_attempts, 20) AS is_dead
      FROM lapsed x
      JOIN won w ON w.slot = x.slot AND w.lane_id = x.lane_id AND w.lease_from = x.from_seq
      JOIN ${s}.ready r ON r.lane_id = x.lane_id AND r.lane_seq = x.lane_seq AND r.slot = x.slot
  ), buried AS (
    INSERT INTO ${s}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
                                   last_error, created_at, last_attempted_at)
    SELECT id, type, payload, queue, priority, shard, attempt, max_attempts, dedupe_key,
           format('lease lapsed at %s on attempt %s (worker %s)', expired_at, attempt, coalesce(worker, 'unknown')),
           created_at, claimed_at FROM src WHERE is_dead
    ON CONFLICT (id) DO NOTHING
  ), retried AS (
    INSERT INTO ${s}.deferred (id, state, type, payload, queue, priority, shard, attempts, max_attempts,
                               dedupe_key, last_error, created_at, last_attempted_at, run_at)
    SELECT id, 'retryable', type, payload, queue, priority, shard, attempt, max_attempts, dedupe_key,
           format('lease lapsed at %s on attempt %s (worker %s)', expired_at, attempt, coalesce(worker, 'unknown')),
           created_at, claimed_at, now() FROM src WHERE NOT is_dead
    ON CONFLICT (id) DO NOTHING
  )
  SELECT count(*) FILTER (WHERE NOT is_dead) AS retried, count(*) FILTER (WHERE is_dead) AS dead FROM src`;
}

/** Load `perLane` due entries into each of `lanes` lanes (slot 0), ids unique across lanes. */
export function loadSql(s: string, lanes: number, perLane: number, seqBase = 0, idBase = 0): string {
  return `INSERT INTO ${s}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard, attempts,
                                 max_attempts, created_at, run_at)
  SELECT 0, l, ${seqBase} + g, ${idBase} + (l - 1) * ${perLane} + g, 'noop', '{}'::jsonb, 'default', 0, l - 1, 0, NULL, now(), now() - interval '1 s'
    FROM generate_series(1, ${lanes}) l, generate_series(1, ${perLane}) g`;
}

/** Discovery, as berth's today with the cursor read from the last lease of the lane. */
export function discoverSql(s: string): string {
  return `SELECT r.lane_id, r.lane_seq::text AS lane_seq, r.id::text AS id
       FROM ${s}.lanes l
       CROSS JOIN LATERAL (
         SELECT r.lane_id, r.lane_seq, r.id, r.priority, r.run_at
           FROM ${s}.ready r
          WHERE r.lane_id = l.lane_id
            AND r.lane_seq > coalesce((SELECT le.to_seq FROM ${s}.leases le
                                        WHERE le.lane_id = l.lane_id ORDER BY le.from_seq DESC LIMIT 1), 0)
            AND r.run_at <= now()
            AND r.attempts < coalesce(r.max_attempts, 2147483647)
            AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                             WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
                             OFFSET 0)
          ORDER BY r.lane_seq
          LIMIT $3) r
      WHERE ($1::text[] IS NULL OR l.queue = ANY ($1::text[]))
        AND NOT l.paused
      ORDER BY r.priority, r.run_at, r.lane_id, r.lane_seq
      LIMIT $2`;
}
