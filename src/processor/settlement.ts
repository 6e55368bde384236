import { LeaseLostError } from '../errors.js';
import { BerthInputError } from '../errors.js';
import { quoteIdent, readCommittedOnly, READ_COMMITTED_REQUIRED, type Queryable } from '../sql.js';
import type { LeaseRef } from './claim.js';

/**
 * Every write about a leased task is fenced on its token. The fence's arbiter is the
 * settlements primary key: the first writer to insert a settlement for a lease (this worker's
 * completion, a failure, a release, a cursor advance, or the rescue of a lapsed lease) wins,
 * and everyone after it matches nothing. Writes never update or delete a ready entry.
 */

export function leaseKey(ref: Pick<LeaseRef, 'laneId' | 'laneSeq'>): string {
  return `${ref.laneId}:${ref.laneSeq}`;
}

/** Columns shared by the statements below that move a settled entry somewhere else. */
const MOVE_COLUMNS = `id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
  last_error, created_at, last_attempted_at`;

/**
 * Dequeue, batched: settle leases as completed. Returns the keys that were settled; a lease not
 * returned was refused (token no longer owns it). Also frees each completed task's dedupe key.
 *
 * One statement per ring slot in the batch (almost always one), naming the slot's partitions
 * directly: measured ~30 % cheaper per row than going through the partitioned parents (no tuple
 * routing, no run-time pruning per probe). The slot comes from the claim, so the partition
 * constraint holds by construction.
 */
export async function completeLeases(
  write: Queryable,
  schema: string,
  refs: readonly (LeaseRef & { dedupeKey?: string | null })[],
): Promise<Set<string>> {
  const bySlot = new Map<number, (LeaseRef & { dedupeKey?: string | null })[]>();
  for (const r of refs) {
    let g = bySlot.get(r.slot);
    if (!g) bySlot.set(r.slot, (g = []));
    g.push(r);
  }
  const settled = new Set<string>();
  for (const [slot, group] of bySlot) {
    for (const key of await completeInSlot(write, schema, slot, group)) settled.add(key);
  }
  return settled;
}

async function completeInSlot(
  write: Queryable,
  schema: string,
  slot: number,
  refs: readonly (LeaseRef & { dedupeKey?: string | null })[],
): Promise<string[]> {
  const s = quoteIdent(schema);
  const leases = `${s}.${quoteIdent(`leases_${slot}`)}`;
  const settlements = `${s}.${quoteIdent(`settlements_${slot}`)}`;
  const res = await write.query<{ lane_id: number; lane_seq: string }>({
    name: `berth-complete:${schema}:${slot}`,
    text: `WITH u AS (
       SELECT * FROM unnest($1::integer[], $2::bigint[], $3::uuid[]) AS u(lane_id, lane_seq, token)
     ), won AS (
       INSERT INTO ${settlements} (slot, lane_id, lane_seq, id, outcome)
       SELECT l.slot, l.lane_id, l.lane_seq, l.id, 'completed'
         FROM u JOIN ${leases} l
           ON l.lane_id = u.lane_id AND l.lane_seq = u.lane_seq AND l.token = u.token
       ON CONFLICT DO NOTHING
       RETURNING lane_id, lane_seq, id
     ), freed AS (
       -- By key, and only for tasks that have one: most batches probe nothing here.
       DELETE FROM ${s}.dedupe d
        WHERE d.dedupe_key = ANY ($4::text[]) AND d.id IN (SELECT won.id FROM won)
     )
     SELECT lane_id, lane_seq::text AS lane_seq FROM won`,
    values: [
      refs.map((r) => r.laneId),
      refs.map((r) => r.laneSeq),
      refs.map((r) => r.token),
      refs.flatMap((r) => (r.dedupeKey ? [r.dedupeKey] : [])),
    ],
  });
  return res.rows.map((r) => leaseKey({ laneId: r.lane_id, laneSeq: r.lane_seq }));
}

