/**
 * Fleet-wide queue limits (docs/architecture.md, "Queue limits"): a queue's running limit and
 * its rate limit hold across worker processes, enforced by the database's limited claim.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { BerthInputError, clearQueueLimit, enqueueMany, listQueueLimits, setQueueLimit } from '../src/index.js';
import { freshSchema, scaled, spawnWorkerProcess, stopProcesses, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('qlimits');
const S = `"${schema}"`;

await pool.query(
  `CREATE TABLE ${S}.limit_runs (run bigserial PRIMARY KEY, i integer NOT NULL, task_id bigint NOT NULL,
     worker text NOT NULL, queue text NOT NULL, key text, started_at timestamptz NOT NULL, ended_at timestamptz)`,
);

async function enqueueWork(n: number, from = 0): Promise<void> {
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, k) => ({ type: 'lim_work', payload: { i: from + k }, queue: 'limited' })),
    { schema },
  );
}

/** The most handlers that ever ran at once: the peak of the starts and ends, in time order. */
async function maxOverlap(): Promise<number> {
  const r = await pool.query<{ peak: number }>(
    `SELECT coalesce(max(running), 0)::integer AS peak FROM (
       SELECT sum(d) OVER (ORDER BY at, d) AS running
         FROM (SELECT started_at AS at, 1 AS d FROM ${S}.limit_runs
               UNION ALL SELECT ended_at, -1 FROM ${S}.limit_runs WHERE ended_at IS NOT NULL) e) x`,
  );
  return r.rows[0]!.peak;
}

test('bad input: a clear error naming the field, and nothing changes', async () => {
  await enqueueWork(1, -1);
  const bad: [unknown, RegExp][] = [
    [{ maxRunning: 0 }, /maxRunning must be an integer from 1/],
    [{ maxRunning: -3 }, /maxRunning must be an integer from 1/],
    [{ maxRunning: 2.5 }, /maxRunning must be an integer/],
    [{ rate: { limit: 0, intervalMs: 1000 } }, /rate\.limit must be an integer from 1/],
    [{ rate: { limit: 5, intervalMs: 0 } }, /rate\.intervalMs must be an integer from 1/],
    [{ rate: { limit: 5 } }, /rate\.intervalMs must be an integer/],
    [{ concurrency: 3 }, /unknown option "concurrency"; did you mean "maxRunning"\?/],
    [{ rate: { count: 3, intervalMs: 10 } }, /unknown option "count"; did you mean "limit"\?/],
  ];
  for (const [change, message] of bad) {
    await assert.rejects(
      setQueueLimit(pool, schema, 'limited', change as never, 'test'),
      (err: Error) => err instanceof BerthInputError && message.test(err.message),
      JSON.stringify(change),
    );
  }
  await assert.rejects(
    setQueueLimit(pool, schema, 'no-such-queue', { maxRunning: 3 }, 'test'),
    (err: Error) => err instanceof BerthInputError && /queue "no-such-queue" does not exist/.test(err.message),
  );
  await assert.rejects(
    setQueueLimit(pool, schema, 'x'.repeat(300), { maxRunning: 3 }, 'test'),
    (err: Error) => err instanceof BerthInputError && /queue/.test(err.message),
  );
  assert.deepEqual(await listQueueLimits(pool, schema), []);
  const lanes = await pool.query(`SELECT count(*)::int AS n FROM ${S}.lanes WHERE limited`);
  assert.equal(lanes.rows[0].n, 0);
  // Leave nothing queued for the next tests.
  await pool.query(`DELETE FROM ${S}.ready`);
});

test('a running limit of 5 across 3 processes x 8 slots: never more than 5 at once, and the queue drains', async () => {
  const n = 300;
  const limit = await setQueueLimit(pool, schema, 'limited', { maxRunning: 5 }, 'test');
  assert.equal(limit?.maxRunning, 5);
  const children: ChildProcess[] = [];
  try {
    for (const id of ['w1', 'w2', 'w3'])
      children.push(await spawnWorkerProcess(schema, id, { fixture: 'limit-worker.ts' }));
    await enqueueWork(n);
    await waitFor(
      async () => (await pool.query(`SELECT count(*)::int AS n FROM ${S}.limit_runs WHERE i >= 0`)).rows[0].n >= n,
      scaled(120_000),
      'the limited queue to drain',
    );
  } finally {
    await stopProcesses(children);
  }
  const peak = await maxOverlap();
  assert.ok(peak <= 5, `at most 5 handlers ran at once (peak ${peak})`);
  assert.ok(peak >= 2, `the limit was used, not serialised to one (peak ${peak})`);
  const runs = await pool.query(
    `SELECT count(DISTINCT i)::int AS n, count(*)::int AS runs FROM ${S}.limit_runs WHERE i >= 0`,
  );
  assert.equal(runs.rows[0].n, n);
  const workers = await pool.query(`SELECT count(DISTINCT worker)::int AS n FROM ${S}.limit_runs WHERE i >= 0`);
  assert.ok(workers.rows[0].n >= 2, 'more than one process took part');
  const usage = (await listQueueLimits(pool, schema)).find((l) => l.queue === 'limited');
  assert.equal(usage?.running, 0);
});

