/**
 * A real read replica: a primary and a streaming standby of the test's own (initdb, then
 * `pg_basebackup -R`, on free ports), with a fleet whose `readConnectionString` names the
 * standby. Discovery is counted by its text in pg_stat_statements on each server, so the
 * primary's count is discovery alone (the heartbeats, the leader and the claims run there too,
 * by design). The shared test server is never touched.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { defineTask, enqueueMany, migrate, Worker } from '../src/index.js';
import { captureLogger, counterValue, waitFor } from './helpers.js';
import { PG_BIN, TestCluster } from './support/cluster.js';

const BINARIES = ['initdb', 'pg_ctl', 'pg_basebackup', 'postgres'];
const missing = BINARIES.filter((b) => !existsSync(join(PG_BIN, b)));
const skip =
  missing.length > 0
    ? `PostgreSQL server binaries missing in ${PG_BIN} (${missing.join(', ')}): set BERTH_PG_BIN to their directory`
    : false;

const schema = 'standby';
const database = 'berth_standby';
/**
 * Long enough that a standby streaming on a busy 2-core machine is never half a poll (the lag
 * discovery allows a replica) behind an idle primary, short enough for the file to stay quick.
 */
const POLL_MS = 2_000;
/** Discovery's text, and only discovery's (the claim and the limited claim read other shapes). */
const DISCOVERY = '%ORDER BY r.priority, r.run_at, r.lane_id, r.lane_seq%';
const FELL_BACK = 'read replica failed; discovery reads the primary until it answers again';
const BACK = 'read replica answers again; discovery reads it';

interface Servers {
  primary: TestCluster;
  standby: TestCluster;
  /** On the primary's berth database. */
  pool: pg.Pool;
  /** On the standby's berth database. */
  replica: pg.Pool;
}

async function setUp(): Promise<Servers> {
  const primary = await TestCluster.create({
    // wal_keep_size: the standby stopped by the last test catches up from the primary's WAL
    // (there is no replication slot to keep it).
    settings: {
      shared_preload_libraries: "'pg_stat_statements'",
      'pg_stat_statements.max': 1000,
      wal_keep_size: "'256MB'",
    },
  });
  let standby: TestCluster | null = null;
  try {
    const admin = new pg.Client({ connectionString: primary.url() });
    await admin.connect();
    await admin.query(`CREATE DATABASE ${database}`);
    await admin.end();
    const pool = new pg.Pool({ connectionString: primary.url(database), max: 4 });
    pool.on('error', () => undefined);
    await pool.query('CREATE EXTENSION pg_stat_statements');
    await migrate({ connectionString: primary.url(database), schema });
    standby = await TestCluster.standbyOf(primary);
    // The standby's sessions die when the test stops it: the pool drops them and reconnects.
    const replica = new pg.Pool({ connectionString: standby.url(database), max: 2 });
    replica.on('error', () => undefined);
    return { primary, standby, pool, replica };
  } catch (err) {
    await standby?.destroy();
    await primary.destroy();
    throw err;
  }
}

const servers = skip ? null : await setUp();
after(async () => {
  if (!servers) return;
  await servers.pool.end();
  await servers.replica.end();
  await servers.standby.destroy();
  await servers.primary.destroy();
});

/** Calls of discovery on one server (its pg_stat_statements, the berth database only). */
async function discoveryCalls(db: pg.Pool): Promise<number> {
  const r = await db.query<{ calls: string }>(
    `SELECT coalesce(sum(calls), 0)::text AS calls FROM pg_stat_statements
      WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE $1`,
    [DISCOVERY],
  );
  return Number(r.rows[0]!.calls);
}

/** Whether the standby has replayed everything the primary has written so far. */
async function standbyCaughtUp(s: Servers): Promise<boolean> {
  const lsn = (await s.pool.query<{ lsn: string }>('SELECT pg_current_wal_insert_lsn()::text AS lsn')).rows[0]!.lsn;
  return waitFor(
    async () =>
      (await s.replica.query<{ ok: boolean }>('SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn AS ok', [lsn])).rows[0]!
        .ok,
    60_000,
    'the standby to replay the primary',
  );
}

/** Every run of the test's task, by payload number: a double run shows as 2. */
const runs = new Map<number, number>();
const echo = defineTask({
  type: 'standby_echo',
  queue: 'standby',
  ceilingMs: 30_000,
  handler: async (payload: { n: number }) => {
    runs.set(payload.n, (runs.get(payload.n) ?? 0) + 1);
  },
});
let next = 0;

