/**
 * The new-process pickup row of `npm run bench` alone, two berth builds interleaved (or any
 * systems), with where in the run the slow pickups fall and when the worker's sessions opened.
 *
 *   BENCH_BERTH_BASE=/path/to/other/dist/index.js npx tsx bench/cold-pickup-probe.ts [--reps 8]
 *     [--systems berth] [--sessions] [--trace]
 *
 * The scenario is bench/cold.ts's `coldPickup` as the bench runs it (a child process that has
 * loaded the systems' modules starts a worker at its defaults with slots 10; after 1 s idle the
 * parent enqueues 500 tasks 10 ms apart; latency = handler start − the instant before the
 * enqueue call), on a dedicated stock cluster (bench/cluster.ts; BENCH_DATABASE_URL targets an
 * existing server instead). By default each repetition runs `berth (default)` (this checkout's
 * dist/) and `berth (base)` (BENCH_BERTH_BASE), the order swapped every repetition; `--systems`
 * takes bench/systems/all.ts's filters instead (`--systems "berth (base),throughput,graphile-worker
 * (default)"`), in that order, rotated the same way.
 *
 * Per build it prints: each run's p50 / p95 / p99 / max and their medians; the enqueue call's
 * own time (the producer's call in this process, commit included) and the rest of each latency
 * (notification, claim, handler start in the child); the latency by half-second of the run
 * (median of the runs' per-bucket p99 and max), so a tail that belongs to one moment of a new
 * worker shows as one bucket; with `--sessions`, per run, the worker's sessions
 * (`pg_stat_activity` read while the child still runs: role, when each backend started relative
 * to the first enqueue, and its last statement's first words).
 *
 * `--trace`: each child writes its timeline to stderr (bench/query-trace.ts: its queries,
 * notifications, garbage collections with their pauses, and handler starts as `T run <epoch ms>
 * <i>`), and this process writes each run's six slowest pickups there as `S <label> <i> <sent
 * epoch ms> <latency ms> <enqueue call ms>`, so each can be laid beside what the child did
 * meanwhile (docs/benchmarks-journal.md, "Issue 35's sixth round"). `BENCH_CHILD_NODE_OPTIONS`
 * passes V8 flags to the children only (`--trace-gc --trace-gc-nvp`: each collection's promoted
 * bytes, on stdout).
 */
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { coldPickup, type ColdPickupDetail } from './cold.js';
import { loadConfig } from './config.js';
import { openBenchServer, recreateDatabase } from './db.js';
import { median, percentile } from './stats.js';
import { benchSystems } from './systems/all.js';
import { log } from './util.js';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '8' },
    bucket: { type: 'string', default: '500' },
    sessions: { type: 'boolean', default: false },
    trace: { type: 'boolean', default: false },
    systems: { type: 'string', default: 'berth' },
  },
});
const reps = Number(values.reps);
// --trace: the children write their timelines to stderr (bench/query-trace.ts), and this process
// writes each run's slowest pickups there as `S <label> <i> <sent epoch ms> <latency ms> <enqueue call ms>`.
if (values.trace) process.env.BENCH_TRACE = '1';
const bucketMs = Number(values.bucket);
if (values.systems === 'berth' && !process.env.BENCH_BERTH_BASE)
  throw new Error('BENCH_BERTH_BASE must name the other build (its dist/index.js)');

interface RunDetail {
  p50: number;
  p95: number;
  p99: number;
  max: number;
  /** Per bucket of `bucketMs` from the first enqueue: p99 and max. */
  buckets: [number, number][];
  slowest: string;
  sessions: string[];
}

