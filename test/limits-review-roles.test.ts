/**
 * Review of the limited claim (commit 700b9a2, migration 28): what the runtime roles can do to
 * queue limits, and a fault in the middle of a limited claim. A test that fails here
 * demonstrates a finding (the review report lists them); a test that passes is an attack that
 * held.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/limits-review-roles.test.ts
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { clearQueueLimit, defineTask, enqueueMany, grantRuntimeRole, setQueueLimit, Worker } from '../src/index.js';
import { claimBatch } from '../src/processor/claim.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, scaled, testLogger, urlAs, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('lrevrole');
const S = `"${schema}"`;
const workerRole = `berth_lrev_w_${process.pid}`;
const producerRole = `berth_lrev_p_${process.pid}`;
for (const r of [workerRole, producerRole]) {
  await pool.query(`DROP ROLE IF EXISTS "${r}"`);
  await pool.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
}
await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: workerRole, kind: 'worker' });
await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: producerRole, kind: 'producer' });
const asWorker = new pg.Pool({ connectionString: urlAs(workerRole), max: 3 });
const asProducer = new pg.Pool({ connectionString: urlAs(producerRole), max: 2 });
after(async () => {
  await asWorker.end();
  await asProducer.end();
  await pool.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`).catch(() => undefined);
  for (const r of [workerRole, producerRole]) {
    await pool.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
    await pool.query(`DROP ROLE IF EXISTS "${r}"`).catch(() => undefined);
  }
});

async function enqueueTo(queue: string, n: number): Promise<void> {
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 'rr_work', payload: { i }, queue })),
    { schema },
  );
}

async function denied(db: pg.Pool, sql: string): Promise<void> {
  await assert.rejects(db.query(sql), (err: { code?: string }) => err.code === '42501', sql);
}

test('held: neither runtime role sets a limit or writes the limit tables; a producer calls none of the limited claim', async () => {
  await enqueueTo('guarded', 1);
  for (const db of [asWorker, asProducer]) {
    await denied(db, `SELECT ${S}.set_queue_limit('guarded', 1, NULL, NULL, 'me', false, false)`);
    await denied(db, `INSERT INTO ${S}.queue_limits (queue, max_running, updated_by) VALUES ('guarded', 1, 'me')`);
    await denied(db, `DELETE FROM ${S}.limit_holders`);
    await denied(db, `DELETE FROM ${S}.limit_starts`);
    await denied(db, `UPDATE ${S}.lanes SET limited = false`);
  }
  await denied(asProducer, `SELECT * FROM ${S}.limit_capacity('guarded', 1)`);
  await denied(asProducer, `SELECT ${S}.hold_leases('guarded', '{}', '{}', '{}')`);
});

test("regression (review 9): a worker role's hold_leases with another queue's lease (or one lease again and again) uses up a rate-limited queue's starts", async () => {
  await enqueueTo('rated', 1);
  await setQueueLimit(pool, schema, 'rated', { rate: { limit: 5, intervalMs: 3_600_000 } }, 'review');
  // A lease of another, ordinary queue: 5 tasks.
  await enqueueTo('elsewhere', 5);
  const lanes = (await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = 'elsewhere'`)).rows.map(
    (r) => r.lane_id as number,
  );
  const [t] = (await claimBatch(pool, claimParams(schema, lanes, 5, { queues: ['elsewhere'] }))).tasks;
  // As the worker role: record that lease as a start of `rated` (hold_leases checks the lane's
  // queue for the holder, not for the start).
  await asWorker.query(`SELECT ${S}.hold_leases('rated', $1::smallint[], $2::integer[], $3::bigint[])`, [
    [t!.segment],
    [t!.laneId],
    [t!.leaseFrom],
  ]);
  const c = await asWorker.connect();
  try {
    await c.query('BEGIN');
    const r = await c.query<{ free: number }>(`SELECT free FROM ${S}.limit_capacity('rated', 5)`);
    await c.query('ROLLBACK');
    assert.equal(r.rows[0]!.free, 5, 'the queue started nothing, yet its rate is used up for an hour');
  } finally {
    c.release();
  }
});

test("regression (review 8b): a worker role holding limit_capacity in an open transaction blocks the operator's clearQueueLimit (no lock timeout)", async () => {
  await enqueueTo('stuck', 1);
  await setQueueLimit(pool, schema, 'stuck', { maxRunning: 2 }, 'review');
  const holder = await asWorker.connect();
  await holder.query('BEGIN');
  await holder.query(`SELECT * FROM ${S}.limit_capacity('stuck', 1)`);
  let done = false;
  let returnedWhileHeld = false;
  const clearing = clearQueueLimit(pool, schema, 'stuck', 'review').then(
    () => {
      done = true;
    },
    (err: Error) => {
      // Refused after its lock timeout, with a message that says why and changes nothing.
      assert.match(err.message, /held by a claim that has not finished/);
      done = true;
    },
  );
  try {
    const deadline = Date.now() + scaled(3_000);
    while (!done && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    returnedWhileHeld = done;
  } finally {
    await holder.query('ROLLBACK');
    holder.release();
    await clearing;
  }
  assert.ok(
    returnedWhileHeld,
    "the operator's clear returned (or failed with a lock timeout) while a worker held the row",
  );
});

test("held: the fetcher's backend killed while the limit row is held elsewhere: the worker recovers and claims", async () => {
  await enqueueTo('killed', 2);
  await setQueueLimit(pool, schema, 'killed', { maxRunning: 5 }, 'review');
  let ran = 0;
  const def = defineTask<{ i: number }>({
    type: 'rr_work',
    queue: 'killed',
    ceilingMs: 60_000,
    handler: async () => {
      ran++;
    },
  });
  // Hold the limit row: the worker's limited claim finds it locked (SKIP LOCKED) and looks again shortly.
  const holder = await pool.connect();
  await holder.query('BEGIN');
  await holder.query(`SELECT * FROM ${S}.limit_capacity('killed', 1)`);
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 4,
    pollIntervalMs: 500,
    logger: testLogger,
    maintenance: FAST_MAINTENANCE,
  });
  await w.start();
  try {
    const waiting = async () =>
      (
        await pool.query<{ pid: number }>(
          `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
              AND query LIKE '%limit_capacity%' AND application_name LIKE 'berth worker%'`,
        )
      ).rows[0]?.pid;
    const pid = await waitFor(waiting, 20_000, "the worker's limited claim to ask for capacity");
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await holder.query('ROLLBACK');
    await waitFor(() => ran === 2, 30_000, 'both tasks after the kill');
  } finally {
    await holder.query('ROLLBACK').catch(() => undefined);
    holder.release();
    await w.stop();
  }
});
