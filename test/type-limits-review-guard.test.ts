/**
 * Review of task type rate limits (migration 30): liveness under a short interval. A granted
 * start must begin within the limit's guard of the ask being sent (a tenth of the interval, at
 * most 250 ms), or the task is handed back with its start spent. For an interval of 50 ms the
 * guard is 5 ms: the ask's own round trip (1.7 ms p50, 4 ms p99 for a bare take_type_starts on
 * the test host, more inside a worker that is also handing tasks back) spends most grants, each
 * spent start fills the window, and each expired task comes straight back to ask again.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/type-limits-review-guard.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueueMany, listTypeLimits, setTypeLimit } from '../src/index.js';
import { freshSchema } from './helpers.js';
import { reviewWorker } from './type-limits-review-support.js';

const { schema, pool } = await freshSchema('tlrvguard');

test('a short interval (5 starts per 50 ms, 100 a second): a backlog makes progress, at a tenth of the limit at least', async () => {
  const type = 'rv_short';
  let started = 0;
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-short',
    ceilingMs: 60_000,
    handler: async () => {
      started++;
    },
  });
  await enqueueMany(
    pool,
    Array.from({ length: 600 }, (_, i) => ({ type, payload: { i }, queue: 'rv-short' })),
    { schema },
  );
  await setTypeLimit(pool, schema, type, { limit: 5, intervalMs: 50 }, 'review');
  const w = reviewWorker(schema, [def]);
  await w.start();
  try {
    await new Promise((r) => setTimeout(r, 5_000));
  } finally {
    await w.stop();
  }
  const [usage] = await listTypeLimits(pool, schema);
  // 500 in 5 s at the limit (455 with the guard in the window); a tenth of that is the bound.
  assert.ok(started >= 50, `${started} started in 5 s at a limit of 100 a second (${usage!.refused} refused)`);
});
