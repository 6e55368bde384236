import type pg from 'pg';
import { storageFor, type Storage } from '../storage/storage.js';
import { BerthInputError } from '../errors.js';
import { checkKeys } from '../limits.js';
import { createLogger, type Logger } from '../logger.js';
import { promoteDue } from '../maintenance/promote.js';
import type { BerthMetrics, Outcome } from '../metrics/catalogue.js';
import { wakeChannel } from '../sql.js';
import { DEFAULT_BACKOFF, type AnyTaskDefinition } from '../task.js';
import { claimLimitedQueue } from '../processor/claim-limited.js';
import { queueFlags } from '../storage/keys.js';
import { promoteHeld } from '../storage/keys.js';
import { depsTick } from '../storage/deps.js';
import { claimBatch, discover, type ClaimedTask } from '../processor/claim.js';
import { settlementFor, type SettleAnswer, type Settlement, type TaskRun } from '../processor/outcome-table.js';
import { DeadlineTimer, RunAbort } from '../processor/run-abort.js';
import { runTask, type RunDeps } from '../processor/run-task.js';
import { ScheduleCeilings } from '../processor/schedule-ceilings.js';
import { settleTask, type SettleDeps } from '../processor/settle-task.js';
import { SettlementBatcher } from '../processor/settlement-batcher.js';
import { TypeMetrics } from '../processor/type-metrics.js';
import { TaskReports } from '../processor/task-reports.js';
import { UnknownTypes } from '../processor/unknown-types.js';
import { resolveWorkerOptions, type ResolvedWorkerOptions } from './worker-options.js';
import { resolveSchedules, type ScheduleDefinition } from '../schedule.js';
import { fireDueSchedules } from '../maintenance/scheduler.js';
import { declareSchedules } from './declare-schedules.js';
import { TypeRateGate } from '../processor/type-rate-gate.js';

export interface RunDueTasksOptions {
  /** The installation schema. `berth`. */
  schema?: string;
  /** Only claim from these queues, as the worker option. Default: as a Worker holding the same tasks. */
  queues?: readonly string[];
  /** Lease margin, as the worker option (lease = ceiling + margin). 30 s. */
  leaseMarginMs?: number;
  /** The ceiling for a claimed task of a type `tasks` does not define, as the worker option. 5 min. */
  defaultCeilingMs?: number;
  /** Recorded on every lease. Default: host:pid:random, as a worker's. */
  workerId?: string;
  /** The handlers' and the settlements' log lines. Default: none (level `silent`). */
  logger?: Logger;
  /** Counts each outcome on `berth_task_outcomes_total`, as a worker does. Default: a registry of its own. */
  metrics?: BerthMetrics;
  /**
   * Give up with an error after this many runs: a handler that enqueues itself again, or
   * continues forever, would otherwise never let the call return. 1000.
   */
  maxRuns?: number;
  /** The cap on a handler's result, as the worker option. 64 KiB. */
  resultMaxBytes?: number;
  /**
   * Schedules (`defineSchedule`) to declare, as a Worker holding them does at start, and fire
   * before the run: each instant due by `now` fires as the maintenance leader fires it (the
   * watermark, the misfire policy), and its task runs in this call.
   */
  schedules?: readonly ScheduleDefinition[];
  /** The time schedules are fired by (default: the database's clock). */
  now?: Date;
}

const OPTION_KEYS: ReadonlySet<string> = new Set<keyof RunDueTasksOptions>([
  'schema',
  'queues',
  'leaseMarginMs',
  'defaultCeilingMs',
  'workerId',
  'logger',
  'metrics',
  'maxRuns',
  'resultMaxBytes',
  'schedules',
  'now',
]);

export const DEFAULT_MAX_RUNS = 1000;

