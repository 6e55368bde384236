/**
 * Review of task type rate limits (migration 30): liveness under a short interval. A granted
 * start must begin within the limit's guard of the ask being sent (a tenth of the interval, at
 * most 250 ms), or the task is handed back with its start spent. For an interval of 50 ms the
 * guard is 5 ms: the ask's own round trip (1.7 ms p50, 4 ms p99 for a bare take_type_starts on
 * the test host, more inside a worker that is also handing tasks back) spends most grants, each
 * spent start fills the window, and each expired task comes straight back to ask again. The
 * guard of a type's rate is now at least 20 ms.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/type-limits-review-guard.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueueMany, listTypeLimits, setTypeLimit } from '../src/index.js';
import { freshSchema, waitFor } from './helpers.js';
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
    // Progress, not a rate: 100 of the backlog started, with a deadline far above what the limit
    // needs (at 5 per 70 ms, about 1.4 s). Before the guard's floor no grant was ever in time.
    await waitFor(async () => started >= 100, 60_000, 'a hundred starts of the short-interval type');
  } finally {
    await w.stop();
  }
  const [usage] = await listTypeLimits(pool, schema);
  assert.ok(usage!.started <= 5, `the window holds at most the limit (${usage!.started})`);
  console.log(`short interval: ${started} started, ${usage!.refused} refused`);
});
