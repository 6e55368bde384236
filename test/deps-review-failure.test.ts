/**
 * Review of task dependencies (migration 31), invariant C: failure policies. A dead parent
 * cancels its `cancel` dependents and keeps its `wait` ones (counted blocked) until it is retried
 * and completes; a cancelled or deleted parent cancels every dependent, down the levels; a dead
 * letter deleted, purged or pruned by retention cancels the `wait` dependents; an operator's
 * retry of a waiting task is refused; a waiting task cancelled or moved leaves no counter that
 * blocks or miscounts anything. The leader's `deps` branch is one `tick()` call.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cancelTask, deleteTask, getTask, moveTask, retryTask } from '../src/index.js';
import { pruneDeadLetters } from '../src/maintenance-api.js';
import { promoteDue } from '../src/maintenance/promote.js';
import type { ClaimedTask } from '../src/processor/claim.js';
import { dependencyUsage, dependentsOf } from '../src/storage/deps.js';
import { recordFailures } from '../src/storage/fail.js';
import { storageFor } from '../src/storage/storage.js';
import { freshSchema } from './helpers.js';
import { claimIds, completeAndRelease, edgesOf, graph, pendingOf, stateOf, tick } from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_failure');
const S = `"${schema}"`;
const storage = storageFor(schema);

/** The leader's ticks until nothing changes (a cancel goes down a level a tick). */
async function settleTicks(): Promise<void> {
  for (let i = 0; i < 20; i++) {
    const r = await tick(pool, schema);
    if (r.released === 0 && r.cancelled === 0 && r.lastParent === null) return;
  }
}

/** The task's last attempt fails for good: a dead letter. */
async function kill(t: ClaimedTask): Promise<void> {
  const r = await recordFailures(pool, storage, [{ ref: t, error: 'boom', delayMs: 0, permanent: true }]);
  assert.equal([...r.values()][0], 'dead');
}

async function usage(queue: string) {
  return (await dependencyUsage(pool, storage)).find((r) => r.queue === queue) ?? { queue, waiting: 0, blocked: 0 };
}

