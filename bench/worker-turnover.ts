/**
 * What a stopped worker takes with it: the compiled code V8 throws away ("marking dependent code …
 * reason: weak objects" in `node --trace-deopt`) at the full collections after a worker stopped,
 * before the next worker in the same process starts.
 *
 *   npx tsx bench/worker-turnover.ts --url postgres://…/db [--dist DIR] [--reps 5] [--n 20000] [--slots 10]
 *
 * Each repetition enqueues N no-op tasks, starts a Worker, waits until every handler has run,
 * stops it, drops it and runs full collections; the next repetition's worker then meets whatever
 * code survived. The task definition is made once (as an application's are), so only what berth
 * itself makes per worker can be lost. Runs itself again as a child under
 * `--expose-gc --trace-deopt` and prints, per stopped worker, how many compiled functions were
 * marked and which (pg's and postgres-array's parsers among them: pg's per-query objects are not
 * berth's to keep), with the drain's wall time and this process's CPU.
 *
 * `--dist` is a directory holding a build's `index.js` (default: this checkout's dist/, after
 * `npm run build`), e.g. another commit's `git worktree` built there. `--url` (or
 * BENCH_DATABASE_URL) must name a database nothing else is using heavily: the runs drop and
 * recreate the schema `worker_turnover` there. docs/benchmarks-journal.md, "Issue 35's fifteenth
 * round".
 */
import { spawn } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    dist: { type: 'string' },
    reps: { type: 'string', default: '5' },
    n: { type: 'string', default: '20000' },
    slots: { type: 'string', default: '10' },
    child: { type: 'boolean', default: false },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required');
const here = dirname(fileURLToPath(import.meta.url));
const dist = resolve(values.dist ?? resolve(here, '../dist'));
const reps = Number(values.reps);
const n = Number(values.n);
const slots = Number(values.slots);
for (const [name, v] of Object.entries({ reps, n, slots }))
  if (!Number.isInteger(v) || v < 1) throw new Error(`--${name} must be a positive integer`);

const MARK = '=== turnover';

if (values.child) await child();
else await parent();

/** Runs the drains under the V8 flags and prints each stopped worker's marks. */
async function parent(): Promise<void> {
  const args = [
    '--expose-gc',
    '--trace-deopt',
    '--import',
    'tsx',
    fileURLToPath(import.meta.url),
    '--child',
    ...['--url', url!, '--dist', dist, '--reps', String(reps), '--n', String(n), '--slots', String(slots)],
  ];
  const proc = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  proc.stdout.setEncoding('utf8').on('data', (d: string) => {
    out += d;
  });
  const code = await new Promise<number | null>((r) => proc.on('close', r));
  if (code !== 0) throw new Error(`the child exited with ${code}`);
  console.log(`${n} no-op tasks, ${slots} slots, ${reps} workers in turn; build ${dist}`);
  console.log('| worker | drain ms | process CPU ms | functions marked after its stop ("weak objects") | which |');
  console.log('| ---: | ---: | ---: | ---: | --- |');
  let rep = '';
  let drain = '';
  let marks: string[] = [];
  let collecting = false;
  for (const line of out.split('\n')) {
    if (line.startsWith(MARK)) {
      const [, , r, what, ...rest] = line.split(' ');
      if (what === 'drained') {
        rep = r!;
        drain = rest.join(' ');
      } else if (what === 'gc') {
        collecting = true;
        marks = [];
      } else if (what === 'collected') {
        collecting = false;
        const [ms, cpu] = drain.split(' ');
        console.log(`| ${Number(rep) + 1} | ${ms} | ${cpu} | ${marks.length} | ${marks.join(', ')} |`);
      }
      continue;
    }
    const m = /marking dependent code .*<SharedFunctionInfo ?([^>]*)>.*reason: weak objects/.exec(line);
    if (collecting && m) marks.push(m[1] || '(anonymous)');
  }
}

/** The drains themselves, with a marker line around each stop's collections. */
async function child(): Promise<void> {
  const berth = (await import(pathToFileURL(resolve(dist, 'index.js')).href)) as typeof import('../src/index.js');
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('run with --expose-gc');
  const schema = 'worker_turnover';
  const admin = new pg.Pool({ connectionString: url });
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await berth.migrate({ connectionString: url!, schema });
  const silent = pino({ level: 'silent' });
  let ran = 0;
  const noop = berth.defineTask<{ i: number }>({
    type: 'noop',
    ceilingMs: 60_000,
    handler: async () => {
      ran++;
    },
  });
  for (let rep = 0; rep < reps; rep++) {
    ran = 0;
    const specs = Array.from({ length: n }, (_, i) => ({ type: 'noop', payload: { i } }));
    for (let i = 0; i < n; i += 1000) await berth.enqueueMany(admin, specs.slice(i, i + 1000), { schema });
    let worker: InstanceType<typeof berth.Worker> | null = new berth.Worker({
      connectionString: url!,
      schema,
      tasks: [noop],
      slots,
      logger: silent,
    });
    const t0 = performance.now();
    const cpu0 = process.cpuUsage();
    await worker.start();
    while (ran < n) await new Promise((r) => setTimeout(r, 2));
    const cpu = process.cpuUsage(cpu0);
    console.log(
      `${MARK} ${rep} drained ${Math.round(performance.now() - t0)} ${Math.round((cpu.user + cpu.system) / 1000)}`,
    );
    await worker.stop();
    worker = null;
    console.log(`${MARK} ${rep} gc`);
    gc();
    gc();
    await new Promise((r) => setTimeout(r, 50));
    gc();
    console.log(`${MARK} ${rep} collected`);
  }
  await admin.end();
}
