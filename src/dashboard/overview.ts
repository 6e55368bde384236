import type { Logger } from '../logger.js';
import type { Queryable } from '../sql.js';
import { storageFor, type Storage } from '../storage/storage.js';
import {
  CachedReader,
  laneActivity,
  laneStats,
  leaderInfo,
  listWorkers,
  taskCounts,
  throughput,
  type LaneStat,
  type TaskCount,
  type ThroughputPoint,
  type WorkerInfo,
} from '../admin/stats.js';
import { listQueueLimits, type QueueLimitStatus } from '../admin/limits.js';
import { dependencyStats, type DependencyUsageRow } from '../admin/dependencies.js';
import { json } from './http.js';
import type { MinutePoint, Overview, QueueOverview, Totals } from './wire.js';

/** Counts read every unfinished row: shared by every open page for this long. */
export const COUNTS_TTL_MS = 5000;
/** Lane stats are index probes per lane; this only lets several tabs share one read. */
export const LANES_TTL_MS = 1000;
export const THROUGHPUT_MINUTES = 60;

/** The reads more than one request shares: one set per dashboard handler. */
export class DashboardReads {
  readonly counts: CachedReader<TaskCount[]>;
  readonly lanes: CachedReader<LaneStat[]>;
  /** Running and dead per lane: counts rows (leases, dead letters), so cached like `counts`. */
  readonly activity: CachedReader<Map<number, { running: number; dead: number }>>;
  /** Queue limits and what they hold back: index probes per lane of a limited queue, like `lanes`. */
  readonly limits: CachedReader<QueueLimitStatus[]>;
  /** Tasks waiting on their parents, per queue: reads every waiting task, so cached like `counts`. */
  readonly dependencies: CachedReader<DependencyUsageRow[]>;

  /** The schema's storage, for the storage-layer reads (getTaskIn, overdueMarks). */
  readonly storage: Storage;

  /** `worker\0problem` already logged: each bad row is logged once, not on every refresh. */
  private readonly reported = new Set<string>();

  constructor(
    readonly db: Queryable,
    /** The schema's name, as the admin functions take it (they bind it at their door). */
    readonly schema: string,
    private readonly logger?: Logger,
  ) {
    this.storage = storageFor(schema);
    this.counts = new CachedReader(() => taskCounts(db, schema), COUNTS_TTL_MS);
    this.lanes = new CachedReader(() => laneStats(db, schema), LANES_TTL_MS);
    this.activity = new CachedReader(() => laneActivity(db, schema), COUNTS_TTL_MS);
    this.limits = new CachedReader(() => listQueueLimits(db, schema), LANES_TTL_MS);
    this.dependencies = new CachedReader(() => dependencyStats(db, schema), COUNTS_TTL_MS);
  }

  /** Log each worker row that could not be read as written, once (rows are shown without the bad parts). */
  noteInvalid(workers: readonly WorkerInfo[]): void {
    for (const w of workers) {
      if (w.invalid === null) continue;
      const key = `${w.workerId}\0${w.invalid}`;
      if (this.reported.has(key)) continue;
      // Bounded: a role that forges rows cannot grow this set without limit.
      if (this.reported.size >= 1000) this.reported.clear();
      this.reported.add(key);
      this.logger?.warn(
        { worker: w.workerId.slice(0, 200), problem: w.invalid },
        'a workers row could not be read as written (shown without the bad parts)',
      );
    }
  }
}

function add(into: Totals, c: TaskCount): void {
  into.pending += c.pending;
  // Both come from one read of the same rows, so running never exceeds pending; max() keeps a
  // page from ever showing a negative count.
  into.waiting += Math.max(0, c.pending - c.running);
  into.running += c.running;
  into.dead += c.dead;
}

