/**
 * Review of task dependencies (migration 31), invariant B: every dependent whose parents all
 * completed becomes claimable, exactly once (no lost wake-up). A parent enqueued earlier, in
 * another call, is named while it is deferred, mid-promotion, in the ring unleased, leased, or
 * completing concurrently with the producer's transaction, by producers at READ COMMITTED,
 * REPEATABLE READ and SERIALIZABLE; a parent of the same call goes through a retry, a snooze, a
 * release, a move, a concurrency key, a dequeue, an older worker's plain completion and a busy
 * lane. Each interleaving is staged statement by statement on sessions the test holds; the
 * leader's `deps` branch is one `tick()` call.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import { BerthInputError, defineTask, moveTask } from '../src/index.js';
import { promoteDue } from '../src/maintenance/promote.js';
import type { ClaimedTask } from '../src/processor/claim.js';
import { runDueTasks } from '../src/testing-api.js';
import { dequeueIn } from '../src/storage/complete.js';
import { watchParents } from '../src/storage/deps.js';
import { recordFailures } from '../src/storage/fail.js';
import { promoteHeld } from '../src/storage/keys.js';
import { removeUnleased } from '../src/storage/remove.js';
import { releaseLease } from '../src/storage/return.js';
import { snoozeLease } from '../src/storage/snooze.js';
import { storageFor } from '../src/storage/storage.js';
import { freshSchema, holdLaneLock } from './helpers.js';
import {
  blockedOnLock,
  claimIds,
  completeAndRelease,
  completePlain,
  edgesOf,
  entries,
  graph,
  pidOf,
  session,
  stateOf,
  tick,
} from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_wakeup');
const S = `"${schema}"`;
const storage = storageFor(schema);
const a = await session();
const b = await session();
after(async () => {
  await a.end();
  await b.end();
});

const LEVELS = ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'] as const;
type Level = (typeof LEVELS)[number];
const short = (l: Level) => ({ 'READ COMMITTED': 'rc', 'REPEATABLE READ': 'rr', SERIALIZABLE: 'ser' })[l];

/** The producer's transaction at `level`, its snapshot taken by a first statement, then `body`, then COMMIT. */
async function produce<T>(c: pg.Client, level: Level, body: () => Promise<T>): Promise<T> {
  await c.query(`BEGIN ISOLATION LEVEL ${level}`);
  try {
    await c.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
    const r = await body();
    await c.query('COMMIT');
    return r;
  } catch (e) {
    await c.query('ROLLBACK');
    throw e;
  }
}

/** A child of `parent` (another call's task), enqueued by `c` in its open transaction. */
async function childOf(c: pg.Client, parent: string, name: string, queue: string): Promise<string> {
  const [id] = await graph(c, schema, [{ name, queue, dependsOn: [parent] }]);
  return id!;
}

/** The dependent is claimable once: one ring entry, state ready. */
async function assertFreedOnce(id: string, what: string): Promise<void> {
  assert.equal(await stateOf(pool, schema, id), 'ready', `${what}: the dependent is claimable`);
  assert.equal(await entries(pool, schema, id), 1, `${what}: appended once`);
  assert.equal((await pool.query(`SELECT 1 FROM ${S}.task_waits WHERE id = $1`, [id])).rowCount, 0);
}

/** Complete `t` as a worker does (release in the flush when it is marked), then one leader tick. */
async function completeThenTick(t: ClaimedTask): Promise<{ freed: number; released: number }> {
  await a.query('BEGIN');
  const { won, freed } = await completeAndRelease(a, schema, [t]);
  await a.query('COMMIT');
  assert.equal(won.size, 1, 'the completion won');
  const { released } = await tick(pool, schema);
  return { freed, released };
}

