/**
 * `npm run bench:growth`: how berth's cost grows with the work (issue 11, item 5). berth only,
 * at its defaults (a `Worker` with GROWTH_SLOTS slots, default 10), on a dedicated stock cluster
 * with pg_stat_statements preloaded (read for the server time per task) unless
 * BENCH_DATABASE_URL names an existing server.
 *
 * 1. Queue size: N tasks enqueued in bulk, then drained (GROWTH_SIZES, default 20k, 200k, 2M).
 *    Cost per task should stay flat.
 * 2. Active lanes: GROWTH_LANE_TASKS tasks spread evenly over L lanes (GROWTH_LANES, default
 *    1, 16, 256), drained; every claim the worker makes (discovery plus claim) is timed.
 * 3. Enqueue: P producers (GROWTH_PRODUCERS, default 1, 4, 16), each its own connection making
 *    single-task `enqueue` calls on one queue, against the shard count it spreads over
 *    (GROWTH_SHARDS, default 1, 4, 16, 64).
 *
 * Repetitions (GROWTH_REPS, default 3) interleave the cells, order rotated; sizes of a million or
 * more run GROWTH_LARGE_REPS times (default 1). GROWTH_SECTIONS picks sections (sizes,lanes,enqueue).
 * Output: bench/results/growth.md and growth-*.svg there (also into docs/ with GROWTH_DOCS=1).
 */
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import pg from 'pg';
import { pino } from 'pino';
import { BerthMetrics, defineTask, enqueue, enqueueMany, migrate, Worker, type TaskSpec } from '../src/index.js';
import { intEnv, intListEnv } from './config.js';
import { berthPending } from './systems/berth-pending.js';
import { dropSchema, openBenchServer, recreateDatabase } from './db.js';
import { RunTracker, untilRecorded } from './scenarios.js';
import { fmtMs, fmtRate, formatCell, median, percentile, type Sample } from './stats.js';
import { compact, lineChart, type Series } from './svg.js';
import { berthRevision, cleanup, log, waitUntil, withTimeout } from './util.js';

const SCHEMA = 'berth_growth';
const DB = 'berth_growth';
const PROBE_ROLE = 'berth_bench_probe';
const LARGE = 1_000_000;
const silent = pino({ level: 'silent' });

const SECTIONS = ['sizes', 'lanes', 'enqueue'] as const;
type Section = (typeof SECTIONS)[number];

function loadGrowthConfig() {
  const sections = (process.env.GROWTH_SECTIONS ?? SECTIONS.join(','))
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const s of sections) {
    if (!(SECTIONS as readonly string[]).includes(s))
      throw new Error(`GROWTH_SECTIONS: unknown section "${s}" (known: ${SECTIONS.join(', ')})`);
  }
  return {
    sections: new Set(sections as Section[]),
    sizes: intListEnv('GROWTH_SIZES', [20_000, 200_000, 2_000_000]),
    reps: intEnv('GROWTH_REPS', 3),
    largeReps: intEnv('GROWTH_LARGE_REPS', 1),
    lanes: intListEnv('GROWTH_LANES', [1, 16, 256]),
    laneTasks: intEnv('GROWTH_LANE_TASKS', 20_000),
    producers: intListEnv('GROWTH_PRODUCERS', [1, 4, 16]),
    shards: intListEnv('GROWTH_SHARDS', [1, 4, 16, 64]),
    enqueueN: intEnv('GROWTH_ENQUEUE_N', 4_000),
    slots: intEnv('GROWTH_SLOTS', 10),
    bulkBatch: 1_000,
    docs: process.env.GROWTH_DOCS === '1',
  };
}
type GrowthConfig = ReturnType<typeof loadGrowthConfig>;

/**
 * Per drain: 60 s plus 0.4 ms per task (2M: 14.3 min, i.e. at least ~2,300 tasks/s), unless
 * GROWTH_TIMEOUT_S says otherwise.
 */
function drainTimeoutMs(n: number): number {
  const fixed = process.env.GROWTH_TIMEOUT_S;
  return fixed ? intEnv('GROWTH_TIMEOUT_S', 60) * 1000 : 60_000 + n * 0.4;
}

