import { BASE, CSRF } from './shell.js';
import type { ActionAnswer } from '../wire.js';

/** An API answer that was not 2xx: its status and the server's `error` text. */
class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

function errorText(body: unknown): string | null {
  return typeof body === 'object' && body !== null && 'error' in body && body.error ? String(body.error) : null;
}

/**
 * A request to the dashboard's JSON API. A 401 (the session expired or was logged out) reloads
 * the page, which then shows the login form. The answer is taken to have the shape `T` the
 * server's route returns (see src/dashboard/wire.ts): this is where the client trusts its own server.
 */
export async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  init.credentials = 'same-origin';
  const res = await fetch(BASE + path, init);
  const text = await res.text();
  let body: unknown = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (res.status === 401) location.reload();
  if (!res.ok) throw new ApiError(res.status, errorText(body) || `${res.status} ${res.statusText}`);
  return body as T;
}

/** An action: a POST with the CSRF header and a JSON body. */
export function post(path: string, body?: object): Promise<ActionAnswer | null> {
  return api<ActionAnswer | null>(path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-berth-csrf': CSRF },
    body: JSON.stringify(body || {}),
  });
}

/** A query string of the parameters that have a value ('' when none has). */
export function query(params: Readonly<Record<string, string | null | undefined>>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const text = q.toString();
  return text ? `?${text}` : '';
}

/** The message of whatever a promise rejected with. */
export function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
