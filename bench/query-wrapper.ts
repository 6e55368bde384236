/**
 * The cost of berth's per-query wrapper (src/db/connections.ts, BerthClient: the statement-name
 * detection and the error hint for transaction poolers): `npx tsx bench/query-wrapper.ts`.
 * Three pools of one connection each on BENCH_DATABASE_URL (else TEST_DATABASE_URL): pg's own
 * client, berth's client without detection, and with it (a worker's default). Each runs the
 * same named one-row statement, in rounds of QUERIES sequential queries, the pools alternating;
 * prints the client's CPU per query (process.cpuUsage: what the wrapper adds lands there) and
 * the wall time, medians of the rounds.
 */
import pg from 'pg';
import { createPool, resolveDatabase } from '../src/db/connections.js';
import { StatementNaming } from '../src/db/prepared.js';

const url =
  process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const QUERIES = Number(process.env.QUERIES ?? 5000);
const ROUNDS = Number(process.env.ROUNDS ?? 8);
const target = resolveDatabase(url);
const pools: Record<string, pg.Pool> = {
  'pg.Client': new pg.Pool({ connectionString: url, max: 1 }),
  'berth, no detection': createPool(target, { max: 1 }, null, 'bench'),
  'berth, detection': createPool(
    { ...target, naming: new StatementNaming(() => undefined) },
    { max: 1 },
    null,
    'bench',
  ),
};
const statement = { name: 'bench-wrapper', text: 'SELECT $1::int AS n', values: [1] };
const cpu: Record<string, number[]> = {};
const wall: Record<string, number[]> = {};
for (const [label, pool] of Object.entries(pools)) {
  for (let i = 0; i < 500; i++) await pool.query(statement);
  cpu[label] = [];
  wall[label] = [];
}
for (let r = 0; r < ROUNDS; r++) {
  const order = Object.keys(pools);
  if (r % 2 === 1) order.reverse();
  for (const label of order) {
    const pool = pools[label]!;
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    for (let i = 0; i < QUERIES; i++) await pool.query(statement);
    const dt = performance.now() - t0;
    const dc = process.cpuUsage(c0);
    cpu[label]!.push((dc.user + dc.system) / QUERIES);
    wall[label]!.push((dt / QUERIES) * 1000);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
for (const label of Object.keys(pools))
  console.log(
    `${label.padEnd(22)} client CPU ${median(cpu[label]!).toFixed(1)} µs/query, wall ${median(wall[label]!).toFixed(1)} µs/query (${ROUNDS} rounds of ${QUERIES})`,
  );
for (const pool of Object.values(pools)) await pool.end();
