import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { z } from 'zod';
import {
  enqueue,
  enqueueMany,
  defineTask,
  getTask,
  moveTask,
  pauseQueue,
  BerthInputError,
  type TaskSpec,
} from '../src/index.js';
import { wakeChannel } from '../src/sql.js';
import { DATABASE_URL, freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('enqueue');

async function listen(): Promise<{ count: () => number; close: () => Promise<void> }> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  let n = 0;
  c.on('notification', () => n++);
  await c.query(`LISTEN "${wakeChannel(schema)}"`);
  return { count: () => n, close: () => c.end() };
}

async function taskCount(): Promise<number> {
  const r = await pool.query(
    `SELECT (SELECT count(*) FROM "${schema}".ready) + (SELECT count(*) FROM "${schema}".deferred) AS n`,
  );
  return Number(r.rows[0].n);
}

test('rollback leaves no task and no wake', async () => {
  const l = await listen();
  const before = await taskCount();
  const c = await pool.connect();
  await c.query('BEGIN');
  await enqueue(c, 'cleanup', { prefix: 'a/' }, { schema });
  await c.query('ROLLBACK');
  c.release();
  // A committed enqueue afterwards proves the listener was live; only that one may arrive.
  await enqueue(pool, 'marker', {}, { schema });
  await waitFor(() => l.count() >= 1, 5000, 'marker wake');
  assert.equal(l.count(), 1);
  assert.equal(await taskCount(), before + 1);
  await l.close();
});

test('commit wakes a listener', async () => {
  const l = await listen();
  const c = await pool.connect();
  await c.query('BEGIN');
  const r = await enqueue(c, 'cleanup', { prefix: 'b/' }, { schema });
  assert.equal(l.count(), 0);
  await c.query('COMMIT');
  c.release();
  await waitFor(() => l.count() === 1, 5000, 'wake on commit');
  assert.equal(r.state, 'ready');
  assert.ok(r.id);
  await l.close();
});

test('a 1,000-task batch in one transaction costs one notification', async () => {
  const l = await listen();
  const c = await pool.connect();
  await c.query('BEGIN');
  const tasks = Array.from({ length: 1000 }, (_, i) => ({ type: 'bulk', payload: { i } }));
  const results = await enqueueMany(c, tasks, { schema });
  // Several statements in the same transaction still collapse into one delivery.
  await enqueue(c, 'bulk', { i: 1000 }, { schema });
  await c.query('COMMIT');
  c.release();
  assert.equal(results.length, 1000);
  assert.ok(results.every((r) => r.state === 'ready' && r.id));
  await enqueue(pool, 'marker', {}, { schema });
  await waitFor(() => l.count() >= 2, 5000, 'two wakes');
  assert.equal(l.count(), 2);
  await l.close();
});

test('a duplicate dedupe key is reported, not raised', async () => {
  const first = await enqueue(pool, 'audit', { org: 1 }, { schema, dedupeKey: 'audit:1' });
  const second = await enqueue(pool, 'audit', { org: 1 }, { schema, dedupeKey: 'audit:1' });
  assert.equal(first.state, 'ready');
  assert.equal(second.state, 'duplicate');
  assert.equal(second.id, null);
  assert.equal(second.duplicateOf, first.id);
  const inBatch = await enqueueMany(
    pool,
    [
      { type: 'audit', payload: {}, dedupeKey: 'audit:2' },
      { type: 'audit', payload: {}, dedupeKey: 'audit:2' },
    ],
    { schema },
  );
  assert.equal(inBatch[0]!.state, 'ready');
  assert.deepEqual(inBatch[1], { id: null, state: 'duplicate', duplicateOf: inBatch[0]!.id });
});

test('concurrent transactions with one dedupe key: the second is reported duplicate after the first commits', async () => {
  const a = await pool.connect();
  const b = await pool.connect();
  await a.query('BEGIN');
  await b.query('BEGIN');
  const ra = await enqueue(a, 'audit', {}, { schema, dedupeKey: 'audit:race' });
  const pb = enqueue(b, 'audit', {}, { schema, dedupeKey: 'audit:race' });
  await a.query('COMMIT');
  const rb = await pb;
  await b.query('COMMIT');
  a.release();
  b.release();
  assert.equal(ra.state, 'ready');
  assert.equal(rb.state, 'duplicate');
});

