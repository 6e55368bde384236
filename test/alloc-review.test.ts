/**
 * Review of the worker's allocation cuts (merge b40bcc9: the engine runs runTask's and
 * settleTask's steps in its own frame, the batcher answers completions through one promise per
 * flush, run times go as one integer[] literal). Attacked where a flush is not the happy case:
 * completions handed in while a flush is in flight, a flush whose statement fails (kept failing,
 * connection cut, committed unseen), a drain that gives up, a flush in parts, hostile run times,
 * and refused completions and a stop with completions pending on the engine's own path.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cancelTask, defineTask, enqueue, enqueueMany, getTask, snooze, Worker } from '../src/index.js';
import type { ClaimedTask } from '../src/processor/claim.js';
import { type CompleteResult, type Completion, SettlementBatcher } from '../src/processor/settlement-batcher.js';
import { completeLeases } from '../src/storage/complete.js';
import { entryKey } from '../src/storage/attempt.js';
import { storageFor } from '../src/storage/storage.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import type { Queryable } from '../src/sql.js';
import { claimedTasks } from './claimed-tasks.js';
import {
  captureLogger,
  DATABASE_URL,
  expectOutcome,
  freshSchema,
  outcomes,
  takeLeaseOver,
  testLogger,
  waitFor,
  within,
} from './helpers.js';

const { schema, pool } = await freshSchema('alloc_review');
const S = `"${schema}"`;
const storage = storageFor(schema);

/** `n` fresh tasks claimed (one lane per queue given), in lane order. */
const claimed = (n: number, queues: string[] = ['q']): Promise<ClaimedTask[]> => claimedTasks(pool, schema, n, queues);

const stolen = (t: ClaimedTask) => ({ ...t, token: '00000000-0000-0000-0000-000000000000' });

function isCompletion(q: unknown): boolean {
  const name = (q as { name?: string })?.name ?? '';
  return name.startsWith('berth-complete');
}

/**
 * The pool, with the completion statement's calls passed to `hook` (call number from 1): it may
 * wait, throw before sending, or run the query and then throw (a commit the caller never saw).
 */
function faulty(hook: (call: number, run: () => Promise<unknown>) => Promise<unknown>): Queryable & { calls: number } {
  const db = {
    calls: 0,
    query: (...args: unknown[]) => {
      const run = () => (pool.query as (...x: unknown[]) => Promise<unknown>)(...args);
      if (!isCompletion(args[0])) return run();
      db.calls++;
      return hook(db.calls, run);
    },
  };
  return db as unknown as Queryable & { calls: number };
}

const connectionError = () => Object.assign(new Error('Connection terminated unexpectedly'), { code: '08006' });
const statementError = () => Object.assign(new Error('injected statement error'), { code: 'XX000' });

async function answerOf(c: Completion): Promise<CompleteResult> {
  await c.flushed;
  assert.notEqual(c.answer, undefined, 'the answer is set before its round resolves');
  return c.answer!;
}

test('completions handed in while a flush is in flight go to the next round, with its own promise and each task its own answer', async () => {
  const [a, b, c, d] = await claimed(4, ['q1', 'q2', 'q3', 'q4']);
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const db = faulty(async (call, run) => {
    if (call === 1) await gate;
    return run();
  });
  const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
  const first = batcher.completion(a!, 1, null);
  await waitFor(() => db.calls === 1, 5_000, 'the first flush in flight');
  const second = batcher.completion(stolen(b!), 2, null);
  const third = batcher.completion(c!, 3, '{"r":3}');
  const viaComplete = batcher.complete(d!, 4, null);
  assert.notEqual(second.flushed, first.flushed, 'a new round while the first is in flight');
  assert.equal(third.flushed, second.flushed, 'one promise for the whole next round');
  let secondDone = false;
  void second.flushed.then(() => (secondDone = true));
  release();
  assert.deepEqual(await within(answerOf(first), 10_000, 'first'), { kind: 'settled' });
  assert.deepEqual(await within(answerOf(second), 10_000, 'second'), { kind: 'refused' });
  assert.deepEqual(await within(answerOf(third), 10_000, 'third'), { kind: 'settled' });
  assert.deepEqual(await within(viaComplete, 10_000, 'complete()'), { kind: 'settled' });
  assert.ok(secondDone);
  assert.equal(db.calls, 2, 'two flushes: the first alone, then the three handed in meanwhile');
  assert.equal((await getTask(pool, schema, b!.id))?.state, 'running', 'the stolen token settled nothing');
  assert.deepEqual(
    (await pool.query(`SELECT result FROM ${S}.task_results WHERE id = $1`, [c!.id])).rows.map((r) => r.result),
    [{ r: 3 }],
  );
  await batcher.drain();
  assert.equal(batcher.pending, 0);
});

