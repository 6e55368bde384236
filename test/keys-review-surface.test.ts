/**
 * Review of concurrency keys (migration 29): the operator surface on held tasks, the paths that
 * move, retry, cancel, dedupe and prune keyed tasks, bad input and roles, a fleet without a
 * leader, and a fleet of workers with retries, snoozes and a graceful stop.
 *
 * A `regression (review N)` test names a finding of that review, fixed since, and fails if it
 * comes back; a `held` test is an attack that held.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  cancelTasks,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  grantRuntimeRole,
  listTasks,
  moveTask,
  pauseQueue,
  retryTask,
  setKeyLimit,
  snooze,
  Worker,
} from '../src/index.js';
import { promoteDue } from '../src/maintenance/promote.js';
import { pruneTaskKeys } from '../src/storage/keys.js';
import { storageFor } from '../src/storage/storage.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, scaled, urlAs, waitFor } from './helpers.js';
import { bury, enqueueKeyed, liveOfKey, promoteHeldSql, settle, where } from './keys-review-support.js';

const { schema, pool } = await freshSchema('krev_surface');
const S = `"${schema}"`;
const { logger } = captureLogger();

test('regression (review 10): listTasks shows a held task with runAt Infinity (a number, not a Date or null)', async () => {
  const [h] = await enqueueKeyed(pool, S, ['L1'], { queue: 'list' });
  assert.equal((await getTask(pool, schema, h!.id!))?.runAt, null, 'getTask hides it');
  const page = await listTasks(pool, schema, { queue: 'list' });
  const row = page.tasks.find((t) => t.id === h!.id);
  assert.equal(row?.state, 'held');
  assert.ok(row?.runAt === null || row?.runAt instanceof Date, `runAt is ${String(row?.runAt)} (${typeof row?.runAt})`);
});

test("regression (review 10): listTasks({ state: 'held' }) and cancelTasks({ state: 'held' }) refuse the state", async () => {
  await enqueueKeyed(pool, S, ['L2'], { queue: 'list2' });
  const page = await listTasks(pool, schema, { state: 'held' });
  assert.ok(page.tasks.length >= 1);
  const r = await cancelTasks(pool, schema, { state: 'held', queue: 'list2' });
  assert.equal(r.removed, 1);
});

test('regression (review 13): a keyed task of a paused queue is not admitted, so it does not keep its key from another queue', async () => {
  await pool.query(`SELECT ${S}.provision_lane('paused-q', 0::smallint, 0::smallint)`);
  await pauseQueue(pool, schema, 'paused-q', 'review');
  const [p1] = await enqueueKeyed(pool, S, ['PZ'], { queue: 'paused-q' });
  const [o1] = await enqueueKeyed(pool, S, ['PZ'], { queue: 'open-q' });
  await promoteHeldSql(pool, S, ['PZ']);
  assert.equal(await where(pool, S, p1!.id!), 'held', "the paused queue's task waits for the resume, held");
  assert.equal(await where(pool, S, o1!.id!), 'ready', "the open queue's task of the key runs meanwhile");
});

test('held: the ordinary enqueue statement is the one sent before keys (text, name, values)', async () => {
  const seen: { name?: string; text: string; values: unknown[] }[] = [];
  const executor = {
    query: async (q: { name?: string; text: string; values: unknown[] }) => {
      seen.push(q);
      return { rows: [{ ids: ['1'], states: 'r', id: '1' }], rowCount: 1 };
    },
  };
  await enqueueMany(executor as never, [
    { type: 't', payload: { a: 1 } },
    { type: 't', payload: { a: 2 } },
  ]);
  assert.equal(seen.length, 1);
  assert.match(seen[0]!.name ?? '', /^berth-enqueue:berth@/);
  assert.equal(seen[0]!.values.length, 11);
  assert.match(seen[0]!.text, /FROM "berth"\.enqueue\(\$1,/);
  assert.match(seen[0]!.text, /\$11::text\) AS e$/);
  // One plain task (since migration 33): enqueue_one(), the task as scalars, its id as text.
  await enqueue(executor as never, 't', { a: 1 }, { schema: 'berth' });
  assert.equal(seen.length, 2);
  assert.match(seen[1]!.name ?? '', /^berth-enqueue-one:berth@/);
  assert.equal(seen[1]!.values.length, 7);
  assert.equal(seen[1]!.text, 'SELECT "berth".enqueue_one($1, $2, $3, $4, $5, $6, $7)::text AS id');
  // The same comparison against the file as of 6e95eab^ (git show 6e95eab^:src/producer/enqueue.ts,
  // loaded beside the new one) gave identical text, name and values for a one-lane and a
  // two-lane call: see the review report.
});

test('held: bad input from SQL (enqueue_keyed called directly) is refused, nothing written', async () => {
  const bad: [string, unknown[]][] = [
    [`ARRAY['t','t'], ARRAY['{}','{}']::jsonb[], NULL, NULL, NULL, NULL, ARRAY['k']`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, NULL`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, ARRAY[NULL::text]`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, ARRAY['']`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, ARRAY[repeat('k', 1025)]`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, ARRAY[repeat('é', 513)]`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, ARRAY[['a']]`, []],
    [`ARRAY['t'], ARRAY['{}']::jsonb[], ARRAY['infinity']::timestamptz[], NULL, NULL, NULL, ARRAY['k']`, []],
    [`ARRAY['t','t'], ARRAY['{}','{}']::jsonb[], ARRAY[now()], NULL, NULL, NULL, ARRAY['k','k']`, []],
  ];
  const before = (await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_keys`)).rows[0].n;
  for (const [args] of bad) {
    await assert.rejects(
      pool.query(`SELECT * FROM ${S}.enqueue_keyed('bad', 0::smallint, 0::smallint, 1::smallint, ${args})`),
      (e: { code?: string; message?: string }) => e.code === '22023' || e.code === '2202E',
      args,
    );
  }
  assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_keys`)).rows[0].n, before);
  assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.deferred WHERE queue = 'bad'`)).rows[0].n, 0);
});

test('held: set_key_limit is refused to the runtime roles; promote_held to a producer; enqueue_keyed granted to both', async () => {
  const workerRole = `krev_w_${process.pid}`;
  const producerRole = `krev_p_${process.pid}`;
  for (const r of [workerRole, producerRole]) {
    await pool.query(`DROP ROLE IF EXISTS "${r}"`);
    await pool.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER`);
  }
  after(async () => {
    for (const r of [workerRole, producerRole]) {
      await pool.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS "${r}"`).catch(() => undefined);
    }
  });
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: workerRole });
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: producerRole, kind: 'producer' });
  const can = async (role: string, fn: string) =>
    (await pool.query(`SELECT has_function_privilege($1, $2, 'EXECUTE') AS x`, [role, `${S}.${fn}`])).rows[0].x;
  assert.equal(await can(workerRole, 'set_key_limit(text,text,integer,text)'), false);
  assert.equal(await can(producerRole, 'set_key_limit(text,text,integer,text)'), false);
  assert.equal(await can(producerRole, 'promote_held(text[], text)'), false);
  assert.equal(await can(workerRole, 'promote_held(text[], text)'), true);
  assert.equal(
    await can(
      producerRole,
      'enqueue_keyed(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[],text,text[])',
    ),
    true,
  );
  const asWorker = new pg.Pool({ connectionString: urlAs(workerRole), max: 1 });
  try {
    await assert.rejects(asWorker.query(`SELECT ${S}.set_key_limit('queue', 'q', 5, 'w')`), { code: '42501' });
    await assert.rejects(
      asWorker.query(`INSERT INTO ${S}.key_limits (scope, name, per_key, updated_by) VALUES ('queue','q',5,'w')`),
      { code: '42501' },
    );
    await assert.rejects(asWorker.query(`DELETE FROM ${S}.held_keys`), { code: '42501' });
  } finally {
    await asWorker.end();
  }
});

test('held: moving a standing keyed task to another queue keeps it counted; a held one moves and is admitted there', async () => {
  const [m1, m2] = await enqueueKeyed(pool, S, ['MV', 'MV'], { queue: 'mv-a' });
  await promoteHeldSql(pool, S, ['MV']);
  assert.equal(await where(pool, S, m1!.id!), 'ready');
  assert.equal(await moveTask(pool, schema, m1!.id!, { queue: 'mv-b' }), 'moved');
  assert.equal(await moveTask(pool, schema, m2!.id!, { queue: 'mv-c' }), 'moved');
  assert.equal((await getTask(pool, schema, m2!.id!))?.state, 'held');
  await promoteHeldSql(pool, S, null);
  assert.equal(await liveOfKey(pool, S, 'MV'), 1, 'the moved task still holds the key');
  assert.equal(await where(pool, S, m2!.id!), 'held');
  await settle(pool, S, [m1!.id!]);
  await promoteHeldSql(pool, S, null);
  const t = await getTask(pool, schema, m2!.id!);
  assert.equal(t?.state, 'ready');
  assert.equal(t?.queue, 'mv-c');
});

test('held: retry now of a held task is refused; of a scheduled keyed task it makes it due, and promotion holds it', async () => {
  const [h1] = await enqueueKeyed(pool, S, ['RN'], { queue: 'rn' });
  const [s1] = await enqueueKeyed(pool, S, ['RN'], { queue: 'rn', runAt: new Date(Date.now() + 3_600_000) });
  assert.equal(await retryTask(pool, schema, h1!.id!), 'not_retryable');
  assert.equal(await retryTask(pool, schema, s1!.id!), 'retried');
  await promoteDue(pool, schema);
  assert.equal(await where(pool, S, s1!.id!), 'held', 'due, it waits for its key instead of entering its lane');
  await promoteHeldSql(pool, S, ['RN']);
  assert.equal(await liveOfKey(pool, S, 'RN'), 1);
});

test('held: a dedupe duplicate in enqueue_keyed gets no key; the key admits the one task', async () => {
  const r = await enqueueKeyed(pool, S, ['DK', 'DK'], { queue: 'dk', dedupe: 'dk-1' });
  assert.deepEqual(
    r.map((x) => x.state),
    ['held', 'duplicate'],
  );
  assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_keys WHERE key = 'DK'`)).rows[0].n, 1);
  const again = await enqueueKeyed(pool, S, ['DK'], { queue: 'dk', dedupe: 'dk-1' });
  assert.equal(again[0]!.state, 'duplicate');
  assert.equal(again[0]!.duplicate_of, r[0]!.id);
});

test('held: a key limit lowered while tasks stand admits nothing until they settle below it', async () => {
  await setKeyLimit(pool, schema, { queue: 'low' }, 3, 'review');
  const made = await enqueueKeyed(pool, S, Array(6).fill('LOW'), { queue: 'low' });
  await promoteHeldSql(pool, S, ['LOW']);
  assert.equal(await liveOfKey(pool, S, 'LOW'), 3);
  await setKeyLimit(pool, schema, { queue: 'low' }, 1, 'review');
  await settle(pool, S, [made[0]!.id!]);
  await promoteHeldSql(pool, S, ['LOW']);
  assert.equal(await liveOfKey(pool, S, 'LOW'), 2);
  await settle(pool, S, [made[1]!.id!, made[2]!.id!]);
  await promoteHeldSql(pool, S, ['LOW']);
  assert.equal(await liveOfKey(pool, S, 'LOW'), 1);
  await setKeyLimit(pool, schema, { queue: 'low' }, null, 'review');
});

test('held: prune_task_keys keeps the keys of tasks still pending (held, scheduled, standing in the ring, dead)', async () => {
  const [p1, p2] = await enqueueKeyed(pool, S, ['PR', 'PR'], { queue: 'pr' });
  const [p3] = await enqueueKeyed(pool, S, ['PR'], { queue: 'pr', runAt: new Date(Date.now() + 3_600_000) });
  const [p4] = await enqueueKeyed(pool, S, ['PR2'], { queue: 'pr' });
  await promoteHeldSql(pool, S, ['PR']);
  await bury(pool, S, p4!.id!);
  await pool.query(`UPDATE ${S}.task_keys SET created_at = now() - interval '2 minutes'`);
  await pruneTaskKeys(pool, storageFor(schema), 100_000);
  const kept = (
    await pool.query(
      `SELECT array_agg(id::text ORDER BY id) AS ids FROM ${S}.task_keys WHERE id = ANY ($1::bigint[])`,
      [[p1!.id, p2!.id, p3!.id, p4!.id]],
    )
  ).rows[0].ids;
  assert.deepEqual(kept, [p1!.id, p2!.id, p3!.id, p4!.id]);
  assert.equal(await where(pool, S, p1!.id!), 'ready');
});

test('held: two workers (one leading) with retries, snoozes and a graceful stop run at most K = 1 per key', async () => {
  const spans: { key: string; start: number; end: number }[] = [];
  const attempts = new Map<string, number>();
  const def = defineTask<{ key: string; i: number }>({
    type: 'mixed_work',
    queue: 'mixed',
    ceilingMs: 10_000,
    maxAttempts: 4,
    backoff: { baseMs: 20, maxMs: 60 },
    handler: async ({ key, i }) => {
      const start = performance.now();
      const id = `${key}:${i}`;
      const n = (attempts.get(id) ?? 0) + 1;
      attempts.set(id, n);
      await new Promise((r) => setTimeout(r, 5 + (i % 4) * 5));
      spans.push({ key, start, end: performance.now() });
      if (n === 1 && i % 5 === 1) throw new Error('first attempt fails');
      if (n === 1 && i % 5 === 2) return snooze(30);
    },
  });
  const make = (id: string, maintenance: boolean) =>
    new Worker({
      connectionString: DATABASE_URL,
      schema,
      workerId: id,
      tasks: [def],
      logger,
      slots: 6,
      pollIntervalMs: 200,
      maintenance: maintenance ? FAST_MAINTENANCE : false,
    });
  const w1 = make('mixed-1', true);
  const w2 = make('mixed-2', false);
  await w1.start();
  await w2.start();
  const total = 3 * 30;
  await enqueueMany(
    pool,
    Array.from({ length: total }, (_, i) => ({
      type: def,
      payload: { key: `m${i % 3}`, i },
      concurrencyKey: `m${i % 3}`,
    })),
    { schema },
  );
  // Done: every task ran its last attempt (a second one for the tasks that fail or snooze first).
  const completed = () =>
    [...attempts.entries()].filter(([id, n]) => {
      const i = Number(id.split(':')[1]);
      return i % 5 === 1 || i % 5 === 2 ? n >= 2 : n >= 1;
    }).length;
  const done = () => completed() >= total;
  let w3: Worker | null = null;
  try {
    await waitFor(() => completed() >= total / 3, scaled(60_000), 'a third of the tasks');
    // A graceful stop hands its unstarted tasks back; another worker takes over.
    await w2.stop();
    w3 = make('mixed-3', false);
    await w3.start();
    await waitFor(done, scaled(120_000), 'every task');
  } finally {
    await w1.stop();
    await w3?.stop();
  }
  for (const key of ['m0', 'm1', 'm2']) {
    const mine = spans.filter((s) => s.key === key).sort((x, y) => x.start - y.start);
    for (let k = 1; k < mine.length; k++)
      assert.ok(mine[k]!.start >= mine[k - 1]!.end, `${key}: a handler started before the previous one ended`);
  }
});
