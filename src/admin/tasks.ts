import { checkKeys, checkNameFilter } from '../limits.js';
import { BerthInputError, notMigrated, orNotMigrated } from '../errors.js';
import { type Queryable, queryRingRead } from '../sql.js';
import { compile, p, positional, type Sql, sql } from '../statement.js';
import { laneCursorsJson, unsettledEntriesOf, unsettledRanges } from '../storage/predicates.js';
import { attemptsOf } from '../storage/history.js';
import { readTaskIn, type TaskState } from '../storage/tasks.js';
import { cancelDetail, OPERATOR_CANCEL_ROW } from '../storage/cancel-record.js';
import { storageFor, type Storage } from '../storage/storage.js';
import { retryDeadLettersIn } from './dead.js';
import { taskId } from '../storage/ids.js';
import { deleteDeadLetter, removeUnleased } from '../storage/remove.js';
import { cancelTasks as cancelTaskIds } from '../storage/cancel.js';
import type { BulkProgress } from './dead.js';
import { makeDeferredDueNow } from '../storage/move.js';

export const TASK_STATES: readonly TaskState[] = [
  'ready',
  'running',
  'scheduled',
  'retryable',
  'held',
  'waiting',
  'dead',
  'completed',
  'cancelled',
];

export interface TaskFilter {
  state?: TaskState;
  queue?: string;
  type?: string;
}

const TASK_FILTER_KEYS: ReadonlySet<string> = new Set<keyof TaskFilter>(['state', 'queue', 'type']);

export interface TaskPage {
  /** At most this many (1-500, default 50). */
  limit?: number;
  /** Keyset cursor: the `next` of the previous page (tasks with a smaller id). */
  after?: string;
}

const PAGE_KEYS: ReadonlySet<string> = new Set<keyof TaskPage>(['limit', 'after']);

export interface TaskSummary {
  id: string;
  type: string;
  state: TaskState;
  queue: string;
  priority: number;
  attempts: number;
  maxAttempts: number | null;
  /** First 300 characters of the last error. */
  lastError: string | null;
  createdAt: Date;
  /** When it is (or was) due; null for dead letters. */
  runAt: Date | null;
  /** Completion, death or cancel time, when it has one. */
  finishedAt: Date | null;
  leaseExpiresAt: Date | null;
  worker: string | null;
  /** State `cancelled` only: who cancelled it (null when the cancel named nobody). */
  cancelledBy?: string | null;
}

export interface TaskList {
  tasks: TaskSummary[];
  /** Pass as `after` for the next page; null when this was the last page. */
  next: string | null;
}

export function parseState(value: string): TaskState {
  if (!(TASK_STATES as readonly string[]).includes(value)) {
    throw new BerthInputError(`unknown state "${value}"; expected one of ${TASK_STATES.join(', ')}`);
  }
  return value as TaskState;
}

function pageLimit(limit: number | undefined): number {
  const n = limit ?? 50;
  if (!Number.isInteger(n) || n < 1 || n > 500) throw new BerthInputError('limit must be an integer from 1 to 500');
  return n;
}

function cursorId(after: string | undefined): string | null {
  if (after === undefined || after === '') return null;
  taskId(after, 'page cursor');
  return after;
}

/**
 * Tasks newest first (by id), with keyset pagination: each page is three index scans by id
 * (deferred, dead letters, the ready ring) that stop after `limit` matches, merged. No count:
 * a page costs the same at 100 tasks as at 10 million. Completed tasks are listed from the ring
 * while their segment is retained and from attempt history for its retention; cancelled tasks
 * from attempt history only (their ring entries are settled `cancelled` or tombstoned). A filter
 * that few tasks match makes a scan walk further before it stops, except `running`, `completed`
 * and `cancelled`, which avoid the walk (see `ringPart`, `historyPart`); docs/explain-admin.md
 * has the measured plans.
 */
