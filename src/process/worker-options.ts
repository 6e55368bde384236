import { didYouMean } from '../util/nearest.js';
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { resolveDatabase, type DatabaseTarget } from '../db/connections.js';
import { BerthInputError } from '../errors.js';
import { childLogger, createLogger, type Logger } from '../logger.js';
import {
  resolveMaintenanceOptions,
  type MaintenanceOptions,
  type ResolvedMaintenanceOptions,
} from '../maintenance/leader.js';
import { BerthMetrics } from '../metrics/catalogue.js';
import { DEFAULT_SCHEMA } from '../sql.js';
import { DEFAULT_MAX_ATTEMPTS, type AnyTaskDefinition } from '../task.js';
import {
  resolveWorkerHttpOptions,
  type ResolvedWorkerHttpOptions,
  type WorkerHttpOptions,
} from '../dashboard/worker-http.js';
import { DEFAULT_HEARTBEAT_MS } from '../storage/live-workers.js';
import { DEFAULT_STUCK_GRACE_MS } from '../processor/stuck.js';
import { DEFAULT_RESULT_MAX_BYTES, MAX_RESULT_MAX_BYTES } from '../processor/handler-result.js';
import type { EngineOptions } from '../processor/engine-options.js';
import { resolveUnknownTypeOptions, type UnknownTypeOptions } from '../processor/unknown-types.js';
import { DEFAULT_QUEUE } from '../producer/enqueue.js';
import { checkSchemaName, checkText, MAX_QUEUE_BYTES, MAX_TIMER_MS } from '../limits.js';
import { resolveSchedules, type ScheduleDefinition } from '../schedule.js';
import type { ScheduleClock } from '../maintenance/scheduler.js';

export interface WorkerOptions {
  connectionString: string;
  /** Discovery reads go here (a replica); claims and settlements always go to the primary. */
  readConnectionString?: string;
  /**
   * Where the sessions that must stay on one server connection go: the LISTEN session (wake-ups)
   * and the maintenance election (the leader's session advisory lock). Default: `connectionString`.
   * Set it to a direct (or session-pooled) connection when `connectionString` goes through a
   * transaction-mode pooler. `false`: there is no such connection; the worker runs poll-only
   * (no LISTEN: tasks are picked up within `pollIntervalMs`) and must not lead maintenance
   * (`maintenance: false`; run a leader in a process with a direct connection).
   */
  sessionConnectionString?: string | false;
  /**
   * false: the worker's statements are sent unnamed instead of prepared once per session, for a
   * transaction-mode pooler without prepared-statement support (PgBouncer before 1.21). true:
   * always named. Default: named until a statement fails as only such a pooler makes it fail
   * (26000 or 42P05), then unnamed for good, with one warning.
   */
  preparedStatements?: boolean;
  tasks: readonly AnyTaskDefinition[];
  /**
   * Recurring tasks (`defineSchedule(…)`), each of a type in `tasks`. Upserted in the database
   * when the worker starts; fired by the elected maintenance leader, exactly once per instant,
   * whichever worker leads. A schedule no running worker declares any more is marked stale and
   * no longer fired. Needs the heartbeat (it says which schedules a live worker declares).
   */
  schedules?: readonly ScheduleDefinition[];
  /**
   * For tests: the time the maintenance leader fires schedules by (default: the database's
   * clock). A function returning a Date.
   */
  scheduleClock?: ScheduleClock;
  /** Worker slots (concurrent handlers). 4; `workerOptionsFromEnv` reads BERTH_TASK_PROCESSOR_CONCURRENCY. */
  slots?: number;
  /**
   * The queues this worker claims from. Default: the queues its definitions name (`default` for
   * a definition that names none), so a worker only meets the types it was deployed with.
   * `'all'`: every queue (a type it has no definition for is then handed back, see
   * `unknownTypes`).
   */
  queues?: readonly string[] | 'all';
  /**
   * A claimed task of a type this worker has no definition for is handed back without charging
   * an attempt, due again after `delayMs` (doubling per consecutive `logIntervalMs` the type is
   * seen in, up to `maxDelayMs`), counted on `berth_tasks_unknown_type_total` and logged once
   * per type per interval. Defaults 5 s, 5 min, 60 s.
   */
  unknownTypes?: UnknownTypeOptions;
  schema?: string;
  /** Lease margin: lease = ceiling + margin; the handler must stop by expiry - margin. 30 s. */
  leaseMarginMs?: number;
  /**
   * The most tasks leased ahead of free slots, so the next batch is claimed while this one runs
   * (the worker aims for ~25 ms of work at the recent completion rate). Their deadlines still come from
   * their own lease stamps. Default: 25 × slots, at least 2,000; 0 claims only for idle slots
   * (seed 000's shape).
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
  /**
   * How long opening one connection may take (every pool, LISTEN, the election session, the
   * HTTP dashboard's pool); 0 waits indefinitely. Default: the URL's `connect_timeout`, else
   * PGCONNECT_TIMEOUT (both in seconds, as libpq reads them), else 10 s.
   */
  connectTimeoutMs?: number;
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
  /**
   * The largest result a handler may return, as JSON in UTF-8 bytes (64 KiB, at most 16 MiB).
   * A larger one fails its attempt, retried with the task's backoff, and the error names its
   * size and this cap.
   */
  resultMaxBytes?: number;
}

