import pg from 'pg';
import { BerthInputError, orNotMigrated } from '../errors.js';
import { checkInteger, checkKeys, checkText, MAX_ACTOR_CHARS, MAX_QUEUE_BYTES, MAX_TYPE_CHARS } from '../limits.js';
import type { Logger } from '../logger.js';
import {
  type HeldKey,
  heldKeys,
  heldSummary,
  type KeyLimitRow,
  keyLimits,
  setKeyLimitRow,
  topHeldKeys,
} from '../storage/keys.js';
import type { Queryable } from '../sql.js';
import {
  limitStatus,
  limitUsage,
  type QueueLimitStatus,
  type QueueLimitUsage,
  setQueueLimitRow,
} from '../storage/limits.js';
import { storageFor } from '../storage/storage.js';
import { durationText, parseDuration } from '../util/duration.js';
import { audited } from './audit.js';

export type { QueueLimitStatus, QueueLimitUsage } from '../storage/limits.js';
export type { HeldKey, KeyLimitRow } from '../storage/keys.js';

/** The most tasks a running limit or a rate limit may name. */
export const MAX_LIMIT = 1_000_000;
/** The longest rate interval: a day. */
export const MAX_RATE_INTERVAL_MS = 86_400_000;

/** A rate limit: at most `limit` task starts in any `intervalMs` window, across the fleet. */
export interface RateLimit {
  limit: number;
  intervalMs: number;
}

/**
 * What `setQueueLimit` changes. A field left out keeps its current value; `null` removes that
 * limit. A queue with neither limit left is no longer limited.
 */
export interface QueueLimitChange {
  /** At most this many of the queue's tasks running at once, across every worker. */
  maxRunning?: number | null;
  /** At most `limit` starts per `intervalMs`, across every worker. */
  rate?: RateLimit | null;
}

const CHANGE_KEYS: ReadonlySet<string> = new Set(['maxRunning', 'rate']);
const CHANGE_HINTS: Readonly<Record<string, string>> = {
  concurrency: 'maxRunning',
  maxConcurrency: 'maxRunning',
  limit: 'maxRunning',
  max: 'maxRunning',
  rateLimit: 'rate',
};
const RATE_KEYS: ReadonlySet<string> = new Set(['limit', 'intervalMs']);
const RATE_HINTS: Readonly<Record<string, string>> = {
  count: 'limit',
  max: 'limit',
  interval: 'intervalMs',
  duration: 'intervalMs',
  per: 'intervalMs',
  perMs: 'intervalMs',
};

/**
 * Set or change a queue's fleet-wide limits, as `actor`. Takes effect at once: the next claim
 * of the queue on any worker counts it, and tasks of the queue already running count against
 * it. The queue must exist (a task was enqueued to it, or it is paused). Needs the schema owner
 * or an operator role. Returns the limits now in force.
 */
export async function setQueueLimit(
  db: Queryable,
  schema: string,
  queue: string,
  change: QueueLimitChange,
  actor: string,
): Promise<QueueLimitUsage | null> {
  const name = checkText(queue, 'queue', 'setQueueLimit', { maxBytes: MAX_QUEUE_BYTES });
  const who = checkText(actor, 'actor', 'setQueueLimit', { maxChars: MAX_ACTOR_CHARS });
  if (typeof change !== 'object' || change === null || Array.isArray(change))
    throw new BerthInputError('setQueueLimit: the change must be an object ({ maxRunning, rate })');
  checkKeys(change, CHANGE_KEYS, 'setQueueLimit', CHANGE_HINTS);
  const maxRunning =
    change.maxRunning === undefined || change.maxRunning === null
      ? change.maxRunning
      : checkInteger(change.maxRunning, 'maxRunning', 'setQueueLimit', 1, MAX_LIMIT);
  const rate = change.rate === undefined || change.rate === null ? change.rate : checkRate(change.rate);
  const storage = storageFor(schema);
  const next = {
    queue: name,
    maxRunning: maxRunning ?? null,
    rateLimit: rate?.limit ?? null,
    rateIntervalMs: rate?.intervalMs ?? null,
  };
  // A field left out is kept as stored: merged by the database under the queue's lock.
  const keep = { maxRunning: maxRunning === undefined, rate: rate === undefined };
  try {
    await orNotMigrated(schema, () => setQueueLimitRow(db, storage, next, who, keep));
  } catch (err) {
    // The database's own refusal (a queue that does not exist): the caller's input, not a fault.
    if (err instanceof pg.DatabaseError && err.code === '22023' && err.message.startsWith('berth: set_queue_limit'))
      throw new BerthInputError(err.message.replace(/^berth: set_queue_limit: /, 'setQueueLimit: '));
    throw limitBusy(err, name);
  }
  return (await limitUsage(db, storage)).find((l) => l.queue === name) ?? null;
}

