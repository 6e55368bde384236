/**
 * enqueue_one() (migration 33), the client's single plain enqueue, against enqueue() (the array
 * form it is the fast path of), in the same schema: every direct call with one or two things
 * wrong answers with the same error or writes the same row; the lane lock, the ring segment and
 * the wake hold as enqueue()'s; the client sends it; the roles that may enqueue may call it.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/enqueue-one.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { assertMigrated, enqueue, grantRuntimeRole, SchemaNotMigratedError } from '../src/index.js';
import { quoteIdent } from '../src/sql.js';
import { DATABASE_URL, freshSchema, urlAs } from './helpers.js';
import {
  assertLaneLockOrder,
  LANE_ARGUMENT_MUTATIONS,
  mutationSets,
  newLaneRace,
  wakesOf,
  withRotatingInserts,
} from './support/lane-append.js';
import { schemaAtVersion } from './support/legacy-schema.js';

const { schema, pool } = await freshSchema('enqone');
const S = quoteIdent(schema);

// An existing lane, a paused queue, a limited queue: what a call may meet.
await pool.query(`SELECT ${S}.provision_lane('q', 0::smallint, 0::smallint)`);
await pool.query(`INSERT INTO ${S}.queue_pauses (queue, paused_by) VALUES ('pausedq', 'test')`);
await pool.query(`SELECT ${S}.provision_lane('limitedq', 0::smallint, 0::smallint)`);
await pool.query(`SELECT ${S}.set_queue_limit('limitedq', 1, NULL, NULL, 'test', false, false)`);

type Args = {
  queue: string;
  priority: string;
  shard: string;
  shards: string;
  type: string;
  payload: string;
  trace: string;
};

const BASE: Args = {
  queue: `'q'`,
  priority: '0::smallint',
  shard: 'NULL::smallint',
  shards: 'NULL::smallint',
  type: `'t'`,
  payload: `'{"a":1}'::jsonb`,
  trace: 'NULL::text',
};

/** The same task through enqueue_one() and through enqueue(), as its answer's id (text) and state. */
function callOne(a: Args): string {
  return `SELECT x::text AS id, 'ready' AS state FROM ${S}.enqueue_one(${a.queue}, ${a.priority}, ${a.shard},
            ${a.shards}, ${a.type}, ${a.payload}, ${a.trace}) AS x`;
}
function callArray(a: Args): string {
  return `SELECT id::text, state FROM ${S}.enqueue(${a.queue}, ${a.priority}, ${a.shard}, ${a.shards},
            ARRAY[${a.type}]::text[], ARRAY[${a.payload}]::jsonb[], NULL, NULL, NULL, ${a.trace})`;
}

const MUTATIONS: (readonly [keyof Args, string])[] = [
  ...LANE_ARGUMENT_MUTATIONS,
  ['type', 'NULL'],
  ['type', `''`],
  ['type', `repeat('t', 201)`],
  ['type', `repeat('t', 200)`],
  ['type', `repeat('é', 200)`],
  ['payload', 'NULL'],
  ['payload', `'null'::jsonb`],
  ['payload', `'[]'::jsonb`],
  ['payload', `'"\\u0000 as text"'::jsonb`],
];

