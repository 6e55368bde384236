/**
 * A cancel races the holder's own settlement, rescue and the leader's promotion: whatever the
 * order, of the cancel and what it raced exactly one is written, attempt history says which, and
 * getTask agrees with what happened (a task that runs again never reads as cancelled; a
 * cancelled task never runs again). The interleavings a statement can land in are forced here
 * with table locks rather than hoped for under load.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  BerthInputError,
  cancelTask,
  cancelTasks as cancelMatching,
  enqueue,
  enqueueMany,
  getTask,
  listTasks,
  migrate,
} from '../src/index.js';
import { promoteDueLanes } from '../src/maintenance/promote.js';
import { claimBatch, type ClaimedTask } from '../src/processor/claim.js';
import { quoteIdent, READ_COMMITTED_REQUIRED } from '../src/sql.js';
import { cancelTasks } from '../src/storage/cancel.js';
import { recordFailures } from '../src/storage/fail.js';
import { rescueLapsedLeasesIn } from '../src/storage/rescue.js';
import { releaseLease } from '../src/storage/return.js';
import { storageFor } from '../src/storage/storage.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, freshSchema, leaseLapsed, waitFor } from './helpers.js';
import { enqueueOnLegacy, schemaAtVersion } from './support/legacy-schema.js';

const { schema, pool } = await freshSchema('cancel_races');
const S = quoteIdent(schema);
const storage = storageFor(schema);

/** Enqueue one task of `type` and claim it, as a worker driven by hand. */
async function runningTask(type: string, ceilingMs = 60_000): Promise<ClaimedTask> {
  await enqueue(pool, type, {}, { schema, queue: type });
  const [task] = await claimOf(type, ceilingMs);
  assert.ok(task, 'one task claimed');
  return task;
}

