import type { Storage } from '../storage/storage.js';
import { laneLabel } from '../lane.js';
import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import type { ClaimedTask } from './claim.js';
import { entryKey } from '../storage/attempt.js';
import { STALE_HEARTBEATS } from '../storage/live-workers.js';
import { clearOverdueLease, protectOverdueLease, refreshOverdueLeases } from '../storage/overdue.js';

/** How long past its deadline a running handler is reported stuck (default 10 s). */
export const DEFAULT_STUCK_GRACE_MS = 10_000;

/**
 * The exit status of a worker that stopped itself because `exitOnStuckSlots` slots were stuck
 * (EX_TEMPFAIL: a supervisor should restart it).
 */
export const STUCK_EXIT_CODE = 75;

export interface StuckGuardOptions {
  workerId: string;
  /** The lease margin: the deadline is expiry − margin, so protection must land within it. */
  marginMs: number;
  graceMs: number;
  /** How often the holder refreshes its overdue rows; rescue honours a row for 3 of these. */
  refreshMs: number;
  /** Call `onTooManyStuck` once this many handlers are stuck at once (undefined: never). */
  exitOnStuckSlots?: number;
}

interface Watched {
  key: string;
  task: ClaimedTask;
  deadline: number;
  stuckAt: number;
  running: boolean;
  stuck: boolean;
  /** The protection write, once started; resolves to whether the row exists. */
  protecting: Promise<boolean> | null;
  /** The row exists: refreshed until the settlement is written. */
  protectedRow: boolean;
}

/** The worker's handlers running now (its own in-flight list): each one's task, and whether a lease key's runs. */
export interface RunningHandlers extends Iterable<{ task: ClaimedTask }> {
  has(key: string): boolean;
}

/**
 * Detects and contains handlers that ignore their AbortSignal (seed 000 leaves this case open:
 * "nothing in the queue can stop it").
 *
 * A scan of the worker's running handlers, every `tickMs`, finds the ones still running at
 * deadline + min(grace, margin / 2) and protects their leases: an `overdue_leases` row,
 * refreshed every `refreshMs` until the settlement is written, which rescue honours, so the task
 * is not re-run elsewhere while this process lives and runs it. The half-margin cap keeps the
 * write well inside the lease (rescue may take a lease the moment it lapses), and the grace
 * spares the write for a handler that honours its signal a moment late. At deadline + grace it
 * is reported stuck: `berth_task_stuck_handlers`, one warn log. With `exitOnStuckSlots`, the
 * worker is told once that many are stuck at once (it stops and exits for a supervisor).
 * A scan rather than a timer per run: the normal path costs one map lookup at settlement.
 *
 * A handler that blocks the event loop (a synchronous spin) runs none of this, nor the
 * heartbeat: its rows are never written or go stale, and rescue treats it as a dead process.
 */
export class StuckGuard {
  /** Handlers past deadline + min(grace, margin / 2), until settled: empty on the normal path. */
  private readonly watched = new Map<string, Watched>();
  private readonly protectAfterMs: number;
  /** How often the running handlers are scanned: half the protection delay, 50 ms to 1 s. */
  readonly tickMs: number;
  private ticker: NodeJS.Timeout | null = null;
  private refreshTimer: NodeJS.Timeout | null = null;
  private stuckCount = 0;
  private tripped = false;
  private stopped = false;

  private readonly storage: Storage;

  constructor(
    private readonly db: Queryable,
    storage: Storage,
    private readonly metrics: BerthMetrics,
    private readonly logger: Logger,
    private readonly opts: StuckGuardOptions,
    private readonly running: RunningHandlers,
    private readonly onTooManyStuck: (stuck: ClaimedTask[]) => void,
  ) {
    this.storage = storage;
    this.protectAfterMs = Math.min(opts.graceMs, opts.marginMs / 2);
    // A late scan delays protection by at most half the delay: it still lands by deadline +
    // 0.75 × margin, inside the lease.
    this.tickMs = Math.min(1000, Math.max(50, this.protectAfterMs / 2));
  }

  /** Handlers reported stuck now. */
  get stuck(): number {
    return this.stuckCount;
  }

  start(): void {
    if (this.ticker || this.stopped) return;
    this.ticker = setInterval(() => this.scan(), this.tickMs);
    // A handler that ignores its signal must not also keep the process alive after stop().
    this.ticker.unref();
  }

  /**
   * A run's settlement is written (or refused): drop its overdue row, if it has one. Called for
   * every run; only a map lookup unless the run overran.
   */
  settled(task: ClaimedTask): Promise<void> | undefined {
    // Its key made only when a handler overran (the engine keeps none per task).
    if (this.watched.size === 0) return undefined;
    const w = this.watched.get(entryKey(task));
    return w && this.release(w);
  }

