import type { Queryable } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import { laneBacklogJoins, laneDepth, laneDueDeferred } from './predicates.js';
import type { Storage } from './storage.js';

/**
 * Fleet-wide queue limits (`queue_limits`, migration 28): at most `max_running` tasks of a queue
 * running across every worker, and at most `rate_limit` starts per `rate_interval_ms`. The
 * database keeps them: the limited claim (processor/claim-limited.ts) asks `limit_capacity()`
 * how many may start, under the queue's row lock, and records what it took with
 * `hold_leases()` in the same transaction. docs/architecture.md, "Queue limits".
 */

/** A queue's limits as stored; null where a limit is not set. */
export interface QueueLimitRow {
  queue: string;
  maxRunning: number | null;
  rateLimit: number | null;
  rateIntervalMs: number | null;
}

/** A limit and how full it is now. */
export interface QueueLimitUsage extends QueueLimitRow {
  /** Tasks of the queue running now (leased and not settled), counted by the limit. */
  running: number;
  /** Starts within the last rate interval (0 when no rate limit is set). */
  started: number;
  updatedAt: Date;
  updatedBy: string;
}

/** What `limit_capacity()` answers. */
export interface Capacity {
  /** How many tasks may start now (at most the `want` asked for). */
  free: number;
  /** Under a rate limit that bounds `free`: when (ms from now) its oldest start leaves the window. */
  retryMs: number | null;
  /** Under a rate limit: how long after its start is recorded a task's handler may still start. */
  guardMs: number | null;
}

/**
 * How many tasks of `queue` may start now, at most `want`: locks the queue's limit row until the
 * caller's transaction ends, so it must run inside the limited claim's transaction. 0 when the
 * queue is at a limit, or has none any more.
 */
export async function limitCapacity(db: Queryable, storage: Storage, queue: string, want: number): Promise<Capacity> {
  const statement = storage.statement('limit-capacity', ({ q: s }) =>
    compile(sql`SELECT free, retry_ms, guard_ms FROM ${s}.limit_capacity(${p('queue')}::text, ${p('want')}::integer)`),
  );
  const res = await db.query<{ free: number; retry_ms: number | null; guard_ms: number | null }>(
    statement.query({ queue, want }),
  );
  const row = res.rows[0];
  return { free: row?.free ?? 0, retryMs: row?.retry_ms ?? null, guardMs: row?.guard_ms ?? null };
}

/** The range leases a limited claim took (one per lane), by their keys. */
export interface HeldLease {
  segment: number;
  laneId: number;
  leaseFrom: string;
}

/** Record `leases` as holders of `queue`'s capacity (and as starts, under a rate limit). */
export async function holdLeases(
  db: Queryable,
  storage: Storage,
  queue: string,
  leases: readonly HeldLease[],
): Promise<void> {
  if (leases.length === 0) return;
  const statement = storage.statement('limit-hold', ({ q: s }) =>
    compile(
      sql`SELECT ${s}.hold_leases(${p('queue')}::text, ${p('slots')}::smallint[], ${p('lanes')}::integer[],
                                 ${p('froms')}::bigint[]) AS held`,
    ),
  );
  await db.query(
    statement.query({
      queue,
      slots: leases.map((l) => l.segment),
      lanes: leases.map((l) => l.laneId),
      froms: leases.map((l) => l.leaseFrom),
    }),
  );
}

/** Every limit, with how many tasks it counts as running and its starts in the current interval. */
export async function limitUsage(db: Queryable, storage: Storage): Promise<QueueLimitUsage[]> {
  const statement = storage.statement('limit-usage', ({ q: s }) =>
    compile(
      sql`SELECT queue, max_running, running, rate_limit, rate_interval_ms, started, updated_at, updated_by
            FROM ${s}.limit_usage()
           ORDER BY queue`,
    ),
  );
  const res = await db.query<UsageRow>(statement.query({}));
  return res.rows.map(usageOf);
}

/** A limit, how full it is, and what it holds back now. */
export interface QueueLimitStatus extends QueueLimitUsage {
  /**
   * The queue is at a limit now: running >= maxRunning, or starts in the interval >= the rate
   * limit. Its due tasks then wait for the limit, not for a worker: they are held, not starved.
   */
  atLimit: boolean;
  /**
   * Due tasks of the queue waiting while it is at a limit (ready entries nobody leased, and due
   * deferred rows not yet promoted, these counted up to DUE_COUNT_CAP per lane); 0 below its limits.
   */
  heldTasks: number;
}

