/**
 * Where the server time of a limited or keyed drain goes, and promote_lane before and after the
 * concurrency keys, from pg_stat_statements (the companion of bench/limits.ts):
 *
 *   npx tsx bench/limits-statements.ts [--n 20000] [--variants a,b,c,d,e] [--top 12] [--promote-reps 5]
 *
 * On a throwaway cluster of its own with pg_stat_statements preloaded and `track = all`, so the
 * statements inside berth's functions (limit_capacity, promote_held, key_entry_live...) are
 * counted on their own. Part 1: for each variant (as in bench/limits.ts: a base build; b this
 * build; c maxRunning 10,000; d 1,000 keys, K = 1; e rate 1,000,000/s), N tasks enqueued, the
 * statistics reset, one worker (10 slots, maintenance on, warnings logged) drains them; prints
 * the drain's rate and its top statements by total execution time. Part 2: 100,000 due deferred
 * rows promoted by `promoteDue` (the leader's per-lane primitive, 1,000 a call), each build in
 * turn, the wall time and promote_lane's mean execution time per call. Part 3: key_entry_live
 * (the check promote_held runs per key) called once per statement, as promote_held's per-key
 * DELETE calls it, against once per row of one statement, over 1,000 live key holders.
 * The server's deadlock reports (its log) are printed after each drain that had any.
 */
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';
import type { TaskSpec } from '../src/index.js';
import { startCluster } from './cluster.js';
import { median } from './stats.js';

type Berth = typeof import('../src/index.js');
type Maintenance = typeof import('../src/maintenance-api.js');

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '20000' },
    variants: { type: 'string', default: 'a,b,c,d,e' },
    top: { type: 'string', default: '12' },
    'promote-reps': { type: 'string', default: '5' },
    'key-check': { type: 'boolean', default: true },
  },
});
const N = Number(values.n);
const TOP = Number(values.top);
const PROMOTE_REPS = Number(values['promote-reps']);
for (const [k, v] of Object.entries({ n: N, top: TOP, 'promote-reps': PROMOTE_REPS }))
  if (!Number.isInteger(v) || v < 0) throw new Error(`--${k} must be a non-negative integer`);

const baseDir = resolve(process.env.BENCH_BERTH_BASE || '/tmp/berth-base/dist/index.js', '..');
const load = async (dir: string) => ({
  berth: (await import(pathToFileURL(resolve(dir, 'index.js')).href)) as Berth,
  maintenance: (await import(pathToFileURL(resolve(dir, 'maintenance-api.js')).href)) as Maintenance,
});
const base = await load(baseDir);
const current = await load(fileURLToPath(new URL('../dist/', import.meta.url)));

const cluster = await startCluster({
  settings: { shared_preload_libraries: 'pg_stat_statements', 'pg_stat_statements.track': 'all' },
});
const url = cluster.url;
const admin = new pg.Pool({ connectionString: url, max: 2 });
await admin.query('CREATE EXTENSION pg_stat_statements');
const out = (line: string) => process.stdout.write(`${line}\n`);

/** The server log's deadlock reports since `from` (a character offset), and the log's length now. */
function deadlocks(from: number): { reports: string[]; length: number } {
  let text = '';
  try {
    text = readFileSync(join(dirname(cluster.dataDir), 'server.log'), 'utf8');
  } catch {
    return { reports: [], length: from };
  }
  const lines = text.slice(from).split('\n');
  const reports: string[] = [];
  lines.forEach((line, i) => {
    if (line.includes('deadlock detected')) reports.push(lines.slice(i, i + 6).join('\n'));
  });
  return { reports, length: text.length };
}
let logAt = deadlocks(0).length;

for (const v of values.variants.split(',').map((s) => s.trim())) {
  const b = v === 'a' ? base.berth : current.berth;
  const schema = `stmts_${v}`;
  await b.migrate({ connectionString: url, schema });
  if (v === 'c' || v === 'e') {
    await b.pauseQueue(admin, schema, 'default', 'bench');
    const change = v === 'c' ? { maxRunning: 10_000 } : { rate: { limit: 1_000_000, intervalMs: 1000 } };
    await b.setQueueLimit(admin, schema, 'default', change, 'bench');
    await b.resumeQueue(admin, schema, 'default', 'bench');
  }
  if (v === 'd') await b.setKeyLimit(admin, schema, { queue: 'default' }, 1, 'bench');
  for (let s = 0; s < N; s += 1000) {
    const specs: TaskSpec[] = [];
    for (let i = s; i < Math.min(N, s + 1000); i++)
      specs.push(
        v === 'd' ? { type: 'noop', payload: { i }, concurrencyKey: `k${i % 1000}` } : { type: 'noop', payload: { i } },
      );
    await b.enqueueMany(admin, specs, { schema });
  }
  await admin.query('SELECT pg_stat_statements_reset()');
  let done = 0;
  const worker = new b.Worker({
    connectionString: url,
    schema,
    slots: 10,
    logger: pino({ level: 'warn' }),
    tasks: [
      b.defineTask<{ i: number }>({
        type: 'noop',
        ceilingMs: 60_000,
        handler: async () => {
          done++;
        },
      }),
    ],
  });
  const t0 = performance.now();
  await worker.start();
  while (done < N && performance.now() - t0 < 600_000) await new Promise((r) => setTimeout(r, 20));
  const secs = (performance.now() - t0) / 1000;
  await worker.stop();
  out(`\n## ${v}: ${done} of ${N} handlers started in ${secs.toFixed(1)} s (${Math.round(done / secs)} tasks/s)\n`);
  out('| calls | total ms | mean ms | level | statement |');
  out('| ---: | ---: | ---: | --- | --- |');
  const r = await admin.query<{ calls: string; total: string; mean: string; toplevel: boolean; q: string }>(
    `SELECT calls::text, round(total_exec_time::numeric)::text AS total, round(mean_exec_time::numeric, 3)::text AS mean,
            toplevel, left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS q
       FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      ORDER BY total_exec_time DESC LIMIT $1`,
    [TOP],
  );
  for (const x of r.rows)
    out(
      `| ${x.calls} | ${x.total} | ${x.mean} | ${x.toplevel ? 'top' : 'nested'} | \`${x.q.replace(/\|/g, '\\|')}\` |`,
    );
  const d = deadlocks(logAt);
  logAt = d.length;
  if (d.reports.length > 0)
    out(`\n${d.reports.length} deadlock(s) in the server log; the first:\n\n\`\`\`\n${d.reports[0]}\n\`\`\``);
}

