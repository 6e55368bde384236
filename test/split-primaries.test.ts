/**
 * Queues split across two primaries, as docs/scaling.md shows it: a routing table (queue →
 * primary) shared by the producers and the workers, one pool per primary on the producer side,
 * one `Worker` per primary in one process on the worker side. Two clusters of the test's own
 * (initdb on free ports; the shared server is not touched).
 *
 * What it holds the page to: each task runs on the worker of the primary its queue routes to and
 * is stored only there; an enqueue is atomic with the producer's own write on that primary (a
 * rolled-back order leaves no receipt); each primary elects its own maintenance leader; a
 * dedupe key is unique per primary only (the page's "What a split gives up").
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import {
  DEFAULT_QUEUE,
  defineTask,
  enqueue,
  getTask,
  leaderInfo,
  migrate,
  Worker,
  type TaskSettledEvent,
} from '../src/index.js';
import { testLogger, waitFor } from './helpers.js';
import { PG_BIN, TestCluster } from './support/cluster.js';

const SCHEMA = 'berth';
const missing = existsSync(join(PG_BIN, 'initdb')) ? null : `no PostgreSQL server binaries in ${PG_BIN}`;

/** Undone in reverse order, whatever happens: workers stop before their clusters go. */
const cleanups: (() => Promise<unknown>)[] = [];

test('queues split across two primaries by a routing table', { skip: missing ?? false }, async () => {
  try {
    await splitPrimaries();
  } finally {
    for (const undo of cleanups.reverse()) await undo().catch(() => undefined);
  }
});

