/**
 * The producer's client-side cost: validating and serialising a batch before its statement.
 *
 *   npx tsx bench/prepare.ts        (no database: the executor is a stub)
 *
 * Runs enqueueMany over 10,000 tasks (a small nested payload, a queue, a dedupe key) against an
 * executor that answers instantly, so what is timed is berth's own work per task: input checks,
 * JSON.stringify, lane grouping and building the parameter arrays. Prints the median and best of
 * 40 runs after 10 warm-up runs.
 */
import { enqueueMany, type TaskSpec } from '../src/index.js';
import type { Queryable } from '../src/sql.js';

const N = 10_000;
const stub = {
  query: async (q: { values: unknown[] }) => ({
    rows: (q.values[4] as unknown[]).map((_, i) => ({ ord: i + 1, id: '1', state: 'ready' })),
  }),
} as unknown as Queryable;
const tasks: TaskSpec[] = Array.from({ length: N }, (_, i) => ({
  type: 'send_invoice',
  payload: {
    orgId: i,
    email: `user${i}@example.com`,
    lines: [
      { sku: 'A-1', qty: 2 },
      { sku: 'B-7', qty: 1 },
    ],
    note: 'net 30',
  },
  queue: 'billing',
  dedupeKey: `invoice:${i}`,
  maxAttempts: 5,
}));
const times: number[] = [];
for (let run = 0; run < 50; run++) {
  const t0 = performance.now();
  await enqueueMany(stub, tasks, { schema: 'bench' });
  if (run >= 10) times.push(performance.now() - t0);
}
times.sort((a, b) => a - b);
console.log(
  `enqueueMany of ${N} tasks (stub executor): median ${times[times.length >> 1]!.toFixed(1)} ms, best ${times[0]!.toFixed(1)} ms`,
);
