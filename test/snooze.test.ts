/**
 * Issue 13, item 4: `return snooze(ms)` runs the task again after a delay without consuming an
 * attempt, at most `maxSnoozes` times per task; past that a snooze keeps its attempt, so the
 * attempt limit ends a task that only ever snoozes (seed 000: an unbounded refund would make it
 * immortal).
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import {
  attemptsOf,
  BerthInputError,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  listAttempts,
  moveTask,
  snooze,
  Worker,
} from '../src/index.js';
import { promoteDue } from '../src/maintenance/promote.js';
import { type ClaimParams, claim, claimLanes } from '../src/processor/claim.js';
import { claimOneLane } from '../src/processor/claim-one-lane.js';
import { quoteIdent } from '../src/sql.js';
import { pruneSnoozeCounts, snoozeLease } from '../src/storage/snooze.js';
import { claimParams } from './claim-params.js';
import { runCli } from './support/run-cli.js';
import {
  DATABASE_URL,
  expectOutcome,
  FAST_MAINTENANCE,
  freshSchema,
  outcomes,
  takeLeaseOver,
  testLogger,
  waitFor,
} from './helpers.js';

const { schema, pool } = await freshSchema('snooze');
const S = quoteIdent(schema);

function worker(tasks: ReturnType<typeof defineTask<Record<string, never>>>[]) {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    slots: 2,
    pollIntervalMs: 100,
    logger: testLogger,
    maintenance: FAST_MAINTENANCE,
  });
}

test('a snooze defers the task by its delay without consuming an attempt; the next run sees the same attempt number', async () => {
  const attempts: number[] = [];
  const def = defineTask<Record<string, never>>({
    type: 's_once',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      attempts.push(ctx.attempt);
      return attempts.length === 1 ? snooze(1500) : 'done';
    },
  });
  const w = worker([def]);
  await w.start();
  try {
    const { id } = await enqueue(pool, 's_once', {}, { schema });
    await waitFor(() => attempts.length === 1, 20_000, 'the first run');
    const snoozed = await waitFor(
      async () =>
        (
          await pool.query(
            `SELECT attempts, state, run_at >= now() + interval '500 ms' AS later FROM ${S}.deferred WHERE id = $1`,
            [id],
          )
        ).rows[0],
      20_000,
      'the snoozed row',
    );
    assert.deepEqual(snoozed, { attempts: 0, state: 'retryable', later: true });
    assert.deepEqual((await pool.query(`SELECT snoozes FROM ${S}.snoozes WHERE id = $1`, [id])).rows, [{ snoozes: 1 }]);
    await waitFor(() => attempts.length === 2, 20_000, 'the run after the snooze');
    assert.deepEqual(attempts, [1, 1]);
    await expectOutcome(w.metrics, 's_once', 'success', 1);
    assert.equal(await outcomes(w.metrics, 's_once', 'snoozed'), 1);
    assert.equal(await outcomes(w.metrics, 's_once', 'failure'), 0);
    assert.equal((await getTask(pool, schema, id!))?.state, 'completed');
    // Its count outlives the task only until retention: a finished task's row goes.
    await pool.query(`UPDATE ${S}.snoozes SET last_snoozed_at = now() - interval '2 hours'`);
    assert.equal(await pruneSnoozeCounts(pool, storageFor(schema)), 1);
  } finally {
    await w.stop();
  }
});

test('bounded: past maxSnoozes a snooze keeps its attempt, so a task that only snoozes dead-letters after maxSnoozes + maxAttempts runs', async () => {
  let runs = 0;
  const def = defineTask<Record<string, never>>({
    type: 's_forever',
    ceilingMs: 60_000,
    maxSnoozes: 2,
    maxAttempts: 3,
    handler: async () => {
      runs++;
      return snooze(0);
    },
  });
  const w = worker([def]);
  await w.start();
  try {
    const { id } = await enqueue(pool, 's_forever', {}, { schema });
    const dead = await waitFor(
      async () => (await pool.query(`SELECT attempts, last_error FROM ${S}.dead_letters WHERE id = $1`, [id])).rows[0],
      30_000,
      'the dead letter',
    );
    assert.deepEqual(dead, { attempts: 3, last_error: 'snoozed past maxSnoozes on its final attempt' });
    assert.equal(runs, 5, '2 free snoozes, then 3 that each burnt an attempt');
    await expectOutcome(w.metrics, 's_forever', 'snoozed', 5);
    assert.deepEqual((await pool.query(`SELECT snoozes FROM ${S}.snoozes WHERE id = $1`, [id])).rows, [{ snoozes: 5 }]);
    const history = (await listAttempts(pool, schema, { type: 's_forever' })).attempts.reverse();
    assert.deepEqual(
      history.map((a) => [a.outcome, a.attempt, a.dead, a.error?.message ?? null]),
      [
        ['snoozed', 1, false, null],
        ['snoozed', 1, false, null],
        ['snoozed', 1, false, null],
        ['snoozed', 2, false, null],
        ['snoozed', 3, true, 'snoozed past maxSnoozes on its final attempt'],
      ],
    );
    // A pending task keeps its count whatever its age.
    await pool.query(`UPDATE ${S}.snoozes SET last_snoozed_at = now() - interval '2 hours'`);
    const keep = await enqueue(pool, 's_keep', {}, { schema, delay: 3_600_000 });
    await pool.query(
      `INSERT INTO ${S}.snoozes (id, snoozes, last_snoozed_at) VALUES ($1, 7, now() - interval '2 hours')`,
      [keep.id],
    );
    assert.equal(
      await pruneSnoozeCounts(pool, storageFor(schema)),
      1,
      'the dead task’s count, not the scheduled one’s',
    );
  } finally {
    await w.stop();
  }
});

test('ctx.snoozes counts the snoozes before this run, and each snoozed run is in attempt history (berth history list)', async () => {
  const seen = new Map<string, number[]>();
  const def = defineTask<Record<string, never>>({
    type: 's_count',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      const runs = seen.get(ctx.id) ?? [];
      runs.push(ctx.snoozes);
      seen.set(ctx.id, runs);
      return runs.length < 3 ? snooze(0) : 'done';
    },
  });
  const w = worker([def]);
  await w.start();
  try {
    // Both shapes of a claimed task: without and with the fields that are sent only when set.
    const plain = await enqueue(pool, 's_count', {}, { schema });
    const keyed = await enqueue(pool, 's_count', {}, { schema, dedupeKey: 's_count-keyed', maxAttempts: 4 });
    await waitFor(
      async () =>
        (await getTask(pool, schema, keyed.id!))?.state === 'completed' &&
        (await getTask(pool, schema, plain.id!))?.state === 'completed',
      30_000,
      'both tasks completed',
    );
    assert.deepEqual(seen.get(plain.id!), [0, 1, 2]);
    assert.deepEqual(seen.get(keyed.id!), [0, 1, 2]);

    const snoozed = await listAttempts(pool, schema, { type: 's_count', outcome: 'snoozed' });
    assert.deepEqual(
      snoozed.attempts.filter((a) => a.id === plain.id).map((a) => [a.outcome, a.attempt, a.dead, a.error]),
      [
        ['snoozed', 1, false, null],
        ['snoozed', 1, false, null],
      ],
    );
    assert.ok(snoozed.attempts.every((a) => a.runMs !== null && a.worker !== null));
    const list = await runCli([
      'history',
      'list',
      '--type',
      's_count',
      '--outcome',
      'snoozed',
      '--schema',
      schema,
      '--database-url',
      DATABASE_URL,
    ]);
    assert.equal(list.code, 0, list.err);
    assert.equal(list.out.match(/ snoozed /g)?.length, 4, list.out);
    assert.match(list.out, new RegExp(`${plain.id} +1/- +snoozed`));
  } finally {
    await w.stop();
  }
});

test('snooze() and maxSnoozes are checked: a bad delay fails the run (a BerthInputError naming it), a bad limit fails defineTask', async () => {
  assert.throws(
    () => snooze(-1),
    (e: Error) => e instanceof BerthInputError && /snooze delay/.test(e.message),
  );
  assert.throws(() => snooze(Number.NaN), BerthInputError);
  assert.throws(() => snooze(366 * 24 * 3600_000), BerthInputError);
  assert.throws(
    () => defineTask({ type: 'x', ceilingMs: 1000, handler: async () => undefined, maxSnoozes: -1 }),
    /maxSnoozes/,
  );
  assert.equal(defineTask({ type: 'x', ceilingMs: 1000, handler: async () => undefined }).maxSnoozes, 100);
  assert.equal(defineTask({ type: 'x', ceilingMs: 1000, handler: async () => undefined, maxSnoozes: 0 }).maxSnoozes, 0);
});

/** Index and sequential scans of `snoozes` this transaction has started so far. */
async function snoozeScans(db: pg.ClientBase): Promise<number> {
  const r = await db.query<{ n: string }>(
    `SELECT (coalesce(seq_scan, 0) + coalesce(idx_scan, 0))::text AS n
       FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = 'snoozes'`,
    [schema],
  );
  return Number(r.rows[0]?.n ?? 0);
}

