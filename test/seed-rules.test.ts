/** Smaller seed rules, each pinned on its own (docs/seed-coverage.md cites them by name). */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueue, enqueueMany, getTask, Worker, BerthMetrics } from '../src/index.js';
import { promoteDueLanes, rescueLapsedLeases } from '../src/maintenance-api.js';
import { claim } from '../src/processor/claim.js';
import { Promoter } from '../src/maintenance/promoter.js';
import { claimParams } from './claim-params.js';
import {
  captureLogger,
  counterValue,
  DATABASE_URL,
  expectOutcome,
  freshSchema,
  waitFor,
  holdLaneLock,
  leaseLapsed,
  scaled,
} from './helpers.js';

const { schema, pool } = await freshSchema('rules');
const S = `"${schema}"`;
const { logger } = captureLogger();

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
}
async function laneOf(queue: string, shard = 0): Promise<number> {
  return (await pool.query(`SELECT ${S}.provision_lane($1, 0::smallint, $2::smallint) AS id`, [queue, shard])).rows[0]
    .id;
}
const holdLane = (lane: number) => holdLaneLock(schema, lane);

test('the default lease margin is 30 s: lease = ceiling + 30 s, deadline = lease - 30 s', async () => {
  await reset();
  let seen: { deadline: number; expires: number } | null = null;
  const def = defineTask({
    type: 'r_margin',
    ceilingMs: 10_000,
    handler: async (_p, ctx) => {
      const r = await pool.query(
        `SELECT (extract(epoch FROM expires_at) * 1000)::float8 AS e, extract(epoch FROM expires_at - claimed_at)::float8 AS s FROM ${S}.leased_entries WHERE id = $1`,
        [ctx.id],
      );
      seen = { deadline: ctx.deadline.getTime(), expires: r.rows[0].e };
      assert.equal(r.rows[0].s, 40);
    },
  });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    logger,
    maintenance: false,
    pollIntervalMs: 100,
  });
  await w.start();
  try {
    await enqueue(pool, def, {}, { schema });
    await waitFor(() => seen !== null, 10_000, 'handler');
    assert.ok(
      Math.abs(seen!.expires - seen!.deadline - 30_000) <= 1,
      `deadline is expiry - 30 s (${seen!.expires - seen!.deadline})`,
    );
  } finally {
    await w.stop();
  }
});

test('a failing task drops to the tail instead of blocking the work behind it', async () => {
  await reset();
  const order: string[] = [];
  const def = defineTask<{ tag: string }>({
    type: 'r_tail',
    ceilingMs: 5000,
    backoff: { baseMs: 300, maxMs: 300 },
    handler: async (p, ctx) => {
      order.push(`${p.tag}#${ctx.attempt}`);
      if (p.tag === 'a' && ctx.attempt === 1) throw new Error('first attempt fails');
    },
  });
  const c = await pool.connect();
  await c.query('BEGIN');
  for (const tag of ['a', 'b', 'c']) await enqueue(c, def, { tag }, { schema, shard: 1 });
  await c.query('COMMIT');
  c.release();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 1,
    prefetch: 0,
    logger,
    pollIntervalMs: 50,
    maintenance: { promoteIntervalMs: 50, leaderPollMs: 50 },
  });
  await w.start();
  try {
    await waitFor(() => order.length === 4, 10_000, 'all ran');
    assert.deepEqual(order, ['a#1', 'b#1', 'c#1', 'a#2']);
  } finally {
    await w.stop();
  }
});

test('a promotion batch takes the oldest due rows first, across lanes', async () => {
  await reset();
  const base = Date.now() + 3600_000;
  await enqueueMany(
    pool,
    [
      { type: 'x', payload: { n: 3 }, queue: 'q1', runAt: new Date(base + 3000) },
      { type: 'x', payload: { n: 1 }, queue: 'q2', runAt: new Date(base + 1000) },
      { type: 'x', payload: { n: 2 }, queue: 'q1', runAt: new Date(base + 2000) },
      { type: 'x', payload: { n: 4 }, queue: 'q2', runAt: new Date(base + 4000) },
    ],
    { schema },
  );
  await pool.query(`UPDATE ${S}.deferred SET run_at = run_at - interval '2 hours'`);
  const r = await promoteDueLanes(pool, schema, null, 2, null);
  assert.equal(r.promoted, 2);
  const promoted = await pool.query(`SELECT (payload->>'n')::int AS n FROM ${S}.ready ORDER BY 1`);
  assert.deepEqual(
    promoted.rows.map((x) => x.n),
    [1, 2],
  );
});

