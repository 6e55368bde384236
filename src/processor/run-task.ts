import type { Storage } from '../storage/storage.js';
import { CancelAbort, DeadlineAbort, isPermanentError, ShutdownAbort } from '../errors.js';
import type { Logger } from '../logger.js';
import type { Queryable } from '../sql.js';
import { fireOfDedupeKey } from '../schedule.js';
import {
  checkPayload,
  type TaskContext,
  type AnyTaskDefinition,
  type PayloadCheck,
  type ScheduleFire,
  type ParentResult,
} from '../task.js';
import type { ClaimedTask } from './claim.js';
import { type HandlerReturn, readHandlerReturn } from './handler-result.js';
import type { Lane } from '../lane.js';
import type { TaskRun } from './outcome-table.js';
import type { TaskReports } from './task-reports.js';
import type { DeadlineTimer, RunAbort } from './run-abort.js';
import { advanceCursor as advanceCursorIn } from '../storage/return.js';
import { dequeueIn } from '../storage/complete.js';
import { parentsOf, watchParents } from '../storage/deps.js';
import type { UnknownTypes } from './unknown-types.js';
import type { ScheduleCeilings } from './schedule-ceilings.js';
import type { TypeRateGate } from './type-rate-gate.js';
import type { ScheduleCeilingRow } from '../storage/schedules.js';
import { errorDetail, errorMessage } from '../util/error-detail.js';

/** What running one task needs from the engine (one value, built once). */
export interface RunDeps {
  write: Queryable;
  storage: Storage;
  workerId: string;
  /** Aborts a running handler at its deadline. */
  deadlines: DeadlineTimer;
  /** Records a started handler's run time (the engine's per-type histogram). */
  reports: TaskReports;
  /** Types this worker has no definition for: their delay, metric and log line. */
  unknownTypes: UnknownTypes;
  /** The cap on a handler's result, as JSON in UTF-8 bytes (the worker's `resultMaxBytes`). */
  resultMaxBytes: number;
  /** The ceilings this worker's claims stamp leases with, per type, and for a type it does not define. */
  ceilings: ReadonlyMap<string, number>;
  defaultCeilingMs: number;
  /** The stored ceilings of schedules, read for a schedule's task only (schedule-ceilings.ts). */
  scheduleCeilings: ScheduleCeilings;
  /** Fleet-wide rate limits of task types: a start of a limited type is asked for first. */
  typeRates: TypeRateGate;
}

export interface RunInput {
  task: ClaimedTask;
  def: AnyTaskDefinition | undefined;
  /** When the claim handed this task to the process (epoch ms). */
  receivedAt: number;
  /** The run's deadline (the lease's own expiry stamp minus the margin) and its abort. */
  abort: RunAbort;
  log: Logger;
  /**
   * Gives the slot back: called as soon as no handler runs for this task any more. A method (the
   * engine's input is an object of a class): always called on the input, never detached from it.
   */
  freeSlot(): void;
  /** Told when the handler starts and returns (events, the span: processor/task-observer.ts); null: nobody asks. */
  hooks: HandlerHooks | null;
}

/** What the observer of an attempt hears of its handler. */
export interface HandlerHooks {
  handlerStarted(): void;
  handlerEnded(): void;
}

/** A context's run (its HandlerRun), for the context's accessors: a symbol, so no key a handler sees. */
const RUN = Symbol('berth.handlerRun');

/**
 * A run an operator's cancel reached before its handler started: settled as a cancelled run is
 * (outcome-table.ts: nothing written, counted cancelled), no handler time.
 */
const CANCELLED_UNSTARTED: TaskRun = Object.freeze({
  kind: 'done',
  ms: 0,
  advanced: false,
  dequeued: false,
  shutdown: false,
  pastDeadline: false,
  cancelled: true,
});

/** A run a stop aborted before its handler started: handed back unstarted (outcome-table.ts). */
const STOPPED_BEFORE_START: TaskRun = Object.freeze({ kind: 'stopped_before_start' });

