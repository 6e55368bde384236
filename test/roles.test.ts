import { storageFor } from '../src/storage/storage.js';
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  defineTask,
  enqueue,
  BerthInputError,
  getTask,
  grantRuntimeRole,
  leaderInfo,
  listLaneSequenceProblems,
  migrate,
  moveTask,
  Worker,
} from '../src/index.js';
import {
  maintainRing,
  promoteDueLanes,
  pruneDeadLetters,
  readGauges,
  rescueLapsedLeases,
  rotateRing,
} from '../src/maintenance-api.js';
import { claim } from '../src/processor/claim.js';
import { claimParams } from './claim-params.js';
import { LEADER_LOCK, schemaLockKey } from '../src/storage/locks.js';
import { clearOverdueLease, overdueMarks, protectOverdueLease, refreshOverdueLeases } from '../src/storage/overdue.js';
import { completeLeases } from '../src/storage/complete.js';
import { removeUnleased } from '../src/storage/remove.js';
import { cancelTasks } from '../src/storage/cancel.js';
import { pruneSnoozeCounts, snoozeLease } from '../src/storage/snooze.js';
import { pruneResults } from '../src/storage/results.js';
import { runDueTasks } from '../src/testing-api.js';
import {
  captureLogger,
  counterValue,
  DATABASE_URL,
  expectOutcome,
  FAST_MAINTENANCE,
  migrateUpTo,
  waitFor,
  urlAs,
} from './helpers.js';

// Roles are cluster-wide: every name carries the pid so parallel runs never share one.
const owner = `berth_owner_r_${process.pid}`;
const roleA = `berth_rt_a_${process.pid}`;
const roleB = `berth_rt_b_${process.pid}`;
const outsider = `berth_rt_x_${process.pid}`;
const producer = `berth_rt_p_${process.pid}`;
const producerQ = `berth_rt_q_${process.pid}`;
const roles = [roleA, roleB, outsider, producer, producerQ, owner];
const schema = `t_roles_${process.pid}`;
const S = `"${schema}"`;

const admin = new pg.Pool({ connectionString: DATABASE_URL });
await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
for (const r of roles) await admin.query(`DROP ROLE IF EXISTS "${r}"`);
for (const r of roles) await admin.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
// A non-superuser owns the schema and migrates it: the definer functions run as this role.
await admin.query(`CREATE SCHEMA ${S} AUTHORIZATION "${owner}"`);
const report = await migrate({
  connectionString: urlAs(owner),
  schema,
  runtimeRoles: [roleA],
  producerRoles: [producer],
});
await grantRuntimeRole({ connectionString: urlAs(owner), schema, role: roleB });
const poolA = new pg.Pool({ connectionString: urlAs(roleA), max: 4 });
const poolB = new pg.Pool({ connectionString: urlAs(roleB), max: 4 });
const poolX = new pg.Pool({ connectionString: urlAs(outsider), max: 2 });
const poolP = new pg.Pool({ connectionString: urlAs(producer), max: 2 });

after(async () => {
  await Promise.all([poolA.end(), poolB.end(), poolX.end(), poolP.end()]);
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
  for (const r of roles) {
    await admin.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS "${r}"`);
  }
  await admin.end();
});

async function laneOf(id: string): Promise<{ lane_id: number; lane_seq: string }> {
  const r = await admin.query(`SELECT lane_id, lane_seq::text AS lane_seq FROM ${S}.ready WHERE id = $1`, [id]);
  assert.equal(r.rowCount, 1, `task ${id} has one ready entry`);
  return r.rows[0];
}

/** The statement fails with insufficient_privilege (42501), whatever the message. */
async function denied(db: pg.Pool, sql: string, values: unknown[] = []): Promise<void> {
  await assert.rejects(
    db.query(sql, values),
    (err: { code?: string; message?: string }) => {
      assert.equal(err.code, '42501', `${sql}: ${err.message}`);
      return true;
    },
    sql,
  );
}

test('migrate grants runtimeRoles and producerRoles in its transaction and reports them', () => {
  assert.deepEqual(report.grantedRoles, [roleA]);
  assert.deepEqual(report.grantedProducerRoles, [producer]);
  assert.deepEqual(report.laneSequences, { repaired: [], busy: [], notPermitted: [], failed: [] });
});

test('runtime roles have no CREATE on the schema, and PUBLIC can execute no berth function', async () => {
  for (const r of [roleA, roleB, producer]) {
    const p = await admin.query(
      `SELECT has_schema_privilege($1, $2, 'CREATE') AS c, has_schema_privilege($1, $2, 'USAGE') AS u`,
      [r, schema],
    );
    assert.deepEqual(p.rows[0], { c: false, u: true }, r);
  }
  const provision = `${S}.provision_lane(text,smallint,smallint)`;
  const exec = await admin.query(
    `SELECT has_function_privilege('public', $1, 'EXECUTE') AS public_, has_function_privilege($2, $1, 'EXECUTE') AS outsider,
            has_function_privilege($3, $1, 'EXECUTE') AS a`,
    [provision, outsider, roleA],
  );
  assert.deepEqual(exec.rows[0], { public_: false, outsider: false, a: true });
  const open = await admin.query(
    `SELECT p.oid::regprocedure::text AS f FROM pg_proc p
      WHERE p.pronamespace = $1::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')`,
    [schema],
  );
  assert.deepEqual(open.rows, [], 'no berth function is executable by PUBLIC');
  const internal = await admin.query(`SELECT has_function_privilege($1, $2, 'EXECUTE') AS x`, [
    roleA,
    `${S}.append_ready(integer,bigint[],text[],jsonb[],integer[],integer[],text[],text[],timestamptz[],timestamptz[],text[])`,
  ]);
  assert.equal(internal.rows[0].x, false, 'append_ready is only called from inside the definer functions');
  const repair = await admin.query(
    `SELECT has_function_privilege($1, $2, 'EXECUTE') AS a, has_function_privilege('public', $2, 'EXECUTE') AS p`,
    [roleA, `${S}.provision_lane_sequence(integer)`],
  );
  assert.deepEqual(
    repair.rows[0],
    { a: false, p: false },
    'the lane sequence repair is for operators, not runtime roles',
  );
});

