import { BerthInputError } from './errors.js';
import { didYouMean } from './util/nearest.js';

/**
 * What PostgreSQL can store, checked in the client so a bad value is refused with a
 * `BerthInputError` naming the field (and the task) before anything is written, instead of
 * failing inside the statement with a raw SQLSTATE. Documented in docs/configuration.md.
 */

/** A task type, in characters (at most 800 UTF-8 bytes; it is in the outcome-count key). */
export const MAX_TYPE_CHARS = 200;
/**
 * A queue name, in UTF-8 bytes. Queue names are btree keys (lanes, deferred, queue_pauses,
 * dead_letters, and outcome_counts next to the type and the worker id), and PostgreSQL refuses an
 * index row over 2704 bytes (a third of a page): a 2.7 KB name failed the enqueue with 54000.
 * 255 leaves the widest key (outcome_counts: 8 + worker id + 255 + 800 + outcome) far below it.
 */
export const MAX_QUEUE_BYTES = 255;
/**
 * An installation schema's name, in UTF-8 bytes: PostgreSQL keeps 63 bytes of a name, and the
 * schema's wake channel is `<schema>.wake` (src/sql.ts), which past 58 bytes made every enqueue
 * fail with "channel name too long" (its NOTIFY runs in the enqueue's own transaction).
 */
export const MAX_SCHEMA_BYTES = 58;

/** An installation schema's name (see MAX_SCHEMA_BYTES), for migrate() and the worker. */
export function checkSchemaName(value: unknown, where: string): string {
  return checkText(value, 'schema', where, { maxBytes: MAX_SCHEMA_BYTES, nonEmpty: true });
}
/** A dedupe key, in UTF-8 bytes: the `dedupe` primary key holds it alone (limit 2704). */
export const MAX_DEDUPE_KEY_BYTES = 1024;
/** An operator's name as a cancel records it (cancel_tasks() refuses a longer one, migration 20). */
export const MAX_ACTOR_CHARS = 200;
/** maxAttempts, for definitions, enqueue and the CLI alike (the column is an int4). */
export const MAX_ATTEMPTS_LIMIT = 1_000_000;
/**
 * When a task may run: years 1 to 9999 (UTC). PostgreSQL stores 4713 BC to 294276 AD, but a run
 * time is read back as a JavaScript Date, which ends in 275760 (pg then returns null), and a
 * date past 9999 is a unit mistake, not a schedule.
 */
export const MIN_RUN_AT_MS = Date.parse('0001-01-01T00:00:00.000Z');
export const MAX_RUN_AT_MS = Date.parse('9999-12-31T23:59:59.999Z');
/** Node's timer limit (2^31 - 1 ms, 24.8 days): a longer setTimeout fires at once. */
export const MAX_TIMER_MS = 2_147_483_647;

// In `u` mode a surrogate range matches only a lone surrogate (a pair is one code point).
// biome-ignore lint/suspicious/noControlCharactersInRegex: NUL is one of the characters jsonb refuses
const UNSTORABLE = /[\u0000\ud800-\udfff]/u;
// What JSON.stringify makes of the same characters: `\u0000`, and a lone surrogate as
// `\udXXX` (a pair is written as is). jsonb refuses both (22P05, 22P02). A match can also be
// the text `\u0000` after an escaped backslash (`\\u0000`); `isEscapeAt` tells them apart.
const UNSTORABLE_IN_JSON = /\\u(?:0000|d[89a-f][0-9a-f]{2})/g;

/** What in `s` PostgreSQL cannot store as text, described; undefined when nothing. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const unstorable = (function (s: string): string | undefined {
  // A plain loop first: ~10 ns for a short key, against ~50 ns for the regex.
  let suspect = false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0 || (c >= 0xd800 && c <= 0xdfff)) {
      suspect = true;
      break;
    }
  }
  const m = suspect ? UNSTORABLE.exec(s) : null;
  if (!m) return undefined;
  const c = m[0].charCodeAt(0);
  return c === 0
    ? 'a NUL character (\\u0000), which PostgreSQL cannot store'
    : `a lone surrogate (\\u${c.toString(16)}), which is not valid Unicode text`;
});

/**
 * A text field: a string, within `maxBytes` UTF-8 bytes (or `maxChars` characters), without a
 * NUL or a lone surrogate (pg would silently store U+FFFD for the latter, so two distinct dedupe
 * keys could collide). `where` names the task ("task #3"). Messages are built only on failure:
 * this runs for every task of a bulk enqueue.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const checkText = (function (
  value: unknown,
  field: string,
  where: string,
  limit: { maxBytes?: number; maxChars?: number; nonEmpty?: boolean },
): string {
  if (typeof value !== 'string' || (limit.nonEmpty && value.length === 0)) throw textError(field, where, limit, '');
  // A UTF-16 unit is at most 3 UTF-8 bytes: short strings skip the byte count.
  if (limit.maxBytes !== undefined) {
    if (value.length * 3 > limit.maxBytes) {
      const bytes = Buffer.byteLength(value, 'utf8');
      if (bytes > limit.maxBytes) throw textError(field, where, limit, ` (got ${bytes} bytes)`);
    }
  } else if (value.length > limit.maxChars!) {
    throw textError(field, where, limit, ` (got ${value.length} characters)`);
  }
  const bad = unstorable(value);
  if (bad) throw new BerthInputError(`${where ? `${where}: ` : ''}${field} contains ${bad}`);
  return value;
});

function textError(
  field: string,
  where: string,
  limit: { maxBytes?: number; maxChars?: number; nonEmpty?: boolean },
  detail: string,
) {
  const size = limit.maxBytes !== undefined ? `${limit.maxBytes} UTF-8 bytes` : `${limit.maxChars} characters`;
  return new BerthInputError(
    `${where ? `${where}: ` : ''}${field} must be ${limit.nonEmpty ? 'a non-empty' : 'a'} string of at most ${size}${detail}`,
  );
}

/**
 * The queue and type of an operator's filter, checked as enqueue checks them: a name no task can
 * have (NUL, a lone surrogate, too long) is refused with its reason instead of reaching
 * PostgreSQL, which answers NUL with a bare encoding error and matches nothing for the rest.
 */
