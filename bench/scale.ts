/**
 * Seed 000: "Fleet capacity is replicas x slots, and adding a replica adds throughput."
 *
 *   npm run bench:scale        (BENCH_DATABASE_URL, default the local server; SCALE_REPS, default 3)
 *
 * For N = 1, 2, 4 worker PROCESSES (separate node processes forked from this file, each a berth
 * Worker with 4 slots and maintenance on, so one of them is elected leader), drain one workload
 * from a freshly installed schema in a dedicated database (`berth_scale`) and report tasks/s:
 *
 *   slot-bound  2,000 tasks whose handler sleeps 50 ms (honouring ctx.signal): the seed's
 *               ceiling is N × 4 slots / 0.05 s = 80 × N tasks/s;
 *   no-op       20,000 tasks whose handler does nothing: bound by PostgreSQL and CPU.
 *
 * The fleet is started and idle (leader elected) before the workload is enqueued in ONE
 * transaction, spread over the 16 default shards (shard = i % 16, which is what many small
 * producing transactions do; one big transaction at the default would put every task in one
 * lane). Window: from just before that COMMIT to the last handler's return, across processes
 * (wall clock). Each configuration runs SCALE_REPS times, configurations interleaved (N order
 * rotated per repetition); the table shows the median (min–max). After each run the fleet is
 * stopped and the schema is checked: nothing pending, nothing dead, no handler re-runs.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { pino } from 'pino';
import { defineTask, enqueueMany, migrate, Worker, type TaskSpec } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { quoteIdent, recreateDatabase } from './db.js';
import { berthRevision } from './util.js';

const SCHEMA = 'berth_scale';
const SLOTS = 4;
const SLEEP_MS = 50;
const SHARDS = 16;
const PROGRESS_MS = 20;

type WorkloadName = 'slot-bound' | 'no-op';
interface Workload {
  name: WorkloadName;
  type: string;
  n: number;
  /** Tasks/s the seed's rule allows: N × slots / handler time (slot-bound only). */
  ceiling(processes: number): number | null;
}
const WORKLOADS: Workload[] = [
  { name: 'slot-bound', type: 'sleep50', n: 2_000, ceiling: (p) => (p * SLOTS * 1000) / SLEEP_MS },
  { name: 'no-op', type: 'noop', n: 20_000, ceiling: () => null },
];
const FLEETS = [1, 2, 4];

/** What a worker process reports over IPC. */
interface Progress {
  kind: 'progress';
  /** Handler runs that returned, and the wall-clock ms of the latest return. */
  done: number;
  lastAt: number;
  leader: boolean;
  /** CPU time (user + system) this process has used, ms. */
  cpuMs: number;
}
type ChildMessage = { kind: 'ready' } | Progress | { kind: 'stopped'; done: number; leader: boolean };

const wallNow = (): number => performance.timeOrigin + performance.now();

