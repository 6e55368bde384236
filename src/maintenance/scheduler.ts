import type { Cron } from 'croner';
import type pg from 'pg';
import { onConnectionOf } from '../db/connections.js';
import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import { cronOf, instantsBetween, latestInstant } from '../schedule.js';
import { liveWorkerParams } from '../storage/live-workers.js';
import {
  activeSchedules,
  fireInstant,
  markStaleSchedules,
  skipThrough,
  type ScheduleTickRow,
} from '../storage/schedules.js';
import type { Storage } from '../storage/storage.js';

/** What the leader's clock says now: the database's by default, a test's own when given. */
export type ScheduleClock = () => Date;

/** One fire of one tick. */
export interface FireReport {
  schedule: string;
  instant: Date;
  /** `cron`: on time (within the misfire grace); `missed`: a missed instant the policy runs. */
  kind: 'cron' | 'missed';
  /** The task enqueued; null when the watermark refused the instant (another fire had it). */
  taskId: string | null;
  lateMs: number;
}

export interface TickReport {
  fires: FireReport[];
  /** Instants skipped by their schedule's misfire policy, by schedule. */
  misses: Record<string, number>;
  /** How long after this tick the next instant of any active schedule comes (ms); null when none does. */
  nextInMs: number | null;
}

/**
 * How many missed instants are counted one by one: an every-second schedule down for a week
 * has 604,800; past this many the miss count says "at least".
 */
const MAX_COUNTED_MISSES = 10_000;
/** On-time instants fired in one tick at most (an every-second schedule a minute late has 60). */
const MAX_ON_TIME = 1000;

/**
 * The croner jobs of the schedules a leader fires, kept across ticks by expression and zone
 * (parsing is the costly part of croner; computing an instant is cheap).
 */
export class CronCache {
  private readonly jobs = new Map<string, Cron>();

  of(cron: string, timeZone: string): Cron {
    const key = `${timeZone}\u0000${cron}`;
    let job = this.jobs.get(key);
    if (job === undefined) {
      job = cronOf(cron, timeZone);
      if (this.jobs.size > 1000) this.jobs.clear();
      this.jobs.set(key, job);
    }
    return job;
  }
}

/**
 * One tick of the leader's schedule branch: every active schedule's due instants fired, each in
 * its own transaction (storage/schedules.ts `fireInstant`), in instant order.
 *
 * An instant is due once the clock has passed it. One late by at most the schedule's misfire
 * grace is on time and fires; earlier ones are missed and follow the schedule's policy: `skip`
 * moves the watermark past them, `once` fires the latest of them, `all` fires the latest
 * `misfireCap` of them in order. Instants are computed here, in JavaScript (croner), but
 * whether one is fired is the database's decision: the watermark only moves forward, so an
 * instant this tick computes that another fire already had is refused, not fired again.
 */
