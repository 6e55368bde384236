/**
 * Adversarial review of issue 35's second round (8923e30 completion by position, 3103af5 one
 * Execution per task, 1ac5846 SettlementBatcher.enlist, 16833c2 a plain task with no async frame,
 * 4f8dcd0 a throwing logger while told). Attacked: what a handler may answer (thenables, promise
 * subclasses, a `then` on the instance, values, throws, rejections with non-Errors), completion
 * answered by position (leases interleaved, split over two flushes, duplicated, partly settled
 * by someone else, a stolen token), an execution that crashes while it starts with a logger that
 * throws, and the async context task:settled listeners run in.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AsyncLocalStorage } from 'node:async_hooks';
import { defineTask, enqueue, enqueueMany, getTask, Worker } from '../src/index.js';
import type { ClaimedTask } from '../src/processor/claim.js';
import { completeBatch } from '../src/storage/complete.js';
import { storageFor } from '../src/storage/storage.js';
import type { Logger } from '../src/logger.js';
import { claimedTasks } from './claimed-tasks.js';
import { DATABASE_URL, expectOutcome, freshSchema, outcomes, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('alloc_round2');
const S = `"${schema}"`;
const storage = storageFor(schema);

function worker(type: string, handler: (p: unknown) => unknown, extra: Record<string, unknown> = {}) {
  const def = defineTask<unknown>({ type, ceilingMs: 60_000, handler: handler as never });
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    queues: [type],
    logger: testLogger,
    maintenance: false,
    heartbeatIntervalMs: false,
    ...extra,
  });
}

class SubPromise<T> extends Promise<T> {
  static thens = 0;
  // biome-ignore lint/suspicious/noThenProperty: a promise subclass with its own then is the case
  override then<A = T, B = never>(
    f?: ((v: T) => A | PromiseLike<A>) | null,
    r?: ((e: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    SubPromise.thens++;
    return super.then(f, r);
  }
}

test('what a handler answers, each counted once as its outcome, its result stored as `await` would have read it; with and without task listeners', async () => {
  // [name, handler, outcome, stored result (undefined: none)]
  const cases: [string, () => unknown, string, unknown][] = [
    // biome-ignore lint/suspicious/noThenProperty: a non-native thenable is the case
    ['thenable', () => ({ then: (ok: (v: unknown) => void) => ok({ t: 1 }) }), 'success', { t: 1 }],
    [
      'thenable_twice',
      () => ({
        // biome-ignore lint/suspicious/noThenProperty: a thenable that answers twice is the case
        then: (ok: (v: unknown) => void, no: (e: unknown) => void) => {
          ok({ first: true });
          no(new Error('second'));
          ok({ third: true });
        },
      }),
      'success',
      { first: true },
    ],
    // biome-ignore lint/suspicious/noThenProperty: a thenable that rejects with a non-Error is the case
    ['thenable_rejects', () => ({ then: (_ok: unknown, no: (e: unknown) => void) => no(7) }), 'failure', undefined],
    [
      'thenable_then_throws',
      () => ({
        // biome-ignore lint/suspicious/noThenProperty: a thenable whose then throws is the case
        then: () => {
          throw new Error('then threw');
        },
      }),
      'failure',
      undefined,
    ],
    ['subclass', () => SubPromise.resolve({ s: 1 }), 'success', { s: 1 }],
    [
      'instance_then',
      () => {
        const p = Promise.resolve({ real: 1 });
        // An own `then` on a native promise: `await` ignores it (the constructor is Promise).
        void Object.defineProperty(p, 'then', { value: (ok: (v: unknown) => void) => ok({ fake: 1 }) });
        return p;
      },
      'success',
      { real: 1 },
    ],
    ['value', () => ({ v: 1 }), 'success', { v: 1 }],
    [
      'sync_throw_string',
      () => {
        throw 'a string';
      },
      'failure',
      undefined,
    ],
    // biome-ignore lint/nursery/usePromiseRejectErrors: a non-Error rejection is the case
    ['reject_undefined', () => Promise.reject(undefined), 'failure', undefined],
  ];
  for (const observed of [false, true]) {
    for (const [name, h, outcome, result] of cases) {
      const type = `r2_${name}_${observed ? 'o' : 'p'}`;
      const w = worker(type, h);
      const settled: string[] = [];
      if (observed) w.events.on('task:settled', (e) => settled.push(e.outcome));
      await w.start();
      try {
        const { id } = await enqueue(pool, type, {}, { schema, queue: type, maxAttempts: 1 });
        await expectOutcome(w.metrics, type, outcome, 1);
        const t = await getTask(pool, schema, id!);
        assert.equal(t?.state, outcome === 'success' ? 'completed' : 'dead', `${type}: ${t?.state}`);
        const r = await pool.query(`SELECT result FROM ${S}.task_results WHERE id = $1`, [id]);
        assert.deepEqual(r.rows[0]?.result, result, `${type}: stored result`);
        if (observed) assert.deepEqual(settled, [outcome], `${type}: one task:settled`);
      } finally {
        await w.stop();
      }
      for (const o of ['success', 'failure', 'lost', 'cancelled']) {
        assert.equal(await outcomes(w.metrics, type, o), o === outcome ? 1 : 0, `${type}: ${o} counted`);
      }
    }
  }
  assert.ok(SubPromise.thens > 0, "a promise subclass's own then is asked, as `await` asks it");
});

test('completeBatch answers by position: leases interleaved, a lease split over two calls, a duplicate ref, a stolen token, an entry settled by someone else first', async () => {
  const ts = await claimedTasks(pool, schema, 12, ['p1', 'p2', 'p3']);
  const lanes = [...new Set(ts.map((t) => t.laneId))];
  assert.equal(lanes.length, 3);
  const ofLane = (i: number) => ts.filter((t) => t.laneId === lanes[i]);
  const [l0, l1, l2] = [ofLane(0), ofLane(1), ofLane(2)];
  // Someone else completes l2's first entry first: the batch's l2 row is dropped whole, and
  // completeRemainders settles the rest of l2 alone.
  const pre = await completeBatch(pool, storage, [l2[0]!]);
  assert.deepEqual(pre, [true]);
  // First call: half of l0 (the other half comes in the second call).
  const first = await completeBatch(pool, storage, [l0[1]!, l0[0]!]);
  assert.deepEqual(first, [true, true]);
  const stolen: ClaimedTask = { ...l1[2]!, token: '00000000-0000-0000-0000-000000000000' };
  // Interleaved, out of lane order, a duplicate (l1[0] twice), results on some only.
  const refs: ClaimedTask[] = [l2[3]!, l1[1]!, l0[3]!, stolen, l2[0]!, l1[0]!, l0[2]!, l2[1]!, l1[0]!, l2[2]!];
  const results = refs.map((r, i) => (i % 3 === 0 ? JSON.stringify({ at: i, id: r.id }) : null));
  const won = await completeBatch(pool, storage, refs, undefined, results);
  const byIndex = refs.map((r, i) => `${i}:${r === stolen ? 'stolen' : r.id}=${won[i]}`);
  // The stolen token and l2[0] (settled before) are refused; every other entry is settled.
  const expected = refs.map((r, i) => `${i}:${r === stolen ? 'stolen' : r.id}=${!(r === stolen || r === l2[0])}`);
  // A duplicate ref: either both of its places settled or both refused, never another's answer.
  assert.equal(won[5], won[8], 'a duplicate answered alike');
  const dup = won[5];
  expected[5] = `5:${l1[0]!.id}=${dup}`;
  expected[8] = `8:${l1[0]!.id}=${dup}`;
  assert.deepEqual(byIndex, expected);
  // The database agrees: each settled answer is a completed task, each result on its own task.
  for (let i = 0; i < refs.length; i++) {
    const r = refs[i]!;
    if (r === stolen) continue;
    const state = (await getTask(pool, schema, r.id))?.state;
    if (won[i]) assert.equal(state, 'completed', `${i}: ${state}`);
    if (won[i] && results[i] !== null) {
      const row = await pool.query(`SELECT result FROM ${S}.task_results WHERE id = $1`, [r.id]);
      assert.deepEqual(row.rows[0]?.result, JSON.parse(results[i]!), `${i}: its own result`);
    }
  }
  assert.equal((await getTask(pool, schema, l1[2]!.id))?.state, 'running', 'the stolen token settled nothing');
});

test('an execution that crashes while it starts (invalid payload, a logger whose error() throws) stops no other task: the rest of its claim runs', async () => {
  const type = 'r2_crash_start';
  const throwing = new Proxy(testLogger, {
    get: (t, p) =>
      p === 'error'
        ? () => {
            throw new Error('logger down');
          }
        : Reflect.get(t, p, t),
  }) as Logger;
  let ran = 0;
  const def = defineTask<{ i: number }>({
    type,
    ceilingMs: 60_000,
    schema: {
      '~standard': {
        version: 1,
        vendor: 'review',
        validate: (v: unknown) =>
          (v as { i: number }).i % 2 === 0 ? { issues: [{ message: 'every other one is invalid' }] } : { value: v },
      },
    } as never,
    handler: async () => {
      ran++;
      return null;
    },
  });
  const unhandled: unknown[] = [];
  const onUnhandled = (err: unknown) => unhandled.push(err);
  process.on('unhandledRejection', onUnhandled);
  // One lane, two slots: every other task is invalid; the rest wait in the buffer behind them.
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    queues: [type],
    logger: throwing,
    maintenance: false,
    heartbeatIntervalMs: false,
    slots: 2,
  });
  try {
    await enqueueMany(
      pool,
      Array.from({ length: 20 }, (_, i) => ({ type, payload: { i }, queue: type })),
      { schema },
    );
    await w.start();
    await waitFor(async () => (await outcomes(w.metrics, type, 'success')) === 10, 30_000, 'the 10 valid tasks run');
    assert.equal(ran, 10);
    // A tick for any rejection left behind to be reported: the crash is logged as best the logger can, never thrown on.
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(unhandled, []);
  } finally {
    await w.stop();
    process.off('unhandledRejection', onUnhandled);
  }
});

test("async context: task:settled listeners run in the worker's context (als.run around start), as at b831b4d; a handler's als.run does not leak", async () => {
  const als = new AsyncLocalStorage<string>();
  const type = 'r2_als';
  const seen: unknown[] = [];
  const w = worker(
    type,
    (p) =>
      als.run(`handler ${(p as { i: number }).i}`, async () => {
        await new Promise((r) => setImmediate(r));
        return null;
      }),
    { slots: 4 },
  );
  w.events.on('task:settled', () => seen.push(als.getStore() ?? null));
  await als.run('start', () => w.start());
  try {
    await enqueueMany(
      pool,
      Array.from({ length: 8 }, (_, i) => ({ type, payload: { i }, queue: type })),
      { schema },
    );
    await expectOutcome(w.metrics, type, 'success', 8);
    await waitFor(() => seen.length === 8, 10_000, 'eight task:settled');
  } finally {
    await w.stop();
  }
  assert.deepEqual(seen, Array(8).fill('start'));
});
