import type pg from 'pg';
import { storageFor } from '../storage/storage.js';
import { prepareSettlement } from '../processor/prepare-settlement.js';
import { BerthInputError } from '../errors.js';
import { checkKeys, checkMs, MAX_TIMER_MS } from '../limits.js';
import { sessionName, type DatabaseTarget } from '../db/connections.js';
import { childLogger, type Logger } from '../logger.js';
import { laneLabel } from '../lane.js';
import { Maintenance } from '../maintenance/leader.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import { wakeChannel } from '../sql.js';
import { StatementNaming } from '../db/prepared.js';
import { assertMigrated } from '../schema/migrate.js';
import { startWorkerHttp } from '../dashboard/worker-http.js';
import type { Listening } from '../http/listen.js';
import type { ClaimedTask } from '../processor/claim.js';
import { Engine } from '../processor/engine.js';
import { Heartbeat, OutcomeTally } from '../processor/heartbeat.js';
import { SettlementBatcher } from '../processor/settlement-batcher.js';
import { STUCK_EXIT_CODE } from '../processor/stuck.js';
import { WorkerEvents } from '../processor/task-events.js';
import { TaskObserver } from '../processor/task-observer.js';
import { WakeListener } from '../processor/wake.js';
import { resolveWorkerOptions, type ResolvedWorkerOptions, type WorkerOptions } from './worker-options.js';
import { onStopSignals, resolveSignalOptions, type StopOnSignalsOptions } from './signals.js';
import { declareSchedules } from './declare-schedules.js';
import { keepRowShapesOf } from '../util/shape-anchor.js';
import { anchorEngineShapes } from './engine-donor.js';
import { workerPool } from './worker-pools.js';

export { WORKER_DEFAULTS, type WorkerOptions } from './worker-options.js';
export { SESSION_OPTIONS } from './worker-pools.js';
export type { StopOnSignalsOptions } from './signals.js';

/** `worker.stop(options)`. */
export interface StopOptions {
  /**
   * How long running handlers may go on before they are aborted (ms, default 0: at once). The
   * CLI's `--grace` (default 15 s on SIGTERM/SIGINT) sets it; see docs/operations.md for sizing
   * it against a platform's termination timeout.
   */
  graceMs?: number;
}

const STOP_KEYS: ReadonlySet<string> = new Set(['graceMs']);

function stopGraceMs(options: StopOptions): number {
  if (typeof options !== 'object' || options === null) throw new BerthInputError('stop options must be an object');
  checkKeys(options, STOP_KEYS, 'stop options');
  return checkMs(options.graceMs ?? 0, 'graceMs', 'stop options', 0, MAX_TIMER_MS, " (Node's timer limit)");
}

/** What SESSION_OPTIONS sets, as `pg_settings` reports it once applied. */
const EXPECTED_SETTINGS: Readonly<Record<string, string>> = {
  jit: 'off',
  plan_cache_mode: 'force_generic_plan',
  enable_bitmapscan: 'off',
  enable_seqscan: 'off',
  default_transaction_isolation: 'read committed',
};

/**
 * A pooler that drops berth's startup parameters (PgBouncer with them in
 * `ignore_startup_parameters`; every transaction-mode pooler, whose server sessions are opened
 * by the pooler) leaves the worker's sessions with the role's settings: the claim may then be
 * JIT-compiled (~1 s a statement), and a runaway statement is never cancelled. Nothing fails,
 * so say so once at start, with the settings to put on the role instead. Never fails start:
 * a database fault here is the first claim's to report.
 */