export async function fireDueSchedules(
  pool: pg.Pool,
  storage: Storage,
  deps: {
    metrics: BerthMetrics;
    logger: Logger;
    clock?: ScheduleClock | undefined;
    crons?: CronCache;
    /** The watermark each schedule was last logged as ahead of the clock at (one line per watermark, not per tick). */
    aheadLogged?: Map<string, number>;
  },
): Promise<TickReport> {
  const { now: dbNow, schedules } = await activeSchedules(pool, storage);
  // Lateness is measured on the same clock as due-ness, moved on by the time this tick takes.
  const offset = dbNow.getTime() - Date.now();
  const clock = deps.clock ?? (() => new Date(Date.now() + offset));
  const crons = deps.crons ?? new CronCache();
  const report: TickReport = { fires: [], misses: {}, nextInMs: null };
  let next = Number.POSITIVE_INFINITY;
  // Published together at the end, with no await between the reset and the sets: a scrape during
  // the tick sees the previous tick's values, never a schedule missing.
  const gauges: { name: string; lastFire: number; interval: number }[] = [];
  for (const row of schedules) {
    warnIfAhead(row, clock(), deps);
    let job: Cron;
    try {
      job = crons.of(row.cron, row.timeZone);
    } catch (err) {
      // Checked at declaration; a row written by hand (or by a newer croner's rules) is logged, not fatal.
      deps.logger.error({ schedule: row.name, err: (err as Error).message }, 'schedule expression cannot be read');
      continue;
    }
    try {
      await fireSchedule(pool, storage, row, job, clock, deps, report);
    } catch (err) {
      deps.logger.error(
        { schedule: row.name, err: (err as Error).message },
        'schedule fire failed; retrying next tick',
      );
    }
    const last = report.fires.filter((f) => f.schedule === row.name && f.taskId !== null).at(-1);
    // When it last fired: this tick's last fire (on the tick's clock), else the row's last commit.
    const lastFire = last ? last.instant.getTime() + last.lateMs : row.lastFiredAt.getTime();
    gauges.push({ name: row.name, lastFire: lastFire / 1000, interval: row.intervalMs / 1000 });
    next = Math.min(next, job.nextRun(clock())?.getTime() ?? next);
  }
  deps.metrics.scheduleLastFire.reset();
  deps.metrics.scheduleInterval.reset();
  for (const g of gauges) {
    deps.metrics.scheduleLastFire.set({ schedule: g.name }, g.lastFire);
    deps.metrics.scheduleInterval.set({ schedule: g.name }, g.interval);
  }
  if (Number.isFinite(next)) report.nextInMs = Math.max(0, next - clock().getTime());
  return report;
}

async function fireSchedule(
  pool: pg.Pool,
  storage: Storage,
  row: ScheduleTickRow,
  job: Cron,
  clock: ScheduleClock,
  deps: { metrics: BerthMetrics; logger: Logger },
  report: TickReport,
): Promise<void> {
  const now = clock();
  const latest = latestInstant(job, now);
  if (latest === null || latest.getTime() <= row.firedThrough.getTime()) return;
  const graceEdge = new Date(now.getTime() - row.misfireGraceMs);
  const toFire: { instant: Date; kind: 'cron' | 'missed' }[] = [];
  let missed = 0;
  if (row.firedThrough.getTime() < graceEdge.getTime()) {
    const lastMissed = latestInstant(job, graceEdge);
    if (lastMissed !== null && lastMissed.getTime() > row.firedThrough.getTime()) {
      const count = await countInstants(job, row.firedThrough, lastMissed);
      if (row.misfire === 'skip') {
        missed = count;
        if (await skipThrough(pool, storage, row.name, lastMissed)) recordMisses(row.name, missed, deps, report);
        missed = 0;
      } else if (row.misfire === 'once') {
        missed = count - 1;
        toFire.push({ instant: lastMissed, kind: 'missed' });
      } else {
        const runs = job
          .previousRuns(row.misfireCap, new Date(lastMissed.getTime() + 1))
          .filter((d) => d.getTime() > row.firedThrough.getTime())
          .reverse();
        missed = count - runs.length;
        for (const instant of runs) toFire.push({ instant, kind: 'missed' });
      }
    }
  }
  const onTimeFrom = new Date(Math.max(row.firedThrough.getTime(), graceEdge.getTime()));
  for (const instant of instantsBetween(job, onTimeFrom, now, MAX_ON_TIME)) toFire.push({ instant, kind: 'cron' });
  let first = true;
  for (const { instant, kind } of toFire) {
    // One connection for the fire's transaction, heard for faults while held and discarded if
    // the fire failed (its session may be gone).
    const result = await onConnectionOf(pool, (client) =>
      fireInstant(client, storage, {
        name: row.name,
        instant,
        through: instant,
        lateMs: Math.max(0, clock().getTime() - instant.getTime()),
      }),
    );
    // Counted after the commit: a fire is late by the time its task became claimable.
    const lateMs = Math.max(0, clock().getTime() - instant.getTime());
    if (result.kind === 'fired') {
      deps.metrics.scheduleFires.inc({ schedule: row.name, kind });
      deps.metrics.scheduleLatenessSeconds.observe({ schedule: row.name }, lateMs / 1000);
      // The policy's decision stands once its first fire committed: the instants before it are
      // behind the watermark now.
      if (first && missed > 0) recordMisses(row.name, missed, deps, report);
    } else if (first) {
      // Another fire moved the watermark first (a second leader, a retried tick): what it
      // skipped is its to count. The rest of this tick's instants are still tried, in order.
      missed = 0;
    }
    first = false;
    report.fires.push({
      schedule: row.name,
      instant,
      kind,
      taskId: result.kind === 'fired' ? result.taskId : null,
      lateMs,
    });
  }
}