test('a role without the grant gets a clear permission error', async () => {
  await assert.rejects(enqueue(poolX, 'r', {}, { schema }), /permission denied for schema/);
  // With USAGE alone, the function itself is refused: PUBLIC's EXECUTE is revoked.
  await admin.query(`GRANT USAGE ON SCHEMA ${S} TO "${outsider}"`);
  try {
    await assert.rejects(enqueue(poolX, 'r', {}, { schema }), /permission denied for function enqueue/);
    await assert.rejects(
      poolX.query(`SELECT ${S}.provision_lane('q', 0::smallint, 0::smallint)`),
      /permission denied for function provision_lane/,
    );
  } finally {
    await admin.query(`REVOKE USAGE ON SCHEMA ${S} FROM "${outsider}"`);
  }
  await assert.rejects(
    grantRuntimeRole({ connectionString: urlAs(owner), schema, role: `no_such_role_${process.pid}` }),
    /does not exist/,
  );
});

test('role A opens a lane never seen before; role B appends to it; its sequence needs no grant', async () => {
  const queue = `fresh-${process.pid}`;
  const a = await enqueue(poolA, 'r_new', { by: 'a' }, { schema, queue, shard: 3 });
  const b = await enqueue(poolB, 'r_new', { by: 'b' }, { schema, queue, shard: 3 });
  assert.equal(a.state, 'ready');
  assert.equal(b.state, 'ready');
  const la = await laneOf(a.id!);
  const lb = await laneOf(b.id!);
  assert.equal(la.lane_id, lb.lane_id);
  assert.deepEqual([la.lane_seq, lb.lane_seq], ['1', '2']);
  const seq = `${S}."lane_seq_${la.lane_id}"`;
  const info = await admin.query(
    `SELECT pg_get_userbyid(c.relowner) AS owner, has_sequence_privilege($2, c.oid, 'USAGE') AS a,
            has_sequence_privilege($3, c.oid, 'USAGE') AS b
       FROM pg_class c WHERE c.oid = $1::regclass`,
    [seq, roleA, roleB],
  );
  assert.deepEqual(info.rows[0], { owner, a: false, b: false });
  assert.deepEqual(await listLaneSequenceProblems(admin, schema), []);
});

test('provision_lane rejects a null argument or a shard outside 0-63, and accepts any queue name and smallint priority', async () => {
  const call = (q: string | null, p: number | null, sh: number | null) =>
    poolA.query<{ id: number }>(`SELECT ${S}.provision_lane($1, $2::smallint, $3::smallint) AS id`, [q, p, sh]);
  for (const [q, p, sh] of [
    [null, 0, 0],
    ['q', null, 0],
    ['q', 0, null],
  ] as const) {
    await assert.rejects(
      call(q, p, sh),
      (err: { code?: string; message?: string }) => err.code === '22004' && /must not be null/.test(err.message ?? ''),
    );
  }
  for (const shard of [-1, 64]) {
    await assert.rejects(
      call('q', 0, shard),
      (err: { code?: string; message?: string }) => err.code === '22023' && /outside 0-63/.test(err.message ?? ''),
    );
  }
  const ids = new Set<number>();
  for (const [q, p, sh] of [
    ['', 0, 0],
    ['', -32768, 63],
    ['ünï "quoted"; drop', 32767, 0],
  ] as const) {
    const first = (await call(q, p, sh)).rows[0]!.id;
    assert.equal((await call(q, p, sh)).rows[0]!.id, first, 'provisioning is idempotent');
    ids.add(first);
  }
  assert.equal(ids.size, 3);
  const empty = await enqueue(poolB, 'r_empty', {}, { schema, queue: '', priority: -32768, shard: 63 });
  assert.equal(empty.state, 'ready');
  assert.equal((await laneOf(empty.id!)).lane_seq, '1');
});

