// Review of 2297e1b (the settled branches' first runs of a term half a promotion tick later and
// one at a time, FirstTurns in src/maintenance/leader.ts): what a first run that hangs, times
// out or loses its backend does to the other branches' first runs, the turn's release, stop(),
// the metrics, and the first runs' bound under custom intervals.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import { Worker } from '../src/index.js';
import { leaderApplicationName } from '../src/storage/locks.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, holdTableLock, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('firstturns');
const S = `"${schema}"`;

/** Branches whose first runs would come within these tests otherwise. */
const QUIET = { gaugeIntervalMs: 600_000, retentionIntervalMs: 600_000, historyIntervalMs: 600_000 };

/**
 * Hold overdue_leases in ACCESS EXCLUSIVE mode: rescue's first statement (anythingToRescue reads
 * it) waits on the lock; nothing the ring, the stale mark or promotion runs reads it.
 */
function blockRescue(): Promise<{ client: pg.PoolClient; release: () => Promise<void> }> {
  return holdTableLock(pool, `${S}.overdue_leases`);
}

/** The backend of a rescue statement waiting on that lock, with how long it has waited (ms). */
/** Every rescue backend waiting on that lock, the longest-waiting first. */
async function waitingRescues(): Promise<{ pid: number; waitedMs: number }[]> {
  const r = await pool.query<{ pid: number; waited_ms: number }>(
    `SELECT pid, (extract(epoch FROM now() - state_change) * 1000)::float8 AS waited_ms
       FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'
        AND query LIKE $1 AND pid <> pg_backend_pid()
      ORDER BY state_change`,
    [`%${S}.overdue_leases%`],
  );
  return r.rows.map((row) => ({ pid: row.pid, waitedMs: Number(row.waited_ms) }));
}

async function waitingRescue(): Promise<{ pid: number; waitedMs: number } | null> {
  const r = await pool.query<{ pid: number; waited_ms: number }>(
    `SELECT pid, (extract(epoch FROM now() - state_change) * 1000)::float8 AS waited_ms
       FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'
        AND query LIKE $1 AND pid <> pg_backend_pid()`,
    [`%${S}.overdue_leases%`],
  );
  const row = r.rows[0];
  return row ? { pid: row.pid, waitedMs: Number(row.waited_ms) } : null;
}

function worker(extra: { statementTimeoutMs?: number; maintenance?: Record<string, number>; workerId?: string } = {}) {
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [],
    queues: ['first-turns'],
    logger,
    ...(extra.workerId ? { workerId: extra.workerId } : {}),
    statementTimeoutMs: extra.statementTimeoutMs ?? 120_000,
    maintenance: { ...FAST_MAINTENANCE, ...QUIET, ...extra.maintenance },
  });
  return { w, lines };
}

const runs = (w: Worker, b: string) => w.maintenanceStats()[b]?.runs ?? 0;

test('a first rescue run blocked on a lock does not hold back the first runs of the ring and the stale-schedule mark', async () => {
  const lock = await blockRescue();
  const { w } = worker();
  await w.start();
  try {
    await waitFor(waitingRescue, 20_000, "rescue's first run waiting on the lock");
    // Before 2297e1b each branch ran on its own loop: the ring and the stale mark ran a second in
    // whatever rescue was doing. Now they wait for rescue's turn: up to statementTimeoutMs (30 s
    // by default; here 120 s), and with no bound on a session without statement_timeout.
    await waitFor(
      () => runs(w, 'ring') >= 1 && runs(w, 'schedule-stale') >= 1,
      15_000,
      'the ring and the stale mark to run while rescue is blocked',
    );
    assert.equal(runs(w, 'rescue'), 0, 'rescue is still blocked');
  } finally {
    await lock.release();
    await w.stop();
  }
});

