/**
 * What queue limits, concurrency keys and task type rate limits cost (`npm run bench:limits`): the drain of no-op tasks
 * with and without them, the build before them against this one, and the leader's promotion of a
 * large batch of due deferred rows before and after (promote_lane's per-row task_keys probe).
 *
 *   npm run bench:limits -- [--n 20000] [--reps 5] [--warmup 50000] [--variants a,b,c,d,e,f]
 *                           [--promote-n 100000] [--promote-reps 3] [--keys 1000]
 *
 * Runs on a throwaway cluster of its own with stock settings (bench/cluster.ts), never on the
 * shared server. The build before is BENCH_BERTH_BASE (default /tmp/berth-base/dist/index.js, a
 * checkout of the commit before the limits, built there); this build is dist/ (`npm run build`).
 *
 * Drain variants, each in a schema of its own, interleaved (order rotated per repetition), at
 * each concurrency (slots) of 10 and 50:
 * - a: the base build, no limits;
 * - b: this build, no limits;
 * - c: this build, the queue under a running limit it never reaches (maxRunning 10,000);
 * - d: this build, every task keyed, `--keys` keys (task i has key i mod keys), K = 1;
 * - e: this build, the queue under a rate limit it never reaches (1,000,000 starts a second);
 * - f: this build, the drained task type under a type rate limit it never reaches (1,000,000
 *   starts a second): every start asks the database first (take_type_starts, one a turn).
 * A drain is bench/scenarios.ts's, as `npm run bench` runs it: N tasks enqueued in bulk first,
 * then a worker at its defaults (only `slots` set) is started, and tasks/s = N / (worker start →
 * a read of the database showing every completion recorded). The claim's time is each value the
 * worker's fetcher observes into `berth_claim_seconds` (one fetch: limited claims, the known-lane
 * claim, discovery and its claim, as the worker waits for them), captured unbucketed by wrapping
 * the histogram's observe; only fetches that returned before the last handler started count
 * (the idle fetches after the drain are not part of it).
 *
 * Promotion: a worker that leads maintenance but claims another queue; N tasks enqueued with one
 * `runAt` a few seconds ahead; from that instant, the time until the leader's promoter has
 * promoted all N (its batches counted on the captured `berth_promote_batch_size`), and the
 * promoter's own time (the sum of its batches' `berth_promote_seconds`). Rows: the base build,
 * this build, and this build with `task_keys` already holding N rows of other (later) tasks, so
 * the probe reads a table that is not empty.
 */
