/**
 * Where berth's drain time goes, statement by statement.
 *
 *   npm run bench:statements     (needs pg_stat_statements in shared_preload_libraries)
 *
 * Drains 20,000 no-op tasks with 10 slots at berth's defaults and prints, from
 * pg_stat_statements, every statement's calls, rows, total and mean execution time, plus the
 * round trips per task (statements issued / tasks) and WAL bytes per task.
 */
import pg from 'pg';
import { pino } from 'pino';
import { defineTask, enqueueMany, migrate, Worker } from '../src/index.js';

const url = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'berth_statements';
const N = Number(process.env.BENCH_DRAIN_N ?? 20_000);
const SLOTS = Number(process.env.BENCH_SLOTS ?? 10);
const admin = new pg.Pool({ connectionString: url, max: 2 });
const has = await admin.query(
  `SELECT 1 FROM pg_settings WHERE name = 'shared_preload_libraries' AND setting LIKE '%pg_stat_statements%'`,
);
if (has.rowCount === 0) {
  console.error('pg_stat_statements is not loaded: add it to shared_preload_libraries and restart PostgreSQL.');
  process.exit(2);
}
await admin.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
await migrate({ connectionString: url, schema });
for (let b = 0; b < N / 1000; b++) {
  await enqueueMany(
    admin,
    Array.from({ length: 1000 }, (_, i) => ({ type: 'noop', payload: { i } })),
    { schema },
  );
}
let done = 0;
const def = defineTask({ type: 'noop', ceilingMs: 60_000, handler: async () => void done++ });
const w = new Worker({ connectionString: url, schema, tasks: [def], slots: SLOTS, logger: pino({ level: 'silent' }) });
await admin.query('SELECT pg_stat_statements_reset()');
const wal0 = (await admin.query('SELECT pg_current_wal_lsn() AS l')).rows[0].l;
const t0 = performance.now();
await w.start();
while (done < N) await new Promise((r) => setTimeout(r, 2));
const secs = (performance.now() - t0) / 1000;
await w.stop();
const wal = (await admin.query('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::float8 AS b', [wal0])).rows[0].b;
const rows = await admin.query(
  `SELECT calls::int, rows::int, total_exec_time::float8 AS total_ms, mean_exec_time::float8 AS mean_ms,
          regexp_replace(left(regexp_replace(query, '\\s+', ' ', 'g'), 90), '"berth_statements"', 's', 'g') AS q
     FROM pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY total_exec_time DESC LIMIT 12`,
);
const calls = rows.rows.reduce((n, r) => n + r.calls, 0);
console.log(
  `drain of ${N} tasks, ${SLOTS} slots: ${Math.round(N / secs)} tasks/s; WAL ${Math.round(wal / N)} bytes/task; ~${(calls / N).toFixed(3)} statements/task\n`,
);
console.log('| calls | rows | total ms | mean ms | statement |\n| ---: | ---: | ---: | ---: | --- |');
for (const r of rows.rows) {
  console.log(
    `| ${r.calls} | ${r.rows} | ${r.total_ms.toFixed(0)} | ${r.mean_ms.toFixed(3)} | \`${r.q.replaceAll('|', '\\|')}\` |`,
  );
}
await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
await admin.end();