for (const level of LEVELS) {
  test(`${short(level)} producer, parent of an earlier call deferred, in the ring unleased, leased: each dependent freed once`, async () => {
    const q = `w-place-${short(level)}`;
    // Deferred (scheduled for later).
    const [deferred] = await graph(pool, schema, [{ name: 'deferred', queue: q, delay: 3_600_000 }]);
    const c1 = await produce(b, level, () => childOf(b, deferred!, 'c-deferred', q));
    assert.equal(await stateOf(pool, schema, c1), 'waiting');
    assert.deepEqual(await edgesOf(pool, schema, c1), [{ parent: deferred, satisfied: false, watched: true }]);
    await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE id = $1`, [deferred]);
    await promoteDue(pool, schema);
    const [td] = await claimIds(pool, schema, [deferred!], q);
    assert.equal(td!.hasDependents, true, 'promoted after the edge: marked');
    const rd = await completeThenTick(td!);
    assert.equal(rd.freed, 1, 'freed by the completion itself');
    await assertFreedOnce(c1, 'deferred parent');

    // In the ring, unleased.
    const [ready] = await graph(pool, schema, [{ name: 'ready', queue: q }]);
    const c2 = await produce(b, level, () => childOf(b, ready!, 'c-ready', q));
    const [tr] = await claimIds(pool, schema, [ready!], q);
    assert.equal(tr!.hasDependents, undefined, 'appended before the edge: unmarked');
    const rr = await completeThenTick(tr!);
    assert.equal(rr.freed + rr.released, 1);
    await assertFreedOnce(c2, 'ready parent');

    // Leased, running.
    const [running] = await graph(pool, schema, [{ name: 'running', queue: q }]);
    const [tl] = await claimIds(pool, schema, [running!], q);
    const c3 = await produce(b, level, () => childOf(b, running!, 'c-running', q));
    const rl = await completeThenTick(tl!);
    assert.equal(rl.released, 1, 'the leader releases a watched edge');
    await assertFreedOnce(c3, 'leased parent');
  });

  test(`${short(level)} producer, parent mid-promotion: the producer waits for the promotion, then (RC) watches the entry or (RR, SERIALIZABLE) gets a serialization failure and retries`, async () => {
    const q = `w-promo-${short(level)}`;
    const [p] = await graph(pool, schema, [{ name: 'promo', queue: q, delay: 3_600_000, shard: 0 }]);
    await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE id = $1`, [p]);
    await a.query('BEGIN');
    assert.equal((await a.query(`SELECT ${S}.promote_lane($1, 0::smallint, 0::smallint, 100) AS n`, [q])).rows[0].n, 1);
    const pending = produce(b, level, () => childOf(b, p!, 'c-promo', q)).then(
      (id) => ({ id, code: null as string | null }),
      (e: { code?: string }) => ({ id: null, code: e.code ?? 'error' }),
    );
    await blockedOnLock(pool, pidOf(b), "the parent's deferred row");
    await a.query('COMMIT');
    let r = await pending;
    if (level === 'READ COMMITTED') assert.equal(r.code, null, 'READ COMMITTED goes on');
    else assert.equal(r.code, '40001', `${level}: a serialization failure, which the producer retries`);
    if (r.id === null) r = { id: await produce(b, level, () => childOf(b, p!, 'c-promo', q)), code: null };
    const [t] = await claimIds(pool, schema, [p!], q);
    await completeThenTick(t!);
    await assertFreedOnce(r.id!, 'parent mid-promotion');
  });

  test(`${short(level)} producer, parent completing concurrently: its completion commits between the producer's check and its commit, or between its snapshot and its check`, async () => {
    const q = `w-race-${short(level)}`;
    // 1. The completion is open when the producer checks, and commits before the producer does.
    const [p1] = await graph(pool, schema, [{ name: 'race1', queue: q }]);
    const [t1] = await claimIds(pool, schema, [p1!], q);
    await b.query(`BEGIN ISOLATION LEVEL ${level}`);
    await b.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
    await a.query('BEGIN');
    await completeAndRelease(a, schema, [t1!]);
    const c1 = await childOf(b, p1!, 'c-race1', q);
    await a.query('COMMIT');
    await b.query('COMMIT');
    assert.equal(await stateOf(pool, schema, c1), 'waiting', 'the completion could not see the edge');
    assert.equal((await tick(pool, schema)).released, 1);
    await assertFreedOnce(c1, 'completion committed between check and commit');

    // 2. The completion commits after the producer's snapshot, before its check.
    const [p2] = await graph(pool, schema, [{ name: 'race2', queue: q }]);
    const [t2] = await claimIds(pool, schema, [p2!], q);
    await b.query(`BEGIN ISOLATION LEVEL ${level}`);
    await b.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
    await completePlain(pool, schema, [t2!]);
    const c2 = await childOf(b, p2!, 'c-race2', q);
    await b.query('COMMIT');
    const edge = (await edgesOf(pool, schema, c2))[0]!;
    if (level === 'READ COMMITTED') assert.equal(edge.satisfied, true, 'READ COMMITTED sees the completion');
    else {
      assert.deepEqual(edge, { parent: p2, satisfied: false, watched: true }, 'an old snapshot: watched');
      assert.equal((await tick(pool, schema)).released, 1);
    }
    await assertFreedOnce(c2, 'completion committed between snapshot and check');
  });
}