type WithRun = { [RUN]: HandlerRun };

/**
 * `ctx.signal`: an own, enumerable property (a handler may spread its context), read through a
 * getter so the signal is made only when the handler reads it (run-abort.ts). One descriptor for
 * every context: a getter written in the object literal, or a descriptor per context, cost
 * ~0.6 µs a task against ~0.17 µs for this (measured on Node 20, a million contexts).
 */
const SIGNAL: PropertyDescriptor & ThisType<WithRun> = {
  get() {
    return this[RUN].signal();
  },
  enumerable: true,
  configurable: true,
};

/**
 * The context's other lazy parts, as `signal` is: `deadline` (its Date) and the three methods
 * (`advanceCursor`, `dequeue`, `parents`), each made on its first read and the same value on every
 * read after it; most handlers read none of them. Own enumerable accessors, so a spread context
 * (`{ ...ctx }`) and a destructured one (`const { dequeue } = ctx`) get working values, and
 * `Object.keys(ctx)` is what it was. Made eagerly, the Date, the three closures and their
 * context were ~360 B of the ~2.85 KB a warm drain allocated per task (docs/benchmarks-journal.md).
 * A setter makes an assigned value a plain data property of that context, as the data property
 * it was (a method's type is not readonly, so `ctx.dequeue = …` type-checks).
 */
function lazy<K extends 'deadline' | 'advanceCursor' | 'dequeue' | 'parents'>(
  key: K,
  make: (run: HandlerRun) => unknown,
): PropertyDescriptor & ThisType<WithRun> {
  return {
    get() {
      return make(this[RUN]);
    },
    set(value: unknown) {
      Object.defineProperty(this, key, { value, writable: true, enumerable: true, configurable: true });
    },
    enumerable: true,
    configurable: true,
  };
}
const DEADLINE = lazy('deadline', (run) => run.deadlineDate());
const ADVANCE_CURSOR = lazy('advanceCursor', (run) => run.advanceCursorFn());
const DEQUEUE = lazy('dequeue', (run) => run.dequeueFn());
const PARENTS = lazy('parents', (run) => run.parentsFn());

/** What a context made on first read (HandlerRun.made), one object for all of them. */
interface MadeParts {
  deadline?: Date;
  advanceCursor?: (next: unknown) => Promise<boolean>;
  dequeue?: (executor: Queryable) => Promise<void>;
  parents?: () => Promise<ReadonlyMap<string, ParentResult>>;
  parentsRead?: Promise<ReadonlyMap<string, ParentResult>>;
}

/**
 * `ctx.lane`, one frozen object per lane rather than one per task (~50 B a task): by lane id,
 * checked against the task's own queue, priority and shard (ids are per schema, and a process
 * may serve several). Bounded: emptied when it reaches LANES_MAX lanes.
 */
const lanes = new Map<number, Lane>();
const LANES_MAX = 4096;

function laneOf(task: ClaimedTask): Lane {
  const known = lanes.get(task.laneId);
  if (
    known !== undefined &&
    known.queue === task.queue &&
    known.priority === task.priority &&
    known.shard === task.shard
  )
    return known;
  if (lanes.size >= LANES_MAX) lanes.clear();
  const lane: Lane = Object.freeze({ queue: task.queue, priority: task.priority, shard: task.shard });
  lanes.set(task.laneId, lane);
  return lane;
}

/**
 * A handler's context: a constructor rather than an object literal, so its accessors are defined
 * in the context's own key order (`Object.keys(ctx)`: id, type, attempt, maxAttempts, snoozes,
 * lane, deadline, logger, schema, token, schedule, advanceCursor, dequeue, parents, signal) with
 * every property in the object (a literal followed by the rest would keep them in a second
 * array, ~60 B more). Its prototype is Object.prototype: to a handler, a plain object as before.
 */