test('a dead letter never suppresses a new enqueue with its key', async () => {
  const r = await enqueue(pool, 'audit', {}, { schema, dedupeKey: 'audit:dead' });
  // Retire the task to the dead letters the way the processor does (key released).
  await pool.query(
    `WITH t AS (SELECT * FROM "${schema}".ready WHERE id = $1)
     INSERT INTO "${schema}".dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts,
       dedupe_key, last_error, created_at, last_attempted_at)
     SELECT id, type, payload, queue, priority, shard, 20, 20, dedupe_key, 'boom', created_at, now() FROM t`,
    [r.id],
  );
  await pool.query(
    `INSERT INTO "${schema}".tombstones (slot, lane_id, lane_seq, id, reason)
                    SELECT slot, lane_id, lane_seq, id, 'test' FROM "${schema}".ready WHERE id = $1`,
    [r.id],
  );
  await pool.query(`DELETE FROM "${schema}".dedupe WHERE id = $1`, [r.id]);
  const again = await enqueue(pool, 'audit', {}, { schema, dedupeKey: 'audit:dead' });
  assert.equal(again.state, 'ready');
});

test('runAt and delay in the future go to deferred storage as scheduled', async () => {
  const a = await enqueue(pool, 'later', {}, { schema, runAt: new Date(Date.now() + 3600_000) });
  const b = await enqueue(pool, 'later', {}, { schema, delay: 60_000 });
  assert.equal(a.state, 'scheduled');
  assert.equal(b.state, 'scheduled');
  const t = await getTask(pool, schema, b.id!);
  assert.equal(t?.state, 'scheduled');
  assert.ok(t!.runAt!.getTime() > Date.now() + 30_000);
});

test("one transaction's entries share a lane and take lane sequence numbers in order", async () => {
  const c = await pool.connect();
  await c.query('BEGIN');
  const rs = await enqueueMany(
    c,
    Array.from({ length: 50 }, (_, i) => ({ type: 'ordered', payload: { i } })),
    { schema },
  );
  await c.query('COMMIT');
  c.release();
  const rows = await pool.query(
    `SELECT lane_id, lane_seq, (payload->>'i')::int AS i FROM "${schema}".ready WHERE id = ANY($1::bigint[]) ORDER BY lane_seq`,
    [rs.map((r) => r.id)],
  );
  assert.equal(new Set(rows.rows.map((r) => r.lane_id)).size, 1);
  assert.deepEqual(
    rows.rows.map((r) => r.i),
    Array.from({ length: 50 }, (_, i) => i),
  );
});

test('bad input gets a clear error and writes nothing', async () => {
  const before = await taskCount();
  await assert.rejects(enqueue(pool, '', {}, { schema }), BerthInputError);
  await assert.rejects(enqueue(pool, 'x', { n: 1n }, { schema }), /not JSON-serialisable/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, priority: 1.5 }), /priority/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, priority: 40000 }), /priority/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, shard: 64 }), /shard/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, runAt: new Date('nope') }), /runAt/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, delay: -1 }), /delay/);
  await assert.rejects(enqueue(pool, 'x', {}, { schema, maxAttempts: 0 }), /maxAttempts/);
  const def = defineTask({
    type: 'typed',
    ceilingMs: 1000,
    handler: async () => {},
    schema: z.object({ org: z.number() }),
  });
  await assert.rejects(
    enqueue(pool, def, { org: 'nope' } as never, { schema }),
    /payload for task type "typed" is invalid: org/,
  );
  // A batch with one bad task writes none of them.
  await assert.rejects(
    enqueueMany(
      pool,
      [
        { type: 'ok', payload: {} },
        { type: 'ok', payload: {}, queue: 5 as never },
      ],
      { schema },
    ),
    /queue/,
  );
  assert.equal(await taskCount(), before);
  const ok = await enqueue(pool, def, { org: 7 }, { schema });
  assert.equal(ok.state, 'ready');
});

test('queue and priority are stored on the task', async () => {
  const r = await enqueue(pool, 'x', { a: 1 }, { schema, queue: 'mail', priority: -5 });
  const t = await getTask(pool, schema, r.id!);
  assert.equal(t?.queue, 'mail');
  assert.equal(t?.priority, -5);
  assert.equal(t?.state, 'ready');
  assert.deepEqual(t?.payload, { a: 1 });
});

test("a producer holds its lane lock until commit, so a lane's entries become visible in sequence order", async () => {
  const a = await pool.connect();
  const b = await pool.connect();
  try {
    await enqueue(pool, 'lane_order', { who: 'first' }, { schema, queue: 'ordered', shard: 5 }); // the lane exists
    await a.query('BEGIN');
    await b.query('BEGIN');
    const ra = await enqueue(a, 'lane_order', { who: 'a' }, { schema, queue: 'ordered', shard: 5 });
    const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    const pb = enqueue(b, 'lane_order', { who: 'b' }, { schema, queue: 'ordered', shard: 5 });
    // B waits on the lane lock A still holds (not on anything else).
    await waitFor(
      async () =>
        (await pool.query(`SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted`, [bPid]))
          .rowCount === 1,
      20_000,
      'B to wait on the lane lock',
    );
    await a.query('COMMIT');
    const rb = await pb;
    await b.query('COMMIT');
    const seqs = await pool.query(
      `SELECT id::text, lane_seq FROM "${schema}".ready WHERE id = ANY($1::bigint[]) ORDER BY lane_seq`,
      [[ra.id, rb.id]],
    );
    assert.deepEqual(
      seqs.rows.map((r) => r.id),
      [ra.id, rb.id],
    );
  } finally {
    a.release();
    b.release();
  }
});