test('a parent of the same call retried after a failure, snoozed, or released by a stop comes back marked: its completion frees the dependent', async () => {
  const q = 'w-back';
  for (const how of ['failure', 'snooze', 'release'] as const) {
    const [p, c] = await graph(pool, schema, [
      { name: `${how}-p`, queue: q, ref: 'p' },
      { name: `${how}-c`, queue: q, dependsOn: [{ ref: 'p' }] },
    ]);
    const [t] = await claimIds(pool, schema, [p!], q);
    assert.equal(t!.hasDependents, true);
    if (how === 'failure')
      assert.equal(
        (await recordFailures(pool, storage, [{ ref: t!, error: 'boom', delayMs: 0, permanent: false }])).size,
        1,
      );
    else if (how === 'snooze') assert.equal((await snoozeLease(pool, storage, t!, 0, 10, 'too many')).wrote, true);
    else await releaseLease(pool, storage, t!, 'stopping');
    assert.equal(await stateOf(pool, schema, c!), 'waiting');
    await promoteDue(pool, schema);
    const [again] = await claimIds(pool, schema, [p!], q);
    assert.equal(again!.hasDependents, true, `${how}: promoted marked`);
    const r = await completeThenTick(again!);
    assert.equal(r.freed, 1, `${how}: freed by the completion`);
    await assertFreedOnce(c!, how);
  }
});

test('a parent moved to another queue, keyed, or dequeued by its handler: the leader releases its dependents', async () => {
  // Moved while ready: appended again without the mark; moveTask watches its edges.
  const [mp, mc] = await graph(pool, schema, [
    { name: 'moved-p', queue: 'w-move', ref: 'p' },
    { name: 'moved-c', queue: 'w-move', dependsOn: [{ ref: 'p' }] },
  ]);
  assert.equal(await moveTask(pool, schema, mp!, { queue: 'w-move-2' }), 'moved');
  const [tm] = await claimIds(pool, schema, [mp!], 'w-move-2');
  const rm = await completeThenTick(tm!);
  assert.equal(rm.freed + rm.released, 1);
  await assertFreedOnce(mc!, 'moved parent');

  // Keyed: admitted by promote_held, which appends without the mark.
  const [kp, kc] = await graph(pool, schema, [
    { name: 'keyed-p', queue: 'w-key', ref: 'p', concurrencyKey: 'review-k' },
    { name: 'keyed-c', queue: 'w-key', dependsOn: [{ ref: 'p' }] },
  ]);
  assert.equal((await promoteHeld(pool, storage, null)).admitted, 1);
  const [tk] = await claimIds(pool, schema, [kp!], 'w-key');
  const rk = await completeThenTick(tk!);
  assert.equal(rk.freed + rk.released, 1);
  await assertFreedOnce(kc!, 'keyed parent');

  // ctx.dequeue(executor) in the handler's own transaction: what run-task.ts sends.
  const [dp, dc] = await graph(pool, schema, [
    { name: 'deq-p', queue: 'w-deq', ref: 'p' },
    { name: 'deq-c', queue: 'w-deq', dependsOn: [{ ref: 'p' }] },
  ]);
  const [td] = await claimIds(pool, schema, [dp!], 'w-deq');
  await a.query('BEGIN');
  await dequeueIn(a, storage, dp!, td!.token);
  if (td!.hasDependents) await watchParents(a, storage, [dp!]);
  await a.query('COMMIT');
  assert.equal((await tick(pool, schema)).released, 1);
  await assertFreedOnce(dc!, 'parent dequeued by its handler');

  // dequeue(…, '') of a ready parent: the producer did the work itself.
  const [ip, ic] = await graph(pool, schema, [
    { name: 'inline-p', queue: 'w-inline', ref: 'p' },
    { name: 'inline-c', queue: 'w-inline', dependsOn: [{ ref: 'p' }] },
  ]);
  assert.equal(await removeUnleased(pool, storage, ip!, 'dequeued'), 'removed');
  assert.equal((await tick(pool, schema)).released, 1);
  await assertFreedOnce(ic!, 'parent dequeued inline');
});

