/**
 * Where a short drain's time goes, phase by phase, for two builds of berth interleaved (issue 11).
 *
 *   npx tsx bench/drain-start.ts --url postgres://…/db [--a DIR] [--b DIR] [--n 20000] [--slots 10] [--reps 16]
 *
 * `npm run bench`'s drain counts from the worker's start, so in a drain of 20,000 tasks (about
 * half a second) the start and the first claims weigh as much as the steady rate. Per run: a
 * fresh schema, N no-op tasks enqueued with enqueueMany (1,000 a call, before the clock), a
 * CHECKPOINT, then a default Worker (`slots` and a silent logger set, as bench/systems/berth.ts
 * runs it) timed from `new Worker`: when start() resolved, when the first handler ran, when a
 * quarter of the tasks had started, when all had, and when the worker's metrics counted every
 * completion written (its settlement batcher's answer came back: what `npm run bench` counts,
 * there by reading the database). Medians over the runs of each build, and each run's rate
 * (N / all recorded), in run order.
 *
 * `--a` and `--b` are directories holding a build's `index.js` (default both: this checkout's
 * dist/, after `npm run build`). For an older commit: `git worktree add /tmp/base <rev>`, link
 * this checkout's node_modules into it, `npx tsc -p tsconfig.json && node scripts/copy-sql.mjs`
 * there, then `--a /tmp/base/dist`. A and B alternate (A B, then B A, …), both in this one
 * process, so drift in the machine's speed hits both alike; the first run of each is also the
 * first in the process for its code, which V8 has not compiled yet (compare its rate with the
 * rest).
 *
 * `--url` (or BENCH_DATABASE_URL) must name a database nothing else is using heavily: the runs
 * drop and recreate the schema `drain_start` there.
 */
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';
import { median } from './stats.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    a: { type: 'string' },
    b: { type: 'string' },
    n: { type: 'string', default: '20000' },
    slots: { type: 'string', default: '10' },
    reps: { type: 'string', default: '16' },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required: the runs drop and recreate a schema there');
const n = Number(values.n);
const slots = Number(values.slots);
const reps = Number(values.reps);
for (const [k, v] of Object.entries({ n, slots, reps })) {
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${k} must be a positive integer, got ${v}`);
}

type Berth = typeof import('../src/index.js');
const dist = resolve(dirname(fileURLToPath(import.meta.url)), '..', 'dist');
const load = async (dir: string | undefined) =>
  (await import(pathToFileURL(resolve(dir ?? dist, 'index.js')).href)) as Berth;
const builds: Record<'A' | 'B', { dir: string; berth: Berth }> = {
  A: { dir: values.a ?? dist, berth: await load(values.a) },
  B: { dir: values.b ?? dist, berth: await load(values.b) },
};

const schema = 'drain_start';
const silent = pino({ level: 'silent' });
const admin = new pg.Client({ connectionString: url });
await admin.connect();

interface Phases {
  startMs: number;
  firstMs: number;
  quarterMs: number;
  allMs: number;
  recordedMs: number;
}

async function successes(worker: InstanceType<Berth['Worker']>): Promise<number> {
  const m = await worker.metrics.outcomes.prom.get();
  return m.values.reduce((sum, v) => (v.labels.outcome === 'success' ? sum + v.value : sum), 0);
}

async function run(berth: Berth): Promise<Phases> {
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await berth.migrate({ connectionString: url!, schema });
  const pool = new pg.Pool({ connectionString: url });
  try {
    for (let i = 0; i < n; i += 1000) {
      const count = Math.min(1000, n - i);
      await berth.enqueueMany(
        pool,
        Array.from({ length: count }, (_, k) => ({ type: 'noop', payload: { i: i + k } })),
        { schema },
      );
    }
  } finally {
    await pool.end();
  }
  await admin.query('CHECKPOINT');
  const starts = new Float64Array(n);
  let started = 0;
  const noop = berth.defineTask<{ i: number }>({
    type: 'noop',
    ceilingMs: 60_000,
    handler: async () => {
      starts[started++] = performance.now();
    },
  });
  const t0 = performance.now();
  const worker = new berth.Worker({ connectionString: url!, schema, tasks: [noop], slots, logger: silent });
  await worker.start();
  const startMs = performance.now() - t0;
  let recordedMs = Number.NaN;
  try {
    const deadline = t0 + 120_000;
    while (started < n) {
      if (performance.now() > deadline) throw new Error(`only ${started} of ${n} tasks started in 120 s`);
      await new Promise((r) => setTimeout(r, 1));
    }
    // Read every millisecond: the answer is late by at most that (a read costs microseconds).
    while ((await successes(worker)) < n) {
      if (performance.now() > deadline) throw new Error(`not every completion recorded in 120 s`);
      await new Promise((r) => setTimeout(r, 1));
    }
    recordedMs = performance.now() - t0;
  } finally {
    await worker.stop();
  }
  return {
    startMs,
    firstMs: starts[0]! - t0,
    quarterMs: starts[Math.ceil(n / 4) - 1]! - t0,
    allMs: starts[n - 1]! - t0,
    recordedMs,
  };
}

const results: Record<'A' | 'B', Phases[]> = { A: [], B: [] };
for (let r = 0; r < reps; r++) {
  for (const k of r % 2 === 0 ? (['A', 'B'] as const) : (['B', 'A'] as const)) {
    results[k].push(await run(builds[k].berth));
  }
}
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await admin.end();

const ms = (xs: number[]) => median(xs).toFixed(0);
console.log(
  `drain of ${n} no-op tasks, ${slots} slots, ${reps} runs per build, interleaved; ms from \`new Worker\`, medians\n`,
);
console.log(
  '| build | start() resolved | first handler | 25 % started | all started | all recorded | tasks/s (all recorded), each run |',
);
console.log('| --- | ---: | ---: | ---: | ---: | ---: | --- |');
for (const k of ['A', 'B'] as const) {
  const rs = results[k];
  console.log(
    `| ${k} (${builds[k].dir}) | ${ms(rs.map((x) => x.startMs))} | ${ms(rs.map((x) => x.firstMs))} | ` +
      `${ms(rs.map((x) => x.quarterMs))} | ${ms(rs.map((x) => x.allMs))} | ${ms(rs.map((x) => x.recordedMs))} | ` +
      `${rs.map((x) => Math.round(n / (x.recordedMs / 1000)).toLocaleString('en-US')).join(' ')} |`,
  );
}