test('a completion statement that keeps failing (statement error) answers every completion unwritten after its retries; none hangs', async () => {
  const ts = await claimed(3, ['q1', 'q2']);
  const db = faulty(async () => {
    throw statementError();
  });
  const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
  const cs = ts.slice(0, 2).map((t) => batcher.completion(t, 5, null));
  const viaComplete = batcher.complete(ts[2]!, 5, null);
  for (const c of cs) {
    const a = await within(answerOf(c), 20_000, 'an answer');
    assert.equal(a.kind, 'unwritten');
    assert.match((a as { error: string }).error, /injected statement error/);
  }
  assert.equal((await within(viaComplete, 20_000, 'complete()')).kind, 'unwritten');
  // The first completion flushes alone at once; the other two wait for it and form the next round.
  assert.equal(db.calls, 8, 'OTHER_ERROR_ATTEMPTS tries per flush, then given up');
  await within(batcher.drain(), 5_000, 'drain');
  for (const t of ts) assert.equal((await getTask(pool, schema, t.id))?.state, 'running', 'nothing written');
});

test('a connection cut before the statement, and one after it committed unseen: retried, answered settled (never refused), written once', async () => {
  const ts = await claimed(4, ['q1', 'q2']);
  // First flush: cut before it reaches the server. Second flush: committed, then the cut.
  const db = faulty(async (call, run) => {
    if (call === 1) throw connectionError();
    if (call === 3) {
      await run();
      throw connectionError();
    }
    return run();
  });
  const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
  const a = batcher.completion(ts[0]!, 1, null);
  assert.deepEqual(await within(answerOf(a), 10_000, 'after the cut'), { kind: 'settled' });
  const rest = ts.slice(1).map((t) => batcher.completion(t, 2, '{"x":1}'));
  for (const c of rest)
    assert.deepEqual(await within(answerOf(c), 10_000, 'after an unseen commit'), { kind: 'settled' });
  for (const t of ts) assert.equal((await getTask(pool, schema, t.id))?.state, 'completed');
  const h = await pool.query(`SELECT count(*)::int AS n FROM ${S}.attempt_history, unnest(ids) AS i`);
  assert.equal(h.rows[0].n, 4, 'one history record per task: the retry wrote nothing twice');
});

test('connection faults until drain(giveUpAfterMs): drain returns and every pending completion is answered unwritten', async () => {
  const ts = await claimed(3, ['q1', 'q2', 'q3']);
  const db = faulty(async () => {
    throw connectionError();
  });
  const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
  const first = batcher.completion(ts[0]!, 1, null);
  await waitFor(() => db.calls >= 1, 5_000, 'the first flush failing');
  // Handed in while the first flush retries: the next round.
  const later = ts.slice(1).map((t) => batcher.completion(t, 1, null));
  const started = Date.now();
  await within(batcher.drain(300), 10_000, 'drain gives up');
  assert.ok(Date.now() - started < 5_000, 'a stop does not wait out the 60 s leases');
  for (const c of [first, ...later]) assert.equal((await within(answerOf(c), 1_000, 'answered')).kind, 'unwritten');
});

