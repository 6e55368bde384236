import { BerthInputError, notMigrated, orNotMigrated } from '../errors.js';
import { checkNameFilter } from '../limits.js';
import { taskId } from './ids.js';
import { readErrorDetail } from './attempt-read.js';
import type { Queryable } from '../sql.js';
import { positional, type Sql, sql } from '../statement.js';
import { storageFor } from './storage.js';
import type { ErrorDetail } from '../util/error-detail.js';

/**
 * Attempt history (migration 10): what every attempt was, written by the statement that settles
 * it (complete, Dequeue, fail, release, AdvanceCursor, snooze, rescue) as one more data-modifying CTE, so
 * it costs no round trip and is written exactly when the settlement wins its fence. Append-only
 * in a ring of partitions the leader truncates by age (`rotate_history`, maintenance/history.ts).
 * The schema's `history_state` says whether it is written and for how long it is kept; each
 * statement reads it itself, so producers, workers and the leader always agree.
 *
 * Successes are compact: one row per (range lease, type, id bucket) of a completion flush, its
 * tasks as arrays. Everything else is one row per task, with its error or its cursor.
 */

/**
 * The outcome an attempt ended with: seed 000's six (`lost`: its lease lapsed and was rescued),
 * and `snoozed` (the handler returned `snooze(ms)`).
 */
export type AttemptOutcome = 'success' | 'failure' | 'timeout' | 'continued' | 'cancelled' | 'lost' | 'snoozed';

export const ATTEMPT_OUTCOMES: readonly AttemptOutcome[] = [
  'success',
  'failure',
  'timeout',
  'continued',
  'cancelled',
  'lost',
  'snoozed',
];

const COLUMNS =
  'part, bucket, outcome, lane_id, type, worker, claimed_at, ids, attempts, created_at, run_ms, error, cursor, dead';

/** Whether history is written, read inside the statement (a one-time filter: nothing else runs when off). */
function enabled(s: string): string {
  return `(SELECT hs.enabled FROM ${s}.history_state hs)`;
}

function currentPart(s: string): string {
  return `(SELECT hs.current_part FROM ${s}.history_state hs)`;
}

/**
 * The INSERT of one history row per task, for a settling statement's CTE. `from` is a SELECT
 * with the columns id, outcome, lane_id, type, worker, claimed_at, attempt, created_at, run_ms
 * (integer), error (jsonb), cursor (jsonb), dead (boolean), one row per settlement won.
 */
export function perTaskHistory<N extends string>(s: string, from: Sql<N>): Sql<N> {
  return sql`INSERT INTO ${s}.attempt_history (${COLUMNS})
       SELECT ${currentPart(s)}, h.id >> 10, h.outcome, h.lane_id, h.type, h.worker, h.claimed_at,
              ARRAY[h.id], ARRAY[h.attempt], ARRAY[h.created_at], ARRAY[h.run_ms], h.error, h.cursor, h.dead
         FROM (${from}) h
        WHERE ${enabled(s)}`;
}

/**
 * The completion statement's history CTE, `hist`: one row per (lease, type, id bucket) of the
 * entries in `done` (the settled entries, with lane_id, from_seq, worker, claimed_at, id, type,
 * attempt, created_at and run_ms; src/storage/complete.ts), the tasks as arrays. The arrays of a row are aligned
 * (one aggregate node feeds them all in the same order); their order is the input's.
 */
export function completionHistory(s: string): string {
  return `hist AS (
       INSERT INTO ${s}.attempt_history (${COLUMNS})
       SELECT ${currentPart(s)}, e.id >> 10, 'success', e.lane_id, e.type, e.worker, e.claimed_at,
              array_agg(e.id), array_agg(e.attempt), array_agg(e.created_at), array_agg(e.run_ms), NULL, NULL, false
         FROM done e
        WHERE ${enabled(s)}
        GROUP BY e.lane_id, e.from_seq, e.worker, e.claimed_at, e.type, e.id >> 10
     )`;
}

/** A handler's run time as the history column holds it (whole ms, within int4). */
export function runMsValue(ms: number | null | undefined): number | null {
  if (ms == null || !Number.isFinite(ms) || ms < 0) return null;
  return Math.min(Math.round(ms), 2_147_483_647);
}

/** One attempt of one task, as attempt history holds it. */
export interface AttemptRecord {
  id: string;
  attempt: number;
  outcome: AttemptOutcome;
  type: string;
  queue: string;
  priority: number;
  shard: number;
  worker: string | null;
  claimedAt: Date;
  settledAt: Date;
  /** From the claim to the settlement. */
  durationMs: number;
  /** The handler's own run time; null when it did not run (or the attempt was not settled by its worker). */
  runMs: number | null;
  createdAt: Date;
  error: ErrorDetail | null;
  /** The payload AdvanceCursor saved, for a `continued` attempt that advanced. */
  cursor: unknown;
  /** The attempt retired the task to the dead letters. */
  dead: boolean;
  /** The schedule that fired the task (`defineSchedule`), while its fire record is kept (7 days); else null. */
  schedule: string | null;
  /**
   * What was wrong with the row as stored, when anything was (a worker role can write any row):
   * the record is still given, with those fields made safe.
   */
  invalid?: string[];
}

