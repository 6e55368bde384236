/**
 * Seed 003's coupling benchmark: does one busy lane stall the leader?
 *
 *   npm run bench:coupling        (BENCH_DATABASE_URL, default the local test database)
 *
 * Scenarios: a hot lane kept busy by 16 or 32 producers that each hold its lock (an open
 * enqueue transaction) for a few ms at a time, and a hot lane whose lock is held for 3 s.
 * Meanwhile a 5,000-row due backlog waits in the hot lane's deferred storage, a scheduled task
 * is enqueued on an unrelated queue every 100 ms, and an abandoned lease appears every 250 ms.
 * Reported: leader promotion tick max, unrelated-queue lag p99, rescue start lateness max, and
 * the hot backlog's drain time; berth as shipped vs. berth with the lane lock timeout (and so
 * the hand-off) disabled, which is the behaviour seed 003 fixed. Two rounds, alternating order.
 */
import { writeFileSync, mkdirSync } from 'node:fs';
import pg from 'pg';
import { pino } from 'pino';
import { defineTask, enqueue, enqueueMany, migrate, Worker } from '../src/index.js';
import { claim } from '../src/processor/claim.js';
import { claimParams } from '../test/claim-params.js';
import { schemaLockKey } from '../src/storage/locks.js';

const url = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'berth_coupling';
const S = `"${schema}"`;
const BACKLOG = Number(process.env.COUPLING_BACKLOG ?? 5000);
const MAX_WINDOW_MS = 40_000;

interface Scenario {
  name: string;
  producers: number;
  holdMs: number;
}
const SCENARIOS: Scenario[] = [
  { name: '16 producers', producers: 16, holdMs: 0 },
  { name: '32 producers', producers: 32, holdMs: 0 },
  { name: 'held 3 s', producers: 0, holdMs: 3000 },
];
const MODES = [
  { name: 'berth (lane timeout + waiter)', laneLockTimeoutMs: 50 as number | null },
  { name: 'berth (no lane timeout)', laneLockTimeoutMs: null },
];

interface Result {
  tickMaxMs: number;
  coldLagP99Ms: number;
  rescueLatenessMaxMs: number;
  hotDrainMs: number | null;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function run(scenario: Scenario, laneLockTimeoutMs: number | null): Promise<Result> {
  const admin = new pg.Pool({ connectionString: url, max: 4 });
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
  await migrate({ connectionString: url, schema });
  const hotLane = (await admin.query(`SELECT ${S}.provision_lane('hot', 0::smallint, 0::smallint) AS id`)).rows[0]
    .id as number;
  await enqueueMany(
    admin,
    Array.from({ length: BACKLOG }, (_, i) => ({
      type: 'hot',
      payload: { i },
      queue: 'hot',
      shard: 0,
      delay: 3600_000,
    })),
    { schema },
  );
  await admin.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 s'`);

  let hotDone = 0;
  const coldLag: number[] = [];
  const cold = defineTask<{ dueAt: number }>({
    type: 'cold',
    ceilingMs: 60_000,
    handler: async (p) => void coldLag.push(Date.now() - p.dueAt),
  });
  const hot = defineTask({ type: 'hot', ceilingMs: 60_000, handler: async () => void hotDone++ });
  const produced = defineTask({ type: 'produced', ceilingMs: 60_000, handler: async () => {} });
  const worker = new Worker({
    connectionString: url,
    schema,
    tasks: [cold, hot, produced],
    slots: 8,
    queues: ['hot', 'cold'],
    logger: pino({ level: 'silent' }),
    maintenance: { laneLockTimeoutMs, rescueIntervalMs: 250, ringIntervalMs: 600_000, leaderPollMs: 100 },
  });
  let stop = false;
  // The 3 s hold starts before the worker, so the backlog meets a lane that is already held.
  let holding: () => void = () => {};
  const held = new Promise<void>((r) => (holding = r));
  const holder = scenario.holdMs
    ? (async () => {
        const c = new pg.Client({ connectionString: url });
        await c.connect();
        await c.query('BEGIN');
        await c.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), hotLane]);
        holding();
        await sleep(scenario.holdMs);
        await c.query('COMMIT');
        await c.end();
      })()
    : Promise.resolve();
  if (!scenario.holdMs) holding();
  await held;
  const started = Date.now();
  await worker.start();

  const producers = Array.from({ length: scenario.producers }, async () => {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    while (!stop) {
      await c.query('BEGIN');
      await enqueue(c, 'produced', {}, { schema, queue: 'hot', shard: 0 });
      await sleep(2 + Math.random() * 6);
      await c.query('COMMIT');
    }
    await c.end();
  });
  const coldProbe = (async () => {
    while (!stop) {
      await enqueue(admin, 'cold', { dueAt: Date.now() + 50 }, { schema, queue: 'cold', delay: 50 });
      await sleep(100);
    }
  })();
  const orphanProbe = (async () => {
    const orphanLane = (await admin.query(`SELECT ${S}.provision_lane('orphans', 0::smallint, 0::smallint) AS id`))
      .rows[0].id as number;
    while (!stop) {
      const c = await admin.connect();
      await c.query('BEGIN');
      await enqueue(c, 'orphan', {}, { schema, queue: 'orphans', shard: 0 });
      await claim(
        c,
        claimParams(schema, [orphanLane], 1, {
          ceilings: new Map([['orphan', 100]]),
          defaultCeilingMs: 100,
          workerId: 'abandoned',
        }),
      );
      await c.query('COMMIT');
      c.release();
      await sleep(250);
    }
  })();

  let hotDrainMs: number | null = null;
  while (Date.now() - started < MAX_WINDOW_MS) {
    if (hotDone >= BACKLOG) {
      hotDrainMs = Date.now() - started;
      break;
    }
    await sleep(20);
  }
  // Keep the pressure on for at least 6 s so the probes see the contended period.
  while (Date.now() - started < 6000) await sleep(50);
  stop = true;
  await Promise.all([...producers, holder, coldProbe, orphanProbe]);
  await sleep(600);
  const tickMaxMs = worker.maintenanceStats().promote?.maxMs ?? NaN;
  await worker.stop();
  const rescue = await admin.query(
    `SELECT coalesce(max(extract(epoch FROM st.settled_at - l.expires_at) * 1000), 0)::float8 AS late
       FROM ${S}.range_settlements st
       JOIN ${S}.range_leases l ON l.slot = st.slot AND l.lane_id = st.lane_id AND l.from_seq = st.lease_from
      WHERE st.outcome = 'rescued'`,
  );
  const unrescued = await admin.query(
    `SELECT coalesce(max(extract(epoch FROM now() - l.expires_at) * 1000), 0)::float8 AS late FROM ${S}.leased_entries l
      WHERE l.worker = 'abandoned' AND l.expires_at < now() - interval '1 s' AND l.outcome IS NULL`,
  );
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
  await admin.end();
  coldLag.sort((a, b) => a - b);
  return {
    tickMaxMs,
    coldLagP99Ms: coldLag.length ? coldLag[Math.min(coldLag.length - 1, Math.ceil(coldLag.length * 0.99) - 1)]! : NaN,
    rescueLatenessMaxMs: Math.max(rescue.rows[0].late, unrescued.rows[0].late),
    hotDrainMs,
  };
}

