/**
 * Idle pickup latency of berth alone, small enough to run beside other work (issue 11).
 *
 *   npx tsx bench/pickup-probe.ts --url postgres://…/db [--n 500] [--gap 10] [--slots 10]
 *                                 [--reps 3] [--compare <git rev>]
 *
 * The same scenario as `npm run bench`'s pickup row (bench/scenarios.ts): a running, idle worker
 * at its defaults (`slots` and a silent logger only, maintenance on); `--n` tasks enqueued one
 * at a time `--gap` ms apart; latency = handler start − the instant before the enqueue call;
 * nearest-rank p50 / p95 / p99 per run, and the median of each over `--reps` runs.
 *
 * `--compare <rev>` measures this checkout against `src/` of another commit, interleaved (A B,
 * then B A, …, so drift in the machine's load hits both alike): that commit's `src/` is extracted
 * with `git archive` into `bench/.probe/<rev>/` and imported beside this one, each in its own
 * schema. It also reports the worker's fetches per pickup (`berth_claims_total`). Run it both
 * ways round (from a checkout of the other revision too): a build measured 0.2–0.3 ms slower in
 * the claim stage as this checkout than as the `--compare` copy, for reasons not yet found
 * (docs/benchmarks-journal.md, "Worker start and the drain's phases").
 *
 * `--stages` also times each pickup's stages, by wrapping node-postgres's `Client.prototype.query`
 * and `emit` and the fetcher's `fetch` in this process (berth's code is not changed):
 *   enqueue → wake: the enqueue call until the worker's LISTEN client emits the notification
 *     (the producer's statement, its commit, and NOTIFY delivery);
 *   wake → fetch: until the fetch loop starts a fetch (it is busy with an earlier claim or discovery);
 *   fetch → claim: discovery before the claim, if any, and the pool checkout;
 *   claim: the claim statement's round trip;
 *   claim → handler: dispatch to a slot, payload validation, the handler's call.
 * and what the fetch loop was doing when each notification arrived.
 *
 * `--with-options JSON` adds this checkout again with extra Worker options (an A/B of a default,
 * e.g. `'{"maintenance":false}'`), in the schema `pickup_probe_c`.
 *
 * `--graphile` adds graphile-worker at its defaults and with its throughput preset, interleaved
 * with the rest, through the bench's own adapter and pickup scenario (bench/systems/graphile.ts,
 * bench/scenarios.ts), so the target (issue 11: berth's p95 and p99 no worse than
 * graphile-worker's) is read on the same machine at the same moment.
 *
 * `--url` (or BENCH_DATABASE_URL) must name a database nothing else is using heavily: the probe
 * drops and recreates the schemas `pickup_probe_a` and `pickup_probe_b` in it.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';
import { loadConfig } from './config.js';
import { pickup } from './scenarios.js';
import { median, percentile } from './stats.js';
import { graphileAdapter } from './systems/graphile.js';
import { berthRevision, log, sleep } from './util.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    n: { type: 'string', default: '500' },
    gap: { type: 'string', default: '10' },
    slots: { type: 'string', default: '10' },
    reps: { type: 'string', default: '3' },
    compare: { type: 'string' },
    stages: { type: 'boolean', default: false },
    graphile: { type: 'boolean', default: false },
    'with-options': { type: 'string' },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required: the probe drops and recreates its schemas there');
const n = Number(values.n);
const gapMs = Number(values.gap);
const slots = Number(values.slots);
const reps = Number(values.reps);
for (const [k, v] of Object.entries({ n, gap: gapMs, slots, reps })) {
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${k} must be a positive integer, got ${v}`);
}

/** The slice of berth's public API the probe uses; both versions export it. */
type Berth = typeof import('../src/index.js');

type FetcherModule = typeof import('../src/processor/fetcher.js');

interface Variant {
  label: string;
  schema: string;
  berth: Berth;
  /** Its Fetcher, wrapped when `--stages` is on. */
  fetcher: FetcherModule;
  /** Extra Worker options (`--with-options`). */
  options?: Record<string, unknown>;
}