/** An AttemptRecord as the statement returns it (snake_case times, and the keyset cursor's key). */
type AttemptRow = Omit<AttemptRecord, 'claimedAt' | 'settledAt' | 'durationMs' | 'runMs' | 'createdAt'> & {
  claimed_at: Date;
  settled_at: Date;
  settled_key: string;
  duration_ms: number;
  run_ms: number | null;
  created_at: Date;
};

const ATTEMPT_SELECT = `x.id::text AS id, x.attempt, h.outcome, h.type, ln.queue, ln.priority, ln.shard, h.worker,
       h.claimed_at, h.settled_at, (extract(epoch FROM h.settled_at) * 1000000)::bigint::text AS settled_key,
       (extract(epoch FROM h.settled_at - h.claimed_at) * 1000)::float8 AS duration_ms,
       x.run_ms, x.created_at, h.error, h.cursor, h.dead, sf.schedule`;

/**
 * What both attempt reads select from: each history row's tasks (one row per task of the
 * settlement), its lane, and the schedule that fired the task (migration 26: one probe of the
 * fires' task index).
 */
function attemptRows(s: string): string {
  return `${s}.attempt_history h
         JOIN ${s}.lanes ln ON ln.lane_id = h.lane_id
        CROSS JOIN LATERAL unnest(h.ids, h.attempts, h.created_at, h.run_ms) AS x(id, attempt, created_at, run_ms)
        LEFT JOIN LATERAL (SELECT f.schedule FROM ${s}.schedule_fires f WHERE f.task_id = x.id LIMIT 1) sf ON true`;
}

/**
 * A row as a reader may use it: every field a worker role could have forged checked (the error
 * by `readErrorDetail`, the outcome against the known ones, the worker's name bounded), so a bad
 * row is shown and marked (`invalid`), never a reason for a listing to stop.
 */
function toRecord(r: AttemptRow): AttemptRecord {
  const { error, problems } = readErrorDetail(r.error);
  if (!(ATTEMPT_OUTCOMES as readonly string[]).includes(r.outcome))
    problems.push(`its outcome is not one berth writes`);
  if (r.worker !== null && r.worker.length > 200) problems.push('its worker name is longer than 200 characters');
  return {
    id: r.id,
    attempt: r.attempt,
    outcome: r.outcome,
    type: r.type,
    queue: r.queue,
    priority: r.priority,
    shard: r.shard,
    worker: r.worker !== null && r.worker.length > 200 ? `${r.worker.slice(0, 200)}…` : r.worker,
    claimedAt: r.claimed_at,
    settledAt: r.settled_at,
    durationMs: r.duration_ms,
    runMs: r.run_ms,
    createdAt: r.created_at,
    error,
    cursor: r.cursor,
    dead: r.dead,
    schedule: r.schedule ?? null,
    ...(problems.length > 0 ? { invalid: problems } : {}),
  };
}

