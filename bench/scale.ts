/**
 * Seed 000: "Fleet capacity is replicas x slots, and adding a replica adds throughput", and how
 * far one primary goes.
 *
 *   npm run bench:scale
 *
 * Runs on a dedicated PostgreSQL cluster with stock settings, started for the run and removed
 * afterwards (bench/cluster.ts; BENCH_DATABASE_URL targets an existing server instead). For
 * N = 1, 2, 4, 8 worker PROCESSES (separate node processes forked from this file, each a berth
 * Worker with 4 slots and maintenance on, so one of them is elected leader), drain one workload
 * from a freshly installed schema in the database `berth_scale` and report tasks/s:
 *
 *   slot-bound  2,000 tasks whose handler sleeps 50 ms (honouring ctx.signal): the seed's
 *               ceiling is N × 4 slots / 0.05 s = 80 × N tasks/s;
 *   no-op       20,000 tasks whose handler does nothing: bound by PostgreSQL and CPU.
 *
 * Per run it also reports the primary's write commits per second over the drain (transaction
 * ids consumed: exact and immediate, where pg_stat_database's xact_commit is flushed by each
 * backend up to a second late, too coarse for a drain of two seconds), the transactions per task
 * (xact_commit, read once the fleet has exited), CPU, and the connections each process held at
 * once (pg_stat_activity by application_name, bench/scale-connections.ts) against the pools' sizes
 * in src/process/worker.ts. A pgbench write ceiling is measured in the same run, before the
 * first and after the last fleet (bench/pgbench-ceiling.ts).
 *
 * The fleet is started and idle (leader elected) before the workload is enqueued in ONE
 * transaction, spread over the 16 default shards (shard = i % 16, which is what many small
 * producing transactions do; one big transaction at the default would put every task in one
 * lane). Window: from just before that COMMIT to the last handler's return, across processes
 * (wall clock). Each configuration runs SCALE_REPS times, configurations interleaved (N order
 * rotated per repetition); the table shows the median (min–max). After each run the fleet is
 * stopped and the schema is checked: nothing pending, nothing dead, no handler re-runs.
 *
 * To shrink a run: SCALE_REPS (default 3), SCALE_FLEETS (default 1,2,4,8), SCALE_WORKLOADS
 * (default slot-bound,no-op), SCALE_SLOT_TASKS (2000), SCALE_NOOP_TASKS (20000),
 * SCALE_PGBENCH_SECONDS (15; 0 skips pgbench).
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { pino } from 'pino';
import { defineTask, enqueueMany, migrate, Worker, type TaskSpec } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { openBenchServer, quoteIdent, recreateDatabase } from './db.js';
import { busyCores, machineCpu, postmasterPid, treeCpuSeconds } from './machine-cpu.js';
import { nextXid, pgbenchCeiling, type PgbenchCeiling } from './pgbench-ceiling.js';
import { ConnectionSampler, ROLES, type Role } from './scale-connections.js';
import { berthRevision } from './util.js';

const DATABASE = 'berth_scale';
const SCHEMA = 'berth_scale';
const SLOTS = 4;
const SLEEP_MS = 50;
const SHARDS = 16;
const PROGRESS_MS = 20;

/**
 * The most sessions one Worker opens on the primary, from src/process/worker.ts: the claim
 * session and the settlement session (pools of one), the shared pool of max(4, ⌈slots / 2⌉ + 4),
 * the LISTEN session and the election session. A read replica adds 2 there, the worker's
 * dashboard 2 more on the primary; this bench uses neither.
 */
const budget = (slots: number) => {
  const worker = 2 + Math.max(4, Math.ceil(slots / 2) + 4);
  return { worker, listen: 1, election: 1, total: worker + 2 };
};

type WorkloadName = 'slot-bound' | 'no-op';
interface Workload {
  name: WorkloadName;
  type: string;
  n: number;
  /** Tasks/s the seed's rule allows: N × slots / handler time (slot-bound only). */
  ceiling(processes: number): number | null;
}