export async function listTasks(
  db: Queryable,
  schema: string,
  filter: TaskFilter = {},
  page: TaskPage = {},
): Promise<TaskList> {
  try {
    return await listTasksIn(db, storageFor(schema), filter, page);
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

async function listTasksIn(
  db: Queryable,
  storage: Storage,
  filter: TaskFilter = {},
  page: TaskPage = {},
): Promise<TaskList> {
  checkKeys(filter, TASK_FILTER_KEYS, 'listTasks filter');
  checkKeys(page, PAGE_KEYS, 'listTasks page');
  checkNameFilter(filter, 'listTasks filter');
  const limit = pageLimit(page.limit);
  if (filter.state) parseState(filter.state);
  const shape = listShape(filter.state);
  const statement = storage.statement(`admin-list-tasks:${shape}`, ({ q: s }) =>
    compile(
      sql`SELECT DISTINCT ON (id) * FROM (
       (SELECT d.id, d.type, d.state, d.queue, d.priority, d.attempts, d.max_attempts,
               left(d.last_error, 300) AS last_error, d.created_at,
               -- A held task waits for its concurrency key, a waiting one for its parents, not
               -- for a time (run_at 'infinity').
               CASE WHEN d.state IN ('held', 'waiting') THEN NULL ELSE d.run_at END AS run_at,
               NULL::timestamptz AS finished_at, NULL::timestamptz AS lease_expires_at, NULL::text AS worker,
               0 AS pref, NULL::text AS cancel_data
          FROM ${s}.deferred d
         WHERE (${STATE}::text IS NULL OR ${STATE} IN ('scheduled', 'retryable', 'held', 'waiting'))
           AND (${STATE}::text IS NULL OR d.state = ${STATE}) AND (${QUEUE}::text IS NULL OR d.queue = ${QUEUE})
           AND (${TYPE}::text IS NULL OR d.type = ${TYPE}) AND (${AFTER}::bigint IS NULL OR d.id < ${AFTER})
         ORDER BY d.id DESC LIMIT ${LIMIT})
       UNION ALL
       (SELECT d.id, d.type, 'dead', d.queue, d.priority, d.attempts, d.max_attempts,
               left(d.last_error, 300), d.created_at, NULL, d.died_at, NULL, NULL, 0, NULL
          FROM ${s}.dead_letters d
         WHERE (${STATE}::text IS NULL OR ${STATE} = 'dead') AND (${QUEUE}::text IS NULL OR d.queue = ${QUEUE})
           AND (${TYPE}::text IS NULL OR d.type = ${TYPE}) AND (${AFTER}::bigint IS NULL OR d.id < ${AFTER})
         ORDER BY d.id DESC LIMIT ${LIMIT})
       UNION ALL
       (${ringPart(s, shape)})
${
  // Only where completed or cancelled tasks can match: the history part opens all 8 partitions
  // (~2 ms of executor start-up even when its one-time filter is false; docs/explain-admin.md).
  shape === 'all' || shape === 'completed' || shape === 'cancelled' ? sql`UNION ALL (${historyPart(s, shape)})` : ''
}
     ) x ORDER BY id DESC, pref LIMIT ${LIMIT}`,
    ),
  );
  // The text alone, not prepared: a named ring read is planned generically (RingReadStatement),
  // and only a plan made for the values folds the optional filters (`$n IS NULL OR …`).
  const res = await queryRingRead<{
    id: string;
    type: string;
    state: TaskState;
    queue: string;
    priority: number;
    attempts: number;
    max_attempts: number | null;
    last_error: string | null;
    created_at: Date;
    run_at: Date | null;
    finished_at: Date | null;
    lease_expires_at: Date | null;
    worker: string | null;
    cancel_data: string | null;
  }>(
    db,
    statement.text,
    statement.values({
      state: filter.state ?? null,
      queue: filter.queue ?? null,
      type: filter.type ?? null,
      after: cursorId(page.after),
      limit: limit + 1,
    }),
  );
  const rows = res.rows.slice(0, limit);
  return {
    tasks: rows.map((r) => ({
      id: String(r.id),
      type: r.type,
      state: r.state,
      queue: r.queue,
      priority: r.priority,
      attempts: r.attempts,
      maxAttempts: r.max_attempts,
      lastError: r.last_error,
      createdAt: r.created_at,
      runAt: r.run_at,
      finishedAt: r.finished_at,
      leaseExpiresAt: r.lease_expires_at,
      worker: r.worker,
      ...(r.state === 'cancelled' ? { cancelledBy: cancelDetail(r.cancel_data).actor } : {}),
    })),
    next: res.rows.length > limit ? String(rows[rows.length - 1]!.id) : null,
  };
}

/**
 * What a `listTasks` statement's text depends on, its state filter, as the statement's key: a
 * state with a ring route of its own (see `ringPart`), `cancelled` (history only, through its
 * own index), no filter (`all`, which reads history too), or any other state (`other`: the
 * general walk).
 */
type ListShape = 'running' | 'ready' | 'completed' | 'cancelled' | 'all' | 'other';

function listShape(state: TaskState | undefined): ListShape {
  if (state === undefined) return 'all';
  return state === 'running' || state === 'ready' || state === 'completed' || state === 'cancelled' ? state : 'other';
}

/** A `listTasks` page's parameters, by name, for its parts. */
const STATE = p('state');
const QUEUE = p('queue');
const TYPE = p('type');
/** The keyset cursor: only ids below it. */
const AFTER = p('after');
const LIMIT = p('limit');
type ListParams = 'state' | 'queue' | 'type' | 'after' | 'limit';

/**
 * The ready-ring part of a `listTasks` page (its parameters: state, queue, type, the cursor
 * `after`, limit). In general it walks the ring newest first by id, probing each entry's
 * lease and settlement for its state, until `limit` entries match. A state filter makes the walk
 * probe every entry newer than the page (at 100,000 pending tasks, over a second for `running`
 * or `completed`) and, when fewer than a page match, the whole ring, so each state has an exact
 * cheaper route. All three rest on one invariant: a settlement is only ever written from a lease
 * (complete, fail, release, advance, rescue all insert from `range_leases`), so no lease means no
 * settlement, and a settled entry is never past its lane's claim cursor (its last range's to_seq).
 *
 * - `running` (a leased entry with no settlement) starts from the range leases with unsettled
 *   entries, whose cost follows the work in flight, not the backlog or the id order.
 * - `completed` keeps the walk but first drops, with one comparison, every entry past its lane's
 *   claim cursor, so the unclaimed backlog costs no probes.
 * - `ready` (past its lane's cursor) probes the cursor only. Still a walk: on a drained queue (fewer ready
 *   entries than a page) it reads the whole ring, a third of what the general walk costs.
 */
function ringPart(s: string, state: ListShape): Sql<ListParams> {
  const where = sql`NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                            WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
           AND (${QUEUE}::text IS NULL OR r.queue = ${QUEUE})
           AND (${TYPE}::text IS NULL OR r.type = ${TYPE}) AND (${AFTER}::bigint IS NULL OR r.id < ${AFTER})
         ORDER BY r.id DESC LIMIT ${LIMIT}`;
  if (state === 'running') {
    return sql`SELECT r.id, r.type, 'running', r.queue, r.priority, r.attempts + 1,
               coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]),
               left(r.last_error, 300), r.created_at, r.run_at, NULL,
               l.type_expires[array_position(l.types, r.type)], l.worker, 0, NULL
          FROM ${unsettledRanges(s)} l
          CROSS JOIN LATERAL (${unsettledEntriesOf(s, 'l')}) r
         WHERE ${where}`;
  }
  if (state === 'ready') {
    return sql`SELECT r.id, r.type, 'ready', r.queue, r.priority, r.attempts, r.max_attempts,
               left(r.last_error, 300), r.created_at, r.run_at, NULL, NULL, NULL, 0, NULL
          FROM ${s}.ready r
         WHERE r.lane_seq > coalesce((${laneCursorsJson(s)} ->> r.lane_id::text)::bigint, 0)
           AND ${where}`;
  }
  // One row per lane, computed once per statement (an InitPlan); a lane missing from it is not cut.
  const pastCursor =
    state !== 'completed'
      ? ''
      : `
           AND r.lane_seq <= coalesce((${laneCursorsJson(s)} ->> r.lane_id::text)::bigint, 9223372036854775807)`;
  return sql`SELECT r.id, r.type, e.state, r.queue, r.priority, coalesce(l.attempt, r.attempts),
               coalesce(l.max_attempts, r.max_attempts), left(r.last_error, 300), r.created_at,
               r.run_at, CASE WHEN e.state = 'completed' THEN l.settled_at END, l.expires_at, l.worker, 0, NULL
          FROM ${s}.ready r
          LEFT JOIN LATERAL (SELECT * FROM ${s}.leased_entries le
                              WHERE le.id = r.id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq
                                AND le.slot = r.slot) l ON true
          CROSS JOIN LATERAL (SELECT CASE WHEN l.outcome = 'completed' THEN 'completed'
                                          WHEN l.lane_seq IS NOT NULL THEN 'running'
                                          ELSE 'ready' END AS state) e
         WHERE (${STATE}::text IS NULL OR ${STATE} IN ('ready', 'running', 'completed'))
           AND (l.outcome IS NULL OR l.outcome = 'completed')${pastCursor}
           AND (${STATE}::text IS NULL OR e.state = ${STATE}) AND ${where}`;
}

/**
 * Completed and cancelled tasks in attempt history (a completed task's ring entry may be gone; a
 * cancelled task's never stands for it), for a `listTasks` page (parameters as there). Walks the
 * history's `bucket` index (id >> 10) backwards, sorting each bucket's ids (an incremental sort),
 * and stops at the page; `cancelled` reads the partial index of operator cancels (migration 25)
 * instead, so it never reads the successes, nor a worker's `cancelled` release (a run its own
 * stop interrupted: no cancel of the task, which runs again): its cost follows the cancels kept
 * in history (docs/explain-admin.md: 1,000 cancels among 106,000 rows, 54 buffers). A task still in the ring shows once: the outer
 * DISTINCT ON prefers the ring's row (`pref` 0). Only a cancel row is a task's last word (a
 * cancelled task never runs again), and only a success row says completed, so the two never
 * both hold one id.
 */
function historyPart(s: string, shape: 'completed' | 'cancelled' | 'all'): Sql<ListParams> {
  const outcome =
    shape === 'completed'
      ? `h.outcome = 'success'`
      : shape === 'cancelled'
        ? OPERATOR_CANCEL_ROW
        : `(h.outcome = 'success' OR ${OPERATOR_CANCEL_ROW})`;
  return sql`SELECT x.id, h.type, CASE WHEN h.outcome = 'success' THEN 'completed' ELSE 'cancelled' END,
               ln.queue, ln.priority, x.attempt, NULL::integer, NULL::text,
               x.created_at, NULL::timestamptz, h.settled_at, NULL::timestamptz, h.worker, 1,
               CASE WHEN h.outcome = 'cancelled' THEN h.error ->> 'data' END
          FROM ${s}.attempt_history h
          JOIN ${s}.lanes ln ON ln.lane_id = h.lane_id
         CROSS JOIN LATERAL unnest(h.ids, h.attempts, h.created_at) AS x(id, attempt, created_at)
         WHERE (${STATE}::text IS NULL OR ${STATE} IN ('completed', 'cancelled')) AND ${outcome}
           AND (${QUEUE}::text IS NULL OR ln.queue = ${QUEUE}) AND (${TYPE}::text IS NULL OR h.type = ${TYPE})
           AND (${AFTER}::bigint IS NULL OR (h.bucket <= ${AFTER}::bigint >> 10 AND x.id < ${AFTER}))
         ORDER BY h.bucket DESC, x.id DESC LIMIT ${LIMIT}`;
}

export interface TimelineEvent {
  at: Date;
  event: 'created' | 'appended' | 'claimed' | 'settled' | 'attempt' | 'removed' | 'scheduled' | 'dead';
  detail: Record<string, unknown>;
}

/**
 * What happened to a task, oldest first, from what storage still holds: every attempt in
 * attempt history (its claim, and an `attempt` event with the outcome, duration, error and
 * cursor), every ready-ring entry it had (each append, claim, settlement, tombstone) while its
 * ring segment is retained, and its deferred or dead-letter row. A ring claim and settlement
 * that history also holds are shown once, from history.
 */
export async function taskTimeline(db: Queryable, schema: string, id: string): Promise<TimelineEvent[]> {
  taskId(id);
  try {
    const storage = storageFor(schema);
    const task = await readTaskIn(db, storage, id);
    if (!task) return [];
    const ring = storage.statement('admin-timeline-ring', ({ q: s }) =>
      positional(
        `SELECT r.appended_at, r.queue, r.priority, l.attempt, l.claimed_at, l.expires_at, l.worker,
              l.outcome, l.settled_at, t.reason, t.created_at AS removed_at
         FROM ${s}.ready r
         LEFT JOIN LATERAL (SELECT * FROM ${s}.leased_entries le
                             WHERE le.id = r.id AND le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq
                               AND le.slot = r.slot) l ON true
         LEFT JOIN ${s}.tombstones t ON t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
        WHERE r.id = $1`,
        ['id'],
      ),
    );
    const res = await db.query<{
      appended_at: Date;
      queue: string;
      priority: number;
      attempt: number | null;
      claimed_at: Date | null;
      expires_at: Date | null;
      worker: string | null;
      outcome: string | null;
      settled_at: Date | null;
      reason: string | null;
      removed_at: Date | null;
    }>(ring.query({ id }));
    const events: TimelineEvent[] = [
      { at: task.createdAt, event: 'created', detail: { queue: task.queue, priority: task.priority } },
    ];
    const recorded = new Set<string>();
    for (const a of await attemptsOf(db, storage.schema.name, id)) {
      recorded.add(`${Number(a.claimedAt)}:${a.attempt}`);
      // The cancel of a pending task is recorded as an attempt that no worker claimed.
      const unclaimed = a.outcome === 'cancelled' && a.worker === null && cancelDetail(a.error).state !== 'running';
      if (!unclaimed)
        events.push({
          at: a.claimedAt,
          event: 'claimed',
          detail: { attempt: a.attempt, worker: a.worker, queue: a.queue, priority: a.priority },
        });
      events.push({
        at: a.settledAt,
        event: 'attempt',
        detail: {
          attempt: a.attempt,
          outcome: a.outcome,
          worker: a.worker,
          durationMs: a.durationMs,
          runMs: a.runMs,
          error: a.error,
          ...(a.cursor !== null ? { cursor: a.cursor } : {}),
          dead: a.dead,
        },
      });
    }
    for (const r of res.rows) {
      events.push({ at: r.appended_at, event: 'appended', detail: { queue: r.queue, priority: r.priority } });
      // Already shown from attempt history, with more detail.
      if (r.claimed_at && recorded.has(`${Number(r.claimed_at)}:${r.attempt}`)) {
        if (r.removed_at) events.push({ at: r.removed_at, event: 'removed', detail: { reason: r.reason } });
        continue;
      }
      if (r.claimed_at)
        events.push({
          at: r.claimed_at,
          event: 'claimed',
          detail: { attempt: r.attempt, worker: r.worker, leaseExpiresAt: r.expires_at },
        });
      if (r.settled_at)
        events.push({ at: r.settled_at, event: 'settled', detail: { outcome: r.outcome, attempt: r.attempt } });
      if (r.removed_at) events.push({ at: r.removed_at, event: 'removed', detail: { reason: r.reason } });
    }
    if ((task.state === 'scheduled' || task.state === 'retryable') && task.runAt) {
      events.push({ at: task.runAt, event: 'scheduled', detail: { state: task.state, runAt: task.runAt } });
    }
    if (task.state === 'dead') {
      const d = await db.query<{ died_at: Date }>(
        storage
          .statement('admin-timeline-dead', ({ q: s }) =>
            positional(`SELECT died_at FROM ${s}.dead_letters WHERE id = $1`, ['id']),
          )
          .query({ id }),
      );
      if (d.rows[0])
        events.push({
          at: d.rows[0].died_at,
          event: 'dead',
          detail: { attempts: task.attempts, lastError: task.lastError },
        });
    }
    // A task created and appended in one statement shares the timestamp: keep insertion order.
    // Number(), not getTime(): an infinite timestamp (which the runtime role can write) comes back
    // from pg as the number Infinity, not a Date.
    const at = (e: TimelineEvent) => Number(e.at);
    return events
      .map((e, i) => ({ e, i }))
      .sort((a, b) => at(a.e) - at(b.e) || a.i - b.i)
      .map((x) => x.e);
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/** What an operator action on one task did. */
export type TaskActionResult =
  | 'retried' // a dead letter back in the ready ring, or a scheduled/retryable task made due now
  | 'removed'
  | 'cancelled' // it was running: its attempt is settled as cancelled and its handler aborted
  | 'already_settled' // cancel only: its attempt was settled first (it completed, died, was cancelled): nothing changed
  | 'running' // delete only: under a lease, not changed (cancel it first)
  | 'not_retryable' // already ready, running or completed, or held for its concurrency key
  | 'waiting_on_parents' // retry only: it waits for the tasks it depends on; the last one's completion makes it due
  | 'duplicate' // a dead letter whose dedupe key a live task holds
  | 'not_found';

/**
 * Run a task now: a dead letter is retried with a fresh attempt budget; a scheduled or
 * retryable task becomes due now (the leader's promotion appends it within a tick). A task
 * waiting on its dependencies answers `waiting_on_parents`: only its last parent's completion
 * makes it due (retry a dead parent instead, or cancel it).
 */
export async function retryTask(db: Queryable, schema: string, id: string): Promise<TaskActionResult> {
  taskId(id);
  return orNotMigrated(schema, async () => {
    const storage = storageFor(schema);
    const task = await readTaskIn(db, storage, id);
    if (!task) return 'not_found';
    if (task.state === 'dead') {
      const [r] = await retryDeadLettersIn(db, storage, [id]);
      return r?.result ?? 'not_found';
    }
    if (task.state === 'waiting') return 'waiting_on_parents';
    if (task.state === 'scheduled' || task.state === 'retryable') {
      return (await makeDeferredDueNow(db, storage, id)) ? 'retried' : 'not_found';
    }
    return 'not_retryable';
  });
}

/** Who cancels: recorded on the cancelled settlement (and by `audited()` in the audit log). */
export interface CancelOptions {
  /** `cli:alice`, `dashboard:ops@example.com`; null when not given. */
  actor?: string;
}

/**
 * Cancel a task so it never runs again: a pending one is removed before it runs; a running one
 * (or one a dead worker's lease still holds) has its attempt settled as `cancelled` with the
 * actor, and the worker running it sees its handler's `AbortSignal` fire (a notification, or
 * its poll). Of a cancel and the task's own settlement exactly one wins: the loser of a cancel
 * is told `already_settled`. A dead letter is not pending: use deleteTask.
 */
export async function cancelTask(
  db: Queryable,
  schema: string,
  id: string,
  options: CancelOptions = {},
): Promise<TaskActionResult> {
  taskId(id);
  const r = await orNotMigrated(schema, () => cancelTaskIds(db, storageFor(schema), [id], options.actor ?? null));
  return r.get(id) ?? 'not_found';
}

/** Which tasks a bulk cancel takes: at least one of the fields, or `all`. */
export interface CancelFilter {
  /** Pending states only: ready, running, scheduled, retryable, held, waiting. */
  state?: Exclude<TaskState, 'dead' | 'completed' | 'cancelled'>;
  queue?: string;
  type?: string;
  all?: boolean;
}

export interface BulkCancelResult {
  /** Tasks the filter matched when their page was read. */
  matched: number;
  removed: number;
  cancelled: number;
  /** Settled first (completed, died, cancelled meanwhile): left as they were. */
  alreadySettled: number;
}

const CANCEL_BATCH = 500;

/** States a cancel has nothing to do to (a dead letter is deleted or retried instead). */
const FINISHED: ReadonlySet<TaskState> = new Set<TaskState>(['dead', 'completed', 'cancelled']);

/**
 * Cancel every pending or running task a filter matches, newest first, a page of 500 at a time
 * (one `cancel_tasks` statement per page). Refuses an empty filter (pass `all: true`).
 */
export async function cancelTasks(
  db: Queryable,
  schema: string,
  filter: CancelFilter,
  options: CancelOptions & { onProgress?: (p: BulkProgress) => void } = {},
): Promise<BulkCancelResult> {
  const storage = storageFor(schema);
  const { state, queue, type, all } = filter;
  if (state !== undefined && FINISHED.has(parseState(state)))
    throw new BerthInputError(
      `cannot cancel ${state} tasks: only ready, running, scheduled, retryable, held or waiting ones`,
    );
  for (const [name, v] of [
    ['queue', queue],
    ['type', type],
  ] as const) {
    if (v !== undefined && v === '') throw new BerthInputError(`${name} must not be empty`);
  }
  checkNameFilter(filter, 'cancelTasks filter');
  if (state === undefined && queue === undefined && type === undefined && all !== true)
    throw new BerthInputError('a bulk cancel needs a filter (state, queue, type) or all');
  return orNotMigrated(schema, () => cancelMatching(db, storage, filter, options));
}

async function cancelMatching(
  db: Queryable,
  storage: Storage,
  { state, queue, type }: CancelFilter,
  options: CancelOptions & { onProgress?: (p: BulkProgress) => void },
): Promise<BulkCancelResult> {
  const out: BulkCancelResult = { matched: 0, removed: 0, cancelled: 0, alreadySettled: 0 };
  let after: string | undefined;
  for (;;) {
    const page = await listTasksIn(db, storage, { state, queue, type }, { limit: CANCEL_BATCH, after });
    const ids = page.tasks.filter((t) => !FINISHED.has(t.state)).map((t) => t.id);
    if (ids.length > 0) {
      out.matched += ids.length;
      for (const r of (await cancelTaskIds(db, storage, ids, options.actor ?? null)).values()) {
        if (r === 'removed') out.removed++;
        else if (r === 'cancelled') out.cancelled++;
        else if (r === 'already_settled') out.alreadySettled++;
      }
      options.onProgress?.({ done: out.matched, total: out.matched });
    }
    if (page.next === null) break;
    after = page.next;
  }
  return out;
}

/** Remove a task in any state but running: pending ones as cancel does, dead letters deleted (no record kept). */
export async function deleteTask(db: Queryable, schema: string, id: string): Promise<TaskActionResult> {
  taskId(id);
  return orNotMigrated(schema, async () => {
    const storage = storageFor(schema);
    if (await deleteDeadLetter(db, storage, id)) return 'removed';
    return removeUnleasedAs(db, storage, id, 'deleted');
  });
}

async function removeUnleasedAs(
  db: Queryable,
  storage: Storage,
  id: string,
  reason: string,
): Promise<TaskActionResult> {
  const result = await removeUnleased(db, storage, taskId(id), reason);
  return result === 'leased' ? 'running' : result;
}