const server = await openBenchServer();
try {
  const cfg = loadConfig(server.adminUrl);
  await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
  const systems = benchSystems({ connectionString: cfg.benchUrl }, values.systems.split(','));
  if (values.systems === 'berth' && systems.length !== 2)
    throw new Error(`expected two berth builds, got ${systems.map((s) => s.label).join(', ')}`);
  const monitor = new pg.Client({ connectionString: cfg.benchUrl, application_name: 'cold-pickup-probe' });
  await monitor.connect();
  const results = new Map<string, RunDetail[]>(systems.map((s) => [s.label, []]));
  const loads: number[] = [];
  for (let rep = 0; rep < reps; rep++) {
    const order = rep % 2 === 0 ? systems : [...systems].reverse();
    for (const system of order) {
      loads.push(loadavg()[0]!);
      let d: ColdPickupDetail | null = null;
      let sessions: string[] = [];
      const out = await coldPickup(system, cfg, async (detail) => {
        d = detail;
        const first = detail.sent[0]!;
        const r = await monitor.query<{ app: string; at: number; query: string }>(
          `SELECT application_name AS app, extract(epoch FROM backend_start) * 1000 AS at, left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS query
             FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'berth %' ORDER BY backend_start`,
        );
        sessions = r.rows.map(
          (s) =>
            `${s.app.split(' ')[1]} ${(Number(s.at) - first).toFixed(0)} ms (start ${(Number(s.at) - detail.workerStartedAt).toFixed(0)}): ${s.query}`,
        );
      });
      if (!out.ok || d === null) {
        log(`${system.label} rep ${rep + 1}: failed: ${out.ok ? 'no detail' : out.note}`);
        continue;
      }
      const { sent, latencies, enqueued } = d as ColdPickupDetail;
      const first = sent[0]!;
      const buckets: number[][] = [];
      for (let i = 0; i < sent.length; i++) {
        const b = Math.floor((sent[i]! - first) / bucketMs);
        const xs = buckets[b] ?? [];
        xs.push(latencies[i]!);
        buckets[b] = xs;
      }
      const slowest = [...latencies.keys()].sort((a, b) => latencies[b]! - latencies[a]!).slice(0, 6);
      const slow = slowest.map((i) => `${latencies[i]!.toFixed(1)}@${(sent[i]! - first).toFixed(0)}`);
      if (values.trace)
        for (const i of slowest)
          process.stderr.write(
            `S ${system.label.replace(/\W+/g, '_')} ${i} ${sent[i]!.toFixed(1)} ${latencies[i]!.toFixed(1)} ${(enqueued[i]! - sent[i]!).toFixed(1)}\n`,
          );
      const detail: RunDetail = {
        ...out.value,
        buckets: buckets.map((xs) => [percentile(xs ?? [], 99), Math.max(...(xs ?? [Number.NaN]))]),
        slowest: slow.join(' '),
        sessions,
      };
      results.get(system.label)!.push(detail);
      const enq = [...enqueued].map((e, i) => e - sent[i]!);
      const inChild = [...latencies].map((l, i) => l - enq[i]!);
      log(
        `${system.label} rep ${rep + 1}: enqueue call p50 ${percentile(enq, 50).toFixed(1)} p99 ${percentile(enq, 99).toFixed(1)}; after it p50 ${percentile(inChild, 50).toFixed(1)} p99 ${percentile(inChild, 99).toFixed(1)} max ${Math.max(...inChild).toFixed(1)}`,
      );
      log(
        `${system.label} rep ${rep + 1}: p50 ${detail.p50.toFixed(1)} p95 ${detail.p95.toFixed(1)} p99 ${detail.p99.toFixed(1)} max ${detail.max.toFixed(1)}; slowest (ms@ms into the run) ${detail.slowest}; load ${loadavg()[0]!.toFixed(2)}`,
      );
      if (values.sessions) for (const s of sessions) log(`    ${s}`);
    }
  }
  await monitor.end();
  console.log(`\nload average (1 min) at each run: ${loads.map((l) => l.toFixed(2)).join(' ')}\n`);
  console.log('| build | runs | p50 | p95 | p99 | max |');
  console.log('| --- | ---: | --- | --- | --- | --- |');
  const cell = (xs: number[]) =>
    `${median(xs).toFixed(1)} (${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)})`;
  for (const [label, rs] of results) {
    if (rs.length === 0) continue;
    console.log(
      `| ${label} | ${rs.length} | ${cell(rs.map((r) => r.p50))} | ${cell(rs.map((r) => r.p95))} | ${cell(rs.map((r) => r.p99))} | ${cell(rs.map((r) => r.max))} |`,
    );
  }
  console.log(
    `\nPer ${bucketMs} ms of the run from the first enqueue: median over runs of the bucket's p99 / max (ms)\n`,
  );
  for (const [label, rs] of results) {
    if (rs.length === 0) continue;
    const n = Math.max(...rs.map((r) => r.buckets.length));
    const cells: string[] = [];
    for (let b = 0; b < n; b++) {
      const p = rs.map((r) => r.buckets[b]?.[0]).filter((x): x is number => x !== undefined);
      const m = rs.map((r) => r.buckets[b]?.[1]).filter((x): x is number => x !== undefined);
      cells.push(`${median(p).toFixed(0)}/${median(m).toFixed(0)}`);
    }
    console.log(`- ${label}: ${cells.join('  ')}`);
  }
} finally {
  await server.stop();
}
