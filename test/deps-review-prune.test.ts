/**
 * Review of task dependencies (migration 31): the ring prune as the backstop. A producer naming a
 * parent in the ring holds the prune of its segment until it commits (its FOR KEY SHARE on the
 * entry), at every isolation level; the BEFORE TRUNCATE trigger releases a completed parent's
 * dependents that nothing else did (an older worker's plain completion); a dead letter deleted
 * while a `wait` dependent waits. Each test leaves every entry it appended settled, so the
 * segment it seals can be pruned (this file's own schema: no other file's entries in its ring).
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';

import { BerthInputError } from '../src/index.js';
import { pruneSegment, rotateRing } from '../src/maintenance/ring.js';
import type { ClaimedTask } from '../src/processor/claim.js';
import { dependencyUsage } from '../src/storage/deps.js';
import { recordFailures } from '../src/storage/fail.js';
import { deleteDeadLetter } from '../src/storage/remove.js';
import { storageFor } from '../src/storage/storage.js';
import { freshSchema } from './helpers.js';
import {
  claimIds,
  claimQueue,
  completePlain,
  entries,
  footprint,
  graph,
  session,
  stateOf,
  tick,
} from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_prune');
const S = `"${schema}"`;
const storage = storageFor(schema);
const b = await session();
after(async () => {
  await b.end();
});

/** Settle everything claimable in `queue` (so the segment holds no claimable or running entry). */
async function drain(queue: string): Promise<void> {
  for (;;) {
    const ts = await claimQueue(pool, schema, queue, 100);
    if (ts.length === 0) return;
    await completePlain(pool, schema, ts);
  }
}

/** Seal the current segment (it holds `t`'s entry) and answer it. */
async function seal(t: ClaimedTask): Promise<number> {
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  return t.segment;
}

for (const level of ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'] as const) {
  test(`${level}: a producer naming a running parent holds its segment's prune until it commits; the prune then releases the dependent`, async () => {
    const q = `pr-${level.split(' ')[0]!.toLowerCase()}`;
    const [p] = await graph(pool, schema, [{ name: 'p', queue: q }]);
    const [t] = await claimIds(pool, schema, [p!], q);
    await b.query(`BEGIN ISOLATION LEVEL ${level}`);
    await b.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
    const [c] = await graph(b, schema, [{ name: 'c', queue: q, dependsOn: [p!] }]);
    // The parent completes (an unmarked entry: appended before the edge) and its segment is sealed.
    assert.equal((await completePlain(pool, schema, [t!])).size, 1);
    const segment = await seal(t!);
    const first = await pruneSegment(pool, schema, segment, 200);
    assert.deepEqual(first, { segment, result: 'blocked', reason: 'lock_timeout' }, 'held by the producer');
    await b.query('COMMIT');
    assert.equal(await stateOf(pool, schema, c!), 'waiting');
    const second = await pruneSegment(pool, schema, segment, 5000);
    assert.equal(second.result, 'pruned');
    assert.equal(await stateOf(pool, schema, c!), 'ready', 'released by the prune, before the entry went');
    assert.equal(await entries(pool, schema, c!), 1);
    assert.equal((await tick(pool, schema)).released, 0, 'nothing left for the leader');
    await drain(q);
  });
}

test('REPEATABLE READ: a parent that completed and was pruned after the producer took its snapshot is refused (not lost), and nothing is written', async () => {
  const q = 'pr-old-snapshot';
  const [p] = await graph(pool, schema, [{ name: 'p', queue: q }]);
  const [t] = await claimIds(pool, schema, [p!], q);
  await b.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
  await b.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
  await completePlain(pool, schema, [t!]);
  const segment = await seal(t!);
  assert.equal((await pruneSegment(pool, schema, segment, 5000)).result, 'pruned');
  const before = await footprint(pool, schema);
  let id: string | null = null;
  try {
    id = (await graph(b, schema, [{ name: 'c', queue: q, dependsOn: [p!] }]))[0] ?? null;
    await b.query('COMMIT');
  } catch (e) {
    await b.query('ROLLBACK');
    // The old snapshot sees the segment empty (TRUNCATE) and not the completion's history row.
    assert.ok(e instanceof BerthInputError, `refused as an input error: ${(e as Error).message}`);
    assert.match(
      (e as Error).message,
      /as this transaction's snapshot sees it: if it completed since the transaction began, retry/,
    );
    assert.equal(await footprint(pool, schema), before, 'nothing written');
  }
  if (id !== null) {
    await tick(pool, schema);
    assert.equal(await stateOf(pool, schema, id), 'ready', 'accepted: then released');
    await drain(q);
  }
});

test('an older worker completes a marked parent with the plain statement: the prune releases its dependents before the entry goes', async () => {
  const q = 'pr-old-worker';
  const [p, c1, c2] = await graph(pool, schema, [
    { name: 'p', queue: q, ref: 'p' },
    { name: 'c1', queue: q, dependsOn: [{ ref: 'p' }] },
    { name: 'c2', queue: q, dependsOn: [{ ref: 'p' }] },
  ]);
  const [t] = await claimIds(pool, schema, [p!], q);
  assert.equal(t!.hasDependents, true);
  await completePlain(pool, schema, [t!]);
  assert.equal((await tick(pool, schema)).released, 0, 'sure edges: the tick does not look');
  const segment = await seal(t!);
  assert.equal((await pruneSegment(pool, schema, segment, 5000)).result, 'pruned');
  for (const c of [c1!, c2!]) {
    assert.equal(await stateOf(pool, schema, c), 'ready');
    assert.equal(await entries(pool, schema, c), 1);
  }
  await drain(q);
});

test('regression (review): a dead parent whose dead letter is deleted: its `wait` dependent is cancelled by the next tick (nothing can retry the parent now)', async () => {
  const q = 'pr-dead-deleted';
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue: q, ref: 'p' },
    { name: 'c', queue: q, dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
  ]);
  const [t] = await claimIds(pool, schema, [p!], q);
  assert.equal(
    (await recordFailures(pool, storage, [{ ref: t!, error: 'boom', delayMs: 0, permanent: true }])).get(
      `${t!.laneId}:${t!.laneSeq}`,
    ),
    'dead',
  );
  await tick(pool, schema);
  assert.equal(await stateOf(pool, schema, c!), 'waiting', 'wait policy: kept');
  assert.deepEqual(
    (await dependencyUsage(pool, storage)).find((r) => r.queue === q),
    { queue: q, waiting: 1, blocked: 1 },
    'counted blocked',
  );
  assert.equal(await deleteDeadLetter(pool, storage, p!), true);
  await tick(pool, schema);
  const afterTick = await stateOf(pool, schema, c!);
  // Whatever the tick did, the prune of the parent's segment must settle it.
  await drain(q);
  const segment = await seal(t!);
  assert.equal((await pruneSegment(pool, schema, segment, 5000)).result, 'pruned');
  await tick(pool, schema);
  assert.equal(await stateOf(pool, schema, c!), 'cancelled', 'cancelled once the segment is pruned');
  assert.equal(afterTick, 'cancelled', 'cancelled by the tick after the delete, not only after the prune');
});
