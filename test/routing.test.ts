import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BerthInputError, defineTask, enqueue, enqueueMany, getTask, Worker } from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { resolveUnknownTypeOptions, UnknownTypes } from '../src/processor/unknown-types.js';
import {
  captureLogger,
  counterValue,
  DATABASE_URL,
  FAST_MAINTENANCE,
  freshSchema,
  outcomes,
  waitFor,
} from './helpers.js';

const { schema, pool } = await freshSchema('routing');
const S = `"${schema}"`;

/** Short delays, so a handed-back task is due again quickly; one log line per type per minute. */
const QUICK_HAND_BACK = { delayMs: 50, maxDelayMs: 200, logIntervalMs: 60_000 };

function makeWorker(
  name: string,
  tasks: AnyTaskDefinition[],
  opts: Partial<ConstructorParameters<typeof Worker>[0]> = {},
) {
  const { logger, lines } = captureLogger();
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    slots: 4,
    pollIntervalMs: 100,
    workerId: `${name}-${process.pid}`,
    logger,
    maintenance: FAST_MAINTENANCE,
    unknownTypes: QUICK_HAND_BACK,
    heartbeatIntervalMs: false,
    ...opts,
  });
  return { worker, lines };
}

/** A definition that records, per run, which worker ran it and on which attempt. */
function recorded(
  type: string,
  queue: string | undefined,
  runs: { type: string; attempt: number; by: string }[],
  by: string,
) {
  return defineTask<{ n: number }>({
    type,
    queue,
    ceilingMs: 10_000,
    handler: async (_p, ctx) => {
      runs.push({ type, attempt: ctx.attempt, by });
    },
  });
}

async function deadLetters(types: string[]): Promise<number> {
  const r = await pool.query(`SELECT count(*)::int AS n FROM ${S}.dead_letters WHERE type = ANY($1::text[])`, [types]);
  return r.rows[0].n;
}

const unknownCount = (w: Worker, type: string) =>
  counterValue(w.metrics, 'berth_tasks_unknown_type_total', { task_type: type });

const handBackLines = (lines: Record<string, unknown>[], type: string) =>
  lines.filter(
    (l) => l.task_type === type && typeof l.msg === 'string' && l.msg.startsWith('no handler for task type'),
  );

test('defineTask: queue is optional, checked like an enqueue queue, and kept on the definition', () => {
  const handler = async () => {};
  assert.equal(defineTask({ type: 'r_plain', ceilingMs: 1000, handler }).queue, undefined);
  assert.equal(defineTask({ type: 'r_q', ceilingMs: 1000, handler, queue: 'mail' }).queue, 'mail');
  // A number, a NUL, an over-long name: refused naming the field and the task.
  for (const queue of [42, 'a\u0000b', 'x'.repeat(256)]) {
    assert.throws(
      () => defineTask({ type: 'r_bad', ceilingMs: 1000, handler, queue: queue as string }),
      (e: unknown) =>
        e instanceof BerthInputError && /^task "r_bad": queue (must be a string|contains a NUL)/.test(e.message),
    );
  }
});

test('enqueue by definition routes to its queue; an explicit queue option wins; by name goes to default', async () => {
  const def = defineTask<{ n: number }>({ type: 'r_route', queue: 'mail', ceilingMs: 1000, handler: async () => {} });
  const byDef = await enqueue(pool, def, { n: 1 }, { schema });
  const overridden = await enqueue(pool, def, { n: 2 }, { schema, queue: 'mail_slow' });
  const byName = await enqueue(pool, 'r_route', { n: 3 }, { schema });
  const many = await enqueueMany(
    pool,
    [
      { type: def, payload: { n: 4 } },
      { type: def, payload: { n: 5 }, queue: 'mail_bulk' },
      { type: 'r_route', payload: { n: 6 } },
    ],
    { schema },
  );
  const queueOf = async (id: string | null) => (await getTask(pool, schema, id!))!.queue;
  assert.equal(await queueOf(byDef.id), 'mail');
  assert.equal(await queueOf(overridden.id), 'mail_slow');
  assert.equal(await queueOf(byName.id), 'default');
  assert.deepEqual(await Promise.all(many.map((r) => queueOf(r.id))), ['mail', 'mail_bulk', 'default']);
  // A hand-made definition-like object is checked too.
  await assert.rejects(
    enqueue(
      pool,
      { type: 'r_route', maxAttempts: 3, schema: undefined, queue: 7 as unknown as string },
      {},
      { schema },
    ),
    (e: unknown) => e instanceof BerthInputError && /queue must be a string/.test(e.message),
  );
  await pool.query(`DELETE FROM ${S}.ready WHERE type = 'r_route'`);
});