export interface FailureInput {
  ref: LeaseRef;
  error: string;
  /** Backoff before the retry, applied on the database clock. */
  delayMs: number;
  /** Dead-letter now, whatever attempts remain. */
  permanent: boolean;
}

/**
 * RecordFailure, batched: settle as failed, store last_error, and move the task to deferred
 * storage (retryable at now() + backoff, lease cleared) or, out of attempts, to the dead
 * letters. Returns key -> 'retry' | 'dead'; a missing key was refused.
 */
export async function recordFailures(
  write: Queryable,
  schema: string,
  items: readonly FailureInput[],
): Promise<Map<string, 'retry' | 'dead'>> {
  if (items.length === 0) return new Map();
  const s = quoteIdent(schema);
  const res = await write.query<{ lane_id: number; lane_seq: string; dead: boolean }>({
    name: `berth-fail:${schema}`,
    text: `WITH u AS (
       SELECT * FROM unnest($1::smallint[], $2::integer[], $3::bigint[], $4::uuid[], $5::text[],
                            $6::float8[], $7::boolean[])
         AS u(slot, lane_id, lane_seq, token, error, delay_ms, permanent)
     ), won AS (
       INSERT INTO ${s}.settlements (slot, lane_id, lane_seq, id, outcome)
       SELECT l.slot, l.lane_id, l.lane_seq, l.id, 'failed'
         FROM u JOIN ${s}.leases l
           ON l.lane_id = u.lane_id AND l.lane_seq = u.lane_seq AND l.slot = u.slot AND l.token = u.token
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lane_seq
     ), src AS MATERIALIZED (
       SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, l.attempt AS attempts,
              r.max_attempts, r.dedupe_key, u.error AS last_error, r.created_at,
              l.claimed_at AS last_attempted_at, u.delay_ms, r.lane_id, r.lane_seq,
              (u.permanent OR l.attempt >= l.max_attempts) AS dead
         FROM won w
         JOIN u ON u.slot = w.slot AND u.lane_id = w.lane_id AND u.lane_seq = w.lane_seq
         JOIN ${s}.leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.lane_seq = w.lane_seq
         JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
     ), buried AS (
       INSERT INTO ${s}.dead_letters (${MOVE_COLUMNS})
       SELECT ${MOVE_COLUMNS} FROM src WHERE dead
       ON CONFLICT (id) DO UPDATE SET
         payload = EXCLUDED.payload, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
         last_attempted_at = EXCLUDED.last_attempted_at, died_at = now()
       RETURNING id
     ), retried AS (
       INSERT INTO ${s}.deferred (state, run_at, ${MOVE_COLUMNS})
       SELECT 'retryable', now() + make_interval(secs => delay_ms / 1000.0), ${MOVE_COLUMNS}
         FROM src WHERE NOT dead
       -- A task already deferred (it can only be a duplicate copy) must not fail the batch.
       ON CONFLICT (id) DO NOTHING
     ), freed AS (
       DELETE FROM ${s}.dedupe d USING buried WHERE d.id = buried.id
     )
     SELECT lane_id, lane_seq::text AS lane_seq, dead FROM src`,
    values: [
      items.map((i) => i.ref.slot),
      items.map((i) => i.ref.laneId),
      items.map((i) => i.ref.laneSeq),
      items.map((i) => i.ref.token),
      items.map((i) => i.error),
      items.map((i) => Math.max(0, i.delayMs)),
      items.map((i) => i.permanent),
    ],
  });
  return new Map(res.rows.map((r) => [leaseKey({ laneId: r.lane_id, laneSeq: r.lane_seq }), r.dead ? 'dead' : 'retry']));
}

export interface ReturnResult {
  /** False when the fence refused: the lease was already settled or taken over. */
  wrote: boolean;
  /** True when the task was on its final attempt and went to the dead letters. */
  dead: boolean;
}

