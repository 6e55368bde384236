/**
 * Review of task dependencies (migration 31), invariant A: a dependent is claimable only after
 * every parent completed, never before. The release is staged statement by statement on
 * sessions the test holds: the two last parents of a join completing at once, a completion the
 * fence refuses, a completion flush retried after a connection error (its first try committed
 * unseen, or not), and `release_completed` called directly by a worker role.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { grantRuntimeRole } from '../src/index.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { SettlementBatcher } from '../src/processor/settlement-batcher.js';
import type { Queryable } from '../src/sql.js';
import { storageFor } from '../src/storage/storage.js';
import { DATABASE_URL, freshSchema, takeLeaseOver, testLogger, urlAs } from './helpers.js';
import {
  blockedOnLock,
  bury,
  claimIds,
  completeAndRelease,
  edgesOf,
  entries,
  graph,
  pendingOf,
  pidOf,
  session,
  stateOf,
} from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_release');
const S = `"${schema}"`;
const a = await session();
const b = await session();
after(async () => {
  await a.end();
  await b.end();
});

/** A join over two parents enqueued in one call; answers [p1, p2, join]. */
async function join2(tag: string): Promise<[string, string, string]> {
  const [p1, p2, j] = await graph(pool, schema, [
    { name: `${tag}-p1`, ref: 'p1' },
    { name: `${tag}-p2`, ref: 'p2' },
    { name: `${tag}-join`, dependsOn: [{ ref: 'p1' }, { ref: 'p2' }] },
  ]);
  return [p1!, p2!, j!];
}

test('the two last parents of a join complete on two sessions: the second waits on the counter, the join is freed once, at the second commit', async () => {
  for (const commitFirst of ['a', 'b'] as const) {
    const [p1, p2, j] = await join2(`two-${commitFirst}`);
    const [t1, t2] = await claimIds(pool, schema, [p1, p2]);
    assert.equal(t1!.hasDependents, true, 'a parent of the call is claimed marked');
    assert.equal(t2!.hasDependents, true);
    await a.query('BEGIN');
    await b.query('BEGIN');
    const first = await completeAndRelease(a, schema, [t1!]);
    assert.equal(first.freed, 0, 'one parent of two: nothing freed');
    // B's release must wait for A's lock on the join's counter.
    const second = completeAndRelease(b, schema, [t2!]);
    await blockedOnLock(pool, pidOf(b), "the join's task_waits row");
    assert.equal(await stateOf(pool, schema, j), 'waiting');
    if (commitFirst === 'a') {
      await a.query('COMMIT');
      assert.equal((await second).freed, 1, 'the second parent frees the join');
      assert.equal(await stateOf(pool, schema, j), 'waiting', 'not before the second completion commits');
      await b.query('COMMIT');
    } else {
      // A rolls back: its completion never happened, so B's release frees nothing.
      await a.query('ROLLBACK');
      assert.equal((await second).freed, 0, 'the first parent did not complete');
      await b.query('COMMIT');
      assert.equal(await stateOf(pool, schema, j), 'waiting');
      assert.equal(await pendingOf(pool, schema, j), 1);
      // The lease is still A's to complete: completed now, it frees the join.
      assert.equal((await completeAndRelease(pool, schema, [t1!])).freed, 1);
    }
    assert.equal(await stateOf(pool, schema, j), 'ready');
    assert.equal(await entries(pool, schema, j), 1, 'appended once');
    assert.equal(await pendingOf(pool, schema, j), null, 'the counter row is gone');
    assert.deepEqual(
      (await edgesOf(pool, schema, j)).map((e) => e.satisfied),
      [true, true],
    );
  }
});

test('both last parents release at the same moment, ten times: each join is freed exactly once', async () => {
  for (let i = 0; i < 10; i++) {
    const [p1, p2, j] = await join2(`same-${i}`);
    const [t1, t2] = await claimIds(pool, schema, [p1, p2]);
    // Each session's flush as the batcher sends it (BEGIN, completion, release, COMMIT), both at once.
    const flush = async (c: pg.Client, t: typeof t1) => {
      await c.query('BEGIN');
      const r = await completeAndRelease(c, schema, [t!]);
      await c.query('COMMIT');
      return r;
    };
    const freed = await Promise.all([flush(a, t1), flush(b, t2)]);
    assert.equal(freed[0].freed + freed[1].freed, 1, 'freed by exactly one of the two');
    assert.equal(await entries(pool, schema, j), 1);
    assert.equal(await stateOf(pool, schema, j), 'ready');
  }
});

test('a completion the fence refuses (the lease taken over by rescue) releases nothing, in the batcher or called directly', async () => {
  const [p1, , j] = await join2('fence');
  const [single, kid] = await graph(pool, schema, [
    { name: 'fence-single-p', ref: 'p' },
    { name: 'fence-single-c', dependsOn: [{ ref: 'p' }] },
  ]);
  const [t1, ts] = await claimIds(pool, schema, [p1, single!]);
  await takeLeaseOver(pool, schema, p1);
  await takeLeaseOver(pool, schema, single!);
  const batcher = new SettlementBatcher(pool, storageFor(schema), new BerthMetrics(), testLogger);
  const r = await Promise.all([batcher.complete(t1!), batcher.complete(ts!)]);
  assert.deepEqual(
    r.map((x) => x.kind),
    ['refused', 'refused'],
  );
  assert.equal(await stateOf(pool, schema, kid!), 'waiting', 'a refused completion frees nothing');
  assert.deepEqual(
    (await edgesOf(pool, schema, kid!)).map((e) => e.satisfied),
    [false],
  );
  assert.equal(await pendingOf(pool, schema, j), 2);
  // The same ids handed to release_completed directly, after the refused completion.
  const n = (await pool.query(`SELECT ${S}.release_completed(ARRAY[$1, $2]::bigint[]) AS n`, [p1, single])).rows[0].n;
  assert.equal(n, 0);
  assert.equal(await stateOf(pool, schema, kid!), 'waiting');
});

