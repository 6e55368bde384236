/**
 * Review of task dependencies (migration 31), invariant F: locks. The release takes the waiting
 * dependents' counters (task_waits, id order), then their edges, then their deferred rows, then
 * tries their lanes' locks. Met here, staged from sessions the test holds: an operator's cancel
 * of the waiting dependent (both orders), the leader's cancel of it on a parent read as dead
 * while the parent is retried and released, and promotion; and a graph enqueue's lane locks
 * against a plain multi-lane enqueueMany's, whose order is the client's (JSON keys sorted as
 * strings), not the lanes' (queue, priority, shard).
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import { cancelTask, enqueueMany } from '../src/index.js';
import { promoteDue } from '../src/maintenance/promote.js';
import type { Queryable } from '../src/sql.js';
import { recordFailures } from '../src/storage/fail.js';
import { storageFor } from '../src/storage/storage.js';
import { freshSchema } from './helpers.js';
import {
  blockedOnLock,
  claimIds,
  completeAndRelease,
  completePlain,
  entries,
  graph,
  pendingOf,
  pidOf,
  session,
  stateOf,
  tick,
} from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_locks');
const S = `"${schema}"`;
const storage = storageFor(schema);
const a = await session();
const b = await session();
const x = await session();
after(async () => {
  await Promise.all([a.end(), b.end(), x.end()]);
});

/** A statement's outcome: 'ok' or its SQLSTATE. */
function outcome(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? String(e),
  );
}

/** A parent (dead: its only attempt failed for good) and its dependent of the `cancel` policy, in `queue`. */
async function deadParentOf(queue: string): Promise<[string, string]> {
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue, ref: 'p' },
    { name: 'c', queue, dependsOn: [{ ref: 'p' }] },
  ]);
  const [t] = await claimIds(pool, schema, [p!], queue);
  await recordFailures(pool, storage, [{ ref: t!, error: 'boom', delayMs: 0, permanent: true }]);
  return [p!, c!];
}

test('release vs an operator cancel of the last waiting dependent, both orders: no deadlock, it is cancelled and never runs', async () => {
  for (const first of ['release', 'cancel'] as const) {
    const q = `l-cancel-${first}`;
    const [p, c] = await graph(pool, schema, [
      { name: 'p', queue: q, ref: 'p' },
      { name: 'c', queue: q, dependsOn: [{ ref: 'p' }] },
    ]);
    const [t] = await claimIds(pool, schema, [p!], q);
    await a.query('BEGIN');
    let cancelled: Promise<string>;
    if (first === 'release') {
      assert.equal((await completeAndRelease(a, schema, [t!])).freed, 1);
      cancelled = cancelTask(b, schema, c!, { actor: 'review' });
      await blockedOnLock(pool, pidOf(b), "the dependent's row");
      await a.query('COMMIT');
      assert.equal(await cancelled, 'removed', 'the cancel takes the entry the release appended');
    } else {
      assert.deepEqual((await a.query(`SELECT result FROM ${S}.cancel_tasks(ARRAY[$1::bigint], 'review')`, [c])).rows, [
        { result: 'removed' },
      ]);
      await b.query('BEGIN');
      const released = completeAndRelease(b, schema, [t!]);
      await blockedOnLock(pool, pidOf(b), "the dependent's row");
      await a.query('COMMIT');
      assert.equal((await released).freed, 0, 'nothing to free: the dependent is gone');
      await b.query('COMMIT');
    }
    assert.equal(await stateOf(pool, schema, c!), 'cancelled');
    assert.equal(await pendingOf(pool, schema, c!), null, 'no counter left');
    await promoteDue(pool, schema);
    assert.equal(await stateOf(pool, schema, c!), 'cancelled');
  }
});

test('regression (review): the leader cancels a dependent on a parent it read as dead while the parent is retried and a second deps pass releases it: no deadlock', async () => {
  const q = 'l-stale-dead';
  const [p, c] = await deadParentOf(q);
  // Something holds the dependent's row a moment (a producer's FOR UPDATE stands in for any).
  await x.query('BEGIN');
  await x.query(`SELECT 1 FROM ${S}.deferred WHERE id = $1 FOR UPDATE`, [c]);
  // The leader's pass reads the parent dead and goes to cancel the dependent: it waits for the row.
  const cancelPass = outcome(tick(a, schema));
  await blockedOnLock(pool, pidOf(a), "the dependent's row (cancel)");
  // Meanwhile the operator retries the parent, it runs and completes, and a second pass (a new
  // leader whose predecessor's pass is still running; or the prune's trigger) releases the dependent.
  await pool.query(`SELECT * FROM ${S}.retry_dead(ARRAY[$1::bigint])`, [p]);
  const [again] = await claimIds(pool, schema, [p!], q);
  await completePlain(pool, schema, [again!]);
  const releasePass = outcome(tick(b, schema));
  await blockedOnLock(pool, pidOf(b), "the dependent's row (release)");
  await x.query('COMMIT');
  const got = await Promise.all([cancelPass, releasePass]);
  assert.deepEqual(got, ['ok', 'ok'], 'both passes finish (40P01: a deadlock)');
  // The cancel was decided, under the dependent's counter lock, before the retry: it stands, and
  // the release that came after frees nothing. Either way the dependent is settled once.
  await tick(pool, schema);
  const state = await stateOf(pool, schema, c!);
  assert.ok(state === 'cancelled' || state === 'ready', state);
  assert.equal(await entries(pool, schema, c!), state === 'ready' ? 1 : 0);
  assert.equal(await pendingOf(pool, schema, c!), null, 'no counter left');
});

