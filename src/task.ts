import type { Logger } from './logger.js';
import { BerthInputError } from './errors.js';

/** Where a task lives: its lane. */
export interface Lane {
  queue: string;
  priority: number;
  shard: number;
}

/**
 * What a running handler sees. `signal` aborts at the lease's database-stamped expiry minus the
 * margin (or when the worker stops); `advanceCursor` is the one queue write a handler makes.
 */
export interface TaskContext<P> {
  readonly id: string;
  readonly type: string;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly lane: Lane;
  readonly signal: AbortSignal;
  /** When the handler must have stopped (lease expiry minus the margin). */
  readonly deadline: Date;
  readonly logger: Logger;
  /**
   * Commit slice progress: rewrites the payload, makes the task due now with attempts reset and
   * its lease cleared, in one fenced statement. Resolves `false` when the lease was lost (the
   * handler must then throw, never return `'continue'`).
   */
  advanceCursor(next: P): Promise<boolean>;
}

/** `'done'` (or nothing) finished the task; `'continue'` means a slice committed its cursor. */
export type HandlerResult = 'done' | 'continue' | void;

export type TaskHandler<P> = (payload: P, ctx: TaskContext<P>) => Promise<HandlerResult>;

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

export interface TaskDefinitionInput<P> {
  type: string;
  /**
   * The handler's maximum run time in ms, about ten times its expected worst case. The lease is
   * `ceiling + margin`, which is also the crash-recovery wait for the type.
   */
  ceiling: number;
  handler: TaskHandler<P>;
  /** Attempts before the task dead-letters (default 20). */
  maxAttempts?: number;
  backoff?: Partial<BackoffPolicy>;
  /** Validates payloads at enqueue (when the definition is passed) and before each run. */
  schema?: StandardSchemaLike<P>;
}

export interface TaskDefinition<P = unknown> {
  readonly type: string;
  readonly ceiling: number;
  readonly handler: TaskHandler<P>;
  readonly maxAttempts: number;
  readonly backoff: BackoffPolicy;
  readonly schema: StandardSchemaLike<P> | undefined;
}

export const DEFAULT_MAX_ATTEMPTS = 20;
export const DEFAULT_BACKOFF: BackoffPolicy = { baseMs: 15_000, maxMs: 600_000 };

export function defineTask<P>(input: TaskDefinitionInput<P>): TaskDefinition<P> {
  if (typeof input.type !== 'string' || input.type.length === 0 || input.type.length > 200) {
    throw new BerthInputError('task type must be a non-empty string of at most 200 characters');
  }
  if (!Number.isFinite(input.ceiling) || input.ceiling <= 0) {
    throw new BerthInputError(`task "${input.type}": ceiling must be a positive number of milliseconds`);
  }
  if (typeof input.handler !== 'function') {
    throw new BerthInputError(`task "${input.type}": handler must be a function`);
  }
  const maxAttempts = input.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 1_000_000) {
    throw new BerthInputError(`task "${input.type}": maxAttempts must be an integer >= 1`);
  }
  const backoff = { ...DEFAULT_BACKOFF, ...input.backoff };
  if (!(backoff.baseMs >= 0) || !(backoff.maxMs >= backoff.baseMs)) {
    throw new BerthInputError(`task "${input.type}": backoff needs 0 <= baseMs <= maxMs`);
  }
  return Object.freeze({
    type: input.type,
    ceiling: input.ceiling,
    handler: input.handler,
    maxAttempts,
    backoff,
    schema: input.schema,
  });
}

/** Capped exponential backoff: base doubling per failed attempt, never above the cap. */
export function backoffDelayMs(policy: BackoffPolicy, attempt: number): number {
  const exp = Math.min(Math.max(attempt - 1, 0), 40);
  return Math.min(policy.baseMs * 2 ** exp, policy.maxMs);
}

/** Validate a payload against a definition's schema; returns the parsed value or the issues. */
export async function validatePayload<P>(
  def: Pick<TaskDefinition<P>, 'schema' | 'type'>,
  payload: unknown,
): Promise<{ ok: true; value: P } | { ok: false; message: string }> {
  if (!def.schema) return { ok: true, value: payload as P };
  const result = await def.schema['~standard'].validate(payload);
  if (result.issues) {
    const detail = result.issues
      .map((i) => (i.path && i.path.length ? `${i.path.map(String).join('.')}: ${i.message}` : i.message))
      .join('; ');
    return { ok: false, message: `payload for task type "${def.type}" is invalid: ${detail}` };
  }
  return { ok: true, value: result.value };
}
