import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type pg from 'pg';
import { createPool, sessionName } from '../db/connections.js';
import { BerthInputError, isPermanentError } from '../errors.js';
import { createLogger, type Logger } from '../logger.js';
import { Maintenance, validateMaintenanceOptions, type MaintenanceOptions } from '../maintenance/leader.js';
import { BerthMetrics, type Outcome } from '../metrics.js';
import { DEFAULT_SCHEMA, wakeChannel } from '../sql.js';
import { backoffDelayMs, DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS, validatePayload, type TaskContext, type TaskDefinition } from '../task.js';
import { claim, discover, LANE_SHARE, type ClaimedTask } from './claim.js';
import { SettlementBatcher, type FailResult } from './settlement-batcher.js';
import { leaseKey } from '../storage/lease.js';
import { advanceCursor, releaseLease, returnUnstarted } from '../storage/return.js';
import { WakeListener } from './wake.js';
import { assertMigrated } from '../schema/migrate.js';
import { Heartbeat } from './heartbeat.js';
import { DEFAULT_HEARTBEAT_MS } from '../storage/live-workers.js';
import { startWorkerHttp, validateWorkerHttpOptions, type WorkerHttpOptions } from '../dashboard/worker-http.js';
import { abortableSleep } from '../util/abortable-sleep.js';
import { describeHandlerResult, isContractResult } from './handler-result.js';
import { DEFAULT_STUCK_GRACE_MS, STUCK_EXIT_CODE, StuckGuard } from './stuck.js';

export interface WorkerOptions {
  connectionString: string;
  /** Discovery reads go here (a replica); claims and settlements always go to the primary. */
  readConnectionString?: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- definitions of any payload type
  tasks: readonly TaskDefinition<any>[];
  /** Worker slots (concurrent handlers). Default: env BERTH_TASK_PROCESSOR_CONCURRENCY, else 4. */
  slots?: number;
  /** Only claim from these queues. Default: all. */
  queues?: readonly string[];
  schema?: string;
  /** Lease margin: lease = ceiling + margin; the handler must stop by expiry - margin. 30 s. */
  leaseMarginMs?: number;
  /**
   * The most tasks leased ahead of free slots, so the next batch is claimed while this one runs
   * (the worker aims for ~25 ms of work at the recent completion rate). Their deadlines still come from
   * their own lease stamps. Default: 25 × slots; 0 claims only for idle slots (seed 000's shape).
   */
  prefetch?: number;
  /** The shared idle poll: one fetch per tick. 5 s. */
  pollIntervalMs?: number;
  /** Ceiling used for a claimed task whose type this worker has no definition for. 5 min. */
  defaultCeilingMs?: number;
  /** How long stop() waits for aborted handlers to return. 10 s. */
  stopTimeoutMs?: number;
  /** Statement timeout for every query the worker's pools run. 30 s. */
  statementTimeoutMs?: number;
  /** Run the elected maintenance leader in this process (default true). */
  maintenance?: boolean | MaintenanceOptions;
  logger?: Logger;
  metrics?: BerthMetrics;
  /** Recorded on every lease; default host:pid:random. */
  workerId?: string;
  /** LISTEN reconnect backoff. */
  listenReconnectBaseMs?: number;
  /**
   * How often this worker writes its row in `workers` and flushes its per-minute outcome counts
   * (what `berth stats`, `berth leader` and the dashboard read). 10 s; `false` turns it off.
   */
  heartbeatIntervalMs?: number | false;
  /**
   * Opt-in HTTP server started by start() and closed by stop(): `GET /metrics` from this worker's
   * registry (`metrics`, default true) and/or the web dashboard on a small pool of its own (two
   * connections, so its reads never take a claim's connection; `dashboard`: true or its options;
   * without auth, host must be loopback). See `httpUrl`.
   */
  http?: WorkerHttpOptions;
  /**
   * A handler still running this long past its deadline (it ignored its AbortSignal) is reported
   * stuck: `berth_task_stuck_handlers`, a warn log, a mark on the dashboard. Its lease is kept
   * from rescue while this process runs it (see docs/architecture.md). 10 s.
   */
  stuckGraceMs?: number;
  /**
   * Opt-in: once this many slots are stuck at once, log an error, stop (no new claims, the rest
   * released) and exit the process with status 75 (`STUCK_EXIT_CODE`) for a supervisor to
   * restart. The stuck leases are rescued once the process is gone. Default: never.
   */
  exitOnStuckSlots?: number;
}

