/**
 * A/B of the claim statement alone: `npx tsx bench/claim-ab.ts BASE` where BASE is another
 * checkout's root (e.g. `git archive <rev> src | tar -x -C /tmp/base`). 20,000 queued no-op
 * tasks over 16 lanes; each impl on its own session with the worker's SESSION_OPTIONS claims 130
 * (33 per lane) in a transaction it rolls back, 6 rounds of 60 claims, alternating A (BASE) and
 * B (this checkout). Prints the client's CPU per claimed task (process.cpuUsage around the
 * call: the round trip and the row parsing) and the wall time, medians of the rounds, and the
 * server's execution time per claim from pg_stat_statements (needs the extension on
 * BENCH_DATABASE_URL's server, else that line is skipped).
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import pg from 'pg';
import { SESSION_OPTIONS } from '../src/process/worker.js';
import { claimParams } from '../test/claim-params.js';

const url =
  process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const base = process.argv[2];
if (!base) throw new Error('usage: npx tsx bench/claim-ab.ts BASE_CHECKOUT_DIR');
const A = (await import(resolve(base, 'src/processor/claim.ts'))) as typeof import('../src/processor/claim.js');
const B = await import('../src/processor/claim.js');
const { migrate, enqueueMany } = await import('../src/index.js');
const schema = 'claim_ab';
const admin = new pg.Client({ connectionString: url });
await admin.connect();
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });
const pool = new pg.Pool({ connectionString: url, max: 2, options: SESSION_OPTIONS });
const specs = [];
for (let i = 0; i < Number(process.env.CLAIM_TASKS ?? 20000); i++)
  specs.push({ type: 'noop', payload: { i, s: 'x'.repeat(20) } });
// 1,000 per call: each call's tasks go to one lane of the default 16 shards, as the drain's do.
for (let i = 0; i < specs.length; i += 1000) await enqueueMany(pool, specs.slice(i, i + 1000) as never, { schema });
const lanes = (await admin.query(`SELECT lane_id FROM ${schema}.lanes ORDER BY lane_id`)).rows.map((r) => r.lane_id);
await admin.query('VACUUM ANALYZE');
/** The claim's shape: CLAIM_LIMIT tasks (default 130, the c10 drain's) over CLAIM_LANES lanes (default 4). */
const LIMIT = Number(process.env.CLAIM_LIMIT ?? 130);
const LANES = Number(process.env.CLAIM_LANES ?? 4);
const clients = new Map<typeof A, pg.PoolClient>([
  [A, await pool.connect()],
  [B, await pool.connect()],
]);
/** A backend's CPU seconds from /proc (the server must be on this machine), or NaN. */
function backendCpu(pid: number): number {
  try {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return Number.NaN;
  }
}
const pids = new Map<typeof A, number>();
for (const [impl, c] of clients) pids.set(impl, (await c.query('SELECT pg_backend_pid() AS p')).rows[0].p);
const serverCpu = new Map<typeof A, { cpu: number; claims: number }>([
  [A, { cpu: 0, claims: 0 }],
  [B, { cpu: 0, claims: 0 }],
]);
async function round(impl: typeof A, n: number): Promise<{ cpu: number; wall: number; tasks: number }> {
  const c = clients.get(impl)!;
  const s0 = backendCpu(pids.get(impl)!);
  let cpu = 0,
    wall = 0,
    tasks = 0;
  try {
    for (let i = 0; i < n; i++) {
      await c.query('BEGIN');
      const t0 = performance.now();
      const u0 = process.cpuUsage();
      const b = await impl.claimBatch(
        c,
        claimParams(schema, lanes.slice(0, LANES), LIMIT, {
          perLane: Math.ceil(LIMIT / Math.min(LANES, lanes.length)),
          ceilings: new Map([['noop', 60000]]),
          marginMs: 30000,
          workerId: 'w',
          wakeChannel: 'x',
          queues: null,
          maxLanes: 16,
        }),
      );
      const u = process.cpuUsage(u0);
      wall += performance.now() - t0;
      cpu += u.user + u.system;
      tasks += b.tasks.length;
      await c.query('ROLLBACK');
    }
  } finally {
  }
  const sc = serverCpu.get(impl)!;
  sc.cpu += backendCpu(pids.get(impl)!) - s0;
  sc.claims += n;
  return { cpu, wall, tasks };
}
await round(A, 20);
await round(B, 20);
for (const v of serverCpu.values()) Object.assign(v, { cpu: 0, claims: 0 });
const stats = await admin.query('SELECT pg_stat_statements_reset()').then(
  () => true,
  () => false,
);
const res: Record<string, { cpu: number[]; wall: number[] }> = { A: { cpu: [], wall: [] }, B: { cpu: [], wall: [] } };
for (let r = 0; r < 6; r++)
  for (const [k, impl] of [
    ['A', A],
    ['B', B],
  ] as const) {
    const x = await round(impl, 60);
    res[k]!.cpu.push(x.cpu / x.tasks);
    res[k]!.wall.push((x.wall * 1000) / x.tasks);
  }
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!.toFixed(2);
for (const k of ['A', 'B'])
  console.log(
    k,
    'client CPU µs/task',
    med(res[k]!.cpu),
    'wall µs/task',
    med(res[k]!.wall),
    res[k]!.cpu.map((v) => v.toFixed(1)).join(' '),
  );
for (const [k, impl] of [
  ['A', A],
  ['B', B],
] as const) {
  const v = serverCpu.get(impl)!;
  console.log(k, 'backend CPU ms/claim (BEGIN/ROLLBACK included)', ((v.cpu * 1000) / v.claims).toFixed(3));
}
const st = !stats
  ? { rows: [] }
  : await admin.query(
      `SELECT (query = (SELECT min(query) FROM pg_stat_statements WHERE query LIKE 'WITH locked AS MATERIALIZED%')) AS first, calls, total_exec_time / calls AS ms, rows FROM pg_stat_statements WHERE query LIKE 'WITH locked AS MATERIALIZED%'`,
    );
for (const r of st.rows)
  console.log(
    r.first ? 'first' : 'second',
    'server exec ms/claim',
    Number(r.ms).toFixed(3),
    'rows/call',
    r.rows / r.calls,
  );
for (const c of clients.values()) c.release();
await pool.end();
await admin.query(`DROP SCHEMA ${schema} CASCADE`);
await admin.end();
