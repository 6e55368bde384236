import { BerthInputError } from '../errors.js';
import { listAudit } from '../admin/audit.js';
import { countDead, listDead } from '../admin/dead.js';
import { listHeldKeys, listKeyLimits, listQueueLimits, rateText } from '../admin/limits.js';
import { listQueues } from '../admin/queues.js';
import { listTypeLimits } from '../admin/type-limits.js';
import { listSchedules } from '../admin/schedules.js';
import { leaderInfo, listWorkers } from '../admin/stats.js';
import { listTasks, parseState, taskTimeline } from '../admin/tasks.js';
import { laneKey } from '../lane.js';
import { attemptsOf, listAttempts, parseOutcome } from '../storage/history.js';
import { getTaskIn } from '../storage/tasks.js';
import { overdueMarks } from '../storage/overdue.js';
import { HttpError, json } from './http.js';
import { readOverview, type DashboardReads } from './overview.js';
import {
  MAX_FILTER_TEXT_CHARS,
  optionalCursor,
  optionalQuery,
  optionalQueueQuery,
  queryLimit,
  taskId,
} from './params.js';
import type {
  AttemptList,
  DeadCount,
  DeadLetters,
  Lanes,
  Maintenance,
  Overview,
  Queues,
  Schedules,
  TaskDetail,
  TaskList,
} from './wire.js';

/**
 * The GET side of the JSON API: reads only, keyset pages and cached counts. Each returns its
 * answer's wire shape (wire.ts), through `json` where the server's types hold Dates.
 */

export function overview(reads: DashboardReads): Promise<Overview> {
  return readOverview(reads);
}

/**
 * Lanes: depth and oldest due (index probes), running and dead (cached counts), and the
 * promotion contention and waiters the leader's heartbeat reports (validated: see listWorkers).
 */
export async function lanes(reads: DashboardReads): Promise<Lanes> {
  const [stats, activity, leader] = await Promise.all([
    reads.lanes.get(),
    reads.activity.get(),
    leaderInfo(reads.db, reads.schema),
  ]);
  if (leader.worker) reads.noteInvalid([leader.worker]);
  const waitingLanes = leader.worker?.maintenance.waitingLanes ?? [];
  const waiting = new Set(waitingLanes.map(laneKey));
  const contention = new Map((leader.worker?.maintenance.contention ?? []).map((c) => [laneKey(c), c]));
  return {
    ageMs: stats.ageMs,
    activityAgeMs: activity.ageMs,
    leader: leader.worker?.workerId ?? null,
    waitingLanes,
    lanes: stats.data.map((l) => {
      const c = contention.get(laneKey(l));
      return {
        ...l,
        running: activity.data.get(l.laneId)?.running ?? 0,
        dead: activity.data.get(l.laneId)?.dead ?? 0,
        contention: c
          ? {
              handedOff: c.handed_off,
              waiterLimit: c.waiter_limit,
              waiterTimedOut: c.waiter_timed_out,
              failed: c.failed,
              lastOutcome: c.lastOutcome,
              lastAt: c.lastAt,
            }
          : null,
        waiting: waiting.has(laneKey(l)),
      };
    }),
  };
}

export async function tasks(reads: DashboardReads, url: URL): Promise<TaskList> {
  const state = optionalQuery(url, 'state');
  const page = await listTasks(
    reads.db,
    reads.schema,
    {
      state: state === undefined ? undefined : parseState(state),
      queue: optionalQueueQuery(url),
      type: optionalQuery(url, 'type'),
    },
    { after: optionalCursor(url), limit: queryLimit(url) },
  );
  // Running tasks whose handler overran its deadline (one index probe per running task shown).
  const marks = await overdueMarks(
    reads.db,
    reads.storage,
    page.tasks.filter((t) => t.state === 'running').map((t) => t.id),
  );
  return json({ ...page, tasks: page.tasks.map((t) => (marks.has(t.id) ? { ...t, overdue: marks.get(t.id) } : t)) });
}