test('rescue never takes the lane lock: a lapsed lease is rescued while its own lane is held', async () => {
  await reset();
  const lane = await laneOf('held', 2);
  const [t] = await enqueueMany(pool, [{ type: 'x', payload: {}, queue: 'held', shard: 2 }], { schema });
  const [leased] = await claim(pool, claimParams(schema, [lane], 1, { defaultCeilingMs: 1, workerId: 'rules' }));
  const release = await holdLane(lane);
  try {
    await leaseLapsed(pool, leased!.leaseExpiresAt);
    const c = new pg.Client({ connectionString: DATABASE_URL });
    await c.connect();
    await c.query("SET lock_timeout = '1s'");
    assert.deepEqual(await rescueLapsedLeases(c, schema), { retried: 1, dead: 0, held: 0 });
    await c.end();
    assert.equal((await getTask(pool, schema, t!.id!))?.state, 'retryable');
  } finally {
    await release();
  }
});

test('promoter: a lane with a waiter is skipped by later ticks; past the waiter limit it is counted waiter_limit; a waiter that runs out of time is counted waiter_timed_out', async () => {
  await reset();
  const a = await laneOf('wa');
  const b = await laneOf('wb');
  await enqueueMany(
    pool,
    [
      { type: 'x', payload: {}, queue: 'wa', shard: 0, delay: 1 },
      { type: 'x', payload: {}, queue: 'wb', shard: 0, delay: 1 },
    ],
    { schema },
  );
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 s'`);
  const releaseA = await holdLane(a);
  const releaseB = await holdLane(b);
  const metrics = new BerthMetrics();
  // The waiter must still be waiting when the second tick runs, however slow the machine: a
  // waiter timeout far beyond two ticks here, a short one below for the timed-out count.
  const p = new Promoter(
    pool,
    storageFor(schema),
    { batchSize: 100, laneLockTimeoutMs: 50, waiterLockTimeoutMs: scaled(60_000), poolSize: 8 },
    metrics,
    logger,
  );
  const short = new BerthMetrics();
  const q = new Promoter(
    pool,
    storageFor(schema),
    { batchSize: 100, laneLockTimeoutMs: 50, waiterLockTimeoutMs: 400, poolSize: 8 },
    short,
    logger,
  );
  try {
    await p.tick();
    assert.equal(
      await counterValue(metrics, 'berth_promote_lane_contention_total', { outcome: 'handed_off', state: 'scheduled' }),
      1,
    );
    assert.equal(
      await counterValue(metrics, 'berth_promote_lane_contention_total', {
        outcome: 'waiter_limit',
        state: 'scheduled',
      }),
      1,
      'pool of 8 allows one waiter',
    );
    assert.equal(p.waitingLanes.length, 1);
    const waiting = p.waitingLanes[0]!.queue;
    await p.tick();
    assert.equal(
      await counterValue(metrics, 'berth_promote_lane_contention_total', { outcome: 'handed_off', queue: waiting }),
      1,
      'the waiting lane is skipped by the next tick',
    );
    assert.equal(
      await counterValue(metrics, 'berth_promote_lane_contention_total', { outcome: 'waiter_limit' }),
      2,
      'the other lane is retried each tick',
    );
    await p.stop();
    // A waiter that runs out of time (400 ms) is counted as such.
    // One lane goes to the (only) waiter; on a slow machine it may time out before tick() returns.
    await q.tick();
    await waitFor(
      async () =>
        (await counterValue(short, 'berth_promote_lane_contention_total', { outcome: 'waiter_timed_out' })) === 1,
      5000,
      'waiter timeout',
    );
    assert.ok((await counterValue(metrics, 'berth_promote_batches_total', {})) >= 2, 'tick batches are counted');
    assert.ok(
      (await counterValue(short, 'berth_promote_batches_total', {})) >= 2,
      'tick and waiter batches are counted',
    );
    assert.equal(
      (await pool.query(`SELECT count(*) FROM ${S}.deferred`)).rows[0].count,
      '2',
      'nothing promoted while both lanes are held',
    );
  } finally {
    await p.stop();
    await q.stop();
    await releaseA();
    await releaseB();
  }
  assert.equal((await promoteDueLanes(pool, schema, null, 100, 50)).promoted, 2);
});

