import { createRequire } from 'node:module';
import { storageFor } from '../storage/storage.js';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Command } from 'commander';
import type pg from 'pg';
import { laneStats } from '../admin/stats.js';
import { BerthInputError } from '../errors.js';
import { MAX_TIMER_MS } from '../limits.js';
import { createLogger, logLevel } from '../logger.js';
import { discover } from '../processor/claim.js';
import { Worker } from '../process/worker.js';
import type { TaskDefinition } from '../task.js';
import type { ScheduleDefinition } from '../schedule.js';
import { CliFailure, cliPool, collect, common, database, intOption, type Common, durationMs } from './common.js';
import { progressBar } from './progress.js';
import { runUntilSignal } from './signals.js';
import { dashboardOptionsFromEnv } from '../dashboard/options.js';
import { slotsFromEnv } from '../process/env.js';
import { say, terminalSafeStream } from './terminal.js';

/**
 * The grace period running handlers get on SIGTERM/SIGINT before they are aborted and their
 * leases released: the one `worker.stopOnSignals()` uses (src/process/signals.ts), 15 s, so that
 * the grace plus the abort wait (`stopTimeoutMs`, 10 s) stays under Kubernetes' default
 * `terminationGracePeriodSeconds` (30 s) with 5 s to spare (docs/operations.md, "Graceful stop").
 */
export { DEFAULT_SIGNAL_GRACE_MS } from '../process/signals.js';
import { DEFAULT_SIGNAL_GRACE_MS } from '../process/signals.js';

type AnyDefinition = TaskDefinition<unknown>;

function isDefinition(x: unknown): x is AnyDefinition {
  return (
    typeof x === 'object' &&
    x !== null &&
    typeof (x as AnyDefinition).type === 'string' &&
    typeof (x as AnyDefinition).handler === 'function'
  );
}

/**
 * Task definitions from a user module: its `tasks` export, or its default export (an array, or
 * an object with `tasks`). Each must be what defineTask returns.
 */
export async function loadTaskModule(path: string): Promise<AnyDefinition[]> {
  return (await loadWorkerModule(path)).tasks;
}

/**
 * A worker module: its task definitions (as `loadTaskModule`) and its `schedules` export, if
 * any (a named export, or the default export's `schedules`): `defineSchedule(...)` results,
 * checked by the Worker.
 */
export async function loadWorkerModule(path: string): Promise<{ tasks: AnyDefinition[]; schedules: unknown[] }> {
  const abs = resolve(path);
  let mod: Record<string, unknown>;
  try {
    mod = await importModule(abs);
  } catch (err) {
    if (err instanceof BerthInputError) throw err;
    const e = err as NodeJS.ErrnoException;
    if (e.code === 'ERR_MODULE_NOT_FOUND') throw new BerthInputError(`cannot load task module ${abs}: ${e.message}`);
    // The module exists but failed while loading: its own error, not a usage problem.
    throw new CliFailure(`task module ${abs} failed to load: ${e.message}`);
  }
  const def = mod.default as unknown;
  const list = mod.tasks ?? (Array.isArray(def) ? def : (def as { tasks?: unknown } | undefined)?.tasks);
  if (!Array.isArray(list) || list.length === 0) {
    throw new BerthInputError(
      `task module ${abs} must export \`tasks\` (or a default export) as a non-empty array of defineTask(...) results`,
    );
  }
  list.forEach((d, i) => {
    if (!isDefinition(d))
      throw new BerthInputError(`task module ${abs}: tasks[${i}] is not a task definition (use defineTask)`);
  });
  const schedules = mod.schedules ?? (def as { schedules?: unknown } | undefined)?.schedules ?? [];
  if (!Array.isArray(schedules))
    throw new BerthInputError(`task module ${abs}: \`schedules\` must be an array of defineSchedule(...) results`);
  return { tasks: list as AnyDefinition[], schedules };
}

const TYPESCRIPT = /\.(?:ts|mts|cts|tsx)$/;

/**
 * Import a task module. A TypeScript one loads as it is where Node can (22.18 and later strip
 * types by default, or a `--import tsx` already registered); otherwise through the tsx the
 * user's project has (found from the module, then from the working directory), with its
 * `tsImport`, scoped to that module. Node 20 has no type stripping at all, so without tsx the
 * error says what to install.
 */
async function importModule(abs: string): Promise<Record<string, unknown>> {
  const url = pathToFileURL(abs).href;
  try {
    return (await import(url)) as Record<string, unknown>;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (
      !TYPESCRIPT.test(abs) ||
      (code !== 'ERR_UNKNOWN_FILE_EXTENSION' && code !== 'ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING')
    )
      throw err;
  }
  const tsImport = await findTsx(abs);
  if (tsImport === null) {
    throw new BerthInputError(
      `cannot load task module ${abs}: Node ${process.version} cannot run TypeScript by itself and no tsx was found ` +
        'from the module or the working directory; install it (npm install --save-dev tsx), compile the module to .js, ' +
        'or use Node 22.18 or later',
    );
  }
  return (await tsImport(abs, import.meta.url)) as Record<string, unknown>;
}