/** Enqueue `count` tasks over four lanes (shards `base` to `base + 3`); returns their numbers. */
async function enqueueBatch(s: Servers, count: number, base = 0): Promise<number[]> {
  const ns = Array.from({ length: count }, () => next++);
  await enqueueMany(
    s.pool,
    ns.map((n) => ({ type: echo, payload: { n }, shard: base + (n % 4) })),
    { schema },
  );
  return ns;
}

/** Wait until each of `ns` ran, then require exactly once each. */
async function ranOnce(ns: readonly number[], what: string): Promise<void> {
  await waitFor(() => ns.every((n) => (runs.get(n) ?? 0) >= 1), 60_000, what);
  const twice = ns.filter((n) => runs.get(n) !== 1);
  assert.deepEqual(twice, [], `${what}: tasks run more than once`);
}

interface Member {
  worker: Worker;
  lines: Record<string, unknown>[];
}

/** Two workers reading the standby; the first may lead maintenance. */
async function startFleet(s: Servers): Promise<Member[]> {
  const fleet: Member[] = [];
  for (let i = 0; i < 2; i++) {
    const { logger, lines } = captureLogger();
    const worker = new Worker({
      connectionString: s.primary.url(database),
      readConnectionString: s.standby.url(database),
      schema,
      tasks: [echo],
      logger,
      pollIntervalMs: POLL_MS,
      heartbeatIntervalMs: 1_000,
      ...(i === 0 ? {} : { maintenance: false as const }),
    });
    await worker.start();
    fleet.push({ worker, lines });
  }
  return fleet;
}

async function stopFleet(fleet: readonly Member[]): Promise<void> {
  for (const m of fleet) await m.worker.stop();
}

/** Run `fn` with a fleet started on a caught-up standby that has polled once; the fleet is stopped after. */
async function withFleet(s: Servers, fn: (fleet: Member[]) => Promise<void>): Promise<void> {
  await standbyCaughtUp(s);
  const fleet = await startFleet(s);
  try {
    await pollsPass(fleet, 1, 'warm-up');
    await fn(fleet);
  } finally {
    await stopFleet(fleet);
  }
}

const polls = (m: Member) => counterValue(m.worker.metrics, 'berth_wakeups_total', { reason: 'poll' });
const fallbacks = (m: Member, reason: string) =>
  counterValue(m.worker.metrics, 'berth_discovery_fallbacks_total', { reason });
const onPrimary = (m: Member) => counterValue(m.worker.metrics, 'berth_discovery_on_primary', {});
const count = (m: Member, msg: string) => m.lines.filter((l) => l.msg === msg).length;

/** Wait until every member has polled `n` more times. */
async function pollsPass(fleet: readonly Member[], n: number, what: string): Promise<void> {
  const from = await Promise.all(fleet.map(polls));
  await waitFor(
    async () => (await Promise.all(fleet.map(polls))).every((v, i) => v >= from[i]! + n),
    60_000,
    `${n} polls (${what})`,
  );
}

test('an idle fleet reading a standby puts no discovery on the primary, and its tasks run', { skip }, () =>
  withFleet(servers!, async (fleet) => {
    const s = servers!;
    await s.pool.query('SELECT pg_stat_statements_reset()');
    const onStandby = await discoveryCalls(s.replica);
    // Each poll of each worker discovers on the standby: wait until that has been seen 6 times.
    await waitFor(async () => (await discoveryCalls(s.replica)) >= onStandby + 6, 60_000, 'discoveries on the standby');
    assert.equal(await discoveryCalls(s.pool), 0, 'no discovery on the primary over the idle window');
    for (const m of fleet) {
      assert.equal(await fallbacks(m, 'unavailable'), 0);
      assert.equal(await fallbacks(m, 'lagging'), 0);
      assert.equal(await onPrimary(m), 0);
    }

    const ns = await enqueueBatch(s, 40);
    await ranOnce(ns, 'tasks enqueued with the fleet reading the standby');
  }),
);

