/**
 * Concurrency keys (docs/architecture.md, "Concurrency keys"): at most K tasks with the same key
 * run at once across the fleet; the rest wait, held in deferred storage, without holding up the
 * other keys of their lane.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import {
  BerthInputError,
  defineTask,
  enqueue,
  enqueueMany,
  enqueueSql,
  getTask,
  listHeldKeys,
  listKeyLimits,
  listTasks,
  retryDeadLetters,
  setKeyLimit,
} from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { freshSchema, scaled, spawnWorkerProcess, stopProcesses, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('ckeys');
const S = `"${schema}"`;

await pool.query(
  `CREATE TABLE ${S}.limit_runs (run bigserial PRIMARY KEY, i integer NOT NULL, task_id bigint NOT NULL,
     worker text NOT NULL, queue text NOT NULL, key text, started_at timestamptz NOT NULL, ended_at timestamptz)`,
);

/** The most handlers of one key that ever ran at once, over every key (`keyFilter`: only these). */
async function peakPerKey(): Promise<number> {
  const r = await pool.query<{ peak: number }>(
    `SELECT coalesce(max(running), 0)::integer AS peak FROM (
       SELECT sum(d) OVER (PARTITION BY key ORDER BY at, d) AS running
         FROM (SELECT key, started_at AS at, 1 AS d FROM ${S}.limit_runs
               UNION ALL SELECT key, ended_at, -1 FROM ${S}.limit_runs) e) x`,
  );
  return r.rows[0]!.peak;
}

async function spawnFleet(queue: string, sleepMs = 20): Promise<ChildProcess[]> {
  const children: ChildProcess[] = [];
  for (const id of ['k1', 'k2', 'k3'])
    children.push(
      await spawnWorkerProcess(schema, `${queue}-${id}`, {
        fixture: 'limit-worker.ts',
        env: { TASK_QUEUE: queue, SLEEP_MS: String(sleepMs) },
      }),
    );
  return children;
}

async function runsDone(filter = 'true'): Promise<number> {
  return (await pool.query(`SELECT count(DISTINCT i)::int AS n FROM ${S}.limit_runs WHERE ${filter}`)).rows[0].n;
}

test('bad input: a clear error naming the field, nothing written', async () => {
  const bad: [unknown, RegExp][] = [
    ['', /concurrencyKey must be a non-empty string/],
    ['k'.repeat(1025), /concurrencyKey must be .*1024/],
    [42, /concurrencyKey must be a non-empty string/],
  ];
  for (const [key, message] of bad) {
    await assert.rejects(
      enqueue(pool, 'lim_work', { i: -1 }, { schema, queue: 'keyed', concurrencyKey: key as string }),
      (err: Error) => err instanceof BerthInputError && message.test(err.message),
      String(key).slice(0, 20),
    );
  }
  await assert.rejects(
    enqueueSql('lim_work', { i: -1 }, { schema, concurrencyKey: 'a' }),
    (err: Error) => err instanceof BerthInputError && /concurrencyKey is not supported/.test(err.message),
  );
  for (const [target, perKey, message] of [
    [{ queue: 'keyed' }, 0, /perKey must be an integer from 1/],
    [{ queue: 'keyed' }, 1.5, /perKey must be an integer/],
    [{ queue: 'keyed', type: 't' }, 2, /exactly one of queue or type/],
    [{}, 2, /exactly one of queue or type/],
    [{ task: 't' }, 2, /unknown option "task"; did you mean "type"\?/],
  ] as const) {
    await assert.rejects(
      setKeyLimit(pool, schema, target as never, perKey, 'test'),
      (err: Error) => err instanceof BerthInputError && message.test(err.message),
      JSON.stringify(target),
    );
  }
  assert.deepEqual(await listKeyLimits(pool, schema), []);
  const n = await pool.query(`SELECT (SELECT count(*) FROM ${S}.deferred) + (SELECT count(*) FROM ${S}.ready) AS n`);
  assert.equal(Number(n.rows[0].n), 0);
});