import { cpus, loadavg } from 'node:os';
import { mkdirSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';
import type { TaskSpec } from '../src/index.js';
import { startCluster } from './cluster.js';
import { loadConfig } from './config.js';
import { dropSchema, Monitor, recreateDatabase } from './db.js';
import { drain } from './scenarios.js';
import { fmtMs, fmtRate, median, percentile } from './stats.js';
import { berthPending } from './systems/berth-pending.js';
import type { Producer, RunningWorker, SystemAdapter } from './systems/types.js';
import { berthRevision, log, sleep } from './util.js';

type Berth = typeof import('../src/index.js');

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '20000' },
    reps: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '50000' },
    variants: { type: 'string', default: 'a,b,c,d,e,f' },
    keys: { type: 'string', default: '1000' },
    'promote-n': { type: 'string', default: '100000' },
    'promote-reps': { type: 'string', default: '3' },
  },
});
function positiveInt(name: string, raw: string, min = 1): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got "${raw}"`);
  return n;
}
const N = positiveInt('n', values.n);
const REPS = positiveInt('reps', values.reps);
const WARMUP = positiveInt('warmup', values.warmup, 0);
const KEYS = positiveInt('keys', values.keys);
const PROMOTE_N = positiveInt('promote-n', values['promote-n'], 0);
const PROMOTE_REPS = positiveInt('promote-reps', values['promote-reps']);
const wanted = new Set(values.variants.split(',').map((s) => s.trim()));
const CONCURRENCIES = [10, 50] as const;
/** maxRunning of variant c: 200 times the larger slot count, never reached. */
const MAX_RUNNING = 10_000;
/** Variant e's rate: far above any drain this machine runs (40-60k tasks/s at best). */
const RATE = { limit: 1_000_000, intervalMs: 1000 };

// The path is a variable so that typechecking never needs dist/ (as in systems/berth.ts).
const currentEntry = '../dist/index.js';
const current = (await import(currentEntry)) as Berth;
const basePath = resolve(process.env.BENCH_BERTH_BASE || '/tmp/berth-base/dist/index.js');
const base = (await import(pathToFileURL(basePath).href)) as Berth;

const silent = pino({ level: 'silent' });
const ACTOR = 'bench:limits';

interface Variant {
  id: string;
  label: string;
  berth: Berth;
  schema: string;
  /** After migrate, before the enqueue. */
  setup?: (db: pg.Pool, schema: string) => Promise<void>;
  /** The task's concurrency key, if keyed. */
  key?: (i: number) => string;
}

/**
 * A queue limit set before the queue's first task: set_queue_limit wants the queue to exist (a
 * lane or a pause), so the queue is paused around it; lanes opened later are limited from their
 * first entry (provision_lane reads queue_limits).
 */
async function limitQueue(db: pg.Pool, schema: string, change: Parameters<Berth['setQueueLimit']>[3]) {
  await current.pauseQueue(db, schema, 'default', ACTOR);
  await current.setQueueLimit(db, schema, 'default', change, ACTOR);
  await current.resumeQueue(db, schema, 'default', ACTOR);
}

const allVariants: Variant[] = [
  { id: 'a', label: 'a: base build, no limits', berth: base, schema: 'lim_a' },
  { id: 'b', label: 'b: this build, no limits', berth: current, schema: 'lim_b' },
  {
    id: 'c',
    label: `c: maxRunning ${MAX_RUNNING.toLocaleString('en-US')} (never reached)`,
    berth: current,
    schema: 'lim_c',
    setup: (db, s) => limitQueue(db, s, { maxRunning: MAX_RUNNING }),
  },
  {
    id: 'd',
    label: `d: ${KEYS.toLocaleString('en-US')} concurrency keys, K = 1`,
    berth: current,
    schema: 'lim_d',
    setup: (db, s) => current.setKeyLimit(db, s, { queue: 'default' }, 1, ACTOR),
    key: (i) => `k${i % KEYS}`,
  },
  {
    id: 'e',
    label: `e: rate ${RATE.limit.toLocaleString('en-US')}/s (never reached)`,
    berth: current,
    schema: 'lim_e',
    setup: (db, s) => limitQueue(db, s, { rate: RATE }),
  },
  {
    id: 'f',
    label: `f: type rate ${RATE.limit.toLocaleString('en-US')}/s (never reached)`,
    berth: current,
    schema: 'lim_f',
    // The drained type itself: every start asks take_type_starts (one statement a turn).
    setup: async (db, s) => {
      await current.setTypeLimit(db, s, 'noop', RATE, ACTOR);
    },
  },
];
const variants = allVariants.filter((v) => wanted.has(v.id));
if (variants.length === 0) throw new Error(`--variants names none of a,b,c,d,e,f: "${values.variants}"`);

/** What one drain's worker saw, beyond what scenarios.drain returns. */
interface Seen {
  /** [end (performance.now()), duration ms] of each fetch. */
  claims: [number, number][];
  workerStart: number;
  firstRun: number;
  lastRun: number;
}

/** Replace a histogram's observe with one that also hands each plain value to `sink`. */
function tap(h: { observe(...args: never[]): void }, sink: (value: number) => void): void {
  const original = h.observe.bind(h) as (...args: unknown[]) => void;
  (h as { observe: (...args: unknown[]) => void }).observe = (...args: unknown[]) => {
    const v = typeof args[0] === 'number' ? args[0] : args[1];
    if (typeof v === 'number') sink(v);
    original(...args);
  };
}

function adapterFor(v: Variant, url: string, seen: Seen): SystemAdapter {
  const { BerthMetrics, defineTask, enqueueMany, migrate, Worker } = v.berth;
  return {
    label: v.label,
    settings: `Worker({ slots, logger: silent, metrics }), everything else default; schema \`${v.schema}\``,
    async reset() {
      await dropSchema(url, v.schema);
      await migrate({ connectionString: url, schema: v.schema });
      if (v.setup) {
        const db = new pg.Pool({ connectionString: url, max: 1 });
        try {
          await v.setup(db, v.schema);
        } finally {
          await db.end();
        }
      }
    },
    async openProducer(): Promise<Producer> {
      const pool = new pg.Pool({ connectionString: url });
      pool.on('error', () => {});
      await pool.query('SELECT 1');
      return {
        async bulk(start, count) {
          const specs: TaskSpec[] = [];
          for (let i = start; i < start + count; i++)
            specs.push(
              v.key ? { type: 'noop', payload: { i }, concurrencyKey: v.key(i) } : { type: 'noop', payload: { i } },
            );
          await enqueueMany(pool, specs, { schema: v.schema });
        },
        async single(i) {
          await enqueueMany(pool, [{ type: 'noop', payload: { i } }], { schema: v.schema });
        },
        close: () => pool.end(),
      };
    },
    async startWorker(concurrency, runs): Promise<RunningWorker> {
      seen.claims = [];
      seen.firstRun = Number.NaN;
      seen.lastRun = Number.NaN;
      const metrics = new BerthMetrics();
      tap(metrics.claimSeconds, (s) => seen.claims.push([performance.now(), s * 1000]));
      const noop = defineTask<{ i: number }>({
        type: 'noop',
        ceilingMs: 60_000,
        handler: async (payload) => {
          const now = performance.now();
          if (Number.isNaN(seen.firstRun)) seen.firstRun = now;
          seen.lastRun = now;
          runs.record(payload.i);
        },
      });
      seen.workerStart = performance.now();
      const worker = new Worker({
        connectionString: url,
        schema: v.schema,
        tasks: [noop],
        slots: concurrency,
        logger: silent,
        metrics,
      });
      await worker.start();
      return { stop: () => worker.stop() };
    },
    pending: (db) => berthPending(db, v.schema),
  };
}