/**
 * What became of one run:
 * - `completed`: the handler finished and the completion was written;
 * - `retry`: it failed and waits out its backoff (`retryDelayMs`) as `retryable`;
 * - `dead`: it failed on its last attempt, or permanently (`PermanentError`, a payload its
 *   schema refuses), and is in the dead letters;
 * - `continued`: a slice returned `'continue'` (see `runSlices`): it is due again, and a later
 *   pass of the same call runs it;
 * - `snoozed`: the handler returned `snooze(ms)`: due again after the delay;
 * - `returned`: handed back without running, its attempt refunded: due now (the claim came
 *   back after its deadline), or after the unknown-type delay (its type has no definition in
 *   `tasks`; docs/architecture.md, *Routing*);
 * - `cancelled`: an operator's cancel settled the attempt first;
 * - `lost`: the fence refused the settlement (the lease was no longer this run's);
 * - `unsettled`: the settlement could not be written (the database failed).
 */
export type TaskRunStatus =
  | 'completed'
  | 'retry'
  | 'dead'
  | 'continued'
  | 'snoozed'
  | 'returned'
  | 'cancelled'
  | 'lost'
  | 'unsettled';

/** One run of one task by `runDueTasks`. */
export interface TaskRunReport {
  id: string;
  type: string;
  payload: unknown;
  queue: string;
  priority: number;
  /** This run's attempt (1 for the first). */
  attempt: number;
  /** The attempt limit it ran under. */
  maxAttempts: number;
  status: TaskRunStatus;
  /** The outcome a worker counts on `berth_task_outcomes_total` (`success`, `failure`, `timeout`, …); null when none is. */
  outcome: Outcome | null;
  /** What the handler threw (its message), or why the task could not run; null when nothing failed. */
  error: string | null;
  /** For `retry`: the backoff before it is due again. */
  retryDelayMs: number | null;
  /** For `completed`: what the handler returned, as stored (its JSON parsed); null when it stored none. */
  result: unknown;
}

/**
 * Run every task that is due now with the given definitions, one at a time, and say what became
 * of each: a test's "drain the queue". Each task goes the way a Worker's does: discovery, the
 * one-statement claim (lease, token, attempt), the handler under its deadline and signal, and
 * the fenced settlement the outcome table chooses (complete, fail with backoff or to the dead
 * letters, release), so attempts, retries, dead letters and dedupe keys end as in production.
 *
 * Before it stops it promotes what has become due in deferred storage (a retry with no backoff
 * left, a task scheduled in the past), so a task is run as often as it is due again within the
 * call: a handler's follow-up tasks, a slice that continues, a failure whose backoff is 0. A
 * retry waiting out a real backoff is not due, and is reported once as `retry`.
 *
 * It claims as a Worker holding `tasks` would (the same queues; what a worker does with a task
 * type it has no definition for, this does too). A running Worker on the same schema competes
 * for the same tasks: stop it first. Writes go through `pool` and commit: run it against a test
 * database (a schema of the test's own).
 */
