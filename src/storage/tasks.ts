import type { Lane } from '../lane.js';
import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from './storage.js';
import { taskId } from './ids.js';
import { BerthInputError, notMigrated } from '../errors.js';
import { checkKeys } from '../limits.js';
import { executorFor, explainPreparedStatementError, isPreparedStatementsOption } from '../db/prepared.js';
import { resultOf } from './results.js';
import { cancelDetail, OPERATOR_CANCEL_ROW } from './cancel-record.js';
import { dependenciesIn, type TaskDependencies } from './dependency-view.js';
import type { TaskState } from './task-state.js';

export type { TaskState } from './task-state.js';

/** A task as storage holds it now; its lane fields say where it lives. */
export interface TaskRecord extends Lane {
  id: string;
  type: string;
  state: TaskState;
  payload: unknown;
  attempts: number;
  /** null: not set on the task; its type's setting applies at claim (default 20). */
  maxAttempts: number | null;
  dedupeKey: string | null;
  lastError: string | null;
  createdAt: Date;
  runAt: Date | null;
  lease: { token: string; expiresAt: Date; worker: string | null; attempt: number } | null;
  /**
   * `queue`: read from the queue's own storage. `history`: the task is gone from it (a completed
   * task whose ring segment was reclaimed, a purged dead letter, a cancelled task) and this is its
   * last attempt in attempt history, which keeps no payload (`payload` is null, `maxAttempts` and
   * `dedupeKey` unknown).
   */
  source: 'queue' | 'history';
  /** When it completed, died or was cancelled, when that is known. */
  finishedAt?: Date;
  /**
   * What the handler of its completed attempt returned (a JSON value), or null: the task has not
   * completed, its handler returned nothing (or null, or one of berth's answers), or the result
   * was older than the leader's `resultRetentionMs`.
   */
  result: unknown;
  /** State `cancelled` only: who cancelled it (null when the cancel named nobody) and when. */
  cancelled?: { actor: string | null; at: Date };
  /**
   * Its parents (the tasks it depends on) and dependents, with their states, and what it waits
   * for while `waiting`; null for a task enqueued without `dependsOn` that nothing depends on.
   */
  dependencies: TaskDependencies | null;
}

/** A task's record without its dependencies: what the reads that only need its state take. */
export type TaskCore = Omit<TaskRecord, 'dependencies'>;

/**
 * Point read by id. Looks in deferred storage, the dead letters and the ready ring; in the ring
 * it returns only the entry that still stands for the task (never a tombstoned one, never one
 * whose attempt has moved on), so a task that was moved or retried reads as its current row.
 */
export async function getTask(
  db: Queryable,
  schema: string,
  id: string,
  options: GetTaskOptions = {},
): Promise<TaskRecord | null> {
  const storage = storageFor(schema);
  taskId(id);
  if (typeof options !== 'object' || options === null) throw new BerthInputError('getTask options must be an object');
  checkKeys(options, GET_TASK_OPTION_KEYS, 'getTask options');
  if (!isPreparedStatementsOption(options.preparedStatements))
    throw new BerthInputError(
      `preparedStatements must be true or false, got ${JSON.stringify(options.preparedStatements)}`,
    );
  return getTaskIn(executorFor(db, options.preparedStatements), storage, id).catch((err: unknown) => {
    throw explainPreparedStatementError(notMigrated(err, schema));
  });
}

/** `getTask`'s options. */
export interface GetTaskOptions {
  /**
   * false: the read sends its statements unnamed, for a transaction-mode pooler without
   * prepared-statement support (see `enqueue`'s option of the same name). Default true.
   */
  preparedStatements?: boolean;
}

const GET_TASK_OPTION_KEYS: ReadonlySet<string> = new Set<keyof GetTaskOptions>(['preparedStatements']);

/** getTask on a bound storage. */
export async function getTaskIn(db: Queryable, storage: Storage, id: string): Promise<TaskRecord | null> {
  const task = await readTaskIn(db, storage, id);
  if (!task) return null;
  const stateOf = async (other: string) => (await readTaskIn(db, storage, other))?.state ?? null;
  return { ...task, dependencies: await dependenciesIn(db, storage, id, task.state, stateOf) };
}

