import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { enqueueMany } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { freshSchema, waitFor, spawnWorkerProcess } from './helpers.js';

const { schema, pool } = await freshSchema('multi');
const S = `"${schema}"`;

const spawnWorker = (id: string) => spawnWorkerProcess(schema, id);

test('3 worker processes, 5,000 tasks, one SIGKILLed mid-run and replaced: nothing lost, only its leases re-run', async () => {
  await pool.query(
    `CREATE TABLE ${S}.executions (i integer NOT NULL, kind text NOT NULL, worker text NOT NULL, at timestamptz DEFAULT clock_timestamp())`,
  );
  const workers = await Promise.all(['w1', 'w2', 'w3'].map(spawnWorker));
  const live: ChildProcess[] = [...workers];
  try {
    const OK = 4900;
    const BAD = 100;
    const specs = [
      ...Array.from({ length: OK }, (_, i) => ({ type: 'mp_ok', payload: { i } })),
      ...Array.from({ length: BAD }, (_, i) => ({ type: 'mp_bad', payload: { i: OK + i } })),
    ].sort(() => Math.random() - 0.5);
    for (let b = 0; b < specs.length; b += 500) await enqueueMany(pool, specs.slice(b, b + 500), { schema });

    const executed = async () =>
      Number((await pool.query(`SELECT count(DISTINCT i) AS n FROM ${S}.executions WHERE kind = 'ok'`)).rows[0].n);
    await waitFor(async () => (await executed()) >= OK * 0.3, 60_000, '30% executed');
    workers[0]!.kill('SIGKILL');
    live.splice(live.indexOf(workers[0]!), 1);
    await new Promise((r) => workers[0]!.once('exit', r));
    // What the killed worker held at its death: leases of w1 with no settlement yet.
    const held = new Set(
      (
        await pool.query(`SELECT l.id::text FROM ${S}.leased_entries l WHERE l.worker = 'w1' AND l.outcome IS NULL`)
      ).rows.map((r) => r.id),
    );
    live.push(await spawnWorker('w4'));

    await waitFor(
      async () => {
        const g = await readGauges(pool, schema);
        return (await executed()) === OK && (g.pending.get('mp_ok') ?? 0) === 0 && (g.pending.get('mp_bad') ?? 0) === 0;
      },
      120_000,
      'every task settled',
    );

    const g = await readGauges(pool, schema);
    assert.equal(g.dead.get('mp_bad'), BAD, 'tasks that always throw end as dead letters');
    assert.equal(g.dead.get('mp_ok') ?? 0, 0);
    const deadAttempts = await pool.query(
      `SELECT min(attempts) AS lo, max(attempts) AS hi FROM ${S}.dead_letters WHERE type = 'mp_bad'`,
    );
    assert.deepEqual(deadAttempts.rows[0], { lo: 3, hi: 3 });

    // Which tasks ran more than once, mapped to their task ids.
    const repeats = await pool.query(
      `SELECT e.i, count(*) AS runs FROM ${S}.executions e WHERE e.kind = 'ok' GROUP BY e.i HAVING count(*) > 1`,
    );
    const idsByI = new Map(
      (
        await pool.query(
          `SELECT DISTINCT (r.payload->>'i')::int AS i, r.id::text FROM ${S}.leased_entries le JOIN ${S}.ready r USING (slot, lane_id, lane_seq, id)`,
        )
      ).rows.map((r) => [r.i, r.id]),
    );
    for (const r of repeats.rows) {
      const id = idsByI.get(r.i);
      assert.ok(
        id === undefined || held.has(id),
        `task i=${r.i} ran ${r.runs} times but the killed worker did not hold it`,
      );
    }
    assert.ok(repeats.rowCount! <= held.size, `${repeats.rowCount} repeats, ${held.size} held by the killed worker`);
    const badRuns = await pool.query(
      `SELECT max(n) AS hi FROM (SELECT count(*) AS n FROM ${S}.executions WHERE kind = 'bad' GROUP BY i) x`,
    );
    assert.ok(Number(badRuns.rows[0].hi) <= 3, 'a failing task never runs more than its attempts');
  } finally {
    for (const c of live) c.kill('SIGTERM');
    await Promise.all(live.map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once('exit', r)))));
  }
});