  private scan(): void {
    const now = Date.now();
    for (const w of this.watched.values()) {
      if (w.running && !this.running.has(w.key)) this.returned(w);
      else if (w.running && !w.stuck && now >= w.stuckAt) this.report(w);
    }
    for (const { task } of this.running) {
      const deadline = task.leaseExpiresAt - this.opts.marginMs;
      if (now < deadline + this.protectAfterMs) continue;
      const key = entryKey(task);
      if (this.watched.has(key)) continue;
      const w: Watched = {
        key,
        task,
        deadline,
        stuckAt: deadline + this.opts.graceMs,
        running: true,
        stuck: false,
        protecting: null,
        protectedRow: false,
      };
      this.watched.set(key, w);
      this.protect(w);
      if (now >= w.stuckAt) this.report(w);
    }
  }

  /** Stop refreshing (the worker is stopping): rows go stale and rescue takes their leases. */
  stop(): void {
    this.stopped = true;
    if (this.ticker) clearInterval(this.ticker);
    this.ticker = null;
    if (this.refreshTimer) clearInterval(this.refreshTimer);
    this.refreshTimer = null;
  }

  private fields(w: Watched): Record<string, unknown> {
    const t = w.task;
    return { task_id: t.id, task_type: t.type, lane: laneLabel(t), attempt: t.attempt };
  }

  private protect(w: Watched): void {
    if (this.stopped) return;
    const attempt = async (): Promise<boolean> => {
      for (;;) {
        try {
          return await protectOverdueLease(
            this.db,
            this.storage,
            w.task,
            this.opts.workerId,
            w.stuckAt - Date.now(),
            this.opts.refreshMs * STALE_HEARTBEATS,
          );
        } catch (err) {
          // A database blip: try again while the lease is live (rescue only takes lapsed ones).
          if (!w.running || this.stopped || Date.now() >= w.task.leaseExpiresAt) {
            this.logger.warn(
              { ...this.fields(w), err: (err as Error).message },
              'could not protect the lease of a handler running past its deadline',
            );
            return false;
          }
          await new Promise((r) => setTimeout(r, 1000).unref());
        }
      }
    };
    w.protecting = attempt().then((written) => {
      w.protectedRow = written;
      if (written) this.ensureRefresh();
      else if (w.running) {
        this.logger.warn(
          { ...this.fields(w), lease_expires_at: new Date(w.task.leaseExpiresAt).toISOString() },
          'handler running past its deadline, but its lease could not be protected (already lapsed or settled): the task may run again elsewhere',
        );
      }
      return written;
    });
  }

  private report(w: Watched): void {
    if (!w.running || w.stuck) return;
    w.stuck = true;
    this.stuckCount++;
    this.metrics.stuckHandlers.inc({ task_type: w.task.type });
    this.logger.warn(
      {
        ...this.fields(w),
        deadline: new Date(w.deadline).toISOString(),
        grace_ms: this.opts.graceMs,
        stuck_slots: this.stuckCount,
      },
      'handler is stuck: it ignored its AbortSignal and still runs past its deadline; its slot stays busy and its lease is kept from rescue while this process lives',
    );
    const limit = this.opts.exitOnStuckSlots;
    if (limit !== undefined && this.stuckCount >= limit && !this.tripped) {
      this.tripped = true;
      this.onTooManyStuck([...this.watched.values()].filter((x) => x.stuck && x.running).map((x) => x.task));
    }
  }

  private returned(w: Watched): void {
    if (!w.running) return;
    w.running = false;
    if (w.stuck) {
      this.stuckCount--;
      this.metrics.stuckHandlers.dec({ task_type: w.task.type });
      this.logger.info(
        { ...this.fields(w), overdue_ms: Math.round(Date.now() - w.deadline) },
        'stuck handler returned; its slot is free again',
      );
    }
  }

  private async release(w: Watched): Promise<void> {
    this.returned(w);
    const written = w.protecting !== null ? await w.protecting : false;
    this.watched.delete(w.key);
    if (this.refreshTimer && ![...this.watched.values()].some((x) => x.protectedRow)) {
      clearInterval(this.refreshTimer);
      this.refreshTimer = null;
    }
    if (!written) return;
    // After the settlement, never before: deleting first would let rescue take a lease whose
    // handler has returned but whose result is not written yet.
    await clearOverdueLease(this.db, this.storage, w.task).catch((err: Error) =>
      this.logger.warn(
        { ...this.fields(w), err: err.message },
        'could not remove an overdue lease row; it goes stale and rescue removes it',
      ),
    );
  }

  private ensureRefresh(): void {
    if (this.refreshTimer || this.stopped) return;
    this.refreshTimer = setInterval(() => void this.refresh(), this.opts.refreshMs);
    this.refreshTimer.unref();
  }

  private async refresh(): Promise<void> {
    // Returned but not yet settled counts too: the lease is still this process's to settle.
    const refs = [...this.watched.values()].filter((w) => w.protectedRow).map((w) => w.task);
    try {
      await refreshOverdueLeases(this.db, this.storage, this.opts.workerId, refs);
    } catch (err) {
      // The row stays fresh for STALE_HEARTBEATS intervals: one missed refresh loses nothing.
      this.logger.warn(
        { err: (err as Error).message, leases: refs.length },
        'could not refresh overdue leases; retrying at the next interval',
      );
    }
  }
}
