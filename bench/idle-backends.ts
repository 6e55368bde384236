/**
 * New PostgreSQL backends per minute opened by idle workers (issue 8, item 7).
 *
 *   npm run bench:idle-backends -- [--workers 10] [--seconds 60] [--warmup 5] [--url URL]
 *
 * Starts `--workers` Worker instances in this process, at berth's defaults (leader poll 1 s), on
 * a schema with no tasks, and counts the sessions they open during a `--seconds` window that
 * begins after `--warmup` seconds (so start-up connections are not counted).
 *
 * Where: by default a throwaway cluster of its own (initdb in a temporary directory, free port),
 * so the count is exact and no other session on the shared server is disturbed (10 workers keep
 * about 30 sessions open; the shared server allows 100 for everyone). `--url` runs against an
 * existing database instead, which must be used by nothing else: every session on it counts.
 *
 * How: the exact count is `pg_stat_database.sessions` (PostgreSQL 14+: sessions established to
 * the database) read before and after the window. A backend reports the increment when it first
 * goes idle or when it exits, so a short-lived session is never missed (log_connections would
 * need a server reload). As a breakdown, pg_stat_activity is sampled every 100 ms and each
 * session seen that started inside the window is counted under its application_name; a session
 * that lives less than a sample interval can be missed there, so only the first number is the
 * measurement. Parallel query workers (the leader's gauge reads start two every few seconds) are
 * left out of both: they are not client sessions and do not go through max_connections.
 */
import pg from 'pg';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { migrate, Worker } from '../src/index.js';
import { startCluster, type Cluster } from './cluster.js';
import { berthRevision, log } from './util.js';

const { values } = parseArgs({
  options: {
    workers: { type: 'string', default: '10' },
    seconds: { type: 'string', default: '60' },
    warmup: { type: 'string', default: '5' },
    url: { type: 'string' },
  },
});
const workers = Number(values.workers);
const seconds = Number(values.seconds);
const warmup = Number(values.warmup);
for (const [k, v] of Object.entries({ workers, seconds, warmup })) {
  if (!Number.isFinite(v) || v < 0 || (k !== 'warmup' && v <= 0))
    throw new Error(`--${k} must be a positive number, got ${v}`);
}

const schema = 'berth_idle';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let cluster: Cluster | null = null;
let url = values.url;
let monitorUrl = values.url;
if (!url) {
  cluster = await startCluster({ settings: { max_connections: 200 } });
  process.on('exit', () => cluster?.stop());
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
  const admin = new pg.Client({ connectionString: cluster.url });
  await admin.connect();
  await admin.query('CREATE DATABASE berth_idle');
  await admin.end();
  monitorUrl = cluster.url;
  url = cluster.url.replace(/\/postgres$/, '/berth_idle');
}
log(`database ${url}; ${workers} workers; warm-up ${warmup} s; window ${seconds} s`);

const monitor = new pg.Client({ connectionString: monitorUrl, application_name: 'bench-monitor' });
await monitor.connect();
const db = (await monitor.query<{ d: string }>('SELECT current_database() AS d')).rows[0]!.d;
const dbName = new URL(url).pathname.slice(1) || db;
await migrate({ connectionString: url, schema });

const pool = [...Array(workers).keys()].map(
  (i) =>
    new Worker({
      connectionString: url!,
      schema,
      tasks: [],
      workerId: `idle-${i + 1}`,
      logger: pino({ level: 'silent' }),
    }),
);
await Promise.all(pool.map((w) => w.start()));
await sleep(warmup * 1000);

async function sessionsCounter(): Promise<{ sessions: number; at: Date }> {
  await monitor.query('SELECT pg_stat_clear_snapshot()');
  const r = await monitor.query<{ sessions: string; at: Date }>(
    'SELECT sessions::text, clock_timestamp() AS at FROM pg_stat_database WHERE datname = $1',
    [dbName],
  );
  return { sessions: Number(r.rows[0]!.sessions), at: r.rows[0]!.at };
}

const before = await sessionsCounter();
const t0 = performance.now();
const seen = new Map<string, string>();
let maxOpen = 0;
const leaderNamed = new Set<number>();
while (performance.now() - t0 < seconds * 1000) {
  const r = await monitor.query<{ pid: number; started: Date; name: string; fresh: boolean }>(
    `SELECT pid, backend_start AS started, application_name AS name, backend_start > $2 AS fresh
       FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`,
    [dbName, before.at],
  );
  maxOpen = Math.max(maxOpen, r.rowCount ?? 0);
  for (const row of r.rows) {
    if (row.name.startsWith('berth leader ')) leaderNamed.add(row.pid);
    if (row.fresh) seen.set(`${row.pid}/${row.started.toISOString()}`, row.name);
  }
  await sleep(100);
}
const after = await sessionsCounter();
const elapsedMin = (after.at.getTime() - before.at.getTime()) / 60_000;
const leaders = pool.filter((w) => w.isLeader).length;
await Promise.all(pool.map((w) => w.stop()));
await monitor.end();

const byName = new Map<string, number>();
for (const name of seen.values()) {
  const key = name.replace(/ idle-\d+$/, ' <worker>') || '(unnamed: pool, LISTEN)';
  byName.set(key, (byName.get(key) ?? 0) + 1);
}
const newSessions = after.sessions - before.sessions;
const perMin = (n: number) => (n / elapsedMin).toFixed(1);
console.log(
  `berth ${berthRevision()} · ${workers} idle workers · window ${(elapsedMin * 60).toFixed(1)} s after ${warmup} s warm-up · ${cluster ? 'own cluster' : `database ${dbName}`}\n`,
);
console.log('| measure | value |');
console.log('| --- | ---: |');
console.log(`| new backends (pg_stat_database.sessions) | ${newSessions} |`);
console.log(`| new backends per minute | ${perMin(newSessions)} |`);
console.log(`| most sessions open at once | ${maxOpen} |`);
console.log(`| sessions named \`berth leader …\` seen | ${leaderNamed.size} |`);
console.log(`| workers leading at the end | ${leaders} |`);
for (const [name, n] of [...byName].sort((a, b) => b[1] - a[1]))
  console.log(`| sampled new sessions: ${name} | ${n} (${perMin(n)}/min) |`);
await cluster?.stop();
