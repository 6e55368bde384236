/**
 * Ring windows (migration 13, src/storage/ring-window.ts): a worker's claims read only the ring
 * segments that may hold entries, and a claim whose snapshot shows a later ring generation than
 * its window's leases nothing and says it is stale. An appender that raced a rotation bumps the
 * generation, so the one entry a window could leave out behind the lane's cursor is never
 * passed over.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueueMany, getTask, Worker } from '../src/index.js';
import { claimBatch, type ClaimParams, discover } from '../src/processor/claim.js';
import { rotateRing, pruneSegment } from '../src/maintenance/ring.js';
import { readGauges, readGaugesIn } from '../src/maintenance/gauges.js';
import { bindSchema, quoteIdent, wakeChannel } from '../src/sql.js';
import { claimableEntry, liveEntries } from '../src/storage/predicates.js';
import { completeLeases } from '../src/storage/complete.js';
import { removeUnleased } from '../src/storage/remove.js';
import { MAX_WINDOW_SEGMENTS, overWindow, readRingWindow } from '../src/storage/ring-window.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('ringwin');
const S = quoteIdent(schema);

function params(laneIds: number[], limit: number, extra: Partial<ClaimParams> = {}): ClaimParams {
  return {
    schema,
    laneIds,
    limit,
    ceilings: new Map([['t', 60_000]]),
    maxAttempts: new Map(),
    defaultMaxAttempts: 20,
    defaultCeilingMs: 60_000,
    marginMs: 0,
    workerId: 'ring-window-test',
    wakeChannel: wakeChannel(schema),
    ...extra,
  };
}

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
  assert.deepEqual((await readRingWindow(pool, schema)).segments, [0], 'an empty ring: the current segment');
  await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 1 }], { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, [{ type: 't', payload: { i: 2 }, shard: 1 }], { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  const w = await readRingWindow(pool, schema);
  assert.deepEqual(w.segments, [0, 1, 2], 'two sealed segments with entries and the (empty) current one');
  assert.equal(BigInt(w.generation), await generation());
  // A window wider than MAX_WINDOW_SEGMENTS is the whole ring.
  for (let i = 0; i < MAX_WINDOW_SEGMENTS; i++) {
    await enqueueMany(pool, [{ type: 't', payload: { i: 10 + i }, shard: 1 }], { schema });
    assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  }
  assert.equal((await readRingWindow(pool, schema)).segments, null);
});

test('a claim in a window leases in lane order across its segments; a pruned segment leaves it', async () => {
  await reset();
  const specs = (from: number, n: number) =>
    Array.from({ length: n }, (_, i) => ({ type: 't', payload: { i: from + i }, shard: 2 }));
  await enqueueMany(pool, specs(0, 3), { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, specs(3, 3), { schema });
  const lane = await laneOf(2);
  const window = await readRingWindow(pool, schema);
  assert.deepEqual(window.segments, [0, 1]);
  const first = await claimBatch(pool, params([lane], 10, { window }));
  assert.equal(first.stale, false);
  // A range never spans two segments: the first segment's three, then the next segment's.
  assert.deepEqual(
    first.tasks.map((t) => (t.payload as { i: number }).i),
    [0, 1, 2],
  );
  assert.equal(first.more, true, 'it stopped at the segment boundary');
  const second = await claimBatch(pool, params([lane], 10, { window }));
  assert.deepEqual(
    second.tasks.map((t) => (t.payload as { i: number }).i),
    [3, 4, 5],
  );
  assert.equal((await discover(pool, schema, null, 20, 1, window)).length, 0, 'nothing left to discover');
  // Settled, the first segment is pruned; the next window is the current segment alone.
  assert.equal((await completeLeases(pool, schema, [...first.tasks, ...second.tasks])).size, 6);
  assert.deepEqual((await pruneSegment(pool, schema, 0, 1000)).result, 'pruned');
  assert.deepEqual((await readRingWindow(pool, schema)).segments, [1]);
});

test('a claim whose window the ring moved past leases nothing and says stale; the fresh window claims', async () => {
  await reset();
  await enqueueMany(pool, [{ type: 't', payload: { i: 0 }, shard: 3 }], { schema });
  const lane = await laneOf(3);
  const old = await readRingWindow(pool, schema);
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 3 }], { schema });
  const stale = await claimBatch(pool, params([lane], 10, { window: old }));
  assert.deepEqual(stale, { tasks: [], more: false, stale: true });
  assert.equal(Number((await pool.query(`SELECT count(*) AS n FROM ${S}.range_leases`)).rows[0].n), 0, 'no lease');
  const fresh = await readRingWindow(pool, schema);
  const got = await claimBatch(pool, params([lane], 10, { window: fresh }));
  assert.equal(got.stale, false);
  assert.deepEqual(
    got.tasks.map((t) => (t.payload as { i: number }).i),
    [0],
  );
});

test('an append that raced a rotation bumps the generation, so a window that left its segment out goes stale', async () => {
  await reset();
  await enqueueMany(pool, [{ type: 't', payload: { i: 0 }, shard: 4 }], { schema });
  const lane = await laneOf(4);
  const before = await readRingWindow(pool, schema);
  const g0 = await generation();
  // A rotation committed while the append ran (between its read of current_slot and its
  // second look after the INSERT): simulated by a trigger that moves current_slot inside the
  // appender's own transaction, after its row is routed.
  await pool.query(`CREATE FUNCTION ${S}.rotate_during_append() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN UPDATE ${S}.ring_state SET current_slot = (current_slot + 1) % slot_count; RETURN NULL; END $$`);
  await pool.query(
    `CREATE TRIGGER rotate_during_append AFTER INSERT ON ${S}.ready_0 FOR EACH ROW EXECUTE FUNCTION ${S}.rotate_during_append()`,
  );
  try {
    await enqueueMany(pool, [{ type: 't', payload: { i: 1 }, shard: 4 }], { schema });
  } finally {
    await pool.query(`DROP TRIGGER rotate_during_append ON ${S}.ready_0`);
    await pool.query(`DROP FUNCTION ${S}.rotate_during_append()`);
  }
  assert.equal(await generation(), g0 + 1n, 'the appender bumped the generation');
  assert.equal((await claimBatch(pool, params([lane], 10, { window: before }))).stale, true);
  // An append that did not race one leaves the generation alone.
  await enqueueMany(pool, [{ type: 't', payload: { i: 2 }, shard: 4 }], { schema });
  assert.equal(await generation(), g0 + 1n);
  const got = await claimBatch(pool, params([lane], 10, { window: await readRingWindow(pool, schema) }));
  assert.deepEqual(
    got.tasks.map((t) => (t.payload as { i: number }).i),
    [0, 1],
    'the lane in order: the raced entry first (the next segment is the next claim)',
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
  const first = await claimBatch(pool, params([lane], 1));
  assert.deepEqual(
    first.tasks.map((t) => t.id),
    [a!.id],
  );
  const rest9 = await claimBatch(pool, params([other], 10));
  assert.equal(rest9.tasks.length, 1, 'lane 9 fully leased');
  // Lane 8's last entry removed (tombstoned): only its middle entry is unleased, and only a read
  // of the whole lane finds it.
  assert.equal(await removeUnleased(pool, schema, c!.id!, 'test'), 'removed');
  assert.deepEqual(await pruneSegment(pool, schema, 0, 1000), {
    segment: 0,
    result: 'skipped',
    reason: 'claimable',
  });
  const rest8 = await claimBatch(pool, params([lane], 10));
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
  await completeLeases(pool, schema, [...first.tasks, ...rest9.tasks, ...rest8.tasks]);
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
  const window = await readRingWindow(pool, schema);
  assert.deepEqual(window.segments, [0, 1]);
  // Leased and partly settled in the first segment, one tombstoned in the second.
  const leased = await claimBatch(pool, params([lane], 3, { window }));
  assert.equal((await completeLeases(pool, schema, leased.tasks.slice(0, 2))).size, 2);
  const [, , , , , sixth] = (await pool.query(`SELECT id FROM ${S}.ready ORDER BY lane_seq`)).rows as { id: string }[];
  assert.equal(await removeUnleased(pool, schema, sixth!.id, 'test'), 'removed');

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
  const old = await readRingWindow(pool, schema);
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
  const snap = await readGaugesIn(db, bindSchema(schema), old);
  assert.equal(snap.pending.get('t'), 2, 'the entry in segment 1, outside the old window, is counted');
  assert.equal(counted.length, 2, 'counted again, over the new window');
  assert.match(counted[1]!, /:w0\.1$/);
  // A later generation with no new segment (an appender's bump): the counts stand.
  const now = await readRingWindow(pool, schema);
  await pool.query(`UPDATE ${S}.ring_state SET generation = generation + 1`);
  counted.length = 0;
  assert.equal((await readGaugesIn(db, bindSchema(schema), now)).pending.get('t'), 2);
  assert.equal(counted.length, 1, 'counted once');
});
