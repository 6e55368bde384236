import { resolveDatabase, type DatabaseTarget } from '../db/connections.js';
import { storageFor, type Storage } from '../storage/storage.js';
import { checkKeys } from '../limits.js';
import { didYouMean } from '../util/nearest.js';
import { BerthInputError } from '../errors.js';
import type pg from 'pg';
import type { Lane } from '../lane.js';
import { childLogger, type Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import { ElectionSession } from './election.js';
import { publishGauges, readGauges, resetGauges } from './gauges.js';
import { ContentionTally, Promoter, type LaneContention } from './promoter.js';
import { DEFAULT_DEAD_RETENTION_MS, pruneDeadLetters, pruneOperatorHistory } from './retention.js';
import { rotateHistory } from './history.js';
import { maintainRing } from './ring.js';
import { rescueLapsedLeasesIn } from '../storage/rescue.js';
import { pruneSnoozeCounts } from '../storage/snooze.js';
import { DEFAULT_RESULT_RETENTION_MS, pruneResults } from '../storage/results.js';
import { pruneScheduleFires } from '../storage/schedules.js';
import { promoteHeld, pruneTaskKeys } from '../storage/keys.js';
import { depsTick, pruneDepEdges } from '../storage/deps.js';
import { releasePaced } from '../storage/type-limits.js';
import { inPoolTransaction } from '../db/connections.js';
import { CronCache, fireDueSchedules, markStale, type ScheduleClock } from './scheduler.js';

export interface MaintenanceOptions {
  /** How often a follower tries to take leadership, and the leader checks its session. */
  leaderPollMs?: number;
  promoteIntervalMs?: number;
  promoteBatchSize?: number;
  /**
   * Lock timeout for each lane's promotion transaction on the leader's tick (50 ms). `null`
   * waits on a busy lane with no timeout and no hand-off (the behaviour seed 003 fixed; kept
   * for the coupling benchmark's comparison).
   */
  laneLockTimeoutMs?: number | null;
  /** Lock timeout of a busy-lane waiter's promotion transaction (30 s). */
  waiterLockTimeoutMs?: number;
  rescueIntervalMs?: number;
  ringIntervalMs?: number;
  /** Seal the current ring segment once it is this old and holds at least 4 MiB of entries. */
  ringRotateAfterMs?: number;
  /**
   * Seal a smaller (non-empty) segment once it is this old (60 s). Each rotation costs a prune
   * later: TRUNCATE of the segment's partitions under an exclusive lock that claims still
   * reading it wait behind, a file sync per index, new catalog rows. A queue of 100 tasks/s
   * pruned a 500-entry segment every 5 s; it now prunes one of 6,000 a minute.
   */
  ringRotateSmallAfterMs?: number;
  ringLockTimeoutMs?: number;
  retentionIntervalMs?: number;
  deadRetentionMs?: number;
  /**
   * Task results (a handler's returned value) are deleted this long after they were stored
   * (7 days), by the retention branch. Their own setting, not attempt history's: a result is
   * what a dependent task reads of its parent, so it must outlive the history of the attempt.
   */
  resultRetentionMs?: number;
  /**
   * How often the leader checks whether attempt history is due a rotation (60 s). The retention
   * itself is the schema's setting (`berth history`), so every process agrees on it.
   */
  historyIntervalMs?: number;
  gaugeIntervalMs?: number;
  /**
   * How often the leader fires due schedule instants (1 s): a fire is late by at most this plus
   * the time to claim its task, on a quiet fleet.
   */
  scheduleTickMs?: number;
  /** How often the leader marks stale the schedules no live worker declares (5 s). */
  scheduleStaleIntervalMs?: number;
}

/** What `Maintenance.stats()` reports per branch. */
export interface BranchStats {
  runs: number;
  failures: number;
  overruns: number;
  lastMs: number;
  maxMs: number;
  lastRunAt: Date | null;
}

/** MaintenanceOptions with every default filled in and every value checked. */
export type ResolvedMaintenanceOptions = Required<MaintenanceOptions>;

/** Every maintenance default in one place (docs/configuration.md lists them). */
/** Parents the deps branch looks at in one statement (it goes on from the last at once). */
const DEPS_TICK_PARENTS = 2000;
/** How often the deps branch sweeps every parent with a waiting dependent, not only watched ones. */
const DEPS_SWEEP_INTERVAL_MS = 30_000;

export const MAINTENANCE_DEFAULTS: ResolvedMaintenanceOptions = {
  leaderPollMs: 1000,
  promoteIntervalMs: 250,
  promoteBatchSize: 1000,
  laneLockTimeoutMs: 50 as number | null,
  waiterLockTimeoutMs: 30_000,
  rescueIntervalMs: 5000,
  ringIntervalMs: 1000,
  ringRotateAfterMs: 5000,
  ringRotateSmallAfterMs: 60_000,
  ringLockTimeoutMs: 100,
  retentionIntervalMs: 3600_000,
  deadRetentionMs: DEFAULT_DEAD_RETENTION_MS,
  resultRetentionMs: DEFAULT_RESULT_RETENTION_MS,
  historyIntervalMs: 60_000,
  gaugeIntervalMs: 5000,
  scheduleTickMs: 1000,
  scheduleStaleIntervalMs: 5000,
};

/**
 * The options that become a timer's delay (or a session's lock_timeout): Node fires a timer of
 * more than 2^31 - 1 ms (24.8 days) after 1 ms instead, so a branch given a longer interval
 * would run in a loop; PostgreSQL's lock_timeout has the same bound. Retention ages are not
 * timers and may be longer.
 */
const TIMER_KEYS: ReadonlySet<string> = new Set([
  'leaderPollMs',
  'promoteIntervalMs',
  'laneLockTimeoutMs',
  'waiterLockTimeoutMs',
  'rescueIntervalMs',
  'ringIntervalMs',
  'ringLockTimeoutMs',
  'retentionIntervalMs',
  'historyIntervalMs',
  'gaugeIntervalMs',
  'scheduleTickMs',
  'scheduleStaleIntervalMs',
]);
const MAX_TIMER_MS = 2_147_483_647;

/**
 * Defaults filled in, every value checked: a bad interval (0, negative, NaN, a string from a
 * config file) is refused with a clear error before anything starts, not discovered as a busy
 * loop or a branch that never runs.
 */
export function resolveMaintenanceOptions(options: MaintenanceOptions | undefined): ResolvedMaintenanceOptions {
  if (options !== undefined && (typeof options !== 'object' || options === null || Array.isArray(options))) {
    throw new BerthInputError('maintenance options must be an object (see docs/configuration.md)');
  }
  const given = Object.fromEntries(Object.entries(options ?? {}).filter(([, v]) => v !== undefined));
  const o = { ...MAINTENANCE_DEFAULTS, ...given } as ResolvedMaintenanceOptions;
  for (const [key, value] of Object.entries(o) as [keyof MaintenanceOptions, unknown][]) {
    if (!(key in MAINTENANCE_DEFAULTS))
      throw new BerthInputError(
        `unknown maintenance option "${key}"${didYouMean(key, Object.keys(MAINTENANCE_DEFAULTS))}`,
      );
    if (key === 'laneLockTimeoutMs' && value === null) continue;
    const integer = key === 'promoteBatchSize';
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0 || (integer && !Number.isInteger(value))) {
      throw new BerthInputError(
        `maintenance option ${key} must be a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(value)}`,
      );
    }
    if (TIMER_KEYS.has(key) && value > MAX_TIMER_MS) {
      throw new BerthInputError(
        `maintenance option ${key} must be at most ${MAX_TIMER_MS} ms (24.8 days, the longest timer Node keeps), got ${value}`,
      );
    }
  }
  return o;
}

