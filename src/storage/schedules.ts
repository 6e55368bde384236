import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { fireDedupeKey, type MisfirePolicy, type ScheduleDefinition } from '../schedule.js';
import { liveWorker, STALE_HEARTBEATS } from './live-workers.js';
import type { Storage } from './storage.js';

/**
 * The schedules table (migration 26): declarations upserted by workers, fired by the leader.
 * Exactly once per instant is a database fact here: a fire moves the schedule's watermark
 * (`fired_through`) forward with a conditional UPDATE and enqueues its task in the same
 * transaction, so a second fire of an instant at or before the watermark updates no row and
 * enqueues nothing, whoever sends it and whatever its clock says (docs/architecture.md,
 * "Schedules").
 */

/** The default queue's name, as enqueue's (a schedule declares none and its definition none). */
const DEFAULT_QUEUE = 'default';
/** Shards a fire's task is spread over, as enqueue's default. */
const FIRE_SHARDS = 16;

/** What the leader's tick reads of an active schedule. */
export interface ScheduleTickRow {
  name: string;
  cron: string;
  timeZone: string;
  misfire: MisfirePolicy;
  misfireCap: number;
  misfireGraceMs: number;
  firedThrough: Date;
  /** When it last fired, else when it was first declared. */
  lastFiredAt: Date;
  intervalMs: number;
}

/** A declaration's outcome at upsert: new, changed (its expression, task or options), or as it was. */
export interface UpsertResult {
  name: string;
  created: boolean;
  changed: boolean;
}

/**
 * Upsert a worker's schedules, one statement. A new schedule's watermark is now (it does not
 * run the instants before it was declared); a changed expression or time zone moves it to now
 * too (the new expression's past is not owed); any other change (the task, its options, the
 * ceiling) leaves it where it is. Declaring a schedule clears its stale mark; its pause (an
 * operator's) is left as it is.
 */
export async function upsertSchedules(
  db: Queryable,
  storage: Storage,
  schedules: readonly ScheduleDefinition[],
  intervals: readonly number[],
  workerId: string,
): Promise<UpsertResult[]> {
  if (schedules.length === 0) return [];
  const rows = schedules.map((d, i) => ({
    name: d.name,
    cron: d.cron,
    time_zone: d.timeZone,
    task_type: d.taskType,
    payload: d.payload,
    queue: d.queue ?? DEFAULT_QUEUE,
    priority: d.priority,
    max_attempts: d.maxAttempts,
    misfire: d.misfire,
    misfire_cap: d.misfireCap,
    misfire_grace_ms: d.misfireGraceMs,
    ceiling_ms: d.ceilingMs,
    interval_ms: intervals[i],
  }));
  const statement = storage.statement('schedules-upsert', ({ q: s }) =>
    positional(
      `WITH given AS (
         SELECT * FROM jsonb_to_recordset($1::jsonb) AS x(name text, cron text, time_zone text, task_type text,
           payload jsonb, queue text, priority smallint, max_attempts integer, misfire text, misfire_cap integer,
           misfire_grace_ms integer, ceiling_ms integer, interval_ms double precision)
       ), old AS (
         SELECT o.* FROM ${s}.schedules o WHERE o.name IN (SELECT name FROM given)
       ), up AS (
         INSERT INTO ${s}.schedules AS sc (name, cron, time_zone, task_type, payload, queue, priority, max_attempts,
                                           misfire, misfire_cap, misfire_grace_ms, ceiling_ms, interval_ms, declared_by)
         SELECT g.name, g.cron, g.time_zone, g.task_type, g.payload, g.queue, g.priority, g.max_attempts,
                g.misfire, g.misfire_cap, g.misfire_grace_ms, g.ceiling_ms, g.interval_ms, $2 FROM given g
         ON CONFLICT (name) DO UPDATE
           SET cron = excluded.cron, time_zone = excluded.time_zone, task_type = excluded.task_type,
               payload = excluded.payload, queue = excluded.queue, priority = excluded.priority,
               max_attempts = excluded.max_attempts, misfire = excluded.misfire, misfire_cap = excluded.misfire_cap,
               misfire_grace_ms = excluded.misfire_grace_ms, ceiling_ms = excluded.ceiling_ms,
               interval_ms = excluded.interval_ms,
               declared_by = excluded.declared_by, declared_at = now(), stale = false, stale_since = NULL,
               fired_through = CASE WHEN (sc.cron, sc.time_zone) IS DISTINCT FROM (excluded.cron, excluded.time_zone)
                                    THEN greatest(sc.fired_through, now()) ELSE sc.fired_through END
         RETURNING sc.name
       )
       SELECT up.name, o.name IS NULL AS created,
              o.name IS NOT NULL AND (o.cron, o.time_zone, o.task_type, o.payload, o.queue, o.priority, o.max_attempts,
                o.misfire, o.misfire_cap, o.misfire_grace_ms, o.ceiling_ms)
                IS DISTINCT FROM (g.cron, g.time_zone, g.task_type, g.payload, g.queue, g.priority, g.max_attempts,
                g.misfire, g.misfire_cap, g.misfire_grace_ms, g.ceiling_ms) AS changed
         FROM up JOIN given g USING (name) LEFT JOIN old o USING (name)
        ORDER BY up.name`,
      ['rows', 'workerId'],
    ),
  );
  const res = await db.query<UpsertResult>(statement.query({ rows: JSON.stringify(rows), workerId }));
  return res.rows;
}

