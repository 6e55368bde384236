/**
 * The worker's own CPU per task during a drain (issue 11): how much of a core the Node process
 * spends per task, apart from PostgreSQL's time.
 *
 *   npx tsx bench/drain-profile.ts [--n 50000] [--slots 10,50] [--runs 3] [--warmup 10000] [--profile] [--dist] [--schema-check]
 *
 * After a warm-up drain of `--warmup` tasks (not reported), each run, per slot count: a fresh schema, N no-op tasks enqueued with enqueueMany (1,000 per
 * call, before the clock starts), then a Worker at its defaults (only `slots` and a silent
 * logger set, as bench/systems/berth.ts runs it) is started and timed until its metrics count N
 * successes, i.e. every completion is written and acknowledged by the database. Printed per run:
 * tasks/s; the process's CPU (process.cpuUsage, user + system) per task over the same window; and
 * the CPU of the worker's own PostgreSQL backends per task (from /proc, so only when the server
 * runs on this machine; its pids from pg_stat_activity by the sessions' application_name). Then
 * the median of the runs. The window includes the worker's start (pools, LISTEN, the leader's
 * election), a few ms in a drain of seconds.
 *
 * `--profile` adds one more run per slot count under the V8 CPU profiler (node:inspector, started
 * at the worker's start and stopped at the last completion) and writes
 * `bench/results/drain-c<slots>.cpuprofile`, and a sampling heap profile of the same run (every
 * allocation, collected or not) as `drain-c<slots>.heapprofile` (open them in Chrome DevTools, or
 * summarise them with `npx tsx bench/cpuprofile-summary.ts FILE`). Profiled runs are slower and are not in the medians.
 * `--cold` measures the first drain of the process instead (no warm-up, no other runs; the first
 * `--slots` value only, as the second drain of a process is no longer cold): V8's compiling and
 * its first, unoptimised runs of the hot path, which a long-lived worker pays once. With
 * `--profile` that drain is the profiled one, written as `drain-c<slots>-cold.cpuprofile` and
 * `.heapprofile`.
 * `--dist` runs the built package (dist/, after `npm run build`) instead of src/ under tsx;
 * `--entry FILE` imports berth from another checkout's `src/index.ts`, for an A/B against an older
 * commit (`mkdir /tmp/base && git archive main src | tar -x -C /tmp/base`, then
 * `--entry /tmp/base/src/index.ts`; node_modules resolve from here when the checkout lies below).
 * `--worker-options JSON` adds Worker options (an A/B of a default, e.g. `'{"prefetch":1000}'`).
 * `--schema-check` gives the task type a Zod payload schema (validation per task).
 * `--observe events` adds a listener to `task:started` and `task:settled` (each counts);
 * `--observe trace` registers an OpenTelemetry SDK first (BasicTracerProvider, always sampled,
 * spans dropped by a NoopSpanProcessor, and the AsyncLocalStorage context manager), so every
 * attempt makes its span; `--observe both` does both (docs/benchmarks-journal.md, "Events and traces").
 *
 * Database: BENCH_DATABASE_URL, else TEST_DATABASE_URL. Schema `berth_drain_profile_<pid>`, dropped at
 * the end. The machine's load is printed with the results: other processes on the same cores
 * move every number here.
 */
import { readFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { loadavg } from 'node:os';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';
import { z } from 'zod';
import type { TaskSpec, Worker } from '../src/index.js';
import { AllocationMeter } from './allocation.js';
import { dropSchema } from './db.js';
import { median } from './stats.js';

const { values: args } = parseArgs({
  options: {
    n: { type: 'string', default: '50000' },
    slots: { type: 'string', default: '10,50' },
    runs: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '10000' },
    profile: { type: 'boolean', default: false },
    cold: { type: 'boolean', default: false },
    'schema-check': { type: 'boolean', default: false },
    dist: { type: 'boolean', default: false },
    entry: { type: 'string' },
    observe: { type: 'string' },
    'worker-options': { type: 'string' },
  },
});
/** Extra Worker options as JSON (`--worker-options '{"prefetch":1000}'`), for an A/B of a default. */
const WORKER_OPTIONS = JSON.parse(args['worker-options'] ?? '{}') as Record<string, unknown>;
const OBSERVE = args.observe ?? 'none';
if (!['none', 'events', 'trace', 'both'].includes(OBSERVE)) {
  console.error('--observe is one of none, events, trace, both');
  process.exit(2);
}
if (OBSERVE === 'trace' || OBSERVE === 'both') {
  const { trace, context } = await import('@opentelemetry/api');
  const { BasicTracerProvider, NoopSpanProcessor } = await import('@opentelemetry/sdk-trace-base');
  const { AsyncLocalStorageContextManager } = await import('@opentelemetry/context-async-hooks');
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new NoopSpanProcessor()] }));
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
}
// tsx compiles src/ with esbuild's keepNames (every function and closure created is renamed
// through a helper) and minified whitespace; `--dist` runs tsc's build, as the package ships it
// (run `npm run build` first). The path is a variable so typechecking never needs dist/.
const entry = args.entry ? resolve(args.entry) : args.dist ? '../dist/index.js' : '../src/index.js';
const {
  defineTask,
  enqueueMany,
  migrate,
  taskCounts,
  Worker: WorkerClass,
} = (await import(entry)) as typeof import('../src/index.js');
const N = Number(args.n);
const SLOTS = args.slots.split(',').map(Number);
const RUNS = Number(args.runs);
const WARMUP = Number(args.warmup);
const url = process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL;
if (!url) {
  console.error('set BENCH_DATABASE_URL or TEST_DATABASE_URL');
  process.exit(2);
}
// The process id in the name: two sessions profiling on one server do not drain each other's tasks.
const SCHEMA = `berth_drain_profile_${process.pid}`;
const silent = pino({ level: 'silent' });
/** Linux clock ticks per second (`getconf CLK_TCK`), the unit of /proc/<pid>/stat's CPU times. */
const CLK_TCK = 100;

interface RunResult {
  slots: number;
  tasksPerSec: number;
  cpuUsPerTask: number;
  /** The system (kernel) part of cpuUsPerTask. */
  sysUsPerTask: number;
  /**
   * The main thread's CPU alone (/proc/self/task): the event loop's time per task, without GC
   * helper threads; null where /proc is not readable.
   */
  mainUsPerTask: number | null;
  /** JS heap bytes allocated per task (from the GC profiler's heap sizes around each collection). */
  allocatedPerTask: number;
  /** Claim statements and settlement flushes per task: the batch shape the CPU per task depends on. */
  claimsPerTask: number;
  flushesPerTask: number;
  /** null when the backends' /proc entries cannot be read (a remote server). */
  serverUsPerTask: number | null;
}

/** CPU seconds (user + system) a local process or thread has used, from /proc; null if unreadable. */
function procCpuSeconds(path: string): number | null {
  try {
    const stat = readFileSync(path, 'utf8');
    // Fields after the command name (which may hold spaces, so split after its closing paren).
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(rest[11]) + Number(rest[12])) / CLK_TCK;
  } catch {
    return null;
  }
}

async function fill(admin: pg.Pool, n: number): Promise<void> {
  await dropSchema(url as string, SCHEMA);
  await migrate({ connectionString: url as string, schema: SCHEMA });
  for (let start = 0; start < n; start += 1000) {
    const specs: TaskSpec[] = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) specs.push({ type: 'noop', payload: { i } });
    await enqueueMany(admin, specs, { schema: SCHEMA });
  }
  // The drain starts from settled statistics and no pending autovacuum work of the fill.
  await admin.query(`VACUUM ANALYZE`);
}

async function successes(worker: Worker): Promise<number> {
  const m = await worker.metrics.outcomes.prom.get();
  return m.values.reduce((n, v) => (v.labels.outcome === 'success' ? n + v.value : n), 0);
}

