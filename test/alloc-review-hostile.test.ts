/**
 * Review of merge b40bcc9 (the engine runs runTask's steps in its own frame): a handler that
 * throws a hostile value (a revoked Proxy, a Proxy whose every trap throws) ends as before the
 * change: a failure written, counted, never a crashed execution that leaves the lease to lapse.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueue, getTask, Worker } from '../src/index.js';
import { captureLogger, DATABASE_URL, expectOutcome, freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('alloc_review_hostile');

const trapsThrow = () =>
  new Proxy(
    {},
    {
      get() {
        throw new Error('trap');
      },
      getPrototypeOf() {
        throw new Error('trap');
      },
      has() {
        throw new Error('trap');
      },
      ownKeys() {
        throw new Error('trap');
      },
      getOwnPropertyDescriptor() {
        throw new Error('trap');
      },
    },
  );
const revoked = () => {
  const r = Proxy.revocable({}, {});
  r.revoke();
  return r.proxy;
};

for (const [name, make] of [
  ['revoked', revoked],
  ['traps', trapsThrow],
] as const) {
  test(`a handler that throws a hostile value (${name}) fails its attempt, written and counted, without observers and with`, async () => {
    for (const observed of [false, true]) {
      const type = `arh_${name}_${observed ? 'o' : 'p'}`;
      const { logger, lines } = captureLogger();
      const def = defineTask<unknown>({
        type,
        ceilingMs: 60_000,
        handler: async () => {
          throw make();
        },
      });
      const w = new Worker({
        connectionString: DATABASE_URL,
        schema,
        tasks: [def],
        queues: [type],
        logger,
        maintenance: false,
        heartbeatIntervalMs: false,
      });
      if (observed) w.events.on('task:settled', () => {});
      await w.start();
      try {
        const { id } = await enqueue(pool, type, {}, { schema, queue: type, maxAttempts: 1 });
        await expectOutcome(w.metrics, type, 'failure', 1);
        assert.equal((await getTask(pool, schema, id!))?.state, 'dead');
        assert.equal(lines.filter((l) => l.msg === 'task execution crashed').length, 0);
      } finally {
        await w.stop();
      }
    }
  });
}