test('shutdown settles a handler that returns as the drain ends; it never runs again', async () => {
  await reset();
  let runs = 0;
  const def = defineTask({
    type: 'r_drain',
    ceilingMs: 60_000,
    handler: async () => {
      runs++;
      // Finishes its work despite the abort, a moment into the drain.
      await new Promise((r) => setTimeout(r, 300));
    },
  });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    logger,
    maintenance: false,
    pollIntervalMs: 100,
    stopTimeoutMs: 5000,
  });
  await w.start();
  const r = await enqueue(pool, def, {}, { schema });
  await waitFor(() => runs === 1, 10_000, 'started');
  await w.stop();
  await expectOutcome(w.metrics, 'r_drain', 'success', 1);
  assert.equal((await getTask(pool, schema, r.id!))?.state, 'completed', 'settled before the pools closed');
  const again = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    logger,
    maintenance: false,
    pollIntervalMs: 50,
  });
  await again.start();
  // Long enough for the second worker to have looked: a few of its polls, however slow the machine.
  await waitFor(
    async () => (await counterValue(again.metrics, 'berth_wakeups_total', { reason: 'poll' })) >= 3,
    10_000,
    'the second worker polling',
  );
  await again.stop();
  assert.equal(runs, 1);
});

test('provision_lane rejects a null argument or a shard outside 0-63, and accepts any queue name and smallint priority', async () => {
  await assert.rejects(pool.query(`SELECT ${S}.provision_lane(NULL, 0::smallint, 0::smallint)`), /must not be null/);
  await assert.rejects(pool.query(`SELECT ${S}.provision_lane('q', NULL, 0::smallint)`), /must not be null/);
  await assert.rejects(pool.query(`SELECT ${S}.provision_lane('q', 0::smallint, 64::smallint)`), /outside 0-63/);
  await assert.rejects(pool.query(`SELECT ${S}.provision_lane('q', 0::smallint, (-1)::smallint)`), /outside 0-63/);
  const empty = await pool.query(`SELECT ${S}.provision_lane('', (-32768)::smallint, 63::smallint) AS id`);
  const again = await pool.query(`SELECT ${S}.provision_lane('', (-32768)::smallint, 63::smallint) AS id`);
  assert.equal(empty.rows[0].id, again.rows[0].id, 'idempotent');
  const odd = await pool.query(`SELECT ${S}.provision_lane('ünïcode "q"; drop', 32767::smallint, 0::smallint) AS id`);
  assert.ok(odd.rows[0].id > 0);
  const r = await enqueue(pool, 'x', {}, { schema, queue: '', priority: -32768 });
  assert.equal((await getTask(pool, schema, r.id!))?.queue, '');
});

test('promotion is never backed off: an overrunning promotion body runs again at once, and overruns are counted', async () => {
  await reset();
  // Every promotion transaction now takes 150 ms, three times the 50 ms interval.
  await pool.query(
    `CREATE FUNCTION ${S}.slow_promotion() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.15); RETURN NULL; END $$`,
  );
  await pool.query(
    `CREATE TRIGGER slow_promotion AFTER DELETE ON ${S}.deferred FOR EACH STATEMENT EXECUTE FUNCTION ${S}.slow_promotion()`,
  );
  try {
    const w = new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [],
      queues: ['none'],
      logger,
      maintenance: {
        leaderPollMs: 50,
        promoteIntervalMs: 50,
        rescueIntervalMs: 60_000,
        ringIntervalMs: 60_000,
        gaugeIntervalMs: 60_000,
      },
    });
    await w.start();
    try {
      for (let i = 0; i < 5; i++) {
        await enqueueMany(pool, [{ type: 'x', payload: { i }, queue: `q${i}`, delay: 1 }], { schema });
      }
      await waitFor(
        async () => (await pool.query(`SELECT count(*) FROM ${S}.deferred`)).rows[0].count === '0',
        20_000,
        'all promoted',
      );
      await waitFor(() => (w.maintenanceStats().promote?.overruns ?? 0) >= 1, 10_000, 'an overrun');
      const st = w.maintenanceStats().promote!;
      assert.ok(st.maxMs > 50, `a tick overran (${st.maxMs} ms)`);
      assert.ok((await counterValue(w.metrics, 'berth_maintenance_overruns_total', { branch: 'promote' })) >= 1);
      const runs = st.runs;
      await enqueueMany(pool, [{ type: 'x', payload: {}, queue: 'late', delay: 1 }], { schema });
      await waitFor(
        async () => (await pool.query(`SELECT count(*) FROM ${S}.deferred`)).rows[0].count === '0',
        5_000,
        'promoted right after an overrun',
      );
      // The branch's statistics are updated just after its run returns, a moment after the
      // promotion committed: wait for them rather than read them at once.
      await waitFor(() => w.maintenanceStats().promote!.runs > runs, 10_000, 'the promotion run counted');
    } finally {
      await w.stop();
    }
  } finally {
    await pool.query(`DROP TRIGGER slow_promotion ON ${S}.deferred`);
  }
});