interface HandlerContext extends WithRun {
  id: string;
  type: string;
  attempt: number;
  maxAttempts: number;
  snoozes: number;
  lane: Lane;
  logger: Logger;
  schema: string;
  token: string;
  schedule: ScheduleFire | null;
}
const HandlerContext = function (
  this: HandlerContext,
  run: HandlerRun,
  task: ClaimedTask,
  log: Logger,
  schema: string,
  schedule: ScheduleFire | null,
) {
  this.id = task.id;
  this.type = task.type;
  this.attempt = task.attempt;
  this.maxAttempts = task.maxAttempts;
  this.snoozes = task.snoozes;
  this.lane = laneOf(task);
  Object.defineProperty(this, 'deadline', DEADLINE);
  this.logger = log;
  this.schema = schema;
  this.token = task.token;
  this.schedule = schedule;
  Object.defineProperty(this, 'advanceCursor', ADVANCE_CURSOR);
  Object.defineProperty(this, 'dequeue', DEQUEUE);
  Object.defineProperty(this, 'parents', PARENTS);
  this[RUN] = run;
  Object.defineProperty(this, 'signal', SIGNAL);
} as unknown as new (
  run: HandlerRun,
  task: ClaimedTask,
  log: Logger,
  schema: string,
  schedule: ScheduleFire | null,
) => HandlerContext & TaskContext<unknown>;
HandlerContext.prototype = Object.prototype;

/**
 * Take a leased task: decide whether it may start, run its handler under its deadline, and say
 * what happened. Writes nothing but the handler's own AdvanceCursor calls; the settlement is
 * the caller's next step (outcome-table.ts, settle-task.ts).
 *
 * Its steps, for a caller that runs them in its own async frame (the engine, per task: an async
 * layer and its await were ~0.4 KB allocated per task on Node 20, docs/benchmarks-journal.md):
 * `startRun`, then for a HandlerRun `begin()`, the handler's call awaited (its answer to
 * `returned`, a throw to `threw`) and `end()`.
 */
export async function runTask(deps: RunDeps, input: RunInput): Promise<TaskRun> {
  const start = startRun(deps, input);
  const run = start instanceof Promise ? await start : start;
  return run instanceof HandlerRun ? runHandler(run) : run;
}

/** A HandlerRun's steps: begin, its handler's call awaited, what it returned or threw, end. */
export async function runHandler(run: HandlerRun): Promise<TaskRun> {
  run.begin();
  try {
    run.returned(await run.call());
  } catch (err) {
    run.threw(err);
  }
  return run.end();
}

/**
 * Decide whether a leased task may start: the run that ended before its handler, or the
 * HandlerRun to call (its deadline armed). Synchronous for a plain task; a promise only when a
 * step has to wait (a schedule's ceiling read, an asynchronous payload schema, a rate-limited
 * type's start).
 */
export function startRun(deps: RunDeps, input: RunInput): Startable | Promise<Startable> {
  const { task, def } = input;
  // The lease's deadline: the claim's stamp for the type's ceiling, minus the margin (read before
  // a schedule's shorter ceiling brings the run's deadline forward).
  const leaseDeadline = input.abort.deadline;
  if (!def) {
    input.freeSlot();
    // Logged once per type per interval by unknownTypes, not per task.
    const delayMs = deps.unknownTypes.handBack(task);
    return { kind: 'unknown_type', error: deps.unknownTypes.note(task.type), delayMs };
  }
  // Null at once for a task without a dedupe key: a plain task pays no read and no await.
  const schedule = fireOfDedupeKey(task.dedupeKey);
  if (schedule !== null) return scheduledStart(deps, input, def, schedule, leaseDeadline);
  return startBy(deps, input, def, null, leaseDeadline, leaseDeadline);
}

/** What startRun answers: the run ended before its handler, or the handler to call. */
export type Startable = TaskRun | HandlerRun;

