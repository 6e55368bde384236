/**
 * `npm run bench`: berth vs graphile-worker vs pg-boss on one PostgreSQL database, by default
 * on a dedicated cluster with stock settings started for the run (BENCH_DATABASE_URL targets an
 * existing server instead). Each repetition runs every scenario for every system, systems
 * interleaved (order rotated per repetition). Progress goes to stderr; the Markdown report goes
 * to stdout and bench/results/latest.md. berth runs from its tsc build (dist/, which `npm run
 * bench` builds first), as the peers run their compiled packages; BENCH_BERTH_SRC=1 runs src/.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { loadConfig, type BenchConfig } from './config.js';
import { Monitor, openBenchServer, recreateDatabase, type ServerInfo } from './db.js';
import { coldDrain, coldFirstEnqueue, coldPickup } from './cold.js';
import {
  COLD_COLUMNS,
  DRAIN_DETAIL_COLUMNS,
  PICKUP_DETAIL_COLUMNS,
  MAIN_COLUMNS,
  Results,
  WAL_DETAIL_COLUMNS,
  type MetricKey,
} from './report.js';
import { drain, enqueueRate, pickup, type Outcome, type PickupResult } from './scenarios.js';
import type { Sample } from './stats.js';
import { benchSystems } from './systems/all.js';
import { pgBossErrors } from './systems/pgboss.js';
import type { AdapterContext, SystemAdapter } from './systems/types.js';
import { berthRevision, leaks, log } from './util.js';

interface Scenario {
  name: string;
  /** Runs the scenario for one system and records its samples; returns the outcome. */
  run(adapter: SystemAdapter): Promise<Outcome<unknown>>;
  keys: readonly MetricKey[];
}

function packageVersion(name: string): string {
  try {
    const url = new URL(`../node_modules/${name}/package.json`, import.meta.url);
    return (JSON.parse(readFileSync(url, 'utf8')) as { version: string }).version;
  } catch {
    return '?';
  }
}

function threadsText(t: { main: number; helpers: number } | null): string {
  return t === null ? '' : ` (main thread ${Math.round(t.main)}, helper threads ${Math.round(t.helpers)})`;
}

function busyText(cores: number | null): string {
  return cores === null ? '?' : cores.toFixed(2);
}

function failure(o: Outcome<unknown>): Sample {
  if (o.ok) throw new Error('not a failure');
  return o.timeout ? { kind: 'timeout', note: o.note } : { kind: 'error', note: o.note };
}

async function main(): Promise<void> {
  const started = Date.now();
  const server = await openBenchServer();
  try {
    await bench(server.adminUrl, server.description, started);
  } finally {
    await server.stop();
  }
  if (leaks.length > 0) {
    // Something refused to shut down; do not let it hold the process open.
    log(`exiting explicitly: ${leaks.length} cleanup step(s) did not finish`);
    process.exit(2);
  }
}

