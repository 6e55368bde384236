/**
 * berth through a real PgBouncer (Debian's 1.18: no protocol-level prepared statements), started
 * by this file in front of the shared test server's database (test/support/pgbouncer.ts), with
 * one alias per pool mode:
 * - transaction mode, statements unnamed (`preparedStatements: false`): producers enqueue
 *   through it (inside a user's transaction too) and a worker claims and settles through it,
 *   with its LISTEN and leader sessions on a direct `sessionConnectionString`, and poll-only
 *   (`sessionConnectionString: false`, no leader) without one;
 * - transaction mode, prepared statements on (the default): a second client's enqueue fails
 *   with the server's error code and a message naming the option, and works with it; workers
 *   not told find out (the second of two on one server connection meets the first's names)
 *   and go unnamed;
 * - session mode, every default: everything works, LISTEN and the leader included.
 * Workers that connect through the pooler warn that their session settings were dropped.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { Worker, withoutPreparedStatements, type WorkerOptions } from '../src/index.js';
import { BerthInputError, defineTask, enqueue, enqueueMany, enqueueSql, getTask } from '../src/index.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor } from './helpers.js';
import { fileBouncer } from './support/pgbouncer.js';
import { runCli } from './support/run-cli.js';
import { fileURLToPath } from 'node:url';

const { schema, pool: direct } = await freshSchema('pgbouncer');
const { bouncer, skip, closeAtEnd } = await fileBouncer(DATABASE_URL, {
  txn: { mode: 'transaction', size: 4 },
  // One server connection: a second client always meets the first one's statements.
  txn1: { mode: 'transaction', size: 1 },
  sess: { mode: 'session', size: 30 },
});

function pooled(alias: string, max = 4): pg.Pool {
  const p = closeAtEnd(new pg.Pool({ connectionString: bouncer!.url(alias), max }));
  p.on('error', () => undefined);
  return p;
}

const done = new Map<string, number>();
const noop = defineTask<{ n: number }>({
  type: 'pgb_noop',
  ceilingMs: 30_000,
  handler: async (_payload, ctx) => {
    done.set(ctx.id, (done.get(ctx.id) ?? 0) + 1);
  },
});
/** Fails its first attempt: the retry is scheduled, and only the leader makes it due again. */
const flaky = defineTask<{ n: number }>({
  type: 'pgb_flaky',
  ceilingMs: 30_000,
  backoff: { baseMs: 100, maxMs: 100 },
  handler: async (_payload, ctx) => {
    if (ctx.attempt === 1) throw new Error('first attempt fails');
    done.set(ctx.id, (done.get(ctx.id) ?? 0) + 1);
  },
});
const tasks = [noop, flaky];

async function allCompleted(db: pg.Pool, ids: readonly string[], preparedStatements = true): Promise<boolean> {
  for (const id of ids) {
    const t = await getTask(db, schema, id, { preparedStatements });
    if (t?.state !== 'completed') return false;
  }
  return true;
}

function settingsWarned(lines: Record<string, unknown>[]): boolean {
  return lines.some((l) => l.level === 40 && /session settings did not take effect/.test(String(l.msg)));
}

test('options: checked, unknown and mistyped values refused (no pooler needed)', async () => {
  const base = { connectionString: DATABASE_URL, schema, tasks };
  assert.throws(
    () => new Worker({ ...base, sessionConnectionString: false }),
    (e: unknown) => e instanceof BerthInputError && /maintenance: false/.test(e.message),
  );
  assert.throws(
    () => new Worker({ ...base, sessionConnectionString: 42 as unknown as string }),
    (e: unknown) => e instanceof BerthInputError && /sessionConnectionString/.test(e.message),
  );
  assert.throws(
    () => new Worker({ ...base, sessionConnectionString: 'localhost/db' }),
    (e: unknown) => e instanceof BerthInputError && /sessionConnectionString/.test(e.message),
  );
  assert.throws(
    () => new Worker({ ...base, preparedStatements: 'no' as unknown as boolean }),
    (e: unknown) => e instanceof BerthInputError && /preparedStatements/.test(e.message),
  );
  await assert.rejects(
    enqueue(direct, 'pgb_noop', { n: 0 }, { schema, preparedStatements: 1 as unknown as boolean }),
    (e: unknown) => e instanceof BerthInputError && /preparedStatements/.test(e.message),
  );
  await assert.rejects(
    getTask(direct, schema, '1', { prepared: false } as never),
    (e: unknown) => e instanceof BerthInputError && /prepared/.test(e.message),
  );
  await assert.rejects(
    enqueueSql(noop, { n: 0 }, { schema, preparedStatements: false } as never),
    (e: unknown) => e instanceof BerthInputError && /preparedStatements/.test(e.message),
  );
});

