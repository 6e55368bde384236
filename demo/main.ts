/**
 * The zero-setup main job: a worker draining a trickle of demo tasks (quick, slow, failing,
 * sliced) and serving the dashboard and /metrics. Uses DATABASE_URL when set, else an embedded
 * PostgreSQL with its data under ./.berth/. Ctrl-C stops it cleanly.
 */
import pg from 'pg';
import { defineTask, enqueueMany, migrate, runSlices, Worker, createLogger } from '../src/index.js';
import { DEFAULT_DASHBOARD_PORT } from '../src/dashboard/index.js';
import { fromEnv } from '../src/process/env.js';
import { startEmbeddedPostgres } from './embedded-postgres.js';

/** A startup failure as one line on stderr (no stack trace), then exit 1. */
function fail(message: string): never {
  process.stderr.write(`berth demo: ${message}\n`);
  process.exit(1);
}

// Read (and so validated) before anything starts: a bad BERTH_* value is a clear error.
let env: ReturnType<typeof fromEnv>;
try {
  env = fromEnv(process.env);
} catch (err) {
  fail((err as Error).message);
}
// On a terminal the demo's JSON lines would bury the banner: they start at warn there unless
// BERTH_LOG_LEVEL says otherwise (the banner says how to see them). Piped, they are all there.
const level = env.logLevel ?? (process.stdout.isTTY ? 'warn' : 'info');
// One logger, so one destination (one pino stream on stdout), for the demo and its worker.
const rootLog = createLogger({}, undefined, level);
const log = rootLog.child({ component: 'demo' });

async function database(): Promise<{ url: string; stop: () => Promise<void> }> {
  if (env.databaseUrl) return { url: env.databaseUrl, stop: async () => {} };
  // In a detached process of its own, so Ctrl-C reaches the worker first (demo/embedded-postgres.ts).
  return startEmbeddedPostgres();
}

const dashboard = env.dashboard;
const dashboardPort = dashboard.port ?? DEFAULT_DASHBOARD_PORT;
let db: { url: string; stop: () => Promise<void> };
try {
  db = await database();
} catch (err) {
  fail(`could not start the database: ${(err as Error).message}`);
}
const schema = env.schema ?? 'berth';
try {
  const report = await migrate({ connectionString: db.url, schema });
  log.info(report, 'migrated');
} catch (err) {
  await db.stop();
  fail((err as Error).message);
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((res, rej) => {
    const t = setTimeout(res, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(t);
      rej(signal.reason);
    });
  });

const tasks = [
  defineTask<{ prefix: string }>({
    type: 'storage_cleanup',
    ceilingMs: 60_000,
    handler: async (p, ctx) => {
      await sleep(50 + Math.random() * 200, ctx.signal);
      ctx.logger.info({ prefix: p.prefix }, 'cleaned prefix');
    },
  }),
  defineTask<{ org: number }>({
    type: 'quota_audit',
    ceilingMs: 30_000,
    maxAttempts: 3,
    backoff: { baseMs: 1000, maxMs: 5000 },
    handler: async (p, ctx) => {
      await sleep(20, ctx.signal);
      if (Math.random() < 0.3) throw new Error(`quota service unavailable for org ${p.org}`);
    },
  }),
  defineTask<{ report: number }>({
    type: 'report_render',
    // Its own queue, which this worker then serves too (the producer below names it).
    queue: 'reports',
    ceilingMs: 60_000,
    handler: async (p, ctx) => {
      // The slow one: a few seconds, so the dashboard shows tasks running.
      await sleep(3000 + Math.random() * 5000, ctx.signal);
      ctx.logger.info({ report: p.report }, 'rendered report');
    },
  }),
  defineTask<{ org: number; cursor: number | null }>({
    type: 'projection_rebuild',
    ceilingMs: 60_000,
    handler: (payload, ctx) =>
      runSlices(payload, ctx, {
        cursorOf: (p) => p.cursor,
        withCursor: (p, cursor) => ({ ...p, cursor }),
        sliceMs: 300,
        readPage: async (cursor, signal) => {
          await sleep(100, signal);
          const next = (cursor ?? 0) + 1;
          return { next: next >= 5 ? null : next };
        },
      }),
  }),
];

const worker = new Worker({
  connectionString: db.url,
  schema,
  tasks,
  slots: 4,
  logger: rootLog,
  http: {
    port: dashboardPort,
    host: dashboard.host,
    dashboard: { auth: dashboard.auth, readOnly: dashboard.readOnly },
  },
});
try {
  await worker.start();
} catch (err) {
  await db.stop();
  if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE')
    fail(
      `port ${dashboardPort} on ${dashboard.host ?? '127.0.0.1'} is already in use (another demo or dashboard?): ` +
        'stop it, or start with BERTH_DASHBOARD_PORT=<another port> (0 picks a free one)',
    );
  fail((err as Error).message);
}
const pool = new pg.Pool({ connectionString: db.url, max: 2 });
pool.on('error', (err) => log.warn({ err: err.message }, 'demo producer connection lost'));
let n = 0;
const trickle = setInterval(() => {
  n++;
  enqueueMany(
    pool,
    [
      { type: 'storage_cleanup', payload: { prefix: `stacks/${n}/` } },
      { type: 'quota_audit', payload: { org: n % 7 }, dedupeKey: `quota:${n % 7}` },
      ...(n % 5 === 0 ? [{ type: 'report_render', payload: { report: n }, queue: 'reports' }] : []),
      ...(n % 10 === 0 ? [{ type: 'projection_rebuild', payload: { org: n, cursor: null } }] : []),
    ],
    { schema },
  ).catch((err: Error) => log.error({ err: err.message }, 'demo enqueue failed'));
}, 1000);
log.info(
  { database: db.url.replace(/:[^:@/]*@/, ':***@'), schema, dashboard: worker.httpUrl },
  'berth demo running; Ctrl-C to stop',
);
// The banner goes to stderr: on a terminal it is what a person reads, and piped it stays apart
// from the JSON lines on stdout.
process.stderr.write(
  `\nberth demo: dashboard at ${worker.httpUrl}/  (metrics at ${worker.httpUrl}/metrics; Ctrl-C to stop)\n` +
    (env.logLevel === undefined && process.stdout.isTTY
      ? '  worker logs: warnings only on a terminal; BERTH_LOG_LEVEL=info (or debug: every completed task) for all\n\n'
      : '\n'),
);

let stoppingSince = 0;
async function shutdown(signal: NodeJS.Signals) {
  if (stoppingSince) {
    // Under `npm start` / `npx tsx`, one Ctrl-C arrives two or three times within some tens of
    // milliseconds (from the terminal, then forwarded by npm and relayed by tsx): the same one.
    if (Date.now() - stoppingSince < 1000) return;
    // A second Ctrl-C: stop waiting. An embedded PostgreSQL still stops by itself (its IPC
    // channel drops); leases not yet released lapse and are rescued.
    log.warn({ signal }, 'forced exit');
    process.exit(130);
  }
  stoppingSince = Date.now();
  log.info({ signal }, 'stopping: worker first (releases its leases), then the database');
  clearInterval(trickle);
  await worker.stop();
  await pool.end();
  await db.stop();
  log.info('demo stopped');
  process.exit(0);
}
process.on('SIGINT', shutdown);
process.on('SIGTERM', shutdown);
