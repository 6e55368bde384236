import pg from 'pg';
import { BerthInputError } from '../errors.js';
import { createLogger } from '../logger.js';
import { validateAuthLimits } from './auth-limits.js';
import { createDashboardHandler } from './handler.js';
import { listen } from '../http/listen.js';
import { assertMigrated } from '../schema/migrate.js';
import { DEFAULT_SCHEMA } from '../sql.js';
import {
  assertSafeBinding,
  DEFAULT_DASHBOARD_HOST,
  DEFAULT_DASHBOARD_PORT,
  normaliseBasePath,
  validateAuth,
  validatePort,
  warnIfNoAuth,
  type DashboardOptions,
} from './options.js';

export interface DashboardServer {
  /** The dashboard's address, with the port actually bound and the base path, ending in `/`. */
  readonly url: string;
  /** Stops listening, drops open connections, and ends the pool it created (never one passed in). */
  close(): Promise<void>;
}

/**
 * Start the web dashboard on its own HTTP server. Without `auth` it refuses any host but
 * loopback; with `auth.token` it also serves a login form; `readOnly` turns every action off.
 * Throws SchemaNotMigratedError (a BerthInputError) when the schema is missing or older than the code.
 */
export async function startDashboard(options: DashboardOptions): Promise<DashboardServer> {
  const host = options.host ?? DEFAULT_DASHBOARD_HOST;
  const port = validatePort(options.port ?? DEFAULT_DASHBOARD_PORT);
  validateAuth(options.auth);
  validateAuthLimits(options.authLimits);
  assertSafeBinding(options.auth, host);
  const base = normaliseBasePath(options.basePath);
  if (!options.pool && !options.connectionString) throw new BerthInputError('the dashboard needs a connectionString or a pool');
  const logger = options.logger ?? createLogger({ component: 'dashboard' });
  const ownPool = options.pool
    ? null
    : new pg.Pool({
        connectionString: options.connectionString,
        max: 4,
        statement_timeout: 30_000,
        application_name: 'berth dashboard',
        // Lane stats plan over every ring partition: costed high enough for JIT (seconds) on a
        // millisecond query.
        options: '-c jit=off',
      });
  ownPool?.on('error', (err) => logger.warn({ err: err.message }, 'idle dashboard connection lost'));
  const pool = options.pool ?? ownPool!;
  let server;
  try {
    // An unmigrated (or older) schema would answer 500 on every request: refuse it up front, with the fix.
    await assertMigrated(pool, options.schema ?? DEFAULT_SCHEMA);
    const handler = createDashboardHandler({ ...options, pool, logger });
    server = await listen([handler], port, host, logger);
  } catch (err) {
    await ownPool?.end();
    throw err;
  }
  warnIfNoAuth(logger, options.auth, host);
  const url = `${server.url}${base}/`;
  logger.info({ url, readOnly: options.readOnly ?? false }, 'dashboard listening');
  let closing: Promise<void> | null = null;
  return {
    url,
    close: () =>
      (closing ??= (async () => {
        await server.close();
        await ownPool?.end();
      })()),
  };
}
