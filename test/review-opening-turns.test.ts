/**
 * Review of the opening turns (leader.ts becomeLeader: promote, keys, deps and schedules take the
 * first run of a term one at a time through a FirstTurns queue, each bounded by
 * FIRST_TURN_WAIT_MAX_MS from the start of the turn before). Maintenance runs alone here, on a
 * pool whose every connect and query is delayed a little (a session's cost) so a run's span is
 * clear in its statistics; the branches' intervals are long, so each first run is the only run
 * a statistic describes unless a notice wakes the branch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { Maintenance } from '../src/maintenance-api.js';
import { Promoter } from '../src/maintenance/promoter.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { captureLogger, DATABASE_URL, freshSchema, waitFor, within } from './helpers.js';

const { schema } = await freshSchema('rv_opening');
const unhandled: unknown[] = [];
process.on('unhandledRejection', (e) => void unhandled.push(e));

const LONG = 600_000;
const QUIET = {
  promoteIntervalMs: LONG,
  scheduleTickMs: LONG,
  gaugeIntervalMs: LONG,
  retentionIntervalMs: LONG,
  historyIntervalMs: LONG,
  rescueIntervalMs: LONG,
  ringIntervalMs: LONG,
  scheduleStaleIntervalMs: LONG,
  leaderPollMs: 100,
};

/** A pool whose connects and queries each wait `delayMs` first. */
function slowPool(delayMs: number): pg.Pool {
  const p = new pg.Pool({ connectionString: DATABASE_URL, max: 10 });
  const origConnect = p.connect.bind(p) as () => Promise<pg.PoolClient>;
  const origQuery = p.query.bind(p) as (...a: unknown[]) => Promise<unknown>;
  const pause = () => new Promise((r) => setTimeout(r, delayMs));
  (p as unknown as { connect: unknown }).connect = async (cb?: unknown) => {
    // pg-pool's own query() connects with a callback: delayed by query() already.
    if (typeof cb === 'function') return (origConnect as (c: unknown) => unknown)(cb);
    await pause();
    return origConnect();
  };
  (p as unknown as { query: unknown }).query = async (...a: unknown[]) => {
    await pause();
    return origQuery(...a);
  };
  return p;
}

function start(pool: pg.Pool, id: string) {
  const { logger, lines } = captureLogger();
  const leadership: boolean[] = [];
  const m = new Maintenance({
    connectionString: DATABASE_URL,
    schema,
    pool,
    logger,
    metrics: new BerthMetrics(),
    options: QUIET,
    workerId: `${schema}-${id}`,
    onLeadership: (l) => void leadership.push(l),
  });
  m.start();
  return { m, lines, leadership };
}

const runs = (m: Maintenance, b: string) => m.stats()[b]?.runs ?? 0;

/** Each branch's last run as [start, end] (epoch ms), ordered by start. */
function spans(m: Maintenance, branches: string[]): { b: string; start: number; end: number }[] {
  return branches
    .map((b) => {
      const st = m.stats()[b]!;
      const end = st.lastRunAt!.getTime();
      return { b, start: end - st.lastMs, end };
    })
    .sort((x, y) => x.start - y.start);
}

/** No span starts before the one before it ended (1 ms for the two clocks' rounding). */
function assertOneAtATime(s: { b: string; start: number; end: number }[]): void {
  for (let i = 1; i < s.length; i++)
    assert.ok(s[i]!.start >= s[i - 1]!.end - 1, `${s[i]!.b} started before ${s[i - 1]!.b} ended: ${JSON.stringify(s)}`);
}

const origTick = Promoter.prototype.tick;

function hungFirstTick(): { unblock: () => void } {
  let unblock!: () => void;
  const hang = new Promise<void>((r) => {
    unblock = r;
  });
  let calls = 0;
  Promoter.prototype.tick = async function (this: Promoter) {
    if (calls++ === 0) await hang;
    return origTick.call(this);
  };
  return { unblock };
}