/**
 * Every worker default in one place: the numbers seed 000 fixes (slots, margin, poll, statement
 * timeout) and the rest. docs/configuration.md lists them; `prefetch` defaults to
 * `prefetchPerSlot` × slots, at least `prefetchMin`: the cap on what the ~25 ms rate target may
 * lease ahead. Fast tasks are claimed in batches of that size: a drain of no-op tasks with 10
 * slots ran at 35–43k tasks/s under the old 250 (one claim in flight, the buffer empty before
 * the next claim returned) and at 74–115k under 2,000 (docs/benchmarks-journal.md); slow tasks never
 * reach it (25 ms of their work is a few tasks).
 */
export const WORKER_DEFAULTS = Object.freeze({
  slots: 4,
  leaseMarginMs: 30_000,
  pollIntervalMs: 5000,
  defaultCeilingMs: 300_000,
  stopTimeoutMs: 10_000,
  statementTimeoutMs: 30_000,
  prefetchPerSlot: 25,
  prefetchMin: 2000,
  heartbeatIntervalMs: DEFAULT_HEARTBEAT_MS as number | false,
  stuckGraceMs: DEFAULT_STUCK_GRACE_MS,
  listenReconnectBaseMs: 500,
  maintenance: true as boolean,
  schema: DEFAULT_SCHEMA,
  resultMaxBytes: DEFAULT_RESULT_MAX_BYTES,
});

/** Every key WorkerOptions has: anything else is a typo, refused rather than ignored. */
const WORKER_OPTION_KEYS: ReadonlySet<string> = new Set<keyof WorkerOptions>([
  'connectionString',
  'readConnectionString',
  'sessionConnectionString',
  'preparedStatements',
  'tasks',
  'schedules',
  'scheduleClock',
  'slots',
  'queues',
  'unknownTypes',
  'schema',
  'leaseMarginMs',
  'prefetch',
  'pollIntervalMs',
  'defaultCeilingMs',
  'stopTimeoutMs',
  'statementTimeoutMs',
  'connectTimeoutMs',
  'maintenance',
  'logger',
  'metrics',
  'workerId',
  'listenReconnectBaseMs',
  'heartbeatIntervalMs',
  'http',
  'stuckGraceMs',
  'exitOnStuckSlots',
  'resultMaxBytes',
]);

/** WorkerOptions with every default filled in and every value checked: what the worker runs on. */
export interface ResolvedWorkerOptions extends EngineOptions {
  /** The primary, checked, with its connect timeout. */
  readonly database: DatabaseTarget;
  /** `readConnectionString`'s target, or null. */
  readonly readDatabase: DatabaseTarget | null;
  /** `preparedStatements`: `detect` when not given (named until a pooler shows they are not kept). */
  readonly preparedStatements: boolean | 'detect';
  /** Where LISTEN and the election session connect (`sessionConnectionString`, else the primary); null: poll-only. */
  readonly sessionDatabase: DatabaseTarget | null;
  readonly statementTimeoutMs: number;
  /** false: this process never leads maintenance. */
  readonly maintenance: ResolvedMaintenanceOptions | false;
  /** The caller's logger (or a new one), bound to this worker's id. */
  readonly logger: Logger;
  readonly metrics: BerthMetrics;
  readonly listenReconnectBaseMs: number;
  readonly http: ResolvedWorkerHttpOptions | null;
  /** The worker's schedules, checked against its task definitions. */
  readonly schedules: readonly ScheduleDefinition[];
  readonly scheduleClock: ScheduleClock | null;
}

/**
 * Defaults filled in, every value checked, once: a bad value (or an unknown key) is a
 * BerthInputError naming the option, thrown by `new Worker(...)` before anything starts. The
 * library never reads the environment here (see `workerOptionsFromEnv` in src/process/env.ts).
 */
/**
 * What other queues call an option berth names differently, for the "did you mean" of a key
 * spelt no closer (graphile-worker's and pg-boss's `concurrency` is berth's `slots`).
 */
const PEER_OPTION_NAMES: Readonly<Record<string, string>> = {
  concurrency: '; did you mean "slots"? (the number of handlers a worker runs at once)',
  localConcurrency: '; did you mean "slots"? (the number of handlers a worker runs at once)',
  taskList: '; did you mean "tasks"? (an array of defineTask(…) values)',
};

