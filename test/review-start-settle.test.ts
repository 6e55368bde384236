/**
 * Review of the start reorder (worker.ts build()): the engine starts before the
 * settlement session has connected and planned the completion (prepareSettlement) and before the
 * shared pool's first connect (warnOnDroppedSettings); the leader and heartbeat after both.
 * Through a proxy switched from the `worker:started` listener, those two connects are delayed,
 * held until their connect timeout, or refused, while the fetcher's session (connected already)
 * claims a backlog of tasks that complete at once: every task must complete exactly once, no
 * error logged, no task event before worker:started, leader:gained after it, stop() clean.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { enqueueMany, Worker, type WorkerEventName } from '../src/index.js';
import { captureLogger, FAST_MAINTENANCE, waitFor, within } from './helpers.js';
import { type ProxyMode, recordEvents, reviewFixture } from './review-start-support.js';

const { schema, pool, S, proxy, unhandled, runs, instant, workerSessions } = await reviewFixture(
  'rs_settle',
  'rs_instant',
);

async function backlog(n: number, queue: string): Promise<string[]> {
  const r = await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: instant, payload: { i }, queue })),
    { schema },
  );
  return r.map((x) => x.id!);
}

/** Per task id, how many attempts attempt history holds, and of which outcomes. */
async function history(ids: readonly string[]) {
  const r = await pool.query<{ id: string; n: number; outcomes: string[] }>(
    `SELECT x.id::text AS id, count(*)::int AS n, array_agg(h.outcome) AS outcomes
       FROM ${S}.attempt_history h CROSS JOIN LATERAL unnest(h.ids) AS x(id)
      WHERE x.id = ANY($1::bigint[]) GROUP BY x.id`,
    [ids],
  );
  return r.rows;
}

const EVENTS: WorkerEventName[] = [
  'task:started',
  'task:settled',
  'task:completed',
  'task:failed',
  'task:retrying',
  'task:lease_lost',
  'task:unsettled',
  'task:cancelled',
  'worker:started',
  'worker:stopped',
  'leader:gained',
  'leader:lost',
];

async function drainThroughLateSessions(label: string, late: ProxyMode, n: number, connectTimeoutMs?: number) {
  runs.clear();
  const queue = `rs-${label}`;
  const ids = await backlog(n, queue);
  const { logger, lines } = captureLogger();
  const workerId = `rs-${label}-${process.pid}`;
  const w = new Worker({
    connectionString: proxy.url,
    schema,
    workerId,
    tasks: [instant],
    queues: [queue],
    slots: 50,
    logger,
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: 200,
    ...(connectTimeoutMs === undefined ? {} : { connectTimeoutMs }),
  });
  const events = recordEvents(w, EVENTS);
  let claimedBeforeStartResolved = 0;
  let startedBeforeFirstCompletion = 0;
  let completions = 0;
  w.events.on('worker:started', () => {
    proxy.mode = late;
  });
  w.events.on('task:started', () => {
    if (!resolved) claimedBeforeStartResolved++;
    if (completions === 0) startedBeforeFirstCompletion++;
  });
  w.events.on('task:completed', () => void completions++);
  let resolved = false;
  try {
    await within(w.start(), 60_000, 'start()');
    resolved = true;
    // start() resolves with the engine's start: the two connects that follow it (the settlement
    // session's, the shared pool's first) meet the late mode, then new ones pass again.
    if (late.kind !== 'pass')
      await waitFor(() => proxy.seen[late.kind] >= 2, 30_000, `both late connects to meet ${late.kind}`);
    proxy.mode = { kind: 'pass' };
    await waitFor(async () => runs.size === n && (await history(ids)).length === n, 60_000, `${n} tasks completed`);
    const h = await history(ids);
    const twice = h.filter((r) => r.n !== 1 || r.outcomes[0] !== 'success');
    assert.deepEqual(twice, [], 'each task: one attempt, success');
    assert.deepEqual(
      [...runs.values()].filter((v) => v !== 1),
      [],
      'each handler ran once',
    );
    await waitFor(() => events.includes('leader:gained'), 30_000, 'leader:gained');
    const started = events.indexOf('worker:started');
    assert.equal(started, 0, `first event: ${events.slice(0, 3).join(', ')}`);
    assert.ok(events.indexOf('leader:gained') > started);
    // Emitted once the worker reads the flush's answer: after the rows are visible to this pool.
    await waitFor(() => events.filter((e) => e === 'task:completed').length >= n, 30_000, 'every task:completed');
    assert.equal(events.filter((e) => e === 'task:completed').length, n);
    const errors = lines.filter((l) => (l.level as number) >= 50);
    assert.deepEqual(errors, [], 'no error logged');
    // No handler runs before start() has resolved (a caller installs its signal handlers after it).
    assert.equal(claimedBeforeStartResolved, 0, 'handlers started before start() resolved');
    return { lines, startedBeforeFirstCompletion, workerId, w };
  } finally {
    proxy.mode = { kind: 'pass' };
    await within(w.stop(), 60_000, 'stop()');
    await waitFor(async () => (await workerSessions(workerId)).length === 0, 20_000, 'no session of the worker left');
    const row = await pool.query(`SELECT count(*)::int AS n FROM ${S}.workers WHERE worker_id = $1`, [workerId]);
    assert.equal(row.rows[0].n, 0, 'heartbeat row removed');
    assert.equal(events.at(-1), 'worker:stopped', `last event ${events.at(-1)}`);
  }
}

test('a backlog drained while the settlement and shared sessions connect 1.5 s late: every task completed exactly once, events in order, no error', async () => {
  const r = await drainThroughLateSessions('delay', { kind: 'delay', ms: 1500 }, 3000);
  // Evidence that the window was real: handlers ran before any completion could be written.
  assert.ok(r.startedBeforeFirstCompletion > 0, 'tasks started while the settlement session was connecting');
  console.log(
    `started before the first completion: ${r.startedBeforeFirstCompletion}; proxy: ${JSON.stringify(proxy.seen)}`,
  );
  const warns = r.lines.filter((l) => (l.level as number) === 40).map((l) => l.msg);
  console.log('warnings:', warns);
  assert.deepEqual(unhandled, []);
});

test('the settlement and shared sessions held until their connect timeout at start: start() resolves, the flush retries, every task completed exactly once', async () => {
  const r = await drainThroughLateSessions('hold', { kind: 'hold' }, 1000, 1500);
  const warns = r.lines.filter((l) => (l.level as number) === 40).map((l) => l.msg);
  console.log('warnings:', warns, JSON.stringify(proxy.seen));
  assert.deepEqual(unhandled, []);
});

test('the server refuses new sessions right after engine.start() (down mid-start): start() resolves, every task completed exactly once once it is back', async () => {
  const r = await drainThroughLateSessions('refuse', { kind: 'refuse' }, 1000);
  const warns = r.lines.filter((l) => (l.level as number) === 40).map((l) => l.msg);
  console.log('warnings:', warns, JSON.stringify(proxy.seen));
  assert.deepEqual(unhandled, []);
});

test('no proxy games: a cold backlog of instant tasks, every task exactly once (batcher first flush racing prepareSettlement on the pool of one)', async () => {
  for (let round = 0; round < 3; round++) {
    await drainThroughLateSessions(`plain${round}`, { kind: 'pass' }, 2000);
  }
  assert.deepEqual(unhandled, []);
});
