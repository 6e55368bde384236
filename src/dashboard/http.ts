import type { IncomingMessage, ServerResponse } from 'node:http';
import { BerthError, type BerthErrorCode } from '../errors.js';
import { rejectNulDeep } from './params.js';
import type { ErrorAnswer } from './wire.js';

/** An answer with a status and a message safe to show the client. */
export class HttpError extends BerthError {
  override readonly code: BerthErrorCode = 'HTTP';

  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = 'HttpError';
  }
}

/**
 * Sent with every response. Scripts and styles only from this origin (no inline script, so
 * nothing injected into a page can run), never framed, no MIME sniffing.
 */
export const SECURITY_HEADERS: Readonly<Record<string, string>> = Object.freeze({
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'same-origin',
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-resource-policy': 'same-origin',
});

export function send(
  res: ServerResponse,
  status: number,
  contentType: string,
  body: string,
  headers: Record<string, string | string[]> = {},
): void {
  res.writeHead(status, { ...SECURITY_HEADERS, 'content-type': contentType, 'cache-control': 'no-store', ...headers });
  res.end(body);
}

/**
 * What sendJson makes of a value of type T, as a type: a Date (anything with `toJSON`) becomes
 * what its `toJSON` returns, an ISO string; a bigint becomes text; undefined, a function or a
 * symbol is left out of an object (null in an array); `unknown` stays unknown. A Map or a Set
 * would be sent as `{}`, so it has no JSON type (`never`): convert it first. The API's routes
 * return `Json<...>` of their server types checked against the shapes in wire.ts.
 */
export type Json<T> = unknown extends T
  ? unknown
  : T extends { toJSON(): infer R }
    ? Json<R>
    : T extends bigint
      ? string
      : T extends string | number | boolean | null
        ? T
        : T extends undefined | symbol | ((...args: never[]) => unknown)
          ? undefined
          : T extends ReadonlyMap<unknown, unknown> | ReadonlySet<unknown>
            ? never
            : T extends readonly (infer U)[]
              ? (Exclude<Json<U>, undefined> | (undefined extends Json<U> ? null : never))[]
              : { [K in keyof T]: Json<T[K]> };

/**
 * A value as the JSON sendJson will send for it, typed as such: the conversion is sendJson's
 * (JSON.stringify and its bigint replacer), this only states it in the type, so a route's answer
 * can be checked against its wire shape (wire.ts) without copying the value.
 */
export function json<T>(value: T): Json<T> {
  return value as unknown as Json<T>;
}

/** Dates as ISO strings, bigint as text: what JSON.stringify does, plus bigint. */
export function sendJson(
  res: ServerResponse,
  status: number,
  value: unknown,
  headers: Record<string, string | string[]> = {},
): void {
  const body = JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
  send(res, status, 'application/json; charset=utf-8', body, headers);
}

export function sendError(res: ServerResponse, err: HttpError): void {
  const answer: ErrorAnswer = { error: err.message };
  sendJson(res, err.status, answer, err.headers);
}

const MAX_BODY = 64 * 1024;

/** The request body as text, at most 64 KiB (413 beyond); a raw NUL byte in it is a 400. */
export async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const b = chunk as Buffer;
    size += b.length;
    if (size > MAX_BODY) throw new HttpError(413, 'request body too large');
    chunks.push(b);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  if (text.includes('\u0000'))
    throw new HttpError(400, 'the request body contains a NUL byte (\\0), which PostgreSQL text cannot hold');
  return text;
}

/** A JSON object body; an empty body is `{}`. */
export async function readJsonObject(req: IncomingMessage): Promise<Record<string, unknown>> {
  const text = await readBody(req);
  if (text.trim() === '') return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new HttpError(400, 'the request body is not valid JSON');
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw new HttpError(400, 'the request body must be a JSON object');
  // A NUL as the escape \u0000 only shows once parsed: check every string and key.
  rejectNulDeep(value);
  return value as Record<string, unknown>;
}

export function parseCookies(header: string | undefined): Map<string, string> {
  const out = new Map<string, string>();
  for (const part of (header ?? '').split(';')) {
    const i = part.indexOf('=');
    if (i < 0) continue;
    const name = part.slice(0, i).trim();
    if (name && !out.has(name)) out.set(name, part.slice(i + 1).trim());
  }
  return out;
}
