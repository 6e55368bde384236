/**
 * `worker.events` (issue 13, item 5): every event kind against a real worker, each payload's
 * fields, and the isolation rules: a throwing or rejecting listener is logged and changes
 * nothing; a listener that never finishes holds no slot.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import {
  BerthInputError,
  defineTask,
  enqueue,
  type TaskSettledEvent,
  Worker,
  type WorkerEventMap,
  type WorkerEventName,
} from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { captureLogger, FAST_MAINTENANCE, freshSchema, DATABASE_URL, takeLeaseOver, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('events');

/** Every event a worker emitted, in order, by name. */
function record(w: Worker): { name: WorkerEventName; event: unknown }[] {
  const seen: { name: WorkerEventName; event: unknown }[] = [];
  const names: WorkerEventName[] = [
    'task:started',
    'task:settled',
    'task:completed',
    'task:failed',
    'task:retrying',
    'task:dead',
    'task:cancelled',
    'task:continued',
    'task:lease_lost',
    'task:unsettled',
    'worker:started',
    'worker:stopped',
    'leader:gained',
    'leader:lost',
  ];
  for (const name of names) w.events.on(name, (event) => void seen.push({ name, event }));
  return seen;
}

function worker(defs: AnyTaskDefinition[], opts: Partial<ConstructorParameters<typeof Worker>[0]> = {}) {
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: defs,
    queues: defs.map((d) => d.type),
    logger,
    maintenance: false,
    heartbeatIntervalMs: false,
    ...opts,
  });
  return { w, lines };
}

const ofTask = (seen: { name: WorkerEventName; event: unknown }[], id: string) =>
  seen.filter((s) => (s.event as { task?: { id: string } }).task?.id === id);

const stopped: Worker[] = [];
after(async () => {
  for (const w of stopped) await w.stop();
});

test('a success: task:started, then task:settled and task:completed with the task, the outcome and the duration', async () => {
  const def = defineTask<{ n: number }>({ type: 'ev_ok', ceilingMs: 10_000, handler: async () => {} });
  const { w } = worker([def]);
  stopped.push(w);
  const seen = record(w);
  await w.start();
  const { id } = await enqueue(pool, def, { n: 1 }, { schema, queue: def.type, priority: 2 });
  await waitFor(() => ofTask(seen, id!).some((s) => s.name === 'task:completed'), 20_000, 'task:completed');
  const names = ofTask(seen, id!).map((s) => s.name);
  assert.deepEqual(names, ['task:started', 'task:settled', 'task:completed']);
  const done = ofTask(seen, id!)[2]!.event as TaskSettledEvent;
  assert.equal(done.workerId, w.id);
  assert.deepEqual(
    { ...done.task, shard: 0 },
    {
      id,
      type: 'ev_ok',
      queue: 'ev_ok',
      priority: 2,
      shard: 0,
      attempt: 1,
      maxAttempts: 20,
    },
  );
  assert.equal(done.outcome, 'success');
  assert.ok(typeof done.durationMs === 'number' && done.durationMs >= 0);
  assert.equal(done.error, null);
  assert.equal(done.dead, false);
  assert.equal(done.retryInMs, null);
  assert.equal(seen[0]!.name, 'worker:started');
  assert.deepEqual(seen[0]!.event, { workerId: w.id, slots: 4, queues: ['ev_ok'], types: ['ev_ok'] });
});