/** What the bench database offers: server time from pg_stat_statements, a separate probe login. */
interface Env {
  url: string;
  /** Connection string for the pending-count probe (a role of its own when it could be made). */
  probeUrl: string;
  /** null when pg_stat_statements is not loaded: no server time. */
  statements: boolean;
  /** The probe's statements are left out of the server time only when it has a role of its own. */
  probeRoleOid: number | null;
}

async function prepareEnv(url: string): Promise<Env> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    let statements = true;
    try {
      await c.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
      await c.query('SELECT pg_stat_statements_reset()');
    } catch (err) {
      statements = false;
      log(`pg_stat_statements unavailable (${(err as Error).message}); no server time per task`);
    }
    let probeRoleOid: number | null = null;
    let probeUrl = url;
    try {
      await c.query(`DO $$ BEGIN CREATE ROLE ${PROBE_ROLE} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`);
      await c.query(`GRANT pg_read_all_data TO ${PROBE_ROLE}`);
      const u = new URL(url);
      u.username = PROBE_ROLE;
      u.password = '';
      const t = new pg.Client({ connectionString: u.toString() });
      await t.connect();
      await t.end();
      probeUrl = u.toString();
      probeRoleOid = Number(
        (await c.query<{ oid: string }>('SELECT oid::text AS oid FROM pg_roles WHERE rolname = $1', [PROBE_ROLE]))
          .rows[0]!.oid,
      );
    } catch (err) {
      log(`probe role unavailable (${(err as Error).message}); the probe's reads count in the server time`);
    }
    return { url, probeUrl, statements, probeRoleOid };
  } finally {
    await c.end();
  }
}

async function dropProbeRole(adminUrl: string): Promise<void> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  try {
    await c.query(`DROP ROLE IF EXISTS ${PROBE_ROLE}`);
  } finally {
    await c.end();
  }
}

async function resetSchema(url: string): Promise<void> {
  await dropSchema(url, SCHEMA);
  await migrate({ connectionString: url, schema: SCHEMA });
}

/** Lane `l` of the lanes section: 64 shards per queue, as many queues as needed. */
function laneOf(l: number): { queue: string; shard: number } {
  return { queue: `lanes${Math.floor(l / 64)}`, shard: l % 64 };
}

interface DrainRun {
  n: number;
  enqueuePerSec: number;
  tasksPerSec: number;
  tailMs: number;
  walBytes: number;
  /** Summed execution time of the worker's statements, ms; null without pg_stat_statements. */
  serverMs: number | null;
  /** Every discovery-plus-claim the worker ran, ms. */
  claimMs: number[];
  claimedTasks: number;
}

type Outcome = { ok: true; run: DrainRun } | { ok: false; note: string };

/**
 * Enqueue `n` tasks (over `lanes` lanes, or berth's default lane choice), then drain them with
 * a fresh Worker and time until the database shows every completion recorded.
 */
