/**
 * Review of the limited claim (commit 700b9a2, migration 28), at the SQL level: each test is a
 * doubt about the fleet-wide queue limits and its repro against the real database. A `regression
 * (review N)` test names a finding of that review, fixed since, and fails if it comes back; a
 * `held` test is an attack that held.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/limits-review-sql.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { enqueueMany, listQueueLimits, setQueueLimit } from '../src/index.js';
import { claimBatch } from '../src/processor/claim.js';
import { claimLimitedQueue } from '../src/processor/claim-limited.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, freshSchema, takeLeaseOver, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('lrevsql');
const S = `"${schema}"`;

/** `n` tasks of `queue`, all in one transaction (one lane) or each in its own (spread over the shards). */
async function enqueueTo(queue: string, n: number, oneLane = true): Promise<string[]> {
  const specs = Array.from({ length: n }, (_, i) => ({ type: 'rev_work', payload: { i }, queue }));
  const idsOf = (rs: { id: string | null }[]) => rs.map((r) => r.id).filter((id): id is string => id !== null);
  if (oneLane) return idsOf(await enqueueMany(pool, specs, { schema }));
  const ids: string[] = [];
  for (const s of specs) ids.push(...idsOf(await enqueueMany(pool, [s], { schema })));
  return ids;
}

async function lanesOf(queue: string): Promise<number[]> {
  const r = await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1 ORDER BY 1`, [
    queue,
  ]);
  return r.rows.map((x) => x.lane_id);
}

/** The queue's tasks leased and not settled: what really runs. */
async function reallyRunning(queue: string): Promise<number> {
  const r = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM ${S}.leased_entries le JOIN ${S}.lanes l USING (lane_id)
      WHERE l.queue = $1 AND le.outcome IS NULL`,
    [queue],
  );
  return r.rows[0]!.n;
}

async function countedRunning(queue: string): Promise<number> {
  return (await listQueueLimits(pool, schema)).find((l) => l.queue === queue)?.running ?? -1;
}

/** The limited claim's parameters (claimLimitedQueue's), as the worker's fetcher passes them. */
function limitedParams() {
  const { laneIds: _l, limit: _n, ...rest } = claimParams(schema, [], 0);
  return rest;
}