test("seed 000's numbers are the defaults: 4 slots, 30 s margin, 5 s poll, 20 attempts, 15 s doubling to 10 min, 2 min slices, hourly 7-day retention, 30 s statement timeout", async () => {
  const { WORKER_DEFAULTS, DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF, DEFAULT_SLICE_MS, MAINTENANCE_DEFAULTS } =
    await import('../src/index.js');
  assert.deepEqual(
    {
      slots: WORKER_DEFAULTS.slots,
      margin: WORKER_DEFAULTS.leaseMarginMs,
      poll: WORKER_DEFAULTS.pollIntervalMs,
      statement: WORKER_DEFAULTS.statementTimeoutMs,
    },
    { slots: 4, margin: 30_000, poll: 5000, statement: 30_000 },
  );
  assert.equal(DEFAULT_MAX_ATTEMPTS, 20);
  assert.deepEqual(DEFAULT_BACKOFF, { baseMs: 15_000, maxMs: 600_000 });
  assert.equal(DEFAULT_SLICE_MS, 120_000);
  assert.equal(MAINTENANCE_DEFAULTS.retentionIntervalMs, 3600_000);
  assert.equal(MAINTENANCE_DEFAULTS.deadRetentionMs, 7 * 24 * 3600_000);
  assert.equal(MAINTENANCE_DEFAULTS.laneLockTimeoutMs, 50);
  assert.equal(MAINTENANCE_DEFAULTS.waiterLockTimeoutMs, 30_000);
});

test("a task enqueued by name takes its attempt limit from the claiming worker's definition, else 20", async () => {
  await reset();
  const lane = await laneOf('limits', 0);
  await enqueueMany(
    pool,
    [
      { type: 'defined', payload: {}, queue: 'limits', shard: 0 },
      { type: 'undefined_type', payload: {}, queue: 'limits', shard: 0 },
      { type: 'defined', payload: {}, queue: 'limits', shard: 0, maxAttempts: 2 },
    ],
    { schema },
  );
  const got = await claim(
    pool,
    claimParams(schema, [lane], 3, { maxAttempts: new Map([['defined', 7]]), workerId: 'rules' }),
  );
  assert.deepEqual(
    got.map((t) => [t.type, t.maxAttempts]),
    [
      ['defined', 7],
      ['undefined_type', 20],
      ['defined', 2],
    ],
  );
});

test('a handler that ignores its AbortSignal: stop() gives up after stopTimeoutMs, logs it at error, and its lease is left to lapse', async () => {
  await reset();
  const { logger: l, lines } = captureLogger();
  let started = 0;
  const def = defineTask({
    type: 'r_ignores',
    ceilingMs: 60_000,
    handler: () => new Promise<void>(() => void started++),
  });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    logger: l,
    maintenance: false,
    pollIntervalMs: 50,
    stopTimeoutMs: 200,
  });
  await w.start();
  const r = await enqueue(pool, def, {}, { schema });
  await waitFor(() => started === 1, 10_000, 'started');
  await w.stop();
  const line = lines.find((x) => String(x.msg).startsWith('handlers ignored their AbortSignal'));
  assert.ok(line, 'logged');
  assert.equal(line!.level, 50);
  assert.deepEqual(line!.still_running, [r.id]);
  assert.equal(
    (await getTask(pool, schema, r.id!))?.state,
    'running',
    'still leased: only expiry (and rescue) frees it',
  );
});

test('discovery runs on the read pool; an idle poll issues no claim on the primary', async () => {
  await reset();
  const readUrl = new URL(DATABASE_URL);
  readUrl.searchParams.set('application_name', `berth_read_${process.pid}`);
  const writeUrl = new URL(DATABASE_URL);
  writeUrl.searchParams.set('application_name', `berth_write_${process.pid}`);
  const w = new Worker({
    connectionString: writeUrl.toString(),
    readConnectionString: readUrl.toString(),
    schema,
    tasks: [],
    queues: ['idle_only'],
    logger,
    maintenance: false,
    pollIntervalMs: 30,
  });
  await w.start();
  try {
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'poll' })) >= 5,
      10_000,
      'polls',
    );
    // pg_stat_activity shows each session's last statement. A discovery on the read pool follows
    // its check that the read target has replayed the primary (here it is the primary: it has),
    // so one sample can land between the two: look until a read session shows discovery, and
    // check every write session at each look.
    const sample = async () => {
      const sessions = await pool.query(
        `SELECT application_name, query FROM pg_stat_activity WHERE application_name IN ($1, $2)`,
        [`berth_read_${process.pid}`, `berth_write_${process.pid}`],
      );
      const write = sessions.rows.filter((r) => r.application_name.startsWith('berth_write'));
      assert.ok(
        write.every((r) => !/WITH locked/.test(r.query) && !/CROSS JOIN LATERAL/.test(r.query)),
        'the primary saw neither discovery nor a claim',
      );
      const read = sessions.rows.filter((r) => r.application_name.startsWith('berth_read'));
      return read.some((r) => /CROSS JOIN LATERAL/.test(r.query));
    };
    await waitFor(sample, 10_000, 'discovery seen on the read pool');
  } finally {
    await w.stop();
  }
});