async function drainOnce(env: Env, cfg: GrowthConfig, n: number, lanes: number | null): Promise<Outcome> {
  await resetSchema(env.url);
  const pool = new pg.Pool({ connectionString: env.url, max: 2 });
  pool.on('error', () => {});
  const e0 = performance.now();
  try {
    for (let start = 0; start < n; start += cfg.bulkBatch) {
      const specs: TaskSpec[] = [];
      for (let i = start; i < Math.min(n, start + cfg.bulkBatch); i++) {
        specs.push(
          lanes === null ? { type: 'noop', payload: { i } } : { type: 'noop', payload: { i }, ...laneOf(i % lanes) },
        );
      }
      await enqueueMany(pool, specs, { schema: SCHEMA });
    }
  } finally {
    await pool.end();
  }
  const enqueuePerSec = n / ((performance.now() - e0) / 1000);

  const admin = new pg.Client({ connectionString: env.url, application_name: 'bench-growth' });
  const probe = new pg.Client({ connectionString: env.probeUrl, application_name: 'bench-probe' });
  await admin.connect();
  await probe.connect();
  // One read before the clock (and the statistics reset): a session's first read plans and loads
  // the ring partitions' catalog entries (~30 ms), which otherwise lands in the drain's tail.
  await berthPending(probe, SCHEMA);
  const tracker = new RunTracker(n);
  const metrics = new BerthMetrics();
  const claimMs: number[] = [];
  const observe = metrics.claimSeconds.observe.bind(metrics.claimSeconds) as (v: number) => void;
  metrics.claimSeconds.observe = ((v: number) => {
    claimMs.push(v * 1000);
    observe(v);
  }) as typeof metrics.claimSeconds.observe;
  const noop = defineTask<{ i: number }>({
    type: 'noop',
    ceilingMs: 60_000,
    handler: async (p) => tracker.record(p.i),
  });
  let worker: Worker | null = null;
  try {
    await admin.query('CHECKPOINT');
    if (env.statements) await admin.query('SELECT pg_stat_statements_reset()');
    const lsn0 = (await admin.query<{ l: string }>('SELECT pg_current_wal_lsn()::text AS l')).rows[0]!.l;
    const t0 = performance.now();
    const deadline = t0 + drainTimeoutMs(n);
    worker = new Worker({
      connectionString: env.url,
      schema: SCHEMA,
      tasks: [noop],
      // The lanes section spreads over queues `lanes0`, `lanes1`, …: serve them all.
      queues: 'all',
      slots: cfg.slots,
      logger: silent,
      metrics,
    });
    await worker.start();
    const started = await waitUntil(() => tracker.distinct >= n, Math.max(0, deadline - performance.now()), 10);
    const recorded = started ? await untilRecorded(() => berthPending(probe, SCHEMA), deadline) : null;
    await cleanup('growth worker stop', () => worker!.stop());
    worker = null;
    if (!recorded || recorded.at === null) {
      const s = (performance.now() - t0) / 1000;
      return {
        ok: false,
        note: started
          ? `all started; ${recorded?.left ?? '?'} not recorded as completed after ${Math.round(s)} s`
          : `${tracker.distinct.toLocaleString('en-US')}/${n.toLocaleString('en-US')} started in ${Math.round(s)} s`,
      };
    }
    const wal = await admin.query<{ d: string }>(
      'SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::text AS d',
      [lsn0],
    );
    let serverMs: number | null = null;
    if (env.statements) {
      const r = await admin.query<{ ms: string }>(
        `SELECT coalesce(sum(total_exec_time), 0)::text AS ms FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND userid IS DISTINCT FROM $1::oid
            AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal_lsn%'`,
        [env.probeRoleOid],
      );
      serverMs = Number(r.rows[0]!.ms);
    }
    const claimedTasks = Number((await metrics.claimedTasks.prom.get()).values[0]?.value ?? 0);
    return {
      ok: true,
      run: {
        n,
        enqueuePerSec,
        tasksPerSec: n / ((recorded.at - t0) / 1000),
        tailMs: recorded.at - tracker.lastFirstRun,
        walBytes: Number(wal.rows[0]!.d),
        serverMs,
        claimMs,
        claimedTasks,
      },
    };
  } finally {
    if (worker) await cleanup('growth worker stop', () => worker!.stop());
    await cleanup('probe close', () => probe.end());
    await cleanup('admin close', () => admin.end());
  }
}

/** `producers` connections, each making single-task enqueue calls on one queue over `shards` shards. */
async function enqueueOnce(env: Env, cfg: GrowthConfig, producers: number, shards: number): Promise<number> {
  await resetSchema(env.url);
  const clients = Array.from(
    { length: producers },
    () => new pg.Client({ connectionString: env.url, application_name: 'bench-producer' }),
  );
  await Promise.all(clients.map((c) => c.connect()));
  try {
    const opts = { schema: SCHEMA, queue: 'growth', shards };
    // One call each first: connections warm, every lane the run will touch most likely open.
    await Promise.all(clients.map((c) => enqueue(c, 'noop', { i: -1 }, opts)));
    const per = Math.ceil(cfg.enqueueN / producers);
    const t0 = performance.now();
    await withTimeout(
      Promise.all(
        clients.map(async (c, k) => {
          for (let j = 0; j < per; j++) await enqueue(c, 'noop', { i: k * per + j }, opts);
        }),
      ),
      300_000,
      `enqueue ${producers} producers × ${shards} shards`,
    );
    return (per * producers) / ((performance.now() - t0) / 1000);
  } finally {
    await Promise.all(clients.map((c) => cleanup('producer close', () => c.end())));
  }
}

