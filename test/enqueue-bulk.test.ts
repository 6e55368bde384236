/**
 * Bulk enqueue (issue 11): the batch shapes `enqueueMany` sends as JSON arrays and NULL columns,
 * checked row by row in storage, through both paths of `enqueue()` (migration 9: the fast path
 * for batches with no dedupe key and nothing scheduled, the general path otherwise), so both
 * are held to the same rows, lanes, lane order, dedupe and notifications.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { z } from 'zod';
import { BerthInputError, defineTask, enqueue, enqueueMany, getTask, type TaskSpec } from '../src/index.js';
import { CHUNK_JSON_CHARS } from '../src/producer/enqueue.js';
import { wakeChannel } from '../src/sql.js';
import { DATABASE_URL, freshSchema, waitFor } from './helpers.js';

const migrated = await freshSchema('bulk');
const { pool } = migrated;
const installs = [{ label: 'as migrated', schema: migrated.schema }];

interface ReadyRow {
  id: string;
  lane_id: number;
  lane_seq: string;
  type: string;
  payload: unknown;
  queue: string;
  priority: number;
  shard: number;
  attempts: number;
  max_attempts: number | null;
  dedupe_key: string | null;
  run_at: Date;
}

async function readyRows(schema: string, ids: (string | null)[]): Promise<ReadyRow[]> {
  const r = await pool.query<ReadyRow>(
    `SELECT id::text, lane_id, lane_seq::text, type, payload, queue, priority, shard, attempts, max_attempts,
            dedupe_key, run_at
       FROM "${schema}".ready r WHERE r.id = ANY($1::bigint[]) ORDER BY r.lane_id, r.lane_seq`,
    [ids.filter((x) => x !== null)],
  );
  return r.rows;
}

/** Run `body` with a listener on the schema's wake channel; `lanes()` is every payload so far. */
async function listening(schema: string, body: (lanes: () => string[]) => Promise<void>): Promise<void> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  try {
    const lanes: string[] = [];
    c.on('notification', (n) => lanes.push(n.payload ?? ''));
    await c.query(`LISTEN "${wakeChannel(schema)}"`);
    await body(() => lanes);
  } finally {
    await c.end();
  }
}