test('B claims, fails, retries, slices and completes through a Worker whose maintenance (promotion, rescue, ring prune, gauges, retention) runs as B', async () => {
  const queue = `work-${process.pid}`;
  const attempts = new Map<string, number>();
  const done = defineTask({ type: 'r_done', ceilingMs: 10_000, handler: async () => undefined });
  const flaky = defineTask({
    type: 'r_flaky',
    ceilingMs: 10_000,
    backoff: { baseMs: 0, maxMs: 0 },
    handler: async (_p, ctx) => {
      attempts.set('flaky', ctx.attempt);
      if (ctx.attempt === 1) throw new Error('first attempt fails');
    },
  });
  const doomed = defineTask({
    type: 'r_dead',
    ceilingMs: 10_000,
    maxAttempts: 1,
    handler: async () => {
      throw new Error('always');
    },
  });
  const sliced = defineTask<{ cursor: number }>({
    type: 'r_slice',
    ceilingMs: 10_000,
    handler: async (p, ctx) => {
      if (p.cursor >= 2) return 'done';
      assert.equal(await ctx.advanceCursor({ cursor: p.cursor + 1 }), true);
      return 'continue';
    },
  });
  const { logger, lines } = captureLogger();
  const w = new Worker({
    connectionString: urlAs(roleB),
    schema,
    tasks: [done, flaky, doomed, sliced],
    queues: [queue],
    slots: 2,
    leaseMarginMs: 0,
    pollIntervalMs: 100,
    logger,
    // Retention's first run waits one interval after the term starts (maintenance/leader.ts).
    maintenance: { ...FAST_MAINTENANCE, ringRotateAfterMs: 100, ringRotateSmallAfterMs: 100, retentionIntervalMs: 200 },
  });
  await w.start();
  try {
    // The tests above left entries in the first segment that no worker here claims, so that
    // segment is never pruned. The first rotation seals it; this test's entries go after it,
    // into segments that hold only entries it settles.
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_ring_rotations_total', { result: 'rotated' })) > 0,
      10_000,
      'the first rotation',
    );
    await enqueue(poolA, done, {}, { schema, queue, shard: 1 });
    await enqueue(poolB, done, {}, { schema, queue, shard: 1 });
    await enqueue(poolA, flaky, {}, { schema, queue, shard: 1 });
    await enqueue(poolB, sliced, { cursor: 0 }, { schema, queue, shard: 1 });
    const dead = (await enqueue(poolA, doomed, {}, { schema, queue, shard: 1 })).id!;
    // Settled entries may be pruned from the ring at once, so the outcomes are read from the
    // worker's counters; a dead letter stays readable.
    await expectOutcome(w.metrics, 'r_done', 'success', 2);
    await expectOutcome(w.metrics, 'r_flaky', 'failure', 1);
    await expectOutcome(w.metrics, 'r_flaky', 'success', 1);
    await expectOutcome(w.metrics, 'r_slice', 'continued', 2);
    await expectOutcome(w.metrics, 'r_slice', 'success', 1);
    await waitFor(async () => (await getTask(admin, schema, dead))?.state === 'dead', 10_000, 'dead letter');
    assert.equal(attempts.get('flaky'), 2);
    // Prune truncates a settled ring segment's partitions through prune_slot (B has no TRUNCATE).
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_ring_prune_total', { result: 'pruned' })) > 0,
      10_000,
      'a ring segment pruned by B',
    );
    // A forged leader row (the same role can write `workers`) does not change who leads.
    await forgeLeaderRow(poolB, forged);
    const info = await waitFor(
      async () => {
        const i = await leaderInfo(admin, schema);
        return i.worker?.workerId === w.id ? i : null;
      },
      10_000,
      'leaderInfo names the worker holding the lock',
    );
    assert.match(info.session!.applicationName, /^berth leader /);
    // One run is the proof: after a run the gauges wait 20 times its length (GAUGE_BUSY_SHARE),
    // so on a loaded machine a second run can be many seconds away (CI: none within 15 s).
    await waitFor(
      async () => (await counterValue(w.metrics, 'berth_maintenance_branch_seconds_count', { branch: 'gauges' })) > 0,
      10_000,
      'gauges ran',
    );
    for (const branch of ['promote', 'rescue', 'ring', 'retention', 'gauges']) {
      assert.ok(
        (await counterValue(w.metrics, 'berth_maintenance_branch_seconds_count', { branch })) > 0,
        `${branch} ran`,
      );
    }
    assert.equal(
      await counterValue(w.metrics, 'berth_maintenance_errors_total', {}),
      0,
      JSON.stringify(lines.filter((l) => l.level === 50)),
    );
  } finally {
    await w.stop();
  }
  const none = await leaderInfo(admin, schema);
  assert.deepEqual(
    { session: none.session, worker: none.worker },
    { session: null, worker: null },
    'no lock holder: no leader, forged row or not',
  );
  await admin.query(`DELETE FROM ${S}.workers WHERE worker_id = $1`, [forged]);
});