/**
 * Every limit with its usage (limit_usage()) and, for the queues at a limit now, their due tasks
 * waiting, from index probes per lane (the lane stats' own expressions). The CLI's `limits list`
 * and `stats`, the dashboard and the leader's gauges all read it, so they agree on which queue is
 * held and by how much.
 *
 * Two statements, the second only when a queue is at a limit: the waiting count joins every ring
 * partition, and as one statement with the usage it was planned on every read, limits or none. On
 * an idle schema without limits that plan took ~10 ms of server CPU each gauge run on a session
 * that had not planned it before (30 ms in three runs, pg_stat_statements over a 20 s pickup
 * run), in a burst with the other gauge reads that the pickups running then waited behind
 * (docs/benchmarks-journal.md, "Issue 35's sixteenth round"). A queue's usage and its waiting
 * count are now read a moment apart; a gauge is a reading of a moment either way.
 */
export async function limitStatus(db: Queryable, storage: Storage): Promise<QueueLimitStatus[]> {
  const status = (await limitUsage(db, storage)).map((usage) => {
    const atLimit =
      (usage.maxRunning !== null && usage.running >= usage.maxRunning) ||
      (usage.rateLimit !== null && usage.started >= usage.rateLimit);
    return { ...usage, atLimit, heldTasks: 0 };
  });
  const held = status.filter((l) => l.atLimit).map((l) => l.queue);
  if (held.length === 0) return status;
  const waiting = storage.statement('limit-waiting', ({ name, q: s }) =>
    compile(
      sql`SELECT l.queue, sum(${laneDepth(s, 'l')} + ${laneDueDeferred(s, 'l')})::text AS waiting
            FROM ${s}.lanes l
            ${laneBacklogJoins(s, 'l')}
           WHERE l.queue = ANY(${p('queues')}::text[])
           GROUP BY l.queue`,
      `berth-limit-waiting:${name}`,
    ),
  );
  const res = await db.query<{ queue: string; waiting: string }>(waiting.query({ queues: held }));
  const byQueue = new Map(res.rows.map((r) => [r.queue, Number(r.waiting)]));
  for (const l of status) if (l.atLimit) l.heldTasks = byQueue.get(l.queue) ?? 0;
  return status;
}

/** A row of limit_usage(). */
interface UsageRow {
  queue: string;
  max_running: number | null;
  running: number;
  rate_limit: number | null;
  rate_interval_ms: number | null;
  started: number;
  updated_at: Date;
  updated_by: string;
}

function usageOf(r: UsageRow): QueueLimitUsage {
  return {
    queue: r.queue,
    maxRunning: r.max_running,
    running: r.running,
    rateLimit: r.rate_limit,
    rateIntervalMs: r.rate_interval_ms,
    started: r.started,
    updatedAt: r.updated_at,
    updatedBy: r.updated_by,
  };
}

/**
 * Set a queue's limits (any of them non-null) or clear them (all null), as `actor`: an
 * operator's statement (the schema owner or an operator role; no runtime role may call it).
 * `keep`: leave the running limit or the rate as stored (merged under the queue's lock, so two
 * changes of different limits at once both hold). Answers how many of the queue's lanes changed
 * between limited and not.
 */
export async function setQueueLimitRow(
  db: Queryable,
  storage: Storage,
  limit: QueueLimitRow,
  actor: string,
  keep: { maxRunning: boolean; rate: boolean } = { maxRunning: false, rate: false },
): Promise<number> {
  const statement = storage.statement('limit-set', ({ q: s }) =>
    compile(
      sql`SELECT ${s}.set_queue_limit(${p('queue')}::text, ${p('maxRunning')}::integer, ${p('rateLimit')}::integer,
                                      ${p('rateIntervalMs')}::integer, ${p('actor')}::text,
                                      ${p('keepMax')}::boolean, ${p('keepRate')}::boolean) AS lanes`,
    ),
  );
  const res = await db.query<{ lanes: number }>(
    statement.query({
      queue: limit.queue,
      maxRunning: limit.maxRunning,
      rateLimit: limit.rateLimit,
      rateIntervalMs: limit.rateIntervalMs,
      actor,
      keepMax: keep.maxRunning,
      keepRate: keep.rate,
    }),
  );
  return res.rows[0]?.lanes ?? 0;
}
