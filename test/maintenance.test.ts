import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineTask, enqueueMany, Worker, getTask } from '../src/index.js';
import {
  promoteDueLanes,
  promoteDue,
  rescueLapsedLeases,
  pruneSegment,
  rotateRing,
  readRingState,
  maintainRing,
} from '../src/maintenance-api.js';
import { claim } from '../src/processor/claim.js';
import { completeLeases } from '../src/storage/complete.js';
import { claimParams } from './claim-params.js';
import { schemaLockKey } from '../src/storage/locks.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, leaseLapsed, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('maint');
const S = `"${schema}"`;

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe`,
  );
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0, rotated_at = now()`);
}

async function claimAll(limit: number, ceilingMs = 60_000) {
  const lanes = (await pool.query(`SELECT lane_id FROM ${S}.lanes`)).rows.map((r) => r.lane_id as number);
  return claim(pool, claimParams(schema, lanes, limit, { defaultCeilingMs: ceilingMs, workerId: 'm' }));
}

test('promotion run by many processes at once moves every due row exactly once', async () => {
  await reset();
  const tasks = Array.from({ length: 2000 }, (_, i) => ({ type: 'm', payload: { i }, shard: i % 5, delay: 60_000 }));
  await enqueueMany(pool, tasks, { schema });
  await pool.query(`UPDATE ${S}.deferred SET run_at = run_at - interval '1 hour'`);
  await Promise.all(
    Array.from({ length: 6 }, async () => {
      for (;;) {
        const r = await promoteDueLanes(pool, schema, null, 150, null);
        if (r.selected === 0) return;
      }
    }),
  );
  const counts = await pool.query(
    `SELECT (SELECT count(*) FROM ${S}.deferred) AS deferred, (SELECT count(*) FROM ${S}.ready) AS ready, (SELECT count(DISTINCT id) FROM ${S}.ready) AS ids`,
  );
  assert.deepEqual(counts.rows[0], { deferred: '0', ready: '2000', ids: '2000' });
});

test('promoted rows of a lane take lane sequence numbers in due order (ids in the opposite order)', async () => {
  await reset();
  // Task ids ascend while due times descend.
  const tasks = Array.from({ length: 300 }, (_, i) => ({
    type: 'm',
    payload: { i },
    shard: i % 3,
    runAt: new Date(Date.now() + 3600_000 + (300 - i) * 1000),
  }));
  await enqueueMany(pool, tasks, { schema });
  await pool.query(`UPDATE ${S}.deferred SET run_at = run_at - interval '2 hours'`);
  for (;;) {
    const r = await promoteDueLanes(pool, schema, null, 40, null);
    if (r.selected === 0) break;
  }
  const disorder = await pool.query(
    `SELECT count(*) AS n FROM (SELECT run_at < lag(run_at) OVER (PARTITION BY lane_id ORDER BY lane_seq) AS back FROM ${S}.ready) x WHERE back`,
  );
  assert.equal((await pool.query(`SELECT count(*) FROM ${S}.ready`)).rows[0].count, '300');
  assert.equal(disorder.rows[0].n, '0');
});