const MAINTENANCE_DEPS_KEYS: ReadonlySet<string> = new Set([
  'connectionString',
  'connectTimeoutMs',
  'onLeadership',
  'schema',
  'pool',
  'logger',
  'metrics',
  'options',
  'workerId',
  'scheduleClock',
]);

/**
 * `startAfterMs`: the branch's first run waits this long after the term begins. Promotion starts
 * at once; rescue and the ring a second in (TERM_SETTLE_MS, or their interval if shorter); the
 * bookkeeping branches (gauges, retention, history rotation) one interval after rescue (the
 * gauges one and a half, see GAUGE_PHASE), capped at a minute (START_CAP_MS), so a starting
 * fleet's new leader does not spend its first moments on full-ring reads while the workers claim
 * their first batches: at start the three took ~100 ms of server CPU over a 50,000-task backlog
 * (gauges 43 ms, the dead-letter prune 39 ms), inside the first claims of a drain, and on their
 * new sessions rescue's first run and the ring's first window read took 40-77 and 30-68 ms
 * beside a 20,000-task drain's first quarter (docs/benchmarks-journal.md, "Worker start"). None of
 * them is owed sooner: a lease lapses a ceiling and a margin after its claim, a rotation or a
 * prune is due seconds apart, a gauge reading is as old as its interval anyway, and retention
 * and rotation are hourly and per-minute.
 */