const here = dirname(fileURLToPath(import.meta.url));

async function loadRevision(rev: string): Promise<Omit<Variant, 'schema'>> {
  const git = (...args: string[]) => execFileSync('git', args, { cwd: here, encoding: 'utf8' }).trim();
  const sha = git('rev-parse', '--short', '--verify', `${rev}^{commit}`);
  const dir = join(here, '.probe', sha);
  if (!existsSync(join(dir, 'src', 'index.ts'))) {
    mkdirSync(dir, { recursive: true });
    // Inside the repository, so the extracted src/ resolves this checkout's node_modules.
    const tar = execFileSync('git', ['archive', '--format=tar', sha, 'src'], {
      cwd: git('rev-parse', '--show-toplevel'),
      maxBuffer: 256 * 1024 * 1024,
    });
    execFileSync('tar', ['-x', '-C', dir], { input: tar });
  }
  const berth = (await import(pathToFileURL(join(dir, 'src', 'index.ts')).href)) as Berth;
  const fetcher = (await import(pathToFileURL(join(dir, 'src', 'processor', 'fetcher.ts')).href)) as FetcherModule;
  return { label: `${rev} (${sha})`, berth, fetcher };
}

interface Run {
  p50: number;
  p95: number;
  p99: number;
  /** berth rows only: fetches (`berth_claims_total`) per task picked up. */
  fetchesPerPickup?: number;
  /** With `--stages`: per stage, p50 / p95 / p99 over the pickups; and what each wake found the fetch loop doing. */
  stages?: Record<string, [number, number, number]>;
  wakeFound?: Record<string, number>;
  /** With `--stages`: the slowest 1 % of pickups, and how many of them each other statement of the worker's sessions overlapped. */
  tail?: {
    pickups: number;
    overlaps: Record<string, number>;
    busyMs: Record<string, number>;
    maxMs: Record<string, number>;
    runMs: number;
  };
}

/** `--stages`: a time-ordered log of what the worker's sessions and its fetcher did. */
type Ev = {
  t: number;
  kind: 'send' | 'enqueued' | 'notify' | 'fetch>' | 'fetch<' | 'q>' | 'q<';
  what: string;
  id?: number;
};
let events: Ev[] | null = null;
const note = (kind: Ev['kind'], what = '', id?: number): void => {
  events?.push({ t: performance.now(), kind, what, id });
};
let queryIds = 0;

/** The statement's name (berth names its hot statements) or its first words, for the worker's own sessions only. */
function statementLabel(client: pg.Client, config: unknown): string | null {
  const app = (client as unknown as { connectionParameters?: { application_name?: string } }).connectionParameters
    ?.application_name;
  if (!app?.startsWith('berth worker')) return null;
  // Without the schema's name, which would fill the label of every unnamed statement.
  const words = (text: string) =>
    text
      .replace(/"[^"]*"\./g, '')
      .replace(/\s+/g, ' ')
      .trim()
      .slice(0, 40);
  if (typeof config === 'string') return words(config);
  const c = config as { name?: string; text?: string } | null;
  const name = c?.name?.split(':')[0];
  // Either claim statement is the fetch's claim (a checkout from before 280258c has only the first).
  if (name === 'berth-claim-one-lane') return 'berth-claim';
  return name ?? (c?.text === undefined ? '?' : words(c.text));
}