for (const { label, schema } of installs) {
  test(`${label}: 12,001 tasks in one transaction: one lane, contiguous lane numbers in input order, one wake`, async () => {
    await listening(schema, async (lanes) => {
      const c = await pool.connect();
      const n = 12_001; // three statements: 5,000 + 5,000 + 2,001
      let results: Awaited<ReturnType<typeof enqueueMany>>;
      try {
        await c.query('BEGIN');
        results = await enqueueMany(
          c,
          Array.from({ length: n }, (_, i) => ({ type: 'bulk', payload: { i } })),
          { schema },
        );
        assert.equal(lanes().length, 0, 'no wake before commit');
        await c.query('COMMIT');
      } finally {
        c.release();
      }
      assert.equal(results.length, n);
      assert.ok(results.every((r) => r.state === 'ready' && r.id !== null && r.duplicateOf === undefined));
      assert.equal(new Set(results.map((r) => r.id)).size, n);
      const rows = await readyRows(
        schema,
        results.map((r) => r.id),
      );
      assert.equal(rows.length, n);
      assert.equal(new Set(rows.map((r) => r.lane_id)).size, 1);
      const first = BigInt(rows[0]!.lane_seq);
      rows.forEach((r, k) => {
        assert.equal(BigInt(r.lane_seq), first + BigInt(k), 'contiguous lane numbers');
        assert.deepEqual(r.payload, { i: k }, 'lane order is input order');
        assert.equal(r.id, results[k]!.id, 'results in input order');
        assert.equal(r.attempts, 0);
        assert.equal(r.max_attempts, null);
      });
      // The next append to the lane continues after the batch (the block was reserved, not skipped).
      const next = await enqueueMany(pool, [{ type: 'bulk', payload: { i: n }, shard: rows[0]!.shard }], { schema });
      const [after] = await readyRows(schema, [next[0]!.id]);
      assert.equal(BigInt(after!.lane_seq), first + BigInt(n));
      await waitFor(() => lanes().length >= 2, 5000, 'the two wakes');
      assert.deepEqual(lanes(), [String(rows[0]!.lane_id), String(rows[0]!.lane_id)]);
    });
  });

  test(`${label}: a rolled-back bulk batch leaves no row, no dedupe key and no wake`, async () => {
    await listening(schema, async (lanes) => {
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await enqueueMany(
          c,
          Array.from({ length: 2000 }, (_, i) => ({
            type: 'gone',
            payload: { i },
            dedupeKey: i % 2 ? `gone:${i}` : undefined,
          })),
          { schema },
        );
        await c.query('ROLLBACK');
      } finally {
        c.release();
      }
      const r = await pool.query(
        `SELECT (SELECT count(*) FROM "${schema}".ready WHERE type = 'gone')::int AS ready,
              (SELECT count(*) FROM "${schema}".dedupe WHERE dedupe_key LIKE 'gone:%')::int AS keys`,
      );
      assert.deepEqual(r.rows[0], { ready: 0, keys: 0 });
      await enqueue(pool, 'marker', {}, { schema });
      await waitFor(() => lanes().length >= 1, 5000, 'marker wake');
      assert.equal(lanes().length, 1);
    });
  });

  test(`${label}: a mixed batch: immediate, scheduled, past runAt, dedupe in and out of the batch, maxAttempts`, async () => {
    const held = await enqueue(pool, 'mixed', { held: true }, { schema, dedupeKey: `held:${schema}` });
    const past = new Date(Date.now() - 3_600_000);
    const future = new Date(Date.now() + 3_600_000);
    const batch: TaskSpec[] = [
      { type: 'mixed', payload: 0 },
      { type: 'mixed', payload: 1, runAt: future },
      { type: 'mixed', payload: 2, dedupeKey: `k1:${schema}`, maxAttempts: 3 },
      { type: 'mixed', payload: 3, dedupeKey: `k1:${schema}` },
      { type: 'mixed', payload: 4, delay: 60_000, dedupeKey: `k2:${schema}` },
      { type: 'mixed', payload: 5, runAt: past },
      { type: 'mixed', payload: 6, dedupeKey: `held:${schema}` },
      { type: 'mixed', payload: 7, maxAttempts: 7 },
      { type: 'mixed', payload: 8, delay: 0 },
    ];
    const rs = await enqueueMany(pool, batch, { schema });
    assert.deepEqual(
      rs.map((r) => r.state),
      ['ready', 'scheduled', 'ready', 'duplicate', 'scheduled', 'ready', 'duplicate', 'ready', 'ready'],
    );
    assert.deepEqual(rs[3], { id: null, state: 'duplicate', duplicateOf: rs[2]!.id });
    assert.deepEqual(rs[6], { id: null, state: 'duplicate', duplicateOf: held.id });
    const ready = await readyRows(
      schema,
      rs.map((r) => r.id),
    );
    // The ready ones share one lane, numbered in input order.
    assert.deepEqual(
      ready.map((r) => r.payload),
      [0, 2, 5, 7, 8],
    );
    assert.equal(new Set(ready.map((r) => r.lane_id)).size, 1);
    assert.deepEqual(
      ready.map((r) => r.max_attempts),
      [null, 3, null, 7, null],
    );
    assert.deepEqual(
      ready.map((r) => r.dedupe_key),
      [null, `k1:${schema}`, null, null, null],
    );
    assert.equal(ready[2]!.run_at.getTime(), past.getTime(), 'a past runAt is kept as given');
    const deferred = await pool.query(
      `SELECT id::text, payload, state, run_at, dedupe_key FROM "${schema}".deferred WHERE id = ANY($1::bigint[]) ORDER BY id`,
      [[rs[1]!.id, rs[4]!.id]],
    );
    assert.deepEqual(
      deferred.rows.map((r) => [r.payload, r.state, r.dedupe_key]),
      [
        [1, 'scheduled', null],
        [4, 'scheduled', `k2:${schema}`],
      ],
    );
    assert.equal(deferred.rows[0].run_at.getTime(), future.getTime());
    assert.ok(deferred.rows[1].run_at.getTime() > Date.now() + 30_000, 'delay is measured on the database clock');
    const keys = await pool.query(
      `SELECT dedupe_key, id::text FROM "${schema}".dedupe WHERE dedupe_key = ANY($1) ORDER BY dedupe_key`,
      [[`k1:${schema}`, `k2:${schema}`]],
    );
    assert.deepEqual(
      keys.rows.map((r) => r.id),
      [rs[2]!.id, rs[4]!.id],
    );
  });

  test(`${label}: without dedupe keys: past runAt, delay 0 and maxAttempts ready in order, one future task scheduled`, async () => {
    const past = new Date(Date.now() - 60_000);
    const now: TaskSpec[] = [
      { type: 'nodedupe', payload: 0, shard: 9 },
      { type: 'nodedupe', payload: 1, shard: 9, runAt: past, maxAttempts: 2 },
      { type: 'nodedupe', payload: 2, shard: 9, delay: 0 },
      { type: 'nodedupe', payload: 3, shard: 9 },
    ];
    const rs = await enqueueMany(pool, now, { schema });
    assert.ok(rs.every((r) => r.state === 'ready'));
    const rows = await readyRows(
      schema,
      rs.map((r) => r.id),
    );
    assert.deepEqual(
      rows.map((r) => [r.id, r.payload, r.max_attempts, r.dedupe_key]),
      rs.map((r, i) => [r.id, i, i === 1 ? 2 : null, null]),
    );
    assert.equal(rows[1]!.run_at.getTime(), past.getTime());
    assert.ok(Math.abs(rows[0]!.run_at.getTime() - rows[2]!.run_at.getTime()) < 60_000, 'unset and delay 0: now()');
    const later = await enqueueMany(
      pool,
      [
        ...now,
        { type: 'nodedupe', payload: 4, shard: 9, delay: 3_600_000 },
        { type: 'nodedupe', payload: 5, shard: 9 },
      ],
      { schema },
    );
    assert.deepEqual(
      later.map((r) => r.state),
      ['ready', 'ready', 'ready', 'ready', 'scheduled', 'ready'],
    );
    const again = await readyRows(
      schema,
      later.map((r) => r.id),
    );
    assert.deepEqual(
      again.map((r) => r.payload),
      [0, 1, 2, 3, 5],
    );
    assert.equal(BigInt(again[0]!.lane_seq), BigInt(rows[3]!.lane_seq) + 1n, 'the lane continues');
  });

  test(`${label}: plain tasks (append_ready's three-array insert) and tasks with maxAttempts get attempts 0 and the enqueue's time`, async () => {
    // Migration 17: enqueue()'s fast path passes NULL attempts, created_at and run_at arrays;
    // with nothing else set append_ready inserts from three arrays, otherwise it reads those
    // NULLs as 0, now() and now(). Both, in one transaction (one now()).
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      const txNow = (await c.query<{ t: Date }>('SELECT now() AS t')).rows[0]!.t.getTime();
      const plain = await enqueueMany(
        c,
        [0, 1, 2].map((i) => ({ type: 'three', payload: { i }, shard: 11 })),
        { schema },
      );
      const capped = await enqueueMany(
        c,
        [3, 4].map((i) => ({ type: 'three', payload: { i }, shard: 11, maxAttempts: 7 })),
        { schema },
      );
      const r = await c.query<{
        attempts: number;
        max_attempts: number | null;
        created_at: Date;
        run_at: Date;
        trace_context: string | null;
      }>(
        `SELECT attempts, max_attempts, created_at, run_at, trace_context FROM "${schema}".ready
          WHERE id = ANY($1::bigint[]) ORDER BY lane_seq`,
        [[...plain, ...capped].map((x) => x.id)],
      );
      await c.query('COMMIT');
      assert.deepEqual(
        r.rows.map((x) => [x.attempts, x.max_attempts, x.created_at.getTime(), x.run_at.getTime(), x.trace_context]),
        Array.from({ length: 5 }, (_, i) => [0, i < 3 ? null : 7, txNow, txNow, null]),
      );
    } catch (err) {
      await c.query('ROLLBACK').catch(() => undefined);
      throw err;
    } finally {
      c.release();
    }
    // A caller's own arrays still go through the general insert unchanged (as promotion's do).
    const lane = (
      await pool.query<{ l: number }>(`SELECT "${schema}".provision_lane('default', 0::smallint, 12::smallint) AS l`)
    ).rows[0]!.l;
    const ids = (
      await pool.query<{ ids: string[] }>(
        `SELECT ARRAY(SELECT nextval('"${schema}".task_id_seq')::text FROM generate_series(1, 2)) AS ids`,
      )
    ).rows[0]!.ids;
    const at = new Date('2026-01-02T03:04:05Z');
    await pool.query(
      `SELECT "${schema}".append_ready($1, $2::bigint[], ARRAY['own','own'], ARRAY['1','2']::jsonb[], ARRAY[2, NULL]::integer[],
              NULL, NULL, NULL, ARRAY[$3::timestamptz, $3::timestamptz], ARRAY[$3::timestamptz, NULL], ARRAY['tc', NULL])`,
      [lane, ids, at],
    );
    const own = await pool.query<{ attempts: number; created_at: Date; run_at: Date; trace_context: string | null }>(
      `SELECT attempts, created_at, run_at, trace_context FROM "${schema}".ready WHERE id = ANY($1::bigint[]) ORDER BY lane_seq`,
      [ids],
    );
    assert.deepEqual(own.rows[0], { attempts: 2, created_at: at, run_at: at, trace_context: 'tc' });
    assert.equal(own.rows[1]!.attempts, 0, 'a NULL element: 0');
    assert.ok(own.rows[1]!.run_at.getTime() > at.getTime(), 'a NULL run_at element: now()');
  });

  test(`${label}: promotion appends after the lane's entries, in due order, and an empty promotion takes no number`, async () => {
    const lane = { queue: 'promo', shard: 2 };
    const [head] = await enqueueMany(pool, [{ type: 'promo', payload: 'head', ...lane }], { schema });
    const later = await enqueueMany(
      pool,
      [3, 1, 2].map((k) => ({ type: 'promo', payload: k, delay: 3_600_000 + k * 1000, ...lane })),
      { schema },
    );
    assert.ok(later.every((r) => r.state === 'scheduled'));
    const promote = async () =>
      (await pool.query(`SELECT "${schema}".promote_lane('promo', 0::smallint, 2::smallint, 100) AS n`)).rows[0].n;
    assert.equal(await promote(), 0, 'nothing due yet');
    await pool.query(
      `UPDATE "${schema}".deferred SET run_at = run_at - interval '2 hours' WHERE id = ANY($1::bigint[])`,
      [later.map((r) => r.id)],
    );
    assert.equal(await promote(), 3);
    const [tail] = await enqueueMany(pool, [{ type: 'promo', payload: 'tail', ...lane }], { schema });
    const rows = await readyRows(schema, [head!.id, ...later.map((r) => r.id), tail!.id]);
    assert.deepEqual(
      rows.map((r) => r.payload),
      ['head', 1, 2, 3, 'tail'],
    );
    const seqs = rows.map((r) => BigInt(r.lane_seq));
    assert.deepEqual(
      seqs,
      seqs.map((_, k) => seqs[0]! + BigInt(k)),
    );
  });

  test(`${label}: a batch over several lanes: results in input order, each lane in input order, one wake per lane`, async () => {
    await listening(schema, async (lanes) => {
      const targets = [
        { queue: 'a', priority: 0, shard: 1 },
        { queue: 'b', priority: -3, shard: 2 },
        { queue: 'a', priority: 5, shard: 1 },
      ];
      const specs: TaskSpec[] = Array.from({ length: 300 }, (_, i) => ({
        type: 'lanes',
        payload: { i },
        ...targets[i % 3]!,
      }));
      // Default shards in a multi-lane batch resolve to one shard per transaction.
      specs.push(
        { type: 'lanes', payload: { i: 300 }, queue: 'c' },
        { type: 'lanes', payload: { i: 301 }, queue: 'c' },
      );
      const rs = await enqueueMany(pool, specs, { schema });
      assert.ok(rs.every((r) => r.state === 'ready'));
      const rows = await readyRows(
        schema,
        rs.map((r) => r.id),
      );
      const byId = new Map(rows.map((r) => [r.id, r]));
      rs.forEach((r, i) => {
        assert.deepEqual(byId.get(r.id!)!.payload, { i }, `result ${i} is task ${i}`);
      });
      const perLane = new Map<number, number[]>();
      for (const r of rows) perLane.set(r.lane_id, [...(perLane.get(r.lane_id) ?? []), (r.payload as { i: number }).i]);
      assert.equal(perLane.size, 4);
      for (const is of perLane.values())
        assert.deepEqual(
          is,
          [...is].sort((a, b) => a - b),
        );
      const c = rows.filter((r) => r.queue === 'c');
      assert.equal(new Set(c.map((r) => r.shard)).size, 1);
      await waitFor(() => lanes().length >= 4, 5000, 'a wake per lane');
      assert.deepEqual(new Set(lanes()), new Set([...perLane.keys()].map(String)));
    });
  });

  test(`${label}: types and payloads survive the JSON arrays byte for byte`, async () => {
    const weird = [
      'quote " and backslash \\ and comma , braces {} and NULL',
      'unicode é 日本 \ud83d\ude00',
      'looks escaped: \\u0000 \\\\u0041',
      '',
      ' spaces ',
    ];
    const specs: TaskSpec[] = [
      ...weird.map((w, i) => ({
        type: w || 'x',
        payload: { w, i, nested: [w, { [w || 'k']: [null, true, 1.5e300] }] },
      })),
      { type: 'null', payload: null },
      { type: 'undefined', payload: undefined },
      { type: 'string', payload: '{"not":"an object"}' },
      { type: 'number', payload: -0.000123 },
      { type: 'array', payload: [[], {}, '', 0] },
    ];
    const rs = await enqueueMany(pool, specs, { schema });
    for (let i = 0; i < specs.length; i++) {
      const t = await getTask(pool, schema, rs[i]!.id!);
      assert.equal(t?.type, specs[i]!.type);
      assert.deepEqual(t?.payload, specs[i]!.payload === undefined ? null : specs[i]!.payload);
    }
  });

  test(`${label}: definitions with schemas and plain tasks in one batch`, async () => {
    const typed = defineTask({
      type: 'typed_bulk',
      ceilingMs: 1000,
      maxAttempts: 4,
      handler: async () => {},
      schema: z.object({ n: z.number(), tag: z.string().default('none') }),
    });
    const specs: TaskSpec[] = Array.from({ length: 200 }, (_, i) =>
      i % 2 ? { type: typed, payload: { n: i } } : { type: 'plain_bulk', payload: { n: i } },
    );
    const rs = await enqueueMany(pool, specs, { schema });
    const rows = await readyRows(
      schema,
      rs.map((r) => r.id),
    );
    assert.equal(rows.length, 200);
    rows.forEach((r, i) => {
      assert.equal(r.type, i % 2 ? 'typed_bulk' : 'plain_bulk');
      assert.deepEqual(r.payload, i % 2 ? { n: i, tag: 'none' } : { n: i }, 'the validated value is stored');
      assert.equal(r.max_attempts, i % 2 ? 4 : null);
    });
    // An invalid payload or a bad plain task anywhere refuses the whole batch, and a refusal
    // while validations are still running leaves none of them unheard.
    const before = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".ready`);
    await assert.rejects(
      enqueueMany(pool, [...specs, { type: typed, payload: { n: 'x' } as never }], { schema }),
      /task #200: payload for task type "typed_bulk" is invalid: n/,
    );
    await assert.rejects(
      enqueueMany(pool, [...specs, { type: 'plain_bulk', payload: {}, priority: 1e6 }], { schema }),
      (err: Error) => err instanceof BerthInputError && /task #200: priority/.test(err.message),
    );
    const afterCount = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".ready`);
    assert.equal(afterCount.rows[0].n, before.rows[0].n);
  });
}