const forged = `forged-${process.pid}`;

/** The row the security probe wrote: leader, seen ten years ahead, malformed maintenance. */
async function forgeLeaderRow(db: pg.Pool, id: string): Promise<void> {
  await db.query(
    `INSERT INTO ${S}.workers (worker_id, host, pid, queues, slots, busy, prefetched, leader, maintenance, started_at, last_seen_at)
     VALUES ($1, 'forged', 1, NULL, 1, 0, 0, true, '{"branches": 42, "waitingLanes": "x"}',
             now() + interval '10 years', now() + interval '10 years')`,
    [id],
  );
}

test('A promotes a scheduled task on a lane B created', async () => {
  const queue = `promo-${process.pid}`;
  const first = await enqueue(poolB, 'r_promo', { n: 1 }, { schema, queue, shard: 5 });
  const later = await enqueue(poolB, 'r_promo', { n: 2 }, { schema, queue, shard: 5, delay: 200 });
  assert.equal(later.state, 'scheduled');
  const lane = await laneOf(first.id!);
  const owners = await admin.query(`SELECT pg_get_userbyid(relowner) AS o FROM pg_class WHERE oid = $1::regclass`, [
    `${S}."lane_seq_${lane.lane_id}"`,
  ]);
  assert.equal(owners.rows[0].o, owner, 'created through the definer: owned by the schema owner, not by B');
  await waitFor(
    async () =>
      (await admin.query(`SELECT run_at <= now() AS due FROM ${S}.deferred WHERE id = $1`, [later.id])).rows[0].due,
    10_000,
    'the task to come due',
  );
  const out = await promoteDueLanes(poolA, schema, null, 100, 1000);
  assert.deepEqual(
    { promoted: out.promoted, contended: out.contended, failed: out.failed },
    { promoted: 1, contended: [], failed: [] },
  );
  assert.deepEqual(await laneOf(later.id!), { lane_id: lane.lane_id, lane_seq: '2' });
});

test('the rest of the runtime surface works under the grant (read, move, remove, rescue, gauges, ring, retention)', async () => {
  const queue = `misc-${process.pid}`;
  const t = await enqueue(poolA, 'r_misc', {}, { schema, queue, shard: 2 });
  assert.equal((await getTask(poolB, schema, t.id!))?.state, 'ready');
  assert.equal(await moveTask(poolB, schema, t.id!, { queue: `${queue}-moved`, priority: 3 }), 'moved');
  assert.equal(await removeUnleased(poolA, storageFor(schema), t.id!, 'cancelled'), 'removed');
  const d = await enqueue(poolA, 'r_misc', {}, { schema, queue, delay: 60_000, dedupeKey: `k-${process.pid}` });
  assert.equal(await removeUnleased(poolB, storageFor(schema), d.id!, 'cancelled'), 'removed');
  assert.deepEqual(await rescueLapsedLeases(poolA, schema), { retried: 0, dead: 0, held: 0 });
  assert.ok((await readGauges(poolB, schema)).dead.get('r_dead'));
  assert.equal(await pruneDeadLetters(poolA, schema, 0), 1);
  await maintainRing(poolA, schema, { rotateAfterMs: 0, lockTimeoutMs: 100 });
});