/**
 * A worker through `alias` with `options`, started, once it leads and listens (a long poll: a
 * task enqueued while it idles starts on its LISTEN wake-up); with the lines it logged.
 */
async function leadingWorker(
  alias: string,
  options: Partial<WorkerOptions>,
): Promise<{ worker: Worker; lines: Record<string, unknown>[] }> {
  const { logger, lines } = captureLogger();
  const worker = new Worker({
    connectionString: bouncer!.url(alias),
    schema,
    tasks,
    logger,
    pollIntervalMs: 600_000,
    maintenance: FAST_MAINTENANCE,
    ...options,
  });
  await worker.start();
  try {
    await waitFor(() => worker.isLeader, 20_000, `the worker through ${alias} to lead`);
    assert.notEqual(await worker.listenerBackendPid(), null, 'a LISTEN session');
    assert.ok(settingsWarned(lines), 'the worker warns that the pooler dropped its session settings');
  } catch (err) {
    await worker.stop();
    throw err;
  }
  return { worker, lines };
}

test('transaction mode, unnamed statements, sessions direct: producers and a worker through the pooler', {
  skip,
}, async () => {
  const producers = pooled('txn');
  // The election and LISTEN on the direct session; everything else through the pooler.
  const { worker } = await leadingWorker('txn', { sessionConnectionString: DATABASE_URL, preparedStatements: false });
  try {
    // A single enqueue through the pooler, per-call option.
    const one = await enqueue(producers, noop, { n: 1 }, { schema, preparedStatements: false });
    assert.equal(one.state, 'ready');
    // enqueueMany inside a user's transaction on a client of the pooler: committed with it.
    const client = await producers.connect();
    let many: string[];
    try {
      await client.query('BEGIN');
      await client.query('SELECT 1');
      const r = await enqueueMany(
        client,
        [
          ...Array.from({ length: 20 }, (_, n) => ({ type: noop, payload: { n }, queue: 'default' })),
          { type: flaky, payload: { n: 99 } },
          { type: noop, payload: { n: 100 }, delay: 300 },
        ],
        { schema, preparedStatements: false },
      );
      await client.query('COMMIT');
      many = r.map((x) => x.id!);
    } finally {
      client.release();
    }
    // A rolled-back enqueue through the pooler leaves nothing.
    const rolledBack = await producers.connect();
    let ghost: string;
    try {
      await rolledBack.query('BEGIN');
      ghost = (await enqueue(rolledBack, noop, { n: -1 }, { schema, preparedStatements: false })).id!;
      await rolledBack.query('ROLLBACK');
    } finally {
      rolledBack.release();
    }
    const ids = [one.id, ...many];
    // getTask through the pooler, on a pool made unnamed once.
    const reader = withoutPreparedStatements(producers);
    await waitFor(() => allCompleted(reader, ids), 30_000, 'every task completed (the delayed and the retried too)');
    assert.equal(await getTask(reader, schema, ghost), null, 'the rolled-back task does not exist');
    assert.ok(
      ids.every((id) => done.get(id) === 1),
      'each task ran to completion once',
    );
  } finally {
    await worker.stop();
  }
});

test('transaction mode, no session connection: poll-only, no leader, the worker drains', { skip }, async () => {
  const producers = withoutPreparedStatements(pooled('txn'));
  const { logger } = captureLogger();
  const worker = new Worker({
    connectionString: bouncer!.url('txn'),
    sessionConnectionString: false,
    maintenance: false,
    preparedStatements: false,
    schema,
    tasks,
    logger,
    pollIntervalMs: 200,
    // The worker's own dashboard reads through the pooler with the worker's options.
    http: { port: 0, dashboard: true },
  });
  await worker.start();
  try {
    assert.equal(await worker.listenerBackendPid(), null, 'no LISTEN session');
    const r = await enqueueMany(
      producers,
      Array.from({ length: 30 }, (_, n) => ({ type: noop, payload: { n } })),
      { schema },
    );
    const ids = r.map((x) => x.id!);
    await waitFor(() => allCompleted(producers, ids), 30_000, 'the poll-only worker to drain');
    assert.equal(worker.isLeader, false);
    for (const path of ['api/overview', 'api/lanes', 'api/maintenance', `api/tasks/${ids[0]}`]) {
      const res = await fetch(new URL(path, worker.httpUrl!));
      assert.equal(res.status, 200, `${path}: ${await res.text()}`);
    }
  } finally {
    await worker.stop();
  }
});