test('payloads over the per-statement JSON budget are split into more statements, lane order kept', async () => {
  const { schema } = migrated;
  const big = 'x'.repeat(Math.floor(CHUNK_JSON_CHARS / 2.5)); // two fit in a statement, three do not
  const sizes = [5, big.length, 5, big.length, big.length];
  const specs: TaskSpec[] = sizes.map((n, i) => ({
    type: 'big',
    payload: { i, s: n === 5 ? 'small' : big },
    shard: 4,
  }));
  let statements = 0;
  const counting = {
    query: (...args: Parameters<typeof pool.query>) => {
      statements++;
      return pool.query(...args);
    },
  } as unknown as pg.Pool;
  const rs = await enqueueMany(counting, specs, { schema });
  assert.equal(statements, 2, 'two big ones and the small ones, then the third big one');
  const r = await pool.query(
    `SELECT (payload->>'i')::int AS i, length(payload->>'s') AS len, lane_seq FROM "${schema}".ready r
      WHERE r.id = ANY($1::bigint[]) ORDER BY r.lane_seq`,
    [rs.map((x) => x.id)],
  );
  assert.deepEqual(
    r.rows.map((x) => [x.i, x.len]),
    sizes.map((n, i) => [i, n]),
  );
  const seqs = r.rows.map((x) => BigInt(x.lane_seq));
  assert.deepEqual(
    seqs,
    seqs.map((_, k) => seqs[0]! + BigInt(k)),
  );
});