function instrument(fetchers: FetcherModule[]): void {
  events = [];
  type Query = (this: pg.Client, ...args: unknown[]) => unknown;
  const query = pg.Client.prototype.query as unknown as Query;
  (pg.Client.prototype as unknown as { query: Query }).query = function (this: pg.Client, ...args: unknown[]) {
    const label = statementLabel(this, args[0]);
    if (label === null) return query.apply(this, args);
    const id = ++queryIds;
    note('q>', label, id);
    // The pool passes a callback; a direct call gets a promise.
    const last = args.length - 1;
    const cb = args[last];
    if (typeof cb === 'function') {
      args[last] = (...r: unknown[]) => {
        note('q<', label, id);
        return (cb as (...r: unknown[]) => unknown)(...r);
      };
      return query.apply(this, args);
    }
    const res = query.apply(this, args);
    if (res instanceof Promise)
      res.then(
        () => note('q<', label, id),
        () => note('q<', label, id),
      );
    return res;
  };
  const emit = pg.Client.prototype.emit;
  pg.Client.prototype.emit = function (this: pg.Client, event: string | symbol, ...args: unknown[]) {
    if (event === 'notification') note('notify');
    return emit.call(this, event, ...args);
  };
  for (const m of fetchers) {
    const fetch = m.Fetcher.prototype.fetch;
    m.Fetcher.prototype.fetch = async function (this: InstanceType<FetcherModule['Fetcher']>, want: number) {
      note('fetch>');
      try {
        return await fetch.call(this, want);
      } finally {
        note('fetch<');
      }
    };
  }
}

/**
 * Which of the worker's other statements (the leader's maintenance, the election, the
 * heartbeat: anything but the fetch's discovery and claim) were running during each of the
 * slowest 1 % of pickups: a statement in the tail far more often than its share of the time is
 * what the tail waits on.
 */
function tailOf(evs: readonly Ev[], sent: Float64Array, firstRun: Float64Array): NonNullable<Run['tail']> {
  const lat = Array.from(firstRun, (t, i) => t - sent[i]!);
  const threshold = percentile(lat, 99);
  const open = new Map<number, { what: string; t: number }>();
  const spans: { what: string; from: number; to: number }[] = [];
  for (const e of evs) {
    if (e.id === undefined || e.what === 'berth-claim' || e.what === 'berth-discover') continue;
    if (e.kind === 'q>') open.set(e.id, { what: e.what, t: e.t });
    else if (e.kind === 'q<') {
      const o = open.get(e.id);
      if (o) spans.push({ what: o.what, from: o.t, to: e.t });
      open.delete(e.id);
    }
  }
  const overlaps: Record<string, number> = {};
  const busyMs: Record<string, number> = {};
  const maxMs: Record<string, number> = {};
  const runFrom = sent[0]!;
  const runTo = Math.max(...firstRun);
  for (const sp of spans) {
    if (sp.to < runFrom || sp.from > runTo) continue;
    busyMs[sp.what] = (busyMs[sp.what] ?? 0) + (sp.to - sp.from);
    maxMs[sp.what] = Math.max(maxMs[sp.what] ?? 0, sp.to - sp.from);
  }
  let pickups = 0;
  for (let i = 0; i < lat.length; i++) {
    if (!(lat[i]! >= threshold)) continue;
    pickups++;
    if (process.env.PROBE_TAIL_DEBUG)
      console.error(
        `slow pickup at +${(sent[i]! - runFrom).toFixed(0)} ms: ${lat[i]!.toFixed(1)} ms;`,
        `[${evs
          .filter((e) => e.t >= sent[i]! && e.t <= firstRun[i]! && (e.kind !== 'send' || e.t > sent[i]!))
          .map((e) => `${e.kind}${e.what ? ` ${e.what.slice(0, 12)}` : ''} +${(e.t - sent[i]!).toFixed(1)}`)
          .join(', ')}]`,
        spans
          .filter((s) => s.from < firstRun[i]! && s.to > sent[i]!)
          .map((s) => `${s.what.slice(0, 20)} ${(s.from - runFrom).toFixed(0)}+${(s.to - s.from).toFixed(1)}`)
          .join(', '),
      );
    const seen = new Set(spans.filter((s) => s.from < firstRun[i]! && s.to > sent[i]!).map((s) => s.what));
    for (const w of seen) overlaps[w] = (overlaps[w] ?? 0) + 1;
  }
  return { pickups, overlaps, busyMs, maxMs, runMs: runTo - runFrom };
}

