/**
 * Review of concurrency keys (migration 29): the lane locks promote_held takes. It appends each
 * admitted task through append_ready, which takes its lane's advisory lock and keeps it to the
 * end of the transaction; one call admits into many lanes, one key after another. A producer
 * holds a lane's lock until it commits.
 *
 * The review found that a release or a tick waiting for one busy lane kept the lanes it had
 * admitted into locked, and could deadlock with a producer. Since, promote_held tries every lane
 * lock and skips a key whose lane is busy: these tests pin that it never waits.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { enqueue } from '../src/index.js';
import { releaseKeys } from '../src/storage/keys.js';
import { storageFor } from '../src/storage/storage.js';
import { DATABASE_URL, freshSchema, holdLaneLock } from './helpers.js';
import { enqueueKeyed, promoteHeldSql, settle, where, WORKER_SESSION } from './keys-review-support.js';

const { schema, pool } = await freshSchema('krev_locks');
const S = `"${schema}"`;
// The worker's own pool: KeyReleaser sends release_keys on it, with no lock_timeout.
const workerPool = new pg.Pool({ connectionString: DATABASE_URL, max: 2, options: WORKER_SESSION });
after(() => workerPool.end());

async function laneOf(queue: string, shard = 0): Promise<number> {
  return (await pool.query(`SELECT ${S}.provision_lane($1, 0::smallint, $2::smallint) AS id`, [queue, shard])).rows[0]
    .id;
}

/**
 * Keys A (older) and B, each with a task admitted and settled and one held: A's next task in
 * lane `qa`, B's in `qb`. A release of both admits A's into qa, then B's into qb.
 */
async function twoKeys(a: string, b: string): Promise<{ settled: string[]; nextA: string; nextB: string }> {
  const [a0] = await enqueueKeyed(pool, S, [a], { queue: `q${a}` });
  const [b0] = await enqueueKeyed(pool, S, [b], { queue: `q${b}` });
  await promoteHeldSql(pool, S, [a, b]);
  const [a1] = await enqueueKeyed(pool, S, [a], { queue: `q${a}` });
  await new Promise((r) => setTimeout(r, 20));
  const [b1] = await enqueueKeyed(pool, S, [b], { queue: `q${b}` });
  await settle(pool, S, [a0!.id!, b0!.id!]);
  return { settled: [a0!.id!, b0!.id!], nextA: a1!.id!, nextB: b1!.id! };
}

test("regression (review 5): a release never waits for a producer's lane: it admits what it can and skips the busy lane's key", async () => {
  const { settled, nextA, nextB } = await twoKeys('A', 'B');
  const laneB = await laneOf('qB');
  // A producer's long transaction holds lane qB (it enqueued there and has not committed).
  const commitProducer = await holdLaneLock(schema, laneB);
  const releaser = await workerPool.connect();
  try {
    // Returns while the producer still holds qB: A admitted, B's key skipped for now.
    assert.equal(await releaseKeys(releaser, storageFor(schema), settled), 1);
    assert.equal(await where(pool, S, nextA), 'ready');
    assert.equal(await where(pool, S, nextB), 'held');
    // An ordinary producer on lane qA is not held up by the release (it committed).
    await enqueue(pool, 'plain', {}, { schema, queue: 'qA', shard: 0 });
  } finally {
    await commitProducer();
    releaser.release();
  }
  // The lane free again: the next call (the leader's tick) admits B's task.
  assert.equal(await promoteHeldSql(pool, S, ['B']), 1);
  assert.equal(await where(pool, S, nextB), 'ready');
});

test('regression (review 5): a producer writing to two lanes and a release admitting into both do not deadlock', async () => {
  const { settled, nextA, nextB } = await twoKeys('E', 'F');
  const producer = await pool.connect();
  const releaser = await workerPool.connect();
  try {
    await producer.query('BEGIN');
    await enqueue(producer, 'plain', {}, { schema, queue: 'qF', shard: 0 });
    // The release meets lane qF held: it skips F's key instead of waiting (no lock cycle).
    const released = await releaseKeys(releaser, storageFor(schema), settled);
    await enqueue(producer, 'plain', {}, { schema, queue: 'qE', shard: 0 });
    await producer.query('COMMIT');
    assert.equal(released, 1);
    assert.equal(await where(pool, S, nextA), 'ready');
    assert.equal(await promoteHeldSql(pool, S, ['F']), 1);
    assert.equal(await where(pool, S, nextB), 'ready');
  } finally {
    await producer.query('ROLLBACK').catch(() => undefined);
    producer.release();
    releaser.release();
  }
});