test('promoteDueLanes: a contended lane stays deferred and is reported, other lanes go ahead; skip leaves a lane out', async () => {
  await reset();
  await enqueueMany(
    pool,
    [
      { type: 'm', payload: {}, queue: 'hot', shard: 0, delay: 60_000 },
      { type: 'm', payload: {}, queue: 'cold', shard: 0, delay: 60_000 },
    ],
    { schema },
  );
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 s'`);
  await promoteDue(pool, schema).catch(() => 0); // provisions lanes (promotes both)
  await reset();
  await enqueueMany(
    pool,
    [
      { type: 'm', payload: { q: 'hot' }, queue: 'hot', shard: 0, delay: 60_000 },
      { type: 'm', payload: { q: 'cold' }, queue: 'cold', shard: 0, delay: 60_000 },
    ],
    { schema },
  );
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 s'`);
  const hotLane = (await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = 'hot' AND shard = 0`)).rows[0]
    .lane_id;
  const holder = await pool.connect();
  await holder.query('BEGIN');
  await holder.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), hotLane]);
  const r = await promoteDueLanes(pool, schema, null, 100, 50);
  assert.equal(r.promoted, 1);
  assert.deepEqual(r.contended, [{ queue: 'hot', priority: 0, shard: 0 }]);
  assert.equal((await pool.query(`SELECT count(*) FROM ${S}.deferred WHERE queue = 'hot'`)).rows[0].count, '1');
  const skipped = await promoteDueLanes(pool, schema, null, 100, 50, [{ queue: 'hot', priority: 0, shard: 0 }]);
  assert.equal(skipped.selected, 0);
  assert.deepEqual(skipped.contended, []);
  await holder.query('COMMIT');
  holder.release();
  assert.equal((await promoteDueLanes(pool, schema, null, 100, 50)).promoted, 1);
});

test('rescue run by many processes at once rescues each lapsed lease once', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 300 }, (_, i) => ({ type: 'm', payload: { i } })),
    { schema },
  );
  const got = await claimAll(300, 1);
  assert.equal(got.length, 300);
  await leaseLapsed(pool, Math.max(...got.map((t) => t.leaseExpiresAt)));
  const results = await Promise.all(Array.from({ length: 6 }, () => rescueLapsedLeases(pool, schema, 100)));
  let more = results.reduce((n, r) => n + r.retried, 0);
  while (more < 300) {
    const r = await rescueLapsedLeases(pool, schema, 100);
    if (r.retried === 0) break;
    more += r.retried;
  }
  assert.equal(more, 300);
  assert.equal((await pool.query(`SELECT count(*) FROM ${S}.deferred`)).rows[0].count, '300');
  assert.equal(
    (
      await pool.query(
        `SELECT coalesce(sum(n), 0)::text AS count FROM ${S}.range_settlements WHERE outcome = 'rescued'`,
      )
    ).rows[0].count,
    '300',
  );
});

test('ring: rotation seals a segment; prune truncates it only when nothing is claimable or in flight', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 10 }, () => ({ type: 'm', payload: {} })),
    { schema },
  );
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  const st = await readRingState(pool, schema);
  assert.equal(st.currentSegment, 1);
  assert.equal(await rotateRing(pool, schema, 0), 'empty', 'an empty current segment is not rotated');
  assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'skipped', reason: 'claimable' });
  const leased = await claimAll(10);
  assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'skipped', reason: 'in_flight' });
  await completeLeases(pool, storageFor(schema), leased.slice(0, 9));
  assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'skipped', reason: 'in_flight' });
  // A transaction using the segment blocks the prune (reported, not waited on).
  const reader = await pool.connect();
  await reader.query('BEGIN');
  await reader.query(`SELECT count(*) FROM ${S}.ready_0`);
  await completeLeases(pool, storageFor(schema), leased.slice(9));
  assert.deepEqual(await pruneSegment(pool, schema, 0, 50), { segment: 0, result: 'blocked', reason: 'lock_timeout' });
  await reader.query('COMMIT');
  reader.release();
  assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'pruned' });
  assert.equal((await pool.query(`SELECT count(*) FROM ${S}.ready_0`)).rows[0].count, '0');
  assert.equal((await pool.query(`SELECT count(*) FROM ${S}.range_leases_0`)).rows[0].count, '0');
  assert.deepEqual(await pruneSegment(pool, schema, 1, 100), { segment: 1, result: 'skipped', reason: 'current' });
});

test('prune truncates the partitions of the segment with pages, a dead row too, and leaves the never-written ones as they are', async () => {
  await reset();
  await enqueueMany(
    pool,
    Array.from({ length: 4 }, (_, i) => ({ type: 'm', payload: { i } })),
    { schema },
  );
  // A rolled-back insert leaves a dead row, and a page, in tombstones_0 (no live tombstone).
  const tx = await pool.connect();
  await tx.query('BEGIN');
  await tx.query(`INSERT INTO ${S}.tombstones (slot, lane_id, lane_seq, id, reason)
                  SELECT slot, lane_id, lane_seq, id, 'test' FROM ${S}.ready_0 LIMIT 1`);
  await tx.query('ROLLBACK');
  tx.release();
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await completeLeases(pool, storageFor(schema), await claimAll(4));
  // A segment is these four partitions (since migration 22: the per-task leases_0 and
  // settlements_0 of berth before migration 8 are no longer part of it; see the next test).
  const partitions = ['ready', 'range_leases', 'range_settlements', 'tombstones'];
  const files = async () => {
    const r = await pool.query<{ t: string; file: string; size: string }>(
      `SELECT t, pg_relation_filenode(format('%I.%I', $1::text, t || '_0')::regclass)::text AS file,
              pg_relation_size(format('%I.%I', $1::text, t || '_0')::regclass)::text AS size
         FROM unnest($2::text[]) t`,
      [schema, partitions],
    );
    return new Map(r.rows.map((x) => [x.t, x]));
  };
  const before = await files();
  for (const t of partitions) assert.notEqual(before.get(t)!.size, '0', `${t}_0 has a page`);
  assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'pruned' });
  const after = await files();
  for (const t of partitions) assert.equal(after.get(t)!.size, '0', `${t}_0 holds nothing, live or dead`);
  for (const t of partitions) assert.notEqual(after.get(t)!.file, before.get(t)!.file, `${t}_0 was truncated`);
  // The segment takes entries again after the ring comes round, and they are claimed.
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0`);
  await enqueueMany(pool, [{ type: 'm', payload: { again: true } }], { schema });
  assert.equal((await claimAll(10)).length, 1);
  // Segment 1 now: its entry settled, tombstones_1 never written. Its prune leaves that one as it is.
  const tombstones1 = `SELECT pg_relation_filenode('${S}."tombstones_1"')::text AS file`;
  const tombstonesBefore = (await pool.query(tombstones1)).rows[0].file;
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 1`);
  await enqueueMany(pool, [{ type: 'm', payload: { one: true } }], { schema });
  await completeLeases(pool, storageFor(schema), await claimAll(10));
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 2`);
  assert.deepEqual(await pruneSegment(pool, schema, 1, 100), { segment: 1, result: 'pruned' });
  assert.equal(
    (await pool.query(tombstones1)).rows[0].file,
    tombstonesBefore,
    'tombstones_1, empty, was left as it was',
  );
});

