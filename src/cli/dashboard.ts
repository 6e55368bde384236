import type { Command } from 'commander';
import { startDashboard } from '../dashboard/server.js';
import { dashboardOptionsFromEnv } from '../dashboard/options.js';
import { createLogger, logLevel } from '../logger.js';
import { common, database, intOption, type Common } from './common.js';
import { runUntilSignal } from './signals.js';
import { say, terminalSafeStream } from './terminal.js';

export function registerDashboardCommand(program: Command): void {
  common(program.command('dashboard'), { json: false })
    .description('serve the web dashboard (overview, lanes, tasks, dead letters, queues, maintenance)')
    .option(
      '--host <address>',
      'listen address (default: $BERTH_DASHBOARD_HOST or 127.0.0.1; anything else needs auth)',
    )
    .option('--port <n>', 'port (default: $BERTH_DASHBOARD_PORT or 4680; 0 = any free port)', intOption(0, 65535))
    .option('--read-only', 'show everything, change nothing (also $BERTH_DASHBOARD_READ_ONLY=1)')
    .addHelpText(
      'after',
      '\nAuthentication: BERTH_DASHBOARD_TOKEN (bearer token / login form) and/or BERTH_DASHBOARD_USERS=user:pass,...' +
        '\n(HTTP Basic). Without either it binds to 127.0.0.1 only. Every action is audited with the user who did it.',
    )
    .action(async (opts: Common & { host?: string; port?: number; readOnly?: boolean }) => {
      const env = dashboardOptionsFromEnv(process.env);
      // Log lines carry what clients sent (a Basic user name, a path): nothing in them may act on a
      // terminal, as in the worker's log.
      const logger = createLogger(
        { component: 'dashboard' },
        terminalSafeStream(process.stdout),
        logLevel(process.env.BERTH_LOG_LEVEL),
      );
      const db = database(opts);
      const server = await startDashboard({
        ...env,
        connectionString: db.connectionString,
        connectTimeoutMs: db.connectTimeoutMs,
        schema: opts.schema,
        host: opts.host ?? env.host,
        port: opts.port ?? env.port,
        readOnly: opts.readOnly ?? env.readOnly,
        logger,
      });
      say(`berth dashboard: ${server.url}`);
      await runUntilSignal(() => server.close());
    });
}
