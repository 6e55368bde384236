/**
 * Each of berth's error classes carries a stable `code`: the class name in capitals
 * without its `Error` suffix. Messages are for people and may be reworded; a code never changes
 * once released, so match on it (or on the class) rather than on the text. A subclass has its
 * own code (`SchemaNotMigratedError` is a `BerthInputError` with code `SCHEMA_NOT_MIGRATED`).
 * docs/api.md lists them.
 */
export type BerthErrorCode =
  | 'BERTH_INPUT'
  | 'LEASE_LOST'
  | 'PERMANENT'
  | 'SCHEMA_NOT_MIGRATED'
  | 'SCHEMA_TOO_NEW'
  | 'MIGRATION_CHANGED'
  | 'SLICE_LEASE_LOST'
  | 'HTTP'
  | 'TOO_MANY_ATTEMPTS'
  | 'CLI_FAILURE'
  | 'SHUTDOWN_ABORT'
  | 'DEADLINE_ABORT'
  | 'CANCEL_ABORT'
  | 'CONNECT';

/**
 * The base of berth's errors. `instanceof BerthError` holds within one copy of berth; a task
 * module loaded through another module system gets its own copy (see PermanentError), so code
 * that must work across copies checks `code` (or `isPermanentError`).
 */
export abstract class BerthError extends Error {
  abstract readonly code: BerthErrorCode;
}

/** A caller passed something berth cannot accept (bad payload, option or config value). */
export class BerthInputError extends BerthError {
  override readonly code: BerthErrorCode = 'BERTH_INPUT';

  constructor(message: string) {
    super(message);
    this.name = 'BerthInputError';
  }
}

/** The schema is missing or older than the code: nothing was run against it. */
export class SchemaNotMigratedError extends BerthInputError {
  override readonly code: BerthErrorCode = 'SCHEMA_NOT_MIGRATED';

  constructor(
    readonly schema: string,
    message: string,
  ) {
    super(message);
    this.name = 'SchemaNotMigratedError';
  }
}

/**
 * PostgreSQL's answers when a schema, a table or a function of it is not there: 3F000
 * invalid_schema_name, 42P01 undefined_table, 42883 undefined_function.
 */
const NOT_MIGRATED_CODES: ReadonlySet<string> = new Set(['3F000', '42P01', '42883']);

/**
 * `err` as a SchemaNotMigratedError when PostgreSQL said the schema, a table or a function of
 * it does not exist (the call ran against a schema nobody migrated), else `err` itself. For the
 * producer's and the operator's calls, which would otherwise surface a bare SQLSTATE.
 */
export function notMigrated(err: unknown, schema: string): unknown {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== 'string' || !NOT_MIGRATED_CODES.has(code)) return err;
  const e = new SchemaNotMigratedError(
    schema,
    `berth schema "${schema}" is not migrated, or older than this code (${(err as Error).message}): run \`berth migrate --schema ${schema}\` or migrate()`,
  );
  (e as Error & { cause?: unknown }).cause = err;
  return e;
}

/** `run()`, its rejection passed through notMigrated: an operator action's door. */
export async function orNotMigrated<T>(schema: string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/**
 * A fenced write matched nothing: the lease token no longer owns the task. Dequeue and
 * RecordFailure raise it so the caller rolls back; the processor records the run as `lost`.
 */
export class LeaseLostError extends BerthError {
  override readonly code = 'LEASE_LOST';

  constructor(
    readonly taskId: string,
    operation: string,
  ) {
    super(`lease on task ${taskId} is no longer held; ${operation} refused`);
    this.name = 'LeaseLostError';
  }
}

const PERMANENT = Symbol.for('berth.PermanentError');

/**
 * Thrown by a handler (or by payload validation) for a failure no retry can fix.
 * The task goes straight to the dead letters with this message as last_error.
 */
export class PermanentError extends BerthError {
  override readonly code = 'PERMANENT';
  /** A brand, not `instanceof`: a task module loaded through another module system (tsx
   * loading a .ts file as CommonJS) gets its own copy of this class. */
  readonly [PERMANENT] = true;

  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'PermanentError';
  }
}

/** True for any PermanentError, whichever copy of berth created it. */
export function isPermanentError(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as Record<symbol, unknown>)[PERMANENT] === true;
}

/**
 * The reason a handler's `ctx.signal` carries when the worker stops (`worker.stop()`, SIGTERM):
 * the lease is released and the task is due again at once. A handler that checks
 * `signal.reason.code` can tell a shutdown (save progress, return `continue`) from a deadline.
 */
export class ShutdownAbort extends BerthError {
  override readonly code: BerthErrorCode = 'SHUTDOWN_ABORT';

  constructor() {
    super('worker is shutting down');
    this.name = 'ShutdownAbort';
  }
}

/** The reason a handler's `ctx.signal` carries when its attempt's deadline passes. */
export class DeadlineAbort extends BerthError {
  override readonly code: BerthErrorCode = 'DEADLINE_ABORT';

  constructor(readonly deadline: number) {
    super(`handler deadline ${new Date(deadline).toISOString()} passed`);
    this.name = 'DeadlineAbort';
  }
}

/**
 * The reason a handler's `ctx.signal` carries when an operator cancelled its task (`cancelTask`,
 * `berth tasks cancel`, the dashboard). The attempt is already settled as `cancelled`: whatever
 * the handler returns now is not written, and the task never runs again.
 */
export class CancelAbort extends BerthError {
  override readonly code: BerthErrorCode = 'CANCEL_ABORT';

  constructor() {
    super('task was cancelled by an operator');
    this.name = 'CancelAbort';
  }
}
