/**
 * Ring windows (migration 13, src/storage/ring-window.ts): a worker's claims read only the ring
 * segments that may hold entries, and a claim whose snapshot shows a later ring generation than
 * its window's leases nothing and says it is stale. An appender that raced a rotation moves its
 * entries to the segment current after it (migration 18), so no window leaves one out behind the
 * lane's cursor.
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueueMany, getTask, migrate, Worker } from '../src/index.js';
import { claimBatch, type ClaimParams, discover } from '../src/processor/claim.js';
import { rotateRing, pruneSegment } from '../src/maintenance/ring.js';
import { readGauges, readGaugesIn } from '../src/maintenance/gauges.js';
import { bindSchema, quoteIdent } from '../src/sql.js';
import { claimableEntry, liveEntries } from '../src/storage/predicates.js';
import { completeLeases } from '../src/storage/complete.js';
import { removeUnleased } from '../src/storage/remove.js';
import { MAX_WINDOW_SEGMENTS, overWindow, readRingWindow } from '../src/storage/ring-window.js';
import { claimParams } from './claim-params.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor } from './helpers.js';
import { enqueueOnLegacy, schemaAtVersion } from './support/legacy-schema.js';

const { schema, pool } = await freshSchema('ringwin');
const S = quoteIdent(schema);

/** This file's claims: type 't' for 60 s, as worker 'ring-window-test'. */
const TERMS: Partial<ClaimParams> = { ceilings: new Map([['t', 60_000]]), workerId: 'ring-window-test' };

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dedupe`,
  );
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0`);
}

