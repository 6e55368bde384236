/**
 * Review of the opening turns (leader.ts becomeLeader): promotion, keys, deps and
 * schedules now take their first run of a term one at a time (FirstTurns, 1 s bound). Promotion's
 * first run is blocked on a lock here (the deferred table held ACCESS EXCLUSIVE): the others'
 * first runs must still come (after the bound), an every-second schedule must still fire, and a
 * step-down or stop() while they wait for their turn must end the loops and resolve.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineSchedule, defineTask, Worker, type WorkerEventName } from '../src/index.js';
import { leaderApplicationName } from '../src/storage/locks.js';
import { FirstTurns } from '../src/maintenance/leader.js';
import {
  captureLogger,
  DATABASE_URL,
  FAST_MAINTENANCE,
  freshSchema,
  holdTableLock,
  waitFor,
  within,
} from './helpers.js';

const { schema, pool } = await freshSchema('rs_leader');
const S = `"${schema}"`;

const unhandled: unknown[] = [];
process.on('unhandledRejection', (e) => void unhandled.push(e));

const QUIET = { gaugeIntervalMs: 600_000, retentionIntervalMs: 600_000, historyIntervalMs: 600_000 };

const fired: string[] = [];
const tick = defineTask<{ k: string }>({
  type: 'rs_tick',
  ceilingMs: 30_000,
  handler: async (_p, ctx) => {
    fired.push(ctx.id);
  },
});
const everySecond = defineSchedule({ name: 'rs-every-second', cron: '* * * * * *', task: tick, payload: { k: 's' } });

function blockPromotion(): Promise<{ release: () => Promise<void> }> {
  return holdTableLock(pool, `${S}.deferred`);
}

async function promotionWaiting(): Promise<boolean> {
  const r = await pool.query(
    `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
        AND query LIKE '%due_deferred%' AND pid <> pg_backend_pid()`,
  );
  return r.rows.length > 0;
}

function worker(workerId: string) {
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    workerId,
    tasks: [tick],
    queues: ['rs_tick'],
    schedules: [everySecond],
    logger,
    statementTimeoutMs: 120_000,
    maintenance: { ...FAST_MAINTENANCE, ...QUIET, scheduleTickMs: 200 },
  });
  const events: WorkerEventName[] = [];
  for (const n of ['worker:started', 'worker:stopped', 'leader:gained', 'leader:lost'] as WorkerEventName[])
    w.events.on(n, () => void events.push(n));
  return { w, lines, events };
}

const runs = (w: Worker, b: string) => w.maintenanceStats()[b]?.runs ?? 0;

test("promotion's first run blocked on a lock: keys, deps and schedules still get their first turns (bounded), stop() resolves once it is released", async () => {
  const lock = await blockPromotion();
  const { w, lines } = worker(`rs-leader-a-${process.pid}`);
  let stopped = false;
  try {
    await w.start();
    await waitFor(() => w.isLeader, 20_000, 'leadership');
    await waitFor(promotionWaiting, 20_000, "promotion's first run waiting on the lock");
    // The deferred lock blocks deps_tick and the schedule's enqueue too: that their statements
    // are in flight beside the blocked promotion shows their first turns came (the 1 s bound).
    await waitFor(
      async () => {
        const r = await pool.query<{ q: string }>(
          `SELECT query AS q FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'
              AND application_name LIKE 'berth worker %' AND pid <> pg_backend_pid()`,
        );
        const qs = r.rows.map((x) => x.q);
        return (
          runs(w, 'keys') >= 1 && qs.some((q) => q.includes('deps_tick')) && qs.some((q) => q.includes('duplicate_of'))
        );
      },
      20_000,
      "keys' first run done, deps' and the schedule's first runs issued, beside the blocked promotion",
    );
    assert.equal(runs(w, 'promote'), 0, 'promotion still blocked');
    assert.ok(await promotionWaiting());
    console.log('stats while blocked:', JSON.stringify(w.maintenanceStats()));
    const stopping = w.stop().then(() => {
      stopped = true;
    });
    await waitFor(() => !w.isLeader, 10_000, 'the term to end');
    await lock.release();
    await within(stopping, 30_000, 'stop()');
    assert.deepEqual(
      lines.filter((l) => (l.level as number) >= 50).map((l) => l.msg),
      [],
    );
  } finally {
    await lock.release();
    if (!stopped) await w.stop();
  }
  assert.deepEqual(unhandled, []);
});

test('a step-down while keys, deps and schedules wait for their first turn behind a blocked promotion: the term ends, leader:lost is sent, a new term leads, stop() resolves', async () => {
  const lock = await blockPromotion();
  const id = `rs-leader-b-${process.pid}`;
  const { w, events } = worker(id);
  let stopped = false;
  try {
    await w.start();
    await waitFor(() => w.isLeader, 20_000, 'leadership');
    // Right away: the others are still waiting for promotion's turn (its 1 s bound).
    const keysAtCut = runs(w, 'keys');
    const t = await pool.query(
      `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = $1`,
      [leaderApplicationName(id)],
    );
    console.log('terminated election sessions:', t.rows.length, 'keys runs at cut:', keysAtCut);
    await waitFor(() => events.includes('leader:lost') || !w.isLeader, 20_000, 'the term to end');
    await lock.release();
    await waitFor(() => events.filter((e) => e === 'leader:lost').length >= 1, 30_000, 'leader:lost');
    await waitFor(() => events.filter((e) => e === 'leader:gained').length >= 2, 30_000, 'a new term');
    await waitFor(() => runs(w, 'promote') >= 1 && runs(w, 'keys') >= 1, 20_000, 'the new term runs');
    const stopping = w.stop().then(() => {
      stopped = true;
    });
    await within(stopping, 30_000, 'stop()');
    const gained = events.filter((e) => e === 'leader:gained').length;
    const lost = events.filter((e) => e === 'leader:lost').length;
    assert.equal(gained, lost, `events: ${events.join(', ')}`);
  } finally {
    await lock.release();
    if (!stopped) await w.stop();
  }
  assert.deepEqual(unhandled, []);
});

test('stop() right after start while promotion is blocked and the others wait for their turn: resolves once the blocked run ends', async () => {
  const lock = await blockPromotion();
  const { w, events } = worker(`rs-leader-c-${process.pid}`);
  let stopped = false;
  try {
    await w.start();
    await waitFor(() => w.isLeader, 20_000, 'leadership');
    const stopping = w.stop().then(() => {
      stopped = true;
    });
    await waitFor(() => !w.isLeader, 10_000, 'the term to end');
    await lock.release();
    await within(stopping, 30_000, 'stop()');
    assert.deepEqual(events, ['worker:started', 'leader:gained', 'leader:lost', 'worker:stopped']);
  } finally {
    await lock.release();
    if (!stopped) await w.stop();
  }
  assert.deepEqual(unhandled, []);
});

test('turns taken together: once the first is waited out, the others still go one at a time, each bounded from the start of the one before', async () => {
  // promote, keys, deps and schedules take their turns in the same tick with the same bound.
  // With promotion blocked past it, keys is granted at the bound; deps then waits for keys (or
  // for the bound, counted from keys' start), and schedules for deps: the three new shared-pool
  // sessions the change spreads out do not open together (test/review-opening-turns.test.ts).
  const turns = new FirstTurns();
  const promote = turns.take(100);
  const keys = turns.take(100);
  let depsGranted = false;
  let schedulesGranted = false;
  const deps = turns.take(100).then((r) => {
    depsGranted = true;
    return r;
  });
  const schedules = turns.take(100).then((r) => {
    schedulesGranted = true;
    return r;
  });
  const holdPromote = await promote; // never released until the end: a run blocked on a lock
  const releaseKeys = await keys; // granted at its bound
  // One turn of the event loop: the timers that fell due with keys' have run by then. Counted
  // from take(), deps' and schedules' bounds ran out with keys' (all four were taken together);
  // counted from the turn before's start, deps' has only just begun.
  await new Promise((r) => setImmediate(r));
  assert.equal(depsGranted, false, 'deps waits for keys');
  assert.equal(schedulesGranted, false, 'schedules waits for deps');
  releaseKeys();
  const releaseDeps = await within(deps, 5_000, 'deps granted once keys ends');
  await new Promise((r) => setImmediate(r));
  assert.equal(schedulesGranted, false, 'schedules waits for deps');
  // deps never released: schedules is granted at its bound from deps' start.
  await waitFor(() => schedulesGranted, 5_000, 'schedules granted at its bound');
  (await schedules)();
  releaseDeps();
  holdPromote();
});
