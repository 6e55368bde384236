/**
 * Task results under the completion's fence (invariant 12), attacked where a batch is not the
 * happy case: lease-mates with different results, some of them taken over before the flush (the
 * remainder statement), a remainder that needs a second pass because a concurrent writer took an
 * entry while it ran, a batch naming an entry twice, a retried flush whose first try committed,
 * an operator's cancel, a dead letter retried, `ctx.dequeue`, and hostile returned values.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cancelTask, defineTask, enqueue, enqueueMany, getTask, retryTask } from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { claim, discover, type ClaimedTask } from '../src/processor/claim.js';
import { completeLeases } from '../src/storage/complete.js';
import { entryKey } from '../src/storage/attempt.js';
import { settledWith } from '../src/storage/settled.js';
import { storageFor } from '../src/storage/storage.js';
import { encodeResult } from '../src/processor/handler-result.js';
import { pruneResults } from '../src/storage/results.js';
import type { Queryable } from '../src/sql.js';
import { claimParams } from './claim-params.js';
import { freshSchema, takeLeaseOver, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('results_fence');
const S = `"${schema}"`;
const storage = storageFor(schema);

async function empty(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dead_letters, ${S}.dedupe, ${S}.task_results`,
  );
}

/** `n` tasks of one lane, claimed as one range lease, in lane order. */
async function oneLease(n: number): Promise<ClaimedTask[]> {
  await empty();
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 't', payload: { i }, shard: 0 })),
    { schema },
  );
  const lanes = [...new Set((await discover(pool, storage, null, 20)).map((c) => c.laneId))];
  const got = await claim(pool, claimParams(schema, lanes, n));
  assert.equal(got.length, n);
  assert.equal(new Set(got.map((t) => t.token)).size, 1, 'one range lease');
  return got.sort((a, b) => Number(BigInt(a.laneSeq) - BigInt(b.laneSeq)));
}

async function stored(): Promise<Map<string, unknown>> {
  const r = await pool.query<{ id: string; result: unknown }>(`SELECT id::text, result FROM ${S}.task_results`);
  return new Map(r.rows.map((x) => [x.id, x.result]));
}

async function settledCount(): Promise<{ n: number; settled: number }> {
  const r = await pool.query(
    `SELECT l.n, coalesce((SELECT sum(x.n) FROM ${S}.range_settlements x
                            WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq AND x.slot = l.slot), 0)::int AS settled
       FROM ${S}.range_leases l`,
  );
  return r.rows[0];
}

test('lease-mates with different results, some taken over before the flush: each won entry stores exactly its own result (main and remainder statements)', async () => {
  const [a, b, c, d, e] = await oneLease(5);
  assert.ok(a && b && c && d && e);
  // b and d are taken over (rescue after a lapse): the lease's row is dropped whole, the
  // remainder statement settles a, c, e. e carries no result (a mixed batch).
  await takeLeaseOver(pool, schema, b.id);
  await takeLeaseOver(pool, schema, d.id);
  const results = ['{"r":"a"}', '{"r":"b"}', '{"r":"c"}', '{"r":"d"}', null];
  const settled = await completeLeases(pool, storage, [a, b, c, d, e], undefined, results);
  assert.deepEqual([...settled].sort(), [a, c, e].map(entryKey).sort());
  assert.deepEqual(
    await stored(),
    new Map<string, unknown>([
      [a.id, { r: 'a' }],
      [c.id, { r: 'c' }],
    ]),
  );
  assert.deepEqual(await settledCount(), { n: 5, settled: 5 });

  // In the main statement: a batch in another order, with the results matched by entry, not position.
  const [f, g, h] = await oneLease(3);
  assert.ok(f && g && h);
  const won = await completeLeases(pool, storage, [h, f, g], undefined, ['"h"', '"f"', null]);
  assert.equal(won.size, 3);
  assert.deepEqual(
    await stored(),
    new Map<string, unknown>([
      [h.id, 'h'],
      [f.id, 'f'],
    ]),
  );
});

