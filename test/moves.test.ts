import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { enqueue, enqueueMany, getTask, moveTask } from '../src/index.js';
import { maintainRing, readRingState, rotateRing, pruneSegment } from '../src/maintenance-api.js';
import { claim } from '../src/processor/claim.js';
import { completeLeases } from '../src/storage/complete.js';
import { claimParams } from './claim-params.js';
import { freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('moves');
const S = `"${schema}"`;

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0, rotated_at = now()`);
}
async function claimFrom(queues: string[] | null, limit: number) {
  const lanes = (
    await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE $1::text[] IS NULL OR queue = ANY($1)`, [queues])
  ).rows.map((r) => r.lane_id as number);
  return claim(pool, claimParams(schema, lanes, limit, { workerId: 'mv' }));
}
/** Other traffic: enqueue, claim and complete a few tasks on queue 'other', then rotate once. */
async function churnAndRotate(): Promise<void> {
  await enqueueMany(
    pool,
    Array.from({ length: 3 }, () => ({ type: 'o', payload: {}, queue: 'other' })),
    { schema },
  );
  await completeLeases(pool, storageFor(schema), await claimFrom(['other'], 10));
  const r = await rotateRing(pool, schema, 0);
  assert.equal(r, 'rotated');
  const st = await readRingState(pool, schema);
  // Reclaim the segment we will rotate into next, as the leader's ring branch would.
  await pruneSegment(pool, schema, (st.currentSegment + 1) % st.segmentCount, 100);
}

test('moving a pending task to another priority: getTask returns the current row, never the tombstoned one', async () => {
  await reset();
  const r = await enqueue(pool, 'm', { v: 1 }, { schema, priority: 5 });
  assert.equal(await moveTask(pool, schema, r.id!, { priority: -1 }), 'moved');
  const t = await getTask(pool, schema, r.id!);
  assert.equal(t?.priority, -1);
  assert.equal(t?.state, 'ready');
  const ready = await pool.query(`SELECT count(*) FROM ${S}.ready WHERE id = $1`, [r.id]);
  assert.equal(ready.rows[0].count, '2', 'append-only: the old entry stays, tombstoned');
  const [got] = await claimFrom(null, 5);
  assert.equal(got?.id, r.id);
  assert.equal(got?.priority, -1, 'the claim takes the moved entry, not the tombstoned one');
  assert.equal((await claimFrom(null, 5)).length, 0);
});

test('moves across a ring wrap (priority, then queue): getTask follows the newest entry', async () => {
  await reset();
  const r = await enqueue(pool, 'm', { v: 1 }, { schema, queue: 'src', priority: 3 });
  for (let i = 0; i < 14; i++) await churnAndRotate();
  assert.equal((await readRingState(pool, schema)).currentSegment, 14);
  assert.equal(await moveTask(pool, schema, r.id!, { priority: 7 }), 'moved');
  // The source segment 0 holds only the tombstoned entry now: prunable.
  assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'pruned' });
  for (let i = 0; i < 3; i++) await churnAndRotate(); // 14 -> 15 -> 0 -> 1: the segment numbers wrap
  assert.equal((await readRingState(pool, schema)).currentSegment, 1);
  assert.equal((await getTask(pool, schema, r.id!))?.priority, 7);
  assert.equal(await moveTask(pool, schema, r.id!, { queue: 'dst' }), 'moved');
  const t = await getTask(pool, schema, r.id!);
  assert.equal(t?.queue, 'dst', 'the entry in segment 1 is newer than the one in segment 14');
  assert.equal(t?.priority, 7);
  assert.deepEqual(t?.payload, { v: 1 });
  await maintainRing(pool, schema, { rotateAfterMs: 60_000, lockTimeoutMs: 100 });
  assert.equal((await getTask(pool, schema, r.id!))?.queue, 'dst', 'still, after pruning what can be pruned');
  const got = await claimFrom(['src', 'dst'], 5);
  assert.deepEqual(
    got.map((g) => [g.id, g.queue]),
    [[r.id, 'dst']],
  );
});

test('a scheduled task is moved in deferred storage; a leased one is not moved', async () => {
  await reset();
  const later = await enqueue(pool, 'm', {}, { schema, delay: 3600_000 });
  assert.equal(await moveTask(pool, schema, later.id!, { queue: 'elsewhere', priority: 2 }), 'moved');
  const t = await getTask(pool, schema, later.id!);
  assert.equal(t?.state, 'scheduled');
  assert.equal(t?.queue, 'elsewhere');
  const now = await enqueue(pool, 'm', {}, { schema, queue: 'busy' });
  await claimFrom(['busy'], 1);
  assert.equal(await moveTask(pool, schema, now.id!, { queue: 'x' }), 'leased');
  assert.equal(await moveTask(pool, schema, '999999999', { queue: 'x' }), 'not_found');
  await assert.rejects(moveTask(pool, schema, later.id!, { priority: 1e6 }), /priority/);
});

test('moves and empty-token dequeues refuse to run above READ COMMITTED (they could miss a lease taken meanwhile)', async () => {
  await reset();
  const { dequeue, BerthInputError } = await import('../src/index.js');
  const r = await enqueue(pool, 'm', {}, { schema });
  const c = await pool.connect();
  try {
    await c.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await assert.rejects(moveTask(c, schema, r.id!, { priority: 1 }), BerthInputError);
    await c.query('ROLLBACK');
    await c.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
    await assert.rejects(dequeue(c, schema, r.id!, ''), /READ COMMITTED/);
    await c.query('ROLLBACK');
  } finally {
    c.release();
  }
  assert.equal((await getTask(pool, schema, r.id!))?.state, 'ready', 'nothing changed');
});