test('regression (review): dequeue(…, "") of a scheduled parent (the producer did the work itself) counts as a completion, as for a ready one', async () => {
  const [sp, sc] = await graph(pool, schema, [
    { name: 'inline-sched-p', queue: 'w-inline-s', ref: 'p', delay: 3_600_000 },
    { name: 'inline-sched-c', queue: 'w-inline-s', dependsOn: [{ ref: 'p' }] },
  ]);
  assert.equal(await removeUnleased(pool, storage, sp!, 'dequeued'), 'removed');
  await tick(pool, schema);
  assert.equal(
    await stateOf(pool, schema, sc!),
    'ready',
    'a ready parent dequeued inline releases its dependents; a scheduled one must too (not cancel them)',
  );
});

test('an older worker completes a marked parent with the plain statement: the 30 s sweep releases it', async () => {
  const [p, c] = await graph(pool, schema, [
    { name: 'old-p', queue: 'w-old', ref: 'p' },
    { name: 'old-c', queue: 'w-old', dependsOn: [{ ref: 'p' }] },
  ]);
  const [t] = await claimIds(pool, schema, [p!], 'w-old');
  assert.equal(t!.hasDependents, true);
  assert.equal((await completePlain(pool, schema, [t!])).size, 1);
  assert.equal((await tick(pool, schema)).released, 0, 'not watched: the tick does not look');
  assert.equal(await stateOf(pool, schema, c!), 'waiting');
  assert.equal((await tick(pool, schema, true)).released, 1, 'the sweep does');
  await assertFreedOnce(c!, 'plain completion');
});

test('a freed dependent whose lane a producer holds is left due; promotion appends it marked for its own dependents', async () => {
  const [p, c, g] = await graph(pool, schema, [
    { name: 'busy-p', queue: 'w-busy', ref: 'p', shard: 3 },
    { name: 'busy-c', queue: 'w-busy', ref: 'c', shard: 3, dependsOn: [{ ref: 'p' }] },
    { name: 'busy-g', queue: 'w-busy', shard: 3, dependsOn: [{ ref: 'c' }] },
  ]);
  const [t] = await claimIds(pool, schema, [p!], 'w-busy');
  const lane = (
    await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = 'w-busy' AND priority = 0 AND shard = 3`)
  ).rows[0].lane_id;
  const unlock = await holdLaneLock(schema, lane);
  try {
    const { freed } = await completeThenTick(t!);
    assert.equal(freed, 1, 'freed, though the lane is busy');
    assert.equal(await stateOf(pool, schema, c!), 'scheduled', 'left due for promotion');
  } finally {
    await unlock();
  }
  await promoteDue(pool, schema);
  const [tc] = await claimIds(pool, schema, [c!], 'w-busy');
  assert.equal(tc!.hasDependents, true, 'promoted marked');
  assert.equal((await completeThenTick(tc!)).freed, 1);
  await assertFreedOnce(g!, 'grandchild');
});

test('regression (review): runDueTasks runs a dependent whose parent was enqueued in an earlier call', async () => {
  const ran: string[] = [];
  const def = defineTask<{ name: string }>({
    type: 'dr',
    ceilingMs: 10_000,
    handler: async (payload) => {
      ran.push(payload.name);
    },
  });
  const [p] = await graph(pool, schema, [{ name: 'rdt-p', queue: 'w-rdt' }]);
  const [c] = await graph(pool, schema, [{ name: 'rdt-c', queue: 'w-rdt', dependsOn: [p!] }]);
  await runDueTasks(pool, [def], { schema, queues: ['w-rdt'] });
  assert.deepEqual(ran, ['rdt-p', 'rdt-c'], 'the parent, then its dependent');
  assert.equal(await stateOf(pool, schema, c!), 'completed');
});

test('a refused dependsOn (the parent is unknown) names it and writes nothing', async () => {
  await assert.rejects(
    graph(pool, schema, [{ name: 'x', queue: 'w-x', dependsOn: ['987654321'] }]),
    (e: Error) => e instanceof BerthInputError && /depends on task 987654321, which does not exist/.test(e.message),
  );
});