/** Splits each pickup into its stages, from the event log of one run. */
function stagesOf(evs: readonly Ev[], sent: Float64Array, firstRun: Float64Array): Pick<Run, 'stages' | 'wakeFound'> {
  const names = ['enqueue → wake', 'wake → fetch', 'fetch → claim', 'claim', 'claim → handler'] as const;
  const samples: Record<string, number[]> = Object.fromEntries(names.map((k) => [k, []]));
  const wakeFound: Record<string, number> = {};
  // What the fetch loop was doing at each notification: idle, or which statement of a fetch.
  let inFetch = false;
  let fetchDoing = 'idle';
  let j = 0;
  for (let i = 0; i < sent.length; i++) {
    while (j < evs.length && evs[j]!.t < sent[i]!) {
      const e = evs[j++]!;
      if (e.kind === 'fetch>') [inFetch, fetchDoing] = [true, 'fetch'];
      if (e.kind === 'fetch<') [inFetch, fetchDoing] = [false, 'idle'];
      if (e.kind === 'q>' && inFetch && (e.what === 'berth-claim' || e.what === 'berth-discover')) fetchDoing = e.what;
    }
    let wake = Number.NaN;
    let fetch = Number.NaN;
    let claimSent = Number.NaN;
    let claimBack = Number.NaN;
    for (let k = j; k < evs.length && evs[k]!.t <= firstRun[i]!; k++) {
      const e = evs[k]!;
      if (Number.isNaN(wake)) {
        if (e.kind === 'fetch>') [inFetch, fetchDoing] = [true, 'fetch'];
        if (e.kind === 'fetch<') [inFetch, fetchDoing] = [false, 'idle'];
        if (e.kind === 'q>' && inFetch && (e.what === 'berth-claim' || e.what === 'berth-discover'))
          fetchDoing = e.what;
        if (e.kind === 'notify') {
          wake = e.t;
          const doing = fetchDoing.replace('berth-', '');
          wakeFound[doing] = (wakeFound[doing] ?? 0) + 1;
        }
        // The first fetch after the wake, its first claim, and that claim's return.
      } else if (e.kind === 'fetch>' && Number.isNaN(fetch)) fetch = e.t;
      else if (e.kind === 'q>' && e.what === 'berth-claim' && !Number.isNaN(fetch) && Number.isNaN(claimSent))
        claimSent = e.t;
      else if (e.kind === 'q<' && e.what === 'berth-claim' && !Number.isNaN(claimSent) && Number.isNaN(claimBack))
        claimBack = e.t;
    }
    const parts = [wake - sent[i]!, fetch - wake, claimSent - fetch, claimBack - claimSent, firstRun[i]! - claimBack];
    // A task claimed by a fetch already under way at its wake (or with another task's wake) has
    // no stages of its own; the report says how many pickups were split.
    if (parts.every((x) => Number.isFinite(x) && x >= 0)) {
      for (const [k, x] of parts.entries()) samples[names[k]!]!.push(x);
    }
  }
  const stages: Record<string, [number, number, number]> = {};
  for (const k of names) stages[k] = [50, 95, 99].map((p) => percentile(samples[k]!, p)) as [number, number, number];
  stages['(pickups split)'] = [samples[names[0]]!.length, Number.NaN, Number.NaN];
  return { stages, wakeFound };
}

async function counter(worker: InstanceType<Berth['Worker']>, name: string): Promise<number> {
  const m = await worker.metrics.registry.getSingleMetric(name)?.get();
  return (m?.values ?? []).reduce((sum, v) => sum + v.value, 0);
}

