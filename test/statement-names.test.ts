/**
 * Prepared statement names past PostgreSQL's 63 bytes (statementName in src/sql.ts): the server
 * cuts a name there, so two of berth's per-window statement names that shared their first 63
 * bytes collided on one connection under a long schema name.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { enqueueMany } from '../src/index.js';
import { claimLanes, discover, type ClaimParams } from '../src/processor/claim.js';
import { claimOneLane } from '../src/processor/claim-one-lane.js';
import { SESSION_OPTIONS } from '../src/processor/worker.js';
import { statementName, wakeChannel } from '../src/sql.js';
import { readRingWindow } from '../src/storage/ring-window.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

test('a name within 63 bytes is kept as it is; a longer one becomes its kind and a hash, within 63 bytes', () => {
  assert.equal(statementName('berth-claim:berth:w0.1'), 'berth-claim:berth:w0.1');
  const long = (suffix: string) => `berth-claim-one-lane:${'s'.repeat(50)}${suffix}`;
  const a = statementName(long(':w10.11.12.13'));
  const b = statementName(long(':w10.11.12.14'));
  for (const n of [a, b]) {
    assert.ok(Buffer.byteLength(n) <= 63, `${n} fits`);
    assert.ok(n.startsWith('berth-claim-one-lane:#'), `${n} keeps the statement's kind`);
  }
  assert.notEqual(a, b, 'names that differ past byte 63 stay distinct');
  assert.equal(statementName(long(':w10.11.12.13')), a, 'the same statement gets the same name');
  // Bytes, not characters: 30 three-byte characters are 90 bytes.
  const wide = statementName(`berth-fail:${'é'.repeat(15)}${'水'.repeat(15)}`);
  assert.ok(Buffer.byteLength(wide) <= 63);
  assert.ok(wide.startsWith('berth-fail:#'));
});

test('under a long schema name, claims and discovery in two ring windows run on one connection', async () => {
  // t_ + 51 + _ + pid: a schema name of 55 bytes or more (at most 63 with a 7-digit pid).
  const { schema, pool } = await freshSchema(`long_schema_name_${'x'.repeat(34)}`);
  assert.ok(Buffer.byteLength(schema) >= 55, schema);
  await enqueueMany(
    pool,
    Array.from({ length: 6 }, (_, i) => ({ type: 't', payload: { i }, shard: 0 })),
    { schema },
  );
  const worker = new pg.Client({ connectionString: DATABASE_URL, options: SESSION_OPTIONS });
  await worker.connect();
  try {
    const current = await readRingWindow(worker, schema);
    const other = (current.segments?.[0] ?? 0) === 0 ? 1 : 0;
    // The same generation with one more (empty) segment: a window the worker could hold after
    // a rotation, and a statement name that differs only in its window's part.
    const wider = { generation: current.generation, segments: [...(current.segments ?? [0]), other].sort() };
    const lanes = [...new Set((await discover(worker, schema, null, 20, 1, current)).map((c) => c.laneId))];
    assert.equal((await discover(worker, schema, null, 20, 1, wider)).length, 1);
    const params = (window: typeof current): ClaimParams => ({
      schema,
      laneIds: lanes,
      limit: 1,
      ceilings: new Map(),
      maxAttempts: new Map(),
      defaultMaxAttempts: 20,
      defaultCeilingMs: 60_000,
      marginMs: 30_000,
      workerId: 'test',
      wakeChannel: wakeChannel(schema),
      window,
    });
    const got: string[] = [];
    for (const window of [current, wider]) {
      for (const claim of [claimOneLane, claimLanes]) {
        const batch = await claim(worker, params(window));
        assert.equal(batch.stale, false);
        got.push(...batch.tasks.map((t) => t.id));
      }
    }
    assert.equal(got.length, 4, 'each of the four claims leased one task');
    assert.equal(new Set(got).size, 4);
  } finally {
    await worker.end();
  }
});
