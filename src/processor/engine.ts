import { storageFor, type Storage } from '../storage/storage.js';
import { CancelAbort, ShutdownAbort } from '../errors.js';
import { laneLabel } from '../lane.js';
import { childLogger, type Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import { type AnyTaskDefinition, type BackoffPolicy, DEFAULT_BACKOFF } from '../task.js';
import { abortableSleep } from '../util/abortable-sleep.js';
import { anchorShape } from '../util/shape-anchor.js';
import type { ClaimedTask } from './claim.js';
import { STAND_IN_TERMS, standInLease, tasksOf } from './claim-shared.js';
import { type FetchLoop, Fetcher } from './fetcher.js';
import { DiscoveryReads } from './discovery-reads.js';
import { KeyReleaser } from './key-releaser.js';
import { TypeRateGate } from './type-rate-gate.js';
import { DEFAULT_HEARTBEAT_MS } from '../storage/live-workers.js';
import type { OutcomeTally } from './heartbeat.js';
import { type SettleAnswer, type Settlement, settlementFor, type TaskAttempt, type TaskRun } from './outcome-table.js';
import { NotifyThrottle } from './notify-throttle.js';
import { PrefetchRate } from './prefetch-rate.js';
import { DeadlineTimer, RunAbort } from './run-abort.js';
import { HandlerRun, type RunInput, runHandler, runTask, type RunDeps, type Startable, startRun } from './run-task.js';
import { ScheduleCeilings } from './schedule-ceilings.js';
import { afterRefused, completedAnswer, type SettleDeps, settled, writeSettlement } from './settle-task.js';
import type { CompleteResult, CompletionOwner, SettlementBatcher } from './settlement-batcher.js';
import { entryKey } from '../storage/attempt.js';
import { groupByLease, groupValues } from '../storage/complete.js';
import type { ResultJson } from '../storage/results.js';
import { returnUnstarted } from '../storage/return.js';
import { cancelledAmong, CANCEL_NOTICE_PREFIX, parseCancelNotice } from '../storage/cancel.js';
import { type RunningHandlers, StuckGuard } from './stuck.js';
import type { EngineOptions } from './engine-options.js';
import { TypeMetrics } from './type-metrics.js';
import { TaskReports } from './task-reports.js';
import { UnknownTypes } from './unknown-types.js';
import { Attempt, type TaskObserver } from './task-observer.js';
import type { WorkerEvents } from './task-events.js';

/** The longest wait between claim attempts while the database fails (see runFetchLoop). */
const FETCH_RETRY_MAX_MS = 1000;

/**
 * The most settlements the batcher may hold unwritten (besides the flush in flight) before this
 * worker stops claiming. Handlers free their slots before their settlements are written, so a
 * worker whose tasks finish faster than the database takes their settlements would otherwise go
 * on claiming and running while the unwritten ones pile up: in `npm run bench:growth` (two million
 * no-op tasks queued, the server also busy with the bench's counts) a worker held over a million,
 * its leases lapsed behind them, and rescue handed the tasks out again (docs/benchmarks-journal.md,
 * "Issue 35's fourteenth round"). Held here, the worker claims again once a flush has taken the
 * backlog below the bound (`executionEnded`), so it runs at the rate its settlements are written.
 * A normal drain flushes a few hundred at a time and never reaches it.
 */
export const SETTLEMENT_BACKLOG_MAX = 10_000;
/**
 * Cancel notices are confirmed in batches at most this often (`cancelNoticed`): a real cancel
 * aborts its handler that much later at most, a flood of forged notices naming this worker's
 * leases costs at most 20 probes a second.
 */
const CANCEL_CONFIRM_SPACING_MS = 50;
/** Leases awaiting confirmation at most: past it a notice is dropped (the poll still finds a real cancel). */
const MAX_NOTICED_CANCELS = 4096;
/** A probe that failed (the database away) is tried this many times in all, then left to the poll. */
const CANCEL_CONFIRM_TRIES = 3;

const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
/**
 * The intrinsic Promise (what `await` uses), whatever the global `Promise` is: a library that
 * installs its own as the global (bluebird, zone.js) gives promises the intrinsic `then` refuses
 * as receivers ("incompatible receiver"), and every plain task would crash where `await` works.
 */
const IntrinsicPromise = (async () => {})().constructor as PromiseConstructor;
/** Its `then`, as the module found it (callHandler). */
const promiseThen = IntrinsicPromise.prototype.then;

/**
 * Leased tasks waiting for a slot, oldest claim first: each claim's batch as it came, with the
 * time it arrived (to tell a late claim from a wait in the buffer).
 */
class ClaimBuffer {
  private batches: { tasks: ClaimedTask[]; at: number }[] = [];
  /** The next task's index in the first batch. */
  private next = 0;
  private count = 0;
  /** When the task `take()` returned last arrived (epoch ms). */
  takenAt = 0;

  get size(): number {
    return this.count;
  }

  add(tasks: ClaimedTask[], at: number): void {
    if (tasks.length === 0) return;
    this.batches.push({ tasks, at });
    this.count += tasks.length;
  }

  /**
   * Ahead of everything buffered: a limited queue's tasks, leased only for free slots and
   * counted against a fleet-wide limit while they wait (processor/claim-limited.ts).
   */
  addFirst(tasks: ClaimedTask[], at: number): void {
    if (tasks.length === 0) return;
    const first = this.batches[0];
    if (first !== undefined && this.next > 0) {
      this.batches[0] = { tasks: first.tasks.slice(this.next), at: first.at };
      this.next = 0;
    }
    this.batches.unshift({ tasks, at });
    this.count += tasks.length;
  }

  take(): ClaimedTask | undefined {
    const batch = this.batches[0];
    if (batch === undefined) return undefined;
    const task = batch.tasks[this.next++]!;
    this.takenAt = batch.at;
    this.count--;
    if (this.next === batch.tasks.length) {
      this.batches.shift();
      this.next = 0;
    }
    return task;
  }

  /** The buffered task with this lease key, left in place; null if not here. */
  find(key: string): ClaimedTask | null {
    for (let b = 0; b < this.batches.length; b++) {
      const batch = this.batches[b]!;
      for (let i = b === 0 ? this.next : 0; i < batch.tasks.length; i++) {
        if (entryKey(batch.tasks[i]!) === key) return batch.tasks[i]!;
      }
    }
    return null;
  }

  /** Take the task with this lease key out of the buffer (an operator cancelled it); null if not here. */
  remove(key: string): ClaimedTask | null {
    for (let b = 0; b < this.batches.length; b++) {
      const batch = this.batches[b]!;
      for (let i = b === 0 ? this.next : 0; i < batch.tasks.length; i++) {
        if (entryKey(batch.tasks[i]!) !== key) continue;
        const [task] = batch.tasks.splice(i, 1);
        this.count--;
        if (b === 0 ? this.next >= batch.tasks.length : batch.tasks.length === 0) {
          this.batches.splice(b, 1);
          if (b === 0) this.next = 0;
        }
        return task!;
      }
    }
    return null;
  }

  /** Empty the buffer, returning what it held. */
  takeAll(): ClaimedTask[] {
    const all: ClaimedTask[] = [];
    for (let t = this.take(); t !== undefined; t = this.take()) all.push(t);
    return all;
  }
}

/** What the engine runs on: made by the worker (the composition root) before the engine exists. */
export interface EngineDeps {
  options: EngineOptions;
  /** The primary: releases, hand-backs, the handlers' writes, the cancel poll, the stuck guard. */
  write: Queryable;
  /** The primary, the fetcher's own session: the ring window and the claims. */
  claims: Queryable;
  /**
   * The read replica discovery reads (`readConnectionString`: its pool and where it points), or
   * null: discovery reads the fetcher's session. A replica that fails or lags is left for the
   * primary (discovery-reads.ts).
   */
  replica: { pool: Queryable; where: string } | null;
  batcher: SettlementBatcher;
  logger: Logger;
  metrics: BerthMetrics;
  wakeChannel: string;
  /** The heartbeat's per-minute outcome counts; null when the heartbeat is off. */
  tally: OutcomeTally | null;
  /** Claims work again after database errors (the LISTEN session may still be backing off). */
  onClaimsRecovered: () => void;
  /** `exitOnStuckSlots` reached: the process should stop and exit. */
  onTooManyStuck: (stuck: ClaimedTask[]) => void;
  /** Reports each attempt to `worker.events` and its trace span (task-observer.ts). */
  observer: TaskObserver;
}

/**
 * One execution of a leased task, from its start on a slot to its written settlement: the run's
 * input (run-task.ts's RunInput), the engine's in-flight entry, the handler of the task's lazy
 * logger and the outcome table's TaskAttempt, as one object. They were an input object, a
 * `freeSlot` closure and its context, an in-flight entry, a proxy handler and the table's
 * argument per task (~0.2 KB of a drain's allocation per task, docs/benchmarks-journal.md).
 *
 * The task's logger (`log`) is a child of the worker's with the task's fields, made on first use
 * (most runs log nothing, and a pino child per task is not free): a Proxy whose handler is this
 * object (`get` is its only trap; no other trap's name is a member here).
 */
class Execution implements RunInput, ProxyHandler<Logger>, TaskAttempt, CompletionOwner {
  readonly abort: RunAbort;
  /** Its place in the engine's running list while its handler holds a slot (Running), else -1. */
  slot = -1;
  readonly def: AnyTaskDefinition | undefined;
  readonly log: Logger;
  /** Null unless someone listens to task events or a TracerProvider is registered. */
  readonly hooks: Attempt | null;
  private freed = false;
  private child: Logger | undefined = undefined;
  /** What happened, and the settlement the outcome table chose for it (`settleAs`). */
  run: TaskRun | null = null;
  settlement: Settlement | null = null;
  /** A completion's answer in the batcher (CompletionOwner's; its run time and result are read from `run`). */
  answer: CompleteResult | undefined = undefined;

  constructor(
    private readonly engine: Engine,
    readonly task: ClaimedTask,
    /** When the claim handed this task to the process (epoch ms). */
    readonly receivedAt: number,
    o: EngineOptions,
    /** The worker's logger: the lazy logger's target (`get`'s), not kept again here. */
    parent: Logger,
    observer: TaskObserver,
  ) {
    this.abort = new RunAbort(task.leaseExpiresAt - o.leaseMarginMs);
    this.def = o.tasks.defs.get(task.type);
    this.log = new Proxy(parent, this);
    this.hooks = observer.begin(task);
  }

  /** Its lease's key (a cancel's, the stuck guard's): made when asked, not kept per task. */
  get key(): string {
    return entryKey(this.task);
  }

  /** RunInput's: the handler is over (or never starts); observed runs free it outside their span. */
  freeSlot(): void {
    if (this.freed) return;
    if (this.hooks === null) this.release();
    else this.hooks.detached(() => this.release())();
  }

  /** Give the slot back, once (the execution's end frees it too, if nothing did before). */
  release(): void {
    if (this.freed) return;
    this.freed = true;
    this.engine.slotFreed(this);
  }

  /**
   * Note what happened and its settlement. A completion (almost every run) is handed to the
   * batcher, which calls `flushed` once it is written: true. Any other settlement is the
   * caller's to write: false.
   */
  settleAs(run: TaskRun, settlement: Settlement, batcher: SettlementBatcher): boolean {
    this.run = run;
    this.settlement = settlement;
    const action = settlement.action;
    if (action.kind !== 'complete') return false;
    batcher.enlist(this);
    return true;
  }

  /** CompletionOwner's: the handler's run time (read from the run, not kept again per task). */
  get runMs(): number | null {
    const run = this.run;
    return run !== null && 'ms' in run ? run.ms : null;
  }

  /** CompletionOwner's: the handler's result, as its completion's settlement carries it. */
  get result(): ResultJson | null {
    const action = this.settlement?.action;
    return action?.kind === 'complete' ? (action.result ?? null) : null;
  }

  /** CompletionOwner's: the lease to complete. */
  get ref(): ClaimedTask {
    return this.task;
  }

  /** CompletionOwner's: the completion's answer is set. */
  flushed(): void {
    this.engine.completed(this);
  }

  /** The outcome table's TaskAttempt. */
  get attempt(): number {
    return this.task.attempt;
  }

  get backoff(): BackoffPolicy {
    return this.def?.backoff ?? DEFAULT_BACKOFF;
  }

  get maxSnoozes(): number | undefined {
    return this.def?.maxSnoozes;
  }

  /** The lazy logger's trap. */
  get(parent: Logger, prop: string | symbol): unknown {
    const t = this.task;
    this.child ??= childLogger(parent, {
      task_id: t.id,
      task_type: t.type,
      lane: laneLabel(t),
      attempt: t.attempt,
    });
    const child = this.child;
    const value: unknown = Reflect.get(child, prop, child);
    return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(child) : value;
  }
}

/**
 * The executions whose handler holds a slot: an array, each execution knowing its place in it.
 * A Map by lease key cost a key string per task (~50 B) and its table's regrowth as entries came
 * and went (~40 B a task; docs/benchmarks-journal.md). Looked up by key only for a cancel and by
 * the stuck guard's scan of overdue handlers: a walk of at most `slots` entries.
 */
class Running implements RunningHandlers {
  private readonly list: Execution[] = [];

  get size(): number {
    return this.list.length;
  }

  add(x: Execution): void {
    x.slot = this.list.length;
    this.list.push(x);
  }

  delete(x: Execution): void {
    const i = x.slot;
    if (i < 0 || this.list[i] !== x) return;
    const last = this.list.pop() as Execution;
    if (last !== x) {
      this.list[i] = last;
      last.slot = i;
    }
    x.slot = -1;
  }

  get(key: string): Execution | undefined {
    // Its lane position first (a string compare, no key built per entry: a flood of cancel
    // notices costs a walk each), then the whole key.
    const seq = key.slice(key.indexOf(':') + 1);
    return this.list.find((x) => x.task.laneSeq === seq && entryKey(x.task) === key);
  }

  has(key: string): boolean {
    return this.get(key) !== undefined;
  }

  /** A copy: what its caller does with each (an abort) may end an execution meanwhile. */
  values(): Execution[] {
    return [...this.list];
  }

  [Symbol.iterator](): Iterator<Execution> {
    return this.values()[Symbol.iterator]();
  }
}

/**
 * The pair of reactions a handler's answer is followed by (callHandler's `then`), made once and
 * reused rather than two closures and their context per task (~170 B of a warm drain's
 * allocation per task, docs/benchmarks-journal.md). A pair is given to one promise at a time:
 * a promise settles once, so one of the two runs once, and only then is the pair free again
 * (Engine.reacted). A handler that never answers keeps its pair, as it kept its closures.
 */
class Reactions {
  x: Execution | null = null;
  h: HandlerRun | null = null;
  readonly fulfilled: (value: unknown) => void;
  readonly rejected: (err: unknown) => void;

  constructor(engine: Engine) {
    this.fulfilled = (value) => engine.reacted(this, value, false);
    this.rejected = (err: unknown) => engine.reacted(this, err, true);
  }
}

/**
 * Donors of the per-task shapes (util/shape-anchor.ts): a claimed task from a lease row as the
 * claim returns one (`tasksOf`), and one that others depend on; the execution of that task, with
 * its abort, handler run and context; a reaction pair; an observed attempt, its handler's start
 * and end set (its start field begins as 0 and then holds a fractional time, a shape of its own).
 * Held by no engine: its engine, options, logger and observer are stand-ins no method of a donor
 * reaches.
 */
function anchorTaskShapes(): void {
  const now = Date.now() + 0.5;
  const lease = standInLease(0, '0');
  const task = tasksOf([lease], STAND_IN_TERMS)[0]!;
  // A task that others depend on carries one more field (`hasDependents`): a shape of its own.
  anchorShape(
    'claimed task with dependents',
    tasksOf([{ ...lease, tasks: '[["1","1",1,1,0.5,null,null,null,null,0,1]]' }], STAND_IN_TERMS)[0]!,
  );
  const noEngine = null as unknown as Engine;
  const options = { leaseMarginMs: 0, tasks: { defs: new Map() } } as unknown as EngineOptions;
  const observer = { begin: () => null } as unknown as TaskObserver;
  const x = new Execution(noEngine, task, now, options, {} as Logger, observer);
  const runDeps = { deadlines: { arm: () => {} }, storage: { schema: { name: '' } } } as unknown as RunDeps;
  const run = new HandlerRun(runDeps, x, null, undefined);
  // An observed attempt's (task events, tracing), its handler's start and end stored as they are.
  const attempt = new Attempt({ wantsTaskEvents: false } as WorkerEvents, '', task, false);
  attempt.handlerStarted();
  attempt.handlerEnded();
  anchorShape('Attempt', attempt);
  // A completion batch's groups and their statement values live only while a flush does: made
  // from a claimed task, as every flush makes them, so the completion's code sees one shape of
  // task (a literal ref made here once was a second shape for all of it).
  const groups = groupByLease([task], [0.5]);
  anchorShape('lease group', groups[0]!);
  anchorShape('lease group values', groupValues(groups));
  const reactions = new Reactions(noEngine);
  reactions.x = x;
  reactions.h = run;
  anchorShape('Reactions', reactions);
  // The engine's own parts live as long as its worker, so a new worker after a full collection
  // finds their shapes gone too. The buffer is taken through a take: its arrival time starts
  // as 0, a small integer, and then holds an epoch time, too large for one (a shape of its own).
  const buffer = new ClaimBuffer();
  buffer.add([task], now);
  buffer.take();
  anchorShape('ClaimBuffer', buffer);
  anchorShape('Running', new Running());
  anchorShape('DeadlineTimer', new DeadlineTimer());
}
anchorTaskShapes();

/**
 * Runs tasks. N slots share one fetcher: a wake (NOTIFY, the shared poll tick, or a slot coming
 * free) runs one fetch that leases entries for every idle slot: a claim on the lanes it knows
 * (notified, hot), else discovery on the read pool and a claim on the primary (fetcher.ts says
 * when discovery is owed; a freed slot after a short claim runs nothing). Each leased task runs
 * under its own token and deadline (run-task.ts), and what happened is settled by its own fenced
 * row, as the outcome table says (outcome-table.ts, settle-task.ts).
 */
export class Engine implements FetchLoop {
  private readonly o: EngineOptions;
  private readonly fetcher: Fetcher;
  /** Frees the concurrency keys of settled keyed tasks (processor/key-releaser.ts). */
  private readonly keyReleaser: KeyReleaser;
  private readonly rate: PrefetchRate;
  private readonly stuckGuard: StuckGuard;
  /** Leased tasks waiting for a slot (at most `prefetch` beyond the idle slots). */
  private readonly buffer = new ClaimBuffer();
  /** Tasks whose handler is running: each holds a slot. */
  private readonly inflight = new Running();
  /** Reaction pairs no handler's answer is waiting on (callHandler, Reactions). */
  private readonly idleReactions: Reactions[] = [];
  /** Executions not yet fully settled (a handler may already have returned), and stop()'s wait for none. */
  private executing = 0;
  private dispatching = false;
  private noneExecuting: (() => void) | null = null;
  private readonly typeMetrics: TypeMetrics;
  /** A run's and a settlement's per-task reports (metrics, tally, the debug-level check). */
  private readonly reports: TaskReports;
  private readonly deadlines = new DeadlineTimer();
  /** What runTask and settleTask need, built once rather than per task. */
  private readonly runDeps: RunDeps;
  private readonly settleDeps: SettleDeps;
  private wakeReason: string | null = null;
  private wakeResolve: (() => void) | null = null;
  private ticker: NodeJS.Timeout | null = null;
  /** Stops the busy-slot and prefetched gauges reading this engine (set by start). */
  private stopSampling: (() => void) | null = null;
  private fetchLoop: Promise<void> = Promise.resolve();
  private stopping = false;
  /** Ends stop()'s grace period early (a second stop, a second signal); set while it waits. */
  private endGrace: (() => void) | null = null;
  private graceSkipped = false;
  private checkingCancels = false;
  /** Leases named by cancel notices, to be confirmed by the database (`cancelNoticed`). */
  private readonly noticed = new Map<string, { task: ClaimedTask; tries: number }>();
  private confirming: Promise<void> | null = null;
  private lastCancelProbeAt = 0;
  /** Set at the end of stop(): no handler or buffered task is left to abort. */
  private cancelsClosed = false;
  /** The throttle's sleep before a woken fetch (notify-throttle.ts): cut short by any other wake. */
  private throttled: AbortController | null = null;
  /** Aborted when the database is seen back (LISTEN reconnected) or on stop(): ends the fetch loop's error backoff early. */
  private retryNow = new AbortController();
  private readonly notifyThrottle = new NotifyThrottle();
  /** The schema's storage, bound once (storage/storage.ts). */
  private readonly storage: Storage;
  /** The last fetch's size and whether it got all it asked for (see wanted()). */
  private lastClaimed = 0;
  private lastClaimFull = false;
  /** wanted() found the batcher's backlog at SETTLEMENT_BACKLOG_MAX: the next execution to end below it wakes the fetch loop. */
  private heldBySettlements = false;

  constructor(private readonly deps: EngineDeps) {
    this.o = deps.options;
    this.storage = storageFor(this.o.schema);
    this.typeMetrics = new TypeMetrics(deps.metrics);
    this.reports = new TaskReports(this.typeMetrics, deps.tally, deps.logger);
    this.runDeps = {
      write: deps.write,
      storage: this.storage,
      workerId: this.o.workerId,
      deadlines: this.deadlines,
      reports: this.reports,
      unknownTypes: new UnknownTypes(this.o.unknownTypes, deps.metrics, deps.logger, this.o.workerId),
      resultMaxBytes: this.o.resultMaxBytes,
      ceilings: this.o.tasks.ceilings,
      defaultCeilingMs: this.o.defaultCeilingMs,
      scheduleCeilings: new ScheduleCeilings(deps.write, this.storage),
      typeRates: new TypeRateGate(deps.write, this.storage, deps.logger, deps.metrics),
    };
    this.settleDeps = {
      write: deps.write,
      storage: this.storage,
      batcher: deps.batcher,
      reports: this.reports,
      workerId: this.o.workerId,
    };
    this.keyReleaser = new KeyReleaser(deps.write, this.storage, deps.logger);
    this.fetcher = new Fetcher({
      write: deps.claims,
      reads: new DiscoveryReads({
        replica: deps.replica,
        primary: deps.claims,
        storage: this.storage,
        metrics: deps.metrics,
        logger: deps.logger,
        pollIntervalMs: this.o.pollIntervalMs,
      }),
      metrics: deps.metrics,
      typeMetrics: this.typeMetrics,
      storage: this.storage,
      tasks: this.o.tasks,
      defaultCeilingMs: this.o.defaultCeilingMs,
      marginMs: this.o.leaseMarginMs,
      workerId: this.o.workerId,
      wakeChannel: deps.wakeChannel,
      queues: this.o.queues,
      loop: this,
      typeRates: this.runDeps.typeRates,
    });
    this.rate = new PrefetchRate(this.o.prefetch);
    this.stuckGuard = new StuckGuard(
      deps.write,
      this.storage,
      deps.metrics,
      deps.logger,
      {
        workerId: this.o.workerId,
        marginMs: this.o.leaseMarginMs,
        graceMs: this.o.stuckGraceMs,
        // Protection is refreshed on the heartbeat's interval, or its default when it is off.
        refreshMs: this.o.heartbeatIntervalMs === false ? DEFAULT_HEARTBEAT_MS : this.o.heartbeatIntervalMs,
        exitOnStuckSlots: this.o.exitOnStuckSlots ?? undefined,
      },
      this.inflight,
      deps.onTooManyStuck,
    );
  }

  /**
   * Takes a never-started engine (the process's shape donor, process/engine-donor.ts) through the
   * steps after which a running engine's objects have their final shapes: a field that starts as a
   * small integer and later holds another number gets a new shape (util/shape-anchor.ts).
   */
  static ripenDonor(donor: Engine): void {
    // The completion rate starts at 0 and holds a fraction after the first sample.
    donor.rate.completed();
    donor.rate.target(performance.now() + 10.3);
    // The throttle's last refill time starts at 0, its tokens at a whole number; both hold
    // fractions once notifications have been throttled.
    const t = Math.floor(performance.now()) + 0.5;
    donor.notifyThrottle.waitMs(t);
    donor.notifyThrottle.fetched(true, false, t + 0.5);
    donor.notifyThrottle.waitMs(t + 1.5);
    // A task type's bound instruments (made at a type's first task): a histogram's sum holds a
    // fraction once it has observed one. The donor's meter records nothing (engine-donor.ts).
    const instruments = donor.typeMetrics.for('');
    instruments.handlerSeconds.observe(0.5);
    instruments.waitSeconds.observe(0.5);
    instruments.outcome('success').inc();
    instruments.outcome('failure').inc();
  }

  /** Handlers running now. */
  get activeSlots(): number {
    return this.inflight.size;
  }

  /** Leased tasks waiting in the prefetch buffer. */
  get buffered(): number {
    return this.buffer.size;
  }

  /** Ids of the tasks whose handlers run now. */
  runningTaskIds(): string[] {
    return this.inflight.values().map((f) => f.task.id);
  }

  start(): void {
    this.stuckGuard.start();
    const { metrics } = this.deps;
    metrics.slots.set(this.o.slots);
    // Read when the registry is read, not set at every dispatch and freed slot (twice a task).
    const unsample = [
      metrics.busySlots.sample(() => this.inflight.size),
      metrics.bufferedTasks.sample(() => this.buffer.size),
    ];
    this.stopSampling = () => {
      for (const u of unsample.splice(0)) u();
    };
    // One ticker shared by all slots: each tick releases at most one fetch.
    this.ticker = setInterval(() => {
      // The fallback for a cancel notice this process missed (LISTEN down): also during stop's grace.
      void this.checkCancelled();
      if (this.stopping) return;
      // Owed even while every slot is busy: the next slot to come free then discovers, so work
      // whose NOTIFY was missed waits no longer than one poll interval either way.
      this.fetcher.oweDiscovery();
      if (this.inflight.size < this.o.slots) this.wake('poll');
    }, this.o.pollIntervalMs);
    this.wakeToDiscover('start');
    this.fetchLoop = this.runFetchLoop();
  }

  /**
   * Ahead of start(): the fetcher's session runs its first reads once, so the first fetch finds
   * them planned (Fetcher.prepare). Never rejects: a failure is the first fetch's to report.
   */
  prepare(): Promise<void> {
    return this.fetcher.prepare().catch(() => undefined);
  }

  /** A wake notification arrived (payload: the lane it names, '', or a cancel notice). */
  notify(payload: string): void {
    if (payload.startsWith(CANCEL_NOTICE_PREFIX)) {
      const key = parseCancelNotice(payload);
      if (key !== null) this.cancelNoticed(key);
      return;
    }
    this.fetcher.noteLane(payload);
    this.wake('notify');
  }

  /**
   * A cancel notice named lease `key`. A notice is a hint, never a verdict: anyone who can connect
   * may NOTIFY the wake channel (it needs no privilege), and a forged notice that aborted a
   * handler threw its run away, until rescue re-ran it and, after its last attempt, buried it. So
   * a notice naming a lease this worker holds (running or prefetched) is confirmed by the
   * database first: one probe of the settlements for every lease named since the last, never two
   * at once, at most one every CANCEL_CONFIRM_SPACING_MS. A notice naming anything else costs
   * nothing. The poll on the ticker (`checkCancelled`) stays the fallback for a notice missed.
   */
  private cancelNoticed(key: string): void {
    if (this.cancelsClosed || this.noticed.has(key) || this.noticed.size >= MAX_NOTICED_CANCELS) return;
    const task = this.heldTask(key);
    if (task === null) return;
    this.noticed.set(key, { task, tries: 0 });
    this.confirming ??= this.confirmCancels().finally(() => {
      this.confirming = null;
    });
  }

  /** The task of lease `key` if this worker holds it: running (not yet aborted) or prefetched. */
  private heldTask(key: string): ClaimedTask | null {
    const running = this.inflight.get(key);
    return running !== undefined && running.abort.reason === undefined ? running.task : this.buffer.find(key);
  }

  private async confirmCancels(): Promise<void> {
    while (this.noticed.size > 0 && !this.cancelsClosed) {
      // Spaced from the last probe, whichever round made it: a stream of notices naming this
      // worker's leases costs at most one probe every CANCEL_CONFIRM_SPACING_MS.
      const wait = this.lastCancelProbeAt + CANCEL_CONFIRM_SPACING_MS - Date.now();
      if (wait > 0) await delay(wait);
      if (this.cancelsClosed) break;
      const named = new Map(this.noticed);
      this.noticed.clear();
      this.lastCancelProbeAt = Date.now();
      try {
        const tasks = [...named.values()].map((n) => n.task);
        for (const key of await cancelledAmong(this.deps.write, this.storage, tasks)) this.cancelled(key);
      } catch (err) {
        this.deps.logger.warn({ err: (err as Error).message }, 'confirming a cancel notice failed; retrying');
        // Asked again (a few times, while this worker still holds the lease), else left to the poll.
        for (const [key, n] of named) {
          if (n.tries < CANCEL_CONFIRM_TRIES - 1 && this.heldTask(key) !== null && !this.noticed.has(key))
            this.noticed.set(key, { task: n.task, tries: n.tries + 1 });
        }
      }
    }
  }

  /**
   * An operator cancelled the lease `key` (its `cancelled` settlement is committed): abort its
   * handler if it runs here, or drop it from the prefetch buffer (it never starts). Nothing is
   * written: the cancel's settlement is the attempt's.
   */
  private cancelled(key: string): void {
    const f = this.inflight.get(key);
    if (f !== undefined) {
      f.abort.abort(new CancelAbort());
      return;
    }
    const task = this.buffer.remove(key);
    if (task === null) return;
    this.reports.record(task, 'cancelled');
    this.deps.logger.info(
      { task_id: task.id, task_type: task.type },
      'prefetched task cancelled by an operator; dropped',
    );
  }

  /**
   * The poll behind the cancel notices: one statement over the running handlers' leases, on the
   * shared ticker, only while some run (and never two at once). A failure is retried next tick.
   */
  private async checkCancelled(): Promise<void> {
    if (this.checkingCancels || this.inflight.size === 0) return;
    this.checkingCancels = true;
    try {
      const running = this.inflight
        .values()
        .filter((f) => f.abort.reason === undefined)
        .map((f) => f.task);
      for (const key of await cancelledAmong(this.deps.write, this.storage, running)) this.cancelled(key);
    } catch (err) {
      this.deps.logger.warn({ err: (err as Error).message }, 'checking running tasks for cancels failed');
    } finally {
      this.checkingCancels = false;
    }
  }

  /** The database is back (LISTEN reconnected): a fetch loop sleeping out its error backoff retries now. */
  databaseBack(): void {
    this.retryNow.abort();
  }

  /** Resolves once the fetch loop has ended (after stop()). */
  fetchLoopEnded(): Promise<void> {
    return this.fetchLoop;
  }

  /** A wake that names no lane: the fetch it releases runs discovery. */
  private wakeToDiscover(reason: string): void {
    this.fetcher.oweDiscovery();
    this.wake(reason);
  }

  /** The fetcher's ask for another pass at once (FetchLoop). */
  wakeForMore(): void {
    this.wake('more');
  }

  private wake(reason: string): void {
    // A poll tick, a freed slot or a stop ends the throttle's wait at once: only notifications wait.
    if (reason !== 'notify') this.throttled?.abort();
    if (this.wakeReason === null) this.wakeReason = reason;
    const r = this.wakeResolve;
    this.wakeResolve = null;
    r?.();
  }

  private waitForWake(): Promise<void> {
    if (this.wakeReason !== null || this.stopping) return Promise.resolve();
    return new Promise((resolve) => {
      this.wakeResolve = resolve;
    });
  }

  private async runFetchLoop(): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      await this.waitForWake();
      if (this.stopping) break;
      const want = this.wanted();
      if (want === 0) {
        // Stay asleep until a slot frees (it re-wakes us).
        this.wakeReason = null;
        continue;
      }
      if (!this.fetcher.hasLeads) {
        // The last claim came back short from everything it knew of, and no wake since names
        // anything new (a freed slot does not): a fetch would only find nothing. New work
        // arrives with its lane's NOTIFY; the poll is the safety net.
        this.wakeReason = null;
        continue;
      }
      const reason = this.wakeReason ?? 'unknown';
      const woken = reason === 'notify';
      let wantNow = want;
      if (woken) {
        // A flood of notifications (anyone may NOTIFY) costs a bounded number of claims; the
        // ones that arrive meanwhile are noted and taken by this one fetch (notify-throttle.ts).
        const wait = this.notifyThrottle.waitMs(Date.now());
        if (wait > 0) {
          this.throttled = new AbortController();
          await abortableSleep(wait, this.throttled.signal);
          this.throttled = null;
          if (this.stopping) break;
          wantNow = Math.max(want, this.wanted());
        }
      }
      this.wakeReason = null;
      this.deps.metrics.wakeups.inc({ reason });
      try {
        const tasks = await this.fetcher.fetch(wantNow, this.o.slots);
        this.notifyThrottle.fetched(woken, tasks.length > 0, Date.now());
        this.lastClaimed = tasks.length;
        this.lastClaimFull = tasks.length === wantNow;
        if (failures > 0) {
          this.deps.logger.info({ failures }, 'claims work again after database errors');
          // The LISTEN session may still be waiting out its own reconnect backoff.
          this.deps.onClaimsRecovered();
        }
        failures = 0;
        const limited = this.fetcher.lastLimited;
        if (limited > 0) {
          this.buffer.addFirst(tasks.slice(0, limited), Date.now());
          this.buffer.add(tasks.slice(limited), Date.now());
        } else this.buffer.add(tasks, Date.now());
        this.dispatch();
      } catch (err) {
        failures++;
        // Capped at a second (with jitter, so a fleet does not retry in step): after an outage
        // the worker claims again within about a second of the database's return, and a LISTEN
        // reconnect cuts the wait short. Each retry is one connection attempt per process.
        const delay = Math.round(Math.min(100 * 2 ** failures, FETCH_RETRY_MAX_MS) * (0.5 + Math.random() / 2));
        if (failures === 1 || failures % 10 === 0) {
          this.deps.logger.warn(
            { err: (err as Error).message, retryInMs: delay, failures },
            'fetch failed; backing off',
          );
        }
        if (this.retryNow.signal.aborted && !this.stopping) this.retryNow = new AbortController();
        await abortableSleep(delay, this.retryNow.signal);
        // The failed fetch had already taken its notified lanes: discovery finds them again.
        this.wakeToDiscover('retry');
      }
    }
  }

  /**
   * How many tasks to claim now: 0 while the buffer is above its low-water mark, or while the
   * batcher holds SETTLEMENT_BACKLOG_MAX unwritten settlements.
   *
   * Ahead of the idle slots: the rate target (~25 ms of work), or, when the worker ran dry
   * (every slot idle, nothing buffered) right after a claim that got all it asked for, twice
   * that claim. The rate is measured over what the worker could lease, so at the start of a
   * drain of fast tasks it grew from claims of a few tens (the first ~30 ms of a drain in claims
   * of 10–27 tasks, docs/benchmarks-journal.md); doubling instead reaches the prefetch cap in a few
   * round trips. Slow tasks never trigger it: their slots are still busy when the next claim is
   * wanted.
   */
  private wanted(): number {
    if (this.deps.batcher.pending >= SETTLEMENT_BACKLOG_MAX) {
      this.heldBySettlements = true;
      return 0;
    }
    const slots = this.o.slots;
    const idle = slots - this.inflight.size;
    const dry = this.inflight.size === 0 && this.buffer.size === 0 && this.lastClaimFull;
    const ahead = Math.max(this.rate.target(), dry ? Math.min(this.o.prefetch, 2 * this.lastClaimed) : 0);
    const want = idle + ahead - this.buffer.size;
    // Claim when the buffer is down to its low-water mark, or a slot idles with nothing local.
    const lowWater = Math.ceil((slots + ahead) / 2);
    if (want <= 0 || (want < lowWater && !(idle > 0 && this.buffer.size === 0))) return 0;
    return want;
  }

  /** Start buffered tasks on free slots, oldest claim first. */
  private dispatch(): void {
    // A run that never starts its handler (no definition, a bad payload) frees its slot within
    // startTask: the loop below takes that slot, rather than a nested dispatch per such task
    // (a buffer of them would otherwise recurse once per task).
    if (this.dispatching) return;
    this.dispatching = true;
    try {
      while (this.inflight.size < this.o.slots && !this.stopping) {
        const task = this.buffer.take();
        if (task === undefined) break;
        this.startTask(task, this.buffer.takenAt);
      }
    } finally {
      this.dispatching = false;
    }
  }

  private startTask(task: ClaimedTask, receivedAt: number): void {
    const x = new Execution(this, task, receivedAt, this.o, this.deps.logger, this.deps.observer);
    this.inflight.add(x);
    this.executing++;
    this.runOne(x);
  }

  /**
   * An execution's slot came free: as soon as its handler returned (or never started); its
   * settlement is written by the batcher meanwhile (stop() waits for it). Execution.release's, once
   * per execution.
   */
  slotFreed(x: Execution): void {
    this.inflight.delete(x);
    this.rate.completed();
    if (this.stopping) return;
    this.dispatch();
    // Asked here rather than by waking the fetch loop to ask it (a promise and a turn of the
    // loop per task): it would go straight back to sleep unless a claim is wanted. Not whether
    // the fetcher has leads: a fetch in flight may not have set them yet, and the wake is what
    // makes the loop look again once it returns.
    if (this.wanted() > 0) this.wake('slot_freed');
  }

  /**
   * One execution, from the handler to its settlement handed off. No async function of its own
   * for a plain task: its handler's answer is followed by one `then` (the steps `await` took:
   * `Promise.resolve` of the answer, a thenable's adoption included, then its reaction), and a
   * completion is told by the batcher (`completed`). An async frame per task, kept with all its
   * registers across the handler's await, was ~0.3 KB of a drain's allocation per task
   * (docs/benchmarks-journal.md). A start that waits (a schedule's ceiling, an asynchronous
   * payload schema, a rate-limited type) and an observed execution run in `runLater`.
   */
  private runOne(x: Execution): void {
    try {
      const start = x.hooks === null ? startRun(this.runDeps, x) : null;
      if (start === null || start instanceof Promise) void this.runLater(x, start);
      else if (start instanceof HandlerRun) this.callHandler(x, start);
      else this.ran(x, start);
    } catch (err) {
      this.crashed(x, err);
    }
  }

  /** Call the handler (its run begun) and follow its answer. */
  private callHandler(x: Execution, h: HandlerRun): void {
    h.begin();
    let answered: Promise<unknown>;
    try {
      answered = IntrinsicPromise.resolve(h.call());
    } catch (err) {
      // Thrown at once (or its answer's `constructor` threw, as `await` would have): no turn waited.
      this.handlerAnswered(x, h, err, true);
      return;
    }
    // The intrinsic `then`, as `await` uses: a handler's promise with a `then` of its own is not asked.
    const r = this.idleReactions.pop() ?? new Reactions(this);
    r.x = x;
    r.h = h;
    promiseThen.call(answered, r.fulfilled, r.rejected);
  }

  /**
   * One of a Reactions' pair ran (its promise settled, so neither runs again): the pair is free
   * for another handler's answer, kept while fewer than `slots` are.
   */
  reacted(r: Reactions, value: unknown, threw: boolean): void {
    const x = r.x as Execution;
    const h = r.h as HandlerRun;
    r.x = null;
    r.h = null;
    if (this.idleReactions.length < this.o.slots) this.idleReactions.push(r);
    this.handlerAnswered(x, h, value, threw);
  }

  /**
   * The handler answered (`threw`: it threw, or its promise rejected): end its run and settle it.
   * Never throws (crashed does not).
   */
  private handlerAnswered(x: Execution, h: HandlerRun, value: unknown, threw: boolean): void {
    let run: TaskRun;
    try {
      if (threw) h.threw(value);
      else {
        try {
          h.returned(value);
        } catch (err) {
          h.threw(err);
        }
      }
      run = h.end();
    } catch (err) {
      this.crashed(x, err);
      return;
    }
    this.ran(x, run);
  }

  /** An execution's start waits, or it is observed (events, a span): as runTask, in a frame of its own. */
  private async runLater(x: Execution, start: Promise<Startable> | null): Promise<void> {
    let run: TaskRun;
    try {
      if (start === null) run = await (x.hooks as Attempt).run(() => runTask(this.runDeps, x));
      else {
        const started = await start;
        if (started instanceof HandlerRun) {
          run = await runHandler(started);
        } else run = started;
      }
    } catch (err) {
      this.crashed(x, err);
      return;
    }
    this.ran(x, run);
  }

  /**
   * What happened, settled: a completion (almost every run) handed to the batcher, which tells
   * `completed` once its flush is over; any other settlement written here, as settleTask does.
   */
  private ran(x: Execution, run: TaskRun): void {
    let written: Promise<SettleAnswer>;
    try {
      if (x.settleAs(run, settlementFor(run, x), this.deps.batcher)) return;
      written = writeSettlement(this.settleDeps, x.task, run, x.settlement as Settlement, x.log);
    } catch (err) {
      this.crashed(x, err);
      return;
    }
    void this.finish(x, written);
  }

  /**
   * An execution's completion was answered (the batcher told its Execution): the steps after the
   * write, in this turn, unless a refusal's probe or an overdue lease row must be waited for.
   */
  completed(x: Execution): void {
    const answer = completedAnswer(x);
    if (answer.kind === 'refused') {
      void this.finish(x, answer);
      return;
    }
    let overdue: Promise<void> | undefined;
    try {
      try {
        this.settledAs(x, answer);
      } catch (err) {
        this.logCrash(x, err);
      }
      overdue = this.afterSettled(x);
    } finally {
      // Ended whatever threw (a logger that throws while telling of a crash): as runOne's finally did.
      if (overdue === undefined) {
        x.release();
        this.executionEnded();
      }
    }
    if (overdue !== undefined) void this.afterOverdue(x, overdue);
  }

  /**
   * The steps after a settlement's first answer (null: the execution crashed before it had one):
   * who won a refusal, the log lines and counts, what follows a settlement, the execution's end.
   */
  private async finish(x: Execution, first: SettleAnswer | Promise<SettleAnswer> | null): Promise<void> {
    try {
      if (first !== null) {
        try {
          let answer = first instanceof Promise ? await first : first;
          if (answer.kind === 'refused') answer = await afterRefused(this.settleDeps, x.task, answer, x.log);
          this.settledAs(x, answer);
        } catch (err) {
          this.logCrash(x, err);
        }
      }
      const overdue = this.afterSettled(x);
      if (overdue !== undefined) await overdue;
    } finally {
      x.release();
      this.executionEnded();
    }
  }

  private async afterOverdue(x: Execution, overdue: Promise<void>): Promise<void> {
    try {
      await overdue;
    } finally {
      x.release();
      this.executionEnded();
    }
  }

  /** Log what became of the execution's settlement, count its outcome and tell its observer. */
  private settledAs(x: Execution, answer: SettleAnswer): void {
    const run = x.run as TaskRun;
    const settlement = x.settlement as Settlement;
    settled(this.settleDeps, x.task, run, settlement, answer, x.log);
    x.hooks?.settled(run, settlement, answer);
  }

  /**
   * An execution failed outside its handler (a bug, a logger or an observer that threw): logged,
   * and ended. Never throws: it runs in the frame of whatever started or ended the execution (a
   * dispatch from the fetch loop, another task's freed slot), where a throw (a logger that throws
   * while the crash is logged) would stop that dispatch and reach the other task, whose own
   * settlement it would drop, or the fetch loop, which would take it for a failed claim. At b831b4d
   * each execution had a frame of its own, whose rejection reached no other task.
   */
  private crashed(x: Execution, err: unknown): void {
    try {
      this.logCrash(x, err);
    } catch {
      // A logger or an observer that throws while the crash is told: the execution ends all the same.
    } finally {
      void this.finish(x, null);
    }
  }

  private logCrash(x: Execution, err: unknown): void {
    this.deps.logger.error({ err: (err as Error).message, task_id: x.task.id }, 'task execution crashed');
    x.hooks?.crashed(err);
  }

  /** What follows an execution's settlement; the stuck guard's overdue row to wait for, if any. */
  private afterSettled(x: Execution): Promise<void> | undefined {
    const task = x.task;
    // A limited queue's capacity freed when the settlement committed (not when the slot did:
    // a claim between the two would find the queue still full): claim it again. Otherwise
    // one boolean read.
    if (this.fetcher.hasLimits) {
      if (this.fetcher.isKeyed(task.queue)) this.keyReleaser.settled(task.id);
      if (this.fetcher.noteFreed(task.queue) && !this.stopping) this.wake('limit_freed');
    }
    // Stuck-handler containment (processor/stuck.ts): after the settlement is written, an
    // overdue lease row, if this run overran its deadline, has done its job.
    return this.stuckGuard.settled(task);
  }

  /** Wait up to `graceMs` for the running handlers to finish on their own (ended early by skipGrace). */
  private async grace(graceMs: number): Promise<void> {
    if (graceMs <= 0 || this.graceSkipped || this.inflight.size === 0) return;
    const running = this.inflight.size;
    this.deps.logger.info(
      { running, grace_ms: graceMs },
      'stopping: running handlers may finish within the grace period',
    );
    let timer: NodeJS.Timeout | undefined;
    const finished = await Promise.race([
      this.allExecuted().then(() => true),
      new Promise<boolean>((r) => {
        timer = setTimeout(() => r(false), graceMs);
        this.endGrace = () => r(false);
      }),
    ]);
    clearTimeout(timer);
    this.endGrace = null;
    if (!finished && this.inflight.size > 0) {
      this.deps.logger.warn(
        { still_running: this.runningTaskIds(), grace_ms: graceMs, skipped: this.graceSkipped },
        'grace period over: aborting the handlers still running; their leases are released',
      );
    }
  }

  private executionEnded(): void {
    this.executing--;
    if (this.heldBySettlements && this.deps.batcher.pending < SETTLEMENT_BACKLOG_MAX) {
      this.heldBySettlements = false;
      if (!this.stopping && this.wanted() > 0) this.wake('settled');
    }
    if (this.executing === 0 && this.noneExecuting !== null) {
      const resolve = this.noneExecuting;
      this.noneExecuting = null;
      resolve();
    }
  }

  /** Resolves when no execution (nor hand-back) is left. */
  private allExecuted(): Promise<void> {
    if (this.executing === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const before = this.noneExecuting;
      this.noneExecuting = () => {
        before?.();
        resolve();
      };
    });
  }

  /** End a stop()'s grace period now (a second stop or signal): running handlers are aborted at once. */
  skipGrace(): void {
    this.graceSkipped = true;
    this.endGrace?.();
  }

  /**
   * The engine's part of a graceful stop: no new claims; leased but unstarted tasks handed back;
   * in-flight handlers given `graceMs` to finish (their settlements written as usual), then
   * aborted (their leases released, as the outcome table says for a shutdown: cancelled, or
   * continued when they saved progress, the attempt not refunded); every settlement already
   * handed off written or given up on.
   */
  async stop(graceMs = 0): Promise<void> {
    this.stopping = true;
    this.retryNow.abort();
    this.wake('stop');
    await this.fetchLoop;
    const { logger, write } = this.deps;
    // Leased but never started: hand them straight back with the claim's attempt refunded.
    const unstarted = this.buffer.takeAll();
    for (const t of unstarted) {
      this.executing++;
      const done = returnUnstarted(write, this.storage, t).then(
        (r) => {
          if (!r.wrote)
            logger.warn(
              { task_id: t.id, task_type: t.type },
              'unstarted task could not be handed back: lease no longer held',
            );
        },
        (err: Error) =>
          logger.warn(
            { err: err.message, task_id: t.id },
            'handing back an unstarted task failed; its lease will lapse',
          ),
      );
      void done.finally(() => this.executionEnded());
    }
    await this.grace(graceMs);
    if (this.ticker) clearInterval(this.ticker);
    for (const f of this.inflight.values()) f.abort.abort(new ShutdownAbort());
    const all = this.allExecuted();
    let timer: NodeJS.Timeout | undefined;
    const timedOut = await Promise.race([
      all.then(() => false),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(true), this.o.stopTimeoutMs))),
    ]);
    clearTimeout(timer);
    // The gauges follow handlers that outlive the stop until they return.
    if (timedOut) void all.then(() => this.stopSampling?.());
    else this.stopSampling?.();
    if (timedOut) {
      logger.error(
        { still_running: this.runningTaskIds() },
        'handlers ignored their AbortSignal past the stop timeout; their leases will lapse',
      );
    }
    // Nothing is left to abort: confirmations in flight end, none starts.
    this.cancelsClosed = true;
    this.noticed.clear();
    await this.confirming;
    // Against an unreachable database a stop does not wait out whole leases: they lapse instead.
    await this.deps.batcher.drain(this.o.stopTimeoutMs);
    await this.keyReleaser.drain();
    this.fetcher.close();
    // Handlers still running past stop() lose their lease protection within 3 refresh intervals.
    this.stuckGuard.stop();
  }
}
