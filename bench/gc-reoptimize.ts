/**
 * What one full garbage collection between two drains does to the second: a new Worker drains
 * N no-op tasks, then (in turn) either nothing happens or the process runs one full GC, then a
 * new Worker drains again. Prints each drain's wall time and this process's CPU (every thread,
 * V8's background compiler included), medians by what came before it.
 *
 *   npx tsx bench/gc-reoptimize.ts --url postgres://…/db [--n 20000] [--slots 10] [--rounds 6] [--handler per-drain|shared] [--gap-ms 0] [--gcs 1]
 *
 * Why: in `npm run bench` berth's warm drain used 100-140 ms of this process's CPU when the drain
 * before it in the process was berth's, and 230-330 ms when graphile-worker's drains and the
 * new-process scenarios ran in between (docs/benchmarks-journal.md, "Issue 35's eighth round").
 * With `--trace-deopt`, the full GC marks the optimized code of the engine's hot methods and of
 * pg's message parsing "for deoptimization, reason: weak objects" (objects that code embedded had
 * died with the previous worker), and the next drain compiles them again while it runs.
 * `--gap-ms` pauses that long after each stop before the next step, so the stopped worker's own
 * timers have ended and nothing of it is left for the collection to find alive.
 * `--gcs` runs that many full collections instead of one (V8 ages an unused shape out over
 * several).
 * `--handler shared` gives every drain the same handler function (as an application's task
 * definitions are), `per-drain` a new closure each time (as the bench's adapters make).
 *
 * Runs as the bench runs berth: its dist/ build (`npm run build` first). `--url` (or
 * BENCH_DATABASE_URL) must name a database nothing else is using heavily: the runs drop and
 * recreate the schema `gc_reoptimize` there. Run with `node --expose-gc --import tsx` or through
 * npx tsx (the GC is then reached through v8.setFlagsFromString).
 */
import { parseArgs } from 'node:util';
import v8 from 'node:v8';
import { runInNewContext } from 'node:vm';
import pg from 'pg';
import { pino } from 'pino';
import type { TaskDefinition } from '../src/index.js';
import { cpuMs } from './gc-tally.js';
import { median } from './stats.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    n: { type: 'string', default: '20000' },
    slots: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '6' },
    handler: { type: 'string', default: 'per-drain' },
    'gap-ms': { type: 'string', default: '0' },
    gcs: { type: 'string', default: '1' },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required: the runs drop and recreate a schema there');
const whole = (k: 'n' | 'slots' | 'rounds' | 'gcs'): number => {
  const v = Number(values[k]);
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${k} must be a positive integer, got ${values[k]}`);
  return v;
};
const n = whole('n');
const slots = whole('slots');
const rounds = whole('rounds');
const gcs = whole('gcs');
const gapMs = Number(values['gap-ms']);
if (!Number.isInteger(gapMs) || gapMs < 0)
  throw new Error(`--gap-ms must be a whole number of ms, got ${values['gap-ms']}`);
/** The pause between a drain's stop and the next step: long enough for the stopped worker's timers to end. */
const gap = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, gapMs));
if (values.handler !== 'per-drain' && values.handler !== 'shared')
  throw new Error(`--handler must be per-drain or shared, got ${values.handler}`);

type Berth = typeof import('../src/index.js');
const entry = '../dist/index.js';
const berth = (await import(entry)) as Berth;
const schema = 'gc_reoptimize';
const silent = pino({ level: 'silent' });

v8.setFlagsFromString('--expose-gc');
const fullGc = runInNewContext('gc') as () => void;

let done = 0;
let allDone: () => void = () => {};
const count = (): void => {
  if (++done === n) allDone();
};
const shared = berth.defineTask<{ i: number }>({ type: 'noop', ceilingMs: 60_000, handler: async () => count() });
const definition = (): TaskDefinition<{ i: number }> =>
  values.handler === 'shared'
    ? shared
    : berth.defineTask<{ i: number }>({ type: 'noop', ceilingMs: 60_000, handler: async () => count() });

const admin = new pg.Pool({ connectionString: url });

/** One drain on a new Worker: wall ms from `new Worker` to the last handler, and this process's CPU ms. */
async function drainOnce(): Promise<{ wallMs: number; cpuMs: number }> {
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await berth.migrate({ connectionString: url!, schema });
  for (let s = 0; s < n; s += 1000) {
    const specs = [];
    for (let i = s; i < Math.min(n, s + 1000); i++) specs.push({ type: 'noop', payload: { i } });
    await berth.enqueueMany(admin, specs, { schema });
  }
  done = 0;
  const finished = new Promise<void>((resolve) => {
    allDone = resolve;
  });
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const worker = new berth.Worker({ connectionString: url!, schema, tasks: [definition()], slots, logger: silent });
  await worker.start();
  await finished;
  const wallMs = performance.now() - t0;
  const used = cpuMs(process.cpuUsage(cpu0));
  await worker.stop();
  return { wallMs, cpuMs: used };
}

try {
  for (let i = 0; i < 6; i++) await drainOnce(); // compiled and warm
  const after: Record<'a drain' | 'full GCs', { wallMs: number; cpuMs: number }[]> = {
    'a drain': [],
    'full GCs': [],
  };
  for (let r = 0; r < rounds; r++) {
    await gap();
    after['a drain'].push(await drainOnce());
    await gap();
    // V8 keeps an unused shape through a few full collections (it ages them out), so one
    // collection can leave alive what the bench's many collections between drains do not.
    for (let g = 0; g < gcs; g++) {
      fullGc();
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    after['full GCs'].push(await drainOnce());
  }
  console.log(`${n} no-op tasks, ${slots} slots, handler ${values.handler}, ${rounds} rounds; medians (each run)`);
  console.log('');
  console.log('| the drain came after | wall ms | process CPU ms |');
  console.log('| --- | ---: | ---: |');
  for (const [k, runs] of Object.entries(after)) {
    const w = runs.map((x) => Math.round(x.wallMs));
    const c = runs.map((x) => Math.round(x.cpuMs));
    console.log(`| ${k} | ${median(w)} (${w.join(', ')}) | ${median(c)} (${c.join(', ')}) |`);
  }
} finally {
  await admin.end();
}
