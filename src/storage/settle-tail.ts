import { p, type Sql, sql } from '../statement.js';
import type { AttemptRef } from './attempt.js';

/**
 * The settle-and-move tail that fail (processor), return (processor: release, AdvanceCursor,
 * hand-back) and rescue (maintenance) end with: once the settlement row has won the fence, the
 * task leaves the ring for the dead letters or for deferred storage, and a buried task frees
 * its dedupe key. Written once here; each caller's statement splices it in after its own `src`
 * CTE, so each path stays one statement (docs/architecture.md, "Every transition is one
 * statement").
 */

/** The columns a settled entry carries to `dead_letters` or `deferred`. */
export const MOVE_COLUMNS = `id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
  last_error, created_at, last_attempted_at, trace_context`;

/**
 * The tail's CTEs, to follow a `src` CTE (MATERIALIZED, so the moves read it once) that selects
 * every MOVE_COLUMNS column plus `dead` (boolean: bury instead of retry) for each settlement won.
 *
 * - `buried`: a dead letter replaces an older one of the same task (a task retried out of the
 *   dead letters dies again under the same id).
 * - `retried`: back to deferred, `retryable`, due at `runAt` (an SQL expression over `src`).
 *   `ON CONFLICT (id) DO NOTHING`: a task already deferred can only be a duplicate copy, and one
 *   colliding row must never fail a settlement batch or wedge rescue for every lapsed lease
 *   behind it.
 * - `freed`: a dead letter never holds a dedupe key (a retried task keeps its own).
 *
 * `s` is the quoted schema. The caller's final SELECT reads `src` for its result.
 */
export function settleAndMove<N extends string>(s: string, runAt: Sql<N>): Sql<N> {
  return sql`buried AS (
       INSERT INTO ${s}.dead_letters (${MOVE_COLUMNS})
       SELECT ${MOVE_COLUMNS} FROM src WHERE dead
       ON CONFLICT (id) DO UPDATE SET
         payload = EXCLUDED.payload, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
         last_attempted_at = EXCLUDED.last_attempted_at, died_at = now()
       RETURNING id
     ), retried AS (
       INSERT INTO ${s}.deferred (state, run_at, ${MOVE_COLUMNS})
       SELECT 'retryable', ${runAt}, ${MOVE_COLUMNS} FROM src WHERE NOT dead
       ON CONFLICT (id) DO NOTHING
     ), freed AS (
       DELETE FROM ${s}.dedupe d USING buried WHERE d.id = buried.id
     )`;
}

/** The parameters that name one entry of a range lease. */
export type EntryParams = 'segment' | 'laneId' | 'laneSeq' | 'leaseFrom' | 'token';

/**
 * The head of a single-entry settlement (release, AdvanceCursor, hand-back, snooze), written
 * once: `won` inserts the settlement of entry `laneSeq` of the range lease (`segment`, `laneId`,
 * `leaseFrom` its first entry) fenced on `token`, as `outcome` (an SQL expression); `lease` reads
 * the entry it settled with its attempt and limit. Nothing when the fence refuses, or when
 * `laneSeq` is not an entry of the lease. The caller's `src` follows.
 */
export function settleOneEntry<N extends string>(s: string, outcome: Sql<N>): Sql<N | EntryParams> {
  return sql`won AS (
       INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
       SELECT l.slot, l.lane_id, l.from_seq, int8multirange(int8range(${p('laneSeq')}::bigint, ${p('laneSeq')}::bigint + 1)), 1, ${outcome}
         FROM ${s}.range_leases l
        WHERE l.slot = ${p('segment')} AND l.lane_id = ${p('laneId')} AND l.from_seq = ${p('leaseFrom')} AND l.token = ${p('token')}::uuid
          AND ${p('laneSeq')}::bigint BETWEEN l.from_seq AND l.to_seq
          AND ${entryOfLease(s, sql`${p('segment')}`, sql`${p('laneId')}`, sql`${p('laneSeq')}::bigint`)}
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lease_from
     ), lease AS (
       SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, r.attempts + 1 AS attempt,
              coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]) AS max_attempts,
              r.max_attempts AS task_max_attempts, r.dedupe_key, r.last_error, r.created_at, l.claimed_at,
              r.lane_id, l.worker, r.trace_context
         FROM won w
         JOIN ${s}.range_leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.from_seq = w.lease_from
         JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = ${p('laneSeq')}::bigint
     )`;
}

/** The values of EntryParams for one entry of a range lease. */
export function entryArgs(ref: AttemptRef): { [K in EntryParams]: unknown } {
  return { segment: ref.segment, laneId: ref.laneId, laneSeq: ref.laneSeq, leaseFrom: ref.leaseFrom, token: ref.token };
}

/**
 * Lane position `seq` of lane `lane` in ring segment `segment` (SQL expressions) is an entry the
 * lease holds: it exists and is not tombstoned. A single-entry settlement counts 1 (its `n`):
 * naming a position within the lease's range that holds no entry (a gap left by a rolled-back
 * append) or a tombstoned one would count an entry that is not there, and a lease whose
 * settlements add up to its `n` with one of its entries unsettled is one rescue and prune would
 * take for done.
 */
export function entryOfLease<N extends string>(s: string, segment: Sql<N>, lane: Sql<N>, seq: Sql<N>): Sql<N> {
  return sql`EXISTS (SELECT 1 FROM ${s}.ready r WHERE r.slot = ${segment} AND r.lane_id = ${lane} AND r.lane_seq = ${seq})
          AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                           WHERE t.slot = ${segment} AND t.lane_id = ${lane} AND t.lane_seq = ${seq})`;
}
