/** A caller passed something berth cannot accept (bad payload, option or config value). */
export class BerthInputError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BerthInputError';
  }
}

/**
 * A fenced write matched nothing: the lease token no longer owns the task. Dequeue and
 * RecordFailure raise it so the caller rolls back; the processor records the run as `lost`.
 */
export class LeaseLostError extends Error {
  constructor(readonly taskId: string, operation: string) {
    super(`lease on task ${taskId} is no longer held; ${operation} refused`);
    this.name = 'LeaseLostError';
  }
}

const PERMANENT = Symbol.for('berth.PermanentError');

/**
 * Thrown by a handler (or by payload validation) for a failure no retry can fix.
 * The task goes straight to the dead letters with this message as last_error.
 */
export class PermanentError extends Error {
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