test('prune locks and truncates a segment’s four partitions only: a reader of the per-task leases_0 and settlements_0 (kept by migration 22, read by nothing) holds no prune up', async () => {
  await reset();
  await enqueueMany(pool, [{ type: 'm', payload: {} }], { schema });
  assert.equal(await rotateRing(pool, schema, 0), 'rotated');
  await completeLeases(pool, storageFor(schema), await claimAll(1));
  const reader = await pool.connect();
  try {
    await reader.query('BEGIN');
    await reader.query(`SELECT (SELECT count(*) FROM ${S}."leases_0") + (SELECT count(*) FROM ${S}."settlements_0")`);
    // Until migration 22 the prune's LOCK named both: it waited its lock timeout and said blocked.
    assert.deepEqual(await pruneSegment(pool, schema, 0, 100), { segment: 0, result: 'pruned' });
  } finally {
    await reader.query('ROLLBACK');
    reader.release();
  }
});

test('ring: a small segment is sealed at ringRotateSmallAfterMs, one of 4 MiB at ringRotateAfterMs', async () => {
  await reset();
  const opts = { rotateAfterMs: 5_000, rotateSmallAfterMs: 60_000, lockTimeoutMs: 100 };
  const ageBy = (ms: number) =>
    pool.query(`UPDATE ${S}.ring_state SET rotated_at = now() - $1 * interval '1 ms'`, [ms]);
  await enqueueMany(
    pool,
    Array.from({ length: 10 }, (_, i) => ({ type: 'm', payload: { i } })),
    { schema },
  );
  await ageBy(10_000);
  assert.equal((await maintainRing(pool, schema, opts)).rotation, 'not_due', 'small and younger than a minute');
  await ageBy(61_000);
  assert.equal((await maintainRing(pool, schema, opts)).rotation, 'rotated', 'small, but a minute old');
  // ~1.5 kB entries (below the TOAST threshold, so in the partition itself): 3,000 of them pass 4 MiB.
  const { SMALL_SEGMENT_BYTES } = await import('../src/maintenance/ring.js');
  const pad = 'x'.repeat(1_500);
  for (let k = 0; k < 3; k++)
    await enqueueMany(
      pool,
      Array.from({ length: 1_000 }, (_, i) => ({ type: 'm', payload: { i, pad } })),
      { schema },
    );
  const size = await pool.query(`SELECT pg_relation_size(format('%I.%I', $1::text, 'ready_1')::regclass) AS b`, [
    schema,
  ]);
  assert.ok(Number(size.rows[0].b) >= SMALL_SEGMENT_BYTES, `segment 1 holds ${size.rows[0].b} bytes`);
  await ageBy(1_000);
  assert.equal((await maintainRing(pool, schema, opts)).rotation, 'not_due', 'younger than ringRotateAfterMs');
  await ageBy(6_000);
  assert.equal((await maintainRing(pool, schema, opts)).rotation, 'rotated', 'full and 5 s old');
  // Without rotateSmallAfterMs the size does not matter (the API's behaviour before).
  await enqueueMany(pool, [{ type: 'm', payload: {} }], { schema });
  await ageBy(6_000);
  assert.equal((await maintainRing(pool, schema, { rotateAfterMs: 5_000, lockTimeoutMs: 100 })).rotation, 'rotated');
});

