/**
 * Exactly once per schedule instant across a leader failover, with two fleets declaring the same
 * schedule (docs/architecture.md, "Schedules", invariant 8).
 *
 * Three worker processes (fleet a: one, fleet b: two) declare the same every-second schedule.
 * The test holds, in an open transaction of its own, the dedupe key of an instant a few seconds
 * ahead: the leader's fire of that instant moves the watermark (uncommitted) and then waits on
 * the key inside enqueue(). The leader is SIGKILLed there, between computing the instant and
 * committing its task; the test then lets go of the key. The dead leader's transaction rolls
 * back, another process takes the lead and fires the instant, and every instant of the run has
 * run exactly once, whichever fleet's process fired it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { fireDedupeKey } from '../src/schedule.js';
import { freshSchema, leaderWorkerId, spawnWorkerProcess, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('schedfail');
const S = `"${schema}"`;

test('the leader SIGKILLed in the middle of a fire: the instant fires once, on the next leader; no instant runs twice', async () => {
  await pool.query(
    `CREATE TABLE ${S}.schedule_runs (instant timestamptz, fleet text NOT NULL, worker text NOT NULL, task_id bigint NOT NULL)`,
  );
  const children = new Map<string, ChildProcess>();
  const spawn = (id: string, fleet: string) =>
    spawnWorkerProcess(schema, id, { fixture: 'schedule-worker.ts', env: { FLEET: fleet } });
  children.set('a1', await spawn('a1', 'a'));
  children.set('b1', await spawn('b1', 'b'));
  children.set('b2', await spawn('b2', 'b'));
  // The instant to interrupt: a few seconds ahead, on the database's clock.
  const now = (await pool.query<{ now: Date }>('SELECT clock_timestamp() AS now')).rows[0]!.now;
  const held = new Date(Math.ceil(now.getTime() / 1000) * 1000 + 4000);
  const blocker = await pool.connect();
  try {
    await blocker.query('BEGIN');
    await blocker.query(`INSERT INTO ${S}.dedupe (dedupe_key, id) VALUES ($1, 0)`, [
      fireDedupeKey('every-second', held),
    ]);
    const first = await waitFor(() => leaderWorkerId(pool, schema), 20_000, 'a leader');
    // The leader's fire of `held`: the watermark moved in its open transaction, enqueue waiting on the key.
    await waitFor(
      async () =>
        (
          await pool.query(
            `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%schedule_fires%' AND query LIKE $1`,
            [`%${schema}%`],
          )
        ).rowCount! > 0,
      20_000,
      'the leader to wait inside the fire of the held instant',
    );
    const leader = children.get(first)!;
    leader.kill('SIGKILL');
    await new Promise((r) =>
      leader.exitCode !== null || leader.signalCode !== null ? r(null) : leader.once('exit', r),
    );
    children.delete(first);
    await blocker.query('ROLLBACK');
  } finally {
    blocker.release();
  }
  try {
    const second = await waitFor(
      async () => {
        const id = await leaderWorkerId(pool, schema);
        return id && children.has(id) ? id : null;
      },
      20_000,
      'a new leader',
    );
    assert.ok(children.has(second));
    // The held instant runs (fired by the new leader), and a few after it.
    await waitFor(
      async () =>
        (await pool.query(`SELECT 1 FROM ${S}.schedule_runs WHERE instant >= $1`, [new Date(held.getTime() + 3000)]))
          .rowCount! > 0,
      30_000,
      'instants after the held one to run',
    );
  } finally {
    for (const c of children.values()) c.kill('SIGTERM');
    await Promise.all(
      [...children.values()].map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once('exit', r)))),
    );
  }
  const runs = await pool.query<{ instant: Date; n: number }>(
    `SELECT instant, count(*)::int AS n FROM ${S}.schedule_runs GROUP BY instant ORDER BY instant`,
  );
  const twice = runs.rows.filter((r) => r.n > 1);
  assert.deepEqual(twice, [], 'no instant ran twice');
  assert.ok(
    runs.rows.some((r) => r.instant.getTime() === held.getTime()),
    'the instant interrupted by the kill ran (once) after the failover',
  );
  // Every fire recorded committed one task, and each instant has one fire.
  const fires = await pool.query<{ n: number; d: number }>(
    `SELECT count(*)::int AS n, count(DISTINCT instant)::int AS d FROM ${S}.schedule_fires WHERE kind = 'cron'`,
  );
  assert.equal(fires.rows[0]!.n, fires.rows[0]!.d);
  // Both fleets declared it; one row holds whichever declaration came last.
  const declared = await pool.query(`SELECT count(*)::int AS n FROM ${S}.schedules`);
  assert.equal(declared.rows[0].n, 1);
});
