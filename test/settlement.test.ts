import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  enqueue,
  enqueueMany,
  dequeue,
  getTask,
  LeaseLostError,
  backoffDelayMs,
  DEFAULT_BACKOFF,
} from '../src/index.js';
import { pruneDeadLetters, rescueLapsedLeases, promoteDue, readGauges } from '../src/maintenance-api.js';
import { claim, discover, type ClaimedTask } from '../src/processor/claim.js';
import { completeLeases } from '../src/storage/complete.js';
import { recordFailures } from '../src/storage/fail.js';
import { entryKey } from '../src/storage/attempt.js';
import { advanceCursor, releaseLease } from '../src/storage/return.js';
import { removeUnleased } from '../src/storage/remove.js';
import { countLostClaim, refusalOf } from '../src/storage/lost-claim.js';
import { claimParams } from './claim-params.js';
import { freshSchema, leaseLapsed } from './helpers.js';

const { schema, pool } = await freshSchema('settle');
const S = `"${schema}"`;

async function claimOne(type = 't', ceilingMs = 60_000): Promise<ClaimedTask> {
  const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
  const [t] = await claim(
    pool,
    claimParams(schema, lanes, 1, { ceilings: new Map([[type, ceilingMs]]), defaultCeilingMs: ceilingMs }),
  );
  assert.ok(t, 'a task was claimed');
  return t;
}

async function fresh(payload: unknown = {}, opts: { maxAttempts?: number; dedupeKey?: string } = {}): Promise<string> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
  const r = await enqueue(pool, 't', payload, { schema, ...opts });
  return r.id!;
}

/** Make a deferred row due now and promote it, as the leader would. */
async function promoteNow(): Promise<void> {
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 ms'`);
  await promoteDue(pool, schema);
}

const stolen = (t: ClaimedTask) => ({ ...t, token: '00000000-0000-0000-0000-000000000000' });

test('Dequeue is fenced on the token: a wrong token is refused with LeaseLostError', async () => {
  const id = await fresh();
  const t = await claimOne();
  await assert.rejects(dequeue(pool, schema, id, stolen(t).token), LeaseLostError);
  assert.equal((await getTask(pool, schema, id))?.state, 'running');
  await dequeue(pool, schema, id, t.token);
  assert.equal((await getTask(pool, schema, id))?.state, 'completed');
  // A second settlement of the same lease is refused too.
  await assert.rejects(dequeue(pool, schema, id, t.token), LeaseLostError);
  const batch = await completeLeases(pool, storageFor(schema), [t]);
  assert.equal(batch.size, 0);
});

test('Dequeue with an empty token removes an unleased task and refuses a leased one', async () => {
  const id = await fresh({}, { dedupeKey: 'inline' });
  await dequeue(pool, schema, id, '');
  assert.equal(await getTask(pool, schema, id), null, 'the tombstoned entry is never returned');
  assert.equal((await discover(pool, storageFor(schema), null, 20)).length, 0, 'and never discovered');
  const again = await enqueue(pool, 't', {}, { schema, dedupeKey: 'inline' });
  assert.equal(again.state, 'ready', 'its dedupe key is free');
  await claimOne();
  await assert.rejects(dequeue(pool, schema, again.id!, ''), LeaseLostError);
  const scheduled = await enqueue(pool, 't', {}, { schema, delay: 3600_000 });
  await dequeue(pool, schema, scheduled.id!, '');
  assert.equal(await getTask(pool, schema, scheduled.id!), null);
});

test('RecordFailure is fenced: a wrong token is refused and nothing is written', async () => {
  const id = await fresh();
  const t = await claimOne();
  const refused = await recordFailures(pool, storageFor(schema), [
    { ref: stolen(t), error: 'x', delayMs: 0, permanent: false },
  ]);
  assert.equal(refused.size, 0);
  assert.equal((await getTask(pool, schema, id))?.state, 'running');
});

