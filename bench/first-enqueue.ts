/**
 * Where a new process's first enqueue goes: the client's part and the server's, for berth
 * (two builds) and graphile-worker, each measurement in a process of its own.
 *
 *   npx tsx bench/first-enqueue.ts --url postgres://…/db [--a DIR] [--b DIR] [--reps 15]
 *
 * `npm run bench`'s "first enqueue" row is one number per process; this splits it.
 * - **client**: berth's first `enqueue` on a stub executor that answers at once, so only berth's
 *   own code runs (checks, statement, V8 compiling it on first use); then the second call.
 * - **server**: backend CPU (from `/proc/<pid>/schedstat`, the nanoseconds the backend ran) and
 *   wall time of the first call on a new session. berth's session has run `SELECT pg_backend_pid()`;
 *   graphile-worker's has also run its migrate check, which `makeWorkerUtils()` runs on the pool's
 *   session before it returns (one read of its migrations table). That query warms the session's
 *   generic catalog caches for any next statement, so the like-for-like pair is `server berth B
 *   +warm` (berth's call after the same query) against `server graphile`; `server graphile +warm`
 *   has run it twice.
 * `a new lane`: berth's first call into a queue never used before, which makes the lane. The
 * default queue's 16 lanes are made before the runs (64 enqueues), as in an installation in use.
 * berth's call is `enqueue()` on a pg.Client; graphile-worker's is `addJob` through WorkerUtils on
 * a pool of one session. Medians and ranges over the repetitions, interleaved.
 *
 * `--a`/`--b`: directories holding a berth build's `index.js` (default this checkout's dist/, after
 * `npm run build`). The database must hold both systems' schemas: berth's in schema
 * `first_enqueue` and graphile-worker's default schema, both installed here when missing. The
 * server must run on this machine (its backends' /proc entries are read).
 */
import { execFileSync } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { makeWorkerUtils, runMigrations } from 'graphile-worker';
import { median } from './stats.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    a: { type: 'string' },
    b: { type: 'string' },
    reps: { type: 'string', default: '15' },
    // Internal: one measurement, in a child process.
    child: { type: 'string' },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required');
const reps = Number(values.reps);
if (!Number.isInteger(reps) || reps <= 0) throw new Error(`--reps must be a positive integer, got ${values.reps}`);
const SCHEMA = 'first_enqueue';
const dist = resolve(dirname(fileURLToPath(import.meta.url)), '..', 'dist');
const MIGRATE_CHECK = `select current_setting('server_version_num') as server_version_num,
  (select id from graphile_worker.migrations order by id desc limit 1) as id,
  (select id from graphile_worker.migrations where breaking is true order by id desc limit 1) as biggest_breaking_id`;

type Job =
  | { kind: 'client'; dir: string }
  | { kind: 'server'; system: 'berth' | 'graphile'; dir: string; warm: boolean; newLane?: boolean };
type Answer = { first: number; second: number; cpu?: number };