test('a failure with attempts left: task:failed and task:retrying (with the backoff); on the last: task:failed and task:dead', async () => {
  const boom = new Error('boom');
  const def = defineTask<unknown>({
    type: 'ev_fail',
    ceilingMs: 10_000,
    maxAttempts: 2,
    backoff: { baseMs: 10, maxMs: 10 },
    handler: async () => {
      throw boom;
    },
  });
  const { w } = worker([def], { maintenance: FAST_MAINTENANCE });
  stopped.push(w);
  const seen = record(w);
  await w.start();
  const { id } = await enqueue(pool, def, {}, { schema, queue: def.type });
  await waitFor(() => ofTask(seen, id!).some((s) => s.name === 'task:dead'), 30_000, 'task:dead');
  const names = ofTask(seen, id!).map((s) => s.name);
  assert.deepEqual(names, [
    'task:started',
    'task:settled',
    'task:failed',
    'task:retrying',
    'task:started',
    'task:settled',
    'task:failed',
    'task:dead',
  ]);
  const first = ofTask(seen, id!)[3]!.event as TaskSettledEvent;
  assert.equal(first.outcome, 'failure');
  assert.equal(first.task.attempt, 1);
  assert.equal(first.retryInMs, 10);
  assert.equal(first.dead, false);
  assert.equal(first.error?.message, 'boom');
  assert.equal(first.error?.thrown, boom, 'the thrown value as it was');
  const last = ofTask(seen, id!)[7]!.event as TaskSettledEvent;
  assert.equal(last.task.attempt, 2);
  assert.equal(last.dead, true);
  assert.equal(last.retryInMs, null);
  // Leadership came and went with the worker (maintenance on).
  await w.stop();
  const order = seen.map((s) => s.name).filter((n) => !n.startsWith('task:'));
  assert.deepEqual(order, ['worker:started', 'leader:gained', 'leader:lost', 'worker:stopped']);
  assert.deepEqual(seen.find((s) => s.name === 'leader:gained')!.event, { workerId: w.id });
});

test('a handler interrupted by stop(): task:cancelled; a continue: task:continued; a refused fence: task:lease_lost', async () => {
  let started = false;
  const slow = defineTask<unknown>({
    type: 'ev_cancel',
    ceilingMs: 10_000,
    handler: (_p, ctx) =>
      new Promise<void>((_resolve, reject) => {
        started = true;
        ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason));
      }),
  });
  const cont = defineTask<{ cursor: number }>({
    type: 'ev_continue',
    ceilingMs: 10_000,
    handler: async (p, ctx) => {
      if (p.cursor === 0) {
        await ctx.advanceCursor({ cursor: 1 });
        return 'continue';
      }
    },
  });
  const lost = defineTask<unknown>({
    type: 'ev_lost',
    ceilingMs: 10_000,
    handler: async (_p, ctx) => {
      // Another party settles this lease first (as rescue would after a lapse): the completion is refused.
      await takeLeaseOver(pool, schema, ctx.id);
    },
  });
  const defs = [slow, cont, lost];
  const { w } = worker(defs, { maintenance: FAST_MAINTENANCE });
  // Stopped at the end of the file too, so a failed assertion does not leave it running.
  stopped.push(w);
  const seen = record(w);
  await w.start();
  const c = await enqueue(pool, cont, { cursor: 0 }, { schema, queue: cont.type });
  const l = await enqueue(pool, lost, {}, { schema, queue: lost.type });
  // Both runs reported: the second run's completion can be reported before the first run's
  // settlement (its handback came first), so wait for both, not only the completion.
  await waitFor(
    () =>
      ofTask(seen, c.id!).some((s) => s.name === 'task:completed') &&
      ofTask(seen, c.id!).some((s) => s.name === 'task:continued'),
    30_000,
    'the continued task done, both runs reported',
  );
  // Each run's settlement reported as a pair (task:settled, then its outcome's event), the two
  // pairs in either order: the second run may start, and even settle, before the first's
  // settlement is reported, since its AdvanceCursor already handed the task back, due at once,
  // while the first run's own (refused) settlement was still being written.
  const names = ofTask(seen, c.id!).map((s) => s.name);
  const settlements = names.filter((n) => n !== 'task:started');
  const pairs = [settlements.slice(0, 2).join(), settlements.slice(2).join()].sort();
  assert.deepEqual(pairs, ['task:settled,task:completed', 'task:settled,task:continued'], settlements.join());
  assert.equal(names.filter((n) => n === 'task:started').length, 2);
  assert.equal(names[0], 'task:started');
  assert.ok(names.lastIndexOf('task:started') < names.lastIndexOf('task:settled'), names.join());
  await waitFor(() => ofTask(seen, l.id!).some((s) => s.name === 'task:lease_lost'), 20_000, 'task:lease_lost');
  assert.equal((ofTask(seen, l.id!)[1]!.event as TaskSettledEvent).outcome, 'lost');
  const s = await enqueue(pool, slow, {}, { schema, queue: slow.type });
  await waitFor(() => started, 20_000, 'the slow handler started');
  await w.stop();
  const cancelled = ofTask(seen, s.id!);
  assert.deepEqual(
    cancelled.map((x) => x.name),
    ['task:started', 'task:settled', 'task:cancelled'],
  );
  assert.equal((cancelled[2]!.event as TaskSettledEvent).outcome, 'cancelled');
});

