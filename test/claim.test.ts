import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { enqueueMany, enqueue } from '../src/index.js';
import { claim, claimBatch, claimLanes, discover, type ClaimParams, type ClaimedTask } from '../src/processor/claim.js';
import { claimOneLane } from '../src/processor/claim-one-lane.js';
import { type Queryable, wakeChannel } from '../src/sql.js';
import { readRingWindow } from '../src/storage/ring-window.js';
import { claimParams } from './claim-params.js';
import { freshSchema, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('claim');

/** This file's claims: type 't' for 60 s, any other for 300 s, with a 30 s lease margin. */
const TERMS: Partial<ClaimParams> = { ceilings: new Map([['t', 60_000]]), defaultCeilingMs: 300_000, marginMs: 30_000 };

type ClaimFn = (db: Queryable, p: ClaimParams) => Promise<ClaimedTask[]>;

/**
 * The claim's rules, checked on both of its statements: claimBatch takes the one-lane statement
 * when it may lock one lane (maxLanes 1, or one candidate) and the several-lane one otherwise, so
 * each test here runs both directly. An assertion that fails names the statement.
 */
const STATEMENTS: readonly (readonly [string, ClaimFn])[] = [
  ['the one-lane statement', async (db, p) => (await claimOneLane(db, p)).tasks],
  ['the several-lane statement', async (db, p) => (await claimLanes(db, p)).tasks],
];

async function forEachStatement(body: (claim: ClaimFn, label: string) => Promise<void>): Promise<void> {
  for (const [label, fn] of STATEMENTS) {
    try {
      await body(fn, label);
    } catch (err) {
      if (err instanceof Error) err.message = `${label}: ${err.message}`;
      throw err;
    }
  }
}

test('claimBatch runs the one-lane statement when it may lock one lane, the several-lane one otherwise', async () => {
  await reset();
  await enqueueMany(
    pool,
    [0, 1].map((shard) => ({ type: 't', payload: { shard }, shard })),
    { schema },
  );
  const lanes = (await pool.query(`SELECT lane_id FROM "${schema}".lanes`)).rows.map((r) => r.lane_id as number);
  const client = await pool.connect();
  try {
    const prepared = async () =>
      (
        await client.query<{ name: string }>(
          `SELECT name FROM pg_prepared_statements WHERE name LIKE 'berth-claim%' ORDER BY name`,
        )
      ).rows
        .map((r) => r.name.split(':')[0]!)
        .sort();
    assert.equal((await claimBatch(client, claimParams(schema, lanes, 1, { ...TERMS, maxLanes: 1 }))).tasks.length, 1);
    assert.deepEqual(await prepared(), ['berth-claim-one-lane'], 'maxLanes 1: the one-lane statement');
    assert.equal((await claimBatch(client, claimParams(schema, lanes, 1, TERMS))).tasks.length, 1);
    assert.deepEqual(await prepared(), ['berth-claim', 'berth-claim-one-lane'], 'two lanes: the several-lane one');
  } finally {
    client.release(true);
  }
});

async function leaseCount(): Promise<number> {
  return Number((await pool.query(`SELECT count(*) AS n FROM "${schema}".leased_entries`)).rows[0].n);
}

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE "${schema}".ready, "${schema}".range_leases, "${schema}".range_settlements, "${schema}".tombstones, "${schema}".deferred`,
  );
}

test('ClaimLeasesExactlyOneRow: a claim for one slot leases exactly the one entry it returns', () =>
  forEachStatement(async (claim) => {
    await reset();
    await enqueueMany(
      pool,
      Array.from({ length: 30 }, (_, i) => ({ type: 't', payload: { i }, shard: 0 })),
      { schema },
    );
    await enqueueMany(
      pool,
      Array.from({ length: 30 }, (_, i) => ({ type: 't', payload: { i }, shard: 1 })),
      { schema },
    );
    const lanes = (await pool.query(`SELECT lane_id FROM "${schema}".lanes`)).rows.map((r) => r.lane_id as number);
    assert.equal(lanes.length, 2);
    const got = await claim(pool, claimParams(schema, lanes, 1, TERMS));
    assert.equal(got.length, 1);
    assert.equal(await leaseCount(), 1);
    const three = await claim(pool, claimParams(schema, lanes, 3, TERMS));
    assert.equal(three.length, 3);
    assert.equal(await leaseCount(), 4);
    const leased = await pool.query(`SELECT id::text FROM "${schema}".leased_entries ORDER BY id`);
    assert.deepEqual(leased.rows.map((r) => r.id).sort(), [...got, ...three].map((t) => t.id).sort());
  }));

test('discovery returns due, unleased entries oldest first, 20 at a time', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 25 }, (_, i) => ({ type: 't', payload: { i }, shard: 2 })),
    { schema },
  );
  await enqueue(pool, 't', { future: true }, { schema, delay: 3600_000, shard: 2 });
  const first = await discover(pool, storageFor(schema), null, 20);
  assert.equal(first.length, 20);
  const seqs = first.map((c) => Number(c.laneSeq));
  assert.deepEqual(
    seqs,
    [...seqs].sort((a, b) => a - b),
  );
  await claim(pool, claimParams(schema, [first[0]!.laneId], 5, TERMS));
  const after = await discover(pool, storageFor(schema), null, 20);
  assert.equal(after.length, 20);
  assert.ok(Number(after[0]!.laneSeq) > Number(first[4]!.laneSeq), 'leased entries are not rediscovered');
  const other = await discover(pool, storageFor(schema), ['nope'], 20);
  assert.equal(other.length, 0, 'queue filter');
});

test('priority: a lower number is discovered and claimed first', async () => {
  await reset();
  await enqueue(pool, 't', { p: 5 }, { schema, priority: 5 });
  await enqueue(pool, 't', { p: -1 }, { schema, priority: -1 });
  const cands = await discover(pool, storageFor(schema), null, 20);
  const got = await claim(pool, claimParams(schema, [...new Set(cands.map((c) => c.laneId))], 1, TERMS));
  assert.deepEqual(got[0]!.payload, { p: -1 });
});

test('SKIP LOCKED: two claimers handed the same candidates take different entries', () =>
  forEachStatement(async (claim) => {
    await reset();
    for (let shard = 0; shard < 4; shard++) {
      await enqueueMany(
        pool,
        Array.from({ length: 5 }, (_, i) => ({ type: 't', payload: { i }, shard })),
        { schema },
      );
    }
    const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
    // Hold one lane locked as a concurrent claimer would, mid-statement.
    const holder = await pool.connect();
    await holder.query('BEGIN');
    await holder.query(`SELECT 1 FROM "${schema}".lanes WHERE lane_id = $1 FOR UPDATE`, [lanes[0]]);
    const got = await claim(pool, claimParams(schema, lanes, 4, TERMS));
    assert.equal(got.length, 4);
    assert.ok(
      got.every((t) => t.laneId !== lanes[0]),
      'the locked lane is skipped, not waited on',
    );
    await holder.query('ROLLBACK');
    holder.release();
    // Many concurrent claimers over the same candidates never lease one entry twice.
    await reset();
    for (let shard = 0; shard < 8; shard++) {
      await enqueueMany(
        pool,
        Array.from({ length: 50 }, (_, i) => ({ type: 't', payload: { i }, shard })),
        { schema },
      );
    }
    const all = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
    const claimed: string[] = [];
    for (let round = 0; round < 20; round++) {
      const batches = await Promise.all(
        Array.from({ length: 6 }, () => claim(pool, claimParams(schema, all, 4, TERMS))),
      );
      for (const b of batches) claimed.push(...b.map((t) => t.id));
    }
    assert.equal(new Set(claimed).size, claimed.length, 'no entry leased twice');
    assert.equal(await leaseCount(), claimed.length);
  }));

test('the claim stamps a random token and expiry = db now() + ceiling + margin', () =>
  forEachStatement(async (claim, label) => {
    await reset();
    // One lane for the one-lane statement (it leases from one), two for the other (one range each).
    await enqueue(pool, 't', {}, { schema, shard: 0 });
    await enqueue(pool, 'unknown_type', {}, { schema, shard: label === STATEMENTS[0]![0] ? 0 : 1 });
    const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
    const got = await claim(pool, claimParams(schema, lanes, 2, TERMS));
    assert.equal(got.length, 2);
    const rows = await pool.query(
      `SELECT type, token::text, extract(epoch FROM expires_at - claimed_at)::float8 AS secs, attempt FROM "${schema}".leased_entries ORDER BY type`,
    );
    const byType = Object.fromEntries(rows.rows.map((r) => [r.type, r]));
    assert.equal(byType.t.secs, 90, 'ceiling 60 s + margin 30 s');
    assert.equal(byType.unknown_type.secs, 330, 'default ceiling 300 s + margin');
    // One claim leases one range per lane: entries of one lane share the range's token.
    const sameLane = got[0]!.laneId === got[1]!.laneId;
    assert.equal(byType.t.token === byType.unknown_type.token, sameLane);
    assert.match(byType.t.token, /^[0-9a-f-]{36}$/);
    assert.equal(byType.t.attempt, 1, 'attempts are counted at claim');
    const t = got.find((x) => x.type === 't')!;
    const dbExpiry = await pool.query(
      `SELECT (extract(epoch FROM expires_at) * 1000)::float8 AS ms FROM "${schema}".leased_entries WHERE token = $1 AND id = $2`,
      [t.token, t.id],
    );
    assert.equal(t.leaseExpiresAt, dbExpiry.rows[0].ms, 'the deadline is derived from the returned database stamp');
  }));

test('a claim that fills every requested slot re-signals the wake channel; a short one does not', () =>
  forEachStatement(async (claim) => {
    await reset();
    const pg = (await import('pg')).default;
    const l = new pg.Client({ connectionString: (await import('./helpers.js')).DATABASE_URL });
    await l.connect();
    const got: string[] = [];
    l.on('notification', (m) => got.push(m.payload ?? ''));
    const channel = wakeChannel(schema);
    await l.query(`LISTEN "${channel}"`);
    // Notifications reach a listener in commit order: once a marker sent after a statement has
    // arrived, everything that statement signalled has arrived too (no fixed sleep).
    let markers = 0;
    const signalledBy = async (statement: () => Promise<unknown>): Promise<number> => {
      got.length = 0;
      await statement();
      const marker = `marker-${++markers}`;
      await pool.query('SELECT pg_notify($1, $2)', [channel, marker]);
      await waitFor(() => got.includes(marker), 10_000, marker);
      return got.filter((p) => !p.startsWith('marker-')).length;
    };
    await signalledBy(() =>
      enqueueMany(
        pool,
        Array.from({ length: 3 }, () => ({ type: 't', payload: {} })),
        { schema },
      ),
    );
    const lanes = [...new Set((await discover(pool, storageFor(schema), null, 20)).map((c) => c.laneId))];
    assert.equal(
      await signalledBy(() => claim(pool, claimParams(schema, lanes, 2, TERMS))),
      1,
      'full claim re-signals',
    );
    assert.equal(await signalledBy(() => claim(pool, claimParams(schema, lanes, 5, TERMS))), 0, 'short claim does not');
    await l.end();
  }));

test('the cursor never passes an unleased entry: a claim that began before an append it then sees leases a prefix of the lane', () =>
  forEachStatement(async (claim) => {
    await reset();
    const s = `"${schema}"`;
    const lane = (
      await pool.query<{ id: number }>(`SELECT ${s}.provision_lane('default', 0::smallint, 9::smallint) AS id`)
    ).rows[0]!.id;
    // A claim's now() is its transaction's start, but its snapshot is taken when it executes.
    // Anything that delays it in between (a CPU stall under load; here, as in the ring's prune, an
    // ACCESS EXCLUSIVE lock on a ring partition, which the claim's plan must lock) lets entries
    // appended meanwhile be visible to it with a run_at later than its now().
    const ring = await pool.query<{ current_slot: number; slot_count: number }>(
      `SELECT current_slot, slot_count FROM ${s}.ring_state`,
    );
    const other = (ring.rows[0]!.current_slot + 1) % ring.rows[0]!.slot_count;
    const blocker = await pool.connect();
    const claimer = await pool.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`LOCK TABLE ${s}."ready_${other}" IN ACCESS EXCLUSIVE MODE`);
      const claimerPid = (await claimer.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      const pending = claim(claimer, claimParams(schema, [lane], 10, TERMS));
      const claimStart = await waitFor(
        async () => {
          const r = await pool.query<{ xact_start: Date }>(
            `SELECT a.xact_start FROM pg_stat_activity a
          WHERE a.pid = $1 AND EXISTS (SELECT 1 FROM pg_locks k WHERE k.pid = a.pid AND NOT k.granted)`,
            [claimerPid],
          );
          return r.rows[0]?.xact_start;
        },
        20_000,
        'the claim to wait for the ring partition lock',
      );
      // X: due now (run_at = the producer's now(), after the claim's now()). Y: appended after X,
      // with a runAt in the past, as an enqueue with an old runAt or a promotion of a row that
      // came due long ago (a backlog after a leader change) appends it.
      const [x] = await enqueueMany(pool, [{ type: 't', payload: { n: 'x' }, shard: 9 }], { schema });
      const [y] = await enqueueMany(
        pool,
        [{ type: 't', payload: { n: 'y' }, shard: 9, runAt: new Date(Date.now() - 60_000) }],
        { schema },
      );
      const entries = await pool.query<{ id: string; lane_seq: string; late: boolean }>(
        // On the current segment only: planning a read of every partition would queue behind the lock too.
        `SELECT r.id::text, r.lane_seq::text AS seq, r.run_at > $2 AS late FROM ${s}.ready r
        WHERE r.lane_id = $1 AND r.slot = $3 ORDER BY r.lane_seq`,
        [lane, claimStart, ring.rows[0]!.current_slot],
      );
      assert.deepEqual(
        entries.rows.map((r) => [r.id, r.late]),
        [
          [x!.id, true],
          [y!.id, false],
        ],
        'X precedes Y in the lane, and only X is later than the claim began',
      );
      await blocker.query('COMMIT');
      const first = await pending;
      // The invariant itself: no entry at or below the lane's cursor without a lease.
      const stranded = await pool.query<{ id: string }>(
        `SELECT r.id::text FROM ${s}.ready r
        WHERE r.lane_id = $1
          AND r.lane_seq <= (SELECT max(le.to_seq) FROM ${s}.range_leases le WHERE le.lane_id = $1)
          AND NOT EXISTS (SELECT 1 FROM ${s}.leased_entries le
                           WHERE le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot)
          AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                           WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)`,
        [lane],
      );
      assert.deepEqual(
        stranded.rows,
        [],
        `the claim (it leased ${JSON.stringify(first.map((t) => t.id))}) left the cursor past an unleased entry`,
      );
      assert.deepEqual(
        first.map((t) => t.id),
        [],
        'the lane stops at X, not due by the now() of the claim: nothing behind it is leased',
      );
      // The lane's next claim (a later now()) takes both, in lane order.
      const second = await claim(pool, claimParams(schema, [lane], 10, TERMS));
      assert.deepEqual(
        second.map((t) => t.id),
        [x!.id, y!.id],
      );
    } finally {
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
      claimer.release();
    }
  }));

test('the claim commits asynchronously, and only its own transaction (synchronous_commit off, local)', () =>
  forEachStatement(async (claim) => {
    await reset();
    await enqueue(pool, 't', { i: 1 }, { schema, shard: 0 });
    const lanes = (await pool.query(`SELECT lane_id FROM "${schema}".lanes`)).rows.map((r) => r.lane_id as number);
    const client = await pool.connect();
    try {
      // The session's own setting (a test cluster may run with it off server-wide).
      await client.query('SET synchronous_commit = on');
      await client.query('BEGIN');
      const got = await claim(client, claimParams(schema, lanes, 1, TERMS));
      assert.equal(got.length, 1);
      // Inside the claim's transaction the setting is off, so its commit does not wait for the flush.
      assert.equal((await client.query(`SELECT current_setting('synchronous_commit') AS v`)).rows[0].v, 'off');
      await client.query('COMMIT');
      // After it, the session is as it was: settlements on this connection still commit synchronously.
      assert.equal((await client.query(`SELECT current_setting('synchronous_commit') AS v`)).rows[0].v, 'on');
      // Autocommit, as the worker runs it: the same, and the lease is there.
      await enqueue(pool, 't', { i: 2 }, { schema, shard: 0 });
      assert.equal((await claim(client, claimParams(schema, lanes, 1, TERMS))).length, 1);
      assert.equal((await client.query(`SELECT current_setting('synchronous_commit') AS v`)).rows[0].v, 'on');
      assert.equal(await leaseCount(), 2);
    } finally {
      await client.query('RESET synchronous_commit');
      client.release();
    }
  }));

test('ids and lane positions past 2^53 come back exact (int8 travels as text in the claim)', () =>
  forEachStatement(async (claim) => {
    await reset();
    await pool.query(`ALTER SEQUENCE "${schema}".task_id_seq RESTART WITH 9007199254740993`);
    try {
      await enqueueMany(
        pool,
        [1, 2].map((i) => ({ type: 't', payload: { i }, shard: 30 })),
        { schema },
      );
      const lane = (await pool.query(`SELECT lane_id FROM "${schema}".lanes WHERE shard = 30`)).rows[0]
        .lane_id as number;
      // The lane's own sequence too: every entry appended next sits past 2^53.
      await pool.query(`TRUNCATE "${schema}".ready`);
      await pool.query(`ALTER SEQUENCE "${schema}".lane_seq_${lane} RESTART WITH 9007199254740995`);
      await pool.query(`ALTER SEQUENCE "${schema}".task_id_seq RESTART WITH 9007199254740997`);
      await enqueueMany(
        pool,
        [3, 4].map((i) => ({ type: 't', payload: { i }, shard: 30 })),
        { schema },
      );
      const got = await claim(pool, claimParams(schema, [lane], 2, TERMS));
      assert.deepEqual(
        got.map((t) => [t.id, t.laneSeq, t.payload]),
        [
          ['9007199254740997', '9007199254740995', { i: 3 }],
          ['9007199254740998', '9007199254740996', { i: 4 }],
        ],
      );
      const stored = await pool.query(`SELECT id::text, lane_seq::text FROM "${schema}".ready ORDER BY lane_seq`);
      assert.deepEqual(
        stored.rows.map((r) => [r.id, r.lane_seq]),
        got.map((t) => [t.id, t.laneSeq]),
      );
    } finally {
      await pool.query(`ALTER SEQUENCE "${schema}".task_id_seq RESTART WITH 1000000`);
    }
  }));

test('the segment test stops a lane’s prefix: a lane whose entries read segments B, A, B is leased B, then A, then B', () =>
  forEachStatement(async (claim, label) => {
    for (const windowed of [false, true]) {
      await reset();
      const tasks = await enqueueMany(
        pool,
        [0, 1, 2].map((i) => ({ type: 't', payload: { i }, shard: 9 })),
        { schema },
      );
      // Appends never write this order (migration 18); a bug that did would have the claim lease
      // B..B as one range and its cursor pass A for good. Made by hand: the first and the last
      // entry moved to segment 1, the middle one left in segment 0.
      await pool.query(`UPDATE "${schema}".ready SET slot = 1 WHERE id = ANY ($1::bigint[])`, [
        [tasks[0]!.id, tasks[2]!.id],
      ]);
      const lane = (await pool.query(`SELECT lane_id FROM "${schema}".ready WHERE id = $1`, [tasks[0]!.id])).rows[0]
        .lane_id;
      const window = windowed ? await readRingWindow(pool, storageFor(schema)) : undefined;
      if (window) assert.deepEqual(window.segments, [0, 1]);
      const order: number[] = [];
      for (let round = 0; round < 3; round++) {
        const got = await claim(pool, claimParams(schema, [lane], 10, { ...TERMS, window }));
        assert.equal(got.length, 1, `${label}, ${windowed ? 'in a window' : 'whole ring'}: one entry a claim`);
        order.push((got[0]!.payload as { i: number }).i);
      }
      assert.deepEqual(order, [0, 1, 2], 'in lane order, none passed');
      assert.equal((await claim(pool, claimParams(schema, [lane], 10, { ...TERMS, window }))).length, 0);
      const ranges = await pool.query(
        `SELECT slot, from_seq::int AS f, to_seq::int AS t, n FROM "${schema}".range_leases ORDER BY from_seq`,
      );
      assert.deepEqual(
        ranges.rows.map((r) => [r.slot, r.t - r.f + 1, r.n]),
        [
          [1, 1, 1],
          [0, 1, 1],
          [1, 1, 1],
        ],
        'one range per segment run, none spanning another segment’s entry',
      );
    }
  }));