async function waitingOnLock(fragment: string): Promise<boolean> {
  const r = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`,
    [`%${fragment}%`],
  );
  return r.rows[0]!.n > 0;
}

test('regression (review 1): set_queue_limit racing an ordinary claim in flight: the claimed tasks must count against the new limit', async () => {
  await enqueueTo('race', 3);
  const lanes = await lanesOf('race');
  // An ordinary claim, its transaction still open (as every claim is between its statement and
  // its commit; held open here so the interleaving is certain).
  const claimer = await pool.connect();
  let committed = false;
  try {
    await claimer.query('BEGIN');
    const batch = await claimBatch(claimer, claimParams(schema, lanes, 3, { queues: ['race'] }));
    assert.equal(batch.tasks.length, 3);
    // The limit is set meanwhile: its holders are read before its UPDATE of the lanes waits for
    // the claim's lane lock.
    const setting = setQueueLimit(pool, schema, 'race', { maxRunning: 3 }, 'review');
    await waitFor(() => waitingOnLock('set_queue_limit'), 10_000, 'set_queue_limit to wait for the lane lock');
    await claimer.query('COMMIT');
    committed = true;
    await setting;
  } finally {
    if (!committed) await claimer.query('ROLLBACK').catch(() => undefined);
    claimer.release();
  }
  assert.equal(await reallyRunning('race'), 3, 'three tasks run');
  const counted = await countedRunning('race');
  // Three more tasks: a limit of 3 with 3 running must start none of them.
  await enqueueTo('race', 3);
  const more = await claimLimitedQueue(pool, limitedParams(), 'race', 3);
  assert.equal(
    more.tasks.length,
    0,
    `a limit of 3 with 3 tasks running started ${more.tasks.length} more (the limit counted ${counted} of the 3 running; ${await reallyRunning('race')} run now)`,
  );
});

test('held: tasks already running when a limit is set count against it', async () => {
  await enqueueTo('pre', 4);
  const lanes = await lanesOf('pre');
  const batch = await claimBatch(pool, claimParams(schema, lanes, 4, { queues: ['pre'] }));
  assert.equal(batch.tasks.length, 4);
  await setQueueLimit(pool, schema, 'pre', { maxRunning: 5 }, 'review');
  assert.equal(await countedRunning('pre'), 4);
  await enqueueTo('pre', 4);
  const more = await claimLimitedQueue(pool, limitedParams(), 'pre', 4);
  assert.equal(more.tasks.length, 1, 'one slot of five was free');
});

test('held: a limit lowered from 10 to 2 while 10 run starts nothing until 8 have settled; a lease settled in parts counts what is left', async () => {
  await enqueueTo('lower', 10);
  await setQueueLimit(pool, schema, 'lower', { maxRunning: 10 }, 'review');
  const first = await claimLimitedQueue(pool, limitedParams(), 'lower', 10);
  assert.equal(first.tasks.length, 10);
  assert.equal(await countedRunning('lower'), 10);
  await setQueueLimit(pool, schema, 'lower', { maxRunning: 2 }, 'review');
  await enqueueTo('lower', 5);
  assert.equal((await claimLimitedQueue(pool, limitedParams(), 'lower', 5)).tasks.length, 0);
  // Settle 8 of the 10 (one lease, settled entry by entry, as rescue or a split flush would).
  for (const t of first.tasks.slice(0, 8)) await takeLeaseOver(pool, schema, t.id);
  assert.equal(await countedRunning('lower'), 2);
  assert.equal((await claimLimitedQueue(pool, limitedParams(), 'lower', 5)).tasks.length, 0);
  await takeLeaseOver(pool, schema, first.tasks[8]!.id);
  assert.equal((await claimLimitedQueue(pool, limitedParams(), 'lower', 5)).tasks.length, 1);
});

test('held: 12 concurrent limited claims of one queue never start more than its limit', async () => {
  await enqueueTo('conc', 40, false);
  await setQueueLimit(pool, schema, 'conc', { maxRunning: 5 }, 'review');
  const many = new pg.Pool({ connectionString: DATABASE_URL, max: 12, options: '-c jit=off' });
  try {
    const got = await Promise.all(
      Array.from({ length: 12 }, () => claimLimitedQueue(many, limitedParams(), 'conc', 8)),
    );
    const total = got.reduce((n, b) => n + b.tasks.length, 0);
    assert.ok(total <= 5, `at most 5 started (${total})`);
    assert.equal(await reallyRunning('conc'), total);
    assert.equal(await countedRunning('conc'), total);
  } finally {
    await many.end();
  }
});

test("regression (review 2): a limited claim with room for 8 takes one task when the queue's tasks sit in different lanes", async () => {
  // Tasks enqueued one transaction each land on different shards (txid % 16): different lanes.
  await enqueueTo('spread', 10, false);
  assert.ok((await lanesOf('spread')).length >= 5, 'the tasks are spread over several lanes');
  await setQueueLimit(pool, schema, 'spread', { maxRunning: 8 }, 'review');
  const batch = await claimLimitedQueue(pool, limitedParams(), 'spread', 8);
  // The fetcher owes the queue another claim only when the claim filled its capacity (it did
  // not), so this worker runs one task of the queue until it settles or the poll comes.
  assert.equal(
    batch.tasks.length,
    8,
    `capacity ${batch.capacity}, ${batch.tasks.length} task(s) claimed, more=${batch.more}`,
  );
});

test('regression (review 3): limit_capacity answers retry_ms = 1 when the want exceeds an empty rate window', async () => {
  await enqueueTo('rate', 5);
  await setQueueLimit(pool, schema, 'rate', { rate: { limit: 2, intervalMs: 60_000 } }, 'review');
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const r = await c.query<{ free: number; retry_ms: number | null }>(
      `SELECT free, retry_ms FROM ${S}.limit_capacity('rate', 5)`,
    );
    await c.query('ROLLBACK');
    assert.equal(r.rows[0]!.free, 2);
    // Nothing started yet: the 2 it may start now leave the window a minute after they start,
    // not in 1 ms (the fetcher's timer fires at once and runs a claim that finds the rate full).
    assert.ok(
      r.rows[0]!.retry_ms === null || r.rows[0]!.retry_ms > 1000,
      `retry_ms ${r.rows[0]!.retry_ms} for a window of a minute`,
    );
  } finally {
    c.release();
  }
});

test('regression (review 4): move_task into a new lane of the same queue vs set_queue_limit deadlock', async () => {
  const ids = await enqueueTo('mv', 2);
  const mover = await pool.connect();
  let outcome = 'none';
  try {
    await mover.query('BEGIN');
    // A first move within the task's own lane (priority 0): locks the lane's row (version bump).
    await mover.query(`SELECT ${S}.move_task($1, 'mv', 0::smallint)`, [ids[0]]);
    // The limit: the queue's lock, then an UPDATE of the queue's lanes that waits for the mover.
    const setting = setQueueLimit(pool, schema, 'mv', { maxRunning: 1 }, 'review').then(
      () => 'set',
      (err: Error) => `set failed: ${err.message}`,
    );
    await waitFor(() => waitingOnLock('set_queue_limit'), 10_000, 'set_queue_limit to wait for the lane');
    // A second move, to a lane that does not exist yet (priority 3): provision_lane waits for the
    // queue's lock, which set_queue_limit holds while it waits for this transaction.
    const moved = await mover.query(`SELECT ${S}.move_task($1, 'mv', 3::smallint)`, [ids[1]]).then(
      () => 'moved',
      (err: Error) => `move failed: ${err.message}`,
    );
    await mover.query(moved === 'moved' ? 'COMMIT' : 'ROLLBACK');
    outcome = `${moved}; ${await setting}`;
  } finally {
    mover.release();
  }
  assert.ok(!/deadlock/.test(outcome), outcome);
});

test('held: a lane opened while set_queue_limit commits comes out limited', async () => {
  await enqueueTo('prov', 1);
  // Hold the queue's lock as set_queue_limit does, in an open transaction that sets the limit.
  const setter = await pool.connect();
  try {
    await setter.query('BEGIN');
    await setter.query(`SELECT ${S}.set_queue_limit('prov', 2, NULL, NULL, 'review', false, false)`);
    const opening = enqueueMany(pool, [{ type: 'rev_work', payload: { i: 1 }, queue: 'prov', priority: 7 }], {
      schema,
    });
    await waitFor(() => waitingOnLock('enqueue'), 10_000, 'provision_lane to wait for the queue lock');
    await setter.query('COMMIT');
    await opening;
  } finally {
    setter.release();
  }
  const r = await pool.query(`SELECT count(*)::int AS n FROM ${S}.lanes WHERE queue = 'prov' AND NOT limited`);
  assert.equal(r.rows[0].n, 0);
});

test('regression (review 10): two setQueueLimit calls changing different fields at once lose one change', async () => {
  await enqueueTo('lu', 1);
  // An open set_queue_limit holds the queue's lock, so both calls below read the limit before
  // either writes (as two operators' calls overlapping by a few ms would).
  const holder = await pool.connect();
  await holder.query('BEGIN');
  await holder.query(`SELECT ${S}.set_queue_limit('lu', 9, NULL, NULL, 'holder', false, false)`);
  const a = setQueueLimit(pool, schema, 'lu', { maxRunning: 5 }, 'alice');
  await waitFor(() => waitingOnLock('set_queue_limit'), 10_000, 'alice to wait');
  const b = setQueueLimit(pool, schema, 'lu', { rate: { limit: 7, intervalMs: 1000 } }, 'bob');
  await waitFor(
    async () =>
      (
        await pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%set_queue_limit%'`,
        )
      ).rows[0]!.n >= 2,
    10_000,
    'bob to wait',
  );
  await holder.query('ROLLBACK');
  holder.release();
  await Promise.all([a, b]);
  const now = (await listQueueLimits(pool, schema)).find((l) => l.queue === 'lu');
  assert.deepEqual(
    { maxRunning: now?.maxRunning, rateLimit: now?.rateLimit },
    { maxRunning: 5, rateLimit: 7 },
    'alice set maxRunning and bob set the rate: both are in force',
  );
});