test('the claim reads snoozes only for a task back from deferred storage: fresh tasks cost no read of it, even with dead counts in the table (both claim statements)', async () => {
  const queue = 's_probe';
  // A count of another task, and 2,000 dead ones ahead of it in the index (pruned, no vacuum yet):
  // an EXISTS over the table would walk them all on every claim.
  await pool.query(
    `INSERT INTO ${S}.snoozes (id, snoozes) SELECT 8000000000000000000 + g, 1 FROM generate_series(1, 2000) g`,
  );
  await pool.query(`INSERT INTO ${S}.snoozes (id, snoozes) VALUES (9000000000000000000, 3)`);
  await pool.query(`DELETE FROM ${S}.snoozes WHERE id BETWEEN 8000000000000000001 AND 8000000000000002000`);
  const snoozed = await enqueue(pool, 's_probe_t', { n: 0 }, { schema, queue });
  const lanes = (
    await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1`, [queue])
  ).rows.map((r) => r.lane_id);
  const [first] = await claim(pool, claimParams(schema, lanes, 1));
  assert.equal(first?.id, snoozed.id);
  assert.equal(first?.snoozes, 0);
  assert.equal((await snoozeLease(pool, storageFor(schema), first!, 0, 100, 'x')).wrote, true);
  assert.ok((await promoteDue(pool, schema)) >= 1);
  // Moved to another priority (a new lane of the queue): it keeps its count.
  assert.equal(await moveTask(pool, schema, snoozed.id!, { priority: 1 }), 'moved');
  const fresh = await enqueueMany(
    pool,
    [1, 2].map((n) => ({ type: 's_probe_t', payload: { n }, queue })),
    { schema },
  );
  const allLanes = (
    await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1 ORDER BY lane_id`, [queue])
  ).rows.map((r) => r.lane_id);
  const client = await pool.connect();
  try {
    for (const [label, run] of [
      ['the one-lane statement', (p: ClaimParams) => claimOneLane(client, p)],
      ['the several-lane statement', (p: ClaimParams) => claimLanes(client, p)],
    ] as const) {
      // Every lane of the queue (its tasks may be spread over shards), in one transaction rolled
      // back, so the next statement claims the same tasks.
      await client.query('BEGIN');
      try {
        const before = await snoozeScans(client);
        const counts = new Map<string, number>();
        for (const lane of allLanes) {
          for (const t of (await run(claimParams(schema, [lane], 10))).tasks) counts.set(t.id, t.snoozes);
        }
        const probes = (await snoozeScans(client)) - before;
        assert.deepEqual(counts, new Map([[snoozed.id!, 1], ...fresh.map((f) => [f.id!, 0] as const)]), label);
        assert.equal(probes, 1, `${label}: one probe of snoozes, the snoozed task's; none for fresh tasks`);
      } finally {
        await client.query('ROLLBACK');
      }
    }
  } finally {
    client.release();
  }
});

test('a snooze whose lease was taken over writes nothing: no count, no deferred row, no attempt-history row', async () => {
  const queue = 's_fenced';
  const { id } = await enqueue(pool, 's_fenced_t', {}, { schema, queue });
  const lanes = (
    await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1`, [queue])
  ).rows.map((r) => r.lane_id);
  const [task] = await claim(pool, claimParams(schema, lanes, 1));
  assert.equal(task?.id, id);
  await takeLeaseOver(pool, schema, id!);
  const r = await snoozeLease(pool, storageFor(schema), task!, 0, 100, 'x');
  assert.deepEqual(r, { wrote: false, snoozes: 0, refunded: false, dead: false });
  assert.deepEqual((await pool.query(`SELECT 1 FROM ${S}.snoozes WHERE id = $1`, [id])).rows, []);
  assert.deepEqual((await pool.query(`SELECT 1 FROM ${S}.deferred WHERE id = $1`, [id])).rows, []);
  assert.deepEqual(
    (await attemptsOf(pool, schema, id!)).map((a) => a.outcome),
    [],
  );
});