type TsImport = (specifier: string, parent: string) => Promise<unknown>;
type TsxManifest = { exports?: Record<string, { import?: string | { default?: string } } | undefined> };

async function findTsx(abs: string): Promise<TsImport | null> {
  for (const from of [abs, join(process.cwd(), 'noop.js')]) {
    // The ESM entry of `tsx/esm/api` (require.resolve would pick its CommonJS one, which
    // cannot load from here): read from tsx's own exports map.
    let api: string;
    try {
      const manifest = createRequire(from).resolve('tsx/package.json');
      const exports = (JSON.parse(readFileSync(manifest, 'utf8')) as TsxManifest).exports?.['./esm/api'];
      const entry = typeof exports?.import === 'string' ? exports.import : exports?.import?.default;
      if (typeof entry !== 'string') continue;
      api = join(dirname(manifest), entry);
    } catch {
      continue;
    }
    const mod = (await import(pathToFileURL(api).href)) as { tsImport?: TsImport };
    if (typeof mod.tsImport === 'function') return mod.tsImport;
  }
  return null;
}

function splitQueues(values: string[]): string[] | undefined {
  const q = values
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter(Boolean);
  return q.length > 0 ? q : undefined;
}

/**
 * Wait until nothing is claimable and nothing runs: discovery (the claim's own read) finds no
 * entry, no due deferred row waits for promotion, and the worker's slots are idle, twice in a
 * row. Lanes of paused queues and tasks scheduled for later do not count.
 */
async function drained(
  pool: pg.Pool,
  schema: string,
  worker: Worker,
  queues: readonly string[] | null,
  onRemaining: (n: number) => void,
): Promise<void> {
  let quiet = 0;
  for (;;) {
    const lanes = (await laneStats(pool, schema)).filter((l) => !l.paused && (!queues || queues.includes(l.queue)));
    const remaining = lanes.reduce((n, l) => n + l.depth + l.dueDeferred, 0) + worker.activeSlots;
    onRemaining(remaining);
    const claimable = await discover(pool, storageFor(schema), queues, 1);
    const due = lanes.some((l) => l.dueDeferred > 0);
    quiet = claimable.length === 0 && !due && worker.activeSlots === 0 ? quiet + 1 : 0;
    if (quiet >= 2) return;
    await new Promise((r) => setTimeout(r, 250));
  }
}