type Branch = {
  name: string;
  intervalMs: number;
  startAfterMs?: number;
  /**
   * The most of the leader's time this branch may keep a session busy: after a run of `took` ms
   * it waits at least took / busyShare - took. The gauges count the whole backlog (pending per
   * type): 1.0-1.4 s a run at 2 million queued tasks, every 5 s, a quarter of a core taken from
   * the drain (auto_explain; docs/benchmarks-journal.md, "Scaling with work").
   */
  busyShare?: number;
  /**
   * When the branch's work next falls due, if sooner than its interval (ms from the end of its
   * last run): the schedules branch wakes for the next instant instead of up to a tick after it.
   */
  dueInMs?: () => number | null;
  /** Ends the branch's wait early (the keys branch, on a keyed enqueue's `keys` notice). */
  waker?: BranchWaker;
  /** The branch's first run of the term waits its turn here (the settled branches, see settlePhaseMs; the opening ones, see becomeLeader). */
  firstTurn?: FirstTurns;
  run: () => Promise<void>;
};

/**
 * A branch's early wake-up: `wake()` ends the current (or the next) wait of the branch. A wake
 * during a run makes the branch run again as soon as it ends, so an admission asked for while the
 * branch ran is not left for its next interval.
 */
export class BranchWaker {
  private woken = false;
  private release: (() => void) | null = null;

  wake(): void {
    this.woken = true;
    this.release?.();
  }

  /** Sleep `ms`, or until woken or `signal` aborts. */
  sleep(ms: number, signal: AbortSignal): Promise<void> {
    if (this.woken || signal.aborted) {
      this.woken = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        signal.removeEventListener('abort', done);
        this.release = null;
        this.woken = false;
        resolve();
      };
      const t = setTimeout(done, ms);
      this.release = done;
      signal.addEventListener('abort', done);
    });
  }
}

/**
 * Woken for a schedule instant this long after it (a timer may fire a little early; an instant
 * not yet due is found at the next wake), and never sooner than MIN_DUE_WAIT_MS after the last
 * run (a test's clock that stands still would otherwise spin the branch).
 */
const DUE_MARGIN_MS = 2;
const MIN_DUE_WAIT_MS = 5;

/** How long a schedule's fire records are kept (what `berth schedules show` and attempt history read). */
const SCHEDULE_FIRE_RETENTION_MS = 7 * 24 * 3600_000;

/** The gauges' busy share: at most 5 % of the time reading the backlog. */
const GAUGE_BUSY_SHARE = 0.05;

/**
 * How long a branch sleeps after a run that took `took` ms: the rest of its interval, and at
 * least long enough to keep within its busy share.
 */
export function branchWait(b: Pick<Branch, 'intervalMs' | 'busyShare'>, took: number): number {
  const cycle = b.busyShare ? Math.max(b.intervalMs, took / b.busyShare) : b.intervalMs;
  return Math.max(0, cycle - took);
}

/** The longest a bookkeeping branch waits for its first run in a term (see Branch). */
const START_CAP_MS = 60_000;

/** How far into a term rescue and the ring first run, at most (see Branch). */
export const TERM_SETTLE_MS = 1000;

/** When rescue or the ring first runs in a term: TERM_SETTLE_MS in, or one interval if that is shorter. */
export function settledStartMs(intervalMs: number): number {
  return Math.min(TERM_SETTLE_MS, intervalMs);
}

/**
 * The settled branches (rescue, the ring, the stale-schedule mark) make their first runs of a
 * term half a promotion tick after settledStartMs, and one at a time (FirstTurns), so they find
 * idle the sessions the term's first ticks opened instead of opening sessions of their own. At
 * TERM_SETTLE_MS itself the promotion, keys, deps and schedules branches tick too (every 250 ms
 * and every second from the term's start), and the seven runs at once opened one to three new
 * sessions of the shared pool (a backend's fork, its catalog loading and first plans: rescue's
 * first bind took 28.7 ms and the ring's first window read 29 ms on such sessions) a second after
 * a new worker started: in bench/cold-pickup-probe.ts the slowest pickups of a new process came
 * in the first 100-150 ms of enqueues, as those sessions opened; now none opens then
 * (docs/benchmarks-journal.md, "A new process's pickup tail and the leader's first runs").
 */
export function settlePhaseMs(promoteIntervalMs: number): number {
  // Capped: a long promotion tick (validation allows days) must not postpone a new term's first
  // rescue and ring runs by half of it (test/maintenance-review-first-turns.test.ts).
  return Math.min(promoteIntervalMs / 2, SETTLE_PHASE_MAX_MS);
}

/** settlePhaseMs's cap: twice the default promotion tick's half. */
export const SETTLE_PHASE_MAX_MS = 250;

