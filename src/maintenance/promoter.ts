import type pg from 'pg';
import { childLogger, type Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import { laneKey, laneLabel, type Lane } from '../lane.js';
import type { Storage } from '../storage/storage.js';
import { isLockTimeout, promoteDueLaneIn, promoteDueLanesIn, type DeferredState } from './promote.js';

export interface PromoterOptions {
  batchSize: number;
  /** Lock timeout of each lane transaction on the leader's tick (seed 003: 50 ms); null: none. */
  laneLockTimeoutMs: number | null;
  /** Lock timeout of a waiter's lane transaction (seed 003: 30 s). */
  waiterLockTimeoutMs: number;
  /** The pool's size; waiters hold pool connections while they wait. */
  poolSize: number;
}

/** Seed 003: one waiter per eight pool connections, never fewer than one nor more than four. */
export function waiterLimit(poolSize: number): number {
  return Math.max(1, Math.min(4, Math.floor(poolSize / 8)));
}

const STATES: readonly DeferredState[] = ['scheduled', 'retryable'];

/** How long a lane whose promotion errored is left out before it is tried again. */
const FAILING_LANE_COOLDOWN_MS = 30_000;

/** The outcomes counted on berth_promote_lane_contention_total. */
export type ContentionOutcome = 'handed_off' | 'waiter_limit' | 'waiter_timed_out' | 'failed';

/** One lane's contention outcomes since this process first saw it contended (JSON-safe). */
export interface LaneContention extends Lane {
  handed_off: number;
  waiter_limit: number;
  waiter_timed_out: number;
  failed: number;
  lastOutcome: ContentionOutcome;
  /** ISO time of the last outcome. */
  lastAt: string;
}

/** How many lanes a ContentionTally keeps by default. */
export const CONTENTION_LANES = 1000;

/**
 * Per-lane tallies of the promoter's contention outcomes (the per-lane view of
 * berth_promote_lane_contention_total, whose labels stop at the queue). Bounded: past `maxLanes`
 * the lane whose last contention is oldest is dropped. Outlives a leadership term (the
 * Maintenance owning it passes it to each term's Promoter).
 */
export class ContentionTally {
  /** In order of last contention, oldest first (a lane is re-inserted on each outcome). */
  private readonly lanes = new Map<string, LaneContention>();

  constructor(readonly maxLanes = CONTENTION_LANES) {}

  record(lane: Lane, outcome: ContentionOutcome, at = new Date()): void {
    const key = laneKey(lane);
    const entry = this.lanes.get(key) ?? {
      queue: lane.queue,
      priority: lane.priority,
      shard: lane.shard,
      handed_off: 0,
      waiter_limit: 0,
      waiter_timed_out: 0,
      failed: 0,
      lastOutcome: outcome,
      lastAt: at.toISOString(),
    };
    entry[outcome]++;
    entry.lastOutcome = outcome;
    entry.lastAt = at.toISOString();
    this.lanes.delete(key);
    this.lanes.set(key, entry);
    while (this.lanes.size > this.maxLanes) {
      const oldest = this.lanes.keys().next().value;
      if (oldest === undefined) break;
      this.lanes.delete(oldest);
    }
  }

  /** Every tallied lane, most recently contended first (copies). */
  list(): LaneContention[] {
    return [...this.lanes.values()].reverse().map((e) => ({ ...e }));
  }

  get size(): number {
    return this.lanes.size;
  }
}

interface Waiter {
  lane: Lane;
  done: Promise<void>;
}

/**
 * The leader's promotion, one instance per leadership term (seed 003's QueueStoragePromoter).
 *
 * Each tick promotes batches lane by lane under a short lane lock timeout. A lane that times
 * out is skipped for the rest of the tick and handed to a waiter, which promotes it in batches
 * under a long lock timeout. PostgreSQL grants a lock to its waiters in arrival order, so the
 * waiter is served after the producers already queued, however busy the lane stays: that is
 * the fairness bound. The leader never waits on a busy lane for more than one short timeout per
 * newly contended lane per tick, and skips lanes that have a waiter. Ending the term aborts the
 * waiters; an aborted waiter's transaction rolls back and its rows stay deferred.
 */
export class Promoter {
  private readonly waiters = new Map<string, Waiter>();
  /** Lanes whose promotion raised an error, and until when they are left out. */
  private readonly failingLanes = new Map<string, Lane>();
  private readonly failingUntil = new Map<string, number>();
  private readonly abort = new AbortController();

  private readonly storage: Storage;

  constructor(
    private readonly pool: pg.Pool,
    storage: Storage,
    private readonly opts: PromoterOptions,
    private readonly metrics: BerthMetrics,
    private readonly logger: Logger,
    /** Where contention outcomes are tallied per lane (Maintenance passes one that outlives the term). */
    readonly contention: ContentionTally = new ContentionTally(),
  ) {
    this.storage = storage;
  }

  /** Lanes currently handed to a waiter. */
  get waitingLanes(): Lane[] {
    return [...this.waiters.values()].map((w) => w.lane);
  }

  /** One promotion tick. Returns rows promoted by the tick itself (waiters count separately). */
  async tick(): Promise<number> {
    let total = 0;
    const skipThisTick = new Map<string, Lane>();
    const now = Date.now();
    for (const [key, until] of this.failingUntil) if (until <= now) this.failingUntil.delete(key);
    for (const state of STATES) {
      for (;;) {
        if (this.abort.signal.aborted) return total;
        const failing = [...this.failingLanes.entries()].filter(([k]) => this.failingUntil.has(k)).map(([, l]) => l);
        const skip = [...this.waitingLanes, ...skipThisTick.values(), ...failing];
        const started = performance.now();
        const r = await promoteDueLanesIn(
          this.pool,
          this.storage,
          state,
          this.opts.batchSize,
          this.opts.laneLockTimeoutMs,
          skip,
        );
        this.recordBatch(r.promoted, performance.now() - started);
        total += r.promoted;
        for (const f of r.failed) {
          // A lane that errors (say its sequence is missing: see lane_sequence_problems) must not
          // hold the batch: it is left out for the rest of the tick and for a cooldown after.
          const key = laneKey(f.lane);
          skipThisTick.set(key, f.lane);
          this.failingLanes.set(key, f.lane);
          this.failingUntil.set(key, Date.now() + FAILING_LANE_COOLDOWN_MS);
          this.countContention(f.lane, state, 'failed');
          this.logger.error(
            { err: f.error.message, lane: f.lane, state, retry_in_ms: FAILING_LANE_COOLDOWN_MS },
            'promotion of a lane failed; lane skipped for a while',
          );
        }
        for (const lane of r.contended) {
          skipThisTick.set(laneKey(lane), lane);
          this.handOff(lane, state);
        }
        // A short batch means nothing else is due in this state (bar skipped lanes).
        if (r.selected < this.opts.batchSize) break;
        if (r.promoted === 0 && r.contended.length === 0 && r.failed.length === 0) break;
      }
    }
    return total;
  }

  private recordBatch(size: number, ms: number): void {
    this.metrics.promoteBatches.inc();
    this.metrics.promoteBatchSize.observe(size);
    this.metrics.promoteSeconds.observe(ms / 1000);
    this.metrics.promoted.inc(size);
  }

  private handOff(lane: Lane, state: DeferredState): void {
    const key = laneKey(lane);
    if (this.waiters.has(key)) return;
    if (this.waiters.size >= waiterLimit(this.opts.poolSize)) {
      // Every waiter is busy; the lane is retried on the next tick.
      this.countContention(lane, state, 'waiter_limit');
      return;
    }
    this.countContention(lane, state, 'handed_off');
    const waiter: Waiter = { lane, done: Promise.resolve() };
    waiter.done = this.runWaiter(lane, state).finally(() => this.waiters.delete(key));
    this.waiters.set(key, waiter);
  }

  /** On the metric (by queue) and on the per-lane tally. */
  private countContention(lane: Lane, state: DeferredState, outcome: ContentionOutcome): void {
    this.metrics.laneContention.inc({ state, queue: lane.queue, outcome });
    this.contention.record(lane, outcome);
  }

  private async runWaiter(lane: Lane, state: DeferredState): Promise<void> {
    const log = childLogger(this.logger, { lane: laneLabel(lane) });
    log.info('busy lane handed to a promotion waiter');
    try {
      for (;;) {
        if (this.abort.signal.aborted) return;
        const started = performance.now();
        const n = await promoteDueLaneIn(
          this.pool,
          this.storage,
          lane,
          this.opts.batchSize,
          this.opts.waiterLockTimeoutMs,
          this.abort.signal,
        );
        this.recordBatch(n, performance.now() - started);
        if (n < this.opts.batchSize) return;
      }
    } catch (err) {
      if (this.abort.signal.aborted) return;
      if (isLockTimeout(err)) {
        this.countContention(lane, state, 'waiter_timed_out');
        log.warn({ timeout_ms: this.opts.waiterLockTimeoutMs }, 'promotion waiter timed out on a busy lane');
        return;
      }
      log.error({ err: (err as Error).message }, 'promotion waiter failed');
    }
  }

  /** End of the term: abort every waiter (their transactions roll back) and wait for them. */
  async stop(): Promise<void> {
    this.abort.abort();
    await Promise.allSettled([...this.waiters.values()].map((w) => w.done));
  }
}