test('regression (review 12): under a rate limit alone, every limited claim adds a holder that nothing ever removes', async () => {
  await enqueueTo('rateonly', 30, false);
  await setQueueLimit(pool, schema, 'rateonly', { rate: { limit: 1000, intervalMs: 1000 } }, 'review');
  // Thirty limited claims (one task each, as pickups are), every task then settled.
  for (let k = 0; k < 30; k++) {
    const b = await claimLimitedQueue(pool, limitedParams(), 'rateonly', 1);
    for (const t of b.tasks) await takeLeaseOver(pool, schema, t.id);
  }
  assert.equal(await reallyRunning('rateonly'), 0);
  const holders = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM ${S}.limit_holders WHERE queue = 'rateonly'`,
  );
  // limit_capacity forgets empty holders only under a running limit; hold_leases adds them
  // whatever the limit. A queue limited by rate for a week keeps a row per claim of the week,
  // which the first limit_capacity after a running limit is added reads under the row lock.
  assert.ok(holders.rows[0]!.n < 30, `${holders.rows[0]!.n} holders kept for 0 running tasks`);
});

test('regression (review 13): a queue whose tasks are all scheduled for later cannot be limited ("no task was ever enqueued to it")', async () => {
  await enqueueMany(
    pool,
    [{ type: 'rev_work', payload: { i: 0 }, queue: 'later', runAt: new Date(Date.now() + 3_600_000) }],
    { schema },
  );
  // The operator limits the queue before its tasks come due: the limit is refused.
  const set = await setQueueLimit(pool, schema, 'later', { maxRunning: 2 }, 'review').then(
    () => 'set',
    (err: Error) => err.message,
  );
  assert.equal(set, 'set');
});
