/**
 * What attempt history costs (issue 13): the same drain with history on and off.
 *
 *   npx tsx bench/history-cost.ts [--n 20000] [--slots 10,50] [--runs 3] [--fail 0]
 *
 * Each run, per slot count and mode (off and on alternate, so drift in the machine's load hits
 * both): a fresh schema, history set on or off, N no-op tasks enqueued with enqueueMany (1,000 a
 * call, before the clock), a CHECKPOINT (so every run pays the same full-page writes), then a
 * Worker at its defaults (only `slots`, a silent logger, and maintenance off, so no leader branch
 * writes WAL meanwhile) timed until its metrics count N successes. Printed per run: tasks/s, WAL
 * bytes per task (pg_current_wal_lsn around the drain, cluster-wide: run it on a cluster of your
 * own, with nothing else running on it), and the history's own bytes per task (heap and indexes of attempt_history after the
 * drain). Then the medians and the on/off ratios. `--fail F` makes every F-th task fail once
 * (one per-task failure row each, then a success on the retry, which needs the leader's
 * promotion: maintenance is then on).
 *
 * Database: BENCH_DATABASE_URL, else TEST_DATABASE_URL. Schema `berth_history_cost`, dropped at
 * the end.
 */
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { pino } from 'pino';
import { defineTask, enqueueMany, migrate, setHistorySettings, Worker } from '../src/index.js';
import { dropSchema } from './db.js';
import { median } from './stats.js';

const { values: args } = parseArgs({
  options: {
    n: { type: 'string', default: '20000' },
    slots: { type: 'string', default: '10,50' },
    runs: { type: 'string', default: '3' },
    fail: { type: 'string', default: '0' },
  },
});
const N = Number(args.n);
const SLOTS = args.slots.split(',').map(Number);
const RUNS = Number(args.runs);
const FAIL_EVERY = Number(args.fail);
const url = process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL;
if (!url) {
  console.error('set BENCH_DATABASE_URL or TEST_DATABASE_URL');
  process.exit(2);
}
const SCHEMA = 'berth_history_cost';
const silent = pino({ level: 'silent' });
const pool = new pg.Pool({ connectionString: url, max: 4 });

async function successes(worker: Worker): Promise<number> {
  const m = await worker.metrics.outcomes.prom.get();
  return m.values.reduce((n, v) => (v.labels.outcome === 'success' ? n + v.value : n), 0);
}

interface Run {
  rate: number;
  walPerTask: number;
  historyPerTask: number;
  /** CPU of the worker's PostgreSQL backends per task, µs (null when /proc is not readable). */
  serverUs: number | null;
  /** CPU of this process per task, µs. */
  clientUs: number;
}

/** Linux clock ticks per second, the unit of /proc/<pid>/stat's CPU times. */
const CLK_TCK = 100;

/** CPU seconds (user + system) of a local process, from /proc; null if unreadable. */
function procCpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(rest[11]) + Number(rest[12])) / CLK_TCK;
  } catch {
    return null;
  }
}

async function drain(slots: number, history: boolean): Promise<Run> {
  await dropSchema(url!, SCHEMA);
  await migrate({ connectionString: url!, schema: SCHEMA });
  await setHistorySettings(pool, SCHEMA, { enabled: history });
  const seen = new Set<number>();
  const def = defineTask<{ i: number }>({
    type: 'noop',
    ceilingMs: 60_000,
    backoff: { baseMs: 1, maxMs: 1 },
    handler: async ({ i }) => {
      if (FAIL_EVERY > 0 && i % FAIL_EVERY === 0 && !seen.has(i)) {
        seen.add(i);
        throw new Error(`planned failure of ${i}`);
      }
    },
  });
  for (let b = 0; b < N; b += 1000) {
    await enqueueMany(
      pool,
      Array.from({ length: Math.min(1000, N - b) }, (_, k) => ({ type: 'noop', payload: { i: b + k } })),
      { schema: SCHEMA },
    );
  }
  await pool.query('CHECKPOINT');
  const worker = new Worker({
    connectionString: url!,
    schema: SCHEMA,
    tasks: [def],
    slots,
    logger: silent,
    maintenance: FAIL_EVERY > 0 ? { promoteIntervalMs: 50 } : false,
  });
  const lsn0 = (await pool.query<{ l: string }>('SELECT pg_current_wal_lsn()::text AS l')).rows[0]!.l;
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  await worker.start();
  while ((await successes(worker)) < N) await new Promise((r) => setTimeout(r, 5));
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  // The worker's backends were opened by its start: their whole CPU is the drain's (and the
  // few ms of connection setup, the same in both modes).
  const pids = (
    await pool.query<{ pid: number }>(`SELECT pid FROM pg_stat_activity WHERE application_name = ANY ($1::text[])`, [
      ['worker', 'read', 'listen'].map((k) => `berth ${k} ${worker.id}`.slice(0, 63)),
    ])
  ).rows.map((r) => r.pid);
  const cpus = pids.map(procCpuSeconds);
  const serverUs = cpus.some((c) => c === null) ? null : (cpus.reduce((a: number, b) => a + (b ?? 0), 0) * 1e6) / N;
  const wal = Number(
    (await pool.query<{ b: string }>('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::text AS b', [lsn0])).rows[0]!.b,
  );
  await worker.stop();
  const size = Number(
    (
      await pool.query<{ b: string }>(
        `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::text AS b
           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = $1::regclass`,
        [`"${SCHEMA}".attempt_history`],
      )
    ).rows[0]!.b,
  );
  return {
    rate: N / seconds,
    walPerTask: wal / N,
    historyPerTask: size / N,
    serverUs,
    clientUs: (cpu.user + cpu.system) / N,
  };
}

console.log(
  `history cost: ${N} tasks, slots ${SLOTS.join(',')}, ${RUNS} runs, fail every ${FAIL_EVERY || '-'}; load ${loadavg()
    .map((x) => x.toFixed(1))
    .join(' ')}`,
);
await drain(SLOTS[0]!, true); // warm-up, not reported
for (const slots of SLOTS) {
  const off: Run[] = [];
  const on: Run[] = [];
  for (let r = 0; r < RUNS; r++) {
    for (const history of [false, true]) {
      const run = await drain(slots, history);
      (history ? on : off).push(run);
      console.log(
        `c${slots} history ${history ? 'on ' : 'off'}: ${run.rate.toFixed(0)} tasks/s, WAL ${run.walPerTask.toFixed(0)} B/task, history storage ${run.historyPerTask.toFixed(1)} B/task, server CPU ${run.serverUs?.toFixed(1) ?? '-'} µs/task, worker CPU ${run.clientUs.toFixed(1)} µs/task`,
      );
    }
  }
  const m = (rs: Run[], k: keyof Run) => median(rs.map((x) => x[k] ?? Number.NaN));
  console.log(
    `c${slots} median: off ${m(off, 'rate').toFixed(0)} tasks/s ${m(off, 'walPerTask').toFixed(0)} B/task | on ${m(on, 'rate').toFixed(0)} tasks/s ${m(on, 'walPerTask').toFixed(0)} B/task | throughput ${((m(on, 'rate') / m(off, 'rate') - 1) * 100).toFixed(1)} %, WAL +${(m(on, 'walPerTask') - m(off, 'walPerTask')).toFixed(0)} B/task, server CPU ${m(off, 'serverUs').toFixed(1)} -> ${m(on, 'serverUs').toFixed(1)} µs/task, worker CPU ${m(off, 'clientUs').toFixed(1)} -> ${m(on, 'clientUs').toFixed(1)} µs/task; load ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );
}
await dropSchema(url!, SCHEMA);
await pool.end();