test('regression (review): the leader reads a parent dead; before it cancels, the parent is retried and completes: the dependent is released, not cancelled', async () => {
  const q = 'l-retried';
  const [p, c] = await deadParentOf(q);
  // Something holds the dependent's counter a moment (a release of another of its parents).
  await x.query('BEGIN');
  await x.query(`SELECT 1 FROM ${S}.task_waits WHERE id = $1 FOR UPDATE`, [c]);
  const cancelPass = tick(a, schema);
  await blockedOnLock(pool, pidOf(a), "the dependent's counter");
  // The operator retries the parent; it runs and completes (retry_dead appends it unmarked).
  await pool.query(`SELECT * FROM ${S}.retry_dead(ARRAY[$1::bigint])`, [p]);
  const [again] = await claimIds(pool, schema, [p!], q);
  await completePlain(pool, schema, [again!]);
  await x.query('ROLLBACK');
  assert.equal((await cancelPass).cancelled, 0, 'the fate read again under the lock: completed');
  assert.equal((await tick(pool, schema)).released, 1);
  assert.equal(await stateOf(pool, schema, c!), 'ready');
  assert.equal(await entries(pool, schema, c!), 1);
});

/** A session whose `nth` statement (1-based) waits for `gate` after it returns. */
function pausing(c: pg.Client, nth: number, gate: Promise<void>): Queryable & { paused: Promise<void> } {
  let n = 0;
  let reached!: () => void;
  const paused = new Promise<void>((r) => {
    reached = r;
  });
  return {
    paused,
    query: async (...args: unknown[]) => {
      const r = await (c.query as (...y: unknown[]) => Promise<unknown>)(...args);
      if (++n === nth) {
        reached();
        await gate;
      }
      return r;
    },
  } as unknown as Queryable & { paused: Promise<void> };
}

test('regression (review): a graph enqueue and a plain multi-lane enqueueMany over the same two lanes: both commit (the same lane lock order)', async () => {
  const q = 'l-order';
  // The lanes exist (a new lane is provisioned under a queue lock of its own).
  await enqueueMany(
    pool,
    [
      { type: 'dr', payload: {}, queue: q, shard: 2 },
      { type: 'dr', payload: {}, queue: q, shard: 10 },
    ],
    { schema },
  );
  let open!: () => void;
  const gate = new Promise<void>((r) => {
    open = r;
  });
  // The plain call: its lanes in the client's order, ["l-order",0,10,0] before ["l-order",0,2,0];
  // it stops after its first statement (shard 10's lane locked).
  const plainDb = pausing(a, 1, gate);
  await a.query('BEGIN');
  const plain = outcome(
    enqueueMany(
      plainDb,
      [
        { type: 'dr', payload: { n: 1 }, queue: q, shard: 2 },
        { type: 'dr', payload: { n: 2 }, queue: q, shard: 10 },
      ],
      { schema },
    ).then(() => a.query('COMMIT')),
  );
  await plainDb.paused;
  // The graph: due tasks on both lanes, appended in (queue, priority, shard) order.
  const g = outcome(
    graph(b, schema, [
      { name: 'g1', queue: q, shard: 2, ref: 'r' },
      { name: 'g2', queue: q, shard: 10 },
      { name: 'g3', queue: q, shard: 2, dependsOn: [{ ref: 'r' }] },
    ]),
  );
  await blockedOnLock(pool, pidOf(b), "shard 10's lane (the plain call holds it)");
  open();
  const got = await Promise.all([plain, g]);
  if (got[0] !== 'ok') await a.query('ROLLBACK');
  assert.deepEqual(got, ['ok', 'ok'], 'both commit (40P01: the two calls took the lanes in opposite orders)');
});

test('regression (review): a release into a lane that does not exist yet never waits for a producer holding its queue (a new lane of the queue, open)', async () => {
  // The dependent's lane (queue l-newlane, shard 7) is never provisioned until its first append.
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue: 'l-newlane-parent', ref: 'p' },
    { name: 'c', queue: 'l-newlane', shard: 7, dependsOn: [{ ref: 'p' }] },
  ]);
  const [t] = await claimIds(pool, schema, [p!], 'l-newlane-parent');
  // A producer's open transaction provisioned another new lane of the same queue: it holds the
  // queue's lock (provision_lane) until it commits.
  await b.query('BEGIN');
  await enqueueMany(b, [{ type: 'dr', payload: {}, queue: 'l-newlane', shard: 5 }], { schema });
  try {
    await a.query('BEGIN');
    const done = completeAndRelease(a, schema, [t!]).then(async (r) => {
      await a.query('COMMIT');
      return r;
    });
    const waited = await Promise.race([
      done.then(() => false),
      blockedOnLock(pool, pidOf(a), 'the queue lock').then(() => true),
    ]);
    if (waited) await b.query('COMMIT');
    assert.equal(waited, false, "the completion waited for a producer's transaction");
    assert.equal((await done).freed, 1, 'freed (left due for promotion)');
  } finally {
    await b.query('COMMIT').catch(() => undefined);
  }
  await promoteDue(pool, schema);
  assert.equal(await stateOf(pool, schema, c!), 'ready');
  assert.equal(await entries(pool, schema, c!), 1);
});

test('a release into a lane that does not exist yet, its queue free: provisioned and appended at once', async () => {
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue: 'l-newlane2-parent', ref: 'p' },
    { name: 'c', queue: 'l-newlane2', shard: 9, dependsOn: [{ ref: 'p' }] },
  ]);
  const [t] = await claimIds(pool, schema, [p!], 'l-newlane2-parent');
  assert.equal((await completeAndRelease(pool, schema, [t!])).freed, 1);
  assert.equal(await stateOf(pool, schema, c!), 'ready', 'no promotion needed');
});