test('a remainder that needs a second pass (a concurrent writer took an entry while it ran) stores each result once, for the entries it settled', async () => {
  const [a, b, c, d] = await oneLease(4);
  assert.ok(a && b && c && d);
  await takeLeaseOver(pool, schema, b.id);
  // The first remainder pass is made to wait on a writer holding d's settlement uncommitted; that
  // writer commits, the pass's row is dropped by the constraint, and a second pass settles a, c.
  const other = await pool.connect();
  const texts: string[] = [];
  let injected = false;
  const write: Queryable = {
    query: (async (q: { text: string; values: unknown[] }) => {
      texts.push(q.text);
      if (injected || !q.text.includes('range_agg')) return pool.query(q);
      injected = true;
      await other.query('BEGIN');
      await other.query(
        `INSERT INTO ${S}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
         SELECT slot, lane_id, lease_from, int8multirange(int8range(lane_seq, lane_seq + 1)), 1, 'rescued'
           FROM ${S}.leased_entries WHERE id = $1`,
        [d.id],
      );
      const pid = (await other.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      const pending = pool.query(q);
      await waitFor(
        async () =>
          (await pool.query(`SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, [pid])).rows
            .length > 0,
        10_000,
        'the remainder pass waits on the uncommitted settlement',
      );
      await other.query('COMMIT');
      return pending;
    }) as Queryable['query'],
  };
  try {
    const settled = await completeLeases(write, storage, [a, b, c, d], undefined, ['1', '2', '3', '4']);
    assert.deepEqual([...settled].sort(), [a, c].map(entryKey).sort());
  } finally {
    other.release();
  }
  assert.equal(texts.filter((t) => t.includes('range_agg')).length, 2, 'two remainder passes');
  assert.deepEqual(
    await stored(),
    new Map<string, unknown>([
      [a.id, 1],
      [c.id, 3],
    ]),
  );
  assert.deepEqual(await settledCount(), { n: 4, settled: 4 });
});

test('a batch naming an entry twice with results completes it once and stores one result (never a failed batch)', async () => {
  const [a, b] = await oneLease(2);
  assert.ok(a && b);
  const settled = await completeLeases(pool, storage, [a, a, b], undefined, ['"a1"', '"a2"', '"b"']);
  assert.deepEqual([...settled].sort(), [a, b].map(entryKey).sort());
  const got = await stored();
  assert.equal(got.size, 2);
  assert.equal(got.get(a.id), 'a1', 'the first naming of the entry is kept');
  assert.equal(got.get(b.id), 'b');
  assert.deepEqual(await settledCount(), { n: 2, settled: 2 });

  // The same through the remainder statement (a lease-mate taken over first).
  const [c, d, e] = await oneLease(3);
  assert.ok(c && d && e);
  await takeLeaseOver(pool, schema, e.id);
  const again = await completeLeases(pool, storage, [c, d, d, e], undefined, ['"c"', '"d1"', '"d2"', '"e"']);
  assert.deepEqual([...again].sort(), [c, d].map(entryKey).sort());
  assert.deepEqual(
    await stored(),
    new Map<string, unknown>([
      [c.id, 'c'],
      [d.id, 'd1'],
    ]),
  );
});

test('a retried flush whose first try committed stores nothing again: the first result stays, settledWith finds the completions', async () => {
  const [a, b] = await oneLease(2);
  assert.ok(a && b);
  assert.equal((await completeLeases(pool, storage, [a, b], undefined, ['"first"', null])).size, 2);
  const before = (await pool.query(`SELECT id::text, result, stored_at FROM ${S}.task_results ORDER BY id`)).rows;
  // The batcher's retry after a dropped connection sends the same batch (its result now another
  // value, as a re-encoded one could be) and then asks settledWith.
  assert.equal((await completeLeases(pool, storage, [a, b], undefined, ['"second"', '"late"'])).size, 0);
  const again = await settledWith(pool, storage, [a, b], 'completed');
  assert.deepEqual([...again.keys()].sort(), [a, b].map(entryKey).sort());
  const after = (await pool.query(`SELECT id::text, result, stored_at FROM ${S}.task_results ORDER BY id`)).rows;
  assert.deepEqual(after, before);
  assert.deepEqual(await settledCount(), { n: 2, settled: 2 });
});

test('an operator cancel mid-run stores no result; a dead letter retried stores the result of the run that completes it', async () => {
  await empty();
  const def = defineTask<{ mode: string }>({
    type: 'rf_cancel',
    ceilingMs: 10_000,
    maxAttempts: 1,
    handler: async (p, ctx) => {
      if (p.mode === 'cancel') {
        assert.equal(await cancelTask(pool, schema, ctx.id, { actor: 'test' }), 'cancelled');
        return { shouldNot: 'store' };
      }
      if (p.mode === 'die') throw new Error('first run dies');
      return { second: true };
    },
  });
  const cancelled = await enqueue(pool, def, { mode: 'cancel' }, { schema });
  const [r1] = await runDueTasks(pool, [def], { schema });
  assert.equal(r1?.status, 'cancelled');
  assert.equal(r1?.result, null);
  const read = await getTask(pool, schema, cancelled.id!);
  assert.equal(read?.state, 'cancelled', 'a cancelled task stays visible');
  assert.equal(read?.result, null, 'and carries no result');
  assert.equal((await stored()).size, 0);

  const dying = await enqueue(pool, def, { mode: 'die' }, { schema });
  const [r2] = await runDueTasks(pool, [def], { schema });
  assert.equal(r2?.status, 'dead');
  // Retried: the payload is kept, so it dies again; a dead letter has no result either way.
  await pool.query(`UPDATE ${S}.dead_letters SET payload = '{"mode":"live"}' WHERE id = $1`, [dying.id]);
  assert.equal(await retryTask(pool, schema, dying.id!), 'retried');
  const [r3] = await runDueTasks(pool, [def], { schema });
  assert.equal(r3?.status, 'completed');
  assert.deepEqual(r3?.result, { second: true });
  assert.deepEqual((await getTask(pool, schema, dying.id!))?.result, { second: true });
  assert.equal(await retryTask(pool, schema, dying.id!), 'not_retryable', 'a completed task does not run again');
});

test('ctx.dequeue and a returned value: the task completes, no result is stored, the run counts a success', async () => {
  await empty();
  const def = defineTask<unknown>({
    type: 'rf_dequeue',
    ceilingMs: 10_000,
    handler: async (_p, ctx) => {
      await ctx.dequeue(pool);
      return { ignored: true };
    },
  });
  const { id } = await enqueue(pool, def, {}, { schema });
  const [r] = await runDueTasks(pool, [def], { schema });
  assert.equal(r?.outcome, 'success');
  assert.equal(r?.result, null, 'the report says what was stored: nothing');
  const t = await getTask(pool, schema, id!);
  assert.equal(t?.state, 'completed');
  assert.equal(t?.result, null);
  assert.equal((await stored()).size, 0);
});

test('hostile returned values (a throwing toJSON or getter, Proxies, a revoked Proxy) fail the attempt with an error that says why; the worker carries on', async () => {
  await empty();
  const trap = new Proxy(
    {},
    {
      get() {
        throw new Error('trap says no');
      },
    },
  );
  const { proxy: revoked, revoke } = Proxy.revocable({}, {});
  revoke();
  // A Proxy whose trap throws from its third read on (the first is the promise's `then`, the second
  // the snooze check): whatever reads the value again breaks.
  let reads = 0;
  const flaky = new Proxy(
    {},
    {
      get(_t, key) {
        if (key === 'toJSON') return undefined;
        if (++reads > 2) throw new Error('flaky trap');
        return undefined;
      },
      ownKeys: () => [],
    },
  );
  const bare = Object.create(null) as object;
  const values: unknown[] = [
    {
      toJSON() {
        throw new Error('toJSON failed');
      },
    },
    {
      get boom() {
        throw new Error('getter failed');
      },
    },
    {
      toJSON() {
        throw bare; // a thrown value with no message and no string form
      },
    },
    trap,
    revoked,
    flaky,
  ];
  for (const v of values) {
    const encoded = (() => {
      try {
        return encodeResult(v, 1000);
      } catch (err) {
        return { threw: (err as Error).message };
      }
    })();
    assert.ok(!('threw' in encoded), `encodeResult threw: ${JSON.stringify(encoded)}`);
  }
  reads = 0;
  const def = defineTask<{ i: number }>({
    type: 'rf_hostile',
    ceilingMs: 10_000,
    maxAttempts: 1,
    handler: async (p) => values[p.i] as object,
  });
  const ok = defineTask<unknown>({ type: 'rf_fine', ceilingMs: 10_000, handler: async () => ({ fine: true }) });
  const fine = await enqueue(pool, ok, {}, { schema });
  for (let i = 0; i < values.length; i++) await enqueue(pool, def, { i }, { schema });
  const reports = await runDueTasks(pool, [def, ok], { schema });
  const all = reports.filter((r) => r.type === 'rf_hostile').sort((x, y) => Number(BigInt(x.id) - BigInt(y.id)));
  // The flaky Proxy is read once: its snooze check passes, and its JSON is `{}`.
  const last = all.pop();
  assert.deepEqual([last?.status, last?.result], ['completed', {}]);
  const hostile = all;
  assert.deepEqual(
    hostile.map((r) => r.status),
    hostile.map(() => 'dead'),
  );
  // A throwing toJSON or getter, and a thrown value with no message: the value is refused, saying why.
  for (const r of hostile.slice(0, 3))
    assert.match(r.error ?? '', /^handler returned .*a result must be a JSON value$/, `error: ${r.error}`);
  assert.match(hostile[0]!.error!, /toJSON failed/);
  assert.match(hostile[1]!.error!, /getter failed/);
  // A Proxy whose `get` throws, or a revoked one, rejects the handler's own promise while it
  // resolves (reading `then`): a failure with the trap's error, as a throw would be.
  assert.equal(hostile[3]!.error, 'trap says no');
  assert.match(hostile[4]!.error!, /revoked/);
  assert.deepEqual((await getTask(pool, schema, fine.id!))?.result, { fine: true });
  assert.deepEqual([...(await stored()).keys()].sort(), [fine.id!, last!.id].sort());
});

test('the result retention deletes through the stored_at index, oldest first, a batch at a time', async () => {
  await empty();
  await pool.query(
    `INSERT INTO ${S}.task_results (id, attempt, result, stored_at)
     SELECT g, 1, '{}'::jsonb, now() - make_interval(mins => g) - interval '30 seconds' FROM generate_series(1, 20000) g`,
  );
  await pool.query(`ANALYZE ${S}.task_results`);
  // The production statement, as pruneResults sends it.
  const sent: { text: string; values: unknown[] }[] = [];
  const capture: Queryable = {
    query: (async (q: { text: string; values: unknown[] }) => {
      sent.push(q);
      return pool.query(`EXPLAIN ${q.text}`, q.values);
    }) as Queryable['query'],
  };
  await pruneResults(capture, storage, 3600_000, 5000);
  const explained = await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${sent[0]!.text}`, sent[0]!.values);
  const plan = explained.rows.map((r) => r['QUERY PLAN']).join('\n');
  assert.match(plan, /Index Scan using task_results_stored_at_idx/, plan);
  assert.match(plan, /Index Scan using task_results_pkey/, plan);
  assert.doesNotMatch(plan, /Seq Scan/, plan);
  assert.equal(
    await pruneResults(pool, storage, 3600_000, 5000),
    20000 - 59,
    'every result older than the hour (5,000 a statement)',
  );
  assert.equal((await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_results`)).rows[0].n, 59);
});
