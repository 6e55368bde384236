/**
 * Range leases and range settlements (migration 8, docs/design/range-leases.md): the fence is
 * the exclusion constraint, a claim leases one range per lane within one ring segment, each
 * entry keeps its own type's deadline and limit, and exactly one writer settles each entry when
 * the holder's completion races rescue.
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { enqueueMany } from '../src/index.js';
import { claimBatch, type ClaimedTask, type ClaimParams } from '../src/processor/claim.js';
import { migrate } from '../src/schema/migrate.js';
import { queryRingRead, quoteIdent } from '../src/sql.js';
import { completeLeases } from '../src/storage/complete.js';
import { entryKey, seqsToMultirange } from '../src/storage/attempt.js';
import { rescueLapsedLeases } from '../src/storage/rescue.js';
import { rotateRing } from '../src/maintenance/ring.js';
import { migrateSchemaTo, schemaAtVersion } from './support/legacy-schema.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, freshSchema, leaseLapsed } from './helpers.js';

const { schema, pool } = await freshSchema('ranges');
const S = quoteIdent(schema);

/** Every lane, as candidates: these tests claim whatever is there. */
async function allLanes(): Promise<number[]> {
  const r = await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes ORDER BY lane_id`);
  return r.rows.map((x) => x.lane_id);
}

/** The lane of the default queue and priority with this shard. */
async function laneOf(shard: number): Promise<number[]> {
  const r = await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE shard = $1`, [shard]);
  return r.rows.map((x) => x.lane_id);
}

/** This file's claims: type 't' for 60 s, as worker 'range-test'. */
const TERMS: Partial<ClaimParams> = { ceilings: new Map([['t', 60_000]]), workerId: 'range-test' };

/** Claim up to `limit` over every lane, again while a claim says it left entries (as the worker does). */
async function claimAll(
  limit: number,
  extra: Partial<ClaimParams> = {},
  { once = false } = {},
): Promise<ClaimedTask[]> {
  const laneIds = await allLanes();
  const got: ClaimedTask[] = [];
  for (;;) {
    const batch = await claimBatch(pool, claimParams(schema, laneIds, limit - got.length, { ...TERMS, ...extra }));
    got.push(...batch.tasks);
    if (once || !batch.more || got.length >= limit) return got;
  }
}

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
}

test('seqsToMultirange collapses runs of consecutive entries', () => {
  assert.equal(seqsToMultirange(['5', '3', '4', '9', '10', '7']), '{[3,6),[7,8),[9,11)}');
  assert.equal(seqsToMultirange(['12345678901234567']), '{[12345678901234567,12345678901234568)}');
  assert.equal(seqsToMultirange([]), '{}');
  // A run across the 15-digit line (Numbers below it, BigInts above).
  assert.equal(seqsToMultirange(['1000000000000000', '999999999999999']), '{[999999999999999,1000000000000001)}');
});

test('the fence: an overlapping settlement of a lane is refused whatever writes it; disjoint ones and other lanes are not', async () => {
  await reset();
  const ins = (lane: number, seqs: string, outcome = 'completed') =>
    pool.query(
      `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
       VALUES (0, $1, 1, $2::int8multirange, 1, $3) ON CONFLICT DO NOTHING`,
      [lane, seqs, outcome],
    );
  assert.equal((await ins(1, '{[1,5)}')).rowCount, 1);
  assert.equal((await ins(1, '{[4,6)}', 'rescued')).rowCount, 0, 'overlaps entry 4');
  assert.equal((await ins(1, '{[5,6),[9,10)}', 'failed')).rowCount, 1, 'disjoint');
  assert.equal((await ins(2, '{[1,5)}')).rowCount, 1, 'another lane');
  // Without ON CONFLICT it is an exclusion violation, so no writer can slip past it.
  await assert.rejects(
    pool.query(
      `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome) VALUES (0, 1, 1, '{[2,3)}', 1, 'x')`,
    ),
    (err: { code?: string }) => err.code === '23P01',
  );
  // An in-progress overlapping row blocks, then refuses once it commits (a unique index would too).
  const a = new pg.Client({ connectionString: DATABASE_URL, options: '-c jit=off' });
  await a.connect();
  try {
    await a.query('BEGIN');
    await a.query(
      `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome) VALUES (0, 3, 1, '{[1,3)}', 2, 'completed')`,
    );
    const b = ins(3, '{[2,4)}', 'rescued');
    await a.query('COMMIT');
    assert.equal((await b).rowCount, 0);
  } finally {
    await a.end();
  }
});

