/**
 * Review of the bench's first-enqueue method (a002d20, 9478acd): what each system's producer has
 * run on its session before the timed first enqueue (bench/systems/*.ts openProducer, then
 * bench/cold-child.ts: optional Producer.migrate(), then the timed single()).
 *
 * The method text (bench/run.ts) says what each producer's session has run before its first
 * enqueue: berth's `SELECT 1`; graphile-worker's its migrate check (makeWorkerUtils runs it) and
 * `SELECT 1`; with the "after migrate()" row, each system's own migrate() as well. The adapters are
 * run here on a database of their own and every statement each pg.Client sends is recorded with
 * the client's backend pid, so the session of the first enqueue and what it ran before are known.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import type { SystemAdapter } from '../bench/systems/types.js';
import { DATABASE_URL } from './helpers.js';

const DB = `rev_eager_bench_${process.pid}`;
const url = (() => {
  const u = new URL(DATABASE_URL);
  u.pathname = `/${DB}`;
  return u.toString();
})();

/** Every statement sent through pg.Client#query, with the backend pid of the client that sent it. */
const sent: { pid: number; text: string }[] = [];
const originalQuery = pg.Client.prototype.query;

before(async () => {
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${DB}`);
  await admin.query(`CREATE DATABASE ${DB}`);
  await admin.end();
  (pg.Client.prototype as { query: unknown }).query = function (this: pg.Client, q: unknown, ...rest: unknown[]) {
    const text = typeof q === 'string' ? q : ((q as { text?: string } | null)?.text ?? String(q));
    sent.push({ pid: (this as unknown as { processID: number }).processID, text: text.replace(/\s+/g, ' ').trim() });
    return (originalQuery as (...a: unknown[]) => unknown).call(this, q, ...rest);
  };
});

after(async () => {
  (pg.Client.prototype as { query: unknown }).query = originalQuery;
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`).catch(() => undefined);
  await admin.end();
});

/**
 * Open the adapter's producer as the cold child does (optionally its migrate()), mark, run one
 * single(): the statements of the enqueue's session before the mark, and the enqueue's pid.
 */
async function sessionBeforeFirstEnqueue(
  adapter: SystemAdapter,
  migrateFirst: boolean,
): Promise<{ before: string[]; pids: Set<number> }> {
  await adapter.reset();
  const start = sent.length;
  const producer = await adapter.openProducer();
  try {
    if (migrateFirst) await producer.migrate!();
    const mark = sent.length;
    await producer.single(0);
    const enqueuePids = new Set(sent.slice(mark).map((s) => s.pid));
    assert.equal(enqueuePids.size, 1, 'the first enqueue runs on one session');
    const [pid] = [...enqueuePids];
    const beforeMark = sent.slice(start, mark);
    return {
      before: beforeMark.filter((s) => s.pid === pid).map((s) => s.text),
      pids: new Set(beforeMark.map((s) => s.pid)),
    };
  } finally {
    await producer.close();
  }
}

test("graphile-worker's producer session has run its own migrate check and SELECT 1 before its first addJob (as makeWorkerUtils does for every user)", async () => {
  const { graphileAdapter } = await import('../bench/systems/graphile.js');
  const { before } = await sessionBeforeFirstEnqueue(graphileAdapter({ connectionString: url }, 'default'), false);
  // makeWorkerUtils() runs graphile-worker's migrate() on the pool's session before it returns
  // (node_modules/graphile-worker/dist/lib.js, getUtilsAndReleasersFromOptions: "// Migrate"),
  // so the session has read graphile_worker.migrations before the SELECT 1 and the timed addJob:
  // what bench/systems/graphile.ts and bench/run.ts's method text say.
  assert.ok(
    before.some((t) => /graphile_worker"?\.migrations/.test(t)),
    `graphile's session ran, before the first addJob:\n${before.join('\n')}`,
  );
  assert.equal(before.at(-1), 'SELECT 1');
});

test("graphile-worker's 'after migrate()' row: utils.migrate() runs on the session of the first addJob", async () => {
  const { graphileAdapter } = await import('../bench/systems/graphile.js');
  const { before, pids } = await sessionBeforeFirstEnqueue(graphileAdapter({ connectionString: url }, 'default'), true);
  assert.equal(pids.size, 1, 'one session from open to the first addJob');
  assert.ok(
    before.some((t) => /graphile_worker"?\.migrations/.test(t)),
    before.join('\n'),
  );
});

test("berth's 'after migrate()' row: migrate({ client }) runs on the session of the first enqueue", async () => {
  process.env.BENCH_BERTH_SRC = '1'; // src/ under tsx, so this test needs no build
  const { berthAdapter } = await import('../bench/systems/berth.js');
  const { before, pids } = await sessionBeforeFirstEnqueue(berthAdapter({ connectionString: url }), true);
  assert.equal(pids.size, 1, `one session from open to the first enqueue, got pids ${[...pids].join(', ')}`);
  assert.equal(before[0], 'SELECT 1');
  assert.ok(
    before.some((t) => t.startsWith('SELECT pg_advisory_xact_lock')),
    before.join('\n'),
  );
});

test("berth's plain first-enqueue row: its session has run only SELECT 1", async () => {
  process.env.BENCH_BERTH_SRC = '1';
  const { berthAdapter } = await import('../bench/systems/berth.js');
  const { before } = await sessionBeforeFirstEnqueue(berthAdapter({ connectionString: url }), false);
  assert.deepEqual(before, ['SELECT 1']);
});
