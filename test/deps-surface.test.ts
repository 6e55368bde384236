/**
 * The operator's view of task dependencies (issue 33 item 6): getTask's `dependencies`,
 * `berth tasks show` (what a waiting task waits for), `listTasks({ state: 'waiting' })` and
 * `berth tasks list --state waiting`, the refused retry of a waiting task, `berth stats` and
 * `dependencyStats`, the gauges, and the dashboard's reads. One small graph: a parent that
 * completes, one that runs (held), one that dies, a join waiting on all three with policy
 * `wait`, and the join's own dependent.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BerthMetrics,
  defineTask,
  dependencyStats,
  enqueue,
  enqueueMany,
  getTask,
  listTasks,
  retryTask,
  Worker,
} from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { publishGauges } from '../src/maintenance/gauges.js';
import { startDashboard } from '../src/dashboard/index.js';
import type { Overview, TaskDetail, TaskList } from '../src/dashboard/wire.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, testLogger, waitFor } from './helpers.js';
import { cliOn } from './support/run-cli.js';
import { httpCall } from './support/http.js';

const { schema, pool } = await freshSchema('depsurface');
const { berth, berthJson } = cliOn(schema, DATABASE_URL);
const QUEUE = 'surface';

let release: () => void = () => {};
const held = new Promise<void>((r) => (release = r));
const gate = { fail: true };

const ok = defineTask<{ name: string }>({
  type: 'surf_ok',
  queue: QUEUE,
  ceilingMs: 10_000,
  handler: async (p) => ({ name: p.name }),
});
const hold = defineTask({ type: 'surf_hold', queue: QUEUE, ceilingMs: 120_000, handler: async () => held });
const flaky = defineTask({
  type: 'surf_fail',
  queue: QUEUE,
  ceilingMs: 10_000,
  maxAttempts: 1,
  handler: async () => {
    if (gate.fail) throw new Error('upstream said no');
  },
});

const worker = new Worker({
  connectionString: DATABASE_URL,
  schema,
  tasks: [ok, hold, flaky],
  slots: 4,
  logger: testLogger,
  pollIntervalMs: 100,
  heartbeatIntervalMs: 200,
  maintenance: FAST_MAINTENANCE,
});
await worker.start();
const dash = await startDashboard({ connectionString: DATABASE_URL, schema, port: 0, logger: testLogger });
after(async () => {
  release();
  await dash.close();
  await worker.stop();
});

const [done, running, dead, join, grandchild] = await enqueueMany(
  pool,
  [
    { type: ok, payload: { name: 'done' }, ref: 'done' },
    { type: hold, payload: {}, ref: 'running' },
    { type: flaky, payload: {}, ref: 'dead' },
    {
      type: ok,
      payload: { name: 'join' },
      ref: 'join',
      dependsOn: [{ ref: 'done' }, { ref: 'running' }, { ref: 'dead' }],
      onParentFailure: 'wait',
    },
    { type: ok, payload: { name: 'grandchild' }, dependsOn: [{ ref: 'join' }] },
  ],
  { schema },
);
const id = (r: typeof done) => r!.id!;
const [D, R, X, J, G] = [done, running, dead, join, grandchild].map(id) as [string, string, string, string, string];

const stateOf = async (task: string) => (await getTask(pool, schema, task))?.state;
await waitFor(async () => (await stateOf(D)) === 'completed', 30_000, 'the first parent to complete');
await waitFor(async () => (await stateOf(R)) === 'running', 30_000, 'the second parent to run');
await waitFor(async () => (await stateOf(X)) === 'dead', 30_000, 'the third parent to die');
// The completed parent is counted for the join (in its completion's transaction, or by the leader).
await waitFor(
  async () => (await getTask(pool, schema, J))?.dependencies?.parents.find((p) => p.id === D)?.satisfiedAt,
  30_000,
  "the completed parent's count",
);

test('getTask: a waiting join lists its parents, the unfinished first, what it waits on, and its dependent', async () => {
  const t = await getTask(pool, schema, J);
  assert.equal(t?.state, 'waiting');
  assert.equal(t?.runAt, null, 'no run time: not the year 294276');
  const d = t!.dependencies!;
  assert.deepEqual(
    d.parents.map((p) => [p.id, p.type, p.state, p.satisfiedAt !== null]),
    [
      [R, 'surf_hold', 'running', false],
      [X, 'surf_fail', 'dead', false],
      [D, 'surf_ok', 'completed', true],
    ],
  );
  assert.equal(d.parentsTotal, 3);
  assert.deepEqual(d.waitingOn, { pending: 2, total: 3, dead: 1, onParentFailure: 'wait', runAt: null });
  assert.deepEqual(d.dependents, [
    { id: G, state: 'waiting', waiting: true, onParentFailure: 'cancel', satisfiedAt: null },
  ]);
  assert.equal(d.dependentsTotal, 1);
});

test('getTask: a parent lists its dependent; a task without edges has none', async () => {
  const parent = (await getTask(pool, schema, D))!.dependencies!;
  assert.deepEqual([parent.parents, parent.parentsTotal, parent.waitingOn], [[], 0, null]);
  assert.equal(parent.dependentsTotal, 1);
  assert.equal(parent.dependents[0]?.id, J);
  assert.equal(parent.dependents[0]?.state, 'waiting');
  assert.ok(parent.dependents[0]?.satisfiedAt instanceof Date, 'its completion is counted for the join');
  const lone = await enqueue(pool, ok, { name: 'lone' }, { schema, delay: 3_600_000 });
  assert.equal((await getTask(pool, schema, lone.id!))?.dependencies, null);
  const child = (await getTask(pool, schema, G))!.dependencies!;
  assert.deepEqual(
    child.parents.map((p) => [p.id, p.state]),
    [[J, 'waiting']],
  );
  assert.deepEqual(child.waitingOn, { pending: 1, total: 1, dead: 0, onParentFailure: 'cancel', runAt: null });
});

test('berth tasks show says what a waiting task waits for, and lists parents and dependents', async () => {
  const r = await berth('tasks', 'show', J);
  assert.equal(r.code, 0, r.err);
  assert.match(r.out, /^task \d+ {2}surf_ok {2}waiting$/m);
  assert.ok(
    r.out.includes(`waiting on 2 of 3 parents: ${R} (running), ${X} (dead — retry it, or cancel this task)`),
    r.out,
  );
  assert.match(r.out, /if a parent dies: waits for it to be retried; due when its last parent completes$/m);
  assert.match(r.out, /^parents \(3\):$/m);
  assert.match(r.out, new RegExp(`^ {2}${D} {2}surf_ok {2}completed {2}counted \\d{4}-`, 'm'));
  assert.match(r.out, /^dependents \(1\):$/m);
  assert.match(r.out, new RegExp(`^ {2}${G} {2}waiting {2}still waiting {2}on parent failure: cancel$`, 'm'));
  assert.doesNotMatch(r.out, /^due /m, 'no due time for a waiting task');
  const json = await berthJson<{ task: { dependencies: { waitingOn: { pending: number } } } }>(
    'tasks',
    'show',
    J,
    '--json',
  );
  assert.equal(json.task.dependencies.waitingOn.pending, 2);
});

test("listTasks({ state: 'waiting' }) and berth tasks list --state waiting list the waiting tasks, without a run time", async () => {
  const page = await listTasks(pool, schema, { state: 'waiting', queue: QUEUE });
  assert.deepEqual(
    page.tasks.map((t) => [t.id, t.state, t.runAt]),
    [
      [G, 'waiting', null],
      [J, 'waiting', null],
    ],
  );
  const all = await listTasks(pool, schema, { queue: QUEUE });
  assert.equal(all.tasks.find((t) => t.id === J)?.runAt, null, 'the unfiltered list too');
  const r = await berth('tasks', 'list', '--state', 'waiting');
  assert.equal(r.code, 0, r.err);
  assert.deepEqual(
    r.out
      .split('\n')
      .slice(1)
      .map((l) => l.split(/\s+/).slice(0, 3)),
    [
      [G, 'surf_ok', 'waiting'],
      [J, 'surf_ok', 'waiting'],
    ],
  );
});

test('retrying a waiting task is refused with what it waits on; nothing changes', async () => {
  assert.equal(await retryTask(pool, schema, J), 'waiting_on_parents');
  const r = await berth('tasks', 'retry', J);
  assert.equal(r.code, 1);
  assert.match(r.err, /waits on the tasks it depends on and runs when the last one completes/);
  assert.ok(r.err.includes(`waiting on 2 of 3 parents: ${R} (running), ${X} (dead`), r.err);
  const csrf = (await httpCall(`${dash.url}api/session`)).json().csrf as string;
  const post = await httpCall(`${dash.url}api/tasks/${J}/retry`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-berth-csrf': csrf },
    body: '{}',
  });
  assert.deepEqual(post.json(), { result: 'waiting_on_parents' });
  const t = await getTask(pool, schema, J);
  assert.equal(t?.state, 'waiting');
  assert.equal(t?.dependencies?.waitingOn?.pending, 2);
});

test('berth stats, dependencyStats and the gauges count the waiting and the blocked per queue', async () => {
  assert.deepEqual(await dependencyStats(pool, schema), [{ queue: QUEUE, waiting: 2, blocked: 1 }]);
  const r = await berth('stats');
  assert.equal(r.code, 0, r.err);
  assert.match(r.out, /^task dependencies: 2 task\(s\) waiting on their parents, 1 blocked by a dead parent/m);
  assert.match(r.out, new RegExp(`^${QUEUE} +2 +1$`, 'm'));
  const json = await berthJson<{ dependencies: unknown }>('stats', '--json');
  assert.deepEqual(json.dependencies, [{ queue: QUEUE, waiting: 2, blocked: 1 }]);
  const m = new BerthMetrics();
  publishGauges(m, await readGauges(pool, schema));
  const text = await m.registry.metrics();
  assert.match(text, new RegExp(`^berth_tasks_waiting\\{queue="${QUEUE}"\\} 2$`, 'm'));
  assert.match(text, new RegExp(`^berth_tasks_blocked\\{queue="${QUEUE}"\\} 1$`, 'm'));
});

test("the dashboard's task read carries the dependencies; the overview counts them; the list filters on waiting", async () => {
  const detail = (await httpCall(`${dash.url}api/tasks/${J}`)).json() as unknown as TaskDetail;
  const d = detail.task.dependencies!;
  assert.deepEqual(
    d.parents.map((p) => [p.id, p.state]),
    [
      [R, 'running'],
      [X, 'dead'],
      [D, 'completed'],
    ],
  );
  assert.match(String(d.parents[2]?.satisfiedAt), /^\d{4}-\d\d-\d\dT/, 'times as ISO strings');
  assert.deepEqual(d.waitingOn, { pending: 2, total: 3, dead: 1, onParentFailure: 'wait', runAt: null });
  assert.equal(detail.task.runAt, null);
  const overview = (await httpCall(`${dash.url}api/overview`)).json() as unknown as Overview;
  assert.deepEqual(overview.dependencies, { waiting: 2, blocked: 1 });
  assert.deepEqual(overview.queues.find((q) => q.queue === QUEUE)?.dependencies, { waiting: 2, blocked: 1 });
  const list = (await httpCall(`${dash.url}api/tasks?state=waiting`)).json() as unknown as TaskList;
  assert.deepEqual(
    list.tasks.map((t) => t.id),
    [G, J],
  );
});

test('once the dead parent is retried and the running one completes, the join and its dependent run; nothing waits', async () => {
  gate.fail = false;
  const r = await berth('tasks', 'retry', X);
  assert.equal(r.code, 0, r.err);
  release();
  await waitFor(async () => (await stateOf(G)) === 'completed', 30_000, 'the grandchild to run');
  const t = await getTask(pool, schema, J);
  assert.equal(t?.state, 'completed');
  assert.equal(t?.dependencies?.waitingOn, null);
  assert.ok(
    t?.dependencies?.parents.every((p) => p.state === 'completed' && p.satisfiedAt !== null),
    JSON.stringify(t?.dependencies?.parents),
  );
  assert.deepEqual(await dependencyStats(pool, schema), []);
  assert.doesNotMatch((await berth('stats')).out, /task dependencies/);
});