interface DrainRow {
  tasksPerSec: number[];
  claimP50: number[];
  claimP99: number[];
  claimCalls: number[];
  firstStartMs: number[];
  tailMs: number[];
  walPerTask: number[];
  commitsPerTask: number[];
  failures: string[];
}
const emptyRow = (): DrainRow => ({
  tasksPerSec: [],
  claimP50: [],
  claimP99: [],
  claimCalls: [],
  firstStartMs: [],
  tailMs: [],
  walPerTask: [],
  commitsPerTask: [],
  failures: [],
});

/** Load average sampled through the run (1-minute), for the report. */
const loads: number[] = [];
const loadTimer = setInterval(() => loads.push(loadavg()[0]!), 5000);
loadTimer.unref();

const started = Date.now();
const loadStart = loadavg();
const cluster = await startCluster({ settings: {} });
log(`own cluster on 127.0.0.1:${cluster.port}; base build ${basePath}`);
// A keyed drain runs at a few hundred tasks a second on this machine (its admissions, not its
// claims, bound it), so a drain may take minutes: 600 s unless BENCH_TIMEOUT_S says otherwise.
const cfg = {
  ...loadConfig(cluster.url),
  drainN: N,
  ...(process.env.BENCH_TIMEOUT_S ? {} : { drainTimeoutMs: 600_000 }),
};
await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
const url = cfg.benchUrl;
const monitor = await Monitor.open(url);
const serverVersion = (await monitor.serverInfo()).version;

const seen: Seen = { claims: [], workerStart: 0, firstRun: Number.NaN, lastRun: Number.NaN };
const adapters = new Map(variants.map((v) => [v.id, adapterFor(v, url, seen)]));
const rows = new Map<string, DrainRow>();
for (const v of variants) for (const c of CONCURRENCIES) rows.set(`${v.id}/${c}`, emptyRow());