/**
 * A watermark ahead of the clock by more than this is logged: the clock went back (a database
 * server's clock corrected after running ahead, a test's clock), and the schedule fires nothing
 * until the clock passes the watermark again, which would otherwise look like a schedule that
 * silently stopped. A changed declaration or a resume never moves it back (invariant 13).
 */
const AHEAD_LOG_MS = 5000;

function warnIfAhead(
  row: ScheduleTickRow,
  now: Date,
  deps: { logger: Logger; aheadLogged?: Map<string, number> },
): void {
  const aheadMs = row.firedThrough.getTime() - now.getTime();
  if (aheadMs <= AHEAD_LOG_MS || deps.aheadLogged?.get(row.name) === row.firedThrough.getTime()) return;
  deps.aheadLogged?.set(row.name, row.firedThrough.getTime());
  if (deps.aheadLogged !== undefined && deps.aheadLogged.size > 10_000) deps.aheadLogged.clear();
  deps.logger.warn(
    { schedule: row.name, fired_through: row.firedThrough.toISOString(), ahead_ms: Math.round(aheadMs) },
    "schedule's watermark is ahead of the clock (the clock went back): no instant fires until the clock passes it",
  );
}

/** Instants counted between two yields to the event loop (croner takes ~50-130 µs an instant). */
const COUNT_SLICE = 500;

/**
 * The missed instants in (after, until], counted up to MAX_COUNTED_MISSES. Counted in slices
 * with a yield between them: an every-second schedule after hours of downtime walks 10,000
 * instants, which in one go stalled the leader's process (its engine, heartbeat and election
 * checks) for about half a second (test/schedule-review.test.ts, "a week down").
 */
async function countInstants(job: Cron, after: Date, until: Date): Promise<number> {
  let count = 0;
  let from = after;
  while (count < MAX_COUNTED_MISSES) {
    const slice = instantsBetween(job, from, until, Math.min(COUNT_SLICE, MAX_COUNTED_MISSES - count));
    count += slice.length;
    if (slice.length < COUNT_SLICE) break;
    from = slice.at(-1)!;
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
  return count;
}

function recordMisses(
  name: string,
  n: number,
  deps: { metrics: BerthMetrics; logger: Logger },
  report: TickReport,
): void {
  if (n <= 0) return;
  deps.metrics.scheduleMisses.inc({ schedule: name }, n);
  report.misses[name] = (report.misses[name] ?? 0) + n;
  deps.logger.warn(
    { schedule: name, missed: n, counted_up_to: MAX_COUNTED_MISSES },
    'schedule missed instants while no leader fired it; its misfire policy skipped them',
  );
}

/**
 * Schedules no live worker declares marked stale (no longer fired, kept, shown as stale), and
 * those one declares again unmarked. A schedule just declared is given three heartbeats before
 * it can be marked, so its worker's first heartbeat has landed.
 */
export async function markStale(
  pool: pg.Pool,
  storage: Storage,
  logger: Logger,
  heartbeatMs?: number,
): Promise<{ marked: string[]; cleared: string[] }> {
  const [staleMs, futureMs] = liveWorkerParams(heartbeatMs);
  const r = await markStaleSchedules(pool, storage, { staleMs, futureMs, graceMs: staleMs });
  if (r.marked.length > 0)
    logger.warn({ schedules: r.marked }, 'schedules no running worker declares are stale: no longer fired');
  if (r.cleared.length > 0) logger.info({ schedules: r.cleared }, 'stale schedules declared again: firing resumes');
  return r;
}
