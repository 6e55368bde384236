/**
 * `berth-queue/testing` (src/testing-api.ts, docs/testing.md): the helpers an application's own
 * suite uses.
 * - `runDueTasks` runs what is due through the worker's claim, handler run and fenced
 *   settlement, and reports each run: completed, retry (with its backoff), dead, continued, lost
 *   (a fence refusal), with the handler's error; runs follow-ups and zero-backoff retries within
 *   the call, stops a self-enqueueing loop at `maxRuns` (handing the claimed task back), counts
 *   outcomes on the metrics, and checks its options.
 * - `enqueuedIn` lists what the caller's open transaction enqueued (ready and scheduled, through
 *   enqueue and enqueueMany, inside savepoints), and nothing committed or uncommitted by anyone
 *   else; it refuses a pool or a client outside a transaction.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  BerthInputError,
  BerthMetrics,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  PermanentError,
  runSlices,
} from '../src/index.js';
import { rescueLapsedLeases } from '../src/maintenance-api.js';
import { enqueuedIn, runDueTasks, type TaskRunReport } from '../src/testing-api.js';
import { counterValue, DATABASE_URL, freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('testing');

/** The reports without the fields that vary from run to run. */
function brief(r: TaskRunReport) {
  return { type: r.type, attempt: r.attempt, status: r.status, error: r.error };
}