async function scheduledStart(
  deps: RunDeps,
  input: RunInput,
  def: AnyTaskDefinition,
  schedule: ScheduleFire,
  leaseDeadline: number,
): Promise<Startable> {
  const deadline = await scheduleDeadline(deps, input.task, schedule, input.abort, input.log);
  return startBy(deps, input, def, schedule, leaseDeadline, deadline);
}

/** The run's checks once its deadline is known: the clock, then its payload. */
function startBy(
  deps: RunDeps,
  input: RunInput,
  def: AnyTaskDefinition,
  schedule: ScheduleFire | null,
  leaseDeadline: number,
  deadline: number,
): Startable | Promise<Startable> {
  const { task, log } = input;
  const now = Date.now();
  if (leaseDeadline <= now && input.receivedAt < leaseDeadline) {
    // It waited in the prefetch buffer past its deadline: it never ran, so hand it back with
    // the attempt refunded rather than charge it a failure.
    input.freeSlot();
    return { kind: 'expired_in_buffer' };
  }
  if (task.startBy !== undefined && now > task.startBy) {
    // A rate-limited task that could not start within its limit's guard (a slow claim, a busy
    // process): started now, it could push a window of the limit over. Handed back with the
    // attempt refunded, as a task that waited too long in the buffer.
    input.freeSlot();
    return { kind: 'expired_in_buffer' };
  }
  if (deadline <= now) {
    input.freeSlot();
    // The claim outlasted the whole ceiling: running now would outlive the lease. Or the lease
    // is good but the shorter ceiling of the task's schedule is spent (a slow claim, a wait in
    // the buffer): failed with backoff as well, not refunded, since a refund would hand a task
    // with a short ceiling back to the same busy buffer again and again.
    const error =
      leaseDeadline <= now
        ? `claim returned after the handler deadline (${new Date(leaseDeadline).toISOString()}); not started`
        : `schedule "${schedule?.name}"'s ceiling was spent before the handler started (deadline ${new Date(deadline).toISOString()}); not started`;
    log.warn(error);
    return { kind: 'late_claim', error };
  }
  // No schema: the payload is the handler's value, as checkPayload would say, without its
  // answer's object per task (~40 B of a warm drain's allocation).
  if (!def.schema) return startValid(deps, input, schedule, task.payload);
  let checked: PayloadCheck<unknown> | Promise<PayloadCheck<unknown>>;
  try {
    checked = checkPayload(def, task.payload);
  } catch (err) {
    checked = validatorThrew(task, err);
  }
  if (checked instanceof Promise) {
    return checked.then(
      (parsed) => startChecked(deps, input, schedule, parsed),
      (err: unknown) => startChecked(deps, input, schedule, validatorThrew(task, err)),
    );
  }
  return startChecked(deps, input, schedule, checked);
}

/** A validator that throws (instead of returning issues) is a bad payload too. */
function validatorThrew(task: ClaimedTask, err: unknown): PayloadCheck<unknown> {
  return {
    ok: false,
    message: `payload validation for task type "${task.type}" threw: ${(err as Error)?.message ?? String(err)}`,
  };
}

function startChecked(
  deps: RunDeps,
  input: RunInput,
  schedule: ScheduleFire | null,
  parsed: PayloadCheck<unknown>,
): Startable | Promise<Startable> {
  if (!parsed.ok) {
    input.freeSlot();
    input.log.error(parsed.message);
    return { kind: 'invalid_payload', error: parsed.message };
  }
  return startValid(deps, input, schedule, parsed.value);
}

/** Its payload is good (`value`, the handler's): a rate-limited type's start asked for, else the run. */
function startValid(
  deps: RunDeps,
  input: RunInput,
  schedule: ScheduleFire | null,
  value: unknown,
): Startable | Promise<Startable> {
  // A plain task reaches this in the turn it was taken from the buffer, where nothing has aborted
  // it; one whose start waited (an asynchronous schema, a schedule's ceiling read) may have been
  // stopped or cancelled meanwhile, and its handler must not start then.
  const unstarted = abortedBeforeStart(input);
  if (unstarted !== null) return unstarted;
  if (deps.typeRates.limits(input.task.type)) return rateLimitedStart(deps, input, schedule, value);
  return new HandlerRun(deps, input, schedule, value);
}

