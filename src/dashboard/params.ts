import { taskId as checkTaskId } from '../storage/ids.js';
import { BerthInputError } from '../errors.js';
import { MAX_QUEUE_BYTES, MAX_TYPE_CHARS, unstorable } from '../limits.js';

/** Checks on request values (query strings and JSON bodies); each throws BerthInputError (400). */

/**
 * Longest queue name a request may carry, in UTF-8 bytes: the producer's own limit (a longer
 * one cannot have been enqueued).
 */
export const MAX_QUEUE_NAME_BYTES = MAX_QUEUE_BYTES;
/** Longest task type, in characters (as `enqueue` and `defineTask` check it). */
export const MAX_TASK_TYPE_CHARS = MAX_TYPE_CHARS;
/** Longest error filter and pause reason, in characters. */
export const MAX_FILTER_TEXT_CHARS = 500;

/**
 * A NUL byte (or a lone surrogate) anywhere in `value` is a 400 naming where it was: PostgreSQL
 * text cannot hold the one, and the other would match nothing.
 */
export function rejectNul(value: string, where: string): string {
  const bad = unstorable(value);
  if (bad) throw new BerthInputError(`${where} contains ${bad}`);
  return value;
}

/** Every string (and key) in a parsed JSON body, checked for NUL bytes. */
export function rejectNulDeep(value: unknown, where = 'the request body'): void {
  if (typeof value === 'string') rejectNul(value, where);
  else if (Array.isArray(value)) for (const v of value) rejectNulDeep(v, where);
  else if (typeof value === 'object' && value !== null) {
    for (const [k, v] of Object.entries(value)) {
      rejectNul(k, where);
      rejectNulDeep(v, where);
    }
  }
}

/** A queue name (path segment, query or body): at most MAX_QUEUE_NAME_BYTES, no NUL. */
export function queueName(value: string, name = 'queue'): string {
  rejectNul(value, name);
  if (Buffer.byteLength(value, 'utf8') > MAX_QUEUE_NAME_BYTES) {
    throw new BerthInputError(
      `${name} must be a name of at most ${MAX_QUEUE_NAME_BYTES} bytes (UTF-8), got ${Buffer.byteLength(value, 'utf8')}`,
    );
  }
  return value;
}

/** A task type (path segment): at most MAX_TASK_TYPE_CHARS characters (as `defineTask` takes it), no NUL. */
export function taskType(value: string, name = 'type'): string {
  rejectNul(value, name);
  if (value.length > MAX_TASK_TYPE_CHARS)
    throw new BerthInputError(
      `${name} must be a task type of at most ${MAX_TASK_TYPE_CHARS} characters, got ${value.length}`,
    );
  return value;
}

export function optionalQueue(value: unknown, name = 'queue'): string | undefined {
  if (value === undefined || value === null || value === '') return undefined;
  if (typeof value !== 'string') throw new BerthInputError(`${name} must be a queue name (text)`);
  return queueName(value, name);
}

/** A task id from a path or body: a positive bigint (up to 2^63 - 1), else 400. */
export function taskId(value: string, what = 'task id'): string {
  return checkTaskId(value.length > 40 ? `${value.slice(0, 40)}…` : value, what);
}

/** A keyset cursor (`?after=`): absent, or a task id. */
export function optionalCursor(url: URL): string | undefined {
  const v = optionalQuery(url, 'after', 40);
  return v === undefined ? undefined : taskId(v, 'page cursor');
}

/** A short text value (queue, type, filter), or undefined when absent or empty. */
export function optionalText(value: unknown, name: string, max = MAX_TASK_TYPE_CHARS): string | undefined {
  if (value === undefined || value === null || value === '') return undefined;
  if (typeof value !== 'string' || value.length > max)
    throw new BerthInputError(`${name} must be text of at most ${max} characters`);
  return rejectNul(value, name);
}

export function optionalQuery(url: URL, name: string, max = MAX_TASK_TYPE_CHARS): string | undefined {
  return optionalText(url.searchParams.get(name) ?? undefined, name, max);
}

export function optionalQueueQuery(url: URL): string | undefined {
  return optionalQueue(url.searchParams.get('queue') ?? undefined);
}

export function queryLimit(url: URL): number | undefined {
  const v = url.searchParams.get('limit');
  if (v === null || v === '') return undefined;
  if (!/^[0-9]{1,4}$/.test(v)) throw new BerthInputError('limit must be an integer from 1 to 500');
  return Number(v);
}

export function optionalInteger(value: unknown, name: string): number | undefined {
  if (value === undefined || value === null || value === '') return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value)) throw new BerthInputError(`${name} must be an integer`);
  return value;
}

export function optionalBoolean(value: unknown, name: string): boolean | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'boolean') throw new BerthInputError(`${name} must be true or false`);
  return value;
}

export function optionalIds(value: unknown): string[] | undefined {
  if (value === undefined || value === null) return undefined;
  if (!Array.isArray(value) || value.length > 1000)
    throw new BerthInputError('ids must be a list of at most 1000 task ids');
  return value.map((v) => taskId(typeof v === 'string' ? v : String(v)));
}