/** Claim statements (hit or empty) and settlement flushes (complete or fail) the worker made. */
async function statements(worker: Worker): Promise<{ claims: number; flushes: number }> {
  const claims = (await worker.metrics.claims.prom.get()).values.reduce((n, v) => n + v.value, 0);
  const flushes = (await worker.metrics.settlementFlushSeconds.prom.get()).values
    .filter((v) => v.metricName?.endsWith('_count'))
    .reduce((n, v) => n + v.value, 0);
  return { claims, flushes };
}

async function drain(admin: pg.Pool, slots: number, profile: string | null, n = N): Promise<RunResult> {
  await fill(admin, n);
  const payload = z.object({ i: z.number().int() });
  const noop = args['schema-check']
    ? defineTask({ type: 'noop', ceilingMs: 60_000, schema: payload, handler: async () => {} })
    : defineTask<{ i: number }>({ type: 'noop', ceilingMs: 60_000, handler: async () => {} });
  const worker = new WorkerClass({
    connectionString: url as string,
    schema: SCHEMA,
    tasks: [noop],
    slots,
    logger: silent,
    ...WORKER_OPTIONS,
  });
  if (OBSERVE === 'events' || OBSERVE === 'both') {
    let heard = 0;
    worker.events.on('task:started', () => void heard++);
    worker.events.on('task:settled', () => void heard++);
  }
  let session: Session | null = null;
  if (profile) {
    session = new Session();
    session.connect();
    await session.post('Profiler.enable');
    await session.post('Profiler.setSamplingInterval', { interval: 100 });
    await session.post('Profiler.start');
    // Every allocation site, short-lived objects included (they are what a drain allocates).
    await session.post('HeapProfiler.enable');
    await session.post('HeapProfiler.startSampling', {
      samplingInterval: 4096,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true,
    });
  }
  const mainStat = `/proc/self/task/${process.pid}/stat`;
  const allocation = new AllocationMeter();
  const main0 = procCpuSeconds(mainStat);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await worker.start();
  // Polled, not pushed: the count is read from the worker's own metrics, which it updates once
  // the database acknowledged the completion. 200 reads a second cost a few µs each.
  while ((await successes(worker)) < n) await new Promise((r) => setTimeout(r, 5));
  const secs = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const main1 = procCpuSeconds(mainStat);
  const allocated = allocation.stop();
  const made = await statements(worker);
  if (session) {
    const { profile: p } = await session.post('Profiler.stop');
    const { profile: h } = await session.post('HeapProfiler.stopSampling');
    mkdirSync('bench/results', { recursive: true });
    writeFileSync(profile as string, JSON.stringify(p));
    writeFileSync((profile as string).replace(/\.cpuprofile$/, '.heapprofile'), JSON.stringify(h));
    session.disconnect();
  }
  const backends = await admin.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity WHERE application_name LIKE '%' || $1`,
    [worker.id],
  );
  let serverSecs: number | null = 0;
  for (const { pid } of backends.rows) {
    const s = procCpuSeconds(`/proc/${pid}/stat`);
    serverSecs = s === null || serverSecs === null ? null : serverSecs + s;
  }
  await worker.stop();
  // Nothing left pending (the public count, as `berth stats` shows it).
  const left = (await taskCounts(admin, SCHEMA)).reduce((sum, c) => sum + c.pending, 0);
  if (left !== 0) throw new Error(`${left} tasks left pending after the drain`);
  return {
    slots,
    tasksPerSec: n / secs,
    cpuUsPerTask: (cpu.user + cpu.system) / n,
    sysUsPerTask: cpu.system / n,
    mainUsPerTask: main0 === null || main1 === null ? null : ((main1 - main0) * 1e6) / n,
    allocatedPerTask: allocated / n,
    claimsPerTask: made.claims / n,
    flushesPerTask: made.flushes / n,
    serverUsPerTask: serverSecs === null ? null : (serverSecs * 1e6) / n,
  };
}

const fmt = (x: number | null, digits = 1): string => (x === null ? '–' : x.toFixed(digits));

const admin = new pg.Pool({ connectionString: url, max: 2 });
admin.on('error', () => {});
try {
  const load0 = loadavg()[0]!;
  const results: RunResult[] = [];
  if (args.cold) {
    const file = `bench/results/drain-c${SLOTS[0]}-cold.cpuprofile`;
    const res = await drain(admin, SLOTS[0]!, args.profile ? file : null);
    console.log(
      `cold (first drain of the process) c${SLOTS[0]}, ${N} tasks (${args.entry ?? (args.dist ? 'dist/' : 'src/ under tsx')})${args.profile ? ', profiled' : ''}: ${Math.round(res.tasksPerSec)} tasks/s, ${fmt(res.cpuUsPerTask)} µs CPU/task (main thread ${fmt(res.mainUsPerTask)}), ${Math.round(res.allocatedPerTask)} B allocated/task; node ${process.version}; load ${load0.toFixed(1)}${args.profile ? `; wrote ${file}` : ''}`,
    );
  } else {
    // The first drain in a process runs colder (module loading, JIT): measured runs start warm.
    if (WARMUP > 0) await drain(admin, SLOTS[0]!, null, WARMUP);
    for (let r = 0; r < RUNS; r++) {
      for (const slots of SLOTS) {
        const res = await drain(admin, slots, null);
        results.push(res);
        console.error(
          `run ${r + 1} c${slots}: ${Math.round(res.tasksPerSec)} tasks/s, ${fmt(res.cpuUsPerTask)} µs CPU/task (worker; ${fmt(res.sysUsPerTask)} system; main thread ${fmt(res.mainUsPerTask)}), ${Math.round(res.allocatedPerTask)} B allocated/task, ${fmt(res.serverUsPerTask)} µs/task (its backends); ${res.claimsPerTask.toFixed(4)} claims and ${res.flushesPerTask.toFixed(4)} flushes per task`,
        );
      }
    }
    console.log(
      `\ndrain of ${N} no-op tasks (${args.entry ?? (args.dist ? 'dist/' : 'src/ under tsx')})${args['schema-check'] ? ' (Zod payload schema)' : ''}${OBSERVE === 'none' ? '' : ` (observed: ${OBSERVE})`}, ${RUNS} runs; node ${process.version}; load ${load0.toFixed(1)} → ${loadavg()[0]!.toFixed(1)}\n`,
    );
    console.log('Medians over the runs.\n');
    console.log(
      '| slots | tasks/s (median, min–max) | worker CPU µs/task (median, min–max) | main thread µs/task | B allocated/task | its backends, CPU µs/task | claims / flushes per task |',
    );
    console.log('| ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
    for (const slots of SLOTS) {
      const rs = results.filter((x) => x.slots === slots);
      const tps = rs.map((x) => x.tasksPerSec);
      const cpu = rs.map((x) => x.cpuUsPerTask);
      const srv = rs.map((x) => x.serverUsPerTask);
      const srvMedian = srv.every((x) => x !== null) ? median(srv as number[]) : null;
      const main = rs.map((x) => x.mainUsPerTask);
      const mainMedian = main.every((x) => x !== null) ? median(main as number[]) : null;
      console.log(
        `| ${slots} | ${Math.round(median(tps))} (${Math.round(Math.min(...tps))}–${Math.round(Math.max(...tps))}) | ${fmt(median(cpu))} (${fmt(Math.min(...cpu))}–${fmt(Math.max(...cpu))}) | ${fmt(mainMedian)} | ${Math.round(median(rs.map((x) => x.allocatedPerTask)))} | ${fmt(srvMedian)} | ${median(rs.map((x) => x.claimsPerTask)).toFixed(4)} / ${median(rs.map((x) => x.flushesPerTask)).toFixed(4)} |`,
      );
    }
    if (args.profile) {
      for (const slots of SLOTS) {
        const file = `bench/results/drain-c${slots}.cpuprofile`;
        const res = await drain(admin, slots, file);
        console.log(
          `\nprofiled c${slots}: ${Math.round(res.tasksPerSec)} tasks/s, ${fmt(res.cpuUsPerTask)} µs CPU/task; wrote ${file}`,
        );
      }
    }
  }
} finally {
  await dropSchema(url, SCHEMA);
  await admin.end();
}
