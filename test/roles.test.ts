import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  defineTask,
  enqueue,
  getTask,
  grantRuntimeRole,
  listLaneSequenceProblems,
  maintainRing,
  migrate,
  moveTask,
  promoteDueLanes,
  pruneDeadLetters,
  readGauges,
  removeUnleased,
  rescueLapsedLeases,
  Worker,
} from '../src/index.js';
import { overdueMarks } from '../src/index.js';
import { claim } from '../src/processor/claim.js';
import { clearOverdueLease, protectOverdueLease, refreshOverdueLeases } from '../src/processor/overdue.js';
import { completeLeases } from '../src/processor/settlement.js';
import { wakeChannel } from '../src/sql.js';
import { captureLogger, counterValue, DATABASE_URL, expectOutcome, FAST_MAINTENANCE, waitFor, urlAs } from './helpers.js';

// Roles are cluster-wide: every name carries the pid so parallel runs never share one.
const owner = `berth_owner_r_${process.pid}`;
const roleA = `berth_rt_a_${process.pid}`;
const roleB = `berth_rt_b_${process.pid}`;
const outsider = `berth_rt_x_${process.pid}`;
const roles = [roleA, roleB, outsider, owner];
const schema = `t_roles_${process.pid}`;
const S = `"${schema}"`;


const admin = new pg.Pool({ connectionString: DATABASE_URL });
await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
for (const r of roles) await admin.query(`DROP ROLE IF EXISTS "${r}"`);
for (const r of roles) await admin.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
// A non-superuser owns the schema and migrates it: the definer functions run as this role.
await admin.query(`CREATE SCHEMA ${S} AUTHORIZATION "${owner}"`);
const report = await migrate({ connectionString: urlAs(owner), schema, runtimeRoles: [roleA] });
await grantRuntimeRole({ connectionString: urlAs(owner), schema, role: roleB });
const poolA = new pg.Pool({ connectionString: urlAs(roleA), max: 4 });
const poolB = new pg.Pool({ connectionString: urlAs(roleB), max: 4 });
const poolX = new pg.Pool({ connectionString: urlAs(outsider), max: 2 });