test('transaction mode, prepared statements on: a second client fails clearly; unnamed, it works', {
  skip,
}, async () => {
  const a = new pg.Client({ connectionString: bouncer!.url('txn1') });
  const b = new pg.Client({ connectionString: bouncer!.url('txn1') });
  await a.connect();
  await b.connect();
  try {
    // The first client prepares berth's statements on the one server connection ...
    await enqueue(a, noop, { n: 1 }, { schema });
    assert.ok(await getTask(a, schema, (await enqueue(a, noop, { n: 2 }, { schema })).id!));
    // ... where the second client's prepare of the same names is refused, in its transaction.
    await b.query('BEGIN');
    await assert.rejects(enqueue(b, noop, { n: 3 }, { schema }), (e: unknown) => {
      const err = e as { code?: string; message: string };
      assert.ok(err.code === '42P05' || err.code === '26000', `a prepared-statement error, got ${err.code}`);
      assert.match(err.message, /prepared statement/);
      assert.match(err.message, /preparedStatements: false/);
      return true;
    });
    // The error aborted the caller's transaction, as any error does: it is the caller's to end.
    await assert.rejects(b.query('SELECT 1'), (e: unknown) => (e as { code?: string }).code === '25P02');
    await b.query('ROLLBACK');
    // Unnamed, the same client works on the same server connection.
    await b.query('BEGIN');
    const r = await enqueue(b, noop, { n: 4 }, { schema, preparedStatements: false });
    await b.query('COMMIT');
    assert.equal((await getTask(b, schema, r.id!, { preparedStatements: false }))?.id, r.id);
  } finally {
    await a.end();
    await b.end();
  }
});

test('session mode, every default: producers, LISTEN and the leader through the pooler', { skip }, async () => {
  const producers = pooled('sess');
  const { worker } = await leadingWorker('sess', {});
  try {
    const r = await enqueueMany(
      producers,
      [
        { type: noop, payload: { n: 1 } },
        { type: flaky, payload: { n: 2 } },
        { type: noop, payload: { n: 3 }, delay: 300 },
      ],
      { schema },
    );
    const ids = r.map((x) => x.id!);
    await waitFor(() => allCompleted(producers, ids), 30_000, 'every task completed through the session pooler');
  } finally {
    await worker.stop();
  }
});

test('transaction mode, preparedStatements not given: workers find out and go unnamed', { skip }, async () => {
  // Two workers on one server connection: the second prepares a name the first already has
  // there (42P05), so the detection fires whatever order they start in.
  const started: { worker: Worker; lines: Record<string, unknown>[] }[] = [];
  try {
    for (let i = 0; i < 2; i++) {
      const { logger, lines } = captureLogger();
      const worker = new Worker({
        connectionString: bouncer!.url('txn1'),
        sessionConnectionString: false,
        maintenance: false,
        schema,
        tasks,
        logger,
        pollIntervalMs: 200,
      });
      await worker.start();
      started.push({ worker, lines });
    }
    const r = await enqueueMany(
      direct,
      Array.from({ length: 20 }, (_, n) => ({ type: noop, payload: { n } })),
      { schema },
    );
    await waitFor(
      () =>
        allCompleted(
          direct,
          r.map((x) => x.id!),
        ),
      30_000,
      'the two workers to drain',
    );
    const detected = started.flatMap(({ lines }) =>
      lines.filter((l) => l.level === 40 && /does not keep prepared statements/.test(String(l.msg))),
    );
    assert.ok(detected.length >= 1, 'a worker said it goes unnamed');
    assert.ok(
      started.every(
        ({ lines }) => lines.filter((l) => /does not keep prepared statements/.test(String(l.msg))).length <= 1,
      ),
      'once per worker',
    );
  } finally {
    for (const { worker } of started) await worker.stop();
  }
});

test('berth worker --poll-only --no-prepared-statements drains through the transaction pooler', { skip }, async () => {
  const module = fileURLToPath(new URL('./fixtures/cli-tasks.ts', import.meta.url));
  const base = ['worker', '--tasks', module, '--schema', schema, '--database-url', bouncer!.url('txn')];
  const env = { BERTH_LOG_LEVEL: 'silent' };
  const refused = await runCli([...base, '--poll-only'], env);
  assert.equal(refused.code, 2, 'poll-only with maintenance is a usage error');
  assert.match(refused.err, /--no-maintenance/);
  const r = await enqueueMany(
    direct,
    Array.from({ length: 10 }, (_, n) => ({ type: 'cli_ok', payload: { n } })),
    { schema },
  );
  const run = await runCli([...base, '--poll-only', '--no-maintenance', '--no-prepared-statements', '--drain'], env);
  assert.equal(run.code, 0, run.err);
  assert.ok(
    await allCompleted(
      direct,
      r.map((x) => x.id!),
    ),
    'every task the CLI worker claimed is completed',
  );
});
