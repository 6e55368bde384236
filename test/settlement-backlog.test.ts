/**
 * A worker whose handlers finish faster than the database takes their settlements stops claiming
 * once SETTLEMENT_BACKLOG_MAX settlements wait unwritten, and claims again when a flush has taken
 * the backlog below it. Without the hold, handlers free their slots before their completions are
 * written, so the worker went on claiming and running while the completions piled up: with two
 * million no-op tasks queued and a busy server, one flush held over a million of them, the
 * statement timeout cancelled it on every retry, and the leases behind it lapsed.
 *
 * Here the completions cannot be written at all (another session holds the settlement table in
 * SHARE mode, which lets the claim and every read through but makes an INSERT into it wait), so
 * an unbounded worker would run every queued task. Each flush statement also carries at most
 * FLUSH_MAX_COMPLETIONS completions (the unit test in results.test.ts); a stop that gives up
 * sends no part after the one in flight, which would each wait out the statement timeout.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueueMany, type TaskSpec, Worker } from '../src/index.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { SETTLEMENT_BACKLOG_MAX } from '../src/processor/engine.js';
import { FLUSH_MAX_COMPLETIONS, SettlementBatcher } from '../src/processor/settlement-batcher.js';
import { quoteIdent } from '../src/sql.js';
import { storageFor } from '../src/storage/storage.js';
import { claimedTasks } from './claimed-tasks.js';
import { captureLogger, counterValue, DATABASE_URL, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('backlog');

const SLOTS = 10;
const PREFETCH = 500;
/** Enough that a worker without the hold runs well past it while nothing is written. */
const N = 2 * SETTLEMENT_BACKLOG_MAX + 5_000;

const ran = new Map<number, number>();
const quick = defineTask<{ i: number }>({
  type: 'backlog_quick',
  ceilingMs: 600_000,
  handler: async (payload) => {
    ran.set(payload.i, (ran.get(payload.i) ?? 0) + 1);
  },
});

test('a worker stops claiming while SETTLEMENT_BACKLOG_MAX settlements wait, and finishes every task once they are written', async () => {
  let blocker: pg.PoolClient | null = null;
  const unblock = async () => {
    const c = blocker;
    blocker = null;
    if (c === null) return;
    await c.query('ROLLBACK').catch(() => undefined);
    c.release();
  };
  let w: Worker | null = null;
  try {
    w = new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [quick],
      slots: SLOTS,
      prefetch: PREFETCH,
      maintenance: false,
      // A blocked flush waits for the lock, however slow the machine: no statement gives up
      // (a flush answered `unwritten` would leave its tasks to a rescue that is not running).
      statementTimeoutMs: 3_600_000,
      // Only a flush that takes the backlog below the bound may resume the claims (no poll tick).
      pollIntervalMs: 3_600_000,
      logger: testLogger,
    });
    // Started on an empty queue, so its start (which plans the completion on its session) is not
    // held by the lock taken next.
    await w.start();
    blocker = await pool.connect();
    await blocker.query('BEGIN');
    await blocker.query(`LOCK TABLE ${quoteIdent(schema)}.range_settlements IN SHARE MODE`);
    for (let start = 0; start < N; start += 1_000) {
      const specs: TaskSpec[] = [];
      for (let i = start; i < Math.min(N, start + 1_000); i++) specs.push({ type: 'backlog_quick', payload: { i } });
      await enqueueMany(pool, specs, { schema });
    }
    await waitFor(() => ran.size >= SETTLEMENT_BACKLOG_MAX, 60_000, `${SETTLEMENT_BACKLOG_MAX} handlers run`);
    // Then until no handler has run for a while: the worker is held (or, without the hold, has
    // run everything). A slow machine can only end this wait early, which the bound below still
    // checks: it cannot make a worker without the hold look held.
    let last = -1;
    let still = 0;
    await waitFor(
      () => {
        still = ran.size === last ? still + 1 : 0;
        last = ran.size;
        return still >= 40;
      },
      120_000,
      'the handler count to stop moving',
    );
    // The flush in flight when the backlog formed, the backlog, and one claim past it (its free
    // slots and its prefetch).
    const bound = SETTLEMENT_BACKLOG_MAX + 2 * (SLOTS + PREFETCH);
    assert.ok(ran.size <= bound, `held: ${ran.size} handlers ran with nothing written (bound ${bound}, queued ${N})`);
    assert.ok(ran.size < N, 'tasks are left queued while it is held');

    await unblock();
    await waitFor(() => ran.size === N, 120_000, `all ${N} handlers run`);
    assert.ok(
      (await counterValue(w.metrics, 'berth_wakeups_total', { reason: 'settled' })) >= 1,
      'claims resumed when a flush took the backlog below the bound',
    );
  } finally {
    await unblock();
    await w?.stop();
  }
  const twice = [...ran.values()].filter((n) => n > 1).length;
  assert.equal(twice, 0, 'no task ran twice: no lease lapsed behind the backlog');
  const left = await pool.query<{ n: string }>(
    `SELECT count(*)::text AS n FROM ${quoteIdent(schema)}.ready r
      WHERE NOT EXISTS (SELECT 1 FROM ${quoteIdent(schema)}.range_settlements s
                         WHERE s.lane_id = r.lane_id AND s.seqs @> r.lane_seq)`,
  );
  assert.equal(left.rows[0]!.n, '0', 'every task settled');
});

test('a stop that gives up writes no part of a flush after the one in flight', async () => {
  const n = 2 * FLUSH_MAX_COMPLETIONS + 2_000;
  const tasks = await claimedTasks(pool, schema, n, ['q']);
  const db = new pg.Client({ connectionString: DATABASE_URL, options: '-c statement_timeout=1000 -c jit=off' });
  await db.connect();
  const blocker = await pool.connect();
  const { logger, lines } = captureLogger();
  try {
    await blocker.query('BEGIN');
    await blocker.query(`LOCK TABLE ${quoteIdent(schema)}.range_settlements IN SHARE MODE`);
    const batcher = new SettlementBatcher(db, storageFor(schema), new BerthMetrics(), logger);
    // The first completion flushes alone (and waits on the lock); the rest are handed in meanwhile
    // and make the next flush, of three parts.
    const [head, ...rest] = tasks;
    const answers = [batcher.complete(head!), ...rest.map((t) => batcher.complete(t))];
    await batcher.drain(1);
    const got = await Promise.all(answers);
    assert.equal(got.filter((a) => a.kind === 'unwritten').length, n, 'nothing was written');
    const skipped = lines.filter((l) => String(l.msg).startsWith('settlement not written: the worker stopped'));
    assert.deepEqual(
      skipped.map((l) => l.tasks),
      [FLUSH_MAX_COMPLETIONS, n - 1 - 2 * FLUSH_MAX_COMPLETIONS],
      'the second flush sent its first part; its other two were not sent',
    );
  } finally {
    await blocker.query('ROLLBACK').catch(() => undefined);
    blocker.release();
    await db.end();
  }
});
