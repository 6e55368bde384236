import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { z } from 'zod';
import { enqueue, enqueueMany, defineTask, getTask, BerthInputError } from '../src/index.js';
import { wakeChannel } from '../src/sql.js';
import { DATABASE_URL, freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('enqueue');

async function listen(): Promise<{ count: () => number; close: () => Promise<void> }> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  let n = 0;
  c.on('notification', () => n++);
  await c.query(`LISTEN "${wakeChannel(schema)}"`);
  return { count: () => n, close: () => c.end() };
}

async function taskCount(): Promise<number> {
  const r = await pool.query(
    `SELECT (SELECT count(*) FROM "${schema}".ready) + (SELECT count(*) FROM "${schema}".deferred) AS n`,
  );
  return Number(r.rows[0].n);
}

test('rollback leaves no task and no wake', async () => {
  const l = await listen();
  const before = await taskCount();
  const c = await pool.connect();
  await c.query('BEGIN');
  await enqueue(c, 'cleanup', { prefix: 'a/' }, { schema });
  await c.query('ROLLBACK');
  c.release();
  // A committed enqueue afterwards proves the listener was live; only that one may arrive.
  await enqueue(pool, 'marker', {}, { schema });
  await waitFor(() => l.count() >= 1, 5000, 'marker wake');
  assert.equal(l.count(), 1);
  assert.equal(await taskCount(), before + 1);
  await l.close();
});

test('commit wakes a listener', async () => {
  const l = await listen();
  const c = await pool.connect();
  await c.query('BEGIN');
  const r = await enqueue(c, 'cleanup', { prefix: 'b/' }, { schema });
  assert.equal(l.count(), 0);
  await c.query('COMMIT');
  c.release();
  await waitFor(() => l.count() === 1, 5000, 'wake on commit');
  assert.equal(r.state, 'ready');
  assert.ok(r.id);
  await l.close();
});

test('a 1,000-task batch in one transaction costs one notification', async () => {
  const l = await listen();
  const c = await pool.connect();
  await c.query('BEGIN');
  const tasks = Array.from({ length: 1000 }, (_, i) => ({ type: 'bulk', payload: { i } }));
  const results = await enqueueMany(c, tasks, { schema });
  // Several statements in the same transaction still collapse into one delivery.
  await enqueue(c, 'bulk', { i: 1000 }, { schema });
  await c.query('COMMIT');
  c.release();
  assert.equal(results.length, 1000);
  assert.ok(results.every((r) => r.state === 'ready' && r.id));
  await enqueue(pool, 'marker', {}, { schema });
  await waitFor(() => l.count() >= 2, 5000, 'two wakes');
  assert.equal(l.count(), 2);
  await l.close();
});

test('a duplicate dedupe key is reported, not raised', async () => {
  const first = await enqueue(pool, 'audit', { org: 1 }, { schema, dedupeKey: 'audit:1' });
  const second = await enqueue(pool, 'audit', { org: 1 }, { schema, dedupeKey: 'audit:1' });
  assert.equal(first.state, 'ready');
  assert.equal(second.state, 'duplicate');
  assert.equal(second.id, null);
  assert.equal(second.duplicateOf, first.id);
  const inBatch = await enqueueMany(
    pool,
    [
      { type: 'audit', payload: {}, dedupeKey: 'audit:2' },
      { type: 'audit', payload: {}, dedupeKey: 'audit:2' },
    ],
    { schema },
  );
  assert.equal(inBatch[0]!.state, 'ready');
  assert.deepEqual(inBatch[1], { id: null, state: 'duplicate', duplicateOf: inBatch[0]!.id });
});

test('concurrent transactions with one dedupe key: the second is reported duplicate after the first commits', async () => {
  const a = await pool.connect();
  const b = await pool.connect();
  await a.query('BEGIN');
  await b.query('BEGIN');
  const ra = await enqueue(a, 'audit', {}, { schema, dedupeKey: 'audit:race' });
  const pb = enqueue(b, 'audit', {}, { schema, dedupeKey: 'audit:race' });
  await a.query('COMMIT');
  const rb = await pb;
  await b.query('COMMIT');
  a.release();
  b.release();
  assert.equal(ra.state, 'ready');
  assert.equal(rb.state, 'duplicate');
});

test('a dead letter never suppresses a new enqueue with its key', async () => {
  const r = await enqueue(pool, 'audit', {}, { schema, dedupeKey: 'audit:dead' });
  // Retire the task to the dead letters the way the processor does (key released).
  await pool.query(
    `WITH t AS (SELECT * FROM "${schema}".ready WHERE id = $1)
     INSERT INTO "${schema}".dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts,
       dedupe_key, last_error, created_at, last_attempted_at)
     SELECT id, type, payload, queue, priority, shard, 20, 20, dedupe_key, 'boom', created_at, now() FROM t`,
    [r.id],
  );
  await pool.query(`INSERT INTO "${schema}".tombstones (slot, lane_id, lane_seq, id, reason)
                    SELECT slot, lane_id, lane_seq, id, 'test' FROM "${schema}".ready WHERE id = $1`, [r.id]);
  await pool.query(`DELETE FROM "${schema}".dedupe WHERE id = $1`, [r.id]);
  const again = await enqueue(pool, 'audit', {}, { schema, dedupeKey: 'audit:dead' });
  assert.equal(again.state, 'ready');
});

