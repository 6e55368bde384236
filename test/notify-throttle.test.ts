/**
 * A flood of wake notifications costs a bounded number of claims (src/processor/notify-throttle.ts):
 * the throttle's rule without a database, and a worker under a flood of forged notices from a
 * role with no berth privileges, against a real database.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueue, getTask, Worker } from '../src/index.js';
import { NotifyThrottle } from '../src/processor/notify-throttle.js';
import { wakeChannel } from '../src/sql.js';
import { counterValue, captureLogger, DATABASE_URL, freshSchema, waitFor } from './helpers.js';

test('empty woken fetches draw on a budget of 20 a second; past it a woken fetch waits for it to refill; a woken fetch that finds work pays for two', () => {
  const t = new NotifyThrottle();
  let now = 1000;
  assert.equal(t.waitMs(now), 0);
  for (let i = 0; i < 20; i++) {
    assert.equal(t.waitMs(now), 0, `empty fetch ${i + 1} of the second's budget runs at once`);
    t.fetched(true, false, now);
  }
  assert.equal(t.waitMs(now), 50, 'the budget spent: one more after 1/20 s');
  now += 50;
  assert.equal(t.waitMs(now), 0);
  t.fetched(true, false, now);
  assert.equal(t.waitMs(now), 50);
  // Fetches the poll or a free slot woke cost nothing; a woken fetch that found work gives two back.
  for (let i = 0; i < 100; i++) t.fetched(false, false, now);
  assert.equal(t.waitMs(now), 50);
  t.fetched(true, true, now);
  assert.equal(t.waitMs(now), 0, 'a win pays for two losses');
  t.fetched(true, false, now);
  t.fetched(true, false, now);
  assert.equal(t.waitMs(now), 50);
  // A quiet second refills it.
  now += 1000;
  assert.equal(t.waitMs(now), 0);
});

test('a flood of forged wake notices from a role with no berth privileges costs a bounded number of claims, and real work still runs', async () => {
  const { schema, pool } = await freshSchema('notify_flood');
  const forger = `t_flooder_${process.pid}`;
  await pool.query(`DROP ROLE IF EXISTS "${forger}"`);
  await pool.query(`CREATE ROLE "${forger}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  const def = defineTask({ type: 'flood_t', ceilingMs: 60_000, handler: async () => {} });
  // Eight lanes that exist and hold nothing: what the notices name.
  for (let shard = 0; shard < 8; shard++)
    await pool.query(`SELECT "${schema}".provision_lane('flood_t', 0::smallint, $1::smallint)`, [shard]);
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    queues: [def.type],
    slots: 4,
    logger: captureLogger().logger,
    maintenance: false,
    heartbeatIntervalMs: false,
    pollIntervalMs: 60_000,
  });
  await w.start();
  const url = new URL(DATABASE_URL);
  url.username = forger;
  const attacker = new pg.Client({ connectionString: url.toString() });
  await attacker.connect();
  try {
    const claims = () => counterValue(w.metrics, 'berth_claims_total', {});
    const before = await claims();
    const began = Date.now();
    let rounds = 0;
    // Every lane of the schema named, one transaction after another, for 3 s.
    while (Date.now() - began < 3000) {
      await attacker.query(`SELECT count(pg_notify($1, l::text)) FROM generate_series(1, 20) l`, [wakeChannel(schema)]);
      rounds++;
    }
    const elapsedS = (Date.now() - began) / 1000;
    // Notices still queued for the worker are read within a moment: count what they cost too.
    await new Promise((r) => setTimeout(r, 500));
    const spent = (await claims()) - before;
    assert.ok(rounds > 100, `the flood ran (${rounds} rounds)`);
    // At most 20 empty woken fetches a second (and one second's budget at the start), each at
    // most a claim of the notified lanes, a discovery and a claim of what it found: a bound, not
    // a timing (a slower machine claims less).
    const bound = Math.ceil((elapsedS + 0.5 + 1) * 20 * 2) + 4;
    assert.ok(
      spent <= bound,
      `${spent} claims during a ${elapsedS.toFixed(1)} s flood of ${rounds} rounds (at most ${bound})`,
    );
    // Real work still runs.
    const { id } = await enqueue(pool, def.type, {}, { schema, queue: def.type });
    await waitFor(async () => (await getTask(pool, schema, id!))?.state === 'completed', 30_000, 'the real task');
  } finally {
    await attacker.end();
    await w.stop();
    await pool.query(`DROP ROLE IF EXISTS "${forger}"`);
  }
});
