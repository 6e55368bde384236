import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { BerthInputError, SchemaNotMigratedError } from '../errors.js';
import { metricsRequestHandler, type MetricsRequestHandler } from '../observability/metrics-http.js';
import { assertMigrated } from '../schema/migrate.js';

/** PostgreSQL's undefined_table: what every read answers on an unmigrated schema. */
const UNDEFINED_TABLE = '42P01';
import { serveApi } from './api.js';
import { loadAssets } from './assets.js';
import { Authenticator, checkCsrf, checkSameOrigin, TooManyAttemptsError, type Principal } from './auth.js';
import { HttpError, readBody, send, sendError, sendJson } from './http.js';
import { DashboardReads } from './overview.js';
import {
  resolveDashboardHandlerOptions,
  type DashboardHandlerOptions,
  type ResolvedDashboardHandlerOptions,
} from './options.js';
import { loginPage, shellPage, unauthorizedPage } from './pages.js';
import { rejectNul } from './params.js';
import type { ErrorAnswer } from './wire.js';

/** Serves a request and returns true, or returns false for a path outside the base path. */
export type DashboardHandler = (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;

export type { DashboardHandlerOptions } from './options.js';

const HTML = 'text/html; charset=utf-8';

/**
 * Where to land after logging in: the page's own `#/route` (sent by /assets/login.js), or ''.
 * Only a fragment of plain URL characters, so it can never point at another site or break the header.
 */
export function nextRoute(next: string | null): string {
  return next !== null && next.length <= 500 && /^#\/[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*$/.test(next) ? next : '';
}

/**
 * Every route family (pages, assets, API, actions, login) refuses a NUL byte in its path (as
 * %00: a raw one never gets past Node's parser) or in a query parameter with a 400, before
 * anything reads it: PostgreSQL text cannot hold one, and the query would answer 500.
 */
function rejectNulInUrl(path: string, url: URL): void {
  if (/%00/.test(path) || path.includes('\u0000')) throw new HttpError(400, 'the path contains a NUL byte (%00)');
  for (const [name, value] of url.searchParams) rejectNul(`${name}=${value}`, 'a query parameter');
}

/**
 * The dashboard as a request handler another `node:http` server can route through (see
 * `startDashboard` for a server of its own). Without `auth` it answers requests whose Host is
 * loopback only; binding it to a reachable address is the caller's responsibility. On a
 * schema that is not migrated, requests answer 503 with the fix (`berth migrate`).
 */
export function createDashboardHandler(options: DashboardHandlerOptions): DashboardHandler {
  return dashboardHandler(resolveDashboardHandlerOptions(options));
}

/** The handler on options resolved once (startDashboard and the worker's HTTP server resolve theirs). */
export function dashboardHandler(options: ResolvedDashboardHandlerOptions): DashboardHandler {
  const { basePath: base, logger, readOnly, schema } = options;
  const auth = new Authenticator(options.auth, options.authLimits, logger);
  const reads = new DashboardReads(options.pool, schema, logger);
  const metrics: MetricsRequestHandler | null = options.metricsRegistry
    ? metricsRequestHandler(options.metricsRegistry)
    : null;
  const cookiePath = base || '/';
  // Read (and from src/, checked against the client's sources) now: a missing build fails here, not on a request.
  const assets = loadAssets();

  async function route(req: IncomingMessage, res: ServerResponse, path: string, url: URL): Promise<void> {
    const method = req.method ?? 'GET';
    rejectNulInUrl(path, url);
    const asset = assets.get(path);
    if (asset) {
      // Code and styles only, no data: served before authentication so the login page has them.
      send(res, 200, asset[0], asset[1], { 'cache-control': 'no-cache' });
      return;
    }
    if (path === '/login' && auth.acceptsLogin) {
      if (method === 'POST') return login(req, res);
      send(res, 200, HTML, loginPage(base, null, auth.acceptsBasic));
      return;
    }
    const principal = auth.authenticate(req);
    if (path === '/basic' && auth.acceptsBasic) {
      // The login page's "sign in with a user name" link: challenge until Basic credentials come,
      // then back to the page (and the route) the operator was on.
      if (!principal) {
        send(res, 401, HTML, unauthorizedPage(base), auth.challenge());
        return;
      }
      res.writeHead(303, {
        location: `${base}/${nextRoute(url.searchParams.get('next'))}`,
        'cache-control': 'no-store',
      });
      res.end();
      return;
    }
    if (!principal) return unauthorized(res, path);
    if (path === '/logout') {
      if (method !== 'POST') throw new HttpError(405, 'log out with POST', { allow: 'POST' });
      checkCsrf(req, principal);
      auth.logout(principal.sessionId);
      res.writeHead(303, { location: `${base}/login`, 'set-cookie': auth.clearCookie(cookiePath) });
      res.end();
      return;
    }
    if (path === '/metrics' && metrics) {
      await metrics(req, res);
      return;
    }
    if (path.startsWith('/api/')) return serveApi({ reads, logger, readOnly }, req, res, path, url, principal);
    if (path === '/' || path === '/index.html') {
      if (method !== 'GET' && method !== 'HEAD') throw new HttpError(405, 'use GET', { allow: 'GET, HEAD' });
      return shell(res, principal);
    }
    throw new HttpError(404, 'not found');
  }

  function shell(res: ServerResponse, principal: Principal): void {
    send(
      res,
      200,
      HTML,
      shellPage({
        base,
        csrf: principal.csrf,
        actor: principal.actor,
        readOnly,
        session: principal.sessionId !== undefined,
      }),
    );
  }

  function unauthorized(res: ServerResponse, path: string): void {
    if (path.startsWith('/api/') || path === '/metrics') {
      const answer: ErrorAnswer = { error: 'authentication required' };
      sendJson(res, 401, answer, auth.challenge());
    } else if (auth.acceptsLogin) {
      // No Basic challenge on a page when the token form is on offer: the browser would show its
      // own prompt before the form. The form links to /basic, which challenges.
      send(res, 401, HTML, loginPage(base, null, auth.acceptsBasic));
    } else {
      send(res, 401, HTML, unauthorizedPage(base), auth.challenge());
    }
  }

  async function login(req: IncomingMessage, res: ServerResponse): Promise<void> {
    checkSameOrigin(req);
    const form = new URLSearchParams(await readBody(req));
    for (const [name, value] of form) rejectNul(`${name}=${value}`, 'the login form');
    let sid: string | null;
    try {
      sid = auth.login(req, form.get('token') ?? '');
    } catch (err) {
      if (!(err instanceof TooManyAttemptsError)) throw err;
      send(
        res,
        429,
        HTML,
        loginPage(base, `Too many failed attempts: try again in ${err.retryAfterSeconds} s.`, auth.acceptsBasic),
        err.headers,
      );
      return;
    }
    if (!sid) {
      // Logged (at a bounded rate) by the authenticator, with every other method's failures.
      send(res, 401, HTML, loginPage(base, 'That token is not right.', auth.acceptsBasic));
      return;
    }
    const secure = Boolean((req.socket as TLSSocket).encrypted);
    res.writeHead(303, {
      location: `${base}/${nextRoute(form.get('next'))}`,
      'set-cookie': auth.sessionCookie(sid, cookiePath, secure),
      'cache-control': 'no-store',
    });
    res.end();
  }

  return async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://dashboard.invalid');
    let path = url.pathname;
    if (base) {
      if (path === base) {
        res.writeHead(308, { location: `${base}/${url.search}` });
        res.end();
        return true;
      }
      if (!path.startsWith(`${base}/`)) return false;
      path = path.slice(base.length);
    }
    try {
      await route(req, res, path, url);
    } catch (err) {
      if (res.headersSent) {
        res.destroy();
      } else if (err instanceof HttpError) {
        sendError(res, err);
      } else if (err instanceof SchemaNotMigratedError) {
        // The schema was dropped or never migrated under a handler mounted elsewhere: say so.
        logger.error({ err: err.message, method: req.method, path }, 'dashboard request failed');
        sendError(res, new HttpError(503, err.message));
      } else if (err instanceof BerthInputError) {
        sendError(res, new HttpError(400, err.message));
      } else if ((err as { code?: unknown })?.code === UNDEFINED_TABLE) {
        // The schema was dropped or never migrated under a handler mounted elsewhere: say so.
        const reason = await assertMigrated(options.pool, schema).then(
          () => null,
          (e: Error) => e.message,
        );
        logger.error({ err: (err as Error).message, method: req.method, path }, 'dashboard request failed');
        sendError(
          res,
          reason ? new HttpError(503, reason) : new HttpError(500, 'internal error (see the dashboard log)'),
        );
      } else {
        logger.error({ err: (err as Error)?.message, method: req.method, path }, 'dashboard request failed');
        sendError(res, new HttpError(500, 'internal error (see the dashboard log)'));
      }
    }
    return true;
  };
}