/** Busy and total CPU jiffies of the whole machine (Linux /proc/stat); null elsewhere. */
function machineCpu(): { busy: number; total: number } | null {
  try {
    const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
    const total = f.reduce((a, x) => a + x, 0);
    const idle = f[3]! + (f[4] ?? 0);
    return { busy: total - idle, total };
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------------------------
// Worker process (this file, forked with SCALE_CHILD=1)
// ---------------------------------------------------------------------------------------------

async function child(): Promise<void> {
  const send = (m: ChildMessage) => process.send!(m);
  let done = 0;
  let lastAt = 0;
  const finished = () => {
    done++;
    lastAt = wallNow();
  };
  const sleep50 = defineTask<{ i: number }>({
    type: 'sleep50',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      await delay(SLEEP_MS, undefined, { signal: ctx.signal });
      finished();
    },
  });
  const noop = defineTask<{ i: number }>({ type: 'noop', ceilingMs: 60_000, handler: async () => finished() });
  const worker = new Worker({
    connectionString: process.env.SCALE_URL!,
    schema: SCHEMA,
    tasks: [sleep50, noop],
    slots: SLOTS,
    workerId: process.env.SCALE_WORKER_ID,
    logger: pino({ level: 'silent' }),
    maintenance: true,
  });
  await worker.start();
  send({ kind: 'ready' });
  const cpuMs = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1000;
  };
  const ticker = setInterval(
    () => send({ kind: 'progress', done, lastAt, leader: worker.isLeader, cpuMs: cpuMs() }),
    PROGRESS_MS,
  );
  process.on('message', async (m) => {
    if (m !== 'stop') return;
    clearInterval(ticker);
    const leader = worker.isLeader;
    await worker.stop();
    send({ kind: 'stopped', done, leader });
    process.disconnect();
  });
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

interface Fleet {
  children: ChildProcess[];
  latest: Progress[];
}

function log(message: string): void {
  process.stderr.write(`[scale ${new Date().toISOString().slice(11, 19)}] ${message}\n`);
}

async function startFleet(url: string, processes: number): Promise<Fleet> {
  const file = fileURLToPath(import.meta.url);
  const latest: Progress[] = Array.from({ length: processes }, () => ({
    kind: 'progress',
    done: 0,
    lastAt: 0,
    leader: false,
    cpuMs: 0,
  }));
  const children = await Promise.all(
    Array.from({ length: processes }, (_, k) => {
      const c = fork(file, [], {
        execArgv: ['--import', 'tsx'],
        env: { ...process.env, SCALE_CHILD: '1', SCALE_URL: url, SCALE_WORKER_ID: `scale-w${k + 1}` },
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      });
      c.on('message', (m: ChildMessage) => {
        if (m.kind === 'progress') latest[k] = m;
      });
      return new Promise<ChildProcess>((resolve, reject) => {
        const early = (code: number | null) => reject(new Error(`worker process ${k + 1} exited early (${code})`));
        c.once('exit', early);
        c.once('message', () => {
          c.off('exit', early);
          resolve(c);
        });
      });
    }),
  );
  return { children, latest };
}

async function stopFleet(fleet: Fleet): Promise<{ done: number; leaders: number }> {
  const finals = await Promise.all(
    fleet.children.map(
      (c) =>
        new Promise<{ done: number; leader: boolean }>((resolve) => {
          const kill = setTimeout(() => c.kill('SIGKILL'), 30_000);
          c.on('message', (m: ChildMessage) => {
            if (m.kind === 'stopped') resolve(m);
          });
          c.once('exit', () => {
            clearTimeout(kill);
            resolve({ done: NaN, leader: false });
          });
          c.send('stop');
        }),
    ),
  );
  await Promise.all(
    fleet.children.map((c) =>
      c.exitCode === null && c.signalCode === null ? new Promise((r) => c.once('exit', r)) : null,
    ),
  );
  return { done: finals.reduce((a, f) => a + f.done, 0), leaders: finals.filter((f) => f.leader).length };
}

interface RunResult {
  tasksPerSec: number | null;
  /** CPU the worker processes used in the window, in cores (CPU seconds / wall seconds). */
  workerCores: number | null;
  /** Whole-machine busy CPU in the window, in cores (every process: PostgreSQL, workers, anything else). */
  machineCores: number | null;
  /** Committed transactions in the database from just before the enqueue to the fleet's exit, per task. */
  xactPerTask: number;
  note: string;
  perProcess: number[];
}

async function runOnce(url: string, w: Workload, processes: number): Promise<RunResult> {
  const admin = new pg.Pool({ connectionString: url, max: 2 });
  admin.on('error', () => {});
  await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(SCHEMA)} CASCADE`);
  await migrate({ connectionString: url, schema: SCHEMA });
  const specs: TaskSpec[] = Array.from({ length: w.n }, (_, i) => ({
    type: w.type,
    payload: { i },
    shard: i % SHARDS,
  }));

  const fleet = await startFleet(url, processes);
  let note = '';
  let tasksPerSec: number | null = null;
  try {
    // Maintenance on in every process: wait until exactly one of them holds the leadership.
    const electedBy = Date.now() + 15_000;
    while (fleet.latest.filter((p) => p.leader).length !== 1 && Date.now() < electedBy) await delay(20);
    const leadersBefore = fleet.latest.filter((p) => p.leader).length;
    if (leadersBefore !== 1) note += `${leadersBefore} leaders before the run; `;

    const commits = async () =>
      Number(
        (await admin.query(`SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = current_database()`))
          .rows[0].n,
      );
    const xact0 = await commits();
    const c = await admin.connect();
    let t0: number;
    const cpu = () => fleet.latest.reduce((a, p) => a + p.cpuMs, 0);
    let cpu0: number;
    let m0: { busy: number; total: number } | null;
    try {
      await c.query('BEGIN');
      await enqueueMany(c, specs, { schema: SCHEMA });
      cpu0 = cpu();
      m0 = machineCpu();
      t0 = wallNow();
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    const deadline = Date.now() + 120_000;
    const total = () => fleet.latest.reduce((a, p) => a + p.done, 0);
    while (total() < w.n && Date.now() < deadline) await delay(5);
    const perProcess = fleet.latest.map((p) => p.done);
    let workerCores: number | null = null;
    let machineCores: number | null = null;
    if (total() >= w.n) {
      const end = Math.max(...fleet.latest.map((p) => p.lastAt));
      tasksPerSec = w.n / ((end - t0) / 1000);
      // Progress arrives every 20 ms, so the CPU figure covers roughly the same window.
      workerCores = (cpu() - cpu0) / (wallNow() - t0);
      const m1 = machineCpu();
      if (m0 && m1 && m1.total > m0.total) machineCores = (cpus().length * (m1.busy - m0.busy)) / (m1.total - m0.total);
    } else {
      note += `timeout: ${total()}/${w.n} in 120 s; `;
    }
    const stopped = await stopFleet(fleet);
    if (stopped.leaders !== 1) note += `${stopped.leaders} leaders at the end; `;
    if (stopped.done > w.n) note += `${stopped.done - w.n} handler re-runs; `;
    // The workers' backends flushed their counters when they exited; the admin pool's flush within a second.
    await delay(1100);
    const xactPerTask = ((await commits()) - xact0) / w.n;
    const g = await readGauges(admin, SCHEMA);
    const pending = g.pending.get(w.type) ?? 0;
    const dead = g.dead.get(w.type) ?? 0;
    if (pending > 0 || dead > 0) note += `${pending} pending, ${dead} dead after stop; `;
    return { tasksPerSec, workerCores, machineCores, xactPerTask, note: note.replace(/; $/, ''), perProcess };
  } finally {
    for (const ch of fleet.children) if (ch.exitCode === null && ch.signalCode === null) ch.kill('SIGKILL');
    await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(SCHEMA)} CASCADE`).catch(() => {});
    await admin.end();
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const int = (x: number): string => Math.round(x).toLocaleString('en-US');