/**
 * The run of a task aborted while its start waited, or null when nothing aborted it. An
 * operator's cancel: the cancel's settlement is the attempt's (nothing to write, counted
 * cancelled). A stop: handed back unstarted with the attempt refunded, as a task still in the
 * buffer at stop is (started, it would run with its signal aborted, past a stop() that may have
 * returned already, and be released on its attempt).
 */
function abortedBeforeStart(input: RunInput): TaskRun | null {
  const why = input.abort.reason;
  if (why === undefined) return null;
  if (why instanceof CancelAbort) {
    input.freeSlot();
    return CANCELLED_UNSTARTED;
  }
  if (why instanceof ShutdownAbort) {
    input.freeSlot();
    return STOPPED_BEFORE_START;
  }
  return null;
}

async function rateLimitedStart(
  deps: RunDeps,
  input: RunInput,
  schedule: ScheduleFire | null,
  value: unknown,
): Promise<Startable> {
  const { task } = input;
  // Asked last, right before the handler starts: a start granted is counted at once, so
  // nothing that may still stop the task (its payload, its deadline) comes between.
  const start = await deps.typeRates.take(task.type, task.id);
  if (!start.granted) {
    input.freeSlot();
    return { kind: 'rate_limited', note: start.note, delayMs: start.delayMs };
  }
  // An operator's cancel or a stop, while it waited: its start is spent either way.
  const unstarted = abortedBeforeStart(input);
  if (unstarted !== null) return unstarted;
  const now = Date.now();
  if ((start.startBy !== null && now > start.startBy) || (task.startBy !== undefined && now > task.startBy)) {
    // The answer came back later than the limit's guard, or later than the guard of its
    // queue's rate (checked above, before this wait): starting now could push a window of the
    // type's or the queue's starts over. Handed back unstarted, its start spent.
    input.freeSlot();
    return { kind: 'expired_in_buffer' };
  }
  return new HandlerRun(deps, input, schedule, value);
}

/**
 * What a thrown value says, read once and never throwing: a revoked Proxy, or one whose traps
 * throw (`instanceof Error` alone throws on it), fails its attempt like any error, never a run
 * that crashes and leaves its lease to lapse unsettled and uncounted (as handler-result.ts does
 * for a returned value).
 */
function readThrown(error: unknown): { message: string; detail: ReturnType<typeof errorDetail>; permanent: boolean } {
  try {
    return { message: errorMessage(error), detail: errorDetail(error), permanent: isPermanentError(error) };
  } catch (err) {
    let reason: string;
    try {
      reason = errorMessage(err);
    } catch {
      reason = 'an error that could not be read';
    }
    const message = `handler threw a value that could not be read (${reason})`;
    return { message, detail: { message }, permanent: false };
  }
}

/**
 * A run whose handler may start, its deadline armed: its context, and what its handler did.
 * `begin()`, then `call()` awaited by the caller (its answer to `returned`, a throw to `threw`),
 * then `end()` says what happened.
 */
export class HandlerRun {
  private readonly ctx: TaskContext<unknown>;
  private advanced = false;
  private dequeued = false;
  /**
   * When the handler started (performance.now()): null until then, so the field holds the
   * number's own box rather than a second one per run that a number-only field is given.
   */
  private started: number | null = null;
  private returnedValue: HandlerReturn | null = null;
  private error: unknown = null;
  /** The context's parts made on their first read (its accessors), null until one is. */
  private made: MadeParts | null = null;