test('a producer role enqueues and reads task state, and nothing more', async () => {
  const queue = `prod-${process.pid}`;
  const ready = await enqueue(poolP, 'r_prod', { n: 1 }, { schema, queue, shard: 7, dedupeKey: `pk-${process.pid}` });
  const later = await enqueue(poolP, 'r_prod', { n: 2 }, { schema, queue, shard: 7, delay: 60_000 });
  assert.equal(
    (await enqueue(poolP, 'r_prod', {}, { schema, queue, dedupeKey: `pk-${process.pid}` })).state,
    'duplicate',
  );
  assert.equal((await getTask(poolP, schema, ready.id!))?.state, 'ready');
  assert.equal((await getTask(poolP, schema, later.id!))?.state, 'scheduled');
  const lane = await laneOf(ready.id!);

  // Claim: the lane lock (FOR UPDATE needs UPDATE on lanes) and the lease insert are refused.
  await assert.rejects(
    claim(poolP, claimParams(schema, [lane.lane_id], 1, { defaultCeilingMs: 1000, workerId: 'p' })),
    (err: { code?: string }) => err.code === '42501',
  );
  await denied(
    poolP,
    `INSERT INTO ${S}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, types, type_expires,
                                    type_max_attempts, expires_at)
                        VALUES (0, $1, $2::bigint, $2::bigint, 1, gen_random_uuid(), now(), '{x}', ARRAY[now()], '{1}', now())`,
    [lane.lane_id, lane.lane_seq],
  );
  // Settlement, ring and lane writes, the definer functions beyond enqueue.
  await denied(
    poolP,
    `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
                        VALUES (0, $1, $2::bigint, int8multirange(int8range($2::bigint, $2::bigint + 1)), 1, 'completed')`,
    [lane.lane_id, lane.lane_seq],
  );
  await denied(poolP, `UPDATE ${S}.lanes SET paused = true`);
  await assert.rejects(rotateRing(poolP as never, schema, 0), (err: { code?: string }) => err.code === '42501');
  for (const call of [
    `${S}.prune_slot(0::smallint, 10)`,
    `${S}.prune_dead_letters(0, 10)`,
    `${S}.promote_lane('q', 0::smallint, 0::smallint, 10)`,
    `${S}.remove_unleased(${ready.id}, 'x')`,
    `${S}.provision_lane('q', 0::smallint, 0::smallint)`,
    `* FROM ${S}.due_deferred(NULL, 10, '{}', '{}', '{}')`,
  ])
    await denied(poolP, `SELECT ${call}`);
  // Nothing that destroys: truncate, delete, drop.
  await denied(poolP, `TRUNCATE ${S}."ready_0"`);
  await denied(poolP, `TRUNCATE ${S}.ready`);
  for (const t of ['deferred', 'ready', 'dead_letters', 'dedupe', 'leases'])
    await denied(poolP, `DELETE FROM ${S}.${t}`);
  await denied(poolP, `UPDATE ${S}.deferred SET run_at = now()`);
  await denied(poolP, `DROP TABLE ${S}.ready`);
  await denied(poolP, `DROP TABLE ${S}."ready_0"`);
  // Nor forge a worker, a leader or an audit entry.
  await assert.rejects(forgeLeaderRow(poolP, `${forged}-p`), (err: { code?: string }) => err.code === '42501');
  await denied(poolP, `INSERT INTO ${S}.audit_log (actor, action, target, result) VALUES ('x', 'x', '{}', '{}')`);
  await denied(poolP, `SELECT count(*) FROM ${S}.audit_log`);
  await denied(poolP, `SELECT count(*) FROM ${S}.workers`);
  // Everything refused left the tasks as they were.
  assert.equal((await getTask(admin, schema, ready.id!))?.state, 'ready');
  assert.equal((await getTask(admin, schema, later.id!))?.state, 'scheduled');
});

test('a worker role cannot truncate, delete, drop or forge what it does not own', async () => {
  for (const t of ['ready', 'range_leases', 'range_settlements', 'tombstones']) {
    await denied(poolB, `TRUNCATE ${S}.${t}`);
    await denied(poolB, `TRUNCATE ${S}."${t}_3"`);
    const c = await poolB.connect();
    try {
      await c.query('BEGIN');
      await assert.rejects(
        c.query(`LOCK TABLE ${S}."${t}_3" IN ACCESS EXCLUSIVE MODE`),
        (err: { code?: string }) => err.code === '42501',
      );
    } finally {
      await c.query('ROLLBACK');
      c.release();
    }
  }
  for (const t of [
    'ready',
    'leases',
    'settlements',
    'range_leases',
    'range_settlements',
    'tombstones',
    'deferred',
    'dead_letters',
    'audit_log',
    'lanes',
  ]) {
    await denied(poolB, `DELETE FROM ${S}.${t}`);
  }
  await denied(poolB, `DELETE FROM ${S}."ready_3"`);
  await denied(poolB, `UPDATE ${S}.deferred SET run_at = now() + interval '1 year'`);
  await denied(poolB, `UPDATE ${S}.ready SET payload = '{}'`);
  await denied(poolB, `UPDATE ${S}.range_leases SET expires_at = now()`);
  await denied(poolB, `SELECT id FROM ${S}.deferred FOR UPDATE`);
  await denied(poolB, `INSERT INTO ${S}.audit_log (actor, action, target, result) VALUES ('x', 'x', '{}', '{}')`);
  await denied(
    poolB,
    `INSERT INTO ${S}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard, attempts, created_at, run_at)
                        VALUES (0, 1, 999999, 1, 'x', '{}', 'q', 0, 0, 0, now(), now())`,
  );
  await denied(poolB, `DROP TABLE ${S}.ready`);
  await denied(poolB, `DROP TABLE ${S}.workers`);
  await denied(poolB, `ALTER TABLE ${S}.dead_letters DISABLE TRIGGER ALL`);
  await denied(poolB, `CREATE TABLE ${S}.mine (x int)`);
  await denied(poolB, `SELECT ${S}.set_queue_paused('q', true, 'b', NULL)`);
  await denied(poolB, `SELECT * FROM ${S}.retry_dead('{1}')`);
  await denied(poolB, `SELECT * FROM ${S}.schema_migrations`);
  // A forged leader row is refused to nobody holding the worker grant, and changes nothing.
  const before = await leaderInfo(admin, schema);
  await forgeLeaderRow(poolB, `${forged}-b`);
  try {
    const after = await leaderInfo(admin, schema);
    assert.deepEqual(after, before, 'leaderInfo reads the lock holder, not a row that says it leads');
  } finally {
    await admin.query(`DELETE FROM ${S}.workers WHERE worker_id = $1`, [`${forged}-b`]);
  }
});

