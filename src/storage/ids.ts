import { BerthInputError } from '../errors.js';

const MAX_BIGINT = 9223372036854775807n;

/** True for a task id PostgreSQL's bigint can hold: a positive integer up to 2^63 - 1. */
export function isTaskId(value: unknown): value is string {
  return typeof value === 'string' && /^[0-9]{1,19}$/.test(value) && BigInt(value) > 0n && BigInt(value) <= MAX_BIGINT;
}

/** A task id (or keyset cursor) from outside, checked; `what` names it in the error. */
export function taskId(value: string, what = 'task id'): string {
  if (!isTaskId(value))
    throw new BerthInputError(`bad ${what} "${value}": expected a positive integer up to 9223372036854775807`);
  return value;
}
