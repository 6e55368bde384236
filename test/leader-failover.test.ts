import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { enqueueMany, getTask } from '../src/index.js';
import { claim } from '../src/processor/claim.js';
import { claimParams } from './claim-params.js';
import { freshSchema, leaderWorkerId, waitFor, spawnWorkerProcess } from './helpers.js';

const { schema, pool } = await freshSchema('failover');
const S = `"${schema}"`;

const spawnWorker = (id: string) => spawnWorkerProcess(schema, id);

const leaderId = () => leaderWorkerId(pool, schema);

test('three worker processes: the leader is SIGKILLed and promotion and rescue resume on another', async () => {
  await pool.query(
    `CREATE TABLE ${S}.executions (i integer NOT NULL, kind text NOT NULL, worker text NOT NULL, at timestamptz DEFAULT clock_timestamp())`,
  );
  const children = new Map<string, ChildProcess>();
  for (const id of ['f1', 'f2', 'f3']) children.set(id, await spawnWorker(id));
  try {
    const first = await waitFor(leaderId, 20_000, 'a leader');
    children.get(first)!.kill('SIGKILL');
    await new Promise((r) => children.get(first)!.once('exit', r));
    children.delete(first);
    const second = await waitFor(
      async () => {
        const id = await leaderId();
        return id && id !== first ? id : null;
      },
      20_000,
      'a new leader',
    );
    assert.ok(children.has(second));
    // Promotion resumed: a scheduled task becomes due and runs.
    const [scheduled] = await enqueueMany(pool, [{ type: 'mp_ok', payload: { i: 1 }, delay: 200 }], { schema });
    // Rescue resumed: an attempt abandoned by a dead worker (lease lapsed) is rescued and runs.
    // Enqueued and leased in one transaction, so no live worker can take it first.
    const c = await pool.connect();
    await c.query('BEGIN');
    await enqueueMany(c, [{ type: 'mp_ok', payload: { i: 2 }, queue: 'orphans', shard: 0 }], { schema });
    const lane = (await c.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = 'orphans'`)).rows[0].lane_id;
    const got = await claim(
      c,
      claimParams(schema, [lane], 1, { ceilings: new Map([['mp_ok', 1]]), defaultCeilingMs: 1, workerId: 'ghost' }),
    );
    await c.query('COMMIT');
    c.release();
    assert.equal(got.length, 1);
    const ran = async (i: number) =>
      (await pool.query(`SELECT 1 FROM ${S}.executions WHERE i = $1`, [i])).rowCount! > 0;
    await waitFor(() => ran(1), 20_000, 'the scheduled task to run after failover');
    // Leased by 'ghost', which never settles: only rescue can have made it runnable again.
    await waitFor(() => ran(2), 20_000, 'the rescued task to run');
    // The handler's row commits before its completion is flushed (settlements are batched).
    await waitFor(
      async () => ((await getTask(pool, schema, scheduled!.id!))?.state ?? 'completed') === 'completed',
      20_000,
      'the scheduled task settled as completed',
    );
  } finally {
    for (const c of children.values()) c.kill('SIGTERM');
    await Promise.all(
      [...children.values()].map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once('exit', r)))),
    );
  }
});