/** A positive integer from the environment, or the default; anything else stops the run. */
function envInt(name: string, fallback: number, min = 1): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got "${raw}"`);
  return n;
}

function envList(name: string, fallback: string): string[] {
  return (process.env[name] || fallback)
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean);
}

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
  const children: ChildProcess[] = [];
  const started = Array.from({ length: processes }, (_, k) => {
    const c = fork(file, [], {
      execArgv: ['--import', 'tsx'],
      env: { ...process.env, SCALE_CHILD: '1', SCALE_URL: url, SCALE_WORKER_ID: `scale-w${k + 1}` },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    children.push(c);
    c.on('message', (m: ChildMessage) => {
      if (m.kind === 'progress') latest[k] = m;
    });
    return new Promise<void>((resolve, reject) => {
      const early = (code: number | null) => reject(new Error(`worker process ${k + 1} exited early (${code})`));
      c.once('exit', early);
      c.once('message', () => {
        c.off('exit', early);
        resolve();
      });
    });
  });
  try {
    await Promise.all(started);
  } catch (err) {
    // One failed to start: the others must not outlive the run.
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    throw err;
  }
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
  /** Transaction ids the server consumed over the drain window, per second (cluster-wide). */
  writeCommitsPerSec: number | null;
  /** CPU the worker processes used in the window, in cores (CPU seconds / wall seconds). */
  workerCores: number | null;
  /** Whole-machine busy CPU in the window, in cores (every process: PostgreSQL, workers, anything else). */
  machineCores: number | null;
  /** CPU of the server's processes (postmaster and backends) in the window, in cores; null on BENCH_DATABASE_URL. */
  serverCores: number | null;
  /** Committed transactions in the database from just before the enqueue to the fleet's exit, per task. */
  xactPerTask: number;
  /** The most sessions one process held at once, and per role. */
  connections: { perProcess: number; byRole: Map<Role, number>; fleet: number };
  note: string;
  perProcess: number[];
}

/** Sessions on the maintenance database that watch the bench database without counting in it. */
interface Watch {
  xid: pg.Client;
  sampler: ConnectionSampler;
  /** The dedicated cluster's postmaster, whose process tree is the server's CPU; null when external. */
  serverPid: number | null;
}

async function runOnce(url: string, watch: Watch, w: Workload, processes: number): Promise<RunResult> {
  const admin = new pg.Pool({ connectionString: url, max: 2, application_name: 'bench-scale-admin' });
  admin.on('error', () => {});
  await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(SCHEMA)} CASCADE`);
  await migrate({ connectionString: url, schema: SCHEMA });
  const specs: TaskSpec[] = Array.from({ length: w.n }, (_, i) => ({
    type: w.type,
    payload: { i },
    shard: i % SHARDS,
  }));

  watch.sampler.start();
  let fleet: Fleet | null = null;
  let note = '';
  let tasksPerSec: number | null = null;
  let writeCommitsPerSec: number | null = null;
  try {
    fleet = await startFleet(url, processes);
    const f = fleet;
    // Maintenance on in every process: wait until exactly one of them holds the leadership.
    const electedBy = Date.now() + 15_000;
    while (f.latest.filter((p) => p.leader).length !== 1 && Date.now() < electedBy) await delay(20);
    const leadersBefore = f.latest.filter((p) => p.leader).length;
    if (leadersBefore !== 1) note += `${leadersBefore} leaders before the run; `;

    const commits = async () =>
      Number(
        (await admin.query(`SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = current_database()`))
          .rows[0].n,
      );
    const xact0 = await commits();
    const c = await admin.connect();
    let t0: number;
    const cpu = () => f.latest.reduce((a, p) => a + p.cpuMs, 0);
    let cpu0: number;
    let m0: ReturnType<typeof machineCpu>;
    let s0: number | null = null;
    let xid0: number;
    try {
      await c.query('BEGIN');
      await enqueueMany(c, specs, { schema: SCHEMA });
      // Read before the COMMIT, so the window misses no transaction of the drain.
      xid0 = await nextXid(watch.xid);
      cpu0 = cpu();
      m0 = machineCpu();
      if (watch.serverPid !== null) s0 = treeCpuSeconds(watch.serverPid);
      t0 = wallNow();
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    const deadline = Date.now() + 120_000;
    const total = () => f.latest.reduce((a, p) => a + p.done, 0);
    while (total() < w.n && Date.now() < deadline) await delay(5);
    const perProcess = f.latest.map((p) => p.done);
    let workerCores: number | null = null;
    let machineCores: number | null = null;
    let serverCores: number | null = null;
    if (total() >= w.n) {
      const xid1 = await nextXid(watch.xid);
      const readAt = wallNow();
      const end = Math.max(...f.latest.map((p) => p.lastAt));
      tasksPerSec = w.n / ((end - t0) / 1000);
      // The counter is read up to one progress interval (20 ms) after the last return.
      writeCommitsPerSec = (xid1 - xid0) / ((readAt - t0) / 1000);
      // Progress arrives every 20 ms, so the CPU figure covers roughly the same window.
      workerCores = (cpu() - cpu0) / (wallNow() - t0);
      machineCores = busyCores(m0, machineCpu());
      const s1 = watch.serverPid === null ? null : treeCpuSeconds(watch.serverPid);
      if (s0 !== null && s1 !== null) serverCores = (s1 - s0) / ((wallNow() - t0) / 1000);
    } else {
      note += `timeout: ${total()}/${w.n} in 120 s; `;
    }
    fleet = null;
    const stopped = await stopFleet(f);
    const peaks = await watch.sampler.stop();
    if (stopped.leaders !== 1) note += `${stopped.leaders} leaders at the end; `;
    if (stopped.done > w.n) note += `${stopped.done - w.n} handler re-runs; `;
    // The workers' backends flushed their counters when they exited; the admin pool's flush within a second.
    await delay(1100);
    const xactPerTask = ((await commits()) - xact0) / w.n;
    const g = await readGauges(admin, SCHEMA);
    const pending = g.pending.get(w.type) ?? 0;
    const dead = g.dead.get(w.type) ?? 0;
    if (pending > 0 || dead > 0) note += `${pending} pending, ${dead} dead after stop; `;
    const perProcessPeak = Math.max(0, ...peaks.perProcess.values());
    if (peaks.perProcess.size !== processes)
      note += `sessions seen for ${peaks.perProcess.size} of ${processes} processes; `;
    if (perProcessPeak > budget(SLOTS).total) note += `a process held ${perProcessPeak} sessions, above the budget; `;
    return {
      tasksPerSec,
      writeCommitsPerSec,
      workerCores,
      machineCores,
      serverCores,
      xactPerTask,
      connections: { perProcess: perProcessPeak, byRole: peaks.byRole, fleet: peaks.fleet },
      note: note.replace(/; $/, ''),
      perProcess,
    };
  } finally {
    await watch.sampler.stop();
    if (fleet) for (const ch of fleet.children) if (ch.exitCode === null && ch.signalCode === null) ch.kill('SIGKILL');
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
const range = (xs: number[]): string =>
  xs.length ? `${int(median(xs))} (${int(Math.min(...xs))}–${int(Math.max(...xs))})` : 'no result';

/** Samples per configuration key ("workload/N"), in run order. */
class Series {
  private readonly m = new Map<string, number[]>();
  add(key: string, x: number | null): void {
    if (x !== null) this.m.set(key, [...(this.m.get(key) ?? []), x]);
  }
  get(key: string): number[] {
    return this.m.get(key) ?? [];
  }
}

async function driver(): Promise<void> {
  const reps = envInt('SCALE_REPS', 3);
  const fleets = envList('SCALE_FLEETS', '1,2,4,8').map((x) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n < 1 || n > 16) throw new Error(`SCALE_FLEETS: "${x}" is not a process count of 1-16`);
    return n;
  });
  const all: Workload[] = [
    {
      name: 'slot-bound',
      type: 'sleep50',
      n: envInt('SCALE_SLOT_TASKS', 2_000),
      ceiling: (p) => (p * SLOTS * 1000) / SLEEP_MS,
    },
    { name: 'no-op', type: 'noop', n: envInt('SCALE_NOOP_TASKS', 20_000), ceiling: () => null },
  ];
  const wanted = envList('SCALE_WORKLOADS', 'slot-bound,no-op');
  for (const x of wanted)
    if (!all.some((w) => w.name === x)) throw new Error(`SCALE_WORKLOADS: unknown workload "${x}" (slot-bound, no-op)`);
  const workloads = all.filter((w) => wanted.includes(w.name));
  const pgbenchSeconds = envInt('SCALE_PGBENCH_SECONDS', 15, 0);

  const started = Date.now();
  const revision = berthRevision();
  const server = await openBenchServer();
  try {
    await measure(server.adminUrl, server.description, {
      reps,
      fleets,
      workloads,
      pgbenchSeconds,
      started,
      revision,
      serverPid: postmasterPid(server.dataDir),
    });
  } finally {
    await server.stop();
  }
}