/** Every attempt of one task still in history, oldest first. One btree probe (`bucket`). */
export async function attemptsOf(db: Queryable, schema: string, id: string): Promise<AttemptRecord[]> {
  taskId(id);
  try {
    const statement = storageFor(schema).statement('attempts-of', ({ q: s }) =>
      positional(
        `SELECT ${ATTEMPT_SELECT}
         FROM ${attemptRows(s)}
        WHERE h.bucket = $1::bigint >> 10 AND $1::bigint = ANY (h.ids) AND x.id = $1::bigint
        ORDER BY h.settled_at, h.claimed_at`,
        ['id'],
      ),
    );
    const res = await db.query<AttemptRow>(statement.query({ id }));
    return res.rows.map(toRecord);
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

export interface AttemptFilter {
  type?: string;
  queue?: string;
  outcome?: AttemptOutcome;
  /** Settled at or after this time. */
  since?: Date;
  /** Settled before this time. */
  before?: Date;
}

function checkTime(value: Date | undefined, name: string): Date | null {
  if (value === undefined) return null;
  if (!(value instanceof Date) || Number.isNaN(value.getTime()))
    throw new BerthInputError(`${name} must be a valid date`);
  return value;
}

export interface AttemptPage {
  /** 1-500, default 50. */
  limit?: number;
  /** The `next` of the previous page. */
  after?: string;
}

export interface AttemptList {
  attempts: AttemptRecord[];
  next: string | null;
}

export function parseOutcome(value: string): AttemptOutcome {
  if (!(ATTEMPT_OUTCOMES as readonly string[]).includes(value)) {
    throw new BerthInputError(`unknown outcome "${value}"; expected one of ${ATTEMPT_OUTCOMES.join(', ')}`);
  }
  return value as AttemptOutcome;
}

const AT = `timestamptz 'epoch' + $4::bigint * interval '1 microsecond'`;

/** The keyset cursor: settled_at in microseconds since the epoch (exact, unlike a JS Date), `:`, the id (shell-safe, for the CLI's next-page command). */
function parseCursor(after: string | undefined): [string, string] | [null, null] {
  if (after === undefined || after === '') return [null, null];
  const m = /^(-?[0-9]{1,18}):([0-9]{1,19})$/.exec(after);
  if (!m) throw new BerthInputError('after must be the next cursor of a previous page');
  return [m[1]!, m[2]!];
}

/**
 * Attempts newest first (by settlement time, then id), filtered by type, queue, outcome and a
 * settlement-time window, with
 * keyset pagination. Walks the `settled_at` index backwards and stops at the page: a filter few
 * attempts match walks further (the whole retention at worst).
 */
export async function listAttempts(
  db: Queryable,
  schema: string,
  filter: AttemptFilter = {},
  page: AttemptPage = {},
): Promise<AttemptList> {
  try {
    const limit = page.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 500)
      throw new BerthInputError('limit must be an integer from 1 to 500');
    if (filter.outcome !== undefined) parseOutcome(filter.outcome);
    checkNameFilter(filter, 'listAttempts filter');
    const [at, afterId] = parseCursor(page.after);
    const statement = storageFor(schema).statement('list-attempts', ({ q: s }) =>
      positional(
        `SELECT ${ATTEMPT_SELECT}
         FROM ${attemptRows(s)}
        WHERE ($1::text IS NULL OR h.type = $1) AND ($2::text IS NULL OR ln.queue = $2)
          AND ($3::text IS NULL OR h.outcome = $3)
          AND ($4::bigint IS NULL OR h.settled_at <= ${AT})
          AND ($4::bigint IS NULL OR (h.settled_at, x.id) < (${AT}, $5::bigint))
          AND ($7::timestamptz IS NULL OR h.settled_at >= $7) AND ($8::timestamptz IS NULL OR h.settled_at < $8)
        ORDER BY h.settled_at DESC, x.id DESC
        LIMIT $6`,
        ['type', 'queue', 'outcome', 'at', 'afterId', 'limit', 'since', 'before'],
      ),
    );
    const res = await db.query<AttemptRow>(
      statement.query({
        type: filter.type ?? null,
        queue: filter.queue ?? null,
        outcome: filter.outcome ?? null,
        at,
        afterId,
        limit: limit + 1,
        since: checkTime(filter.since, 'since'),
        before: checkTime(filter.before, 'before'),
      }),
    );
    const rows = res.rows.slice(0, limit);
    const last = rows[rows.length - 1];
    return {
      attempts: rows.map(toRecord),
      next: res.rows.length > limit && last ? `${last.settled_key}:${last.id}` : null,
    };
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/** The schema-wide history setting. */
export interface HistorySettings {
  enabled: boolean;
  retentionMs: number;
  partitions: number;
  currentPartition: number;
  generation: number;
  rotatedAt: Date;
}

export async function readHistorySettings(db: Queryable, schema: string): Promise<HistorySettings> {
  try {
    const statement = storageFor(schema).statement('history-settings', ({ q: s }) =>
      positional(
        `SELECT enabled, retention_ms, part_count, current_part, generation::text AS generation, rotated_at
          FROM ${s}.history_state`,
        [],
      ),
    );
    const r = await db.query<{
      enabled: boolean;
      retention_ms: number;
      part_count: number;
      current_part: number;
      generation: string;
      rotated_at: Date;
    }>(statement.query({}));
    const row = r.rows[0]!;
    return {
      enabled: row.enabled,
      retentionMs: row.retention_ms,
      partitions: row.part_count,
      currentPartition: row.current_part,
      generation: Number(row.generation),
      rotatedAt: row.rotated_at,
    };
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/** The shortest retention: rotation runs every retention / 7, on the leader's history branch. */
export const MIN_HISTORY_RETENTION_MS = 7000;

/**
 * Turn attempt history on or off, or change how long it is kept (an operator's action, as the
 * schema owner: runtime roles may only read the setting). Takes effect at each writer's next
 * statement. Turning it off stops the writes; what is kept ages out as before.
 */
export async function setHistorySettings(
  db: Queryable,
  schema: string,
  change: { enabled?: boolean; retentionMs?: number },
): Promise<HistorySettings> {
  for (const key of Object.keys(change)) {
    if (key !== 'enabled' && key !== 'retentionMs') throw new BerthInputError(`unknown history setting "${key}"`);
  }
  if (change.enabled !== undefined && typeof change.enabled !== 'boolean')
    throw new BerthInputError('history enabled must be true or false');
  const ms = change.retentionMs;
  if (ms !== undefined && (typeof ms !== 'number' || !Number.isFinite(ms) || ms < MIN_HISTORY_RETENTION_MS))
    throw new BerthInputError(`history retentionMs must be a number of milliseconds >= ${MIN_HISTORY_RETENTION_MS}`);
  await orNotMigrated(schema, () =>
    db.query(
      storageFor(schema)
        .statement('set-history-settings', ({ q: s }) =>
          positional(
            `UPDATE ${s}.history_state
        SET enabled = coalesce($1::boolean, enabled), retention_ms = coalesce($2::float8, retention_ms)`,
            ['enabled', 'retentionMs'],
          ),
        )
        .query({ enabled: change.enabled ?? null, retentionMs: ms ?? null }),
    ),
  );
  return readHistorySettings(db, schema);
}