test("a first rescue run that hits statement_timeout releases its turn: the ring and the stale mark run; the failure is counted and logged as rescue's", async () => {
  const lock = await blockRescue();
  const { w, lines } = worker({ statementTimeoutMs: 2000 });
  await w.start();
  try {
    await waitFor(
      () => runs(w, 'ring') >= 1 && runs(w, 'schedule-stale') >= 1,
      30_000,
      'the ring and the stale mark after rescue timed out',
    );
    await waitFor(() => (w.maintenanceStats().rescue?.failures ?? 0) >= 1, 30_000, 'rescue failure counted');
    const text = await w.metrics.registry.metrics();
    assert.match(text, /berth_maintenance_errors_total\{branch="rescue"\} [1-9]/);
    assert.doesNotMatch(text, /berth_maintenance_errors_total\{branch="(ring|schedule-stale)"\} [1-9]/);
    assert.ok(
      lines.some((l) => l.msg === 'maintenance branch failed' && l.branch === 'rescue'),
      'the failure is logged with its branch',
    );
  } finally {
    await lock.release();
    await w.stop();
  }
  assert.equal(w.isLeader, false);
});

test("a first rescue run whose backend is terminated releases its turn; the ring's first run is timed without the wait, and rescue recovers", async () => {
  const lock = await blockRescue();
  const { w } = worker();
  await w.start();
  try {
    // Let the ring wait for its turn a measurable while (a condition, not a sleep).
    const held = await waitFor(
      async () => {
        const r = await waitingRescue();
        return r && r.waitedMs >= 3000 ? r : null;
      },
      30_000,
      'rescue blocked for 3 s',
    );
    await pool.query('SELECT pg_terminate_backend($1)', [held.pid]);
    await waitFor(
      () => runs(w, 'ring') >= 1 && runs(w, 'schedule-stale') >= 1,
      30_000,
      'the ring and the stale mark after rescue lost its backend',
    );
    const stats = w.maintenanceStats();
    // maintenanceSeconds / stats count the run, not the wait for the turn (≥ 3 s).
    assert.ok(stats.ring!.maxMs < held.waitedMs, `ring's first run took ${stats.ring!.maxMs} ms`);
    assert.ok(stats['schedule-stale']!.maxMs < held.waitedMs, `stale mark took ${stats['schedule-stale']!.maxMs} ms`);
    const text = await w.metrics.registry.metrics();
    const sum = Number(/berth_maintenance_branch_seconds_sum\{branch="ring"\} ([0-9.e-]+)/.exec(text)?.[1]);
    const count = Number(/berth_maintenance_branch_seconds_count\{branch="ring"\} (\d+)/.exec(text)?.[1]);
    assert.ok(count >= 1 && sum * 1000 < held.waitedMs, `ring histogram sum ${sum} s over ${count} runs`);
    await lock.release();
    await waitFor(() => runs(w, 'rescue') >= 2, 30_000, 'rescue runs again once the lock is gone');
  } finally {
    await lock.release();
    await w.stop();
  }
});

test('stop() while the ring and the stale mark wait for the turn a blocked rescue holds: they end without running, stop completes', async () => {
  const lock = await blockRescue();
  const { w } = worker();
  await w.start();
  let stopped = false;
  try {
    await waitFor(waitingRescue, 20_000, "rescue's first run waiting on the lock");
    // Under 2297e1b the ring and the stale mark wait for rescue's turn here (not yet run).
    const ringAtStop = runs(w, 'ring');
    const staleAtStop = runs(w, 'schedule-stale');
    const stopping = w.stop().then(() => {
      stopped = true;
    });
    await waitFor(() => !w.isLeader, 10_000, 'the term to end');
    // stop() waits for the run in flight (as before the change); release it.
    await lock.release();
    await waitFor(() => stopped, 30_000, 'stop() to complete');
    await stopping;
    if (ringAtStop === 0) assert.equal(runs(w, 'ring'), 0, 'the ring did not run after its term ended');
    if (staleAtStop === 0) assert.equal(runs(w, 'schedule-stale'), 0, 'nor the stale mark');
  } finally {
    await lock.release();
    if (!stopped) await w.stop();
  }
});

