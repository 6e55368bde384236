/**
 * Review of task type rate limits (migration 30), at the start gate (run-task.ts): what is
 * checked after a worker has waited for `take_type_starts()`. The ask is a round trip, and a
 * wait on the type's `type_limits` row when another worker (or an operator's set_type_limit)
 * holds it; whatever was checked before it may be stale when the answer comes back. Each wait
 * below is staged by holding that row lock from the test's own session.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/type-limits-review-start.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  cancelTask,
  defineTask,
  enqueueMany,
  getTask,
  listTypeLimits,
  setQueueLimit,
  setTypeLimit,
} from '../src/index.js';
import { freshSchema, waitFor } from './helpers.js';
import { askWaiting, holdTypeRow, reviewWorker } from './type-limits-review-support.js';

const { schema, pool } = await freshSchema('tlrvstart');
const S = `"${schema}"`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Handlers' starts (this process's clock; the database shares the host's). */
const starts: { type: string; i: number; t: number }[] = [];

/** The most handler starts of `type` in any window of `ms`. */
function peakIn(type: string, ms: number): number {
  const ts = starts
    .filter((s) => s.type === type)
    .map((s) => s.t)
    .sort((a, b) => a - b);
  let most = 0;
  for (let a = 0, b = 0; b < ts.length; b++) {
    while (ts[b]! - ts[a]! >= ms) a++;
    most = Math.max(most, b - a + 1);
  }
  return most;
}

test("a queue's rate guard still holds after the type's ask: a task of a rate-limited type in a rate-limited queue never starts past its queue's startBy", async () => {
  // The queue: 5 starts a second (guard 100 ms). The type: a rate never reached, with a guard of
  // 250 ms (interval 5 s), so only the queue's guard can stop a late start.
  const type = 'rv_qt';
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-qrate',
    ceilingMs: 60_000,
    handler: async ({ i }) => {
      starts.push({ type, i, t: Date.now() });
    },
  });
  await enqueueMany(
    pool,
    Array.from({ length: 20 }, (_, i) => ({ type, payload: { i }, queue: 'rv-qrate' })),
    { schema },
  );
  await setQueueLimit(pool, schema, 'rv-qrate', { rate: { limit: 5, intervalMs: 1000 } }, 'review');
  await setTypeLimit(pool, schema, type, { limit: 1000, intervalMs: 5000 }, 'review');
  const held = await holdTypeRow(S, type);
  const w = reviewWorker(schema, [def]);
  await w.start();
  let first = 0;
  try {
    // The first limited claim records its 5 starts, then the worker asks for the type's starts
    // and waits on the row: released 180 ms after the queue's starts were recorded (past the
    // queue's guard of 100 ms, within the type's 250 ms).
    const t0 = await waitFor(
      async () =>
        (
          await pool.query<{ t: Date | null }>(
            `SELECT min(started_at) AS t FROM ${S}.limit_starts WHERE queue = 'rv-qrate'`,
          )
        ).rows[0]!.t,
      20_000,
      "the queue's first starts",
    );
    await askWaiting(pool);
    await sleep(Math.max(0, t0.getTime() + 180 - Date.now()));
    await held.query('COMMIT');
    first = t0.getTime();
    await waitFor(() => starts.filter((s) => s.type === type).length >= 10, 30_000, 'ten starts');
  } finally {
    await held.end().catch(() => undefined);
    await w.stop();
  }
  // The first claim's tasks (every start before the queue's window frees) start within the
  // queue's guard of their recorded start, or not at all (migration 28's invariant).
  const late = starts.filter((s) => s.type === type && s.t < first + 1100).map((s) => s.t - first);
  assert.ok(
    late.every((ms) => ms <= 100),
    `no handler starts more than the queue's guard (100 ms) after its recorded start (${late.join(', ')} ms)`,
  );
  const peak = peakIn(type, 1000);
  assert.ok(peak <= 5, `at most 5 handler starts of the rate-limited queue in any second (peak ${peak})`);
});

test('a stop that aborts a task while it waits for its start: the task is handed back unstarted, never started with its signal aborted nor buried on its final attempt', async () => {
  const type = 'rv_stop';
  let startedAborted = 0;
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-stop',
    ceilingMs: 60_000,
    maxAttempts: 1,
    handler: async ({ i }, ctx) => {
      starts.push({ type, i, t: Date.now() });
      // A handler that honours its signal, as a handler should.
      if (ctx.signal.aborted) {
        startedAborted++;
        throw ctx.signal.reason;
      }
    },
  });
  await setTypeLimit(pool, schema, type, { limit: 100, intervalMs: 5000 }, 'review');
  const held = await holdTypeRow(S, type);
  const w = reviewWorker(schema, [def]);
  await w.start();
  let stopping: Promise<void> | null = null;
  let id = '';
  try {
    id = (await enqueueMany(pool, [{ type, payload: { i: 0 }, queue: 'rv-stop' }], { schema }))[0]!.id!;
    await askWaiting(pool);
    // Stopped with no grace while the ask waits: the task is aborted before its handler starts.
    stopping = w.stop();
    await sleep(120);
    await held.query('COMMIT');
    await stopping;
  } finally {
    await held.end().catch(() => undefined);
    if (stopping === null) await w.stop();
  }
  const dead = await pool.query(`SELECT last_error FROM ${S}.dead_letters WHERE type = $1`, [type]);
  assert.deepEqual(dead.rows, [], 'not buried by a stop that came before its handler started');
  assert.equal(startedAborted, 0, 'no handler started with its signal already aborted');
  // Due again (deferred, or already promoted back to its lane), not started, its attempt refunded.
  const t = await getTask(pool, schema, id);
  assert.ok(t?.state === 'ready' || t?.state === 'retryable', `pending again (${t?.state})`);
  assert.equal(t.attempts, 0, 'handed back unstarted, its attempt refunded');
});

