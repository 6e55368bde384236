/**
 * Bulk enqueue call by call, for every system of `npm run bench`, through its own adapters
 * (bench/systems/*.ts): how much of the bulk row is a new session's first call.
 *
 *   npx tsx bench/bulk-calls.ts            (its own stock cluster, as `npm run bench` starts)
 *   BENCH_DATABASE_URL=postgres://… npx tsx bench/bulk-calls.ts
 *
 * Each repetition, for each system in turn (order rotated per repetition): the bench's reset
 * (a fresh schema or queue), its producer (a new pool, connected with `SELECT 1` as the bench
 * does), then CALLS_N calls of 1,000 tasks, each call timed alone. Reported per system, as the
 * median over the repetitions: the first call, the median of the other calls, and the rate the
 * bulk row would show for the first 20 calls (BENCH_BULK_N=20000) and for all of them. Knobs:
 * CALLS_REPS (default 3), CALLS_N (default 100), BENCH_SYSTEMS (label filters, as the bench).
 * berth runs from dist/ as in the bench (`npm run build` first; BENCH_BERTH_SRC=1 for src/).
 */
import { loadavg } from 'node:os';
import { startCluster } from './cluster.js';
import { intEnv, loadConfig } from './config.js';
import { recreateDatabase } from './db.js';
import { median } from './stats.js';
import { benchSystems } from './systems/all.js';
import { berthBuild } from './systems/berth.js';

const reps = intEnv('CALLS_REPS', 3);
const calls = intEnv('CALLS_N', 100);
const BATCH = 1_000;
if (calls < 20) throw new Error('CALLS_N must be at least 20 (the bench row is 20 calls)');

const cluster = process.env.BENCH_DATABASE_URL ? undefined : await startCluster();
try {
  const cfg = loadConfig(process.env.BENCH_DATABASE_URL ?? cluster!.url);
  await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
  const ctx = { connectionString: cfg.benchUrl };
  const systems = benchSystems(ctx, cfg.systemFilter);
  const load0 = loadavg()[0]!;
  const rows = new Map(
    systems.map((s) => [s.label, { first: [], rest: [], r20: [], all: [] } as Record<string, number[]>]),
  );
  for (let rep = 0; rep < reps; rep++) {
    const order = systems.map((_, i) => systems[(i + rep) % systems.length]!);
    for (const s of order) {
      await s.reset();
      const producer = await s.openProducer();
      const ms: number[] = [];
      try {
        for (let k = 0; k < calls; k++) {
          const t = performance.now();
          await producer.bulk(k * BATCH, BATCH);
          ms.push(performance.now() - t);
        }
      } finally {
        await producer.close();
      }
      const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
      const row = rows.get(s.label)!;
      row.first!.push(ms[0]!);
      row.rest!.push(median(ms.slice(1)));
      row.r20!.push((20 * BATCH) / (sum(ms.slice(0, 20)) / 1000));
      row.all!.push((calls * BATCH) / (sum(ms) / 1000));
      process.stderr.write(
        `rep ${rep + 1} ${s.label}: first ${ms[0]!.toFixed(1)} ms, others ${median(ms.slice(1)).toFixed(1)} ms\n`,
      );
    }
  }
  const rate = (x: number) => Math.round(x).toLocaleString('en-US');
  console.log(
    `bulk enqueue call by call: ${calls} calls of ${BATCH} per system and repetition, ${reps} repetitions, ` +
      `${cluster ? 'dedicated stock cluster' : 'BENCH_DATABASE_URL'}, berth ${berthBuild}; 1-min load average ${load0.toFixed(1)} at start, ` +
      `${loadavg()[0]!.toFixed(1)} at end. Medians over the repetitions.\n`,
  );
  console.log(
    `| system | first call ms | other calls, median ms | tasks/s over the first 20 calls | tasks/s over ${calls} calls |`,
  );
  console.log('| --- | ---: | ---: | ---: | ---: |');
  for (const [label, r] of rows)
    console.log(
      `| ${label} | ${median(r.first!).toFixed(1)} | ${median(r.rest!).toFixed(1)} | ${rate(median(r.r20!))} | ${rate(median(r.all!))} |`,
    );
} finally {
  await cluster?.stop();
}
