/**
 * What storing the producer's trace context costs per task (issue 13, item 6): WAL bytes per
 * enqueued task and the `ready` row's size, for an untraced producer and a traced one, with
 * `enqueueMany` calls of 1,000 tasks and with single `enqueue` calls.
 *
 *   npx tsx bench/trace-wal.ts [--n 20000] [--entry /tmp/base/src/index.ts]
 *
 * `--entry` imports berth from another checkout (an A/B against the schema before migration 12:
 * `mkdir /tmp/base && git archive <commit> src | tar -x -C /tmp/base && ln -s $PWD/node_modules
 * /tmp/base/`); the traced rows are then skipped (that code stores no context). WAL is
 * `pg_current_wal_lsn()` around each fill on an otherwise idle server, so anything else writing
 * to the cluster shows up in it: run it where nothing else does, and read the numbers as an
 * upper bound. Database: BENCH_DATABASE_URL, else TEST_DATABASE_URL; schema `berth_trace_wal`.
 */
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider } from '@opentelemetry/sdk-trace-base';
import pg from 'pg';
import { dropSchema, quoteIdent } from './db.js';

const { values: args } = parseArgs({
  options: { n: { type: 'string', default: '20000' }, entry: { type: 'string' } },
});
const entry = args.entry ? resolve(args.entry) : '../src/index.js';
const { enqueue, enqueueMany, migrate } = (await import(entry)) as typeof import('../src/index.js');
const N = Number(args.n);
const url = process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL;
if (!url) {
  console.error('set BENCH_DATABASE_URL or TEST_DATABASE_URL');
  process.exit(2);
}
const SCHEMA = 'berth_trace_wal';
const S = quoteIdent(SCHEMA);
const pool = new pg.Pool({ connectionString: url, max: 2 });
trace.setGlobalTracerProvider(new BasicTracerProvider());
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

async function walOf(fill: () => Promise<void>): Promise<{ walPerTask: number; rowBytes: number }> {
  await dropSchema(url as string, SCHEMA);
  await migrate({ connectionString: url as string, schema: SCHEMA });
  await pool.query('CHECKPOINT');
  const before = (await pool.query<{ l: string }>('SELECT pg_current_wal_lsn()::text AS l')).rows[0]!.l;
  await fill();
  const wal = await pool.query<{ b: string }>('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::text AS b', [before]);
  const row = await pool.query<{ b: string }>(`SELECT avg(pg_column_size(r.*))::text AS b FROM ${S}.ready r`);
  return { walPerTask: Number(wal.rows[0]!.b) / N, rowBytes: Number(row.rows[0]!.b) };
}

const bulk = async () => {
  for (let start = 0; start < N; start += 1000) {
    const specs = [];
    for (let i = start; i < Math.min(N, start + 1000); i++) specs.push({ type: 'noop', payload: { i } });
    await enqueueMany(pool, specs, { schema: SCHEMA });
  }
};
const single = async () => {
  for (let i = 0; i < N; i++) await enqueue(pool, 'noop', { i }, { schema: SCHEMA });
};
const traced = (fill: () => Promise<void>) => () =>
  trace.getTracer('bench').startActiveSpan('producer', async (span) => {
    await fill();
    span.end();
  });

const rows: [string, () => Promise<void>][] = [
  ['enqueueMany x1000, untraced', bulk],
  ['enqueue x1, untraced', single],
];
if (!args.entry) rows.push(['enqueueMany x1000, traced', traced(bulk)], ['enqueue x1, traced', traced(single)]);
console.log(`\n${N} tasks per row (${args.entry ?? 'src/'}); WAL per task and the ready row's size\n`);
console.log('| producer | WAL B/task | ready row B |\n| --- | ---: | ---: |');
for (const [label, fill] of rows) {
  const r = await walOf(fill);
  console.log(`| ${label} | ${r.walPerTask.toFixed(0)} | ${r.rowBytes.toFixed(0)} |`);
}
await dropSchema(url, SCHEMA);
await pool.end();