/** What one call did, rolled back: its error, or its answer and the row it wrote (lane, position and segment checked). */
async function outcome(c: pg.ClientBase, sql: string, a: Args): Promise<unknown> {
  await c.query('BEGIN');
  try {
    let rows: { id: string; state: string }[];
    try {
      rows = (await c.query(sql)).rows;
    } catch (err) {
      const e = err as { code?: string; message: string; hint?: string; detail?: string };
      return { error: e.code, message: e.message, hint: e.hint, detail: e.detail };
    }
    const written = await c.query(
      `SELECT r.type, r.payload, r.queue, r.priority, r.attempts, r.max_attempts, r.dedupe_key, r.last_error,
              r.created_at = now() AS created_now, r.run_at = now() AS run_now, r.trace_context, r.has_dependents,
              r.shard = coalesce(${a.shard}, (txid_current() % greatest(coalesce(${a.shards}, 1), 1))::smallint) AS shard_ok,
              r.lane_seq = (SELECT s.last_value FROM pg_sequences s
                             WHERE s.schemaname = $2 AND s.sequencename = 'lane_seq_' || r.lane_id) AS seq_last,
              r.slot = (SELECT (e.last_value % rs.slot_count)::smallint FROM ${S}.ring_epoch e, ${S}.ring_state rs) AS slot_now,
              l.queue = r.queue AND l.priority = r.priority AND l.shard = r.shard AS lane_matches, l.paused, l.limited,
              EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.pid = pg_backend_pid()
                         AND k.objid = r.lane_id::oid AND k.objsubid = 2 AND k.mode = 'ExclusiveLock') AS held
         FROM ${S}.ready r JOIN ${S}.lanes l ON l.lane_id = r.lane_id
        WHERE r.id::text = ANY ($1)`,
      [rows.map((r) => r.id), schema],
    );
    const tasks = await c.query(`SELECT count(*)::int AS n FROM ${S}.ready WHERE created_at = now()`);
    return {
      answers: rows.map((r) => ({ id: typeof r.id === 'string' && /^\d+$/.test(r.id), state: r.state })),
      rows: written.rows,
      tasks: tasks.rows[0]!.n,
    };
  } finally {
    await c.query('ROLLBACK');
  }
}

test('every direct call, one or two things wrong at once: the same error (SQLSTATE, message) or the same answer and row as enqueue()', async () => {
  const c = await pool.connect();
  let errors = 0;
  let successes = 0;
  const diffs: string[] = [];
  try {
    for (const set of mutationSets(MUTATIONS)) {
      const a = { ...BASE };
      for (const [f, e] of set) a[f] = e;
      const got = await outcome(c, callOne(a), a);
      const want = await outcome(c, callArray(a), a);
      if ((got as { error?: string }).error) errors++;
      else successes++;
      try {
        assert.deepEqual(got, want);
      } catch {
        diffs.push(`${JSON.stringify(set)}:\n  one   ${JSON.stringify(got)}\n  array ${JSON.stringify(want)}`);
      }
    }
  } finally {
    c.release();
  }
  assert.ok(errors > 150 && successes > 50, `${errors} refused, ${successes} accepted`);
  assert.deepEqual(diffs.slice(0, 10), [], `${diffs.length} calls differ`);
});

test('a successful call writes one ready row in the current segment at the lane sequence’s next position, and holds the lane lock', async () => {
  const c = await pool.connect();
  try {
    const r = (await outcome(c, callOne(BASE), BASE)) as { rows: Record<string, unknown>[]; tasks: number };
    assert.equal(r.tasks, 1);
    assert.equal(r.rows.length, 1);
    const row = r.rows[0]!;
    assert.equal(row.seq_last, true);
    assert.equal(row.slot_now, true);
    assert.equal(row.lane_matches, true);
    assert.equal(row.shard_ok, true);
    assert.equal(row.held, true);
    assert.equal(row.run_now, true);
  } finally {
    c.release();
  }
});

const oneOn = (queue: string, shard = 0) =>
  `SELECT ${S}.enqueue_one('${queue}', 0::smallint, ${shard}::smallint, NULL, 't', '{}'::jsonb, NULL)::text AS id`;
const arrayOn = (queue: string, shard = 0) =>
  `SELECT id::text FROM ${S}.enqueue('${queue}', 0::smallint, ${shard}::smallint, NULL, ARRAY['t'], ARRAY['{}'::jsonb],
     NULL, NULL, NULL, NULL)`;
const CALLS = { one: oneOn, array: arrayOn };

for (const level of ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']) {
  for (const [first, second] of [
    ['one', 'one'],
    ['one', 'array'],
    ['array', 'one'],
  ] as const) {
    test(`invariant 1 at ${level}: ${first} holds the lane lock to commit; ${second} on the same lane waits and lands behind it`, async () => {
      const lane = `lock_${level.replace(' ', '_')}_${first}_${second}`.toLowerCase();
      await pool.query(`SELECT ${S}.provision_lane($1, 0::smallint, 0::smallint)`, [lane]);
      await assertLaneLockOrder(pool, schema, level, CALLS[first](lane), CALLS[second](lane));
    });
  }
}

