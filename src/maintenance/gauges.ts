import { type Queryable, queryRingRead } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from '../storage/storage.js';
import { overWindow, readRingWindow, type RingWindow, windowKey } from '../storage/ring-window.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import { claimableEntry, deadRowPredicate, liveEntries } from '../storage/predicates.js';
import { liveWorker, liveWorkerParams } from '../storage/live-workers.js';
import { limitStatus, type QueueLimitStatus } from '../storage/limits.js';
import { heldSummary, type KeyLimitRow, keyLimits } from '../storage/keys.js';
import { type TypeLimitUsage, typeLimitUsage } from '../storage/type-limits.js';
import { type DependencyUsageRow, dependencyUsage } from '../storage/deps.js';

export interface GaugeSnapshot {
  pending: Map<string, number>;
  running: Map<string, number>;
  dead: Map<string, number>;
  oldestDueSeconds: number;
  /** Queues paused now. */
  pausedQueues: string[];
  /** Every queue limit: how full it is, and the due tasks it holds back (its queue is at a limit). */
  limits: QueueLimitStatus[];
  /** Tasks held for their concurrency key, by queue (queues with none left out). */
  keyHeldTasks: Map<string, number>;
  /** Concurrency keys with tasks held for them. */
  keysWaiting: number;
  /** Every key limit set. */
  keyLimits: KeyLimitRow[];
  /** Every task type rate limit: how full it is, and the tasks it paced. */
  typeLimits: TypeLimitUsage[];
  /** Tasks waiting on dependencies, and those blocked by a dead parent, by queue (queues with none left out). */
  dependencies: DependencyUsageRow[];
  /** Worker processes whose heartbeat is fresh. */
  workers: number;
}

/**
 * Read the queue-wide gauges (seed 000's four questions): pending (unfinished; includes
 * running), running (under a live lease), dead (same predicate as retention), and how long
 * the longest-waiting claimable task has been due. A paused queue's work is not claimable, so
 * it is left out of oldest-due: pausing a queue must not page as starvation. Nor is the work of
 * a queue at its limit now (running at its max, or its rate's starts used up): it waits for the
 * limit, which is what the limit is for (it shows as berth_queue_limit_held_tasks). A limited
 * queue below its limits is counted: work waiting there with the limit free is starvation.
 */
export async function readGauges(db: Queryable, schema: string): Promise<GaugeSnapshot> {
  const storage = storageFor(schema);
  return readGaugesIn(db, storage, await readRingWindow(db, storage));
}

/**
 * readGauges over a ring window read before (exported for its test: a window the ring moved past).
 *
 * The window is read in a statement of its own, so the counts may miss a segment that became
 * current after it. After the counts the window is read again: when it names no segment the
 * first one left out, every entry the counts' snapshot could see was in a segment they read (a
 * segment only gains entries while current, and the current one is in every window). A later
 * generation alone (an appender that raced a rotation bumps it) changes nothing then. Otherwise
 * the counts are read again over the new window, and after a second miss over the whole ring.
 */