export function checkNameFilter(filter: { queue?: unknown; type?: unknown }, where: string): void {
  if (filter.queue !== undefined) checkText(filter.queue, 'queue', where, { maxBytes: MAX_QUEUE_BYTES });
  if (filter.type !== undefined) checkText(filter.type, 'type', where, { maxChars: MAX_TYPE_CHARS });
}

/** An integer in [min, max], else an error naming the field and the range. */
export function checkInteger(value: unknown, field: string, where: string, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new BerthInputError(
      `${where ? `${where}: ` : ''}${field} must be an integer from ${min} to ${max} (got ${show(value)})`,
    );
  }
  return value;
}

/** A number of milliseconds in [min, max] (finite), else an error naming the field. */
export function checkMs(value: unknown, field: string, where: string, min: number, max: number, why = ''): number {
  if (typeof value !== 'number' || !(value >= min && value <= max)) {
    throw new BerthInputError(
      `${where ? `${where}: ` : ''}${field} must be a number of milliseconds from ${min} to ${max}${why} (got ${show(value)})`,
    );
  }
  return value;
}

/**
 * Refuse keys a caller did not mean (a misspelt `dealy` would otherwise be dropped silently),
 * naming the key and the nearest known one. `what` says whose option it is ("task #3");
 * `hints` maps names other libraries use to ours, where spelling alone would not find it
 * (`backoff.initial` → `baseMs`).
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const checkKeys = (function (
  value: object,
  known: ReadonlySet<string>,
  what: string,
  hints?: Readonly<Record<string, string>>,
): void {
  for (const key in value) {
    if (!known.has(key)) throw unknownOption(key, known, what, hints);
  }
});

/** The error for an unknown option key: the key, the nearest known one, and the full list. */
export function unknownOption(
  key: string,
  known: Iterable<string>,
  what: string,
  hints?: Readonly<Record<string, string>>,
): BerthInputError {
  const list = [...known];
  const hint = hints && Object.hasOwn(hints, key) ? `; did you mean "${hints[key]}"?` : didYouMean(key, list);
  return new BerthInputError(`${what ? `${what}: ` : ''}unknown option "${key}"${hint} (expected ${list.join(', ')})`);
}

/**
 * A payload's JSON, scanned once for what jsonb refuses. Only on a hit is the payload walked, to
 * name the path of the offending value or key.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const checkPayloadJson = (function (json: string, where: string, type: string): void {
  const found = unstorableInJson(json, 'payload');
  if (found !== undefined) throw new BerthInputError(`${where} (${type}): ${found}`);
});

/**
 * What in a JSON text (JSON.stringify's) jsonb refuses, named by its path under `root`;
 * undefined when nothing (a handler's result is checked with it too).
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const unstorableInJson = (function (json: string, root: string): string | undefined {
  // Most values have no `\u` escape at all: one native scan (~15 ns for a small payload).
  if (json.indexOf('\\u') === -1) return undefined;
  UNSTORABLE_IN_JSON.lastIndex = 0;
  for (let m = UNSTORABLE_IN_JSON.exec(json); m; m = UNSTORABLE_IN_JSON.exec(json)) {
    if (isEscapeAt(json, m.index)) {
      return (
        findUnstorable(JSON.parse(json) as unknown, root) ??
        `${root} contains ${unstorable(JSON.parse(`"${m[0]}"`) as string)}`
      );
    }
  }
  return undefined;
});

/** Whether the backslash at `i` starts an escape: an even number of backslashes precede it. */
function isEscapeAt(json: string, i: number): boolean {
  let n = 0;
  while (i - n - 1 >= 0 && json.charCodeAt(i - n - 1) === 92) n++;
  return n % 2 === 0;
}

/** The first string or key under `value` that PostgreSQL cannot store, with its path. */
function findUnstorable(value: unknown, path: string): string | undefined {
  if (typeof value === 'string') {
    const bad = unstorable(value);
    return bad && `${path} contains ${bad}`;
  }
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = findUnstorable(value[i], `${path}[${i}]`);
      if (found) return found;
    }
    return undefined;
  }
  if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      const bad = unstorable(k);
      if (bad) return `key ${JSON.stringify(k)} in ${path} contains ${bad}`;
      const found = findUnstorable(v, /^[A-Za-z_$][\w$]*$/.test(k) ? `${path}.${k}` : `${path}[${JSON.stringify(k)}]`);
      if (found) return found;
    }
  }
  return undefined;
}

function show(value: unknown): string {
  if (typeof value === 'string')
    return value.length > 40 ? `a string of ${value.length} characters` : JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean' || value === null || value === undefined)
    return String(value);
  return typeof value;
}
