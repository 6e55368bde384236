/**
 * `npm run bench:prune`: what the ring prune costs under its lock, on a dedicated stock cluster.
 *
 * The prune of a sealed segment holds ACCESS EXCLUSIVE on its partitions while it decides and
 * truncates, and every claim whose ring window holds that segment waits for it. Migration 18 made
 * the prune check every entry of the segment (settled or tombstoned) before it truncates; the
 * entry-by-entry pass runs before the lock, and under the lock only the lanes whose last entry
 * moved are read again. This measures, for a fully settled segment of each size, with 2,000,000
 * tasks queued in the current segment beside it: the prune's time, and the longest wait of a
 * reader of the segment polling every 5 ms (what a claim would wait).
 *
 * BENCH_BERTH_BASE=<another build's dist/index.js> runs the same on that build, in a schema of
 * its own, for a before/after in one run. BENCH_PRUNE_SIZES (default 30000,300000,1000000),
 * BENCH_PRUNE_QUEUED (default 2000000), BENCH_PRUNE_LEASE (entries per lease, default 64),
 * BENCH_REPS (default 3).
 */
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import pg from 'pg';
import { intEnv, intListEnv } from './config.js';
import { openBenchServer, quoteIdent, recreateDatabase } from './db.js';
import { log } from './util.js';

type Berth = typeof import('../src/index.js');
const builds: { label: string; berth: Berth; schema: string }[] = [
  { label: 'this checkout', berth: (await import('../src/index.js')) as Berth, schema: 'prune_cost' },
];
if (process.env.BENCH_BERTH_BASE) {
  const path = resolve(process.env.BENCH_BERTH_BASE);
  builds.push({
    label: `base (${path})`,
    berth: (await import(pathToFileURL(path).href)) as Berth,
    schema: 'prune_cost_base',
  });
}
const sizes = intListEnv('BENCH_PRUNE_SIZES', [30_000, 300_000, 1_000_000]);
const queued = intEnv('BENCH_PRUNE_QUEUED', 2_000_000, 0);
const leaseSize = intEnv('BENCH_PRUNE_LEASE', 64);
const reps = intEnv('BENCH_REPS', 3);
const LANES = 16;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Segment 0: `size` entries over 16 lanes, leased in ranges of `leaseSize` and each lease
 * settled by two completion rows (two flushes). Segment 1, current: `queued` entries, unclaimed.
 * Written with INSERT … SELECT (the shapes the claim and the completion write), then analyzed.
 */
async function populate(pool: pg.Pool, schema: string, size: number): Promise<void> {
  const S = quoteIdent(schema);
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones`);
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0`);
  for (let sh = 0; sh < LANES; sh++) {
    await pool.query(`SELECT ${S}.provision_lane('default', 0::smallint, $1::smallint)`, [sh]);
  }
  const per = Math.floor(size / LANES);
  const later = Math.floor(queued / LANES);
  await pool.query(
    `INSERT INTO ${S}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard, attempts, created_at, run_at)
     SELECT CASE WHEN s <= $1::int THEN 0 ELSE 1 END, l.lane_id, s, nextval('${schema}.task_id_seq'), 't', jsonb_build_object('i', s),
            l.queue, l.priority, l.shard, 0, now(), now()
       FROM ${S}.lanes l, generate_series(1, $1::int + $2::int) s`,
    [per, later],
  );
  await pool.query(
    `INSERT INTO ${S}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker, types, type_expires,
                                    type_max_attempts, expires_at)
     SELECT 0, l.lane_id, f, least(f + $2::int - 1, $1::int), least(f + $2::int - 1, $1::int) - f + 1, gen_random_uuid(), now(), 'w', '{t}',
            ARRAY[now() + interval '1 min'], '{20}', now() + interval '1 min'
       FROM ${S}.lanes l, generate_series(1, $1::int, $2::int) f`,
    [per, leaseSize],
  );
  await pool.query(
    `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
     SELECT 0, l.lane_id, l.from_seq, int8multirange(int8range(l.from_seq, l.from_seq + h)), h, 'completed'
       FROM (SELECT x.*, greatest(x.n / 2, 1) AS h FROM ${S}.range_leases_0 x) l
     UNION ALL
     SELECT 0, l.lane_id, l.from_seq, int8multirange(int8range(l.from_seq + h, l.to_seq + 1)), l.n - h, 'completed'
       FROM (SELECT x.*, greatest(x.n / 2, 1) AS h FROM ${S}.range_leases_0 x) l WHERE l.n - h > 0`,
  );
  for (const { lane_id } of (await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes`)).rows) {
    await pool.query(`SELECT setval('${schema}.lane_seq_${lane_id}', $1)`, [per + later]);
  }
  // The ring at segment 1 (a rotation by ring_state's own UPDATE, which either schema version takes).
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 1, generation = generation + 1`);
  await pool.query(`ANALYZE ${S}.ready_0, ${S}.range_leases_0, ${S}.range_settlements_0, ${S}.ready_1`);
}