async function run(v: Variant): Promise<Run> {
  const { berth, schema } = v;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await admin.end();
  }
  await berth.migrate({ connectionString: url!, schema });
  const firstRun = new Float64Array(n).fill(Number.NaN);
  let started = 0;
  const noop = berth.defineTask<{ i: number }>({
    type: 'noop',
    ceilingMs: 60_000,
    handler: async ({ i }) => {
      if (i >= 0 && Number.isNaN(firstRun[i]!)) {
        firstRun[i] = performance.now();
        started++;
      }
    },
  });
  const worker = new berth.Worker({
    connectionString: url!,
    schema,
    tasks: [noop],
    slots,
    logger: pino({ level: 'silent' }),
    ...v.options,
  });
  const pool = new pg.Pool({ connectionString: url });
  pool.on('error', () => {});
  const sent = new Float64Array(n);
  let fetches = 0;
  try {
    await worker.start();
    await berth.enqueue(pool, 'noop', { i: -1 }, { schema }); // warm the producer's connection
    await sleep(1_000); // let the worker go idle
    const fetchesBefore = await counter(worker, 'berth_claims_total');
    if (events) events = [];
    const base = performance.now();
    for (let i = 0; i < n; i++) {
      const wait = base + i * gapMs - performance.now();
      if (wait > 0) await sleep(wait);
      sent[i] = performance.now();
      note('send');
      await berth.enqueue(pool, 'noop', { i }, { schema });
      note('enqueued');
    }
    const end = performance.now() + 30_000;
    while (started < n && performance.now() < end) await sleep(2);
    if (started < n) throw new Error(`${v.label}: ${started}/${n} picked up 30 s after the last enqueue`);
    fetches = (await counter(worker, 'berth_claims_total')) - fetchesBefore;
  } finally {
    await worker.stop();
    await pool.end();
  }
  const lat = Array.from(firstRun, (t, i) => t - sent[i]!);
  return {
    p50: percentile(lat, 50),
    p95: percentile(lat, 95),
    p99: percentile(lat, 99),
    fetchesPerPickup: fetches / n,
    ...(events ? { ...stagesOf(events, sent, firstRun), tail: tailOf(events, sent, firstRun) } : {}),
  };
}

const variants: Variant[] = [
  {
    label: `this checkout (${berthRevision()})`,
    schema: 'pickup_probe_a',
    berth: await import('../src/index.js'),
    fetcher: await import('../src/processor/fetcher.js'),
  },
];
if (values['with-options']) {
  const options = JSON.parse(values['with-options']) as Record<string, unknown>;
  variants.push({
    ...variants[0]!,
    label: `this checkout + ${values['with-options']}`,
    schema: 'pickup_probe_c',
    options,
  });
}
if (values.compare) variants.push({ ...(await loadRevision(values.compare)), schema: 'pickup_probe_b' });
if (values.stages) instrument(variants.map((v) => v.fetcher));

/** A row: a berth variant, or a peer run through the bench's adapter and pickup scenario. */
type Row = { label: string; run: () => Promise<Run> };
const rows: Row[] = variants.map((v) => ({ label: v.label, run: () => run(v) }));
if (values.graphile) {
  const cfg = { ...loadConfig(url), pickupN: n, pickupGapMs: gapMs, pickupConcurrency: slots };
  for (const mode of ['default', 'throughput'] as const) {
    const adapter = graphileAdapter({ connectionString: url }, mode);
    rows.push({
      label: adapter.label,
      run: async () => {
        const o = await pickup(adapter, cfg);
        if (!o.ok) throw new Error(`${adapter.label}: ${o.note}`);
        return o.value;
      },
    });
  }
}

const results = new Map<Row, Run[]>(rows.map((v) => [v, []]));
for (let r = 0; r < reps; r++) {
  const order = r % 2 === 0 ? rows : [...rows].reverse();
  for (const v of order) {
    const res = await v.run();
    results.get(v)!.push(res);
    log(
      `rep ${r + 1} ${v.label}: p50 ${res.p50.toFixed(2)} / p95 ${res.p95.toFixed(2)} / p99 ${res.p99.toFixed(2)} ms` +
        (res.fetchesPerPickup === undefined ? '' : `, ${res.fetchesPerPickup.toFixed(2)} fetches/pickup`),
    );
  }
}

