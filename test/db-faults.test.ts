import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueue, enqueueMany, Worker } from '../src/index.js';
import { promoteDueLane } from '../src/maintenance/promote.js';
import { pruneSegment } from '../src/maintenance-api.js';
import { createPool, isConnectionError, resolveDatabase } from '../src/db/connections.js';
import { ReadyThenFatalProxy } from './support/tcp-proxy.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, holdLaneLock, outcomes, testLogger, waitFor } from './helpers.js';

/**
 * Issue 8, item 1: no database fault may crash a berth process. A backend is terminated while
 * each kind of holder has a client: a promotion waiter, a prune, and a whole worker (claims,
 * settlements, LISTEN, heartbeat, the leader's session, the dashboard). Only this file's own
 * sessions are terminated (found by an application_name carrying this process's pid), never
 * another test's. A server restart is exercised by test/chaos.test.ts on a cluster of its own.
 */
const { schema, pool } = await freshSchema('dbfaults');
const tag = `dbfaults-${process.pid}`;

// An 'error' event nobody listens to becomes an uncaught exception: record any, and fail on it.
const uncaught: unknown[] = [];
const onUncaught = (err: unknown) => uncaught.push(err);
process.on('uncaughtException', onUncaught);
after(() => {
  process.off('uncaughtException', onUncaught);
});

/** A pool whose sessions this file may terminate. */
function taggedPool(name: string): pg.Pool {
  const p = new pg.Pool({ connectionString: DATABASE_URL, max: 4, application_name: `${tag} ${name}` });
  p.on('error', () => undefined);
  return p;
}

async function terminate(where: string, params: unknown[]): Promise<number> {
  const r = await pool.query<{ n: string }>(
    `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND ${where}`,
    params,
  );
  return Number(r.rows[0]!.n);
}

/**
 * Wait until `call` (running on the tagged pool `name`) really sits on a lock, cut its backend,
 * and require the call to fail rather than the process to crash.
 */
async function cutWhileBlocked(call: Promise<unknown>, name: string): Promise<void> {
  call.catch(() => undefined);
  await waitFor(
    async () => (await terminate(`application_name = $1 AND wait_event_type = 'Lock'`, [`${tag} ${name}`])) > 0,
    60_000,
    `the ${name} blocked on a lock`,
  );
  await assert.rejects(call);
}

test('a promotion waiter whose backend is terminated fails its call; the process does not crash', async () => {
  const p = taggedPool('waiter');
  try {
    const lane = { queue: 'faults_waiter', priority: 0, shard: 3 };
    await enqueue(pool, 't', {}, { schema, queue: lane.queue, shard: lane.shard });
    const laneId = (
      await pool.query<{ lane_id: number }>(`SELECT lane_id FROM "${schema}".lanes WHERE queue = $1`, [lane.queue])
    ).rows[0]!.lane_id;
    await enqueue(pool, 't', {}, { schema, queue: lane.queue, shard: lane.shard, delay: 1 });
    const release = await holdLaneLock(schema, laneId);
    try {
      await cutWhileBlocked(promoteDueLane(p, schema, lane, 10, 60_000), 'waiter');
    } finally {
      await release();
    }
    // The pool replaced the broken client and still works.
    assert.equal((await p.query<{ one: number }>('SELECT 1 AS one')).rows[0]!.one, 1);
    assert.deepEqual(uncaught, []);
  } finally {
    await p.end();
  }
});

test('a prune whose backend is terminated while it waits for the ring segment lock fails its call; the process does not crash', async () => {
  const p = taggedPool('prune');
  const holder = new pg.Client({ connectionString: DATABASE_URL });
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query(`LOCK TABLE "${schema}".ready_5 IN ACCESS SHARE MODE`);
    await cutWhileBlocked(pruneSegment(p, schema, 5, 60_000), 'prune');
    await holder.query('ROLLBACK');
    assert.equal((await pruneSegment(p, schema, 5, 5_000)).result, 'skipped');
    assert.deepEqual(uncaught, []);
  } finally {
    await holder.end();
    await p.end();
  }
});