  /**
   * Its definition is `input.def` and its deadline `input.abort.deadline` (startRun's checks read
   * them from there, and a schedule's shorter ceiling is applied before the run is armed here):
   * not kept again, as 24 B a task more (a number field is a box of its own).
   */
  constructor(
    private readonly deps: RunDeps,
    private readonly input: RunInput,
    schedule: ScheduleFire | null,
    private readonly value: unknown,
  ) {
    deps.deadlines.arm(input.abort);
    this.ctx = new HandlerContext(this, input.task, input.log, deps.storage.schema.name, schedule);
  }

  private madeParts(): MadeParts {
    if (this.made === null) this.made = {};
    return this.made;
  }

  /**
   * What `util.inspect(ctx)` shows under the context's run key (an own enumerable symbol, so a
   * spread context keeps working): not the worker's pools, options and engine this run reaches,
   * which at depth printed the connection string (test/handler-context-review.test.ts).
   */
  [Symbol.for('nodejs.util.inspect.custom')](): string {
    return `[berth run of task ${this.input.task.id}]`;
  }

  /** `ctx.signal`. */
  signal(): AbortSignal {
    return this.input.abort.signal;
  }

  /** `ctx.deadline`: the same Date on every read. */
  deadlineDate(): Date {
    const made = this.madeParts();
    made.deadline ??= new Date(this.input.abort.deadline);
    return made.deadline;
  }

  /** `ctx.advanceCursor`: the same function on every read, called with or without its context. */
  advanceCursorFn(): (next: unknown) => Promise<boolean> {
    const made = this.madeParts();
    if (made.advanceCursor === undefined) {
      const { deps, input } = this;
      // Named as the context's key (a function's `name`, as the arrow in a literal had).
      const advanceCursor = async (next: unknown) => {
        const ok = await advanceCursorIn(deps.write, deps.storage, input.task, next);
        if (ok) this.advanced = true;
        else input.log.warn('AdvanceCursor refused: lease no longer held');
        return ok;
      };
      made.advanceCursor = advanceCursor;
    }
    return made.advanceCursor;
  }

  /** `ctx.dequeue`, as advanceCursorFn. */
  dequeueFn(): (executor: Queryable) => Promise<void> {
    const made = this.madeParts();
    if (made.dequeue === undefined) {
      const { deps, input } = this;
      const dequeue = async (executor: Queryable) => {
        const task = input.task;
        await dequeueIn(executor, deps.storage, task.id, task.token);
        // Completed in the caller's transaction (any isolation level): its dependents are the
        // leader's to release, within a tick of that commit.
        if (task.hasDependents) await watchParents(executor, deps.storage, [task.id]);
        this.dequeued = true;
      };
      made.dequeue = dequeue;
    }
    return made.dequeue;
  }

  /** `ctx.parents`, as advanceCursorFn: one query, on its first call. */
  parentsFn(): () => Promise<ReadonlyMap<string, ParentResult>> {
    const made = this.madeParts();
    if (made.parents === undefined) {
      const { deps, input } = this;
      const parents = () => (made.parentsRead ??= readParents(deps.write, deps.storage, input.task.id));
      made.parents = parents;
    }
    return made.parents;
  }

  /** The handler starts: its observer is told, its time counts from here. */
  begin(): void {
    this.input.hooks?.handlerStarted();
    this.started = performance.now();
  }

  /** Call the handler (awaited by the caller, which hands its answer to `returned` or its throw to `threw`). */
  call(): unknown {
    return (this.input.def as AnyTaskDefinition).handler(this.value, this.ctx);
  }

  /**
   * A value other than berth's answers is the task's result (`handler: (p) => mailer.send(p)`
   * succeeds): read once and encoded here, on the handler's side of the settlement, so a value
   * the completion could not write fails this attempt alone and never the flush it would join.
   */
  returned(value: unknown): void {
    const returned = readHandlerReturn(value, this.deps.resultMaxBytes);
    this.returnedValue = returned;
    if (returned.kind === 'unstorable') {
      this.error = new Error(returned.error);
    }
  }

  threw(err: unknown): void {
    this.error = err ?? new Error('handler threw a nullish value');
  }

