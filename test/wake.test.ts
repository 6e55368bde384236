import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueue, pauseQueue, resumeQueue, Worker } from '../src/index.js';
import { captureLogger, counterValue, DATABASE_URL, freshSchema, outcomes, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('wake');

function worker(
  tasks: ReturnType<typeof defineTask>[],
  pollIntervalMs: number,
  slots = 4,
  more: { prefetch?: number } = {},
) {
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    slots,
    pollIntervalMs,
    logger,
    maintenance: false,
    listenReconnectBaseMs: 50,
    ...more,
  });
  return { w, lines };
}

test('LISTEN: a committed enqueue wakes an idle worker without waiting for the poll', async () => {
  let ran = 0;
  const def = defineTask({ type: 'w_notify', ceilingMs: 5000, handler: async () => void ran++ });
  const { w } = worker([def], 600_000); // the poll would take ten minutes
  await w.start();
  try {
    await enqueue(pool, def, {}, { schema });
    await waitFor(() => ran === 1, 10_000, 'notify-driven pickup');
    assert.ok((await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'notify' })) >= 1);
  } finally {
    await w.stop();
  }
});

test('one shared poll ticker: each tick wakes one fetch, not one per slot', async () => {
  const def = defineTask({ type: 'w_idle', ceilingMs: 5000, handler: async () => {} });
  const { w } = worker([def], 50, 8);
  await w.start();
  try {
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'poll' })) >= 10,
      10_000,
      'ten ticks',
    );
    const polls = await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'poll' });
    const claims = await counterValue(w.metrics, 'berth_claims_total', {});
    // Every fetch is one discovery (and at most one claim) whatever the slot count: 8 idle
    // slots and N ticks give about N fetches, never 8N.
    assert.ok(claims <= polls + 2, `claims ${claims} vs polls ${polls}`);
  } finally {
    await w.stop();
  }
});

test('a burst cascades: one wake fills every idle slot with one claim', async () => {
  let running = 0;
  let peak = 0;
  const release: (() => void)[] = [];
  const def = defineTask({
    type: 'w_burst',
    ceilingMs: 10_000,
    handler: () =>
      new Promise<void>((r) => {
        running++;
        peak = Math.max(peak, running);
        release.push(() => {
          running--;
          r();
        });
      }),
  });
  const { w } = worker([def], 600_000, 4);
  await w.start();
  try {
    const c = await pool.connect();
    await c.query('BEGIN');
    for (let i = 0; i < 6; i++) await enqueue(c, def, { i }, { schema });
    await c.query('COMMIT');
    c.release();
    await waitFor(() => running === 4, 10_000, 'all slots busy');
    assert.equal(peak, 4, 'never more handlers than slots');
    while (release.length) release.shift()!();
    await waitFor(() => running === 2, 10_000, 'the rest picked up as slots free');
    while (release.length) release.shift()!();
    await waitFor(() => running === 0, 10_000, 'drained');
  } finally {
    while (release.length) release.shift()!();
    await w.stop();
  }
});

test('a lost LISTEN connection reconnects with backoff, and polling keeps draining meanwhile', async () => {
  let ran = 0;
  const def = defineTask({ type: 'w_reconnect', ceilingMs: 5000, handler: async () => void ran++ });
  const { w, lines } = worker([def], 100);
  await w.start();
  try {
    const pid = await w.listenerBackendPid();
    assert.ok(pid);
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    // While deaf (or reconnecting), the poll still finds work.
    await enqueue(pool, def, {}, { schema });
    await waitFor(() => ran === 1, 10_000, 'poll-driven pickup');
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_listen_reconnects_total', {})) >= 1,
      10_000,
      'reconnect',
    );
    assert.ok(lines.some((l) => String(l.msg).includes('wake LISTEN connection lost')));
    const newPid = await w.listenerBackendPid();
    assert.ok(newPid && newPid !== pid);
  } finally {
    await w.stop();
  }
});

test('a notification naming a lane of another queue is not claimed by a worker that does not serve it', async () => {
  let ranA = 0;
  let ranB = 0;
  const a = defineTask({ type: 'w_qa', ceilingMs: 5000, handler: async () => void ranA++ });
  const b = defineTask({ type: 'w_qb', ceilingMs: 5000, handler: async () => void ranB++ });
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [a, b],
    queues: ['served'],
    pollIntervalMs: 100,
    logger,
    maintenance: false,
  });
  await w.start();
  try {
    await enqueue(pool, b, {}, { schema, queue: 'not_served' });
    await enqueue(pool, a, {}, { schema, queue: 'served' });
    await waitFor(() => ranA === 1, 10_000, 'served queue');
    // The worker has had its chances to take the other queue's task: a few polls since.
    const polls = await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'poll' });
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'poll' })) >= polls + 3,
      10_000,
      'three more polls',
    );
    assert.equal(ranB, 0);
  } finally {
    await w.stop();
  }
});