export function registerWorkerCommands(program: Command): void {
  common(program.command('worker'), { json: false })
    .description(
      'run a worker (and, unless --no-maintenance, a candidate maintenance leader) for the task types a module defines',
    )
    .requiredOption(
      '--tasks <module>',
      'module exporting `tasks`: an array of defineTask(...) results (and optionally `schedules`: defineSchedule(...) results)',
    )
    .option('--slots <n>', 'concurrent handlers (default: $BERTH_TASK_PROCESSOR_CONCURRENCY or 4)', intOption(1, 1000))
    .option(
      '--queue <names>',
      'only claim from these queues (comma-separated or repeated; default: the queues the task definitions name)',
      collect,
      [],
    )
    .option('--all-queues', 'claim from every queue (tasks of types the module does not define are handed back)')
    .option('--no-maintenance', 'never lead maintenance in this process')
    .option(
      '--session-database-url <url>',
      'a direct (or session-pooled) connection for LISTEN and the leader, when --database-url is a transaction-mode pooler (default: $BERTH_SESSION_DATABASE_URL, else --database-url)',
    )
    .option(
      '--poll-only',
      'no LISTEN and no leader session (behind a transaction-mode pooler without a direct connection; needs --no-maintenance)',
    )
    .option(
      '--no-prepared-statements',
      'send statements unnamed (a transaction-mode pooler without prepared-statement support)',
    )
    .option('--drain', 'exit once no due work is left (progress bar on a terminal)')
    .option('--http-port <n>', 'serve GET /metrics (Prometheus) on this port (0 = any free port)', intOption(0, 65535))
    .option('--http-host <address>', 'address for --http-port (default 127.0.0.1)')
    .option(
      '--dashboard',
      'also serve the dashboard on --http-port (auth from BERTH_DASHBOARD_TOKEN / BERTH_DASHBOARD_USERS)',
    )
    .option(
      '--grace <duration>',
      'on SIGTERM/SIGINT, let running handlers finish for this long (500ms, 30s, 2m) before aborting them; a second signal aborts at once',
      durationMs,
      DEFAULT_SIGNAL_GRACE_MS,
    )
    .option(
      '--exit-on-stuck-slots <n>',
      'exit with status 75 once this many slots hold handlers stuck past their deadline (for a supervisor to restart)',
      intOption(1, 1000),
    )
    .addHelpText(
      'after',
      '\nStops gracefully on SIGINT/SIGTERM: claiming stops at once, running handlers get --grace to finish,\n' +
        'then the rest are aborted and their leases released. A second signal skips the grace; a third exits at once.',
    )
    .action(
      async (
        opts: Common & {
          tasks: string;
          slots?: number;
          queue: string[];
          allQueues?: boolean;
          maintenance: boolean;
          sessionDatabaseUrl?: string;
          pollOnly?: boolean;
          preparedStatements: boolean;
          drain?: boolean;
          httpPort?: number;
          httpHost?: string;
          dashboard?: boolean;
          exitOnStuckSlots?: number;
          grace: number;
        },
      ) => {
        if (opts.grace > MAX_TIMER_MS) throw new BerthInputError('--grace must be at most 596h (24.8 days)');
        const resolved = database(opts);
        // The drain's own reads go through --database-url too: unnamed when the worker's are.
        const db = opts.preparedStatements ? resolved : { ...resolved, preparedStatements: false };
        const session = opts.sessionDatabaseUrl ?? (process.env.BERTH_SESSION_DATABASE_URL || undefined);
        if (opts.pollOnly && session !== undefined)
          throw new BerthInputError(
            '--poll-only and --session-database-url (or $BERTH_SESSION_DATABASE_URL) exclude each other',
          );
        if (opts.pollOnly && opts.maintenance)
          throw new BerthInputError(
            '--poll-only needs --no-maintenance: the leader holds a session lock (run one with a direct connection elsewhere)',
          );
        const { tasks, schedules } = await loadWorkerModule(opts.tasks);
        const named = splitQueues(opts.queue);
        if (named && opts.allQueues) throw new BerthInputError('--queue and --all-queues exclude each other');
        const queues = opts.allQueues ? 'all' : named;
        // Log lines carry task types and errors: nothing in them may act on a terminal.
        const logger = createLogger(
          { service: 'berth-worker' },
          terminalSafeStream(process.stdout),
          logLevel(process.env.BERTH_LOG_LEVEL),
        );
        if (opts.dashboard && opts.httpPort === undefined) throw new BerthInputError('--dashboard needs --http-port');
        const env = opts.dashboard ? dashboardOptionsFromEnv(process.env) : {};
        const http =
          opts.httpPort === undefined
            ? undefined
            : {
                port: opts.httpPort,
                host: opts.httpHost,
                dashboard: opts.dashboard ? { auth: env.auth, readOnly: env.readOnly } : false,
              };
        const worker = new Worker({
          connectionString: db.connectionString,
          connectTimeoutMs: db.connectTimeoutMs,
          schema: opts.schema,
          tasks,
          schedules: schedules as ScheduleDefinition[],
          queues,
          // The flag wins; the library never reads the environment, so the CLI does.
          slots: opts.slots ?? slotsFromEnv(process.env.BERTH_TASK_PROCESSOR_CONCURRENCY),
          maintenance: opts.maintenance,
          ...(opts.pollOnly ? { sessionConnectionString: false as const } : {}),
          ...(session === undefined ? {} : { sessionConnectionString: session }),
          preparedStatements: opts.preparedStatements,
          logger,
          http,
          exitOnStuckSlots: opts.exitOnStuckSlots,
        });
        await worker.start();
        if (worker.httpUrl) {
          say(
            `berth worker: metrics at ${worker.httpUrl.replace(/\/$/, '')}/metrics${opts.dashboard ? `, dashboard at ${worker.httpUrl}` : ''}`,
          );
        }
        const stop = () => worker.stop({ graceMs: opts.grace });
        const hurry = () => {
          say('berth worker: second signal, aborting running handlers now (a third exits at once)');
          void worker.stop();
        };
        if (!opts.drain) return runUntilSignal(stop, undefined, hurry);
        const pool = cliPool(db, 'berth drain', 1);
        const bar = progressBar('draining');
        let total = 0;
        let finished = false;
        const drain = drained(pool, opts.schema, worker, worker.queues, (n) => {
          total = Math.max(total, n);
          bar.update({ done: total - n, total });
        })
          .then(() => {
            finished = true;
          })
          .finally(() => bar.stop());
        try {
          await runUntilSignal(stop, drain, hurry);
        } finally {
          await pool.end();
        }
        if (!finished) throw new CliFailure('stopped before the queue drained; run it again to finish');
        say(`drained: no due work left${total > 0 ? ` (about ${total} task(s) were waiting when it started)` : ''}`);
      },
    );
}