test('runAt and delay in the future go to deferred storage as scheduled', async () => {
  const a = await enqueue(pool, 'later', {}, { schema, runAt: new Date(Date.now() + 3600_000) });
  const b = await enqueue(pool, 'later', {}, { schema, delay: 60_000 });
  assert.equal(a.state, 'scheduled');
  assert.equal(b.state, 'scheduled');
  const t = await getTask(pool, schema, b.id!);
  assert.equal(t?.state, 'scheduled');
  assert.ok(t!.runAt!.getTime() > Date.now() + 30_000);
});

test('one transaction\'s entries share a lane and take lane sequence numbers in order', async () => {
  const c = await pool.connect();
  await c.query('BEGIN');
  const rs = await enqueueMany(c, Array.from({ length: 50 }, (_, i) => ({ type: 'ordered', payload: { i } })), { schema });
  await c.query('COMMIT');
  c.release();
  const rows = await pool.query(
    `SELECT lane_id, lane_seq, (payload->>'i')::int AS i FROM "${schema}".ready WHERE id = ANY($1::bigint[]) ORDER BY lane_seq`,
    [rs.map((r) => r.id)],
  );
  assert.equal(new Set(rows.rows.map((r) => r.lane_id)).size, 1);
  assert.deepEqual(rows.rows.map((r) => r.i), Array.from({ length: 50 }, (_, i) => i));
});

test('bad input gets a clear error and writes nothing', async () => {
  const before = await taskCount();
  await assert.rejects(enqueue(pool, '', {}, { schema }), BerthInputError);
  await assert.rejects(enqueue(pool, 'x', { n: 1n }, { schema }), /not JSON-serialisable/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, priority: 1.5 }), /priority/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, priority: 40000 }), /priority/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, shard: 64 }), /shard/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, runAt: new Date('nope') }), /runAt/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, delay: -1 }), /delay/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, maxAttempts: 0 }), /maxAttempts/);
  const def = defineTask({ type: 'typed', ceiling: 1000, handler: async () => {}, schema: z.object({ org: z.number() }) });
  await assert.rejects(enqueue(pool, def, { org: 'nope' } as never, { schema }), /payload for task type "typed" is invalid: org/);
  // A batch with one bad task writes none of them.
  await assert.rejects(
    enqueueMany(pool, [{ type: 'ok', payload: {} }, { type: 'ok', payload: {}, queue: 5 as never }], { schema }),
    /queue/,
  );
  assert.equal(await taskCount(), before);
  const ok = await enqueue(pool, def, { org: 7 }, { schema });
  assert.equal(ok.state, 'ready');
});

test('queue and priority are stored on the task', async () => {
  const r = await enqueue(pool, 'x', { a: 1 }, { schema, queue: 'mail', priority: -5 });
  const t = await getTask(pool, schema, r.id!);
  assert.equal(t?.queue, 'mail');
  assert.equal(t?.priority, -5);
  assert.equal(t?.state, 'ready');
  assert.deepEqual(t?.payload, { a: 1 });
});

test('a producer holds its lane lock until commit, so a lane\'s entries become visible in sequence order', async () => {
  const a = await pool.connect();
  const b = await pool.connect();
  try {
    await enqueue(pool, 'lane_order', { who: 'first' }, { schema, queue: 'ordered', shard: 5 }); // the lane exists
    await a.query('BEGIN');
    await b.query('BEGIN');
    const ra = await enqueue(a, 'lane_order', { who: 'a' }, { schema, queue: 'ordered', shard: 5 });
    const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    const pb = enqueue(b, 'lane_order', { who: 'b' }, { schema, queue: 'ordered', shard: 5 });
    // B waits on the lane lock A still holds (not on anything else).
    await waitFor(async () => (await pool.query(
      `SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted`, [bPid])).rowCount === 1, 20_000, 'B to wait on the lane lock');
    await a.query('COMMIT');
    const rb = await pb;
    await b.query('COMMIT');
    const seqs = await pool.query(`SELECT id::text, lane_seq FROM "${schema}".ready WHERE id = ANY($1::bigint[]) ORDER BY lane_seq`, [[ra.id, rb.id]]);
    assert.deepEqual(seqs.rows.map((r) => r.id), [ra.id, rb.id]);
  } finally {
    a.release();
    b.release();
  }
});

test('two batches mixing pinned and default shards take lane locks in one order: no deadlock', async () => {
  for (let sh = 0; sh < 16; sh++) await pool.query(`SELECT "${schema}".provision_lane('mixed', 0::smallint, $1::smallint)`, [sh]);
  const c1 = await pool.connect();
  const c2 = await pool.connect();
  try {
    await c1.query('BEGIN');
    await c2.query('BEGIN');
    const a = Number((await c1.query('SELECT txid_current() AS t')).rows[0].t) % 16;
    const b = Number((await c2.query('SELECT txid_current() AS t')).rows[0].t) % 16;
    // Each pins the shard the other one's default resolves to: opposite orders without the fix.
    const run = async (c: typeof c1, pinned: number) => {
      await enqueueMany(c, [{ type: 'x', payload: 1, queue: 'mixed', shard: pinned }, { type: 'x', payload: 2, queue: 'mixed' }], { schema });
      await c.query('COMMIT');
      return 'ok';
    };
    const results = await Promise.allSettled([run(c1, b), run(c2, a)]);
    assert.deepEqual(results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as Error).message)), ['ok', 'ok']);
  } finally {
    await c1.query('ROLLBACK').catch(() => undefined);
    await c2.query('ROLLBACK').catch(() => undefined);
    c1.release();
    c2.release();
  }
});