/**
 * Hand a leased task back, due now, without a failure: either a cursor advance (new payload,
 * attempts reset, last_error cleared) or a release (payload and burnt attempt kept). Both clear
 * the lease in the same statement. A release on the final attempt retires the task to the dead
 * letters and stamps `finalError`, the only explanation it will carry. Zero-row matches are
 * reported, not raised: a lapsed lease needs no releasing.
 *
 * The task goes to deferred storage (due now) rather than straight into its lane, so this
 * statement never waits on a busy lane's lock; promotion moves it within one tick.
 */
async function returnLease(
  write: Queryable,
  schema: string,
  ref: LeaseRef,
  mode: 'advanced' | 'released' | 'unstarted',
  payload: unknown,
  finalError: string | null,
): Promise<ReturnResult> {
  const s = quoteIdent(schema);
  const res = await write.query<{ wrote: boolean; dead: boolean }>(
    `WITH won AS (
       INSERT INTO ${s}.settlements (slot, lane_id, lane_seq, id, outcome)
       SELECT l.slot, l.lane_id, l.lane_seq, l.id, $5
         FROM ${s}.leases l
        WHERE l.slot = $1 AND l.lane_id = $2 AND l.lane_seq = $3 AND l.token = $4::uuid
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lane_seq
     ), src AS MATERIALIZED (
       SELECT r.id, r.type,
              CASE WHEN $5 = 'advanced' THEN $6::jsonb ELSE r.payload END AS payload,
              r.queue, r.priority, r.shard,
              CASE WHEN $5 = 'advanced' THEN 0 WHEN $5 = 'unstarted' THEN l.attempt - 1
                   ELSE l.attempt END AS attempts,
              r.max_attempts, r.dedupe_key,
              CASE WHEN $5 = 'advanced' THEN NULL
                   WHEN l.attempt >= l.max_attempts THEN coalesce($7, r.last_error)
                   ELSE r.last_error END AS last_error,
              r.created_at, l.claimed_at AS last_attempted_at,
              ($5 = 'released' AND l.attempt >= l.max_attempts) AS dead
         FROM won w
         JOIN ${s}.leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.lane_seq = w.lane_seq
         JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
     ), buried AS (
       INSERT INTO ${s}.dead_letters (${MOVE_COLUMNS})
       SELECT ${MOVE_COLUMNS} FROM src WHERE dead
       ON CONFLICT (id) DO UPDATE SET
         payload = EXCLUDED.payload, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
         last_attempted_at = EXCLUDED.last_attempted_at, died_at = now()
       RETURNING id
     ), returned AS (
       INSERT INTO ${s}.deferred (state, run_at, ${MOVE_COLUMNS})
       SELECT 'retryable', now(), ${MOVE_COLUMNS} FROM src WHERE NOT dead
       ON CONFLICT (id) DO NOTHING
     ), freed AS (
       DELETE FROM ${s}.dedupe d USING buried WHERE d.id = buried.id
     )
     SELECT EXISTS (SELECT 1 FROM src) AS wrote, coalesce((SELECT bool_or(dead) FROM src), false) AS dead`,
    [ref.slot, ref.laneId, ref.laneSeq, ref.token, mode, mode === 'advanced' ? JSON.stringify(payload ?? null) : null, finalError],
  );
  const row = res.rows[0]!;
  return { wrote: row.wrote, dead: row.dead };
}

/** AdvanceCursor: commit slice progress. Resolves false when the lease was lost. */
export async function advanceCursor(write: Queryable, schema: string, ref: LeaseRef, payload: unknown): Promise<boolean> {
  return (await returnLease(write, schema, ref, 'advanced', payload, null)).wrote;
}

/**
 * Hand back a prefetched task whose handler never started: the attempt its claim counted is
 * refunded (nothing ran, so nothing was interrupted) and it never dead-letters.
 */
export async function returnUnstarted(write: Queryable, schema: string, ref: LeaseRef): Promise<ReturnResult> {
  return returnLease(write, schema, ref, 'unstarted', null, null);
}

