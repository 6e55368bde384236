import { notMigrated } from '../errors.js';
import type { Lane } from '../lane.js';
import { type Queryable, queryRingRead } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from '../storage/storage.js';
import { LEADER_LOCK, leaderApplicationName, schemaLockKey } from '../storage/locks.js';
import {
  DEFAULT_HEARTBEAT_MS,
  HEARTBEAT_FUTURE_ALLOWANCE_MS,
  liveWorker,
  liveWorkerParams,
} from '../storage/live-workers.js';
import type { MaintenanceReport } from './worker-report.js';
import {
  deadRowPredicate,
  laneBacklogJoins,
  laneDepth,
  laneDueDeferred,
  liveEntries,
  unsettledEntriesOf,
  unsettledRanges,
} from '../storage/predicates.js';

export { DUE_COUNT_CAP } from '../storage/predicates.js';

export interface LaneStat extends Lane {
  laneId: number;
  paused: boolean;
  /** Entries appended past the lane's claim cursor, less the removed (tombstoned) ones. */
  depth: number;
  /** Due deferred rows waiting for promotion, counted up to DUE_COUNT_CAP. */
  dueDeferred: number;
  /** How long the lane's oldest claimable work has been due; 0 when it has none. */
  oldestDueSeconds: number;
}

/**
 * Per-lane depth and age from index probes only: the ready head and claim cursor (two PK probes
 * per partition), the tombstones past the cursor (rare), the first unclaimed entry, and the
 * oldest due deferred row. Cost grows with the
 * number of lanes, not the number of tasks, so it is safe on every dashboard refresh.
 */