/** Remove every limit of a queue, as `actor`. Returns whether the queue had one. */
export async function clearQueueLimit(
  db: Queryable,
  schema: string,
  queue: string,
  actor: string,
): Promise<{ cleared: boolean }> {
  const name = checkText(queue, 'queue', 'clearQueueLimit', { maxBytes: MAX_QUEUE_BYTES });
  const who = checkText(actor, 'actor', 'clearQueueLimit', { maxChars: MAX_ACTOR_CHARS });
  const storage = storageFor(schema);
  const had = (await orNotMigrated(schema, () => limitUsage(db, storage))).some((l) => l.queue === name);
  await orNotMigrated(schema, () =>
    setQueueLimitRow(db, storage, { queue: name, maxRunning: null, rateLimit: null, rateIntervalMs: null }, who),
  ).catch((err: unknown) => {
    throw limitBusy(err, name);
  });
  return { cleared: had };
}

/**
 * Every queue limit, with how many tasks it counts as running, the starts in its interval,
 * whether the queue is at a limit now and how many due tasks that holds back.
 */
export async function listQueueLimits(db: Queryable, schema: string): Promise<QueueLimitStatus[]> {
  return orNotMigrated(schema, () => limitStatus(db, storageFor(schema)));
}

/**
 * setQueueLimit as an operator action, audited (`queue.limit`) under `actor`: what the CLI and
 * the dashboard run.
 */
export function setQueueLimitAudited(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: string,
  queue: string,
  change: QueueLimitChange,
): Promise<QueueLimitUsage | null> {
  return audited(db, schema, logger, actor, 'queue.limit', { queue, ...change }, () =>
    setQueueLimit(db, schema, queue, change, actor),
  );
}

/** clearQueueLimit as an operator action, audited (`queue.unlimit`) under `actor`. */
export function clearQueueLimitAudited(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: string,
  queue: string,
): Promise<{ cleared: boolean }> {
  return audited(db, schema, logger, actor, 'queue.unlimit', { queue }, () =>
    clearQueueLimit(db, schema, queue, actor),
  );
}

/**
 * A rate limit as operators write it, `<count>/<interval>` with the interval's unit: `20/1s`,
 * `100/1m`, `500/250ms`, `1000/1h` (the CLI's `--rate`, the dashboard's form). `field` names it
 * in the error.
 */
export function parseRate(text: string, field = 'rate'): RateLimit {
  const m = /^\s*(\d+)\s*\/\s*(\S+)\s*$/.exec(text);
  const interval = m ? parseDuration(m[2]!) : null;
  if (!m || !interval || 'error' in interval)
    throw new BerthInputError(
      `${field} must be a count and an interval with its unit, such as 20/1s or 100/1m (got ${JSON.stringify(text.slice(0, 40))})${interval && 'error' in interval ? `: ${interval.error}` : ''}`,
    );
  return {
    limit: checkInteger(Number(m[1]), `${field}'s count`, '', 1, MAX_LIMIT),
    intervalMs: checkInteger(interval.ms, `${field}'s interval (ms)`, '', 1, MAX_RATE_INTERVAL_MS),
  };
}

/** A rate limit as parseRate reads it: `20/1s`; null when there is none. */
export function rateText(limit: number | null, intervalMs: number | null): string | null {
  return limit === null || intervalMs === null ? null : `${limit}/${durationText(intervalMs)}`;
}

/**
 * set_queue_limit waits at most 2 s for the queue's limit row (a claim holds it for
 * milliseconds): past that, a clear error rather than PostgreSQL's lock timeout.
 */
function limitBusy(err: unknown, queue: string): unknown {
  if (err instanceof pg.DatabaseError && err.code === '55P03')
    return new Error(
      `the limits of queue "${queue}" are held by a claim that has not finished for 2 s (a stalled worker session?); nothing changed, try again`,
      { cause: err },
    );
  return err;
}

/** A rate limit `{ limit, intervalMs }` checked for `fn` (setQueueLimit, setTypeLimit). */
export function checkRate(value: unknown, fn = 'setQueueLimit'): RateLimit {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw new BerthInputError(`${fn}: rate must be an object { limit, intervalMs } or null`);
  checkKeys(value, RATE_KEYS, `${fn}: rate`, RATE_HINTS);
  const r = value as Record<string, unknown>;
  return {
    limit: checkInteger(r.limit, 'rate.limit', fn, 1, MAX_LIMIT),
    intervalMs: checkInteger(r.intervalMs, 'rate.intervalMs', fn, 1, MAX_RATE_INTERVAL_MS),
  };
}

/** Whose key limit: a queue's tasks, or a task type's (a type's limit wins over its queue's). */
export type KeyLimitTarget = { queue: string; type?: undefined } | { type: string; queue?: undefined };

const TARGET_KEYS: ReadonlySet<string> = new Set(['queue', 'type']);

/**
 * Set (`perKey`, 1 to 1,000,000) or clear (null) how many tasks with the same concurrency key may
 * run at once: for the tasks of a queue, or of a task type (which wins). A key with no limit set
 * runs one task at a time. Takes effect at once: a raised limit admits held tasks within the
 * leader's next promotion tick. Needs the schema owner or an operator role.
 */
