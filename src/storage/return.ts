import { bindSchema, type Queryable, type SchemaRef } from '../sql.js';
import type { LeaseRef } from './lease.js';
import { settleAndMove } from './settle-tail.js';

export interface ReturnResult {
  /** False when the fence refused: the lease was already settled or taken over. */
  wrote: boolean;
  /** True when the task was on its final attempt and went to the dead letters. */
  dead: boolean;
}

/**
 * Hand a leased task back, due now, without a failure: either a cursor advance (new payload,
 * attempts reset, last_error cleared) or a release (payload and burnt attempt kept). Both clear
 * the lease in the same statement, fenced on the token like every settlement (see complete.ts).
 * A release on the final attempt retires the task to the dead letters and stamps `finalError`,
 * the only explanation it will carry. Zero-row matches are reported, not raised: a lapsed lease
 * needs no releasing.
 *
 * The task goes to deferred storage (due now) rather than straight into its lane, so this
 * statement never waits on a busy lane's lock; promotion moves it within one tick.
 */
async function returnLease(
  write: Queryable,
  schema: SchemaRef,
  ref: LeaseRef,
  mode: 'advanced' | 'released' | 'unstarted',
  payload: unknown,
  finalError: string | null,
): Promise<ReturnResult> {
  const { q: s } = bindSchema(schema);
  const res = await write.query<{ wrote: boolean; dead: boolean }>(
    `WITH won AS (
       INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
       SELECT l.slot, l.lane_id, l.from_seq, int8multirange(int8range($3::bigint, $3::bigint + 1)), 1, $5
         FROM ${s}.range_leases l
        WHERE l.slot = $1 AND l.lane_id = $2 AND l.from_seq = $8 AND l.token = $4::uuid
          AND $3::bigint BETWEEN l.from_seq AND l.to_seq
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lease_from
     ), lease AS (
       SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, r.attempts + 1 AS attempt,
              coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]) AS max_attempts,
              r.max_attempts AS task_max_attempts, r.dedupe_key, r.last_error, r.created_at, l.claimed_at,
              r.trace_context
         FROM won w
         JOIN ${s}.range_leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.from_seq = w.lease_from
         JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = $3::bigint
     ), src AS MATERIALIZED (
       SELECT x.id, x.type,
              CASE WHEN $5 = 'advanced' THEN $6::jsonb ELSE x.payload END AS payload,
              x.queue, x.priority, x.shard,
              CASE WHEN $5 = 'advanced' THEN 0 WHEN $5 = 'unstarted' THEN x.attempt - 1
                   ELSE x.attempt END AS attempts,
              x.task_max_attempts AS max_attempts, x.dedupe_key,
              CASE WHEN $5 = 'advanced' THEN NULL
                   WHEN x.attempt >= x.max_attempts THEN coalesce($7, x.last_error)
                   ELSE x.last_error END AS last_error,
              x.created_at, x.claimed_at AS last_attempted_at, x.trace_context,
              ($5 = 'released' AND x.attempt >= x.max_attempts) AS dead
         FROM lease x
     ), ${settleAndMove(s, 'now()')}
     SELECT EXISTS (SELECT 1 FROM src) AS wrote, coalesce((SELECT bool_or(dead) FROM src), false) AS dead`,
    [
      ref.slot,
      ref.laneId,
      ref.laneSeq,
      ref.token,
      mode,
      mode === 'advanced' ? JSON.stringify(payload ?? null) : null,
      finalError,
      ref.leaseFrom,
    ],
  );
  const row = res.rows[0]!;
  return { wrote: row.wrote, dead: row.dead };
}

/** AdvanceCursor: commit slice progress. Resolves false when the lease was lost. */
export async function advanceCursor(
  write: Queryable,
  schema: SchemaRef,
  ref: LeaseRef,
  payload: unknown,
): Promise<boolean> {
  return (await returnLease(write, schema, ref, 'advanced', payload, null)).wrote;
}

/**
 * Hand back a prefetched task whose handler never started: the attempt its claim counted is
 * refunded (nothing ran, so nothing was interrupted) and it never dead-letters.
 */
export async function returnUnstarted(write: Queryable, schema: SchemaRef, ref: LeaseRef): Promise<ReturnResult> {
  return returnLease(write, schema, ref, 'unstarted', null, null);
}

/** Release: give the task back due now with its burnt attempt kept. */
export function releaseLease(
  write: Queryable,
  schema: SchemaRef,
  ref: LeaseRef,
  finalError: string,
): Promise<ReturnResult> {
  return returnLease(write, schema, ref, 'released', null, finalError);
}