export async function task(reads: DashboardReads, id: string): Promise<TaskDetail> {
  taskId(id);
  const record = await getTaskIn(reads.db, reads.storage, id);
  if (!record)
    throw new HttpError(
      404,
      `task ${id} not found (never existed, removed, or finished before attempt history's retention)`,
    );
  const timeline = await taskTimeline(reads.db, reads.schema, id);
  // Every attempt in attempt history, each with its error (stack, cause chain) or cursor.
  const attempts = await attemptsOf(reads.db, reads.schema, id);
  // A handler still running past its deadline: marked on the page (stuck past the grace).
  const overdue = record.lease ? ((await overdueMarks(reads.db, reads.storage, [id])).get(id) ?? null) : null;
  // The lease token is the fence a holder settles with: never shown.
  const { lease, ...rest } = record;
  return json({
    task: {
      ...rest,
      lease: lease && { expiresAt: lease.expiresAt, worker: lease.worker, attempt: lease.attempt, overdue },
    },
    attempts,
    timeline,
  });
}

/** A time in the query (ISO 8601, e.g. 2026-12-01T06:00Z), or undefined when absent. */
function timeQuery(url: URL, name: string): Date | undefined {
  const v = optionalQuery(url, name, 40);
  if (v === undefined) return undefined;
  const t = new Date(v);
  if (Number.isNaN(t.getTime())) throw new BerthInputError(`${name} must be a time like 2026-12-01T06:00Z`);
  return t;
}

/** Attempts newest first by type, queue, outcome and time (attempt history), keyset-paginated. */
export async function attempts(reads: DashboardReads, url: URL): Promise<AttemptList> {
  const outcome = optionalQuery(url, 'outcome');
  const after = optionalQuery(url, 'after', 40);
  const page = await listAttempts(
    reads.db,
    reads.schema,
    {
      queue: optionalQueueQuery(url),
      type: optionalQuery(url, 'type'),
      outcome: outcome === undefined ? undefined : parseOutcome(outcome),
      since: timeQuery(url, 'since'),
      before: timeQuery(url, 'before'),
    },
    { after, limit: queryLimit(url) },
  );
  return json(page);
}

function deadFilter(url: URL) {
  return {
    queue: optionalQueueQuery(url),
    type: optionalQuery(url, 'type'),
    errorContains: optionalQuery(url, 'error', MAX_FILTER_TEXT_CHARS),
  };
}

export async function dead(reads: DashboardReads, url: URL): Promise<DeadLetters> {
  return json(
    await listDead(reads.db, reads.schema, deadFilter(url), { after: optionalCursor(url), limit: queryLimit(url) }),
  );
}

/** What a bulk action on the filter would touch: read once, when the operator asks. */
export async function deadCount(reads: DashboardReads, url: URL): Promise<DeadCount> {
  return { count: await countDead(reads.db, reads.schema, deadFilter(url)) };
}

/**
 * Every queue and its pause; every queue limit, how full it is and what it holds back; every task
 * type rate limit and how full it is; every key limit, and the keys with held tasks (the 100
 * longest waiting).
 */
export async function queues(reads: DashboardReads): Promise<Queues> {
  // Not the overview's cached read: an action on this page is shown by the refresh right after it.
  const [queues, limits, typeLimits, keyLimits, heldKeys] = await Promise.all([
    listQueues(reads.db, reads.schema),
    listQueueLimits(reads.db, reads.schema),
    listTypeLimits(reads.db, reads.schema),
    listKeyLimits(reads.db, reads.schema),
    listHeldKeys(reads.db, reads.schema, 100),
  ]);
  return json({
    queues,
    limits: limits.map((l) => ({ ...l, rate: rateText(l.rateLimit, l.rateIntervalMs) })),
    typeLimits: typeLimits.map((l) => ({ ...l, rate: rateText(l.rateLimit, l.rateIntervalMs)! })),
    keyLimits,
    heldKeys,
  });
}

export async function schedules(reads: DashboardReads): Promise<Schedules> {
  return json({ schedules: await listSchedules(reads.db, reads.schema) });
}

export async function maintenance(reads: DashboardReads): Promise<Maintenance> {
  const [leader, workers, audit] = await Promise.all([
    leaderInfo(reads.db, reads.schema),
    listWorkers(reads.db, reads.schema),
    listAudit(reads.db, reads.schema, { limit: 50 }),
  ]);
  reads.noteInvalid(workers);
  const now = Date.now();
  return json({
    leader,
    workers: workers.map((w) => ({ ...w, heartbeatAgeSeconds: Math.max(0, (now - w.lastSeenAt.getTime()) / 1000) })),
    audit,
  });
}