/** A task's record without its dependencies (one statement less): for reads that only need its state. */
export async function readTaskIn(db: Queryable, storage: Storage, id: string): Promise<TaskCore | null> {
  const res = await db.query<{
    id: string;
    type: string;
    state: TaskState;
    payload: unknown;
    queue: string;
    priority: number;
    shard: number;
    attempts: number;
    max_attempts: number | null;
    dedupe_key: string | null;
    last_error: string | null;
    created_at: Date;
    run_at: Date | null;
    token: string | null;
    expires_at: Date | null;
    worker: string | null;
  }>(
    storage
      .statement('get-task', ({ q: s }) =>
        positional(
          `SELECT id::text, type, state, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
            last_error, created_at,
            -- A held task waits for its key, a waiting one for its parents, not for a time (their
            -- run_at is 'infinity').
            CASE WHEN state IN ('held', 'waiting') THEN NULL ELSE run_at END AS run_at,
            NULL AS token, NULL::timestamptz AS expires_at, NULL AS worker
       FROM ${s}.deferred WHERE id = $1
     UNION ALL
     SELECT id::text, type, 'dead', payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
            last_error, created_at, NULL, NULL, NULL, NULL
       FROM ${s}.dead_letters WHERE id = $1
     UNION ALL
     (SELECT r.id::text, r.type,
             CASE WHEN l.outcome = 'completed' THEN 'completed'
                  WHEN l.lane_seq IS NOT NULL THEN 'running' ELSE 'ready' END,
             r.payload, r.queue, r.priority, r.shard, coalesce(l.attempt, r.attempts), coalesce(l.max_attempts, r.max_attempts),
             r.dedupe_key, r.last_error, r.created_at, r.run_at, l.token::text, l.expires_at, l.worker
        FROM ${s}.ready r
        LEFT JOIN LATERAL (SELECT * FROM ${s}.leased_entries le
                            WHERE le.id = r.id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq
                              AND le.slot = r.slot) l ON true
       WHERE r.id = $1
         AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                          WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
         AND (l.outcome IS NULL OR l.outcome = 'completed')
       ORDER BY r.appended_at DESC
       LIMIT 1)`,
          ['id'],
        ),
      )
      .query({ id }),
  );
  const row = res.rows[0];
  if (!row) return fromHistory(db, storage, id);
  return {
    id: row.id,
    type: row.type,
    state: row.state,
    payload: row.payload,
    queue: row.queue,
    priority: row.priority,
    shard: row.shard,
    attempts: row.attempts,
    maxAttempts: row.max_attempts,
    dedupeKey: row.dedupe_key,
    lastError: row.last_error,
    createdAt: row.created_at,
    runAt: row.run_at,
    lease: row.token
      ? { token: row.token, expiresAt: row.expires_at!, worker: row.worker, attempt: row.attempts }
      : null,
    source: 'queue',
    // A second point read, only for a completed task: the statement above stays as it was.
    result: row.state === 'completed' ? await storedResult(db, storage, id) : null,
  };
}

/** A stored result, or null when none is. */
async function storedResult(db: Queryable, storage: Storage, id: string): Promise<unknown> {
  const result = await resultOf(db, storage, id);
  return result === undefined ? null : result;
}

/**
 * A task the queue's storage no longer holds, from its last attempt in attempt history: a
 * success (completed), an attempt that retired it (dead, the dead letter since purged), or a
 * cancel (cancelled, whether it was running or pending: `cancel_tasks()` records both). A task
 * removed any other way (deleted, or its last attempt a failure or a run its worker's stop
 * interrupted, recorded `cancelled` but no cancel) is not found. An operator's cancel row is
 * preferred whatever its time: a cancelled task never runs again, so it is the last word even
 * when a failure it waited for carries a later transaction time. One probe of the history's
 * `bucket` index.
 */
async function fromHistory(db: Queryable, storage: Storage, id: string): Promise<TaskCore | null> {
  const res = await db.query<{
    type: string;
    outcome: string;
    cancel: boolean;
    dead: boolean;
    queue: string;
    priority: number;
    shard: number;
    attempt: number;
    created_at: Date;
    settled_at: Date;
    error: { message?: string } | null;
  }>(
    storage
      .statement('task-from-history', ({ q: s }) =>
        positional(
          `SELECT h.type, h.outcome, ${OPERATOR_CANCEL_ROW} IS TRUE AS cancel, h.dead, ln.queue, ln.priority, ln.shard, x.attempt, x.created_at, h.settled_at, h.error
       FROM ${s}.attempt_history h
       JOIN ${s}.lanes ln ON ln.lane_id = h.lane_id
      CROSS JOIN LATERAL unnest(h.ids, h.attempts, h.created_at) AS x(id, attempt, created_at)
      WHERE h.bucket = $1::bigint >> 10 AND $1::bigint = ANY (h.ids) AND x.id = $1::bigint
      ORDER BY ${OPERATOR_CANCEL_ROW} IS TRUE DESC, h.settled_at DESC LIMIT 1`,
          ['id'],
        ),
      )
      .query({ id }),
  );
  const h = res.rows[0];
  if (!h) return null;
  const state = h.outcome === 'success' ? 'completed' : h.cancel ? 'cancelled' : h.dead ? 'dead' : null;
  if (state === null) return null;
  return {
    id,
    type: h.type,
    state,
    payload: null,
    queue: h.queue,
    priority: h.priority,
    shard: h.shard,
    attempts: h.attempt,
    maxAttempts: null,
    dedupeKey: null,
    lastError: state === 'dead' ? (h.error?.message ?? null) : null,
    createdAt: h.created_at,
    runAt: null,
    lease: null,
    source: 'history',
    finishedAt: h.settled_at,
    result: h.outcome === 'success' ? await storedResult(db, storage, id) : null,
    ...(state === 'cancelled' ? { cancelled: { actor: cancelDetail(h.error).actor, at: h.settled_at } } : {}),
  };
}