async function splitPrimaries(): Promise<void> {
  const created = await Promise.allSettled([TestCluster.create(), TestCluster.create()]);
  const clusters = created.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  for (const c of clusters) cleanups.push(() => c.destroy());
  for (const r of created) if (r.status === 'rejected') throw r.reason;
  const [ordersDb, mediaDb] = clusters.map((c) => c.url());

  // docs/scaling.md's routing table.
  const PRIMARIES = { orders: ordersDb!, media: mediaDb! } as const;
  type Primary = keyof typeof PRIMARIES;
  const ROUTES: Readonly<Record<string, Primary>> = { receipts: 'orders', invoices: 'orders', thumbnails: 'media' };
  const primaryOf = (queue: string): Primary => {
    const p = ROUTES[queue];
    if (p === undefined) throw new Error(`queue ${queue} has no primary in ROUTES`);
    return p;
  };

  const sendReceipt = defineTask<{ orderId: number }>({
    type: 'send_receipt',
    queue: 'receipts',
    ceilingMs: 30_000,
    handler: async () => {},
  });
  const makeThumbnail = defineTask<{ imageId: string }>({
    type: 'make_thumbnail',
    queue: 'thumbnails',
    ceilingMs: 30_000,
    handler: async () => {},
  });
  const tasks = [sendReceipt, makeThumbnail];

  await Promise.all(Object.values(PRIMARIES).map((url) => migrate({ connectionString: url, schema: SCHEMA })));
  const pools = {
    orders: new pg.Pool({ connectionString: PRIMARIES.orders, max: 4 }),
    media: new pg.Pool({ connectionString: PRIMARIES.media, max: 4 }),
  };
  for (const p of Object.values(pools)) cleanups.push(() => p.end());
  await pools.orders.query('CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)');

  // One Worker per primary, in this process, each given the definitions routed there.
  const completed = new Map<Primary, TaskSettledEvent[]>([
    ['orders', []],
    ['media', []],
  ]);
  const workers = (Object.keys(PRIMARIES) as Primary[]).map((p) => {
    const w = new Worker({
      connectionString: PRIMARIES[p],
      schema: SCHEMA,
      workerId: `${p}-${process.pid}`,
      tasks: tasks.filter((d) => primaryOf(d.queue ?? DEFAULT_QUEUE) === p),
      logger: testLogger,
    });
    w.events.on('task:completed', (e) => completed.get(p)!.push(e));
    return { primary: p, worker: w };
  });
  for (const { worker } of workers) {
    await worker.start();
    cleanups.push(() => worker.stop());
  }
  assert.deepEqual(
    workers.map(({ worker }) => worker.queues),
    [['receipts'], ['thumbnails']],
    'each worker claims the queues routed to its primary',
  );

  // Producer: the receipt commits (or not) with the order, on the orders primary.
  const placeOrder = async (email: string, commit: boolean): Promise<string | null> => {
    const client = await pools[primaryOf(sendReceipt.queue!)].connect();
    try {
      await client.query('BEGIN');
      const { rows } = await client.query<{ id: number }>('INSERT INTO orders (email) VALUES ($1) RETURNING id', [
        email,
      ]);
      const r = await enqueue(client, sendReceipt, { orderId: rows[0]!.id });
      await client.query(commit ? 'COMMIT' : 'ROLLBACK');
      return r.id;
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    } finally {
      client.release();
    }
  };
  const receipts = [await placeOrder('a@example.com', true), await placeOrder('b@example.com', true)];
  const rolledBack = await placeOrder('c@example.com', false);
  const thumbnails: string[] = [];
  for (const imageId of ['i-1', 'i-2', 'i-3']) {
    const r = await enqueue(pools[primaryOf('thumbnails')], makeThumbnail, { imageId });
    thumbnails.push(r.id!);
  }

  await waitFor(
    () => completed.get('orders')!.length >= 2 && completed.get('media')!.length >= 3,
    30_000,
    'both primaries to run their tasks',
  );
  const ran = (p: Primary) =>
    completed
      .get(p)!
      .map((e) => `${e.task.queue}/${e.task.id}`)
      .sort();
  assert.deepEqual(ran('orders'), receipts.map((id) => `receipts/${id}`).sort(), 'the orders worker ran the receipts');
  assert.deepEqual(
    ran('media'),
    thumbnails.map((id) => `thumbnails/${id}`).sort(),
    'the media worker ran the thumbnails',
  );

  // Stored only where routed: each id read on its own primary is that task, completed.
  for (const id of receipts) {
    const t = await getTask(pools.orders, SCHEMA, id!);
    assert.equal(t?.state, 'completed');
    assert.equal(t?.queue, 'receipts');
  }
  for (const id of thumbnails) {
    const t = await getTask(pools.media, SCHEMA, id);
    assert.equal(t?.state, 'completed');
    assert.equal(t?.queue, 'thumbnails');
  }
  // The rolled-back order left no receipt (its id was taken in the transaction, then undone).
  assert.equal(await getTask(pools.orders, SCHEMA, rolledBack!), null, 'the receipt rolled back with its order');
  const { rows: orders } = await pools.orders.query<{ n: number }>('SELECT count(*)::int AS n FROM orders');
  assert.equal(orders[0]!.n, 2);

  // Each primary elects its own leader, among the workers connected to it.
  for (const { primary } of workers) {
    const info = await waitFor(
      async () => {
        const i = await leaderInfo(pools[primary], SCHEMA);
        return i.session ? i : null;
      },
      20_000,
      `a leader on the ${primary} primary`,
    );
    assert.match(info.session!.applicationName, new RegExp(`^berth leader ${primary}-`));
  }

  // A dedupe key is unique per primary, not across them: the same key is written on both.
  const later = new Date(Date.now() + 3_600_000);
  const once = (pool: pg.Pool) => enqueue(pool, sendReceipt, { orderId: 0 }, { dedupeKey: 'k', runAt: later });
  const onOrders = await once(pools.orders);
  const onMedia = await once(pools.media);
  const again = await once(pools.orders);
  assert.equal(onOrders.state, 'scheduled');
  assert.equal(onMedia.state, 'scheduled');
  assert.equal(again.state, 'duplicate', 'on one primary the key is held');
}
