import { unstorableInJson } from '../limits.js';
import type { ResultJson } from '../storage/results.js';
import { isSnooze } from '../task.js';
import { errorMessage } from '../util/error-detail.js';

/** The default cap on a handler's result, as JSON in UTF-8 bytes (the worker's `resultMaxBytes`). */
export const DEFAULT_RESULT_MAX_BYTES = 64 * 1024;
/**
 * The largest `resultMaxBytes` a worker accepts (16 MiB). A completion flush writes every result
 * of its batch in one statement, so a cap far above this would let one flush carry gigabytes.
 */
export const MAX_RESULT_MAX_BYTES = 16 * 1024 * 1024;

/**
 * What a handler's returned value comes to. berth's own answers: done (`'done'` or nothing),
 * `'continue'`, a snooze. Anything else is not an answer but the task's result: the task succeeds
 * and the value is stored with the completion (docs/architecture.md, "Where the seeds
 * disagree"), as `result` (its JSON; absent when there is nothing to store), or it cannot be
 * stored (`error`, the attempt's failure).
 */
export type HandlerReturn =
  | { kind: 'done'; result?: ResultJson }
  | { kind: 'continue' }
  | { kind: 'snooze'; delayMs: number }
  | { kind: 'unstorable'; error: string };

const DONE: HandlerReturn = Object.freeze({ kind: 'done' });
const CONTINUE: HandlerReturn = Object.freeze({ kind: 'continue' });

/**
 * Read a returned value once, and never throw: a Proxy whose traps throw (or throw only when read
 * again), a revoked Proxy or a throwing getter is a failure of the attempt that says so, never a
 * run that rejects (which would leave the settlement unwritten until rescue) or a second reading
 * that disagrees with the first.
 */
export function readHandlerReturn(value: unknown, maxBytes: number): HandlerReturn {
  if (value === undefined || value === 'done') return DONE;
  if (value === 'continue') return CONTINUE;
  try {
    if (isSnooze(value)) return { kind: 'snooze', delayMs: value.delayMs };
    const encoded = encodeResult(value, maxBytes);
    if (!encoded.ok) return { kind: 'unstorable', error: encoded.error };
    return encoded.json === null ? DONE : { kind: 'done', result: encoded.json };
  } catch (err) {
    return {
      kind: 'unstorable',
      error: `handler returned a value that could not be read (${reasonOf(err)}); a result must be a JSON value`,
    };
  }
}

/** What a thrown value says, even when reading it throws again. */
function reasonOf(err: unknown): string {
  try {
    return errorMessage(err);
  } catch {
    return 'an error that could not be read';
  }
}

/**
 * A handler's result as it is stored: its JSON text (`json`: null when there is nothing to
 * store), or why it cannot be stored (`error`, the attempt's failure).
 */
export type EncodedResult = { ok: true; json: ResultJson | null } | { ok: false; error: string };

const NOTHING: EncodedResult = Object.freeze({ ok: true, json: null });

/**
 * Encode a value a handler returned that is not one of berth's answers. `null` (and a value whose
 * JSON is `null`, such as an invalid Date) stores nothing: getTask's `result` is null either way,
 * so storing it would tell a reader nothing. Otherwise the value is JSON.stringify's rendering
 * (`toJSON` honoured; undefined and functions inside objects dropped, as JSON does), refused
 * when it has none (a function, a symbol), when JSON.stringify throws (a BigInt, a cycle), when
 * it holds what PostgreSQL cannot store (a NUL, a lone surrogate), or when it is over `maxBytes`
 * bytes of UTF-8: each a failure of the attempt, retried like a throw, never a success whose
 * result is lost, and never a completion that fails its whole flush.
 */
export function encodeResult(value: unknown, maxBytes: number): EncodedResult {
  if (value === null) return NOTHING;
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (err) {
    return {
      ok: false,
      error: `handler returned ${describeHandlerResult(value)}, which is not JSON-serialisable (${reasonOf(err)}); a result must be a JSON value`,
    };
  }
  if (json === undefined) {
    return {
      ok: false,
      error: `handler returned ${describeHandlerResult(value)}, which has no JSON form; a result must be a JSON value`,
    };
  }
  if (json === 'null') return NOTHING;
  // Three bytes of UTF-8 at most per UTF-16 unit: most results are under the cap without counting.
  if (json.length * 3 > maxBytes) {
    const bytes = Buffer.byteLength(json, 'utf8');
    if (bytes > maxBytes) {
      return {
        ok: false,
        error: `handler returned a result of ${bytes} bytes as JSON, over the worker's resultMaxBytes cap of ${maxBytes} bytes`,
      };
    }
  }
  const unstorable = unstorableInJson(json, 'result');
  if (unstorable !== undefined)
    return { ok: false, error: `handler returned a result PostgreSQL cannot store: ${unstorable}` };
  return { ok: true, json };
}

/** A short, bounded rendering of a returned value for an error message. */
export function describeHandlerResult(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return JSON.stringify(value.length > 60 ? `${value.slice(0, 60)}…` : value);
  if (typeof value === 'object') {
    // A Proxy's trap or a getter may throw, or hand back anything as the name.
    let name: unknown;
    try {
      name = (value as object).constructor?.name;
    } catch {
      name = undefined;
    }
    return `an object (${typeof name === 'string' ? name : 'Object'})`;
  }
  if (typeof value === 'function') return 'a function';
  if (typeof value === 'symbol') return 'a symbol';
  return `${typeof value} ${String(value)}`;
}