test('one busy key does not hold up another in the same lane: B behind 300 of A runs at once', async () => {
  const t0 = (await pool.query<{ t: Date }>('SELECT clock_timestamp() AS t')).rows[0]!.t;
  await enqueueMany(
    pool,
    Array.from({ length: 300 }, (_, i) => ({
      type: 'lim_work',
      payload: { i, key: 'A' },
      queue: 'keyed',
      shard: 0,
      concurrencyKey: 'A',
    })),
    { schema },
  );
  const [b] = await enqueueMany(
    pool,
    [{ type: 'lim_work', payload: { i: 1000, key: 'B' }, queue: 'keyed', shard: 0, concurrencyKey: 'B' }],
    { schema },
  );
  assert.equal(b!.state, 'held');
  const held = await listHeldKeys(pool, schema);
  assert.ok(held.some((h) => h.key === 'A' && h.held > 0));
  const children = await spawnFleet('keyed', 20);
  try {
    await waitFor(async () => (await runsDone('i = 1000')) === 1, scaled(60_000), 'B to run');
    const aDone = await runsDone(`key = 'A'`);
    assert.ok(aDone < 150, `B ran before A's backlog drained (${aDone} of 300 A ran first)`);
    await waitFor(async () => (await runsDone(`key = 'A'`)) === 300, scaled(120_000), 'A to drain');
  } finally {
    await stopProcesses(children);
  }
  assert.equal(await peakPerKey(), 1, 'one task of a key at a time (K = 1)');
  const gone = (await getTask(pool, schema, b!.id!))?.state;
  assert.ok(
    gone === 'completed' || gone === undefined || gone === null,
    `B completed (${gone}); t0 ${t0.toISOString()}`,
  );
});

test('3 processes x 8 slots, 50 keys with K = 1, then one hot key beside 49 cold ones', async () => {
  await pool.query(`TRUNCATE ${S}.limit_runs`);
  await enqueueMany(
    pool,
    Array.from({ length: 500 }, (_, i) => ({
      type: 'lim_work',
      payload: { i, key: `k${i % 50}` },
      queue: 'keyed',
      concurrencyKey: `k${i % 50}`,
    })),
    { schema },
  );
  const children = await spawnFleet('keyed', 10);
  try {
    await waitFor(async () => (await runsDone()) === 500, scaled(120_000), '500 keyed tasks to run');
    assert.equal(await peakPerKey(), 1);
    const overall = await pool.query<{ peak: number }>(
      `SELECT coalesce(max(running), 0)::integer AS peak FROM (
         SELECT sum(d) OVER (ORDER BY at, d) AS running
           FROM (SELECT started_at AS at, 1 AS d FROM ${S}.limit_runs
                 UNION ALL SELECT ended_at, -1 FROM ${S}.limit_runs) e) x`,
    );
    assert.ok(overall.rows[0]!.peak >= 4, `keys ran side by side (peak ${overall.rows[0]!.peak})`);
    // One hot key (400 tasks) beside 49 cold ones (2 each), the hot ones enqueued first.
    await pool.query(`TRUNCATE ${S}.limit_runs`);
    await enqueueMany(
      pool,
      Array.from({ length: 400 }, (_, i) => ({
        type: 'lim_work',
        payload: { i: 10_000 + i, key: 'hot' },
        queue: 'keyed',
        concurrencyKey: 'hot',
      })),
      { schema },
    );
    await enqueueMany(
      pool,
      Array.from({ length: 98 }, (_, i) => ({
        type: 'lim_work',
        payload: { i: 20_000 + i, key: `cold${i % 49}` },
        queue: 'keyed',
        concurrencyKey: `cold${i % 49}`,
      })),
      { schema },
    );
    await waitFor(async () => (await runsDone(`key LIKE 'cold%'`)) === 98, scaled(60_000), 'the cold keys to run');
    const hotDone = await runsDone(`key = 'hot'`);
    assert.ok(hotDone < 300, `the cold keys did not wait for the hot backlog (${hotDone} of 400 hot ran first)`);
    await waitFor(async () => (await runsDone(`key = 'hot'`)) === 400, scaled(120_000), 'the hot key to drain');
    assert.equal(await peakPerKey(), 1);
  } finally {
    await stopProcesses(children);
  }
});