/** What the run of a schedule's task reads of its schedule: the ceiling stored, and for which type. */
export interface ScheduleCeilingRow {
  /** The schedule's ceiling in ms; null: its task type's. */
  ceilingMs: number | null;
  taskType: string;
}

/**
 * A schedule's stored ceiling, by name (a primary-key probe); null when there is no such schedule.
 * The row is the authority, not the running worker's code: the last worker to start declared it,
 * and the worker running one of its tasks may not declare it at all.
 */
export async function scheduleCeilingOf(
  db: Queryable,
  storage: Storage,
  name: string,
): Promise<ScheduleCeilingRow | null> {
  const res = await db.query<{ ceiling_ms: number | null; task_type: string }>(
    storage
      .statement('schedules-ceiling', ({ q: s }) =>
        positional(`SELECT ceiling_ms, task_type FROM ${s}.schedules WHERE name = $1`, ['name']),
      )
      .query({ name }),
  );
  const row = res.rows[0];
  return row === undefined ? null : { ceilingMs: row.ceiling_ms, taskType: row.task_type };
}

/** The schedules the leader may fire (neither paused nor stale), with the database's clock. */
export async function activeSchedules(
  db: Queryable,
  storage: Storage,
): Promise<{ now: Date; schedules: ScheduleTickRow[] }> {
  const statement = storage.statement('schedules-active', ({ q: s }) =>
    positional(
      `SELECT clock_timestamp() AS now, coalesce(json_agg(json_build_object(
                'name', sc.name, 'cron', sc.cron, 'timeZone', sc.time_zone, 'misfire', sc.misfire,
                'misfireCap', sc.misfire_cap, 'misfireGraceMs', sc.misfire_grace_ms,
                'firedThrough', sc.fired_through, 'lastFiredAt', coalesce(sc.last_fired_at, sc.created_at),
                'intervalMs', sc.interval_ms) ORDER BY sc.name), '[]') AS rows
         FROM ${s}.schedules sc WHERE NOT sc.paused AND NOT sc.stale`,
      [],
    ),
  );
  type Row = Omit<ScheduleTickRow, 'firedThrough' | 'lastFiredAt'> & { firedThrough: string; lastFiredAt: string };
  const res = await db.query<{ now: Date; rows: Row[] }>(statement.query({}));
  const row = res.rows[0]!;
  return {
    now: row.now,
    schedules: row.rows.map((r) => ({
      ...r,
      firedThrough: new Date(r.firedThrough),
      lastFiredAt: new Date(r.lastFiredAt),
    })),
  };
}

/** What one fire did: its task, or why none was enqueued. */
export type FireResult =
  | { kind: 'fired'; taskId: string; duplicate: boolean }
  /** The watermark was already at or past the instant (or the schedule is paused, stale or gone): nothing enqueued. */
  | { kind: 'refused' };

/**
 * Fire one instant of a schedule, in one transaction on `client` (a checked-out client, not in a
 * transaction): the watermark moved to `through` (at or after `instant`) only if it is before
 * `instant`, the task enqueued with the fire's dedupe key, and the fire recorded. Refused, with
 * nothing written, when the watermark is already there. `lateMs`: how late the fire is.
 */