async function driver(): Promise<void> {
  const reps = Number(process.env.SCALE_REPS ?? 3);
  if (!Number.isInteger(reps) || reps < 1)
    throw new Error(`SCALE_REPS must be a positive integer, got "${process.env.SCALE_REPS}"`);
  const adminUrl = process.env.BENCH_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test';
  const u = new URL(adminUrl);
  u.pathname = '/berth_scale';
  const url = u.toString();
  const started = Date.now();
  const revision = berthRevision();
  await recreateDatabase(adminUrl, 'berth_scale');
  const mon = new pg.Client({ connectionString: url });
  await mon.connect();
  const pgVersion = (await mon.query('SHOW server_version')).rows[0].server_version as string;
  const otherCommits = async () => {
    await mon.query('SELECT pg_stat_clear_snapshot()');
    const r = await mon.query(
      `SELECT coalesce(sum(xact_commit), 0)::text AS n FROM pg_stat_database WHERE datname IS DISTINCT FROM current_database()`,
    );
    return Number(r.rows[0].n);
  };
  const other0 = await otherCommits();
  const load0 = loadavg()[0]!;

  const results = new Map<string, number[]>();
  const cores = new Map<string, number[]>();
  const machine = new Map<string, number[]>();
  const xact = new Map<string, number[]>();
  const notes: string[] = [];
  for (let rep = 0; rep < reps; rep++) {
    const order = FLEETS.map((_, i) => FLEETS[(i + rep) % FLEETS.length]!);
    for (const w of WORKLOADS) {
      for (const n of order) {
        const r = await runOnce(url, w, n);
        const key = `${w.name}/${n}`;
        if (r.tasksPerSec !== null) results.set(key, [...(results.get(key) ?? []), r.tasksPerSec]);
        if (r.workerCores !== null) cores.set(key, [...(cores.get(key) ?? []), r.workerCores]);
        xact.set(key, [...(xact.get(key) ?? []), r.xactPerTask]);
        if (r.machineCores !== null) machine.set(key, [...(machine.get(key) ?? []), r.machineCores]);
        if (r.note) notes.push(`${w.name}, N=${n}, rep ${rep + 1}: ${r.note}`);
        log(
          `rep ${rep + 1}/${reps} ${w.name} N=${n}: ${r.tasksPerSec === null ? 'no result' : `${int(r.tasksPerSec)} tasks/s`}` +
            ` (per process ${r.perProcess.join('/')}; worker CPU ${r.workerCores?.toFixed(2) ?? '?'} / machine ${r.machineCores?.toFixed(2) ?? '?'} cores; ${r.xactPerTask.toFixed(3)} xact/task; load ${loadavg()[0]!.toFixed(2)})${r.note ? `; ${r.note}` : ''}`,
        );
      }
    }
  }
  const other1 = await otherCommits();
  await mon.end();

  const rows: string[] = [];
  for (const w of WORKLOADS) {
    const base = results.get(`${w.name}/1`);
    for (const n of FLEETS) {
      const xs = results.get(`${w.name}/${n}`) ?? [];
      const ceiling = w.ceiling(n);
      const cell = xs.length ? `${int(median(xs))} (${int(Math.min(...xs))}–${int(Math.max(...xs))})` : 'no result';
      const ofCeiling = ceiling !== null && xs.length ? ` (${Math.round((100 * median(xs)) / ceiling)}%)` : '';
      const ratio = base?.length && xs.length ? `${(median(xs) / median(base)).toFixed(2)}×` : '–';
      const cs = cores.get(`${w.name}/${n}`) ?? [];
      const ms = machine.get(`${w.name}/${n}`) ?? [];
      const xs2 = xact.get(`${w.name}/${n}`) ?? [];
      const cpuCell =
        `${cs.length ? median(cs).toFixed(2) : '–'} | ${ms.length ? median(ms).toFixed(2) : '–'} | ` +
        `${xs2.length ? median(xs2).toFixed(3) : '–'}`;
      rows.push(
        `| ${n} | ${w.name} (${w.n.toLocaleString('en-US')} tasks) | ${cell} | ${ceiling === null ? '–' : `${int(ceiling)}${ofCeiling}`} | ${ratio} | ${cpuCell} |`,
      );
    }
  }
  const seconds = Math.round((Date.now() - started) / 1000);
  const report = [
    `# Adding worker processes (seed 000) — ${new Date().toISOString()}`,
    '',
    `Command: \`${process.env.SCALE_REPS ? `SCALE_REPS=${reps} ` : ''}npm run bench:scale\` · ${reps} repetitions, N order rotated per repetition · total ${seconds} s`,
    '',
    `Node ${process.version}, ${cpus().length} CPUs · PostgreSQL ${pgVersion} · berth ${revision} · database \`berth_scale\` · ` +
      `${SLOTS} slots per process, maintenance on · cells: median (min–max) tasks/s`,
    '',
    '| worker processes (N) | workload | tasks/s | expected ceiling (N × 4 / 0.05 s) | ratio to N=1 | worker CPU (cores) | machine CPU busy (cores) | transactions/task |',
    '| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...rows,
    '',
    'CPU columns (medians): worker CPU is the user + system CPU of all worker processes over the drain window divided by ' +
      `its length; machine CPU busy is the whole machine's non-idle time from /proc/stat over the same window, out of ${cpus().length} ` +
      'cores (PostgreSQL, the workers and anything else running). transactions/task: `xact_commit` of the bench database ' +
      'from just before the enqueue until the fleet has exited (enqueue, claims, settlements, maintenance, heartbeats; ' +
      'read-only transactions included), divided by the task count.',
    '',
    `Background: other databases committed ${(other1 - other0).toLocaleString('en-US')} transactions during the run; ` +
      `1-min load average ${load0.toFixed(2)} at start, ${loadavg()[0]!.toFixed(2)} at end.`,
    ...(notes.length ? ['', 'Notes:', ...notes.map((n) => `- ${n}`)] : []),
  ].join('\n');
  console.log(report);
  mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
  writeFileSync(new URL('./results/scale.md', import.meta.url), `${report}\n`);
}

if (process.env.SCALE_CHILD === '1') {
  await child();
} else {
  await driver().catch((err: unknown) => {
    log(`fatal: ${(err as Error).stack ?? String(err)}`);
    process.exitCode = 1;
  });
}