test('failure stores last_error, backs off and clears the lease; attempts are counted at claim', async () => {
  const id = await fresh();
  const started = performance.now();
  const t = await claimOne();
  assert.equal(t.attempt, 1);
  const r = await recordFailures(pool, storageFor(schema), [
    { ref: t, error: 'object store said 503', delayMs: 15_000, permanent: false },
  ]);
  assert.equal(r.get(entryKey(t)), 'retry');
  const task = await getTask(pool, schema, id);
  assert.equal(task?.state, 'retryable');
  assert.equal(task?.lastError, 'object store said 503');
  assert.equal(task?.attempts, 1);
  assert.equal(task?.lease, null, 'lease cleared');
  // run_at is the failure's now() + 15 s; last_attempted_at is the claim's now(). Between the
  // two lies however long the machine took (measured here), not a fixed second.
  const between = (performance.now() - started) / 1000;
  const delay = await pool.query(
    `SELECT extract(epoch FROM run_at - last_attempted_at)::float8 AS s FROM ${S}.deferred WHERE id = $1`,
    [id],
  );
  assert.ok(
    delay.rows[0].s >= 15 && delay.rows[0].s <= 15 + between + 0.05,
    `backoff 15 s after the failure, got ${delay.rows[0].s} (claim to failure took at most ${between} s)`,
  );
  await promoteNow();
  const t2 = await claimOne();
  assert.equal(t2.id, id, 'identity is stable across retries');
  assert.equal(t2.attempt, 2);
});

test('backoff: 15 s doubling to a 10 min cap', () => {
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6, 7, 8, 20].map((a) => backoffDelayMs(DEFAULT_BACKOFF, a) / 1000),
    [15, 30, 60, 120, 240, 480, 600, 600, 600],
  );
});

test('dead letter at max attempts; a dead letter frees its dedupe key', async () => {
  const id = await fresh({ n: 1 }, { maxAttempts: 2, dedupeKey: 'dies' });
  for (let i = 1; i <= 2; i++) {
    const t = await claimOne();
    assert.equal(t.attempt, i);
    const r = await recordFailures(pool, storageFor(schema), [
      { ref: t, error: `boom ${i}`, delayMs: 0, permanent: false },
    ]);
    assert.equal(r.get(entryKey(t)), i < 2 ? 'retry' : 'dead');
    if (i < 2) await promoteNow();
  }
  const dead = await getTask(pool, schema, id);
  assert.equal(dead?.state, 'dead');
  assert.equal(dead?.lastError, 'boom 2');
  assert.deepEqual(dead?.payload, { n: 1 });
  assert.equal((await discover(pool, storageFor(schema), null, 20)).length, 0, 'a dead letter is not discovered');
  const again = await enqueue(pool, 't', {}, { schema, dedupeKey: 'dies' });
  assert.equal(again.state, 'ready');
  const g = await readGauges(pool, schema);
  assert.equal(g.dead.get('t'), 1);
});

test('a permanent failure dead-letters at once', async () => {
  const id = await fresh();
  const t = await claimOne();
  const r = await recordFailures(pool, storageFor(schema), [
    { ref: t, error: 'bad payload', delayMs: 0, permanent: true },
  ]);
  assert.equal(r.get(entryKey(t)), 'dead');
  assert.equal((await getTask(pool, schema, id))?.state, 'dead');
});

test('AdvanceCursor rewrites the payload, makes it due now, resets attempts and clears the lease in one statement', async () => {
  const id = await fresh({ cursor: 0 }, { maxAttempts: 5 });
  await recordFailures(pool, storageFor(schema), [
    { ref: await claimOne(), error: 'first', delayMs: 0, permanent: false },
  ]);
  await promoteNow();
  const t = await claimOne();
  assert.equal(t.attempt, 2);
  assert.equal(await advanceCursor(pool, storageFor(schema), t, { cursor: 10 }), true);
  const task = await getTask(pool, schema, id);
  assert.equal(task?.state, 'retryable');
  assert.deepEqual(task?.payload, { cursor: 10 });
  assert.equal(task?.attempts, 0);
  assert.equal(task?.lastError, null);
  assert.equal(task?.lease, null);
  const due = await pool.query(`SELECT run_at <= now() AS due FROM ${S}.deferred WHERE id = $1`, [id]);
  assert.equal(due.rows[0].due, true);
  // The lease is gone: a second advance, or a release, reports that it wrote nothing.
  assert.equal(await advanceCursor(pool, storageFor(schema), t, { cursor: 20 }), false);
  assert.deepEqual(await releaseLease(pool, storageFor(schema), t, 'x'), { wrote: false, dead: false });
  await promoteNow();
  const next = await claimOne();
  assert.deepEqual(next.payload, { cursor: 10 });
  assert.equal(next.attempt, 1);
});

