import type { Queryable, Schema } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import type { AttemptRef } from './attempt.js';
import { perTaskHistory, runMsValue } from './history.js';
import { entryArgs, settleAndMove, settleOneEntry } from './settle-tail.js';
import type { Storage } from './storage.js';

export interface SnoozeResult {
  /** False when the fence refused: the lease was already settled (a cancel, rescue) or taken over. */
  wrote: boolean;
  /** The task's snoozes so far, this one included. */
  snoozes: number;
  /** True when this snooze was within `maxSnoozes`: the claim's attempt was given back. */
  refunded: boolean;
  /** True when a snooze past `maxSnoozes` on the final attempt retired the task to the dead letters. */
  dead: boolean;
}

/**
 * Snooze: settle the lease as `snoozed` (fenced on the token, like every settlement) and defer
 * the task to `now() + delayMs` with its payload and last error kept, in one statement. The
 * task's count in `snoozes` goes up by one in the same statement. Within `maxSnoozes` the
 * attempt the claim burnt is given back (the snooze does not consume an attempt); past it the
 * attempt is kept, so the attempt limit bounds the task again and it dead-letters on its final
 * attempt with `finalError` (seed 000: a refund without a bound would make a task immortal).
 * Attempt history gets the run as outcome `snoozed` (its handler's `runMs`), in the same
 * statement, as every other settlement writes its own.
 */
export async function snoozeLease(
  write: Queryable,
  storage: Storage,
  ref: AttemptRef,
  delayMs: number,
  maxSnoozes: number,
  finalError: string,
  runMs: number | null = null,
): Promise<SnoozeResult> {
  const res = await write.query<{ wrote: boolean; snoozes: number | null; refunded: boolean; dead: boolean }>(
    storage.statement('snooze', snoozeStatement).query({
      ...entryArgs(ref),
      delayMs: Math.max(0, delayMs),
      maxSnoozes,
      finalError,
      runMs: runMsValue(runMs),
    }),
  );
  const row = res.rows[0]!;
  return { wrote: row.wrote, snoozes: row.snoozes ?? 0, refunded: row.refunded, dead: row.dead };
}

/**
 * Retention of snooze counts (the leader's retention branch): a count is kept while its task is
 * pending (deferred, or a ready entry neither tombstoned nor settled) and dropped otherwise. The
 * hour of slack keeps a count whose task is between two rows (a promotion or settlement commits
 * both rows at once, so this is slack, not a fence).
 */
function snoozeStatement({ q: s }: Schema) {
  const within = sql`c.snoozes <= ${p('maxSnoozes')}`;
  return compile(
    sql`WITH ${settleOneEntry(s, sql`'snoozed'`)}, counted AS (
       INSERT INTO ${s}.snoozes AS z (id, snoozes) SELECT x.id, 1 FROM lease x
       ON CONFLICT (id) DO UPDATE SET snoozes = z.snoozes + 1, last_snoozed_at = now()
       RETURNING z.id, z.snoozes
     ), src AS MATERIALIZED (
       SELECT x.id, x.type, x.payload, x.queue, x.priority, x.shard,
              CASE WHEN ${within} THEN x.attempt - 1 ELSE x.attempt END AS attempts,
              x.task_max_attempts AS max_attempts, x.dedupe_key,
              CASE WHEN NOT ${within} AND x.attempt >= x.max_attempts THEN ${p('finalError')} ELSE x.last_error END AS last_error,
              x.created_at, x.claimed_at AS last_attempted_at, x.trace_context,
              (NOT ${within} AND x.attempt >= x.max_attempts) AS dead,
              c.snoozes, ${within} AS refunded, x.attempt AS attempt_no, x.lane_id, x.worker
         FROM lease x JOIN counted c ON c.id = x.id
     ), ${settleAndMove(s, sql`now() + make_interval(secs => ${p('delayMs')}::float8 / 1000.0)`)}, hist AS (${perTaskHistory(
       s,
       // The attempt number the run had, refunded or not: history shows the run as it was.
       sql`SELECT id, 'snoozed' AS outcome, lane_id, type, worker, last_attempted_at AS claimed_at,
               attempt_no AS attempt, created_at, ${p('runMs')}::integer AS run_ms,
               CASE WHEN dead THEN jsonb_build_object('message', last_error) END AS error, NULL::jsonb AS cursor, dead
          FROM src`,
     )})
     SELECT EXISTS (SELECT 1 FROM won) AS wrote, (SELECT snoozes FROM src) AS snoozes,
            coalesce((SELECT refunded FROM src), false) AS refunded,
            coalesce((SELECT dead FROM src), false) AS dead`,
  );
}

export async function pruneSnoozeCounts(db: Queryable, storage: Storage, limit = 5000): Promise<number> {
  const res = await db.query(storage.statement('prune-snoozes', pruneSnoozesStatement).query({ limit }));
  return res.rowCount ?? 0;
}

function pruneSnoozesStatement({ q: s }: Schema) {
  return compile(
    sql`DELETE FROM ${s}.snoozes z
      WHERE z.id IN (
        SELECT y.id FROM ${s}.snoozes y
         WHERE y.last_snoozed_at < now() - interval '1 hour'
           AND NOT EXISTS (SELECT 1 FROM ${s}.deferred d WHERE d.id = y.id)
           AND NOT EXISTS (SELECT 1 FROM ${s}.ready r
                            WHERE r.id = y.id
                              AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                                               WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
                              AND NOT EXISTS (SELECT 1 FROM ${s}.leased_entries le
                                               WHERE le.id = r.id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq
                                                 AND le.slot = r.slot AND le.outcome IS NOT NULL))
         LIMIT ${p('limit')})`,
  );
}
