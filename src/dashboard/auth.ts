import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { BerthErrorCode } from '../errors.js';
import type { Logger } from '../logger.js';
import type { AuthLimits } from './auth-limits.js';
import { clientKey } from './client-address.js';
import { FailureLog, type AuthMethod } from './failure-log.js';
import { HttpError, parseCookies } from './http.js';
import { AuthLimiter } from './limiter.js';
import { hasAuth, isLoopbackHost, type DashboardAuth } from './options.js';

/** Who is making a request, as recorded on the audit log, and the CSRF token their pages carry. */
export interface Principal {
  /** `dashboard:<basic user>`, `dashboard:token` or `dashboard:local`. */
  actor: string;
  /** What a state-changing request must send as `x-berth-csrf` (when `ambient`). */
  csrf: string;
  /**
   * Whether a browser sends this credential by itself, on a request another site's page makes
   * (a session cookie, remembered Basic credentials, a loopback address): then a state-changing
   * request must prove it comes from the dashboard's own page with the CSRF token. An
   * `Authorization: Bearer` header is never ambient: only code that holds the token can send it,
   * and a cross-origin page cannot even try without a CORS preflight the dashboard never grants.
   */
  ambient: boolean;
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

/** 429: this client, user or token has failed too often; the secret was not read. */
export class TooManyAttemptsError extends HttpError {
  override readonly code: BerthErrorCode = 'TOO_MANY_ATTEMPTS';

  constructor(readonly retryAfterSeconds: number) {
    super(429, `too many failed authentications: try again in ${retryAfterSeconds} s`, {
      'retry-after': String(retryAfterSeconds),
    });
    this.name = 'TooManyAttemptsError';
  }
}

/** The shared limiter key of the token (bearer and form), and of a Basic user name (hashed: any length in, 64 bytes kept). */
const TOKEN_KEY = 'token';
const userKey = (user: string) => `user:${createHash('sha256').update(user, 'utf8').digest('hex')}`;

/**
 * Bearer token, login sessions (a random id in an HttpOnly cookie, never the token itself) and
 * HTTP Basic users; with none configured, everyone on loopback is `dashboard:local`. Sessions
 * live in this process: a restart logs everyone out. Every secret comparison goes through the
 * failure limiter first (429 without reading the secret while the client, user or token waits)
 * and its failures through the bounded failure log.
 */
export class Authenticator {
  readonly required: boolean;
  private readonly secret = randomBytes(32);
  private readonly sessions = new Map<string, { csrf: string; expiresAt: number }>();
  private readonly users: [string, string][];
  private readonly limiter: AuthLimiter;
  private readonly failures: FailureLog;

  constructor(
    private readonly auth: DashboardAuth | undefined,
    private readonly limits: AuthLimits,
    logger: Logger,
  ) {
    this.required = hasAuth(auth);
    this.users = Object.entries(auth?.users ?? {});
    this.limiter = new AuthLimiter(limits, new Set([TOKEN_KEY, ...this.users.map(([u]) => userKey(u))]));
    this.failures = new FailureLog(logger, limits.logLinesPerMinute);
  }

  /**
   * Compare a secret unless the client or the shared key (user, token) must wait: then 429
   * without comparing. Returns the actor, or null for a wrong secret.
   */
  private guarded(
    req: IncomingMessage,
    method: AuthMethod,
    shared: string,
    user: string | undefined,
    compare: () => string | null,
  ): string | null {
    const client = clientKey(req, this.limits.trustProxy);
    const waitMs = this.limiter.retryAfterMs(client, shared);
    if (waitMs > 0) {
      this.failures.refused(method);
      throw new TooManyAttemptsError(Math.ceil(waitMs / 1000));
    }
    const actor = compare();
    if (actor === null) {
      const { lockedOut } = this.limiter.failed(client, shared);
      const named = lockedOut.map((k) =>
        k === client ? `client ${client}` : user !== undefined ? `user ${clip(user)}` : 'token',
      );
      this.failures.failed(method, { remote: client, ...(user !== undefined && { user: clip(user) }) }, named);
    } else {
      this.limiter.succeeded(client, shared);
    }
    return actor;
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
      return this.principal('local', 'dashboard:local');
    }
    const header = req.headers.authorization;
    if (header !== undefined) return this.fromAuthorization(req, header);
    const sid = parseCookies(req.headers.cookie).get(SESSION_COOKIE);
    if (sid === undefined) return null;
    const session = this.sessions.get(sid);
    if (!session) return null;
    if (session.expiresAt <= Date.now()) {
      this.sessions.delete(sid);
      return null;
    }
    return { actor: 'dashboard:token', csrf: session.csrf, ambient: true, sessionId: sid };
  }

  private fromAuthorization(req: IncomingMessage, header: string): Principal | null {
    const [scheme = '', value = ''] = header.trim().split(/\s+/, 2);
    if (scheme.toLowerCase() === 'bearer' && this.auth?.token) {
      const token = this.auth.token;
      const actor = this.guarded(req, 'bearer', TOKEN_KEY, undefined, () =>
        safeEqual(value, token) ? 'dashboard:token' : null,
      );
      return actor === null ? null : this.principal('bearer', actor);
    }
    if (scheme.toLowerCase() === 'basic' && this.acceptsBasic) {
      const decoded = Buffer.from(value, 'base64').toString('utf8');
      const i = decoded.indexOf(':');
      if (i < 0) return null;
      const user = decoded.slice(0, i);
      const password = decoded.slice(i + 1);
      const actor = this.guarded(req, 'basic', userKey(user), user, () => {
        // Compare against every user, so the time taken does not say which names exist.
        let match: string | null = null;
        for (const [u, p] of this.users) {
          const ok = safeEqual(u, user) && safeEqual(p, password);
          if (ok && match === null) match = u;
        }
        return match === null ? null : `dashboard:${match}`;
      });
      return actor === null ? null : this.principal('basic', actor);
    }
    return null;
  }

  /**
   * Basic, bearer and local principals have no session: their CSRF token is an HMAC of who they
   * are, the kind of credential included, so no two kinds ever share one (a Basic user's name
   * can never make the bearer's token; the names `token` and `local` are refused anyway).
   */
  private principal(kind: 'basic' | 'bearer' | 'local', actor: string): Principal {
    return {
      actor,
      csrf: createHmac('sha256', this.secret).update(`${kind}\u0000${actor}`).digest('base64url'),
      ambient: kind !== 'bearer',
    };
  }

  /** A new session id for a correct token from the login form; null otherwise (429 while limited). */
  login(req: IncomingMessage, token: string): string | null {
    const expected = this.auth?.token;
    if (!expected) return null;
    if (
      this.guarded(req, 'form', TOKEN_KEY, undefined, () => (safeEqual(token, expected) ? 'dashboard:token' : null)) ===
      null
    )
      return null;
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

/** A user name as logged: at most 100 characters. */
function clip(text: string): string {
  return text.length > 100 ? `${text.slice(0, 100)}…` : text;
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
 * A state-changing request with an ambient credential must carry the principal's CSRF token in
 * `x-berth-csrf`; any state-changing request's Origin (or, without one, its Referer) must name
 * this host when one was sent. A script calling with a bearer token sends neither header and
 * needs no CSRF token; a browser page that sent the bearer header itself is still held to its
 * origin.
 */
export function checkCsrf(req: IncomingMessage, principal: Principal): void {
  const sent = req.headers['x-berth-csrf'];
  if (principal.ambient && (typeof sent !== 'string' || !safeEqual(sent, principal.csrf))) {
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