test("a cancel that lands while a task waits for its start: the handler never starts, and the cancel is the attempt's outcome", async () => {
  const type = 'rv_cancel';
  let started = 0;
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-cancel',
    ceilingMs: 60_000,
    handler: async () => {
      started++;
    },
  });
  await setTypeLimit(pool, schema, type, { limit: 100, intervalMs: 5000 }, 'review');
  const held = await holdTypeRow(S, type);
  const w = reviewWorker(schema, [def]);
  let cancelled = 0;
  w.events.on('task:cancelled', () => {
    cancelled++;
  });
  await w.start();
  try {
    const id = (await enqueueMany(pool, [{ type, payload: { i: 0 }, queue: 'rv-cancel' }], { schema }))[0]!.id!;
    await askWaiting(pool);
    assert.equal(await cancelTask(pool, schema, id, { actor: 'review' }), 'cancelled');
    // The cancel notice reaches the worker (it aborts the run) while the held row keeps the ask
    // waiting. Nothing outside the worker shows the abort until the ask answers, so this pause
    // sets the interleaving up: 2 s, not 100 ms, since a loaded CI machine once took longer than
    // 100 ms to deliver and confirm the notice, and the handler then started.
    await sleep(2_000);
    await held.query('COMMIT');
    await waitFor(() => cancelled > 0, 20_000, "the cancel counted as the attempt's outcome");
    const t = await getTask(pool, schema, id);
    assert.equal(t?.state, 'cancelled');
  } finally {
    await held.end().catch(() => undefined);
    await w.stop();
  }
  assert.equal(started, 0, 'the handler of a cancelled task never started');
});

test("a grant answered past the type's guard is spent: that task is handed back unstarted, asks again and is refused, and the limit counts both refusals", async () => {
  // One start an hour (guard 250 ms): two tasks ask together; the answer is held back by the row
  // lock past the guard, so the one start granted cannot be used. This is what a loaded machine
  // does to an answer slower than the guard, and what the dashboard shows then.
  const type = 'rv_spent';
  let started = 0;
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-spent',
    ceilingMs: 60_000,
    handler: async () => {
      started++;
    },
  });
  await setTypeLimit(pool, schema, type, { limit: 1, intervalMs: 3_600_000 }, 'review');
  const held = await holdTypeRow(S, type);
  const w = reviewWorker(schema, [def]);
  await w.start();
  let ids: string[] = [];
  try {
    ids = (
      await enqueueMany(
        pool,
        [0, 1].map((i) => ({ type, payload: { i }, queue: 'rv-spent' })),
        { schema },
      )
    ).map((t) => t.id!);
    const pid = await askWaiting(pool);
    // Released only once the ask has waited past the guard by the server's own clock (the worker
    // times the guard from before it sent the ask, so its answer is later still).
    await waitFor(
      async () =>
        (
          await pool.query<{ past: boolean }>(
            `SELECT clock_timestamp() - query_start > interval '300 milliseconds' AS past
               FROM pg_stat_activity WHERE pid = $1`,
            [pid],
          )
        ).rows[0]?.past,
      20_000,
      'the ask waiting past the guard',
    );
    await held.query('COMMIT');
    const settled = await waitFor(
      async () => {
        const limit = (await listTypeLimits(pool, schema)).find((l) => l.type === type);
        return limit && limit.paced === 2 ? limit : null;
      },
      20_000,
      'both tasks paced',
    );
    assert.equal(settled.started, 1, 'the start granted is counted, used or not');
    assert.equal(settled.refused, 2, 'the refused task, and the spent one refused when it asked again');
    assert.equal(settled.atLimit, true);
  } finally {
    await held.end().catch(() => undefined);
    await w.stop();
  }
  assert.equal(started, 0, 'no handler started past the guard');
  for (const id of ids) {
    const t = await getTask(pool, schema, id);
    assert.equal(t?.state, 'retryable', 'paced until the window frees');
    assert.equal(t.attempts, 0, 'handed back unstarted, its attempt refunded');
  }
});