test('an idle worker runs one fetch per task it picks up: a slot freed after a short claim queries nothing', async () => {
  let ran = 0;
  const def = defineTask({ type: 'w_one_fetch', ceilingMs: 5000, handler: async () => void ran++ });
  const { w } = worker([def], 600_000); // no poll: every fetch below is a wake's
  await w.start();
  try {
    // The start-up fetch (a discovery of an empty queue).
    await waitFor(async () => (await counterValue(w.metrics, 'berth_claims_total', {})) >= 1, 10_000, 'start fetch');
    const before = await counterValue(w.metrics, 'berth_claims_total', {});
    const k = 10;
    for (let i = 0; i < k; i++) {
      await enqueue(pool, def, { i }, { schema });
      await waitFor(() => ran === i + 1, 10_000, `task ${i} picked up`);
      await waitFor(async () => (await outcomes(w.metrics, 'w_one_fetch', 'success')) === i + 1, 10_000, 'settled');
    }
    const fetches = (await counterValue(w.metrics, 'berth_claims_total', {})) - before;
    // One claim on the notified lane per task. Before issue 11 each task also cost a discovery
    // after the short claim and another when its slot came free: about 2.5 fetches per task.
    assert.ok(fetches <= k + 2, `${fetches} fetches for ${k} tasks picked up one at a time`);
  } finally {
    await w.stop();
  }
});

test('wakes that arrive during a claim are not lost: same lane and another lane, no poll', async () => {
  const ran = new Set<number>();
  const def = defineTask({
    type: 'w_during_claim',
    ceilingMs: 5000,
    handler: async (payload) => void ran.add((payload as { i: number }).i),
  });
  const { w } = worker([def], 600_000);
  await w.start();
  const blocker = await pool.connect();
  try {
    await waitFor(async () => (await counterValue(w.metrics, 'berth_claims_total', {})) >= 1, 10_000, 'start fetch');
    // Hold the claim's INSERT into range_leases: the claim woken by task 0 waits while the others commit.
    await blocker.query('BEGIN');
    await blocker.query(`LOCK TABLE "${schema}".range_leases IN SHARE MODE`);
    await enqueue(pool, def, { i: 0 }, { schema, shard: 3 });
    await waitFor(
      async () =>
        (
          await pool.query(
            `SELECT 1 FROM pg_stat_activity
              WHERE application_name LIKE 'berth worker %' AND wait_event_type = 'Lock'`,
          )
        ).rowCount === 1,
      10_000,
      'the claim blocked on the range_leases lock',
    );
    await enqueue(pool, def, { i: 1 }, { schema, shard: 3 }); // the lane being claimed
    await enqueue(pool, def, { i: 2 }, { schema, shard: 5 }); // another lane
    await blocker.query('COMMIT');
    await waitFor(() => ran.size === 3, 10_000, 'all three picked up by their wakes');
  } finally {
    await blocker.query('ROLLBACK').catch(() => undefined);
    blocker.release();
    await w.stop();
  }
});

test('work in more lanes than one claim locks drains without the poll', async () => {
  const ran = new Set<number>();
  const def = defineTask({
    type: 'w_many_lanes',
    ceilingMs: 5000,
    handler: async (payload) => void ran.add((payload as { i: number }).i),
  });
  // Enqueued before the worker listens: only its start-up discovery knows of them. Four slots
  // lock one discovered lane per claim (LANE_SHARE), so each claim comes back short with lanes
  // left over, and discovery stays owed until they are drained.
  for (let i = 0; i < 6; i++) await enqueue(pool, def, { i }, { schema, shard: 10 + i });
  const { w } = worker([def], 600_000, 4, { prefetch: 0 });
  await w.start();
  try {
    await waitFor(() => ran.size === 6, 10_000, 'every lane drained');
  } finally {
    await w.stop();
  }
});

test("a paused queue's task runs on the resume's wake, without the poll", async () => {
  let ran = 0;
  const def = defineTask({ type: 'w_resume', queue: 'w-paused', ceilingMs: 5000, handler: async () => void ran++ });
  await pauseQueue(pool, schema, 'w-paused', 'test', 'wake test');
  const { w } = worker([def], 600_000);
  await w.start();
  try {
    await waitFor(async () => (await counterValue(w.metrics, 'berth_claims_total', {})) >= 1, 10_000, 'start fetch');
    // Its wake names the paused lane: the claim gets nothing and the discovery that follows
    // skips paused lanes, so nothing runs and nothing more is owed.
    await enqueue(pool, def, {}, { schema });
    await waitFor(async () => (await counterValue(w.metrics, 'berth_claims_total', {})) >= 2, 10_000, 'its fetch');
    assert.equal(ran, 0);
    // Resuming NOTIFYs every lane of the queue.
    await resumeQueue(pool, schema, 'w-paused', 'test');
    await waitFor(() => ran === 1, 10_000, 'the resumed task picked up by its wake');
  } finally {
    await w.stop();
  }
});
