import type { Queryable, Schema } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import { perTaskHistory, runMsValue } from './history.js';
import type { AttemptRef } from './attempt.js';
import { entryArgs, settleAndMove, settleOneEntry } from './settle-tail.js';
import type { Storage } from './storage.js';

export interface ReturnResult {
  /** False when the fence refused: the lease was already settled or taken over. */
  wrote: boolean;
  /** True when the task was on its final attempt and went to the dead letters. */
  dead: boolean;
}

/**
 * Hand a leased task back, due now, without a failure: either a cursor advance (new payload,
 * attempts reset, last_error cleared) or a release (payload and burnt attempt kept). Both settle
 * the attempt in the same statement, fenced on the token like every settlement (see complete.ts).
 * A release on the final attempt retires the task to the dead letters and stamps `finalError`,
 * the only explanation it will carry. Zero-row matches are reported, not raised: a lapsed lease
 * needs no releasing.
 *
 * The task goes to deferred storage (due now) rather than straight into its lane, so this
 * statement never waits on a busy lane's lock; promotion moves it within one tick.
 */
async function returnLease(
  write: Queryable,
  storage: Storage,
  ref: AttemptRef,
  mode: 'advanced' | 'released' | 'unstarted',
  payload: unknown,
  finalError: string | null,
  history: ReleaseHistory,
  delayMs = 0,
): Promise<ReturnResult> {
  const res = await write.query<{ wrote: boolean; dead: boolean }>(
    storage.statement('return', returnStatement).query({
      ...entryArgs(ref),
      mode,
      payload: mode === 'advanced' ? JSON.stringify(payload ?? null) : null,
      finalError,
      delayMs,
      outcome: history.outcome,
      runMs: runMsValue(history.runMs),
    }),
  );
  const row = res.rows[0]!;
  return { wrote: row.wrote, dead: row.dead };
}

function returnStatement({ q: s }: Schema) {
  const mode = p('mode');
  const cursor = sql`${p('payload')}::jsonb`;
  return compile(
    sql`WITH ${settleOneEntry(s, sql`${mode}`)}, src AS MATERIALIZED (
       SELECT x.id, x.type,
              CASE WHEN ${mode} = 'advanced' THEN ${cursor} ELSE x.payload END AS payload,
              x.queue, x.priority, x.shard,
              CASE WHEN ${mode} = 'advanced' THEN 0 WHEN ${mode} = 'unstarted' THEN x.attempt - 1
                   ELSE x.attempt END AS attempts,
              x.task_max_attempts AS max_attempts, x.dedupe_key,
              CASE WHEN ${mode} = 'advanced' THEN NULL
                   WHEN ${mode} = 'unstarted' THEN coalesce(${p('finalError')}, x.last_error)
                   WHEN x.attempt >= x.max_attempts THEN coalesce(${p('finalError')}, x.last_error)
                   ELSE x.last_error END AS last_error,
              x.created_at, x.claimed_at AS last_attempted_at, x.trace_context,
              (${mode} = 'released' AND x.attempt >= x.max_attempts) AS dead,
              x.attempt AS attempt_no, x.lane_id, x.worker
         FROM lease x
     ), ${settleAndMove(s, sql`now() + make_interval(secs => ${p('delayMs')}::float8 / 1000.0)`)}, hist AS (${perTaskHistory(
       s,
       // A hand-back of a task that never started is no attempt (its attempt is refunded).
       sql`SELECT id, CASE WHEN ${mode} = 'advanced' THEN 'continued' ELSE ${p('outcome')} END AS outcome, lane_id, type, worker,
               last_attempted_at AS claimed_at, attempt_no AS attempt, created_at, ${p('runMs')}::integer AS run_ms,
               CASE WHEN dead THEN jsonb_build_object('message', last_error) END AS error,
               CASE WHEN ${mode} = 'advanced' THEN ${cursor} END AS cursor, dead
          FROM src WHERE ${mode} <> 'unstarted'`,
     )})
     SELECT EXISTS (SELECT 1 FROM src) AS wrote, coalesce((SELECT bool_or(dead) FROM src), false) AS dead`,
  );
}

/** AdvanceCursor: commit slice progress. Resolves false when the lease was lost. */
export async function advanceCursor(
  write: Queryable,
  storage: Storage,
  ref: AttemptRef,
  payload: unknown,
): Promise<boolean> {
  return (await returnLease(write, storage, ref, 'advanced', payload, null, NO_HISTORY)).wrote;
}

/**
 * Hand back a task whose handler never started: the attempt its claim counted is refunded
 * (nothing ran, so nothing was interrupted) and it never dead-letters. Due now, or after
 * `delayMs` with `note` as its last_error (a type this worker cannot run: docs/architecture.md,
 * "Routing").
 */
export async function returnUnstarted(
  write: Queryable,
  storage: Storage,
  ref: AttemptRef,
  away?: { delayMs: number; note: string | null },
): Promise<ReturnResult> {
  return returnLease(write, storage, ref, 'unstarted', null, away?.note ?? null, NO_HISTORY, away?.delayMs ?? 0);
}

/**
 * Release: give the task back due now with its burnt attempt kept. `history` is what attempt
 * history records: `continued` (a slice that did not advance), `cancelled` (stop interrupted it)
 * or `timeout` (it was past its deadline).
 */
export function releaseLease(
  write: Queryable,
  storage: Storage,
  ref: AttemptRef,
  finalError: string,
  history: ReleaseHistory = { outcome: 'continued' },
): Promise<ReturnResult> {
  return returnLease(write, storage, ref, 'released', null, finalError, history);
}

/** What attempt history records for a release. */
export interface ReleaseHistory {
  outcome: 'continued' | 'cancelled' | 'timeout';
  /** The handler's run time, ms. */
  runMs?: number | null;
}

/** AdvanceCursor records `continued` with its cursor; a hand-back records nothing. */
const NO_HISTORY: ReleaseHistory = { outcome: 'continued' };