interface Plan {
  reps: number;
  fleets: number[];
  workloads: Workload[];
  pgbenchSeconds: number;
  started: number;
  revision: string;
  serverPid: number | null;
}

async function ceiling(adminUrl: string, seconds: number, serverPid: number | null): Promise<PgbenchCeiling | null> {
  if (seconds === 0) return null;
  log(`pgbench write ceiling (${seconds} s)`);
  const r = await pgbenchCeiling(adminUrl, {
    binDir: process.env.BENCH_PG_BIN || '/usr/lib/postgresql/15/bin',
    seconds,
    clients: 8,
    threads: 2,
    database: 'berth_scale_pgbench',
    serverPid,
  });
  log(
    `pgbench: ${int(r.tps)} tps, ${int(r.writeXactPerSec)} write commits/s, machine ${r.machineCores?.toFixed(2) ?? '?'} cores, server ${r.serverCores?.toFixed(2) ?? '?'}`,
  );
  return r;
}

async function measure(adminUrl: string, serverDescription: string, plan: Plan): Promise<void> {
  const { reps, fleets, workloads } = plan;
  const u = new URL(adminUrl);
  u.pathname = `/${DATABASE}`;
  const url = u.toString();
  await recreateDatabase(adminUrl, DATABASE);
  const watchClient = new pg.Client({ connectionString: adminUrl, application_name: 'bench-scale-watch' });
  const sampleClient = new pg.Client({ connectionString: adminUrl, application_name: 'bench-scale-sampler' });
  await watchClient.connect();
  await sampleClient.connect();
  const watch: Watch = {
    xid: watchClient,
    sampler: new ConnectionSampler(sampleClient, DATABASE),
    serverPid: plan.serverPid,
  };
  const setting = async (name: string) =>
    (await watchClient.query<{ v: string }>('SELECT current_setting($1) AS v', [name])).rows[0]!.v;
  const pgVersion = await setting('server_version');
  const maxConnections = await setting('max_connections');
  const syncCommit = await setting('synchronous_commit');
  const load0 = loadavg()[0]!;

  const before = await ceiling(adminUrl, plan.pgbenchSeconds, plan.serverPid);
  const rate = new Series();
  const commitRate = new Series();
  const cores = new Series();
  const machine = new Series();
  const server = new Series();
  const xact = new Series();
  const perProcessConns = new Series();
  const fleetConns = new Series();
  const roleConns = new Map<string, Series>(ROLES.map((r) => [r, new Series()]));
  const notes: string[] = [];
  for (let rep = 0; rep < reps; rep++) {
    const order = fleets.map((_, i) => fleets[(i + rep) % fleets.length]!);
    for (const w of workloads) {
      for (const n of order) {
        const r = await runOnce(url, watch, w, n);
        const key = `${w.name}/${n}`;
        rate.add(key, r.tasksPerSec);
        commitRate.add(key, r.writeCommitsPerSec);
        cores.add(key, r.workerCores);
        machine.add(key, r.machineCores);
        server.add(key, r.serverCores);
        xact.add(key, r.xactPerTask);
        perProcessConns.add(`${n}`, r.connections.perProcess);
        fleetConns.add(`${n}`, r.connections.fleet);
        for (const role of ROLES) roleConns.get(role)!.add(`${n}`, r.connections.byRole.get(role) ?? 0);
        if (r.note) notes.push(`${w.name}, N=${n}, rep ${rep + 1}: ${r.note}`);
        log(
          `rep ${rep + 1}/${reps} ${w.name} N=${n}: ${r.tasksPerSec === null ? 'no result' : `${int(r.tasksPerSec)} tasks/s`}` +
            `, ${r.writeCommitsPerSec === null ? '?' : int(r.writeCommitsPerSec)} write commits/s` +
            ` (per process ${r.perProcess.join('/')}; worker CPU ${r.workerCores?.toFixed(2) ?? '?'} / server ${r.serverCores?.toFixed(2) ?? '?'} / machine ${r.machineCores?.toFixed(2) ?? '?'} cores; ` +
            `${r.xactPerTask.toFixed(3)} xact/task; sessions ${r.connections.perProcess}/process, ${r.connections.fleet} fleet; load ${loadavg()[0]!.toFixed(2)})` +
            `${r.note ? `; ${r.note}` : ''}`,
        );
      }
    }
  }
  const after = await ceiling(adminUrl, plan.pgbenchSeconds, plan.serverPid);
  await watchClient.end();
  await sampleClient.end();

  const pgbenchWrite = [before, after].filter((x): x is PgbenchCeiling => x !== null).map((x) => x.writeXactPerSec);
  const pgbenchCeil = pgbenchWrite.length ? Math.max(...pgbenchWrite) : null;
  const rows: string[] = [];
  for (const w of workloads) {
    const base = rate.get(`${w.name}/1`);
    for (const n of fleets) {
      const key = `${w.name}/${n}`;
      const xs = rate.get(key);
      const c = w.ceiling(n);
      const ofCeiling = c !== null && xs.length ? ` (${Math.round((100 * median(xs)) / c)}%)` : '';
      const ratio = base.length && xs.length ? `${(median(xs) / median(base)).toFixed(2)}×` : '–';
      const wc = commitRate.get(key);
      const ofPgbench = pgbenchCeil !== null && wc.length ? ` (${Math.round((100 * median(wc)) / pgbenchCeil)}%)` : '';
      const med = (s: Series, digits: number) => (s.get(key).length ? median(s.get(key)).toFixed(digits) : '–');
      rows.push(
        `| ${n} | ${w.name} (${w.n.toLocaleString('en-US')} tasks) | ${range(xs)} | ${c === null ? '–' : `${int(c)}${ofCeiling}`} | ${ratio} | ` +
          `${wc.length ? int(median(wc)) : '–'}${ofPgbench} | ${med(xact, 3)} | ${med(cores, 2)} | ${med(server, 2)} | ${med(machine, 2)} |`,
      );
    }
  }
  const b = budget(SLOTS);
  const connRows = fleets.map((n) => {
    const k = `${n}`;
    const max = (s: Series) => (s.get(k).length ? String(Math.max(...s.get(k))) : '–');
    const roles = ROLES.filter((r) => r !== 'read' && r !== 'dashboard')
      .map((r) => max(roleConns.get(r)!))
      .join(' | ');
    return `| ${n} | ${max(perProcessConns)} | ${roles} | ${max(fleetConns)} | ${n * b.total} |`;
  });
  const pgbenchLine = (label: string, r: PgbenchCeiling | null) =>
    r === null
      ? []
      : [
          `- ${label}: ${int(r.tps)} tps (pgbench), ${int(r.writeXactPerSec)} write commits/s on the server, PostgreSQL ${r.serverCores?.toFixed(2) ?? '?'} and the machine ${r.machineCores?.toFixed(2) ?? '?'} of ${cpus().length} cores busy`,
        ];
  const seconds = Math.round((Date.now() - plan.started) / 1000);
  const env = [
    'SCALE_REPS',
    'SCALE_FLEETS',
    'SCALE_WORKLOADS',
    'SCALE_SLOT_TASKS',
    'SCALE_NOOP_TASKS',
    'SCALE_PGBENCH_SECONDS',
  ]
    .filter((k) => process.env[k])
    .map((k) => `${k}=${process.env[k]} `)
    .join('');
  const report = [
    `# Adding worker processes, and one primary's ceiling (seed 000) — ${new Date().toISOString()}`,
    '',
    `Command: \`${env}npm run bench:scale\` · ${reps} repetitions, N order rotated per repetition · total ${seconds} s`,
    '',
    `Node ${process.version}, ${cpus().length} CPUs · PostgreSQL ${pgVersion} (${serverDescription}; max_connections ${maxConnections}, synchronous_commit ${syncCommit}) · ` +
      `berth ${plan.revision} · database \`${DATABASE}\` · ${SLOTS} slots per process, maintenance on · cells: median (min–max) tasks/s`,
    '',
    '| worker processes (N) | workload | tasks/s | expected ceiling (N × 4 / 0.05 s) | ratio to N=1 | write commits/s (of pgbench) | transactions/task | worker CPU (cores) | PostgreSQL CPU (cores) | machine CPU busy (cores) |',
    '| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...rows,
    '',
    ...(pgbenchCeil === null
      ? ['pgbench ceiling: not measured (SCALE_PGBENCH_SECONDS=0).']
      : [
          `pgbench write ceiling, same cluster, \`${(before ?? after)!.command}\` (8 clients, 2 threads, simple-update script: one UPDATE, one SELECT, one INSERT per transaction); the percentages use the higher of:`,
          '',
          ...pgbenchLine('before the first fleet', before),
          ...pgbenchLine('after the last fleet', after),
        ]),
    '',
    `Sessions on the primary (pg_stat_activity by application_name, sampled every 100 ms, most at once over every run of that N): per process, its pool sessions (\`berth worker\`: claim + settlement + shared pool, at most ${b.worker} at ${SLOTS} slots), LISTEN and election; the fleet's total against N × ${b.total}.`,
    '',
    '| worker processes (N) | sessions per process | worker pools | listen | election | fleet | budget (N × 10) |',
    '| ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...connRows,
    '',
    'write commits/s: transaction ids the server consumed from just before the enqueue COMMIT to the last handler return, ' +
      'per second (every write transaction commits or aborts; aborts are rare here). transactions/task: `xact_commit` of the ' +
      'bench database from just before the enqueue until the fleet has exited (read-only transactions included), per task. ' +
      `Worker CPU: user + system CPU of all worker processes over the drain window; PostgreSQL CPU: the postmaster and its backends (/proc/<pid>/stat), over the same window; machine CPU busy: /proc/stat, out of ${cpus().length} cores.`,
    '',
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