test('a task that never starts its handler (bad payload) settles with no task:started and a null duration', async () => {
  const def = defineTask<{ n: number }>({
    type: 'ev_invalid',
    ceilingMs: 10_000,
    schema: {
      '~standard': {
        version: 1,
        vendor: 'test',
        validate: (v: unknown) =>
          typeof (v as { n?: unknown })?.n === 'number'
            ? { value: v as { n: number } }
            : { issues: [{ message: 'n must be a number' }] },
      },
    },
    handler: async () => {},
  });
  const { w } = worker([def]);
  stopped.push(w);
  const seen = record(w);
  await w.start();
  const { id } = await enqueue(pool, def.type, { n: 'x' }, { schema, queue: def.type });
  await waitFor(() => ofTask(seen, id!).some((s) => s.name === 'task:dead'), 20_000, 'task:dead');
  assert.deepEqual(
    ofTask(seen, id!).map((s) => s.name),
    ['task:settled', 'task:failed', 'task:dead'],
  );
  const e = ofTask(seen, id!)[0]!.event as TaskSettledEvent;
  assert.equal(e.durationMs, null);
  assert.match(e.error!.message, /n must be a number/);
  assert.equal(e.error!.thrown, null);
});

test('a throwing or rejecting listener is logged and changes nothing; a listener that never finishes holds no slot', async () => {
  let ran = 0;
  const def = defineTask<unknown>({
    type: 'ev_isolated',
    ceilingMs: 10_000,
    handler: async () => {
      ran++;
    },
  });
  const { w, lines } = worker([def], { slots: 1 });
  stopped.push(w);
  const calls: string[] = [];
  w.events.on('task:started', () => {
    calls.push('throws');
    throw new Error('listener bug');
  });
  w.events.on('task:completed', async () => {
    calls.push('rejects');
    throw new Error('async listener bug');
  });
  // Never settles: nothing waits for it.
  w.events.on('task:settled', () => new Promise(() => {}));
  const completed: string[] = [];
  w.events.on('task:completed', (e) => void completed.push(e.task.id));
  await w.start();
  for (let i = 0; i < 5; i++) await enqueue(pool, def, { i }, { schema, queue: def.type });
  await waitFor(() => completed.length === 5, 20_000, 'five completions through one slot');
  assert.equal(ran, 5);
  await waitFor(
    () => lines.filter((l) => l.msg === 'worker event listener failed').length === 10,
    10_000,
    'each listener failure logged',
  );
  const failures = lines.filter((l) => l.msg === 'worker event listener failed');
  assert.deepEqual(new Set(failures.map((l) => l.err)), new Set(['listener bug', 'async listener bug']));
  assert.deepEqual(new Set(failures.map((l) => l.event)), new Set(['task:started', 'task:completed']));
});

test('on / once / off; an unknown event name or a non-function listener is refused', () => {
  const def = defineTask<unknown>({ type: 'ev_api', ceilingMs: 10_000, handler: async () => {} });
  const { w } = worker([def]);
  const got: string[] = [];
  const off = w.events.on('worker:stopped', () => void got.push('on'));
  w.events.once('worker:stopped', () => void got.push('once'));
  assert.equal(w.events.listenerCount('worker:stopped'), 2);
  assert.equal(w.events.wantsTaskEvents, false);
  const event: WorkerEventMap['worker:stopped'] = { workerId: 'x' };
  w.events.emit('worker:stopped', event);
  w.events.emit('worker:stopped', event);
  assert.deepEqual(got, ['on', 'once', 'on']);
  off();
  w.events.emit('worker:stopped', event);
  assert.equal(got.length, 3);
  const listener = () => {};
  w.events.on('task:started', listener);
  assert.equal(w.events.wantsTaskEvents, true);
  w.events.off('task:started', listener);
  assert.equal(w.events.wantsTaskEvents, false);
  assert.throws(() => w.events.on('task:finished' as never, () => {}), BerthInputError);
  assert.throws(() => w.events.on('task:started', 42 as never), BerthInputError);
});