async function bench(adminUrl: string, serverDescription: string, started: number): Promise<void> {
  const cfg = loadConfig(adminUrl);
  const revision = berthRevision();
  log(`recreating database ${cfg.benchDbName}`);
  await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
  const ctx: AdapterContext = { connectionString: cfg.benchUrl };
  const monitor = await Monitor.open(cfg.benchUrl);
  const serverInfo = await monitor.serverInfo();
  const runStart = await monitor.read();
  const loadStart = loadavg()[0]!;

  const systems = benchSystems(ctx, cfg.systemFilter);
  /** The same system on another database (the first-enqueue rows' own, bench/cold.ts). */
  const sameSystemAt =
    (a: SystemAdapter) =>
    (url: string): SystemAdapter => {
      const found = benchSystems({ connectionString: url }, []).find((s) => s.label === a.label);
      if (!found) throw new Error(`no system labelled ${a.label}`);
      return found;
    };
  const results = new Results(systems.map((s) => s.label));
  const notes = { duplicates: [] as string[], noisyWindows: 0, drainWindows: 0 };

  /**
   * A pickup scenario (warm or cold) recording p50 / p95 / p99 / max, then the enqueue call's p99
   * and the worker's part's (PICKUP_DETAIL_COLUMNS), under `keys`, in that order.
   */
  const pickupScenario = (
    name: string,
    keys: readonly [MetricKey, MetricKey, MetricKey, MetricKey, MetricKey, MetricKey],
    measure: (a: SystemAdapter) => Promise<Outcome<PickupResult>>,
  ): Scenario => ({
    name,
    keys,
    async run(a) {
      const o = await measure(a);
      if (o.ok) {
        const { p50, p95, p99, max, callP99, afterP99 } = o.value;
        const values = [p50, p95, p99, max, callP99, afterP99];
        for (let i = 0; i < keys.length; i++) results.add(a.label, keys[i]!, { kind: 'ok', value: values[i]! });
        if (o.value.duplicates > 0) notes.duplicates.push(`${a.label} ${name}: ${o.value.duplicates} handler re-runs`);
        log(
          `  ${a.label} ${name}: p50 ${p50.toFixed(1)} / p95 ${p95.toFixed(1)} / p99 ${p99.toFixed(1)} / max ${max.toFixed(1)} ms ` +
            `(p99 of the enqueue call ${callP99.toFixed(1)}, of its return → handler start ${afterP99.toFixed(1)})`,
        );
      } else {
        results.add(a.label, keys[0], failure(o));
        for (const k of keys.slice(1)) results.add(a.label, k, { kind: 'skipped' });
        log(`  ${a.label} ${name}: ${o.note}`);
      }
      return o;
    },
  });

  const allScenarios: Scenario[] = [
    ...cfg.drainConcurrencies.map((c): Scenario => {
      const rateKey = `drain${c}` as MetricKey;
      const costKeys = [
        `started${c}`,
        `tail${c}`,
        `wal${c}`,
        `commits${c}`,
        `walAll${c}`,
        `writeCommits${c}`,
      ] as MetricKey[];
      return {
        name: `drain c${c}`,
        keys: [rateKey, ...costKeys],
        async run(a) {
          const o = await drain(a, monitor, cfg, c);
          if (o.ok) {
            const { tasksPerSec, startedPerSec, tailMs, cost, duplicates } = o.value;
            const perTask = (x: number | null): Sample =>
              x === null ? { kind: 'skipped' } : { kind: 'ok', value: x / cfg.drainN };
            const ownWal = cost.ownWalBytes ?? cost.walBytes;
            results.add(a.label, rateKey, { kind: 'ok', value: tasksPerSec });
            results.add(a.label, `started${c}` as MetricKey, { kind: 'ok', value: startedPerSec });
            results.add(a.label, `tail${c}` as MetricKey, { kind: 'ok', value: tailMs });
            results.add(a.label, `wal${c}` as MetricKey, perTask(ownWal));
            results.add(a.label, `commits${c}` as MetricKey, perTask(cost.commits));
            results.add(a.label, `walAll${c}` as MetricKey, perTask(cost.walBytes));
            results.add(a.label, `writeCommits${c}` as MetricKey, perTask(cost.ownWriteCommits));
            notes.drainWindows++;
            if (cost.otherCommits > 0) notes.noisyWindows++;
            if (duplicates > 0) notes.duplicates.push(`${a.label} drain c${c}: ${duplicates} handler re-runs`);
            const n = cfg.drainN;
            log(
              `  ${a.label} drain c${c}: ${Math.round(tasksPerSec)} tasks/s completed (${Math.round(startedPerSec)} started, ` +
                `tail ${Math.round(tailMs)} ms); WAL/task ${Math.round(ownWal / n)} B own, ` +
                `${Math.round(cost.walBytes / n)} B cluster; commits/task ${(cost.commits / n).toFixed(2)} ` +
                `(write ${cost.ownWriteCommits === null ? '?' : (cost.ownWriteCommits / n).toFixed(2)})` +
                `${cost.otherCommits > 0 ? `; other dbs committed ${cost.otherCommits}` : ''}; ` +
                `this process's CPU ${Math.round(o.value.processCpuMs)} ms${threadsText(o.value.threads)}, ${o.value.gcs.count} GCs (${Math.round(o.value.gcs.ms)} ms); ` +
                `machine busy cores ${busyText(o.value.machineBusy.before)} before the start, ${busyText(o.value.machineBusy.during)} during`,
            );
          } else {
            results.add(a.label, rateKey, failure(o));
            for (const k of costKeys) results.add(a.label, k, { kind: 'skipped' });
            log(`  ${a.label} drain c${c}: ${o.timeout ? 'timeout' : 'error'} ${o.note}`);
          }
          return o;
        },
      };
    }),
    ...(['bulk', 'single'] as const).map(
      (kind): Scenario => ({
        name: `${kind} enqueue`,
        keys: [kind],
        async run(a) {
          const o = await enqueueRate(a, cfg, kind);
          results.add(a.label, kind, o.ok ? { kind: 'ok', value: o.value } : failure(o));
          log(`  ${a.label} ${kind} enqueue: ${o.ok ? `${Math.round(o.value)} tasks/s` : o.note}`);
          return o;
        },
      }),
    ),
    pickupScenario('pickup latency', ['p50', 'p95', 'p99', 'max', 'callP99', 'afterP99'], (a) => pickup(a, cfg)),
    ...(cfg.cold
      ? [
          ...cfg.drainConcurrencies.map(
            (c): Scenario => ({
              name: `cold drain c${c}`,
              keys: [`cold${c}` as MetricKey],
              async run(a) {
                const o = await coldDrain(a, cfg, c);
                const key = `cold${c}` as MetricKey;
                if (o.ok) {
                  results.add(a.label, key, { kind: 'ok', value: o.value.tasksPerSec });
                  if (o.value.duplicates > 0)
                    notes.duplicates.push(`${a.label} cold drain c${c}: ${o.value.duplicates} handler re-runs`);
                  log(
                    `  ${a.label} cold drain c${c}: ${Math.round(o.value.tasksPerSec)} tasks/s completed ` +
                      `(${Math.round(o.value.startedPerSec)} started, tail ${Math.round(o.value.tailMs)} ms)`,
                  );
                } else {
                  results.add(a.label, key, failure(o));
                  log(`  ${a.label} cold drain c${c}: ${o.timeout ? 'timeout' : 'error'} ${o.note}`);
                }
                return o;
              },
            }),
          ),
          pickupScenario(
            'cold pickup latency',
            ['coldP50', 'coldP95', 'coldP99', 'coldMax', 'coldCallP99', 'coldAfterP99'],
            (a) => coldPickup(a, cfg),
          ),
          {
            name: 'cold first enqueue',
            keys: ['firstEnqueue', 'laterEnqueue'],
            async run(a) {
              const o = await coldFirstEnqueue(sameSystemAt(a), cfg);
              if (o.ok) {
                results.add(a.label, 'firstEnqueue', { kind: 'ok', value: o.value.firstMs });
                results.add(a.label, 'laterEnqueue', { kind: 'ok', value: o.value.laterMs });
                log(
                  `  ${a.label} first enqueue in a new process: ${o.value.firstMs.toFixed(1)} ms (then ${o.value.laterMs.toFixed(1)} ms)`,
                );
              } else {
                results.add(a.label, 'firstEnqueue', failure(o));
                results.add(a.label, 'laterEnqueue', { kind: 'skipped' });
                log(`  ${a.label} first enqueue: ${o.note}`);
              }
              return o;
            },
          } satisfies Scenario,
          {
            name: 'cold first enqueue after migrate',
            keys: ['firstEnqueueMigrated'],
            async run(a) {
              if (!a.producerMigrates) {
                results.add(a.label, 'firstEnqueueMigrated', { kind: 'skipped' });
                return { ok: true, value: null };
              }
              const o = await coldFirstEnqueue(sameSystemAt(a), cfg, true);
              if (o.ok) {
                results.add(a.label, 'firstEnqueueMigrated', { kind: 'ok', value: o.value.firstMs });
                log(`  ${a.label} first enqueue after its migrate(): ${o.value.firstMs.toFixed(1)} ms`);
              } else {
                results.add(a.label, 'firstEnqueueMigrated', failure(o));
                log(`  ${a.label} first enqueue after its migrate(): ${o.note}`);
              }
              return o;
            },
          } satisfies Scenario,
        ]
      : []),
  ];

  const scenarios =
    cfg.scenarioFilter.length === 0 ? allScenarios : allScenarios.filter((sc) => cfg.scenarioFilter.includes(sc.name));
  if (scenarios.length === 0)
    throw new Error(`BENCH_SCENARIOS names no scenario; they are: ${allScenarios.map((sc) => sc.name).join(', ')}`);

  // Warm-up, recorded nowhere: each system drains BENCH_WARMUP_N tasks once (100,000), so every
  // row is measured with its code compiled and its heap grown. A worker process runs for hours; a
  // fresh Node process runs its first tasks interpreted: berth drained 27-33k tasks/s in a fresh
  // process against 40-50k from its second drain on (docs/benchmarks-journal.md, "Worker start"), and
  // both berth and graphile-worker's preset reach their plateau only after 40,000-80,000 tasks
  // (config.ts). Every system gets the same warm-up; one that cannot finish it in the time allowed
  // (pg-boss at its defaults, about concurrency / 2 tasks a second; graphile-worker at its
  // defaults; pg-boss batched) just stops there.
  if (cfg.warmupN > 0) {
    log(`warm-up: each system drains ${cfg.warmupN.toLocaleString('en-US')} tasks at c10, unrecorded`);
    const warm = { ...cfg, drainN: cfg.warmupN, drainTimeoutMs: cfg.warmupTimeoutMs };
    for (const a of systems) {
      try {
        const o = await drain(a, monitor, warm, 10);
        log(`  ${a.label}: ${o.ok ? `${Math.round(o.value.tasksPerSec)} tasks/s` : `stopped (${o.note})`}`);
      } catch (err) {
        log(`  ${a.label}: warm-up failed: ${(err as Error).message.split('\n')[0]!.slice(0, 120)}`);
      }
    }
  }

  // A (system, scenario) that timed out is not run again: its cell says "timeout" either way.
  const gaveUp = new Set<string>();
  for (let rep = 0; rep < cfg.reps; rep++) {
    const order = systems.map((_, i) => systems[(i + rep) % systems.length]!);
    for (const sc of scenarios) {
      log(`rep ${rep + 1}/${cfg.reps}: ${sc.name}`);
      for (const a of order) {
        const id = `${a.label}/${sc.name}`;
        if (gaveUp.has(id)) {
          for (const k of sc.keys) results.add(a.label, k, { kind: 'skipped' });
          log(`  ${a.label}: skipped (timed out in an earlier repetition)`);
          continue;
        }
        try {
          const o = await sc.run(a);
          if (!o.ok && o.timeout) gaveUp.add(id);
        } catch (err) {
          const message = (err as Error).message.split('\n')[0]!.slice(0, 120);
          log(`  ${a.label} ${sc.name}: error ${message}`);
          results.add(a.label, sc.keys[0]!, { kind: 'error', note: message });
          for (const k of sc.keys.slice(1)) results.add(a.label, k, { kind: 'skipped' });
        }
      }
    }
  }
  const runEnd = await monitor.read();
  await monitor.close();
  const background = {
    otherCommits: runEnd.otherCommits - runStart.otherCommits,
    load: [loadStart, loadavg()[0]!] as const,
  };

  const report = render(
    cfg,
    serverInfo,
    serverDescription,
    results,
    systems,
    notes,
    (Date.now() - started) / 1000,
    monitor.walinspectProblem,
    background,
    revision,
  );
  mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
  writeFileSync(new URL('./results/latest.md', import.meta.url), report);
  process.stdout.write(report);
  log(`done in ${Math.round((Date.now() - started) / 1000)} s; report written to bench/results/latest.md`);
}