if (WARMUP > 0) {
  log(`warm-up: each variant drains ${WARMUP.toLocaleString('en-US')} tasks at c10, unrecorded`);
  for (const v of variants) {
    // At most 20 s each (as run.ts's 15 s): the keyed variant stops part way, its code warm.
    const o = await drain(adapters.get(v.id)!, monitor, { ...cfg, drainN: WARMUP, drainTimeoutMs: 20_000 }, 10);
    log(`  ${v.label}: ${o.ok ? `${Math.round(o.value.tasksPerSec)} tasks/s` : `stopped (${o.note})`}`);
  }
}

for (let rep = 0; rep < REPS; rep++) {
  const order = variants.map((_, i) => variants[(i + rep) % variants.length]!);
  for (const c of CONCURRENCIES) {
    log(`rep ${rep + 1}/${REPS}: drain c${c}`);
    for (const v of order) {
      const row = rows.get(`${v.id}/${c}`)!;
      const o = await drain(adapters.get(v.id)!, monitor, cfg, c);
      if (!o.ok) {
        row.failures.push(o.note);
        log(`  ${v.label} c${c}: ${o.timeout ? 'timeout' : 'error'} ${o.note}`);
        continue;
      }
      const claims = seen.claims.filter(([end]) => end <= seen.lastRun).map(([, ms]) => ms);
      const p50 = percentile(claims, 50);
      const p99 = percentile(claims, 99);
      row.tasksPerSec.push(o.value.tasksPerSec);
      row.claimP50.push(p50);
      row.claimP99.push(p99);
      row.claimCalls.push(claims.length);
      row.firstStartMs.push(seen.firstRun - seen.workerStart);
      row.tailMs.push(o.value.tailMs);
      row.walPerTask.push((o.value.cost.ownWalBytes ?? o.value.cost.walBytes) / N);
      row.commitsPerTask.push(o.value.cost.commits / N);
      log(
        `  ${v.label} c${c}: ${Math.round(o.value.tasksPerSec)} tasks/s; ${claims.length} claims, ` +
          `p50 ${p50.toFixed(2)} / p99 ${p99.toFixed(2)} ms; first start ${Math.round(seen.firstRun - seen.workerStart)} ms; ` +
          `WAL ${Math.round((o.value.cost.ownWalBytes ?? o.value.cost.walBytes) / N)} B/task`,
      );
    }
  }
}

/** One promotion measurement. */
interface PromoteRun {
  wallMs: number;
  busyMs: number;
  batches: number;
}

interface PromoteVariant {
  label: string;
  berth: Berth;
  schema: string;
  /** Fill task_keys with this many rows of other tasks (due in a day) first. */
  keyedRows: number;
}

/**
 * One run: a leader that claims only the queue `elsewhere`; PROMOTE_N tasks of `default` due
 * together a few seconds ahead; time from that instant to the last of them promoted.
 */