test('a pooled session terminated in the packet that says it is ready fails its connect as a connection fault; the process does not crash', async () => {
  const server = new URL(DATABASE_URL);
  const proxy = new ReadyThenFatalProxy({ host: server.hostname, port: Number(server.port || 5432) }, async (pid) => {
    await pool.query('SELECT pg_terminate_backend($1)', [pid]);
  });
  await proxy.start();
  // A plain target, and a host list whose connect also checks the session it got.
  const plain = proxy.url(DATABASE_URL);
  const checked = `${plain}${plain.includes('?') ? '&' : '?'}target_session_attrs=read-write`;
  try {
    for (const url of [plain, checked]) {
      const coalesced = createPool(resolveDatabase(url), { max: 2 }, null, 'coalesced');
      try {
        for (let i = 0; i < 3; i++) {
          const err: unknown = await coalesced.query('SELECT 1').then(
            () => null,
            (e: unknown) => e,
          );
          assert.ok(err !== null && isConnectionError(err), `a connection fault, got ${String(err)}`);
        }
      } finally {
        await coalesced.end();
      }
    }
    assert.deepEqual(uncaught, []);
  } finally {
    await proxy.close();
  }
});

test('a worker whose every session is terminated twice, mid-stream, keeps running and completes every task; nothing counts as lost', async () => {
  const done = new Set<string>();
  const def = defineTask({
    type: 'faults_work',
    // Long enough that no lease lapses on a loaded machine (a lapsed lease is legitimately
    // `lost` when its settlement lands after rescue); short enough that a claim whose reply
    // was cut after its commit strands its leases only briefly.
    ceilingMs: 20_000,
    handler: async (_p, ctx) => {
      await new Promise((r) => setTimeout(r, 20));
      done.add(ctx.id);
    },
  });
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 4,
    queues: ['default', 'faults_busy'],
    workerId: tag,
    leaseMarginMs: 1000,
    pollIntervalMs: 200,
    heartbeatIntervalMs: 200,
    listenReconnectBaseMs: 50,
    logger: testLogger,
    maintenance: FAST_MAINTENANCE,
    http: { port: 0, dashboard: true },
  });
  await worker.start();
  const readers = new AbortController();
  try {
    await waitFor(() => worker.isLeader, 60_000, 'leadership');
    // A busy lane keeps a promotion waiter holding a client through the faults.
    await enqueue(pool, def, {}, { schema, queue: 'faults_busy', shard: 1 });
    const busyLane = (
      await pool.query<{ lane_id: number }>(`SELECT lane_id FROM "${schema}".lanes WHERE queue = 'faults_busy'`)
    ).rows[0]!.lane_id;
    const releaseBusy = await holdLaneLock(schema, busyLane);
    await enqueue(pool, def, {}, { schema, queue: 'faults_busy', shard: 1, delay: 1 });
    // The dashboard keeps reading through the faults.
    const dashboard = (async () => {
      while (!readers.signal.aborted) {
        await fetch(new URL('api/lanes', worker.httpUrl!), { signal: readers.signal })
          .then((r) => r.text())
          .catch(() => undefined);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    let enqueued = 2;
    for (let round = 0; round < 2; round++) {
      const before = done.size;
      // One batch, so the stream is still flowing when the sessions are cut.
      await enqueueMany(
        pool,
        Array.from({ length: 300 }, (_, i) => ({ type: def, payload: { i } })),
        { schema },
      );
      enqueued += 300;
      await waitFor(
        () => done.size > before + 20,
        120_000,
        `work in progress in round ${round} (done ${done.size} of ${enqueued})`,
      );
      const n = await terminate(`application_name LIKE $1`, [`%${tag}%`]);
      assert.ok(n >= 3, `terminated ${n} of the worker's sessions`);
    }
    await releaseBusy();
    await waitFor(() => done.size >= enqueued, 120_000, `all ${enqueued} tasks done (got ${done.size})`);
    readers.abort();
    await dashboard;
    assert.equal(await outcomes(worker.metrics, 'faults_work', 'lost'), 0, 'a connection fault is not a lost lease');
    assert.deepEqual(uncaught, []);
  } finally {
    readers.abort();
    await worker.stop();
  }
});
