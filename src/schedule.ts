import { Cron } from 'croner';
import { BerthInputError } from './errors.js';
import {
  checkInteger,
  checkKeys,
  checkMs,
  checkPayloadJson,
  checkText,
  MAX_ATTEMPTS_LIMIT,
  MAX_QUEUE_BYTES,
  MAX_TIMER_MS,
} from './limits.js';
import { checkPayload, type AnyTaskDefinition, type ScheduleFire } from './task.js';
import type { TaskPayload, TaskTypeLike, TaskTypeName } from './task-type.js';

/**
 * What a schedule does with the instants it missed while no leader could fire it (the whole
 * fleet down, the schedule stale): `skip` them (the default, as graphile-worker's crontab and
 * River's periodic jobs), run `once` for all of them (one task, standing for the latest), or run
 * `all` of them, the most recent `misfireCap` at most.
 */
export type MisfirePolicy = 'skip' | 'once' | 'all';
export const MISFIRE_POLICIES: readonly MisfirePolicy[] = ['skip', 'once', 'all'];

/** What `defineSchedule` takes besides the task and its payload. */
export interface ScheduleFields {
  /** Unique per schema: letters, digits and `_ . : / -`, at most 200 characters. */
  name: string;
  /**
   * A cron expression: five fields (minute hour day-of-month month day-of-week), or six with
   * seconds first. Parsed by croner; day-of-month and day-of-week combine with OR, as in Vixie cron.
   */
  cron: string;
  /** The IANA time zone the expression is read in. Default `UTC`. */
  timeZone?: string;
  /** Default: the task definition's queue, else `default`. */
  queue?: string;
  /** Lower runs first. Default 0. */
  priority?: number;
  /** Default: the worker's definition at claim. */
  maxAttempts?: number;
  /** What happens to instants missed while no leader fired them (see MisfirePolicy). Default `skip`. */
  misfire?: MisfirePolicy;
  /** For `misfire: 'all'`: the most missed instants run (the latest ones). Default 10, at most 1000. */
  misfireCap?: number;
  /**
   * An instant fired at most this late is on time, not missed: a leader failover or a short
   * outage does not drop a fire. Default 60 s.
   */
  misfireGraceMs?: number;
  /**
   * The handler's ceiling for the tasks this schedule fires, in ms: at most the task
   * definition's `ceilingMs`, which it may only shorten (the lease, and so the wait after a
   * crash, is still the type's). Default: the definition's.
   */
  ceilingMs?: number;
}

/** A schedule of a task definition: its payload typed by the definition, checked by its schema. */
export type ScheduleInput<P> = ScheduleFields & { task: TaskTypeLike<P>; payload: NoInfer<P> };

/** A schedule of a task named in the TaskRegistry (docs/api.md, "Typed producers"). */
export type NamedScheduleInput<T extends TaskTypeName> = ScheduleFields & { task: T; payload: TaskPayload<T> };

/** A declared schedule, every field checked and every default filled in (the Worker's `schedules`). */
export interface ScheduleDefinition {
  readonly name: string;
  readonly cron: string;
  readonly timeZone: string;
  readonly taskType: string;
  /** The definition passed, if one was: its schema validates the payload. */
  readonly task: TaskTypeLike<unknown> | null;
  readonly payload: unknown;
  readonly queue: string | null;
  readonly priority: number;
  readonly maxAttempts: number | null;
  readonly misfire: MisfirePolicy;
  readonly misfireCap: number;
  readonly misfireGraceMs: number;
  /** The handler's ceiling for its tasks (ms, at most the type's); null: the task definition's. */
  readonly ceilingMs: number | null;
}

