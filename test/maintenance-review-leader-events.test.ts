// Second-round review of 23f8055 (src/maintenance/leader.ts): FirstTurns.take's bounded wait,
// and stepDown() clearing only its own term, sending leader:lost in the terms' order and only
// for a term whose leader:gained was sent (becomeLeader defers leader:gained behind an earlier
// step-down; stop() awaits a pending one). Attacks: event order and pairing across terms lost
// while an old term's run is blocked, stop() in the middle of that, throwing listeners, the
// queue-wide gauges and the isLeader metric against `w.isLeader`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from '../src/index.js';
import { FirstTurns } from '../src/maintenance/leader.js';
import { leaderApplicationName } from '../src/storage/locks.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, holdTableLock, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('leaderevents');
const S = `"${schema}"`;

/** Retention and history would not run within these tests anyway; the gauges run (FAST). */
const QUIET = { retentionIntervalMs: 600_000, historyIntervalMs: 600_000 };

/** Hold overdue_leases: rescue's first statement waits on it (as in maintenance-review-first-turns). */
function blockRescue(): Promise<{ release: () => Promise<void> }> {
  return holdTableLock(pool, `${S}.overdue_leases`);
}

async function waitingRescues(): Promise<number[]> {
  const r = await pool.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'
        AND query LIKE $1 AND pid <> pg_backend_pid()
      ORDER BY state_change`,
    [`%${S}.overdue_leases%`],
  );
  return r.rows.map((row) => row.pid);
}

async function killLeaderSession(workerId: string): Promise<void> {
  const leader = await waitFor(
    async () => {
      const r = await pool.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [
        leaderApplicationName(workerId),
      ]);
      return r.rows[0] ?? null;
    },
    20_000,
    'the leader session',
  );
  await pool.query('SELECT pg_terminate_backend($1)', [leader.pid]);
}

function worker(workerId: string) {
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [],
    queues: ['leader-events'],
    logger,
    workerId,
    statementTimeoutMs: 120_000,
    maintenance: { ...FAST_MAINTENANCE, ...QUIET },
  });
  return { w, lines };
}

/** The value of a label-free metric in the worker's registry (null: no sample line). */
async function metricValue(w: Worker, name: string): Promise<number | null> {
  const text = await w.metrics.registry.metrics();
  const m = new RegExp(`^${name} ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : null;
}

const runs = (w: Worker, b: string) => w.maintenanceStats()[b]?.runs ?? 0;

/** Records every leader event with what the process said about itself at that moment. */
function record(w: Worker) {
  const events: {
    e: 'gained' | 'lost';
    isLeader: boolean;
    workers: Promise<number | null>;
    metric: Promise<number | null>;
  }[] = [];
  const on = (e: 'gained' | 'lost') => () => {
    // Read in the listener's turn: the reset (or not) happens just before leader:lost.
    events.push({
      e,
      isLeader: w.isLeader,
      workers: metricValue(w, 'berth_workers'),
      metric: metricValue(w, 'berth_maintenance_leader'),
    });
  };
  w.events.on('leader:gained', on('gained'));
  w.events.on('leader:lost', on('lost'));
  return events;
}

test('FirstTurns: a turn that waited out a blocked one and ran is waited for by the next (one at a time after the bound)', async () => {
  // Docs: "a first run waits at most a second for the one before it". The tail chains every
  // turn behind every earlier one, so the third waits for the blocked first too, not only for
  // the second: after the bound the second and the third run side by side.
  const turns = new FirstTurns();
  const blocked = await turns.take(600_000); // held for the whole test (a run blocked on a lock)
  const second = await turns.take(50); // runs beside the blocked one after its bound
  let thirdStarted = false;
  const third = turns.take(600_000).then((release) => {
    thirdStarted = true;
    release();
  });
  second(); // the second run ends: the one before the third has released its turn
  try {
    await waitFor(() => thirdStarted, 5_000, 'the third turn once the second released (the first still held)');
  } finally {
    blocked();
    await third;
  }
});