/** One prune of segment 0: its time, and the longest wait of a reader of `ready_0` meanwhile. */
async function timedPrune(
  pool: pg.Pool,
  url: string,
  schema: string,
): Promise<{ ms: number; waitMs: number; result: string }> {
  const S = quoteIdent(schema);
  let stop = false;
  let waitMs = 0;
  const reader = new pg.Client({ connectionString: url });
  await reader.connect();
  const probing = (async () => {
    while (!stop) {
      const a = performance.now();
      await reader.query(`SELECT 1 FROM ${S}.ready_0 LIMIT 1`);
      waitMs = Math.max(waitMs, performance.now() - a);
      await sleep(5);
    }
  })();
  await sleep(50);
  const a = performance.now();
  const r = await pool.query<{ r: string }>(`SELECT ${S}.prune_slot(0::smallint, 10000) AS r`);
  const ms = performance.now() - a;
  await sleep(20);
  stop = true;
  await probing;
  await reader.end();
  return { ms, waitMs, result: r.rows[0]!.r };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const server = await openBenchServer();
try {
  const url = new URL(server.adminUrl);
  url.pathname = '/prune_cost';
  await recreateDatabase(server.adminUrl, 'prune_cost');
  const pool = new pg.Pool({ connectionString: url.toString(), max: 4, options: '-c jit=off' });
  for (const b of builds) await b.berth.migrate({ connectionString: url.toString(), schema: b.schema });
  const rows: string[] = [];
  for (const size of sizes) {
    const got = new Map<string, { ms: number[]; wait: number[]; results: Set<string> }>();
    for (let rep = 0; rep < reps; rep++) {
      for (const b of rep % 2 ? [...builds].reverse() : builds) {
        await populate(pool, b.schema, size);
        const r = await timedPrune(pool, url.toString(), b.schema);
        log(
          `${b.label}, segment of ${size}, ${queued} queued: prune ${r.ms.toFixed(0)} ms, reader waited ${r.waitMs.toFixed(0)} ms (${r.result})`,
        );
        const g = got.get(b.label) ?? { ms: [], wait: [], results: new Set<string>() };
        g.ms.push(r.ms);
        g.wait.push(r.waitMs);
        g.results.add(r.result);
        got.set(b.label, g);
      }
    }
    for (const [label, g] of got) {
      rows.push(
        `| ${label} | ${size.toLocaleString('en')} | ${median(g.ms).toFixed(0)} (${Math.min(...g.ms).toFixed(0)}–${Math.max(...g.ms).toFixed(0)}) | ` +
          `${median(g.wait).toFixed(0)} (${Math.min(...g.wait).toFixed(0)}–${Math.max(...g.wait).toFixed(0)}) | ${[...g.results].join(', ')} |`,
      );
    }
  }
  await pool.end();
  process.stdout.write(
    [
      `Ring prune of a settled segment, ${queued.toLocaleString('en')} tasks queued in the current segment, leases of ${leaseSize}, ` +
        `${reps} repetitions (median, min–max), ${server.description}:`,
      '',
      '| build | segment entries | prune ms | longest wait of a reader of the segment ms | result |',
      '| --- | ---: | ---: | ---: | --- |',
      ...rows,
      '',
    ].join('\n'),
  );
} finally {
  await server.stop();
}
