/**
 * The warm drain rows of `npm run bench` alone, for any systems, with how busy the machine was
 * while each drain ran: a quick check of a change against graphile-worker's preset, and of how
 * the systems in a run move each other's numbers.
 *
 *   npx tsx bench/warm-drain-probe.ts [--reps 5] [--systems berth,throughput] [--warmup 100000]
 *
 * bench/scenarios.ts's `drain` as the bench runs it (20,000 tasks queued, a worker started in this
 * process, counted when the database shows every completion recorded), at 10 and 50 at once,
 * after a warm-up drain per system, systems interleaved and the order reversed every repetition,
 * on a dedicated stock cluster (bench/cluster.ts). BENCH_BERTH_BASE adds the `berth (base)` row.
 * `--systems` takes lower-case parts of labels, as BENCH_SYSTEMS does.
 *
 * Busy: the share of both cores' time not idle (/proc/stat) from just before the worker is made to
 * the moment it is told to stop (the completion already recorded): the worker, its server
 * backends and this process's probe together. Near 100 % the machine's CPU bounds the drain;
 * well below, the chain of round trips does (a worker's start, claims waiting on settlements).
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { loadConfig } from './config.js';
import { Monitor, openBenchServer, recreateDatabase } from './db.js';
import { drain } from './scenarios.js';
import { median } from './stats.js';
import { benchSystems } from './systems/all.js';
import type { SystemAdapter } from './systems/types.js';
import { log } from './util.js';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '5' },
    systems: { type: 'string', default: 'berth,throughput' },
    warmup: { type: 'string', default: '100000' },
  },
});
const reps = Number(values.reps);
const warmupN = Number(values.warmup);
if (!Number.isInteger(reps) || reps < 1) throw new Error(`--reps must be a positive integer, got ${values.reps}`);
if (!Number.isInteger(warmupN) || warmupN < 0) throw new Error(`--warmup must be a whole number, got ${values.warmup}`);

/** Both cores' idle and total jiffies so far (the first line of /proc/stat). */
function cpuTimes(): { idle: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  return { idle: fields[3]! + fields[4]!, total: fields.reduce((a, b) => a + b, 0) };
}

/** The adapter with its worker's life measured: busy share from start to the stop request. */
function measured(a: SystemAdapter): { adapter: SystemAdapter; busy: () => number } {
  let from = cpuTimes();
  let to = from;
  const adapter: SystemAdapter = {
    ...a,
    async startWorker(concurrency, runs) {
      from = cpuTimes();
      const worker = await a.startWorker(concurrency, runs);
      return {
        stop: () => {
          to = cpuTimes();
          return worker.stop();
        },
      };
    },
  };
  return { adapter, busy: () => 1 - (to.idle - from.idle) / Math.max(1, to.total - from.total) };
}

const server = await openBenchServer();
try {
  const cfg = loadConfig(server.adminUrl);
  await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
  const monitor = await Monitor.open(cfg.benchUrl);
  const filter = values.systems.split(',').map((s) => s.trim().toLowerCase());
  const systems = benchSystems({ connectionString: cfg.benchUrl }, filter).map(measured);
  if (systems.length === 0) throw new Error(`no system matches --systems ${values.systems}`);
  if (warmupN > 0) {
    for (const { adapter } of systems) {
      const o = await drain(adapter, monitor, { ...cfg, drainN: warmupN, drainTimeoutMs: cfg.warmupTimeoutMs * 2 }, 10);
      log(`warm-up ${adapter.label}: ${o.ok ? `${Math.round(o.value.tasksPerSec)} tasks/s` : o.note}`);
    }
  }
  const rows = new Map<string, { rate: number[]; busy: number[] }>();
  for (let r = 0; r < reps; r++) {
    const order = r % 2 === 0 ? systems : [...systems].reverse();
    for (const c of cfg.drainConcurrencies) {
      for (const { adapter, busy } of order) {
        const o = await drain(adapter, monitor, cfg, c);
        const key = `${adapter.label}|${c}`;
        const row = rows.get(key) ?? { rate: [], busy: [] };
        rows.set(key, row);
        if (!o.ok) {
          log(`${adapter.label} c${c} rep ${r + 1}: ${o.note}`);
          continue;
        }
        row.rate.push(o.value.tasksPerSec);
        row.busy.push(busy());
        log(
          `${adapter.label} c${c} rep ${r + 1}: ${Math.round(o.value.tasksPerSec)} tasks/s, busy ${(busy() * 100).toFixed(0)} %`,
        );
      }
    }
  }
  await monitor.close();
  const preset = (c: number) => rows.get(`graphile-worker (throughput)|${c}`)?.rate;
  console.log(`\nwarm drain of ${cfg.drainN.toLocaleString('en-US')} tasks, ${reps} repetitions, medians\n`);
  console.log('| system | at once | tasks/s (median) | each repetition | × the preset | machine busy |');
  console.log('| --- | ---: | ---: | --- | ---: | ---: |');
  for (const [key, row] of rows) {
    const [label, c] = key.split('|') as [string, string];
    if (row.rate.length === 0) continue;
    const p = preset(Number(c));
    const ratio = p && p.length > 0 ? `${(median(row.rate) / median(p)).toFixed(2)}×` : '–';
    console.log(
      `| ${label} | ${c} | ${Math.round(median(row.rate)).toLocaleString('en-US')} | ${row.rate.map((x) => Math.round(x)).join(' ')} | ${ratio} | ${(median(row.busy) * 100).toFixed(0)} % |`,
    );
  }
} finally {
  await server.stop();
}
