/**
 * Review of task type rate limits (migration 30): where refused tasks are sent, and whether a
 * change of the limit brings them back. `set_type_limit()` makes the tasks the old limit paced
 * due at once, and `take_type_starts()` paces a backlog from the type's horizon
 * (`type_limits.paced_until`). Two ways a task stays where a limit that no longer holds sent it:
 * a refusal still on its way back when the limit is cleared (brought back by the leader's rescue
 * branch), and a horizon kept by tasks that were cancelled.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/type-limits-review-pacing.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  cancelTasks,
  clearTypeLimit,
  defineTask,
  enqueueMany,
  listTypeLimits,
  setTypeLimit,
  Worker,
} from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('tlrvpace');
const S = `"${schema}"`;

test('a limit cleared while a refused task is on its way back: the task is due at once, not where the cleared limit sent it', async () => {
  const type = 'rv_inflight';
  let ran = 0;
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-inflight',
    ceilingMs: 60_000,
    handler: async () => {
      ran++;
    },
  });
  // One start an hour, already taken: the task below is refused and paced an hour out.
  await setTypeLimit(pool, schema, type, { limit: 1, intervalMs: 3_600_000 }, 'review');
  await pool.query(`SELECT * FROM ${S}.take_type_starts($1, ARRAY[0]::bigint[])`, [type]);
  const id = (await enqueueMany(pool, [{ type, payload: { i: 0 }, queue: 'rv-inflight' }], { schema }))[0]!.id!;
  // The hand-back is held up (a row of the same id, not yet committed, in deferred storage) so
  // the clear below commits between the refusal and the hand-back, as it does when it lands
  // within a worker's round trip (a scratch run of 3,000 tasks, 2 workers, a limit of 1 a
  // minute cleared mid-refusals: 15-26 tasks left 1h20-1h50 out, every run).
  const blocker = new pg.Client({ connectionString: DATABASE_URL });
  await blocker.connect();
  await blocker.query('BEGIN');
  await blocker.query(
    `INSERT INTO ${S}.deferred (id, state, type, payload, queue, priority, shard, attempts, created_at, run_at)
     VALUES ($1, 'retryable', $2, '{}', 'rv-inflight', 0, 0, 0, now(), now())`,
    [id, type],
  );
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 4,
    pollIntervalMs: 200,
    logger: testLogger,
    maintenance: { ...FAST_MAINTENANCE, ringIntervalMs: 600_000 },
  });
  await w.start();
  try {
    await waitFor(
      async () =>
        (await pool.query(`SELECT 1 FROM ${S}.type_paced WHERE id = $1`, [id])).rowCount === 1 &&
        (
          await pool.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event = 'transactionid'`,
          )
        ).rows[0]!.n > 0,
      20_000,
      'the task refused, its hand-back waiting',
    );
    await clearTypeLimit(pool, schema, type, 'review');
    await blocker.query('ROLLBACK');
    await waitFor(
      async () => (await pool.query(`SELECT 1 FROM ${S}.deferred WHERE id = $1`, [id])).rowCount === 1 || ran > 0,
      20_000,
      'the hand-back written',
    );
    // The clear could not see this hand-back (it had not landed): the leader's rescue branch
    // makes it due (release_paced, every type, each rescue interval), and the task runs.
    await waitFor(async () => ran > 0, 30_000, 'the task, due again once its limit is gone, run');
  } finally {
    await blocker.end().catch(() => undefined);
    await w.stop();
  }
});

test('a paced backlog cancelled: the next refused task of the type is paced from the window, not behind the cancelled backlog', async () => {
  const type = 'rv_cancelled';
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-cancelled',
    ceilingMs: 60_000,
    handler: async () => undefined,
  });
  await setTypeLimit(pool, schema, type, { limit: 2, intervalMs: 3000 }, 'review');
  // 60 tasks: 2 start, 58 are refused and paced 1.5 s apart, ~90 s out.
  await enqueueMany(
    pool,
    Array.from({ length: 60 }, (_, i) => ({ type, payload: { i }, queue: 'rv-cancelled' })),
    { schema },
  );
  const first = await runDueTasks(pool, [def], { schema, queues: ['rv-cancelled'] });
  // Two start; on a loaded machine the run can outlast the window (3.25 s), and two more start,
  // and a refused task whose pace came due within the run is refused (or started) again: counted
  // by task, not by report.
  const doneIds = new Set(first.filter((r) => r.status === 'completed').map((r) => r.id));
  const refusedIds = new Set(first.filter((r) => r.status === 'returned').map((r) => r.id));
  for (const id of doneIds) refusedIds.delete(id);
  const done = doneIds.size;
  const refused = refusedIds.size;
  assert.ok(done >= 2, `${done} started`);
  assert.equal(done + refused, 60);
  // The backlog is cancelled (it was a mistake).
  const cancelled = await cancelTasks(pool, schema, { type }, { actor: 'review' });
  assert.equal(cancelled.removed, refused);
  // Once the window (3.25 s) is empty again, three new tasks: two start, the third is refused.
  await waitFor(
    async () => (await listTypeLimits(pool, schema)).find((l) => l.type === type)?.started === 0,
    20_000,
    "the type's window empty",
  );
  // And every refusal of the backlog older than the 2 s an in-flight hand-back is given (on a
  // loaded machine the 58 refusals spread over several asks, the last ones seconds after the
  // first start): until then the ask counts a cancelled task's row as a hand-back on its way.
  await waitFor(
    async () =>
      (
        await pool.query(
          `SELECT 1 FROM ${S}.type_paced WHERE type = $1 AND refused_at > clock_timestamp() - interval '2 seconds'`,
          [type],
        )
      ).rowCount === 0,
    20_000,
    "the backlog's refusals past the hand-back grace",
  );
  await enqueueMany(
    pool,
    Array.from({ length: 3 }, (_, i) => ({ type, payload: { i }, queue: 'rv-cancelled' })),
    { schema },
  );
  const second = await runDueTasks(pool, [def], { schema, queues: ['rv-cancelled'] });
  assert.deepEqual(
    second.map((r) => r.status),
    ['completed', 'completed', 'returned'],
  );
  const delayMs = Number(/due again in (\d+) ms/.exec(second[2]!.error ?? '')?.[1]);
  assert.ok(
    delayMs <= 4_000,
    `refused with an empty window behind it: due again when the window frees (${delayMs} ms), not after the cancelled backlog`,
  );
});
