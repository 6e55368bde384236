/**
 * `cancelled` is a task state that stays visible: a task cancelled while ready, scheduled,
 * retryable or running reads as `cancelled`, with who cancelled it and when, from getTask,
 * listTasks, the CLI and the dashboard's API, for as long as attempt history keeps its cancel row
 * (migration 25 records the cancel of a pending task there; a running one's was already
 * recorded). A cancel that lost to the task's own settlement marks nothing; a deleted task and a
 * cancel whose history row has been rotated away read as not found.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  attemptsOf,
  cancelTask,
  cancelTasks,
  defineTask,
  deleteTask,
  enqueue,
  getTask,
  listTasks,
  retryTask,
  setHistorySettings,
  type TaskContext,
  Worker,
  type WorkerOptions,
} from '../src/index.js';
import { rotateHistory } from '../src/maintenance-api.js';
import { runDueTasks } from '../src/testing-api.js';
import { startDashboard } from '../src/dashboard/index.js';
import { quoteIdent } from '../src/sql.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, scaled, testLogger, waitFor } from './helpers.js';
import { httpCall } from './support/http.js';
import { runCli } from './support/run-cli.js';

const { schema, pool } = await freshSchema('cancelled_state');
const S = quoteIdent(schema);

const servers: { close(): Promise<void> }[] = [];
after(async () => {
  for (const s of servers) await s.close();
});

let dashboardUrl: string | undefined;
async function dashboard(): Promise<string> {
  if (dashboardUrl) return dashboardUrl;
  const d = await startDashboard({ connectionString: DATABASE_URL, schema, port: 0, logger: testLogger });
  servers.push(d);
  dashboardUrl = d.url;
  return d.url;
}

function cli(args: readonly string[]) {
  return runCli([...args, '--schema', schema, '--database-url', DATABASE_URL], { BERTH_ACTOR: 'cli:tester' });
}

/** A failing type with a long backoff, so its failed task stays retryable. */
const flaky = defineTask<{ n: number }>({
  type: 'cs_flaky',
  ceilingMs: 30_000,
  maxAttempts: 5,
  backoff: { baseMs: 3_600_000, maxMs: 3_600_000 },
  handler: async () => {
    throw new Error('smtp down');
  },
});
const ok = defineTask<{ n: number }>({ type: 'cs_ok', ceilingMs: 30_000, handler: async () => undefined });

/**
 * What every reader says of a cancelled task: getTask, listTasks({ state: 'cancelled' }), `berth
 * tasks show` and `tasks list --state cancelled`, and the dashboard's task page and filtered list.
 */
async function expectCancelled(id: string, expected: { actor: string | null; attempts: number; type: string }) {
  const before = Date.now();
  const t = await getTask(pool, schema, id);
  assert.ok(t, `task ${id} is found`);
  assert.equal(t.state, 'cancelled');
  assert.equal(t.source, 'history');
  assert.equal(t.payload, null, 'attempt history keeps no payload');
  assert.equal(t.type, expected.type);
  assert.equal(t.attempts, expected.attempts);
  assert.equal(t.lease, null);
  assert.equal(t.cancelled?.actor, expected.actor);
  assert.ok(t.cancelled.at instanceof Date && t.cancelled.at.getTime() <= before + 1000);
  assert.equal(t.finishedAt?.getTime(), t.cancelled.at.getTime());

  const listed = await listTasks(pool, schema, { state: 'cancelled' }, { limit: 500 });
  const row = listed.tasks.find((x) => x.id === id);
  assert.ok(row, 'listTasks({ state: cancelled }) lists it');
  assert.equal(row.state, 'cancelled');
  assert.equal(row.cancelledBy, expected.actor);
  assert.equal(row.attempts, expected.attempts);
  assert.equal(row.finishedAt?.getTime(), t.cancelled.at.getTime());
  const all = await listTasks(pool, schema, {}, { limit: 500 });
  assert.equal(all.tasks.find((x) => x.id === id)?.state, 'cancelled', 'and so does the unfiltered list');

  const show = await cli(['tasks', 'show', id]);
  assert.equal(show.code, 0, show.err);
  assert.match(show.out, new RegExp(`^task ${id}  ${expected.type}  cancelled$`, 'm'));
  assert.match(show.out, new RegExp(`^cancelled by ${expected.actor ?? 'an operator'}`, 'm'));
  assert.match(show.out, /payload: not kept/);
  const list = await cli(['tasks', 'list', '--state', 'cancelled', '--json']);
  assert.equal(list.code, 0, list.err);
  const cliRow = (
    JSON.parse(list.out) as { tasks: { id: string; state: string; cancelledBy: string | null }[] }
  ).tasks.find((x) => x.id === id);
  assert.deepEqual(cliRow && { state: cliRow.state, cancelledBy: cliRow.cancelledBy }, {
    state: 'cancelled',
    cancelledBy: expected.actor,
  });

  const url = await dashboard();
  const page = await httpCall(`${url}api/tasks/${id}`);
  assert.equal(page.status, 200, page.body);
  const detail = page.json() as { task: { state: string; cancelled?: { actor: string | null; at: string } } };
  assert.equal(detail.task.state, 'cancelled');
  assert.equal(detail.task.cancelled?.actor, expected.actor);
  assert.equal(Date.parse(detail.task.cancelled?.at ?? ''), t.cancelled.at.getTime());
  const apiList = await httpCall(`${url}api/tasks?state=cancelled&limit=500`);
  assert.equal(apiList.status, 200, apiList.body);
  const apiRow = (apiList.json() as { tasks: { id: string; state: string; cancelledBy?: string | null }[] }).tasks.find(
    (x) => x.id === id,
  );
  assert.deepEqual(apiRow && { state: apiRow.state, cancelledBy: apiRow.cancelledBy }, {
    state: 'cancelled',
    cancelledBy: expected.actor,
  });
  return t;
}