test('release keeps the burnt attempt; on the final attempt it dead-letters and stamps last_error', async () => {
  const id = await fresh({}, { maxAttempts: 2 });
  const t1 = await claimOne();
  assert.deepEqual(await releaseLease(pool, storageFor(schema), t1, 'interrupted on final attempt'), {
    wrote: true,
    dead: false,
  });
  let task = await getTask(pool, schema, id);
  assert.equal(task?.attempts, 1);
  assert.equal(task?.lastError, null, 'not stamped unless final');
  await promoteNow();
  const t2 = await claimOne();
  assert.equal(t2.attempt, 2);
  assert.deepEqual(await releaseLease(pool, storageFor(schema), t2, 'interrupted on final attempt'), {
    wrote: true,
    dead: true,
  });
  task = await getTask(pool, schema, id);
  assert.equal(task?.state, 'dead');
  assert.equal(task?.lastError, 'interrupted on final attempt');
});

test('rescue: a lapsed lease goes back to retryable with the attempt burnt, or dead when out of attempts', async () => {
  const id = await fresh({}, { maxAttempts: 2 });
  const t1 = await claimOne('t', 1);
  await leaseLapsed(pool, t1.leaseExpiresAt);
  assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 1, dead: 0, held: 0 });
  assert.equal((await getTask(pool, schema, id))?.state, 'retryable');
  await assert.rejects(dequeue(pool, schema, id, t1.token), LeaseLostError, 'the old holder is fenced out');
  await promoteNow();
  const t2 = await claimOne('t', 1);
  assert.equal(t2.attempt, 2);
  await leaseLapsed(pool, t2.leaseExpiresAt);
  assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 0, dead: 1, held: 0 });
  const dead = await getTask(pool, schema, id);
  assert.equal(dead?.state, 'dead');
  assert.match(dead!.lastError!, /lease lapsed/);
  // A live lease is never rescued.
  await fresh();
  await claimOne('t', 60_000);
  assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 0, dead: 0, held: 0 });
});

test('retention prunes dead letters older than 7 days from the last attempt, never one under a live lease', async () => {
  await fresh();
  await pool.query(
    `INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, last_error, created_at, last_attempted_at)
     VALUES (9001, 't', '{}', 'default', 0, 0, 20, 20, 'old', now() - interval '30 days', now() - interval '8 days'),
            (9002, 't', '{}', 'default', 0, 0, 20, 20, 'recent', now() - interval '30 days', now() - interval '6 days'),
            (9003, 't', '{}', 'default', 0, 0, 20, 20, 'old but leased', now() - interval '30 days', now() - interval '8 days')`,
  );
  // 9003 was retried by an operator and is on its final attempt under a live lease.
  await pool.query(
    `INSERT INTO ${S}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard, attempts, max_attempts, created_at, run_at)
     VALUES (0, 999999, 1, 9003, 't', '{}', 'default', 0, 0, 19, 20, now(), now())`,
  );
  await pool.query(
    `INSERT INTO ${S}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, types, type_expires,
                                    type_max_attempts, expires_at)
     VALUES (0, 999999, 1, 1, 1, gen_random_uuid(), now(), '{t}', ARRAY[now() + interval '1 hour'], '{20}',
             now() + interval '1 hour')`,
  );
  const before = await readGauges(pool, schema);
  assert.equal(before.dead.get('t'), 2, 'the gauge uses the same predicate');
  assert.equal(await pruneDeadLetters(pool, schema), 1);
  const left = await pool.query(`SELECT id FROM ${S}.dead_letters ORDER BY id`);
  assert.deepEqual(
    left.rows.map((r) => Number(r.id)),
    [9002, 9003],
  );
});

