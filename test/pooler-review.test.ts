/**
 * Review of berth through a transaction-mode pooler (prepared statements off or detected, the
 * session connection apart): the cases test/pgbouncer.test.ts leaves out, each a repro of one
 * doubt.
 * - withoutPreparedStatements: the proxy is still the pool (instanceof, events, counters,
 *   connect in both forms, release), and producers on a plain client inside the caller's
 *   transaction, or on the proxy, leave no prepared statement in the session.
 * - A sessionConnectionString whose server is down: start() resolves, the worker polls and
 *   drains, never leads, and stops.
 * - The LISTEN session on the direct connection is cut: it reconnects there, and wake-ups work.
 * - Detection flips while a completion with dependents is in its transaction: the whole
 *   transaction is rolled back and retried unnamed; no task runs twice, no dependent is lost;
 *   a worker whose LISTEN and election share the pooled connection says so once.
 * - preparedStatements: true behind the pooler while the server forgets its statements: each
 *   failure carries the hint, the worker neither crashes nor loses a task.
 *
 * The server forgets statements on purpose: a `DEALLOCATE ALL` through a one-connection
 * transaction pool runs on the only server session, the one every worker client is using, so
 * the next Bind of a name a client prepared fails with 26000, as behind a pooler that handed it
 * another server session.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  BerthInputError,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  Worker,
  withoutPreparedStatements,
  type WorkerOptions,
} from '../src/index.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor, within } from './helpers.js';
import { freePort } from './support/cluster.js';
import { fileBouncer } from './support/pgbouncer.js';

const { schema, pool: direct } = await freshSchema('poolrev');
const { bouncer, skip, closeAtEnd } = await fileBouncer(DATABASE_URL, {
  txn: { mode: 'transaction', size: 4 },
  txn1: { mode: 'transaction', size: 1 },
});

/** A plain pg client on `alias` of the test's PgBouncer: no berth in it. */
async function rawClient(alias: string): Promise<pg.Client> {
  const c = closeAtEnd(new pg.Client({ connectionString: bouncer!.url(alias) }));
  c.on('error', () => undefined);
  await c.connect();
  return c;
}

const runs = new Map<string, number>();
const ran = (id: string) => runs.set(id, (runs.get(id) ?? 0) + 1);
/** The client a parent's handler wipes the server's prepared statements with (set per test). */
let wiper: pg.Client | null = null;
/** How many completion statements the wiping parent made the server forget. */
let wiped = 0;
const plain = defineTask<{ n: number }>({
  type: 'rev_plain',
  ceilingMs: 30_000,
  handler: async (_p, ctx) => {
    ran(ctx.id);
  },
});
const parent = defineTask<{ wipe: boolean }>({
  type: 'rev_parent',
  ceilingMs: 30_000,
  handler: async (p, ctx) => {
    ran(ctx.id);
    // Just before the handler returns, the completion's names (and only them) are forgotten on
    // the one server session: the completion, in its transaction with the dependents' release,
    // is the next statement to meet it, on the settlement session that prepared it earlier.
    if (!p.wipe) return;
    const named = await wiper!.query<{ name: string }>(
      "SELECT name FROM pg_catalog.pg_prepared_statements WHERE name LIKE 'berth-complete%'",
    );
    wiped += named.rows.length;
    for (const { name } of named.rows) await wiper!.query(`DEALLOCATE "${name.replaceAll('"', '""')}"`);
  },
});
const child = defineTask<{ n: number }>({
  type: 'rev_child',
  ceilingMs: 30_000,
  handler: async (_p, ctx) => {
    ran(ctx.id);
  },
});
const tasks = [plain, parent, child];

/** A worker of this file's tasks and schema, started, with the lines it logs. */
async function started(options: Omit<WorkerOptions, 'schema' | 'tasks' | 'logger'>) {
  const { logger, lines } = captureLogger();
  const worker = new Worker({ schema, tasks, logger, ...options });
  await within(worker.start(), 60_000, 'the worker to start');
  return { worker, lines };
}

async function completed(ids: readonly string[]): Promise<boolean> {
  for (const id of ids) if ((await getTask(direct, schema, id))?.state !== 'completed') return false;
  return true;
}

function logged(lines: Record<string, unknown>[], level: number, pattern: RegExp): Record<string, unknown>[] {
  return lines.filter((l) => l.level === level && pattern.test(String(l.msg)));
}