async function promoteOnce(p: PromoteVariant, leadMs: number): Promise<PromoteRun | 'late'> {
  const { BerthMetrics, defineTask, enqueueMany, migrate, Worker } = p.berth;
  await dropSchema(url, p.schema);
  await migrate({ connectionString: url, schema: p.schema });
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  pool.on('error', () => {});
  try {
    if (p.keyedRows > 0) {
      const later = new Date(Date.now() + 86_400_000);
      for (let start = 0; start < p.keyedRows; start += 1000) {
        const specs: TaskSpec[] = [];
        for (let i = start; i < Math.min(p.keyedRows, start + 1000); i++)
          specs.push({ type: 'noop', payload: { i }, queue: 'later', runAt: later, concurrencyKey: `k${i % 1000}` });
        await enqueueMany(pool, specs, { schema: p.schema });
      }
    }
    const batches: { at: number; size: number; ms: number }[] = [];
    const metrics = new BerthMetrics();
    let size = 0;
    // recordBatch observes the size, then the seconds: pair them in that order.
    tap(metrics.promoteBatchSize, (n) => {
      size = n;
    });
    tap(metrics.promoteSeconds, (s) => batches.push({ at: performance.now(), size, ms: s * 1000 }));
    const elsewhere = defineTask<Record<string, never>>({
      type: 'elsewhere',
      queue: 'elsewhere',
      ceilingMs: 60_000,
      handler: async () => {},
    });
    const worker = new Worker({
      connectionString: url,
      schema: p.schema,
      tasks: [elsewhere],
      slots: 1,
      logger: silent,
      metrics,
    });
    await worker.start();
    try {
      const electBy = performance.now() + 30_000;
      while (!worker.isLeader) {
        if (performance.now() > electBy) throw new Error('the worker did not become the maintenance leader in 30 s');
        await sleep(20);
      }
      const dueAt = Date.now() + leadMs;
      const runAt = new Date(dueAt);
      for (let start = 0; start < PROMOTE_N; start += 1000) {
        const specs: TaskSpec[] = [];
        for (let i = start; i < Math.min(PROMOTE_N, start + 1000); i++)
          specs.push({ type: 'noop', payload: { i }, runAt });
        await enqueueMany(pool, specs, { schema: p.schema });
      }
      // Every row must be written before any is due, or the promoter starts on a partial set.
      if (Date.now() > dueAt - 500) return 'late';
      await sleep(dueAt - Date.now());
      const t0 = performance.now() - (Date.now() - dueAt);
      const first = batches.length;
      let promoted = 0;
      let doneAt = Number.NaN;
      const deadline = performance.now() + 120_000;
      while (Number.isNaN(doneAt)) {
        if (performance.now() > deadline) throw new Error(`promotion unfinished after 120 s (${promoted} promoted)`);
        await sleep(5);
        promoted = 0;
        for (const b of batches.slice(first)) {
          promoted += b.size;
          if (promoted >= PROMOTE_N) {
            doneAt = b.at;
            break;
          }
        }
      }
      const mine = batches.slice(first).filter((b) => b.at <= doneAt);
      const left = await pool.query<{ n: string }>(
        `SELECT count(*)::text AS n FROM "${p.schema}".deferred WHERE queue = 'default'`,
      );
      if (Number(left.rows[0]!.n) !== 0) throw new Error(`${left.rows[0]!.n} rows still deferred after promotion`);
      return { wallMs: doneAt - t0, busyMs: mine.reduce((s, b) => s + b.ms, 0), batches: mine.length };
    } finally {
      await worker.stop();
    }
  } finally {
    await pool.end();
  }
}

const promoteVariants: PromoteVariant[] = [
  { label: 'base build', berth: base, schema: 'lim_p_base', keyedRows: 0 },
  { label: 'this build', berth: current, schema: 'lim_p_new', keyedRows: 0 },
  {
    label: `this build, task_keys holding ${PROMOTE_N.toLocaleString('en-US')} rows of other tasks`,
    berth: current,
    schema: 'lim_p_keyed',
    keyedRows: PROMOTE_N,
  },
];
const promoteRuns = new Map<string, PromoteRun[]>(promoteVariants.map((p) => [p.label, []]));
if (PROMOTE_N > 0) {
  for (let rep = 0; rep < PROMOTE_REPS; rep++) {
    log(`promotion rep ${rep + 1}/${PROMOTE_REPS}: ${PROMOTE_N.toLocaleString('en-US')} deferred rows due at once`);
    const order = promoteVariants.map((_, i) => promoteVariants[(i + rep) % promoteVariants.length]!);
    for (const p of order) {
      let leadMs = Math.max(5000, PROMOTE_N / 10);
      let r = await promoteOnce(p, leadMs);
      while (r === 'late' && leadMs < 120_000) {
        leadMs *= 2;
        log(`  ${p.label}: the enqueue outlasted the lead; again with ${leadMs} ms`);
        r = await promoteOnce(p, leadMs);
      }
      if (r === 'late') throw new Error('the enqueue never finished within the lead');
      promoteRuns.get(p.label)!.push(r);
      log(
        `  ${p.label}: all promoted ${Math.round(r.wallMs)} ms after due; promoter busy ${Math.round(r.busyMs)} ms in ${r.batches} batches`,
      );
    }
  }
}

