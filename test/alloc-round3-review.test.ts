/**
 * Adversarial review of the third allocation round (09eef4a..e47ae38) with a worker and the
 * database: the answer's reaction pair reused from a free list (answers attributed to the right
 * task under concurrency, thenables that answer twice, late or re-entrantly), the running list
 * (a cancel among tasks at the same lane position in other lanes), and the handler's context
 * (lane identity, deadline value, signal at the deadline, JSON).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cancelTask, defineTask, enqueue, getTask, type TaskContext, Worker } from '../src/index.js';
import { DeadlineAbort } from '../src/errors.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { quoteIdent } from '../src/sql.js';
import { rescueLapsedLeases } from '../src/storage/rescue.js';
import {
  DATABASE_URL,
  expectOutcome,
  FAST_MAINTENANCE,
  freshSchema,
  outcomes,
  testLogger,
  waitFor,
} from './helpers.js';

const { schema, pool } = await freshSchema('alloc_round3');
const S = quoteIdent(schema);

function worker(tasks: AnyTaskDefinition[], queues: string[], extra: Record<string, unknown> = {}): Worker {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    queues,
    logger: testLogger,
    maintenance: { ...FAST_MAINTENANCE, ringRotateAfterMs: 3_600_000 },
    heartbeatIntervalMs: false,
    pollIntervalMs: 100,
    ...extra,
  });
}

const later = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

async function reactionsRound(slots: number, N: number): Promise<void> {
  const type = `r3_react_${slots}`;
  const lateCalls: (() => void)[] = [];
  const def = defineTask<{ n: number }>({
    type,
    ceilingMs: 60_000,
    handler: ((p: { n: number }) => {
      const n = p.n;
      const mine = { n };
      switch (n % 8) {
        case 0:
          return mine;
        case 1:
          return later(n % 7).then(() => mine);
        case 2:
          return {
            // biome-ignore lint/suspicious/noThenProperty: a thenable that answers twice, then again later
            then(ok: (v: unknown) => void, no: (e: unknown) => void) {
              ok(mine);
              no(new Error(`second ${n}`));
              lateCalls.push(() => {
                ok({ n: -n, late: true });
                no(new Error(`late ${n}`));
              });
            },
          };
        case 3:
          return {
            // biome-ignore lint/suspicious/noThenProperty: a thenable that answers on a timer, twice
            then(ok: (v: unknown) => void) {
              setTimeout(() => {
                ok(mine);
                ok({ n: -n });
              }, n % 5);
            },
          };
        case 4:
          return {
            // biome-ignore lint/suspicious/noThenProperty: a thenable rejecting then resolving
            then(ok: (v: unknown) => void, no: (e: unknown) => void) {
              queueMicrotask(() => {
                no(Object.assign(new Error(`fail ${n}`), { permanent: true }));
                ok({ n: -n });
              });
            },
          };
        case 5:
          throw new Error(`sync ${n}`);
        case 6:
          // A promise that settles, whose then is given the answer of a promise that settles
          // to another handler's answer shape later (nested thenable chain).
          return Promise.resolve({
            // biome-ignore lint/suspicious/noThenProperty: a thenable inside a native promise
            then(ok: (v: unknown) => void) {
              void later(n % 3).then(() => ok(mine));
            },
          });
        default:
          return Promise.reject(new Error(`rejected ${n}`));
      }
    }) as never,
  });
  const w = worker([def], [type], { slots, prefetch: slots });
  const ids = new Map<string, number>();
  for (let n = 0; n < N; n++) {
    const { id } = await enqueue(pool, def, { n }, { schema, queue: type, maxAttempts: 1 });
    ids.set(id!, n);
  }
  const fails = [...ids.values()].filter((n) => [4, 5, 7].includes(n % 8)).length;
  await w.start();
  try {
    await expectOutcome(w.metrics, type, 'success', N - fails);
    await expectOutcome(w.metrics, type, 'failure', fails);
    // Late calls after every task settled: nothing changes, nothing throws.
    for (const f of lateCalls) f();
    await later(50);
  } finally {
    await w.stop();
  }
  const rows = await pool.query<{ id: string; result: { n: number } }>(
    `SELECT id, result FROM ${S}.task_results WHERE id = ANY($1::bigint[])`,
    [[...ids.keys()]],
  );
  const wrong: string[] = [];
  for (const r of rows.rows) {
    const n = ids.get(r.id);
    if (n === undefined || r.result.n !== n) wrong.push(`${r.id}: ${n} got ${JSON.stringify(r.result)}`);
  }
  assert.deepEqual(wrong, []);
  assert.equal(rows.rows.length, N - fails);
  for (const [id, n] of ids) {
    const t = await getTask(pool, schema, id);
    assert.equal(t?.state, [4, 5, 7].includes(n % 8) ? 'dead' : 'completed', `task ${n}`);
  }
  assert.equal(await outcomes(w.metrics, type, 'lost'), 0);
}

test('reaction pairs reused: 400 tasks on 16 slots and 80 on one (a pair reused by every next task), answers of every kind settling in any order (thenables answering twice, late, synchronously, after the task settled): each task’s own result stored, each counted once', async () => {
  await reactionsRound(16, 400);
  await reactionsRound(1, 80);
});

test('a cancel among running tasks at the same lane position in other lanes (other queues and priorities): only the named one aborted, in any order of the running list', async () => {
  const queues = ['r3_cq_a', 'r3_cq_b', 'r3_cq_c'];
  const runs = new Map<string, { aborted: string | null; ctx: TaskContext<unknown> }>();
  const defs = queues.map((q) =>
    defineTask<Record<string, never>>({
      type: q,
      ceilingMs: 60_000,
      handler: async (_p, ctx) => {
        const run = { aborted: null as string | null, ctx };
        runs.set(ctx.id, run);
        await new Promise<void>((resolve) => {
          if (ctx.signal.aborted) return resolve();
          ctx.signal.addEventListener('abort', () => resolve(), { once: true });
        });
        run.aborted = (ctx.signal.reason as { code?: string }).code ?? 'unknown';
        throw ctx.signal.reason;
      },
    }),
  );
  // Each queue at two priorities: six lanes, each with one task at its first position.
  const ids: string[] = [];
  for (const q of queues)
    for (const priority of [0, 1]) {
      const { id } = await enqueue(pool, q, {}, { schema, queue: q, priority, shard: 0 });
      ids.push(id!);
    }
  // The precondition: six lanes, every task at the same lane position.
  const shape = await pool.query<{ lanes: number; seqs: number }>(
    `SELECT count(DISTINCT lane_id)::int AS lanes, count(DISTINCT lane_seq)::int AS seqs FROM ${S}.ready WHERE id = ANY($1::bigint[])`,
    [ids],
  );
  assert.deepEqual(shape.rows[0], { lanes: 6, seqs: 1 });
  const w = worker(defs, queues, { slots: 8 });
  await w.start();
  try {
    await waitFor(() => runs.size === ids.length, 20_000, 'all six handlers to start').catch((e) => {
      throw new Error(`${(e as Error).message}: ${runs.size} started`);
    });
    // Cancel the middle one, then the last enqueued, then the first: none of the others aborted.
    const order = [ids[2]!, ids[5]!, ids[0]!];
    const aborted = new Set<string>();
    for (const id of order) {
      assert.equal(await cancelTask(pool, schema, id, { actor: 'review' }), 'cancelled');
      await waitFor(() => runs.get(id)?.aborted, 20_000, `the cancel of ${id} to abort its handler`);
      aborted.add(id);
      for (const other of ids)
        if (!aborted.has(other)) assert.equal(runs.get(other)?.aborted, null, `${other} aborted by ${id}'s cancel`);
      assert.equal(runs.get(id)?.aborted, 'CANCEL_ABORT');
    }
    for (const q of queues) await expectOutcome(w.metrics, q, 'cancelled', 1);
  } finally {
    await w.stop();
  }
});

test('ctx.lane: one frozen object for tasks of one lane, its own for another lane; ctx.deadline is the lease’s expiry minus the margin; ctx.signal aborts at it with a DeadlineAbort', async () => {
  const type = 'r3_ctx';
  const seen: { id: string; lane: object; frozen: boolean; deadline: number; json: string; reason?: unknown }[] = [];
  const def = defineTask<{ wait?: boolean }>({
    type,
    ceilingMs: 3_000,
    handler: async (p, ctx) => {
      const entry = {
        id: ctx.id,
        lane: ctx.lane,
        frozen: Object.isFrozen(ctx.lane),
        deadline: ctx.deadline.getTime(),
        json: JSON.stringify({ ...ctx, logger: undefined }),
        reason: undefined as unknown,
      };
      seen.push(entry);
      if (p.wait) {
        await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
        entry.reason = ctx.signal.reason;
      }
    },
  });
  const margin = 500;
  const w = worker([def], [type, `${type}_2`], { slots: 1, leaseMarginMs: margin });
  const a = await enqueue(pool, def, {}, { schema, queue: type, shard: 0 });
  const b = await enqueue(pool, def, {}, { schema, queue: type, shard: 0 });
  const c = await enqueue(pool, def, {}, { schema, queue: `${type}_2`, shard: 0 });
  const d = await enqueue(pool, def, { wait: true }, { schema, queue: type, shard: 0 });
  await w.start();
  try {
    await waitFor(
      () => seen.find((s) => s.id === d.id)?.reason,
      30_000,
      'the waiting handler to be aborted at its deadline',
    );
    await expectOutcome(w.metrics, type, 'success', 4);
  } finally {
    await w.stop();
  }
  const by = (id: string | null | undefined) => seen.find((s) => s.id === id)!;
  assert.equal(by(a.id).lane, by(b.id).lane);
  assert.equal(by(a.id).lane, by(d.id).lane);
  assert.notEqual(by(a.id).lane, by(c.id).lane);
  assert.deepEqual({ ...by(c.id).lane }, { queue: `${type}_2`, priority: 0, shard: 0 });
  assert.ok(seen.every((s) => s.frozen));
  assert.ok(by(d.id).reason instanceof DeadlineAbort);
  // The deadline each handler saw: its lease's expiry (as the claim stamped it) minus the margin.
  const leases = await pool.query<{ e: Date }>(`SELECT DISTINCT unnest(type_expires) AS e FROM ${S}.range_leases`);
  const expiries = leases.rows.map((r) => r.e.getTime() - margin);
  if (expiries.length > 0)
    for (const s of seen)
      assert.ok(
        expiries.some((e) => Math.abs(e - s.deadline) <= 1),
        `deadline ${s.deadline} not a lease's expiry − margin (${expiries.join(', ')})`,
      );
  for (const s of seen) {
    const j = JSON.parse(s.json) as Record<string, unknown>;
    assert.deepEqual(Object.keys(j), [
      'id',
      'type',
      'attempt',
      'maxAttempts',
      'snoozes',
      'lane',
      'deadline',
      'schema',
      'token',
      'schedule',
      'signal',
    ]);
    assert.equal(j.deadline, new Date(s.deadline).toISOString());
  }
});

test('one task running twice in this worker (a stuck first attempt whose protection was lost, rescued and claimed here again): a cancel reaches the second run', async () => {
  const type = 'r3_dup';
  let releaseFirst: () => void = () => {};
  const firstDone = new Promise<void>((r) => {
    releaseFirst = r;
  });
  const runs: { attempt: number; aborted: string | null }[] = [];
  const def = defineTask<Record<string, never>>({
    type,
    ceilingMs: 8_000,
    handler: async (_p, ctx) => {
      const run = { attempt: ctx.attempt, aborted: null as string | null };
      runs.push(run);
      if (ctx.attempt === 1) {
        // Ignores its signal: runs on past its deadline until the test lets it go.
        await firstDone;
        return;
      }
      await new Promise<void>((resolve) => {
        if (ctx.signal.aborted) return resolve();
        ctx.signal.addEventListener('abort', () => resolve(), { once: true });
      });
      run.aborted = (ctx.signal.reason as { code?: string }).code ?? 'unknown';
      throw ctx.signal.reason;
    },
  });
  const w = worker([def], [type], { slots: 2, leaseMarginMs: 500 });
  const { id } = await enqueue(pool, def, {}, { schema, queue: type, maxAttempts: 3 });
  await w.start();
  try {
    await waitFor(() => runs.length === 1, 20_000, 'the first attempt to start');
    // The stuck guard's overdue row, deleted as it is written: rescue takes the lease once it lapses.
    await waitFor(
      async () => {
        await pool.query(`DELETE FROM ${S}.overdue_leases`);
        await rescueLapsedLeases(pool, schema);
        return runs.length >= 2;
      },
      60_000,
      'the second attempt to start here while the first still runs',
    );
    assert.equal(runs[1]!.attempt, 2);
    assert.equal(runs[0]!.aborted, null);
    // What this found: the retry is a new lane position (a lease of its own, another entry key),
    // so the running list never holds one key twice; a cancel names the second run's.
    const held = await pool.query<{ n: number }>(
      `SELECT count(DISTINCT (lane_id, from_seq))::int AS n FROM ${S}.range_leases WHERE $1 = ANY (types)`,
      [type],
    );
    assert.equal(held.rows[0]!.n, 2);
    assert.equal(await cancelTask(pool, schema, id!, { actor: 'review' }), 'cancelled');
    await waitFor(() => runs[1]!.aborted, 30_000, 'the second run to be aborted');
    assert.equal(runs[1]!.aborted, 'CANCEL_ABORT');
  } finally {
    releaseFirst();
    await w.stop();
  }
});