export const SCHEDULE_DEFAULTS = Object.freeze({
  timeZone: 'UTC',
  priority: 0,
  misfire: 'skip' as MisfirePolicy,
  misfireCap: 10,
  misfireGraceMs: 60_000,
});
export const MAX_MISFIRE_CAP = 1000;
const MAX_NAME_CHARS = 200;
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.:/-]*$/;
const KEYS: ReadonlySet<string> = new Set([
  'name',
  'cron',
  'timeZone',
  'task',
  'payload',
  'queue',
  'priority',
  'maxAttempts',
  'misfire',
  'misfireCap',
  'misfireGraceMs',
  'ceilingMs',
]);
/** What other crontabs call a field berth names differently. */
const HINTS: Readonly<Record<string, string>> = {
  pattern: 'cron',
  expression: 'cron',
  schedule: 'cron',
  tz: 'timeZone',
  timezone: 'timeZone',
  identifier: 'name',
  type: 'task',
  args: 'payload',
  backfillPeriod: 'misfire',
  timeout: 'ceilingMs',
  ceiling: 'ceilingMs',
};

/**
 * Declare a recurring task: a name, a cron expression in a time zone, and the task it enqueues
 * at each instant, typed as `enqueue` types it (a definition's payload type, or a registered
 * name's). Checked at once: a bad expression, time zone or option is a BerthInputError naming
 * the schedule and the field. The Worker checks it again against its own task definitions.
 */
export function defineSchedule<P>(input: ScheduleInput<P>): ScheduleDefinition;
export function defineSchedule<T extends TaskTypeName>(input: NamedScheduleInput<T>): ScheduleDefinition;
export function defineSchedule(input: ScheduleFields & { task: string | TaskTypeLike<unknown>; payload: unknown }) {
  return resolveSchedule(input);
}

/** The definitions `defineSchedule` made: already checked, taken as they are. */
const DEFINED = new WeakSet<object>();

/** A schedule checked on its own: everything but its task type's definition in a worker. */
export function resolveSchedule(input: unknown): ScheduleDefinition {
  if (typeof input === 'object' && input !== null && DEFINED.has(input)) return input as ScheduleDefinition;
  if (typeof input !== 'object' || input === null || Array.isArray(input))
    throw new BerthInputError('a schedule must be an object (defineSchedule({ name, cron, task, payload }))');
  const raw = input as Record<string, unknown>;
  const rawName = raw.name;
  if (typeof rawName !== 'string' || rawName.length === 0 || rawName.length > MAX_NAME_CHARS || !NAME.test(rawName)) {
    throw new BerthInputError(
      `schedule ${typeof rawName === 'string' ? `"${rawName.slice(0, 60)}"` : '(unnamed)'}: name must be 1-${MAX_NAME_CHARS} characters of letters, digits and _ . : / - (starting with a letter or digit)`,
    );
  }
  const name = rawName;
  const where = `schedule "${name}"`;
  checkKeys(raw, KEYS, where, HINTS);
  const timeZone = raw.timeZone === undefined ? SCHEDULE_DEFAULTS.timeZone : checkTimeZone(raw.timeZone, where);
  if (typeof raw.cron !== 'string') throw new BerthInputError(`${where}: cron must be a string such as "0 3 * * *"`);
  const cron = raw.cron.trim();
  cronOf(cron, timeZone, where);
  const task = raw.task;
  let taskType: string;
  let def: TaskTypeLike<unknown> | null = null;
  if (typeof task === 'string') taskType = task;
  else if (typeof task === 'object' && task !== null && typeof (task as { type?: unknown }).type === 'string') {
    def = task as TaskTypeLike<unknown>;
    taskType = def.type;
  } else throw new BerthInputError(`${where}: task must be a task definition or a task type name`);
  checkText(taskType, 'task', where, { maxChars: 200, nonEmpty: true });
  if (!('payload' in raw)) throw new BerthInputError(`${where}: payload is required (use null for none)`);
  const json = JSON.stringify(raw.payload);
  if (json === undefined) throw new BerthInputError(`${where}: payload must be JSON-serialisable`);
  checkPayloadJson(json, where, taskType);
  const queueOption = raw.queue ?? def?.queue ?? null;
  const queue = queueOption === null ? null : checkText(queueOption, 'queue', where, { maxBytes: MAX_QUEUE_BYTES });
  const priority =
    raw.priority === undefined
      ? SCHEDULE_DEFAULTS.priority
      : checkInteger(raw.priority, 'priority', where, -32768, 32767);
  const maxAttemptsOption = raw.maxAttempts ?? def?.maxAttempts;
  const maxAttempts =
    maxAttemptsOption === undefined
      ? null
      : checkInteger(maxAttemptsOption, 'maxAttempts', where, 1, MAX_ATTEMPTS_LIMIT);
  const misfire = raw.misfire ?? SCHEDULE_DEFAULTS.misfire;
  if (!(MISFIRE_POLICIES as readonly unknown[]).includes(misfire))
    throw new BerthInputError(
      `${where}: misfire must be one of ${MISFIRE_POLICIES.join(', ')} (got ${JSON.stringify(misfire)})`,
    );
  const misfireCap =
    raw.misfireCap === undefined
      ? SCHEDULE_DEFAULTS.misfireCap
      : checkInteger(raw.misfireCap, 'misfireCap', where, 1, MAX_MISFIRE_CAP);
  const misfireGraceMs =
    raw.misfireGraceMs === undefined
      ? SCHEDULE_DEFAULTS.misfireGraceMs
      : checkMs(raw.misfireGraceMs, 'misfireGraceMs', where, 0, 24 * 3600_000);
  // Bounded as a definition's ceilingMs (a Node timer), and whole milliseconds for the column:
  // rounded down, so a schedule's ceiling never comes out longer than the value it was given.
  const ceilingMs =
    raw.ceilingMs === undefined
      ? null
      : Math.floor(checkMs(raw.ceilingMs, 'ceilingMs', where, 1, MAX_TIMER_MS, " (Node's timer limit, 24.8 days)"));
  const definition: ScheduleDefinition = Object.freeze({
    name,
    cron,
    timeZone,
    taskType,
    task: def,
    payload: JSON.parse(json) as unknown,
    queue,
    priority,
    maxAttempts,
    misfire: misfire as MisfirePolicy,
    misfireCap,
    misfireGraceMs: Math.round(misfireGraceMs),
    ceilingMs,
  });
  DEFINED.add(definition);
  return definition;
}