test('a ready task cancelled: cancelled, by its actor, with no attempt made, in every reader; its history row is the cancel', async () => {
  const { id } = await enqueue(pool, 'cs_ready', { secret: 1 }, { schema, dedupeKey: 'cs-ready' });
  assert.equal(await cancelTask(pool, schema, id!, { actor: 'test:alice' }), 'removed');
  await expectCancelled(id!, { actor: 'test:alice', attempts: 0, type: 'cs_ready' });
  const history = await attemptsOf(pool, schema, id!);
  assert.deepEqual(
    history.map((a) => [a.attempt, a.outcome, a.worker, a.error?.message]),
    [[0, 'cancelled', null, 'cancelled by test:alice while ready']],
  );
  // The timeline shows the cancel, and no claim: no worker ever held it.
  const show = await cli(['tasks', 'show', id!, '--json']);
  const events = (JSON.parse(show.out) as { timeline: { event: string }[] }).timeline.map((e) => e.event);
  assert.ok(events.includes('attempt') && !events.includes('claimed'), events.join(','));
  // And its text: the cancel row has a time, no worker, no claim and no duration.
  const text = (await cli(['tasks', 'show', id!])).out;
  assert.match(text, /^ {2}#0 {2}cancelled {2}at \d{4}-\d\d-\d\dT[\d:.]+Z$/m);
  assert.doesNotMatch(text, /claimed/);
  // Its dedupe key is free: a new task with it is a different id, and nothing special.
  const again = await enqueue(pool, 'cs_ready', {}, { schema, dedupeKey: 'cs-ready' });
  assert.equal(again.state, 'ready');
  assert.notEqual(again.id, id);
  assert.equal((await getTask(pool, schema, again.id!))?.state, 'ready');
  assert.equal((await getTask(pool, schema, id!))?.state, 'cancelled');
  // Cancelling it again changes nothing, and the CLI says who cancelled it.
  const twice = await cli(['tasks', 'cancel', id!]);
  assert.equal(twice.code, 1);
  assert.match(twice.err, new RegExp(`task ${id} was already cancelled, by test:alice at `));
});

test('a scheduled task cancelled with no actor: cancelled, by nobody named, its lane opened for the record', async () => {
  const { id } = await enqueue(pool, 'cs_sched', {}, { schema, delay: 3_600_000, queue: 'cs-never-appended' });
  assert.equal((await getTask(pool, schema, id!))?.state, 'scheduled');
  assert.equal(await cancelTask(pool, schema, id!), 'removed');
  const t = await expectCancelled(id!, { actor: null, attempts: 0, type: 'cs_sched' });
  assert.equal(t.queue, 'cs-never-appended');
  assert.match((await attemptsOf(pool, schema, id!))[0]?.error?.message ?? '', /while scheduled$/);
});

test('a retryable task cancelled: cancelled, its one failed attempt counted, the cancel after it', async () => {
  const { id } = await enqueue(pool, flaky, { n: 1 }, { schema });
  const reports = await runDueTasks(pool, [flaky], { schema });
  assert.equal(reports.find((r) => r.id === id)?.status, 'retry');
  assert.equal((await getTask(pool, schema, id!))?.state, 'retryable');
  assert.equal(await cancelTask(pool, schema, id!, { actor: 'cli:bob' }), 'removed');
  await expectCancelled(id!, { actor: 'cli:bob', attempts: 1, type: 'cs_flaky' });
  assert.deepEqual(
    (await attemptsOf(pool, schema, id!)).map((a) => [a.attempt, a.outcome]),
    [
      [1, 'failure'],
      [1, 'cancelled'],
    ],
  );
});

/** A worker of one slot whose handler of `type` runs until its signal fires; counts starts and aborts. */
function blockingWorker(type: string, maintenance: WorkerOptions['maintenance'] = false) {
  const runs = { started: 0, aborted: 0 };
  const def = defineTask({
    type,
    ceilingMs: scaled(30_000),
    handler: async (_p: unknown, ctx: TaskContext<unknown>) => {
      runs.started++;
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
      runs.aborted++;
      throw ctx.signal.reason;
    },
  });
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    logger: testLogger,
    slots: 1,
    maintenance,
  });
  return { def, worker, runs };
}