const fmt = (n: number | null, unit = '') =>
  n === null || Number.isNaN(n) ? 'not drained' : unit === ' s' ? `${n.toFixed(1)} s` : `${Math.round(n)}${unit}`;

const rows: string[] = [];
const startedAll = Date.now();
for (const scenario of SCENARIOS) {
  const results = new Map<string, Result[]>();
  for (let round = 0; round < 2; round++) {
    const order = round % 2 === 0 ? MODES : [...MODES].reverse();
    for (const mode of order) {
      const r = await run(scenario, mode.laneLockTimeoutMs);
      console.error(`${scenario.name} / ${mode.name} / round ${round + 1}: ${JSON.stringify(r)}`);
      results.set(mode.name, [...(results.get(mode.name) ?? []), r]);
    }
  }
  for (const mode of MODES) {
    const rs = results.get(mode.name)!;
    const cell = (f: (r: Result) => number | null, unit: string) => rs.map((r) => fmt(f(r), unit)).join(' / ');
    rows.push(
      `| ${scenario.name} | ${mode.name} | ${cell((r) => r.tickMaxMs, '')} | ${cell((r) => r.coldLagP99Ms, '')} | ${cell((r) => r.rescueLatenessMaxMs, '')} | ${cell((r) => (r.hotDrainMs === null ? null : r.hotDrainMs / 1000), ' s')} |`,
    );
  }
}
const pgVersion = await (async () => {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const v = (await c.query('SHOW server_version')).rows[0].server_version;
  await c.end();
  return v;
})();
const table = [
  `# Coupling benchmark (seed 003) — ${new Date().toISOString()}`,
  '',
  `Command: \`npm run bench:coupling\` · PostgreSQL ${pgVersion} · Node ${process.version} · ${Math.round((Date.now() - startedAll) / 1000)} s · cells are round 1 / round 2, ms unless marked`,
  '',
  '| scenario | mode | leader promotion tick max | unrelated-queue lag p99 | rescue start lateness max | hot backlog drain |',
  '| --- | --- | ---: | ---: | ---: | ---: |',
  ...rows,
].join('\n');
console.log(table);
mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
writeFileSync(new URL('./results/coupling.md', import.meta.url), `${table}\n`);
