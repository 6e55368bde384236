/**
 * Adversarial review of the third allocation round (09eef4a..e47ae38), the parts without a
 * database: the deadline timer's array (arm/disarm order, a run armed while the timer fires) and
 * the handler's context as HandlerRun builds it (its lane cache over 4,096 lanes, its accessors
 * read without the context, assigned, copied).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DeadlineAbort } from '../src/errors.js';
import { DeadlineTimer, RunAbort } from '../src/processor/run-abort.js';
import { HandlerRun, type RunDeps, type RunInput } from '../src/processor/run-task.js';
import type { ClaimedTask } from '../src/processor/claim.js';
import type { TaskContext } from '../src/task.js';
import { testLogger, waitFor } from './helpers.js';

test('a run armed while the timer fires (from a due run’s abort listener) is aborted at its own deadline, not at the next one left', async () => {
  const timer = new DeadlineTimer();
  const now = Date.now();
  const first = new RunAbort(now + 20);
  // Much later than the run armed from the listener: the timer must not wait for it.
  const far = new RunAbort(now + 600_000);
  const armedLater = new RunAbort(now + 60);
  first.signal.addEventListener('abort', () => timer.arm(armedLater), { once: true });
  timer.arm(first);
  timer.arm(far);
  await waitFor(() => first.reason, 10_000, 'the first deadline');
  // On main (a Set iterated while it grows) the run armed meanwhile was seen by the same scan.
  await waitFor(() => armedLater.reason ?? far.reason, 5_000, 'the run armed from the listener to be aborted');
  assert.ok(armedLater.reason instanceof DeadlineAbort);
  assert.equal(far.reason, undefined);
  timer.disarm(far);
});

test('a run armed while the timer fires, already past its deadline, is aborted without waiting for the next run', async () => {
  const timer = new DeadlineTimer();
  const now = Date.now();
  const first = new RunAbort(now + 20);
  const far = new RunAbort(now + 600_000);
  const overdue = new RunAbort(now - 1000);
  first.signal.addEventListener('abort', () => timer.arm(overdue), { once: true });
  timer.arm(first);
  timer.arm(far);
  await waitFor(() => overdue.reason ?? far.reason, 5_000, 'the overdue run armed from the listener');
  assert.ok(overdue.reason instanceof DeadlineAbort);
  timer.disarm(far);
});

test('many runs with one deadline, disarmed in every order, some re-armed: each armed one aborted once, no disarmed one', async () => {
  const timer = new DeadlineTimer();
  const at = Date.now() + 40;
  const runs = Array.from({ length: 200 }, () => new RunAbort(at));
  let aborts = 0;
  for (const r of runs) {
    timer.arm(r);
    r.signal.addEventListener('abort', () => aborts++);
  }
  // Disarm every third, from the end and from the start, twice each; re-arm every ninth.
  const disarmed = new Set<RunAbort>();
  for (let i = runs.length - 1; i >= 0; i -= 3) {
    timer.disarm(runs[i]!);
    timer.disarm(runs[i]!);
    disarmed.add(runs[i]!);
  }
  for (let i = runs.length - 1; i >= 0; i -= 9) {
    timer.arm(runs[i]!);
    timer.arm(runs[i]!);
    disarmed.delete(runs[i]!);
  }
  const sentinel = new RunAbort(at + 100);
  timer.arm(sentinel);
  await waitFor(() => sentinel.reason, 10_000, 'the sentinel');
  for (const r of runs) {
    if (disarmed.has(r)) assert.equal(r.reason, undefined);
    else assert.ok(r.reason instanceof DeadlineAbort);
  }
  assert.equal(aborts, runs.length - disarmed.size);
  // Disarmed after its abort (as HandlerRun.end does): nothing changes, and no later run is lost.
  for (const r of runs) timer.disarm(r);
  const after = new RunAbort(Date.now() + 20);
  timer.arm(after);
  await waitFor(() => after.reason, 10_000, 'a run armed after all that');
});

function fakeTask(laneId: number, queue: string, n = 0): ClaimedTask {
  return {
    laneId,
    laneSeq: String(n + 1),
    token: `tok${n}`,
    id: `00000000-0000-0000-0000-${String(n).padStart(12, '0')}`,
    type: 't',
    payload: null,
    queue,
    priority: laneId % 3,
    shard: laneId % 2,
    attempt: 1,
    maxAttempts: 3,
    dedupeKey: null,
    leaseExpiresAt: Date.now() + 60_000,
    waitedSeconds: 0,
    traceContext: null,
    snoozes: 0,
  } as ClaimedTask;
}

/** A HandlerRun with what its constructor reads, and its context. */
function contextOf(task: ClaimedTask): { run: HandlerRun; ctx: TaskContext<unknown>; abort: RunAbort } {
  const abort = new RunAbort(task.leaseExpiresAt - 1000);
  const deps = {
    deadlines: { arm() {}, disarm() {} },
    storage: { schema: { name: 'review_schema' } },
  } as unknown as RunDeps;
  const input = {
    task,
    def: { type: 't', handler: () => undefined },
    receivedAt: Date.now(),
    abort,
    log: testLogger,
    freeSlot() {},
    hooks: null,
  } as unknown as RunInput;
  const run = new HandlerRun(deps, input, null, null);
  return { run, ctx: (run as unknown as { ctx: TaskContext<unknown> }).ctx, abort };
}

