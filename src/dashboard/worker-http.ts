import type pg from 'pg';
import { createPool, type DatabaseTarget } from '../db/connections.js';
import type { Registry } from 'prom-client';
import { BerthInputError } from '../errors.js';
import type { Logger } from '../logger.js';
import { metricsRequestHandler } from '../observability/metrics-http.js';
import { dashboardHandler } from './handler.js';
import { listen, type Listening, type RequestHandler } from '../http/listen.js';
import {
  assertSafeBinding,
  DEFAULT_DASHBOARD_HOST,
  resolveDashboardSettings,
  validatePort,
  warnIfNoAuth,
  type DashboardSettings,
  type ResolvedDashboardSettings,
} from './options.js';

/**
 * Dashboard settings a worker takes: the rest (database, schema, address, metrics registry) are
 * the worker's own.
 */
export type WorkerDashboardOptions = DashboardSettings;

/** The worker's opt-in HTTP server (`WorkerOptions.http`). */
export interface WorkerHttpOptions {
  /** 0 picks a free port (see `Worker.httpUrl`). */
  port: number;
  /** Default 127.0.0.1. */
  host?: string;
  /** Serve `GET /metrics` from this worker's registry (default true); behind the dashboard's auth when both are on. */
  metrics?: boolean;
  /**
   * Serve the dashboard too, on a small pool of its own (two connections, 30 s statement
   * timeout), so its reads and bulk actions never take the worker's claim and settlement
   * connections.
   */
  dashboard?: boolean | WorkerDashboardOptions;
}

/** WorkerHttpOptions with its defaults filled in and every value checked. */
export interface ResolvedWorkerHttpOptions {
  readonly port: number;
  readonly host: string;
  readonly metrics: boolean;
  /** null: no dashboard. */
  readonly dashboard: ResolvedDashboardSettings | null;
}

/** Resolved in the Worker constructor, so a bad setting fails before anything starts. */
export function resolveWorkerHttpOptions(o: WorkerHttpOptions): ResolvedWorkerHttpOptions {
  if (typeof o !== 'object' || o === null)
    throw new BerthInputError('http must be an object { port, host?, metrics?, dashboard? }');
  const port = validatePort(o.port, 'http.port');
  const host = o.host ?? DEFAULT_DASHBOARD_HOST;
  if (typeof host !== 'string' || host === '') throw new BerthInputError('http.host must be a host name or address');
  const raw = o.dashboard === undefined || o.dashboard === false ? null : o.dashboard === true ? {} : o.dashboard;
  if (o.metrics === false && !raw) throw new BerthInputError('http serves nothing: turn on metrics or dashboard');
  if (raw !== null && (typeof raw !== 'object' || Array.isArray(raw)))
    throw new BerthInputError('http.dashboard must be true, false or dashboard options');
  const dashboard = raw === null ? null : resolveDashboardSettings(raw, 'http.dashboard option');
  if (dashboard) assertSafeBinding(dashboard.auth, host);
  return { port, host, metrics: o.metrics ?? true, dashboard };
}

export interface WorkerHttpContext {
  /** The worker's database: the dashboard opens its own pool on it. */
  database: DatabaseTarget;
  schema: string;
  registry: Registry;
  logger: Logger;
  /** The dashboard pool's `application_name` (the worker names it after itself). */
  applicationName?: string;
}

/** The dashboard's pool inside a worker: small, and apart from the worker's own. */
export const WORKER_DASHBOARD_POOL = { max: 2, statementTimeoutMs: 30_000 } as const;

/** One server for the worker: /metrics and/or the dashboard. `close()` also ends the dashboard's pool. */
export async function startWorkerHttp(o: ResolvedWorkerHttpOptions, ctx: WorkerHttpContext): Promise<Listening> {
  const { dashboard, metrics } = o;
  const handlers: RequestHandler[] = [];
  let pool: pg.Pool | null = null;
  if (dashboard) {
    const logger = dashboard.logger ?? ctx.logger;
    pool = createPool(
      ctx.database,
      {
        max: WORKER_DASHBOARD_POOL.max,
        statement_timeout: WORKER_DASHBOARD_POOL.statementTimeoutMs,
        application_name: ctx.applicationName ?? 'berth dashboard',
        // Lane stats plan over every ring partition: costed high enough for JIT on a millisecond read.
        options: '-c jit=off',
      },
      logger,
      'dashboard',
    );
    // Resolved in the Worker constructor: only what the worker owns is added here.
    handlers.push(
      dashboardHandler({
        ...dashboard,
        pool,
        schema: ctx.schema,
        logger,
        metricsRegistry: metrics ? ctx.registry : null,
      }),
    );
  } else if (metrics) {
    handlers.push(metricsRequestHandler(ctx.registry));
  }
  let server: Listening;
  try {
    server = await listen(handlers, o.port, o.host, ctx.logger);
  } catch (err) {
    await pool?.end();
    throw err;
  }
  if (dashboard) warnIfNoAuth(ctx.logger, dashboard.auth, o.host);
  let closing: Promise<void> | null = null;
  return {
    url: server.url,
    close: () =>
      (closing ??= (async () => {
        await server.close();
        await pool?.end();
      })()),
  };
}