/**
 * How long a first run waits for the one before it (FirstTurns): a first run on an idle session
 * takes milliseconds to tens of them; one blocked on a lock or a slow statement must not hold back
 * the others' first runs for up to its statement timeout (or for ever behind a pooler that drops
 * it), so this long after its start the next one runs beside it, as every branch did before.
 */
export const FIRST_TURN_WAIT_MAX_MS = 1000;

/**
 * One at a time: each `take()` resolves once the turn before it is released, or `maxWaitMs` after
 * that turn was granted (it still running: the two then run side by side). A chain of first runs
 * each blocked waits that long per turn: the fourth of a term's opening turns at most 3 s.
 */
export class FirstTurns {
  /** When the last turn taken was granted, and when it ended. */
  private lastGranted: Promise<unknown> = Promise.resolve();
  private lastEnded: Promise<void> = Promise.resolve();

  take(maxWaitMs: number): Promise<() => void> {
    let release!: () => void;
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    const before = this.lastEnded;
    // A turn waits for the one before it to end, or `maxWaitMs` from that one's start: counted
    // from the call, the turns a term takes together would all be granted at the same moment
    // once the first was waited out (test/review-opening-turns.test.ts). A turn never waits for
    // the ones before the one before it: after one that was waited out, the rest still go one
    // at a time (test/maintenance-review-leader-events.test.ts).
    const granted = this.lastGranted.then(
      () =>
        new Promise<() => void>((resolve) => {
          const timer = setTimeout(() => resolve(release), maxWaitMs);
          timer.unref();
          void before.then(() => {
            clearTimeout(timer);
            resolve(release);
          });
        }),
    );
    this.lastGranted = granted;
    this.lastEnded = mine;
    return granted;
  }
}

/**
 * When a bookkeeping branch first runs in a term: `1 + phase` of its interval in, capped at
 * START_CAP_MS. Branches keep their phase (a run waits out the rest of its interval, see
 * branchWait), so a phase set here is kept for the term.
 */
export function firstRunAfterMs(intervalMs: number, phase = 0): number {
  return Math.min(intervalMs * (1 + phase), START_CAP_MS);
}

/**
 * The gauges run half an interval out of step with rescue: at their defaults (both 5 s) they
 * ran at the same moments, and with them the ring's rotation (5 s after the last) and each
 * rotation's stale windows. In the pickup probe the slowest pickups of a run came at that 5 s
 * mark, behind rescue, a rotation, two window reads and the gauges at once (bench/pickup-probe.ts
 * --stages, PROBE_TAIL_DEBUG=1).
 */
export const GAUGE_PHASE = 0.5;

/**
 * Exactly one maintenance leader per schema, elected through a session-level advisory lock that
 * each process tries on one election session of its own, kept open across polls
 * (`ElectionSession`): when the leader dies or its connection drops, PostgreSQL releases the
 * lock and a follower takes it on its next poll. Each branch runs on its own loop, timed and
 * counted, so a slow branch (or a busy lane in promotion) never delays the others (only the first
 * runs of rescue, the ring and the stale-schedule mark in a term take turns, see settlePhaseMs).
 * Cooldowns are wall-clock: a branch that overran its interval starts again at once, never backed
 * off.
 */
export class Maintenance {
  private readonly opts: ResolvedMaintenanceOptions;
  /** The schema's storage, bound once (storage/storage.ts). */
  private readonly storage: Storage;
  private readonly database: DatabaseTarget;
  private stopped = false;
  private election: ElectionSession | null = null;
  private term: AbortController | null = null;
  private branchLoops: Promise<void>[] = [];
  /** The last term's step-down while its branches are still ending (its leader:lost not yet sent). */
  private steppingDown: Promise<void> | null = null;
  /** Terms whose leader:gained was sent, so their leader:lost is sent too. */
  private readonly announced = new WeakSet<AbortController>();
  private promoter: Promoter | null = null;
  private readonly branchStats = new Map<string, BranchStats>();
  /** Per-lane promotion contention, kept across leadership terms of this process. */
  private readonly contentionTally = new ContentionTally();
  /** Wakes the keys branch (a keyed enqueue's or a raised key limit's `keys` notice). */
  private readonly keysWaker = new BranchWaker();
  /** Wakes the deps branch (a `deps` notice: an edge to watch, a parent that died or was removed). */
  private readonly depsWaker = new BranchWaker();
  /** Where the deps branch's watch and sweep go on from (null: from the first parent). */
  private depsCursor: string | null = null;
  private sweepCursor: string | null = null;
  private lastSweepAt = 0;
  /** The last key the keys branch visited (it goes on from there; null: from the first). */
  private keysCursor: string | null = null;
  private readonly stopSignal = new AbortController();
  private loop: Promise<void> | null = null;
  /** Held leases at the last rescue run (logged on change). */
  private lastHeld = 0;
  /** Parsed cron expressions, kept across terms. */
  private readonly crons = new CronCache();
  /** Schedules logged as having a watermark ahead of the clock, kept across terms (one line each). */
  private readonly aheadLogged = new Map<string, number>();

