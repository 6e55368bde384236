import type pg from 'pg';
import { createPool } from '../db/connections.js';
import { BerthInputError } from '../errors.js';
import { dashboardHandler } from './handler.js';
import { listen, type Listening } from '../http/listen.js';
import { assertMigrated } from '../schema/migrate.js';
import { resolveDashboardOptions, warnIfNoAuth, type DashboardOptions } from './options.js';

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
  const o = resolveDashboardOptions(options);
  const { logger, host } = o;
  const ownPool =
    o.database === null
      ? null
      : createPool(
          o.database,
          {
            max: 4,
            statement_timeout: 30_000,
            application_name: 'berth dashboard',
            // Lane stats plan over every ring partition: costed high enough for JIT (seconds) on a
            // millisecond query.
            options: '-c jit=off',
          },
          logger,
          'dashboard',
        );
  const pool: pg.Pool | null = o.pool ?? ownPool;
  if (pool === null) throw new BerthInputError('the dashboard needs a connectionString or a pool');
  let server: Listening;
  try {
    // An unmigrated (or older) schema would answer 500 on every request: refuse it up front, with the fix.
    await assertMigrated(pool, o.schema);
    const handler = dashboardHandler({ ...o, pool });
    server = await listen([handler], o.port, host, logger);
  } catch (err) {
    await ownPool?.end();
    throw err;
  }
  warnIfNoAuth(logger, o.auth, host);
  const url = `${server.url}${o.basePath}/`;
  logger.info({ url, readOnly: o.readOnly }, 'dashboard listening');
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