export function resolveWorkerOptions(options: WorkerOptions): ResolvedWorkerOptions {
  for (const key of Object.keys(options)) {
    if (!WORKER_OPTION_KEYS.has(key))
      throw new BerthInputError(
        `unknown worker option "${key}"${PEER_OPTION_NAMES[key] ?? didYouMean(key, WORKER_OPTION_KEYS)}`,
      );
  }
  if (!options.connectionString) throw new BerthInputError('Worker needs a connectionString');
  if (!Array.isArray(options.tasks))
    throw new BerthInputError(
      'Worker needs tasks: the definitions it runs, an array of defineTask(…) values (tasks: [sendReceipt])',
    );
  const preparedStatements = options.preparedStatements;
  if (preparedStatements !== undefined && typeof preparedStatements !== 'boolean')
    throw new BerthInputError(`preparedStatements must be true or false, got ${JSON.stringify(preparedStatements)}`);
  const database = resolveDatabase(options.connectionString, {
    connectTimeoutMs: options.connectTimeoutMs,
    preparedStatements,
  });
  const readDatabase = options.readConnectionString
    ? resolveDatabase(options.readConnectionString, {
        field: 'readConnectionString',
        connectTimeoutMs: options.connectTimeoutMs,
        preparedStatements,
      })
    : null;
  const sessionDatabase = resolveSessionDatabase(options, database);
  const d = WORKER_DEFAULTS;
  const slots = options.slots ?? d.slots;
  if (!Number.isInteger(slots) || slots < 1) throw new BerthInputError('slots must be an integer >= 1');
  const leaseMarginMs = options.leaseMarginMs ?? d.leaseMarginMs;
  if (!(leaseMarginMs >= 0)) throw new BerthInputError('leaseMarginMs must be >= 0');
  const pollIntervalMs = options.pollIntervalMs ?? d.pollIntervalMs;
  if (!(pollIntervalMs > 0)) throw new BerthInputError('pollIntervalMs must be > 0');
  const defaultCeilingMs = options.defaultCeilingMs ?? d.defaultCeilingMs;
  const prefetch = options.prefetch ?? Math.max(d.prefetchMin, slots * d.prefetchPerSlot);
  if (!Number.isInteger(prefetch) || prefetch < 0) throw new BerthInputError('prefetch must be an integer >= 0');
  const stopTimeoutMs = options.stopTimeoutMs ?? d.stopTimeoutMs;
  if (!(stopTimeoutMs >= 0)) throw new BerthInputError('stopTimeoutMs must be >= 0');
  if (!(defaultCeilingMs > 0)) throw new BerthInputError('defaultCeilingMs must be > 0');
  const statementTimeoutMs = options.statementTimeoutMs ?? d.statementTimeoutMs;
  if (!(statementTimeoutMs > 0)) throw new BerthInputError('statementTimeoutMs must be > 0');
  const maintenanceOption = options.maintenance ?? d.maintenance;
  const maintenance =
    maintenanceOption === false
      ? false
      : resolveMaintenanceOptions(maintenanceOption === true ? undefined : maintenanceOption);
  const heartbeatIntervalMs = options.heartbeatIntervalMs ?? d.heartbeatIntervalMs;
  if (heartbeatIntervalMs !== false && !(heartbeatIntervalMs > 0))
    throw new BerthInputError('heartbeatIntervalMs must be > 0 or false');
  // Each of these arms a Node timer (or, statement_timeout, a server setting of the same
  // limit): Node fires a delay past 2^31 - 1 ms after 1 ms instead, so a stop would not wait
  // for its handlers and a poll would spin. Refused, as stop()'s graceMs is.
  for (const [field, ms] of [
    ['leaseMarginMs', leaseMarginMs],
    ['pollIntervalMs', pollIntervalMs],
    ['stopTimeoutMs', stopTimeoutMs],
    ['statementTimeoutMs', statementTimeoutMs],
    ['heartbeatIntervalMs', heartbeatIntervalMs === false ? 0 : heartbeatIntervalMs],
  ] as const) {
    if (ms > MAX_TIMER_MS)
      throw new BerthInputError(`${field} must be at most ${MAX_TIMER_MS} ms (Node's timer limit), got ${ms}`);
  }
  const http = options.http === undefined ? null : resolveWorkerHttpOptions(options.http);
  const stuckGraceMs = options.stuckGraceMs ?? d.stuckGraceMs;
  if (typeof stuckGraceMs !== 'number' || !Number.isFinite(stuckGraceMs) || stuckGraceMs < 0) {
    throw new BerthInputError(`stuckGraceMs must be a finite number >= 0, got ${JSON.stringify(options.stuckGraceMs)}`);
  }
  const exitOn = options.exitOnStuckSlots;
  if (exitOn !== undefined && !(Number.isInteger(exitOn) && exitOn >= 1 && exitOn <= slots)) {
    throw new BerthInputError(
      `exitOnStuckSlots must be an integer from 1 to slots (${slots}), got ${JSON.stringify(exitOn)}`,
    );
  }
  const resultMaxBytes = options.resultMaxBytes ?? d.resultMaxBytes;
  if (!Number.isInteger(resultMaxBytes) || resultMaxBytes < 1 || resultMaxBytes > MAX_RESULT_MAX_BYTES) {
    throw new BerthInputError(
      `resultMaxBytes must be an integer from 1 to ${MAX_RESULT_MAX_BYTES} (16 MiB), got ${JSON.stringify(options.resultMaxBytes)}`,
    );
  }
  const defs = new Map<string, AnyTaskDefinition>();
  const ceilings = new Map<string, number>();
  const maxAttempts = new Map<string, number>();
  for (const def of options.tasks) {
    if (defs.has(def.type)) throw new BerthInputError(`task type "${def.type}" is defined twice`);
    defs.set(def.type, def);
    ceilings.set(def.type, def.ceilingMs);
    maxAttempts.set(def.type, def.maxAttempts);
  }
  const schedules = resolveSchedules(options.schedules, defs);
  if (schedules.length > 0 && heartbeatIntervalMs === false)
    throw new BerthInputError(
      'schedules need the heartbeat (heartbeatIntervalMs: false turns it off): it tells the leader which schedules a running worker declares',
    );
  if (options.scheduleClock !== undefined && typeof options.scheduleClock !== 'function')
    throw new BerthInputError('scheduleClock must be a function returning a Date');
  const queues = resolveQueues(options.queues, options.tasks);
  const workerId = options.workerId ?? `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  if (sessionDatabase === null && maintenance !== false)
    throw new BerthInputError(
      'sessionConnectionString: false needs maintenance: false: the maintenance leader holds a session lock, which a transaction-mode pooler cannot keep; run the leader in a process with a direct connection (docs/operations.md, "Connection poolers")',
    );
  return {
    database,
    readDatabase,
    preparedStatements: preparedStatements ?? 'detect',
    sessionDatabase,
    tasks: { defs, ceilings, maxAttempts, defaultMaxAttempts: DEFAULT_MAX_ATTEMPTS },
    slots,
    queues,
    unknownTypes: resolveUnknownTypeOptions(options.unknownTypes),
    schema: checkSchemaName(options.schema ?? d.schema, 'Worker'),
    leaseMarginMs,
    prefetch,
    pollIntervalMs,
    defaultCeilingMs,
    stopTimeoutMs,
    statementTimeoutMs,
    maintenance,
    logger: childLogger(options.logger ?? createLogger(), { worker: workerId }),
    metrics: options.metrics ?? new BerthMetrics(),
    workerId,
    listenReconnectBaseMs: options.listenReconnectBaseMs ?? d.listenReconnectBaseMs,
    heartbeatIntervalMs,
    http,
    stuckGraceMs,
    exitOnStuckSlots: exitOn ?? null,
    resultMaxBytes,
    schedules,
    scheduleClock: options.scheduleClock ?? null,
  };
}

/**
 * The session target: `sessionConnectionString` if given (a string), the primary when absent,
 * null for `false` (poll-only). A given one keeps named statements whatever
 * `preparedStatements` says: it is a direct or session-pooled connection, where they last.
 */
function resolveSessionDatabase(options: WorkerOptions, database: DatabaseTarget): DatabaseTarget | null {
  const session = options.sessionConnectionString;
  if (session === undefined) return database;
  if (session === false) return null;
  if (typeof session !== 'string')
    throw new BerthInputError(
      `sessionConnectionString must be a connection string or false, got ${JSON.stringify(session)}`,
    );
  return resolveDatabase(session, { field: 'sessionConnectionString', connectTimeoutMs: options.connectTimeoutMs });
}

/**
 * The queues a worker claims from: the ones it was given, else the ones its definitions name
 * (the default queue for a definition that names none), in definition order, once each; null
 * for `'all'` (docs/architecture.md, "Routing").
 */
function resolveQueues(
  queues: readonly string[] | 'all' | undefined,
  tasks: readonly AnyTaskDefinition[],
): readonly string[] | null {
  if (queues === 'all') return null;
  if (queues === undefined) return [...new Set(tasks.map((d) => d.queue ?? DEFAULT_QUEUE))];
  if (!Array.isArray(queues)) {
    throw new BerthInputError(`queues must be an array of queue names or 'all', got ${JSON.stringify(queues)}`);
  }
  return queues.map((q, i) => checkText(q, `queues[${i}]`, '', { maxBytes: MAX_QUEUE_BYTES }));
}
