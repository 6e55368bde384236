import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueue, Worker } from '../src/index.js';
import { captureLogger, counterValue, DATABASE_URL, freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('wake');

function worker(tasks: ReturnType<typeof defineTask>[], pollIntervalMs: number, slots = 4) {
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
  });
  return { w, lines };
}

test('LISTEN: a committed enqueue wakes an idle worker without waiting for the poll', async () => {
  let ran = 0;
  const def = defineTask({ type: 'w_notify', ceiling: 5000, handler: async () => void ran++ });
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
  const def = defineTask({ type: 'w_idle', ceiling: 5000, handler: async () => {} });
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
    ceiling: 10_000,
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
  const def = defineTask({ type: 'w_reconnect', ceiling: 5000, handler: async () => void ran++ });
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
  const a = defineTask({ type: 'w_qa', ceiling: 5000, handler: async () => void ranA++ });
  const b = defineTask({ type: 'w_qb', ceiling: 5000, handler: async () => void ranB++ });
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