async function warnOnDroppedSettings(pool: pg.Pool, statementTimeoutMs: number, logger: Logger): Promise<void> {
  // pg sends statement_timeout as a whole number of ms; pg_settings reports it in ms too.
  const expected: Record<string, string> = {
    ...EXPECTED_SETTINGS,
    statement_timeout: String(Number.parseInt(String(statementTimeoutMs), 10)),
  };
  let rows: { name: string; setting: string }[];
  try {
    rows = (
      await pool.query<{ name: string; setting: string }>(
        'SELECT name, setting FROM pg_catalog.pg_settings WHERE name = ANY($1::text[])',
        [Object.keys(expected)],
      )
    ).rows;
  } catch {
    return;
  }
  const actual = new Map(rows.map((r) => [r.name, r.setting]));
  const differ = Object.entries(expected).filter(([name, want]) => actual.get(name) !== want);
  if (differ.length === 0) return;
  logger.warn(
    {
      expected: Object.fromEntries(differ),
      actual: Object.fromEntries(differ.map(([name]) => [name, actual.get(name) ?? null])),
      fix: differ.map(([name, want]) => `ALTER ROLE current_user SET ${name} = '${want}'`),
    },
    'the worker\'s session settings did not take effect (a connection pooler dropped its startup parameters?): set them on the worker\'s role (docs/operations.md, "Connection poolers")',
  );
}

/** Everything start() builds, so stop() takes down exactly what exists. */
interface Running {
  write: pg.Pool;
  /** The fetcher's session (discovery too, unless a replica is configured). */
  claims: pg.Pool;
  /** The settlement batcher's session. */
  settlements: pg.Pool;
  /** The read replica's pool (`readConnectionString`), or null. */
  read: pg.Pool | null;
  /** The maintenance leader's pool on `sessionConnectionString`, when that is given. */
  leaderPool: pg.Pool | null;
  http: Listening | null;
  /** null: poll-only (`sessionConnectionString: false`). */
  listener: WakeListener | null;
  maintenance: Maintenance | null;
  heartbeat: Heartbeat | null;
  engine: Engine;
}

/**
 * The task processor's process: the composition root. It resolves its options once (at
 * construction, so a bad one fails before anything starts), and start() builds the process
 * around the engine that runs tasks (processor/engine.ts): pools, the LISTEN session, the
 * opt-in HTTP server, the maintenance candidate and the heartbeat. stop() takes them down in
 * order: the engine first (no new claims, handlers aborted, leases released, settlements
 * written), then HTTP, heartbeat, maintenance, LISTEN and the pools.
 */
export class Worker {
  readonly id: string;
  readonly metrics: BerthMetrics;
  readonly logger: Logger;
  /**
   * What happens in this worker, as typed events: tasks started and settled (completed, failed,
   * retrying, dead, cancelled, continued, lease lost, unsettled), the worker started and stopped,
   * leadership gained and lost. `worker.events.on('task:completed', (e) => ...)`; docs/api.md,
   * "Events". Listeners run synchronously and must not block; their throws are logged.
   */
  readonly events: WorkerEvents;
  private readonly o: ResolvedWorkerOptions;
  private readonly channel: string;
  private readonly startedAt = new Date();
  private starting: Promise<void> | null = null;
  private running: Running | null = null;
  private stopping: Promise<void> | null = null;

  constructor(options: WorkerOptions) {
    this.o = resolveWorkerOptions(options);
    this.id = this.o.workerId;
    this.metrics = this.o.metrics;
    this.logger = this.o.logger;
    this.events = new WorkerEvents(this.logger);
    this.channel = wakeChannel(this.o.schema);
  }

  /** The queues this worker claims from (null: every queue); see the `queues` option. */
  get queues(): readonly string[] | null {
    return this.o.queues;
  }

  get activeSlots(): number {
    return this.running?.engine.activeSlots ?? 0;
  }

  /** The `http` server's address (`http://host:port`, the bound port), once started. */
  get httpUrl(): string | null {
    return this.running?.http?.url ?? null;
  }

  get isLeader(): boolean {
    return this.running?.maintenance?.isLeader ?? false;
  }

  /** Maintenance branch statistics of this process (empty unless it has led). */
  maintenanceStats(): ReturnType<Maintenance['stats']> {
    return this.running?.maintenance?.stats() ?? {};
  }

  async start(): Promise<void> {
    if (this.starting !== null) throw new Error('worker already started');
    this.starting = this.build();
    try {
      await this.starting;
    } catch (err) {
      // Nothing is left running: the caller can fix the cause (the address, the schema) and retry.
      this.starting = null;
      throw err;
    }
  }

