/**
 * Review of task type rate limits (migration 30): a database fault in the ask for a start
 * (`take_type_starts()`), and the runtime roles. Attacks that held: kept as tests so they keep
 * holding.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/type-limits-review-faults.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import { defineTask, enqueueMany, getTask, grantRuntimeRole, setTypeLimit } from '../src/index.js';
import { DATABASE_URL, freshSchema, waitFor } from './helpers.js';
import { askWaiting, holdTypeRow, reviewWorker } from './type-limits-review-support.js';

const { schema, pool } = await freshSchema('tlrvfault');
const S = `"${schema}"`;

test('held: the ask for a start killed (its backend terminated): the worker carries on, the task is handed back unstarted and runs once, on its only attempt', async () => {
  const type = 'rv_fault';
  const ran: string[] = [];
  const def = defineTask<{ i: number }>({
    type,
    queue: 'rv-fault',
    ceilingMs: 60_000,
    maxAttempts: 1,
    handler: async (_p, ctx) => {
      ran.push(ctx.id);
    },
  });
  await setTypeLimit(pool, schema, type, { limit: 100, intervalMs: 1000 }, 'review');
  const held = await holdTypeRow(S, type);
  const w = reviewWorker(schema, [def], 4);
  await w.start();
  try {
    const id = (await enqueueMany(pool, [{ type, payload: { i: 0 }, queue: 'rv-fault' }], { schema }))[0]!.id!;
    const pid = await askWaiting(pool);
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    // Handed back for a second (the start could not be asked for), its attempt refunded.
    await waitFor(
      async () => (await pool.query(`SELECT 1 FROM ${S}.deferred WHERE id = $1 AND attempts = 0`, [id])).rowCount === 1,
      20_000,
      'the task handed back unstarted',
    );
    await held.query('COMMIT');
    await waitFor(() => ran.length > 0, 20_000, 'the task run once the database answers');
    // Its completion recorded, nothing can run it again: it ran once.
    await waitFor(async () => (await getTask(pool, schema, id))?.state === 'completed', 20_000, 'the completion');
    assert.deepEqual(ran, [id], 'run once');
    // The worker carries on: a second task runs too.
    const next = (await enqueueMany(pool, [{ type, payload: { i: 1 }, queue: 'rv-fault' }], { schema }))[0]!.id!;
    await waitFor(() => ran.includes(next), 20_000, 'a second task');
  } finally {
    await held.end().catch(() => undefined);
    await w.stop();
  }
  const dead = await pool.query(`SELECT count(*)::int AS n FROM ${S}.dead_letters`);
  assert.equal(dead.rows[0].n, 0);
});

test('held: a worker role asks for starts and reads the limits; a producer cannot ask; neither can set a limit or write its tables', async () => {
  const worker = `tlrv_worker_${process.pid}`;
  const producer = `tlrv_producer_${process.pid}`;
  for (const r of [worker, producer]) {
    await pool.query(`DROP ROLE IF EXISTS ${r}`);
    await pool.query(`CREATE ROLE ${r} LOGIN`);
  }
  try {
    await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: worker, kind: 'worker' });
    await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: producer, kind: 'producer' });
    await setTypeLimit(pool, schema, 'rv_roles', { limit: 1, intervalMs: 60_000 }, 'review');
    const as = async (role: string, sql: string): Promise<string> => {
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await c.query(`SET LOCAL ROLE ${role}`);
        await c.query(sql);
        return 'ok';
      } catch (err) {
        return (err as pg.DatabaseError).code ?? 'error';
      } finally {
        await c.query('ROLLBACK');
        c.release();
      }
    };
    const take = `SELECT * FROM ${S}.take_type_starts('rv_roles', ARRAY[1]::bigint[])`;
    assert.equal(await as(worker, take), 'ok');
    assert.equal(await as(worker, `SELECT * FROM ${S}.type_limit_usage()`), 'ok');
    assert.equal(await as(worker, `SELECT type FROM ${S}.type_limits`), 'ok');
    assert.equal(await as(producer, take), '42501');
    assert.equal(await as(producer, `SELECT type FROM ${S}.type_limits`), '42501');
    for (const role of [worker, producer]) {
      assert.equal(await as(role, `SELECT ${S}.set_type_limit('rv_roles', 1000, 1000, 'me')`), '42501', role);
      assert.equal(await as(role, `SELECT ${S}.set_type_limit('rv_roles', NULL, NULL, 'me')`), '42501', role);
      assert.equal(await as(role, `UPDATE ${S}.type_limits SET rate_limit = 1000`), '42501', role);
      assert.equal(await as(role, `DELETE FROM ${S}.type_starts`), '42501', role);
      assert.equal(await as(role, `INSERT INTO ${S}.type_paced VALUES (1, 'x', now())`), '42501', role);
    }
  } finally {
    for (const r of [worker, producer]) {
      await pool.query(`DROP OWNED BY ${r}`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS ${r}`).catch(() => undefined);
    }
  }
});
