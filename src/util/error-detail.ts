/**
 * What a handler threw, as attempt history keeps it: the message, the name, the stack and the
 * `cause` chain, each bounded, so one pathological error (a megabyte message, a cause cycle) can
 * never make a settlement statement large. A value that is not an Error is kept as JSON (`throw
 * { code: 42 }` reads `{"code":42}`, not `[object Object]`).
 */
export interface ErrorDetail {
  message: string;
  name?: string;
  stack?: string;
  /** Own enumerable properties of the error other than the above (`code`, `status`, ...), as JSON. */
  data?: string;
  cause?: ErrorDetail;
}

/** Per text field. A stack of 4,000 characters is about 40 frames. */
export const MAX_MESSAGE_CHARS = 2000;
export const MAX_STACK_CHARS = 4000;
/** Links of the cause chain kept (the error itself counts as the first). */
export const MAX_CAUSE_DEPTH = 4;

/** Bounded, and storable: PostgreSQL refuses NUL in text and jsonb, and lone surrogates in jsonb. */
function clip(s: string, max: number): string {
  const cut = s.length <= max ? s : `${s.slice(0, max)}… (${s.length - max} more characters)`;
  return cut.replace(UNSTORABLE, '\uFFFD');
}

// biome-ignore lint/suspicious/noControlCharactersInRegex: NUL is one of the characters PostgreSQL refuses
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/**
 * JSON of any value, never throwing: bigints as strings, cycles and functions named, and
 * undefined / symbols as their `String()`.
 */
export function safeJson(value: unknown): string {
  const seen = new WeakSet<object>();
  try {
    const out = JSON.stringify(value, (_k, v: unknown) => {
      if (typeof v === 'bigint') return v.toString();
      if (typeof v === 'function') return `[function ${v.name || 'anonymous'}]`;
      if (typeof v === 'symbol') return v.toString();
      if (v !== null && typeof v === 'object') {
        if (seen.has(v)) return '[circular]';
        seen.add(v);
      }
      return v;
    });
    return out === undefined ? String(value) : out;
  } catch (err) {
    return `[unserialisable: ${(err as Error)?.message ?? 'unknown'}]`;
  }
}

/** The one-line message of a thrown value (what `last_error` stores). */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return clip(err.message || err.name, MAX_MESSAGE_CHARS);
  if (typeof err === 'string') return clip(err, MAX_MESSAGE_CHARS);
  return clip(safeJson(err), MAX_MESSAGE_CHARS);
}

const KNOWN = new Set(['message', 'name', 'stack', 'cause']);

/** The bounded detail of a thrown value, following `cause` up to MAX_CAUSE_DEPTH links. */
export function errorDetail(err: unknown, depth = 1): ErrorDetail {
  if (!(err instanceof Error)) return { message: errorMessage(err) };
  const d: ErrorDetail = { message: errorMessage(err) };
  if (err.name && err.name !== 'Error') d.name = clip(err.name, 200);
  if (typeof err.stack === 'string') d.stack = clip(err.stack, MAX_STACK_CHARS);
  const extra = Object.entries(err).filter(([k]) => !KNOWN.has(k));
  if (extra.length > 0) d.data = clip(safeJson(Object.fromEntries(extra)), MAX_MESSAGE_CHARS);
  const cause = (err as { cause?: unknown }).cause;
  if (cause !== undefined && depth < MAX_CAUSE_DEPTH) d.cause = errorDetail(cause, depth + 1);
  return d;
}
