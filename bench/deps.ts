/**
 * Task dependencies at scale (issue 33, item 5): `npm run bench:deps`.
 *
 *   npm run bench:deps -- [--reps 3] [--scale 1] [--systems berth,pg-boss] [--only ROW,...]
 *                         [--warmup 20000] [--timeout 900] [--peer-timeout 180] [--flow-interval 1] [--peer-poll 0.5]
 *
 * Rows (`--only` takes their ids), each a graph of no-op tasks (bench/deps/shapes.ts), sizes
 * times `--scale`:
 * - baseline: 10,000 plain tasks (no dependencies);
 * - fan-out: 1 parent, 10,000 dependents;
 * - fan-in: 10,000 parents, 1 dependent;
 * - layers: 20 layers of 500 tasks, each depending on 3 tasks of the previous layer;
 * - chain: 10,000 tasks, each depending on the previous;
 * each in one enqueueMany call (`{ ref }` parents), and `layers-per-layer` and `chain-per-link`:
 * one call per layer or per link naming the ids the previous call returned. A parent enqueued
 * by an earlier call may already be in its lane unmarked, so its edges are watched: the leader's
 * `deps` branch releases them within its tick (250 ms) unless the parent was released itself
 * after its dependent was written (it is then marked, and its completion releases them).
 *
 * One run: a fresh schema; one worker process (bench/deps/worker.ts) with 10 slots that leads
 * maintenance, as the drain rows of `npm run bench` run; `--warmup` plain tasks drained,
 * unrecorded; then the row's enqueue, from the driver, while the worker runs. Measured:
 * - enqueue: wall clock of the enqueue call(s);
 * - drain: enqueue done → the last task's completion recorded, on the database clock (the
 *   completion's settlement time; enqueue done read with clock_timestamp() after the last call);
 * - total: the first call's start → the last completion, which for the per-call rows covers
 *   what ran while the producer was still enqueuing;
 * - delay, per dependent that waited: its start (its lease's claimed_at) minus the latest
 *   completion (settled_at) among its parents, on the database clock; min, p50, p99, max. For
 *   a fan-out this includes the dependents' queueing behind each other (10 slots), so its min is
 *   the release's latency and its p50 is mostly the queue;
 * - released: dependents ready at their enqueue (every parent had completed by then), freed by
 *   their last parent's completion, freed by the leader (`berth_dependency_releases_total{path}`
 *   of the worker's metrics), and how many entries the leader's promotion appended (a release
 *   whose lane lock was busy leaves the task due for the next promotion tick);
 * - chain: time per link, (last link's completion − first link's) / (links − 1).
 * Checks (the script exits 1 when one fails): every task completed exactly once, in one attempt,
 * and no dependent started before its last parent's completion was recorded.
 *
 * pg-boss (installed 12.x) has dependencies, `flow()`, for graphs in one call only; it runs the
 * one-call rows (bench/deps/pgboss.ts), each within `--peer-timeout` seconds: its flow resolver
 * unblocks dependents every `--flow-interval` seconds (its minimum, 1; pg-boss's default 5) and
 * its worker finds them at its next poll, every `--peer-poll` seconds (its minimum, 0.5), so a
 * chain of 10,000 does not finish in any reasonable time; the row then reports how far it got
 * and its time per link.
 *
 * Cells: the median over `--reps` repetitions (rows and systems interleaved, their order rotated
 * per repetition), with (min–max) for the times. Runs on a throwaway cluster of its own with
 * stock settings (bench/cluster.ts); BENCH_DATABASE_URL targets an existing server instead.
 * The report goes to stdout and bench/results/deps-latest.md.
 */
import { readFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { analyse, type Measured } from './deps/analysis.js';
import { berthSystem } from './deps/berth.js';
import { pgBossSystem } from './deps/pgboss.js';
import { type CallMode, dependents, type ShapeName, shapesAt } from './deps/shapes.js';
import type { CrossCheck, DepsSystem, ReleaseCounts } from './deps/system.js';
import { loadConfig } from './config.js';
import { Monitor, openBenchServer, recreateDatabase } from './db.js';
import { fmtMs, median } from './stats.js';
import { berthRevision, log, sleep } from './util.js';

const SLOTS = 10;

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '3' },
    scale: { type: 'string', default: '1' },
    systems: { type: 'string', default: 'berth,pg-boss' },
    only: { type: 'string' },
    warmup: { type: 'string', default: '20000' },
    timeout: { type: 'string', default: '900' },
    'peer-timeout': { type: 'string', default: '180' },
    'flow-interval': { type: 'string', default: '1' },
    'peer-poll': { type: 'string', default: '0.5' },
  },
});
function intArg(name: string, raw: string, min: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got "${raw}"`);
  return n;
}
const REPS = intArg('reps', values.reps, 1);
const SCALE = Number(values.scale);
if (!Number.isFinite(SCALE) || SCALE <= 0 || SCALE > 1)
  throw new Error(`--scale must be in (0, 1], got "${values.scale}"`);
const WARMUP = Math.round(intArg('warmup', values.warmup, 0) * SCALE);
const TIMEOUT_MS = intArg('timeout', values.timeout, 1) * 1000;
const PEER_TIMEOUT_MS = intArg('peer-timeout', values['peer-timeout'], 1) * 1000;
const FLOW_INTERVAL_S = intArg('flow-interval', values['flow-interval'], 1);
const PEER_POLL_S = Number(values['peer-poll']);
if (!Number.isFinite(PEER_POLL_S) || PEER_POLL_S < 0.5)
  throw new Error(`--peer-poll must be a number of seconds >= 0.5 (pg-boss's minimum), got "${values['peer-poll']}"`);

interface Row {
  id: string;
  shape: ShapeName;
  mode: CallMode;
}
const ALL_ROWS: Row[] = [
  { id: 'baseline', shape: 'baseline', mode: 'one call' },
  { id: 'fan-out', shape: 'fan-out', mode: 'one call' },
  { id: 'fan-in', shape: 'fan-in', mode: 'one call' },
  { id: 'layers', shape: 'layers', mode: 'one call' },
  { id: 'layers-per-layer', shape: 'layers', mode: 'per layer' },
  { id: 'chain', shape: 'chain', mode: 'one call' },
  { id: 'chain-per-link', shape: 'chain', mode: 'per link' },
];
const only = values.only?.split(',').map((s) => s.trim());
const unknownRow = only?.find((id) => !ALL_ROWS.some((r) => r.id === id));
if (unknownRow !== undefined)
  throw new Error(`--only: no row "${unknownRow}" (rows: ${ALL_ROWS.map((r) => r.id).join(', ')})`);
const rows = only ? ALL_ROWS.filter((r) => only.includes(r.id)) : ALL_ROWS;
const systemNames = values.systems.split(',').map((s) => s.trim());
for (const s of systemNames) if (s !== 'berth' && s !== 'pg-boss') throw new Error(`--systems: unknown "${s}"`);

const shapes = shapesAt(SCALE);
const pgBossVersion = (
  JSON.parse(readFileSync(new URL('../node_modules/pg-boss/package.json', import.meta.url), 'utf8')) as {
    version: string;
  }
).version;

/** Every repetition's measurements of one row and system. */
interface Cell {
  runs: Measured[];
  enqueueMs: number[];
  calls: number;
  releases: ReleaseCounts[];
  failures: string[];
}
const cells = new Map<string, Cell>();
const cellOf = (row: Row, system: string): Cell => {
  const key = `${row.id}/${system}`;
  let c = cells.get(key);
  if (!c) {
    c = { runs: [], enqueueMs: [], calls: 0, releases: [], failures: [] };
    cells.set(key, c);
  }
  return c;
};
const problems: string[] = [];
const crossChecks: CrossCheck[] = [];
const workerErrors: string[] = [];

const loads: number[] = [];
const loadTimer = setInterval(() => loads.push(loadavg()[0]!), 5000);
loadTimer.unref();
const started = Date.now();
const loadStart = loadavg();

const server = await openBenchServer();
const cfg = loadConfig(server.adminUrl);
await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
const url = cfg.benchUrl;
const monitor = await Monitor.open(url);
const serverVersion = (await monitor.serverInfo()).version;
await monitor.close();

const systems: DepsSystem[] = systemNames.map((s) =>
  s === 'berth'
    ? berthSystem(url, SLOTS)
    : pgBossSystem(url, SLOTS, { flowIntervalS: FLOW_INTERVAL_S, pollS: PEER_POLL_S }),
);

const int = (x: number) => Math.round(x).toLocaleString('en-US');
type Delay = Measured['delay'];
const oneDelay = (d: Delay) =>
  d === null ? '–' : `${int(d.n)} · ${[d.min, d.p50, d.p99, d.max].map(fmtMs).join(' / ')}`;
/** Over the repetitions: the median count, then the medians of each run's min / p50 / p99 / max. */
const medianDelay = (ds: Delay[]) => {
  const xs = ds.filter((d) => d !== null);
  if (xs.length === 0) return '–';
  const m = (f: (d: NonNullable<Delay>) => number) => median(xs.map(f));
  return `${int(m((d) => d.n))} · ${[m((d) => d.min), m((d) => d.p50), m((d) => d.p99), m((d) => d.max)].map(fmtMs).join(' / ')}`;
};

/** One run of one row on one system; its measurements go into its cell. */
async function runOnce(row: Row, sys: DepsSystem, rep: number): Promise<void> {
  const shape = shapes[row.shape];
  const cell = cellOf(row, sys.name);
  const timeoutMs = sys.name === 'berth' ? TIMEOUT_MS : PEER_TIMEOUT_MS;
  const what = `rep ${rep + 1}/${REPS} ${row.id} ${sys.name}`;
  try {
    await sys.prepare();
    if (WARMUP > 0) await sys.warmUp(WARMUP, 120_000);
    const e = await sys.enqueue(shape, row.mode);
    cell.calls = e.calls;
    const deadline = performance.now() + timeoutMs;
    let left = await sys.pending();
    while (left > 0 && performance.now() < deadline) {
      await sleep(100);
      left = await sys.pending();
    }
    const timings = await sys.timings(e);
    const m = analyse(shape, timings, {
      enqueueStartDbMs: e.startDbMs,
      enqueueDoneDbMs: e.doneDbMs,
      readyAtEnqueue: e.readyAtEnqueue,
    });
    const rel = await sys.releases();
    const check = await sys.crossCheck(e, timings);
    if (check !== null) crossChecks.push(check);
    if (check !== null && check.differ > 0)
      problems.push(`${what}: attempt history's times differ from the ring's for ${check.differ} tasks`);
    cell.runs.push(m);
    cell.enqueueMs.push(e.wallMs);
    if (rel) cell.releases.push(rel);
    if (m.completed < m.tasks)
      cell.failures.push(`timeout: ${int(m.completed)} of ${int(m.tasks)} completed in ${int(timeoutMs / 1000)} s`);
    for (const p of m.problems) problems.push(`${what}: ${p}`);
    const d = m.delay;
    const p = m.byPath;
    log(
      `${what}: enqueue ${int(e.wallMs)} ms in ${int(e.calls)} call(s); ` +
        (m.drainMs === null ? `${int(m.completed)}/${int(m.tasks)} completed; ` : `drain ${int(m.drainMs)} ms; `) +
        (d
          ? `delay min ${fmtMs(d.min)} / p50 ${fmtMs(d.p50)} / p99 ${fmtMs(d.p99)} / max ${fmtMs(d.max)} ms (${int(d.n)}); `
          : '') +
        (p
          ? `by path: completion ${oneDelay(p.completion)}, later ${oneDelay(p.later)}, unknown ${int(p.unknown)}; `
          : '') +
        (rel
          ? `released ${int(m.readyAtEnqueue)} at enqueue / ${int(rel.completion)} completion / ${int(rel.leader)} leader, ${int(rel.promoted)} promoted; `
          : '') +
        (m.perLinkMs !== null ? `${fmtMs(m.perLinkMs)} ms a link; ` : '') +
        (check
          ? `${int(check.inRing)} of ${int(check.tasks)} tasks still in the ring, history's times differ for ${int(check.differ)}`
          : '') +
        (m.problems.length ? `; PROBLEMS: ${m.problems.join('; ')}` : ''),
    );
  } catch (err) {
    cell.failures.push(`error: ${(err as Error).message}`);
    log(`${what}: error ${(err as Error).stack ?? String(err)}`);
  } finally {
    const errs = sys.errors();
    if (errs.length > 0) workerErrors.push(`${what}: ${errs.slice(0, 3).join(' | ')}`);
    await sys.finish().catch((err: unknown) => log(`${what}: cleanup failed: ${(err as Error).message}`));
  }
}

try {
  log(
    `${server.description}; scale ${SCALE}; ${REPS} repetition(s); rows ${rows.map((r) => r.id).join(', ')}; ` +
      `systems ${systems.map((s) => s.name).join(', ')}; warm-up ${int(WARMUP)} tasks a run`,
  );
  for (let rep = 0; rep < REPS; rep++) {
    const order = rows.map((_, i) => rows[(i + rep) % rows.length]!);
    for (const row of order)
      for (const sys of systems) {
        const why = sys.unsupported(row.mode);
        if (why === null) await runOnce(row, sys, rep);
      }
  }
} finally {
  for (const s of systems) await s.close();
  await server.stop();
  clearInterval(loadTimer);
}
const loadEnd = loadavg();

const range = (xs: number[], fmt: (x: number) => string) =>
  xs.length === 0
    ? '–'
    : xs.length === 1
      ? fmt(xs[0]!)
      : `${fmt(median(xs))} (${fmt(Math.min(...xs))}–${fmt(Math.max(...xs))})`;
const med = (xs: number[], fmt: (x: number) => string) => (xs.length === 0 ? '–' : fmt(median(xs)));
const loadStr = (l: number[]) => l.map((x) => x.toFixed(2)).join(' / ');
const scaleFlag = SCALE === 1 ? '' : ` --scale ${SCALE}`;
const lines: string[] = [
  `# Task dependencies at scale — ${new Date().toISOString()}`,
  '',
  `Command: \`npm run bench:deps -- --reps ${REPS}${scaleFlag} --systems ${systemNames.join(',')}` +
    `${only ? ` --only ${only.join(',')}` : ''} --warmup ${values.warmup} --timeout ${TIMEOUT_MS / 1000} ` +
    `--peer-timeout ${PEER_TIMEOUT_MS / 1000} --flow-interval ${FLOW_INTERVAL_S} --peer-poll ${PEER_POLL_S}\` · total ${int((Date.now() - started) / 1000)} s`,
  '',
  `Node ${process.version}, ${cpus().length} CPUs · PostgreSQL ${serverVersion}, ${server.description} · ` +
    `berth ${berthRevision()} (src/) · pg-boss ${pgBossVersion}`,
  '',
  `Load average (1 / 5 / 15 min): ${loadStr(loadStart)} at start, ${loadStr(loadEnd)} at end; 1-min samples every 5 s: ` +
    `median ${loads.length ? median(loads).toFixed(2) : '–'}, max ${loads.length ? Math.max(...loads).toFixed(2) : '–'}.`,
  '',
  `One worker process, ${SLOTS} slots, no-op handlers, warmed up with ${int(WARMUP)} plain tasks a run. ` +
    'Times in ms; enqueue and drain: median (min–max) over the repetitions; delay (last parent completed → ' +
    "dependent claimed, database clock): the medians of each run's min / p50 / p99 / max; released: dependents " +
    "ready at enqueue / freed by their last parent's completion / freed by the leader (medians).",
  '',
  '| graph | calls | system | enqueue | drain | first call → last completion | delay min / p50 / p99 / max | released: enqueue / completion / leader | per link |',
  '| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |',
];
for (const row of rows) {
  const shape = shapes[row.shape];
  for (const sys of systems) {
    const how = row.mode === 'one call' ? '1' : row.mode;
    const why = sys.unsupported(row.mode);
    if (why !== null) {
      lines.push(`| ${shape.label} | ${how} | ${sys.name} | not supported: ${why} | | | | | |`);
      continue;
    }
    const c = cellOf(row, sys.name);
    const runs = c.runs;
    const fail = c.failures.length > 0 ? ` (${c.failures.length} of ${REPS}: ${c.failures[0]})` : '';
    const delayCell = medianDelay(runs.map((m) => m.delay)).replace(/^[\d,]+ · /, '');
    const releasedCell =
      dependents(shape).length === 0
        ? '–'
        : c.releases.length > 0
          ? [runs.map((m) => m.readyAtEnqueue), c.releases.map((r) => r.completion), c.releases.map((r) => r.leader)]
              .map((xs) => med(xs, int))
              .join(' / ')
          : 'flow resolver';
    lines.push(
      `| ${shape.label} | ${c.calls > 1 ? int(c.calls) : how} | ${sys.name}${fail} | ${range(c.enqueueMs, int)} | ` +
        `${range(
          runs.flatMap((m) => (m.drainMs === null ? [] : [m.drainMs])),
          int,
        )} | ${med(
          runs.flatMap((m) => (m.totalMs === null ? [] : [m.totalMs])),
          int,
        )} | ${delayCell} | ${releasedCell} | ${med(
          runs.flatMap((m) => (m.perLinkMs === null ? [] : [m.perLinkMs])),
          fmtMs,
        )} |`,
    );
  }
}
// The delays by release path, for the rows where the leader freed some (berth records when).
const pathRows: string[] = [];
for (const row of rows)
  for (const sys of systems) {
    const paths = cellOf(row, sys.name).runs.flatMap((m) => (m.byPath ? [m.byPath] : []));
    if (paths.length === 0 || paths.every((p) => p.later === null)) continue;
    pathRows.push(
      `| ${shapes[row.shape].label} | ${row.mode} | ${sys.name} | ${medianDelay(paths.map((p) => p.completion))} | ` +
        `${medianDelay(paths.map((p) => p.later))} | ${med(
          paths.map((p) => p.unknown),
          int,
        )} |`,
    );
  }
if (pathRows.length > 0)
  lines.push(
    '',
    "Delay by how the dependent was freed (berth: a dependent's release time is the latest `satisfied_at` of its " +
      "edges; equal to its last parent's completion: freed in that completing transaction; later: by the leader's " +
      "watch, or the prune's backstop). Median count · medians of min / p50 / p99 / max ms; unknown: edges already " +
      'pruned by the leader (a minute after the dependent completed) when the run ended.',
    '',
    '| graph | calls | system | freed by the completion | freed later (leader) | unknown |',
    '| --- | --- | --- | ---: | ---: | ---: |',
    ...pathRows,
  );
const promoted = [...cells.entries()].filter(([k]) => k.endsWith('/berth')).flatMap(([, c]) => c.releases);
lines.push(
  '',
  `Settings. ${systems.map((s) => `${s.name}: ${s.settings}.`).join(' ')}`,
  '',
  `berth: entries appended by the leader's promotion over all runs (a release that found its lane locked): ` +
    `${int(promoted.reduce((a, r) => a + r.promoted, 0))}.`,
  '',
  "Where the times come from: berth, attempt history (per task its lease's `claimed_at` and its completing " +
    "settlement's `settled_at`, the values `range_leases` and `range_settlements` hold, kept after the leader prunes " +
    'a drained ring segment); pg-boss, its job rows (`started_on`, `completed_on`). ' +
    (crossChecks.length === 0
      ? ''
      : `Checked against the ring's own rows at the end of each berth run (ready(id) → its lease's [from_seq, to_seq] ` +
        `and the settlement holding its lane_seq), for the tasks whose segment was not pruned yet: ` +
        `${int(crossChecks.reduce((a, c) => a + c.inRing, 0))} of ${int(crossChecks.reduce((a, c) => a + c.tasks, 0))} ` +
        `tasks over ${crossChecks.length} runs, times differing for ${int(crossChecks.reduce((a, c) => a + c.differ, 0))}.`),
  '',
  problems.length === 0
    ? 'Checks: every task completed exactly once in one attempt; no dependent started before its last parent completed.'
    : `CHECKS FAILED:\n${problems.map((p) => `- ${p}`).join('\n')}`,
  ...(workerErrors.length ? ['', 'Worker errors:', ...workerErrors.map((e) => `- ${e}`)] : []),
);
const report = `${lines.join('\n')}\n`;
mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
writeFileSync(new URL('./results/deps-latest.md', import.meta.url), report);
process.stdout.write(report);
log(`done in ${int((Date.now() - started) / 1000)} s; report in bench/results/deps-latest.md`);
if (problems.length > 0) process.exitCode = 1;