/**
 * A worker's `schedules` against its `tasks`: each checked, names unique, each task type one of
 * the worker's definitions, and each payload valid by that definition's schema when the schema
 * answers at once (an asynchronous schema is checked when the worker starts: `checkScheduleAsync`).
 */
export function resolveSchedules(
  schedules: unknown,
  defs: ReadonlyMap<string, AnyTaskDefinition>,
): ScheduleDefinition[] {
  if (schedules === undefined) return [];
  if (!Array.isArray(schedules)) throw new BerthInputError('schedules must be an array of defineSchedule(…) values');
  const seen = new Set<string>();
  return schedules.map((s: unknown) => {
    const d = resolveSchedule(s);
    const where = `schedule "${d.name}"`;
    if (seen.has(d.name)) throw new BerthInputError(`${where} is declared twice`);
    seen.add(d.name);
    const def = defs.get(d.taskType);
    if (def === undefined) {
      throw new BerthInputError(
        `${where}: task "${d.taskType}" is not one of this worker's task definitions (${[...defs.keys()].join(', ') || 'none'})`,
      );
    }
    if (d.ceilingMs !== null && d.ceilingMs > def.ceilingMs) {
      throw new BerthInputError(
        `${where}: ceilingMs ${d.ceilingMs} is above task "${d.taskType}"'s ceilingMs ${def.ceilingMs}: a schedule may only shorten its task's ceiling, since the lease (and the wait after a crash) is derived from the type's ceiling at claim`,
      );
    }
    const check = checkPayload(def, d.payload);
    if (!(check instanceof Promise) && !check.ok) throw new BerthInputError(`${where}: payload: ${check.message}`);
    return d;
  });
}

/** The payload check a schema with an asynchronous validate could not give at construction. */
export async function checkScheduleAsync(d: ScheduleDefinition, def: AnyTaskDefinition): Promise<void> {
  const check = await checkPayload(def, d.payload);
  if (!check.ok) throw new BerthInputError(`schedule "${d.name}": payload: ${check.message}`);
}