test('a running task cancelled: its handler aborted, cancelled with its actor and the attempt that ran', async () => {
  const {
    def: blocking,
    worker: w,
    runs,
  } = blockingWorker('cs_running', {
    ...FAST_MAINTENANCE,
    ringRotateAfterMs: 3_600_000,
  });
  await w.start();
  try {
    const { id } = await enqueue(pool, blocking, {}, { schema });
    await waitFor(() => runs.started === 1, scaled(20_000), 'the handler to start');
    assert.equal((await getTask(pool, schema, id!))?.state, 'running');
    assert.equal(await cancelTask(pool, schema, id!, { actor: 'dashboard:ops@example.com' }), 'cancelled');
    await waitFor(() => runs.aborted === 1, scaled(20_000), 'the handler to be aborted');
    await expectCancelled(id!, { actor: 'dashboard:ops@example.com', attempts: 1, type: 'cs_running' });
    assert.deepEqual(
      (await attemptsOf(pool, schema, id!)).map((a) => [a.attempt, a.outcome, a.worker !== null]),
      [[1, 'cancelled', true]],
    );
  } finally {
    await w.stop();
  }
});

test('a cancel that lost to the completion marks nothing: the task reads completed, and no cancel is recorded', async () => {
  const { id } = await enqueue(pool, ok, { n: 1 }, { schema });
  assert.equal((await runDueTasks(pool, [ok], { schema })).find((r) => r.id === id)?.status, 'completed');
  assert.equal(await cancelTask(pool, schema, id!, { actor: 'test:late' }), 'already_settled');
  assert.equal((await getTask(pool, schema, id!))?.state, 'completed');
  assert.deepEqual(
    (await attemptsOf(pool, schema, id!)).map((a) => a.outcome),
    ['success'],
  );
  const listed = await listTasks(pool, schema, { state: 'cancelled' }, { limit: 500 });
  assert.ok(!listed.tasks.some((t) => t.id === id));
});

test('a deleted task is not cancelled: it reads as not found, and no cancel is recorded', async () => {
  const { id } = await enqueue(pool, 'cs_deleted', {}, { schema });
  assert.equal(await deleteTask(pool, schema, id!), 'removed');
  assert.equal(await getTask(pool, schema, id!), null);
  assert.deepEqual(await attemptsOf(pool, schema, id!), []);
  const show = await cli(['tasks', 'show', id!]);
  assert.equal(show.code, 1);
  assert.match(show.err, /not found/);
});