test('a flush in parts (results over 32 MiB): every caller answered with its own answer, a failing part answers only its own tasks', async () => {
  const [blocker, ...ts] = await claimed(5, ['q0', 'q1', 'q2', 'q3', 'q4']);
  const big = (ch: string) => JSON.stringify(ch.repeat(12 * 1024 * 1024));
  // A completion held in flight first, so that the four below form one round. Its parts: [0, 1]
  // (24 MiB), [2 (stolen), 3 (no result)]. With failPart2, the second part's every try fails.
  const run = async (failPart2: boolean) => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const db = faulty(async (call, exec) => {
      if (call === 1) await gate;
      if (failPart2 && call >= 3) throw statementError();
      return exec();
    });
    const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
    const held = batcher.completion(blocker!, 1, null);
    await waitFor(() => db.calls === 1, 5_000, 'the blocker in flight');
    const cs = [
      batcher.completion(ts[0]!, 1, big('a')),
      batcher.completion(ts[1]!, 1, big('b')),
      batcher.completion(stolen(ts[2]!), 1, big('c')),
      batcher.completion(ts[3]!, 1, null),
    ];
    assert.equal(new Set(cs.map((c) => c.flushed)).size, 1, 'one round');
    assert.notEqual(cs[0]!.flushed, held.flushed);
    release();
    await answerOf(held);
    const answers = [];
    for (const c of cs) answers.push(await within(answerOf(c), 60_000, 'an answer'));
    return { answers, calls: db.calls };
  };
  const failing = await run(true);
  assert.deepEqual(
    failing.answers.map((a) => a.kind),
    ['settled', 'settled', 'unwritten', 'unwritten'],
  );
  assert.equal(failing.calls, 6, 'the blocker, part 1 once, part 2 four times');
  assert.equal((await getTask(pool, schema, ts[3]!.id))?.state, 'running');
  const ok = await run(false);
  // ts[0], ts[1] (and the blocker) were settled by the first run: refused now (the fence); the
  // stolen token refused; ts[3] settled.
  assert.deepEqual(
    ok.answers.map((a) => a.kind),
    ['refused', 'refused', 'refused', 'settled'],
  );
  assert.equal(ok.calls, 3, 'the blocker, then two parts');
  const stored = await pool.query<{ id: string; n: number }>(
    `SELECT id::text, length(result #>> '{}')::int AS n FROM ${S}.task_results`,
  );
  assert.deepEqual(
    new Map(stored.rows.map((r) => [r.id, r.n])),
    new Map([
      [ts[0]!.id, 12 * 1024 * 1024],
      [ts[1]!.id, 12 * 1024 * 1024],
    ]),
  );
});

test('run times as one integer[] literal: negative, zero, fractional, huge, NaN, Infinity and null are stored as runMsValue says, across lease groups', async () => {
  const hostile = [
    -5,
    0,
    -0,
    0.4,
    1.5,
    2.5,
    1e12,
    2147483647.6,
    NaN,
    Infinity,
    -Infinity,
    null,
    7,
    1e-9,
    -1e-9,
    2147483647,
  ];
  const want = [null, 0, 0, 0, 2, 3, 2147483647, 2147483647, null, null, null, null, 7, 0, null, 2147483647];
  // Two lanes: the literal carries both groups' run times, indexed by run_from.
  const ts = await claimed(hostile.length, ['qa', 'qb']);
  const settled = await completeLeases(pool, storage, ts, hostile);
  assert.equal(settled.size, ts.length, 'the server took the statement');
  const rows = await pool.query<{ id: string; run_ms: number | null }>(
    `SELECT i::text AS id, m AS run_ms FROM ${S}.attempt_history h, unnest(h.ids, h.run_ms) AS x(i, m)`,
  );
  const got = new Map(rows.rows.map((r) => [r.id, r.run_ms]));
  assert.deepEqual(
    ts.map((t) => got.get(t.id)),
    want,
  );
  // Through the batcher too (the engine's path), run times per task in a batch of many lanes.
  const more = await claimed(6, ['qc', 'qd', 'qe']);
  const batcher = new SettlementBatcher(pool, storage, new BerthMetrics(), testLogger);
  const times = [NaN, -1, 3.49, 3.5, null, 1e300];
  const cs = more.map((t, i) => batcher.completion(t, times[i] as number | null, null));
  for (const c of cs) assert.deepEqual(await answerOf(c), { kind: 'settled' });
  const rows2 = await pool.query<{ id: string; run_ms: number | null }>(
    `SELECT i::text AS id, m AS run_ms FROM ${S}.attempt_history h, unnest(h.ids, h.run_ms) AS x(i, m)`,
  );
  const got2 = new Map(rows2.rows.map((r) => [r.id, r.run_ms]));
  assert.deepEqual(
    more.map((t) => got2.get(t.id)),
    [null, null, 3, 4, null, 2147483647],
  );
});

function worker(type: string, handler: (p: unknown, ctx: { id: string }) => Promise<unknown>, ceilingMs = 60_000) {
  const { logger, lines } = captureLogger();
  const def = defineTask<unknown>({ type, ceilingMs, handler: handler as never });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    queues: [type],
    logger,
    maintenance: false,
    heartbeatIntervalMs: false,
  });
  return { w, lines };
}

