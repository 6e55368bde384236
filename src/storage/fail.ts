import type { Queryable, Schema } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import type { ErrorDetail } from '../util/error-detail.js';
import { perTaskHistory, runMsValue } from './history.js';
import { entryKey, type AttemptRef } from './attempt.js';
import { entryOfLease, settleAndMove } from './settle-tail.js';
import type { Storage } from './storage.js';

export interface FailureInput {
  ref: AttemptRef;
  error: string;
  /** Backoff before the retry, applied on the database clock. */
  delayMs: number;
  /** Dead-letter now, whatever attempts remain. */
  permanent: boolean;
  /** The outcome attempt history records (default `failure`; `timeout` past the deadline). */
  outcome?: 'failure' | 'timeout';
  /** What was thrown (message, stack, cause chain); default: `{ message: error }`. */
  detail?: ErrorDetail;
  /** The handler's run time, ms. */
  runMs?: number | null;
}

/**
 * RecordFailure, batched: settle as failed (fenced on each token: the range_settlements
 * exclusion constraint is the arbiter, see complete.ts; one single-entry row per failure), store last_error, and move the task to deferred storage
 * (retryable at now() + backoff) or, out of attempts, to the dead letters.
 * Returns key -> 'retry' | 'dead'; a missing key was refused. One statement per batch.
 *
 * Each lease is looked up in a `LATERAL … LIMIT 1` probe, as the completion does (complete.ts,
 * `leaseProbe`): as a join, the session's cached generic plan read the segment's lease index from
 * its start to the match (203 rows for one failure in docs/explain.md; ~1 after).
 */
export async function recordFailures(
  write: Queryable,
  storage: Storage,
  items: readonly FailureInput[],
): Promise<Map<string, 'retry' | 'dead'>> {
  if (items.length === 0) return new Map();
  const res = await write.query<{ lane_id: number; lane_seq: string; dead: boolean }>(
    storage.statement('fail', failStatement).query({
      segments: items.map((i) => i.ref.segment),
      laneIds: items.map((i) => i.ref.laneId),
      laneSeqs: items.map((i) => i.ref.laneSeq),
      tokens: items.map((i) => i.ref.token),
      errors: items.map((i) => i.error),
      delayMs: items.map((i) => Math.max(0, i.delayMs)),
      permanent: items.map((i) => i.permanent),
      leaseFroms: items.map((i) => i.ref.leaseFrom),
      outcomes: items.map((i) => i.outcome ?? 'failure'),
      details: items.map((i) => JSON.stringify(i.detail ?? { message: i.error })),
      runMs: items.map((i) => runMsValue(i.runMs)),
    }),
  );
  return new Map(
    res.rows.map((r) => [entryKey({ laneId: r.lane_id, laneSeq: r.lane_seq }), r.dead ? 'dead' : 'retry']),
  );
}

function failStatement({ name, q: s }: Schema) {
  return compile(
    sql`WITH u AS (
       SELECT * FROM unnest(${p('segments')}::smallint[], ${p('laneIds')}::integer[], ${p('laneSeqs')}::bigint[],
                            ${p('tokens')}::uuid[], ${p('errors')}::text[], ${p('delayMs')}::float8[],
                            ${p('permanent')}::boolean[], ${p('leaseFroms')}::bigint[], ${p('outcomes')}::text[],
                            ${p('details')}::jsonb[], ${p('runMs')}::integer[])
         AS u(slot, lane_id, lane_seq, token, error, delay_ms, permanent, lease_from, outcome, detail, run_ms)
     ), won AS (
       INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
       SELECT l.slot, l.lane_id, l.from_seq, int8multirange(int8range(u.lane_seq, u.lane_seq + 1)), 1, 'failed'
         FROM u CROSS JOIN LATERAL (
                SELECT l.slot, l.lane_id, l.from_seq, l.to_seq FROM ${s}.range_leases l
                 WHERE l.lane_id = u.lane_id AND l.from_seq = u.lease_from AND l.slot = u.slot AND l.token = u.token
                 LIMIT 1) l
        WHERE u.lane_seq BETWEEN l.from_seq AND l.to_seq AND ${entryOfLease(s, sql`l.slot`, sql`l.lane_id`, sql`u.lane_seq`)}
        ORDER BY u.lane_id, u.lane_seq
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lease_from, lower(seqs) AS lane_seq
     ), src AS MATERIALIZED (
       SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, r.attempts + 1 AS attempts,
              r.max_attempts, r.dedupe_key, u.error AS last_error, r.created_at,
              l.claimed_at AS last_attempted_at, r.trace_context, u.delay_ms, r.lane_id, r.lane_seq,
              l.worker, u.outcome, u.detail, u.run_ms,
              (u.permanent OR r.attempts + 1 >= coalesce(r.max_attempts,
                 l.type_max_attempts[array_position(l.types, r.type)])) AS dead
         FROM won w
         JOIN u ON u.slot = w.slot AND u.lane_id = w.lane_id AND u.lane_seq = w.lane_seq
         CROSS JOIN LATERAL (
                SELECT l.claimed_at, l.worker, l.types, l.type_max_attempts FROM ${s}.range_leases l
                 WHERE l.slot = w.slot AND l.lane_id = w.lane_id AND l.from_seq = w.lease_from
                 LIMIT 1) l
         JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
     ), ${settleAndMove(s, sql`now() + make_interval(secs => delay_ms / 1000.0)`)}, hist AS (${perTaskHistory(
       s,
       sql`SELECT id, outcome, lane_id, type, worker, last_attempted_at AS claimed_at, attempts AS attempt, created_at,
               run_ms, detail AS error, NULL::jsonb AS cursor, dead FROM src`,
     )})
     SELECT lane_id, lane_seq::text AS lane_seq, dead FROM src`,
    `berth-fail:${name}`,
  );
}