test('listTasks({ state: cancelled }) pages by id, newest first, and filters by queue and type; other filters leave cancelled tasks out', async () => {
  const ids: string[] = [];
  for (let n = 0; n < 5; n++) ids.push((await enqueue(pool, 'cs_page', { n }, { schema, queue: 'cs-page' })).id!);
  const r = await cancelTasks(pool, schema, { queue: 'cs-page' }, { actor: 'test:bulk' });
  assert.equal(r.removed, 5);
  const seen: string[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await listTasks(pool, schema, { state: 'cancelled', queue: 'cs-page' }, { limit: 2, after });
    assert.ok(page.tasks.length <= 2);
    for (const t of page.tasks) {
      assert.equal(t.cancelledBy, 'test:bulk');
      seen.push(t.id);
    }
    if (!page.next) break;
    after = page.next;
  }
  assert.deepEqual(seen, [...ids].reverse());
  assert.equal((await listTasks(pool, schema, { state: 'cancelled', type: 'cs_page' })).tasks.length, 5);
  assert.equal((await listTasks(pool, schema, { state: 'cancelled', type: 'cs_other' })).tasks.length, 0);
  for (const state of ['ready', 'scheduled', 'completed'] as const)
    assert.equal((await listTasks(pool, schema, { state, queue: 'cs-page' })).tasks.length, 0, state);
  // A bulk cancel of cancelled tasks is refused; there is nothing to do to them.
  await assert.rejects(cancelTasks(pool, schema, { state: 'cancelled' } as never), /cannot cancel cancelled/);
});

test('with attempt history off a cancel records nothing and the task reads as not found', async () => {
  await setHistorySettings(pool, schema, { enabled: false });
  try {
    const { id } = await enqueue(pool, 'cs_off', {}, { schema });
    assert.equal(await cancelTask(pool, schema, id!, { actor: 'test:off' }), 'removed');
    assert.equal(await getTask(pool, schema, id!), null);
  } finally {
    await setHistorySettings(pool, schema, { enabled: true });
  }
});

test("once attempt history's retention has rotated its cancel row away, a cancelled task reads as not found", async () => {
  const { id } = await enqueue(pool, 'cs_aged', {}, { schema });
  assert.equal(await cancelTask(pool, schema, id!, { actor: 'test:aged' }), 'removed');
  assert.equal((await getTask(pool, schema, id!))?.state, 'cancelled');
  await setHistorySettings(pool, schema, { retentionMs: 7000 });
  try {
    // Eight rotations: every partition, the cancel row's included, is truncated once.
    for (let i = 0; i < 8; i++) {
      await pool.query(`UPDATE ${S}.history_state SET rotated_at = now() - interval '1 hour'`);
      assert.equal(await rotateHistory(pool, schema, 1000), 'rotated');
    }
  } finally {
    await setHistorySettings(pool, schema, { retentionMs: 86_400_000 });
  }
  assert.equal(await getTask(pool, schema, id!), null);
  assert.ok(!(await listTasks(pool, schema, { state: 'cancelled' }, { limit: 500 })).tasks.some((t) => t.id === id));
  assert.equal((await httpCall(`${await dashboard()}api/tasks/${id}`)).status, 404);
});

test("a run its worker's stop interrupted is recorded `cancelled` but is no cancel: the task runs again and never reads as cancelled", async () => {
  const { def: interrupted, worker: w, runs } = blockingWorker('cs_interrupted');
  await w.start();
  const { id } = await enqueue(pool, interrupted, {}, { schema });
  try {
    await waitFor(() => runs.started === 1, scaled(20_000), 'the handler to start');
  } finally {
    await w.stop();
  }
  assert.deepEqual(
    (await attemptsOf(pool, schema, id!)).map((a) => a.outcome),
    ['cancelled'],
  );
  // Handed back due now (deferred, promoted by the leader), not cancelled.
  assert.equal((await getTask(pool, schema, id!))?.state, 'retryable');
  assert.ok(!(await listTasks(pool, schema, { state: 'cancelled' }, { limit: 500 })).tasks.some((t) => t.id === id));
  // It runs again and completes; with its ring entries gone (as after the segments are
  // reclaimed), attempt history says completed, not cancelled.
  const done = defineTask({ type: 'cs_interrupted', ceilingMs: 30_000, handler: async () => undefined });
  assert.equal(await retryTask(pool, schema, id!), 'retried');
  const reports = await runDueTasks(pool, [done], { schema });
  assert.equal(reports.find((r) => r.id === id)?.status, 'completed', JSON.stringify(reports));
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones`);
  const t = await getTask(pool, schema, id!);
  assert.equal(t?.state, 'completed', 'getTask');
  assert.equal(t?.source, 'history');
  assert.ok(!(await listTasks(pool, schema, { state: 'cancelled' }, { limit: 500 })).tasks.some((x) => x.id === id));
  const all = await listTasks(pool, schema, {}, { limit: 500 });
  assert.equal(all.tasks.find((x) => x.id === id)?.state, 'completed', JSON.stringify(all.tasks.slice(0, 3)));
});
