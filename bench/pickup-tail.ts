/**
 * Where a pickup's tail comes from, per system: the warm pickup row of `npm run bench` (a running,
 * idle worker and its producer in this process; tasks enqueued one at a time 10 ms apart), with
 * every pickup split at the enqueue call's return, and the slowest 1 % laid beside the call's
 * time and this process's garbage collections.
 *
 *   npx tsx bench/pickup-tail.ts --url postgres://…/postgres [--n 2000] [--reps 3]
 *       [--systems berth,throughput,graphile-worker (default)] [--async]
 *
 * `--async` adds each system again with its producer's session at `synchronous_commit = off`
 * (an experiment, not a setting to use: the enqueue's commit then returns before its WAL is
 * flushed), to see how much of the tail is the commit's flush. Systems and modes interleave per
 * repetition; the table gives the median over the repetitions of each run's percentile.
 * `--url` names a maintenance database of a server nothing else uses heavily; the probe
 * recreates the bench database there (BENCH_DB_NAME, default `berth_bench`).
 */
import { PerformanceObserver } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { loadConfig } from './config.js';
import { recreateDatabase } from './db.js';
import { pickupRun } from './scenarios.js';
import { median, percentile } from './stats.js';
import { benchSystems } from './systems/all.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    n: { type: 'string', default: '2000' },
    reps: { type: 'string', default: '3' },
    systems: { type: 'string', default: 'berth,throughput,graphile-worker (default)' },
    async: { type: 'boolean', default: false },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required');
const n = Number(values.n);
const reps = Number(values.reps);
if (!Number.isInteger(n) || n < 100 || !Number.isInteger(reps) || reps < 1) throw new Error('--n ≥ 100 and --reps ≥ 1');

/** Garbage collections in this process: start (performance.now()) and duration, ms. */
const gcs: { start: number; ms: number }[] = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcs.push({ start: e.startTime, ms: e.duration });
}).observe({ entryTypes: ['gc'] });

const cfg = loadConfig(url);
await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
const filter = values.systems.split(',').map((s) => s.trim().toLowerCase());
const sync = benchSystems({ connectionString: cfg.benchUrl }, filter);
const asyncUrl = `${cfg.benchUrl}${cfg.benchUrl.includes('?') ? '&' : '?'}options=${encodeURIComponent('-c synchronous_commit=off')}`;
const asyncProducers = benchSystems({ connectionString: asyncUrl }, filter);
const modes = values.async ? ['sync', 'async'] : ['sync'];

const COLUMNS = ['pickup p50', 'pickup p99', 'call p50', 'call p99', 'after return p50', 'after return p99'];
const rows = new Map<string, { v: number[]; slowCall: number; gc: number }[]>();
for (let r = 0; r < reps; r++) {
  for (const mode of modes) {
    for (let k = 0; k < sync.length; k++) {
      const system = sync[k]!;
      await system.reset();
      const run = await pickupRun(system, {
        n,
        gapMs: 10,
        concurrency: 10,
        tailTimeoutMs: 30_000,
        ...(mode === 'async' && { producerOf: asyncProducers[k]! }),
        beforeFirst: () => {
          gcs.length = 0;
        },
      });
      if (!run.ok) throw new Error(`${system.label}: ${run.note}`);
      const { sent, enqueued: returned, ran } = run.value;
      const lat = Array.from({ length: n }, (_, i) => ran[i]! - sent[i]!);
      const calls = Array.from({ length: n }, (_, i) => returned[i]! - sent[i]!);
      const after = Array.from({ length: n }, (_, i) => ran[i]! - returned[i]!);
      const slowest = lat
        .map((l, i) => [l, i] as const)
        .sort((a, b) => b[0] - a[0])
        .slice(0, Math.ceil(n / 100))
        .map(([, i]) => i);
      const slowCall = slowest.filter((i) => calls[i]! >= 3).length;
      const gc = slowest.filter((i) => gcs.some((g) => g.start < ran[i]! && g.start + g.ms > sent[i]!)).length;
      const v = [
        percentile(lat, 50),
        percentile(lat, 99),
        percentile(calls, 50),
        percentile(calls, 99),
        percentile(after, 50),
        percentile(after, 99),
      ];
      const key = `${system.label}, producer commit ${mode}`;
      const list = rows.get(key) ?? [];
      list.push({ v, slowCall, gc });
      rows.set(key, list);
      console.log(
        `rep ${r + 1} ${key}: ${COLUMNS.map((c, j) => `${c} ${v[j]!.toFixed(2)}`).join(', ')}; of the slowest ${slowest.length}, ${slowCall} had a call ≥ 3 ms, ${gc} overlapped a GC`,
      );
    }
  }
}
const slow = Math.ceil(n / 100);
console.log(`\n${n} pickups 10 ms apart, ${reps} repetition(s); ms, median over the repetitions\n`);
console.log(`| system | ${COLUMNS.join(' | ')} | slowest ${slow}: call ≥ 3 ms | slowest ${slow}: during a GC |`);
console.log(`| --- | ${COLUMNS.map(() => '---:').join(' | ')} | ---: | ---: |`);
for (const [key, list] of rows) {
  const cols = COLUMNS.map((_, j) => median(list.map((x) => x.v[j]!)).toFixed(2));
  console.log(
    `| ${key} | ${cols.join(' | ')} | ${median(list.map((x) => x.slowCall))} | ${median(list.map((x) => x.gc))} |`,
  );
}
process.exit(0);