test('a rate limit of 20 starts per second across 3 processes for 10 s: no second-long window above 20', async () => {
  await pool.query(`TRUNCATE ${S}.limit_runs`);
  await clearQueueLimit(pool, schema, 'limited', 'test');
  await enqueueWork(1000, 10_000);
  await setQueueLimit(pool, schema, 'limited', { rate: { limit: 20, intervalMs: 1000 } }, 'test');
  const children: ChildProcess[] = [];
  let first: Date;
  try {
    for (const id of ['r1', 'r2', 'r3'])
      children.push(await spawnWorkerProcess(schema, id, { fixture: 'limit-worker.ts', env: { SLEEP_MS: '5' } }));
    await waitFor(
      async () => (await pool.query(`SELECT count(*)::int AS n FROM ${S}.limit_runs`)).rows[0].n > 0,
      scaled(30_000),
      'a first start',
    );
    first = (await pool.query<{ t: Date }>(`SELECT min(started_at) AS t FROM ${S}.limit_runs`)).rows[0]!.t;
    await waitFor(
      async () =>
        (await pool.query<{ t: Date }>(`SELECT clock_timestamp() AS t`)).rows[0]!.t.getTime() - first.getTime() >=
        10_000,
      scaled(60_000),
      '10 seconds of starts',
    );
  } finally {
    await stopProcesses(children);
  }
  // Every window of one second that starts at a start (the densest windows start at one).
  const windows = await pool.query<{ peak: number }>(
    `SELECT max((SELECT count(*) FROM ${S}.limit_runs b
                 WHERE b.started_at >= a.started_at AND b.started_at < a.started_at + interval '1 second'))::integer AS peak
       FROM ${S}.limit_runs a`,
  );
  if (windows.rows[0]!.peak > 20) {
    const claims = await pool.query(
      `SELECT le.claimed_at, le.worker, r.started_at, r.started_at - le.claimed_at AS delay
         FROM ${S}.limit_runs r JOIN ${S}.leased_entries le ON le.id = r.task_id ORDER BY r.started_at`,
    );
    console.log(
      claims.rows.map((x) => `${x.claimed_at.toISOString()} ${x.worker} ${x.started_at.toISOString()}`).join('\n'),
    );
  }
  assert.ok(windows.rows[0]!.peak <= 20, `at most 20 starts in any one-second window (peak ${windows.rows[0]!.peak})`);
  const inTen = await pool.query<{ n: number }>(
    `SELECT count(*)::integer AS n FROM ${S}.limit_runs WHERE started_at < $1::timestamptz + interval '10 seconds'`,
    [first!],
  );
  // Close to 200: about 180 on a quiet machine (the rate's guard keeps a start in the window
  // for 1.1 s). A loaded one starts fewer (a task whose handler could not start within the
  // guard is handed back, its start spent), never more.
  assert.ok(inTen.rows[0]!.n <= 200, `at most 200 in the first 10 s (${inTen.rows[0]!.n})`);
  assert.ok(inTen.rows[0]!.n >= 100, `close to 200 in the first 10 s (${inTen.rows[0]!.n})`);
  console.log(`rate limit: ${inTen.rows[0]!.n} starts in the first 10 s, peak ${windows.rows[0]!.peak} in a second`);
  await clearQueueLimit(pool, schema, 'limited', 'test');
  assert.deepEqual(await listQueueLimits(pool, schema), []);
});

test('runDueTasks runs a limited queue within its limits', async () => {
  const { defineTask } = await import('../src/index.js');
  const { runDueTasks } = await import('../src/testing-api.js');
  const seen: number[] = [];
  const def = defineTask<{ i: number }>({
    type: 'lim_due',
    queue: 'due-limited',
    ceilingMs: 10_000,
    handler: async ({ i }) => {
      seen.push(i);
    },
  });
  await enqueueMany(
    pool,
    Array.from({ length: 3 }, (_, i) => ({ type: def, payload: { i } })),
    { schema },
  );
  await setQueueLimit(pool, schema, 'due-limited', { maxRunning: 1 }, 'test');
  // One at a time, each settled before the next claim: a running limit of 1 lets all three run.
  const first = await runDueTasks(pool, [def], { schema, queues: ['due-limited'] });
  assert.deepEqual(
    first.map((r) => r.status),
    ['completed', 'completed', 'completed'],
  );
  assert.deepEqual(seen.sort(), [0, 1, 2]);
  // A rate of 2 a minute: two run now, the third waits for the window.
  await enqueueMany(
    pool,
    Array.from({ length: 3 }, (_, i) => ({ type: def, payload: { i: 10 + i } })),
    { schema },
  );
  await setQueueLimit(
    pool,
    schema,
    'due-limited',
    { maxRunning: null, rate: { limit: 2, intervalMs: 60_000 } },
    'test',
  );
  const second = await runDueTasks(pool, [def], { schema, queues: ['due-limited'] });
  assert.equal(second.length, 2);
  const left = await pool.query(
    `SELECT count(*)::int AS n FROM ${S}.ready r JOIN ${S}.lanes l USING (lane_id)
      WHERE l.queue = 'due-limited' AND r.lane_seq > coalesce((SELECT max(to_seq) FROM ${S}.range_leases x WHERE x.lane_id = r.lane_id), 0)`,
  );
  assert.equal(left.rows[0].n, 1);
  await clearQueueLimit(pool, schema, 'due-limited', 'test');
  const third = await runDueTasks(pool, [def], { schema, queues: ['due-limited'] });
  assert.equal(third.length, 1, 'cleared: the queue is ordinary again');
});