/** Whatever of `queue` a worker could claim now (one task). */
async function claimOf(queue: string, ceilingMs = 60_000): Promise<ClaimedTask[]> {
  const lanes = (await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1`, [queue]))
    .rows;
  const { tasks } = await claimBatch(
    pool,
    claimParams(
      schema,
      lanes.map((r) => r.lane_id),
      1,
      { workerId: 'races', defaultCeilingMs: ceilingMs },
    ),
  );
  return tasks;
}

/** The operator cancel rows attempt history holds for `id`: [state it was cancelled in, actor]. */
async function cancelRows(id: string): Promise<[string, string | null][]> {
  const rows = await pool.query<{ data: string }>(
    `SELECT h.error ->> 'data' AS data FROM ${S}.attempt_history h
      WHERE h.bucket = $1::bigint >> 10 AND $1::bigint = ANY (h.ids)
        AND h.outcome = 'cancelled' AND h.error ->> 'name' = 'Cancel'`,
    [id],
  );
  return rows.rows.map((r) => {
    const d = JSON.parse(r.data) as { state?: string; cancelledBy: string | null };
    return [d.state ?? 'none', d.cancelledBy];
  });
}

/** A client of its own, for a transaction the test holds open. */
async function session(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  c.on('error', () => undefined);
  await c.connect();
  return c;
}

/** Waits until a backend of `query`'s text waits for a heavyweight lock. */
async function waitingOnLock(like: string): Promise<void> {
  await waitFor(
    async () =>
      (
        await pool.query(
          `SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1 AND pid <> pg_backend_pid()`,
          [`%${like}%`],
        )
      ).rowCount,
    20_000,
    `a statement like ${like} waiting for a lock`,
  );
}

/**
 * The settlements that move a running task to deferred storage (a retry), written by `db` in the
 * transaction the test holds open. Each test waits for its task's lease to lapse first (a
 * moment for a short ceiling) so rescue may take it.
 */
const TO_DEFERRED: {
  name: string;
  ceilingMs: number;
  lapse: boolean;
  settle(db: pg.Client, t: ClaimedTask): Promise<void>;
}[] = [
  {
    name: 'the holder’s failure',
    ceilingMs: 60_000,
    lapse: false,
    async settle(db, t) {
      const failed = await recordFailures(db, storage, [
        { ref: t, error: 'boom', delayMs: 3_600_000, permanent: false },
      ]);
      assert.equal(failed.size, 1);
    },
  },
  {
    name: 'rescue of its lapsed lease',
    ceilingMs: 200,
    lapse: true,
    async settle(db) {
      // Rescue takes every lapsed lease of the schema: at least this one.
      assert.ok((await rescueLapsedLeasesIn(db, storage)).retried >= 1);
    },
  },
];

for (const { name, ceilingMs, lapse, settle } of TO_DEFERRED) {
  test(`a cancel that first looked in deferred storage before ${name} committed, and then removed the retry, records that it removed it: the task reads as cancelled`, async () => {
    const t = await runningTask(`race_between_${ceilingMs}`, ceilingMs);
    // Lapsed before the transaction begins: rescue reads now(), the transaction's start.
    if (lapse) await leaseLapsed(pool, t.leaseExpiresAt);
    const settler = await session();
    const blocker = await session();
    try {
      // The settlement, written and not yet committed: its retry is in deferred storage, invisible
      // to others.
      await settler.query('BEGIN');
      await settle(settler, t);
      // A SHARE lock request queued behind it: a cancel's row lock (ROW SHARE) passes it, a DELETE
      // (ROW EXCLUSIVE) queues behind it. So the settlement commits between the cancel's first
      // look in deferred storage and any later statement of the cancel that deletes there.
      await blocker.query('BEGIN');
      const share = blocker.query(`LOCK TABLE ${S}.deferred IN SHARE MODE`);
      await waitingOnLock('IN SHARE MODE');
      const cancel = cancelTasks(pool, storage, [t.id], 'test:between');
      await waitingOnLock('cancel_tasks');
      await settler.query('COMMIT');
      await share;
      await blocker.query('COMMIT');
      const result = await cancel;
      assert.equal(result.get(t.id), 'removed', 'the cancel took the retry out of deferred storage');
      assert.equal((await pool.query(`SELECT 1 FROM ${S}.deferred WHERE id = $1`, [t.id])).rowCount, 0);
      const read = await getTask(pool, schema, t.id);
      assert.equal(read?.state, 'cancelled', 'a removed retry reads as cancelled, not as not found');
      assert.equal(read?.cancelled?.actor, 'test:between');
      assert.deepEqual(await cancelRows(t.id), [['retryable', 'test:between']]);
      assert.deepEqual(await claimOf(`race_between_${ceilingMs}`), [], 'it never runs again');
    } finally {
      await settler.end();
      await blocker.end();
    }
  });

  test(`a cancel that settled the attempt first, uncommitted: ${name} waits and is refused; the task reads cancelled while running and never runs again`, async () => {
    const t = await runningTask(`race_first_${ceilingMs}`, ceilingMs);
    if (lapse) await leaseLapsed(pool, t.leaseExpiresAt);
    const canceller = await session();
    try {
      await canceller.query('BEGIN');
      assert.equal((await cancelTasks(canceller, storage, [t.id], 'test:first')).get(t.id), 'cancelled');
      const other = await session();
      try {
        await other.query('BEGIN');
        const settled = settle(other, t).then(
          () => 'written',
          (err: unknown) => (err instanceof assert.AssertionError ? 'refused' : Promise.reject(err)),
        );
        await canceller.query('COMMIT');
        assert.equal(await settled, 'refused');
        await other.query('COMMIT');
      } finally {
        await other.end();
      }
      assert.equal((await pool.query(`SELECT 1 FROM ${S}.deferred WHERE id = $1`, [t.id])).rowCount, 0);
      assert.equal((await getTask(pool, schema, t.id))?.state, 'cancelled');
      assert.deepEqual(await cancelRows(t.id), [['running', 'test:first']]);
      assert.deepEqual(await claimOf(`race_first_${ceilingMs}`), [], 'it never runs again');
    } finally {
      await canceller.end();
    }
  });
}

/** A scheduled task of `queue` made due: the leader's promotion may take it now. */
async function dueDeferred(queue: string): Promise<{ id: string; shard: number }> {
  const { id } = await enqueue(pool, queue, {}, { schema, queue, delay: 3_600_000 });
  const row = await pool.query<{ shard: number }>(
    `UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE id = $1 RETURNING shard`,
    [id],
  );
  return { id: id!, shard: row.rows[0]!.shard };
}

test('a cancel that waits for the leader’s promotion of its due task finds it in the ring: cancelled as ready, recorded once, never run', async () => {
  const { id, shard } = await dueDeferred('race_promote_first');
  const promoter = await session();
  try {
    await promoter.query('BEGIN');
    const moved = await promoter.query(`SELECT ${S}.promote_lane($1, 0::smallint, $2::smallint, 100) AS n`, [
      'race_promote_first',
      shard,
    ]);
    assert.equal(moved.rows[0].n, 1);
    const cancel = cancelTasks(pool, storage, [id], 'test:promote');
    await waitingOnLock('cancel_tasks');
    await promoter.query('COMMIT');
    assert.equal((await cancel).get(id), 'removed');
  } finally {
    await promoter.end();
  }
  assert.equal((await getTask(pool, schema, id))?.state, 'cancelled');
  assert.deepEqual(await cancelRows(id), [['ready', 'test:promote']]);
  assert.deepEqual(await claimOf('race_promote_first'), [], 'the promoted entry is tombstoned: it never runs');
});

test('the leader’s promotion skips a due task a cancel holds: cancelled as scheduled, recorded once, never promoted, never run', async () => {
  const { id } = await dueDeferred('race_cancel_first');
  const canceller = await session();
  try {
    await canceller.query('BEGIN');
    assert.equal((await cancelTasks(canceller, storage, [id], 'test:held')).get(id), 'removed');
    // Promotion takes whatever else of the schema is due, and skips the row the cancel holds.
    await promoteDueLanes(pool, schema, null, 1000, 5_000);
    assert.equal((await pool.query(`SELECT 1 FROM ${S}.ready WHERE id = $1`, [id])).rowCount, 0, 'not promoted');
    await canceller.query('COMMIT');
  } finally {
    await canceller.end();
  }
  await promoteDueLanes(pool, schema, null, 1000, 5_000);
  assert.equal((await pool.query(`SELECT 1 FROM ${S}.ready WHERE id = $1`, [id])).rowCount, 0, 'not promoted');
  assert.equal((await getTask(pool, schema, id))?.state, 'cancelled');
  assert.deepEqual(await cancelRows(id), [['scheduled', 'test:held']]);
  assert.deepEqual(await claimOf('race_cancel_first'), []);
});

test('a cancel of a running task that won, then its worker’s stop releasing it (refused): cancelled, not ready; a release that won first, then the cancel: cancelled too, recorded after the release', async () => {
  const t = await runningTask('race_stop');
  assert.equal((await cancelTasks(pool, storage, [t.id], 'test:stop')).get(t.id), 'cancelled');
  const refused = await releaseLease(pool, storage, t, 'stopped', { outcome: 'cancelled' });
  assert.equal(refused.wrote, false);
  assert.equal((await getTask(pool, schema, t.id))?.state, 'cancelled');

  const u = await runningTask('race_stop');
  assert.equal((await releaseLease(pool, storage, u, 'stopped', { outcome: 'cancelled' })).wrote, true);
  // The stop's release is no cancel: the task is pending again.
  assert.notEqual((await getTask(pool, schema, u.id))?.state, 'cancelled');
  assert.equal((await cancelTasks(pool, storage, [u.id], 'test:stop')).get(u.id), 'removed');
  const read = await getTask(pool, schema, u.id);
  assert.equal(read?.state, 'cancelled');
  const rows = await cancelRows(u.id);
  assert.equal(rows.length, 1, 'one cancel recorded');
  assert.equal(rows[0]![1], 'test:stop');
  assert.deepEqual(await claimOf('race_stop'), [], 'neither runs again');
});

test('a cancel at REPEATABLE READ or SERIALIZABLE is refused with READ_COMMITTED_REQUIRED and changes nothing, by id and by filter', async () => {
  const { id } = await enqueue(pool, 'race_iso', {}, { schema, queue: 'race_iso' });
  for (const level of ['REPEATABLE READ', 'SERIALIZABLE']) {
    const c = await session();
    try {
      await c.query(`BEGIN ISOLATION LEVEL ${level}`);
      await assert.rejects(cancelTask(c, schema, id!, { actor: 'test:iso' }), (err: unknown) => {
        assert.ok(err instanceof BerthInputError, level);
        assert.equal(err.message, READ_COMMITTED_REQUIRED);
        return true;
      });
      await c.query('ROLLBACK');
      await c.query(`BEGIN ISOLATION LEVEL ${level}`);
      await assert.rejects(cancelMatching(c, schema, { queue: 'race_iso' }, { actor: 'test:iso' }), BerthInputError);
      await c.query('ROLLBACK');
    } finally {
      await c.end();
    }
  }
  assert.equal((await getTask(pool, schema, id!))?.state, 'ready');
  assert.deepEqual(await cancelRows(id!), []);
});

test('a bulk cancel by filter of 3,000 pending tasks while the leader promotes the due half: every one cancelled and recorded once, none run, no deadlock', async (t) => {
  const queue = 'race_bulk';
  const n = 1500;
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: queue, payload: { i }, queue })),
    { schema },
  );
  const later = await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: queue, payload: { i }, queue, delay: 3_600_000 })),
    { schema },
  );
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE queue = $1`, [queue]);
  // The leader promotes in small batches, as fast as it can, for as long as the cancel runs.
  let promoting = true;
  let promoted = 0;
  const promoter = (async () => {
    while (promoting) promoted += (await promoteDueLanes(pool, schema, null, 50, 5_000)).promoted;
  })();
  const started = Date.now();
  let result: Awaited<ReturnType<typeof cancelMatching>>;
  try {
    result = await cancelMatching(pool, schema, { queue }, { actor: 'test:bulk' });
  } finally {
    promoting = false;
    await promoter;
  }
  t.diagnostic(`bulk cancel of ${2 * n} tasks: ${Date.now() - started} ms, ${promoted} promoted meanwhile`);
  assert.equal(result.removed, 2 * n, JSON.stringify(result));
  const recorded = await pool.query<{ tasks: number; rows: number; states: string[] }>(
    `SELECT count(DISTINCT x.id)::int AS tasks, count(*)::int AS rows,
            array_agg(DISTINCT (h.error ->> 'data')::jsonb ->> 'state') AS states
       FROM ${S}.attempt_history h CROSS JOIN LATERAL unnest(h.ids) x(id)
      WHERE h.type = $1 AND h.outcome = 'cancelled' AND h.error ->> 'name' = 'Cancel'`,
    [queue],
  );
  assert.equal(recorded.rows[0]!.tasks, 2 * n, 'every task recorded');
  assert.equal(recorded.rows[0]!.rows, 2 * n, 'each once');
  assert.equal((await pool.query(`SELECT 1 FROM ${S}.deferred WHERE queue = $1`, [queue])).rowCount, 0);
  assert.deepEqual(await claimOf(queue), [], 'nothing left to run');
  for (const { id } of later.slice(0, 20)) assert.equal((await getTask(pool, schema, id!))?.state, 'cancelled');
  const listed = await listTasks(pool, schema, { state: 'cancelled', queue }, { limit: 100 });
  assert.equal(listed.tasks.length, 100);
});