test('ring wrap: a task enqueued after the claim cursor history was truncated is still claimed', async () => {
  await reset();
  for (let round = 0; round < 20; round++) {
    await enqueueMany(
      pool,
      Array.from({ length: 5 }, (_, i) => ({ type: 'm', payload: { round, i }, shard: 0 })),
      { schema },
    );
    const got = await claimAll(5);
    assert.equal(got.length, 5, `round ${round}`);
    await completeLeases(pool, storageFor(schema), got);
    await maintainRing(pool, schema, { rotateAfterMs: 0, lockTimeoutMs: 100 });
  }
  const st = await readRingState(pool, schema);
  assert.ok(st.generation >= 16, 'wrapped the 16-segment ring');
});

test('prune run aggressively under load never loses a task', async () => {
  await reset();
  const seen = new Map<number, number>();
  const def = defineTask<{ i: number }>({
    type: 'm_load',
    ceilingMs: 10_000,
    handler: async (p) => {
      seen.set(p.i, (seen.get(p.i) ?? 0) + 1);
      await new Promise((r) => setTimeout(r, Math.random() * 3));
    },
  });
  const { logger } = captureLogger();
  const workers = [0, 1].map(
    () =>
      new Worker({
        connectionString: DATABASE_URL,
        schema,
        tasks: [def],
        slots: 8,
        pollIntervalMs: 50,
        logger,
        maintenance: {
          ...FAST_MAINTENANCE,
          ringIntervalMs: 10,
          ringRotateAfterMs: 20,
          ringRotateSmallAfterMs: 20,
          ringLockTimeoutMs: 20,
        },
      }),
  );
  await Promise.all(workers.map((w) => w.start()));
  try {
    const N = 3000;
    for (let b = 0; b < 30; b++) {
      await enqueueMany(
        pool,
        Array.from({ length: N / 30 }, (_, k) => ({ type: 'm_load', payload: { i: b * (N / 30) + k } })),
        { schema },
      );
      await new Promise((r) => setTimeout(r, 10));
    }
    await waitFor(() => seen.size === N, 60_000, 'every task ran');
    const completed = await pool.query(
      `SELECT coalesce(sum(n), 0)::text AS count FROM ${S}.range_settlements WHERE outcome = 'completed'`,
    );
    const gen = await readRingState(pool, schema);
    assert.ok(gen.generation > 5, `the ring rotated under load (${gen.generation})`);
    assert.ok(
      [...seen.values()].every((n) => n === 1),
      'no task ran twice',
    );
    assert.ok(Number(completed.rows[0].count) <= N);
  } finally {
    await Promise.all(workers.map((w) => w.stop()));
  }
});