/** Every key WorkerOptions has: anything else is a typo, refused rather than ignored. */
const WORKER_OPTION_KEYS: ReadonlySet<string> = new Set<keyof WorkerOptions>([
  'connectionString', 'readConnectionString', 'tasks', 'slots', 'queues', 'schema', 'leaseMarginMs', 'prefetch',
  'pollIntervalMs', 'defaultCeilingMs', 'stopTimeoutMs', 'statementTimeoutMs', 'maintenance', 'logger', 'metrics',
  'workerId', 'listenReconnectBaseMs', 'heartbeatIntervalMs', 'http', 'stuckGraceMs', 'exitOnStuckSlots',
]);

/**
 * Worker sessions run without JIT: the claim's plan over every ring partition is costed high
 * enough to trigger JIT compilation, which took ~1 s per statement for a sub-millisecond query.
 */
const SESSION_OPTIONS = '-c jit=off -c plan_cache_mode=force_generic_plan';

/** The longest wait between claim attempts while the database fails (see runFetchLoop). */
const FETCH_RETRY_MAX_MS = 1000;

class ShutdownAbort extends Error {
  constructor() {
    super('worker is shutting down');
    this.name = 'ShutdownAbort';
  }
}

class DeadlineAbort extends Error {
  constructor(deadline: number) {
    super(`handler deadline ${new Date(deadline).toISOString()} passed`);
    this.name = 'DeadlineAbort';
  }
}

/** What became of a release: written (maybe to the dead letters), refused by the fence, or not written at all. */
type ReleaseResult = { kind: 'written'; dead: boolean } | { kind: 'refused' } | { kind: 'unwritten'; error: string };

interface InFlight {
  task: ClaimedTask;
  controller: AbortController;
}

function lazyChild(parent: Logger, bindings: () => Record<string, unknown>): Logger {
  let child: Logger | undefined;
  return new Proxy(parent, {
    get(_target, prop) {
      child ??= parent.child(bindings());
      const value: unknown = Reflect.get(child, prop, child);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(child) : value;
    },
  });
}

/** The numbers seed 000 fixes, in one place (docs/configuration in the README lists them). */
export const WORKER_DEFAULTS = Object.freeze({
  slots: 4,
  leaseMarginMs: 30_000,
  pollIntervalMs: 5000,
  defaultCeilingMs: 300_000,
  stopTimeoutMs: 10_000,
  statementTimeoutMs: 30_000,
});

export function slotsFromEnv(value: string | undefined): number | undefined {
  if (value === undefined || value === '') return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 1000) {
    throw new BerthInputError(`BERTH_TASK_PROCESSOR_CONCURRENCY must be an integer from 1 to 1000, got "${value}"`);
  }
  return n;
}

/**
 * The task processor. N slots share one fetcher: a wake (NOTIFY, the shared poll tick, or a
 * slot coming free) runs discovery on the read pool and one claim on the primary that leases
 * entries for every idle slot. Each leased task runs under its own token and deadline and is
 * settled by its own fenced row.
 */
export class Worker {
  readonly id: string;
  readonly metrics: BerthMetrics;
  readonly logger: Logger;
  private readonly schema: string;
  private readonly slots: number;
  private readonly marginMs: number;
  private readonly pollMs: number;
  private readonly defaultCeilingMs: number;
  private readonly stopTimeoutMs: number;
  private readonly heartbeatMs: number | false;
  private readonly stuckGraceMs: number;
  private stuckGuard: StuckGuard | null = null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  private readonly defs = new Map<string, TaskDefinition<any>>();
  private readonly ceilings = new Map<string, number>();
  private readonly maxAttempts = new Map<string, number>();
  private readonly channel: string;
  private writePool: pg.Pool | null = null;
  private readPool: pg.Pool | null = null;
  private listener: WakeListener | null = null;
  private maintenance: Maintenance | null = null;
  private heartbeat: Heartbeat | null = null;
  private http: { url: string; close(): Promise<void> } | null = null;
  private readonly startedAt = new Date();
  private batcher: SettlementBatcher | null = null;
  private ticker: NodeJS.Timeout | null = null;
  /** Leased tasks waiting for a slot (at most `prefetch` beyond the idle slots). */
  private readonly buffer: ClaimedTask[] = [];
  /** When each claimed task arrived, to tell a late claim from a wait in the buffer. */
  private readonly receivedAt = new WeakMap<ClaimedTask, number>();
  private readonly prefetch: number;
  private completionRate = 0;
  private completedSinceSample = 0;
  private rateSampledAt = performance.now();
  /** Tasks whose handler is running: each holds a slot. */
  private readonly inflight = new Map<string, InFlight>();
  /** Every execution not yet fully settled (its handler may already have returned). */
  private readonly executions = new Set<Promise<void>>();
  private wakeReason: string | null = null;
  private wakeResolve: (() => void) | null = null;
  private fetchLoop: Promise<void> | null = null;
  private stopping = false;
  /** Aborted when the database is seen back (LISTEN reconnected) or on stop(): ends the fetch loop's error backoff early. */
  private retryNow = new AbortController();
  private started = false;
  /** Lanes the last claim filled every slot from: tried first next time, skipping discovery. */
  private hotLanes: number[] = [];
  /** Lanes named by wake notifications since the last fetch: also tried before discovery. */
  private readonly notifiedLanes = new Set<number>();