function checkTimeZone(value: unknown, where: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > 100)
    throw new BerthInputError(`${where}: timeZone must be an IANA time zone name such as "Europe/Berlin"`);
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: value });
  } catch {
    throw new BerthInputError(
      `${where}: timeZone "${value}" is not a time zone this runtime knows (an IANA name such as "Europe/Berlin")`,
    );
  }
  return value;
}

/**
 * The croner job of an expression (never started: berth computes instants, the leader fires
 * them). Five fields, or six with seconds; anything else, or an expression that never matches,
 * is a BerthInputError naming the schedule.
 */
export function cronOf(cron: string, timeZone: string, where = 'schedule'): Cron {
  let job: Cron;
  try {
    job = new Cron(cron, { timezone: timeZone, paused: true, mode: '5-or-6-parts' });
  } catch (err) {
    throw new BerthInputError(`${where}: cron "${cron}" is not a valid expression: ${(err as Error).message}`);
  }
  if (job.nextRun(new Date()) === null) throw new BerthInputError(`${where}: cron "${cron}" has no future instant`);
  return job;
}

/** The instants of `job` in (after, until], oldest first, at most `limit`. */
export function instantsBetween(job: Cron, after: Date, until: Date, limit: number): Date[] {
  const out: Date[] = [];
  let at: Date | null = after;
  while (out.length < limit) {
    at = job.nextRun(at);
    if (at === null || at.getTime() > until.getTime()) break;
    out.push(at);
  }
  return out;
}

/** The latest instant of `job` at or before `at`, or null. */
export function latestInstant(job: Cron, at: Date): Date | null {
  // previousRuns is exclusive of its reference: a millisecond later includes `at` itself.
  return job.previousRuns(1, new Date(at.getTime() + 1))[0] ?? null;
}

/**
 * The longest gap between consecutive instants over the next `runs` (ms): what the alert on a
 * schedule that has not fired compares against (an irregular expression such as weekdays at 9
 * is judged by its weekend gap, not by its weekday one).
 */
export function intervalMsOf(job: Cron, from = new Date(), runs = 16): number {
  const next = job.nextRuns(runs, from);
  let longest = 0;
  for (let i = 1; i < next.length; i++) longest = Math.max(longest, next[i]!.getTime() - next[i - 1]!.getTime());
  return longest || 365 * 24 * 3600_000;
}

const FIRE_PREFIX = 'berth-schedule:';
const TRIGGER_PREFIX = 'berth-schedule-trigger:';

/**
 * The dedupe key of a fire: the schedule and the instant. While the task is pending it refuses a
 * second task for the same instant; the schedule's watermark refuses it after (docs/architecture.md,
 * "Schedules"). The task carries it through retries, so `ctx.schedule` is read from it at no cost.
 */
export function fireDedupeKey(name: string, instant: Date, triggered = false): string {
  return `${triggered ? TRIGGER_PREFIX : FIRE_PREFIX}${name}@${instant.toISOString()}`;
}

/**
 * Whether a dedupe key is one a schedule's fire (or trigger) uses. Producers may not enqueue with
 * one: a task holding a fire's key would stand in for that fire (the leader's enqueue finds it
 * and records it as the instant's task, so the schedule's own task never runs) and would carry a
 * forged `ctx.schedule`.
 */
export function isScheduleKey(key: string): boolean {
  return key.startsWith(FIRE_PREFIX) || key.startsWith(TRIGGER_PREFIX);
}

/** The fire a dedupe key names, or null for any other key. */
export function fireOfDedupeKey(key: string | null): ScheduleFire | null {
  if (key === null) return null;
  const triggered = key.startsWith(TRIGGER_PREFIX);
  if (!triggered && !key.startsWith(FIRE_PREFIX)) return null;
  const rest = key.slice(triggered ? TRIGGER_PREFIX.length : FIRE_PREFIX.length);
  const at = rest.lastIndexOf('@');
  if (at <= 0) return null;
  const instant = new Date(rest.slice(at + 1));
  if (Number.isNaN(instant.getTime())) return null;
  return Object.freeze({ name: rest.slice(0, at), instant, triggered });
}