test('exactly one maintenance leader; when it stops another takes over within seconds', async () => {
  await reset();
  const { logger } = captureLogger();
  const ws = [0, 1, 2].map(
    () =>
      new Worker({
        connectionString: DATABASE_URL,
        schema,
        tasks: [],
        queues: ['served'],
        logger,
        maintenance: FAST_MAINTENANCE,
      }),
  );
  await Promise.all(ws.map((w) => w.start()));
  try {
    await waitFor(() => ws.filter((w) => w.isLeader).length === 1, 10_000, 'a leader');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(ws.filter((w) => w.isLeader).length, 1, 'never two');
    const leader = ws.find((w) => w.isLeader)!;
    await waitFor(
      async () => /berth_task_oldest_due_seconds \d/.test(await leader.metrics.registry.metrics()),
      10_000,
      'leader gauges',
    );
    await leader.stop();
    const after = await leader.metrics.registry.metrics();
    assert.match(
      after,
      /^berth_task_oldest_due_seconds 0$/m,
      'a former leader exports no stale oldest-due (max() ignores its 0)',
    );
    assert.doesNotMatch(after, /^berth_tasks_pending\{/m, 'nor per-type series');
    const rest = ws.filter((w) => w !== leader);
    await waitFor(() => rest.filter((w) => w.isLeader).length === 1, 10_000, 'a new leader');
    // The new leader promotes: a due deferred task reaches the ring.
    const [r] = await enqueueMany(pool, [{ type: 'm', payload: {}, delay: 1 }], { schema });
    await waitFor(
      async () => (await getTask(pool, schema, r!.id!))?.state === 'ready',
      10_000,
      'promotion by the new leader',
    );
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
  }
});

test('gauges: pending includes running; running is a live lease; dead; oldest due; running exports nothing when idle', async () => {
  await reset();
  const { readGauges } = await import('../src/maintenance-api.js');
  const { publishGauges } = await import('../src/maintenance/gauges.js');
  const { BerthMetrics } = await import('../src/metrics/catalogue.js');
  await enqueueMany(
    pool,
    Array.from({ length: 5 }, () => ({ type: 'g', payload: {} })),
    { schema },
  );
  await enqueueMany(pool, [{ type: 'g', payload: {}, delay: 3600_000 }], { schema });
  const aged = performance.now();
  await pool.query(`UPDATE ${S}.ready SET run_at = now() - interval '42 seconds'`);
  const idle = new BerthMetrics();
  publishGauges(idle, await readGauges(pool, schema));
  const text0 = await idle.registry.metrics();
  assert.doesNotMatch(text0, /^berth_tasks_running\{/m, 'no series while nothing runs (hence `or vector(0)`)');
  await claimAll(2);
  const g = await readGauges(pool, schema);
  assert.equal(g.pending.get('g'), 6, '5 ready-or-running + 1 scheduled');
  assert.equal(g.running.get('g'), 2);
  // 42 s when aged, plus however long the machine took since (measured, not assumed).
  const since = (performance.now() - aged) / 1000;
  assert.ok(
    g.oldestDueSeconds >= 41 && g.oldestDueSeconds <= 43 + since,
    `oldest due ${g.oldestDueSeconds} (${since} s after aging)`,
  );
  const m = new BerthMetrics();
  publishGauges(m, g);
  const text = await m.registry.metrics();
  assert.match(text, /berth_tasks_running\{task_type="g"\} 2/);
  assert.match(text, /berth_tasks_pending\{task_type="g"\} 6/);
  // The published value is the snapshot's (41 s or more: the machine may be slow to get here).
  assert.ok(text.includes(`berth_task_oldest_due_seconds ${g.oldestDueSeconds}\n`), text);
});

test('a new leader starts promotion at once and rescue and the ring a second and half a promotion tick in; gauges, retention and history rotation one interval later', async () => {
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [],
    queues: ['first-runs'],
    logger: captureLogger().logger,
    maintenance: {
      ...FAST_MAINTENANCE,
      // Longer than this test can take: their first run must not have come yet.
      gaugeIntervalMs: 600_000,
      retentionIntervalMs: 600_000,
      historyIntervalMs: 600_000,
    },
  });
  await w.start();
  try {
    await waitFor(
      () => ['promote', 'rescue', 'ring'].every((b) => (w.maintenanceStats()[b]?.runs ?? 0) >= 2),
      30_000,
      'the task-moving branches running',
    );
    for (const b of ['gauges', 'retention', 'history']) {
      assert.equal(w.maintenanceStats()[b]?.runs ?? 0, 0, `${b} waits out its first interval`);
    }
  } finally {
    await w.stop();
  }
  const soon = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [],
    queues: ['first-runs'],
    logger: captureLogger().logger,
    maintenance: { ...FAST_MAINTENANCE, gaugeIntervalMs: 100, retentionIntervalMs: 100, historyIntervalMs: 100 },
  });
  await soon.start();
  try {
    await waitFor(
      () => ['gauges', 'retention', 'history'].every((b) => (soon.maintenanceStats()[b]?.runs ?? 0) >= 1),
      30_000,
      'each after its (short) interval',
    );
  } finally {
    await soon.stop();
  }
});

