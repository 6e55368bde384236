import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Registry } from 'prom-client';
import {
  BerthInputError,
  BerthMetrics,
  createDashboardHandler,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  grantRuntimeRole,
  listAudit,
  listDead,
  listTasks,
  migrate,
  moveTask,
  retryDead,
  runSlices,
  startDashboard,
  startMetricsServer,
  Worker,
  type TaskContext,
} from '../src/index.js';
import { maintainRing, Maintenance } from '../src/maintenance-api.js';
import { editDistance, nearest } from '../src/util/nearest.js';

/**
 * Issue 12, item 5: every public options object refuses an unknown key with a BerthInputError
 * naming it and, when one is close, the key that was meant. None of these reach a database: the
 * keys are checked before anything connects (the `db` below would throw if used).
 */
const db = {
  query: () => {
    throw new Error('the key check must come first');
  },
} as never;
const handler = async () => {};

function refuses(fn: () => unknown, key: string, meant?: string): void {
  assert.throws(fn, (err: Error) => {
    assert.ok(err instanceof BerthInputError, `${err}`);
    assert.match(err.message, new RegExp(`"${key}"`));
    if (meant) assert.match(err.message, new RegExp(`did you mean "${meant}"\\?`), err.message);
    else assert.doesNotMatch(err.message, /did you mean/, err.message);
    return true;
  });
}

async function rejects(p: () => Promise<unknown>, key: string, meant?: string): Promise<void> {
  await assert.rejects(p, (err: Error) => {
    assert.ok(err instanceof BerthInputError, `${err}`);
    assert.match(err.message, new RegExp(`"${key}"`));
    if (meant) assert.match(err.message, new RegExp(`did you mean "${meant}"\\?`), err.message);
    return true;
  });
}

test('nearest: a close misspelling, a swapped pair, a missing unit, a different case; nothing for an unrelated key', () => {
  const keys = ['maxAttempts', 'backoff', 'ceilingMs', 'leaseMarginMs', 'delay', 'queue'];
  assert.equal(nearest('maxAttemps', keys), 'maxAttempts');
  assert.equal(nearest('dealy', keys), 'delay');
  assert.equal(nearest('ceiling', keys), 'ceilingMs');
  assert.equal(nearest('leaseMargin', keys), 'leaseMarginMs');
  assert.equal(nearest('MAXATTEMPTS', keys), 'maxAttempts');
  assert.equal(nearest('quuee', keys), 'queue');
  assert.equal(nearest('retries', keys), undefined);
  assert.equal(nearest('x', keys), undefined);
  assert.equal(editDistance('abc', 'acb'), 1);
  assert.equal(editDistance('', 'abc'), 3);
});

test("the issue's examples: defineTask's maxAttemps and backoff.initial, Worker's leaseMargin", () => {
  refuses(
    () => defineTask({ type: 't', ceilingMs: 1000, handler, maxAttemps: 3 } as never),
    'maxAttemps',
    'maxAttempts',
  );
  refuses(
    () => defineTask({ type: 't', ceilingMs: 1000, handler, backoff: { initial: 50 } } as never),
    'initial',
    'baseMs',
  );
  refuses(() => defineTask({ type: 't', ceilingMs: 1000, handler, backoff: { maxMS: 50 } } as never), 'maxMS', 'maxMs');
  refuses(
    () => new Worker({ connectionString: 'postgres://h/d', tasks: [], leaseMargin: 1000 } as never),
    'leaseMargin',
    'leaseMarginMs',
  );
  refuses(() => defineTask({ type: 't', ceilingMs: 1000, handler, retries: 3 } as never), 'retries');
});

test("Worker: a timer option past Node's timer limit (2^31 - 1 ms) is refused, not fired after 1 ms", () => {
  const worker = (extra: object) => () => new Worker({ connectionString: 'postgres://h/d', tasks: [], ...extra });
  for (const field of [
    'stopTimeoutMs',
    'pollIntervalMs',
    'heartbeatIntervalMs',
    'statementTimeoutMs',
    'leaseMarginMs',
  ]) {
    for (const value of [2 ** 31, Number.POSITIVE_INFINITY]) {
      assert.throws(
        worker({ [field]: value }),
        (err: unknown) =>
          err instanceof BerthInputError &&
          err.message === `${field} must be at most 2147483647 ms (Node's timer limit), got ${value}`,
        `${field}: ${value}`,
      );
    }
    // The limit itself is a valid delay.
    assert.doesNotThrow(worker({ [field]: 2 ** 31 - 1 }), field);
  }
  assert.doesNotThrow(worker({ heartbeatIntervalMs: false }));
});

test('Worker: its maintenance, http and http.dashboard options', () => {
  const worker = (extra: object) => () => new Worker({ connectionString: 'postgres://h/d', tasks: [], ...extra });
  refuses(worker({ maintenance: { rescueInterval: 5 } }), 'rescueInterval', 'rescueIntervalMs');
  refuses(worker({ http: { port: 0, metric: false } }), 'metric', 'metrics');
  refuses(worker({ http: { port: 0, dashboard: { readonly: true } } }), 'readonly', 'readOnly');
  refuses(worker({ http: { port: 0, dashboard: { authLimits: { trustProxys: true } } } }), 'trustProxys', 'trustProxy');
  refuses(worker({ pollInterval: 10 }), 'pollInterval', 'pollIntervalMs');
  refuses(worker({ sessionConnection: false }), 'sessionConnection', 'sessionConnectionString');
});