/** Per-minute buckets for the last `minutes`, oldest first, zero-filled. */
export function minuteSeries(points: ThroughputPoint[], minutes: number, now = Date.now()): MinutePoint[] {
  const latest = Math.max(Math.floor(now / 60_000) * 60_000, ...points.map((p) => p.minute.getTime()));
  const buckets = new Map<number, MinutePoint>();
  for (let i = minutes - 1; i >= 0; i--) {
    const t = latest - i * 60_000;
    buckets.set(t, { minute: new Date(t).toISOString(), completed: 0, failed: 0, other: 0 });
  }
  for (const p of points) {
    const b = buckets.get(p.minute.getTime());
    if (!b) continue;
    if (p.outcome === 'success') b.completed += p.count;
    else if (p.outcome === 'failure' || p.outcome === 'timeout' || p.outcome === 'lost') b.failed += p.count;
    else b.other += p.count;
  }
  return [...buckets.values()];
}

export async function readOverview(reads: DashboardReads): Promise<Overview> {
  const { db, schema } = reads;
  const [counts, lanes, limits, deps, workers, leader, points] = await Promise.all([
    reads.counts.get(),
    reads.lanes.get(),
    reads.limits.get(),
    reads.dependencies.get(),
    listWorkers(db, schema),
    leaderInfo(db, schema),
    throughput(db, schema, THROUGHPUT_MINUTES),
  ]);
  reads.noteInvalid(workers);
  const total: Totals = { pending: 0, waiting: 0, running: 0, dead: 0 };
  const byType = new Map<string, Totals & { type: string }>();
  const byQueue = new Map<string, QueueOverview>();
  const queue = (name: string): QueueOverview => {
    let q = byQueue.get(name);
    if (!q) {
      q = {
        queue: name,
        pending: 0,
        waiting: 0,
        running: 0,
        dead: 0,
        dependencies: { waiting: 0, blocked: 0 },
        depth: 0,
        oldestDueSeconds: 0,
        paused: false,
      };
      byQueue.set(name, q);
    }
    return q;
  };
  for (const c of counts.data) {
    add(total, c);
    add(queue(c.queue), c);
    let t = byType.get(c.type);
    if (!t) {
      t = { type: c.type, pending: 0, waiting: 0, running: 0, dead: 0 };
      byType.set(c.type, t);
    }
    add(t, c);
  }
  const oldestDue = { seconds: 0, queue: null as string | null };
  const held = new Set(limits.data.filter((l) => l.atLimit).map((l) => l.queue));
  for (const l of lanes.data) {
    const q = queue(l.queue);
    q.depth += l.depth + l.dueDeferred;
    q.oldestDueSeconds = Math.max(q.oldestDueSeconds, l.oldestDueSeconds);
    q.paused ||= l.paused;
    // As berth_task_oldest_due_seconds: a paused lane is not claimable, and a queue at its limit
    // waits for the limit, so neither age is starvation (the queue's row keeps the age).
    if (!l.paused && !held.has(l.queue) && l.oldestDueSeconds > oldestDue.seconds)
      Object.assign(oldestDue, { seconds: l.oldestDueSeconds, queue: l.queue });
  }
  const dependencies = { waiting: 0, blocked: 0 };
  for (const d of deps.data) {
    queue(d.queue).dependencies = { waiting: d.waiting, blocked: d.blocked };
    dependencies.waiting += d.waiting;
    dependencies.blocked += d.blocked;
  }
  const alive = workers.filter((w) => w.alive);
  return json({
    counts: {
      ageMs: counts.ageMs,
      total,
      byQueueType: counts.data,
      byType: [...byType.values()].sort((a, b) => a.type.localeCompare(b.type)),
    },
    queues: [...byQueue.values()].sort((a, b) => a.queue.localeCompare(b.queue)),
    dependencies,
    oldestDue,
    workers: {
      alive: alive.length,
      total: workers.length,
      slots: alive.reduce((n, w) => n + w.slots, 0),
      busy: alive.reduce((n, w) => n + w.busy, 0),
    },
    leader: leader.session
      ? {
          workerId: leader.worker?.workerId ?? null,
          pid: leader.session.pid,
          applicationName: leader.session.applicationName,
          since: leader.session.since,
        }
      : null,
    throughput: minuteSeries(points, THROUGHPUT_MINUTES),
  });
}