test('a claim leases one range per lane: one lease row, every entry returned with the range and its own attempt', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 10 }, (_, i) => ({ type: 't', payload: { i }, shard: 0 })),
    { schema },
  );
  const got = await claimAll(6, { laneIds: await laneOf(0) });
  assert.equal(got.length, 6);
  const rows = await pool.query(`SELECT from_seq::text, to_seq::text, n, token::text FROM ${S}.range_leases`);
  assert.equal(rows.rows.length, 1);
  const [lease] = rows.rows;
  assert.equal(lease.n, 6);
  assert.deepEqual(
    got.map((t) => t.laneSeq),
    got.map((_, i) => String(Number(lease.from_seq) + i)),
  );
  assert.ok(got.every((t) => t.token === lease.token && t.leaseFrom === lease.from_seq && t.attempt === 1));
  const next = await claimAll(10, { laneIds: await laneOf(0) });
  assert.equal(next.length, 4, 'the next claim starts past the first range');
  assert.equal(next[0]!.laneSeq, String(Number(lease.to_seq) + 1));
});

test('a range never spans two ring segments: the claim stops a lane at the segment of its first entry', async () => {
  await reset();
  await enqueueMany(
    pool,
    [1, 2, 3].map((i) => ({ type: 't', payload: { i }, shard: 5 })),
    { schema },
  );
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(
    pool,
    [4, 5].map((i) => ({ type: 't', payload: { i }, shard: 5 })),
    { schema },
  );
  const first = await claimAll(10, { laneIds: await laneOf(5) }, { once: true });
  assert.deepEqual(
    first.map((t) => (t.payload as { i: number }).i),
    [1, 2, 3],
  );
  const second = await claimAll(10, { laneIds: await laneOf(5) }, { once: true });
  assert.deepEqual(
    second.map((t) => (t.payload as { i: number }).i),
    [4, 5],
  );
  assert.notEqual(first[0]!.segment, second[0]!.segment);
  const leases = await pool.query(`SELECT slot, n FROM ${S}.range_leases ORDER BY from_seq`);
  assert.deepEqual(
    leases.rows.map((r) => r.n),
    [3, 2],
  );
});