test("K from the queue, and a task type's K over its queue's", async () => {
  await pool.query(`TRUNCATE ${S}.limit_runs`);
  await setKeyLimit(pool, schema, { queue: 'keyed' }, 3, 'test');
  await enqueueMany(
    pool,
    Array.from({ length: 60 }, (_, i) => ({
      type: 'lim_work',
      payload: { i, key: 'q3' },
      queue: 'keyed',
      concurrencyKey: 'q3',
    })),
    { schema },
  );
  const children = await spawnFleet('keyed', 40);
  try {
    await waitFor(async () => (await runsDone()) === 60, scaled(60_000), 'K = 3 to drain');
    const peak = await peakPerKey();
    assert.ok(peak <= 3 && peak >= 2, `at most 3 at once, and more than 1 (peak ${peak})`);
    await pool.query(`TRUNCATE ${S}.limit_runs`);
    await setKeyLimit(pool, schema, { type: 'lim_work' }, 2, 'test');
    await enqueueMany(
      pool,
      Array.from({ length: 40 }, (_, i) => ({
        type: 'lim_work',
        payload: { i, key: 't2' },
        queue: 'keyed',
        concurrencyKey: 't2',
      })),
      { schema },
    );
    await waitFor(async () => (await runsDone()) === 40, scaled(60_000), 'K = 2 to drain');
    assert.ok((await peakPerKey()) <= 2, "the type's limit wins");
  } finally {
    await stopProcesses(children);
  }
  assert.deepEqual(
    (await listKeyLimits(pool, schema)).map((l) => [l.scope, l.name, l.perKey]),
    [
      ['queue', 'keyed', 3],
      ['type', 'lim_work', 2],
    ],
  );
  await setKeyLimit(pool, schema, { queue: 'keyed' }, null, 'test');
  await setKeyLimit(pool, schema, { type: 'lim_work' }, null, 'test');
  assert.deepEqual(await listKeyLimits(pool, schema), []);
});

test('runDueTasks admits held keyed tasks; a retry and a dead letter retried wait for their key too', async () => {
  let fail = true;
  const runs: string[] = [];
  const def = defineTask<{ n: string }>({
    type: 'key_due',
    queue: 'keyed-due',
    ceilingMs: 10_000,
    maxAttempts: 1,
    handler: async ({ n }) => {
      runs.push(n);
      if (n === 'x1' && fail) throw new Error('first run fails');
    },
  });
  const r = await enqueueMany(
    pool,
    ['x1', 'x2', 'x3'].map((n) => ({ type: def, payload: { n }, concurrencyKey: 'X' })),
    { schema },
  );
  assert.deepEqual(
    r.map((x) => x.state),
    ['held', 'held', 'held'],
  );
  // Shown as held, with no run time (it waits for its key, not for a time).
  const listed = await listTasks(pool, schema, { state: 'held', queue: 'keyed-due' });
  assert.equal(listed.tasks.length, 3);
  assert.ok(listed.tasks.every((t) => t.state === 'held' && t.runAt === null));
  const one = await getTask(pool, schema, r[1]!.id!);
  assert.equal(one?.state, 'held');
  assert.equal(one?.runAt, null);
  const reports = await runDueTasks(pool, [def], { schema, queues: ['keyed-due'] });
  assert.deepEqual(
    reports.map((x) => x.status),
    ['dead', 'completed', 'completed'],
  );
  assert.deepEqual(runs, ['x1', 'x2', 'x3']);
  fail = false;
  // A dead keyed task retried goes back held for its key, then runs.
  const retried = await retryDeadLetters(pool, schema, [r[0]!.id!]);
  assert.deepEqual(
    retried.map((x) => x.result),
    ['retried'],
  );
  assert.equal((await getTask(pool, schema, r[0]!.id!))?.state, 'held');
  const again = await runDueTasks(pool, [def], { schema, queues: ['keyed-due'] });
  assert.deepEqual(
    again.map((x) => x.status),
    ['completed'],
  );
});

test('this code refuses a schema of migration 28, which has no concurrency keys, naming the fix', async () => {
  const { assertMigrated, SchemaNotMigratedError } = await import('../src/index.js');
  const { migrateUpTo } = await import('./helpers.js');
  const old = `${schema}_v28`;
  await pool.query(`DROP SCHEMA IF EXISTS "${old}" CASCADE`);
  await pool.query(`CREATE SCHEMA "${old}"`);
  try {
    await migrateUpTo(pool, old, 28);
    await assert.rejects(
      assertMigrated(pool, old),
      (err: Error) =>
        err instanceof SchemaNotMigratedError && /older than this code .*berth migrate --schema/.test(err.message),
    );
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS "${old}" CASCADE`);
  }
});