for (const level of ['READ COMMITTED', 'REPEATABLE READ']) {
  test(`a new lane opened by two producers at once (${level}): enqueue_one answers as enqueue does`, async () => {
    const results: Record<string, unknown> = {};
    for (const fn of ['one', 'array'] as const) {
      const lane = `race_${fn}_${level.replace(' ', '_')}`.toLowerCase();
      results[fn] = await newLaneRace(pool, schema, level, lane, CALLS[fn](lane, 5));
    }
    assert.deepEqual(results.one, results.array);
    // Read committed: the second waits for the first's lane and lands behind it.
    if (level === 'READ COMMITTED') assert.deepEqual(results.one, { b: 'ok', lanes: 1, order: ['a', 'b'] });
  });
}

test('invariant 2: the ring rotates between the INSERT and the second read (once, then twice): the row ends in the current segment', async () => {
  const slotNow = `SELECT (e.last_value % rs.slot_count)::int AS s FROM ${S}.ring_epoch e, ${S}.ring_state rs`;
  await withRotatingInserts(pool, schema, async () => {
    for (const rotations of [1, 2]) {
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await c.query(`SELECT set_config('berth_test.rotations', $1, true)`, [String(rotations)]);
        const before = (await c.query(slotNow)).rows[0]!.s as number;
        const id = (
          await c.query(
            `SELECT ${S}.enqueue_one('rot', 0::smallint, 0::smallint, NULL, 't', '{}'::jsonb, 'tc')::text AS id`,
          )
        ).rows[0]!.id as string;
        const rows = (
          await c.query(`SELECT slot::int, lane_seq::text, trace_context FROM ${S}.ready WHERE id = $1`, [id])
        ).rows;
        const now = (await c.query(slotNow)).rows[0]!.s as number;
        await c.query('COMMIT');
        assert.notEqual(now, before, 'the trigger advanced the epoch');
        assert.deepEqual(
          rows.map((r) => [r.slot, r.trace_context]),
          [[now, 'tc']],
          `${rotations} rotation(s): one row, in the segment current at the end`,
        );
      } finally {
        await c.query('ROLLBACK').catch(() => undefined);
        c.release();
      }
    }
  });
});

test('one wake per lane per transaction: enqueue_one and enqueue on one lane, enqueue_one on another', async () => {
  const lanes = (
    await pool.query(
      `SELECT ${S}.provision_lane('wake1', 0::smallint, 0::smallint)::text AS a,
              ${S}.provision_lane('wake2', 0::smallint, 0::smallint)::text AS b`,
    )
  ).rows[0] as { a: string; b: string };
  const got = await wakesOf(pool, schema, async (c) => {
    await c.query('BEGIN');
    for (let i = 0; i < 3; i++) await c.query(oneOn('wake1'));
    await c.query(arrayOn('wake1'));
    await c.query(oneOn('wake2'));
    await c.query('COMMIT');
  });
  assert.deepEqual(got.sort(), [lanes.a, lanes.b].sort());
});