test('a dead parent: cancel dependents cancelled down three levels, the wait one kept and counted blocked, then run after retry_dead and completion', async () => {
  const q = 'f-dead';
  const [p, cancelKid, waitKid, grand, great] = await graph(pool, schema, [
    { name: 'p', queue: q, ref: 'p' },
    { name: 'cancel-kid', queue: q, ref: 'k1', dependsOn: [{ ref: 'p' }] },
    { name: 'wait-kid', queue: q, ref: 'k2', dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
    { name: 'grand', queue: q, ref: 'g', dependsOn: [{ ref: 'k1' }, { ref: 'k2' }], onParentFailure: 'wait' },
    { name: 'great', queue: q, dependsOn: [{ ref: 'g' }], onParentFailure: 'wait' },
  ]);
  const [t] = await claimIds(pool, schema, [p!], q);
  await kill(t!);
  await settleTicks();
  assert.equal(await stateOf(pool, schema, cancelKid!), 'cancelled');
  assert.equal(await stateOf(pool, schema, grand!), 'cancelled', "a cancelled dependent's dependent: cancelled");
  assert.equal(await stateOf(pool, schema, great!), 'cancelled', 'and the level below');
  assert.equal(await stateOf(pool, schema, waitKid!), 'waiting');
  assert.deepEqual(await usage(q), { queue: q, waiting: 1, blocked: 1 });
  // Retried, it comes back (appended by retry_dead without the mark: its edges are watched).
  await pool.query(`SELECT * FROM ${S}.retry_dead(ARRAY[$1::bigint])`, [p]);
  assert.deepEqual(await usage(q), { queue: q, waiting: 1, blocked: 0 }, 'no longer blocked');
  const [again] = await claimIds(pool, schema, [p!], q);
  await completeAndRelease(pool, schema, [again!]);
  await settleTicks();
  assert.equal(await stateOf(pool, schema, waitKid!), 'ready', 'the wait dependent runs');
  assert.equal(await stateOf(pool, schema, cancelKid!), 'cancelled', 'a cancelled one stays cancelled');
});

test('regression (review): a running parent cancelled by an operator (no actor given): every dependent cancelled, whatever its policy', async () => {
  const q = 'f-cancel-running';
  const [p, c1, c2] = await graph(pool, schema, [
    { name: 'p', queue: q, ref: 'p' },
    { name: 'c1', queue: q, dependsOn: [{ ref: 'p' }] },
    { name: 'c2', queue: q, dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
  ]);
  await claimIds(pool, schema, [p!], q);
  assert.equal(await cancelTask(pool, schema, p!), 'cancelled');
  assert.equal(await stateOf(pool, schema, p!), 'cancelled');
  await settleTicks();
  assert.equal(await stateOf(pool, schema, c1!), 'cancelled');
  assert.equal(await stateOf(pool, schema, c2!), 'cancelled', 'wait policy too: nothing can complete the parent');
});

test('a pending parent cancelled, deleted while ready or while scheduled: every dependent cancelled', async () => {
  for (const how of ['cancel-ready', 'delete-ready', 'delete-scheduled'] as const) {
    const q = `f-${how}`;
    const [p, c] = await graph(pool, schema, [
      { name: 'p', queue: q, ref: 'p', ...(how === 'delete-scheduled' ? { delay: 3_600_000 } : {}) },
      { name: 'c', queue: q, dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
    ]);
    if (how === 'cancel-ready') assert.equal(await cancelTask(pool, schema, p!, { actor: 'review' }), 'removed');
    else assert.equal(await deleteTask(pool, schema, p!), 'removed');
    await settleTicks();
    assert.equal(await stateOf(pool, schema, c!), 'cancelled', how);
  }
});

test('regression (review): a dead parent whose dead letter is deleted, or pruned by retention: its wait dependents cancelled by the next tick', async () => {
  for (const how of ['delete', 'retention'] as const) {
    const q = `f-dl-${how}`;
    const [p, c] = await graph(pool, schema, [
      { name: 'p', queue: q, ref: 'p' },
      { name: 'c', queue: q, dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
    ]);
    const [t] = await claimIds(pool, schema, [p!], q);
    await kill(t!);
    await settleTicks();
    assert.equal(await stateOf(pool, schema, c!), 'waiting');
    if (how === 'delete') assert.equal(await deleteTask(pool, schema, p!), 'removed');
    else {
      await pool.query(`UPDATE ${S}.dead_letters SET last_attempted_at = now() - interval '30 days' WHERE id = $1`, [
        p,
      ]);
      await pruneDeadLetters(pool, schema, 1000);
      assert.equal((await pool.query(`SELECT 1 FROM ${S}.dead_letters WHERE id = $1`, [p])).rowCount, 0);
    }
    await settleTicks();
    assert.equal(await stateOf(pool, schema, c!), 'cancelled', `${how}: nothing can retry the parent now`);
    const parent = (await getTask(pool, schema, c!))?.state;
    assert.equal(parent, 'cancelled');
  }
});

test("regression (review): an operator's retry of a waiting task is refused; moving it keeps it waiting and counted in its new queue", async () => {
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue: 'f-op', ref: 'p', delay: 3_600_000 },
    { name: 'c', queue: 'f-op', dependsOn: [{ ref: 'p' }] },
  ]);
  assert.equal(await retryTask(pool, schema, c!), 'waiting_on_parents');
  assert.equal(
    (await pool.query(`SELECT result FROM ${S}.retry_dead(ARRAY[$1::bigint])`, [c])).rows[0].result,
    'not_found',
  );
  await promoteDue(pool, schema);
  assert.equal(await stateOf(pool, schema, c!), 'waiting', 'promotion does not read it');
  assert.equal(await moveTask(pool, schema, c!, { queue: 'f-op-2' }), 'moved');
  assert.equal(await stateOf(pool, schema, c!), 'waiting', 'still waiting after a move');
  assert.deepEqual(await usage('f-op-2'), { queue: 'f-op-2', waiting: 1, blocked: 0 }, 'counted where it now is');
  assert.deepEqual(await usage('f-op'), { queue: 'f-op', waiting: 0, blocked: 0 });
  // Its parent completes: it is released into its new queue.
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE id = $1`, [p]);
  await promoteDue(pool, schema);
  const [t] = await claimIds(pool, schema, [p!], 'f-op');
  assert.equal((await completeAndRelease(pool, schema, [t!])).freed, 1);
  assert.equal((await getTask(pool, schema, c!))?.queue, 'f-op-2');
});

test('regression (review): a waiting dependent cancelled: not counted as waiting, shown as not waiting, and its parents complete as before', async () => {
  const q = 'f-cancel-waiting';
  const [p1, p2, c, g] = await graph(pool, schema, [
    { name: 'p1', queue: q, ref: 'p1' },
    { name: 'p2', queue: q, ref: 'p2' },
    { name: 'c', queue: q, ref: 'c', dependsOn: [{ ref: 'p1' }, { ref: 'p2' }] },
    { name: 'g', queue: q, dependsOn: [{ ref: 'c' }], onParentFailure: 'wait' },
  ]);
  assert.equal(await cancelTask(pool, schema, c!, { actor: 'review' }), 'removed');
  await settleTicks();
  assert.equal(await stateOf(pool, schema, g!), 'cancelled', "the cancelled task's own dependent");
  const [t1, t2] = await claimIds(pool, schema, [p1!, p2!], q);
  assert.equal((await completeAndRelease(pool, schema, [t1!])).freed, 0);
  assert.deepEqual(await usage(q), { queue: q, waiting: 0, blocked: 0 }, 'a cancelled task no longer waits');
  const shown = await dependentsOf(pool, storage, p2!, 10);
  assert.equal(shown.dependents[0]?.waiting, false, 'berth tasks show: not waiting');
  assert.equal((await completeAndRelease(pool, schema, [t2!])).freed, 0, 'nothing to free');
  assert.equal(await stateOf(pool, schema, c!), 'cancelled', 'the last parent does not bring it back');
  assert.equal(await pendingOf(pool, schema, c!), null);
  assert.deepEqual(
    (await edgesOf(pool, schema, c!)).map((e) => e.satisfied),
    [true, true],
  );
});