test('batched completion settles each lease by its own token', async () => {
  await fresh();
  await enqueueMany(
    pool,
    Array.from({ length: 5 }, () => ({ type: 't', payload: {} })),
    { schema },
  );
  const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
  const ts = await claim(pool, claimParams(schema, lanes, 6, { workerId: 'x' }));
  assert.equal(ts.length, 6);
  const refs = ts.map((t, i) => (i === 2 ? stolen(t) : t));
  const settled = await completeLeases(pool, storageFor(schema), refs);
  assert.equal(settled.size, 5);
  assert.equal(settled.has(entryKey(ts[2]!)), false);
});

async function empty(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
}

/** Claim every due entry of one lane as one lease, with `ceilings` per type (margin 0). */
async function claimLane(limit: number, ceilings: [string, number][] = [['t', 60_000]]): Promise<ClaimedTask[]> {
  const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
  return claim(pool, claimParams(schema, lanes.slice(0, 1), limit, { ceilings: new Map(ceilings) }));
}

/** The lease's `n` and the sum of its settlements' `n`, for the one lease of the schema. */
async function leaseCounts(): Promise<{ n: number; settled: number }> {
  const r = await pool.query(
    `SELECT l.n, coalesce((SELECT sum(x.n) FROM ${S}.range_settlements x
                            WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq AND x.slot = l.slot), 0)::int AS settled
       FROM ${S}.range_leases l`,
  );
  assert.equal(r.rows.length, 1, 'one lease');
  return r.rows[0];
}

test('a completion counts the entries it settles: a batch naming an entry twice settles it once, and the lease stays unsettled', async () => {
  await empty();
  await enqueueMany(
    pool,
    [1, 2, 3].map((i) => ({ type: 't', payload: { i }, shard: 0 })),
    { schema },
  );
  const [a, b, c] = await claimLane(10);
  assert.ok(a && b && c, 'three tasks in one lease');
  const settled = await completeLeases(pool, storageFor(schema), [a, a, b]);
  assert.deepEqual([...settled].sort(), [entryKey(a), entryKey(b)].sort());
  assert.deepEqual(await leaseCounts(), { n: 3, settled: 2 }, 'two entries settled, counted two, not three');
  assert.equal((await getTask(pool, schema, c.id))?.state, 'running', 'the third is still the holder’s');
  await completeLeases(pool, storageFor(schema), [c]);
  assert.deepEqual(await leaseCounts(), { n: 3, settled: 3 });
});

test('settlements naming entries outside their lease, or a position that holds no entry of it, are refused', async () => {
  await empty();
  const tasks = await enqueueMany(
    pool,
    [1, 2, 3].map((i) => ({ type: 't', payload: { i }, shard: 0 })),
    { schema },
  );
  // The middle one removed before the claim: the lease's range spans a tombstoned position.
  assert.equal(await removeUnleased(pool, storageFor(schema), tasks[1]!.id!, 'test'), 'removed');
  const [a, b] = await claimLane(10);
  assert.ok(a && b, 'two tasks in one lease');
  assert.equal(BigInt(b.laneSeq) - BigInt(a.laneSeq), 2n, 'the range spans the tombstoned middle entry');
  const middle = String(BigInt(a.laneSeq) + 1n);
  const past = String(BigInt(b.laneSeq) + 1n);
  // Completion: a group naming the tombstoned position or one past the lease is refused whole.
  assert.equal((await completeLeases(pool, storageFor(schema), [a, { ...a, laneSeq: middle }])).size, 0);
  assert.equal((await completeLeases(pool, storageFor(schema), [b, { ...b, laneSeq: past }])).size, 0);
  // Failure and release: a single position of the lease that holds no live entry.
  const failed = await recordFailures(pool, storageFor(schema), [
    { ref: { ...a, laneSeq: middle }, error: 'x', delayMs: 0, permanent: false },
  ]);
  assert.equal(failed.size, 0);
  assert.equal((await releaseLease(pool, storageFor(schema), { ...a, laneSeq: middle }, 'x')).wrote, false);
  assert.deepEqual(await leaseCounts(), { n: 2, settled: 0 }, 'nothing was written');
  assert.equal((await completeLeases(pool, storageFor(schema), [a, b])).size, 2, 'the lease’s own entries settle');
  assert.deepEqual(await leaseCounts(), { n: 2, settled: 2 });
});