async function preparedIn(db: pg.ClientBase | pg.Pool): Promise<number> {
  return (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_catalog.pg_prepared_statements')).rows[0]!.n;
}

test('withoutPreparedStatements: still the pool (instanceof, events, counters, connect both ways); nothing prepared', async () => {
  const base = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  base.on('error', () => undefined);
  try {
    const proxy = withoutPreparedStatements(base);
    assert.ok(proxy instanceof pg.Pool, 'instanceof pg.Pool holds through the proxy');
    assert.equal(withoutPreparedStatements(proxy), proxy, 'wrapping twice is the same proxy');
    let connects = 0;
    const onConnect = () => connects++;
    proxy.on('connect', onConnect);
    // Promise form: the checked-out client sends a named statement unnamed.
    const c1 = await proxy.connect();
    await c1.query({ name: 'rev_named', text: 'SELECT 1 AS one' });
    assert.equal(await preparedIn(c1), 0, 'a named query on a checked-out client prepares nothing');
    c1.release();
    assert.equal(proxy.idleCount, 1, 'release() hands the client back to the pool');
    // Callback form, released through the callback's done().
    await new Promise<void>((resolve, reject) => {
      proxy.connect((err, client, done) => {
        if (err || !client) return reject(err ?? new Error('no client'));
        client
          .query({ name: 'rev_named_cb', text: 'SELECT 2 AS two' })
          .then(() => preparedIn(client))
          .then((n) => {
            assert.equal(n, 0, 'the callback form unnamed too');
            done();
            resolve();
          }, reject);
      });
    });
    assert.equal(proxy.totalCount, 1);
    assert.equal(proxy.idleCount, 1, 'done() hands the client back');
    assert.equal(connects, 1, "the listener added through the proxy is the pool's");
    proxy.off('connect', onConnect);
    assert.equal(base.listenerCount('connect'), 0, 'and removed through it');

    // Producers on the proxy: a graph (its own transaction on a checked-out client), a plain
    // enqueue and getTask, on the pool's one connection; nothing is left prepared there.
    const graph = await enqueueMany(
      proxy,
      [
        { type: parent, payload: { wipe: false }, ref: 'p' },
        { type: child, payload: { n: 1 }, dependsOn: [{ ref: 'p' }] },
      ],
      { schema },
    );
    const single = await enqueue(proxy, plain, { n: 1 }, { schema });
    assert.equal((await getTask(proxy, schema, graph[1]!.id!))?.state, 'waiting');
    assert.equal((await getTask(proxy, schema, single.id!))?.state, 'ready');
    assert.equal(await preparedIn(base), 0, 'the proxy pool prepared nothing');
  } finally {
    await base.end();
  }

  // The per-call option on a plain client, inside the caller's transaction.
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  try {
    await client.query('BEGIN');
    const one = await enqueue(client, plain, { n: 2 }, { schema, preparedStatements: false });
    const many = await enqueueMany(
      client,
      [
        { type: parent, payload: { wipe: false }, ref: 'p' },
        { type: child, payload: { n: 2 }, dependsOn: [{ ref: 'p' }] },
      ],
      { schema, preparedStatements: false },
    );
    assert.equal((await getTask(client, schema, one.id!, { preparedStatements: false }))?.state, 'ready');
    assert.equal((await getTask(client, schema, many[1]!.id!, { preparedStatements: false }))?.state, 'waiting');
    assert.equal(await preparedIn(client), 0, 'nothing prepared in the transaction');
    await client.query('ROLLBACK');
    assert.equal(await getTask(direct, schema, one.id!), null, "rolled back with the caller's transaction");
    // Named by default, on the same client: the option was per call.
    await enqueue(client, plain, { n: 3 }, { schema });
    assert.ok((await preparedIn(client)) > 0, 'the default still prepares');
  } finally {
    await client.end();
  }

  // Values other than booleans are refused, whatever the door.
  await assert.rejects(
    enqueueMany(direct, [{ type: plain, payload: { n: 0 } }], { schema, preparedStatements: 'no' as never }),
    (e: unknown) => e instanceof BerthInputError && /preparedStatements/.test(e.message),
  );
  await assert.rejects(
    getTask(direct, schema, '1', null as never),
    (e: unknown) => e instanceof BerthInputError && /getTask options/.test(e.message),
  );
});

test('sessionConnectionString at a server that is down: start resolves, the worker polls and drains, never leads', async () => {
  const port = await freePort();
  // start() resolves with the session server down.
  const { worker, lines } = await started({
    connectionString: DATABASE_URL,
    sessionConnectionString: `postgres://postgres@127.0.0.1:${port}/nowhere`,
    pollIntervalMs: 200,
    maintenance: FAST_MAINTENANCE,
  });
  try {
    const r = await enqueueMany(
      direct,
      Array.from({ length: 10 }, (_, n) => ({ type: plain, payload: { n } })),
      { schema },
    );
    await waitFor(() => completed(r.map((x) => x.id!)), 30_000, 'the worker to drain by polling');
    assert.equal(worker.isLeader, false, 'no leader without its election session');
    assert.equal(await worker.listenerBackendPid(), null, 'no LISTEN session');
    assert.ok(logged(lines, 40, /wake LISTEN connect failed/).length >= 1, 'the LISTEN failure is logged');
    await waitFor(
      () => logged(lines, 40, /election session could not connect/).length >= 1,
      30_000,
      'the election failure to be logged',
    );
  } finally {
    await within(worker.stop(), 60_000, 'stop() with the session server down');
  }
});

test('transaction mode, LISTEN on the direct session: cut, it reconnects there and wakes the worker', {
  skip,
}, async () => {
  const { worker } = await started({
    connectionString: bouncer!.url('txn'),
    sessionConnectionString: DATABASE_URL,
    preparedStatements: false,
    maintenance: false,
    // Only a wake-up starts a task within the test's deadlines.
    pollIntervalMs: 600_000,
  });
  try {
    const before = await waitFor(() => worker.listenerBackendPid(), 20_000, 'a LISTEN session');
    await direct.query('SELECT pg_terminate_backend($1)', [before]);
    await waitFor(
      async () => {
        const pid = await worker.listenerBackendPid().catch(() => null);
        return pid !== null && pid !== before;
      },
      30_000,
      'LISTEN to reconnect on the direct session',
    );
    const r = await enqueue(direct, plain, { n: 1 }, { schema });
    await waitFor(() => completed([r.id!]), 30_000, 'the task woken by NOTIFY on the new session');
  } finally {
    await worker.stop();
  }
});

test('detection flips inside a completion with dependents: rolled back and retried whole, nothing runs twice', {
  skip,
}, async () => {
  wiper = await rawClient('txn1');
  const { worker, lines } = await started({
    connectionString: bouncer!.url('txn1'),
    // LISTEN and the election on the pooled connection (the default): the worker must say so.
    maintenance: false,
    pollIntervalMs: 200,
  });
  try {
    // Warm-up: the settlement session prepares the completion and the release of dependents.
    const warm = await enqueueMany(
      direct,
      [
        { type: parent, payload: { wipe: false }, ref: 'p' },
        { type: child, payload: { n: 0 }, dependsOn: [{ ref: 'p' }] },
      ],
      { schema },
    );
    await waitFor(() => completed(warm.map((x) => x.id!)), 30_000, 'the warm-up graph');
    assert.equal(logged(lines, 40, /does not keep prepared statements/).length, 0, 'named so far');
    // The parent's handler wipes the names just before its completion is written.
    const graphs = [];
    for (let g = 0; g < 3; g++)
      graphs.push(
        await enqueueMany(
          direct,
          [
            { type: parent, payload: { wipe: g === 0 }, ref: 'p' },
            { type: child, payload: { n: g }, dependsOn: [{ ref: 'p' }] },
            { type: child, payload: { n: g + 10 }, dependsOn: [{ ref: 'p' }] },
          ],
          { schema },
        ),
      );
    const ids = [...warm, ...graphs.flat()].map((x) => x.id!);
    await waitFor(() => completed(ids), 60_000, 'every parent and dependent completed');
    for (const id of ids) assert.equal(runs.get(id), 1, `task ${id} ran once`);
    assert.equal(logged(lines, 40, /does not keep prepared statements/).length, 1, 'detected once');
    assert.equal(
      logged(lines, 50, /LISTEN session and maintenance election run through the same connection/).length,
      1,
      'the shared session connection is named once',
    );
    assert.ok(wiped >= 1, 'the completion was prepared on the server session, and forgotten');
    const detected = logged(lines, 40, /does not keep prepared statements/)[0]!;
    assert.match(String(detected.err), /berth-complete/, "the completion's statement met the flip");
    const retried = logged(lines, 40, /settlement flush failed; retrying/);
    assert.equal(retried.length, 1, 'one failed flush');
    assert.equal(retried[0]!.kind, 'complete');
    assert.equal(logged(lines, 30, /settlement written after the database came back/).length, 1, 'its retry wrote it');
  } finally {
    await worker.stop();
  }
});

test('preparedStatements: true while the server forgets its statements: explained failures, no crash, no loss', {
  skip,
}, async () => {
  const forget = await rawClient('txn1');
  const { worker, lines } = await started({
    connectionString: bouncer!.url('txn1'),
    // The leader (rescue of a settlement given up on) on the direct session.
    sessionConnectionString: DATABASE_URL,
    preparedStatements: true,
    maintenance: FAST_MAINTENANCE,
    pollIntervalMs: 100,
  });
  try {
    const hinted = () =>
      lines.filter((l) => l.level === 40 && /preparedStatements: false/.test(String(l.err ?? ''))).length;
    const r = await enqueueMany(
      direct,
      Array.from({ length: 30 }, (_, n) => ({ type: plain, payload: { n } })),
      { schema },
    );
    const ids = r.map((x) => x.id!);
    // Forget every name while the backlog drains: the next statement of a client that had
    // prepared one fails (a claim's, a discovery's or a settlement's), with the hint. A round can
    // pass without a failure: another client of the worker may prepare the name again on the
    // one server session first (the ring's rotation renames the claims too), and the first
    // client's statement then binds without an error. So forget again until one fails.
    await waitFor(
      async () => {
        if (hinted() > 0) return true;
        await forget.query('DEALLOCATE ALL');
        return false;
      },
      30_000,
      'a failure explained after forgetting',
    );
    await waitFor(() => completed(ids), 90_000, 'every task completed');
    for (const id of ids) assert.ok((runs.get(id) ?? 0) >= 1, `task ${id} ran`);
    assert.equal(logged(lines, 40, /does not keep prepared statements/).length, 0, 'never switched to unnamed');
  } finally {
    await worker.stop();
  }
});