export async function runDueTasks(
  pool: pg.Pool,
  tasks: readonly AnyTaskDefinition[],
  options: RunDueTasksOptions = {},
): Promise<TaskRunReport[]> {
  checkKeys(options, OPTION_KEYS, 'runDueTasks');
  const maxRuns = options.maxRuns ?? DEFAULT_MAX_RUNS;
  if (!Number.isInteger(maxRuns) || maxRuns < 1) {
    throw new BerthInputError(`runDueTasks: maxRuns must be an integer >= 1, got ${JSON.stringify(options.maxRuns)}`);
  }
  const o = resolveWorkerOptions({
    // Checked and resolved exactly as a Worker's options, so the claim sees the same ceilings,
    // attempt limits and queues. The connection string is never used: every statement runs on
    // the caller's pool.
    connectionString: 'postgres://runDueTasks.invalid/',
    tasks,
    schema: options.schema,
    queues: options.queues,
    leaseMarginMs: options.leaseMarginMs,
    defaultCeilingMs: options.defaultCeilingMs,
    workerId: options.workerId,
    logger: options.logger ?? createLogger({}, undefined, 'silent'),
    resultMaxBytes: options.resultMaxBytes,
    metrics: options.metrics,
    maintenance: false,
    heartbeatIntervalMs: false,
  });
  const schedules = resolveSchedules(options.schedules, o.tasks.defs);
  const now = options.now;
  if (now !== undefined && !(now instanceof Date && !Number.isNaN(now.getTime())))
    throw new BerthInputError('runDueTasks: now must be a valid Date');
  if (schedules.length > 0) {
    await declareSchedules(pool, o.schema, schedules, o.tasks.defs, o.workerId, o.logger);
    await fireDueSchedules(pool, storageFor(o.schema), {
      metrics: o.metrics,
      logger: o.logger,
      clock: now === undefined ? undefined : () => now,
    });
  }
  const runner = new OnceRunner(pool, o);
  const reports: TaskRunReport[] = [];
  try {
    for (;;) {
      const task = await runner.claimNext();
      if (task === null) {
        // Nothing claimable: what became due in deferred storage meanwhile is the last source.
        if ((await promoteDue(pool, o.schema)) > 0) continue;
        // Then keyed tasks held for their keys: each run settled before the next claim, so a
        // key's next task is admitted here as the leader would admit it.
        if ((await promoteHeld(pool, storageFor(o.schema), null)).admitted > 0) continue;
        // Then dependents whose parents' fate only the leader's deps branch reads (a parent of an
        // earlier call, keyed, moved, dequeued, dead or cancelled): released or cancelled here,
        // as the leader would within a tick.
        if ((await resolveWatchedDependencies(pool, storageFor(o.schema))) > 0) continue;
        return reports;
      }
      if (reports.length >= maxRuns) {
        // Claimed but not run: hand it back, so the queue is left as it was found.
        await runner.handBack(task);
        throw new Error(
          `runDueTasks: tasks were still due after ${maxRuns} runs (a handler that enqueues itself, or continues forever?); raise maxRuns if this is expected`,
        );
      }
      reports.push(await runner.run(task));
    }
  } finally {
    await runner.drain();
  }
}

/** One pass of the leader's deps branch over every watched edge: how many dependents it released or cancelled. */
async function resolveWatchedDependencies(pool: pg.Pool, storage: Storage): Promise<number> {
  let changed = 0;
  let after: string | null = null;
  do {
    const r = await depsTick(pool, storage, { all: false, after, limit: 2000 });
    changed += r.released + r.cancelled;
    after = r.lastParent;
  } while (after !== null);
  return changed;
}

/** The engine's parts for one task at a time: discovery, claim, run, settle. */
class OnceRunner {
  private readonly batcher: SettlementBatcher;
  private readonly storage: Storage;
  private readonly runDeps: RunDeps;
  private readonly settleDeps: SettleDeps;
  private readonly channel: string;

  constructor(
    private readonly pool: pg.Pool,
    private readonly o: ResolvedWorkerOptions,
  ) {
    const storage = storageFor(o.schema);
    this.storage = storage;
    this.batcher = new SettlementBatcher(pool, storage, o.metrics, o.logger);
    this.channel = wakeChannel(o.schema);
    const reports = new TaskReports(new TypeMetrics(o.metrics), null, o.logger);
    this.runDeps = {
      write: pool,
      storage,
      workerId: o.workerId,
      deadlines: new DeadlineTimer(),
      reports,
      unknownTypes: new UnknownTypes(o.unknownTypes, o.metrics, o.logger, o.workerId),
      resultMaxBytes: o.resultMaxBytes,
      ceilings: o.tasks.ceilings,
      defaultCeilingMs: o.defaultCeilingMs,
      scheduleCeilings: new ScheduleCeilings(pool, storage),
      // The rate-limited types are read with the limited queues, at every claimNext.
      typeRates: new TypeRateGate(pool, storage, o.logger, o.metrics),
    };
    this.settleDeps = {
      write: pool,
      storage,
      batcher: this.batcher,
      reports,
      workerId: o.workerId,
    };
  }

