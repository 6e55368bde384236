/**
 * Issue 13, item 2: cancelling a running task. The cancel is a `cancelled` settlement of the
 * running attempt (carrying its actor), fenced by the range_settlements exclusion constraint
 * against the holder's own settlement; the holder hears of it on the wake channel (or its poll)
 * and aborts the handler with a CancelAbort. Two-process coverage is in multiprocess-cancel.test.ts.
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  attemptsOf,
  cancelTask,
  cancelTasks,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  type TaskContext,
  Worker,
  type WorkerOptions,
} from '../src/index.js';
import { claimBatch, type ClaimedTask } from '../src/processor/claim.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { quoteIdent, wakeChannel } from '../src/sql.js';
import { claimParams } from './claim-params.js';
import { cancelledAmong, cancelTasks as cancelIds } from '../src/storage/cancel.js';
import { completeLeases } from '../src/storage/complete.js';
import { recordFailures } from '../src/storage/fail.js';
import { rescueLapsedLeases } from '../src/storage/rescue.js';
import { snoozeLease } from '../src/storage/snooze.js';
import {
  captureLogger,
  DATABASE_URL,
  expectOutcome,
  FAST_MAINTENANCE,
  freshSchema,
  leaseLapsed,
  outcomes,
  scaled,
  testLogger,
  waitFor,
} from './helpers.js';

const { schema, pool } = await freshSchema('cancel');
const S = quoteIdent(schema);

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe, ${S}.snoozes`,
  );
}

/** Claim whatever is there, as a worker that then dies or is driven by hand would. */
async function claimAll(limit: number, ceilingMs = 60_000): Promise<ClaimedTask[]> {
  const laneIds = (await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes ORDER BY lane_id`)).rows.map(
    (r) => r.lane_id,
  );
  const got: ClaimedTask[] = [];
  for (;;) {
    const b = await claimBatch(
      pool,
      claimParams(schema, laneIds, limit - got.length, { defaultCeilingMs: ceilingMs, workerId: 'cancel-test' }),
    );
    got.push(...b.tasks);
    if (!b.more || got.length >= limit || b.tasks.length === 0) return got;
  }
}

/** A worker in this file's schema for one definition (logging to the test logger unless given one). */
function workerFor(def: AnyTaskDefinition, options: Partial<WorkerOptions>): Worker {
  return new Worker({ connectionString: DATABASE_URL, schema, tasks: [def], logger: testLogger, ...options });
}

/** A handler that runs until its signal fires, recording each start and the abort reason's code. */
function blocking(type: string, ceiling = 60_000) {
  const runs: { id: string; attempt: number; aborted: string | null }[] = [];
  const def = defineTask<{ n?: number }>({
    type,
    ceilingMs: ceiling,
    handler: async (_p, ctx: TaskContext<{ n?: number }>) => {
      const run = { id: ctx.id, attempt: ctx.attempt, aborted: null as string | null };
      runs.push(run);
      await new Promise<void>((resolve) => {
        if (ctx.signal.aborted) return resolve();
        ctx.signal.addEventListener('abort', () => resolve(), { once: true });
      });
      run.aborted = (ctx.signal.reason as { code?: string }).code ?? 'unknown';
      throw ctx.signal.reason;
    },
  });
  return { def, runs };
}

test('cancel a running task: the holder hears the notification and aborts the handler (CancelAbort), the attempt is settled cancelled with its actor, and it never runs again', async () => {
  await reset();
  // A short lease, so the test can wait it out; long enough that the cancel comes well before the deadline.
  const { def, runs } = blocking('c_notify', scaled(5000));
  // The poll is a minute away: only the notification can abort the handler within the wait below.
  const w = workerFor(def, {
    slots: 2,
    pollIntervalMs: 60_000,
    leaseMarginMs: 500,
    // No ring rotation: a pruned segment would take the settlement row this test reads with it.
    maintenance: { ...FAST_MAINTENANCE, ringRotateAfterMs: 3_600_000 },
  });
  await w.start();
  try {
    const { id } = await enqueue(pool, 'c_notify', {}, { schema, dedupeKey: 'only-one' });
    await waitFor(() => runs.length === 1, 20_000, 'the handler to start');
    assert.equal((await getTask(pool, schema, id!))?.state, 'running');
    assert.equal(await cancelTask(pool, schema, id!, { actor: 'test:alice' }), 'cancelled');
    await waitFor(() => runs[0]!.aborted !== null, 20_000, 'the handler to see its signal fire');
    assert.equal(runs[0]!.aborted, 'CANCEL_ABORT');
    await expectOutcome(w.metrics, 'c_notify', 'cancelled', 1);
    assert.equal(await outcomes(w.metrics, 'c_notify', 'failure'), 0);
    const st = await pool.query(`SELECT outcome, actor FROM ${S}.range_settlements`);
    assert.deepEqual(st.rows, [{ outcome: 'cancelled', actor: 'test:alice' }]);
    // The attempt history says it was cancelled, and by whom (one row: the holder's own
    // settlement wrote none).
    const history = await attemptsOf(pool, schema, id!);
    assert.deepEqual(
      history.map((a) => [a.attempt, a.outcome, a.error?.message]),
      [[1, 'cancelled', 'cancelled by test:alice']],
    );
    // Not pending anywhere (it reads as cancelled, by its actor), its dedupe key free, and a
    // second cancel is told it lost.
    const read = await getTask(pool, schema, id!);
    assert.equal(read?.state, 'cancelled');
    assert.equal(read?.cancelled?.actor, 'test:alice');
    assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.deferred`)).rows[0].n, 0);
    assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.dedupe`)).rows[0].n, 0);
    assert.equal(await cancelTask(pool, schema, id!), 'already_settled');
    // Past its lease and a few rescues: nothing brings it back.
    const lease = await pool.query<{ at: Date }>(`SELECT max(expires_at) AS at FROM ${S}.range_leases`);
    await leaseLapsed(pool, lease.rows[0]!.at.getTime());
    assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 0, dead: 0, held: 0 });
    assert.equal(runs.length, 1);
  } finally {
    await w.stop();
  }
});

test('the poll is the fallback: with the LISTEN session down, a cancel still aborts the handler', async () => {
  await reset();
  const { def, runs } = blocking('c_poll');
  const w = workerFor(def, {
    slots: 2,
    pollIntervalMs: 200,
    // Once its session is killed it stays deaf for the rest of the test.
    listenReconnectBaseMs: 600_000,
    maintenance: false,
  });
  await w.start();
  try {
    const { id } = await enqueue(pool, 'c_poll', {}, { schema });
    await waitFor(() => runs.length === 1, 20_000, 'the handler to start');
    const pid = await w.listenerBackendPid();
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await waitFor(
      async () => (await w.listenerBackendPid().catch(() => null)) === null,
      10_000,
      'the LISTEN session to be gone',
    );
    assert.equal(await cancelTask(pool, schema, id!), 'cancelled');
    await waitFor(() => runs[0]!.aborted !== null, 20_000, 'the poll to abort the handler');
    assert.equal(runs[0]!.aborted, 'CANCEL_ABORT');
    await expectOutcome(w.metrics, 'c_poll', 'cancelled', 1);
  } finally {
    await w.stop();
  }
});

test('a completion that loses to a cancel is told so: not written, counted cancelled and logged as lost to a cancel', async () => {
  await reset();
  let release: () => void = () => undefined;
  let started = false;
  const def = defineTask({
    type: 'c_race_worker',
    ceilingMs: 60_000,
    // Ignores its signal: finishes when the test says so.
    handler: async () => {
      started = true;
      await new Promise<void>((r) => {
        release = r;
      });
    },
  });
  const { logger, lines } = captureLogger();
  const w = workerFor(def, {
    slots: 1,
    pollIntervalMs: 600_000,
    listenReconnectBaseMs: 600_000,
    logger,
    maintenance: false,
  });
  await w.start();
  try {
    const { id } = await enqueue(pool, 'c_race_worker', {}, { schema });
    await waitFor(() => started, 20_000, 'the handler to start');
    // Deaf (no LISTEN) and no poll in sight: the worker learns of the cancel only from the fence.
    await pool.query('SELECT pg_terminate_backend($1)', [await w.listenerBackendPid()]);
    await waitFor(
      async () => (await w.listenerBackendPid().catch(() => null)) === null,
      10_000,
      'the LISTEN session to be gone',
    );
    assert.equal(await cancelTask(pool, schema, id!), 'cancelled');
    release();
    await expectOutcome(w.metrics, 'c_race_worker', 'cancelled', 1);
    assert.equal(await outcomes(w.metrics, 'c_race_worker', 'success'), 0);
    assert.equal(await outcomes(w.metrics, 'c_race_worker', 'lost'), 0);
    assert.ok(lines.some((l) => String(l.msg).includes('lost to a cancel')));
    const st = await pool.query(`SELECT outcome FROM ${S}.range_settlements`);
    assert.deepEqual(st.rows, [{ outcome: 'cancelled' }]);
  } finally {
    await w.stop();
  }
});

test("a cancel against a dead worker's lease: settled at once, rescue finds nothing to run again, and no worker runs it", async () => {
  await reset();
  const { id } = await enqueue(pool, 'c_dead', { n: 1 }, { schema });
  // A worker that claimed it and died: its lease is there, unsettled, until it lapses.
  const [t] = await claimAll(1, 300);
  assert.equal(t?.id, id);
  assert.equal(await cancelTask(pool, schema, id!, { actor: 'test:bob' }), 'cancelled');
  await leaseLapsed(pool, t!.leaseExpiresAt);
  assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 0, dead: 0, held: 0 });
  const { def, runs } = blocking('c_dead');
  const w = workerFor(def, {
    pollIntervalMs: 100,
    maintenance: FAST_MAINTENANCE,
  });
  await w.start();
  try {
    // A marker task after it: once the worker ran the marker, it had its chance at the cancelled one.
    const marker = await enqueue(pool, 'c_dead', { n: 2 }, { schema });
    await waitFor(() => runs.length >= 1, 20_000, 'the marker to run');
    assert.deepEqual(
      runs.map((r) => r.id),
      [marker.id],
    );
    assert.equal(await cancelTask(pool, schema, marker.id!), 'cancelled');
  } finally {
    await w.stop();
  }
});

test('pending tasks are removed, finished ones are already_settled, unknown ones not_found; the poll statement names exactly the cancelled leases', async () => {
  await reset();
  const pending = await enqueue(pool, 'c_misc', {}, { schema });
  const scheduled = await enqueue(pool, 'c_misc', {}, { schema, delay: 3_600_000 });
  assert.equal(await cancelTask(pool, schema, pending.id!), 'removed');
  assert.equal(await cancelTask(pool, schema, scheduled.id!), 'removed');
  assert.equal(await cancelTask(pool, schema, '999999'), 'not_found');
  await enqueueMany(
    pool,
    [0, 1, 2].map((n) => ({ type: 'c_misc', payload: { n } })),
    { schema },
  );
  const [a, b, c] = await claimAll(3);
  assert.equal((await completeLeases(pool, storageFor(schema), [a!])).size, 1);
  assert.equal(await cancelTask(pool, schema, a!.id), 'already_settled');
  assert.equal(await cancelTask(pool, schema, b!.id), 'cancelled');
  assert.deepEqual([...(await cancelledAmong(pool, storageFor(schema), [a!, b!, c!]))], [`${b!.laneId}:${b!.laneSeq}`]);
  // The holder's own writes now lose to the cancel, snooze included.
  assert.equal((await completeLeases(pool, storageFor(schema), [b!])).size, 0);
  assert.equal((await snoozeLease(pool, storageFor(schema), b!, 10, 5, 'x')).wrote, false);
  await assert.rejects(cancelTask(pool, schema, 'x'), /task id/);
});

test('bulk cancel by filter: pending removed, running cancelled; an empty filter is refused', async () => {
  await reset();
  await enqueueMany(
    pool,
    [0, 1, 2, 3].map((n) => ({ type: 'c_bulk', payload: { n }, queue: 'bulkq' })),
    { schema },
  );
  await enqueueMany(
    pool,
    [0, 1].map((n) => ({ type: 'c_bulk', payload: { n }, queue: 'otherq' })),
    { schema },
  );
  await claimAll(1);
  const running = (await pool.query(`SELECT count(*)::int AS n FROM ${S}.leased_entries WHERE outcome IS NULL`)).rows[0]
    .n;
  assert.equal(running, 1);
  const runningQueue = (
    await pool.query(`SELECT r.queue FROM ${S}.leased_entries le JOIN ${S}.ready r USING (slot, lane_id, lane_seq)`)
  ).rows[0].queue;
  await assert.rejects(cancelTasks(pool, schema, {}), /needs a filter/);
  await assert.rejects(cancelTasks(pool, schema, { state: 'dead' } as never), /cannot cancel dead/);
  const r = await cancelTasks(pool, schema, { queue: 'bulkq' }, { actor: 'test:bulk' });
  assert.equal(r.matched, 4);
  assert.equal(r.cancelled, runningQueue === 'bulkq' ? 1 : 0);
  assert.equal(r.removed + r.cancelled, 4);
  const left = await cancelTasks(pool, schema, { all: true });
  assert.equal(left.matched, 2);
  assert.equal(left.removed + left.cancelled, 2);
  assert.equal((await cancelTasks(pool, schema, { all: true })).matched, 0);
});

test('exactly one winner: a cancel racing the holder’s completion or failure, 40 rounds — never both, never neither, the loser told so', async () => {
  await reset();
  const other = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
  other.on('error', () => undefined);
  try {
    const tally = { completed: 0, cancelled: 0, failedFirst: 0, cancelledFirst: 0 };
    for (let round = 0; round < 40; round++) {
      await enqueueMany(
        pool,
        [0, 1].map((n) => ({ type: 'c_race', payload: { round, n } })),
        { schema },
      );
      const [t, f] = await claimAll(2);
      assert.ok(t && f, 'two claimed');
      const [done, failed, c1, c2] = await Promise.all([
        completeLeases(pool, storageFor(schema), [t]),
        recordFailures(pool, storageFor(schema), [{ ref: f, error: 'boom', delayMs: 0, permanent: false }]),
        cancelIds(other, storageFor(schema), [t.id], 'test:race'),
        cancelIds(other, storageFor(schema), [f.id], 'test:race'),
      ]);
      // Completion against cancel: exactly one settlement row for the entry, and each side knows.
      const won = done.size === 1;
      assert.equal(c1.get(t.id), won ? 'already_settled' : 'cancelled', `round ${round}`);
      const outcomes = (
        await pool.query(`SELECT outcome FROM ${S}.leased_entries WHERE id = $1 AND outcome IS NOT NULL`, [t.id])
      ).rows;
      assert.deepEqual(outcomes, [{ outcome: won ? 'completed' : 'cancelled' }], `round ${round}`);
      // A cancel that lost marks nothing: the task reads as what won.
      assert.equal((await getTask(pool, schema, t.id))?.state, won ? 'completed' : 'cancelled', `round ${round}`);
      if (won) tally.completed++;
      else tally.cancelled++;
      // Failure against cancel: whichever settles first, the task never runs again.
      const failWon = failed.size === 1;
      assert.equal(c2.get(f.id), failWon ? 'removed' : 'cancelled', `round ${round}`);
      // Either way the task never runs again, and reads as cancelled: the cancel removed it from
      // deferred storage after its failure, or settled its attempt.
      assert.equal((await getTask(pool, schema, f.id))?.state, 'cancelled', `round ${round}`);
      if (failWon) tally.failedFirst++;
      else tally.cancelledFirst++;
    }
    assert.equal(tally.completed + tally.cancelled, 40);
    assert.equal(tally.failedFirst + tally.cancelledFirst, 40);
  } finally {
    await other.end();
  }
});

test('a forged cancel notice changes nothing: a role with no berth privileges sweeps every plausible lane and position while tasks run, and each completes on its first run', async () => {
  await reset();
  const forger = `t_forger_${process.pid}`;
  await pool.query(`DROP ROLE IF EXISTS "${forger}"`);
  await pool.query(`CREATE ROLE "${forger}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  const runs: { id: string; attempt: number }[] = [];
  const started = new Set<string>();
  const def = defineTask({
    type: 'forged_cancel',
    ceilingMs: 60_000,
    maxAttempts: 3,
    handler: async (_p, ctx: TaskContext<unknown>) => {
      runs.push({ id: ctx.id, attempt: ctx.attempt });
      started.add(ctx.id);
      // Long enough for several sweeps of forged notices to reach the worker while it runs.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      ctx.signal.throwIfAborted();
    },
  });
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    queues: [def.type],
    slots: 5,
    logger,
    maintenance: false,
  });
  await w.start();
  const url = new URL(DATABASE_URL);
  url.username = forger;
  const attacker = new pg.Client({ connectionString: url.toString() });
  await attacker.connect();
  let sweeping = true;
  let sweeps = 0;
  // NOTIFY needs no privilege: every lane 1-8 and position 1-300, one notice each, a sweep at a time.
  const sweep = (async () => {
    while (sweeping) {
      await attacker.query(
        `SELECT count(pg_notify($1, 'cancel:' || l || ':' || s)) FROM generate_series(1, 8) l, generate_series(1, 300) s`,
        [wakeChannel(schema)],
      );
      sweeps++;
    }
  })();
  try {
    const tasks = await enqueueMany(
      pool,
      Array.from({ length: 5 }, (_, i) => ({ type: def.type, payload: { i }, queue: def.type })),
      { schema },
    );
    const ids = tasks.map((t) => t.id!);
    await waitFor(
      async () => {
        const states = await Promise.all(ids.map(async (id) => (await getTask(pool, schema, id))?.state));
        return states.every((st) => st === 'completed');
      },
      60_000,
      'every task completed',
    );
    assert.ok(sweeps > 1, `the notices kept coming while the tasks ran (${sweeps} sweeps)`);
    assert.deepEqual(
      runs.map((r) => r.attempt),
      [1, 1, 1, 1, 1],
      'each task ran once, on its first attempt',
    );
    assert.equal(await outcomes(w.metrics, def.type, 'success'), 5);
    assert.equal(await outcomes(w.metrics, def.type, 'cancelled'), 0);
    assert.deepEqual(
      lines.filter((l) => typeof l.msg === 'string' && /cancel/.test(l.msg)).map((l) => l.msg),
      [],
      'nothing was logged as a cancel',
    );
  } finally {
    sweeping = false;
    await sweep.catch(() => undefined);
    await attacker.end();
    await w.stop();
    await pool.query(`DROP ROLE IF EXISTS "${forger}"`);
  }
});
