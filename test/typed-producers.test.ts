import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { z } from 'zod';
import {
  BerthInputError,
  BerthMetrics,
  defineTask,
  defineTaskType,
  enqueue,
  enqueueMany,
  getTask,
  implement,
  Worker,
} from '../src/index.js';
import { DATABASE_URL, expectOutcome, FAST_MAINTENANCE, freshSchema, testLogger } from './helpers.js';

/** Issue 12, item 6: args-only definitions, their implementation, and the registry's types. */
const { schema, pool } = await freshSchema('typed_producers');
const root = fileURLToPath(new URL('..', import.meta.url));

test('the type-level tests compile: every @ts-expect-error line (wrong payload, unknown name) is an error', () => {
  // test/types/registry.ts augments the TaskRegistry, so it has a program of its own; an unused
  // expect-error directive (a wrong payload that compiled) fails tsc.
  const r = spawnSync(process.execPath, [`${root}node_modules/typescript/bin/tsc`, '-p', 'tsconfig.types.json'], {
    cwd: root,
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
});

const order = z.object({ orderId: z.string() });

test('defineTaskType checks its fields like defineTask, and names a misspelt key', () => {
  const t = defineTaskType({ type: 'send_email', schema: order, queue: 'email', maxAttempts: 4 });
  assert.deepEqual(
    { ...t, schema: t.schema === order },
    {
      type: 'send_email',
      schema: true,
      queue: 'email',
      maxAttempts: 4,
    },
  );
  assert.ok(Object.isFrozen(t));
  assert.equal('handler' in t, false, 'no handler: a producer imports it without the worker code');
  assert.throws(
    () => defineTaskType({ type: 'x', queu: 'q' } as never),
    (e: Error) =>
      e instanceof BerthInputError && /task type "x": unknown option "queu"; did you mean "queue"\?/.test(e.message),
  );
  assert.throws(() => defineTaskType({ type: 'x', maxAttempts: 0 }), /task type "x": maxAttempts must be an integer/);
  assert.throws(() => defineTaskType({ type: 'x', queue: 'q\u0000' }), /queue contains a NUL/);
  assert.throws(() => defineTaskType({ type: '' }), /task type must be a non-empty string/);
  assert.throws(
    () => implement(t, { ceilingMs: 1000, handler: async () => {}, maxAttempts: 3 } as never),
    /implement\("send_email"\): unknown option "maxAttempts"/,
  );
  assert.throws(() => implement(t, { handler: async () => {} } as never), /ceilingMs must be a number/);
});

test('enqueue by an args-only type: payload validated, routed to its queue, its attempts stamped; the enqueue’s queue wins', async () => {
  const mail = defineTaskType({ type: 'send_email', schema: order, queue: 'email', maxAttempts: 4 });
  const a = await enqueue(pool, mail, { orderId: 'a' }, { schema });
  const ta = await getTask(pool, schema, a.id!);
  assert.deepEqual([ta?.queue, ta?.maxAttempts, ta?.type], ['email', 4, 'send_email']);
  const b = await enqueue(pool, mail, { orderId: 'b' }, { schema, queue: 'urgent' });
  assert.equal((await getTask(pool, schema, b.id!))?.queue, 'urgent');
  await assert.rejects(
    enqueue(pool, mail, { orderId: 5 } as never, { schema }),
    /payload for task type "send_email" is invalid: orderId/,
  );
  const [c, d] = await enqueueMany(
    pool,
    [
      { type: mail, payload: { orderId: 'c' } },
      { type: 'plain', payload: 1 },
    ],
    { schema },
  );
  assert.equal((await getTask(pool, schema, c!.id!))?.queue, 'email');
  assert.equal((await getTask(pool, schema, d!.id!))?.queue, 'default');
  // A definition names its queue the same way.
  const def = defineTask({ type: 'routed', ceilingMs: 1000, queue: 'routed_q', handler: async () => {} });
  const e = await enqueue(pool, def, null, { schema });
  assert.equal((await getTask(pool, schema, e.id!))?.queue, 'routed_q');
  assert.throws(
    () => defineTask({ type: 'r', ceilingMs: 1, queue: 7 as never, handler: async () => {} }),
    /task "r": queue must be a string/,
  );
});

test('the worker implements an args-only type: its handler runs the payload the producer enqueued', async () => {
  const resize = defineTaskType({ type: 'resize', schema: z.object({ w: z.number() }), queue: 'images' });
  const seen: number[] = [];
  const resizeTask = implement(resize, {
    ceilingMs: 30_000,
    backoff: { baseMs: 10 },
    handler: async (p) => {
      seen.push(p.w);
    },
  });
  assert.deepEqual(
    [resizeTask.type, resizeTask.queue, resizeTask.ceilingMs, resizeTask.backoff.baseMs],
    ['resize', 'images', 30_000, 10],
  );
  assert.equal(resizeTask.schema, resize.schema);
  // Spread works too: the args-only fields are defineTask's own.
  const spread = defineTask({ ...resize, ceilingMs: 30_000, handler: async () => {} });
  assert.equal(spread.queue, 'images');

  await enqueue(pool, resize, { w: 640 }, { schema });
  const metrics = new BerthMetrics();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [resizeTask],
    queues: ['images'],
    pollIntervalMs: 100,
    logger: testLogger,
    metrics,
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: false,
  });
  await w.start();
  try {
    await expectOutcome(metrics, 'resize', 'success', 1);
  } finally {
    await w.stop();
  }
  assert.deepEqual(seen, [640]);
});