function render(
  cfg: BenchConfig,
  server: ServerInfo,
  serverDescription: string,
  results: Results,
  systems: readonly SystemAdapter[],
  notes: { duplicates: string[]; noisyWindows: number; drainWindows: number },
  seconds: number,
  walinspectProblem: string | null,
  background: { otherCommits: number; load: readonly [number, number] },
  revision: string,
): string {
  const env = Object.entries(process.env)
    .filter(([k]) => k.startsWith('BENCH_') && k !== 'BENCH_DATABASE_URL')
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  const settings = Object.entries(server.settings)
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
  const walMethod =
    walinspectProblem === null
      ? 'main-table WAL is attributed to the bench database with pg_walinspect'
      : `pg_walinspect unavailable (${walinspectProblem}); main-table WAL is the cluster-wide LSN difference`;
  const lines: string[] = [
    `# berth benchmark — ${new Date().toISOString()}`,
    '',
    `Command: \`${env ? `${env} ` : ''}npm run bench\` · ${cfg.reps} repetition(s), systems interleaved (order rotated per repetition) · ` +
      `total ${Math.round(seconds)} s`,
    '',
    `Node ${process.version}, ${cpus().length} CPUs · PostgreSQL ${server.version}, ${serverDescription}: ` +
      `${settings} · berth ${revision}, graphile-worker ${packageVersion('graphile-worker')}, pg-boss ${packageVersion('pg-boss')} · ` +
      `database \`${cfg.benchDbName}\``,
    '',
    'Each cell: median (min–max) over the repetitions.',
    '',
    results.table(MAIN_COLUMNS),
    '',
    ...(cfg.cold
      ? [
          'Cold: the same in a process that has run nothing before (a child process per measurement, see Method):',
          '',
          results.table(COLD_COLUMNS),
          '',
        ]
      : []),
    'Drain detail: the rate counted at the last handler start, and how long after it the database showed every ' +
      'completion recorded (the main table counts the latter):',
    '',
    results.table(DRAIN_DETAIL_COLUMNS),
    '',
    "Pickup detail: the p99 of the enqueue call alone (the producer's statement and its commit, WAL flush included: " +
      "no worker sees the task before it) and of the time from its return to the handler's start (the worker's part); " +
      'each is a p99 of its own, so the two need not add up to the pickup p99:',
    '',
    results.table(PICKUP_DETAIL_COLUMNS),
    '',
    `WAL detail (drain; ${walMethod}):`,
    '',
    results.table(WAL_DETAIL_COLUMNS),
    '',
    '## Method',
    '',
    `- **Drain**: ${cfg.drainN.toLocaleString('en-US')} no-op tasks enqueued in bulk first (${cfg.bulkBatch} per call), then a worker ` +
      'is started; tasks/s (completed) = N / (time from the worker start call to the instant a read of the database showed ' +
      "every completion recorded). Once the last handler has started, a separate session runs the system's pending count " +
      '(berth: ready entries + deferred rows − entries covered by a settlement − tombstoned entries, one prepared statement; ' +
      'graphile-worker: rows left in `_private_jobs`; pg-boss: rows not in state `completed`) back to ' +
      'back (1 ms apart) until it reads 0; the time is taken when that read returns, so it is late by at most the read ' +
      'in flight when the last completion committed, 1 ms and the read that saw it. The session reads once before the ' +
      "clock starts, so none of these reads is a new session's first (which loads the tables' catalog entries and plans: " +
      "28–32 ms for berth's count, 1.5 ms after). " +
      '(all started) = N / (worker start call to the last handler start).',
    ...(cfg.cold
      ? [
          '- **Cold rows**: each measurement runs in a new child process (bench/cold-child.ts) that has loaded the ' +
            "systems' modules and run nothing else; this process enqueues, probes and keeps the clock (epoch " +
            'milliseconds from `performance.timeOrigin`, one clock for both). **Cold drain**: as the drain above, ' +
            `the child starts the worker on ${cfg.drainN.toLocaleString('en-US')} queued tasks, counted at completion. ` +
            `**Cold pickup**: the child starts the worker; after 1 s idle, ${cfg.coldPickupN} tasks ${cfg.pickupGapMs} ms ` +
            "apart from this process's warm producer. **First enqueue**: the child opens a producer (its session, " +
            'which runs `SELECT 1`) and times its first single-task enqueue into an installation in use, in a database ' +
            'made for that measurement (the bench database has seen every schema dropped and reinstalled dozens of ' +
            "times, which leaves catalog indexes no user's database has); this process installed the system there, " +
            'enqueued 64 tasks, one call each, ran `VACUUM ANALYZE`, as autovacuum leaves an installation in use, ' +
            'and waited until no autovacuum worker ran (each wait is logged); ' +
            "then 20 more (their median). graphile-worker's " +
            '`makeWorkerUtils()` runs its migrate() on that session itself before the `SELECT 1`, as for every user; ' +
            "pg-boss opens with `start()`, which it needs. **After migrate()**: the same, with the system's own " +
            "migrate() run on that session before the first call (berth's `migrate({ client })`; graphile-worker's " +
            "`utils.migrate()`, its second run there), so berth's session has run its schema check too.",
        ]
      : []),
    `- **Bulk enqueue**: ${cfg.bulkN.toLocaleString('en-US')} tasks, ${cfg.bulkBatch} per call, sequential calls. ` +
      `**Single enqueue**: ${cfg.singleN.toLocaleString('en-US')} one-task calls, sequential, through a pool.`,
    `- **Pickup**: worker running and idle (concurrency ${cfg.pickupConcurrency}); ${cfg.pickupN} tasks enqueued one at a time ` +
      `${cfg.pickupGapMs} ms apart; latency = handler start − instant before the enqueue call; nearest-rank percentiles.`,
    '- **WAL bytes/task, commits/task** (drain, processing only; enqueue cost excluded): counters read just before the ' +
      'worker starts (enqueue sessions already closed) and after it stopped and its sessions closed (+0.5 s for the stats ' +
      'flush), divided by N. **WAL bytes/task** counts the WAL records of the window that belong to the bench database ' +
      '(records referencing its relations, plus records — commits — of transactions that did), read with `pg_walinspect`; ' +
      'it excludes page headers and alignment padding. **cluster WAL bytes/task** is ' +
      "`pg_wal_lsn_diff(pg_current_wal_lsn() after, before)`: exact but cluster-wide, so other databases' activity lands " +
      'in it. **commits/task** is the `pg_stat_database.xact_commit` delta of the bench database (every transaction, ' +
      "read-only ones included); **write commits/task** counts COMMIT WAL records of the bench database's transactions " +
      "(the ones that must flush WAL). A `CHECKPOINT` runs before each drain's enqueue, so no timed checkpoint " +
      '(full-page images) falls inside the window. The pending-count reads are subtracted from commits.',
    `- Timeouts: drain ${cfg.drainTimeoutMs / 1000} s from worker start; enqueue ${cfg.enqueueTimeoutMs / 1000} s; pickup ` +
      `${cfg.pickupTailTimeoutMs / 1000} s after the last enqueue. A scenario that timed out for a system is not repeated ` +
      'for it in later repetitions; the cell shows how far it got.',
    '- Each scenario starts from an empty, freshly installed schema (dropped and reinstalled).',
    cfg.warmupN > 0
      ? `- Warm-up: before the repetitions each system drains ${cfg.warmupN.toLocaleString('en-US')} tasks once at ` +
        `concurrency 10 (at most ${cfg.warmupTimeoutMs / 1000} s), unrecorded, so every row runs compiled code ` +
        '(`BENCH_WARMUP_N=0` skips it).'
      : '- No warm-up (`BENCH_WARMUP_N=0`): the first repetition runs each system in a fresh process.',
    '',
    '## Rows',
    '',
    ...systems.map((s) => `- **${s.label}**: ${s.settings}`),
    '',
    '## Caveats',
    '',
    `- pg-boss ${packageVersion('pg-boss')}: concurrency N is \`localConcurrency: N\` (N pollers in one instance). At its ` +
      'defaults each poller fetches one job and then waits out the rest of its 2 s polling interval, so it drains about ' +
      'N / 2 jobs/s and its pickup is poll-bound. The batched row fetches 50 per poll and keeps fetching while batches ' +
      "come back full (`burstWhenBatchFull`), and turns on pg-boss's LISTEN/NOTIFY wake-up (off by default) so its pickup " +
      'is not poll-bound either. pg-boss keeps completed jobs (state `completed`) until its retention deletes them.',
    `- graphile-worker ${packageVersion('graphile-worker')} accepts \`localQueue\`, \`completeJobBatchDelay\` and ` +
      '`failJobBatchDelay` only through `preset.worker` (they are not top-level `RunnerOptions`); the throughput row ' +
      "passes them there, with `maxPoolSize` = concurrency + 1 as in the performance docs' preset (24 jobs, pool 25). " +
      'The default row keeps the default pool of 10.',
    '- graphile-worker 0.18 and pg-boss 12 declare `engines.node >= 22`; this run used the Node version above ' +
      '(both import and run on Node 20; nothing in the run depends on Node 22 features as far as it shows).',
    "- Completion writes that a system batches (berth's settlement batcher, graphile-worker's completeJobBatchDelay, " +
      "pg-boss's per-batch complete) are inside the timed window: a task counts once its completion is in the database.",
    `- Autovacuum is ${server.settings.autovacuum ?? '?'} on this server.`,
  ];
  lines.push(
    `- Background: other databases on the server committed ${background.otherCommits.toLocaleString('en-US')} ` +
      `transactions during the run; 1-min load average ${background.load[0].toFixed(2)} at start, ` +
      `${background.load[1].toFixed(2)} at end.${background.otherCommits > 1000 ? ' The server was not quiet: rates and latencies include contention from that activity.' : ''}`,
  );
  if (notes.noisyWindows > 0) {
    lines.push(
      `- In ${notes.noisyWindows} of ${notes.drainWindows} drain windows another database committed transactions; ` +
        'their cluster WAL figures include that activity (the attributed WAL figures do not).',
    );
  }
  if (notes.duplicates.length > 0) lines.push(`- Handler re-runs observed: ${notes.duplicates.join('; ')}.`);
  if (pgBossErrors.length > 0)
    lines.push(`- pg-boss emitted errors: ${[...new Set(pgBossErrors)].slice(0, 5).join('; ')}.`);
  if (leaks.length > 0) lines.push(`- Cleanup steps that did not finish: ${leaks.join('; ')}.`);
  return `${lines.join('\n')}\n`;
}

main().catch((err: unknown) => {
  log(`fatal: ${(err as Error).stack ?? String(err)}`);
  process.exitCode = 1;
});
