/**
 * Bulk enqueue rate in the shape of `npm run bench`'s bulk-enqueue scenario (bench/scenarios.ts,
 * bench/systems/berth.ts): 20,000 tasks `{ type: 'noop', payload: { i } }`, 1,000 per
 * `enqueueMany` call, sequential calls on a `pg.Pool`, each call its own transaction, a fresh
 * schema per run.
 *
 *   npx tsx bench/enqueue-bulk.ts
 *   BULK_BASELINE=/path/to/other/checkout npx tsx bench/enqueue-bulk.ts   (before/after, interleaved)
 *
 * Without BENCH_DATABASE_URL it starts its own stock cluster, as `npm run bench` does (fsync and
 * synchronous_commit on: every call pays one WAL flush); with it, it runs against that server.
 * BULK_BASELINE names another berth checkout (its `src/index.ts` is imported): both builds run
 * in every repetition, order alternating, so a shared machine's load hits both alike. Prints
 * tasks/s median (min–max) per build. (The "proposed migration" rows in docs/benchmarks-journal.md ran
 * what is now migration 9 as an extra build after migrate().) Knobs: BULK_REPS
 * (default 5), BULK_N (20000), BULK_BATCH (1000).
 */
import { loadavg } from 'node:os';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { startCluster } from './cluster.js';
import { intEnv } from './config.js';
import { dropSchema } from './db.js';

interface Build {
  label: string;
  /** SQL run after migrate() on the run's schema (the proposed migration), if any. */
  enqueueMany: (
    executor: pg.Pool,
    tasks: { type: string; payload: unknown }[],
    o: { schema: string },
  ) => Promise<unknown>;
  migrate: (o: { connectionString: string; schema: string }) => Promise<unknown>;
}

const reps = intEnv('BULK_REPS', 5);
const n = intEnv('BULK_N', 20_000);
const batch = intEnv('BULK_BATCH', 1_000);

async function load(label: string, dir: string): Promise<Build> {
  const mod = (await import(pathToFileURL(resolve(dir, 'src/index.ts')).href)) as Build;
  return { label, enqueueMany: mod.enqueueMany, migrate: mod.migrate };
}

const builds: Build[] = [await load('this checkout', resolve(import.meta.dirname, '..'))];
if (process.env.BULK_BASELINE)
  builds.unshift(await load(`baseline ${process.env.BULK_BASELINE}`, process.env.BULK_BASELINE));

const cluster = process.env.BENCH_DATABASE_URL ? undefined : await startCluster();
const url = process.env.BENCH_DATABASE_URL ?? cluster!.url;

async function once(b: Build, schema: string): Promise<number> {
  await dropSchema(url, schema);
  await b.migrate({ connectionString: url, schema });
  const pool = new pg.Pool({ connectionString: url });
  pool.on('error', () => {});
  try {
    await pool.query('SELECT 1');
    const t0 = performance.now();
    for (let start = 0; start < n; start += batch) {
      const specs: { type: string; payload: unknown }[] = [];
      for (let i = start; i < Math.min(n, start + batch); i++) specs.push({ type: 'noop', payload: { i } });
      await b.enqueueMany(pool, specs, { schema });
    }
    return n / ((performance.now() - t0) / 1000);
  } finally {
    await pool.end();
    await dropSchema(url, schema);
  }
}

try {
  const load0 = loadavg()[0]!;
  const rates = builds.map(() => [] as number[]);
  for (let rep = 0; rep < reps; rep++) {
    const order = builds.map((_, i) => i);
    if (rep % 2 === 1) order.reverse();
    for (const i of order) {
      const r = await once(builds[i]!, `bulk_bench_${i}`);
      rates[i]!.push(r);
      process.stderr.write(`rep ${rep + 1} ${builds[i]!.label}: ${Math.round(r)} tasks/s\n`);
    }
  }
  const fmt = (x: number) => Math.round(x).toLocaleString('en-US');
  console.log(
    `bulk enqueue: ${n} tasks, ${batch} per enqueueMany call, sequential, ${reps} repetitions` +
      ` (${cluster ? 'dedicated stock cluster' : 'BENCH_DATABASE_URL'};` +
      ` 1-min load average ${load0.toFixed(1)} at start, ${loadavg()[0]!.toFixed(1)} at end)`,
  );
  const median = (xs: number[]) => [...xs].sort((a, c) => a - c)[xs.length >> 1]!;
  builds.forEach((b, i) => {
    const xs = [...rates[i]!].sort((a, c) => a - c);
    // Within a repetition the builds ran back to back, so the per-repetition ratio to the first
    // build is steadier than the rates on a machine whose load comes and goes.
    const ratio =
      i === 0
        ? ''
        : `; ×${median(rates[i]!.map((r, k) => r / rates[0]![k]!)).toFixed(2)} of the first, median per repetition`;
    console.log(`  ${b.label}: ${fmt(median(xs))} tasks/s (${fmt(xs[0]!)}–${fmt(xs[xs.length - 1]!)})${ratio}`);
  });
} finally {
  await cluster?.stop();
}
