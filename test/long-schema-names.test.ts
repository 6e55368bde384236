/**
 * Long schema names. PostgreSQL keeps 63 bytes of a name: prepared statement names past that
 * (statementName in src/sql.ts) were cut there, so two of berth's per-window statement names
 * that shared their first 63 bytes collided on one connection; and the schema's wake channel
 * (`<schema>.wake`) past it failed every enqueue, so a schema name is at most 58 bytes.
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { BerthInputError, enqueueMany, migrate, Worker } from '../src/index.js';
import { claimLanes, discover } from '../src/processor/claim.js';
import { claimOneLane } from '../src/processor/claim-one-lane.js';
import { SESSION_OPTIONS } from '../src/process/worker.js';
import { statementName } from '../src/sql.js';
import { readRingWindow } from '../src/storage/ring-window.js';
import { claimParams } from './claim-params.js';
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
  // Bytes, not characters: 25 characters, 66 bytes.
  const short = statementName(`berth-claim:${'水'.repeat(18)}`);
  assert.ok(Buffer.byteLength(short) <= 63, `${short} fits`);
  assert.ok(short.startsWith('berth-claim:#'));
  // 30 three-byte characters are 90 bytes.
  const wide = statementName(`berth-fail:${'é'.repeat(15)}${'水'.repeat(15)}`);
  assert.ok(Buffer.byteLength(wide) <= 63);
  assert.ok(wide.startsWith('berth-fail:#'));
});

test('under a long schema name, claims and discovery in two ring windows run on one connection', async () => {
  // t_ + 45 + _ + pid (1 to 7 digits): 49 to 55 bytes, where every per-window name of the claim
  // and discovery passed 63 bytes, within the 58 a schema name may have.
  const { schema, pool } = await freshSchema(`long_schema_name_${'x'.repeat(28)}`);
  assert.ok(Buffer.byteLength(schema) >= 48 && Buffer.byteLength(schema) <= 58, schema);
  await enqueueMany(
    pool,
    Array.from({ length: 6 }, (_, i) => ({ type: 't', payload: { i }, shard: 0 })),
    { schema },
  );
  const worker = new pg.Client({ connectionString: DATABASE_URL, options: SESSION_OPTIONS });
  await worker.connect();
  try {
    const current = await readRingWindow(worker, storageFor(schema));
    const other = (current.segments?.[0] ?? 0) === 0 ? 1 : 0;
    // The same generation with one more (empty) segment: a window the worker could hold after
    // a rotation, and a statement name that differs only in its window's part.
    const wider = { generation: current.generation, segments: [...(current.segments ?? [0]), other].sort() };
    const lanes = [...new Set((await discover(worker, storageFor(schema), null, 20, 1, current)).map((c) => c.laneId))];
    assert.equal((await discover(worker, storageFor(schema), null, 20, 1, wider)).length, 1);
    const got: string[] = [];
    for (const window of [current, wider]) {
      for (const claim of [claimOneLane, claimLanes]) {
        const batch = await claim(worker, claimParams(schema, lanes, 1, { marginMs: 30_000, window }));
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

test('a schema name past 58 bytes is refused by migrate() and the Worker, before anything is written', async () => {
  const long = `s${'x'.repeat(58)}`;
  await assert.rejects(migrate({ connectionString: DATABASE_URL, schema: long }), (err: unknown) => {
    assert.ok(err instanceof BerthInputError);
    assert.match(err.message, /schema must be a non-empty string of at most 58 UTF-8 bytes \(got 59 bytes\)/);
    return true;
  });
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  try {
    const made = await pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [long]);
    assert.equal(made.rowCount, 0, 'no schema was created');
  } finally {
    await pool.end();
  }
  assert.throws(
    () => new Worker({ connectionString: DATABASE_URL, schema: long, tasks: [] }),
    /at most 58 UTF-8 bytes/,
  );
  // 58 bytes of multi-byte characters is the limit too.
  assert.throws(
    () => new Worker({ connectionString: DATABASE_URL, schema: 'é'.repeat(30), tasks: [] }),
    BerthInputError,
  );
});