/** Release: give the task back due now with its burnt attempt kept. */
export function releaseLease(
  write: Queryable,
  schema: string,
  ref: LeaseRef,
  finalError: string,
): Promise<ReturnResult> {
  return returnLease(write, schema, ref, 'released', null, finalError);
}

/**
 * Dequeue one task by id. With a lease token: complete that lease, raising LeaseLostError when
 * the token no longer owns it (so the caller's transaction rolls back). With an empty token:
 * remove the task only while it is unleased (the inline-cleanup path: a producer that enqueued
 * and then did the work itself). Runs on the caller's executor.
 */
export async function dequeue(executor: Queryable, schema: string, id: string, token: string): Promise<void> {
  const s = quoteIdent(schema);
  if (token !== '') {
    const res = await executor.query(
      `WITH won AS (
         INSERT INTO ${s}.settlements (slot, lane_id, lane_seq, id, outcome)
         SELECT l.slot, l.lane_id, l.lane_seq, l.id, 'completed'
           FROM ${s}.ready r
           JOIN ${s}.leases l ON l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq AND l.slot = r.slot
          WHERE r.id = $1 AND l.token = $2::uuid
         ON CONFLICT DO NOTHING
         RETURNING id
       ), freed AS (DELETE FROM ${s}.dedupe d USING won WHERE d.id = won.id)
       SELECT 1 FROM won`,
      [id, token],
    );
    if (res.rowCount === 0) throw new LeaseLostError(id, 'Dequeue');
    return;
  }
  const outcome = await removeUnleased(executor, schema, id, 'dequeued');
  if (outcome !== 'removed') throw new LeaseLostError(id, `Dequeue with an empty token (task is ${outcome})`);
}

/**
 * Remove a task that no worker holds: a deferred row is deleted; a ready entry past its lane's
 * claim cursor gets a tombstone (the ring stays append-only). The lane row is locked first so
 * no claim can lease the entry between the check and the tombstone.
 */
export async function removeUnleased(
  executor: Queryable,
  schema: string,
  id: string,
  reason: string,
): Promise<'removed' | 'leased' | 'not_found'> {
  const s = quoteIdent(schema);
  const res = await executor.query<{ outcome: 'removed' | 'leased' | 'not_found' | 'isolation' }>(
    `SELECT ${readCommittedOnly(`${s}.remove_unleased($1::bigint, $2)`)} AS outcome`,
    [id, reason],
  );
  const outcome = res.rows[0]!.outcome;
  if (outcome === 'isolation') throw new BerthInputError(READ_COMMITTED_REQUIRED);
  return outcome;
}

/**
 * Which of these leases already carry a settlement with `outcome`. Only the token's holder
 * writes `completed` or `failed` (rescue writes `rescued`), so after a retried flush such a row
 * is this worker's own write whose commit reply was lost with the connection, not a refusal.
 * Runs only on that retry path, never on the hot path.
 */
export async function settledWith(
  write: Queryable,
  schema: string,
  refs: readonly LeaseRef[],
  outcome: 'completed' | 'failed',
): Promise<Map<string, { dead: boolean }>> {
  if (refs.length === 0) return new Map();
  const s = quoteIdent(schema);
  const res = await write.query<{ lane_id: number; lane_seq: string; dead: boolean }>(
    `SELECT st.lane_id, st.lane_seq::text AS lane_seq,
            EXISTS (SELECT 1 FROM ${s}.dead_letters d WHERE d.id = st.id) AS dead
       FROM unnest($1::smallint[], $2::integer[], $3::bigint[]) AS u(slot, lane_id, lane_seq)
       JOIN ${s}.settlements st ON st.slot = u.slot AND st.lane_id = u.lane_id AND st.lane_seq = u.lane_seq
      WHERE st.outcome = $4`,
    [refs.map((r) => r.slot), refs.map((r) => r.laneId), refs.map((r) => r.laneSeq), outcome],
  );
  return new Map(res.rows.map((r) => [leaseKey({ laneId: r.lane_id, laneSeq: r.lane_seq }), { dead: r.dead }]));
}