test('bookkeeping branches first run an interval into a term, the gauges half an interval out of step with rescue', async () => {
  const {
    firstRunAfterMs,
    settledStartMs,
    GAUGE_PHASE,
    MAINTENANCE_DEFAULTS: d,
  } = await import('../src/maintenance/leader.js');
  assert.equal(firstRunAfterMs(5000), 5000);
  assert.equal(firstRunAfterMs(3600_000), 60_000, 'capped at a minute');
  // Rescue and the ring a second into a term (their interval, if shorter), promotion at once.
  assert.equal(settledStartMs(d.rescueIntervalMs), 1000);
  assert.equal(settledStartMs(d.ringIntervalMs), 1000);
  assert.equal(settledStartMs(100), 100, 'a short interval starts within it');
  // Rescue runs at 1, 6, 11 s …; the gauges (same interval) at 8.5, 13.5 s …: never together.
  assert.equal(d.rescueIntervalMs, d.gaugeIntervalMs);
  const rescueAt = settledStartMs(d.rescueIntervalMs);
  const gaugesAt = rescueAt + firstRunAfterMs(d.gaugeIntervalMs, GAUGE_PHASE);
  for (let k = 0; k < 10; k++) {
    const offset = (gaugesAt + k * d.gaugeIntervalMs - rescueAt) % d.rescueIntervalMs;
    assert.equal(Math.min(offset, d.rescueIntervalMs - offset), d.rescueIntervalMs / 2);
  }
});

test("the settled branches' first runs come half a promotion tick after the term settles, one at a time", async () => {
  const {
    settledStartMs,
    settlePhaseMs,
    SETTLE_PHASE_MAX_MS,
    FirstTurns,
    MAINTENANCE_DEFAULTS: d,
  } = await import('../src/maintenance/leader.js');
  // Promotion, keys and deps tick at 0, 250, 500 … ms of a term, the schedules at 0, 1000 …:
  // rescue, the ring and the stale mark start at 1125 ms, between two ticks.
  const at = settledStartMs(d.rescueIntervalMs) + settlePhaseMs(d.promoteIntervalMs);
  assert.equal(at, 1125);
  assert.equal(at % d.promoteIntervalMs, d.promoteIntervalMs / 2);
  // Each turn begins once the one before it is released, in the order they were taken.
  // Capped: a long promotion tick does not postpone them by half of it.
  assert.equal(settlePhaseMs(600_000), SETTLE_PHASE_MAX_MS);
  const turns = new FirstTurns();
  const order: string[] = [];
  const long = 600_000; // a wait that never runs out in this test
  const first = await turns.take(long);
  const second = turns.take(long).then((release) => {
    order.push('second');
    release();
  });
  const third = turns.take(long).then((release) => {
    order.push('third');
    release();
  });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(order.length, 0, 'no turn while the first is held');
  order.push('first');
  first();
  await Promise.all([second, third]);
  assert.deepEqual(order, ['first', 'second', 'third']);
  // A turn held past the wait's limit is no longer waited for: the next runs beside it.
  const held = await turns.take(long);
  const next = await turns.take(20);
  next();
  held();
});

test('a branch sleeps out its interval, and a branch with a busy share (the gauges) keeps within it', async () => {
  const { branchWait } = await import('../src/maintenance/leader.js');
  assert.equal(branchWait({ intervalMs: 5000 }, 100), 4900);
  assert.equal(branchWait({ intervalMs: 5000 }, 7000), 0, 'an overrun starts again at once');
  assert.equal(branchWait({ intervalMs: 5000, busyShare: 0.05 }, 100), 4900, 'a cheap run: the interval');
  // A 1.4 s count of a 2-million-task backlog: 5 % of the time, the next run 28 s after this one began.
  assert.equal(branchWait({ intervalMs: 5000, busyShare: 0.05 }, 1400), 26_600);
});