test('normal start and stop: leader:gained then leader:lost once each; w.isLeader and the metric agree at each', async () => {
  const { w } = worker('le-normal');
  const events = record(w);
  await w.start();
  await waitFor(() => events.length >= 1, 20_000, 'leader:gained');
  await waitFor(() => runs(w, 'gauges') >= 1, 20_000, 'a gauges run');
  await w.stop();
  assert.deepEqual(
    events.map((x) => x.e),
    ['gained', 'lost'],
  );
  assert.equal(events[0]!.isLeader, true);
  assert.equal(await events[0]!.metric, 1);
  assert.equal(events[1]!.isLeader, false);
  assert.equal(await events[1]!.metric, 0);
  assert.equal(await events[1]!.workers, 0, 'the gauges reset before leader:lost');
});

test('lost twice in a row while the first term is blocked: gained(A), lost(A), gained(C); B sends neither; gauges kept while C leads; throwing listeners crash nothing', async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (err: unknown) => unhandled.push(err);
  process.on('unhandledRejection', onUnhandled);
  const lock = await blockRescue();
  const { w, lines } = worker('le-twice');
  // Throwing listeners first: the recorder after them must still see every event.
  w.events.on('leader:gained', () => {
    throw new Error('gained listener throws');
  });
  w.events.on('leader:lost', () => {
    throw new Error('lost listener throws');
  });
  const events = record(w);
  await w.start();
  try {
    await waitFor(async () => (await waitingRescues()).length === 1, 20_000, "term A's rescue blocked");
    await killLeaderSession('le-twice');
    await waitFor(async () => (await waitingRescues()).length === 2, 30_000, "term B's rescue blocked");
    assert.ok(w.isLeader, 'B leads');
    await killLeaderSession('le-twice');
    await waitFor(async () => (await waitingRescues()).length === 3, 30_000, "term C's rescue blocked");
    assert.ok(w.isLeader, 'C leads');
    assert.equal(await metricValue(w, 'berth_maintenance_leader'), 1);
    // C's gauges run (they take no first turn) while A's and B's step-downs wait.
    const g = runs(w, 'gauges');
    await waitFor(() => runs(w, 'gauges') >= g + 2, 20_000, "C's gauges");
    assert.ok(((await metricValue(w, 'berth_workers')) ?? 0) >= 1, "C's gauges published");
    // A's and B's branches have not ended: no leader:lost yet, and C's leader:gained waits.
    assert.deepEqual(
      events.map((x) => x.e),
      ['gained'],
    );
    await lock.release();
    await waitFor(() => events.length >= 3, 30_000, "A's leader:lost and C's leader:gained");
    assert.deepEqual(
      events.map((x) => x.e),
      ['gained', 'lost', 'gained'],
    );
    const lostA = events[1]!;
    assert.equal(lostA.isLeader, true, "C leads when A's leader:lost is sent");
    assert.equal(await lostA.metric, 1, 'the isLeader metric agrees with w.isLeader');
    assert.ok(((await lostA.workers) ?? 0) >= 1, "A's step-down did not reset C's gauges");
    assert.equal(events[2]!.isLeader, true);
    // C keeps running; nothing more is sent while it leads.
    const r = runs(w, 'rescue');
    await waitFor(() => runs(w, 'rescue') >= r + 2, 30_000, "C's rescue runs");
    assert.equal(events.length, 3, events.map((x) => x.e).join(', '));
    assert.ok(w.isLeader);
  } finally {
    await lock.release();
    await w.stop();
    process.off('unhandledRejection', onUnhandled);
  }
  assert.deepEqual(
    events.map((x) => x.e),
    ['gained', 'lost', 'gained', 'lost'],
  );
  assert.equal(events[3]!.isLeader, false);
  assert.equal(await events[3]!.metric, 0);
  assert.equal(await events[3]!.workers, 0, 'gauges reset after the last term');
  assert.equal(await metricValue(w, 'berth_workers'), 0);
  assert.deepEqual(unhandled, []);
  assert.ok(
    lines.filter((l) => l.msg === 'worker event listener failed').length >= 4,
    'the throwing listeners were called (and logged) for each event',
  );
});