test('the client sends one plain task through enqueue_one, with its id as text whatever the pool parses bigint as', async () => {
  // A pool whose sessions parse bigint as a number: the id still comes back as the decimal text.
  const numeric = new pg.Pool({
    connectionString: DATABASE_URL,
    max: 1,
    types: {
      getTypeParser: ((oid: number, format?: 'text') =>
        oid === 20 ? Number : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
    },
  });
  const c = await numeric.connect();
  try {
    await c.query('BEGIN');
    await c.query(`SET LOCAL track_functions = 'pl'`);
    const r = await enqueue(c, 'viaone', { k: 1 }, { schema, queue: 'client' });
    assert.equal(r.state, 'ready');
    assert.equal(typeof r.id, 'string');
    assert.match(r.id!, /^\d+$/);
    const calls = await c.query(
      `SELECT funcname, calls::int FROM pg_stat_xact_user_functions
        WHERE schemaname = $1 AND funcname LIKE 'enqueue%' ORDER BY funcname`,
      [schema],
    );
    assert.deepEqual(calls.rows, [{ funcname: 'enqueue_one', calls: 1 }]);
    const row = await c.query(`SELECT type, payload, queue FROM ${S}.ready WHERE id = $1::bigint`, [r.id]);
    assert.deepEqual(row.rows, [{ type: 'viaone', payload: { k: 1 }, queue: 'client' }]);
    await c.query('COMMIT');
  } finally {
    await c.query('ROLLBACK').catch(() => undefined);
    c.release();
    await numeric.end();
  }
});

test("a schema at migration 32: refused at start and by the producer, naming the fix; the previous version's statement still runs on 33", async () => {
  const old = `${schema}_m32`;
  const c = await pool.connect();
  try {
    await schemaAtVersion(c, old, 32);
  } finally {
    c.release();
  }
  try {
    // What a Worker, the CLI and the dashboard check at start: refused, with the fix.
    await assert.rejects(
      assertMigrated(pool, old),
      (err: Error) =>
        err instanceof SchemaNotMigratedError && /older than this code .*berth migrate --schema/.test(err.message),
    );
    // A producer does not check first: its call names the fix.
    await assert.rejects(
      enqueue(pool, 'old', {}, { schema: old }),
      (err: Error) =>
        err instanceof SchemaNotMigratedError &&
        /not migrated, or older than this code \(.*enqueue_one.*\): run `berth migrate --schema/.test(err.message),
    );
    // The statement the previous version's client sends for one plain task, against this schema.
    const previous = await pool.query(
      `SELECT ARRAY[e.id::text] AS ids, left(e.state, 1) AS states
         FROM ${S}.enqueue($1, $2::smallint, $3::smallint, $4::smallint, ARRAY[$5::text], ARRAY[$6::jsonb],
           NULL, NULL, NULL, $7::text) AS e`,
      ['q', 0, null, 16, 'prev', '{"p":1}', null],
    );
    assert.equal(previous.rows[0].states, 'r');
    const row = await pool.query(`SELECT type, payload FROM ${S}.ready WHERE id = $1::bigint`, [
      previous.rows[0].ids[0],
    ]);
    assert.deepEqual(row.rows, [{ type: 'prev', payload: { p: 1 } }]);
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS ${quoteIdent(old)} CASCADE`).catch(() => undefined);
  }
});

test('the roles: producers and workers may call enqueue_one and PUBLIC may not; a producer enqueues through it on a new and an existing lane', async () => {
  const producer = `berth_enqone_p_${process.pid}`;
  const worker = `berth_enqone_w_${process.pid}`;
  const stranger = `berth_enqone_x_${process.pid}`;
  for (const role of [producer, worker, stranger]) {
    await pool.query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`);
    await pool.query(`CREATE ROLE ${quoteIdent(role)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  }
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: producer, kind: 'producer' });
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: worker, kind: 'worker' });
  await pool.query(`GRANT USAGE ON SCHEMA ${S} TO ${quoteIdent(stranger)}`);
  const asProducer = new pg.Pool({ connectionString: urlAs(producer), max: 1 });
  const asStranger = new pg.Pool({ connectionString: urlAs(stranger), max: 1 });
  try {
    const fn = `${schema}.enqueue_one(text, smallint, smallint, smallint, text, jsonb, text)`;
    const rights = await pool.query(
      `SELECT has_function_privilege($1, $4::regprocedure, 'EXECUTE') AS p,
              has_function_privilege($2, $4::regprocedure, 'EXECUTE') AS w,
              has_function_privilege($3, $4::regprocedure, 'EXECUTE') AS x`,
      [producer, worker, stranger, fn],
    );
    assert.deepEqual(rights.rows[0], { p: true, w: true, x: false });
    for (const queue of ['role_new', 'role_new', 'q']) {
      const r = await enqueue(asProducer, 'byrole', { queue }, { schema, queue });
      assert.equal(r.state, 'ready');
    }
    const refused = await enqueue(asStranger, 'nope', {}, { schema }).then(
      () => 'ok',
      (e: { code?: string; cause?: { code?: string } }) => e.code ?? e.cause?.code,
    );
    assert.equal(refused, '42501');
  } finally {
    await asProducer.end();
    await asStranger.end();
    for (const role of [producer, worker, stranger]) {
      await pool.query(`DROP OWNED BY ${quoteIdent(role)}`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`).catch(() => undefined);
    }
  }
});