  /** The handler is over: its deadline disarmed, its slot freed, and what happened. */
  end(): TaskRun {
    const { deps, input, advanced, dequeued, error } = this;
    const abort = input.abort;
    const deadline = abort.deadline;
    deps.deadlines.disarm(abort);
    input.freeSlot();
    input.hooks?.handlerEnded();
    const ms = performance.now() - (this.started as number);
    deps.reports.handlerRan(input.task, ms / 1000);
    const shutdown = abort.reason instanceof ShutdownAbort;
    const pastDeadline = abort.reason instanceof DeadlineAbort || Date.now() >= deadline;
    const cancelled = abort.reason instanceof CancelAbort;
    if (error !== null) {
      // A thrown non-Error is kept as JSON (`{"code":42}`), never `[object Object]`.
      const { message, detail, permanent } = readThrown(error);
      const ran = { ms, advanced, dequeued, shutdown, pastDeadline, cancelled };
      if (this.returnedValue?.kind === 'unstorable')
        return { kind: 'unstorable_result', error: message, detail, thrown: error, ...ran };
      return { kind: 'error', error: message, detail, permanent, thrown: error, ...ran };
    }
    // A run that returned is written out as one literal, not a shared part spread into it: the
    // spread was an object more per task and a copy (docs/benchmarks-journal.md, issue 35).
    // Not null, not unstorable: the handler returned and no error was recorded.
    const r = this.returnedValue as Exclude<HandlerReturn, { kind: 'unstorable' }>;
    if (r.kind === 'snooze') {
      return { kind: 'snooze', delayMs: r.delayMs, ms, advanced, dequeued, shutdown, pastDeadline, cancelled };
    }
    if (r.kind === 'continue') return { kind: 'continue', ms, advanced, dequeued, shutdown, pastDeadline, cancelled };
    return r.result === undefined
      ? { kind: 'done', ms, advanced, dequeued, shutdown, pastDeadline, cancelled }
      : { kind: 'done', result: r.result, ms, advanced, dequeued, shutdown, pastDeadline, cancelled };
  }
}

/**
 * The deadline of a schedule's task: its schedule's stored ceiling, when shorter than the one
 * this worker's claim stamped the lease with, brings the lease's deadline forward by the
 * difference. Still derived from the database's own stamp (the lease's expiry), never budgeted
 * from the local clock; the lease itself, and so the wait after a crash, stays the type's. The
 * row counts only while it names this task's type (a schedule redeclared for another type says
 * nothing of this one). A failed read is logged and the task runs under its type's deadline:
 * never a crash, never a lost task. Shortens `abort` before it is armed.
 */
async function scheduleDeadline(
  deps: RunDeps,
  task: ClaimedTask,
  schedule: ScheduleFire,
  abort: RunAbort,
  log: Logger,
): Promise<number> {
  let stored: ScheduleCeilingRow | null;
  try {
    stored = await deps.scheduleCeilings.of(schedule.name);
  } catch (err) {
    log.warn(
      { schedule: schedule.name, err: errorMessage(err) },
      "could not read the schedule's ceiling: the task runs under its type's deadline",
    );
    return abort.deadline;
  }
  if (stored === null || stored.ceilingMs === null || stored.taskType !== task.type) return abort.deadline;
  const typeCeilingMs = deps.ceilings.get(task.type) ?? deps.defaultCeilingMs;
  if (stored.ceilingMs < typeCeilingMs) abort.shortenTo(abort.deadline - (typeCeilingMs - stored.ceilingMs));
  return abort.deadline;
}

/** A dependent's parents as its handler reads them (`ctx.parents()`): one query, by id. */
async function readParents(db: Queryable, storage: Storage, id: string): Promise<ReadonlyMap<string, ParentResult>> {
  const out = new Map<string, ParentResult>();
  for (const p of await parentsOf(db, storage, id)) out.set(p.id, { type: p.type, result: p.result });
  return out;
}