test("Worker queues: default is its definitions' queues (default for none), 'all' is every queue, a list is exact", () => {
  const handler = async () => {};
  const tasks = [
    defineTask({ type: 'r_a', queue: 'mail', ceilingMs: 1000, handler }),
    defineTask({ type: 'r_b', ceilingMs: 1000, handler }),
    defineTask({ type: 'r_c', queue: 'mail', ceilingMs: 1000, handler }),
  ];
  const base = { connectionString: DATABASE_URL, schema, tasks };
  assert.deepEqual(new Worker(base).queues, ['mail', 'default']);
  assert.equal(new Worker({ ...base, queues: 'all' }).queues, null);
  assert.deepEqual(new Worker({ ...base, queues: ['x'] }).queues, ['x']);
  assert.deepEqual(new Worker({ ...base, tasks: [] }).queues, [], 'no definitions: nothing to serve');
  assert.throws(
    () => new Worker({ ...base, queues: 'every' as 'all' }),
    (e: unknown) => e instanceof BerthInputError && /queues must be an array of queue names or 'all'/.test(e.message),
  );
  assert.throws(
    () => new Worker({ ...base, queues: ['ok', 3 as unknown as string] }),
    (e: unknown) => e instanceof BerthInputError && /queues\[1\] must be a string/.test(e.message),
  );
  assert.throws(
    () => new Worker({ ...base, unknownTypes: { delayMs: 10, maxDelay: 20 } as never }),
    (e: unknown) => e instanceof BerthInputError && /unknownTypes: unknown option "maxDelay"/.test(e.message),
  );
  assert.throws(
    () => new Worker({ ...base, unknownTypes: { delayMs: 1000, maxDelayMs: 10 } }),
    (e: unknown) => e instanceof BerthInputError && /unknownTypes.maxDelayMs .*at least delayMs/.test(e.message),
  );
});

test('two services on one database, routed by queue: each worker runs only its own types, none is ever handed back', async () => {
  const runs: { type: string; attempt: number; by: string }[] = [];
  const a = makeWorker('svc-a', [recorded('r_svc_a', 'svc_a', runs, 'a')]);
  const b = makeWorker('svc-b', [recorded('r_svc_b', 'svc_b', runs, 'b')]);
  // The producer imports both services' definitions; each routes to its own queue.
  const defA = recorded('r_svc_a', 'svc_a', runs, 'producer');
  const defB = recorded('r_svc_b', 'svc_b', runs, 'producer');
  await a.worker.start();
  await b.worker.start();
  try {
    const specs = Array.from({ length: 40 }, (_, i) => ({ type: i % 2 ? defA : defB, payload: { n: i } }));
    await enqueueMany(pool, specs, { schema });
    await waitFor(() => runs.length >= 40, 30_000, 'all 40 tasks run');
    assert.equal(runs.length, 40, 'each ran once');
    for (const r of runs) {
      assert.equal(r.by, r.type === 'r_svc_a' ? 'a' : 'b', `${r.type} ran on its own service`);
      assert.equal(r.attempt, 1, 'no attempt charged before the run');
    }
    assert.equal(await unknownCount(a.worker, 'r_svc_b'), 0);
    assert.equal(await unknownCount(b.worker, 'r_svc_a'), 0);
    assert.equal(await deadLetters(['r_svc_a', 'r_svc_b']), 0);
  } finally {
    await Promise.all([a.worker.stop(), b.worker.stop()]);
  }
});