test('the leader lock is not a privilege: any role that can connect can take it (and is reported as the lock holder)', async () => {
  // pg_advisory_lock needs no grant. A session that takes the leader key blocks maintenance
  // (no worker can lead) but cannot pass for a worker: leaderInfo names no worker row for it.
  const c = await poolP.connect();
  try {
    const got = await c.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1, $2) AS ok', [
      schemaLockKey(schema),
      LEADER_LOCK,
    ]);
    assert.equal(got.rows[0]!.ok, true);
    const pid = (await c.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    const info = await leaderInfo(admin, schema);
    assert.equal(info.session?.pid, pid);
    assert.equal(info.worker, null);
    await c.query('SELECT pg_advisory_unlock($1, $2)', [schemaLockKey(schema), LEADER_LOCK]);
  } finally {
    c.release();
  }
});

test('a dead-letter retention that deletes something leaves an audit row', async () => {
  const queue = `ret-${process.pid}`;
  const t = await enqueue(poolA, 'r_ret', {}, { schema, queue, delay: 60_000 });
  await admin.query(
    `INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, created_at, last_attempted_at)
     SELECT id, type, payload, queue, priority, shard, 1, created_at, now() - interval '1 day' FROM ${S}.deferred WHERE id = $1`,
    [t.id],
  );
  await admin.query(`DELETE FROM ${S}.deferred WHERE id = $1`, [t.id]);
  assert.equal(await pruneDeadLetters(poolB, schema, 3600_000), 1);
  const audit = await admin.query(
    `SELECT actor, action, result FROM ${S}.audit_log WHERE action = 'dead.retention' ORDER BY id DESC LIMIT 1`,
  );
  assert.deepEqual(audit.rows[0], { actor: `maintenance:${roleB}`, action: 'dead.retention', result: { pruned: 1 } });
  assert.equal(await pruneDeadLetters(poolB, schema, 3600_000), 0);
});

test('grantRuntimeRole: kind producer or worker; regranting converges; options are checked', async () => {
  const conn = { connectionString: urlAs(owner), schema };
  const priv = async (role: string) =>
    (
      await admin.query(
        `SELECT has_table_privilege($1, $2, 'INSERT') AS lease_insert, has_function_privilege($1, $3, 'EXECUTE') AS promote,
                has_function_privilege($1, $4, 'EXECUTE') AS enqueue, has_table_privilege($1, $5, 'SELECT') AS read`,
        [
          role,
          `${S}.range_leases`,
          `${S}.promote_lane(text,smallint,smallint,integer)`,
          `${S}.enqueue(text,smallint,smallint,smallint,text[],jsonb[],timestamptz[],integer[],text[],text)`,
          `${S}.ready`,
        ],
      )
    ).rows[0];
  await grantRuntimeRole({ ...conn, role: producerQ, kind: 'worker' });
  assert.deepEqual(await priv(producerQ), { lease_insert: true, promote: true, enqueue: true, read: true });
  await grantRuntimeRole({ ...conn, role: producerQ, kind: 'producer' });
  assert.deepEqual(await priv(producerQ), { lease_insert: false, promote: false, enqueue: true, read: true });
  assert.deepEqual(await priv(producer), await priv(producerQ), 'same set as migrate({ producerRoles })');

  const input = (err: unknown) => err instanceof BerthInputError;
  await assert.rejects(grantRuntimeRole({ ...conn, role: producerQ, kind: 'admin' as never }), input);
  await assert.rejects(
    grantRuntimeRole({ ...conn, role: producerQ, knd: 'producer' } as never),
    (err: Error) => input(err) && /unknown grantRuntimeRole option "knd"/.test(err.message),
  );
  await assert.rejects(grantRuntimeRole({ ...conn, role: '' }), input);
  await assert.rejects(
    grantRuntimeRole({ ...conn, role: owner }),
    (err: Error) => input(err) && /owns schema/.test(err.message),
  );
  await assert.rejects(
    migrate({ ...conn, producerRole: [producerQ] } as never),
    (err: Error) => input(err) && /unknown migrate option "producerRole"/.test(err.message),
  );
  await assert.rejects(
    migrate({ ...conn, runtimeRoles: [producerQ], producerRoles: [producerQ] }),
    (err: Error) => input(err) && /both/.test(err.message),
  );
  await assert.rejects(migrate({ ...conn, producerRoles: 'x' as never }), input);

  // berth migrate offers both kinds; it turns Q back into a worker role and keeps P a producer.
  const { main } = await import('../src/cli.js');
  const log = console.log;
  const printed: string[] = [];
  console.log = (...a: unknown[]) => void printed.push(a.join(' '));
  try {
    const code = await main([
      'node',
      'berth',
      'migrate',
      '--schema',
      schema,
      '--database-url',
      urlAs(owner),
      '--runtime-role',
      producerQ,
      '--producer-role',
      producer,
    ]);
    assert.equal(code, 0, printed.join('\n'));
  } finally {
    console.log = log;
  }
  assert.ok(printed.includes(`granted runtime privileges to "${producerQ}" (worker role)`), printed.join('\n'));
  assert.ok(printed.includes(`granted producer privileges to "${producer}"`), printed.join('\n'));
  assert.deepEqual(await priv(producerQ), { lease_insert: true, promote: true, enqueue: true, read: true });
  assert.deepEqual(await priv(producer), { lease_insert: false, promote: false, enqueue: true, read: true });
});

