/**
 * Migration 22 retires the per-task `leases` / `settlements` tables of berth before migration 8:
 * their two triggers and functions are dropped, no runtime role keeps a grant on them, and
 * prune_slot locks and truncates a segment's four range-era partitions only. The tables stay,
 * empty and unused, for a later migration (its header says why: a prune already running the
 * migration-18 body when 22 commits still locks them by name; the second test runs one).
 *
 * The previous version here is migration 21 and the code berth had before 22: its own build,
 * compiled from git history by test/support/previous-build.ts (the code under test no longer runs
 * on a schema of 21), with its own grant lists. Any other build can stand in for it:
 *
 *   BERTH_PREVIOUS_DIST=/tmp/berth-prev/dist node --import tsx --test test/migration-22.test.ts
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import * as current from '../src/index.js';
import { rotateRing } from '../src/maintenance/ring.js';
import type { runtimeGrantStatements } from '../src/schema/roles.js';
import { previousBuild } from './support/previous-build.js';
import { quoteIdent } from '../src/sql.js';
import { captureLogger, counterValue, DATABASE_URL, FAST_MAINTENANCE, urlAs, waitFor } from './helpers.js';
import { migrateSchemaTo, schemaAtVersion } from './support/legacy-schema.js';
import { MIGRATIONS } from '../src/schema/migrations.js';

/** What migrate applies to a schema at 21: 22 and every migration after it (the fleet of 21 runs through them all). */
const FROM_22 = MIGRATIONS.map((m) => m.version).filter((v) => v >= 22);

// The code under test no longer runs on a schema of 21 (it writes migration 24's task results),
// so the fleet of 21 is the build from just before migration 22, unless one is given.
const previousDist =
  process.env.BERTH_PREVIOUS_DIST ?? previousBuild('src/schema/migrations/0022_retire_per_task_leases.sql');
const previous: typeof current = await import(pathToFileURL(`${previousDist}/index.js`).href);

/** The previous version's testing helpers: this version's claim reads columns a schema of 21 has not. */
const previousTesting: typeof import('../src/testing-api.js') = await import(
  pathToFileURL(`${previousDist}/testing-api.js`).href
);

/** The statements the previous version's grant ran: its own, from its build. */
const previousGrants: typeof runtimeGrantStatements = (
  await import(pathToFileURL(`${previousDist}/schema/roles.js`).href)
).runtimeGrantStatements;

function perTaskTables(schema: string, partitions = true): string[] {
  const s = quoteIdent(schema);
  return ['leases', 'settlements'].flatMap((t) => [
    `${s}.${t}`,
    ...(partitions ? Array.from({ length: 16 }, (_, n) => `${s}.${quoteIdent(`${t}_${n}`)}`) : []),
  ]);
}

