/**
 * Review of concurrency keys (migration 29): what the keys cost as keys, tasks and admitted
 * tasks grow. Measurements are printed as diagnostics (`# ...` lines), never asserted; what is
 * asserted is a count or a plan's shape.
 *
 * A `regression (review N)` test names a finding of that review, fixed since, and fails if it
 * comes back; a `held` test is an attack that held.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { schemaLockKey } from '../src/storage/locks.js';
import { freshSchema } from './helpers.js';
import { client, enqueueKeyed, liveIds, promoteHeldSql, settle, WORKER_SESSION } from './keys-review-support.js';

const { schema, pool } = await freshSchema('krev_scale');
const S = `"${schema}"`;
const worker = await client(WORKER_SESSION);
after(() => worker.end());

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred,
              ${S}.dead_letters, ${S}.dedupe, ${S}.task_keys, ${S}.held_keys, ${S}.key_holders`,
  );
}

async function timed<T>(f: () => Promise<T>): Promise<[T, number]> {
  const t = performance.now();
  const v = await f();
  return [v, Math.round(performance.now() - t)];
}

test('regression (review 6): past 1000 keys with backlogs, a newer key is never admitted by the leader (held_keys ordered by since, LIMIT 1000)', async (t) => {
  await reset();
  // 1000 keys with 3 tasks each, then one more key.
  await enqueueKeyed(
    pool,
    S,
    Array.from({ length: 3000 }, (_, i) => `old${i % 1000}`),
  );
  await new Promise((r) => setTimeout(r, 20));
  const [late] = await enqueueKeyed(pool, S, ['late']);
  for (let round = 1; round <= 2; round++) {
    const [n, ms] = await timed(() => promoteHeldSql(worker, S, null));
    t.diagnostic(`round ${round}: the leader's promote_held(NULL) admitted ${n} in ${ms} ms`);
    // Every admitted task completes before the next tick.
    const ids = (await pool.query(`SELECT array_agg(id::text) AS ids FROM ${S}.key_holders`)).rows[0].ids ?? [];
    await settle(pool, S, ids);
  }
  const state = (await pool.query(`SELECT state FROM ${S}.deferred WHERE id = $1`, [late!.id])).rows[0]?.state;
  assert.notEqual(state, 'held', 'after two ticks, each admitting 1000 tasks, the newer key has had a turn');
});

test('regression (review 7): the keys tick costs a plan of key_entry_live per key (a SQL function with SET, never inlined): measured', async (t) => {
  for (const keys of [100, 400]) {
    await reset();
    // Each key: one admitted task standing (running) and one held.
    await enqueueKeyed(
      pool,
      S,
      Array.from({ length: 2 * keys }, (_, i) => `busy${i % keys}`),
    );
    await promoteHeldSql(worker, S, null);
    const runs: number[] = [];
    for (let i = 0; i < 3; i++) {
      const [n, ms] = await timed(() => promoteHeldSql(worker, S, null));
      assert.equal(n, 0, 'every key is full');
      runs.push(ms);
    }
    t.diagnostic(`${keys} full keys: a keys tick (promote_held(NULL)) took ${runs.join(', ')} ms (nothing to admit)`);
    const [, one] = await timed(() => worker.query(`SELECT ${S}.key_entry_live(id) FROM ${S}.key_holders LIMIT 1`));
    const [, many] = await timed(() =>
      worker.query(`SELECT count(*) FILTER (WHERE ${S}.key_entry_live(id)) FROM ${S}.key_holders`),
    );
    t.diagnostic(
      `key_entry_live: one call in its own statement ${one} ms; ${keys} calls in one statement ${many} ms (planned once)`,
    );
  }
});

test("regression (review 8): promote_lane's per-row task_keys probe must not be planned, generically, as a hashed read of all of task_keys", async (t) => {
  await reset();
  await pool.query(
    `INSERT INTO ${S}.deferred (id, state, run_at, type, payload, queue, priority, shard, attempts, created_at)
       SELECT g, 'scheduled', now() - interval '1 minute', 't', '{}', 'pl', 0, 0, 0, now()
         FROM generate_series(1, 20000) g`,
  );
  // Keys of tasks elsewhere (pending, or gone and not yet pruned: finding 9).
  await pool.query(
    `INSERT INTO ${S}.task_keys (id, key) SELECT 10000000 + g, 'k' || g FROM generate_series(1, 100000) g`,
  );
  await pool.query(`ANALYZE ${S}.deferred`);
  await pool.query(`ANALYZE ${S}.task_keys`);
  // promote_lane's own selection (migration 29), prepared as plpgsql prepares it, in a worker session.
  await worker.query(`DEALLOCATE ALL`);
  await worker.query(
    `PREPARE picked(text, smallint, smallint, integer) AS
       SELECT array_agg(x.id ORDER BY x.run_at, x.id), array_agg(k.key ORDER BY x.run_at, x.id)
         FROM (SELECT d.id, d.run_at FROM ${S}.deferred d
                WHERE d.queue = $1 AND d.priority = $2 AND d.shard = $3 AND d.run_at <= now()
                ORDER BY d.run_at, d.priority, d.id LIMIT $4 FOR UPDATE SKIP LOCKED) x
         LEFT JOIN LATERAL (SELECT tk.key FROM ${S}.task_keys tk WHERE tk.id = x.id LIMIT 1) k ON true`,
  );
  await worker.query('BEGIN');
  const plan = (
    await worker.query(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE picked('pl', 0::smallint, 0::smallint, 1000)`)
  ).rows[0]['QUERY PLAN'][0];
  await worker.query('ROLLBACK');
  const scans: { rows: number; loops: number }[] = [];
  const walk = (n: Record<string, unknown>) => {
    if (n['Relation Name'] === 'task_keys')
      scans.push({ rows: n['Actual Rows'] as number, loops: n['Actual Loops'] as number });
    for (const c of (n.Plans as Record<string, unknown>[] | undefined) ?? []) walk(c);
  };
  walk(plan.Plan);
  t.diagnostic(`task_keys scans in a 1000-row promotion: ${JSON.stringify(scans)}, ${plan['Execution Time']} ms`);
  const read = scans.reduce((s, x) => s + x.rows * x.loops, 0);
  assert.ok(read <= 1000, `a promotion of 1000 rows reads at most 1000 task_keys rows (read ${read})`);
});

test('measured: promote_lane before and after migration 29, 20,000 due rows in batches of 1000: measured', async (t) => {
  // The promote_lane of migration 12, as it stood before 6e95eab, beside the new one.
  await pool.query(`CREATE OR REPLACE FUNCTION ${S}.promote_lane_before(p_queue text, p_priority smallint, p_shard smallint,
                                  p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE v_lane integer; v_n integer;
BEGIN
  v_lane := ${S}.provision_lane(p_queue, p_priority, p_shard);
  PERFORM pg_advisory_xact_lock(${schemaLockKey(schema)}, v_lane);
  WITH moved AS (
    DELETE FROM ${S}.deferred d
     WHERE d.id IN (SELECT x.id FROM ${S}.deferred x
                     WHERE x.queue = p_queue AND x.priority = p_priority AND x.shard = p_shard
                       AND x.run_at <= now()
                     ORDER BY x.run_at, x.priority, x.id
                     LIMIT p_limit
                     FOR UPDATE SKIP LOCKED)
    RETURNING d.*
  )
  SELECT ${S}.append_ready(v_lane,
           array_agg(m.id ORDER BY m.run_at, m.id), array_agg(m.type ORDER BY m.run_at, m.id),
           array_agg(m.payload ORDER BY m.run_at, m.id), array_agg(m.attempts ORDER BY m.run_at, m.id),
           array_agg(m.max_attempts ORDER BY m.run_at, m.id), array_agg(m.dedupe_key ORDER BY m.run_at, m.id),
           array_agg(m.last_error ORDER BY m.run_at, m.id), array_agg(m.created_at ORDER BY m.run_at, m.id),
           array_agg(m.run_at ORDER BY m.run_at, m.id), array_agg(m.trace_context ORDER BY m.run_at, m.id))
    INTO v_n
    FROM moved m;
  RETURN coalesce(v_n, 0);
END $fn$`);
  for (const keyRows of [0, 100_000]) {
    await reset();
    await pool.query(
      `INSERT INTO ${S}.deferred (id, state, run_at, type, payload, queue, priority, shard, attempts, created_at)
       SELECT g, 'scheduled', now() - interval '1 minute', 't', '{}', 'pl', 0, 0, 0, now()
         FROM generate_series(1, 20000) g`,
    );
    if (keyRows > 0)
      await pool.query(
        `INSERT INTO ${S}.task_keys (id, key) SELECT 10000000 + g, 'k' || g FROM generate_series(1, $1::int) g`,
        [keyRows],
      );
    await pool.query(`ANALYZE ${S}.deferred`);
    await pool.query(`ANALYZE ${S}.task_keys`);
    const out: string[] = [];
    for (const fn of ['promote_lane_before', 'promote_lane', 'promote_lane_before', 'promote_lane']) {
      await worker.query('BEGIN');
      const [n, ms] = await timed(async () => {
        let total = 0;
        for (let i = 0; i < 20; i++)
          total += (await worker.query(`SELECT ${S}.${fn}('pl', 0::smallint, 0::smallint, 1000) AS n`)).rows[0].n;
        return total;
      });
      await worker.query('ROLLBACK');
      assert.equal(n, 20000);
      out.push(`${fn} ${ms} ms`);
    }
    t.diagnostic(`task_keys rows ${keyRows}: ${out.join(', ')}`);
  }
});

test('held: a K = 1 key with 30 held tasks admits one per settlement, in order', async () => {
  await reset();
  const made = await enqueueKeyed(pool, S, Array(30).fill('seq'));
  const order: string[] = [];
  for (let i = 0; i < 30; i++) {
    await promoteHeldSql(pool, S, ['seq']);
    const ids = await liveIds(pool, S, 'seq');
    assert.equal(ids.length, 1);
    order.push(ids[0]!);
    await settle(pool, S, ids);
  }
  assert.deepEqual(
    order,
    made.map((m) => m.id),
  );
});
