import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { pino } from 'pino';
import {
  BerthMetrics,
  defineTask,
  dequeue,
  enqueue,
  getTask,
  LeaseLostError,
  type TaskContext,
  Worker,
} from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { DATABASE_URL, expectOutcome, FAST_MAINTENANCE, freshSchema, outcomes, waitFor } from './helpers.js';

/** Issue 12, item 8: what a handler's context carries, and settling a task from inside its handler. */
const { schema, pool } = await freshSchema('handler_ctx');

/** Raw JSON lines, each checked for a key written twice (JSON.parse would keep the last silently). */
function rawLogger() {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l) lines.push(l);
      cb();
    },
  });
  return { logger: pino({ level: 'debug' }, stream), lines };
}

/** The top-level keys of a JSON object line, in order, duplicates kept. */
function topLevelKeys(line: string): string[] {
  const keys: string[] = [];
  let depth = 0;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === '"') {
      let j = i + 1;
      while (line[j] !== '"') j += line[j] === '\\' ? 2 : 1;
      if (depth === 1 && line[j + 1] === ':') keys.push(JSON.parse(line.slice(i, j + 1)) as string);
      i = j;
    } else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') depth--;
  }
  return keys;
}

async function withWorker(
  tasks: AnyTaskDefinition[],
  fn: (metrics: BerthMetrics) => Promise<void>,
  logger = rawLogger().logger,
) {
  const metrics = new BerthMetrics();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    pollIntervalMs: 100,
    logger,
    metrics,
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: false,
  });
  await w.start();
  try {
    await fn(metrics);
  } finally {
    await w.stop();
  }
}

test('the context has id, type, attempt, max attempts, lane, deadline, signal, schema, token, and a logger with the task fields once', async () => {
  const { logger, lines } = rawLogger();
  const box: { seen?: Omit<TaskContext<unknown>, 'signal'> & { aborted: boolean; leaseToken: string | undefined } } =
    {};
  const def = defineTask<{ n: number }>({
    type: 'ctx_fields',
    // The worker serves its definitions' queues (docs/architecture.md, "Routing").
    queue: 'ctxq',
    ceilingMs: 60_000,
    maxAttempts: 7,
    handler: async (_p, ctx) => {
      // What getTask would have said, for comparison only: the context needs no query.
      const record = await getTask(pool, schema, ctx.id);
      box.seen = { ...ctx, aborted: ctx.signal.aborted, leaseToken: record?.lease?.token };
      ctx.logger.info({ step: 'inside' }, 'handler says hello');
    },
  });
  const { id } = await enqueue(pool, def, { n: 1 }, { schema, queue: 'ctxq', priority: 3 });
  await withWorker(
    [def],
    async (metrics) => {
      await expectOutcome(metrics, 'ctx_fields', 'success', 1);
    },
    logger,
  );
  const ctx = box.seen;
  assert.ok(ctx, 'the handler ran');
  assert.equal(ctx.id, id);
  assert.equal(ctx.type, 'ctx_fields');
  assert.equal(ctx.attempt, 1);
  assert.equal(ctx.maxAttempts, 7);
  assert.deepEqual({ queue: ctx.lane.queue, priority: ctx.lane.priority }, { queue: 'ctxq', priority: 3 });
  assert.ok(ctx.deadline instanceof Date && ctx.deadline.getTime() > Date.now() - 120_000);
  assert.equal(ctx.aborted, false);
  assert.equal(ctx.schema, schema);
  assert.match(ctx.token, /^[0-9a-f-]{36}$/);
  assert.equal(ctx.token, ctx.leaseToken, 'ctx.token is the lease token getTask reads');
  assert.equal(typeof ctx.dequeue, 'function');

  const line = lines.find((l) => l.includes('handler says hello'));
  assert.ok(line, 'the handler logged through ctx.logger');
  const keys = topLevelKeys(line);
  assert.deepEqual(
    keys.filter((k, i) => keys.indexOf(k) !== i),
    [],
    `no key twice: ${line}`,
  );
  const parsed = JSON.parse(line) as Record<string, unknown>;
  assert.equal(parsed.task_id, id);
  assert.equal(parsed.task_type, 'ctx_fields');
  assert.equal(parsed.attempt, 1);
  assert.match(String(parsed.lane), /ctxq/);
  assert.equal(typeof parsed.worker, 'string');
  assert.equal(parsed.step, 'inside');
  for (const l of lines) {
    const k = topLevelKeys(l);
    assert.deepEqual(
      k.filter((x, i) => k.indexOf(x) !== i),
      [],
      `no key twice: ${l}`,
    );
  }
});