// Roles are cluster-wide: every name carries the pid so parallel runs never share one.
const workerRole = `berth_m21_w_${process.pid}`;
const producerRole = `berth_m21_p_${process.pid}`;
const admin = new pg.Pool({ connectionString: DATABASE_URL, max: 4, options: '-c jit=off' });
const schemas: string[] = [];
for (const r of [workerRole, producerRole]) {
  await admin.query(`DROP ROLE IF EXISTS ${quoteIdent(r)}`);
  await admin.query(`CREATE ROLE ${quoteIdent(r)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
}
after(async () => {
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(s)} CASCADE`);
  for (const r of [workerRole, producerRole]) {
    await admin.query(`DROP OWNED BY ${quoteIdent(r)}`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS ${quoteIdent(r)}`);
  }
  await admin.end();
});

async function schemaOf21(name: string): Promise<string> {
  const schema = `t_${name}_${process.pid}`;
  schemas.push(schema);
  const c = await admin.connect();
  try {
    await schemaAtVersion(c, schema, 21);
  } finally {
    c.release();
  }
  return schema;
}

/** May each role SELECT from any of the per-task tables or their partitions? */
async function perTaskSelect(schema: string): Promise<{ worker: boolean; producer: boolean }> {
  const r = await admin.query<{ worker: boolean; producer: boolean }>(
    `SELECT bool_or(has_table_privilege($1, t, 'SELECT')) AS worker, bool_or(has_table_privilege($2, t, 'SELECT')) AS producer
       FROM unnest($3::text[]) t`,
    [workerRole, producerRole, perTaskTables(schema)],
  );
  return r.rows[0]!;
}

test('migration 22 under a fleet of migration 21: two workers, their leader and a producer run through it and through rotations and prunes after it; every task runs exactly once and nothing fails', async () => {
  // Upper case and a quote: the migration finds the grants by the schema's name, never parsed as an identifier.
  const schema = await schemaOf21('Mig22 "fleet"');
  const S = quoteIdent(schema);
  for (const [role, kind] of [
    [workerRole, 'worker'],
    [producerRole, 'producer'],
  ] as const)
    for (const statement of previousGrants(schema, role, kind)) await admin.query(statement);
  assert.deepEqual(await perTaskSelect(schema), { worker: true, producer: true }, 'the grants of 21 reach them');

  const runs = new Map<number, number>();
  const def = previous.defineTask<{ n: number }>({
    type: 'm22',
    ceilingMs: 60_000,
    handler: async ({ n }) => void runs.set(n, (runs.get(n) ?? 0) + 1),
  });
  const logs = [captureLogger(), captureLogger()];
  const workers = logs.map(
    (log, i) =>
      new previous.Worker({
        connectionString: urlAs(workerRole),
        schema,
        tasks: [def],
        slots: 4,
        workerId: `v21-${i}`,
        logger: log.logger,
        // Rotate as soon as a segment holds anything, so prunes follow every few ticks.
        maintenance: { ...FAST_MAINTENANCE, ringIntervalMs: 50, ringRotateAfterMs: 50, ringRotateSmallAfterMs: 50 },
      }),
  );
  const total = async (name: string, labels: Record<string, string>) =>
    (await Promise.all(workers.map((w) => counterValue(w.metrics as never, name, labels)))).reduce((a, b) => a + b, 0);
  const pruned = () => total('berth_ring_prune_total', { result: 'pruned' });
  const rotated = () => total('berth_ring_rotations_total', { result: 'rotated' });

  // The producer: batches of 25 over 8 lanes, as long as the fleet keeps up (at most 400 waiting).
  const producerPool = new pg.Pool({ connectionString: urlAs(producerRole), max: 2 });
  let enqueued = 0;
  let deadlocks = 0;
  let producing = true;
  const producerErrors: unknown[] = [];
  const produce = (async () => {
    while (producing) {
      await waitFor(() => !producing || enqueued - runs.size < 400, 60_000, 'the fleet to keep up');
      if (!producing) break;
      const batch = Array.from({ length: 25 }, (_, k) => ({ type: 'm22', payload: { n: enqueued + k }, shard: k % 8 }));
      // A migration that alters several tables of the hot path (31) can deadlock with a producer's
      // transaction once; the producer retries it, as docs/operations.md ("Upgrading") asks. In a
      // transaction, so a retried batch is written once.
      for (let attempt = 1; ; attempt++) {
        const c = await producerPool.connect();
        try {
          await c.query('BEGIN');
          await previous.enqueueMany(c, batch, { schema });
          await c.query('COMMIT');
          break;
        } catch (err) {
          await c.query('ROLLBACK').catch(() => undefined);
          // Every retry pauses a little: the migration (which retries itself too) gets its locks.
          if ((err as { code?: string }).code !== '40P01' || attempt >= 50) throw err;
          await new Promise((r) => setTimeout(r, 20 * attempt));
          deadlocks++;
        } finally {
          c.release();
        }
      }
      enqueued += batch.length;
    }
  })().catch((err: unknown) => void producerErrors.push(err));

  let migrated: { pruned: number; rotated: number; handled: number } | undefined;
  try {
    await Promise.all(workers.map((w) => w.start()));
    await waitFor(
      async () => runs.size >= 200 && (await pruned()) >= 1,
      60_000,
      'the fleet of 21 to drain, rotate and prune',
    );
    const report = await current.migrate({ connectionString: DATABASE_URL, schema });
    assert.deepEqual(
      report.applied.map((m) => m.version),
      FROM_22,
    );
    migrated = { pruned: await pruned(), rotated: await rotated(), handled: runs.size };
    // Two more of each: at least one rotation and one prune that began after 22 committed (one of
    // each may have been under way at the commit).
    const since = migrated;
    await waitFor(
      async () =>
        runs.size >= since.handled + 200 &&
        (await rotated()) >= since.rotated + 2 &&
        (await pruned()) >= since.pruned + 2,
      60_000,
      'the fleet to drain, rotate and prune on migration 22',
    ).catch(async (err: Error) => {
      // Say which part stalled: the producer (its error), the runs, the rotations or the prunes.
      throw new Error(
        `${err.message}: runs ${runs.size}/${since.handled + 200}, rotated ${await rotated()}/${since.rotated + 2}, pruned ${await pruned()}/${since.pruned + 2}, producer errors ${producerErrors.map((e) => String(e)).join('; ') || 'none'}`,
      );
    });
    producing = false;
    await produce;
    assert.deepEqual(producerErrors, [], `the producer of 21 enqueued throughout (${deadlocks} batches retried)`);
    await waitFor(() => runs.size === enqueued, 60_000, `all ${enqueued} tasks to run (${runs.size})`);
    await waitFor(
      async () => (await total('berth_task_outcomes_total', { task_type: 'm22', outcome: 'success' })) === enqueued,
      60_000,
      `${enqueued} success outcomes`,
    );
  } finally {
    producing = false;
    await produce;
    await Promise.all(workers.map((w) => w.stop()));
    await producerPool.end();
  }

  assert.deepEqual(
    [...runs].filter(([, k]) => k !== 1),
    [],
    'no task ran twice',
  );
  assert.deepEqual(
    Array.from({ length: enqueued }, (_, n) => n).filter((n) => !runs.has(n)),
    [],
    'every enqueued task ran',
  );
  const left = await admin.query(
    `SELECT (SELECT count(*) FROM ${S}.ready r
              WHERE NOT EXISTS (SELECT 1 FROM ${S}.leased_entries le
                                 WHERE le.id = r.id AND le.outcome = 'completed'))::int AS unsettled,
            (SELECT count(*) FROM ${S}.deferred)::int AS deferred,
            (SELECT count(*) FROM ${S}.dead_letters)::int AS dead`,
  );
  assert.deepEqual(left.rows[0], { unsettled: 0, deferred: 0, dead: 0 }, 'every entry left in the ring is completed');
  // Nothing failed: no error line from either worker or its leader, no failed maintenance run.
  for (const log of logs)
    assert.deepEqual(
      log.lines.filter((l) => (l.level as number) >= 50),
      [],
    );
  assert.equal(await total('berth_maintenance_errors_total', {}), 0);
  console.log(
    `migration-22 fleet (previous build ${previousDist}): ` +
      `${enqueued} tasks, each run once; at the migration ${migrated!.handled} run, ${migrated!.rotated} rotations, ` +
      `${migrated!.pruned} prunes; in all ${await rotated()} rotations, ${await pruned()} prunes, 0 errors`,
  );

  // What 22 left: the two tables, without trigger, function, grant or a place in the prune.
  const kept = await admin.query(
    `SELECT to_regclass($2) IS NOT NULL AS leases, to_regclass($3) IS NOT NULL AS settlements,
            (SELECT count(*)::int FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
              WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1) AND c.relname ~ '^(leases|settlements)(_[0-9]+)?$') AS triggers,
            to_regprocedure($4) IS NULL AND to_regprocedure($5) IS NULL AS functions_dropped,
            pg_get_functiondef($6::regprocedure) !~ '''(leases|settlements)''' AS prune_names_neither`,
    [
      schema,
      `${S}.leases`,
      `${S}.settlements`,
      `${S}.refuse_legacy_lease()`,
      `${S}.forward_legacy_settlement()`,
      `${S}.prune_slot(smallint,integer)`,
    ],
  );
  assert.deepEqual(kept.rows[0], {
    leases: true,
    settlements: true,
    triggers: 0,
    functions_dropped: true,
    prune_names_neither: true,
  });
  assert.deepEqual(await perTaskSelect(schema), { worker: false, producer: false }, '22 revoked the grants of 21');
});

test('a prune that began before migration 22 committed runs migration 18’s body to its end, which locks leases_0 (so 22 keeps the table); the next call runs 22’s and leaves it alone', async () => {
  const schema = await schemaOf21('mig22_inflight');
  const S = quoteIdent(schema);
  await current.enqueueMany(
    admin,
    [
      { type: 'p', payload: {} },
      { type: 'p', payload: {} },
    ],
    { schema },
  );
  // Run by the fleet of 21 (this version's claim reads lanes.limited, which 21 has not).
  const def = previous.defineTask({ type: 'p', ceilingMs: 60_000, handler: async () => {} });
  assert.equal((await previousTesting.runDueTasks(admin, [def], { schema })).length, 2);
  assert.equal(await rotateRing(admin, schema, 0), 'rotated', 'segment 0 is sealed, every entry in it settled');
  const [holder, pruner, reader] = [0, 1, 2].map(
    () => new pg.Client({ connectionString: DATABASE_URL, options: '-c jit=off' }),
  ) as [pg.Client, pg.Client, pg.Client];
  await Promise.all([holder.connect(), pruner.connect(), reader.connect()]);
  const prunerPid = (await pruner.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
  try {
    // The prune's checks read tombstones_0 before its LOCK: a lock on it holds the call there.
    await holder.query('BEGIN');
    await holder.query(`LOCK TABLE ${S}."tombstones_0" IN ACCESS EXCLUSIVE MODE`);
    const pruning = pruner
      .query<{ result: string }>(`SELECT ${S}.prune_slot(0::smallint, 500) AS result`)
      .then((r) => r.rows[0]!.result);
    pruning.catch(() => undefined);
    await waitFor(
      async () =>
        (await admin.query('SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted', [prunerPid])).rowCount === 1,
      20_000,
      'the prune to wait in its checks',
    );
    // Migration 22 alone, as migrate() runs it: a later one (31) alters `ready`, whose segment the
    // waiting prune holds, so a migrate() to the latest would wait for the prune, which waits here.
    const migrator = await admin.connect();
    try {
      await migrator.query('BEGIN');
      await migrateSchemaTo(migrator, schema, 22);
      await migrator.query('COMMIT');
    } finally {
      migrator.release();
    }
    // A reader of leases_0 now: the old body's LOCK will wait for it, 22's never asks.
    await reader.query('BEGIN');
    await reader.query(`SELECT count(*) FROM ${S}."leases_0"`);
    await holder.query('COMMIT');
    assert.equal(
      await pruning,
      'blocked',
      'the call compiled before the commit asked for leases_0 (and, the table kept, answered instead of failing)',
    );
    assert.equal(
      (await pruner.query(`SELECT ${S}.prune_slot(0::smallint, 500) AS result`)).rows[0].result,
      'pruned',
      'a call begun after the commit prunes the segment with leases_0 still read',
    );
    await reader.query('COMMIT');
    const report = await current.migrate({ connectionString: DATABASE_URL, schema });
    assert.deepEqual(
      report.applied.map((m) => m.version),
      FROM_22.filter((v) => v > 22),
      'the rest applies once the prune is done',
    );
  } finally {
    await holder.query('ROLLBACK').catch(() => undefined);
    await reader.query('ROLLBACK').catch(() => undefined);
    await Promise.all([holder.end(), pruner.end(), reader.end()]);
  }
});