test('migration 25 on a schema with attempt history: the index is built and valid, a task cancelled while running before it reads as cancelled by its actor, a run a stop interrupted does not', async () => {
  const legacy = `${schema}_v24`;
  const L = quoteIdent(legacy);
  const c = await session();
  try {
    await schemaAtVersion(c, legacy, 24);
    const legacyStorage = storageFor(legacy);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push(await enqueueOnLegacy(c, legacy, 'legacy', { i }));
    const lanes = (await c.query<{ lane_id: number }>(`SELECT lane_id FROM ${L}.lanes`)).rows.map((r) => r.lane_id);
    // This version's claim reads lanes.limited (migration 28) and ready.has_dependents (migration
    // 31), which a version-24 schema has not: the columns are lent for the claim and taken back
    // before the migrations add them.
    await c.query(`ALTER TABLE ${L}.lanes ADD COLUMN limited boolean NOT NULL DEFAULT false`);
    await c.query(`ALTER TABLE ${L}.ready ADD COLUMN has_dependents boolean`);
    const { tasks } = await claimBatch(c, claimParams(legacy, lanes, 3, { workerId: 'v24' }));
    await c.query(`ALTER TABLE ${L}.lanes DROP COLUMN limited`);
    await c.query(`ALTER TABLE ${L}.ready DROP COLUMN has_dependents`);
    assert.equal(tasks.length, 3);
    const [cancelled, stopped, ready] = tasks as [ClaimedTask, ClaimedTask, ClaimedTask];
    // Version 24's cancel (its cancel_tasks(), called as its client called it: this version's
    // client also watches the task's dependents, migration 31) of a running task; a stop's
    // release (outcome `cancelled`, no cancel).
    const cancelV24 = async (id: string) =>
      (await c.query<{ result: string }>(`SELECT result FROM ${L}.cancel_tasks(ARRAY[$1::bigint], 'cli:old')`, [id]))
        .rows[0]?.result;
    assert.equal(await cancelV24(cancelled.id), 'cancelled');
    assert.equal((await releaseLease(c, legacyStorage, stopped, 'stopped', { outcome: 'cancelled' })).wrote, true);
    // Version 24's cancel of a pending task records nothing: it reads as not found, before and after.
    assert.equal((await releaseLease(c, legacyStorage, ready, 'stopped', { outcome: 'continued' })).wrote, true);
    assert.equal(await cancelV24(ready.id), 'removed');
    await migrate({ client: c, schema: legacy });
    const index = await c.query<{ valid: boolean }>(
      `SELECT bool_and(i.indisvalid) AS valid FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
        WHERE x.relname LIKE 'attempt_history%cancelled%' AND x.relnamespace = $1::regnamespace`,
      [legacy],
    );
    assert.equal(index.rows[0]!.valid, true);
    const read = await getTask(c, legacy, cancelled.id);
    assert.equal(read?.state, 'cancelled');
    assert.equal(read?.cancelled?.actor, 'cli:old');
    assert.notEqual((await getTask(c, legacy, stopped.id))?.state, 'cancelled', 'the stop released it: pending');
    assert.equal(await getTask(c, legacy, ready.id), null);
    const listed = await listTasks(c, legacy, { state: 'cancelled' });
    assert.deepEqual(
      listed.tasks.map((x) => x.id),
      [cancelled.id],
    );
  } finally {
    await c.query(`DROP SCHEMA IF EXISTS ${L} CASCADE`).catch(() => undefined);
    await c.end();
  }
});
