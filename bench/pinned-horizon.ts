/**
 * Throughput with the xmin horizon pinned vs. not, in one run (issue 3, item 12).
 *
 *   npm run bench:pinned        (BENCH_DATABASE_URL, default the local test database)
 *
 * Each run drains 20,000 no-op tasks (enqueued in batches of 1,000 while the worker runs) with
 * 10 slots at berth's defaults. "pinned": another session holds an open transaction with an
 * XID for the whole run. Three repetitions, alternating order; also reports dead tuples left
 * on the schema's relations and WAL bytes per task.
 */
import pg from 'pg';
import { pino } from 'pino';
import { defineTask, enqueueMany, migrate, Worker } from '../src/index.js';

const url = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'berth_pinned';
const N = 20_000;

async function run(pinned: boolean): Promise<{ tps: number; dead: number; walPerTask: number }> {
  const admin = new pg.Pool({ connectionString: url, max: 4 });
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await migrate({ connectionString: url, schema });
  const pin = new pg.Client({ connectionString: url });
  await pin.connect();
  if (pinned) {
    await pin.query('BEGIN');
    await pin.query('SELECT txid_current()');
  }
  let done = 0;
  const def = defineTask({ type: 'noop', ceilingMs: 60_000, handler: async () => void done++ });
  const w = new Worker({ connectionString: url, schema, tasks: [def], slots: 10, logger: pino({ level: 'silent' }) });
  await w.start();
  const wal0 = (await admin.query('SELECT pg_current_wal_lsn() AS l')).rows[0].l;
  const t0 = performance.now();
  for (let b = 0; b < N / 1000; b++) {
    await enqueueMany(
      admin,
      Array.from({ length: 1000 }, (_, i) => ({ type: 'noop', payload: { i } })),
      { schema },
    );
  }
  while (done < N) await new Promise((r) => setTimeout(r, 5));
  const secs = (performance.now() - t0) / 1000;
  const wal = (await admin.query('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::float8 AS b', [wal0])).rows[0].b;
  await w.stop();
  await admin.query('SELECT pg_stat_force_next_flush()');
  await new Promise((r) => setTimeout(r, 600));
  const dead = (
    await admin.query(`SELECT coalesce(sum(n_dead_tup), 0)::int AS d FROM pg_stat_user_tables WHERE schemaname = $1`, [
      schema,
    ])
  ).rows[0].d;
  if (pinned) await pin.query('ROLLBACK');
  await pin.end();
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await admin.end();
  return { tps: N / secs, dead, walPerTask: wal / N };
}

const results: Record<'pinned' | 'unpinned', { tps: number; dead: number; walPerTask: number }[]> = {
  pinned: [],
  unpinned: [],
};
for (let rep = 0; rep < 3; rep++) {
  for (const pinned of rep % 2 ? [true, false] : [false, true]) {
    const r = await run(pinned);
    results[pinned ? 'pinned' : 'unpinned'].push(r);
    console.error(
      `rep ${rep + 1} ${pinned ? 'pinned' : 'unpinned'}: ${Math.round(r.tps)} tasks/s, ${r.dead} dead tuples, ${Math.round(r.walPerTask)} WAL bytes/task`,
    );
  }
}
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const cell = (xs: number[]) =>
  `${Math.round(med(xs)).toLocaleString('en-US')} (${Math.round(Math.min(...xs)).toLocaleString('en-US')}–${Math.round(Math.max(...xs)).toLocaleString('en-US')})`;
console.log(
  `| run | tasks/s (enqueue while draining) | dead tuples left | WAL bytes/task |\n| --- | ---: | ---: | ---: |`,
);
for (const k of ['unpinned', 'pinned'] as const) {
  const rs = results[k];
  console.log(
    `| ${k === 'pinned' ? 'xmin horizon pinned' : 'no pin'} | ${cell(rs.map((r) => r.tps))} | ${cell(rs.map((r) => r.dead))} | ${cell(rs.map((r) => r.walPerTask))} |`,
  );
}
