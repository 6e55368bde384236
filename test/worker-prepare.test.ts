/**
 * A worker plans its first claim and completion at start, on leases that cannot exist
 * (Fetcher.prepare, processor/prepare-settlement.ts): nothing may be claimed or written by it,
 * whatever the queue holds, and a database fault there must not fail start().
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueue, getTask, Worker } from '../src/index.js';
import { prepareSettlement } from '../src/processor/prepare-settlement.js';
import { storageFor } from '../src/storage/storage.js';
import { DATABASE_URL, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('worker_prepare');
const S = `"${schema}"`;
const storage = storageFor(schema);

async function counts(): Promise<Record<string, number>> {
  const r = await pool.query<Record<string, number>>(
    `SELECT (SELECT count(*)::int FROM ${S}.range_leases) AS leases,
            (SELECT count(*)::int FROM ${S}.range_settlements) AS settlements,
            (SELECT count(*)::int FROM ${S}.attempt_history) AS history,
            (SELECT count(*)::int FROM ${S}.task_results) AS results,
            (SELECT count(*)::int FROM ${S}.lanes) AS lanes,
            (SELECT count(*)::int FROM ${S}.ready) AS ready`,
  );
  return r.rows[0]!;
}

test('prepareSettlement plans the completion of the current segment on its session and writes nothing', async () => {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  try {
    const before = await counts();
    await prepareSettlement(client, storage);
    const names = (
      await client.query<{ name: string }>(
        'SELECT name FROM pg_catalog.pg_prepared_statements WHERE name LIKE $1 ORDER BY name',
        [`berth-complete%:${schema}:%`],
      )
    ).rows.map((r) => r.name);
    const segment = (await pool.query<{ s: number }>(`SELECT current_slot AS s FROM ${S}.ring_state`)).rows[0]!.s;
    assert.ok(
      names.some((n) => n.startsWith(`berth-complete:${schema}:${segment}@`)),
      `prepared: ${names.join(', ')}`,
    );
    assert.deepEqual(await counts(), before);
  } finally {
    await client.end();
  }
});

test('prepareSettlement never rejects: a session that is gone leaves it to the first flush', async () => {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  client.on('error', () => {});
  await client.connect();
  await client.end();
  await prepareSettlement(client, storage);
});

test('a worker started over a queue with work claims only through its fetches, and its start writes nothing', async () => {
  const done: number[] = [];
  const t = defineTask<{ i: number }>({
    type: 'prep',
    ceilingMs: 30_000,
    handler: async ({ i }) => {
      done.push(i);
    },
  });
  // A lane with an entry and one without: start's claim must take neither.
  const first = await enqueue(pool, t, { i: 1 }, { schema, queue: 'q1' });
  const empty = await counts();
  assert.equal(empty.leases, 0);
  // A worker of another queue: its fetches never read q1, so only its start could touch the entry.
  const other = defineTask({ type: 'other', ceilingMs: 30_000, handler: async () => {} });
  const idle = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [other],
    queues: ['elsewhere'],
    slots: 2,
    logger: testLogger,
    maintenance: false,
  });
  await idle.start();
  try {
    assert.deepEqual(await counts(), empty);
  } finally {
    await idle.stop();
  }
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [t],
    slots: 2,
    queues: 'all',
    logger: testLogger,
  });
  await worker.start();
  try {
    const second = await enqueue(pool, t, { i: 2 }, { schema, queue: 'q2' });
    await waitFor(
      async () => {
        const a = await getTask(pool, schema, first.id!);
        const b = await getTask(pool, schema, second.id!);
        return a?.state === 'completed' && b?.state === 'completed';
      },
      30_000,
      'both tasks completed',
    );
    assert.deepEqual(done.sort(), [1, 2]);
    const after = await counts();
    assert.equal(after.lanes, 2, 'no lane opened by the start');
  } finally {
    await worker.stop();
  }
});
