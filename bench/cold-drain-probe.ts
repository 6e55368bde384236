/**
 * The new-process drain row of `npm run bench` alone, with where its time goes: per run, the
 * worker's start (from just before the worker is made to its start() resolving), its first
 * handler run, the last task's first handler run, and its completion recorded.
 *
 *   npx tsx bench/cold-drain-probe.ts [--reps 5] [--concurrency 50] [--systems berth,graphile] [--trace]
 *
 * bench/cold.ts's `coldDrain` as the bench runs it (20,000 tasks queued, a child process that has
 * loaded the systems' modules starts the worker; counted when the database shows every task's
 * completion recorded), on a dedicated stock cluster (bench/cluster.ts); BENCH_BERTH_BASE adds the
 * `berth (base)` row. Systems interleaved, the order rotated every repetition.
 *
 * --trace: each child also writes its timeline to stderr (bench/query-trace.ts: `T t0 <epoch ms>`,
 * then every connect and query as it starts and ends), e.g. relative to t0:
 *   ... --reps 1 --trace 2>&1 | awk '/^T t0/{t0=$3} /^T /{printf "%s %.1f %s\n", $2, $3 - t0, $4}'
 */
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { coldDrain, type ColdDrainResult } from './cold.js';
import { loadConfig } from './config.js';
import { openBenchServer, recreateDatabase } from './db.js';
import { median } from './stats.js';
import { benchSystems } from './systems/all.js';
import { log } from './util.js';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '5' },
    concurrency: { type: 'string', default: '50' },
    systems: { type: 'string', default: 'berth,graphile' },
    trace: { type: 'boolean', default: false },
  },
});
// Read by bench/cold-child.ts (a child inherits this process's environment).
if (values.trace) process.env.BENCH_TRACE = '1';
const reps = Number(values.reps);
const concurrency = Number(values.concurrency);

const server = await openBenchServer();
try {
  const cfg = loadConfig(server.adminUrl);
  await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
  const filter = values.systems.split(',').map((s) => s.trim().toLowerCase());
  // The peers' default rows are left out (graphile-worker's and pg-boss's defaults drain ~2,000
  // and ~5 tasks/s: minutes a run); berth's default row is berth.
  const systems = benchSystems({ connectionString: cfg.benchUrl }, filter).filter(
    (s) => !s.label.includes('default') || s.label.startsWith('berth'),
  );
  const results = new Map<string, ColdDrainResult[]>(systems.map((s) => [s.label, []]));
  for (let rep = 0; rep < reps; rep++) {
    const order = systems.map((_, i) => systems[(i + rep) % systems.length]!);
    for (const system of order) {
      const out = await coldDrain(system, cfg, concurrency);
      if (!out.ok) {
        log(`${system.label} rep ${rep + 1}: failed: ${out.note}`);
        continue;
      }
      const r = out.value;
      results.get(system.label)!.push(r);
      log(
        `${system.label} rep ${rep + 1}: ${r.tasksPerSec.toFixed(0)} tasks/s; start ${r.startMs.toFixed(1)} ms, first run ${r.firstRunMs.toFixed(1)} ms, last first run ${((cfg.drainN / r.startedPerSec) * 1000).toFixed(0)} ms, then recorded +${r.tailMs.toFixed(1)} ms; load ${loadavg()[0]!.toFixed(2)}`,
      );
    }
  }
  console.log(`\n${cfg.drainN} tasks, ${concurrency} at once, median (range) of ${reps} runs\n`);
  console.log('| system | tasks/s | start() ms | first run ms | last first run ms | recorded after ms |');
  console.log('| --- | ---: | ---: | ---: | ---: | ---: |');
  const cell = (xs: number[], d = 1) =>
    `${median(xs).toFixed(d)} (${Math.min(...xs).toFixed(d)}–${Math.max(...xs).toFixed(d)})`;
  for (const [label, rs] of results) {
    if (rs.length === 0) continue;
    console.log(
      `| ${label} | ${cell(
        rs.map((r) => r.tasksPerSec),
        0,
      )} | ${cell(rs.map((r) => r.startMs))} | ${cell(rs.map((r) => r.firstRunMs))} | ${cell(
        rs.map((r) => (cfg.drainN / r.startedPerSec) * 1000),
        0,
      )} | ${cell(rs.map((r) => r.tailMs))} |`,
    );
  }
} finally {
  await server.stop();
}
