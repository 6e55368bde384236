/**
 * Seed 003's three promotion tests, against real PostgreSQL. docs/seed-coverage.md records the
 * run of each with its mechanism removed (and the failure that produced).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueueMany, getTask, Worker } from '../src/index.js';
import { promoteDueLanes } from '../src/maintenance-api.js';
import { claim } from '../src/processor/claim.js';
import { waiterLimit } from '../src/maintenance/promoter.js';
import { claimParams } from './claim-params.js';
import { schemaLockKey } from '../src/storage/locks.js';
import {
  captureLogger,
  counterValue,
  DATABASE_URL,
  FAST_MAINTENANCE,
  freshSchema,
  waitFor,
  holdLaneLock,
} from './helpers.js';

const { schema, pool } = await freshSchema('promo');
const S = `"${schema}"`;
const HOT = { queue: 'hot', priority: 0, shard: 0 };

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
}

async function laneId(queue: string, shard = 0): Promise<number> {
  const r = await pool.query(`SELECT ${S}.provision_lane($1, 0::smallint, $2::smallint) AS id`, [queue, shard]);
  return r.rows[0].id;
}

const holdLane = (lane: number) => holdLaneLock(schema, lane);

/** Two sessions taking turns holding a lane's lock, so it is never free, until stopped. */
function keepLaneBusy(lane: number, turnMs: number): { stop: () => Promise<void> } {
  let stopped = false;
  const session = async () => {
    const c = new pg.Client({ connectionString: DATABASE_URL });
    await c.connect();
    while (!stopped) {
      await c.query('BEGIN');
      await c.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), lane]);
      await new Promise((r) => setTimeout(r, turnMs));
      await c.query('COMMIT');
    }
    await c.end();
  };
  const runs = [session(), new Promise((r) => setTimeout(r, turnMs / 2)).then(session)];
  return {
    stop: async () => {
      stopped = true;
      await Promise.all(runs);
    },
  };
}

test('a contended lane stays deferred and in order while another queue is promoted', async () => {
  await reset();
  const hot = await laneId('hot');
  await laneId('cold');
  const base = Date.now() + 3600_000;
  // Hot rows: ids ascending, due times descending; all older than the cold row.
  await enqueueMany(
    pool,
    Array.from({ length: 6 }, (_, i) => ({
      type: 'x',
      payload: { i },
      ...HOT,
      runAt: new Date(base + (6 - i) * 1000),
    })),
    { schema },
  );
  await enqueueMany(
    pool,
    [{ type: 'x', payload: { cold: true }, queue: 'cold', shard: 0, runAt: new Date(base + 60_000) }],
    { schema },
  );
  await pool.query(`UPDATE ${S}.deferred SET run_at = run_at - interval '2 hours'`);
  const release = await holdLane(hot);
  try {
    const r = await promoteDueLanes(pool, schema, 'scheduled', 100, 50);
    assert.equal(r.promoted, 1, 'the unrelated queue is promoted');
    assert.deepEqual(r.contended, [HOT]);
    assert.equal(
      (await pool.query(`SELECT count(*) FROM ${S}.deferred WHERE queue = 'hot' AND state = 'scheduled'`)).rows[0]
        .count,
      '6',
    );
    const skipped = await promoteDueLanes(pool, schema, 'scheduled', 100, 50, [HOT]);
    assert.equal(skipped.selected, 0, 'a batch that skips the lane does not touch it');
    assert.deepEqual(skipped.contended, []);
  } finally {
    await release();
  }
  for (;;) {
    const r = await promoteDueLanes(pool, schema, 'scheduled', 2, 50);
    if (r.selected === 0) break;
  }
  const order = await pool.query(
    `SELECT (payload->>'i')::int AS i FROM ${S}.ready WHERE lane_id = $1 ORDER BY lane_seq`,
    [hot],
  );
  assert.deepEqual(
    order.rows.map((x) => x.i),
    [5, 4, 3, 2, 1, 0],
    'lane_seq follows due order, not id order',
  );
  const got = await claim(pool, claimParams(schema, [hot], 10, { workerId: 't' }));
  assert.equal(got.length, 6);
});

