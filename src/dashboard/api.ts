import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '../logger.js';
import {
  bulkTaskAction,
  clearLimitAction,
  deadAction,
  isTaskAction,
  moveAction,
  queueAction,
  scheduleAction,
  setLimitAction,
  setKeyLimitAction,
  clearKeyLimitAction,
  setTypeLimitAction,
  clearTypeLimitAction,
  taskAction,
  type ActionContext,
} from './actions.js';
import { checkCsrf, type Principal } from './auth.js';
import { HttpError, readJsonObject, sendJson } from './http.js';
import type { DashboardReads } from './overview.js';
import * as read from './reads.js';
import type { ActionAnswer, Session } from './wire.js';

export interface ApiContext {
  reads: DashboardReads;
  logger: Logger;
  readOnly: boolean;
}

type Body = Record<string, unknown>;

/** A read: GET, never changes anything. */
type Read = (
  reads: DashboardReads,
  url: URL,
  params: string[],
  session: { principal: Principal; readOnly: boolean },
) => Promise<unknown>;
/** An action: POST (with the CSRF header when the credential is ambient: cookie, Basic, loopback), audited. */
type Action = (c: ActionContext, params: string[], body: Body) => Promise<ActionAnswer>;

interface Route {
  pattern: RegExp;
  read?: Read;
  action?: Action;
}

// Path segments are matched raw and decoded after, so a queue named "a/b" travels as a%2Fb.
const SEGMENT = '([^/]+)';

const ROUTES: Route[] = [
  // What the page needs to act: who it is acting as, its CSRF token, and whether it may.
  {
    pattern: /^\/api\/session$/,
    read: async (_r, _u, _p, s): Promise<Session> => ({
      actor: s.principal.actor,
      csrf: s.principal.csrf,
      readOnly: s.readOnly,
    }),
  },
  { pattern: /^\/api\/overview$/, read: (r) => read.overview(r) },
  { pattern: /^\/api\/lanes$/, read: (r) => read.lanes(r) },
  { pattern: /^\/api\/tasks$/, read: (r, url) => read.tasks(r, url) },
  // Before the one-task routes, whose id segment would take "bulk" (and answer 400).
  {
    pattern: /^\/api\/tasks\/bulk\/(retry|cancel)$/,
    action: (c, [name], body) => bulkTaskAction(c, name === 'retry' ? 'retry' : 'cancel', body),
  },
  { pattern: new RegExp(`^/api/tasks/${SEGMENT}$`), read: (r, _u, [id]) => read.task(r, id!) },
  {
    pattern: new RegExp(`^/api/tasks/${SEGMENT}/(retry|cancel|delete|move)$`),
    action: (c, [id, name], body) =>
      name === 'move' ? moveAction(c, id!, body) : isTaskAction(name!) ? taskAction(c, id!, name) : notFound(),
  },
  { pattern: /^\/api\/attempts$/, read: (r, url) => read.attempts(r, url) },
  { pattern: /^\/api\/dead$/, read: (r, url) => read.dead(r, url) },
  { pattern: /^\/api\/dead\/count$/, read: (r, url) => read.deadCount(r, url) },
  {
    pattern: /^\/api\/dead\/(retry|purge)$/,
    action: (c, [name], body) => deadAction(c, name === 'retry' ? 'retry' : 'purge', body),
  },
  { pattern: /^\/api\/queues$/, read: (r) => read.queues(r) },
  {
    pattern: new RegExp(`^/api/queues/${SEGMENT}/(pause|resume)$`),
    action: (c, [queue, name], body) => queueAction(c, queue!, name === 'pause' ? 'pause' : 'resume', body),
  },
  {
    pattern: new RegExp(`^/api/queues/${SEGMENT}/limits(/clear)?$`),
    action: (c, [queue, clear], body) =>
      clear === undefined ? setLimitAction(c, queue!, body) : clearLimitAction(c, queue!, body),
  },
  {
    pattern: new RegExp(`^/api/types/${SEGMENT}/limits(/clear)?$`),
    action: (c, [type, clear], body) =>
      clear === undefined ? setTypeLimitAction(c, type!, body) : clearTypeLimitAction(c, type!, body),
  },
  {
    pattern: /^\/api\/keys\/limits(\/clear)?$/,
    action: (c, [clear], body) => (clear === undefined ? setKeyLimitAction(c, body) : clearKeyLimitAction(c, body)),
  },
  { pattern: /^\/api\/schedules$/, read: (r) => read.schedules(r) },
  {
    pattern: new RegExp(`^/api/schedules/${SEGMENT}/(pause|resume|trigger)$`),
    action: (c, [name, verb]) => scheduleAction(c, name!, verb as 'pause' | 'resume' | 'trigger'),
  },
  { pattern: /^\/api\/maintenance$/, read: (r) => read.maintenance(r) },
];

function notFound(): never {
  throw new HttpError(404, 'no such API route');
}

function decode(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new HttpError(400, 'bad percent-encoding in the path');
  }
}

/**
 * Serve one `/api/...` request (`path` relative to the dashboard's base path). Errors are
 * thrown for the caller to turn into JSON: HttpError as is, BerthInputError as 400.
 */
export async function serveApi(
  ctx: ApiContext,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  url: URL,
  principal: Principal,
): Promise<void> {
  for (const route of ROUTES) {
    const m = route.pattern.exec(path);
    if (!m) continue;
    // An optional group that did not match stays undefined (not the text "undefined").
    const params = m.slice(1).map((p) => (p === undefined ? p : decode(p)));
    if (route.read) {
      if (req.method !== 'GET' && req.method !== 'HEAD') throw new HttpError(405, 'use GET', { allow: 'GET, HEAD' });
      sendJson(res, 200, await route.read(ctx.reads, url, params, { principal, readOnly: ctx.readOnly }));
      return;
    }
    if (req.method !== 'POST') throw new HttpError(405, 'actions are POST requests', { allow: 'POST' });
    if (ctx.readOnly) throw new HttpError(403, 'the dashboard is read-only: actions are turned off');
    checkCsrf(req, principal);
    const body = await readJsonObject(req);
    const c: ActionContext = { db: ctx.reads.db, schema: ctx.reads.schema, logger: ctx.logger, actor: principal.actor };
    sendJson(res, 200, await route.action!(c, params, body));
    return;
  }
  notFound();
}