  constructor(
    private readonly deps: {
      connectionString: string;
      /** How long the election session's connect may take; default as `resolveDatabase` says (10 s). */
      connectTimeoutMs?: number;
      schema: string;
      pool: pg.Pool;
      logger: Logger;
      metrics: BerthMetrics;
      options?: MaintenanceOptions;
      /** Shown as the leader session's application_name, so operators can see who leads. */
      workerId?: string;
      /** Told after this process became leader (true) or stepped down (false): `worker.events`. */
      onLeadership?: (leader: boolean) => void;
      /** The time schedules are fired by; default the database's clock (tests set their own). */
      scheduleClock?: ScheduleClock;
    },
  ) {
    checkKeys(deps, MAINTENANCE_DEPS_KEYS, 'Maintenance');
    // Resolving a resolved value changes nothing: the worker resolves its options up front.
    this.opts = resolveMaintenanceOptions(deps.options);
    this.storage = storageFor(deps.schema);
    this.database = resolveDatabase(deps.connectionString, { connectTimeoutMs: deps.connectTimeoutMs });
  }

  /**
   * A `keys` notice arrived (a keyed enqueue, a raised key limit, held tasks): if this process
   * leads, admit held tasks now rather than at the next promotion tick.
   */
  noteKeys(): void {
    this.keysWaker.wake();
  }

  /**
   * A `deps` notice arrived (an enqueue whose parents may already be running, a parent that died
   * or was removed): if this process leads, look at the watched parents now.
   */
  noteDeps(): void {
    this.depsWaker.wake();
  }

  get isLeader(): boolean {
    return this.term !== null;
  }

  /** Per-branch run counts and durations since this process started (leader terms only). */
  stats(): Record<string, BranchStats> {
    return Object.fromEntries([...this.branchStats].map(([k, v]) => [k, { ...v }]));
  }

  /** Lanes the current term has handed to a promotion waiter. */
  waitingLanes(): Lane[] {
    return this.promoter?.waitingLanes ?? [];
  }

  /** Per-lane contention outcomes of this process's promotion (bounded; most recent first). */
  contention(): LaneContention[] {
    return this.contentionTally.list();
  }

  start(): void {
    this.election = new ElectionSession({
      database: this.database,
      schema: this.storage.schema.name,
      workerId: this.deps.workerId ?? `pid ${process.pid}`,
      pollMs: this.opts.leaderPollMs,
      logger: this.deps.logger,
      // Step down at once, not at the next poll: a follower may already hold the lock.
      onLeaderSessionLost: () => void this.stepDown(),
    });
    this.loop = this.electionLoop(this.election);
  }

  private async electionLoop(election: ElectionSession): Promise<void> {
    while (!this.stopped) {
      const leads = await election.poll();
      if (this.stopped) break;
      if (leads && !this.term) this.becomeLeader();
      else if (!leads && this.term) await this.stepDown();
      await sleepUnlessAborted(this.opts.leaderPollMs, this.stopSignal.signal);
    }
  }

