import { BerthInputError } from '../errors.js';
import { checkSchemaName } from '../limits.js';
import { addTaskStatement } from '../storage/add-task.js';
import { storageFor } from '../storage/storage.js';
import type { TaskPayload, TaskTypeLike, TaskTypeName } from '../task-type.js';
import { ENQUEUE_DEFAULTS, type EnqueueOptions, resolveEnqueue, type TaskTypeRef } from './enqueue.js';

/** `enqueue`'s options but `preparedStatements` (the SQL call is run by the caller's executor). */
export type SqlEnqueueOptions = Omit<EnqueueOptions, 'preparedStatements'>;

/** A parameterised statement (`$1` … `$n`) and its values, for any PostgreSQL executor. */
export interface SqlCall {
  text: string;
  values: (string | number | null)[];
}

/**
 * The SQL call of `add_task()` that enqueues this task, checked as `enqueue` checks it (the
 * payload against the definition's schema, every option and limit; an unknown option is an
 * error), for executors berth does not know: postgres.js `sql.unsafe(text, values)`, Prisma
 * `$queryRawUnsafe(text, ...values)`, Kysely's and Drizzle's raw SQL. Running it returns one row
 * with `id`: the new task's id, or null when the dedupe key is held by a live task. The task is
 * not traced (`enqueue` stores the caller's trace context; this call carries none).
 */
export function enqueueSql<P>(
  type: TaskTypeLike<P>,
  payload: NoInfer<P>,
  options?: SqlEnqueueOptions,
): Promise<SqlCall>;
export function enqueueSql<T extends TaskTypeName>(
  type: T,
  payload: TaskPayload<T>,
  options?: SqlEnqueueOptions,
): Promise<SqlCall>;
export async function enqueueSql(
  type: TaskTypeRef,
  payload: unknown,
  options: SqlEnqueueOptions = {},
): Promise<SqlCall> {
  const { spec, schema } = await resolveEnqueue(type, payload, options, 'enqueueSql options');
  if (spec.concurrencyKey !== null)
    throw new BerthInputError(
      'enqueueSql options: concurrencyKey is not supported by the SQL door (add_task); enqueue a keyed task with enqueue()',
    );
  if (spec.dependsOn !== null || spec.onParentFailure !== null)
    throw new BerthInputError(
      'enqueueSql options: dependsOn and onParentFailure are not supported by the SQL door (add_task); enqueue a dependent task with enqueue()',
    );
  const statement = storageFor(checkSchemaName(schema, 'enqueueSql')).statement('add-task', addTaskStatement);
  const { text, values } = statement.query({
    type: spec.type,
    payload: spec.json,
    queue: spec.queue,
    runAt: spec.runAt === null ? null : spec.runAt.toISOString(),
    priority: spec.priority,
    dedupeKey: spec.dedupeKey,
    maxAttempts: spec.maxAttempts,
    delayMs: spec.delay,
    shard: spec.shard,
    // NULL is add_task's default (the client's): only a shard count that differs is sent.
    shards: spec.shards === ENQUEUE_DEFAULTS.shards ? null : spec.shards,
  });
  return { text, values: values as SqlCall['values'] };
}