test('ctx.dequeue settles the task in the handler’s own transaction: committed, it is done once and counted a success', async () => {
  await pool.query('CREATE TABLE IF NOT EXISTS public.handler_ctx_orders (id text PRIMARY KEY)');
  let runs = 0;
  const def = defineTask<{ order: string }>({
    type: 'ctx_dequeue',
    ceilingMs: 60_000,
    handler: async (p, ctx) => {
      runs++;
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await c.query('INSERT INTO public.handler_ctx_orders (id) VALUES ($1)', [p.order]);
        await ctx.dequeue(c);
        await c.query('COMMIT');
      } catch (err) {
        await c.query('ROLLBACK');
        throw err;
      } finally {
        c.release();
      }
    },
  });
  const { id } = await enqueue(pool, def, { order: `o-${process.pid}` }, { schema });
  const { logger, lines } = rawLogger();
  await withWorker(
    [def],
    async (metrics) => {
      await expectOutcome(metrics, 'ctx_dequeue', 'success', 1);
      assert.equal(await outcomes(metrics, 'ctx_dequeue', 'lost'), 0, 'not counted as a lost lease');
    },
    logger,
  );
  assert.ok(
    lines.some((l) => l.includes('task dequeued by its handler')),
    'the worker saw its completion refused because the handler had settled it',
  );
  assert.equal(lines.filter((l) => /lease lost|refused/.test(l)).length, 0, lines.join('\n'));
  assert.equal(runs, 1);
  const row = await pool.query('SELECT 1 FROM public.handler_ctx_orders WHERE id = $1', [`o-${process.pid}`]);
  assert.equal(row.rowCount, 1);
  assert.equal(
    (await getTask(pool, schema, id!))?.state ?? 'gone',
    (await getTask(pool, schema, id!))?.state ?? 'gone',
  );
  const state = (await getTask(pool, schema, id!))?.state;
  assert.ok(state === undefined || state === 'completed', `completed, got ${state}`);
  await pool.query('DROP TABLE public.handler_ctx_orders');
});

test('ctx.dequeue in a transaction that rolls back leaves the task to the worker; a stale token is refused', async () => {
  let token = '';
  const def = defineTask<Record<string, never>>({
    type: 'ctx_rollback',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      token = ctx.token;
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await ctx.dequeue(c);
        await c.query('ROLLBACK');
      } finally {
        c.release();
      }
    },
  });
  const { id } = await enqueue(pool, def, {}, { schema });
  await withWorker([def], async (metrics) => {
    await expectOutcome(metrics, 'ctx_rollback', 'success', 1);
  });
  await waitFor(async () => {
    const s = (await getTask(pool, schema, id!))?.state;
    return s === undefined || s === 'completed';
  });
  // The run's lease is settled: its token no longer owns anything.
  await assert.rejects(dequeue(pool, schema, id!, token), LeaseLostError);
});

test('the context’s shape: its keys in order, a spread copy, and advanceCursor, dequeue and parents destructured work without it', async () => {
  const KEYS = [
    'id',
    'type',
    'attempt',
    'maxAttempts',
    'snoozes',
    'lane',
    'deadline',
    'logger',
    'schema',
    'token',
    'schedule',
    'advanceCursor',
    'dequeue',
    'parents',
    'signal',
  ];
  const seen: { step: number; problems: string[] }[] = [];
  const def = defineTask<{ step: number }>({
    type: 'ctx_shape',
    ceilingMs: 60_000,
    handler: async (p, ctx) => {
      const problems: string[] = [];
      const check = (ok: boolean, what: string) => {
        if (!ok) problems.push(what);
      };
      seen.push({ step: p.step, problems });
      check(JSON.stringify(Object.keys(ctx)) === JSON.stringify(KEYS), `keys ${Object.keys(ctx).join(',')}`);
      check(Object.getPrototypeOf(ctx) === Object.prototype, 'a plain object');
      check(Object.isFrozen(ctx.lane), 'lane frozen');
      // Each read again: an accessor's second read is the first one's value.
      const again = (k: 'deadline' | 'dequeue' | 'parents') => {
        const first: unknown = Reflect.get(ctx, k);
        return first === Reflect.get(ctx, k);
      };
      check(ctx.deadline instanceof Date && again('deadline'), 'deadline: one Date');
      check(again('dequeue') && again('parents'), 'one function per method');
      const spread = { ...ctx };
      check(
        JSON.stringify(Object.keys(spread)) === JSON.stringify(KEYS),
        `spread keys ${Object.keys(spread).join(',')}`,
      );
      for (const k of KEYS) check(spread[k as keyof typeof spread] !== undefined, `spread ${k} defined`);
      check(spread.deadline === ctx.deadline && spread.signal === ctx.signal, 'spread deadline and signal');
      check(spread.signal instanceof AbortSignal && !spread.signal.aborted, 'spread signal');
      check(spread.advanceCursor === ctx.advanceCursor && spread.dequeue === ctx.dequeue, 'spread methods');
      const { advanceCursor, dequeue: dequeueIt, parents } = ctx;
      check(advanceCursor.name === 'advanceCursor', `name ${advanceCursor.name}`);
      check(dequeueIt.name === 'dequeue' && parents.name === 'parents', 'names');
      const read = parents();
      check((await read).size === 0 && parents() === read, 'parents: an empty map, read once');
      if (p.step === 1) {
        check((await advanceCursor({ step: 2 })) === true, 'advanceCursor destructured');
        return 'continue';
      }
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await dequeueIt(c);
        await c.query('COMMIT');
      } finally {
        c.release();
      }
      // An assigned method is the context's from then on, as the data property it was.
      const mine = async () => {};
      ctx.dequeue = mine;
      check(ctx.dequeue === mine && Object.keys(ctx).join() === KEYS.join(), 'assigned dequeue');
    },
  });
  const { id } = await enqueue(pool, def, { step: 1 }, { schema });
  const { logger, lines } = rawLogger();
  await withWorker(
    [def],
    async (metrics) => {
      await expectOutcome(metrics, 'ctx_shape', 'success', 1);
    },
    logger,
  );
  assert.deepEqual(
    seen.map((s) => s.step),
    [1, 2],
  );
  assert.deepEqual(
    seen.flatMap((s) => s.problems),
    [],
  );
  assert.ok(
    lines.some((l) => l.includes('task dequeued by its handler')),
    lines.join('\n'),
  );
  const state = (await getTask(pool, schema, id!))?.state;
  assert.ok(state === undefined || state === 'completed', `completed, got ${state}`);
});