  private becomeLeader(): void {
    this.term = new AbortController();
    this.deps.metrics.isLeader.set(1);
    this.deps.logger.info('became maintenance leader');
    const o = this.opts;
    const { pool, metrics } = this.deps;
    const storage = this.storage;
    const schema = storage.schema.name;
    const promoter = new Promoter(
      pool,
      storage,
      {
        batchSize: o.promoteBatchSize,
        laneLockTimeoutMs: o.laneLockTimeoutMs,
        waiterLockTimeoutMs: o.waiterLockTimeoutMs,
        poolSize: pool.options.max ?? 10,
      },
      metrics,
      childLogger(this.deps.logger, { branch: 'promote' }),
      this.contentionTally,
    );
    this.promoter = promoter;
    let nextInstantInMs: number | null = null;
    const settled = new FirstTurns();
    // The branches that tick from the term's start (promotion, keys, deps, schedules) make their
    // first runs one at a time too: at once, they took three new sessions of the shared pool in
    // a new worker's first claims, and a new server session costs ~17 ms of the 2-core development
    // machine, made one after the other (pgbench -C; docs/benchmarks-journal.md, "A new process's
    // start"). Each keeps the phase its turn gave it (branchWait), so their later ticks, a
    // millisecond or two each, fall apart too and share a session.
    const opening = new FirstTurns();
    const settleAt = (intervalMs: number) => settledStartMs(intervalMs) + settlePhaseMs(o.promoteIntervalMs);
    const branches: Branch[] = [
      {
        name: 'promote',
        intervalMs: o.promoteIntervalMs,
        firstTurn: opening,
        run: async () => {
          await promoter.tick();
        },
      },
      {
        // Concurrency keys: admit held tasks whose keys have room (the workers that settle keyed
        // tasks do it at once for their keys; this catches the rest: a keyed enqueue, a crashed
        // worker's tasks settled by rescue, a failed release, a raised limit).
        name: 'keys',
        intervalMs: o.promoteIntervalMs,
        firstTurn: opening,
        waker: this.keysWaker,
        run: async () => {
          // Round-robin over the keys with held tasks, a thousand a run, so none waits behind
          // the first thousand: the run goes on from the last key it visited.
          const r = await promoteHeldWithin(pool, storage, this.keysCursor);
          this.keysCursor = r.lastKey;
          if (r.admitted > 0) metrics.keysAdmitted.inc(r.admitted);
        },
      },
      {
        // Task dependencies: the parents whose completion cannot be sure to release their
        // dependents (enqueued before them, keyed, failed, removed) are looked at every tick;
        // every parent with a dependent still waiting, every 30 s (the sweep: a backstop for a
        // hook that could not run). Completed → released; dead, cancelled, deleted → policies.
        name: 'deps',
        intervalMs: o.promoteIntervalMs,
        firstTurn: opening,
        waker: this.depsWaker,
        run: async () => {
          const sweep = Date.now() - this.lastSweepAt >= DEPS_SWEEP_INTERVAL_MS;
          const r = await depsTick(pool, storage, {
            all: sweep,
            after: sweep ? this.sweepCursor : this.depsCursor,
            limit: DEPS_TICK_PARENTS,
          });
          if (sweep) {
            this.sweepCursor = r.lastParent;
            if (r.lastParent === null) this.lastSweepAt = Date.now();
          } else this.depsCursor = r.lastParent;
          if (r.released > 0) metrics.dependencyReleases.inc({ path: 'leader' }, r.released);
          if (r.cancelled > 0) {
            metrics.dependencyCancels.inc(r.cancelled);
            this.deps.logger.info(
              { cancelled: r.cancelled },
              'cancelled tasks waiting on a task that died, was cancelled or deleted',
            );
          }
          // More to look at (a cursor, or a cascade of cancels a level deeper): again at once.
          if (r.lastParent !== null || r.cancelled > 0) this.depsWaker.wake();
        },
      },
      {
        name: 'rescue',
        intervalMs: o.rescueIntervalMs,
        startAfterMs: settleAt(o.rescueIntervalMs),
        firstTurn: settled,
        run: async () => {
          const r = await rescueLapsedLeasesIn(pool, storage);
          if (r.retried) metrics.rescued.inc({ result: 'retry' }, r.retried);
          if (r.dead) metrics.rescued.inc({ result: 'dead' }, r.dead);
          metrics.rescueHeld.set(r.held);
          // Logged when the number changes, not every run: a stuck handler can be held for hours.
          if (r.held !== this.lastHeld && r.held > 0) {
            this.deps.logger.warn(
              { held: r.held },
              'lapsed leases left to their holders: their handlers still run past the deadline (see berth_task_stuck_handlers)',
            );
          }
          this.lastHeld = r.held;
          if (r.retried || r.dead) this.deps.logger.warn({ retried: r.retried, dead: r.dead }, 'rescued lapsed leases');
          // Tasks a task type's rate limit handed back that no limit holds any more (cleared or
          // changed while their hand-back was on its way): due now. A probe of an empty table
          // when no type is limited.
          const released = await releasePaced(pool, storage, null);
          if (released > 0) this.deps.logger.info({ released }, "tasks paced by a type's former rate limit made due");
        },
      },
      {
        name: 'ring',
        intervalMs: o.ringIntervalMs,
        startAfterMs: settleAt(o.ringIntervalMs),
        firstTurn: settled,
        run: async () => {
          const r = await maintainRing(pool, schema, {
            rotateAfterMs: o.ringRotateAfterMs,
            rotateSmallAfterMs: o.ringRotateSmallAfterMs,
            lockTimeoutMs: o.ringLockTimeoutMs,
          });
          metrics.ringRotations.inc({ result: r.rotation });
          for (const p of r.prunes) {
            metrics.ringPrunes.inc({ result: p.result, reason: 'reason' in p ? p.reason : '' });
            if (p.result === 'recovered') {
              this.deps.logger.error(
                { segment: p.segment, entries: p.entries },
                'ring prune found entries no claim would ever lease and sent them back to deferred: a berth bug, please report it',
              );
            }
          }
        },
      },
      {
        name: 'schedules',
        intervalMs: o.scheduleTickMs,
        firstTurn: opening,
        dueInMs: () => nextInstantInMs,
        run: async () => {
          nextInstantInMs = null;
          const r = await fireDueSchedules(pool, storage, {
            metrics,
            logger: childLogger(this.deps.logger, { branch: 'schedules' }),
            clock: this.deps.scheduleClock,
            crons: this.crons,
            aheadLogged: this.aheadLogged,
          });
          nextInstantInMs = r.nextInMs;
        },
      },
      {
        name: 'schedule-stale',
        intervalMs: o.scheduleStaleIntervalMs,
        startAfterMs: settleAt(o.scheduleStaleIntervalMs),
        firstTurn: settled,
        run: async () => {
          await markStale(pool, storage, this.deps.logger);
        },
      },
      {
        name: 'retention',
        intervalMs: o.retentionIntervalMs,
        startAfterMs: firstRunAfterMs(o.retentionIntervalMs),
        run: async () => {
          const n = await pruneDeadLetters(pool, schema, o.deadRetentionMs, 5000, this.term?.signal);
          metrics.deadPruned.inc(n);
          if (n) this.deps.logger.info({ pruned: n }, 'pruned dead letters past retention');
          const h = await pruneOperatorHistory(pool, schema);
          if (h.outcomeCounts + h.workers > 0) this.deps.logger.info(h, 'pruned operator history past retention');
          const f = await pruneScheduleFires(pool, storage, SCHEDULE_FIRE_RETENTION_MS);
          if (f) this.deps.logger.info({ pruned: f }, 'pruned schedule fire records past retention');
          const z = await pruneSnoozeCounts(pool, storage);
          if (z) this.deps.logger.info({ pruned: z }, 'pruned snooze counts of tasks no longer pending');
          const results = await pruneResults(pool, storage, o.resultRetentionMs, 5000, this.term?.signal);
          if (results) this.deps.logger.info({ pruned: results }, 'pruned task results past retention');
          // In batches until a short one, as results are (a backlog of finished keyed tasks
          // larger than one batch would otherwise grow an hour at a time).
          let keys = 0;
          for (let n = 5000; n === 5000 && !this.term?.signal.aborted; keys += n)
            n = await pruneTaskKeys(pool, storage, 5000);
          if (keys) this.deps.logger.info({ pruned: keys }, 'pruned the concurrency keys of tasks that are gone');
          let edges = 0;
          for (let n = 5000; n >= 5000 && !this.term?.signal.aborted; edges += n)
            n = await pruneDepEdges(pool, storage, 5000);
          if (edges) this.deps.logger.info({ pruned: edges }, 'pruned the dependency edges of tasks that are gone');
        },
      },
      {
        name: 'history',
        intervalMs: o.historyIntervalMs,
        startAfterMs: firstRunAfterMs(o.historyIntervalMs),
        run: async () => {
          const r = await rotateHistory(pool, schema, o.ringLockTimeoutMs);
          if (r === 'rotated') this.deps.logger.info('attempt history rotated: its oldest partition truncated');
          else if (r === 'blocked')
            this.deps.logger.warn('attempt history rotation blocked by a reader of the partition; retrying next run');
        },
      },
      {
        name: 'gauges',
        intervalMs: o.gaugeIntervalMs,
        // Counted from rescue's first run, so the two stay half an interval apart.
        startAfterMs: settleAt(o.rescueIntervalMs) + firstRunAfterMs(o.gaugeIntervalMs, GAUGE_PHASE),
        busyShare: GAUGE_BUSY_SHARE,
        run: async () => {
          const snap = await readGauges(pool, schema);
          if (!this.term?.signal.aborted && this.term !== null) publishGauges(metrics, snap);
        },
      },
    ];
    const term = this.term;
    const signal = term.signal;
    this.branchLoops = branches.map((b) => this.runBranch(b, signal));
    // leader:gained after the last term's leader:lost: that term's branches may still be ending.
    const announce = () => {
      this.announced.add(term);
      this.deps.onLeadership?.(true);
    };
    const before = this.steppingDown;
    if (before === null) announce();
    else {
      const after = () => {
        if (this.term === term) announce();
      };
      void before.then(after, after);
    }
  }

