import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  audited,
  BerthInputError,
  cancelTask,
  defineTask,
  deleteTask,
  enqueue,
  enqueueMany,
  getTask,
  laneStats,
  leaderInfo,
  listAudit,
  listDead,
  listQueues,
  listTasks,
  listWorkers,
  pauseQueue,
  purgeDead,
  resumeQueue,
  retryDead,
  retryTask,
  taskCounts,
  taskTimeline,
  setHistorySettings,
  throughput,
  Worker,
  laneActivity,
} from '../src/index.js';
import { claim } from '../src/processor/claim.js';
import { completeLeases } from '../src/storage/complete.js';
import { claimParams } from './claim-params.js';
import { counterValue, DATABASE_URL, FAST_MAINTENANCE, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('admin');
const S = `"${schema}"`;

async function reset(): Promise<void> {
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters,
                    ${S}.dedupe, ${S}.queue_pauses, ${S}.workers, ${S}.outcome_counts, ${S}.audit_log`);
  await pool.query(`UPDATE ${S}.lanes SET paused = false`);
}

async function claimAll(limit = 100) {
  const lanes = (await pool.query(`SELECT lane_id FROM ${S}.lanes`)).rows.map((r) => r.lane_id as number);
  return claim(pool, claimParams(schema, lanes, limit, { workerId: 'adm' }));
}

/** A dead letter as a worker would leave it: attempts spent, last error recorded. */
async function killTask(id: string, error = 'boom'): Promise<void> {
  await pool.query(
    `INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key, last_error, created_at, last_attempted_at)
     SELECT id, type, payload, queue, priority, shard, 3, 3, dedupe_key, $2, created_at, now() FROM ${S}.deferred WHERE id = $1`,
    [id, error],
  );
  await pool.query(`DELETE FROM ${S}.deferred WHERE id = $1`, [id]);
  await pool.query(`DELETE FROM ${S}.dedupe WHERE id = $1`, [id]);
}

async function deadTask(
  type: string,
  opts: { queue?: string; error?: string; dedupeKey?: string } = {},
): Promise<string> {
  const r = await enqueue(
    pool,
    type,
    { n: 1 },
    { schema, queue: opts.queue, runAt: new Date(Date.now() + 3600_000), dedupeKey: opts.dedupeKey },
  );
  await killTask(r.id!, opts.error);
  return r.id!;
}

test('listTasks: filters by state, queue and type; keyset pages cover everything exactly once', async () => {
  await reset();
  const ids: string[] = [];
  for (let i = 0; i < 7; i++)
    ids.push((await enqueue(pool, i % 2 ? 'odd' : 'even', { i }, { schema, queue: i < 5 ? 'a' : 'b' })).id!);
  const later = await enqueue(pool, 'even', {}, { schema, queue: 'a', runAt: new Date(Date.now() + 3600_000) });
  const dead = await deadTask('odd', { queue: 'b' });
  const [leased] = await claimAll(1);
  assert.ok(leased);

  const seen: string[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await listTasks(pool, schema, {}, { limit: 3, after });
    seen.push(...page.tasks.map((t) => t.id));
    if (!page.next) break;
    after = page.next;
  }
  const all = [...ids, later.id!, dead].sort((x, y) => Number(y) - Number(x));
  assert.deepEqual(seen, all, 'newest first, each task once');

  assert.deepEqual(
    (await listTasks(pool, schema, { state: 'scheduled' })).tasks.map((t) => t.id),
    [later.id],
  );
  assert.deepEqual(
    (await listTasks(pool, schema, { state: 'dead' })).tasks.map((t) => t.id),
    [dead],
  );
  assert.deepEqual(
    (await listTasks(pool, schema, { state: 'running' })).tasks.map((t) => t.id),
    [leased.id],
  );
  const running = (await listTasks(pool, schema, { state: 'running' })).tasks[0]!;
  assert.equal(running.worker, 'adm');
  assert.ok(running.leaseExpiresAt);
  assert.deepEqual(
    (await listTasks(pool, schema, { queue: 'b', type: 'odd' })).tasks.map((t) => t.id).sort(),
    [ids[5]!, dead].sort(),
  );
  assert.equal((await listTasks(pool, schema, { state: 'ready' })).tasks.length, 6);

  await completeLeases(pool, storageFor(schema), [leased]);
  const completed = await listTasks(pool, schema, { state: 'completed' });
  assert.deepEqual(
    completed.tasks.map((t) => t.id),
    [leased.id],
  );
  assert.ok(completed.tasks[0]!.finishedAt);
});

test('listTasks and friends refuse bad input with a clear error', async () => {
  await assert.rejects(listTasks(pool, schema, { state: 'finished' as never }), BerthInputError);
  await assert.rejects(listTasks(pool, schema, {}, { after: '1; drop table x' }), BerthInputError);
  await assert.rejects(listTasks(pool, schema, {}, { limit: 0 }), BerthInputError);
  await assert.rejects(cancelTask(pool, schema, 'abc'), BerthInputError);
  await assert.rejects(retryDead(pool, schema, {}), /needs a filter .* or all/);
  await assert.rejects(purgeDead(pool, schema, {}), /needs a filter .* or all/);
});

test('retryTask: a dead letter goes back to ready with a fresh attempt budget; a scheduled task becomes due', async () => {
  await reset();
  const dead = await deadTask('r', { error: 'disk full' });
  assert.equal(await retryTask(pool, schema, dead), 'retried');
  const t = await getTask(pool, schema, dead);
  assert.equal(t?.state, 'ready');
  assert.equal(t?.attempts, 0);
  assert.equal(t?.lastError, 'disk full', 'the last error is kept as history');
  assert.equal((await listDead(pool, schema)).deadLetters.length, 0);

  const sched = await enqueue(pool, 'r', {}, { schema, runAt: new Date(Date.now() + 3600_000) });
  assert.equal(await retryTask(pool, schema, sched.id!), 'retried');
  const due = await pool.query(`SELECT run_at <= now() AS due FROM ${S}.deferred WHERE id = $1`, [sched.id]);
  assert.equal(due.rows[0].due, true);
  assert.equal(await retryTask(pool, schema, dead), 'not_retryable', 'already ready');
  assert.equal(await retryTask(pool, schema, '999999999'), 'not_found');
});

test('a dead letter whose dedupe key a live task holds is not retried (at most one live task per key)', async () => {
  await reset();
  const dead = await deadTask('k', { dedupeKey: 'org:1' });
  const live = await enqueue(pool, 'k', {}, { schema, dedupeKey: 'org:1' });
  assert.equal(live.state, 'ready');
  assert.equal(await retryTask(pool, schema, dead), 'duplicate');
  assert.equal((await getTask(pool, schema, dead))?.state, 'dead');
  await cancelTask(pool, schema, live.id!);
  assert.equal(await retryTask(pool, schema, dead), 'retried');
  const again = await enqueue(pool, 'k', {}, { schema, dedupeKey: 'org:1' });
  assert.equal(again.state, 'duplicate', 'the retried task holds its key again');
});

test('cancel and delete: pending tasks are removed, running ones cancelled (delete leaves them alone), dead letters only by delete', async () => {
  await reset();
  const a = await enqueue(pool, 'c', {}, { schema });
  const b = await enqueue(pool, 'c', {}, { schema });
  const [leased] = await claimAll(1);
  assert.equal(leased?.id, a.id);
  assert.equal(await deleteTask(pool, schema, a.id!), 'running');
  assert.equal(await cancelTask(pool, schema, a.id!), 'cancelled');
  assert.equal(await cancelTask(pool, schema, b.id!), 'removed');
  assert.equal((await getTask(pool, schema, b.id!))?.state, 'cancelled', 'a cancelled task stays visible');
  const dead = await deadTask('c');
  assert.equal(await cancelTask(pool, schema, dead), 'not_found');
  assert.equal(await deleteTask(pool, schema, dead), 'removed');
  assert.equal(await getTask(pool, schema, dead), null);
});

test('bulk dead-letter retry and purge by filter, with progress; the filter is honoured', async () => {
  await reset();
  const mine: string[] = [];
  for (let i = 0; i < 25; i++)
    mine.push(await deadTask('bulk', { queue: 'q1', error: i % 5 === 0 ? 'Timeout talking to S3' : 'bad input' }));
  const other = await deadTask('other', { queue: 'q2' });
  const progress: number[] = [];
  const r = await retryDead(pool, schema, { type: 'bulk', errorContains: 'timeout' }, (p) => progress.push(p.done));
  assert.deepEqual(r, { matched: 5, changed: 5, duplicates: 0 });
  assert.deepEqual(progress, [5]);
  const p = await purgeDead(pool, schema, { queue: 'q1' });
  assert.equal(p.changed, 20);
  assert.deepEqual(
    (await listDead(pool, schema)).deadLetters.map((d) => d.id),
    [other],
  );
  assert.equal((await purgeDead(pool, schema, { all: true })).changed, 1);
});

test('a paused queue is not claimed; enqueue goes on; resuming lets a worker run it', async () => {
  await reset();
  const before = await enqueue(pool, 'p', {}, { schema, queue: 'paused-q' });
  assert.equal((await pauseQueue(pool, schema, 'paused-q', 'test:alice', 'incident 42')).lanes, 1);
  const during = await enqueue(pool, 'p', {}, { schema, queue: 'paused-q' });
  // A lane opened while the queue is paused starts paused.
  const otherPriority = await enqueue(pool, 'p', {}, { schema, queue: 'paused-q', priority: 3 });
  const free = await enqueue(pool, 'p', {}, { schema, queue: 'free-q' });
  const got = await claimAll(100);
  assert.deepEqual(
    got.map((t) => t.id),
    [free.id],
    'only the unpaused queue is claimed',
  );
  const q = (await listQueues(pool, schema)).find((x) => x.queue === 'paused-q');
  assert.equal(q?.paused, true);
  assert.equal(q?.pausedBy, 'test:alice');
  assert.equal(q?.reason, 'incident 42');
  assert.ok((await laneStats(pool, schema)).filter((l) => l.queue === 'paused-q').every((l) => l.paused));

  await resumeQueue(pool, schema, 'paused-q', 'test:alice');
  const after = await claimAll(100);
  assert.deepEqual(after.map((t) => t.id).sort(), [before.id, during.id, otherPriority.id].sort());
});

test('laneStats: depth and oldest due from index probes; taskCounts by queue and type', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 5 }, () => ({ type: 's', payload: {}, queue: 'stats-q', shard: 0 })),
    { schema },
  );
  await claimAll(2);
  const lane = (await laneStats(pool, schema)).find((l) => l.queue === 'stats-q')!;
  assert.equal(lane.depth, 3);
  assert.ok(lane.oldestDueSeconds >= 0);
  assert.deepEqual((await laneActivity(pool, schema)).get(lane.laneId), { running: 2, dead: 0 });
  const counts = (await taskCounts(pool, schema)).find((c) => c.queue === 'stats-q');
  assert.deepEqual(counts, { queue: 'stats-q', type: 's', pending: 5, running: 2, dead: 0 });
});

test('a worker heartbeats its row and outcome counts; the leader is visible with branch stats; a clean stop removes the row', async () => {
  await reset();
  const def = defineTask({ type: 'hb', queue: 'hbq', ceilingMs: 10_000, handler: async () => {} });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    pollIntervalMs: 100,
    logger: testLogger,
    workerId: 'hb-worker',
    heartbeatIntervalMs: 100,
    maintenance: FAST_MAINTENANCE,
  });
  await w.start();
  try {
    await enqueueMany(
      pool,
      Array.from({ length: 4 }, () => ({ type: 'hb', payload: {}, queue: 'hbq' })),
      { schema },
    );
    const points = await waitFor(
      async () => {
        const t = await throughput(pool, schema, 5);
        return t.reduce((n, p) => n + (p.type === 'hb' && p.outcome === 'success' ? p.count : 0), 0) === 4 ? t : null;
      },
      10_000,
      'outcome counts flushed',
    );
    assert.ok(points.every((p) => p.queue === 'hbq'));
    assert.equal(
      await counterValue(w.metrics, 'berth_task_wait_seconds_count', { task_type: 'hb' }),
      4,
      'each claim records how long its task waited',
    );
    const workers = await listWorkers(pool, schema);
    assert.equal(workers.length, 1, JSON.stringify(workers));
    assert.equal(workers[0]?.workerId, 'hb-worker');
    assert.equal(workers[0]?.alive, true);
    const leader = await waitFor(
      async () => {
        const l = await leaderInfo(pool, schema);
        return l.session && l.worker?.maintenance.branches?.promote ? l : null;
      },
      10_000,
      'leader with branch stats',
    );
    assert.match(leader.session!.applicationName, /hb-worker/);
    assert.ok(leader.worker!.maintenance.branches!.promote!.runs > 0);
  } finally {
    await w.stop();
  }
  assert.deepEqual(await listWorkers(pool, schema), []);
  assert.equal((await leaderInfo(pool, schema)).session, null);
});

test('audited: every action is recorded with who did it, including failures', async () => {
  await reset();
  const r = await audited(pool, schema, testLogger, 'cli:bob', 'queue.pause', { queue: 'x' }, () =>
    pauseQueue(pool, schema, 'x', 'cli:bob'),
  );
  assert.deepEqual(r, { lanes: 0 });
  await assert.rejects(
    audited(pool, schema, testLogger, 'cli:bob', 'task.cancel', { id: 'zz' }, () => cancelTask(pool, schema, 'zz')),
  );
  const log = await listAudit(pool, schema);
  assert.equal(log.length, 2);
  assert.equal(log[0]!.action, 'task.cancel');
  assert.deepEqual(log[0]!.result, {
    error: 'bad task id "zz": expected a positive integer up to 9223372036854775807',
  });
  assert.equal(log[1]!.actor, 'cli:bob');
  assert.deepEqual(log[1]!.target, { queue: 'x' });
});

test('taskTimeline: created, appended, claimed, then the attempt (from attempt history, or the ring when it is off)', async () => {
  await reset();
  const r = await enqueue(pool, 'tl', {}, { schema });
  const [t] = await claimAll(1);
  await completeLeases(pool, storageFor(schema), [t!]);
  const timeline = await taskTimeline(pool, schema, r.id!);
  assert.deepEqual(
    timeline.map((e) => e.event),
    ['created', 'appended', 'claimed', 'attempt'],
  );
  assert.equal(timeline[3]!.detail.outcome, 'success');
  await setHistorySettings(pool, schema, { enabled: false });
  try {
    const off = await enqueue(pool, 'tl', {}, { schema });
    const [u] = await claimAll(1);
    await completeLeases(pool, storageFor(schema), [u!]);
    const events = (await taskTimeline(pool, schema, off.id!)).map((e) => e.event);
    assert.deepEqual(events, ['created', 'appended', 'claimed', 'settled']);
  } finally {
    await setHistorySettings(pool, schema, { enabled: true });
  }
});

test('gauges: a paused queue is exported as paused and left out of oldest-due (pausing must not page as starvation)', async () => {
  await reset();
  const { readGauges } = await import('../src/maintenance-api.js');
  const { BerthMetrics } = await import('../src/index.js');
  const { publishGauges } = await import('../src/maintenance/gauges.js');
  await enqueue(pool, 'g', {}, { schema, queue: 'held', runAt: new Date(Date.now() - 600_000) });
  assert.ok((await readGauges(pool, schema)).oldestDueSeconds >= 590);
  await pauseQueue(pool, schema, 'held', 'test');
  const g = await readGauges(pool, schema);
  assert.equal(g.oldestDueSeconds, 0);
  assert.deepEqual(g.pausedQueues, ['held']);
  const m = new BerthMetrics();
  publishGauges(m, g);
  const text = await m.registry.metrics();
  assert.match(text, /berth_queue_paused\{queue="held"\} 1/);
  assert.match(text, /berth_workers 0/);
});

test('listAudit pages in numeric id order across a power of ten', async () => {
  await reset();
  for (let i = 0; i < 12; i++) await audited(pool, schema, null, 'cli:pager', 'noop', { i }, async () => i);
  const first = await listAudit(pool, schema, { limit: 5 });
  assert.deepEqual(
    first.map((e) => (e.target as { i: number }).i),
    [11, 10, 9, 8, 7],
  );
  const second = await listAudit(pool, schema, { limit: 5, before: first[4]!.id });
  assert.deepEqual(
    second.map((e) => (e.target as { i: number }).i),
    [6, 5, 4, 3, 2],
  );
});

test('a worker, or any admin entry point, refuses an unmigrated schema with the command that fixes it', async () => {
  const { assertMigrated, SchemaNotMigratedError } = await import('../src/index.js');
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema: `t_never_migrated_${process.pid}`,
    tasks: [],
    logger: testLogger,
  });
  await assert.rejects(
    w.start(),
    /is not migrated \(no such tables\): run `berth migrate --schema t_never_migrated_\d+`/,
  );
  await assert.rejects(assertMigrated(pool, 'no_such_schema'), SchemaNotMigratedError);
  await assertMigrated(pool, schema);
  const ids = await import('../src/storage/ids.js');
  assert.equal(ids.isTaskId('9223372036854775807'), true);
  assert.equal(ids.isTaskId('9223372036854775808'), false);
  assert.equal(ids.isTaskId('0'), false);
  await assert.rejects(retryDead(pool, schema, { errorContains: '' }), /error filter must not be empty/);
  await assert.rejects(purgeDead(pool, schema, { queue: ' ' }), /queue filter must not be empty/);
  await assert.rejects(listTasks(pool, schema, {}, { after: '9999999999999999999' }), BerthInputError);
});