test('ctx.lane over more than 4,096 lanes: each context gets its own lane’s values; one object per lane while cached; a lane id reused for another lane is not mixed up', () => {
  const seen = new Map<number, object>();
  for (let round = 0; round < 2; round++) {
    for (let id = 1; id <= 5000; id++) {
      const { ctx } = contextOf(fakeTask(id, `q${id}`));
      assert.deepEqual({ ...ctx.lane }, { queue: `q${id}`, priority: id % 3, shard: id % 2 });
      assert.ok(Object.isFrozen(ctx.lane));
      if (round === 0) seen.set(id, ctx.lane);
    }
  }
  // Right after, two tasks of one lane share it.
  const a = contextOf(fakeTask(7, 'q7', 1)).ctx;
  const b = contextOf(fakeTask(7, 'q7', 2)).ctx;
  assert.equal(a.lane, b.lane);
  // The same id for another queue (another schema's lane): its own values.
  const other = contextOf(fakeTask(7, 'elsewhere', 3)).ctx;
  assert.equal(other.lane.queue, 'elsewhere');
  assert.equal(a.lane.queue, 'q7');
  const again = contextOf(fakeTask(7, 'q7', 4)).ctx;
  assert.equal(again.lane.queue, 'q7');
});

test('a handler that writes to ctx.lane: refused (frozen, TypeError in strict code), and the next task of the lane sees the lane unchanged', () => {
  const { ctx } = contextOf(fakeTask(42, 'q42'));
  assert.throws(() => {
    (ctx.lane as { queue: string }).queue = 'hijacked';
  }, TypeError);
  assert.equal(contextOf(fakeTask(42, 'q42', 1)).ctx.lane.queue, 'q42');
});

test('the context’s accessors: read through a prototype child and a Proxy, assigned, deleted, JSON, structuredClone as main (throws on its functions)', () => {
  const { ctx, abort } = contextOf(fakeTask(3, 'q3'));
  // Read from an object whose prototype is the context (Object.create), or through a Proxy.
  const child = Object.create(ctx) as TaskContext<unknown>;
  assert.equal(child.deadline, ctx.deadline);
  assert.equal(child.dequeue, ctx.dequeue);
  const proxied = new Proxy(ctx, {});
  assert.equal(proxied.parents, ctx.parents);
  assert.equal(proxied.signal, abort.signal);
  // The deadline: the run's own deadline, one Date.
  assert.equal(ctx.deadline.getTime(), abort.deadline);
  // JSON: no throw, the deadline as an ISO string, no function, the lane as its values.
  const json = JSON.parse(JSON.stringify({ ...ctx, logger: undefined })) as Record<string, unknown>;
  assert.equal(json.deadline, new Date(abort.deadline).toISOString());
  assert.deepEqual(json.lane, { queue: 'q3', priority: 0, shard: 1 });
  assert.equal(json.dequeue, undefined);
  assert.equal(json.id, ctx.id);
  // structuredClone of a context has functions in it, on main as here.
  assert.throws(() => structuredClone({ ...ctx, logger: undefined }), /could not be cloned/);
  // An assignment on a child is the child's; on the context, the context's; a delete removes it.
  const mine = async () => {};
  (child as { dequeue: unknown }).dequeue = mine;
  assert.equal(child.dequeue, mine);
  assert.notEqual(ctx.dequeue, mine);
  const d = new Date(0);
  (ctx as { deadline: Date }).deadline = d;
  assert.equal(ctx.deadline, d);
  assert.ok(Object.keys(ctx).includes('deadline'));
  delete (ctx as { parents?: unknown }).parents;
  assert.equal((ctx as { parents?: unknown }).parents, undefined);
  // Object.assign onto the context goes through the setter: a data property after it.
  Object.assign(ctx, { advanceCursor: mine });
  assert.equal(ctx.advanceCursor, mine);
  assert.equal(Object.getOwnPropertyDescriptor(ctx, 'advanceCursor')?.value, mine);
});

test('docs/api.md: an assignment replaces `deadline` or a method; `ctx.signal` cannot be assigned (as before these accessors)', () => {
  const { ctx } = contextOf(fakeTask(5, 'q5'));
  const mine = new AbortController().signal;
  // Strict code (an ES module): a getter without a setter throws on assignment.
  assert.throws(() => {
    (ctx as { signal: AbortSignal }).signal = mine;
  }, TypeError);
  assert.notEqual(ctx.signal, mine);
  const when = new Date(0);
  (ctx as { deadline: Date }).deadline = when;
  assert.equal(ctx.deadline, when);
});