describe('runDueTasks', () => {
  test('runs each due task through claim and settlement and reports what became of it', async () => {
    const seen: unknown[] = [];
    const ok = defineTask<{ n: number }>({
      type: 'rd_ok',
      ceilingMs: 30_000,
      handler: async (p, ctx) => {
        seen.push({ p, attempt: ctx.attempt, max: ctx.maxAttempts });
      },
    });
    const flaky = defineTask<{ n: number }>({
      type: 'rd_flaky',
      ceilingMs: 30_000,
      maxAttempts: 4,
      backoff: { baseMs: 60_000, maxMs: 600_000 },
      handler: async () => {
        throw new Error('smtp down');
      },
    });
    const doomed = defineTask<{ n: number }>({
      type: 'rd_doomed',
      ceilingMs: 30_000,
      handler: async () => {
        throw new PermanentError('no such customer');
      },
    });
    const a = await enqueue(pool, ok, { n: 1 }, { schema, dedupeKey: 'rd-ok-1' });
    const b = await enqueue(pool, flaky, { n: 2 }, { schema, priority: 1 });
    const c = await enqueue(pool, doomed, { n: 3 }, { schema, priority: 2 });

    const reports = await runDueTasks(pool, [ok, flaky, doomed], { schema });
    assert.deepEqual(reports.map(brief), [
      { type: 'rd_ok', attempt: 1, status: 'completed', error: null },
      { type: 'rd_flaky', attempt: 1, status: 'retry', error: 'smtp down' },
      { type: 'rd_doomed', attempt: 1, status: 'dead', error: 'no such customer' },
    ]);
    const [rOk, rFlaky, rDoomed] = reports as [TaskRunReport, TaskRunReport, TaskRunReport];
    assert.deepEqual(
      { id: rOk.id, payload: rOk.payload, queue: rOk.queue, outcome: rOk.outcome },
      { id: a.id, payload: { n: 1 }, queue: 'default', outcome: 'success' },
    );
    assert.deepEqual(seen, [{ p: { n: 1 }, attempt: 1, max: 20 }]);
    assert.equal(rFlaky.id, b.id);
    assert.equal(rFlaky.outcome, 'failure');
    assert.equal(rFlaky.maxAttempts, 4);
    assert.equal(rFlaky.retryDelayMs, 60_000);
    assert.equal(rDoomed.id, c.id);
    assert.equal(rDoomed.retryDelayMs, null);

    // As in production: completed (its dedupe key free again), retryable, dead.
    assert.equal((await getTask(pool, schema, a.id!))?.state, 'completed');
    const retrying = await getTask(pool, schema, b.id!);
    assert.equal(retrying?.state, 'retryable');
    assert.equal(retrying?.lastError, 'smtp down');
    assert.equal((await getTask(pool, schema, c.id!))?.state, 'dead');
    assert.equal((await enqueue(pool, ok, { n: 1 }, { schema, dedupeKey: 'rd-ok-1' })).state, 'ready');

    // The retry waits out its backoff: nothing else is due, so the next call runs only the new ok task.
    assert.deepEqual((await runDueTasks(pool, [ok, flaky, doomed], { schema })).map(brief), [
      { type: 'rd_ok', attempt: 1, status: 'completed', error: null },
    ]);
    assert.deepEqual(await runDueTasks(pool, [ok, flaky, doomed], { schema }), []);
  });

  test('follow-up tasks and retries that are due again run within the same call', async () => {
    const child = defineTask<{ parent: string }>({ type: 'rd_child', ceilingMs: 30_000, handler: async () => {} });
    const parent = defineTask<Record<string, never>>({
      type: 'rd_parent',
      ceilingMs: 30_000,
      handler: async (_p, ctx) => {
        await enqueue(pool, child, { parent: ctx.id }, { schema });
      },
    });
    let tries = 0;
    const stubborn = defineTask<Record<string, never>>({
      type: 'rd_stubborn',
      ceilingMs: 30_000,
      maxAttempts: 3,
      backoff: { baseMs: 0, maxMs: 0 },
      handler: async () => {
        tries++;
        throw new Error(`try ${tries}`);
      },
    });
    const p = await enqueue(pool, parent, {}, { schema });
    await enqueue(pool, stubborn, {}, { schema, priority: 5 });
    const reports = await runDueTasks(pool, [parent, child, stubborn], { schema });
    assert.deepEqual(reports.map(brief), [
      { type: 'rd_parent', attempt: 1, status: 'completed', error: null },
      { type: 'rd_child', attempt: 1, status: 'completed', error: null },
      { type: 'rd_stubborn', attempt: 1, status: 'retry', error: 'try 1' },
      { type: 'rd_stubborn', attempt: 2, status: 'retry', error: 'try 2' },
      { type: 'rd_stubborn', attempt: 3, status: 'dead', error: 'try 3' },
    ]);
    assert.deepEqual(reports[1]?.payload, { parent: p.id });
  });

  test('a slice that continues is run again until it is done', async () => {
    const pages: Record<number, number[]> = { 0: [1, 2], 1: [3], 2: [4] };
    const walked: number[] = [];
    const walk = defineTask<{ page: number | null }>({
      type: 'rd_walk',
      ceilingMs: 30_000,
      handler: (payload, ctx) =>
        runSlices(payload, ctx, {
          cursorOf: (p) => p.page,
          withCursor: (p, page) => ({ ...p, page }),
          // A budget of 0: every page is a slice of its own.
          sliceMs: 0,
          readPage: async (page) => {
            const at = page ?? 0;
            walked.push(...(pages[at] ?? []));
            return { next: at < 2 ? at + 1 : null };
          },
        }),
    });
    await enqueue(pool, walk, { page: null }, { schema });
    const reports = await runDueTasks(pool, [walk], { schema });
    assert.deepEqual(walked, [1, 2, 3, 4]);
    assert.deepEqual(
      reports.map((r) => [r.status, r.payload]),
      [
        ['continued', { page: null }],
        ['continued', { page: 1 }],
        ['completed', { page: 2 }],
      ],
    );
  });

  test('a settlement the fence refuses is reported as lost, and the rescued task runs again', async () => {
    const slow = defineTask<Record<string, never>>({
      type: 'rd_slow',
      ceilingMs: 500,
      maxAttempts: 5,
      handler: async (_p, ctx) => {
        if (ctx.attempt > 1) return;
        // Past the lease (ceiling 500 ms, margin 0; the handler ignores its signal), the
        // leader's rescue takes the task away and makes it due again.
        await waitFor(async () => (await rescueLapsedLeases(pool, schema)).retried > 0, 20_000, 'rescue');
      },
    });
    const { id } = await enqueue(pool, slow, {}, { schema });
    const reports = await runDueTasks(pool, [slow], { schema, leaseMarginMs: 0 });
    assert.deepEqual(
      reports.map((r) => ({ id: r.id, attempt: r.attempt, status: r.status, outcome: r.outcome })),
      [
        { id, attempt: 1, status: 'lost', outcome: 'lost' },
        { id, attempt: 2, status: 'completed', outcome: 'success' },
      ],
    );
  });

  test('stops at maxRuns, handing the claimed task back', async () => {
    const again = defineTask<{ n: number }>({
      type: 'rd_again',
      ceilingMs: 30_000,
      handler: async ({ n }) => {
        await enqueue(pool, again, { n: n + 1 }, { schema });
      },
    });
    await enqueue(pool, again, { n: 0 }, { schema });
    await assert.rejects(runDueTasks(pool, [again], { schema, maxRuns: 3 }), /still due after 3 runs/);
    const left = await pool.query<{ id: string }>(
      `SELECT max(id)::text AS id FROM ${schema}.ready WHERE type = 'rd_again'`,
    );
    const last = await getTask(pool, schema, left.rows[0]!.id);
    assert.deepEqual(
      { state: last?.state, attempts: last?.attempts, payload: last?.payload },
      {
        state: 'retryable',
        attempts: 0,
        payload: { n: 3 },
      },
    );
    // Handed back due now, its attempt refunded; drained here for the other tests.
    const stop = defineTask<{ n: number }>({ type: 'rd_again', ceilingMs: 30_000, handler: async () => {} });
    assert.equal((await runDueTasks(pool, [stop], { schema })).length, 1);
  });

  test('counts outcomes on the metrics it is given, and checks its options', async () => {
    const ok = defineTask<Record<string, never>>({ type: 'rd_counted', ceilingMs: 30_000, handler: async () => {} });
    await enqueue(pool, ok, {}, { schema });
    const metrics = new BerthMetrics();
    await runDueTasks(pool, [ok], { schema, metrics });
    assert.equal(
      await counterValue(metrics, 'berth_task_outcomes_total', { task_type: 'rd_counted', outcome: 'success' }),
      1,
    );
    await assert.rejects(
      runDueTasks(pool, [ok], { schema, maxRun: 3 } as never),
      (e: Error) => e instanceof BerthInputError && /unknown option "maxRun"; did you mean "maxRuns"/.test(e.message),
    );
    await assert.rejects(runDueTasks(pool, [ok], { schema, maxRuns: 0 }), BerthInputError);
    await assert.rejects(runDueTasks(pool, [ok], { schema, leaseMarginMs: -1 }), /leaseMarginMs/);
  });
});