/** A session whose COMMIT (or release) fails once as a dropped connection would: what the flush sees. */
function flaky(c: pg.Client, failOn: 'commit-after' | 'release-before'): Queryable & { failed: number } {
  const q = {
    failed: 0,
    query: async (...args: unknown[]) => {
      const first = args[0];
      const text = typeof first === 'string' ? first : ((first as { text?: string }).text ?? '');
      const lost = () => {
        q.failed++;
        return Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
      };
      if (failOn === 'commit-after' && text === 'COMMIT' && q.failed === 0) {
        await c.query('COMMIT');
        throw lost();
      }
      if (failOn === 'release-before' && text.includes('release_completed') && q.failed === 0) throw lost();
      return (c.query as (...x: unknown[]) => Promise<unknown>)(...args);
    },
  };
  return q as unknown as Queryable & { failed: number };
}

test('a completion flush holding a marked parent, retried after a connection error: released exactly once whether the first try committed or not', async () => {
  for (const failOn of ['commit-after', 'release-before'] as const) {
    const [p, c] = await graph(pool, schema, [
      { name: `retry-${failOn}-p`, ref: 'p' },
      { name: `retry-${failOn}-c`, dependsOn: [{ ref: 'p' }] },
    ]);
    const [t] = await claimIds(pool, schema, [p!]);
    const db = flaky(a, failOn);
    const batcher = new SettlementBatcher(db, storageFor(schema), new BerthMetrics(), testLogger);
    const r = await batcher.complete(t!);
    assert.equal(db.failed, 1, 'the first try failed as a dropped connection');
    assert.equal(r.kind, 'settled', 'the retry reports the completion');
    assert.equal(await stateOf(pool, schema, c!), 'ready', `${failOn}: the dependent is freed`);
    assert.equal(await entries(pool, schema, c!), 1, `${failOn}: appended once`);
    assert.equal(await pendingOf(pool, schema, c!), null);
    assert.equal(await stateOf(pool, schema, p!), 'completed');
  }
});

test('release_completed called by a worker role with ids that did not complete frees nothing; off READ COMMITTED it refuses', async () => {
  const role = `drev_worker_${process.pid}`;
  const admin = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  await admin.query(`DROP ROLE IF EXISTS "${role}"`);
  await admin.query(`CREATE ROLE "${role}" LOGIN`);
  const w = new pg.Pool({ connectionString: urlAs(role), max: 2 });
  try {
    await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role });
    // Parents in every state but completed: scheduled, ready, running, dead, cancelled, unknown.
    const [sched, , ready, , running, , dead, , cancelled, c5] = await graph(pool, schema, [
      { name: 'w-sched', ref: 's', delay: 3_600_000 },
      { name: 'w-sched-c', dependsOn: [{ ref: 's' }] },
      { name: 'w-ready', ref: 'r', queue: 'dq-other' },
      { name: 'w-ready-c', dependsOn: [{ ref: 'r' }] },
      { name: 'w-run', ref: 'u' },
      { name: 'w-run-c', dependsOn: [{ ref: 'u' }] },
      { name: 'w-dead', ref: 'd', delay: 3_600_000 },
      { name: 'w-dead-c', dependsOn: [{ ref: 'd' }], onParentFailure: 'wait' },
      { name: 'w-cancel', ref: 'x', delay: 3_600_000 },
      { name: 'w-cancel-c', dependsOn: [{ ref: 'x' }] },
    ]);
    await claimIds(pool, schema, [running!]);
    await bury(pool, schema, dead!);
    await pool.query(`SELECT * FROM ${S}.cancel_tasks(ARRAY[$1::bigint], 'review')`, [cancelled]);
    const before = (await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_deps WHERE satisfied_at IS NOT NULL`))
      .rows[0].n;
    const n = (
      await w.query(`SELECT ${S}.release_completed($1::bigint[]) AS n`, [
        [sched, ready, running, dead, cancelled, c5, '999999999'],
      ])
    ).rows[0].n;
    assert.equal(n, 0, 'nothing freed');
    const afterN = (await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_deps WHERE satisfied_at IS NOT NULL`))
      .rows[0].n;
    assert.equal(afterN, before, 'no edge satisfied');
    const c = await w.connect();
    try {
      await c.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await assert.rejects(c.query(`SELECT ${S}.release_completed(ARRAY[$1::bigint])`, [ready]), /READ COMMITTED/);
      await c.query('ROLLBACK');
    } finally {
      c.release();
    }
    // Nor may the role write the tables the release writes.
    await assert.rejects(w.query(`UPDATE ${S}.task_waits SET pending = 0`), /permission denied/);
    await assert.rejects(w.query(`UPDATE ${S}.task_deps SET satisfied_at = now()`), /permission denied/);
    await assert.rejects(w.query(`SELECT ${S}.free_waiting(ARRAY[1::bigint])`), /permission denied/);
  } finally {
    await w.end();
    await admin.query(`DROP OWNED BY "${role}"`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS "${role}"`).catch(() => undefined);
    await admin.end();
  }
});