test('no runtime role may read the per-task leases and settlements of berth before migration 8 (kept by migration 22 until a later one drops them)', async () => {
  for (const r of [roleA, roleB, producer]) {
    for (const t of ['leases', 'settlements', 'leases_3', 'settlements_3']) {
      const p = await admin.query(
        `SELECT has_table_privilege($1, $2, 'SELECT') OR has_table_privilege($1, $2, 'INSERT')
                OR has_table_privilege($1, $2, 'TRUNCATE') AS any`,
        [r, `${S}."${t}"`],
      );
      assert.equal(p.rows[0].any, false, `${r} on ${t}`);
    }
  }
  await denied(poolB, `SELECT count(*) FROM ${S}.leases`);
  await denied(poolP, `SELECT count(*) FROM ${S}.settlements`);
});

test('migration 7 turns a runtime role of the old single grant into a worker role', async () => {
  const legacySchema = `t_roles_legacy_${process.pid}`;
  const L = `"${legacySchema}"`;
  const legacy = `berth_rt_l_${process.pid}`;
  await admin.query(`DROP SCHEMA IF EXISTS ${L} CASCADE`);
  await admin.query(`DROP ROLE IF EXISTS "${legacy}"`);
  await admin.query(`CREATE ROLE "${legacy}" LOGIN`);
  const o = new pg.Client({ connectionString: urlAs(owner) });
  await o.connect();
  try {
    await admin.query(`CREATE SCHEMA ${L} AUTHORIZATION "${owner}"`);
    // The schema as berth left it before the split (migrations up to 5), with the old grant.
    await migrateUpTo(o, legacySchema, 5);
    await o.query(`GRANT USAGE ON SCHEMA ${L} TO "${legacy}"`);
    await o.query(`GRANT EXECUTE ON FUNCTION ${L}.promote_lane(text, smallint, smallint, integer) TO "${legacy}"`);
    await o.query(`GRANT SELECT, TRUNCATE ON ${L}."ready_0", ${L}."leases_15", ${L}."tombstones_7" TO "${legacy}"`);
    await o.query(`GRANT SELECT, INSERT, DELETE ON ${L}.dead_letters TO "${legacy}"`);
    await o.query(`GRANT SELECT, INSERT, UPDATE (run_at) ON ${L}.deferred TO "${legacy}"`);
    await migrate({ client: o, schema: legacySchema });
    const p = await admin.query(
      `SELECT has_table_privilege($1, $2, 'TRUNCATE') AS t0, has_table_privilege($1, $3, 'TRUNCATE') AS t15,
              has_table_privilege($1, $4, 'DELETE') AS dl_delete, has_table_privilege($1, $4, 'INSERT') AS dl_insert,
              has_column_privilege($1, $5, 'run_at', 'UPDATE') AS run_at,
              has_function_privilege($1, $6, 'EXECUTE') AS prune, has_function_privilege($1, $7, 'EXECUTE') AS retention,
              has_function_privilege($1, $8, 'EXECUTE') AS due`,
      [
        legacy,
        `${L}."ready_0"`,
        `${L}."leases_15"`,
        `${L}.dead_letters`,
        `${L}.deferred`,
        `${L}.prune_slot(smallint,integer)`,
        `${L}.prune_dead_letters(double precision,integer)`,
        `${L}.due_deferred(text,integer,text[],smallint[],smallint[])`,
      ],
    );
    assert.deepEqual(p.rows[0], {
      t0: false,
      t15: false,
      dl_delete: false,
      dl_insert: true,
      run_at: false,
      prune: true,
      retention: true,
      due: true,
    });
    const ownerKept = await admin.query(`SELECT has_table_privilege($1, $2, 'TRUNCATE') AS t`, [
      owner,
      `${L}."ready_0"`,
    ]);
    assert.equal(ownerKept.rows[0].t, true, 'the owner keeps its own privileges');
  } finally {
    await o.end();
    await admin.query(`DROP SCHEMA IF EXISTS ${L} CASCADE`);
    await admin.query(`DROP OWNED BY "${legacy}"`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS "${legacy}"`);
  }
});

test("a stuck handler's lease protection works under the grant: protect, refresh, mark, hold from rescue, clear", async () => {
  const queue = `stuck-${process.pid}`;
  const t = await enqueue(poolA, 'r_stuck', {}, { schema, queue });
  const lanes = [(await laneOf(t.id!)).lane_id];
  const [lease] = await claim(
    poolA,
    claimParams(schema, lanes, 1, {
      ceilings: new Map([['r_stuck', 3000]]),
      defaultCeilingMs: 3000,
      workerId: 'roles',
    }),
  );
  assert.ok(lease);
  assert.equal(await protectOverdueLease(poolA, storageFor(schema), lease, 'roles', 0, 60_000), true);
  await refreshOverdueLeases(poolA, storageFor(schema), 'roles', [lease]);
  assert.equal((await overdueMarks(poolB, storageFor(schema), [t.id!])).get(t.id!)?.stuck, true);
  await waitFor(
    async () =>
      (await admin.query(`SELECT expires_at < now() AS lapsed FROM ${S}.leased_entries WHERE id = $1`, [t.id])).rows[0]
        .lapsed,
    20_000,
    'lapsed',
  );
  assert.deepEqual(await rescueLapsedLeases(poolB, schema), { retried: 0, dead: 0, held: 1 });
  assert.equal(
    (await completeLeases(poolA, storageFor(schema), [lease])).size,
    1,
    'the late result settles its own lease',
  );
  await clearOverdueLease(poolA, storageFor(schema), lease);
  assert.equal((await admin.query(`SELECT count(*)::int AS n FROM ${S}.overdue_leases`)).rows[0].n, 0);
});

test('cancel and snooze work under the worker grant: cancel_tasks settles a running task, a snooze counts itself, retention prunes counts', async () => {
  const queue = `cancel-${process.pid}`;
  const a = await enqueue(poolA, 'r_cancel', {}, { schema, queue, shard: 3 });
  const b = await enqueue(poolA, 'r_cancel', {}, { schema, queue, shard: 3 });
  const lanes = [(await laneOf(a.id!)).lane_id];
  const leases = await claim(poolB, claimParams(schema, lanes, 2, { workerId: 'roles' }));
  assert.equal(leases.length, 2);
  const [la, lb] = leases[0]!.id === a.id ? leases : [leases[1]!, leases[0]!];
  assert.equal((await cancelTasks(poolA, storageFor(schema), [la!.id], 'roles:a')).get(la!.id), 'cancelled');
  const snoozed = await snoozeLease(poolB, storageFor(schema), lb!, 60_000, 5, 'x');
  assert.deepEqual(snoozed, { wrote: true, snoozes: 1, refunded: true, dead: false });
  assert.equal((await getTask(poolB, schema, b.id!))?.state, 'retryable');
  assert.equal(await pruneSnoozeCounts(poolA, storageFor(schema)), 0, 'a pending task keeps its count');
  await denied(poolP, `SELECT ${S}.cancel_tasks(ARRAY[1::bigint], 'x')`);
});

test('task results work under the grants: a worker role stores results with its completions and prunes them, a producer role reads them with getTask', async () => {
  const def = defineTask<{ n: number }>({
    type: 'r_result',
    ceilingMs: 5000,
    handler: async (p) => ({ twice: p.n * 2 }),
  });
  const queue = `results-${process.pid}`;
  const t = await enqueue(poolP, def.type, { n: 21 }, { schema, queue });
  const [report] = await runDueTasks(poolB, [def], { schema, queues: [queue] });
  assert.equal(report?.status, 'completed', report?.error ?? '');
  assert.deepEqual((await getTask(poolP, schema, t.id!))?.result, { twice: 42 });
  await admin.query(`UPDATE ${S}.task_results SET stored_at = now() - interval '1 day' WHERE id = $1`, [t.id]);
  assert.equal(await pruneResults(poolA, storageFor(schema), 3600_000), 1);
  assert.equal((await getTask(poolP, schema, t.id!))?.result, null);
  await denied(poolP, `DELETE FROM ${S}.task_results`);
  await denied(poolP, `INSERT INTO ${S}.task_results (id, attempt, result) VALUES (1, 1, '1')`);
  await denied(poolP, `UPDATE ${S}.task_results SET result = '2'`);
  // The worker may update only what a completion's ON CONFLICT sets, never a row's task id.
  await denied(poolB, `UPDATE ${S}.task_results SET id = id + 1`);
});