test('two batches mixing pinned and default shards take lane locks in one order: no deadlock', async () => {
  for (let sh = 0; sh < 16; sh++)
    await pool.query(`SELECT "${schema}".provision_lane('mixed', 0::smallint, $1::smallint)`, [sh]);
  const c1 = await pool.connect();
  const c2 = await pool.connect();
  try {
    await c1.query('BEGIN');
    await c2.query('BEGIN');
    const a = Number((await c1.query('SELECT txid_current() AS t')).rows[0].t) % 16;
    const b = Number((await c2.query('SELECT txid_current() AS t')).rows[0].t) % 16;
    // Each pins the shard the other one's default resolves to: opposite orders without the fix.
    const run = async (c: typeof c1, pinned: number) => {
      await enqueueMany(
        c,
        [
          { type: 'x', payload: 1, queue: 'mixed', shard: pinned },
          { type: 'x', payload: 2, queue: 'mixed' },
        ],
        { schema },
      );
      await c.query('COMMIT');
      return 'ok';
    };
    const results = await Promise.allSettled([run(c1, b), run(c2, a)]);
    assert.deepEqual(
      results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as Error).message)),
      ['ok', 'ok'],
    );
  } finally {
    await c1.query('ROLLBACK').catch(() => undefined);
    await c2.query('ROLLBACK').catch(() => undefined);
    c1.release();
    c2.release();
  }
});