const cell = (xs: number[], digits = 1) =>
  `${median(xs).toFixed(digits)} (${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)})`;
console.log(`pickup probe: ${n} tasks ${gapMs} ms apart, ${slots} slots, ${reps} reps; median (min–max) of the runs\n`);
console.log('| system | p50 ms | p95 ms | p99 ms | fetches per pickup |');
console.log('| --- | ---: | ---: | ---: | ---: |');
for (const [v, rs] of results) {
  const fetches = rs.flatMap((x) => (x.fetchesPerPickup === undefined ? [] : [x.fetchesPerPickup]));
  console.log(
    `| ${v.label} | ${cell(rs.map((x) => x.p50))} | ${cell(rs.map((x) => x.p95))} | ${cell(rs.map((x) => x.p99))} | ` +
      `${fetches.length > 0 ? cell(fetches, 2) : '–'} |`,
  );
}

if (values.stages) {
  console.log("\nStages (`--stages`), ms: median over the runs of each run's p50 / p95 / p99\n");
  console.log(
    `| berth | ${Object.keys([...results.values()][0]![0]!.stages!)
      .filter((k) => !k.startsWith('('))
      .join(' | ')} | wake found the fetch loop |`,
  );
  console.log(`| --- |${' ---: |'.repeat(5)} --- |`);
  for (const [v, rs] of results) {
    if (rs[0]?.stages === undefined) continue;
    const keys = Object.keys(rs[0]!.stages!).filter((k) => !k.startsWith('('));
    const cells = keys.map((k) =>
      [0, 1, 2].map((q) => median(rs.map((r) => r.stages![k]![q]!)).toFixed(2)).join(' / '),
    );
    const found: Record<string, number> = {};
    for (const r of rs) for (const [k, c] of Object.entries(r.wakeFound!)) found[k] = (found[k] ?? 0) + c;
    const total = Object.values(found).reduce((a, b) => a + b, 0);
    const foundCell = Object.entries(found)
      .sort((a, b) => b[1] - a[1])
      .map(([k, c]) => `${k} ${((100 * c) / total).toFixed(1)}%`)
      .join(', ');
    const split = median(rs.map((r) => r.stages!['(pickups split)']![0]!));
    console.log(`| ${v.label} | ${cells.join(' | ')} | ${foundCell}; ${split} of ${n} pickups split (median) |`);
  }
  console.log("\nThe slowest 1 % of pickups (all runs): how many overlapped each of the worker's other statements\n");
  for (const [v, rs] of results) {
    if (rs[0]?.tail === undefined) continue;
    const pickups = rs.reduce((a, r) => a + r.tail!.pickups, 0);
    const sum = (pick: (t: NonNullable<Run['tail']>) => Record<string, number>, max = false) => {
      const out: Record<string, number> = {};
      for (const r of rs)
        for (const [k, c] of Object.entries(pick(r.tail!))) out[k] = max ? Math.max(out[k] ?? 0, c) : (out[k] ?? 0) + c;
      return out;
    };
    const overlaps = sum((t) => t.overlaps);
    const busy = sum((t) => t.busyMs);
    const longest = sum((t) => t.maxMs, true);
    const runMs = rs.reduce((a, r) => a + r.tail!.runMs, 0);
    // In the tail N times, running for x % of the time (the share a random pickup would overlap), longest y ms.
    const list = Object.entries(overlaps)
      .sort((a, b) => b[1] - a[1])
      .map(
        ([k, c]) =>
          `${JSON.stringify(k)} ${c} (busy ${((100 * (busy[k] ?? 0)) / runMs).toFixed(1)} %, longest ${(longest[k] ?? 0).toFixed(1)} ms)`,
      )
      .join(', ');
    console.log(`- ${v.label}: ${pickups} pickups; ${list || 'none'}`);
  }
}