  constructor(private readonly options: WorkerOptions) {
    for (const key of Object.keys(options)) {
      if (!WORKER_OPTION_KEYS.has(key)) throw new BerthInputError(`unknown worker option "${key}"`);
    }
    if (!options.connectionString) throw new BerthInputError('Worker needs a connectionString');
    this.schema = options.schema ?? DEFAULT_SCHEMA;
    this.slots = options.slots ?? slotsFromEnv(process.env.BERTH_TASK_PROCESSOR_CONCURRENCY) ?? WORKER_DEFAULTS.slots;
    if (!Number.isInteger(this.slots) || this.slots < 1) throw new BerthInputError('slots must be an integer >= 1');
    this.marginMs = options.leaseMarginMs ?? WORKER_DEFAULTS.leaseMarginMs;
    if (!(this.marginMs >= 0)) throw new BerthInputError('leaseMarginMs must be >= 0');
    this.pollMs = options.pollIntervalMs ?? WORKER_DEFAULTS.pollIntervalMs;
    if (!(this.pollMs > 0)) throw new BerthInputError('pollIntervalMs must be > 0');
    this.defaultCeilingMs = options.defaultCeilingMs ?? WORKER_DEFAULTS.defaultCeilingMs;
    this.prefetch = options.prefetch ?? this.slots * 25;
    if (!Number.isInteger(this.prefetch) || this.prefetch < 0) throw new BerthInputError('prefetch must be an integer >= 0');
    this.stopTimeoutMs = options.stopTimeoutMs ?? WORKER_DEFAULTS.stopTimeoutMs;
    if (!(this.stopTimeoutMs >= 0)) throw new BerthInputError('stopTimeoutMs must be >= 0');
    if (!(this.defaultCeilingMs > 0)) throw new BerthInputError('defaultCeilingMs must be > 0');
    const statementTimeout = options.statementTimeoutMs ?? WORKER_DEFAULTS.statementTimeoutMs;
    if (!(statementTimeout > 0)) throw new BerthInputError('statementTimeoutMs must be > 0');
    if (typeof options.maintenance === 'object') validateMaintenanceOptions(options.maintenance);
    this.heartbeatMs = options.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_MS;
    if (this.heartbeatMs !== false && !(this.heartbeatMs > 0)) throw new BerthInputError('heartbeatIntervalMs must be > 0 or false');
    if (options.http !== undefined) validateWorkerHttpOptions(options.http);
    this.stuckGraceMs = options.stuckGraceMs ?? DEFAULT_STUCK_GRACE_MS;
    if (typeof this.stuckGraceMs !== 'number' || !Number.isFinite(this.stuckGraceMs) || this.stuckGraceMs < 0) {
      throw new BerthInputError(`stuckGraceMs must be a finite number >= 0, got ${JSON.stringify(options.stuckGraceMs)}`);
    }
    const exitOn = options.exitOnStuckSlots;
    if (exitOn !== undefined && !(Number.isInteger(exitOn) && exitOn >= 1 && exitOn <= this.slots)) {
      throw new BerthInputError(`exitOnStuckSlots must be an integer from 1 to slots (${this.slots}), got ${JSON.stringify(exitOn)}`);
    }
    for (const d of options.tasks) {
      if (this.defs.has(d.type)) throw new BerthInputError(`task type "${d.type}" is defined twice`);
      this.defs.set(d.type, d);
      this.ceilings.set(d.type, d.ceiling);
      this.maxAttempts.set(d.type, d.maxAttempts);
    }
    this.id = options.workerId ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
    this.metrics = options.metrics ?? new BerthMetrics();
    this.logger = (options.logger ?? createLogger()).child({ worker: this.id });
    this.channel = wakeChannel(this.schema);
  }

  get activeSlots(): number {
    return this.inflight.size;
  }

