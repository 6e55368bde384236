import type { Logger } from './logger.js';
import { BerthInputError } from './errors.js';
import type { Lane } from './lane.js';
import type { Queryable } from './sql.js';
import {
  checkInteger,
  checkKeys,
  checkMs,
  checkText,
  MAX_ATTEMPTS_LIMIT,
  MAX_QUEUE_BYTES,
  MAX_TIMER_MS,
  MAX_TYPE_CHARS,
} from './limits.js';

/**
 * What a running handler sees, without a query: the task, its lease, its deadline and abort, a
 * logger, and the two queue writes a handler may make (`advanceCursor`, `dequeue`). `signal`
 * aborts at the lease's database-stamped expiry minus the margin (or when the worker stops).
 */
export interface TaskContext<P = unknown> {
  readonly id: string;
  readonly type: string;
  /** This run's attempt, from 1. */
  readonly attempt: number;
  /** The attempt after which a failure dead-letters the task. */
  readonly maxAttempts: number;
  /**
   * How many times this task has snoozed before this run (`return snooze(ms)`), 0 when never.
   * Kept while the task is pending; a task retried out of the dead letters after its count was
   * dropped starts from 0 again.
   */
  readonly snoozes: number;
  /** Where the task lives: its lane. */
  readonly lane: Lane;
  readonly signal: AbortSignal;
  /**
   * When the handler must have stopped: lease expiry minus the margin, or earlier by the
   * difference of the two ceilings for a task of a schedule with a shorter `ceilingMs`.
   */
  readonly deadline: Date;
  /**
   * The worker's logger with this task's fields bound: `task_id`, `task_type`, `lane`
   * (queue/priority/shard) and `attempt` (and the worker's `worker`). Do not log those keys again:
   * pino would write them twice.
   */
  readonly logger: Logger;
  /** The installation schema the task lives in. */
  readonly schema: string;
  /**
   * This run's lease token: with `schema` and `id`, what `dequeue(executor, schema, id, token)`
   * needs (`ctx.dequeue` passes them for you).
   */
  readonly token: string;
  /**
   * Settle this task as completed on `executor`: pass your transaction's client, and the task is
   * done exactly when your own writes commit (and not, if they roll back). Throws LeaseLostError
   * when this run no longer holds the lease (roll your transaction back then). Return `'done'`
   * (or nothing) afterwards: the worker's own completion then finds the task settled.
   */
  dequeue(executor: Queryable): Promise<void>;
  /**
   * Commit slice progress: rewrites the payload, makes the task due now with attempts reset and
   * this attempt settled, in one fenced statement. Resolves `false` when the lease was lost (the
   * handler must then throw, never return `'continue'`).
   */
  advanceCursor(next: P): Promise<boolean>;
  /**
   * The schedule instant this task stands for, when a schedule fired it (`defineSchedule`);
   * null for any other task. Kept across its retries.
   */
  readonly schedule: ScheduleFire | null;
  /**
   * The tasks this one depends on (`dependsOn`), by id, each with its type and the result its
   * handler returned (undefined when it returned none). An empty map for a task without
   * dependencies. One query, on the first call (a handler that never calls it pays nothing).
   * A parent's result is kept for as long as this task may run, whatever `resultRetentionMs` is.
   */
  parents(): Promise<ReadonlyMap<string, ParentResult>>;
}

/** A parent of a dependent task, as its handler reads it (`ctx.parents()`). */
export interface ParentResult {
  readonly type: string;
  /** What the parent's handler returned; undefined when it returned nothing. */
  readonly result: unknown;
}

/** What a task fired by a schedule knows of its schedule (`ctx.schedule`). */
export interface ScheduleFire {
  /** The schedule's name. */
  readonly name: string;
  /**
   * The instant this task stands for: of the expression, or for a task the misfire policy `once`
   * runs, the latest missed one; for a trigger, the moment it was triggered.
   */
  readonly instant: Date;
  /** An operator's trigger (`berth schedules trigger`), not an instant of the expression. */
  readonly triggered: boolean;
}

const SNOOZE = Symbol.for('berth.Snooze');

/** What `snooze(delayMs)` returns: a handler's request to run again after a delay. */
export interface Snooze {
  readonly [SNOOZE]: true;
  /** The delay in ms, applied on the database clock. */
  readonly delayMs: number;
}

/**
 * Ask to run the task again after `delayMs` without consuming an attempt (River's JobSnooze):
 * `return snooze(60_000)`. The attempt the claim counted is given back, up to the type's
 * `maxSnoozes` per task; past it a snooze keeps the attempt, so the attempt limit ends a task
 * that only ever snoozes (docs/api.md, "Snooze").
 */
export function snooze(delayMs: number): Snooze {
  checkMs(delayMs, 'snooze delay', 'snooze()', 0, MAX_BACKOFF_MS);
  return Object.freeze({ [SNOOZE]: true as const, delayMs });
}

