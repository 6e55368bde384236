import { BerthInputError, notMigrated } from '../errors.js';
import { checkText, MAX_ACTOR_CHARS } from '../limits.js';
import { cronOf } from '../schedule.js';
import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { triggerFire } from '../storage/schedules.js';
import { storageFor } from '../storage/storage.js';
import { readTaskIn, type TaskState } from '../storage/tasks.js';

/** A schedule as operators see it (`berth schedules`, the dashboard). */
export interface ScheduleInfo {
  name: string;
  cron: string;
  timeZone: string;
  taskType: string;
  payload: unknown;
  queue: string;
  priority: number;
  maxAttempts: number | null;
  misfire: string;
  misfireCap: number;
  misfireGraceMs: number;
  /** The handler's ceiling for its tasks (ms, at most the type's); null: the task type's own. */
  ceilingMs: number | null;
  /** When it fires next (null while paused or stale: it does not fire then). */
  nextFireAt: Date | null;
  /** The instant it last fired, and when that fire committed. */
  lastInstant: Date | null;
  lastFiredAt: Date | null;
  lastTaskId: string | null;
  /** The last fired task's state now (`completed`, `dead`, `running`, …); null when none, or no longer known. */
  lastTaskState: TaskState | null;
  /** No running worker declares it: kept, not fired. */
  stale: boolean;
  staleSince: Date | null;
  paused: boolean;
  pausedAt: Date | null;
  pausedBy: string | null;
  declaredBy: string | null;
  declaredAt: Date;
  /** Every instant up to this one has been fired or passed over. */
  firedThrough: Date;
}

interface Row {
  name: string;
  cron: string;
  time_zone: string;
  task_type: string;
  payload: unknown;
  queue: string;
  priority: number;
  max_attempts: number | null;
  misfire: string;
  misfire_cap: number;
  misfire_grace_ms: number;
  ceiling_ms: number | null;
  last_instant: Date | null;
  last_fired_at: Date | null;
  last_task_id: string | null;
  stale: boolean;
  stale_since: Date | null;
  paused: boolean;
  paused_at: Date | null;
  paused_by: string | null;
  declared_by: string | null;
  declared_at: Date;
  fired_through: Date;
  now: Date;
}

/** Every schedule by name, or the one named. */
async function readSchedules(db: Queryable, schema: string, name: string | null): Promise<ScheduleInfo[]> {
  const storage = storageFor(schema);
  try {
    const res = await db.query<Row>(
      storage
        .statement('admin-schedules-list', ({ q: s }) =>
          positional(
            `SELECT name, cron, time_zone, task_type, payload, queue, priority, max_attempts, misfire, misfire_cap,
                    misfire_grace_ms, ceiling_ms, last_instant, last_fired_at, last_task_id::text AS last_task_id, stale,
                    stale_since, paused, paused_at, paused_by, declared_by, declared_at, fired_through,
                    clock_timestamp() AS now
               FROM ${s}.schedules WHERE $1::text IS NULL OR name = $1 ORDER BY name`,
            ['name'],
          ),
        )
        .query({ name }),
    );
    const out: ScheduleInfo[] = [];
    for (const r of res.rows) {
      const task = r.last_task_id === null ? null : await readTaskIn(db, storage, r.last_task_id);
      out.push({
        name: r.name,
        cron: r.cron,
        timeZone: r.time_zone,
        taskType: r.task_type,
        payload: r.payload,
        queue: r.queue,
        priority: r.priority,
        maxAttempts: r.max_attempts,
        misfire: r.misfire,
        misfireCap: r.misfire_cap,
        misfireGraceMs: r.misfire_grace_ms,
        ceilingMs: r.ceiling_ms,
        nextFireAt: r.paused || r.stale ? null : nextFire(r),
        lastInstant: r.last_instant,
        lastFiredAt: r.last_fired_at,
        lastTaskId: r.last_task_id,
        lastTaskState: task?.state ?? null,
        stale: r.stale,
        staleSince: r.stale_since,
        paused: r.paused,
        pausedAt: r.paused_at,
        pausedBy: r.paused_by,
        declaredBy: r.declared_by,
        declaredAt: r.declared_at,
        firedThrough: r.fired_through,
      });
    }
    return out;
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/** The next instant after both the watermark and now (a row written by hand may not parse: null). */
function nextFire(r: Row): Date | null {
  try {
    const from = r.fired_through.getTime() > r.now.getTime() ? r.fired_through : r.now;
    return cronOf(r.cron, r.time_zone).nextRun(from);
  } catch {
    return null;
  }
}

export function listSchedules(db: Queryable, schema: string): Promise<ScheduleInfo[]> {
  return readSchedules(db, schema, null);
}

/** One schedule, or a BerthInputError when there is none of that name. */
export async function getSchedule(db: Queryable, schema: string, name: string): Promise<ScheduleInfo> {
  const [found] = await readSchedules(db, schema, checkName(name));
  if (found === undefined) throw new BerthInputError(`no schedule named "${name}"`);
  return found;
}

function checkName(name: string): string {
  return checkText(name, 'schedule name', '', { maxChars: 200, nonEmpty: true });
}

/**
 * Pause (`paused: true`) or resume a schedule. A pause stops firing until resumed; it is kept in
 * the database, so it survives restarts and redeploys (a worker declaring the schedule again
 * leaves it alone); a task already enqueued is left alone. A resume does not run the instants
 * that passed while paused: the watermark moves to now, and the next instant fires as usual.
 */
export async function setSchedulePaused(
  db: Queryable,
  schema: string,
  name: string,
  actor: string,
  paused: boolean,
): Promise<{ name: string; paused: boolean; changed: boolean }> {
  checkText(actor, 'actor', '', { maxChars: MAX_ACTOR_CHARS, nonEmpty: true });
  const res = await db.query<{ changed: boolean }>(
    storageFor(schema)
      .statement('admin-schedules-pause', ({ q: s }) =>
        positional(
          `WITH old AS (SELECT name, paused FROM ${s}.schedules WHERE name = $1 FOR UPDATE)
           UPDATE ${s}.schedules sc
              SET paused = $2, paused_at = CASE WHEN $2 THEN now() END, paused_by = CASE WHEN $2 THEN $3 END,
                  fired_through = CASE WHEN NOT $2 AND old.paused THEN greatest(sc.fired_through, now())
                                       ELSE sc.fired_through END
             FROM old WHERE sc.name = old.name
           RETURNING old.paused IS DISTINCT FROM $2 AS changed`,
          ['name', 'paused', 'actor'],
        ),
      )
      .query({ name: checkName(name), paused, actor }),
  );
  const row = res.rows[0];
  if (row === undefined) throw new BerthInputError(`no schedule named "${name}"`);
  return { name, paused, changed: row.changed };
}

/**
 * Enqueue one run of a schedule now, as it declares its task, without moving it: its next
 * instant still fires. The task's `ctx.schedule` says it was triggered, at this host's time.
 */
export async function triggerSchedule(
  db: Queryable,
  schema: string,
  name: string,
): Promise<{ name: string; taskId: string; instant: Date }> {
  const instant = new Date();
  try {
    const r = await triggerFire(db, storageFor(schema), checkName(name), instant);
    if (r === null) throw new BerthInputError(`no schedule named "${name}"`);
    return { name, taskId: r.taskId, instant };
  } catch (err) {
    throw notMigrated(err, schema);
  }
}
