import { taskId as checkTaskId } from '../admin/ids.js';
import { BerthInputError } from '../errors.js';
import { unstorable } from '../limits.js';

/** Checks on request values (query strings and JSON bodies); each throws BerthInputError (400). */

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
export function optionalText(value: unknown, name: string, max = 200): string | undefined {
  if (value === undefined || value === null || value === '') return undefined;
  if (typeof value !== 'string' || value.length > max) throw new BerthInputError(`${name} must be text of at most ${max} characters`);
  // A NUL or a lone surrogate would fail the query (22021) or match nothing; say so instead.
  const bad = unstorable(value);
  if (bad) throw new BerthInputError(`${name} contains ${bad}`);
  return value;
}

export function optionalQuery(url: URL, name: string, max = 200): string | undefined {
  return optionalText(url.searchParams.get(name) ?? undefined, name, max);
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
  if (!Array.isArray(value) || value.length > 1000) throw new BerthInputError('ids must be a list of at most 1000 task ids');
  return value.map((v) => taskId(typeof v === 'string' ? v : String(v)));
}