export async function fireInstant(
  client: Queryable,
  storage: Storage,
  fire: { name: string; instant: Date; through: Date; lateMs: number },
): Promise<FireResult> {
  await client.query('BEGIN');
  try {
    const advanced = await client.query(
      storage
        .statement('schedules-advance-fire', ({ q: s }) =>
          positional(
            `UPDATE ${s}.schedules SET fired_through = $3, last_instant = $2, last_fired_at = now()
              WHERE name = $1 AND fired_through < $2 AND NOT paused AND NOT stale`,
            ['name', 'instant', 'through'],
          ),
        )
        .query({ name: fire.name, instant: fire.instant, through: fire.through }),
    );
    const result =
      advanced.rowCount === 1 ? await enqueueFire(client, storage, fire.name, fire.instant, false, fire.lateMs) : null;
    if (result === null) {
      await client.query('ROLLBACK');
      return { kind: 'refused' };
    }
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}

/**
 * Move the watermark past instants the misfire policy skips, without a task; false when it was
 * already there (or the schedule is paused, stale or gone).
 */
export async function skipThrough(db: Queryable, storage: Storage, name: string, through: Date): Promise<boolean> {
  const res = await db.query(
    storage
      .statement('schedules-skip', ({ q: s }) =>
        positional(
          `UPDATE ${s}.schedules SET fired_through = $2
            WHERE name = $1 AND fired_through < $2 AND NOT paused AND NOT stale`,
          ['name', 'through'],
        ),
      )
      .query({ name, through }),
  );
  return (res.rowCount ?? 0) > 0;
}

/**
 * An operator's trigger: one task now, as the schedule declares it, without moving the
 * watermark (the next instant still fires). One statement. Fires a paused or stale schedule
 * too: it was asked for by name. Null when there is no such schedule.
 */
export async function triggerFire(
  db: Queryable,
  storage: Storage,
  name: string,
  at: Date,
): Promise<Extract<FireResult, { kind: 'fired' }> | null> {
  return enqueueFire(db, storage, name, at, true, null);
}

/**
 * The fire's task through enqueue() (dedupe, lanes, wake-up as any task), as the schedule's row
 * declares it, and its record; null when there is no such schedule.
 */
async function enqueueFire(
  db: Queryable,
  storage: Storage,
  name: string,
  instant: Date,
  triggered: boolean,
  lateMs: number | null,
): Promise<Extract<FireResult, { kind: 'fired' }> | null> {
  const res = await db.query<{ task_id: string; duplicate: boolean }>(
    storage
      .statement('schedules-enqueue', ({ q: s }) =>
        positional(
          `WITH e AS (
             SELECT coalesce(e.id, e.duplicate_of) AS id, e.state = 'duplicate' AS duplicate
               FROM ${s}.schedules sc,
                    LATERAL ${s}.enqueue(sc.queue, sc.priority, NULL::smallint, $2::smallint, ARRAY[sc.task_type],
                                         ARRAY[sc.payload], NULL::timestamptz[], ARRAY[sc.max_attempts], ARRAY[$3::text],
                                         NULL::text) AS e
              WHERE sc.name = $1
           ), fired AS (
             INSERT INTO ${s}.schedule_fires (schedule, instant, kind, task_id, late_ms)
             SELECT $1, $4, CASE WHEN $5::boolean THEN 'trigger' ELSE 'cron' END, e.id, $6 FROM e
             RETURNING task_id
           ), last AS (
             UPDATE ${s}.schedules SET last_task_id = (SELECT id FROM e) WHERE name = $1 AND NOT $5::boolean
             RETURNING 1
           )
           SELECT e.id::text AS task_id, e.duplicate FROM e, (SELECT count(*) FROM fired) f, (SELECT count(*) FROM last) l`,
          ['name', 'shards', 'dedupeKey', 'instant', 'triggered', 'lateMs'],
        ),
      )
      .query({
        name,
        shards: FIRE_SHARDS,
        dedupeKey: fireDedupeKey(name, instant, triggered),
        instant,
        triggered,
        lateMs,
      }),
  );
  const row = res.rows[0];
  return row === undefined ? null : { kind: 'fired', taskId: row.task_id, duplicate: row.duplicate };
}

/**
 * Mark stale the schedules no live worker declares (and whose last declaration is older than
 * `graceMs`, so a worker that just upserted is not marked before its first heartbeat), and
 * clear the mark of those one does again. Live here is the live-worker rule with each worker's
 * own heartbeat interval (`workers.heartbeat_ms`; the default for a row without one): a worker
 * beating every minute declares its schedules for three minutes. Returns the names marked and
 * cleared.
 */
export async function markStaleSchedules(
  db: Queryable,
  storage: Storage,
  liveParams: { staleMs: number; futureMs: number; graceMs: number },
): Promise<{ marked: string[]; cleared: string[] }> {
  const statement = storage.statement('schedules-stale', ({ q: s }) =>
    positional(
      `WITH declared AS (
         SELECT DISTINCT unnest(w.schedules) AS name FROM ${s}.workers w
          WHERE ${liveWorker('w', `greatest($1, ${STALE_HEARTBEATS} * coalesce(w.heartbeat_ms, 0))`, '$2')}
       ), marked AS (
         UPDATE ${s}.schedules sc SET stale = true, stale_since = now()
          WHERE NOT sc.stale AND sc.declared_at < now() - make_interval(secs => $3 / 1000.0)
            AND sc.name NOT IN (SELECT name FROM declared WHERE name IS NOT NULL)
         RETURNING sc.name
       ), cleared AS (
         UPDATE ${s}.schedules sc SET stale = false, stale_since = NULL
          WHERE sc.stale AND sc.name IN (SELECT name FROM declared)
         RETURNING sc.name
       )
       SELECT (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM marked) AS marked,
              (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM cleared) AS cleared`,
      ['staleMs', 'futureMs', 'graceMs'],
    ),
  );
  const res = await db.query<{ marked: string[]; cleared: string[] }>(statement.query(liveParams));
  return res.rows[0]!;
}

/** Fire records older than `retentionMs` deleted (the leader's retention branch). */
export async function pruneScheduleFires(db: Queryable, storage: Storage, retentionMs: number): Promise<number> {
  const res = await db.query(
    storage
      .statement('schedules-prune-fires', ({ q: s }) =>
        positional(`DELETE FROM ${s}.schedule_fires WHERE fired_at < now() - make_interval(secs => $1 / 1000.0)`, [
          'retentionMs',
        ]),
      )
      .query({ retentionMs }),
  );
  return res.rowCount ?? 0;
}