  /** The `http` server's address (`http://host:port`, the bound port), once started. */
  get httpUrl(): string | null {
    return this.http?.url ?? null;
  }

  get isLeader(): boolean {
    return this.maintenance?.isLeader ?? false;
  }

  /** Maintenance branch statistics of this process (empty unless it has led). */
  maintenanceStats(): ReturnType<Maintenance['stats']> {
    return this.maintenance?.stats() ?? {};
  }

  async start(): Promise<void> {
    if (this.started) throw new Error('worker already started');
    this.started = true;
    const statementTimeout = this.options.statementTimeoutMs ?? WORKER_DEFAULTS.statementTimeoutMs;
    this.writePool = createPool(
      {
        connectionString: this.options.connectionString,
        max: Math.max(4, Math.ceil(this.slots / 2) + 4),
        statement_timeout: statementTimeout,
        options: SESSION_OPTIONS,
        application_name: sessionName('worker', this.id),
      },
      this.logger,
      'write',
    );
    try {
      await assertMigrated(this.writePool, this.schema);
    } catch (err) {
      await this.writePool.end();
      this.started = false;
      throw err;
    }
    if (this.options.readConnectionString) {
      this.readPool = createPool(
        {
          connectionString: this.options.readConnectionString,
          max: 2,
          statement_timeout: statementTimeout,
          options: SESSION_OPTIONS,
          application_name: sessionName('read', this.id),
        },
        this.logger,
        'read',
      );
    } else {
      this.readPool = this.writePool;
    }
    if (this.options.http) {
      try {
        this.http = await startWorkerHttp(this.options.http, {
          connectionString: this.options.connectionString,
          schema: this.schema,
          registry: this.metrics.registry,
          logger: this.logger.child({ component: 'http' }),
          applicationName: sessionName('dashboard', this.id),
        });
      } catch (err) {
        // Nothing else has started yet: close the pools so the caller can fix the address and retry.
        if (this.readPool !== this.writePool) await this.readPool.end();
        await this.writePool.end();
        this.started = false;
        throw err;
      }
    }
    this.batcher = new SettlementBatcher(this.writePool, this.schema, this.metrics, this.logger);
    this.stuckGuard = new StuckGuard(
      this.writePool,
      this.schema,
      this.metrics,
      this.logger,
      {
        workerId: this.id,
        marginMs: this.marginMs,
        graceMs: this.stuckGraceMs,
        refreshMs: this.heartbeatMs === false ? DEFAULT_HEARTBEAT_MS : this.heartbeatMs,
        exitOnStuckSlots: this.options.exitOnStuckSlots,
      },
      this.inflight,
      (stuck) => void this.exitForStuckSlots(stuck),
    );
    this.stuckGuard.start();
    this.metrics.slots.set(this.slots);
    this.listener = new WakeListener({
      connectionString: this.options.connectionString,
      channel: this.channel,
      logger: this.logger,
      onNotify: (payload) => {
        // Producers and promotion name the lane they appended to: claim there first.
        const lane = Number(payload);
        if (payload !== '' && Number.isInteger(lane) && lane > 0 && this.notifiedLanes.size < 64) this.notifiedLanes.add(lane);
        this.wake('notify');
      },
      onReconnect: () => {
        this.metrics.listenReconnects.inc();
        // The database is back: a fetch loop sleeping out its error backoff retries now.
        this.retryNow.abort();
      },
      applicationName: sessionName('listen', this.id),
      reconnectBaseMs: this.options.listenReconnectBaseMs,
    });
    await this.listener.start();
    // One ticker shared by all slots: each tick releases at most one fetch.
    this.ticker = setInterval(() => {
      if (this.inflight.size < this.slots) this.wake('poll');
    }, this.pollMs);
    if (this.options.maintenance !== false) {
      this.maintenance = new Maintenance({
        connectionString: this.options.connectionString,
        schema: this.schema,
        pool: this.writePool,
        logger: this.logger.child({ component: 'maintenance' }),
        metrics: this.metrics,
        options: typeof this.options.maintenance === 'object' ? this.options.maintenance : undefined,
        workerId: this.id,
      });
      this.maintenance.start();
    }
    if (this.heartbeatMs !== false) {
      this.heartbeat = new Heartbeat(
        this.writePool,
        this.schema,
        {
          workerId: this.id,
          queues: this.options.queues ?? null,
          slots: this.slots,
          startedAt: this.startedAt,
          busy: () => this.inflight.size,
          prefetched: () => this.buffer.length,
          leader: () => this.isLeader,
          maintenance: () =>
            this.isLeader
              ? { branches: this.maintenanceStats(), waitingLanes: this.maintenance?.waitingLanes() ?? [], contention: this.maintenance?.contention() ?? [] }
              : {},
        },
        this.logger.child({ component: 'heartbeat' }),
        this.heartbeatMs,
      );
      this.heartbeat.start();
    }
    this.wake('start');
    this.fetchLoop = this.runFetchLoop();
    this.logger.info({ slots: this.slots, schema: this.schema, types: [...this.defs.keys()] }, 'worker started');
  }

