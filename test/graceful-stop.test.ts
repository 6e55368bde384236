/**
 * Issue 13, item 3: `worker.stop({ graceMs })`. Claiming stops at once; running handlers may
 * finish within the grace period; whatever still runs then is aborted and released as seed 000
 * prescribes (cancelled, or continued when it saved progress; the attempt not refunded); a
 * second stop skips the grace. The CLI's --grace and signals are in cli-grace.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  BerthInputError,
  defineSchedule,
  defineTask,
  enqueue,
  getTask,
  type TaskContext,
  triggerSchedule,
  Worker,
  type WorkerOptions,
} from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { runDueTasks } from '../src/testing-api.js';
import { quoteIdent } from '../src/sql.js';
import {
  captureLogger,
  DATABASE_URL,
  expectOutcome,
  freshSchema,
  holdTableLock,
  outcomes,
  testLogger,
  waitFor,
  within,
} from './helpers.js';

const { schema, pool } = await freshSchema('grace');
const S = quoteIdent(schema);

/** A handler that finishes when the test says so, or throws its signal's reason when aborted first. */
function controlled(type: string, opts: { advance?: boolean } = {}) {
  const state = { started: 0, finish: (): void => {}, reason: null as string | null };
  const def = defineTask<{ step?: number }>({
    type,
    ceilingMs: 60_000,
    handler: async (payload, ctx: TaskContext<{ step?: number }>) => {
      state.started++;
      if (opts.advance && payload.step === undefined) await ctx.advanceCursor({ step: 1 });
      await new Promise<void>((resolve, reject) => {
        state.finish = resolve;
        ctx.signal.addEventListener(
          'abort',
          () => {
            state.reason = (ctx.signal.reason as { code?: string }).code ?? 'unknown';
            reject(ctx.signal.reason);
          },
          { once: true },
        );
      });
    },
  });
  return { def, state };
}

function worker(defs: AnyTaskDefinition[], options: Partial<WorkerOptions> = {}) {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: defs,
    slots: 2,
    prefetch: 0,
    pollIntervalMs: 100,
    logger: testLogger,
    maintenance: false,
    ...options,
  });
}

test('a handler that finishes within the grace period completes normally; claiming stopped at once', async () => {
  const { def, state } = controlled('g_finish');
  const w = worker([def]);
  await w.start();
  const { id } = await enqueue(pool, 'g_finish', {}, { schema });
  await waitFor(() => state.started === 1, 20_000, 'the handler to start');
  const stopped = w.stop({ graceMs: 600_000 });
  // Enqueued during the grace: not claimed by a stopping worker.
  const later = await enqueue(pool, 'g_finish', {}, { schema });
  assert.equal(w.activeSlots, 1);
  state.finish();
  await within(stopped, 20_000, 'stop after the handler finished');
  assert.equal(state.reason, null, 'never aborted');
  assert.equal(await outcomes(w.metrics, 'g_finish', 'success'), 1);
  assert.equal(await getTask(pool, schema, id!).then((t) => t?.state ?? 'gone'), 'completed');
  // Never started: still ready, or (claimed by a fetch already in flight when stop began) handed
  // back unstarted with the attempt refunded.
  const l = await getTask(pool, schema, later.id!);
  assert.ok(l?.state === 'ready' || l?.state === 'retryable', l?.state);
  assert.equal(l?.attempts, 0);
  assert.equal(state.started, 1);
});

test('past the grace period the handler is aborted (ShutdownAbort), released and recorded cancelled, the attempt not refunded', async () => {
  const { def, state } = controlled('g_over');
  const w = worker([def]);
  await w.start();
  const { id } = await enqueue(pool, 'g_over', {}, { schema });
  await waitFor(() => state.started === 1, 20_000, 'the handler to start');
  await within(w.stop({ graceMs: 200 }), 20_000, 'stop');
  assert.equal(state.reason, 'SHUTDOWN_ABORT');
  await expectOutcome(w.metrics, 'g_over', 'cancelled', 1);
  const t = await getTask(pool, schema, id!);
  assert.equal(t?.state, 'retryable', 'released: due again at once');
  assert.equal(t?.attempts, 1, 'the attempt the claim burnt is kept');
  const d = await pool.query(`SELECT run_at <= now() AS due FROM ${S}.deferred WHERE id = $1`, [id]);
  assert.equal(d.rows[0].due, true);
});

