import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueue, getTask, Worker } from '../src/index.js';
import { startDashboard } from '../src/dashboard/index.js';
import { MAX_BULK_TASK_IDS } from '../src/dashboard/actions.js';
import type { Attempt } from '../src/dashboard/wire.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, testLogger, waitFor } from './helpers.js';
import { httpCall, type Reply } from './support/http.js';

/**
 * The dashboard's API for finding a task and acting on it: waiting beside running on the
 * overview, retry and cancel of several selected tasks at once, and a task's attempts.
 */
const { schema, pool } = await freshSchema('dashtriage');
const S = `"${schema}"`;

let release: () => void = () => {};
const gate = new Promise<void>((r) => (release = r));
const block = defineTask({ type: 'triage.block', ceilingMs: 60_000, handler: async () => gate });
const ok = defineTask({ type: 'triage.ok', ceilingMs: 10_000, handler: async () => {} });
const fail = defineTask({
  type: 'triage.fail',
  ceilingMs: 10_000,
  maxAttempts: 1,
  handler: async () => {
    throw new Error('upstream said no');
  },
});

// Claims from `work` only: tasks in `parked` stay ready (waiting) for as long as a test needs.
const worker = new Worker({
  connectionString: DATABASE_URL,
  schema,
  tasks: [block, ok, fail],
  queues: ['work'],
  logger: testLogger,
  pollIntervalMs: 50,
  heartbeatIntervalMs: 100,
  // The ring never rotates during the file, so a completed task's claim stays readable.
  maintenance: { ...FAST_MAINTENANCE, ringRotateAfterMs: 3_600_000 },
});
await worker.start();
const dash = await startDashboard({ connectionString: DATABASE_URL, schema, port: 0, logger: testLogger });
const readOnly = await startDashboard({
  connectionString: DATABASE_URL,
  schema,
  port: 0,
  logger: testLogger,
  readOnly: true,
});
after(async () => {
  release();
  await dash.close();
  await readOnly.close();
  await worker.stop();
});

const call = httpCall;

async function csrfOf(url: string): Promise<string> {
  return (await call(`${url}api/session`)).json().csrf as string;
}