test("stop() while an old term's step-down is pending and a new, not yet announced, term leads: it waits for both terms' branches; gained, lost once", async () => {
  const lock = await blockRescue();
  const { w } = worker('le-stopmid');
  const events = record(w);
  await w.start();
  let stopped = false;
  let stopping: Promise<void> | null = null;
  try {
    await waitFor(async () => (await waitingRescues()).length === 1, 20_000, "term A's rescue blocked");
    await killLeaderSession('le-stopmid');
    await waitFor(async () => (await waitingRescues()).length === 2, 30_000, "term B's rescue blocked");
    assert.ok(w.isLeader, 'B leads');
    stopping = w.stop().then(() => {
      stopped = true;
    });
    await waitFor(() => !w.isLeader, 10_000, 'B to end');
    // Both rescues still wait on the lock: stop() cannot have resolved.
    assert.equal((await waitingRescues()).length, 2);
    assert.equal(stopped, false, 'stop() resolved while both terms still had a run in flight');
    await lock.release();
    await stopping;
    assert.deepEqual(await waitingRescues(), []);
    assert.deepEqual(
      events.map((x) => x.e),
      ['gained', 'lost'],
    );
    assert.equal(events[1]!.isLeader, false);
    assert.equal(await events[1]!.metric, 0);
    assert.equal(await events[1]!.workers, 0);
    // No branch of the worker runs after stop(): the stats do not move over a further while.
    const before = JSON.stringify(w.maintenanceStats());
    await pool.query('SELECT pg_sleep(0.3)');
    assert.equal(JSON.stringify(w.maintenanceStats()), before);
  } finally {
    await lock.release();
    if (!stopping) await w.stop();
    else await stopping;
  }
});

test("a term lost after the old term's step-down ended but within its own first second: gained and lost pair up (A, B each once)", async () => {
  // Session lost while A blocks; A's runs end (lost(A), gained(B)); B is lost at once: lost(B).
  const lock = await blockRescue();
  const { w } = worker('le-pair');
  const events = record(w);
  await w.start();
  try {
    await waitFor(async () => (await waitingRescues()).length === 1, 20_000, "term A's rescue blocked");
    await killLeaderSession('le-pair');
    await waitFor(async () => (await waitingRescues()).length === 2, 30_000, "term B's rescue blocked");
    const [a] = await waitingRescues();
    await pool.query('SELECT pg_terminate_backend($1)', [a]);
    await waitFor(() => events.length >= 3, 30_000, 'lost(A), gained(B)');
    await killLeaderSession('le-pair');
    await waitFor(() => !w.isLeader, 10_000, 'B to end');
    await lock.release();
    await waitFor(() => events.length >= 4 && w.isLeader, 30_000, 'lost(B) and a new term');
  } finally {
    await lock.release();
    await w.stop();
  }
  const seq = events.map((x) => x.e);
  for (let i = 0; i < seq.length; i++) assert.equal(seq[i], i % 2 === 0 ? 'gained' : 'lost', seq.join(', '));
  assert.equal(seq.at(-1), 'lost');
});

test("stop() right after the leader session is lost, the old term's run still blocked (a new term or not): stop waits for it; events pair up", async () => {
  const lock = await blockRescue();
  const { w } = worker('le-stoplost');
  const events = record(w);
  await w.start();
  let stopped = false;
  let stopping: Promise<void> | null = null;
  try {
    await waitFor(async () => (await waitingRescues()).length === 1, 20_000, "term A's rescue blocked");
    await killLeaderSession('le-stoplost');
    await waitFor(() => !w.isLeader, 10_000, 'A to end');
    // Within the hold-off (usually no new term yet; either way stop() must cover every term).
    stopping = w.stop().then(() => {
      stopped = true;
    });
    assert.ok((await waitingRescues()).length >= 1, "A's rescue still blocked");
    assert.equal(stopped, false, "stop() resolved while A's rescue was still running");
    await lock.release();
    await stopping;
    assert.deepEqual(await waitingRescues(), []);
    assert.deepEqual(
      events.map((x) => x.e),
      ['gained', 'lost'],
    );
    assert.equal(await events[1]!.workers, 0);
    assert.equal(await metricValue(w, 'berth_maintenance_leader'), 0);
  } finally {
    await lock.release();
    if (!stopping) await w.stop();
    else await stopping;
  }
});