test('a new term: promotion, keys, deps and schedules make their first runs one after another', async () => {
  const pool = slowPool(20);
  const { m } = start(pool, 'normal');
  try {
    await waitFor(() => m.isLeader, 20_000, 'leadership');
    const opening = ['promote', 'keys', 'deps', 'schedules'];
    await waitFor(() => opening.every((b) => runs(m, b) >= 1), 20_000, 'the four first runs');
    assertOneAtATime(spans(m, opening));
  } finally {
    await m.stop();
    await pool.end();
  }
  assert.deepEqual(unhandled, []);
});

/**
 * With promotion's first run made to fail or hang by the caller (Promoter.prototype.tick, put
 * back here), the other three opening branches must still make their first runs, one at a time.
 * `check` sees the rest; `end` unblocks what the caller blocked.
 */
async function othersOneAtATime(
  id: string,
  check: (m: Maintenance, lines: Record<string, unknown>[]) => void,
  end: () => void = () => undefined,
): Promise<void> {
  const pool = slowPool(20);
  const { m, lines } = start(pool, id);
  try {
    await waitFor(() => m.isLeader, 20_000, 'leadership');
    await waitFor(() => ['keys', 'deps', 'schedules'].every((b) => runs(m, b) >= 1), 20_000, 'the others first runs');
    check(m, lines);
    assertOneAtATime(spans(m, ['keys', 'deps', 'schedules']));
  } finally {
    end();
    Promoter.prototype.tick = origTick;
    await m.stop();
    await pool.end();
  }
  assert.deepEqual(unhandled, []);
}

test("promotion's first run throws: the failure is logged and the others still make their first runs, one at a time", async () => {
  let calls = 0;
  Promoter.prototype.tick = async function (this: Promoter) {
    if (calls++ === 0) throw new Error('first tick fails');
    return origTick.call(this);
  };
  await othersOneAtATime('throws', (_m, lines) =>
    assert.ok(lines.some((l) => l.msg === 'maintenance branch failed' && l.branch === 'promote')),
  );
});

test("promotion's first run hangs past the bound: keys, deps and schedules still go one at a time", async () => {
  // With the bound counted from each take(), all three were granted together at the bound.
  const { unblock } = hungFirstTick();
  await othersOneAtATime('hang', (m) => assert.equal(runs(m, 'promote'), 0, 'promotion still hung'), unblock);
});

test('a keys and a deps notice while their first runs wait for their turn are not lost: each runs again after its first run', async () => {
  const { unblock } = hungFirstTick();
  const pool = slowPool(20);
  const { m } = start(pool, 'waker');
  try {
    await waitFor(() => m.isLeader, 20_000, 'leadership');
    m.noteKeys();
    m.noteDeps();
    unblock();
    // Their interval is 10 minutes: a second run within the deadline is the notice's.
    await waitFor(() => runs(m, 'keys') >= 2 && runs(m, 'deps') >= 2, 30_000, 'keys and deps run twice');
  } finally {
    unblock();
    Promoter.prototype.tick = origTick;
    await m.stop();
    await pool.end();
  }
  assert.deepEqual(unhandled, []);
});

test('stop() while the others wait behind a hung promotion: the term ends, stop() resolves once the run ends, events balanced', async () => {
  const { unblock } = hungFirstTick();
  const pool = slowPool(20);
  const { m, leadership } = start(pool, 'stop');
  try {
    await waitFor(() => m.isLeader, 20_000, 'leadership');
    let done = false;
    const stopping = m.stop().then(() => {
      done = true;
    });
    await waitFor(() => !m.isLeader, 20_000, 'the term to end');
    assert.equal(done, false, 'stop() waits for the hung run');
    unblock();
    await within(stopping, 30_000, 'stop()');
    assert.deepEqual(leadership, [true, false]);
  } finally {
    unblock();
    Promoter.prototype.tick = origTick;
    await pool.end();
  }
  assert.deepEqual(unhandled, []);
});