test('past the grace period a handler that saved progress is recorded continued', async () => {
  const { def, state } = controlled('g_slice', { advance: true });
  const w = worker([def]);
  await w.start();
  const { id } = await enqueue(pool, 'g_slice', {}, { schema });
  await waitFor(() => state.started === 1, 20_000, 'the handler to start');
  await waitFor(async () => (await getTask(pool, schema, id!))?.state === 'retryable', 20_000, 'the cursor to advance');
  await within(w.stop({ graceMs: 100 }), 20_000, 'stop');
  assert.equal(state.reason, 'SHUTDOWN_ABORT');
  await expectOutcome(w.metrics, 'g_slice', 'continued', 1);
  const t = await getTask(pool, schema, id!);
  assert.deepEqual(t?.payload, { step: 1 });
  assert.equal(t?.attempts, 0, 'progress resets the count (seed 000), the stop itself refunds nothing');
});

test('a second stop skips the grace: the handler is aborted at once and both calls resolve', async () => {
  const { def, state } = controlled('g_skip');
  const w = worker([def]);
  await w.start();
  await enqueue(pool, 'g_skip', {}, { schema });
  await waitFor(() => state.started === 1, 20_000, 'the handler to start');
  // An hour of grace: only the second call can end it within the wait below.
  const first = w.stop({ graceMs: 3_600_000 });
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(state.reason, null, 'still within the grace');
  const second = w.stop();
  await within(Promise.all([first, second]), 20_000, 'both stops');
  assert.equal(state.reason, 'SHUTDOWN_ABORT');
  await expectOutcome(w.metrics, 'g_skip', 'cancelled', 1);
});

test('stop options are checked: an unknown key or a bad grace is a BerthInputError naming it, and nothing stops', async () => {
  const { def, state } = controlled('g_opts');
  const w = worker([def]);
  await w.start();
  try {
    await assert.rejects(
      w.stop({ grace: 5 } as never),
      (e: Error) => e instanceof BerthInputError && /grace/.test(e.message),
    );
    await assert.rejects(
      w.stop({ graceMs: -1 }),
      (e: Error) => e instanceof BerthInputError && /graceMs/.test(e.message),
    );
    await assert.rejects(
      w.stop({ graceMs: Number.NaN }),
      (e: Error) => e instanceof BerthInputError && /graceMs/.test(e.message),
    );
    // Still running: it claims and runs a task.
    await enqueue(pool, 'g_opts', {}, { schema });
    await waitFor(() => state.started === 1, 20_000, 'a task to run');
  } finally {
    await w.stop();
  }
});

/** A type whose payload schema answers only when the test resolves it (an asynchronous validator). */
function slowSchema(type: string) {
  const state = { validating: 0, started: 0, answer: (): void => {} };
  const def = defineTask<{ n: number }>({
    type,
    ceilingMs: 60_000,
    schema: {
      '~standard': {
        version: 1,
        vendor: 'test',
        validate: (v: unknown) => {
          state.validating++;
          return new Promise<{ value: { n: number } }>((resolve) => {
            state.answer = () => resolve({ value: v as { n: number } });
          });
        },
      },
    },
    handler: async () => {
      state.started++;
    },
  });
  return { def, state };
}