describe('enqueuedIn', () => {
  const email = defineTask<{ to: string }>({ type: 'ei_email', ceilingMs: 30_000, handler: async () => {} });

  test('lists what the open transaction enqueued, and only that; a rollback leaves nothing', async () => {
    const before = await enqueue(pool, email, { to: 'committed-before@example.com' }, { schema });
    const client = await pool.connect();
    const other = await pool.connect();
    try {
      await client.query('BEGIN');
      assert.deepEqual(await enqueuedIn(client, schema), []);
      const a = await enqueue(client, email, { to: 'a@example.com' }, { schema, dedupeKey: 'ei-a' });
      const b = await enqueue(
        client,
        'ei_report',
        { day: '2026-12-01' },
        {
          schema,
          queue: 'reports',
          priority: 3,
          delay: 3_600_000,
          maxAttempts: 2,
        },
      );
      // Another transaction's work: uncommitted, then committed while this one is open (each in
      // a queue of its own: a lane's lock is held to commit, and a shared lane would wait on it).
      await other.query('BEGIN');
      await enqueue(other, email, { to: 'other-open@example.com' }, { schema, queue: 'other' });
      await enqueue(pool, email, { to: 'committed-during@example.com' }, { schema, queue: 'during' });
      // A savepoint: its enqueue counts; one rolled back to does not.
      await client.query('SAVEPOINT s1');
      const [c] = await enqueueMany(client, [{ type: email, payload: { to: 'c@example.com' } }], { schema });
      await client.query('SAVEPOINT s2');
      await enqueue(client, email, { to: 'undone@example.com' }, { schema });
      await client.query('ROLLBACK TO SAVEPOINT s2');
      // A duplicate of a live key enqueues nothing.
      assert.equal((await enqueue(client, email, { to: 'dup' }, { schema, dedupeKey: 'ei-a' })).state, 'duplicate');

      const listed = await enqueuedIn(client, schema);
      // What every email enqueued here shares; the shard is the transaction's (txid % 16).
      const emailed = { type: 'ei_email', queue: 'default', priority: 0, state: 'ready', maxAttempts: 20 };
      assert.deepEqual(
        listed.map(({ shard: _shard, runAt, ...t }) => ({ ...t, runAt: runAt instanceof Date })),
        [
          { ...emailed, id: a.id, payload: { to: 'a@example.com' }, runAt: true, dedupeKey: 'ei-a' },
          {
            id: b.id,
            type: 'ei_report',
            payload: { day: '2026-12-01' },
            queue: 'reports',
            priority: 3,
            state: 'scheduled',
            runAt: true,
            maxAttempts: 2,
            dedupeKey: null,
          },
          { ...emailed, id: c?.id, payload: { to: 'c@example.com' }, runAt: true, dedupeKey: null },
        ],
      );
      assert.equal(new Set(listed.map((t) => t.shard)).size, 1, 'one transaction, one shard');
      const delayMs = listed[1]!.runAt.getTime() - listed[0]!.runAt.getTime();
      assert.ok(delayMs > 3_500_000 && delayMs <= 3_600_000, `delay ${delayMs}`);
      assert.ok(!listed.some((t) => t.id === before.id));

      await client.query('ROLLBACK');
      await other.query('ROLLBACK');
      for (const t of listed) assert.equal(await getTask(pool, schema, t.id), null);
    } finally {
      client.release();
      other.release();
    }
  });

  test('refuses a pool, or a client outside a transaction', async () => {
    await enqueue(pool, email, { to: 'x@example.com' }, { schema });
    await assert.rejects(
      enqueuedIn(pool, schema),
      (e: Error) => e instanceof BerthInputError && /open transaction/.test(e.message),
    );
    const client = new pg.Client({ connectionString: DATABASE_URL });
    await client.connect();
    try {
      await enqueue(client, email, { to: 'y@example.com' }, { schema });
      await assert.rejects(enqueuedIn(client, schema), BerthInputError);
    } finally {
      await client.end();
    }
  });
});