  private async runBranch(b: Branch, signal: AbortSignal): Promise<void> {
    let failures = 0;
    if (b.startAfterMs) await sleepUnlessAborted(b.startAfterMs, signal);
    let turn = b.firstTurn;
    while (!signal.aborted) {
      const release = turn ? await turn.take(FIRST_TURN_WAIT_MAX_MS) : null;
      turn = undefined;
      if (signal.aborted) {
        release?.();
        break;
      }
      const started = performance.now();
      try {
        await b.run();
        failures = 0;
      } catch (err) {
        failures++;
        this.deps.metrics.maintenanceErrors.inc({ branch: b.name });
        this.deps.logger.error({ err: (err as Error).message, branch: b.name }, 'maintenance branch failed');
      } finally {
        release?.();
      }
      const took = performance.now() - started;
      this.deps.metrics.maintenanceSeconds.observe({ branch: b.name }, took / 1000);
      if (took > b.intervalMs) this.deps.metrics.maintenanceOverruns.inc({ branch: b.name });
      const st = this.branchStats.get(b.name) ?? {
        runs: 0,
        failures: 0,
        overruns: 0,
        lastMs: 0,
        maxMs: 0,
        lastRunAt: null,
      };
      st.runs++;
      if (failures) st.failures++;
      if (took > b.intervalMs) st.overruns++;
      st.lastMs = took;
      st.maxMs = Math.max(st.maxMs, took);
      st.lastRunAt = new Date();
      this.branchStats.set(b.name, st);
      // Errors back off (bounded) so a broken database is not hammered; success never does,
      // and promotion never does (its interval is already its floor).
      const errorBackoff = failures && b.name !== 'promote' ? Math.min(250 * 2 ** failures, 30_000) : 0;
      const due = failures ? null : (b.dueInMs?.() ?? null);
      const wait =
        due === null
          ? branchWait(b, took) + errorBackoff
          : Math.min(branchWait(b, took), Math.max(MIN_DUE_WAIT_MS, due + DUE_MARGIN_MS));
      await (b.waker ? b.waker.sleep(wait, signal) : sleepUnlessAborted(wait, signal));
    }
  }