test('per-type deadlines and limits in one range; rescue takes only the lapsed type and buries at the limit resolved at claim', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 6 }, (_, i) => ({ type: i % 2 === 0 ? 'short' : 'long', payload: { i }, shard: 9 })),
    { schema },
  );
  const got = await claimAll(6, {
    laneIds: await laneOf(9),
    ceilings: new Map([
      ['short', 1],
      ['long', 600_000],
    ]),
    maxAttempts: new Map([
      ['short', 1],
      ['long', 5],
    ]),
  });
  assert.equal(got.length, 6);
  assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.range_leases`)).rows[0].n, 1, 'one range');
  const short = got.filter((t) => t.type === 'short');
  const long = got.filter((t) => t.type === 'long');
  assert.ok(short.every((t) => t.maxAttempts === 1) && long.every((t) => t.maxAttempts === 5));
  assert.ok(Math.max(...short.map((t) => t.leaseExpiresAt)) < Math.min(...long.map((t) => t.leaseExpiresAt)) - 500_000);
  // Wait (on the database clock) until the short type's deadline has passed.
  await leaseLapsed(pool, Math.max(...short.map((t) => t.leaseExpiresAt)));
  const rescued = await rescueLapsedLeases(pool, schema);
  assert.deepEqual(rescued, { retried: 0, dead: 3, held: 0 }, 'limit 1, resolved at claim: buried');
  const dead = await pool.query(`SELECT id::text FROM ${S}.dead_letters ORDER BY id`);
  assert.deepEqual(
    dead.rows.map((r) => r.id),
    short.map((t) => t.id).sort(),
  );
  // The holder's completion of all six settles exactly the three rescue did not take.
  const settled = await completeLeases(pool, storageFor(schema), got);
  assert.deepEqual([...settled].sort(), long.map((t) => entryKey(t)).sort());
  assert.equal((await rescueLapsedLeases(pool, schema)).retried, 0, 'nothing left to rescue');
});

test('exactly one winner: the holder completing parts of a lapsed range while two rescuers run', async () => {
  const rounds = 40;
  const size = 32;
  const other = new pg.Pool({ connectionString: DATABASE_URL, max: 4, options: '-c jit=off' });
  try {
    for (let round = 0; round < rounds; round++) {
      await reset();
      await enqueueMany(
        pool,
        Array.from({ length: size }, (_, i) => ({ type: 'lapse', payload: { i }, shard: 1 })),
        { schema },
      );
      const got = await claimAll(size, { ceilings: new Map([['lapse', 1]]), defaultCeilingMs: 1 });
      assert.equal(got.length, size);
      await leaseLapsed(pool, Math.max(...got.map((t) => t.leaseExpiresAt)));
      // The holder completes a random ~80 % in 1–3 flushes, racing two rescuers.
      const picked = got.filter(() => Math.random() < 0.8);
      const flushes = 1 + Math.floor(Math.random() * 3);
      const parts = Array.from({ length: flushes }, (_, f) => picked.filter((_, i) => i % flushes === f));
      const holder = (async () => {
        const won = new Set<string>();
        for (const part of parts) for (const k of await completeLeases(other, storageFor(schema), part)) won.add(k);
        return won;
      })();
      const [holderWon, r1, r2] = await Promise.all([
        holder,
        rescueLapsedLeases(other, schema),
        rescueLapsedLeases(other, schema),
      ]);
      const rescuedCount = r1.retried + r2.retried + r1.dead + r2.dead;
      // A rescue row dropped by an overlapping completion leaves entries for the next run.
      const sweep = await rescueLapsedLeases(pool, schema);
      const totalRescued = rescuedCount + sweep.retried + sweep.dead;
      const check = await pool.query<{ settled: number; distinct_settled: number; deferred: number }>(
        `SELECT (SELECT coalesce(sum(n), 0)::int FROM ${S}.range_settlements) AS settled,
                (SELECT count(*)::int FROM ${S}.leased_entries WHERE outcome IS NOT NULL) AS distinct_settled,
                (SELECT count(*)::int FROM ${S}.deferred) AS deferred`,
      );
      const c = check.rows[0]!;
      assert.equal(c.distinct_settled, size, `round ${round}: every entry settled`);
      assert.equal(c.settled, size, `round ${round}: no entry settled twice`);
      assert.equal(holderWon.size + totalRescued, size, `round ${round}: holder's and rescue's sets are disjoint`);
      assert.equal(c.deferred, totalRescued, `round ${round}: deferred holds exactly the rescued entries`);
      const deferredIds = new Set(
        (await pool.query<{ id: string }>(`SELECT id::text FROM ${S}.deferred`)).rows.map((r) => r.id),
      );
      for (const t of got) {
        if (holderWon.has(entryKey(t))) assert.ok(!deferredIds.has(t.id), `round ${round}: completed and rescued`);
      }
    }
  } finally {
    await other.end();
  }
});

test('rolling deploy: migration 8 carries per-task leases over; an old claim is refused, an old settlement is forwarded and fenced (until migration 22 retires both triggers)', async () => {
  const legacySchema = `t_ranges_legacy_${process.pid}`;
  const L = quoteIdent(legacySchema);
  const c = new pg.Client({ connectionString: DATABASE_URL, options: '-c jit=off' });
  await c.connect();
  try {
    await schemaAtVersion(c, legacySchema, 7);
    // What an older worker left: three entries, two leased per task, one of those settled.
    await c.query(
      `INSERT INTO ${L}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard, attempts, created_at, run_at)
       SELECT 0, 7, s, 100 + s, 'old', '{}', 'default', 0, 0, 0, now(), now() FROM generate_series(1, 3) s`,
    );
    await c.query(
      `INSERT INTO ${L}.leases (slot, lane_id, lane_seq, id, type, attempt, max_attempts, token, claimed_at, expires_at, worker)
       SELECT 0, 7, s, 100 + s, 'old', 1, 3, ('00000000-0000-0000-0000-00000000000' || s)::uuid, now(), now() + interval '1 hour', 'old-worker'
         FROM generate_series(1, 2) s`,
    );
    await c.query(
      `INSERT INTO ${L}.settlements (slot, lane_id, lane_seq, id, outcome) VALUES (0, 7, 1, 101, 'completed')`,
    );
    // Through migration 21, the last with the triggers of migration 8.
    await migrateSchemaTo(c, legacySchema, 21);
    const leased = await c.query(
      `SELECT id::text, attempt, max_attempts, worker, outcome FROM ${L}.leased_entries ORDER BY id`,
    );
    assert.deepEqual(leased.rows, [
      { id: '101', attempt: 1, max_attempts: 3, worker: 'old-worker', outcome: 'completed' },
      { id: '102', attempt: 1, max_attempts: 3, worker: 'old-worker', outcome: null },
    ]);
    // The cursor is past the carried-over leases: the new claim takes entry 3 only.
    const cur = await c.query(
      `SELECT to_seq::text FROM ${L}.range_leases WHERE lane_id = 7 ORDER BY from_seq DESC LIMIT 1`,
    );
    assert.equal(cur.rows[0].to_seq, '2');
    // An old claim fails loudly instead of leasing what a range may hold.
    await assert.rejects(
      c.query(
        `INSERT INTO ${L}.leases (slot, lane_id, lane_seq, id, type, attempt, max_attempts, token, claimed_at, expires_at)
         VALUES (0, 7, 3, 103, 'old', 1, 3, gen_random_uuid(), now(), now())`,
      ),
      /leases ranges since migration 8; upgrade the worker/,
    );
    // An old worker's settlement of its lease is forwarded, and the fence still decides.
    const first = await c.query(
      `INSERT INTO ${L}."settlements_0" (slot, lane_id, lane_seq, id, outcome) VALUES (0, 7, 2, 102, 'completed')
       ON CONFLICT DO NOTHING RETURNING id`,
    );
    assert.equal(first.rowCount, 1);
    const again = await c.query(
      `INSERT INTO ${L}.settlements (slot, lane_id, lane_seq, id, outcome) VALUES (0, 7, 2, 102, 'rescued')
       ON CONFLICT DO NOTHING RETURNING id`,
    );
    assert.equal(again.rowCount, 0, 'the second writer is told it lost');
    const out = await c.query(`SELECT outcome FROM ${L}.leased_entries WHERE id = 102`);
    assert.equal(out.rows[0].outcome, 'completed');
    // Migration 22 drops both triggers: what the range tables hold stands, and the per-task
    // tables, kept for a later migration, are written through by nothing.
    await migrate({ client: c, schema: legacySchema });
    const triggers = await c.query(
      `SELECT count(*)::int AS n FROM pg_trigger t JOIN pg_class k ON k.oid = t.tgrelid
        WHERE k.relnamespace = $1::regnamespace AND t.tgname IN ('refuse_legacy_lease', 'forward_legacy_settlement')`,
      [legacySchema],
    );
    assert.equal(triggers.rows[0].n, 0);
    assert.deepEqual((await c.query(`SELECT id::text, outcome FROM ${L}.leased_entries ORDER BY id`)).rows, [
      { id: '101', outcome: 'completed' },
      { id: '102', outcome: 'completed' },
    ]);
  } finally {
    await c.query(`DROP SCHEMA IF EXISTS ${L} CASCADE`);
    await c.end();
  }
});

test('ring-walking statements run with JIT off on a caller pool that has it on (compiling their plans took seconds)', async () => {
  const plain = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  try {
    const on = await plain.query<{ jit: string }>(`SELECT current_setting('jit') AS jit`);
    const off = await queryRingRead<{ jit: string; bitmap: string; seq: string }>(
      plain,
      `SELECT current_setting('jit') AS jit, current_setting('enable_bitmapscan') AS bitmap,
              current_setting('enable_seqscan') AS seq`,
    );
    assert.deepEqual(off.rows[0], { jit: 'off', bitmap: 'on', seq: 'on' });
    // The caller's sessions keep their own setting.
    const after = await plain.query<{ jit: string }>(`SELECT current_setting('jit') AS jit`);
    assert.equal(after.rows[0]!.jit, on.rows[0]!.jit);
    await assert.rejects(queryRingRead(plain, 'SELECT 1/0'), /division by zero/);
    assert.equal((await plain.query('SELECT 1 AS one')).rows[0].one, 1, 'the pool is usable after an error');
    // On a client: off around the statement, the session's own setting back after it.
    const c = await plain.connect();
    try {
      // A worker session's settings (SESSION_OPTIONS) plus JIT on.
      await c.query(`SET jit = on; SET enable_bitmapscan = off; SET enable_seqscan = off`);
      assert.deepEqual(
        (
          await queryRingRead<{ jit: string; seq: string }>(
            c,
            `SELECT current_setting('jit') AS jit, current_setting('enable_seqscan') AS seq`,
          )
        ).rows[0],
        { jit: 'off', seq: 'on' },
      );
      assert.equal((await c.query(`SELECT current_setting('jit') AS jit`)).rows[0].jit, 'on');
      assert.equal((await c.query(`SELECT current_setting('enable_bitmapscan') AS b`)).rows[0].b, 'off');
      assert.equal((await c.query(`SELECT current_setting('enable_seqscan') AS s`)).rows[0].s, 'off');
      await c.query('BEGIN');
      await assert.rejects(queryRingRead(c, 'SELECT 1/0'), /division by zero/);
      await c.query('ROLLBACK');
      assert.equal((await c.query(`SELECT current_setting('jit') AS jit`)).rows[0].jit, 'on');
    } finally {
      c.release();
    }
  } finally {
    await plain.end();
  }
});

test('a claim reads each lane for its share of the limit and says when it left due entries behind', async () => {
  await reset();
  // Lane A holds 10 entries, lane B 2; a claim of 8 over both reads each for its share of 4.
  await enqueueMany(
    pool,
    Array.from({ length: 10 }, (_, i) => ({ type: 't', payload: { i }, shard: 20 })),
    { schema },
  );
  await enqueueMany(
    pool,
    Array.from({ length: 2 }, (_, i) => ({ type: 't', payload: { i }, shard: 21 })),
    { schema },
  );
  const ab = [...(await laneOf(20)), ...(await laneOf(21))];
  const first = await claimBatch(pool, claimParams(schema, ab, 8, { ...TERMS, perLane: 4 }));
  assert.equal(first.tasks.length, 6, 'A gave its share of 4, B its 2');
  assert.equal(first.more, true, 'A gave its whole share: it may hold more');
  const second = await claimBatch(pool, claimParams(schema, ab, 8, { ...TERMS, perLane: 4 }));
  assert.equal(second.tasks.length, 4, 'A again gives its share');
  assert.equal(second.more, true);
  const third = await claimBatch(pool, claimParams(schema, ab, 8, { ...TERMS, perLane: 4 }));
  assert.equal(third.tasks.length, 2, 'the rest of A');
  assert.equal(third.more, false, 'drained');
  // A lane that continues in the next ring segment: the claim stops at the boundary and says so.
  await enqueueMany(
    pool,
    [1, 2].map((i) => ({ type: 't', payload: { i }, shard: 22 })),
    { schema },
  );
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(
    pool,
    [3].map((i) => ({ type: 't', payload: { i }, shard: 22 })),
    { schema },
  );
  const crossed = await claimBatch(pool, claimParams(schema, await laneOf(22), 10, TERMS));
  assert.deepEqual(
    crossed.tasks.map((t) => (t.payload as { i: number }).i),
    [1, 2],
  );
  assert.equal(crossed.more, true);
  const rest = await claimBatch(pool, claimParams(schema, await laneOf(22), 10, TERMS));
  assert.deepEqual(
    rest.tasks.map((t) => (t.payload as { i: number }).i),
    [3],
  );
  assert.equal(rest.more, false);
});
