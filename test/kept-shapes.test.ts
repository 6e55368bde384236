/**
 * The engine keeps its last started handler run and its last completed execution while it runs,
 * so that V8 keeps their object shapes (and the hot path's compiled code) through a full garbage
 * collection while the worker idles (docs/architecture.md, "Compiled code that survives an idle
 * spell"). What that must not do: keep anything once the worker has stopped. An earlier version
 * kept them for the whole process, and a stopped worker's task (its payload) stayed on the heap.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import v8 from 'node:v8';
import { runInNewContext } from 'node:vm';
import { defineTask, enqueue, getTask, Worker } from '../src/index.js';
import { DATABASE_URL, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('kept_shapes');

v8.setFlagsFromString('--expose-gc');
const fullGc = runInNewContext('gc') as () => void;

test("a running worker keeps its last task's objects through a full GC; a stopped one lets them go", async () => {
  let payloadRef: WeakRef<object> | null = null;
  const def = defineTask<{ marker: string }>({
    type: 'kept_payload',
    ceilingMs: 60_000,
    handler: async (payload) => {
      payloadRef = new WeakRef(payload);
    },
  });
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 2,
    pollIntervalMs: 100,
    logger: testLogger,
    maintenance: false,
  });
  await worker.start();
  let stopped = false;
  try {
    const { id } = await enqueue(pool, 'kept_payload', { marker: 'kept' }, { schema });
    await waitFor(
      async () => (await getTask(pool, schema, id!))?.state === 'completed',
      30_000,
      'the task to complete',
    );
    // Kept since its handler started (the last handler run): it survives full collections while
    // the worker idles, where without the engine's reference the first collection after the
    // task's settlement took it (40 collections, the event loop turning between them).
    assert.ok(payloadRef !== null, 'the handler ran');
    const ref = payloadRef as WeakRef<object>;
    for (let i = 0; i < 40; i++) {
      fullGc();
      assert.notEqual(ref.deref(), undefined, `the running worker keeps its last task's payload (collection ${i + 1})`);
      await new Promise((r) => setImmediate(r));
    }

    await worker.stop();
    stopped = true;
    // Nothing keeps it now; a timer of the stopped worker may still hold its objects for a while.
    await waitFor(
      () => {
        fullGc();
        return ref.deref() === undefined;
      },
      60_000,
      "the stopped worker's last payload to be collected",
    );
  } finally {
    if (!stopped) await worker.stop();
  }
});
