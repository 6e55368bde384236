/**
 * Task type rate limits (docs/architecture.md, "Type rate limits"): a type's starts across worker
 * processes stay within its rate, taken where a task starts; a refused task is handed back
 * unstarted (no attempt spent) and paced; other types in the same lanes are not held up; a
 * cleared limit makes the paced backlog due at once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import {
  BerthInputError,
  clearTypeLimit,
  defineTask,
  enqueueMany,
  listTypeLimits,
  setTypeLimit,
  setTypeLimitAudited,
} from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { BerthMetrics } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { publishGauges } from '../src/maintenance/gauges.js';
import { freshSchema, scaled, spawnWorkerProcess, stopProcesses, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('tlimits');
const S = `"${schema}"`;

await pool.query(
  `CREATE TABLE ${S}.limit_runs (run bigserial PRIMARY KEY, i integer NOT NULL, task_id bigint NOT NULL,
     worker text NOT NULL, queue text NOT NULL, key text, started_at timestamptz NOT NULL, ended_at timestamptz)`,
);

async function count(sql: string, params: unknown[] = []): Promise<number> {
  return (await pool.query<{ n: number }>(sql, params)).rows[0]!.n;
}

test('bad input: a clear error naming the field, and nothing changes', async () => {
  const cases: Array<[unknown, unknown, RegExp]> = [
    ['t', { limit: 0, intervalMs: 1000 }, /rate\.limit must be an integer from 1/],
    ['t', { limit: 1.5, intervalMs: 1000 }, /rate\.limit must be an integer/],
    ['t', { limit: 5, intervalMs: 0 }, /rate\.intervalMs must be an integer from 1/],
    ['t', { limit: 5 }, /rate\.intervalMs must be an integer/],
    ['t', { count: 3, intervalMs: 10 }, /unknown option "count"; did you mean "limit"\?/],
    ['t', null, /rate must be an object/],
    ['', { limit: 5, intervalMs: 1000 }, /type/],
    ['x'.repeat(201), { limit: 5, intervalMs: 1000 }, /type/],
  ];
  for (const [type, rate, message] of cases) {
    await assert.rejects(
      setTypeLimit(pool, schema, type as string, rate as never, 'test'),
      (err: Error) => err instanceof BerthInputError && message.test(err.message),
      `${JSON.stringify(rate)} → ${message}`,
    );
  }
  assert.deepEqual(await listTypeLimits(pool, schema), []);
  assert.deepEqual(await clearTypeLimit(pool, schema, 'never-limited', 'test'), { cleared: false });
});

test('set, change and clear: listed with their usage, audited, a raised limit keeps the starts counted', async () => {
  const set = await setTypeLimitAudited(pool, schema, null, 'test:op', 'report', { limit: 3, intervalMs: 60_000 });
  assert.equal(set.type, 'report');
  assert.equal(set.rateLimit, 3);
  assert.equal(set.rateIntervalMs, 60_000);
  assert.equal(set.started, 0);
  assert.equal(set.atLimit, false);
  assert.equal(set.updatedBy, 'test:op');
  const audit = await pool.query(`SELECT actor, action, target FROM ${S}.audit_log WHERE action = 'type.limit'`);
  assert.deepEqual(audit.rows[0], {
    actor: 'test:op',
    action: 'type.limit',
    target: { type: 'report', rate: { limit: 3, intervalMs: 60_000 } },
  });
  // Starts asked for directly (the worker's statement): 3 granted, 2 refused and paced.
  const r = await pool.query(`SELECT * FROM ${S}.take_type_starts('report', ARRAY[1, 2, 3, 4, 5]::bigint[])`);
  assert.equal(r.rows[0].granted, 3);
  assert.ok(
    r.rows[0].retry_ms > 50_000,
    `the first refused comes back when the window frees (${r.rows[0].retry_ms} ms)`,
  );
  // The window's pace: (60 s + its 250 ms guard) / 3.
  assert.equal(r.rows[0].step_ms, 20_084);
  let [now] = await listTypeLimits(pool, schema);
  assert.equal(now!.started, 3);
  assert.equal(now!.atLimit, true);
  assert.equal(now!.refused, 2);
  assert.equal(now!.paced, 2);
  // Raised: the starts already in the window still count.
  await setTypeLimit(pool, schema, 'report', { limit: 4, intervalMs: 60_000 }, 'test');
  const again = await pool.query(`SELECT * FROM ${S}.take_type_starts('report', ARRAY[4, 5]::bigint[])`);
  assert.equal(again.rows[0].granted, 1);
  [now] = await listTypeLimits(pool, schema);
  assert.equal(now!.started, 4);
  // At another isolation level the statement refuses rather than count from an old snapshot.
  const client = await pool.connect();
  try {
    await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await assert.rejects(
      client.query(`SELECT * FROM ${S}.take_type_starts('report', ARRAY[9]::bigint[])`),
      /READ COMMITTED/,
    );
    await client.query('ROLLBACK');
  } finally {
    client.release();
  }
  assert.deepEqual(await clearTypeLimit(pool, schema, 'report', 'test'), { cleared: true });
  assert.deepEqual(await listTypeLimits(pool, schema), []);
  // Without a limit every start is granted.
  const free = await pool.query(`SELECT * FROM ${S}.take_type_starts('report', ARRAY[6, 7]::bigint[])`);
  assert.equal(free.rows[0].granted, 2);
  assert.equal(free.rows[0].guard_ms, null);
});

test('20 starts per second of one type across 3 processes for 10 s: no second-long window above 20, no attempt spent, and the other type in the same lanes runs at once', async () => {
  await pool.query(`TRUNCATE ${S}.limit_runs`);
  // The limited type first in every lane, the other type behind it: a claim that stopped at the
  // limited type would hold the other back.
  const limited = Array.from({ length: 600 }, (_, k) => ({
    type: 'lim_work',
    payload: { i: k },
    queue: 'typed',
    // A refused start that spent an attempt would dead-letter the task.
    maxAttempts: 1,
  }));
  const other = Array.from({ length: 200 }, (_, k) => ({ type: 'lim_free', payload: { i: k }, queue: 'typed' }));
  await enqueueMany(pool, limited, { schema });
  await enqueueMany(pool, other, { schema });
  await setTypeLimit(pool, schema, 'lim_work', { limit: 20, intervalMs: 1000 }, 'test');
  const children: ChildProcess[] = [];
  let first: Date;
  try {
    for (const id of ['t1', 't2', 't3'])
      children.push(
        await spawnWorkerProcess(schema, id, {
          fixture: 'limit-worker.ts',
          env: { SLEEP_MS: '5', TASK_QUEUE: 'typed' },
        }),
      );
    await waitFor(
      async () => (await count(`SELECT count(*)::int AS n FROM ${S}.limit_runs WHERE key IS NULL`)) > 0,
      scaled(30_000),
      'a first start',
    );
    first = (await pool.query<{ t: Date }>(`SELECT min(started_at) AS t FROM ${S}.limit_runs WHERE key IS NULL`))
      .rows[0]!.t;
    // Every task of the other type ran while the limited type's backlog (30 s of it at the
    // limit) was still far from drained.
    await waitFor(
      async () => (await count(`SELECT count(*)::int AS n FROM ${S}.limit_runs WHERE key = '__free'`)) === 200,
      scaled(60_000),
      'the other type drained',
    );
    assert.ok(
      (await count(`SELECT count(*)::int AS n FROM ${S}.limit_runs WHERE key IS NULL`)) < 600,
      'the other type did not wait for the limited backlog',
    );
    await waitFor(
      async () =>
        (await pool.query<{ t: Date }>(`SELECT clock_timestamp() AS t`)).rows[0]!.t.getTime() - first.getTime() >=
        10_000,
      scaled(60_000),
      '10 seconds of starts',
    );
    const [usage] = await listTypeLimits(pool, schema);
    assert.ok(usage!.refused > 0, 'starts were refused');
    assert.ok(usage!.paced > 0, `the backlog is paced (${usage!.paced})`);
  } finally {
    await stopProcesses(children);
  }
  const windows = await pool.query<{ peak: number }>(
    `SELECT coalesce(max((SELECT count(*) FROM ${S}.limit_runs b
                 WHERE b.key IS NULL AND b.started_at >= a.started_at
                   AND b.started_at < a.started_at + interval '1 second')), 0)::integer AS peak
       FROM ${S}.limit_runs a WHERE a.key IS NULL`,
  );
  assert.ok(windows.rows[0]!.peak <= 20, `at most 20 starts in any one-second window (peak ${windows.rows[0]!.peak})`);
  const inTen = await count(
    `SELECT count(*)::integer AS n FROM ${S}.limit_runs WHERE key IS NULL AND started_at < $1::timestamptz + interval '10 seconds'`,
    [first!],
  );
  // Close to 200 (the guard keeps a start in the window for 1.1 s, and a returning task waits
  // for the leader's promotion tick); a loaded machine starts fewer, never more.
  assert.ok(inTen <= 200, `at most 200 in the first 10 s (${inTen})`);
  assert.ok(inTen >= 100, `close to 200 in the first 10 s (${inTen})`);
  console.log(`type rate limit: ${inTen} starts in the first 10 s, peak ${windows.rows[0]!.peak} in a second`);
  assert.equal(await count(`SELECT count(*)::int AS n FROM ${S}.dead_letters`), 0, 'no refused start spent an attempt');
  assert.equal(
    await count(
      `SELECT count(*)::int AS n FROM (SELECT task_id FROM ${S}.limit_runs GROUP BY task_id HAVING count(*) > 1) d`,
    ),
    0,
    'no task ran twice',
  );

  // Cleared: the paced backlog is due at once, and one worker drains the rest freely.
  const ran = await count(`SELECT count(*)::int AS n FROM ${S}.limit_runs WHERE key IS NULL`);
  const before = await count(`SELECT count(*)::int AS n FROM ${S}.deferred WHERE type = 'lim_work' AND run_at > now()`);
  assert.ok(before > 0, `tasks wait where the limit paced them (${before})`);
  await clearTypeLimit(pool, schema, 'lim_work', 'test');
  assert.equal(
    await count(`SELECT count(*)::int AS n FROM ${S}.deferred WHERE type = 'lim_work' AND run_at > now()`),
    0,
    'a cleared limit makes its paced tasks due',
  );
  const last = await spawnWorkerProcess(schema, 't4', {
    fixture: 'limit-worker.ts',
    env: { SLEEP_MS: '1', TASK_QUEUE: 'typed' },
  });
  try {
    await waitFor(
      async () => (await count(`SELECT count(*)::int AS n FROM ${S}.limit_runs WHERE key IS NULL`)) === 600,
      scaled(60_000),
      `the rest of the limited type drained (${ran} had run)`,
    );
  } finally {
    await stopProcesses([last]);
  }
  assert.equal(await count(`SELECT count(DISTINCT task_id)::int AS n FROM ${S}.limit_runs WHERE key IS NULL`), 600);
  assert.equal(await count(`SELECT count(*)::int AS n FROM ${S}.dead_letters`), 0);
});

test("runDueTasks asks for a rate-limited type's starts, and hands a refused task back unstarted", async () => {
  const ran: number[] = [];
  const task = defineTask<{ i: number }>({
    type: 'due_rated',
    queue: 'due-typed',
    ceilingMs: 10_000,
    handler: async ({ i }) => {
      ran.push(i);
    },
  });
  await enqueueMany(
    pool,
    [0, 1, 2].map((i) => ({ type: 'due_rated', payload: { i }, queue: 'due-typed' })),
    { schema },
  );
  await setTypeLimit(pool, schema, 'due_rated', { limit: 2, intervalMs: 60_000 }, 'test');
  const reports = await runDueTasks(pool, [task], { schema, queues: ['due-typed'] });
  assert.deepEqual(
    reports.map((r) => r.status),
    ['completed', 'completed', 'returned'],
  );
  assert.match(reports[2]!.error ?? '', /rate limit of task type "due_rated": start refused; due again in \d+ ms/);
  assert.deepEqual(ran.sort(), [0, 1]);
  assert.equal(
    await count(`SELECT count(*)::int AS n FROM ${S}.deferred WHERE type = 'due_rated' AND attempts = 0`),
    1,
  );
  await clearTypeLimit(pool, schema, 'due_rated', 'test');
});

test('the leader exports each type limit, its starts and its paced tasks; a cleared limit loses its series', async () => {
  const m = new BerthMetrics();
  const exported = async () => {
    publishGauges(m, await readGauges(pool, schema));
    return (await m.registry.metrics())
      .split('\n')
      .filter((l) => l.startsWith('berth_type_limit_'))
      .join('\n');
  };
  assert.doesNotMatch(await exported(), /berth_type_limit_rate\{/);
  await setTypeLimit(pool, schema, 'gauged', { limit: 2, intervalMs: 60_000 }, 'test');
  await pool.query(`SELECT * FROM ${S}.take_type_starts('gauged', ARRAY[101, 102, 103]::bigint[])`);
  const text = await exported();
  assert.match(text, /^berth_type_limit_rate\{task_type="gauged"\} 2$/m);
  assert.match(text, /^berth_type_limit_rate_interval_seconds\{task_type="gauged"\} 60$/m);
  assert.match(text, /^berth_type_limit_rate_starts\{task_type="gauged"\} 2$/m);
  assert.match(text, /^berth_type_limit_paced_tasks\{task_type="gauged"\} 1$/m);
  await clearTypeLimit(pool, schema, 'gauged', 'test');
  assert.doesNotMatch(await exported(), /task_type="gauged"/);
});