  private async build(): Promise<void> {
    const o = this.o;
    // Unless told, the worker finds out whether its server keeps prepared statements: every
    // client of its pools (not LISTEN's and the election's, which name none) shares one answer.
    const naming =
      o.preparedStatements === 'detect'
        ? new StatementNaming((err) => {
            this.logger.warn(
              { err: err.message },
              'the server does not keep prepared statements from one transaction to the next (a transaction-mode pooler?): this worker sends its statements unnamed from now on; set preparedStatements: false to start that way (docs/operations.md, "Connection poolers")',
            );
            // The same evidence says more when LISTEN and the election share that connection:
            // their session state does not survive either (wake-ups lost, two leaders), and
            // unnamed statements do not fix that. Said once, with the detection.
            if (o.sessionDatabase === o.database)
              this.logger.error(
                { listen: true, maintenance: o.maintenance !== false },
                'this worker\'s LISTEN session and maintenance election run through the same connection, which does not keep session state: wake-ups can be lost and two workers can both lead; set sessionConnectionString to a direct connection, or false with maintenance: false (docs/operations.md, "Connection poolers")',
              );
          })
        : undefined;
    const primary: DatabaseTarget = naming ? { ...o.database, naming } : o.database;
    const replica: DatabaseTarget | null = naming && o.readDatabase ? { ...o.readDatabase, naming } : o.readDatabase;
    const pool = (target: DatabaseTarget, max: number, kind: 'write' | 'read', idleTimeoutMillis?: number) =>
      workerPool(o, this.id, this.logger, target, max, kind, idleTimeoutMillis);
    // The fetcher and the settlement batcher each run one statement at a time, so each has a
    // session of its own (a pool of one, kept open: 0 = never closed for idleness). In the shared
    // pool a claim and a flush took whichever connection was free, and every connection of it
    // prepared (planned, and loaded the catalog entries of) every hot statement: at the start of a
    // drain four sessions each spent 10-20 ms on their first claim and first completion while the
    // tasks waited (docs/benchmarks-journal.md, "Worker start"). The shared pool keeps everything else
    // (the leader, the heartbeat, releases and hand-backs, the handlers' own writes) at its size:
    // shrunk by these two, releases waited behind a busy leader (events.test.ts saw a task's
    // second attempt settle before its first). A worker may hold two connections more.
    const claims = pool(primary, 1, 'write', 0);
    const settlements = pool(primary, 1, 'write', 0);
    const write = pool(primary, Math.max(4, Math.ceil(o.slots / 2) + 4), 'write');
    // Their results are berth's alone: the claims' and the completion's rows may be kept for
    // their V8 shape (util/shape-anchor.ts).
    keepRowShapesOf(claims);
    keepRowShapesOf(settlements);
    const opened: pg.Pool[] = [claims, settlements, write];
    const closeAll = async () => {
      for (const p of opened) await p.end();
    };
    try {
      // On the fetcher's session: the connection it opens is the one the first claim runs on.
      await assertMigrated(claims, o.schema);
    } catch (err) {
      await closeAll();
      throw err;
    }
    try {
      // Before anything runs: a schedule the database refuses fails start, as a bad option would.
      await declareSchedules(write, o.schema, o.schedules, o.tasks.defs, this.id, this.logger);
    } catch (err) {
      await closeAll();
      throw err;
    }
    // Opened lazily by the first discovery: a replica that is down does not fail start().
    const read = replica ? pool(replica, 2, 'read') : null;
    if (read !== null) opened.push(read);
    let http: Listening | null = null;
    if (o.http) {
      try {
        http = await startWorkerHttp(o.http, {
          database: primary,
          schema: o.schema,
          registry: this.metrics.registry,
          logger: childLogger(this.logger, { component: 'http' }),
          applicationName: sessionName('dashboard', this.id),
        });
      } catch (err) {
        // Nothing else has started yet: close the pools so the caller can fix the address and retry.
        await closeAll();
        throw err;
      }
    }
    const tally = o.heartbeatIntervalMs === false ? null : new OutcomeTally();
    const session = o.sessionDatabase;
    // With a sessionConnectionString of its own (a direct connection beside a pooler), the
    // leader's work runs there too, not only its election: behind a pooler its promotion waiter
    // could not cancel its statement (the pid a pooler reports is not the server's), and its
    // ring reads keep their prepared statements. Opened only while leading (pg pools connect on
    // demand and close idle connections after 10 s).
    const leaderPool =
      session !== null && session !== o.database && o.maintenance !== false
        ? pool(session, Math.max(4, Math.ceil(o.slots / 2) + 4), 'write')
        : null;
    if (leaderPool !== null) opened.push(leaderPool);
    const listener =
      session === null
        ? null
        : new WakeListener({
            database: session,
            channel: this.channel,
            logger: this.logger,
            // Producers and promotion name the lane they appended to: the engine claims there first.
            onNotify: (payload) => {
              if (payload === 'keys') maintenance?.noteKeys();
              else if (payload === 'deps') maintenance?.noteDeps();
              else engine.notify(payload);
            },
            onReconnect: () => {
              this.metrics.listenReconnects.inc();
              // The database is back: a fetch loop sleeping out its error backoff retries now.
              engine.databaseBack();
            },
            applicationName: sessionName('listen', this.id),
            reconnectBaseMs: o.listenReconnectBaseMs,
          });
    const engine = new Engine({
      options: o,
      write,
      claims,
      replica: read === null || o.readDatabase === null ? null : { pool: read, where: o.readDatabase.where },
      batcher: new SettlementBatcher(settlements, storageFor(o.schema), this.metrics, this.logger),
      logger: this.logger,
      metrics: this.metrics,
      wakeChannel: this.channel,
      tally,
      onClaimsRecovered: () => listener?.reconnectNow(),
      onTooManyStuck: (stuck) => void this.exitForStuckSlots(stuck),
      observer: new TaskObserver(this.events, this.id),
    });
    const maintenance =
      o.maintenance === false || session === null
        ? null
        : new Maintenance({
            // The election session: its lock is session-level (sessionConnectionString).
            connectionString: session.connectionString,
            // Resolved already (option, URL, PGCONNECT_TIMEOUT or the default): passed as is.
            connectTimeoutMs: session.connectTimeoutMs,
            schema: o.schema,
            pool: leaderPool ?? write,
            logger: childLogger(this.logger, { component: 'maintenance' }),
            metrics: this.metrics,
            options: o.maintenance,
            workerId: this.id,
            onLeadership: (leader) => this.events.emit(leader ? 'leader:gained' : 'leader:lost', { workerId: this.id }),
            ...(o.scheduleClock === null ? {} : { scheduleClock: o.scheduleClock }),
          });
    const heartbeat =
      tally === null || o.heartbeatIntervalMs === false
        ? null
        : new Heartbeat(
            write,
            storageFor(o.schema),
            {
              workerId: this.id,
              queues: o.queues,
              schedules: o.schedules.map((d) => d.name),
              slots: o.slots,
              startedAt: this.startedAt,
              busy: () => engine.activeSlots,
              prefetched: () => engine.buffered,
              leader: () => this.isLeader,
              maintenance: () =>
                maintenance?.isLeader
                  ? {
                      branches: maintenance.stats(),
                      waitingLanes: maintenance.waitingLanes(),
                      contention: maintenance.contention(),
                    }
                  : {},
            },
            childLogger(this.logger, { component: 'heartbeat' }),
            o.heartbeatIntervalMs,
            tally,
          );
    try {
      // The fetcher's session prepares its first statements while the LISTEN session connects:
      // a new session's first ring-window read and discovery plan and load the ring's catalog
      // entries (~20 ms on the 2-core development machine), which the first claim otherwise waits
      // for, and plan the pickup's claim; the settlement session connects and plans the
      // completion, rather than when the first task is done (both on leases that cannot exist:
      // nothing is claimed or written). Nothing read here is kept: the first fetch reads the
      // window after LISTEN is up. Neither step fails start(): a database fault there is the
      // first fetch's or flush's to report.
      // Meanwhile the shared pool checks that the session settings took effect (a pooler).
      await Promise.all([
        listener?.start(),
        engine.prepare(),
        prepareSettlement(settlements, storageFor(o.schema)),
        warnOnDroppedSettings(write, o.statementTimeoutMs, this.logger),
      ]);
    } catch (err) {
      await http?.close();
      await closeAll();
      throw err;
    }
    this.running = { write, claims, settlements, read, leaderPool, http, listener, maintenance, heartbeat, engine };
    // The engine first: its first fetch is what a waiting backlog waits for.
    engine.start();
    maintenance?.start();
    heartbeat?.start();
    const types = [...o.tasks.defs.keys()];
    this.logger.info({ slots: o.slots, schema: o.schema, types }, 'worker started');
    this.events.emit('worker:started', { workerId: this.id, slots: o.slots, queues: o.queues, types });
  }