test('a long promotion tick (promoteIntervalMs within validation) does not postpone the first rescue and ring runs of a term', async () => {
  // settleAt = min(1 s, interval) + promoteIntervalMs / 2: at 600 000 ms (allowed, like any
  // interval up to 24.8 days) rescue and the ring first run 300.1 s into a term, and the gauges'
  // start moves with them; before the change they ran at min(1 s, their interval).
  const { w } = worker({ maintenance: { promoteIntervalMs: 600_000 } });
  await w.start();
  try {
    await waitFor(() => w.isLeader, 20_000, 'leadership');
    await waitFor(
      () => runs(w, 'rescue') >= 1 && runs(w, 'ring') >= 1,
      30_000,
      'rescue and the ring to run within their interval and a settle into the term',
    );
  } finally {
    await w.stop();
  }
});

test("a new term (leader session lost and regained) takes fresh turns: the old term's blocked rescue holds none of the new term's first runs", async () => {
  const lock = await blockRescue();
  const { w } = worker({ workerId: 'ft-newterm' });
  await w.start();
  try {
    await waitFor(async () => (await waitingRescues()).length === 1, 20_000, "the first term's rescue blocked");
    // Lose the leader's election session: the term ends (its rescue still waits on the lock and
    // stepDown awaits it), the worker takes the lock again after its hold-off, a new term starts.
    const leader = await pool.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [
      leaderApplicationName('ft-newterm'),
    ]);
    assert.equal(leader.rows.length, 1, 'the leader session');
    await pool.query('SELECT pg_terminate_backend($1)', [leader.rows[0]!.pid]);
    const both = await waitFor(
      async () => {
        const r = await waitingRescues();
        return r.length === 2 ? r : null;
      },
      30_000,
      "the new term's rescue blocked too",
    );
    assert.ok(w.isLeader, 'leads again');
    const ringBefore = runs(w, 'ring');
    const staleBefore = runs(w, 'schedule-stale');
    // End the new term's rescue run only: the old term's rescue keeps its turn (of the old FirstTurns).
    await pool.query('SELECT pg_terminate_backend($1)', [both[1]!.pid]);
    await waitFor(
      () => runs(w, 'ring') > ringBefore && runs(w, 'schedule-stale') > staleBefore,
      30_000,
      "the new term's ring and stale mark, while the old term's rescue still holds its turn",
    );
    assert.equal((await waitingRescues())[0]?.pid, both[0]!.pid, "the old term's rescue still waits");
  } finally {
    await lock.release();
    await w.stop();
  }
});

test('the end of a term that outlives the hold-off does not step the next term down: no leader:lost while leading (a bug older than the first turns)', async () => {
  // stepDown() of the lost term awaits its branches (here its blocked rescue) and then sets
  // branchLoops = [], promoter = null, resets the gauges and emits leader:lost, whatever term
  // has started meanwhile.
  const lock = await blockRescue();
  const { w } = worker({ workerId: 'ft-lateend' });
  const events: string[] = [];
  w.events.on('leader:gained', () => events.push('gained'));
  w.events.on('leader:lost', () => events.push('lost'));
  await w.start();
  try {
    await waitFor(async () => (await waitingRescues()).length === 1, 20_000, "the first term's rescue blocked");
    const leader = await pool.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [
      leaderApplicationName('ft-lateend'),
    ]);
    await pool.query('SELECT pg_terminate_backend($1)', [leader.rows[0]!.pid]);
    await waitFor(async () => (await waitingRescues()).length === 2, 30_000, 'a new term, its rescue blocked too');
    // End the old term's rescue only: the old stepDown completes now, inside the new term.
    const [old] = await waitingRescues();
    await pool.query('SELECT pg_terminate_backend($1)', [old!.pid]);
    await waitFor(async () => (await waitingRescues()).length === 1, 30_000, "the old term's rescue ended");
    await waitFor(() => events.filter((e) => e === 'lost').length >= 1, 30_000, "the old term's leader:lost");
    assert.ok(w.isLeader, 'the new term leads');
    assert.equal(events.at(-1), 'gained', `leader:lost came after the new term's leader:gained: ${events.join(', ')}`);
  } finally {
    await lock.release();
    await w.stop();
  }
});
