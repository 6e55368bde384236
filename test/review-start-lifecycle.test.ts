/**
 * Review of the start reorder (worker.ts build()): stop() racing start() in the new
 * window (engine running, settlement session and shared pool still connecting, leader and
 * heartbeat not yet started), and start()'s failure paths. After every stop: no session of the
 * worker left, no heartbeat row, no leader lock, no leader:gained or task event after
 * worker:stopped, no unhandled rejection; the tasks it took are all completed exactly once later.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { enqueueMany, Worker, type WorkerEventName } from '../src/index.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, leaderWorkerId, waitFor, within } from './helpers.js';
import { recordEvents as recordEventsOf, reviewFixture } from './review-start-support.js';

const { schema, pool, S, proxy, unhandled, runs, instant, workerSessions, succeeded } = await reviewFixture(
  'rs_life',
  'rs_life',
  // The last test's stop cannot hand its claimed tasks back (the shared pool's connect is held):
  // they wait for their leases to lapse, at this ceiling (and a short margin) rather than 90 s.
  5_000,
);

const recordEvents = (w: Worker) =>
  recordEventsOf(w, [
    'task:started',
    'task:settled',
    'worker:started',
    'worker:stopped',
    'leader:gained',
    'leader:lost',
  ]);

let n = 0;
function makeWorker(opts: Partial<ConstructorParameters<typeof Worker>[0]> = {}) {
  const { logger, lines } = captureLogger();
  const workerId = `rs-life-${process.pid}-${n++}`;
  const w = new Worker({
    connectionString: proxy.url,
    schema,
    workerId,
    tasks: [instant],
    queues: ['rs-life'],
    slots: 20,
    logger,
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: 200,
    ...opts,
  });
  return { w, lines, workerId, events: recordEvents(w) };
}

async function assertGone(workerId: string, events: WorkerEventName[]) {
  await waitFor(async () => (await workerSessions(workerId)).length === 0, 20_000, `no session of ${workerId} left`);
  const row = await pool.query(`SELECT count(*)::int AS n FROM ${S}.workers WHERE worker_id = $1`, [workerId]);
  assert.equal(row.rows[0].n, 0, 'no heartbeat row');
  assert.notEqual(await leaderWorkerId(pool, schema), workerId, 'not holding the leader lock');
  const stopped = events.indexOf('worker:stopped');
  assert.ok(stopped >= 0, 'worker:stopped sent');
  // A leader or heartbeat started after stop would show up here, or as a session above.
  await new Promise((r) => setTimeout(r, 500)); // not a timing assertion: room for a late start to show
  assert.deepEqual(events.slice(stopped + 1), [], 'nothing after worker:stopped');
  assert.equal(events.filter((e) => e === 'leader:gained').length, events.filter((e) => e === 'leader:lost').length);
  assert.deepEqual(await workerSessions(workerId), []);
}

async function enqueueBacklog(k: number): Promise<string[]> {
  const r = await enqueueMany(
    pool,
    Array.from({ length: k }, (_, i) => ({ type: instant, payload: { i }, queue: 'rs-life' })),
    { schema },
  );
  return r.map((x) => x.id!);
}

async function completedOnce(ids: readonly string[]) {
  const { w } = makeWorker({ connectionString: DATABASE_URL });
  await w.start();
  try {
    await waitFor(async () => (await succeeded(ids)) === ids.length, 60_000, 'every task completed');
  } finally {
    await w.stop();
  }
  const twice = await pool.query(
    `SELECT x.id FROM ${S}.attempt_history h CROSS JOIN LATERAL unnest(h.ids) x(id)
      WHERE h.outcome = 'success' AND x.id = ANY($1::bigint[]) GROUP BY x.id HAVING count(*) > 1`,
    [ids],
  );
  assert.equal(twice.rows.length, 0, 'no task completed twice');
  for (const id of ids) assert.ok((runs.get(id) ?? 0) >= 1);
}

test('stop() called right after start() (not awaited), three times over a backlog: both resolve, everything closed, nothing after worker:stopped', async () => {
  const ids = await enqueueBacklog(600);
  for (let i = 0; i < 3; i++) {
    const { w, workerId, events, lines } = makeWorker();
    const started = w.start();
    const stopped = w.stop();
    await within(started, 30_000, 'start()');
    await within(stopped, 30_000, 'stop()');
    await assertGone(workerId, events);
    assert.deepEqual(
      lines.filter((l) => (l.level as number) >= 50),
      [],
    );
  }
  await completedOnce(ids);
  assert.deepEqual(unhandled, []);
});

test('stop() from the worker:started listener while the settlement and shared sessions connect late: stop resolves after start, nothing leaks, nothing after worker:stopped', async () => {
  const ids = await enqueueBacklog(600);
  const { w, workerId, events, lines } = makeWorker();
  let stopping: Promise<void> | null = null;
  let startResolved = false;
  w.events.on('worker:started', () => {
    proxy.mode = { kind: 'delay', ms: 1000 };
    stopping = w.stop();
    void stopping.then(() => assert.ok(startResolved, 'stop resolved before start'));
  });
  await within(w.start(), 30_000, 'start()');
  startResolved = true;
  proxy.mode = { kind: 'pass' };
  assert.ok(stopping);
  await within(stopping!, 30_000, 'stop()');
  await assertGone(workerId, events);
  assert.deepEqual(
    lines.filter((l) => (l.level as number) >= 50),
    [],
  );
  console.log(
    'events:',
    events.filter((e) => !e.startsWith('task:')),
    'task events:',
    events.filter((e) => e.startsWith('task:')).length,
  );
  await completedOnce(ids);
  assert.deepEqual(unhandled, []);
});

test('stop() while the settlement connect is held (until its 2 s connect timeout): stop waits for start, then closes everything', async () => {
  const ids = await enqueueBacklog(300);
  const { w, workerId, events } = makeWorker({ connectTimeoutMs: 2000 });
  let stopping: Promise<void> | null = null;
  w.events.on('worker:started', () => {
    proxy.mode = { kind: 'hold' };
    stopping = w.stop();
  });
  await within(w.start(), 30_000, 'start()');
  proxy.mode = { kind: 'pass' };
  await within(stopping!, 30_000, 'stop()');
  await assertGone(workerId, events);
  await completedOnce(ids);
  assert.deepEqual(unhandled, []);
});

test('start() on a schema not migrated fails and leaves no session; start() again on the same worker also fails cleanly', async () => {
  const { w, workerId } = makeWorker({ schema: `rs_not_migrated_${process.pid}` });
  await assert.rejects(w.start());
  await assert.rejects(w.start());
  await w.stop();
  await waitFor(async () => (await workerSessions(workerId)).length === 0, 20_000, 'no session left');
  assert.deepEqual(unhandled, []);
});

test('a LISTEN/election address that refuses connections: start() resolves (polling), tasks complete, stop() closes everything', async () => {
  const ids = await enqueueBacklog(200);
  const { w, workerId, events } = makeWorker({
    connectionString: DATABASE_URL,
    sessionConnectionString: 'postgres://postgres@127.0.0.1:1/test',
    connectTimeoutMs: 1000,
    pollIntervalMs: 100,
  });
  await within(w.start(), 30_000, 'start()');
  await waitFor(async () => (await succeeded(ids)) === ids.length, 60_000, 'every task completed by polling');
  await within(w.stop(), 30_000, 'stop()');
  await assertGone(workerId, events);
  assert.deepEqual(unhandled, []);
});

test("stop() requested right after start() stops the engine at once, not after start()'s settlement connect (held until its timeout): no handler runs (failed under the reorder as submitted: all 300 ran)", async () => {
  const ids = await enqueueBacklog(300);
  // A short lease margin too: the leases it cannot hand back lapse within seconds.
  const { w, workerId, events } = makeWorker({ connectTimeoutMs: 3000, leaseMarginMs: 1_000 });
  w.events.on('worker:started', () => {
    // The settlement session's and the shared pool's first connects hang (a server or pooler
    // that accepts and never answers) until the connect timeout.
    proxy.mode = { kind: 'hold' };
  });
  const heldBefore = proxy.seen.hold;
  const started = w.start();
  const stopping = w.stop();
  await within(started, 30_000, 'start()');
  await waitFor(() => proxy.seen.hold >= heldBefore + 2, 30_000, 'both connects after the engine start held');
  proxy.mode = { kind: 'pass' };
  await within(stopping, 30_000, 'stop()');
  const ran = events.filter((e) => e === 'task:started').length;
  await assertGone(workerId, events);
  await completedOnce(ids);
  // start() resolves with the engine's start, and stop() (awaiting it) stops the engine before
  // its first fetch answers; only then does it wait out the held connects (stopAll).
  assert.equal(ran, 0, `handlers started after stop() was requested: ${ran}`);
  assert.deepEqual(unhandled, []);
});