/** A snooze request, whichever copy of berth made it (a brand, as for PermanentError). */
export function isSnooze(value: unknown): value is Snooze {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[SNOOZE] === true;
}

/**
 * berth's answers: `'done'` (or nothing) finished the task; `'continue'` means a slice committed
 * its cursor; `snooze(ms)` asks to run again later.
 */
// biome-ignore lint/suspicious/noConfusingVoidType: handlers typed `(...) => Promise<void>` must stay assignable; `undefined` would refuse them
export type HandlerResult = 'done' | 'continue' | Snooze | void;

/**
 * What a handler may return besides berth's answers: a value stored as the task's result, as
 * JSON (a BigInt, a function or a cycle fails the attempt at run time: TypeScript cannot tell a
 * serialisable object from another).
 */
export type TaskResult = string | number | boolean | null | object;

/**
 * A handler: it gives one of berth's answers (`HandlerResult`), or returns another value, `R`,
 * which completes the task and is stored as its result (JSON, within the worker's
 * `resultMaxBytes`; docs/api.md, "Task results").
 */
export type TaskHandler<P, R extends TaskResult = TaskResult> = (
  payload: P,
  ctx: TaskContext<P>,
) => Promise<HandlerResult | R>;

/** A Standard Schema (zod 3.24+/4, valibot, arktype...) used to validate payloads. */
export interface StandardSchemaLike<P> {
  readonly '~standard': {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (
      value: unknown,
    ) =>
      | { readonly value: P; readonly issues?: undefined }
      | { readonly issues: ReadonlyArray<{ readonly message: string; readonly path?: ReadonlyArray<unknown> }> }
      | Promise<
          | { readonly value: P; readonly issues?: undefined }
          | { readonly issues: ReadonlyArray<{ readonly message: string; readonly path?: ReadonlyArray<unknown> }> }
        >;
  };
}

export interface BackoffPolicy {
  /** First retry delay in ms (default 15 000). */
  baseMs: number;
  /** Cap in ms (default 600 000). */
  maxMs: number;
}

/** What `defineTask` takes besides the ceiling (see TaskDefinitionInput). */
export interface TaskDefinitionFields<P> {
  type: string;
  handler: TaskHandler<P>;
  /** Attempts before the task dead-letters (default 20). */
  maxAttempts?: number;
  /**
   * Snoozes per task that give back their attempt (default 100); past it a snooze keeps the
   * attempt its claim counted, so the attempt limit applies. 0: every snooze consumes an attempt.
   */
  maxSnoozes?: number;
  backoff?: Partial<BackoffPolicy>;
  /** Validates payloads at enqueue (when the definition is passed) and before each run. */
  schema?: StandardSchemaLike<P>;
  /**
   * The queue its tasks go to when enqueued by this definition (an explicit `queue` option
   * still wins), and one a worker holding it serves by default. Default: `default`.
   */
  queue?: string;
}

/**
 * A task definition: its fields and its ceiling, `ceilingMs`. The ceiling's name before 0.2,
 * `ceiling`, is an unknown option now ("did you mean ceilingMs?").
 */
export type TaskDefinitionInput<P> = TaskDefinitionFields<P> & {
  /**
   * The handler's maximum run time in ms, about ten times its expected worst case. The lease is
   * `ceilingMs + leaseMarginMs`, which is also the crash-recovery wait for the type.
   */
  ceilingMs: number;
};

export interface TaskDefinition<P = unknown> {
  readonly type: string;
  /** The handler's maximum run time in ms. */
  readonly ceilingMs: number;
  readonly handler: TaskHandler<P>;
  readonly maxAttempts: number;
  readonly maxSnoozes: number;
  readonly backoff: BackoffPolicy;
  readonly schema: StandardSchemaLike<P> | undefined;
  /** The queue it routes to; undefined: the default queue (docs/architecture.md, "Routing"). */
  readonly queue: string | undefined;
}

/**
 * A definition of any payload type, for lists that mix them (the worker's `tasks`).
 * TaskDefinition is invariant in P (the handler takes a P, the schema yields one), so neither
 * `TaskDefinition<unknown>` nor `TaskDefinition<never>` accepts every definition: only `any` does.
 */
// biome-ignore lint/suspicious/noExplicitAny: the one place a definition's payload type is erased, see above
export type AnyTaskDefinition = TaskDefinition<any>;

export const DEFAULT_MAX_ATTEMPTS = 20;
export const DEFAULT_MAX_SNOOZES = 100;
export const DEFAULT_BACKOFF: BackoffPolicy = { baseMs: 15_000, maxMs: 600_000 };