test('two task sets sharing one queue: the other set is handed back without charge, each runs its own, nothing dead-letters', async () => {
  const runs: { type: string; attempt: number; by: string }[] = [];
  // Both definitions name the same queue: the two workers meet in the same lanes.
  const a = makeWorker('shared-a', [recorded('r_sh_a', 'shared', runs, 'a')]);
  const b = makeWorker('shared-b', [recorded('r_sh_b', 'shared', runs, 'b')]);
  const specs = Array.from({ length: 30 }, (_, i) => ({
    type: i % 2 ? 'r_sh_a' : 'r_sh_b',
    payload: { n: i },
    queue: 'shared',
    // Every task on its lane's entry order: both types interleave in every lane.
    maxAttempts: 1,
  }));
  await a.worker.start();
  try {
    await enqueueMany(pool, specs, { schema });
    // A alone first: it must meet B's type (it is in the same lanes) and hand it back. Every
    // task has maxAttempts 1, so one charged attempt would dead-letter it.
    await waitFor(async () => (await unknownCount(a.worker, 'r_sh_b')) >= 15, 30_000, 'A handing back B type');
    await waitFor(() => runs.filter((r) => r.type === 'r_sh_a').length >= 15, 30_000, "A's own tasks run");
    await b.worker.start();
    await waitFor(() => runs.length >= 30, 30_000, 'all 30 tasks run');
    assert.equal(runs.length, 30, 'each ran once');
    for (const r of runs) {
      assert.equal(r.by, r.type === 'r_sh_a' ? 'a' : 'b');
      assert.equal(r.attempt, 1, 'handed-back tasks were never charged');
    }
    assert.equal(await deadLetters(['r_sh_a', 'r_sh_b']), 0, 'never dead-lettered for being unknown');
    for (const w of [a.worker, b.worker]) {
      for (const type of ['r_sh_a', 'r_sh_b']) assert.equal(await outcomes(w.metrics, type, 'failure'), 0);
    }
    // Logged once for the type on A (many hand-backs, one interval), and never for A's own.
    assert.equal(handBackLines(a.lines, 'r_sh_b').length, 1);
    assert.equal(handBackLines(a.lines, 'r_sh_a').length, 0);
    assert.equal(handBackLines(a.lines, 'r_sh_b')[0]!.level, 40, 'warn');
  } finally {
    await Promise.all([a.worker.stop(), b.worker.stop()]);
  }
});