  /**
   * The oldest due task (priority, then due time), leased to this run; null when none is
   * claimable. A limited queue's tasks are claimed through its limited claim, after the others,
   * and only while its limits leave room (a rate limit's window is not waited out). A task of a
   * rate-limited type asks for its start as a worker's does (runTask), and is handed back when refused.
   */
  async claimNext(): Promise<ClaimedTask | null> {
    const o = this.o;
    const terms = {
      storage: this.storage,
      ceilings: o.tasks.ceilings,
      maxAttempts: o.tasks.maxAttempts,
      defaultMaxAttempts: o.tasks.defaultMaxAttempts,
      defaultCeilingMs: o.defaultCeilingMs,
      marginMs: o.leaseMarginMs,
      workerId: o.workerId,
      wakeChannel: this.channel,
    };
    const flags = await queueFlags(this.pool, this.storage);
    this.runDeps.typeRates.setTypes(flags.rateTypes);
    const lanes = [...new Set((await discover(this.pool, this.storage, o.queues, 20, 1)).map((c) => c.laneId))];
    if (lanes.length > 0) {
      const { tasks } = await claimBatch(this.pool, { ...terms, laneIds: lanes, limit: 1, queues: o.queues });
      // Empty although discovery saw due lanes: another claimer holds them (a running worker).
      if (tasks[0] !== undefined) return tasks[0];
    }
    for (const queue of flags.limited) {
      if (o.queues !== null && !o.queues.includes(queue)) continue;
      const { tasks } = await claimLimitedQueue(this.pool, terms, queue, 1);
      if (tasks[0] !== undefined) return tasks[0];
    }
    return null;
  }

  async run(task: ClaimedTask): Promise<TaskRunReport> {
    const def = this.o.tasks.defs.get(task.type);
    const log = this.o.logger.child({ task_id: task.id, task_type: task.type, attempt: task.attempt });
    const abort = new RunAbort(task.leaseExpiresAt - this.o.leaseMarginMs);
    const run = await runTask(this.runDeps, {
      task,
      def,
      receivedAt: Date.now(),
      abort,
      log,
      freeSlot: () => {},
      hooks: null,
    });
    const settlement = settlementFor(run, { attempt: task.attempt, backoff: def?.backoff ?? DEFAULT_BACKOFF });
    const answer = await settleTask(this.settleDeps, task, run, settlement, log);
    return report(task, run, settlement, answer);
  }

  /** A claimed task that will not run: back due now, its attempt refunded (the engine's stop path). */
  async handBack(task: ClaimedTask): Promise<void> {
    const run: TaskRun = { kind: 'expired_in_buffer' };
    const settlement = settlementFor(run, { attempt: task.attempt, backoff: DEFAULT_BACKOFF });
    await settleTask(this.settleDeps, task, run, settlement, this.o.logger);
  }

  drain(): Promise<void> {
    return this.batcher.drain();
  }
}

function report(task: ClaimedTask, run: TaskRun, settlement: Settlement, answer: SettleAnswer): TaskRunReport {
  const action = settlement.action;
  let status: TaskRunStatus;
  if (run.kind === 'continue' && run.advanced)
    status = 'continued'; // AdvanceCursor already settled it
  else if (answer.kind === 'refused') status = 'lost';
  else if (answer.kind === 'cancelled')
    status = 'cancelled'; // an operator's cancel settled it first
  else if (answer.kind === 'unwritten') status = 'unsettled';
  else if (action.kind === 'complete') status = 'completed';
  else if (answer.dead) status = 'dead';
  else if (action.kind === 'fail') status = 'retry';
  else if (action.kind === 'release' && action.reason === 'continue') status = 'continued';
  else if (action.kind === 'snooze') status = 'snoozed';
  else status = 'returned';
  let error: string | null = 'error' in run ? run.error : run.kind === 'rate_limited' ? run.note : null;
  if (status === 'dead' && action.kind === 'release') error = action.finalError;
  return {
    id: task.id,
    type: task.type,
    payload: task.payload,
    queue: task.queue,
    priority: task.priority,
    attempt: task.attempt,
    maxAttempts: task.maxAttempts,
    status,
    outcome: settlement.outcome[answer.kind],
    error,
    retryDelayMs: status === 'retry' && action.kind === 'fail' ? action.delayMs : null,
    result:
      status === 'completed' && action.kind === 'complete' && action.result !== undefined
        ? JSON.parse(action.result)
        : null,
  };
}