test('rescue is not starved by lapsed leases it cannot rescue: more of them than its limit, and the real lapse is taken', async () => {
  await empty();
  // Five leases, each of an entry of type `short` (1 ms ceiling) and one of type `long` (1 hour):
  // each lease's earliest expiry passes at once, but once the short entries complete, what is left
  // of them is not due for rescue for an hour.
  for (let i = 0; i < 5; i++) {
    await enqueueMany(
      pool,
      [
        { type: 'short', payload: { i }, shard: 1 + i },
        { type: 'long', payload: { i }, shard: 1 + i },
      ],
      { schema },
    );
    const [s, l] = await claimLane(2, [
      ['short', 1],
      ['long', 3_600_000],
    ]);
    assert.ok(s && l && s.type === 'short' && l.type === 'long');
    assert.equal((await completeLeases(pool, storageFor(schema), [s])).size, 1);
  }
  // Then one real lapse, with the latest expiry of all.
  const lapsedId = (await enqueue(pool, 'short', { real: true }, { schema, shard: 10 })).id!;
  const [t] = await claimLane(1, [['short', 1]]);
  assert.equal(t?.id, lapsedId);
  await leaseLapsed(pool, t.leaseExpiresAt);
  assert.deepEqual(await rescueLapsedLeases(pool, schema, 3), { retried: 1, dead: 0, held: 0 });
  assert.equal((await getTask(pool, schema, lapsedId))?.state, 'retryable');
});

test('a run whose lease vanished (a crash took the asynchronous claim back) is counted: back to deferred, buried at its limit, or left to the claim that took it again', async () => {
  const vanish = (t: ClaimedTask) => pool.query(`DELETE FROM ${S}.range_leases WHERE token = $1`, [t.token]);
  // Counted: the entry is claimable again and nobody took it yet.
  const counted = await fresh({}, { maxAttempts: 3 });
  const t1 = await claimOne();
  await vanish(t1);
  assert.equal((await completeLeases(pool, storageFor(schema), [t1])).size, 0, 'the fence refuses the vanished lease');
  assert.deepEqual(await refusalOf(pool, storageFor(schema), t1), { outcome: null, leaseExists: false });
  assert.equal(await countLostClaim(pool, storageFor(schema), t1, 'w1'), 'counted');
  let task = await getTask(pool, schema, counted);
  assert.equal(task?.state, 'retryable');
  assert.equal(task?.attempts, 1, 'the lost run counts');
  await promoteNow();
  assert.equal((await claimOne()).attempt, 2);
  // Dead: the lost run was the last attempt.
  const last = await fresh({}, { maxAttempts: 1 });
  const t2 = await claimOne();
  await vanish(t2);
  assert.equal(await countLostClaim(pool, storageFor(schema), t2, 'w1'), 'dead');
  task = await getTask(pool, schema, last);
  assert.equal(task?.state, 'dead');
  assert.match(task!.lastError!, /lost in a database crash/);
  // Running: another claim took the entry first; then, settled by it, gone.
  await fresh({}, { maxAttempts: 3 });
  const t3 = await claimOne();
  await vanish(t3);
  const again = await claimOne();
  assert.equal(again.attempt, 1, 'the entry runs again under the same attempt');
  assert.equal(await countLostClaim(pool, storageFor(schema), t3, 'w1'), 'running');
  assert.equal((await completeLeases(pool, storageFor(schema), [again])).size, 1);
  assert.equal(await countLostClaim(pool, storageFor(schema), t3, 'w1'), 'gone');
});