if (PROMOTE_REPS > 0) {
  const P = 100_000;
  const wall: Record<string, number[]> = { base: [], this: [] };
  const perCall: Record<string, number[]> = { base: [], this: [] };
  const builds = [
    ['base', base],
    ['this', current],
  ] as const;
  for (let rep = 0; rep < PROMOTE_REPS; rep++) {
    for (const [name, build] of rep % 2 ? [...builds].reverse() : builds) {
      const schema = `stmts_promote_${name}`;
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await build.berth.migrate({ connectionString: url, schema });
      const runAt = new Date(Date.now() + 600_000);
      for (let s = 0; s < P; s += 1000) {
        const specs: TaskSpec[] = [];
        for (let i = s; i < s + 1000; i++) specs.push({ type: 'noop', payload: { i }, runAt });
        await build.berth.enqueueMany(admin, specs, { schema });
      }
      // Due now: the same rewrite in both builds, vacuumed so that neither pays for its dead rows.
      await admin.query(`UPDATE ${schema}.deferred SET run_at = now() - interval '1 second'`);
      await admin.query(`VACUUM ANALYZE ${schema}.deferred`);
      await admin.query('SELECT pg_stat_statements_reset()');
      const t0 = performance.now();
      const n = await build.maintenance.promoteDue(admin, schema, 1000);
      const ms = performance.now() - t0;
      const s = await admin.query<{ calls: number; total: number }>(
        `SELECT sum(calls)::int AS calls, sum(total_exec_time)::float8 AS total FROM pg_stat_statements
          WHERE toplevel AND query LIKE '%promote_lane(%'`,
      );
      if (n !== P) throw new Error(`${name}: promoted ${n} of ${P}`);
      wall[name]!.push(ms);
      perCall[name]!.push(s.rows[0]!.total / s.rows[0]!.calls);
    }
  }
  out(`\n## promoteDue of ${P.toLocaleString('en-US')} due rows, ${PROMOTE_REPS} repetitions alternating\n`);
  out('| build | wall ms, median (each) | promote_lane ms per call (1,000 rows), median |');
  out('| --- | ---: | ---: |');
  for (const name of ['base', 'this'])
    out(
      `| ${name} | ${Math.round(median(wall[name]!))} (${wall[name]!.map((x) => Math.round(x)).join(', ')}) | ${median(perCall[name]!).toFixed(1)} |`,
    );
}
if (values['key-check']) {
  const b = current.berth;
  const schema = 'stmts_key_check';
  await b.migrate({ connectionString: url, schema });
  await b.setKeyLimit(admin, schema, { queue: 'default' }, 1, 'bench');
  for (let s = 0; s < 20_000; s += 1000) {
    const specs: TaskSpec[] = [];
    for (let i = s; i < s + 1000; i++) specs.push({ type: 'noop', payload: { i }, concurrencyKey: `k${i % 1000}` });
    await b.enqueueMany(admin, specs, { schema });
  }
  const client = await admin.connect();
  try {
    const timed = async (what: string, fn: () => Promise<unknown>) => {
      const t0 = performance.now();
      const r = await fn();
      out(`| ${what} | ${Math.round(performance.now() - t0)} | ${r} |`);
    };
    const one = (text: string) => async () => (await client.query<{ n: string }>(text)).rows[0]!.n;
    out('\n## key_entry_live and promote_held: 20,000 keyed tasks on 1,000 keys, K = 1\n');
    out('| step | ms | result |');
    out('| --- | ---: | ---: |');
    await timed('promote_held(NULL): admits one task per key', one(`SELECT ${schema}.promote_held(NULL)::text AS n`));
    await timed(
      'promote_held(NULL) again: every holder still live, admits none',
      one(`SELECT ${schema}.promote_held(NULL)::text AS n`),
    );
    await timed(
      'key_entry_live over the 1,000 holders, one statement',
      one(`SELECT count(*) FILTER (WHERE ${schema}.key_entry_live(id))::text AS n FROM ${schema}.key_holders`),
    );
    const ids = (await client.query<{ id: string }>(`SELECT id::text AS id FROM ${schema}.key_holders`)).rows;
    await timed('key_entry_live, 1,000 statements of one call each', async () => {
      let live = 0;
      for (const { id } of ids) {
        const r = await client.query<{ l: boolean }>({
          name: 'key-check',
          text: `SELECT ${schema}.key_entry_live($1::bigint) AS l`,
          values: [id],
        });
        if (r.rows[0]!.l) live++;
      }
      return live;
    });
  } finally {
    client.release();
  }
}

await admin.end();
await cluster.stop();
