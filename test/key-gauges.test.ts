/**
 * The leader's gauges of concurrency keys: berth_key_held_tasks{queue} (tasks held for their key),
 * berth_keys_waiting (keys with held tasks) and berth_key_limit{scope,name}. A queue with nothing
 * held left and a cleared key limit lose their series; held tasks are not starvation (their
 * run_at is 'infinity', so oldest due never reads them).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BerthMetrics, enqueueMany, setKeyLimit } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { publishGauges, resetGauges } from '../src/maintenance/gauges.js';
import { freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('keygauges');
const S = `"${schema}"`;

async function keyed(queue: string, key: string, n: number): Promise<void> {
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 'key_gauge', payload: { i }, queue, concurrencyKey: key })),
    { schema },
  );
}

async function exported(m = new BerthMetrics()): Promise<string> {
  publishGauges(m, await readGauges(pool, schema));
  return (await m.registry.metrics())
    .split('\n')
    .filter((l) => /^berth_(key_|keys_waiting|task_oldest_due_seconds)/.test(l))
    .join('\n');
}

test('held tasks per queue, keys waiting and key limits exported; cleared and drained series disappear', async () => {
  const m = new BerthMetrics();
  let text = await exported(m);
  assert.match(text, /^berth_keys_waiting 0$/m);
  assert.doesNotMatch(text, /berth_key_held_tasks\{/);
  assert.doesNotMatch(text, /berth_key_limit\{/);

  await keyed('mail', 'acme', 3);
  await keyed('mail', 'beta', 2);
  await keyed('reports', 'acme', 1);
  await setKeyLimit(pool, schema, { queue: 'mail' }, 2, 'test');
  await setKeyLimit(pool, schema, { type: 'key_gauge' }, 4, 'test');
  text = await exported(m);
  assert.match(text, /^berth_key_held_tasks\{queue="mail"\} 5$/m);
  assert.match(text, /^berth_key_held_tasks\{queue="reports"\} 1$/m);
  assert.match(text, /^berth_keys_waiting 2$/m);
  assert.match(text, /^berth_key_limit\{scope="queue",name="mail"\} 2$/m);
  assert.match(text, /^berth_key_limit\{scope="type",name="key_gauge"\} 4$/m);
  // Held is waiting for a key, not starvation.
  assert.match(text, /^berth_task_oldest_due_seconds 0$/m);

  // Admit every held task (the type's limit of 4 covers them all): nothing held, series gone.
  await setKeyLimit(pool, schema, { queue: 'mail' }, null, 'test');
  await pool.query(`SELECT * FROM ${S}.promote_held(NULL, NULL)`);
  text = await exported(m);
  assert.doesNotMatch(text, /berth_key_held_tasks\{/);
  assert.match(text, /^berth_keys_waiting 0$/m);
  assert.doesNotMatch(text, /berth_key_limit\{scope="queue"/);
  assert.match(text, /^berth_key_limit\{scope="type",name="key_gauge"\} 4$/m);

  // No longer the leader: no labelled series left, and no keys waiting claimed.
  resetGauges(m);
  const after = await m.registry.metrics();
  assert.doesNotMatch(after, /^berth_key_(held_tasks|limit)\{/m);
  assert.doesNotMatch(after, /^berth_keys_waiting [1-9]/m);
});

test('the held-tasks statement reads the held rows through the run_at index, not the scheduled backlog', async () => {
  // 1,000 held rows among 20,000 scheduled ones, written directly (a gauge's cost, not enqueue's).
  // Measured by hand: 100k held among 1M scheduled, a bitmap scan of this index, ~35 ms.
  await pool.query(
    `INSERT INTO ${S}.deferred (id, state, run_at, type, payload, queue, priority, shard, attempts, max_attempts, created_at)
     SELECT 10000000 + g, CASE WHEN g % 21 = 0 THEN 'held' ELSE 'scheduled' END,
            CASE WHEN g % 21 = 0 THEN 'infinity'::timestamptz ELSE now() + g * interval '1 second' END,
            'key_gauge', '{}', 'bulk' || (g % 4), 0, 0, 0, 5, now()
       FROM generate_series(1, 21000) g`,
  );
  await pool.query(`ANALYZE ${S}.deferred`);
  const g = await readGauges(pool, schema);
  assert.equal(
    [...g.keyHeldTasks].filter(([q]) => q.startsWith('bulk')).reduce((n, [, v]) => n + v, 0),
    1000,
  );
  const plan = await pool.query(
    `EXPLAIN (FORMAT JSON) SELECT d.queue, count(*) FROM ${S}.deferred d
      WHERE d.run_at = 'infinity'::timestamptz AND d.state = 'held' GROUP BY d.queue`,
  );
  const text = JSON.stringify(plan.rows[0]['QUERY PLAN']);
  assert.match(text, /"Index Name":"deferred_run_at_priority_id_idx"/, text);
  assert.doesNotMatch(text, /Seq Scan/, text);
  await pool.query(`DELETE FROM ${S}.deferred WHERE id > 10000000`);
});