  /**
   * Stop on SIGTERM and SIGINT, as `berth worker` does: the first signal stops the worker with
   * `graceMs` (default 15 s) for running handlers; a second one skips what is left of the grace
   * (handlers aborted now, their leases released, so their tasks run again at once elsewhere); a
   * third exits the process at once (code 130). A signal within a second of the previous one is
   * the same request relayed by npm, tsx or the terminal, and is ignored. Resolves when the worker
   * has stopped after a signal (close your own pools then); it stops listening once the worker
   * stops, however it was stopped, so the process can exit.
   */
  stopOnSignals(options: StopOnSignalsOptions = {}): Promise<void> {
    const { graceMs, signals } = resolveSignalOptions(options);
    const { stopped, dispose } = onStopSignals(
      signals,
      () => this.stop({ graceMs }),
      () => {
        this.logger.warn('second signal: aborting running handlers now (a third exits at once)');
        void this.stop();
      },
    );
    this.events.once('worker:stopped', dispose);
    return stopped;
  }

  /** For tests: the LISTEN session's backend pid. */
  listenerBackendPid(): Promise<number | null> {
    return this.running?.listener?.backendPid() ?? Promise.resolve(null);
  }

  /**
   * Graceful stop: claiming stops at once and prefetched tasks are handed back; in-flight
   * handlers may finish within `graceMs` (default 0), then the ones still running are aborted
   * and their leases released (recorded as cancelled, or continued if they saved progress; the
   * attempt is not refunded); every settlement already handed off is written; then maintenance
   * stops and the pools close. A second call while a stop runs ends its grace period at once
   * and resolves when that stop is done.
   */
  async stop(options: StopOptions = {}): Promise<void> {
    const graceMs = stopGraceMs(options);
    await this.starting?.catch(() => undefined);
    const running = this.running;
    if (!running) return;
    if (this.stopping !== null) {
      running.engine.skipGrace();
      return this.stopping;
    }
    this.stopping = this.stopAll(running, graceMs);
    return this.stopping;
  }

  private async stopAll(running: Running, graceMs: number): Promise<void> {
    await running.engine.stop(graceMs);
    await running.http?.close();
    await running.heartbeat?.stop();
    await running.maintenance?.stop();
    await running.leaderPool?.end();
    await running.listener?.stop();
    await running.read?.end();
    await running.claims.end();
    await running.settlements.end();
    await running.write.end();
    // Once per process, while this worker's objects are still alive: the shapes of an engine's
    // own objects then outlive it, for the next worker in this process (engine-donor.ts). Not on
    // start's path: a new process's first drain would wait for it.
    anchorEngineShapes();
    this.logger.info('worker stopped');
    this.events.emit('worker:stopped', { workerId: this.id });
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
        stuck: stuck.map((t) => ({ task_id: t.id, task_type: t.type, lane: laneLabel(t), attempt: t.attempt })),
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