/** Samples per cell key, rendered as median (min–max). */
class Cells {
  private readonly m = new Map<string, Sample[]>();
  add(key: string, s: Sample): void {
    const list = this.m.get(key) ?? [];
    list.push(s);
    this.m.set(key, list);
  }
  get(key: string): Sample[] {
    return this.m.get(key) ?? [];
  }
  /** Median of the ok samples (NaN if none). */
  median(key: string): number {
    return median(this.get(key).flatMap((s) => (s.kind === 'ok' ? [s.value] : [])));
  }
}

async function main(): Promise<void> {
  const cfg = loadGrowthConfig();
  const begun = Date.now();
  const server = await openBenchServer({ shared_preload_libraries: 'pg_stat_statements' });
  try {
    await recreateDatabase(server.adminUrl, DB);
    const u = new URL(server.adminUrl);
    u.pathname = `/${DB}`;
    const env = await prepareEnv(u.toString());
    const c = new pg.Client({ connectionString: env.url });
    await c.connect();
    const version = (await c.query<{ v: string }>("SELECT current_setting('server_version') AS v")).rows[0]!.v;
    const settings = (
      await c.query<{ s: string }>(
        `SELECT string_agg(name || '=' || setting || coalesce(' ' || unit, ''), ', ' ORDER BY name) AS s FROM pg_settings
          WHERE name IN ('autovacuum', 'shared_buffers', 'max_wal_size', 'synchronous_commit', 'fsync', 'checkpoint_timeout', 'shared_preload_libraries')`,
      )
    ).rows[0]!.s;
    await c.end();
    const load0 = loadavg()[0]!;
    const cells = new Cells();
    const runs = new Map<string, DrainRun[]>();
    const keep = (key: string, r: DrainRun) => runs.set(key, [...(runs.get(key) ?? []), r]);

    for (let rep = 0; rep < cfg.reps; rep++) {
      const rot = <T>(xs: readonly T[]) => xs.map((_, i) => xs[(i + rep) % xs.length]!);
      if (cfg.sections.has('sizes')) {
        for (const n of rot(cfg.sizes)) {
          if (n >= LARGE && rep >= cfg.largeReps) continue;
          log(`rep ${rep + 1}/${cfg.reps}: drain ${n.toLocaleString('en-US')} queued tasks`);
          const o = await drainOnce(env, cfg, n, null);
          if (o.ok) {
            keep(`size:${n}`, o.run);
            log(
              `  enqueue ${fmtRate(o.run.enqueuePerSec)}/s; drain ${fmtRate(o.run.tasksPerSec)} tasks/s ` +
                `(${(1e6 / o.run.tasksPerSec).toFixed(1)} µs/task wall` +
                `${o.run.serverMs === null ? '' : `, ${((o.run.serverMs * 1000) / n).toFixed(1)} µs/task server`}), WAL ${Math.round(o.run.walBytes / n)} B/task`,
            );
          } else {
            cells.add(`size:${n}:fail`, { kind: 'timeout', note: o.note });
            log(`  timeout: ${o.note}`);
          }
        }
      }
      if (cfg.sections.has('lanes')) {
        for (const l of rot(cfg.lanes)) {
          log(`rep ${rep + 1}/${cfg.reps}: ${cfg.laneTasks.toLocaleString('en-US')} tasks over ${l} lane(s)`);
          const o = await drainOnce(env, cfg, cfg.laneTasks, l);
          if (o.ok) {
            keep(`lanes:${l}`, o.run);
            const ms = o.run.claimMs;
            log(
              `  ${ms.length} claims, ${(o.run.claimedTasks / Math.max(1, ms.length)).toFixed(1)} tasks/claim; claim p50 ` +
                `${fmtMs(percentile(ms, 50))} / p95 ${fmtMs(percentile(ms, 95))} / p99 ${fmtMs(percentile(ms, 99))} ms; ` +
                `drain ${fmtRate(o.run.tasksPerSec)} tasks/s`,
            );
          } else {
            cells.add(`lanes:${l}:fail`, { kind: 'timeout', note: o.note });
            log(`  timeout: ${o.note}`);
          }
        }
      }
      if (cfg.sections.has('enqueue')) {
        for (const s of rot(cfg.shards)) {
          for (const p of rot(cfg.producers)) {
            try {
              const rate = await enqueueOnce(env, cfg, p, s);
              cells.add(`enq:${p}:${s}`, { kind: 'ok', value: rate });
              log(`rep ${rep + 1}/${cfg.reps}: enqueue ${p} producer(s), ${s} shard(s): ${fmtRate(rate)} tasks/s`);
            } catch (err) {
              const note = (err as Error).message.split('\n')[0]!.slice(0, 120);
              cells.add(`enq:${p}:${s}`, { kind: 'error', note });
              log(`rep ${rep + 1}/${cfg.reps}: enqueue ${p} producer(s), ${s} shard(s): error ${note}`);
            }
          }
        }
      }
    }

    const seconds = (Date.now() - begun) / 1000;
    const envLine = Object.entries(process.env)
      .filter(([k]) => k.startsWith('GROWTH_') || (k.startsWith('BENCH_') && k !== 'BENCH_DATABASE_URL'))
      .map(([k, v]) => `${k}=${v}`)
      .join(' ');
    const command = `${envLine ? `${envLine} ` : ''}npm run bench:growth`;
    const report = render(cfg, cells, runs, {
      command,
      header:
        `Node ${process.version}, ${cpus().length} CPUs · PostgreSQL ${version}, ${server.description}: ${settings} · ` +
        `berth ${berthRevision()} · ${Math.round(seconds)} s · 1-min load average ${load0.toFixed(2)} at start, ${loadavg()[0]!.toFixed(2)} at end`,
      env,
    });
    const dir = new URL('./results/', import.meta.url);
    mkdirSync(dir, { recursive: true });
    writeFileSync(new URL('growth.md', dir), report.markdown);
    for (const [name, svg] of Object.entries(report.svgs)) {
      writeFileSync(new URL(name, dir), svg);
      if (cfg.docs) copyFileSync(new URL(name, dir), new URL(`../docs/${name}`, import.meta.url));
    }
    process.stdout.write(report.markdown);
    log(
      `done in ${Math.round(seconds)} s; report in bench/results/growth.md, plots ${Object.keys(report.svgs).join(', ')}${cfg.docs ? ' (copied to docs/)' : ''}`,
    );
  } finally {
    // A role is cluster-wide: on an existing server, leave none behind (a dedicated one is deleted).
    if (process.env.BENCH_DATABASE_URL) await cleanup('probe role drop', () => dropProbeRole(server.adminUrl));
    await server.stop();
  }
}