test('enqueue, enqueueMany and their task specs', async () => {
  await rejects(() => enqueue(db, 't', {}, { dealy: 5 } as never), 'dealy', 'delay');
  await rejects(() => enqueue(db, 't', {}, { dedupKey: 'k' } as never), 'dedupKey', 'dedupeKey');
  await rejects(() => enqueueMany(db, [{ type: 't', payload: {}, prority: 1 } as never]), 'prority', 'priority');
  await rejects(() => enqueueMany(db, [], { shema: 'x' } as never), 'shema', 'schema');
  await rejects(
    () => enqueue(db, 't', {}, { preparedStatement: false } as never),
    'preparedStatement',
    'preparedStatements',
  );
  await rejects(
    () => getTask(db, 's', '1', { preparedStatement: false } as never),
    'preparedStatement',
    'preparedStatements',
  );
});

test('dashboard options (server and handler), auth and auth limits', async () => {
  await rejects(() => startDashboard({ connectionString: 'postgres://h/d', prot: 1 } as never), 'prot', 'port');
  refuses(() => createDashboardHandler({ pool: db, basepath: '/x' } as never), 'basepath', 'basePath');
  await rejects(
    () => startDashboard({ connectionString: 'postgres://h/d', auth: { tokn: 'x'.repeat(40) } } as never),
    'tokn',
    'token',
  );
});

test('migrations, roles, admin reads and actions, metrics, slices and maintenance primitives', async () => {
  await rejects(() => migrate({ connectionString: 'postgres://h/d', schemaa: 'x' } as never), 'schemaa', 'schema');
  await rejects(
    () => grantRuntimeRole({ connectionString: 'postgres://h/d', role: 'r', knd: 'worker' } as never),
    'knd',
    'kind',
  );
  await rejects(() => listTasks(db, 's', { stat: 'ready' } as never), 'stat', 'state');
  await rejects(() => listTasks(db, 's', {}, { limt: 5 } as never), 'limt', 'limit');
  await rejects(() => listDead(db, 's', { typ: 'x' } as never), 'typ', 'type');
  await rejects(() => retryDead(db, 's', { queue: 'q', errorContain: 'x' } as never), 'errorContain', 'errorContains');
  await rejects(() => listAudit(db, 's', { befor: '1' } as never), 'befor', 'before');
  await rejects(() => moveTask(db, 's', '1', { queu: 'x' } as never), 'queu', 'queue');
  await rejects(
    () => maintainRing(db, 's', { rotateAfterMs: 1, lockTimeoutMs: 1, lockTimeout: 2 } as never),
    'lockTimeout',
    'lockTimeoutMs',
  );
  refuses(() => new BerthMetrics({ registy: new Registry() } as never), 'registy', 'registry');
  await rejects(() => startMetricsServer({ port: 0, registry: new Registry(), hots: 'x' } as never), 'hots', 'host');
  const ctx = { id: '1' } as TaskContext<unknown>;
  await rejects(
    () =>
      runSlices({}, ctx, {
        cursorOf: () => null,
        withCursor: (p: unknown) => p,
        readPage: async () => ({ next: null }),
        sliceMS: 5,
      } as never),
    'sliceMS',
    'sliceMs',
  );
  refuses(
    () =>
      new Maintenance({ connectionString: 'x', schema: 's', pool: db, logger: db, metrics: db, option: {} } as never),
    'option',
    'options',
  );
});

test('ceilingMs is the ceiling; ceiling, its name before 0.2, is an unknown option that points to ceilingMs, and warns nothing', () => {
  const warnings: Error[] = [];
  const onWarning = (w: Error) => warnings.push(w);
  process.on('warning', onWarning);
  try {
    refuses(() => defineTask({ type: 'legacy', ceiling: 1234, handler } as never), 'ceiling', 'ceilingMs');
    assert.throws(
      () => defineTask({ type: 'legacy', ceiling: 1234, handler } as never),
      /^BerthInputError: task "legacy": unknown option "ceiling"; did you mean "ceilingMs"\? \(expected /,
    );
    refuses(() => defineTask({ type: 'both', ceiling: 1, ceilingMs: 1, handler } as never), 'ceiling', 'ceilingMs');
    assert.equal(defineTask({ type: 'new', ceilingMs: 99, handler }).ceilingMs, 99);
    assert.throws(() => defineTask({ type: 'none', handler } as never), /task "none": ceilingMs must be a number/);
  } finally {
    process.off('warning', onWarning);
  }
  assert.deepEqual(warnings, [], 'no DeprecationWarning: the alias is gone, not deprecated');
});

test('prefetch defaults to 25 per slot, at least 2,000 (the cap the ~25 ms rate target may lease ahead); 0 and explicit values stand', async () => {
  const { resolveWorkerOptions } = await import('../src/process/worker-options.js');
  const resolved = (o: Record<string, unknown>) =>
    resolveWorkerOptions({ connectionString: 'postgres://x@127.0.0.1/db', tasks: [], ...o }).prefetch;
  assert.equal(resolved({}), 2000);
  assert.equal(resolved({ slots: 10 }), 2000);
  assert.equal(resolved({ slots: 200 }), 5000);
  assert.equal(resolved({ slots: 10, prefetch: 0 }), 0);
  assert.equal(resolved({ slots: 10, prefetch: 40 }), 40);
});
