/**
 * Review of task dependencies (migration 31), invariant G: roles. A producer role enqueues graphs
 * (and reads a task's parents and dependents) but releases nothing and writes no edge or counter
 * itself; a worker role releases through release_completed only (which checks what it is given)
 * and writes no edge or counter itself; PUBLIC can execute nothing of the schema.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { enqueueMany, grantRuntimeRole } from '../src/index.js';
import { DATABASE_URL, freshSchema, urlAs } from './helpers.js';
import { enqueueGraphSql, graph, graphTask, stateOf } from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_roles');
const S = `"${schema}"`;
const producer = `drev_p_${process.pid}`;
const worker = `drev_w_${process.pid}`;
const outsider = `drev_x_${process.pid}`;
const admin = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
for (const r of [producer, worker, outsider]) {
  await admin.query(`DROP ROLE IF EXISTS "${r}"`);
  await admin.query(`CREATE ROLE "${r}" LOGIN`);
}
await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: producer, kind: 'producer' });
await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: worker, kind: 'worker' });
const asProducer = new pg.Pool({ connectionString: urlAs(producer), max: 2 });
const asWorker = new pg.Pool({ connectionString: urlAs(worker), max: 2 });
after(async () => {
  await asProducer.end();
  await asWorker.end();
  await pool.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`).catch(() => undefined);
  for (const r of [producer, worker, outsider]) {
    await admin.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS "${r}"`).catch(() => undefined);
  }
  await admin.end();
});

const denied = (e: { code?: string }) => e.code === '42501';

test('a producer role enqueues a graph and reads its edges, but releases nothing and writes no edge itself', async () => {
  const [earlier] = await graph(pool, schema, [{ name: 'earlier', queue: 'r-q' }]);
  const res = await enqueueMany(
    asProducer,
    [
      { type: 'dr', payload: {}, queue: 'r-q', ref: 'a' },
      { type: 'dr', payload: {}, queue: 'r-q', dependsOn: [{ ref: 'a' }, earlier!] },
    ],
    { schema },
  );
  assert.deepEqual(
    res.map((r) => r.state),
    ['ready', 'waiting'],
  );
  const child = res[1]!.id!;
  assert.equal((await asProducer.query(`SELECT count(*)::int AS n FROM ${S}.task_parents($1)`, [child])).rows[0].n, 2);
  for (const sql of [
    `SELECT ${S}.release_completed(ARRAY[${res[0]!.id}]::bigint[])`,
    `SELECT * FROM ${S}.deps_tick(true, NULL, 10)`,
    `SELECT ${S}.watch_parents(ARRAY[1]::bigint[])`,
    `SELECT ${S}.free_waiting(ARRAY[${child}]::bigint[])`,
    `SELECT ${S}.append_from_deferred(ARRAY[${child}]::bigint[], false)`,
    `SELECT ${S}.prune_dep_edges(10)`,
    `SELECT ${S}.task_fate(1)`,
    `SELECT ${S}.count_completions(ARRAY[1]::bigint[])`,
    `SELECT ${S}.lane_lock_key('q', 0, 0)`,
    `INSERT INTO ${S}.task_deps (parent_id, child_id, parent_type) VALUES (1, ${child}, 'x')`,
    `UPDATE ${S}.task_deps SET satisfied_at = now() WHERE child_id = ${child}`,
    `UPDATE ${S}.task_waits SET pending = 0 WHERE id = ${child}`,
    `DELETE FROM ${S}.task_waits WHERE id = ${child}`,
  ]) {
    await assert.rejects(asProducer.query(sql), denied, sql);
  }
  // Called directly with an edge that points forwards: refused, nothing written.
  const task = graphTask('x', 'r-q');
  await assert.rejects(
    enqueueGraphSql(asProducer, schema, [task, task], [[0, 1, null]]),
    (e: { code?: string }) => e.code === '22023',
  );
  assert.equal(await stateOf(pool, schema, child), 'waiting');
});

test('a worker role writes no edge or counter itself; the definer functions it is not granted refuse it', async () => {
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue: 'r-w', ref: 'p' },
    { name: 'c', queue: 'r-w', dependsOn: [{ ref: 'p' }] },
  ]);
  for (const sql of [
    `INSERT INTO ${S}.task_deps (parent_id, child_id, parent_type) VALUES (1, ${c}, 'x')`,
    `UPDATE ${S}.task_deps SET satisfied_at = now() WHERE child_id = ${c}`,
    `DELETE FROM ${S}.task_deps WHERE child_id = ${c}`,
    `UPDATE ${S}.task_waits SET pending = 0 WHERE id = ${c}`,
    `DELETE FROM ${S}.task_waits WHERE id = ${c}`,
    `INSERT INTO ${S}.task_waits (id, pending, on_parent_failure) VALUES (1, 0, 'cancel')`,
    `UPDATE ${S}.deferred SET state = 'scheduled', run_at = now() WHERE id = ${c}`,
    `SELECT ${S}.free_waiting(ARRAY[${c}]::bigint[])`,
    `SELECT ${S}.append_from_deferred(ARRAY[${c}]::bigint[], true)`,
    `SELECT ${S}.task_fate(${p})`,
    `SELECT ${S}.count_completions(ARRAY[${p}]::bigint[])`,
  ]) {
    await assert.rejects(asWorker.query(sql), denied, sql);
  }
  assert.equal((await asWorker.query(`SELECT ${S}.release_completed(ARRAY[${p}]::bigint[]) AS n`)).rows[0].n, 0);
  assert.equal(await stateOf(pool, schema, c!), 'waiting');
});

test('PUBLIC (a role with no grant) can execute no function of the schema, the new ones included', async () => {
  const open = await pool.query<{ fn: string }>(
    `SELECT p.oid::regprocedure::text AS fn FROM pg_proc p
      WHERE p.pronamespace = $1::regnamespace
        AND (has_function_privilege('public', p.oid, 'EXECUTE') OR has_function_privilege($2, p.oid, 'EXECUTE'))
      ORDER BY 1`,
    [schema, outsider],
  );
  assert.deepEqual(
    open.rows.map((r) => r.fn),
    [],
  );
});
