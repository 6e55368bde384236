/**
 * DESIGN plane 2: a queue must stay healthy while another session pins the xmin horizon.
 * One session holds an open transaction with an XID for the whole run; 5,000 tasks flow through
 * several ring rotations; the hot relations gain no dead tuples and no task is lost. Attempt
 * history is on (the default), and its rows are inserts only. Throughput
 * with and without the pin is measured by `npm run bench:pinned`, not here.
 *
 * 5,000 rather than 20,000: the claim is about which rows the task path writes, which every
 * task exercises the same way; 20,000 took over 120 s at a load average of 12 on 2 cores (and
 * the pin holds the horizon of the whole shared server back for as long).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueueMany, Worker } from '../src/index.js';
import { readRingState } from '../src/maintenance-api.js';
import { quoteIdent } from '../src/sql.js';
import { captureLogger, DATABASE_URL, freshSchema, waitFor } from './helpers.js';

const N = 5_000;

const { schema, pool } = await freshSchema('pinned');

test('with the xmin horizon pinned, 5,000 tasks flow, hot relations stay free of dead tuples, none is lost', async () => {
  const pin = new pg.Client({ connectionString: DATABASE_URL });
  await pin.connect();
  await pin.query('BEGIN');
  const xid = (await pin.query('SELECT txid_current() AS x')).rows[0].x;
  assert.ok(xid);
  const seen = new Uint8Array(N);
  const def = defineTask<{ i: number }>({
    type: 'pin',
    ceilingMs: 10_000,
    handler: async ({ i }) => {
      seen[i]! += 1;
    },
  });
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 10,
    logger,
    maintenance: {
      promoteIntervalMs: 100,
      ringIntervalMs: 100,
      ringRotateAfterMs: 300,
      ringRotateSmallAfterMs: 300,
      leaderPollMs: 100,
    },
  });
  await w.start();
  let stopped = false;
  try {
    for (let b = 0; b < N / 1000; b++) {
      await enqueueMany(
        pool,
        Array.from({ length: 1000 }, (_, k) => ({ type: 'pin', payload: { i: b * 1000 + k } })),
        { schema },
      );
    }
    await waitFor(() => seen.every((n) => n >= 1), 120_000, 'every task to run');
    assert.ok(
      seen.every((n) => n === 1),
      'no task ran twice',
    );
    const horizon = await pool.query(
      `SELECT backend_xid::text AS x FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid = $1`,
      [(pin as unknown as { processID: number }).processID],
    );
    assert.equal(horizon.rows[0]?.x, String(xid), 'the pin held for the whole run');
    // A backend reports its table statistics when idle (at most once a second) or at exit: stop
    // the worker, so its sessions exit, and wait until every settlement insert is counted (one
    // range_settlements row settles many tasks: count the rows written).
    await w.stop();
    stopped = true;
    const written = Number(
      (await pool.query(`SELECT count(*) AS n FROM ${quoteIdent(schema)}.range_settlements`)).rows[0].n,
    );
    const stats = () =>
      pool.query(
        `SELECT relname, n_dead_tup::int AS dead, n_tup_ins::int AS ins, n_tup_del::int AS del
           FROM pg_stat_user_tables WHERE schemaname = $1 ORDER BY n_dead_tup DESC`,
        [schema],
      );
    const dead = await waitFor(
      async () => {
        const r = await stats();
        const counted = r.rows.filter((x) => x.relname.startsWith('range_settlements')).reduce((n, x) => n + x.ins, 0);
        const appended = r.rows.filter((x) => x.relname.startsWith('ready_')).reduce((n, x) => n + x.ins, 0);
        return counted >= written && appended >= N ? r : null;
      },
      60_000,
      'the statistics of every settlement',
    );
    // One path of the task's writes deletes rows, and it is bounded: an append that raced a
    // rotation moves its own uncommitted entries to the segment that is current now (append_ready,
    // migration 18), so each of them is inserted twice and deleted once. Every ready row deleted
    // must be such a move: the inserts are the tasks plus the deletes, no more.
    const ready = dead.rows.filter((r) => r.relname.startsWith('ready_'));
    const moved = ready.reduce((n, r) => n + r.del, 0);
    assert.equal(
      ready.reduce((n, r) => n + r.ins, 0),
      N + moved,
      `ready rows are only appended, or moved by an append that raced a rotation: ${JSON.stringify(ready)}`,
    );
    // workers and outcome_counts are rewritten on each worker heartbeat (every 10 s), not per
    // task: their dead tuples grow with the run's length, so they are left out of the bound; so
    // are the moved appends' (above).
    const total =
      dead.rows.filter((r) => !['workers', 'outcome_counts'].includes(r.relname)).reduce((n, r) => n + r.dead, 0) -
      moved;
    const rotations = (await readRingState(pool, schema)).generation;
    // Only the one-row ring_state is updated (once per rotation); the task path never updates
    // or deletes a row.
    assert.ok(
      total <= rotations + 20,
      `dead tuples ${total} (rotations ${rotations}): ${JSON.stringify(dead.rows.slice(0, 5))}`,
    );
    assert.ok(rotations >= 1, 'the ring rotated during the run');
    assert.deepEqual(
      dead.rows.filter(
        (r) =>
          /^(ready|range_leases|range_settlements|leases|settlements|tombstones|attempt_history|history_state)/.test(
            r.relname,
          ) && r.dead > (r.relname.startsWith('ready_') ? r.del : 0),
      ),
      [],
      'the ring tables and attempt history gain no dead tuples (but the moved appends in ready)',
    );
    // History is on by default: every task's attempt was recorded, append-only.
    const recorded = Number(
      (
        await pool.query(
          `SELECT coalesce(sum(cardinality(ids)), 0) AS n FROM ${quoteIdent(schema)}.attempt_history WHERE outcome = 'success'`,
        )
      ).rows[0].n,
    );
    assert.equal(recorded, N, 'attempt history holds every success');
  } finally {
    if (!stopped) await w.stop();
    await pin.query('ROLLBACK');
    await pin.end();
  }
});
