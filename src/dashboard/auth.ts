import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { HttpError, parseCookies } from './http.js';
import { hasAuth, isLoopbackHost, type DashboardAuth } from './options.js';

/** Who is making a request, as recorded on the audit log, and the CSRF token their pages carry. */
export interface Principal {
  /** `dashboard:<basic user>`, `dashboard:token` or `dashboard:local`. */
  actor: string;
  /** What a state-changing request must send as `x-berth-csrf`. */
  csrf: string;
  /** Set when the request came with a login session cookie. */
  sessionId?: string;
}

export const SESSION_COOKIE = 'berth_session';
const SESSION_TTL_MS = 12 * 60 * 60_000;
const MAX_SESSIONS = 10_000;

/** Equal strings in time that does not depend on where they differ (or on their lengths). */
export function safeEqual(a: string, b: string): boolean {
  const ha = createHash('sha256').update(a, 'utf8').digest();
  const hb = createHash('sha256').update(b, 'utf8').digest();
  return timingSafeEqual(ha, hb);
}

function randomId(): string {
  return randomBytes(32).toString('base64url');
}

/**
 * Bearer token, login sessions (a random id in an HttpOnly cookie, never the token itself) and
 * HTTP Basic users; with none configured, everyone on loopback is `dashboard:local`. Sessions
 * live in this process: a restart logs everyone out.
 */
export class Authenticator {
  readonly required: boolean;
  private readonly secret = randomBytes(32);
  private readonly sessions = new Map<string, { csrf: string; expiresAt: number }>();
  private readonly users: [string, string][];

  constructor(private readonly auth: DashboardAuth | undefined) {
    this.required = hasAuth(auth);
    this.users = Object.entries(auth?.users ?? {});
  }

  get acceptsLogin(): boolean {
    return Boolean(this.auth?.token);
  }

  get acceptsBasic(): boolean {
    return this.users.length > 0;
  }

  /** What a 401 carries: a Basic challenge when users are configured. */
  challenge(): Record<string, string> {
    return this.acceptsBasic ? { 'www-authenticate': 'Basic realm="berth dashboard", charset="UTF-8"' } : {};
  }

  /** The principal, or null when credentials are missing or wrong (answer 401). */
  authenticate(req: IncomingMessage): Principal | null {
    if (!this.required) {
      // No credentials: refuse a Host that is not loopback, so a page on another site cannot
      // reach this one through DNS rebinding.
      if (!isLoopbackHost(hostName(req.headers.host))) {
        throw new HttpError(403, 'this dashboard has no authentication and answers requests to localhost only');
      }
      return this.principal('dashboard:local');
    }
    const header = req.headers.authorization;
    if (header !== undefined) return this.fromAuthorization(header);
    const sid = parseCookies(req.headers.cookie).get(SESSION_COOKIE);
    if (sid === undefined) return null;
    const session = this.sessions.get(sid);
    if (!session) return null;
    if (session.expiresAt <= Date.now()) {
      this.sessions.delete(sid);
      return null;
    }
    return { actor: 'dashboard:token', csrf: session.csrf, sessionId: sid };
  }

  private fromAuthorization(header: string): Principal | null {
    const [scheme = '', value = ''] = header.trim().split(/\s+/, 2);
    if (scheme.toLowerCase() === 'bearer' && this.auth?.token) {
      return safeEqual(value, this.auth.token) ? this.principal('dashboard:token') : null;
    }
    if (scheme.toLowerCase() === 'basic' && this.acceptsBasic) {
      const decoded = Buffer.from(value, 'base64').toString('utf8');
      const i = decoded.indexOf(':');
      if (i < 0) return null;
      const user = decoded.slice(0, i);
      const password = decoded.slice(i + 1);
      // Compare against every user, so the time taken does not say which names exist.
      let match: string | null = null;
      for (const [u, p] of this.users) {
        const ok = safeEqual(u, user) && safeEqual(p, password);
        if (ok && match === null) match = u;
      }
      return match === null ? null : this.principal(`dashboard:${match}`);
    }
    return null;
  }

  /** Basic, bearer and local principals have no session: their CSRF token is an HMAC of who they are. */
  private principal(actor: string): Principal {
    return { actor, csrf: createHmac('sha256', this.secret).update(actor).digest('base64url') };
  }

  /** A new session id for a correct token; null otherwise. */
  login(token: string): string | null {
    if (!this.auth?.token || !safeEqual(token, this.auth.token)) return null;
    const now = Date.now();
    for (const [id, s] of this.sessions) if (s.expiresAt <= now) this.sessions.delete(id);
    while (this.sessions.size >= MAX_SESSIONS) {
      const oldest = this.sessions.keys().next().value;
      if (oldest === undefined) break;
      this.sessions.delete(oldest);
    }
    const id = randomId();
    this.sessions.set(id, { csrf: randomId(), expiresAt: now + SESSION_TTL_MS });
    return id;
  }

  logout(sessionId: string | undefined): void {
    if (sessionId !== undefined) this.sessions.delete(sessionId);
  }

  sessionCookie(id: string, path: string, secure: boolean): string {
    return `${SESSION_COOKIE}=${id}; Path=${path}; HttpOnly; SameSite=Strict; Max-Age=${SESSION_TTL_MS / 1000}${secure ? '; Secure' : ''}`;
  }

  clearCookie(path: string): string {
    return `${SESSION_COOKIE}=; Path=${path}; HttpOnly; SameSite=Strict; Max-Age=0`;
  }
}

/** The host name of a Host header value (`[::1]:4680` -> `[::1]`), or '' when it is not one. */
export function hostName(host: string | undefined): string {
  if (!host) return '';
  try {
    return new URL(`http://${host}`).hostname;
  } catch {
    return '';
  }
}

/**
 * A state-changing request must carry the principal's CSRF token in `x-berth-csrf`, and its
 * Origin (or, without one, its Referer) must name this host when the browser sent one.
 */
export function checkCsrf(req: IncomingMessage, principal: Principal): void {
  const sent = req.headers['x-berth-csrf'];
  if (typeof sent !== 'string' || !safeEqual(sent, principal.csrf)) {
    throw new HttpError(403, 'missing or wrong x-berth-csrf header (reload the page)');
  }
  checkSameOrigin(req);
}

/** Origin, else Referer, when present, must be this Host. */
export function checkSameOrigin(req: IncomingMessage): void {
  const origin = req.headers.origin ?? req.headers.referer;
  if (origin === undefined) return;
  let host: string;
  try {
    host = new URL(origin).host;
  } catch {
    throw new HttpError(403, 'cross-origin request refused');
  }
  if (!req.headers.host || host.toLowerCase() !== req.headers.host.toLowerCase()) {
    throw new HttpError(403, 'cross-origin request refused');
  }
}