test('a lane held busy by two sessions taking turns holds back neither another queue nor rescue, and its own tasks complete', async () => {
  await reset();
  const hot = await laneId('hot');
  const done = new Set<string>();
  const def = defineTask<{ tag: string }>({
    type: 'busy',
    ceilingMs: 5000,
    handler: async (p) => void done.add(p.tag),
  });
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 4,
    pollIntervalMs: 100,
    leaseMarginMs: 0,
    logger,
    // 'other' is not served: its abandoned attempt must be found by rescue, not re-run here.
    queues: ['hot', 'cold'],
    maintenance: { ...FAST_MAINTENANCE, waiterLockTimeoutMs: 30_000 },
  });
  // One producer holds the lane until the checks below are done; two more queue behind it and
  // then take turns, so the lane is never free for the whole test.
  const firstHolder = await holdLane(hot);
  const busy = keepLaneBusy(hot, 1500);
  await w.start();
  try {
    // Hot rows are older, so every batch meets the busy lane first.
    await enqueueMany(
      pool,
      Array.from({ length: 5 }, (_, i) => ({ type: 'busy', payload: { tag: `hot${i}` }, ...HOT, delay: 1 })),
      { schema },
    );
    await enqueueMany(pool, [{ type: 'busy', payload: { tag: 'cold' }, queue: 'cold', delay: 50 }], { schema });
    // An abandoned attempt on another queue: leased by a worker that died, lease already lapsed.
    const [abandoned] = await enqueueMany(
      pool,
      [{ type: 'busy', payload: { tag: 'abandoned' }, queue: 'other', shard: 3 }],
      { schema },
    );
    const other = await laneId('other', 3);
    await claim(
      pool,
      claimParams(schema, [other], 1, {
        ceilings: new Map([['busy', 1]]),
        defaultCeilingMs: 1,
        workerId: 'dead-worker',
      }),
    );
    // Both happen while the first producer still holds the lane.
    await waitFor(() => done.has('cold'), 20_000, 'the unrelated queue to complete while the lane is held');
    await waitFor(
      async () => /lease lapsed/.test((await getTask(pool, schema, abandoned!.id!))?.lastError ?? ''),
      20_000,
      'rescue of the abandoned attempt while the lane is held',
    );
    assert.equal(done.size, 1, 'no hot task ran yet: the lane is still held');
    await firstHolder();
    await waitFor(
      () => [0, 1, 2, 3, 4].every((i) => done.has(`hot${i}`)),
      20_000,
      'the hot queue to drain through the waiter while producers take turns',
    );
    assert.ok(
      (await counterValue(w.metrics, 'berth_promote_lane_contention_total', { outcome: 'handed_off', queue: 'hot' })) >=
        1,
    );
  } finally {
    await firstHolder().catch(() => undefined);
    await w.stop();
    await busy.stop();
  }
});

test('4,160 locked due rows do not starve promotion of another queue', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 4160 }, (_, i) => ({ type: 'x', payload: { i }, queue: 'locked', delay: 3600_000 })),
    { schema },
  );
  await enqueueMany(pool, [{ type: 'x', payload: { free: true }, queue: 'free', delay: 3600_000 }], { schema });
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 hour' WHERE queue = 'locked'`);
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 minute' WHERE queue = 'free'`);
  const holder = new pg.Client({ connectionString: DATABASE_URL });
  await holder.connect();
  await holder.query('BEGIN');
  await holder.query(`SELECT id FROM ${S}.deferred WHERE queue = 'locked' FOR UPDATE`);
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [],
    queues: ['none'],
    logger,
    maintenance: { ...FAST_MAINTENANCE, promoteBatchSize: 1000 },
  });
  await w.start();
  try {
    const free = (await pool.query(`SELECT id::text FROM ${S}.deferred WHERE queue = 'free'`)).rows[0].id;
    await waitFor(
      async () => (await getTask(pool, schema, free))?.state === 'ready',
      20_000,
      'the free queue promoted past 4,160 locked rows',
    );
    assert.equal((await pool.query(`SELECT count(*) FROM ${S}.deferred WHERE queue = 'locked'`)).rows[0].count, '4160');
    await holder.query('COMMIT');
    await waitFor(
      async () => (await pool.query(`SELECT count(*) FROM ${S}.deferred`)).rows[0].count === '0',
      20_000,
      'locked rows promoted once released',
    );
  } finally {
    await holder.end().catch(() => undefined);
    await w.stop();
  }
});

test('waiters: one per eight pool connections, at least one, at most four', () => {
  assert.deepEqual([1, 7, 8, 10, 16, 24, 32, 100].map(waiterLimit), [1, 1, 1, 1, 2, 3, 4, 4]);
});

test('losing leadership aborts a waiter; its rows stay deferred', async () => {
  await reset();
  const hot = await laneId('hot');
  await enqueueMany(
    pool,
    Array.from({ length: 3 }, (_, i) => ({ type: 'x', payload: { i }, ...HOT, delay: 1 })),
    { schema },
  );
  const release = await holdLane(hot);
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [],
    queues: ['none'],
    logger,
    maintenance: FAST_MAINTENANCE,
  });
  await w.start();
  try {
    await waitFor(
      async () =>
        (await counterValue(w.metrics, 'berth_promote_lane_contention_total', { outcome: 'handed_off' })) >= 1,
      10_000,
      'hand-off',
    );
    // The waiter is now blocked on the lane lock; stopping ends the term and must not hang.
    await w.stop();
    // Only this file's schema: other test files run their own waiters in parallel.
    const waiting = await pool.query(
      `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0 AND query LIKE '%promote_lane%'`,
      [`"${schema}".promote_lane`],
    );
    assert.equal(waiting.rows[0].count, '0', 'the waiter was cancelled');
    assert.equal((await pool.query(`SELECT count(*) FROM ${S}.deferred WHERE queue = 'hot'`)).rows[0].count, '3');
  } finally {
    await release();
  }
});