test('a standby whose replay is paused delays pickup to the next poll at most: every task runs once, paused or not', {
  skip,
}, async () => {
  const s = servers!;
  // B1 replicated, then replay paused, then B2 in other lanes: the standby shows B1's lanes (soon
  // all claimed: stale candidates) and never B2's. No worker runs while they are enqueued, so no
  // wake notification names their lanes: only discovery finds B2, and on the primary.
  const b1 = await enqueueBatch(s, 20);
  await standbyCaughtUp(s);
  await s.replica.query('SELECT pg_wal_replay_pause()');
  await waitFor(
    async () =>
      (await s.replica.query<{ state: string }>('SELECT pg_get_wal_replay_pause_state() AS state')).rows[0]!.state ===
      'paused',
    30_000,
    'replay paused',
  );
  const b2 = await enqueueBatch(s, 20, 4);
  const fleet = await startFleet(s);
  try {
    await ranOnce([...b1, ...b2], 'tasks enqueued before and after replay paused');
    // Enqueued with the fleet running: their wakes name their lanes, and the claim is on the primary.
    const b3 = await enqueueBatch(s, 20, 8);
    await ranOnce(b3, 'tasks enqueued while replay is paused');
    const paused = (await s.replica.query<{ state: string }>('SELECT pg_get_wal_replay_pause_state() AS state'))
      .rows[0]!.state;
    assert.equal(paused, 'paused', 'all of it ran while the standby stayed behind');
    const lagging = (await Promise.all(fleet.map((m) => fallbacks(m, 'lagging')))).reduce((a, b) => a + b, 0);
    assert.ok(lagging > 0, 'discovery read the primary while the standby was behind');

    await s.replica.query('SELECT pg_wal_replay_resume()');
    await standbyCaughtUp(s);
    const b4 = await enqueueBatch(s, 20);
    await ranOnce(b4, 'tasks enqueued after replay resumed');
    // Stale candidates and the resumed replay's old lanes get no task a second run.
    await pollsPass(fleet, 2, 'after the resume');
    await ranOnce([...b1, ...b2, ...b3, ...b4], 'every task of this test');
    for (const m of fleet) assert.equal(await fallbacks(m, 'unavailable'), 0);
  } finally {
    await s.replica.query('SELECT pg_wal_replay_resume()').catch(() => undefined);
    await stopFleet(fleet);
  }
});

test(
  'a standby that goes away: discovery falls back to the primary, logged once and on the gauge, and returns when it is back',
  {
    skip,
  },
  () =>
    withFleet(servers!, async (fleet) => {
      const s = servers!;
      await s.standby.stop('fast');
      await s.pool.query('SELECT pg_stat_statements_reset()');
      await waitFor(
        async () => (await Promise.all(fleet.map(onPrimary))).every((v) => v === 1),
        60_000,
        'every worker on the primary',
      );
      const ns = await enqueueBatch(s, 40);
      await ranOnce(ns, 'tasks enqueued with the standby down');
      // Several polls (each a discovery, on the primary now, and a due retry of the standby).
      await pollsPass(fleet, 3, 'with the standby down');
      assert.ok((await discoveryCalls(s.pool)) > 0, 'discovery ran on the primary');
      for (const m of fleet) {
        assert.equal(count(m, FELL_BACK), 1, 'the fallback is logged once, not once per poll');
        const line = m.lines.find((l) => l.msg === FELL_BACK)!;
        assert.equal(line.level, 40);
        assert.equal(line.replica, `127.0.0.1:${s.standby.port}, database "${database}"`);
        assert.ok((await fallbacks(m, 'unavailable')) >= 3);
        assert.equal(count(m, BACK), 0);
      }

      await s.standby.start();
      await waitFor(
        async () => (await Promise.all(fleet.map(onPrimary))).every((v) => v === 0),
        60_000,
        'every worker back on the standby',
      );
      // It replays what it missed first: until then a discovery may read the primary (lagging).
      await standbyCaughtUp(s);
      const onStandby = await discoveryCalls(s.replica);
      await waitFor(
        async () => (await discoveryCalls(s.replica)) >= onStandby + 4,
        60_000,
        'discoveries on the standby again',
      );
      const primaryCalls = await discoveryCalls(s.pool);
      await pollsPass(fleet, 2, 'with the standby back');
      assert.equal(await discoveryCalls(s.pool), primaryCalls, 'no discovery on the primary once the standby is back');
      for (const m of fleet) {
        assert.equal(count(m, FELL_BACK), 1);
        assert.equal(count(m, BACK), 1, 'the return is logged once');
      }
      const more = await enqueueBatch(s, 20);
      await ranOnce(more, 'tasks enqueued with the standby back');
    }),
);