export async function readGaugesIn(db: Queryable, storage: Storage, window: RingWindow): Promise<GaugeSnapshot> {
  const limits = await limitStatus(db, storage);
  const held = limits.filter((l) => l.atLimit).map((l) => l.queue);
  let counts = await readCounts(db, storage, window.segments, held);
  for (let misses = 0; window.segments !== null; misses++) {
    const now = await readRingWindow(db, storage);
    if (covers(window, now)) break;
    window = misses === 0 ? now : { ...now, segments: null };
    counts = await readCounts(db, storage, window.segments, held);
  }
  const [staleMs, futureMs] = liveWorkerParams();
  const fleet = await db.query<{ paused: string[]; workers: number }>(
    storage
      .statement('gauges-fleet', ({ q: s }) =>
        positional(
          `SELECT ARRAY(SELECT queue FROM ${s}.queue_pauses ORDER BY queue) AS paused,
            (SELECT count(*)::int FROM ${s}.workers w WHERE ${liveWorker('w', '$1', '$2')}) AS workers`,
          ['staleMs', 'futureMs'],
        ),
      )
      .query({ staleMs, futureMs }),
  );
  const { res, oldest } = counts;
  // One after another, not at once: at once on the leader's pool they took four sessions, each
  // planning its statement there for the first time (2-17 ms each, over the functions' own
  // statements), a burst on every core every 5 s that the pickups of the moment waited behind
  // (docs/benchmarks-journal.md, "Issue 35's sixteenth round"). One after another, each gets the
  // session the last one released (pg-pool hands out its most recently released first), where
  // it is planned already.
  const keyed = await heldSummary(db, storage);
  const keyLimitRows = await keyLimits(db, storage);
  const typeLimits = await typeLimitUsage(db, storage);
  const dependencies = await dependencyUsage(db, storage);
  const snap: GaugeSnapshot = {
    pending: new Map(),
    running: new Map(),
    dead: new Map(),
    oldestDueSeconds: 0,
    pausedQueues: fleet.rows[0]!.paused,
    limits,
    keyHeldTasks: keyed.heldByQueue,
    keysWaiting: keyed.keysWaiting,
    keyLimits: keyLimitRows,
    typeLimits,
    dependencies,
    workers: fleet.rows[0]!.workers,
  };
  for (const r of res.rows) {
    snap.pending.set(r.type, Number(r.pending));
    snap.dead.set(r.type, Number(r.dead));
    if (Number(r.running) > 0) snap.running.set(r.type, Number(r.running));
  }
  snap.oldestDueSeconds = Math.max(0, oldest.rows[0]?.secs ?? 0);
  return snap;
}

/** Whether counts over the window `read` saw every entry that the later window `now` can hold. */
function covers(read: RingWindow, now: RingWindow): boolean {
  if (now.generation === read.generation) return true;
  const segments = new Set(read.segments ?? []);
  return now.segments?.every((k) => segments.has(k)) ?? false;
}

/**
 * The per-type counts and the oldest due entry, over the ring window's segments (`segments`, or
 * the whole ring when null; see overWindow): one prepared statement per window and session,
 * like the claim's. The oldest due leaves out paused queues and the queues `held` (at a limit).
 */
async function readCounts(db: Queryable, storage: Storage, segments: readonly number[] | null, held: string[]) {
  const key = windowKey({ generation: '', segments });
  const pending = storage.statement(`gauges-pending${key}`, (schema) => {
    const { name, q: s } = schema;
    return positional(
      overWindow(
        `WITH live AS (
       SELECT r.type, r.expires_at FROM ${liveEntries(s)} r
     ), per_type AS (
       SELECT type, count(*) AS pending, count(*) FILTER (WHERE expires_at > now()) AS running, 0 AS dead
         FROM live GROUP BY type
       UNION ALL
       SELECT type, count(*), 0, 0 FROM ${s}.deferred GROUP BY type
       UNION ALL
       SELECT d.type, 0, 0, count(*) FROM ${s}.dead_letters d WHERE ${deadRowPredicate(s)} GROUP BY d.type
     )
     SELECT type, sum(pending)::text AS pending, sum(running)::text AS running, sum(dead)::text AS dead
       FROM per_type GROUP BY type`,
        schema,
        segments,
      ),
      [],
      `berth-gauges-pending:${name}${key}`,
    );
  });
  const res = await queryRingRead<{ type: string; pending: string; running: string; dead: string }>(db, pending);
  const oldestDue = storage.statement(`gauges-oldest${key}`, (schema) => {
    const { name, q: s } = schema;
    return positional(
      overWindow(
        `SELECT extract(epoch FROM now() - min(due))::float8 AS secs FROM (
       -- Unleased entries only: per unpaused lane, those past its cursor (no lease probe per entry).
       SELECT min(h.run_at) AS due FROM ${s}.lanes pl
        CROSS JOIN LATERAL (
          SELECT min(r.run_at) AS run_at FROM ${s}.ready r
           WHERE ${claimableEntry(s, 'pl')}) h
        WHERE NOT pl.paused AND pl.queue <> ALL ($1::text[])
       UNION ALL
       SELECT min(run_at) FROM ${s}.deferred
        WHERE run_at <= now() AND queue NOT IN (SELECT q.queue FROM ${s}.queue_pauses q)
          AND queue <> ALL ($1::text[])) x`,
        schema,
        segments,
      ),
      ['held'],
      `berth-gauges-oldest:${name}${key}`,
    );
  });
  const oldest = await queryRingRead<{ secs: number | null }>(db, oldestDue, oldestDue.values({ held }));
  return { res, oldest };
}

