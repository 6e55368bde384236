/**
 * Attempt history (issue 13, item 1): every attempt recorded by the statement that settles it,
 * kept after the ring forgets the task, rotated by truncating whole partitions, switchable off.
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  attemptsOf,
  defineTask,
  dequeue,
  enqueue,
  enqueueMany,
  getTask,
  listAttempts,
  listTasks,
  PermanentError,
  readHistorySettings,
  setHistorySettings,
  taskTimeline,
  Worker,
} from '../src/index.js';
import { rescueLapsedLeases, rotateHistory } from '../src/maintenance-api.js';
import { claim, discover, type ClaimedTask } from '../src/processor/claim.js';
import { completeLeases } from '../src/storage/complete.js';
import { claimParams } from './claim-params.js';
import { errorDetail, MAX_STACK_CHARS } from '../src/util/error-detail.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, leaseLapsed, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('history');
const S = `"${schema}"`;

/** Reclaim every ring segment as the leader's prune would once they are settled (as the owner). */
async function forgetRing(): Promise<void> {
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones`);
}

async function claimOne(type: string, ceilingMs = 60_000, marginMs = 0): Promise<ClaimedTask> {
  const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
  const [t] = await claim(
    pool,
    claimParams(schema, lanes, 1, {
      ceilings: new Map([[type, ceilingMs]]),
      defaultCeilingMs: ceilingMs,
      marginMs,
      workerId: 'history-test',
    }),
  );
  assert.ok(t, 'a task was claimed');
  return t;
}

test('a worker records every attempt: success, errors with stack and cause, non-Error throws as JSON, the cursor of continued', async () => {
  let flaky = 0;
  const tasks = [
    defineTask<{ n: number }>({ type: 'ok', ceilingMs: 10_000, handler: async () => undefined }),
    defineTask({
      type: 'flaky',
      ceilingMs: 10_000,
      backoff: { baseMs: 1, maxMs: 1 },
      handler: async () => {
        flaky++;
        if (flaky === 1) throw new Error('outer failure', { cause: new TypeError('inner cause') });
        return 'done';
      },
    }),
    defineTask({
      type: 'object-throw',
      ceilingMs: 10_000,
      maxAttempts: 2,
      backoff: { baseMs: 1, maxMs: 1 },
      handler: async () => {
        throw { code: 42 };
      },
    }),
    defineTask({
      type: 'fatal',
      ceilingMs: 10_000,
      handler: async () => {
        throw new PermanentError('never works');
      },
    }),
    defineTask<{ page: number }>({
      type: 'sliced',
      ceilingMs: 10_000,
      handler: async (p, ctx) => {
        if (p.page < 2) {
          await ctx.advanceCursor({ page: p.page + 1 });
          return 'continue';
        }
        return 'done';
      },
    }),
  ];
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    slots: 4,
    logger,
    maintenance: FAST_MAINTENANCE,
  });
  await w.start();
  try {
    const ok = (await enqueue(pool, 'ok', { n: 1 }, { schema })).id!;
    const flakyId = (await enqueue(pool, 'flaky', {}, { schema })).id!;
    const objectId = (await enqueue(pool, 'object-throw', {}, { schema })).id!;
    const fatalId = (await enqueue(pool, 'fatal', {}, { schema })).id!;
    const slicedId = (await enqueue(pool, 'sliced', { page: 0 }, { schema })).id!;
    await waitFor(
      async () => {
        const states = await Promise.all(
          [ok, flakyId, objectId, fatalId, slicedId].map(async (id) => (await getTask(pool, schema, id))?.state),
        );
        return states.join() === 'completed,completed,dead,dead,completed';
      },
      60_000,
      'every task to finish',
    );

    const [okAttempt, ...more] = await attemptsOf(pool, schema, ok);
    assert.equal(more.length, 0);
    assert.equal(okAttempt?.outcome, 'success');
    assert.equal(okAttempt?.attempt, 1);
    assert.equal(okAttempt?.type, 'ok');
    assert.equal(okAttempt?.queue, 'default');
    assert.match(okAttempt?.worker ?? '', /.+/);
    assert.ok(okAttempt!.settledAt >= okAttempt!.claimedAt);
    assert.ok(okAttempt!.runMs !== null && okAttempt!.runMs >= 0, 'the handler time is kept');

    const flakyAttempts = await attemptsOf(pool, schema, flakyId);
    assert.deepEqual(
      flakyAttempts.map((a) => [a.attempt, a.outcome]),
      [
        [1, 'failure'],
        [2, 'success'],
      ],
    );
    const err = flakyAttempts[0]!.error!;
    assert.equal(err.message, 'outer failure');
    assert.match(err.stack ?? '', /outer failure\n\s+at /);
    assert.equal(err.cause?.message, 'inner cause');
    assert.equal(err.cause?.name, 'TypeError');

    const objectAttempts = await attemptsOf(pool, schema, objectId);
    assert.deepEqual(
      objectAttempts.map((a) => [a.attempt, a.outcome, a.error?.message, a.dead]),
      [
        [1, 'failure', '{"code":42}', false],
        [2, 'failure', '{"code":42}', true],
      ],
    );
    assert.equal((await getTask(pool, schema, objectId))?.lastError, '{"code":42}', 'not [object Object]');

    const fatal = await attemptsOf(pool, schema, fatalId);
    assert.deepEqual(
      fatal.map((a) => [a.outcome, a.error?.name, a.dead]),
      [['failure', 'PermanentError', true]],
    );

    const sliced = await attemptsOf(pool, schema, slicedId);
    assert.deepEqual(
      sliced.map((a) => [a.outcome, a.cursor]),
      [
        ['continued', { page: 1 }],
        ['continued', { page: 2 }],
        ['success', null],
      ],
    );

    // The ring forgets them; history still answers.
    await w.stop();
    await forgetRing();
    const done = await getTask(pool, schema, ok);
    assert.equal(done?.state, 'completed');
    assert.equal(done?.source, 'history');
    assert.equal(done?.type, 'ok');
    assert.equal(done?.queue, 'default');
    assert.equal(done?.payload, null, 'history keeps no payload');
    const listed = await listTasks(pool, schema, { state: 'completed' });
    assert.deepEqual(listed.tasks.map((t) => t.id).sort(), [ok, flakyId, slicedId].sort());
    const all = await listTasks(pool, schema, {});
    assert.equal(new Set(all.tasks.map((t) => t.id)).size, all.tasks.length, 'each task listed once');
    const timeline = await taskTimeline(pool, schema, flakyId);
    const attempts = timeline.filter((e) => e.event === 'attempt');
    assert.deepEqual(
      attempts.map((e) => e.detail.outcome),
      ['failure', 'success'],
    );
    assert.equal((attempts[0]!.detail.error as { message: string }).message, 'outer failure');

    const failures = await listAttempts(pool, schema, { outcome: 'failure' });
    assert.deepEqual(failures.attempts.map((a) => a.id).sort(), [flakyId, objectId, objectId, fatalId].sort());
    const byType = await listAttempts(pool, schema, { type: 'sliced' }, { limit: 2 });
    assert.equal(byType.attempts.length, 2);
    assert.ok(byType.next);
    const rest = await listAttempts(pool, schema, { type: 'sliced' }, { limit: 2, after: byType.next });
    assert.equal(rest.attempts.length, 1);
    assert.equal(rest.next, null);
    assert.deepEqual(
      [...byType.attempts, ...rest.attempts].map((a) => a.outcome),
      ['success', 'continued', 'continued'],
      'newest first',
    );
    assert.equal((await listAttempts(pool, schema, { queue: 'nope' })).attempts.length, 0);
    assert.equal((await listAttempts(pool, schema, { type: 'sliced', since: new Date(0) })).attempts.length, 3);
    assert.equal((await listAttempts(pool, schema, { type: 'sliced', before: new Date(0) })).attempts.length, 0);
    const mid = byType.attempts[1]!.settledAt;
    assert.ok(
      (await listAttempts(pool, schema, { type: 'sliced', before: mid })).attempts.every((a) => a.settledAt < mid),
    );
    await assert.rejects(listAttempts(pool, schema, { since: new Date('nope') }), /since must be a valid date/);
    await assert.rejects(listAttempts(pool, schema, {}, { after: 'x' }), /next cursor/);
  } finally {
    await w.stop();
  }
});

test('a handler Dequeue and a rescued lease are recorded; a hand-back is not an attempt', async () => {
  await pool.query(`TRUNCATE ${S}.attempt_history`);
  const a = (await enqueue(pool, 'manual', {}, { schema })).id!;
  const t = await claimOne('manual');
  await dequeue(pool, schema, a, t.token);
  assert.deepEqual(
    (await attemptsOf(pool, schema, a)).map((x) => [x.outcome, x.worker, x.runMs]),
    [['success', 'history-test', null]],
  );

  const b = (await enqueue(pool, 'lapses', {}, { schema })).id!;
  const lapsed = await claimOne('lapses', 50);
  await leaseLapsed(pool, lapsed.leaseExpiresAt);
  const r = await rescueLapsedLeases(pool, schema);
  assert.equal(r.retried, 1);
  const [rescued] = await attemptsOf(pool, schema, b);
  assert.equal(rescued?.outcome, 'lost');
  assert.match(rescued?.error?.message ?? '', /lease lapsed .* \(worker history-test\)/);
});

test('a batched completion records each task with its own run time, attempt and creation time, read back from the ring', async () => {
  // Two lanes, several tasks each, completed in one flush with the refs out of lane order: the
  // statement numbers each lease's entries in lane order, so each run time must land on its task.
  await forgetRing();
  for (const shard of [40, 41]) {
    await enqueueMany(
      pool,
      Array.from({ length: 5 }, (_, i) => ({ type: 'batch', payload: { i }, shard })),
      { schema },
    );
  }
  const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
  const got = await claim(
    pool,
    claimParams(schema, lanes, 10, { ceilings: new Map([['batch', 60_000]]), workerId: 'history-batch' }),
  );
  assert.equal(got.length, 10);
  const shuffled = [...got].reverse();
  const runMs = shuffled.map((_, i) => 100 + i * 7);
  const settled = await completeLeases(pool, storageFor(schema), shuffled, runMs);
  assert.equal(settled.size, 10);
  const created = new Map(
    (await pool.query<{ id: string; created_at: Date }>(`SELECT id::text, created_at FROM ${S}.ready`)).rows.map(
      (r) => [r.id, r.created_at.getTime()],
    ),
  );
  for (const [i, t] of shuffled.entries()) {
    const [a, ...more] = await attemptsOf(pool, schema, t.id);
    assert.equal(more.length, 0, `one attempt for ${t.id}`);
    assert.equal(a!.outcome, 'success');
    assert.equal(a!.runMs, runMs[i], `the run time of task ${t.id}`);
    assert.equal(a!.attempt, 1);
    assert.equal(a!.type, 'batch');
    assert.equal(a!.worker, 'history-batch');
    assert.equal(a!.createdAt.getTime(), created.get(t.id), 'created_at as the ring holds it');
  }
});

test('with history off nothing is written; turning it back on resumes', async () => {
  await pool.query(`TRUNCATE ${S}.attempt_history`);
  await setHistorySettings(pool, schema, { enabled: false });
  try {
    const id = (await enqueue(pool, 'off', {}, { schema })).id!;
    const t = await claimOne('off');
    await dequeue(pool, schema, id, t.token);
    assert.equal(Number((await pool.query(`SELECT count(*) AS n FROM ${S}.attempt_history`)).rows[0].n), 0);
    assert.equal((await getTask(pool, schema, id))?.state, 'completed', 'the settlement itself is unchanged');
  } finally {
    await setHistorySettings(pool, schema, { enabled: true });
  }
  const id = (await enqueue(pool, 'on', {}, { schema })).id!;
  const t = await claimOne('on');
  await dequeue(pool, schema, id, t.token);
  assert.equal((await attemptsOf(pool, schema, id)).length, 1);
  await assert.rejects(setHistorySettings(pool, schema, { retentionMs: 10 }), /retentionMs/);
  await assert.rejects(
    setHistorySettings(pool, schema, { keep: 1 } as unknown as { enabled: boolean }),
    /unknown history setting/,
  );
});

test('rotation truncates whole partitions: a row lives at least the retention and is gone after the ring wraps', async () => {
  await pool.query(`TRUNCATE ${S}.attempt_history`);
  await setHistorySettings(pool, schema, { retentionMs: 7000 });
  const st = await readHistorySettings(pool, schema);
  assert.equal(st.partitions, 8);
  await pool.query(`UPDATE ${S}.history_state SET rotated_at = now()`);
  assert.equal(
    await rotateHistory(pool, schema, 100),
    'not_due',
    'the current partition is younger than retention / 7',
  );
  const id = (await enqueue(pool, 'rot', {}, { schema })).id!;
  const t = await claimOne('rot');
  await dequeue(pool, schema, id, t.token);
  const age = `UPDATE ${S}.history_state SET rotated_at = now() - interval '1 hour'`;
  // Seven rotations: the row's partition is one of the eight, never the one reclaimed.
  for (let i = 0; i < 7; i++) {
    await pool.query(age);
    assert.equal(await rotateHistory(pool, schema, 100), 'rotated');
    assert.equal((await attemptsOf(pool, schema, id)).length, 1, `kept after ${i + 1} rotations`);
  }
  await pool.query(age);
  assert.equal(await rotateHistory(pool, schema, 100), 'rotated');
  assert.equal((await attemptsOf(pool, schema, id)).length, 0, 'its partition was truncated on the eighth');
  assert.equal((await readHistorySettings(pool, schema)).generation, st.generation + 8);

  // A reader holding the next partition blocks the truncate within the lock timeout, not forever.
  const reader = await pool.connect();
  try {
    const next = ((await readHistorySettings(pool, schema)).currentPartition + 1) % 8;
    await reader.query('BEGIN');
    await reader.query(`SELECT count(*) FROM ${S}."attempt_history_${next}"`);
    await pool.query(age);
    assert.equal(await rotateHistory(pool, schema, 50), 'blocked');
  } finally {
    await reader.query('ROLLBACK');
    reader.release();
  }
  assert.equal(await rotateHistory(pool, schema, 100), 'rotated');
  await setHistorySettings(pool, schema, { retentionMs: 86_400_000 });
});

test('an error detail is bounded and storable', () => {
  const long = new Error('x'.repeat(10_000));
  long.stack = 'y'.repeat(50_000);
  let e: Error = long;
  for (let i = 0; i < 10; i++) e = new Error(`level ${i}`, { cause: e });
  const d = errorDetail(e);
  let depth = 0;
  for (let c: typeof d | undefined = d; c; c = c.cause) depth++;
  assert.equal(depth, 4, 'the cause chain is cut');
  const deep = errorDetail(long);
  assert.ok(deep.message.length < 2100);
  assert.ok((deep.stack ?? '').length < MAX_STACK_CHARS + 100);
  assert.equal(errorDetail('a\u0000b\ud800').message, 'a\ufffdb\ufffd');
  const cyclic: Record<string, unknown> = { n: 1n };
  cyclic.self = cyclic;
  assert.equal(errorDetail(cyclic).message, '{"n":"1","self":"[circular]"}');
  const coded = Object.assign(new Error('with code'), { code: 'E_X', status: 503 });
  assert.equal(errorDetail(coded).data, '{"code":"E_X","status":503}');
});