export async function laneStats(db: Queryable, schema: string): Promise<LaneStat[]> {
  try {
    const statement = storageFor(schema).statement('admin-lane-stats', ({ q: s }) =>
      positional(
        `SELECT l.lane_id, l.queue, l.priority, l.shard, l.paused,
              ${laneDepth(s, 'l')}::text AS depth,
              ${laneDueDeferred(s, 'l')}::text AS due_deferred,
              -- An infinite run_at (no enqueue writes one; the runtime role could) has no age: 0, not an error.
              CASE WHEN isfinite(least(hd.run_at, dd.run_at)) THEN extract(epoch FROM now() - least(hd.run_at, dd.run_at)) END::float8 AS oldest_secs
         FROM ${s}.lanes l
         ${laneBacklogJoins(s, 'l')}
         LEFT JOIN LATERAL (
           SELECT r.run_at FROM ${s}.ready r
            WHERE r.lane_id = l.lane_id AND r.lane_seq > coalesce(c.seq, 0)
              AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                               WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
            ORDER BY r.lane_seq LIMIT 1) hd ON true
         LEFT JOIN LATERAL (
           SELECT d.run_at FROM ${s}.deferred d
            WHERE d.queue = l.queue AND d.priority = l.priority AND d.shard = l.shard AND d.run_at <= now()
            ORDER BY d.run_at LIMIT 1) dd ON true
        ORDER BY l.queue, l.priority, l.shard`,
        [],
      ),
    );
    const r = await db.query<{
      lane_id: number;
      queue: string;
      priority: number;
      shard: number;
      paused: boolean;
      depth: string;
      due_deferred: string;
      oldest_secs: number | null;
    }>(statement.query({}));
    return r.rows.map((x) => ({
      laneId: x.lane_id,
      queue: x.queue,
      priority: x.priority,
      shard: x.shard,
      paused: x.paused,
      depth: Number(x.depth),
      dueDeferred: Number(x.due_deferred),
      oldestDueSeconds: Math.max(0, x.oldest_secs ?? 0),
    }));
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/**
 * Per lane: tasks under a live lease, and dead letters. Reads the range leases with unsettled
 * entries (one row per claimed batch, not per task) and every dead letter: `berth stats` runs
 * it once; a refreshing view should cache it like `taskCounts`.
 */
export async function laneActivity(
  db: Queryable,
  schema: string,
): Promise<Map<number, { running: number; dead: number }>> {
  try {
    const statement = storageFor(schema).statement('admin-lane-activity', ({ q: s }) =>
      positional(
        `SELECT lane_id, sum(running)::text AS running, sum(dead)::text AS dead FROM (
         SELECT le.lane_id, count(*) AS running, 0 AS dead
           FROM ${unsettledRanges(s)} le
          CROSS JOIN LATERAL (${unsettledEntriesOf(s, 'le')}) e
          WHERE le.type_expires[array_position(le.types, e.type)] > now()
          GROUP BY le.lane_id
         UNION ALL
         SELECT l.lane_id, 0, count(*) FROM ${s}.dead_letters d
           JOIN ${s}.lanes l ON l.queue = d.queue AND l.priority = d.priority AND l.shard = d.shard
          WHERE ${deadRowPredicate(s)}
          GROUP BY l.lane_id) x
       GROUP BY lane_id`,
        [],
      ),
    );
    // The text alone, not prepared: a named ring read is planned generically (RingReadStatement),
    // and this one has not been measured that way.
    const r = await queryRingRead<{ lane_id: number; running: string; dead: string }>(db, statement.text);
    return new Map(r.rows.map((x) => [x.lane_id, { running: Number(x.running), dead: Number(x.dead) }]));
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

export interface TaskCount {
  queue: string;
  type: string;
  /** Unfinished: ready, scheduled, retryable or running (running is a subset, as in the gauge). */
  pending: number;
  running: number;
  dead: number;
}

/**
 * Counts by queue and task type, with the gauges' predicates. This one reads every unfinished
 * row, so callers that refresh (the dashboard) cache it; see `CachedReader`.
 */
export async function taskCounts(db: Queryable, schema: string): Promise<TaskCount[]> {
  try {
    const statement = storageFor(schema).statement('admin-task-counts', ({ q: s }) =>
      positional(
        `WITH live AS (
         SELECT r.queue, r.type, r.expires_at FROM ${liveEntries(s)} r
       ), per AS (
         SELECT queue, type, count(*) AS pending, count(*) FILTER (WHERE expires_at > now()) AS running, 0 AS dead
           FROM live GROUP BY queue, type
         UNION ALL
         SELECT queue, type, count(*), 0, 0 FROM ${s}.deferred GROUP BY queue, type
         UNION ALL
         SELECT d.queue, d.type, 0, 0, count(*) FROM ${s}.dead_letters d WHERE ${deadRowPredicate(s)} GROUP BY d.queue, d.type
       )
       SELECT queue, type, sum(pending)::text AS pending, sum(running)::text AS running, sum(dead)::text AS dead
         FROM per GROUP BY queue, type ORDER BY queue, type`,
        [],
      ),
    );
    // The text alone, not prepared, as laneActivity.
    const r = await queryRingRead<{ queue: string; type: string; pending: string; running: string; dead: string }>(
      db,
      statement.text,
    );
    return r.rows.map((x) => ({
      queue: x.queue,
      type: x.type,
      pending: Number(x.pending),
      running: Number(x.running),
      dead: Number(x.dead),
    }));
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

export interface ThroughputPoint {
  minute: Date;
  queue: string;
  type: string;
  outcome: string;
  count: number;
}

/** Handler outcomes per minute over the last `minutes` (from the workers' heartbeats). */
export async function throughput(db: Queryable, schema: string, minutes = 60): Promise<ThroughputPoint[]> {
  try {
    const statement = storageFor(schema).statement('admin-throughput', ({ q: s }) =>
      positional(
        // Heartbeats write this minute's counts: a later (or infinite) minute or a negative count was
        // written by something else, and is left out rather than bending every chart.
        `SELECT minute, queue, type, outcome, sum(count)::text AS count FROM ${s}.outcome_counts
        WHERE minute >= date_trunc('minute', now()) - make_interval(mins => $1)
          AND minute <= now() + make_interval(secs => $2 / 1000.0) AND count >= 0
        GROUP BY minute, queue, type, outcome ORDER BY minute`,
        ['minutes', 'futureMs'],
      ),
    );
    const r = await db.query<{ minute: Date; queue: string; type: string; outcome: string; count: string }>(
      statement.query({
        minutes: Math.min(Math.max(Math.trunc(minutes), 1), 7 * 24 * 60),
        futureMs: HEARTBEAT_FUTURE_ALLOWANCE_MS,
      }),
    );
    return r.rows.map((x) => ({
      minute: x.minute,
      queue: x.queue,
      type: x.type,
      outcome: x.outcome,
      count: Number(x.count),
    }));
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

export interface WorkerInfo {
  workerId: string;
  host: string;
  pid: number;
  queues: string[] | null;
  slots: number;
  busy: number;
  prefetched: number;
  /** It says it leads, and it is the session holding the leader lock (pg_locks): never the row's word alone. */
  leader: boolean;
  startedAt: Date;
  lastSeenAt: Date;
  /** Heartbeat within STALE_HEARTBEATS intervals, and not dated in the future. */
  alive: boolean;
  /** The valid parts of its maintenance report (see readMaintenanceReport). */
  maintenance: MaintenanceReport;
  /** What is wrong with the row (forged or corrupt: a future heartbeat, a malformed report), or null. */
  invalid: string | null;
}

export type { BranchRecord } from './worker-report.js';

type LeaderSession = NonNullable<LeaderInfo['session']>;

/** The session holding the schema's leader advisory lock, or null when nobody leads. */
async function leaderSession(db: Queryable, storage: Storage): Promise<LeaderSession | null> {
  // The text names no schema: the schema is in the lock key, a value.
  const statement = storage.statement('admin-leader-session', () =>
    positional(
      `SELECT a.pid, a.application_name, a.client_addr::text AS client_addr, a.backend_start AS since
       FROM pg_catalog.pg_locks k JOIN pg_catalog.pg_stat_activity a ON a.pid = k.pid
      WHERE k.locktype = 'advisory' AND k.granted AND k.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
        AND k.classid = ($1::bigint & 4294967295)::oid AND k.objid = ($2::bigint & 4294967295)::oid AND k.objsubid = 2`,
      ['schemaKey', 'leaderLock'],
    ),
  );
  const r = await db.query<{ pid: number; application_name: string; client_addr: string | null; since: Date }>(
    statement.query({ schemaKey: schemaLockKey(storage.schema.name), leaderLock: LEADER_LOCK }),
  );
  const row = r.rows[0];
  return row
    ? { pid: row.pid, applicationName: row.application_name, clientAddr: row.client_addr, since: row.since }
    : null;
}

/** application_name as PostgreSQL keeps it: at most 63 bytes, never a split character. */
function clipBytes(text: string, max: number): string {
  let out = '';
  let bytes = 0;
  for (const ch of text) {
    bytes += Buffer.byteLength(ch, 'utf8');
    if (bytes > max) break;
    out += ch;
  }
  return out;
}

/** Whether the lock holder's session is this worker's leader session (see leaderApplicationName). */
function holdsLeaderLock(workerId: string, session: LeaderSession | null): boolean {
  return session !== null && session.applicationName === clipBytes(leaderApplicationName(workerId), 63);
}

async function readWorkers(
  db: Queryable,
  storage: Storage,
  heartbeatMs: number,
  session: LeaderSession | null,
): Promise<WorkerInfo[]> {
  const statement = storage.statement('admin-workers-list', ({ q: s }) =>
    positional(
      // Infinite times are no heartbeat's (it writes now()): such a row is left out, and pruned.
      `SELECT w.worker_id, w.host, w.pid, w.queues, w.slots, w.busy, w.prefetched, w.leader, w.started_at, w.last_seen_at, w.maintenance,
            ${liveWorker('w', '$1', '$2')} AS alive,
            w.last_seen_at > now() + make_interval(secs => $2 / 1000.0) AS future
       FROM ${s}.workers w
      WHERE isfinite(w.started_at) AND isfinite(w.last_seen_at)
      ORDER BY w.started_at DESC`,
      ['staleMs', 'futureMs'],
    ),
  );
  const [staleMs, futureMs] = liveWorkerParams(heartbeatMs);
  const r = await db.query<{
    worker_id: string;
    host: string;
    pid: number;
    queues: string[] | null;
    slots: number;
    busy: number;
    prefetched: number;
    leader: boolean;
    started_at: Date;
    last_seen_at: Date;
    alive: boolean;
    future: boolean;
    maintenance: unknown;
  }>(statement.query({ staleMs, futureMs }));
  // Loaded here, not at the top: the report is read with zod, which costs a process ~90 ms and
  // ~4 MB of heap to load; only the dashboard and the CLI read reports, and a worker never does.
  const { readMaintenanceReport } = await import('./worker-report.js');
  return r.rows.map((w) => {
    const { report, invalid } = readMaintenanceReport(w.maintenance);
    const problems = [w.future ? 'its heartbeat is dated in the future' : null, invalid].filter((p) => p !== null);
    return {
      workerId: w.worker_id,
      host: w.host,
      pid: w.pid,
      queues: w.queues,
      slots: w.slots,
      busy: w.busy,
      prefetched: w.prefetched,
      leader: w.leader && !w.future && holdsLeaderLock(w.worker_id, session),
      startedAt: w.started_at,
      lastSeenAt: w.last_seen_at,
      alive: w.alive,
      maintenance: report,
      invalid: problems.length ? problems.join('; ') : null,
    };
  });
}

/**
 * Worker processes by heartbeat, newest first. Every row is read defensively (the runtime role
 * can write anything into `workers`): a malformed maintenance report is left out and named in
 * `invalid`, a future-dated row is neither alive nor leader, and `leader` is confirmed against
 * the session that holds the leader lock.
 */
export async function listWorkers(
  db: Queryable,
  schema: string,
  heartbeatMs = DEFAULT_HEARTBEAT_MS,
): Promise<WorkerInfo[]> {
  try {
    const storage = storageFor(schema);
    return await readWorkers(db, storage, heartbeatMs, await leaderSession(db, storage));
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

export interface LeaderInfo {
  /** Who holds the leader lock now (from pg_locks), or null when nobody leads. */
  session: { pid: number; applicationName: string; clientAddr: string | null; since: Date } | null;
  /** The leader's worker row (branch statistics, waiters), when its heartbeat is fresh. */
  worker: WorkerInfo | null;
}

/**
 * The maintenance leader: the session holding the schema's leader advisory lock (the truth)
 * and the heartbeat of the worker whose leader session that is (its branch durations and
 * overruns). A row that only says `leader = true` is not taken at its word.
 */
export async function leaderInfo(
  db: Queryable,
  schema: string,
  heartbeatMs = DEFAULT_HEARTBEAT_MS,
): Promise<LeaderInfo> {
  try {
    const storage = storageFor(schema);
    const session = await leaderSession(db, storage);
    const workers = await readWorkers(db, storage, heartbeatMs, session);
    return { session, worker: workers.find((w) => w.leader && w.alive) ?? null };
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/**
 * Single-flight, time-bounded cache for a read that is too heavy to run on every refresh: every
 * caller within `ttlMs` of the last completed read shares it, and concurrent callers share the
 * read in flight.
 */
export class CachedReader<T> {
  private value: { at: number; data: T } | null = null;
  private inFlight: Promise<T> | null = null;

  constructor(
    private readonly read: () => Promise<T>,
    private readonly ttlMs: number,
  ) {}

  get(): Promise<{ data: T; ageMs: number }> {
    const now = Date.now();
    if (this.value && now - this.value.at < this.ttlMs)
      return Promise.resolve({ data: this.value.data, ageMs: now - this.value.at });
    this.inFlight ??= this.read().then(
      (data) => {
        this.value = { at: Date.now(), data };
        this.inFlight = null;
        return data;
      },
      (err: unknown) => {
        this.inFlight = null;
        throw err;
      },
    );
    return this.inFlight.then((data) => ({ data, ageMs: 0 }));
  }
}