const DEFINITION_KEYS: ReadonlySet<string> = new Set([
  'type',
  'ceilingMs',
  'handler',
  'maxAttempts',
  'maxSnoozes',
  'backoff',
  'schema',
  'queue',
]);
const BACKOFF_KEYS: ReadonlySet<string> = new Set(['baseMs', 'maxMs']);
/** What other queues call the backoff's two numbers (pg-boss, BullMQ, graphile-worker's docs). */
const BACKOFF_HINTS: Readonly<Record<string, string>> = {
  initial: 'baseMs',
  initialMs: 'baseMs',
  initialDelay: 'baseMs',
  base: 'baseMs',
  delay: 'baseMs',
  max: 'maxMs',
  maxDelay: 'maxMs',
  cap: 'maxMs',
};
/** A retry delay above a year is a unit mistake; the bound also keeps `now() + delay` storable. */
export const MAX_BACKOFF_MS = 365 * 24 * 3600_000;

export function defineTask<P>(input: TaskDefinitionInput<P>): TaskDefinition<P> {
  if (typeof input !== 'object' || input === null) throw new BerthInputError('defineTask needs an object');
  const type = checkText(input.type, 'task type', '', { maxChars: MAX_TYPE_CHARS, nonEmpty: true });
  const where = `task "${type}"`;
  checkKeys(input, DEFINITION_KEYS, where);
  // The handler's deadline is a Node timer: past 2^31 - 1 ms it would fire at once.
  const ceilingMs = checkMs(input.ceilingMs, 'ceilingMs', where, 1, MAX_TIMER_MS, " (Node's timer limit, 24.8 days)");
  // Any name is a queue, the empty one included, as at enqueue (src/producer/enqueue.ts).
  const queue =
    input.queue === undefined ? undefined : checkText(input.queue, 'queue', where, { maxBytes: MAX_QUEUE_BYTES });
  if (typeof input.handler !== 'function') {
    throw new BerthInputError(`${where}: handler must be a function`);
  }
  const maxAttempts = checkInteger(
    input.maxAttempts ?? DEFAULT_MAX_ATTEMPTS,
    'maxAttempts',
    where,
    1,
    MAX_ATTEMPTS_LIMIT,
  );
  const maxSnoozes = checkInteger(input.maxSnoozes ?? DEFAULT_MAX_SNOOZES, 'maxSnoozes', where, 0, MAX_ATTEMPTS_LIMIT);
  if (input.backoff !== undefined) {
    if (typeof input.backoff !== 'object' || input.backoff === null)
      throw new BerthInputError(`${where}: backoff must be an object`);
    checkKeys(input.backoff, BACKOFF_KEYS, `${where}: backoff`, BACKOFF_HINTS);
  }
  const backoff = { ...DEFAULT_BACKOFF, ...input.backoff };
  checkMs(backoff.baseMs, 'backoff.baseMs', where, 0, MAX_BACKOFF_MS);
  checkMs(backoff.maxMs, 'backoff.maxMs', where, backoff.baseMs, MAX_BACKOFF_MS, ' (at least baseMs)');
  return Object.freeze({
    type,
    ceilingMs,
    handler: input.handler,
    maxAttempts,
    maxSnoozes,
    backoff,
    schema: input.schema,
    queue,
  });
}

/** Capped exponential backoff: base doubling per failed attempt, never above the cap. */
export function backoffDelayMs(policy: BackoffPolicy, attempt: number): number {
  const exp = Math.min(Math.max(attempt - 1, 0), 40);
  return Math.min(policy.baseMs * 2 ** exp, policy.maxMs);
}

/** A payload checked against its definition's schema: the parsed value, or the issues as one message. */
export type PayloadCheck<P> = { ok: true; value: P } | { ok: false; message: string };

type StandardResult<P> = Awaited<ReturnType<StandardSchemaLike<P>['~standard']['validate']>>;

/** Validate a payload against a definition's schema; returns the parsed value or the issues. */
export async function validatePayload<P>(
  def: { readonly type: string; readonly schema?: StandardSchemaLike<P> | undefined },
  payload: unknown,
): Promise<PayloadCheck<P>> {
  return checkPayload(def, payload);
}

/**
 * `validatePayload` without the promise when the schema answers at once (no schema, or zod's
 * synchronous validate): the worker checks every payload it runs, and an await per task is a
 * promise and a microtask turn. A validator that throws, throws here (the caller reports it).
 */
export function checkPayload<P>(
  def: { readonly type: string; readonly schema?: StandardSchemaLike<P> | undefined },
  payload: unknown,
): PayloadCheck<P> | Promise<PayloadCheck<P>> {
  if (!def.schema) return { ok: true, value: payload as P };
  const result = def.schema['~standard'].validate(payload);
  return isThenable(result) ? Promise.resolve(result).then((r) => toCheck(def, r)) : toCheck(def, result);
}

function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}

function toCheck<P>(def: Pick<TaskDefinition<P>, 'type'>, result: StandardResult<P>): PayloadCheck<P> {
  if (result.issues) {
    const detail = result.issues
      .map((i) => (i.path?.length ? `${i.path.map(String).join('.')}: ${i.message}` : i.message))
      .join('; ');
    return { ok: false, message: `payload for task type "${def.type}" is invalid: ${detail}` };
  }
  return { ok: true, value: result.value };
}