test('rolling deploy that adds a type: the old worker hands the new type back without charge, the new worker runs it', async () => {
  const runs: { type: string; attempt: number; by: string }[] = [];
  const v1 = makeWorker('deploy-v1', [recorded('r_dep_old', 'deploy', runs, 'v1')]);
  const v2Defs = [recorded('r_dep_old', 'deploy', runs, 'v2'), recorded('r_dep_new', 'deploy', runs, 'v2')];
  const v2 = makeWorker('deploy-v2', v2Defs);
  await v1.worker.start();
  try {
    // The producer is already on v2: it enqueues the new type by its definition.
    const fresh = await enqueueMany(
      pool,
      Array.from({ length: 5 }, (_, i) => ({ type: v2Defs[1]!, payload: { n: i } })),
      { schema },
    );
    await enqueueMany(
      pool,
      Array.from({ length: 5 }, (_, i) => ({ type: v2Defs[0]!, payload: { n: i } })),
      { schema },
    );
    await waitFor(() => runs.filter((r) => r.type === 'r_dep_old').length >= 5, 30_000, 'old type run by v1');
    // v1 keeps meeting the new type and keeps handing it back (short delays here).
    await waitFor(async () => (await unknownCount(v1.worker, 'r_dep_new')) >= 15, 30_000, 'repeated hand-backs');
    for (const r of fresh) {
      const t = await getTask(pool, schema, r.id!);
      assert.notEqual(t, null, 'nothing lost');
      // Read between hand-backs, or while v1 holds it for its next one (attempt 1 of that lease).
      assert.equal(t!.lease ? t!.lease.attempt : t!.attempts + 1, 1, 'never charged');
      assert.notEqual(t!.state, 'dead');
    }
    const note = await pool.query(
      `SELECT last_error FROM ${S}.deferred WHERE type = 'r_dep_new' AND last_error IS NOT NULL LIMIT 1`,
    );
    if (note.rows[0])
      assert.match(note.rows[0].last_error, /no handler for task type "r_dep_new" on worker deploy-v1-/);
    const logged = handBackLines(v1.lines, 'r_dep_new');
    assert.equal(logged.length, 1, 'one line per type per interval, however many hand-backs');
    assert.equal(logged[0]!.queue, 'deploy');
    assert.equal(logged[0]!.delay_ms, QUICK_HAND_BACK.delayMs);
    // The new version starts next to the old one; then the old one goes.
    await v2.worker.start();
    await waitFor(() => runs.filter((r) => r.type === 'r_dep_new').length >= 5, 30_000, 'new type run by v2');
    await v1.worker.stop();
    const newRuns = runs.filter((r) => r.type === 'r_dep_new');
    assert.equal(newRuns.length, 5, 'each ran once');
    for (const r of newRuns) {
      assert.equal(r.by, 'v2');
      assert.equal(r.attempt, 1, 'first attempt, however often v1 handed it back');
    }
    assert.equal(await deadLetters(['r_dep_old', 'r_dep_new']), 0);
    assert.equal(await outcomes(v1.worker.metrics, 'r_dep_new', 'failure'), 0);
  } finally {
    await Promise.all([v1.worker.stop(), v2.worker.stop()]);
  }
});

test('unknown types: counted every time, logged once per type per interval, the delay doubles per consecutive interval up to the cap', async () => {
  const { logger, lines } = captureLogger();
  const metrics = new BerthMetrics();
  const opts = resolveUnknownTypeOptions({ delayMs: 100, maxDelayMs: 350, logIntervalMs: 1000 });
  const u = new UnknownTypes(opts, metrics, logger, 'w1');
  const x = { type: 'x', queue: 'q' };
  const y = { type: 'y', queue: 'q' };
  assert.equal(u.handBack(x, 0), 100);
  for (let t = 10; t < 1000; t += 10) assert.equal(u.handBack(x, t), 100);
  assert.equal(u.handBack(y, 500), 100);
  assert.equal(handBackLines(lines, 'x').length, 1, 'one line for 100 hand-backs within the interval');
  assert.equal(handBackLines(lines, 'y').length, 1, 'its own line for another type');
  assert.equal(await counterValue(metrics, 'berth_tasks_unknown_type_total', { task_type: 'x' }), 100);
  // The next interval: a second line, carrying the count of the one before, and a longer delay.
  assert.equal(u.handBack(x, 1000), 200);
  assert.equal(handBackLines(lines, 'x').length, 2);
  assert.equal(handBackLines(lines, 'x')[1]!.handed_back_last_interval, 100);
  assert.equal(u.handBack(x, 2000), 350, 'capped at maxDelayMs');
  // Not seen for over an interval: back to the first delay.
  assert.equal(u.handBack(x, 5000), 100);
  assert.equal(handBackLines(lines, 'x').length, 4);
  assert.match(u.note('x'), /^no handler for task type "x" on worker w1: handed back without charging an attempt$/);
  assert.deepEqual(resolveUnknownTypeOptions(undefined), { delayMs: 5000, maxDelayMs: 300_000, logIntervalMs: 60_000 });
});