async function bulk(action: string, body: unknown, url = dash.url, csrf?: string): Promise<Reply> {
  return call(`${url}api/tasks/bulk/${action}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-berth-csrf': csrf ?? (await csrfOf(url)) },
    body: JSON.stringify(body),
  });
}

const stateOf = async (id: string) => (await getTask(pool, schema, id))?.state ?? 'gone';
const later = { schema, queue: 'parked', delay: 3_600_000 };

interface BulkAnswer {
  requested: number;
  changed: number;
  unchanged: number;
  byResult: Record<string, number>;
  results: { id: string; result: string; changed: boolean }[];
}

let runningId = '';

test('the overview shows waiting (pending minus running) beside running; pending keeps counting both', async () => {
  runningId = (await enqueue(pool, block, {}, { schema, queue: 'work' })).id!;
  await enqueue(pool, ok, {}, { schema, queue: 'parked' });
  await enqueue(pool, ok, {}, { schema, queue: 'parked' });
  type Totals = { pending: number; waiting: number; running: number; dead: number };
  const o = await waitFor(
    async () => {
      const r = (await call(`${dash.url}api/overview`)).json() as {
        counts: { total: Totals; byType: (Totals & { type: string })[] };
        queues: (Totals & { queue: string })[];
      };
      return r.counts.total.running === 1 && r.counts.total.pending === 3 ? r : null;
    },
    20_000,
    'the blocked task to be running on the overview',
  );
  assert.deepEqual(o.counts.total, { pending: 3, waiting: 2, running: 1, dead: 0 });
  const q = (name: string) => o.queues.find((x) => x.queue === name);
  assert.deepEqual(
    [q('work')?.pending, q('work')?.waiting, q('work')?.running],
    [1, 0, 1],
    'the running task is pending and running, and not waiting',
  );
  assert.deepEqual([q('parked')?.waiting, q('parked')?.running], [2, 0]);
  const t = o.counts.byType.find((x) => x.type === 'triage.block');
  assert.deepEqual([t?.pending, t?.waiting, t?.running], [1, 0, 1]);
});

test('bulk cancel: one request, each id through the admin cancel, a per-id result and a summary, one audit row per task', async () => {
  // A running task of its own (runningId stays running for the attempts test below). Its handler
  // ignores the abort and holds its slot until the file ends; its attempt is settled cancelled.
  const doomed = (await enqueue(pool, block, {}, { schema, queue: 'work' })).id!;
  await waitFor(async () => (await stateOf(doomed)) === 'running', 20_000, 'the blocked task to run');
  const ready = (await enqueue(pool, ok, {}, { schema, queue: 'parked' })).id!;
  const scheduled = (await enqueue(pool, ok, {}, later)).id!;
  const missing = '999999999';
  const r = await bulk('cancel', { ids: [ready, scheduled, doomed, missing, Number(ready)] });
  assert.equal(r.status, 200, r.body);
  const a = r.json() as unknown as BulkAnswer;
  assert.equal(a.requested, 4, 'a repeated id (text or number) counts once');
  assert.deepEqual(a.results, [
    { id: ready, result: 'removed', changed: true },
    { id: scheduled, result: 'removed', changed: true },
    { id: doomed, result: 'cancelled', changed: true },
    { id: missing, result: 'not_found', changed: false },
  ]);
  assert.deepEqual([a.changed, a.unchanged], [3, 1]);
  assert.deepEqual(a.byResult, { removed: 2, cancelled: 1, not_found: 1 });
  assert.deepEqual(
    [await stateOf(ready), await stateOf(scheduled), await stateOf(doomed)],
    ['cancelled', 'cancelled', 'cancelled'],
  );
  const audit = await pool.query(
    `SELECT actor, target, result FROM ${S}.audit_log WHERE action = 'task.cancel' ORDER BY id`,
  );
  assert.deepEqual(
    audit.rows.map((x) => [x.actor, x.target, x.result]),
    [
      ['dashboard:local', { id: ready, bulk: true }, 'removed'],
      ['dashboard:local', { id: scheduled, bulk: true }, 'removed'],
      ['dashboard:local', { id: doomed, bulk: true }, 'cancelled'],
      ['dashboard:local', { id: missing, bulk: true }, 'not_found'],
    ],
  );
});

test('bulk retry: a dead letter and a scheduled task are retried, a ready one is reported not retryable', async () => {
  const dead = (await enqueue(pool, fail, {}, { schema, queue: 'work' })).id!;
  await waitFor(async () => (await stateOf(dead)) === 'dead', 20_000, 'the failing task to die');
  // The retried dead letter runs again (its queue is `work`) and dies again: the answer is what
  // this test reads.
  const scheduled = (await enqueue(pool, ok, {}, later)).id!;
  const ready = (await enqueue(pool, ok, {}, { schema, queue: 'parked' })).id!;
  const r = await bulk('retry', { ids: [dead, scheduled, ready] });
  assert.equal(r.status, 200, r.body);
  const a = r.json() as unknown as BulkAnswer;
  assert.deepEqual(
    a.results.map((x) => [x.id, x.result, x.changed]),
    [
      [dead, 'retried', true],
      [scheduled, 'retried', true],
      [ready, 'not_retryable', false],
    ],
  );
  assert.deepEqual([a.requested, a.changed, a.unchanged], [3, 2, 1]);
  // Due now: the leader's promotion appends it (`parked` is not claimed, so it stays ready).
  await waitFor(async () => (await stateOf(scheduled)) === 'ready', 20_000, 'the retried task to be promoted');
});

test('bulk actions refuse bad input with a 400 naming the problem and change nothing; read-only and CSRF hold', async () => {
  const ready = (await enqueue(pool, ok, {}, { schema, queue: 'parked' })).id!;
  // Ids no task in this schema has (they count up from 1).
  const tooMany = Array.from({ length: MAX_BULK_TASK_IDS + 1 }, (_, i) => String(1e12 + i));
  const cases: [string, unknown, RegExp][] = [
    ['no ids', {}, /ids must be a list of 1 to 500 task ids/],
    ['empty', { ids: [] }, /1 to 500/],
    ['not a list', { ids: ready }, /1 to 500/],
    ['too many', { ids: tooMany }, /1 to 500/],
    ['not an id', { ids: [ready, 'abc'] }, /bad task id/],
    ['past bigint', { ids: ['9999999999999999999'] }, /bad task id/],
    ['a fraction', { ids: [1.5] }, /text or integers/],
    ['an object', { ids: [{ id: ready }] }, /text or integers/],
    ['an unknown field', { ids: [ready], all: true }, /unknown field "all"/],
  ];
  for (const [what, body, reason] of cases) {
    for (const action of ['retry', 'cancel']) {
      const r = await bulk(action, body);
      assert.equal(r.status, 400, `${what} (${action}): ${r.status} ${r.body}`);
      assert.match(String(r.json().error), reason, what);
    }
  }
  assert.equal((await bulk('cancel', { ids: tooMany.slice(0, MAX_BULK_TASK_IDS) })).status, 200, 'at the limit');
  assert.equal(await stateOf(ready), 'ready', 'nothing was cancelled by a refused request');

  const ro = await bulk('cancel', { ids: [ready] }, readOnly.url);
  assert.equal(ro.status, 403);
  assert.match(String(ro.json().error), /read-only/);
  const noCsrf = await call(`${dash.url}api/tasks/bulk/cancel`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ids: [ready] }),
  });
  assert.equal(noCsrf.status, 403);
  assert.equal((await call(`${dash.url}api/tasks/bulk/cancel`)).status, 405, 'GET never acts');
  assert.equal((await bulk('delete', { ids: [ready] })).status, 400, 'no bulk delete: "bulk" is not a task id');
  assert.equal(await stateOf(ready), 'ready');
});

test("a task's attempts: each ended attempt from attempt history, with its worker, outcome and duration", async () => {
  const done = (await enqueue(pool, ok, {}, { schema, queue: 'work' })).id!;
  await waitFor(async () => (await stateOf(done)) === 'completed', 20_000, 'the task to complete');
  const read = async (id: string) => (await call(`${dash.url}api/tasks/${id}`)).json() as { attempts: Attempt[] };
  const d = await read(done);
  assert.equal(d.attempts.length, 1, JSON.stringify(d.attempts));
  const [a] = d.attempts;
  assert.equal(a!.attempt, 1);
  assert.equal(a!.worker, worker.id);
  assert.equal(a!.outcome, 'success');
  assert.equal(a!.error, null);
  assert.ok(a!.durationMs >= 0, `duration ${a!.durationMs}`);
  // A running attempt has not ended: history holds ended attempts only (the timeline shows the claim).
  assert.deepEqual((await read(runningId)).attempts, []);
  const never = await read((await enqueue(pool, ok, {}, { schema, queue: 'parked' })).id!);
  assert.deepEqual(never.attempts, []);
});
