import {
  type ErrorDetail,
  MAX_CAUSE_DEPTH,
  MAX_MESSAGE_CHARS,
  MAX_STACK_CHARS,
  safeJson,
} from '../util/error-detail.js';

/**
 * An attempt-history row's error as a reader may use it. A worker role can INSERT any row into
 * attempt_history (it writes its settlements' rows), so what comes back is checked, not trusted:
 * a field of the wrong type is made a string, every text field is bounded as the writer bounds
 * it (src/util/error-detail.ts), and the cause chain is cut at the writer's depth. A forged row
 * with a 3,000-deep chain made `berth history list --json` print 27 MB and `berth tasks show`
 * stop halfway on a TypeError; now it reads as a bounded error, with `problems` saying what was
 * wrong, and a listing carries on past it.
 */
export function readErrorDetail(raw: unknown): { error: ErrorDetail | null; problems: string[] } {
  const problems: string[] = [];
  const error = read(raw, 1, problems);
  return { error, problems };
}

function read(raw: unknown, depth: number, problems: string[]): ErrorDetail | null {
  if (raw === null || raw === undefined) return null;
  if (typeof raw !== 'object' || Array.isArray(raw)) {
    problems.push('its error is not a JSON object');
    return { message: bounded(typeof raw === 'string' ? raw : safeJson(raw), MAX_MESSAGE_CHARS) };
  }
  const o = raw as Record<string, unknown>;
  const detail: ErrorDetail = { message: text(o.message, 'message', MAX_MESSAGE_CHARS, problems) ?? '' };
  const name = text(o.name, 'name', 200, problems);
  if (name !== undefined) detail.name = name;
  const stack = text(o.stack, 'stack', MAX_STACK_CHARS, problems);
  if (stack !== undefined) detail.stack = stack;
  const data = text(o.data, 'data', MAX_MESSAGE_CHARS, problems);
  if (data !== undefined) detail.data = data;
  if (o.cause !== undefined && o.cause !== null) {
    if (depth >= MAX_CAUSE_DEPTH) {
      problems.push(`its cause chain is longer than ${MAX_CAUSE_DEPTH} (${chainLength(o.cause)} more left out)`);
    } else {
      const cause = read(o.cause, depth + 1, problems);
      if (cause) detail.cause = cause;
    }
  }
  return detail;
}

/** A text field: a string bounded to `max` characters, anything else as its JSON (and a problem). */
function text(value: unknown, field: string, max: number, problems: string[]): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string') {
    problems.push(`its error's ${field} is not a string`);
    return bounded(safeJson(value), max);
  }
  if (value.length > max) problems.push(`its error's ${field} is longer than ${max} characters`);
  return bounded(value, max);
}

function bounded(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max)}… (${s.length - max} more characters)`;
}

/** How many links hang below `cause`, counted without recursion (and stopping at 10,000). */
function chainLength(cause: unknown): string {
  let n = 0;
  for (let c = cause; c !== null && typeof c === 'object' && n < 10_000; c = (c as { cause?: unknown }).cause) n++;
  return n >= 10_000 ? 'at least 10000' : String(n);
}
