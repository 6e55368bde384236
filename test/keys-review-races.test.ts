/**
 * Review of concurrency keys (migration 29): races between the paths that hold a keyed task
 * (enqueue_keyed, promote_lane, retry_dead) and promote_held, between producers, and the
 * limit's count under another isolation level. Each race is staged statement by statement from
 * two sessions, so it happens every run.
 *
 * A `regression (review N)` test names a finding of that review, fixed since; the
 * fails if it comes back. The others held.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { setKeyLimit } from '../src/index.js';
import { schemaLockKey } from '../src/storage/locks.js';
import { freshSchema } from './helpers.js';
import {
  bury,
  client,
  enqueueKeyed,
  liveIds,
  liveOfKey,
  promoteHeldSql,
  settle,
  where,
} from './keys-review-support.js';

const { schema, pool } = await freshSchema('krev_races');
const S = `"${schema}"`;
// A staged race that goes wrong must fail, not hang the file.
const a = await client('-c jit=off -c statement_timeout=60000');
const b = await client('-c jit=off -c statement_timeout=60000');
after(async () => {
  await a.end();
  await b.end();
});

async function heldKeysRow(key: string): Promise<boolean> {
  return (await pool.query(`SELECT 1 FROM ${S}.held_keys WHERE key = $1`, [key])).rowCount === 1;
}

test('regression (review 1): a keyed enqueue that commits after promote_held emptied its key is stranded (held, no held_keys row)', async () => {
  const [x1] = await enqueueKeyed(pool, S, ['F1']);
  assert.equal(x1!.state, 'held');
  // A producer's transaction enqueues the key's next task: held_keys already has the key, so
  // its INSERT … ON CONFLICT DO NOTHING writes nothing.
  await b.query('BEGIN');
  const [x2] = await enqueueKeyed(b, S, ['F1']);
  assert.equal(x2!.state, 'held');
  // Meanwhile the leader admits x1; x2 is not visible to it, so the key looks drained and its
  // held_keys row is deleted.
  assert.equal(await promoteHeldSql(a, S, null), 1);
  await b.query('COMMIT');
  assert.equal(await where(pool, S, x2!.id!), 'held');
  // x1 completes: its worker frees the key (release_keys), then the leader ticks.
  await settle(pool, S, [x1!.id!]);
  await pool.query(`SELECT ${S}.release_keys(ARRAY[$1::bigint])`, [x1!.id]);
  await promoteHeldSql(pool, S, null);
  await promoteHeldSql(pool, S, null);
  const listed = await heldKeysRow('F1');
  assert.equal(
    await where(pool, S, x2!.id!),
    'ready',
    `the second task of the key is admitted once the first is done (held_keys lists the key: ${listed})`,
  );
});

test('regression (review 1): a due keyed retry held by promotion while promote_held empties the key is stranded', async () => {
  // y1 in a lane of its own (shard 1): promote_held must not wait for the promotion's lane lock.
  const [y1] = await enqueueKeyed(pool, S, ['F1b'], { shard: 1 });
  // y2: a keyed task scheduled for later (as a retry or snooze would be), now due.
  const [y2] = await enqueueKeyed(pool, S, ['F1b'], { runAt: new Date(Date.now() + 3_600_000) });
  assert.equal(y2!.state, 'scheduled');
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE id = $1`, [y2!.id]);
  // The leader's promotion of y2's lane, in its own transaction: y2 becomes held.
  await b.query('BEGIN');
  const n = (await b.query(`SELECT ${S}.promote_lane('kq', 0::smallint, 0::smallint, 100) AS n`)).rows[0].n;
  assert.equal(n, 1);
  // promote_held (a worker's release, or the keys branch) admits y1 and sees no other held task.
  assert.equal(await promoteHeldSql(a, S, null), 1);
  await b.query('COMMIT');
  assert.equal(await where(pool, S, y2!.id!), 'held');
  await settle(pool, S, [y1!.id!]);
  await promoteHeldSql(pool, S, null);
  assert.equal(await where(pool, S, y2!.id!), 'ready', 'the retry runs once the key is free');
});

test('regression (review 1): a keyed dead letter retried while promote_held empties the key is stranded', async () => {
  const [z1, z2] = await enqueueKeyed(pool, S, ['F1c', 'F1c']);
  // z2 died (moved to the dead letters as a worker's final failure would).
  await bury(pool, S, z2!.id!);
  await b.query('BEGIN');
  const r = (await b.query(`SELECT result FROM ${S}.retry_dead(ARRAY[$1::bigint])`, [z2!.id])).rows[0].result;
  assert.equal(r, 'retried');
  assert.equal(await promoteHeldSql(a, S, null), 1);
  await b.query('COMMIT');
  assert.equal(await where(pool, S, z2!.id!), 'held');
  await settle(pool, S, [z1!.id!]);
  await promoteHeldSql(pool, S, null);
  assert.equal(await where(pool, S, z2!.id!), 'ready', 'the retried dead letter runs once the key is free');
});

test('regression (review 2): two producers enqueueing the same two new keys in opposite orders deadlock (held_keys)', async () => {
  await a.query('BEGIN');
  await b.query('BEGIN');
  await enqueueKeyed(a, S, ['tenant-1'], { shard: null });
  await enqueueKeyed(b, S, ['tenant-2'], { shard: null });
  const ra = enqueueKeyed(a, S, ['tenant-2'], { shard: null }).then(
    () => 'ok',
    (e: { code?: string }) => e.code,
  );
  const rb = enqueueKeyed(b, S, ['tenant-1'], { shard: null }).then(
    () => 'ok',
    (e: { code?: string }) => e.code,
  );
  const outcomes = await Promise.all([ra, rb]);
  await a.query(outcomes[0] === 'ok' ? 'COMMIT' : 'ROLLBACK');
  await b.query(outcomes[1] === 'ok' ? 'COMMIT' : 'ROLLBACK');
  // Plain enqueues of the same two transactions (default shards) never wait on each other.
  assert.deepEqual(outcomes, ['ok', 'ok'], 'both producers commit');
});

test("regression (review 2): a producer's open transaction with a keyed enqueue blocks every other producer of that (new) key", async () => {
  await a.query('BEGIN');
  await enqueueKeyed(a, S, ['tenant-3']);
  const second = enqueueKeyed(b, S, ['tenant-3'], { shard: 1 }).then(() => 'done');
  const raced = await Promise.race([second, new Promise((r) => setTimeout(() => r('blocked'), 3000))]);
  await a.query('COMMIT');
  await second;
  assert.equal(raced, 'done', 'an enqueue does not wait for another producer to commit');
});

test('regression (review 3): under REPEATABLE READ (a database default some deployments set), promote_held admits past K', async () => {
  const [old] = await enqueueKeyed(pool, S, ['RR'], { priority: 0, queue: 'rr' });
  assert.equal(old!.state, 'held');
  // A leader transaction whose snapshot predates an admission by another session.
  await a.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await a.query('SELECT 1');
  // A newer task of the key, of a higher priority (a smaller number; its own lane): admitted first elsewhere.
  await enqueueKeyed(pool, S, ['RR'], { priority: -1, queue: 'rr' });
  assert.equal(await promoteHeldSql(b, S, ['RR']), 1);
  assert.equal(await liveOfKey(pool, S, 'RR'), 1);
  const n = await promoteHeldSql(a, S, null).catch((e: Error) => e.message);
  await a.query('COMMIT').catch(() => a.query('ROLLBACK'));
  assert.ok(
    (await liveOfKey(pool, S, 'RR')) <= 1,
    `at most K = 1 standing (promote_held answered ${n}, ${await liveOfKey(pool, S, 'RR')} stand)`,
  );
});

test('held: promote_held and release_keys in two sessions never admit more than K (K = 2, 40 rounds)', async () => {
  await setKeyLimit(pool, schema, { queue: 'k2' }, 2, 'review');
  const made = await enqueueKeyed(pool, S, Array(60).fill('K2'), { queue: 'k2' });
  for (let round = 0; round < 40; round++) {
    const ids = await liveIds(pool, S, 'K2');
    if (ids.length > 0) await settle(pool, S, ids.slice(0, 1));
    await Promise.all([
      promoteHeldSql(a, S, null),
      b.query(`SELECT ${S}.release_keys($1::bigint[])`, [ids.slice(0, 1)]),
      promoteHeldSql(pool, S, ['K2']),
    ]);
    assert.ok((await liveOfKey(pool, S, 'K2')) <= 2, `round ${round}`);
  }
  assert.equal(made.length, 60);
});

test('held: a producer holding a lane past lock_timeout skips that key (subtransaction), and the next call admits it', async () => {
  const [t1] = await enqueueKeyed(pool, S, ['LT'], { queue: 'lt' });
  const lane = (await pool.query(`SELECT ${S}.provision_lane('lt', 0::smallint, 0::smallint) AS id`)).rows[0].id;
  await b.query('BEGIN');
  await b.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), lane]);
  await a.query('BEGIN');
  await a.query(`SET LOCAL lock_timeout = '50ms'`);
  assert.equal(await promoteHeldSql(a, S, null), 0);
  await a.query('COMMIT');
  assert.equal(await where(pool, S, t1!.id!), 'held');
  assert.ok(await heldKeysRow('LT'), 'the key is still listed');
  await b.query('COMMIT');
  assert.equal(await promoteHeldSql(pool, S, null), 1);
  assert.equal(await where(pool, S, t1!.id!), 'ready');
});