test('a release that fails is logged at warn, and the lapsed lease still gets the task re-run', async () => {
  await reset();
  // Every release (and only a release) fails from now on in this schema.
  await pool.query(`CREATE FUNCTION ${S}.no_release() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN IF NEW.outcome = 'released' THEN RAISE EXCEPTION 'release refused by test'; END IF; RETURN NEW; END $$`);
  await pool.query(
    `CREATE TRIGGER no_release BEFORE INSERT ON ${S}.range_settlements FOR EACH ROW EXECUTE FUNCTION ${S}.no_release()`,
  );
  try {
    let runs = 0;
    const def = defineTask({
      type: 'r_release_fails',
      queue: 'release_fails',
      ceilingMs: scaled(1000),
      handler: (_p, ctx) =>
        new Promise<void>((res, rej) => {
          runs++;
          if (runs > 1) return res();
          ctx.signal.addEventListener('abort', () => rej(ctx.signal.reason));
        }),
    });
    const { logger: l1, lines } = captureLogger();
    const first = new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [def],
      logger: l1,
      maintenance: false,
      pollIntervalMs: 50,
      leaseMarginMs: 0,
    });
    await first.start();
    const r = await enqueue(pool, def, {}, { schema });
    await waitFor(() => runs === 1, 10_000, 'first run');
    await first.stop();
    const warn = lines.find((x) => x.msg === 'release could not be written; the lease will lapse');
    assert.ok(warn && warn.level === 40 && warn.task_id === r.id);
    const second = new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [def],
      logger,
      pollIntervalMs: 50,
      maintenance: { leaderPollMs: 50, rescueIntervalMs: 100, promoteIntervalMs: 50, ringIntervalMs: 60_000 },
    });
    await second.start();
    try {
      await waitFor(() => runs === 2, 15_000, 'the task to run again after its lease lapsed');
    } finally {
      await second.stop();
    }
  } finally {
    await pool.query(`DROP TRIGGER no_release ON ${S}.range_settlements`);
  }
});

test('a lane whose promotion fails (its sequence is gone) does not starve the other lanes', async () => {
  await reset();
  const bad = await laneOf('broken', 0);
  await laneOf('healthy', 0);
  await enqueueMany(
    pool,
    Array.from({ length: 30 }, (_, i) => ({ type: 'x', payload: { i }, queue: 'broken', shard: 0, delay: 1 })),
    { schema },
  );
  await enqueueMany(pool, [{ type: 'x', payload: {}, queue: 'healthy', shard: 0, delay: 1 }], { schema });
  await pool.query(
    `UPDATE ${S}.deferred SET run_at = now() - interval '1 s' * (CASE WHEN queue = 'broken' THEN 10 ELSE 1 END)`,
  );
  await pool.query(`DROP SEQUENCE ${S}.lane_seq_${bad}`);
  const metrics = new BerthMetrics();
  const p = new Promoter(
    pool,
    storageFor(schema),
    { batchSize: 10, laneLockTimeoutMs: 50, waiterLockTimeoutMs: 1000, poolSize: 8 },
    metrics,
    logger,
  );
  try {
    await p.tick();
    assert.equal(
      (await pool.query(`SELECT count(*) FROM ${S}.ready WHERE queue = 'healthy'`)).rows[0].count,
      '1',
      'the healthy lane is promoted',
    );
    assert.equal(
      (await pool.query(`SELECT count(*) FROM ${S}.deferred WHERE queue = 'broken'`)).rows[0].count,
      '30',
      'the broken lane keeps its rows',
    );
    assert.equal(
      await counterValue(metrics, 'berth_promote_lane_contention_total', { outcome: 'failed', queue: 'broken' }),
      1,
    );
  } finally {
    await p.stop();
  }
});
