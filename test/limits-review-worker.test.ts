/**
 * Review of the limited claim (commit 700b9a2, migration 28), at the worker level: liveness of
 * limited and ordinary queues on a running Worker. A `regression (review N)`
 * test names a finding of that review, fixed since, and fails if it comes back; a `held` test is
 * an attack that held. Every wait is a
 * liveness bound many times what the work takes, never a timing assertion: a stalled queue
 * here waits for a poll interval set far beyond the bound, or for ever.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/limits-review-worker.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  clearQueueLimit,
  defineTask,
  enqueueMany,
  listQueueLimits,
  pauseQueue,
  resumeQueue,
  setQueueLimit,
  Worker,
} from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, scaled, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('lrevwrk');
const S = `"${schema}"`;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Handlers' starts and ends, in the order they happened (this process's clock, one process). */
const events: { queue: string; i: number; at: 'start' | 'end'; t: number }[] = [];
let sleepMs = 0;
function taskOf(type: string, queue: string): AnyTaskDefinition {
  return defineTask<{ i: number }>({
    type,
    queue,
    ceilingMs: 120_000,
    handler: async ({ i }, ctx) => {
      // The lane's queue, not the definition's: a test may enqueue a type to another queue.
      const q = ctx.lane.queue;
      events.push({ queue: q, i, at: 'start', t: performance.now() });
      if (sleepMs > 0) await sleep(sleepMs);
      events.push({ queue: q, i, at: 'end', t: performance.now() });
    },
  });
}
const ended = (queue: string) => events.filter((e) => e.queue === queue && e.at === 'end').length;
/**
 * How many of `queue`'s tasks have ended once `n` have, or once `ms` (scaled) have passed: for a
 * repro whose task should run at once but, stalled, would run only at a poll set far beyond this.
 */
async function endedWithin(queue: string, n: number, ms: number): Promise<number> {
  const deadline = Date.now() + scaled(ms);
  while (ended(queue) < n && Date.now() < deadline) await sleep(50);
  return ended(queue);
}
function peak(queue: string): number {
  let now = 0;
  let most = 0;
  for (const e of events.filter((x) => x.queue === queue)) {
    now += e.at === 'start' ? 1 : -1;
    most = Math.max(most, now);
  }
  return most;
}

async function enqueueTo(
  type: string,
  queue: string,
  n: number,
  opts: { oneLane?: boolean; shard?: number; from?: number } = {},
): Promise<void> {
  const specs = Array.from({ length: n }, (_, k) => ({
    type,
    payload: { i: (opts.from ?? 0) + k },
    queue,
    ...(opts.shard === undefined ? {} : { shard: opts.shard }),
  }));
  if (opts.oneLane ?? true) {
    for (let k = 0; k < specs.length; k += 1000) await enqueueMany(pool, specs.slice(k, k + 1000), { schema });
    return;
  }
  for (const s of specs) await enqueueMany(pool, [s], { schema });
}

async function withWorker(
  tasks: AnyTaskDefinition[],
  opts: Partial<ConstructorParameters<typeof Worker>[0]>,
  fn: (w: Worker) => Promise<void>,
): Promise<void> {
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    slots: 4,
    leaseMarginMs: 0,
    logger: testLogger,
    maintenance: { ...FAST_MAINTENANCE, ringIntervalMs: 600_000 },
    ...opts,
  });
  await w.start();
  try {
    await fn(w);
  } finally {
    await w.stop();
  }
}