async function measure(job: Job): Promise<Answer> {
  type Berth = typeof import('../src/index.js');
  const pg = (await import('pg')).default;
  const { readFileSync } = await import('node:fs');
  const berth =
    job.kind === 'client' || job.system === 'berth'
      ? ((await import(pathToFileURL(resolve(job.dir, 'index.js')).href)) as Berth)
      : null;
  if (job.kind === 'client') {
    // Answers both the one-task statement (id) and the array form (ids, states), so either build runs on it.
    const stub = { query: async () => ({ rows: [{ id: '1', ids: ['1'], states: 'r' }] }) } as never;
    let at = performance.now();
    await berth!.enqueue(stub, 'noop', { i: 0 }, { schema: SCHEMA });
    const first = performance.now() - at;
    at = performance.now();
    await berth!.enqueue(stub, 'noop', { i: 1 }, { schema: SCHEMA });
    return { first, second: performance.now() - at };
  }
  const backendCpuMs = (pid: number) => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
  if (job.system === 'berth') {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      const pid = (await client.query<{ p: number }>('SELECT pg_backend_pid() AS p')).rows[0]!.p;
      if (job.warm) await client.query(MIGRATE_CHECK);
      // A queue never used before: the call makes its lane (and the lane's sequence).
      const queue = job.newLane ? `new-${process.pid}-${Date.now()}` : undefined;
      const c0 = backendCpuMs(pid);
      let at = performance.now();
      await berth!.enqueue(client, 'noop', { i: 0 }, { schema: SCHEMA, ...(queue ? { queue } : {}) });
      const first = performance.now() - at;
      const cpu = backendCpuMs(pid) - c0;
      at = performance.now();
      await berth!.enqueue(client, 'noop', { i: 1 }, { schema: SCHEMA });
      return { first, second: performance.now() - at, cpu };
    } finally {
      await client.end();
    }
  }
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  pool.on('error', () => {});
  pool.on('connect', (client) => client.on('error', () => {}));
  const utils = await makeWorkerUtils({ pgPool: pool });
  try {
    const pid = await utils.withPgClient(
      async (c) => (await c.query<{ p: number }>('SELECT pg_backend_pid() AS p')).rows[0]!.p,
    );
    if (job.warm) await utils.withPgClient((c) => c.query(MIGRATE_CHECK));
    const c0 = backendCpuMs(pid);
    let at = performance.now();
    await utils.addJob('noop', { i: 0 });
    const first = performance.now() - at;
    const cpu = backendCpuMs(pid) - c0;
    at = performance.now();
    await utils.addJob('noop', { i: 1 });
    return { first, second: performance.now() - at, cpu };
  } finally {
    await utils.release();
    await pool.end();
  }
}

if (values.child) {
  const answer = await measure(JSON.parse(values.child) as Job);
  process.stdout.write(JSON.stringify(answer));
} else {
  const dirs = { A: resolve(values.a ?? dist), B: resolve(values.b ?? dist) };
  const { migrate, enqueue } = (await import(
    pathToFileURL(resolve(dirs.B, 'index.js')).href
  )) as typeof import('../src/index.js');
  await migrate({ connectionString: url, schema: SCHEMA });
  await runMigrations({ connectionString: url, logger: undefined });
  // An installation in use: every lane of the default queue made (16 shards; one call each).
  const pg = (await import('pg')).default;
  const setup = new pg.Client({ connectionString: url });
  await setup.connect();
  for (let i = 0; i < 64; i++) await enqueue(setup, 'noop', { i }, { schema: SCHEMA });
  await setup.end();
  const jobs: Record<string, Job> = {
    'client A': { kind: 'client', dir: dirs.A },
    'client B': { kind: 'client', dir: dirs.B },
    'server berth A': { kind: 'server', system: 'berth', dir: dirs.A, warm: false },
    'server berth B': { kind: 'server', system: 'berth', dir: dirs.B, warm: false },
    'server graphile': { kind: 'server', system: 'graphile', dir: dirs.B, warm: false },
    'server berth B, a new lane': { kind: 'server', system: 'berth', dir: dirs.B, warm: false, newLane: true },
    'server berth B +warm': { kind: 'server', system: 'berth', dir: dirs.B, warm: true },
    'server graphile +warm': { kind: 'server', system: 'graphile', dir: dirs.B, warm: true },
  };
  const out = new Map<string, Answer[]>();
  const self = fileURLToPath(import.meta.url);
  for (let r = 0; r < reps; r++) {
    for (const [label, job] of Object.entries(jobs)) {
      const text = execFileSync(
        process.execPath,
        [...process.execArgv, self, '--url', url, '--child', JSON.stringify(job)],
        { encoding: 'utf8' },
      );
      const list = out.get(label) ?? [];
      list.push(JSON.parse(text) as Answer);
      out.set(label, list);
    }
  }
  const fmt = (xs: number[]) =>
    `${median(xs).toFixed(2)} (${Math.min(...xs).toFixed(2)}-${Math.max(...xs).toFixed(2)})`;
  console.log(`A = ${dirs.A}\nB = ${dirs.B}\n${reps} repetitions, ms: median (range)\n`);
  console.log('| measurement | first call | second call | backend CPU of the first |');
  console.log('| --- | ---: | ---: | ---: |');
  for (const [label, list] of out) {
    const cpu = list.every((a) => a.cpu !== undefined) ? fmt(list.map((a) => a.cpu!)) : '';
    console.log(`| ${label} | ${fmt(list.map((a) => a.first))} | ${fmt(list.map((a) => a.second))} | ${cpu} |`);
  }
}