test('inputs PostgreSQL would refuse are refused by berth, naming the field and the task; the batch writes nothing', async () => {
  const before = await taskCount();
  // Each of these used to reach the statement and fail there with a raw SQLSTATE (in brackets).
  const bad: [Partial<TaskSpec>, RegExp][] = [
    [{ maxAttempts: 3e9 }, /^task #1: maxAttempts must be an integer from 1 to 1000000 \(got 3000000000\)$/], // 22003
    [
      { delay: 1e300 },
      /^task #1: delay must be a number of milliseconds from 0 to \d+ \(the run time must fall before year 10000\) \(got 1e\+300\)$/,
    ], // 22008
    [{ runAt: new Date(-8.64e15) }, /^task #1: runAt must be a valid Date from year 1 to 9999/], // 22008
    [{ runAt: new Date('+010000-01-01T00:00:00Z') }, /^task #1: runAt must be a valid Date from year 1 to 9999/], // read back as null
    [{ payload: { a: 'x\u0000y' } }, /^task #1 \(t\): payload\.a contains a NUL character \(\\u0000\)/], // 22P05
    [
      { payload: { list: [1, { 'odd key': ['ok', 'deep\u0000'] }] } },
      /^task #1 \(t\): payload\.list\[1\]\["odd key"\]\[1\] contains a NUL/,
    ],
    [{ payload: { 'k\u0000': 1 } }, /^task #1 \(t\): key "k\\u0000" in payload contains a NUL/],
    [{ payload: 'lone \ud800 high' }, /^task #1 \(t\): payload contains a lone surrogate \(\\ud800\)/], // 22P02
    [
      { payload: { nested: { '\udc00': true } } },
      /^task #1 \(t\): key "\\udc00" in payload\.nested contains a lone surrogate/,
    ],
    [{ queue: 'q\u0000' }, /^task #1: queue contains a NUL character/], // 22021
    [{ type: 'ty\u0000pe' }, /^task #1: type contains a NUL character/], // 22021
    [{ dedupeKey: 'k\u0000' }, /^task #1: dedupeKey contains a NUL character/], // 22021
    [{ dedupeKey: 'k\ud83d' }, /^task #1: dedupeKey contains a lone surrogate/], // stored as U+FFFD: keys would collide
    [{ queue: 'q'.repeat(2700) }, /^task #1: queue must be a string of at most 255 UTF-8 bytes \(got 2700 bytes\)$/], // 54000
    [{ queue: 'é'.repeat(128) }, /^task #1: queue must be a string of at most 255 UTF-8 bytes \(got 256 bytes\)$/],
    [
      { dedupeKey: 'k'.repeat(2700) },
      /^task #1: dedupeKey must be a non-empty string of at most 1024 UTF-8 bytes \(got 2700 bytes\)$/,
    ], // 54000
    [{ dealy: 5 } as never, /^task #1: unknown option "dealy"/],
  ];
  for (const [spec, message] of bad) {
    const batch = [
      { type: 't', payload: { fine: true } },
      { type: 't', payload: { fine: true }, ...spec } as TaskSpec,
      { type: 't', payload: 1 },
    ];
    await assert.rejects(enqueueMany(pool, batch, { schema }), (err: Error) => {
      assert.ok(err instanceof BerthInputError, `${err.name}: ${err.message}`);
      assert.match(err.message, message);
      return true;
    });
  }
  // One task alone is "task"; options of enqueue() are checked too.
  await assert.rejects(
    enqueue(pool, 't', {}, { schema, maxAttempts: 2 ** 31 }),
    /^BerthInputError: task: maxAttempts must be an integer from 1 to 1000000/,
  );
  await assert.rejects(enqueue(pool, 't', {}, { schema, runAt: 5 as never }), /task: runAt must be a valid Date/);
  await assert.rejects(
    enqueue(pool, 't', {}, { schema, payload: 1 } as never),
    /enqueue options: unknown option "payload"/,
  );
  await assert.rejects(
    enqueueMany(pool, [], { schema, queue: 'q' } as never),
    /enqueueMany options: unknown option "queue"/,
  );
  assert.equal(await taskCount(), before);

  // What is allowed right up to the limits is stored, byte for byte.
  const edge = await enqueueMany(
    pool,
    [
      {
        type: 'e',
        payload: { text: 'pair \ud83d\ude00, escaped \\u0000 and \\\\\\u0000 are text', '\ud83d\ude00': ['\u0001'] },
        queue: `${'é'.repeat(127)}x`,
      },
      { type: 'e', payload: null, dedupeKey: 'k'.repeat(1024), maxAttempts: 1_000_000 },
      { type: 'e', payload: {}, runAt: new Date('9999-12-31T23:59:59.999Z') },
      { type: 'e', payload: {}, runAt: new Date('0001-01-01T00:00:00.000Z') },
    ],
    { schema },
  );
  assert.deepEqual(
    edge.map((r) => r.state),
    ['ready', 'ready', 'scheduled', 'ready'],
  );
  const stored = await getTask(pool, schema, edge[0]!.id!);
  assert.deepEqual(stored?.payload, {
    text: 'pair \ud83d\ude00, escaped \\u0000 and \\\\\\u0000 are text',
    '\ud83d\ude00': ['\u0001'],
  });
  assert.equal(stored?.queue, `${'é'.repeat(127)}x`);
});

test('defineTask refuses what a worker could not run or store, naming the field', () => {
  const handler = async () => {};
  assert.throws(
    () => defineTask({ type: 'd', ceilingMs: 1000, handler, maxAttempts: 3e9 }),
    /^BerthInputError: task "d": maxAttempts must be an integer from 1 to 1000000 \(got 3000000000\)$/,
  );
  assert.throws(
    () => defineTask({ type: 'd', ceilingMs: 1e300, handler }),
    /task "d": ceilingMs must be a number of milliseconds from 1 to 2147483647/,
  );
  assert.throws(
    () => defineTask({ type: 'd', ceilingMs: 1000, handler, backoff: { maxMs: Infinity } }),
    /task "d": backoff\.maxMs must be a number of milliseconds/,
  );
  assert.throws(
    () => defineTask({ type: 'd', ceilingMs: 1000, handler, backoff: { baseMs: 10, maxMs: 5 } }),
    /backoff\.maxMs .* \(at least baseMs\)/,
  );
  assert.throws(
    () => defineTask({ type: 'd', ceilingMs: 1000, handler, backoff: { base: 5 } as never }),
    /task "d": backoff: unknown option "base"/,
  );
  assert.throws(
    () => defineTask({ type: 'd', ceilingMs: 1000, handler, retries: 3 } as never),
    /task "d": unknown option "retries"/,
  );
  assert.throws(() => defineTask({ type: 'd\u0000', ceilingMs: 1000, handler }), /task type contains a NUL character/);
  assert.throws(
    () => defineTask({ type: 'x'.repeat(201), ceilingMs: 1000, handler }),
    /task type must be a non-empty string of at most 200 characters/,
  );
  assert.equal(
    defineTask({ type: 'd', ceilingMs: 2_147_483_647, handler, maxAttempts: 1_000_000 }).maxAttempts,
    1_000_000,
  );
});

test('moving a task or pausing a queue checks the queue name the way enqueue does', async () => {
  const r = await enqueue(pool, 'm', {}, { schema });
  await assert.rejects(moveTask(pool, schema, r.id!, { queue: 'x\u0000' }), /queue contains a NUL character/);
  await assert.rejects(
    moveTask(pool, schema, r.id!, { queue: 'x'.repeat(300) }),
    /queue must be a string of at most 255 UTF-8 bytes/,
  );
  await assert.rejects(pauseQueue(pool, schema, 'x\u0000', 'test'), /queue contains a NUL character/);
  assert.equal((await getTask(pool, schema, r.id!))?.queue, 'default');
});