  /** For tests: the LISTEN session's backend pid. */
  listenerBackendPid(): Promise<number | null> {
    return this.listener?.backendPid() ?? Promise.resolve(null);
  }

  private wake(reason: string): void {
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
      const idle = this.slots - this.inflight.size;
      const ahead = this.prefetchTarget();
      const want = idle + ahead - this.buffer.length;
      // Claim when the buffer is down to its low-water mark, or a slot idles with nothing local.
      const lowWater = Math.ceil((this.slots + ahead) / 2);
      if (want <= 0 || (want < lowWater && !(idle > 0 && this.buffer.length === 0))) {
        // Stay asleep until a slot frees (it re-wakes us).
        this.wakeReason = null;
        continue;
      }
      const reason = this.wakeReason ?? 'unknown';
      this.wakeReason = null;
      this.metrics.wakeups.inc({ reason });
      try {
        const tasks = await this.fetch(want);
        if (failures > 0) {
          this.logger.info({ failures }, 'claims work again after database errors');
          // The LISTEN session may still be waiting out its own reconnect backoff.
          this.listener?.reconnectNow();
        }
        failures = 0;
        const now = Date.now();
        for (const t of tasks) this.receivedAt.set(t, now);
        this.buffer.push(...tasks);
        this.dispatch();
      } catch (err) {
        failures++;
        // Capped at a second (with jitter, so a fleet does not retry in step): after an outage
        // the worker claims again within about a second of the database's return, and a LISTEN
        // reconnect cuts the wait short. Each retry is one connection attempt per process.
        const delay = Math.round(Math.min(100 * 2 ** failures, FETCH_RETRY_MAX_MS) * (0.5 + Math.random() / 2));
        if (failures === 1 || failures % 10 === 0) {
          this.logger.warn({ err: (err as Error).message, retryInMs: delay, failures }, 'fetch failed; backing off');
        }
        if (this.retryNow.signal.aborted && !this.stopping) this.retryNow = new AbortController();
        await abortableSleep(delay, this.retryNow.signal);
        this.wake('retry');
      }
    }
  }

  private async fetch(want: number): Promise<ClaimedTask[]> {
    const started = performance.now();
    const params = {
      schema: this.schema,
      ceilings: this.ceilings,
      maxAttempts: this.maxAttempts,
      defaultMaxAttempts: DEFAULT_MAX_ATTEMPTS,
      defaultCeilingMs: this.defaultCeilingMs,
      marginMs: this.marginMs,
      workerId: this.id,
      wakeChannel: this.channel,
      queues: this.options.queues ?? null,
    };
    let got: ClaimedTask[] = [];
    const known = [...new Set([...this.hotLanes, ...this.notifiedLanes])];
    this.notifiedLanes.clear();
    if (known.length > 0) {
      got = await claim(this.writePool!, { ...params, laneIds: known, limit: want });
      if (got.length > 0 && got.length < want) {
        // Start these now; discovery for the rest runs on the next pass of the loop.
        this.wake('more');
      }
    }
    if (got.length === 0) {
      const candidates = await discover(this.readPool!, this.schema, this.options.queues ?? null, 20, 1);
      const lanes = [...new Set(candidates.map((c) => c.laneId))];
      if (lanes.length > 0) {
        // Every worker's discovery returns the same lanes, so each locks only its share of them
        // (in discovery's priority order): concurrent workers spread instead of all but one
        // finding every lane locked. Known lanes (its own hot lanes, notified ones) are all tried.
        const maxLanes = Math.ceil((want - got.length) / LANE_SHARE);
        got = got.concat(await claim(this.writePool!, { ...params, laneIds: lanes, limit: want - got.length, maxLanes }));
      }
    }
    this.hotLanes = got.length === want ? [...new Set(got.map((t) => t.laneId))] : [];
    this.metrics.claimSeconds.observe((performance.now() - started) / 1000);
    this.metrics.claims.inc({ result: got.length > 0 ? 'hit' : 'empty' });
    this.metrics.claimedTasks.inc(got.length);
    for (const t of got) this.metrics.taskWaitSeconds.observe({ task_type: t.type }, t.waitedSeconds);
    return got;
  }

  /**
   * How many tasks to lease ahead of free slots: about 25 ms of work at the recent completion
   * rate, at most `prefetch`. Fast tasks get big claims (few round trips); slow tasks are never
   * hoarded away from other workers.
   */
  private prefetchTarget(): number {
    if (this.prefetch === 0) return 0;
    const now = performance.now();
    const dt = now - this.rateSampledAt;
    if (dt >= 10) {
      const rate = (this.completedSinceSample * 1000) / dt;
      this.completionRate = this.completionRate === 0 ? rate : this.completionRate * 0.7 + rate * 0.3;
      this.completedSinceSample = 0;
      this.rateSampledAt = now;
    }
    // No floor: when tasks are slow (or the rate is unknown) nothing is leased ahead, so a task
    // never waits in this process behind long handlers while other workers sit idle.
    return Math.min(this.prefetch, Math.ceil(this.completionRate * 0.025));
  }

  /** Start buffered tasks on free slots, oldest claim first. */
  private dispatch(): void {
    while (this.inflight.size < this.slots && this.buffer.length > 0 && !this.stopping) {
      this.startTask(this.buffer.shift()!);
    }
    this.metrics.bufferedTasks.set(this.buffer.length);
  }

  private startTask(task: ClaimedTask): void {
    const controller = new AbortController();
    const key = leaseKey(task);
    this.inflight.set(key, { task, controller });
    this.metrics.busySlots.set(this.inflight.size);
    // The slot comes free as soon as the handler returns; its settlement is written by the
    // batcher meanwhile (stop() waits for it).
    let freed = false;
    const freeSlot = () => {
      if (freed) return;
      freed = true;
      this.inflight.delete(key);
      this.completedSinceSample++;
      this.metrics.busySlots.set(this.inflight.size);
      if (this.stopping) return;
      this.dispatch();
      this.wake('slot_freed');
    };
    const done: Promise<void> = this.execute(task, controller, freeSlot)
      .catch((err) => this.logger.error({ err: (err as Error).message, task_id: task.id }, 'task execution crashed'))
      // Stuck-handler containment (processor/stuck.ts): after the settlement is written, an
      // overdue lease row, if this run overran its deadline, has done its job.
      .then(() => this.stuckGuard!.settled(key))
      .finally(() => {
        freeSlot();
        this.executions.delete(done);
      });
    this.executions.add(done);
  }

  private async execute(task: ClaimedTask, controller: AbortController, freeSlot: () => void): Promise<void> {
    const def = this.defs.get(task.type);
    // Built on first use: most runs log nothing, and a pino child per task is not free.
    const log = lazyChild(this.logger, () => ({
      task_id: task.id,
      task_type: task.type,
      lane: `${task.queue}/${task.priority}/${task.shard}`,
      attempt: task.attempt,
    }));
    const deadline = task.leaseExpiresAt - this.marginMs;
    const record = (outcome: Outcome) => {
      this.metrics.outcomes.inc({ task_type: task.type, outcome });
      this.heartbeat?.tally.record(task.queue, task.type, outcome);
    };
    /** Record a failure through the batcher; `outcome` is what a written failure counts as. */
    const fail = async (error: string, delayMs: number, permanent: boolean, outcome: 'failure' | 'timeout'): Promise<FailResult> => {
      const r = await this.batcher!.fail({ ref: task, error, delayMs, permanent });
      if (r.kind === 'settled') record(outcome);
      else if (r.kind === 'refused') {
        log.warn({ err: error }, 'RecordFailure was refused: lease lost');
        record('lost');
      } else {
        log.error({ err: error, settle_error: r.error }, 'the failure could not be recorded (database unreachable); the lease will lapse and the task run again');
        record('unsettled');
      }
      return r;
    };

    if (!def) {
      freeSlot();
      const error = `no handler registered for task type "${task.type}" on worker ${this.id}`;
      log.error({ max_attempts: task.maxAttempts }, error);
      await fail(error, backoffDelayMs(DEFAULT_BACKOFF, task.attempt), false, 'failure');
      return;
    }
    const receivedAt = this.receivedAt.get(task) ?? Date.now();
    if (deadline <= Date.now() && receivedAt < deadline) {
      // It waited in the prefetch buffer past its deadline: it never ran, so hand it back with
      // the attempt refunded rather than charge it a failure.
      freeSlot();
      const r = await returnUnstarted(this.writePool!, this.schema, task).catch(() => ({ wrote: false, dead: false }));
      log.warn({ handed_back: r.wrote }, 'prefetched task reached its deadline before a slot freed; handed back unstarted');
      return;
    }
    if (deadline <= Date.now()) {
      freeSlot();
      // The claim outlasted the whole ceiling: running now would outlive the lease.
      const error = `claim returned after the handler deadline (${new Date(deadline).toISOString()}); not started`;
      log.warn(error);
      await fail(error, backoffDelayMs(def.backoff, task.attempt), false, 'timeout');
      return;
    }
    // A validator that throws (instead of returning issues) is a bad payload too.
    const parsed = await validatePayload(def, task.payload).catch((err: unknown) => ({
      ok: false as const,
      message: `payload validation for task type "${task.type}" threw: ${(err as Error)?.message ?? String(err)}`,
    }));
    if (!parsed.ok) {
      freeSlot();
      log.error(parsed.message);
      await fail(parsed.message, 0, true, 'failure');
      return;
    }

    const timer = setTimeout(() => controller.abort(new DeadlineAbort(deadline)), Math.max(0, deadline - Date.now()));
    // A handler that ignores its signal must not also keep the process alive after stop().
    timer.unref();
    let advanced = false;
    const ctx: TaskContext<unknown> = {
      id: task.id,
      type: task.type,
      attempt: task.attempt,
      maxAttempts: task.maxAttempts,
      lane: { queue: task.queue, priority: task.priority, shard: task.shard },
      signal: controller.signal,
      deadline: new Date(deadline),
      logger: log,
      advanceCursor: async (next) => {
        const ok = await advanceCursor(this.writePool!, this.schema, task, next);
        if (ok) advanced = true;
        else log.warn('AdvanceCursor refused: lease no longer held');
        return ok;
      },
    };
    const started = performance.now();
    let result: unknown = undefined;
    let error: unknown = null;
    try {
      result = await def.handler(parsed.value, ctx);
      // Seed 000's contract has three answers; anything else (42, 'retry', false) is a bug in
      // the handler, so it fails loudly instead of counting as a success.
      if (!isContractResult(result)) {
        error = new Error(`handler returned ${describeHandlerResult(result)}; a handler must return 'done', 'continue' or nothing`);
      }
    } catch (err) {
      error = err ?? new Error('handler threw a nullish value');
    } finally {
      clearTimeout(timer);
    }
    freeSlot();
    this.metrics.handlerSeconds.observe({ task_type: task.type }, (performance.now() - started) / 1000);
    const shutdown = controller.signal.reason instanceof ShutdownAbort;
    const pastDeadline = controller.signal.reason instanceof DeadlineAbort || Date.now() >= deadline;

    if (shutdown && (error !== null || result === 'continue')) {
      // Interrupted by stop(): hand the lease back so another worker takes it within a poll.
      const r = await this.release(task, 'interrupted by worker shutdown on its final attempt', log);
      if (r.kind === 'written' && r.dead) log.warn('released on its final attempt by shutdown; dead-lettered');
      if (advanced) record('continued');
      else if (r.kind === 'written') record('cancelled');
      else if (r.kind === 'refused') {
        log.warn('shutdown release refused: lease no longer held');
        record('lost');
      } else record('unsettled');
      return;
    }
    if (error !== null) {
      const message = error instanceof Error ? error.message || error.name : String(error);
      const r = await fail(message, backoffDelayMs(def.backoff, task.attempt), isPermanentError(error), pastDeadline ? 'timeout' : 'failure');
      if (r.kind === 'settled') {
        (r.dead ? log.error : log.warn).call(log, { err: message, dead: r.dead, max_attempts: task.maxAttempts }, r.dead ? 'task failed; dead-lettered' : 'task failed; will retry');
      }
      return;
    }
    if (result === 'continue') {
      // AdvanceCursor already cleared the lease; this release is the safety net. Matching a row
      // means the slice advanced nothing and its next attempt repeats this one.
      const r = await this.release(task, 'continued without advancing on its final attempt', log);
      if (r.kind === 'written') {
        log.warn({ dead: r.dead, max_attempts: task.maxAttempts }, 'slice returned continue without advancing its cursor');
      } else if (!advanced) {
        if (r.kind === 'refused') {
          log.warn('continue release refused: lease lost');
          record('lost');
        } else record('unsettled');
        return;
      }
      if (pastDeadline) log.warn('slice continued at its deadline; recorded as timeout');
      record(pastDeadline ? 'timeout' : 'continued');
      return;
    }
    const r = await this.batcher!.complete(task);
    if (r.kind === 'refused') {
      log.warn('task finished but Dequeue was refused: lease lost (the task may run again)');
      record('lost');
      return;
    }
    if (r.kind === 'unwritten') {
      log.error({ settle_error: r.error }, 'task finished but its completion could not be written (database unreachable); it will run again after its lease lapses');
      record('unsettled');
      return;
    }
    if (pastDeadline) log.warn('task reported done after its deadline');
    if (this.logger.isLevelEnabled('debug')) log.debug('task done');
    record('success');
  }

  /** Release a lease (shutdown, or the continue safety net); never throws. */
  private async release(task: ClaimedTask, finalError: string, log: Logger): Promise<ReleaseResult> {
    try {
      const r = await releaseLease(this.writePool!, this.schema, task, finalError);
      return r.wrote ? { kind: 'written', dead: r.dead } : { kind: 'refused' };
    } catch (err) {
      // Expiry still gets there: the lease lapses and rescue hands the task on.
      log.warn({ err: (err as Error).message }, 'release could not be written; the lease will lapse');
      return { kind: 'unwritten', error: (err as Error).message };
    }
  }

  /**
   * Graceful stop: no new claims; in-flight handlers are aborted and their leases released
   * (recorded as cancelled, or continued if they saved progress); every settlement already
   * handed off is written; then maintenance stops and the pools close.
   */
  async stop(): Promise<void> {
    if (!this.started || this.stopping) {
      await this.fetchLoop;
      return;
    }
    this.stopping = true;
    this.retryNow.abort();
    if (this.ticker) clearInterval(this.ticker);
    this.wake('stop');
    await this.fetchLoop;
    // Leased but never started: hand them straight back with the claim's attempt refunded.
    const unstarted = this.buffer.splice(0);
    this.metrics.bufferedTasks.set(0);
    for (const t of unstarted) {
      const done = returnUnstarted(this.writePool!, this.schema, t).then(
        (r) => {
          if (!r.wrote) this.logger.warn({ task_id: t.id, task_type: t.type }, 'unstarted task could not be handed back: lease no longer held');
        },
        (err: Error) => this.logger.warn({ err: err.message, task_id: t.id }, 'handing back an unstarted task failed; its lease will lapse'),
      );
      this.executions.add(done);
      void done.finally(() => this.executions.delete(done));
    }
    for (const f of this.inflight.values()) f.controller.abort(new ShutdownAbort());
    const all = Promise.all([...this.executions]);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = await Promise.race([
      all.then(() => false),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(true), this.stopTimeoutMs))),
    ]);
    clearTimeout(timer);
    if (timedOut) {
      this.logger.error(
        { still_running: [...this.inflight.values()].map((f) => f.task.id) },
        'handlers ignored their AbortSignal past the stop timeout; their leases will lapse',
      );
    }
    // Against an unreachable database a stop does not wait out whole leases: they lapse instead.
    await this.batcher?.drain(this.stopTimeoutMs);
    // Handlers still running past stop() lose their lease protection within 3 refresh intervals.
    this.stuckGuard?.stop();
    await this.http?.close();
    await this.heartbeat?.stop();
    await this.maintenance?.stop();
    await this.listener?.stop();
    if (this.readPool && this.readPool !== this.writePool) await this.readPool.end();
    await this.writePool?.end();
    this.logger.info('worker stopped');
  }

  /**
   * `exitOnStuckSlots` reached: a slot held by a handler that ignores its signal only comes
   * back when the process ends. Stop as stop() does (no new claims; the other handlers aborted
   * and their leases released; settlements written), then exit for a supervisor to restart.
   * The stuck leases are not released (their handlers still run until the exit): their rows go
   * stale, and rescue hands them on, burning the attempt as for a crash.
   */
  private async exitForStuckSlots(stuck: ClaimedTask[]): Promise<void> {
    this.logger.error(
      {
        stuck_slots: stuck.length,
        exit_code: STUCK_EXIT_CODE,
        stuck: stuck.map((t) => ({ task_id: t.id, task_type: t.type, lane: `${t.queue}/${t.priority}/${t.shard}`, attempt: t.attempt })),
      },
      'too many stuck slots (exitOnStuckSlots): stopping and exiting for a supervisor to restart this process',
    );
    try {
      await this.stop();
    } catch (err) {
      this.logger.error({ err: (err as Error).message }, 'stop before the stuck-slot exit failed');
    }
    process.exit(STUCK_EXIT_CODE);
  }
}