/** Stop exporting the queue-wide gauges (this process is no longer the leader). */
export function resetGauges(metrics: BerthMetrics): void {
  metrics.pending.reset();
  metrics.running.reset();
  metrics.dead.reset();
  metrics.oldestDueSeconds.reset();
  metrics.queuePaused.reset();
  for (const g of limitGauges(metrics)) g.reset();
  metrics.keyHeldTasks.reset();
  metrics.keysWaiting.reset();
  metrics.keyLimit.reset();
  for (const g of typeLimitGauges(metrics)) g.reset();
  metrics.tasksWaiting.reset();
  metrics.tasksBlocked.reset();
  metrics.workers.reset();
  metrics.rescueHeld.reset();
  metrics.scheduleLastFire.reset();
  metrics.scheduleInterval.reset();
}

/**
 * Publish a snapshot. `running` exports a series only for types with something running (it is
 * a GROUP BY, which is why the starvation alert needs `or vector(0)`).
 */
export function publishGauges(metrics: BerthMetrics, snap: GaugeSnapshot): void {
  metrics.pending.reset();
  metrics.running.reset();
  metrics.dead.reset();
  for (const [t, v] of snap.pending) metrics.pending.set({ task_type: t }, v);
  for (const [t, v] of snap.running) metrics.running.set({ task_type: t }, v);
  for (const [t, v] of snap.dead) metrics.dead.set({ task_type: t }, v);
  metrics.oldestDueSeconds.set(snap.oldestDueSeconds);
  metrics.queuePaused.reset();
  for (const q of snap.pausedQueues) metrics.queuePaused.set({ queue: q }, 1);
  // Reset, then set: a queue whose limit was cleared since the last run loses its series.
  for (const g of limitGauges(metrics)) g.reset();
  for (const l of snap.limits) {
    const queue = { queue: l.queue };
    metrics.limitRunning.set(queue, l.running);
    metrics.limitHeldTasks.set(queue, l.heldTasks);
    if (l.maxRunning !== null) metrics.limitMaxRunning.set(queue, l.maxRunning);
    if (l.rateLimit !== null && l.rateIntervalMs !== null) {
      metrics.limitRate.set(queue, l.rateLimit);
      metrics.limitRateIntervalSeconds.set(queue, l.rateIntervalMs / 1000);
      metrics.limitRateStarts.set(queue, l.started);
    }
  }
  // Reset, then set, as the limits: a queue with nothing held, a cleared key limit, lose their series.
  metrics.keyHeldTasks.reset();
  for (const [queue, n] of snap.keyHeldTasks) metrics.keyHeldTasks.set({ queue }, n);
  metrics.keysWaiting.set(snap.keysWaiting);
  metrics.keyLimit.reset();
  for (const l of snap.keyLimits) metrics.keyLimit.set({ scope: l.scope, name: l.name }, l.perKey);
  for (const g of typeLimitGauges(metrics)) g.reset();
  for (const l of snap.typeLimits) {
    const type = { task_type: l.type };
    metrics.typeLimitRate.set(type, l.rateLimit);
    metrics.typeLimitRateIntervalSeconds.set(type, l.rateIntervalMs / 1000);
    metrics.typeLimitRateStarts.set(type, l.started);
    metrics.typeLimitPacedTasks.set(type, l.paced);
  }
  metrics.tasksWaiting.reset();
  metrics.tasksBlocked.reset();
  for (const d of snap.dependencies) {
    metrics.tasksWaiting.set({ queue: d.queue }, d.waiting);
    metrics.tasksBlocked.set({ queue: d.queue }, d.blocked);
  }
  metrics.workers.set(snap.workers);
}

/** The per-type rate limit gauges, reset together. */
function typeLimitGauges(metrics: BerthMetrics) {
  return [
    metrics.typeLimitRate,
    metrics.typeLimitRateIntervalSeconds,
    metrics.typeLimitRateStarts,
    metrics.typeLimitPacedTasks,
  ];
}

/** The per-queue limit gauges, reset together. */
function limitGauges(metrics: BerthMetrics) {
  return [
    metrics.limitMaxRunning,
    metrics.limitRunning,
    metrics.limitRate,
    metrics.limitRateIntervalSeconds,
    metrics.limitRateStarts,
    metrics.limitHeldTasks,
  ];
}