  private stepDown(): Promise<void> {
    const term = this.term;
    if (!term) return this.steppingDown ?? Promise.resolve();
    this.term = null;
    term.abort();
    this.deps.metrics.isLeader.set(0);
    this.deps.logger.info('stepped down as maintenance leader');
    // This term's own loops and promoter: a new term may begin before they end (the election
    // session came back while one of this term's runs was still blocked), and its own are not
    // this term's to clear (test/maintenance-review-first-turns.test.ts, "the end of a term…").
    const loops = this.branchLoops;
    const promoter = this.promoter;
    // After any earlier term's step-down, so leader:lost events come in the terms' order and the
    // last step-down covers every earlier one (stop() awaits it).
    const earlier = this.steppingDown;
    const done = Promise.allSettled([...loops, promoter?.stop(), earlier]).then(() => {
      if (this.branchLoops === loops) this.branchLoops = [];
      if (this.promoter === promoter) this.promoter = null;
      // Only the leader exports the queue-wide gauges; a former leader must not keep stale ones.
      // Reset after every branch has ended, so a gauge read in flight cannot republish them; not
      // when a new term leads already (its gauges are its own).
      if (this.term === null) resetGauges(this.deps.metrics);
      if (this.steppingDown === done) this.steppingDown = null;
      // A term that ended before its leader:gained was sent (see becomeLeader) sends neither.
      if (this.announced.delete(term)) this.deps.onLeadership?.(false);
    });
    this.steppingDown = done;
    return done;
  }

  /** Stop: end every branch this leader started, then release leadership (end the election session). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.stopSignal.abort();
    await this.stepDown();
    // An earlier term still ending while no term leads (stepDown() above then had none to end).
    await this.steppingDown;
    // After the branches have ended (stepDown awaits them), so no other leader's branches can
    // overlap ours; before awaiting the loop, so a poll in flight is cut short, not waited out.
    await this.election?.close();
    await this.loop?.catch(() => undefined);
  }
}

/**
 * Admit held keyed tasks of the keys after `after` (promote_held tries every lock it takes, so
 * it never waits while holding others), in a transaction of its own.
 */
function promoteHeldWithin(
  pool: pg.Pool,
  storage: Storage,
  after: string | null,
): Promise<{ admitted: number; lastKey: string | null }> {
  return inPoolTransaction(pool, (c) => promoteHeld(c.client, storage, null, after));
}

function sleepUnlessAborted(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done);
  });
}
