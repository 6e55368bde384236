/**
 * Adversarial review of the third allocation round (09eef4a..e47ae38): what a handler's context
 * shows when it is inspected (`console.log(ctx)`, `console.dir(ctx, { depth })`, a debugger's
 * view). On main its only hidden part was the run's abort (`[Symbol(berth.runAbort)]: RunAbort`);
 * here an own enumerable symbol holds the whole HandlerRun (its deps, the write pool, the engine).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { defineTask, enqueue, Worker } from '../src/index.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('ctx_inspect_review');

/** DATABASE_URL with a password in it (the test server trusts every local connection, so it is ignored). */
function withPassword(url: string, password: string): string {
  const u = new URL(url);
  u.password = password;
  return u.toString();
}

test('inspecting a handler’s context (console.dir depth 6) does not print the worker’s database password', async () => {
  const secret = 'rev1ewS3cretPW';
  const shown: string[] = [];
  const def = defineTask<Record<string, never>>({
    type: 'ctx_inspect',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      shown.push(inspect(ctx), inspect(ctx, { depth: 6 }));
    },
  });
  const w = new Worker({
    connectionString: withPassword(DATABASE_URL, secret),
    schema,
    tasks: [def],
    logger: testLogger,
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: false,
    pollIntervalMs: 100,
  });
  await w.start();
  try {
    await enqueue(pool, def, {}, { schema });
    await waitFor(() => shown.length === 2, 20_000, 'the handler to run');
  } finally {
    await w.stop();
  }
  // On main: neither shows it (the context held a RunAbort, not the engine's deps).
  assert.equal(shown[0]!.includes(secret), false, 'default depth');
  assert.equal(shown[1]!.includes(secret), false, 'depth 6');
});
