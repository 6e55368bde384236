import { BerthInputError } from './errors.js';
import { checkInteger, checkKeys, checkText, MAX_ATTEMPTS_LIMIT, MAX_QUEUE_BYTES, MAX_TYPE_CHARS } from './limits.js';
import {
  defineTask,
  type BackoffPolicy,
  type StandardSchemaLike,
  type TaskDefinition,
  type TaskHandler,
} from './task.js';

/**
 * Typed producers (docs/api.md, "Typed producers"). Two ways to give `enqueue` a payload type:
 *
 * - an args-only definition, `defineTaskType({ type, schema?, queue?, maxAttempts? })`, which a
 *   producer imports without the handler code, and which the worker turns into a runnable
 *   definition with `implement(taskType, { ceilingMs, handler })` (River's JobArgs and Worker,
 *   split the same way);
 * - task names typed through this registry, by module augmentation (graphile-worker's
 *   `GraphileWorker.Tasks`):
 *
 *   declare module 'berth-queue' {
 *     interface TaskRegistry { send_email: { orderId: string } }
 *   }
 *
 *   Once it has an entry, `enqueue(db, 'send_emial', …)` and a wrong payload fail to compile.
 *   While it is empty, any string is a task name and its payload is `unknown`.
 */
// biome-ignore lint/suspicious/noEmptyInterface: applications add their task names by augmenting it
export interface TaskRegistry {}

/** A task name: any string while the registry is empty, else one of its keys. */
export type TaskTypeName = [keyof TaskRegistry] extends [never] ? string : Extract<keyof TaskRegistry, string>;

/** The payload type of a task name: the registry's entry, or `unknown` for a name it lacks. */
export type TaskPayload<T extends string> = T extends keyof TaskRegistry ? TaskRegistry[T] : unknown;

/**
 * The payload type of a task type given either way: a name (the registry's entry, see
 * TaskPayload) or a definition (its payload type). What `enqueue` and `enqueueMany` compute the
 * payload parameter from.
 */
export type PayloadOf<T> = T extends string ? TaskPayload<T> : T extends TaskTypeLike<infer P> ? P : never;

/**
 * What `enqueue` reads of a definition: its name, the schema its payload is checked against,
 * the queue it routes to and the attempts it stamps. A TaskType and a TaskDefinition are both one.
 */
export interface TaskTypeLike<P> {
  readonly type: string;
  readonly schema?: StandardSchemaLike<P> | undefined;
  readonly queue?: string | undefined;
  readonly maxAttempts?: number | undefined;
}

/** An args-only definition: what a producer needs, without the handler. */
export interface TaskType<P = unknown> extends TaskTypeLike<P> {
  readonly type: string;
  readonly schema: StandardSchemaLike<P> | undefined;
  /** Where enqueueing by this type routes (an enqueue's own `queue` wins); undefined: `default`. */
  readonly queue: string | undefined;
  /** Stamped on each task enqueued by this type; undefined: the worker's definition decides at claim. */
  readonly maxAttempts: number | undefined;
}

export interface TaskTypeInput<P> {
  type: string;
  /** Validates payloads at enqueue and, in the worker's definition, before each run. */
  schema?: StandardSchemaLike<P>;
  queue?: string;
  maxAttempts?: number;
}

/** What the worker adds to a TaskType to run it (`implement`). */
export interface TaskImplementation<P> {
  handler: TaskHandler<P>;
  /** The handler's maximum run time in ms (see `defineTask`). */
  ceilingMs: number;
  backoff?: Partial<BackoffPolicy>;
}

const TYPE_KEYS: ReadonlySet<string> = new Set<keyof TaskTypeInput<unknown>>([
  'type',
  'schema',
  'queue',
  'maxAttempts',
]);
const IMPLEMENTATION_KEYS: ReadonlySet<string> = new Set<keyof TaskImplementation<unknown>>([
  'handler',
  'ceilingMs',
  'backoff',
]);

/** An args-only definition, checked as `defineTask` checks the same fields. */
export function defineTaskType<P>(input: TaskTypeInput<P>): TaskType<P> {
  if (typeof input !== 'object' || input === null) throw new BerthInputError('defineTaskType needs an object');
  const type = checkText(input.type, 'task type', '', { maxChars: MAX_TYPE_CHARS, nonEmpty: true });
  const where = `task type "${type}"`;
  checkKeys(input, TYPE_KEYS, where);
  return Object.freeze({
    type,
    schema: input.schema,
    queue:
      input.queue === undefined ? undefined : checkText(input.queue, 'queue', where, { maxBytes: MAX_QUEUE_BYTES }),
    maxAttempts:
      input.maxAttempts === undefined
        ? undefined
        : checkInteger(input.maxAttempts, 'maxAttempts', where, 1, MAX_ATTEMPTS_LIMIT),
  });
}

/**
 * The worker's definition of an args-only type: its name, schema, queue and attempts, with the
 * handler, ceiling and backoff given here. The same as `defineTask({ ...taskType, ...impl })`.
 */
export function implement<P>(taskType: TaskType<P>, impl: TaskImplementation<P>): TaskDefinition<P> {
  if (typeof impl !== 'object' || impl === null) throw new BerthInputError('implement needs { ceilingMs, handler }');
  checkKeys(impl, IMPLEMENTATION_KEYS, `implement("${taskType.type}")`);
  return defineTask<P>({
    type: taskType.type,
    schema: taskType.schema,
    queue: taskType.queue,
    maxAttempts: taskType.maxAttempts,
    ...impl,
  });
}