async function laneOf(shard: number): Promise<number> {
  return (await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE shard = $1`, [shard])).rows[0].lane_id as number;
}

async function generation(): Promise<bigint> {
  return BigInt((await pool.query(`SELECT generation::text AS g FROM ${S}.ring_state`)).rows[0].g);
}

test('the window is the current segment and every segment holding entries, read with the generation', async () => {
  await reset();
  assert.deepEqual(
    (await readRingWindow(pool, storageFor(schema))).segments,
    [0],
    'an empty ring: the current segment',
  );
  await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 1 }], { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, [{ type: 't', payload: { i: 2 }, shard: 1 }], { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  const w = await readRingWindow(pool, storageFor(schema));
  assert.deepEqual(w.segments, [0, 1, 2], 'two sealed segments with entries and the (empty) current one');
  assert.equal(BigInt(w.generation), await generation());
  // A window wider than MAX_WINDOW_SEGMENTS is the whole ring.
  for (let i = 0; i < MAX_WINDOW_SEGMENTS; i++) {
    await enqueueMany(pool, [{ type: 't', payload: { i: 10 + i }, shard: 1 }], { schema });
    assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  }
  assert.equal((await readRingWindow(pool, storageFor(schema))).segments, null);
});

test('a claim in a window leases in lane order across its segments; a pruned segment leaves it', async () => {
  await reset();
  const specs = (from: number, n: number) =>
    Array.from({ length: n }, (_, i) => ({ type: 't', payload: { i: from + i }, shard: 2 }));
  await enqueueMany(pool, specs(0, 3), { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, specs(3, 3), { schema });
  const lane = await laneOf(2);
  const window = await readRingWindow(pool, storageFor(schema));
  assert.deepEqual(window.segments, [0, 1]);
  const first = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window }));
  assert.equal(first.stale, false);
  // A range never spans two segments: the first segment's three, then the next segment's.
  assert.deepEqual(
    first.tasks.map((t) => (t.payload as { i: number }).i),
    [0, 1, 2],
  );
  assert.equal(first.more, true, 'it stopped at the segment boundary');
  const second = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window }));
  assert.deepEqual(
    second.tasks.map((t) => (t.payload as { i: number }).i),
    [3, 4, 5],
  );
  assert.equal((await discover(pool, storageFor(schema), null, 20, 1, window)).length, 0, 'nothing left to discover');
  // Settled, the first segment is pruned; the next window is the current segment alone.
  assert.equal((await completeLeases(pool, storageFor(schema), [...first.tasks, ...second.tasks])).size, 6);
  assert.deepEqual((await pruneSegment(pool, schema, 0, 1000)).result, 'pruned');
  assert.deepEqual((await readRingWindow(pool, storageFor(schema))).segments, [1]);
});

test('a claim whose window the ring moved past leases nothing and says stale; the fresh window claims', async () => {
  await reset();
  await enqueueMany(pool, [{ type: 't', payload: { i: 0 }, shard: 3 }], { schema });
  const lane = await laneOf(3);
  const old = await readRingWindow(pool, storageFor(schema));
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 3 }], { schema });
  const stale = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window: old }));
  assert.deepEqual(stale, { tasks: [], more: false, stale: true });
  assert.equal(Number((await pool.query(`SELECT count(*) AS n FROM ${S}.range_leases`)).rows[0].n), 0, 'no lease');
  const fresh = await readRingWindow(pool, storageFor(schema));
  const got = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window: fresh }));
  assert.equal(got.stale, false);
  assert.deepEqual(
    got.tasks.map((t) => (t.payload as { i: number }).i),
    [0],
  );
});

test('an append that raced a rotation moves its entries to the segment current after it, so no window leaves them out', async () => {
  await reset();
  await enqueueMany(pool, [{ type: 't', payload: { i: 0 }, shard: 4 }], { schema });
  const lane = await laneOf(4);
  const g0 = await generation();
  // A rotation committed while the append ran (between its read of the ring epoch and its
  // second look after the INSERT): simulated by a trigger that rotates inside the appender's own
  // transaction, after its row is routed to segment 0. (ring_state's own trigger moves the epoch.)
  await pool.query(`CREATE FUNCTION ${S}.rotate_during_append() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN UPDATE ${S}.ring_state SET current_slot = (current_slot + 1) % slot_count; RETURN NULL; END $$`);
  await pool.query(
    `CREATE TRIGGER rotate_during_append AFTER INSERT ON ${S}.ready_0 FOR EACH ROW EXECUTE FUNCTION ${S}.rotate_during_append()`,
  );
  let raced: string;
  try {
    raced = (await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 4 }], { schema }))[0]!.id!;
  } finally {
    await pool.query(`DROP TRIGGER rotate_during_append ON ${S}.ready_0`);
    await pool.query(`DROP FUNCTION ${S}.rotate_during_append()`);
  }
  assert.equal(await generation(), g0 + 1n, 'the rotation bumped the generation (the appender does not)');
  const rows = await pool.query(`SELECT slot FROM ${S}.ready WHERE id = $1`, [raced]);
  assert.deepEqual(
    rows.rows.map((r) => r.slot),
    [1],
    'the raced entry lives in the segment that was current after its append, and only there',
  );
  // A later append of the lane goes to the same segment; claims take the lane in order.
  await enqueueMany(pool, [{ type: 't', payload: { i: 2 }, shard: 4 }], { schema });
  const window = await readRingWindow(pool, storageFor(schema));
  assert.deepEqual(window.segments, [0, 1]);
  const first = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window }));
  const second = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window }));
  assert.deepEqual(
    [...first.tasks, ...second.tasks].map((t) => (t.payload as { i: number }).i),
    [0, 1, 2],
    'the lane in order: segment 0, then the raced entry and the next in segment 1',
  );
});

test('a worker drains through rotations and prunes: its claims refresh their window and nothing is lost', async () => {
  await reset();
  const n = 300;
  const seen = new Set<number>();
  const def = defineTask<{ i: number }>({
    type: 'w',
    ceilingMs: 60_000,
    handler: async ({ i }) => void seen.add(i),
  });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 4,
    pollIntervalMs: 60_000,
    logger: captureLogger().logger,
    // Rotate as often as the ring lets it, so claims keep finding their window stale.
    maintenance: { ...FAST_MAINTENANCE, ringRotateAfterMs: 1, ringRotateSmallAfterMs: 1, ringIntervalMs: 20 },
  });
  await w.start();
  try {
    const ids: string[] = [];
    for (let i = 0; i < n; i += 10) {
      const r = await enqueueMany(
        pool,
        Array.from({ length: 10 }, (_, k) => ({ type: 'w', payload: { i: i + k }, shard: 5 + ((i / 10) % 3) })),
        { schema },
      );
      ids.push(...r.map((x) => x.id!));
    }
    await waitFor(() => seen.size === n, 60_000, `all ${n} handled (${seen.size})`);
    await waitFor(
      async () => {
        const states = await Promise.all(ids.map(async (id) => (await getTask(pool, schema, id))?.state));
        return states.every((s) => s === 'completed' || s === undefined);
      },
      60_000,
      'every completion recorded',
    );
    assert.ok((await generation()) > 2n, 'the ring rotated during the drain');
  } finally {
    await w.stop();
  }
});

test("prune's claimable check reads each lane's last entry in the segment, and a tombstoned last entry its whole lane", async () => {
  await reset();
  const [a, b, c] = await enqueueMany(
    pool,
    [0, 1, 2].map((i) => ({ type: 't', payload: { i }, shard: 8 })),
    { schema },
  );
  await enqueueMany(pool, [{ type: 't', payload: { i: 9 }, shard: 9 }], { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  const lane = await laneOf(8);
  const other = await laneOf(9);
  const first = await claimBatch(pool, claimParams(schema, [lane], 1, TERMS));
  assert.deepEqual(
    first.tasks.map((t) => t.id),
    [a!.id],
  );
  const rest9 = await claimBatch(pool, claimParams(schema, [other], 10, TERMS));
  assert.equal(rest9.tasks.length, 1, 'lane 9 fully leased');
  // Lane 8's last entry removed (tombstoned): only its middle entry is unleased, and only a read
  // of the whole lane finds it.
  assert.equal(await removeUnleased(pool, storageFor(schema), c!.id!, 'test'), 'removed');
  assert.deepEqual(await pruneSegment(pool, schema, 0, 1000), {
    segment: 0,
    result: 'skipped',
    reason: 'claimable',
  });
  const rest8 = await claimBatch(pool, claimParams(schema, [lane], 10, TERMS));
  assert.deepEqual(
    rest8.tasks.map((t) => t.id),
    [b!.id],
  );
  // Everything leased: in flight until settled, then pruned.
  assert.deepEqual(await pruneSegment(pool, schema, 0, 1000), {
    segment: 0,
    result: 'skipped',
    reason: 'in_flight',
  });
  await completeLeases(pool, storageFor(schema), [...first.tasks, ...rest9.tasks, ...rest8.tasks]);
  assert.deepEqual(await pruneSegment(pool, schema, 0, 1000), { segment: 0, result: 'pruned' });
});

test('a ring read over a window counts what the whole ring counts, and every ring partition has its parent’s columns in order', async () => {
  await reset();
  const specs = (from: number, n: number, type = 't') =>
    Array.from({ length: n }, (_, i) => ({ type, payload: { i: from + i }, shard: 4 }));
  await enqueueMany(pool, specs(0, 5), { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, specs(5, 4, 'u'), { schema });
  const lane = await laneOf(4);
  const window = await readRingWindow(pool, storageFor(schema));
  assert.deepEqual(window.segments, [0, 1]);
  // Leased and partly settled in the first segment, one tombstoned in the second.
  const leased = await claimBatch(pool, claimParams(schema, [lane], 3, { ...TERMS, window }));
  assert.equal((await completeLeases(pool, storageFor(schema), leased.tasks.slice(0, 2))).size, 2);
  const [, , , , , sixth] = (await pool.query(`SELECT id FROM ${S}.ready ORDER BY lane_seq`)).rows as { id: string }[];
  assert.equal(await removeUnleased(pool, storageFor(schema), sixth!.id, 'test'), 'removed');

  const bound = bindSchema(schema);
  const statements = [
    `SELECT count(*)::int AS n FROM ${liveEntries(S)} r`,
    `SELECT count(*)::int AS n FROM ${S}.ready r JOIN ${S}.lanes pl ON pl.lane_id = r.lane_id WHERE ${claimableEntry(S, 'pl')}`,
    `SELECT (SELECT count(*) FROM ${S}.range_settlements) + (SELECT count(*) FROM ${S}.tombstones) AS n`,
  ];
  for (const text of statements) {
    const whole = (await pool.query(text)).rows[0].n;
    const windowed = overWindow(text, bound, window.segments);
    assert.notEqual(windowed, text, 'the window names partitions');
    for (const parent of ['ready', 'range_leases', 'range_settlements', 'tombstones'])
      assert.ok(
        !windowed.includes(`${S}.${parent}`) &&
          windowed.includes(`${S}."${parent}_0"`) === text.includes(`${S}.${parent}`),
        `${parent} is read as its partitions`,
      );
    assert.equal((await pool.query(windowed)).rows[0].n, whole, windowed);
  }
  assert.equal(overWindow(statements[0]!, bound, null), statements[0], 'no window: the whole ring');
  // t: 5 entries, 2 settled, 1 leased (running), 2 unleased; u: 4 entries, 1 tombstoned.
  const gauges = await readGauges(pool, schema);
  assert.deepEqual(Object.fromEntries(gauges.pending), { t: 3, u: 3 });
  assert.deepEqual(Object.fromEntries(gauges.running), { t: 1 });

  // SELECT * from a partition stands for its parent: same columns, same order.
  const layouts = await pool.query<{ parent: string; n: string }>(
    `SELECT p.relname AS parent, count(DISTINCT cols.list)::text AS n
       FROM pg_inherits i
       JOIN pg_class p ON p.oid = i.inhparent
       JOIN pg_namespace ns ON ns.oid = p.relnamespace AND ns.nspname = $1
       CROSS JOIN LATERAL (SELECT string_agg(a.attname || ':' || a.atttypid::regtype, ',' ORDER BY a.attnum) AS list
                             FROM pg_attribute a
                            WHERE a.attrelid IN (i.inhrelid, i.inhparent) AND a.attnum > 0 AND NOT a.attisdropped
                            GROUP BY a.attrelid) cols
      WHERE p.relname IN ('ready', 'range_leases', 'range_settlements', 'tombstones')
      GROUP BY p.relname ORDER BY p.relname`,
    [schema],
  );
  assert.deepEqual(
    layouts.rows,
    ['range_leases', 'range_settlements', 'ready', 'tombstones'].map((parent) => ({ parent, n: '1' })),
  );
});

test('gauges read over a window the ring moved past count again over the new one, so the new segment is counted', async () => {
  await reset();
  await enqueueMany(pool, [{ type: 't', payload: { i: 0 }, shard: 5 }], { schema });
  const old = await readRingWindow(pool, storageFor(schema));
  assert.deepEqual(old.segments, [0]);
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 5 }], { schema });
  const counted: string[] = [];
  const db = {
    query: ((config: unknown, values?: unknown[]) => {
      const name = (config as { name?: string }).name;
      if (name?.startsWith('berth-gauges-pending')) counted.push(name);
      return pool.query(config as string, values);
    }) as typeof pool.query,
  };
  const snap = await readGaugesIn(db, storageFor(schema), old);
  assert.equal(snap.pending.get('t'), 2, 'the entry in segment 1, outside the old window, is counted');
  assert.equal(counted.length, 2, 'counted again, over the new window');
  assert.match(counted[1]!, /:w0\.1@[\w-]{10}$/);
  // A later generation with no new segment (an appender's bump): the counts stand.
  const now = await readRingWindow(pool, storageFor(schema));
  await pool.query(`UPDATE ${S}.ring_state SET generation = generation + 1`);
  counted.length = 0;
  assert.equal((await readGaugesIn(db, storageFor(schema), now)).pending.get('t'), 2);
  assert.equal(counted.length, 1, 'counted once');
});

test('prune checks every entry: one neither settled nor tombstoned is sent back to deferred, never truncated away', async () => {
  await reset();
  const tasks = await enqueueMany(
    pool,
    [0, 1, 2].map((i) => ({ type: 't', payload: { i }, shard: 10 })),
    { schema },
  );
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  const lane = await laneOf(10);
  const seqs = (
    await pool.query(`SELECT lane_seq::int AS s FROM ${S}.ready WHERE lane_id = $1 ORDER BY lane_seq`, [lane])
  ).rows.map((r) => r.s as number);
  // A broken lease, made by hand: it covers the lane's three entries but counts two, and both of
  // its settlements name the first and the last. Each lane's last entry is leased and no lease
  // is in flight, so only an entry-by-entry check sees the middle one: nobody would ever claim it.
  await pool.query(
    `INSERT INTO ${S}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker, types,
                                    type_expires, type_max_attempts, expires_at)
     VALUES (0, $1, $2, $3, 2, gen_random_uuid(), now(), 'forged', '{t}', ARRAY[now() + interval '1 hour'],
             '{20}', now() + interval '1 hour')`,
    [lane, seqs[0], seqs[2]],
  );
  await pool.query(
    `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
     VALUES (0, $1, $2::bigint, int8multirange(int8range($2::bigint, $2::bigint + 1), int8range($3::bigint, $3::bigint + 1)),
             2, 'completed')`,
    [lane, seqs[0], seqs[2]],
  );
  assert.deepEqual(await pruneSegment(pool, schema, 0, 1000), { segment: 0, result: 'recovered', entries: 1 });
  const deferred = await pool.query(`SELECT id::text, state, attempts, last_error FROM ${S}.deferred`);
  assert.deepEqual(
    deferred.rows.map((r) => [r.id, r.state, r.attempts]),
    [[tasks[1]!.id, 'retryable', 0]],
    'the stranded task waits in deferred, due now, its attempts kept',
  );
  assert.match(deferred.rows[0].last_error, /recovered by the ring prune/);
  assert.equal(
    Number((await pool.query(`SELECT count(*) AS n FROM ${S}.ready_0`)).rows[0].n),
    0,
    'the segment was reclaimed in the same transaction',
  );
  assert.equal((await getTask(pool, schema, tasks[1]!.id!))?.state, 'retryable');
});

/** Wait until backend `pid` waits for a lock (it has taken its snapshot and queued behind one). */
async function waitingForLock(pid: number, what: string): Promise<void> {
  await waitFor(
    async () => (await pool.query(`SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted`, [pid])).rowCount === 1,
    20_000,
    what,
  );
}

test('a window read while a rotation is between its statement and its commit holds both segments: the sealed one’s entry is claimed first', async () => {
  await reset();
  const blocker = await pool.connect();
  const reader = await pool.connect();
  const rotator = await pool.connect();
  try {
    // The window's statement takes its snapshot, then waits behind a lock (a prune's, say).
    await blocker.query('BEGIN');
    await blocker.query(`LOCK TABLE ${S}.ready_9 IN ACCESS EXCLUSIVE MODE`);
    const readerPid = (await reader.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    const pending = readRingWindow(reader, storageFor(schema));
    await waitingForLock(readerPid, 'the window read to wait for the lock');
    // Meanwhile X commits in segment 0, and a rotation to 1 runs its statement, not yet committed.
    const [x] = await enqueueMany(pool, [{ type: 't', payload: { n: 'x' }, shard: 11 }], { schema });
    await rotator.query('BEGIN');
    assert.equal((await rotator.query(`SELECT ${S}.rotate_ring(0::smallint, 1::smallint) AS r`)).rows[0].r, 'rotated');
    await blocker.query('COMMIT');
    const window = await pending;
    // Y, the lane's next entry, goes to segment 1 (the epoch's); the rotation is still open, so
    // a claim with this window is not stale.
    const [y] = await enqueueMany(pool, [{ type: 't', payload: { n: 'y' }, shard: 11 }], { schema });
    assert.deepEqual(window.segments, [0, 1], 'the segment being sealed (ring_state’s) and the epoch’s');
    const lane = await laneOf(11);
    const first = await claimBatch(pool, claimParams(schema, [lane], 10, { ...TERMS, window }));
    assert.equal(first.stale, false);
    assert.deepEqual(
      first.tasks.map((t) => t.id),
      [x!.id],
      'X first (the segment it is in was sealed after the window’s snapshot), then Y',
    );
    await rotator.query('COMMIT');
    const second = await claimBatch(
      pool,
      claimParams(schema, [lane], 10, { ...TERMS, window: await readRingWindow(pool, storageFor(schema)) }),
    );
    assert.deepEqual(
      second.tasks.map((t) => t.id),
      [y!.id],
    );
  } finally {
    await blocker.query('ROLLBACK').catch(() => undefined);
    await rotator.query('ROLLBACK').catch(() => undefined);
    blocker.release();
    reader.release();
    rotator.release();
  }
});

test('prune recovers an unleased last entry its lane’s cursor passed (a lease in a later segment) instead of calling it claimable for ever', async () => {
  await reset();
  const [x, y] = await enqueueMany(
    pool,
    ['x', 'y'].map((n) => ({ type: 't', payload: { n }, shard: 12 })),
    { schema },
  );
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  // Y moved to segment 1 and leased and settled there by hand: the lane's cursor is past X,
  // which is its lane's last entry in segment 0 and unleased.
  await pool.query(`UPDATE ${S}.ready SET slot = 1 WHERE id = $1`, [y!.id]);
  const lane = await laneOf(12);
  const seqY = (await pool.query(`SELECT lane_seq::int AS s FROM ${S}.ready WHERE id = $1`, [y!.id])).rows[0].s;
  await pool.query(
    `INSERT INTO ${S}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker, types,
                                    type_expires, type_max_attempts, expires_at)
     VALUES (1, $1, $2, $2, 1, gen_random_uuid(), now(), 'forged', '{t}', ARRAY[now() + interval '1 hour'],
             '{20}', now() + interval '1 hour')`,
    [lane, seqY],
  );
  await pool.query(
    `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
     VALUES (1, $1, $2::bigint, int8multirange(int8range($2::bigint, $2::bigint + 1)), 1, 'completed')`,
    [lane, seqY],
  );
  assert.equal(
    (
      await claimBatch(
        pool,
        claimParams(schema, [lane], 10, { ...TERMS, window: await readRingWindow(pool, storageFor(schema)) }),
      )
    ).tasks.length,
    0,
    'no claim takes X any more',
  );
  assert.deepEqual(await pruneSegment(pool, schema, 0, 1000), { segment: 0, result: 'recovered', entries: 1 });
  assert.equal((await getTask(pool, schema, x!.id!))?.state, 'retryable', 'X waits in deferred, due now');
});

test('migration 18 under a fleet of migration 17: an older leader’s rotation in flight is waited for, and its plain UPDATE moves the epoch', async () => {
  const legacy = `t_ringwin_v17_${process.pid}`;
  const L = quoteIdent(legacy);
  const c = new pg.Client({ connectionString: DATABASE_URL, options: '-c jit=off' });
  const oldLeader = new pg.Client({ connectionString: DATABASE_URL, options: '-c jit=off' });
  await c.connect();
  await oldLeader.connect();
  try {
    await schemaAtVersion(c, legacy, 17);
    await enqueueOnLegacy(c, legacy, 't', {}, 0);
    // An older leader's rotation, its statement run and its transaction still open.
    await oldLeader.query('BEGIN');
    await oldLeader.query(
      `UPDATE ${L}.ring_state SET current_slot = 1, generation = generation + 1, rotated_at = now() WHERE current_slot = 0`,
    );
    const migrating = migrate({ connectionString: DATABASE_URL, schema: legacy });
    await waitFor(
      async () =>
        (
          await pool.query(
            `SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
              WHERE NOT l.granted AND c.relname = 'ring_state' AND c.relnamespace = $1::regnamespace`,
            [legacy],
          )
        ).rowCount === 1,
      20_000,
      'the migration to wait for the rotation',
    );
    await oldLeader.query('COMMIT');
    await migrating;
    const ring = async () =>
      (
        await c.query(
          `SELECT current_slot, (SELECT last_value % 16 FROM ${L}.ring_epoch)::int AS epoch FROM ${L}.ring_state`,
        )
      ).rows[0];
    assert.deepEqual(await ring(), { current_slot: 1, epoch: 1 }, 'the epoch starts at the committed rotation');
    // The older leader rotates again with its plain UPDATE: the epoch follows, appends go there.
    await oldLeader.query(
      `UPDATE ${L}.ring_state SET current_slot = 2, generation = generation + 1, rotated_at = now() WHERE current_slot = 1`,
    );
    assert.deepEqual(await ring(), { current_slot: 2, epoch: 2 });
    const [t] = await enqueueMany(c, [{ type: 't', payload: {}, shard: 0 }], { schema: legacy });
    assert.equal((await c.query(`SELECT slot FROM ${L}.ready WHERE id = $1`, [t!.id])).rows[0].slot, 2);
  } finally {
    await oldLeader.query('ROLLBACK').catch(() => undefined);
    await c.query(`DROP SCHEMA IF EXISTS ${L} CASCADE`);
    await c.end();
    await oldLeader.end();
  }
});