function render(
  cfg: GrowthConfig,
  cells: Cells,
  runs: Map<string, DrainRun[]>,
  meta: { command: string; header: string; env: Env },
): { markdown: string; svgs: Record<string, string> } {
  const med = (xs: number[]) => median(xs.filter(Number.isFinite));
  const cell = (xs: number[], fmt: (x: number) => string, failKey: string): string => {
    const failed = cells.get(failKey);
    if (failed.length > 0) return formatCell(failed, fmt);
    return formatCell(
      xs.filter(Number.isFinite).map((value) => ({ kind: 'ok', value }) as Sample),
      fmt,
    );
  };
  const us = fmtMs; // one decimal below 100, whole numbers above
  const lines: string[] = [
    `# berth growth benchmark — ${new Date().toISOString()}`,
    '',
    `Command: \`${meta.command}\``,
    '',
    meta.header,
    '',
    `Each cell: median (min–max) over the repetitions. berth at its defaults: \`Worker({ slots: ${cfg.slots} })\`.`,
    '',
  ];
  const svgs: Record<string, string> = {};

  if (cfg.sections.has('sizes')) {
    lines.push(
      '## Drain time against queue size',
      '',
      `N no-op tasks enqueued in bulk (${cfg.bulkBatch} per call, berth's default lane choice), then one worker drains them; ` +
        'drain time runs from the worker start call to the instant a read of the database shows every completion recorded. ' +
        "Server µs/task: summed execution time of the worker's statements (pg_stat_statements) over the drain, per task. " +
        'WAL: `pg_current_wal_lsn()` difference over the drain (cluster-wide).',
      '',
      '| queued tasks | drain s | drain tasks/s | wall µs/task | server µs/task | WAL bytes/task | bulk enqueue tasks/s | last start → all recorded ms |',
      '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    );
    const wall: Series = { name: 'wall µs per task', points: [] };
    const srv: Series = { name: 'server µs per task', points: [] };
    for (const n of cfg.sizes) {
      const rs = runs.get(`size:${n}`) ?? [];
      const fk = `size:${n}:fail`;
      lines.push(
        `| ${n.toLocaleString('en-US')} | ${cell(
          rs.map((r) => n / r.tasksPerSec),
          (x) => x.toFixed(1),
          fk,
        )} | ` +
          `${cell(
            rs.map((r) => r.tasksPerSec),
            fmtRate,
            fk,
          )} | ${cell(
            rs.map((r) => 1e6 / r.tasksPerSec),
            us,
            fk,
          )} | ` +
          `${cell(
            rs.map((r) => (r.serverMs === null ? NaN : (r.serverMs * 1000) / n)),
            us,
            fk,
          )} | ` +
          `${cell(
            rs.map((r) => r.walBytes / n),
            (x) => Math.round(x).toLocaleString('en-US'),
            fk,
          )} | ` +
          `${cell(
            rs.map((r) => r.enqueuePerSec),
            fmtRate,
            fk,
          )} | ${cell(
            rs.map((r) => r.tailMs),
            fmtMs,
            fk,
          )} |`,
      );
      wall.points = [...wall.points, [n, med(rs.map((r) => 1e6 / r.tasksPerSec))]];
      srv.points = [...srv.points, [n, med(rs.map((r) => (r.serverMs === null ? NaN : (r.serverMs * 1000) / n)))]];
    }
    lines.push('', '![drain cost per task against queue size](growth-sizes.svg)', '');
    svgs['growth-sizes.svg'] = lineChart({
      title: 'berth: drain cost per task against queue size',
      subtitle: `${cfg.slots} slots; median of repetitions; ${meta.command}`,
      xLabel: 'queued tasks',
      yLabel: 'µs per task',
      series: [wall, srv],
      logX: true,
    });
  }

  if (cfg.sections.has('lanes')) {
    lines.push(
      '## Claim latency against active lanes',
      '',
      `${cfg.laneTasks.toLocaleString('en-US')} no-op tasks spread evenly over L lanes (64 shards of a queue per 64 lanes), ` +
        'then one worker drains them. Claim: each discovery-plus-claim round trip the worker makes (its ' +
        "`berth_claim_seconds` observations, every one kept), percentiles pooled over the repetitions' claims.",
      '',
      '| active lanes | claims | tasks/claim | claim p50 ms | claim p95 ms | claim p99 ms | claim mean ms | drain tasks/s |',
      '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    );
    const p: Record<'p50' | 'p95' | 'p99', Series> = {
      p50: { name: 'claim p50', points: [] },
      p95: { name: 'claim p95', points: [] },
      p99: { name: 'claim p99', points: [] },
    };
    for (const l of cfg.lanes) {
      const rs = runs.get(`lanes:${l}`) ?? [];
      const fk = `lanes:${l}:fail`;
      const all = rs.flatMap((r) => r.claimMs);
      const failed = cells.get(fk);
      const pct = (q: number) =>
        failed.length > 0 ? formatCell(failed, fmtMs) : all.length ? fmtMs(percentile(all, q)) : '–';
      lines.push(
        `| ${l} | ${cell(
          rs.map((r) => r.claimMs.length),
          (x) => Math.round(x).toLocaleString('en-US'),
          fk,
        )} | ` +
          `${cell(
            rs.map((r) => r.claimedTasks / Math.max(1, r.claimMs.length)),
            (x) => x.toFixed(1),
            fk,
          )} | ` +
          `${pct(50)} | ${pct(95)} | ${pct(99)} | ${cell(
            rs.map((r) => r.claimMs.reduce((a, b) => a + b, 0) / Math.max(1, r.claimMs.length)),
            fmtMs,
            fk,
          )} | ` +
          `${cell(
            rs.map((r) => r.tasksPerSec),
            fmtRate,
            fk,
          )} |`,
      );
      if (all.length)
        for (const [k, q] of [
          ['p50', 50],
          ['p95', 95],
          ['p99', 99],
        ] as const)
          p[k].points = [...p[k].points, [l, percentile(all, q)]];
    }
    lines.push('', '![claim latency against active lanes](growth-lanes.svg)', '');
    svgs['growth-lanes.svg'] = lineChart({
      title: 'berth: claim latency against active lanes',
      subtitle: `${cfg.laneTasks.toLocaleString('en-US')} tasks, ${cfg.slots} slots; ${meta.command}`,
      xLabel: 'active lanes',
      yLabel: 'ms per claim (discovery + claim)',
      series: [p.p50, p.p95, p.p99],
      logX: true,
    });
  }

  if (cfg.sections.has('enqueue')) {
    lines.push(
      '## Enqueue throughput against producers and shards',
      '',
      `${cfg.enqueueN.toLocaleString('en-US')} single-task \`enqueue\` calls per cell, split over P producers (each its own ` +
        "connection, calls back to back), all on one queue with `shards: S` (each call's transaction picks one of S lanes). " +
        'Each cell starts from a fresh schema; one warm-up call per producer is not timed.',
      '',
      `| producers | ${cfg.shards.map((s) => `${s} shard${s === 1 ? '' : 's'} tasks/s`).join(' | ')} |`,
      `| ---: | ${cfg.shards.map(() => '---:').join(' | ')} |`,
    );
    for (const pr of cfg.producers) {
      lines.push(`| ${pr} | ${cfg.shards.map((s) => formatCell(cells.get(`enq:${pr}:${s}`), fmtRate)).join(' | ')} |`);
    }
    lines.push('', '![enqueue throughput against producers, one line per shard count](growth-enqueue.svg)', '');
    svgs['growth-enqueue.svg'] = lineChart({
      title: 'berth: single-task enqueue throughput, one queue',
      subtitle: `${cfg.enqueueN.toLocaleString('en-US')} calls per point; ${meta.command}`,
      xLabel: 'concurrent producers',
      yLabel: 'tasks/s',
      series: cfg.shards.map((s) => ({
        name: `${s} shard${s === 1 ? '' : 's'}`,
        points: cfg.producers.map((pr) => [pr, cells.median(`enq:${pr}:${s}`)] as const),
      })),
      logX: true,
    });
  }

  lines.push(
    '## Notes',
    '',
    `- Repetitions: ${cfg.reps}, cells interleaved with the order rotated per repetition; queue sizes of ` +
      `${compact(LARGE)} or more ran ${Math.min(cfg.reps, cfg.largeReps)} time(s) (GROWTH_LARGE_REPS).`,
    '- Drain timeout: 60 s + 0.4 ms per task (GROWTH_TIMEOUT_S overrides). Every drain starts from a freshly migrated ' +
      'schema and a CHECKPOINT; autovacuum runs as the server has it.',
    meta.env.statements
      ? `- Server time excludes the pending-count probe's statements${meta.env.probeRoleOid === null ? ' only partly: the probe had no role of its own, so its reads are included' : ' (it logs in as its own role)'}.`
      : '- pg_stat_statements was not loaded on this server: no server time.',
  );
  return { markdown: `${lines.join('\n')}\n`, svgs };
}

main().catch((err: unknown) => {
  log(`fatal: ${(err as Error).stack ?? String(err)}`);
  process.exitCode = 1;
});