async function drainedOf(queue: string): Promise<boolean> {
  const r = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM ${S}.ready r JOIN ${S}.lanes l USING (lane_id)
      WHERE l.queue = $1
        AND NOT EXISTS (SELECT 1 FROM ${S}.leased_entries le
                         WHERE le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot)`,
    [queue],
  );
  return r.rows[0]!.n === 0;
}

test('regression (review 5): a task enqueued to a limited queue, in a lane this worker never claimed from, waits for the poll', async () => {
  events.length = 0;
  sleepMs = 0;
  const lim = taskOf('rw_new', 'newlane');
  const ord = taskOf('rw_newo', 'newlane-ordinary');
  await enqueueTo('rw_new', 'newlane', 1, { shard: 0 });
  await setQueueLimit(pool, schema, 'newlane', { maxRunning: 10 }, 'review');
  // A poll far beyond the bound below: only a notification or a freed slot can start the task.
  await withWorker([lim, ord], { pollIntervalMs: 600_000 }, async () => {
    await waitFor(() => ended('newlane') === 1, 20_000, 'the first limited task (claimed at start)');
    // Its settlement committed, and the limited claim that follows it (limit_freed) done: that
    // claim would otherwise take the task enqueued below and hide the stall.
    await waitFor(
      async () => (await listQueueLimits(pool, schema)).find((l) => l.queue === 'newlane')?.running === 0,
      20_000,
      'the first task settled',
    );
    await sleep(1_000);
    // Control: an ordinary queue's task in a new lane starts on its notification.
    await enqueueTo('rw_newo', 'newlane-ordinary', 1, { shard: 9 });
    await waitFor(() => ended('newlane-ordinary') === 1, 10_000, 'the ordinary task (notified)');
    // The limited queue's task in a lane the worker has not claimed from: its notification is
    // taken for an ordinary lane, the ordinary claim skips it (limited), and the queue is not owed.
    await enqueueTo('rw_new', 'newlane', 1, { shard: 9, from: 1 });
    assert.equal(await endedWithin('newlane', 2, 10_000), 2, 'the limited task ran on its notification (no poll came)');
  });
});

test('regression (review 5b): resuming a paused limited queue: its tasks wait for the poll', async () => {
  events.length = 0;
  sleepMs = 0;
  const lim = taskOf('rw_paused', 'pausedlim');
  await enqueueTo('rw_paused', 'pausedlim', 2);
  await setQueueLimit(pool, schema, 'pausedlim', { maxRunning: 10 }, 'review');
  await pauseQueue(pool, schema, 'pausedlim', 'review');
  await withWorker([lim], { pollIntervalMs: 600_000 }, async () => {
    // The worker's first fetch claims the limited queue and finds it paused.
    await sleep(1_000);
    assert.equal(ended('pausedlim'), 0);
    await resumeQueue(pool, schema, 'pausedlim', 'review');
    assert.equal(
      await endedWithin('pausedlim', 2, 10_000),
      2,
      "the resumed queue's tasks ran on the resume's notifications",
    );
  });
});

test('regression (review 2): a limit of 8 on a worker of 8 slots runs one task at a time when the tasks sit in different lanes', async () => {
  events.length = 0;
  sleepMs = 1000;
  const lim = taskOf('rw_spread', 'spread');
  await enqueueTo('rw_spread', 'spread', 8, { oneLane: false });
  const lanes = await pool.query(`SELECT count(*)::int AS n FROM ${S}.lanes WHERE queue = 'spread'`);
  assert.ok(lanes.rows[0].n >= 4, 'the tasks are spread over several lanes');
  await setQueueLimit(pool, schema, 'spread', { maxRunning: 8 }, 'review');
  await withWorker([lim], { slots: 8, pollIntervalMs: 600_000 }, async () => {
    await waitFor(() => ended('spread') === 8, 60_000, 'the 8 tasks');
  });
  assert.ok(peak('spread') >= 4, `at most ${peak('spread')} of the 8 allowed ran at once on a worker with 8 slots`);
});

test('regression (review 6): a limited queue starves while an ordinary backlog keeps the prefetch buffer non-empty', async () => {
  events.length = 0;
  sleepMs = 2;
  const lim = taskOf('rw_starve_l', 'starve-limited');
  const ord = taskOf('rw_starve_o', 'starve-bulk');
  await enqueueTo('rw_starve_l', 'starve-limited', 1, { shard: 0 });
  await setQueueLimit(pool, schema, 'starve-limited', { maxRunning: 10 }, 'review');
  const bulk = 4000;
  await withWorker([lim, ord], { pollIntervalMs: 200 }, async () => {
    // The limited lane is known to this worker (its first task ran at start): its notification
    // owes the queue a claim, and a poll every 200 ms owes one too.
    await waitFor(() => ended('starve-limited') === 1, 20_000, 'the first limited task');
    await enqueueTo('rw_starve_o', 'starve-bulk', bulk);
    await waitFor(() => ended('starve-bulk') >= 200, 30_000, 'the ordinary backlog to flow');
    await enqueueTo('rw_starve_l', 'starve-limited', 1, { shard: 0, from: 1 });
    await waitFor(() => ended('starve-limited') === 2, 120_000, 'the second limited task');
    const ordinaryDone = ended('starve-bulk');
    console.log(`the second limited task ended after ${ordinaryDone} of ${bulk} ordinary tasks`);
    await waitFor(() => drainedOf('starve-bulk'), 120_000, 'the backlog');
    assert.ok(
      ordinaryDone < bulk - 500,
      `the limited task (limit 10, nothing of it running) waited for ${ordinaryDone} of ${bulk} ordinary tasks`,
    );
  });
});

test('regression (review 7): an ordinary task enqueued first waits for a limited backlog whose limit exceeds the slots', async () => {
  events.length = 0;
  sleepMs = 250;
  const lim = taskOf('rw_big_l', 'big-limited');
  const ord = taskOf('rw_big_o', 'big-ordinary');
  // The ordinary task is the oldest due task; the limited queue's 24 come after it.
  await enqueueTo('rw_big_o', 'big-ordinary', 1);
  await sleep(20);
  await enqueueTo('rw_big_l', 'big-limited', 24);
  await setQueueLimit(pool, schema, 'big-limited', { maxRunning: 100 }, 'review');
  await withWorker([lim, ord], { slots: 2, prefetch: 0, pollIntervalMs: 200 }, async () => {
    await waitFor(() => ended('big-ordinary') === 1, 60_000, 'the ordinary task');
  });
  const limitedBefore = events.filter(
    (e) => e.queue === 'big-limited' && e.at === 'end' && e.t < events.find((x) => x.queue === 'big-ordinary')!.t,
  ).length;
  assert.ok(limitedBefore < 12, `the oldest task, in an ordinary queue, started after ${limitedBefore} limited ones`);
});

test("regression (review 8): a limited queue's limit row held by one open transaction stops the worker claiming anything", async () => {
  events.length = 0;
  sleepMs = 0;
  const ord = taskOf('rw_held_o', 'held-ordinary');
  // The limited queue exists (a task of it), and the worker claims it (queues: 'all').
  await enqueueTo('rw_held_o', 'held-limited', 1);
  await setQueueLimit(pool, schema, 'held-limited', { maxRunning: 5 }, 'review');
  // Another worker's limited claim between limit_capacity and its commit (a GC pause, a network
  // stall, a SIGSTOP), or any session of a worker role that calls limit_capacity in a transaction.
  const holder = await pool.connect();
  await holder.query('BEGIN');
  await holder.query(`SELECT * FROM ${S}.limit_capacity('held-limited', 1)`);
  let released = false;
  try {
    await withWorker([ord], { queues: 'all', pollIntervalMs: 500, statementTimeoutMs: 120_000 }, async () => {
      await enqueueTo('rw_held_o', 'held-ordinary', 1);
      const ranWhileHeld = await endedWithin('held-ordinary', 1, 5_000);
      await holder.query('ROLLBACK');
      released = true;
      await waitFor(() => ended('held-ordinary') === 1, 30_000, 'the ordinary task once the row is free');
      assert.equal(ranWhileHeld, 1, "an ordinary queue's task ran while another queue's limit row was locked");
    });
  } finally {
    if (!released) await holder.query('ROLLBACK').catch(() => undefined);
    holder.release();
  }
});

test('held: clearing a limit makes the queue ordinary at once for an idle worker (no poll needed)', async () => {
  events.length = 0;
  sleepMs = 0;
  const lim = taskOf('rw_clear', 'clearme');
  await enqueueTo('rw_clear', 'clearme', 3);
  await setQueueLimit(pool, schema, 'clearme', { rate: { limit: 1, intervalMs: 86_400_000 } }, 'review');
  await withWorker([lim], { pollIntervalMs: 600_000 }, async () => {
    await waitFor(() => ended('clearme') === 1, 20_000, 'the one start the rate allows');
    await sleep(500);
    assert.equal(ended('clearme'), 1, 'the rate held the others');
    await clearQueueLimit(pool, schema, 'clearme', 'review');
    await waitFor(() => ended('clearme') === 3, 10_000, 'the rest once the limit is cleared');
  });
});

test('held: a rate limit frees on its timer, not the poll', async () => {
  events.length = 0;
  sleepMs = 0;
  const lim = taskOf('rw_rate', 'ratetimer');
  await enqueueTo('rw_rate', 'ratetimer', 3);
  await setQueueLimit(pool, schema, 'ratetimer', { rate: { limit: 1, intervalMs: 1000 } }, 'review');
  await withWorker([lim], { pollIntervalMs: 600_000 }, async () => {
    await waitFor(() => ended('ratetimer') === 3, 20_000, 'three starts, one a second');
  });
});

test("regression (review 11): a rate timer outlives the worker's stop", async () => {
  events.length = 0;
  sleepMs = 0;
  const lim = taskOf('rw_timer', 'timerq');
  await enqueueTo('rw_timer', 'timerq', 3);
  await setQueueLimit(pool, schema, 'timerq', { rate: { limit: 1, intervalMs: 3_600_000 } }, 'review');
  let pending = -1;
  await withWorker([lim], { pollIntervalMs: 600_000 }, async (w) => {
    await waitFor(() => ended('timerq') === 1, 20_000, 'the one start the rate allows');
    // Internals, for the repro only: the fetcher's timers (fetcher.ts, retryLimitedAt).
    const engine = (w as unknown as { running: { engine: unknown } }).running.engine;
    const fetcher = (engine as { fetcher: { rateTimers: Map<string, NodeJS.Timeout> } }).fetcher;
    await w.stop();
    pending = fetcher.rateTimers.size;
  });
  assert.equal(pending, 0, 'a timer set for an hour on is still pending after stop(), holding the stopped engine');
});