export async function setKeyLimit(
  db: Queryable,
  schema: string,
  target: KeyLimitTarget,
  perKey: number | null,
  actor: string,
): Promise<void> {
  const { scope, name } = keyTarget(target, 'setKeyLimit');
  const value = perKey === null ? null : checkInteger(perKey, 'perKey', 'setKeyLimit', 1, MAX_LIMIT);
  const who = checkText(actor, 'actor', 'setKeyLimit', { maxChars: MAX_ACTOR_CHARS });
  await orNotMigrated(schema, () => setKeyLimitRow(db, storageFor(schema), scope, name, value, who));
}

/** A key limit's target checked: exactly one of a queue or a task type, each within its bounds. */
function keyTarget(target: KeyLimitTarget, fn: string): { scope: 'queue' | 'type'; name: string } {
  if (typeof target !== 'object' || target === null || Array.isArray(target))
    throw new BerthInputError(`${fn}: the target must be { queue } or { type }`);
  checkKeys(target, TARGET_KEYS, fn, { task: 'type', taskType: 'type' });
  const hasQueue = target.queue !== undefined;
  if (hasQueue === (target.type !== undefined))
    throw new BerthInputError(`${fn}: the target names exactly one of queue or type`);
  return hasQueue
    ? { scope: 'queue', name: checkText(target.queue, 'queue', fn, { maxBytes: MAX_QUEUE_BYTES }) }
    : { scope: 'type', name: checkText(target.type, 'type', fn, { maxChars: MAX_TYPE_CHARS, nonEmpty: true }) };
}

/**
 * setKeyLimit as an operator action, audited (`key.limit`) under `actor`: what the CLI and the
 * dashboard run. Returns the limit now in force.
 */
export function setKeyLimitAudited(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: string,
  target: KeyLimitTarget,
  perKey: number,
): Promise<KeyLimitRow | null> {
  return audited(db, schema, logger, actor, 'key.limit', { ...target, perKey }, async () => {
    await setKeyLimit(db, schema, target, perKey, actor);
    const { scope, name } = keyTarget(target, 'setKeyLimit');
    return (await listKeyLimits(db, schema)).find((l) => l.scope === scope && l.name === name) ?? null;
  });
}

/**
 * Clear a key limit (its keys run one task at a time again, unless a type's or queue's other
 * limit applies), audited (`key.unlimit`) under `actor`. Returns whether there was one.
 */
export function clearKeyLimitAudited(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: string,
  target: KeyLimitTarget,
): Promise<{ cleared: boolean }> {
  return audited(db, schema, logger, actor, 'key.unlimit', { ...target }, async () => {
    const { scope, name } = keyTarget(target, 'clearKeyLimit');
    const had = (await listKeyLimits(db, schema)).some((l) => l.scope === scope && l.name === name);
    await setKeyLimit(db, schema, target, null, actor);
    return { cleared: had };
  });
}

/** Every key limit set, by scope and name. */
export async function listKeyLimits(db: Queryable, schema: string): Promise<KeyLimitRow[]> {
  return orNotMigrated(schema, () => keyLimits(db, storageFor(schema)));
}

/** The keys that have tasks waiting for them, oldest wait first, at most `limit` (default 100). */
export async function listHeldKeys(db: Queryable, schema: string, limit = 100): Promise<HeldKey[]> {
  const n = checkInteger(limit, 'limit', 'listHeldKeys', 1, 10_000);
  return orNotMigrated(schema, () => heldKeys(db, storageFor(schema), n));
}

/** The keys at a glance: `berth stats`'s keys section. */
export interface KeysSummary {
  /** Tasks held for their keys, in all. */
  heldTasks: number;
  /** Held tasks per queue. */
  heldByQueue: Record<string, number>;
  /** Keys with tasks held for them. */
  keysWaiting: number;
  /** Every key limit set. */
  limits: KeyLimitRow[];
  /** The keys with the most held tasks, at most `top` (default 5). */
  top: HeldKey[];
}

export async function keysSummary(db: Queryable, schema: string, top = 5): Promise<KeysSummary> {
  const n = checkInteger(top, 'top', 'keysSummary', 1, 1000);
  return orNotMigrated(schema, async () => {
    const storage = storageFor(schema);
    const [summary, limits] = await Promise.all([heldSummary(db, storage), keyLimits(db, storage)]);
    const heldByQueue = Object.fromEntries([...summary.heldByQueue].sort(([a], [b]) => a.localeCompare(b)));
    const heldTasks = Object.values(heldByQueue).reduce((a, b) => a + b, 0);
    return {
      heldTasks,
      heldByQueue,
      keysWaiting: summary.keysWaiting,
      limits,
      // Nothing held: the per-key read is skipped.
      top: heldTasks === 0 ? [] : await topHeldKeys(db, storage, n),
    };
  });
}