await monitor.close();
await cluster.stop();
clearInterval(loadTimer);
const loadEnd = loadavg();

const cell = (xs: number[], fmt: (x: number) => string) =>
  xs.length === 0
    ? '–'
    : xs.length === 1
      ? fmt(xs[0]!)
      : `${fmt(median(xs))} (${fmt(Math.min(...xs))}–${fmt(Math.max(...xs))})`;
const ms2 = (x: number) => x.toFixed(2);
const int = (x: number) => Math.round(x).toLocaleString('en-US');
const loadStr = (l: number[]) => l.map((x) => x.toFixed(2)).join(' / ');
const lines: string[] = [
  `# Queue limits and concurrency keys: what they cost — ${new Date().toISOString()}`,
  '',
  `Command: \`npm run bench:limits -- --n ${N} --reps ${REPS} --warmup ${WARMUP} --variants ${variants.map((v) => v.id).join(',')} ` +
    `--keys ${KEYS} --promote-n ${PROMOTE_N} --promote-reps ${PROMOTE_REPS}\` · total ${Math.round((Date.now() - started) / 1000)} s`,
  '',
  `Node ${process.version}, ${cpus().length} CPUs · PostgreSQL ${serverVersion}, own cluster (initdb, stock settings) · ` +
    `this build: berth ${berthRevision()} dist/ · base: ${basePath}`,
  '',
  `Load average (1 / 5 / 15 min): ${loadStr(loadStart)} at start, ${loadStr(loadEnd)} at end; 1-min samples every 5 s: ` +
    `median ${median(loads).toFixed(2)}, max ${loads.length ? Math.max(...loads).toFixed(2) : '–'}.`,
  '',
  `Drain of ${N.toLocaleString('en-US')} no-op tasks, ${REPS} repetitions interleaved; each cell median (min–max). ` +
    'Claim: each fetch as the worker times it into `berth_claim_seconds`, unbucketed; per drain the p50 and p99 of its ' +
    'fetches, then the median of those over the repetitions.',
  '',
  '| variant | slots | tasks/s | claims / drain | claim p50 ms | claim p99 ms | first start ms | WAL B/task | commits/task |',
  '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
];
for (const c of CONCURRENCIES)
  for (const v of variants) {
    const r = rows.get(`${v.id}/${c}`)!;
    const fail = r.failures.length > 0 ? ` (${r.failures.length} failed: ${r.failures[0]})` : '';
    lines.push(
      `| ${v.label}${fail} | ${c} | ${cell(r.tasksPerSec, fmtRate)} | ${cell(r.claimCalls, int)} | ${cell(r.claimP50, ms2)} | ` +
        `${cell(r.claimP99, ms2)} | ${cell(r.firstStartMs, fmtMs)} | ${cell(r.walPerTask, int)} | ${cell(r.commitsPerTask, (x) => x.toFixed(3))} |`,
    );
  }
if (PROMOTE_N > 0) {
  lines.push(
    '',
    `Promotion of ${PROMOTE_N.toLocaleString('en-US')} deferred rows due at one instant, ${PROMOTE_REPS} repetitions interleaved; ` +
      'median (min–max):',
    '',
    '| build | due → all promoted ms | promoter busy ms | rows/s while busy | batches |',
    '| --- | ---: | ---: | ---: | ---: |',
  );
  for (const p of promoteVariants) {
    const r = promoteRuns.get(p.label)!;
    lines.push(
      `| ${p.label} | ${cell(
        r.map((x) => x.wallMs),
        int,
      )} | ${cell(
        r.map((x) => x.busyMs),
        int,
      )} | ${cell(
        r.map((x) => PROMOTE_N / (x.busyMs / 1000)),
        fmtRate,
      )} | ${cell(
        r.map((x) => x.batches),
        int,
      )} |`,
    );
  }
}
const report = `${lines.join('\n')}\n`;
mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
writeFileSync(new URL('./results/limits-latest.md', import.meta.url), report);
process.stdout.write(report);
log(`done in ${Math.round((Date.now() - started) / 1000)} s; report in bench/results/limits-latest.md`);
