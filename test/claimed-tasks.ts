import assert from 'node:assert/strict';
import type pg from 'pg';
import { enqueueMany } from '../src/index.js';
import { claim, discover, type ClaimedTask } from '../src/processor/claim.js';
import { storageFor } from '../src/storage/storage.js';
import { claimParams } from './claim-params.js';

/**
 * `n` fresh tasks of type `t` claimed from an emptied schema (one lane per queue given, the tasks
 * spread over them in turn), in lane order: the batcher's reviews complete them by hand.
 */
export async function claimedTasks(
  pool: pg.Pool,
  schema: string,
  n: number,
  queues: string[] = ['q'],
): Promise<ClaimedTask[]> {
  const S = `"${schema}"`;
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe, ${S}.task_results, ${S}.attempt_history`,
  );
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 't', payload: { i }, shard: 0, queue: queues[i % queues.length] })),
    { schema },
  );
  const storage = storageFor(schema);
  const lanes = [...new Set((await discover(pool, storage, null, 50)).map((c) => c.laneId))];
  const got = await claim(pool, claimParams(schema, lanes, n));
  assert.equal(got.length, n);
  return got.sort((a, b) => a.laneId - b.laneId || Number(BigInt(a.laneSeq) - BigInt(b.laneSeq)));
}
