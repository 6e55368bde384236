/**
 * A stopped worker is garbage: once `stop()` has resolved and the application drops its Worker,
 * nothing berth left behind (a timer, a listener, a module-level cache) keeps the worker, its
 * engine or its metrics alive. A process that starts and stops workers (tests, benchmarks, a
 * service that restarts its worker on a configuration change) must not keep every one it made.
 *
 * The settlement batcher's give-up timer once did: armed for `stopTimeoutMs` by every stop and
 * never cleared, it held the batcher and through it the stopped worker's engine and metrics for
 * that long (about 180 KB a worker). `stopTimeoutMs` is set to the largest delay Node takes
 * (about 24.8 days), beyond any scaled deadline here, so a timer of that kind cannot expire in
 * time to hide.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { defineTask, enqueue, Worker } from '../src/index.js';
import { MAX_TIMER_MS } from '../src/limits.js';
import { DATABASE_URL, freshSchema, testLogger, waitFor } from './helpers.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

const { schema, pool } = await freshSchema('release');

let done = 0;
let failed = 0;
const ok = defineTask<{ i: number }>({
  type: 'release_ok',
  ceilingMs: 60_000,
  handler: async () => {
    done++;
  },
});
const failing = defineTask<{ i: number }>({
  type: 'release_fail',
  ceilingMs: 60_000,
  maxAttempts: 1,
  handler: async () => {
    failed++;
    throw new Error('fails on purpose');
  },
});

/** Run a worker until it has settled `n` ok and `n` failing tasks, stop it, return a weak reference to it. */
async function runAndStop(
  n: number,
  maintenance: boolean,
): Promise<{ worker: WeakRef<Worker>; metrics: WeakRef<object> }> {
  done = 0;
  failed = 0;
  for (let i = 0; i < n; i++) {
    await enqueue(pool, 'release_ok', { i }, { schema });
    await enqueue(pool, 'release_fail', { i }, { schema });
  }
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [ok, failing],
    slots: 4,
    logger: testLogger,
    maintenance,
    stopTimeoutMs: MAX_TIMER_MS,
  });
  await w.start();
  // The maintenance case is only a case if this worker leads (its schema is this file's own).
  if (maintenance) await waitFor(() => w.isLeader, 60_000, 'leadership');
  await waitFor(() => done === n && failed === n, 30_000, `${n} tasks of each type settled`);
  await w.stop();
  return { worker: new WeakRef(w), metrics: new WeakRef(w.metrics) };
}

/** Collect until every reference is cleared; the deadline is generous for a loaded machine. */
async function collected(refs: WeakRef<object>[]): Promise<void> {
  await waitFor(
    async () => {
      // A turn of the event loop between collections: a closed socket's last callbacks run.
      await new Promise((resolve) => setImmediate(resolve));
      gc();
      return refs.every((r) => r.deref() === undefined);
    },
    30_000,
    'the stopped worker and its metrics collected',
  );
}

test('a stopped worker without maintenance is collected once dropped', async () => {
  const { worker, metrics } = await runAndStop(5, false);
  await collected([worker, metrics]);
  assert.equal(worker.deref(), undefined);
});

test('a stopped worker that led maintenance is collected once dropped', async () => {
  const { worker, metrics } = await runAndStop(5, true);
  await collected([worker, metrics]);
  assert.equal(worker.deref(), undefined);
});

test('several workers started and stopped in turn are all collected', async () => {
  const refs: WeakRef<object>[] = [];
  for (let i = 0; i < 3; i++) {
    const { worker, metrics } = await runAndStop(3, i % 2 === 0);
    refs.push(worker, metrics);
  }
  await collected(refs);
});