test("the engine's own frame (no listeners): a completion refused after a takeover is counted lost, once; the task is not completed", async () => {
  const { w } = worker('ar_lost', async (_p, ctx) => {
    await takeLeaseOver(pool, schema, ctx.id);
    return { r: 1 };
  });
  await w.start();
  try {
    const { id } = await enqueue(pool, 'ar_lost', {}, { schema, queue: 'ar_lost' });
    await expectOutcome(w.metrics, 'ar_lost', 'lost', 1);
    assert.equal(await outcomes(w.metrics, 'ar_lost', 'success'), 0);
    assert.notEqual((await getTask(pool, schema, id!))?.state, 'completed');
    assert.equal(
      (await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_results WHERE id = $1`, [id])).rows[0].n,
      0,
      'a refused completion stores no result',
    );
  } finally {
    await w.stop();
  }
});

test("the engine's own frame: stop() with completions pending (the settlements table locked) drains them, each counted success", async () => {
  const n = 8;
  let ran = 0;
  const { w } = worker('ar_drain', async () => {
    ran++;
  });
  const locker = await pool.connect();
  let locked = false;
  try {
    await w.start();
    await locker.query('BEGIN');
    await locker.query(`LOCK TABLE ${S}.range_settlements IN EXCLUSIVE MODE`);
    locked = true;
    await enqueueMany(
      pool,
      Array.from({ length: n }, () => ({ type: 'ar_drain', payload: {}, queue: 'ar_drain' })),
      { schema },
    );
    await waitFor(() => ran === n, 20_000, 'every handler ran, its completion blocked');
    const stopping = w.stop();
    await new Promise((r) => setTimeout(r, 300));
    await locker.query('COMMIT');
    locked = false;
    await within(stopping, 20_000, 'stop');
    assert.equal(await outcomes(w.metrics, 'ar_drain', 'success'), n);
    assert.equal(await outcomes(w.metrics, 'ar_drain', 'lost'), 0);
    const states = await pool.query(
      `SELECT count(*)::int AS n FROM ${S}.attempt_history h, unnest(h.ids) i WHERE h.type = 'ar_drain' AND h.outcome = 'success'`,
    );
    assert.equal(states.rows[0].n, n, 'every completion written by the drain');
  } finally {
    if (locked) await locker.query('ROLLBACK');
    locker.release();
  }
});

test("the engine's own frame: throw, snooze, continue, a result, an unstorable result, each counted as its outcome", async () => {
  // [type, handler, outcome counted, the task's state after]
  const cases: [string, () => unknown, string, string][] = [
    ['ar_throw', () => Promise.reject(new Error('boom')), 'failure', 'dead'],
    [
      'ar_throw_sync',
      () => {
        throw new Error('sync boom');
      },
      'failure',
      'dead',
    ],
    // biome-ignore lint/nursery/usePromiseRejectErrors: a handler that rejects with null is the case
    ['ar_throw_null', () => Promise.reject(null), 'failure', 'dead'],
    ['ar_result', () => Promise.resolve({ ok: 1 }), 'success', 'completed'],
    ['ar_plain_value', () => 42, 'success', 'completed'],
    ['ar_unstorable', () => Promise.resolve(10n), 'failure', 'dead'],
    ['ar_snooze', () => Promise.resolve(snooze(3_600_000)), 'snoozed', 'retryable'],
    ['ar_continue', () => Promise.resolve('continue'), 'continued', 'ready'],
  ];
  for (const [type, h, outcome, state] of cases) {
    const { w } = worker(type, h as never);
    await w.start();
    try {
      const { id } = await enqueue(pool, type, {}, { schema, queue: type, maxAttempts: 1 });
      await expectOutcome(w.metrics, type, outcome, 1);
      const t = await getTask(pool, schema, id!);
      if (type !== 'ar_continue') assert.equal(t?.state, state, `${type}: ${t?.state}`);
      if (type === 'ar_result' || type === 'ar_plain_value') {
        const r = await pool.query(`SELECT result FROM ${S}.task_results WHERE id = $1`, [id]);
        assert.deepEqual(r.rows[0]?.result, type === 'ar_result' ? { ok: 1 } : 42);
      }
    } finally {
      await w.stop();
    }
  }
  void entryKey;
});

test("the engine's own frame: a completion that loses to an operator's cancel counts cancelled (not lost, not success), stores no result; so does an aborted run", async () => {
  let release!: () => void;
  let gate = new Promise<void>((r) => (release = r));
  let started = 0;
  let signal: AbortSignal | null = null;
  const { w, lines } = worker('ar_cancel', async (_p, ctx) => {
    started++;
    signal = (ctx as unknown as { signal: AbortSignal }).signal;
    await gate;
    return { late: true, aborted: signal.aborted };
  });
  await w.start();
  try {
    // 1: the handler returns at once after the cancel commits, before the worker hears of it: its
    // completion is refused, and the refusal is read as the cancel's. The cancel's notice to the
    // worker and its answer to this test race in this one process: when the notice wins, the
    // handler's signal fires first and the run takes case 2's path. Each try is checked alike, and
    // tries go on until one took the refused path (a loaded CI machine lost the race once).
    const cancelled: string[] = [];
    let lostToCancel = false;
    for (let tries = 0; tries < 5 && !lostToCancel; tries++) {
      gate = new Promise<void>((r) => (release = r));
      const { id } = await enqueue(pool, 'ar_cancel', {}, { schema, queue: 'ar_cancel' });
      cancelled.push(id!);
      await waitFor(() => started === cancelled.length, 20_000, 'the handler running');
      await cancelTask(pool, schema, id!);
      release();
      await expectOutcome(w.metrics, 'ar_cancel', 'cancelled', cancelled.length);
      lostToCancel = lines.some((l) => l.msg === 'task settlement lost to a cancel: an operator cancelled it first');
    }
    // 2: the handler returns only after its signal fired: nothing written, counted cancelled.
    gate = new Promise<void>((r) => (release = r));
    const second = await enqueue(pool, 'ar_cancel', {}, { schema, queue: 'ar_cancel' });
    cancelled.push(second.id!);
    await waitFor(() => started === cancelled.length, 20_000, 'the second handler running');
    await cancelTask(pool, schema, second.id!);
    await waitFor(() => signal?.aborted === true, 20_000, "the second handler's signal to fire");
    release();
    await expectOutcome(w.metrics, 'ar_cancel', 'cancelled', cancelled.length);
    assert.equal(await outcomes(w.metrics, 'ar_cancel', 'lost'), 0);
    assert.equal(await outcomes(w.metrics, 'ar_cancel', 'success'), 0);
    for (const x of cancelled) {
      assert.equal((await getTask(pool, schema, x))?.state, 'cancelled');
      assert.equal(
        (await pool.query(`SELECT count(*)::int AS n FROM ${S}.task_results WHERE id = $1`, [x])).rows[0].n,
        0,
      );
    }
    assert.ok(lostToCancel, 'the first run took the refused-completion path (afterRefused)');
  } finally {
    release();
    await w.stop();
  }
});

test('a fault outside the retries (a logger that throws) still answers every completion unwritten; no flush hangs, nothing is left unhandled', async () => {
  const ts = await claimed(3, ['q1', 'q2']);
  const db = faulty(async () => {
    throw statementError();
  });
  const thrower = () => {
    throw new Error('the logger itself failed');
  };
  const hostileLogger = { ...testLogger, warn: thrower, error: thrower, info: thrower } as typeof testLogger;
  const unhandled: unknown[] = [];
  const onUnhandled = (err: unknown) => unhandled.push(err);
  process.on('unhandledRejection', onUnhandled);
  try {
    const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), hostileLogger);
    const cs = ts.slice(0, 2).map((t) => batcher.completion(t, 5, null));
    const viaComplete = batcher.complete(ts[2]!, 5, null);
    for (const c of cs) {
      const a = await within(answerOf(c), 20_000, 'an answer');
      assert.equal(a.kind, 'unwritten');
      assert.match((a as { error: string }).error, /the logger itself failed/);
    }
    assert.equal((await within(viaComplete, 20_000, 'complete()')).kind, 'unwritten');
    await within(batcher.drain(), 5_000, 'drain');
    // A tick for any rejection left behind to be reported.
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(unhandled, []);
    for (const t of ts) assert.equal((await getTask(pool, schema, t.id))?.state, 'running', 'nothing written');
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});
