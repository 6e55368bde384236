/**
 * A flush in parts (FLUSH_MAX_COMPLETIONS completions a statement): one range lease of 12,000
 * entries completed in one flush, which flushParts splits into three statements
 * (5,000 / 5,000 / 2,000). The second part fails as a dropped connection,
 * either before reaching the server or after it committed unseen. Checks: every answer settled,
 * each entry settled exactly once, the lease's settlement rows sum to its n, one attempt-history
 * row per task, results stored once. Also: a wrong-token entry inside part 2 is refused alone.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import type { ClaimedTask } from '../src/processor/claim.js';
import { FLUSH_MAX_COMPLETIONS, SettlementBatcher } from '../src/processor/settlement-batcher.js';
import { storageFor } from '../src/storage/storage.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import type { Queryable } from '../src/sql.js';
import { claimedTasks } from './claimed-tasks.js';
import { freshSchema, testLogger } from './helpers.js';

const { schema, pool } = await freshSchema('split');
const S = `"${schema}"`;
const N = 2 * FLUSH_MAX_COMPLETIONS + 2_000;

/** Fails the `nth` completion statement (1-based) once as a dropped connection; `after`: once it committed. */
function flaky(c: pg.PoolClient, nth: number, after: boolean): Queryable & { failed: number; completes: number } {
  const q = {
    failed: 0,
    completes: 0,
    query: async (...args: unknown[]) => {
      const first = args[0] as { text?: string; name?: string } | string;
      const name = typeof first === 'string' ? '' : (first.name ?? '');
      if (name.startsWith('berth-complete')) q.completes++;
      if (name.startsWith('berth-complete') && q.completes === nth && q.failed === 0) {
        q.failed++;
        if (after) await (c.query as (...x: unknown[]) => Promise<unknown>)(...args);
        throw Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
      }
      return (c.query as (...x: unknown[]) => Promise<unknown>)(...args);
    },
  };
  return q as unknown as Queryable & { failed: number; completes: number };
}

async function check(tasks: ClaimedTask[], what: string, refusedSeq?: string) {
  const leases = await pool.query<{ lane_id: number; from_seq: string; n: string; rows: string; sum: string }>(
    `SELECT l.lane_id, l.from_seq::text, (l.to_seq - l.from_seq + 1)::text AS n,
            (SELECT count(*) FROM ${S}.range_settlements s WHERE s.lane_id = l.lane_id AND s.lease_from = l.from_seq)::text AS rows,
            (SELECT coalesce(sum(s.n), 0) FROM ${S}.range_settlements s WHERE s.lane_id = l.lane_id AND s.lease_from = l.from_seq)::text AS sum
       FROM ${S}.range_leases l`,
  );
  const totalN = leases.rows.reduce((a, r) => a + Number(r.n), 0);
  assert.equal(totalN, tasks.length, `${what}: leases cover the claim`);
  const expected = refusedSeq === undefined ? tasks.length : tasks.length - 1;
  const sum = leases.rows.reduce((a, r) => a + Number(r.sum), 0);
  assert.equal(sum, expected, `${what}: settlements sum to the settled entries (${JSON.stringify(leases.rows)})`);
  const hist = await pool.query<{ n: string; d: string }>(
    `SELECT count(*)::text AS n, count(DISTINCT id)::text AS d FROM ${S}.attempt_history, unnest(ids) AS id WHERE outcome = 'success'`,
  );
  assert.equal(hist.rows[0]!.n, String(expected), `${what}: one history row per completed task`);
  assert.equal(hist.rows[0]!.d, String(expected));
  console.log(
    what,
    'leases',
    leases.rows.map((r) => `${r.n} entries / ${r.rows} rows / sum ${r.sum}`),
  );
}

for (const after of [false, true]) {
  test(`a lease split over three statements, the second failing ${after ? 'after committing' : 'before reaching the server'}: each entry settled once, answers right`, async () => {
    const tasks = await claimedTasks(pool, schema, N, ['q']);
    const c = await pool.connect();
    try {
      const db = flaky(c, 2, after);
      const batcher = new SettlementBatcher(db, storageFor(schema), new BerthMetrics(), testLogger);
      // A blocker first so the rest form one round; results on a few entries of every part.
      const [head, ...rest] = tasks;
      const p0 = batcher.complete(head!);
      const wrong = rest[FLUSH_MAX_COMPLETIONS + 10]!; // lands in part 2
      const ps = rest.map((t, i) =>
        batcher.complete(
          t === wrong ? { ...t, token: '00000000-0000-0000-0000-000000000000' } : t,
          1,
          i % 1000 === 0 ? (JSON.stringify({ i }) as never) : null,
        ),
      );
      const answers = await Promise.all([p0, ...ps]);
      await batcher.drain();
      assert.equal(db.failed, 1, 'the second part failed once');
      const kinds = new Map<string, number>();
      for (const a of answers) kinds.set(a.kind, (kinds.get(a.kind) ?? 0) + 1);
      assert.deepEqual(Object.fromEntries(kinds), { settled: N - 1, refused: 1 }, 'answers');
      assert.equal(answers[1 + rest.indexOf(wrong)]!.kind, 'refused', 'the wrong token is the refused one');
      await check(tasks, `after=${after}`, wrong.laneSeq);
      const results = await pool.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${S}.task_results`);
      assert.equal(results.rows[0]!.n, String(Math.ceil((N - 1) / 1000)), 'results stored once each');
    } finally {
      c.release();
    }
  });
}

test('12,000 failures of one lease in one flush: three statements, each entry settled once, every answer settled', async () => {
  const tasks = await claimedTasks(pool, schema, N, ['q']);
  const batcher = new SettlementBatcher(pool, storageFor(schema), new BerthMetrics(), testLogger);
  const [head, ...rest] = tasks;
  const p0 = batcher.fail({ ref: head!, error: 'x', delayMs: 60_000, permanent: false });
  const ps = rest.map((t, i) => batcher.fail({ ref: t, error: 'x', delayMs: 60_000, permanent: i % 2 === 0 }));
  const answers = await Promise.all([p0, ...ps]);
  await batcher.drain();
  const kinds = new Map<string, number>();
  for (const a of answers) {
    const k = a.kind === 'settled' ? `settled:${a.dead}` : a.kind;
    kinds.set(k, (kinds.get(k) ?? 0) + 1);
  }
  assert.deepEqual(Object.fromEntries(kinds), { 'settled:false': N / 2, 'settled:true': N / 2 }, 'answers');
  const s = await pool.query<{ rows: string; sum: string }>(
    `SELECT count(*)::text AS rows, sum(n)::text AS sum FROM ${S}.range_settlements`,
  );
  assert.equal(s.rows[0]!.sum, String(N), 'settlements sum to n');
  const d = await pool.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${S}.dead_letters`);
  assert.equal(d.rows[0]!.n, String(N / 2), 'dead letters once each');
});
