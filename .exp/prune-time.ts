import pg from 'pg';
import { migrate, enqueueMany } from '../src/index.js';
import { claimBatch } from '../src/processor/claim.js';
import { rotateRing, pruneSegment } from '../src/maintenance/ring.js';
import { completeLeases } from '../src/storage/complete.js';
import { readRingWindow } from '../src/storage/ring-window.js';
import { wakeChannel } from '../src/sql.js';
const url = 'postgres://postgres@127.0.0.1:56200/test';
const schema = 'prune_probe';
const pool = new pg.Pool({ connectionString: url, max: 4 });
await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });
const lanes = (await pool.query(`SELECT lane_id FROM ${schema}.lanes`)).rows.map((r) => r.lane_id as number);
const rounds = Number(process.env.ROUNDS ?? 6);
for (let round = 0; round < rounds; round++) {
  await enqueueMany(pool, Array.from({ length: 500 }, (_, i) => ({ type: 't', payload: { i } })), { schema });
  const window = await readRingWindow(pool, schema);
  const laneIds = (await pool.query(`SELECT lane_id FROM ${schema}.lanes`)).rows.map((r) => r.lane_id as number);
  for (;;) {
    const b = await claimBatch(pool, { schema, laneIds, limit: 100, ceilings: new Map([['t', 60000]]), maxAttempts: new Map(), defaultMaxAttempts: 20, defaultCeilingMs: 60000, marginMs: 0, workerId: 'x', wakeChannel: wakeChannel(schema), window });
    if (b.tasks.length === 0) break;
    await completeLeases(pool, schema, b.tasks);
  }
  const st = (await pool.query(`SELECT current_slot FROM ${schema}.ring_state`)).rows[0].current_slot as number;
  await rotateRing(pool, schema, 0);
  const a = performance.now();
  if (process.env.NOPRUNE) { console.log("left", st); continue; }
  const p = await pruneSegment(pool, schema, st, 100);
  console.log('prune', st, p.result, (performance.now() - a).toFixed(1), 'ms');
}
await pool.end();
void lanes;
