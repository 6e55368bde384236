import { isSnooze } from '../task.js';

/**
 * Seed 000's handler contract has three answers: done (`'done'` or nothing), continue
 * (`'continue'`), or an error (a throw). Anything else a handler returns (42, 'retry', false,
 * an object) is outside it, and is recorded as a failure that names what came back.
 */
export function isContractResult(value: unknown): boolean {
  return value === undefined || value === 'done' || value === 'continue' || isSnooze(value);
}

/** A short, bounded rendering of an unexpected return value for the error message. */
export function describeHandlerResult(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return JSON.stringify(value.length > 60 ? `${value.slice(0, 60)}…` : value);
  if (typeof value === 'object') {
    const name = (value as object).constructor?.name ?? 'Object';
    return `an object (${name})`;
  }
  return `${typeof value} ${String(value)}`;
}