after(async () => {
  await Promise.all([poolA.end(), poolB.end(), poolX.end()]);
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

test('migrate grants runtimeRoles in its transaction and reports them', () => {
  assert.deepEqual(report.grantedRoles, [roleA]);
  assert.deepEqual(report.laneSequences, { repaired: [], busy: [], notPermitted: [], failed: [] });
});

test('runtime roles have no CREATE on the schema, and PUBLIC can execute no berth function', async () => {
  for (const r of [roleA, roleB]) {
    const p = await admin.query(`SELECT has_schema_privilege($1, $2, 'CREATE') AS c, has_schema_privilege($1, $2, 'USAGE') AS u`, [r, schema]);
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
  const internal = await admin.query(`SELECT has_function_privilege($1, $2, 'EXECUTE') AS x`, [roleA, `${S}.append_ready(integer,bigint[],text[],jsonb[],integer[],integer[],text[],text[],timestamptz[],timestamptz[])`]);
  assert.equal(internal.rows[0].x, false, 'append_ready is only called from inside the definer functions');
  const repair = await admin.query(
    `SELECT has_function_privilege($1, $2, 'EXECUTE') AS a, has_function_privilege('public', $2, 'EXECUTE') AS p`,
    [roleA, `${S}.provision_lane_sequence(integer)`],
  );
  assert.deepEqual(repair.rows[0], { a: false, p: false }, 'the lane sequence repair is for operators, not runtime roles');
});

test('a role without the grant gets a clear permission error', async () => {
  await assert.rejects(enqueue(poolX, 'r', {}, { schema }), /permission denied for schema/);
  // With USAGE alone, the function itself is refused: PUBLIC's EXECUTE is revoked.
  await admin.query(`GRANT USAGE ON SCHEMA ${S} TO "${outsider}"`);
  try {
    await assert.rejects(enqueue(poolX, 'r', {}, { schema }), /permission denied for function enqueue/);
    await assert.rejects(poolX.query(`SELECT ${S}.provision_lane('q', 0::smallint, 0::smallint)`), /permission denied for function provision_lane/);
  } finally {
    await admin.query(`REVOKE USAGE ON SCHEMA ${S} FROM "${outsider}"`);
  }
  await assert.rejects(grantRuntimeRole({ connectionString: urlAs(owner), schema, role: `no_such_role_${process.pid}` }), /does not exist/);
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
  for (const [q, p, sh] of [[null, 0, 0], ['q', null, 0], ['q', 0, null]] as const) {
    await assert.rejects(call(q, p, sh), (err: { code?: string; message?: string }) => err.code === '22004' && /must not be null/.test(err.message ?? ''));
  }
  for (const shard of [-1, 64]) {
    await assert.rejects(call('q', 0, shard), (err: { code?: string; message?: string }) => err.code === '22023' && /outside 0-63/.test(err.message ?? ''));
  }
  const ids = new Set<number>();
  for (const [q, p, sh] of [['', 0, 0], ['', -32768, 63], ['ünï "quoted"; drop', 32767, 0]] as const) {
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
  const done = defineTask({ type: 'r_done', ceiling: 10_000, handler: async () => undefined });
  const flaky = defineTask({
    type: 'r_flaky',
    ceiling: 10_000,
    backoff: { baseMs: 0, maxMs: 0 },
    handler: async (_p, ctx) => {
      attempts.set('flaky', ctx.attempt);
      if (ctx.attempt === 1) throw new Error('first attempt fails');
    },
  });
  const doomed = defineTask({ type: 'r_dead', ceiling: 10_000, maxAttempts: 1, handler: async () => { throw new Error('always'); } });
  const sliced = defineTask<{ cursor: number }>({
    type: 'r_slice',
    ceiling: 10_000,
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
    slots: 2,
    leaseMarginMs: 0,
    pollIntervalMs: 100,
    logger,
    maintenance: { ...FAST_MAINTENANCE, ringRotateAfterMs: 100 },
  });
  await w.start();
  try {
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
    // Prune truncates a settled slot's partitions (LOCK TABLE + TRUNCATE as B).
    await waitFor(async () => (await counterValue(w.metrics, 'berth_ring_prune_total', { result: 'pruned' })) > 0, 10_000, 'a ring slot pruned by B');
    await waitFor(async () => (await counterValue(w.metrics, 'berth_maintenance_branch_seconds_count', { branch: 'gauges' })) > 1, 5_000, 'gauges ran');
    for (const branch of ['promote', 'rescue', 'ring', 'retention', 'gauges']) {
      assert.ok((await counterValue(w.metrics, 'berth_maintenance_branch_seconds_count', { branch })) > 0, `${branch} ran`);
    }
    assert.equal(await counterValue(w.metrics, 'berth_maintenance_errors_total', {}), 0, JSON.stringify(lines.filter((l) => l.level === 50)));
  } finally {
    await w.stop();
  }
});

test('A promotes a scheduled task on a lane B created', async () => {
  const queue = `promo-${process.pid}`;
  const first = await enqueue(poolB, 'r_promo', { n: 1 }, { schema, queue, shard: 5 });
  const later = await enqueue(poolB, 'r_promo', { n: 2 }, { schema, queue, shard: 5, delay: 200 });
  assert.equal(later.state, 'scheduled');
  const lane = await laneOf(first.id!);
  const owners = await admin.query(`SELECT pg_get_userbyid(relowner) AS o FROM pg_class WHERE oid = $1::regclass`, [`${S}."lane_seq_${lane.lane_id}"`]);
  assert.equal(owners.rows[0].o, owner, 'created through the definer: owned by the schema owner, not by B');
  await new Promise((r) => setTimeout(r, 250));
  const out = await promoteDueLanes(poolA, schema, null, 100, 1000);
  assert.deepEqual({ promoted: out.promoted, contended: out.contended, failed: out.failed }, { promoted: 1, contended: [], failed: [] });
  assert.deepEqual(await laneOf(later.id!), { lane_id: lane.lane_id, lane_seq: '2' });
});

test('the rest of the runtime surface works under the grant (read, move, remove, rescue, gauges, ring, retention)', async () => {
  const queue = `misc-${process.pid}`;
  const t = await enqueue(poolA, 'r_misc', {}, { schema, queue, shard: 2 });
  assert.equal((await getTask(poolB, schema, t.id!))?.state, 'ready');
  assert.equal(await moveTask(poolB, schema, t.id!, { queue: `${queue}-moved`, priority: 3 }), 'moved');
  assert.equal(await removeUnleased(poolA, schema, t.id!, 'cancelled'), 'removed');
  const d = await enqueue(poolA, 'r_misc', {}, { schema, queue, delay: 60_000, dedupeKey: `k-${process.pid}` });
  assert.equal(await removeUnleased(poolB, schema, d.id!, 'cancelled'), 'removed');
  assert.deepEqual(await rescueLapsedLeases(poolA, schema), { retried: 0, dead: 0, held: 0 });
  assert.ok((await readGauges(poolB, schema)).dead.get('r_dead'));
  assert.equal(await pruneDeadLetters(poolA, schema, 0), 1);
  await maintainRing(poolA, schema, { rotateAfterMs: 0, lockTimeoutMs: 100 });
});

test('a stuck handler\'s lease protection works under the grant: protect, refresh, mark, hold from rescue, clear', async () => {
  const queue = `stuck-${process.pid}`;
  const t = await enqueue(poolA, 'r_stuck', {}, { schema, queue });
  const lanes = [(await laneOf(t.id!)).lane_id];
  const [lease] = await claim(poolA, {
    schema, laneIds: lanes, limit: 1, ceilings: new Map([['r_stuck', 3000]]), maxAttempts: new Map(), defaultMaxAttempts: 20,
    defaultCeilingMs: 3000, marginMs: 0, workerId: 'roles', wakeChannel: wakeChannel(schema),
  });
  assert.ok(lease);
  assert.equal(await protectOverdueLease(poolA, schema, lease, 'roles', 0, 60_000), true);
  await refreshOverdueLeases(poolA, schema, 'roles', [lease]);
  assert.equal((await overdueMarks(poolB, schema, [t.id!])).get(t.id!)?.stuck, true);
  await waitFor(async () => (await admin.query(`SELECT expires_at < now() AS lapsed FROM ${S}.leases WHERE id = $1`, [t.id])).rows[0].lapsed, 20_000, 'lapsed');
  assert.deepEqual(await rescueLapsedLeases(poolB, schema), { retried: 0, dead: 0, held: 1 });
  assert.equal((await completeLeases(poolA, schema, [lease])).size, 1, 'the late result settles its own lease');
  await clearOverdueLease(poolA, schema, lease);
  assert.equal((await admin.query(`SELECT count(*)::int AS n FROM ${S}.overdue_leases`)).rows[0].n, 0);
});
