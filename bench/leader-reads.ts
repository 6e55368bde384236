/**
 * What the maintenance leader's periodic statements cost on a quiet schema (issue 11, pickup
 * latency): each runs on one of the machine's cores while pickups run on the other.
 *
 *   npx tsx bench/leader-reads.ts --url postgres://…/db [--rounds 5] [--tasks 500]
 *
 * Each round enqueues `--tasks` tasks, claims and completes them all through a worker's windowed
 * claim, and rotates the ring, so a drained sealed segment and a current one stand, as in an
 * idle fleet between two pickups. Then, timed from this process (round trips included):
 * - the prune of the drained segment (`pruneSegment`: its checks, the lock, TRUNCATE, commit;
 *   the lock is what claims still reading the segment wait behind);
 * - the gauges (`readGauges`) and the idle rescue (`rescueLapsedLeases`, nothing lapsed) on a
 *   new session, then warm, then right after the prune (its TRUNCATE invalidates every plan
 *   that names the segment's partitions).
 * Median (min–max) over the rounds. The schema `leader_reads` is dropped and recreated.
 */
import { storageFor } from '../src/storage/storage.js';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { enqueueMany, migrate } from '../src/index.js';
import { readGauges } from '../src/maintenance/gauges.js';
import { pruneSegment, rotateRing } from '../src/maintenance/ring.js';
import { claimBatch } from '../src/processor/claim.js';
import { claimParams } from '../test/claim-params.js';
import { completeLeases } from '../src/storage/complete.js';
import { rescueLapsedLeases } from '../src/storage/rescue.js';
import { readRingWindow } from '../src/storage/ring-window.js';
import { median } from './stats.js';
import { log } from './util.js';

const { values } = parseArgs({
  options: {
    url: { type: 'string' },
    rounds: { type: 'string', default: '5' },
    tasks: { type: 'string', default: '500' },
  },
});
const url = values.url ?? process.env.BENCH_DATABASE_URL;
if (!url) throw new Error('--url (or BENCH_DATABASE_URL) is required: the bench drops and recreates its schema there');
const rounds = Number(values.rounds);
const tasks = Number(values.tasks);
for (const [k, v] of Object.entries({ rounds, tasks })) {
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${k} must be a positive integer, got ${v}`);
}
const schema = 'leader_reads';

const admin = new pg.Pool({ connectionString: url, max: 2 });
await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });

/** Claim and complete everything queued, as a worker would, through its ring window. */
async function drain(): Promise<void> {
  const laneIds = (await admin.query(`SELECT lane_id FROM ${schema}.lanes`)).rows.map((r) => r.lane_id as number);
  const window = await readRingWindow(admin, storageFor(schema));
  for (;;) {
    const batch = await claimBatch(
      admin,
      claimParams(schema, laneIds, 200, { ceilings: new Map([['t', 60_000]]), workerId: 'leader-reads', window }),
    );
    if (batch.tasks.length === 0) return;
    await completeLeases(admin, storageFor(schema), batch.tasks);
  }
}

async function timed(f: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await f();
  return performance.now() - t;
}

type Row = 'prune' | 'gauges' | 'rescue';
const samples: Record<string, number[]> = {};
const add = (k: string, ms: number) => {
  samples[k] ??= [];
  samples[k].push(ms);
};

for (let round = 0; round < rounds; round++) {
  await enqueueMany(
    admin,
    Array.from({ length: tasks }, (_, i) => ({ type: 't', payload: { i } })),
    { schema },
  );
  await drain();
  const sealed = (await admin.query(`SELECT current_slot FROM ${schema}.ring_state`)).rows[0].current_slot as number;
  if ((await rotateRing(admin, schema, 0)) !== 'rotated') throw new Error('the ring did not rotate');
  // One new session for the leader's reads, as on a new leader or a pool that grew.
  const leader = new pg.Pool({ connectionString: url, max: 1 });
  try {
    add('gauges: new session', await timed(() => readGauges(leader, schema)));
    add('rescue: new session', await timed(() => rescueLapsedLeases(leader, schema)));
    add('gauges: warm', await timed(() => readGauges(leader, schema)));
    add('rescue: warm', await timed(() => rescueLapsedLeases(leader, schema)));
    const pruned = await timed(async () => {
      const p = await pruneSegment(admin, schema, sealed, 1000);
      if (p.result !== 'pruned') throw new Error(`segment ${sealed} was not pruned: ${JSON.stringify(p)}`);
    });
    add('prune: drained segment', pruned);
    add('gauges: after the prune', await timed(() => readGauges(leader, schema)));
    add('rescue: after the prune', await timed(() => rescueLapsedLeases(leader, schema)));
  } finally {
    await leader.end();
  }
  log(`round ${round + 1}: prune ${samples['prune: drained segment']!.at(-1)!.toFixed(1)} ms`);
}
await admin.end();

const rows: Row[] = ['prune', 'gauges', 'rescue'];
console.log(`leader reads: ${tasks} tasks a round, ${rounds} rounds; ms, median (min–max)\n`);
console.log('| statement | ms |');
console.log('| --- | ---: |');
for (const k of Object.keys(samples).sort(
  (a, b) => rows.indexOf(a.split(':')[0] as Row) - rows.indexOf(b.split(':')[0] as Row),
)) {
  const xs = samples[k]!;
  console.log(`| ${k} | ${median(xs).toFixed(1)} (${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)}) |`);
}
