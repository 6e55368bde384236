/**
 * How late an every-second schedule's tasks are (issue 31): a fire should be late by at most the
 * leader's schedule tick (1 s) plus the time to claim its task, on a quiet fleet.
 *
 *   npm run bench:cron -- [--seconds 600] [--warmup 10] [--workers 2] [--url URL]
 *
 * Starts `--workers` Worker instances in this process at berth's defaults (schedule tick 1 s,
 * leader poll 1 s, 4 slots each), all declaring one schedule `* * * * * *` whose handler only
 * records when it started. After `--warmup` seconds it measures for `--seconds`, then reports,
 * over the instants of the window:
 * - fire lateness: instant → the leader's fire (`schedule_fires.late_ms`, taken just before the
 *   fire's enqueue; the tick's share);
 * - run lateness: instant → the handler's start (the fire's commit, the wake-up and the claim
 *   on top): what a user of the schedule sees;
 * - instants that never ran, and instants that ran more than once (both must be 0).
 *
 * Where: by default a throwaway cluster of its own with stock settings (bench/cluster.ts), so
 * nothing else on the machine's shared server is measured or disturbed. `--url` runs against an
 * existing database instead (it creates and drops a schema of its own there).
 */
import pg from 'pg';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { defineSchedule, defineTask, migrate, Worker } from '../src/index.js';
import { startCluster, type Cluster } from './cluster.js';
import { percentile } from './stats.js';
import { berthRevision, log, sleep } from './util.js';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '600' },
    warmup: { type: 'string', default: '10' },
    workers: { type: 'string', default: '2' },
    url: { type: 'string' },
  },
});
const seconds = Number(values.seconds);
const warmup = Number(values.warmup);
const workers = Number(values.workers);
for (const [k, v] of Object.entries({ seconds, warmup, workers })) {
  if (!Number.isFinite(v) || v < 0 || (k !== 'warmup' && v <= 0))
    throw new Error(`--${k} must be a positive number, got ${v}`);
}

const schema = 'berth_cron_bench';
let cluster: Cluster | null = null;
let url = values.url;
if (!url) {
  cluster = await startCluster({ settings: {} });
  process.on('exit', () => cluster?.stop());
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
  url = cluster.url;
}
const admin = new pg.Pool({ connectionString: url, max: 2 });
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });
log(`${cluster ? 'own cluster' : url}; ${workers} workers; warm-up ${warmup} s; window ${seconds} s`);

/** Handler start (ms since the epoch) by instant (ms), every run. */
const runs = new Map<number, number[]>();
const tick = defineTask<Record<string, never>>({
  type: 'cron_bench_tick',
  ceilingMs: 10_000,
  handler: async (_p, ctx) => {
    const started = Date.now();
    const instant = ctx.schedule?.instant.getTime();
    if (instant === undefined) return;
    const seen = runs.get(instant) ?? [];
    seen.push(started);
    runs.set(instant, seen);
  },
});
const fleet = Array.from(
  { length: workers },
  (_, i) =>
    new Worker({
      connectionString: url,
      schema,
      tasks: [tick],
      schedules: [defineSchedule({ name: 'every-second', cron: '* * * * * *', task: tick, payload: {} })],
      workerId: `cron-bench-${i}`,
      logger: pino({ level: 'warn' }),
    }),
);
for (const w of fleet) await w.start();
await sleep(warmup * 1000);
const from = Math.ceil(Date.now() / 1000) * 1000;
const to = from + seconds * 1000;
for (let left = to - Date.now(); left > 0; left = to - Date.now()) {
  await sleep(Math.min(left, 60_000));
  log(`${Math.round((Date.now() - from) / 1000)} s of ${seconds}`);
}
// Let the window's last instants run.
await sleep(3000);
for (const w of fleet) await w.stop();

const fires = await admin.query<{ instant: Date; late_ms: number }>(
  `SELECT instant, late_ms FROM ${schema}.schedule_fires WHERE kind = 'cron' AND instant >= $1 AND instant < $2`,
  [new Date(from), new Date(to)],
);
const fireLate = fires.rows.map((r) => r.late_ms);
const runLate: number[] = [];
let missing = 0;
let twice = 0;
for (let t = from; t < to; t += 1000) {
  const seen = runs.get(t);
  if (!seen) missing++;
  else {
    if (seen.length > 1) twice++;
    runLate.push(seen[0]! - t);
  }
}
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await admin.end();
await cluster?.stop();

const ms = (x: number) => (Number.isNaN(x) ? '-' : x.toFixed(1));
const row = (what: string, xs: number[]) =>
  `| ${what} | ${xs.length} | ${ms(percentile(xs, 50))} | ${ms(percentile(xs, 99))} | ${ms(xs.length ? Math.max(...xs) : NaN)} |`;
process.stdout.write(
  [
    `berth ${berthRevision()} · every-second schedule · ${workers} workers at defaults (tick 1 s) · ${seconds} s window after ${warmup} s warm-up · ${cluster ? 'own stock cluster' : 'given database'}`,
    '',
    '| Lateness (ms) | Instants | p50 | p99 | max |',
    '| --- | --- | --- | --- | --- |',
    row('fire (instant → leader enqueues)', fireLate),
    row('run (instant → handler starts)', runLate),
    '',
    `Instants in the window: ${seconds}; never ran: ${missing}; ran more than once: ${twice}.`,
    '',
  ].join('\n'),
);
process.exit(missing > 0 || twice > 0 ? 1 : 0);