test('a stop while a payload schema is still answering: the handler never starts, the task is handed back with its attempt refunded', async () => {
  const { def, state } = slowSchema('g_validating');
  // Aborted by the stop in the same pass as the validating run: once it has heard, so has that run.
  const companion = controlled('g_companion');
  const { logger, lines } = captureLogger();
  const w = worker([def, companion.def], { logger });
  await w.start();
  const { id } = await enqueue(pool, def.type, { n: 1 }, { schema });
  await enqueue(pool, companion.def.type, {}, { schema });
  await waitFor(() => state.validating === 1 && companion.state.started === 1, 20_000, 'both tasks to start');
  const stopped = w.stop({ graceMs: 100 });
  await waitFor(() => companion.state.reason !== null, 20_000, 'the grace to end');
  // Past the grace, its run's signal aborted, the schema answers: a good payload.
  state.answer();
  await within(stopped, 20_000, 'stop');
  assert.equal(state.started, 0, 'the handler never started');
  const t = await getTask(pool, schema, id!);
  assert.ok(t?.state === 'ready' || t?.state === 'retryable', t?.state);
  assert.equal(t?.attempts, 0, 'handed back unstarted: the attempt refunded');
  await expectOutcome(w.metrics, companion.def.type, 'cancelled', 1);
  // Told as the stop's doing, with the task's fields, not as a prefetched task's deadline.
  const told = lines.filter((l) => l.task_id === id);
  assert.ok(
    told.some(
      (l) => l.msg === 'the worker stopped before the handler started; task handed back unstarted' && l.handed_back,
    ),
    JSON.stringify(told),
  );
  assert.ok(!told.some((l) => /deadline before a slot freed/.test(String(l.msg))), JSON.stringify(told));
});

test('a payload schema that answers after stop() returned: the handler never starts and nothing throws', async () => {
  const { def, state } = slowSchema('g_validating_late');
  const w = worker([def], { slots: 1, stopTimeoutMs: 50 });
  await w.start();
  await enqueue(pool, def.type, { n: 1 }, { schema });
  await waitFor(() => state.validating === 1, 20_000, 'the validator to be asked');
  // Its run outlives the stop timeout, as a handler that ignores its signal does.
  await within(w.stop({ graceMs: 0 }), 20_000, 'stop');
  state.answer();
  // The answer's reactions (the start, the hand-back the closed pools refuse) run within turns.
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
  assert.equal(state.started, 0, 'the handler never started after stop() returned');
});

test("a stop while a scheduled task's ceiling is still being read: the handler never starts, the task is handed back with its attempt refunded", async () => {
  const ran: string[] = [];
  const def = defineTask<{ n: number }>({
    type: 'g_scheduled',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      ran.push(ctx.id);
    },
  });
  const schedule = defineSchedule({
    name: 'g-yearly',
    cron: '0 0 1 1 *',
    task: def,
    payload: { n: 1 },
    ceilingMs: 30_000,
  });
  // Declared (its row is what the worker reads for the ceiling), then fired by hand.
  await runDueTasks(pool, [def], { schema, schedules: [schedule], now: new Date('2000-01-01T00:00:00Z') });
  const { taskId } = await triggerSchedule(pool, schema, 'g-yearly');
  // Aborted by the stop in the same pass as the waiting run: once it has heard, so has that run.
  const companion = controlled('g_sched_companion');
  // The worker's read of the schedule's ceiling waits behind this lock until the test lets it go.
  const lock = await holdTableLock(pool, `${S}.schedules`);
  const w = worker([def, companion.def]);
  try {
    await w.start();
    await enqueue(pool, companion.def.type, {}, { schema });
    const readWaits = async () =>
      (
        await pool.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE query LIKE '%ceiling_ms, task_type FROM ${S}.schedules%' AND wait_event_type = 'Lock'`,
        )
      ).rows[0].n > 0;
    await waitFor(readWaits, 20_000, 'the ceiling read to wait on the lock');
    await waitFor(() => companion.state.started === 1, 20_000, 'the companion to start');
    const stopped = w.stop({ graceMs: 0 });
    await waitFor(() => companion.state.reason !== null, 20_000, 'the stop to abort the runs');
    await lock.release();
    await within(stopped, 20_000, 'stop');
  } finally {
    await lock.release();
  }
  assert.deepEqual(ran, [], 'the handler never started');
  const t = await getTask(pool, schema, taskId);
  assert.ok(t?.state === 'ready' || t?.state === 'retryable', t?.state);
  assert.equal(t?.attempts, 0, 'handed back unstarted: the attempt refunded');
});
