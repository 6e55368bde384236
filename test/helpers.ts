import pg from 'pg';
import { after } from 'node:test';
import { migrate } from '../src/index.js';
import { MIGRATIONS } from '../src/schema/migrations.js';
import type { BerthMetrics } from '../src/metrics/catalogue.js';
import { createLogger, logLevel, type Logger } from '../src/logger.js';

export const DATABASE_URL = process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** A quiet logger for tests (BERTH_LOG_LEVEL=debug to see everything). */
export const testLogger = createLogger({ test: true }, undefined, logLevel(process.env.BERTH_LOG_LEVEL));
if (!process.env.BERTH_LOG_LEVEL) testLogger.level = 'silent';

/**
 * A fresh, migrated schema of its own for one test file (files run in parallel), dropped
 * when the file ends. Returns a pool on the test database.
 */
export async function freshSchema(name: string): Promise<{ schema: string; pool: pg.Pool }> {
  const schema = `t_${name}_${process.pid}`;
  // jit off as on every session berth opens itself (SESSION_OPTIONS in src/process/worker-pools.ts):
  // maintenance and admin statements plan over every ring partition, and on never-analyzed
  // partitions their estimates pass jit_above_cost, where compiling them takes seconds.
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 10, options: '-c jit=off' });
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await migrate({ connectionString: DATABASE_URL, schema });
  after(async () => {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
    await pool.end();
  });
  return { schema, pool };
}

export { scaled, TIMEOUT_SCALE } from './timeouts.js';
import { scaled } from './timeouts.js';

/** Poll `check` until it returns a truthy value (or throw after `timeoutMs`, scaled). Not a timing assertion: a liveness bound. */
export async function waitFor<T>(
  check: () => Promise<T> | T,
  timeoutMs = 20_000,
  what = 'condition',
): Promise<NonNullable<T>> {
  const deadline = Date.now() + scaled(timeoutMs);
  for (;;) {
    const v = await check();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (${scaled(timeoutMs)} ms)`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

export async function counterValue(
  metrics: BerthMetrics,
  name: string,
  labels: Record<string, string>,
): Promise<number> {
  // Histograms list their _count/_sum series under the base name, tagged with metricName.
  const all = await metrics.registry.getMetricsAsJSON();
  const m = all.find((x) => x.name === name) ?? all.find((x) => name.startsWith(`${x.name}_`));
  if (!m) return 0;
  let total = 0;
  for (const v of m.values as { value: number; labels: Record<string, unknown>; metricName?: string }[]) {
    if (m.name !== name && v.metricName !== name) continue;
    if (Object.entries(labels).every(([k, val]) => v.labels[k] === val)) total += v.value;
  }
  return total;
}

export function outcomes(metrics: BerthMetrics, type: string, outcome: string): Promise<number> {
  return counterValue(metrics, 'berth_task_outcomes_total', { task_type: type, outcome });
}

/** `p`, or a failure naming `what` once `timeoutMs` (scaled) has passed: for a call that must return, not hang. */
export async function within<T>(p: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${what} did not finish within ${scaled(timeoutMs)} ms`)),
      scaled(timeoutMs),
    );
  });
  try {
    return await Promise.race([p, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Wait until the database clock is past a lease's expiry (`leaseExpiresAt`, epoch ms): the lease has lapsed. */
export async function leaseLapsed(db: pg.Pool, expiresAtMs: number): Promise<void> {
  await waitFor(
    async () => (await db.query('SELECT now() > to_timestamp($1 / 1000.0) AS past', [expiresAtMs])).rows[0].past,
    10_000,
    'the lease to lapse',
  );
}

export { FAST_MAINTENANCE } from './support/settings.js';

/**
 * Settle a running task's lease as another party would (rescue after a lapse), so its holder's
 * own settlement is refused: the way to provoke a `lost` outcome from inside a handler.
 */
export async function takeLeaseOver(db: pg.Pool, schema: string, id: string): Promise<void> {
  const s = quoteIdent(schema);
  await db.query(
    `INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
     SELECT slot, lane_id, lease_from, int8multirange(int8range(lane_seq, lane_seq + 1)), 1, 'rescued'
       FROM ${s}.leased_entries WHERE id = $1 AND outcome IS NULL ON CONFLICT DO NOTHING`,
    [id],
  );
}

import { pino } from 'pino';
import { Writable } from 'node:stream';

/** A logger whose JSON lines are kept for assertions (and printed only with BERTH_LOG_LEVEL). */
export function captureLogger(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l) lines.push(JSON.parse(l));
      if (process.env.BERTH_LOG_LEVEL) process.stdout.write(chunk);
      cb();
    },
  });
  const logger: Logger = pino({ level: 'debug' }, stream);
  return { logger, lines };
}

/** Wait until an outcome counter reaches `n` (it is bumped just after the settlement commits), then require exactly `n`. */
export async function expectOutcome(metrics: BerthMetrics, type: string, outcome: string, n: number): Promise<void> {
  await waitFor(async () => (await outcomes(metrics, type, outcome)) >= n, 10_000, `${n} ${outcome} of ${type}`).catch(
    () => undefined,
  );
  const got = await outcomes(metrics, type, outcome);
  if (got !== n) throw new Error(`expected ${n} ${outcome} outcome(s) for ${type}, got ${got}`);
}

import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { schemaLockKey } from '../src/storage/locks.js';
import { quoteIdent } from '../src/sql.js';

/** The test database's URL, logging in as `role`. */
export function urlAs(role: string): string {
  const url = new URL(DATABASE_URL);
  url.username = role;
  return url.toString();
}

/**
 * Start test/fixtures/worker-process.ts (or another fixture there) as a child process; resolves
 * once its worker runs. `pipe` gives the test the child's stdout (its log lines) to read.
 */
export function spawnWorkerProcess(
  schema: string,
  id: string,
  opts: { fixture?: string; env?: Record<string, string>; pipe?: boolean } = {},
): Promise<ChildProcess> {
  const fixture = fileURLToPath(new URL(`./fixtures/${opts.fixture ?? 'worker-process.ts'}`, import.meta.url));
  const child = fork(fixture, [], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, SCHEMA: schema, DATABASE_URL, WORKER_ID: id, ...opts.env },
    stdio: ['ignore', opts.pipe ? 'pipe' : 'inherit', 'inherit', 'ipc'],
  });
  return new Promise((resolve, reject) => {
    child.once('message', () => resolve(child));
    child.once('exit', (code) => reject(new Error(`worker ${id} exited early (${code})`)));
  });
}

/** SIGTERM each child (a worker process stops gracefully on it) and wait until all have exited. */
export async function stopProcesses(children: Iterable<ChildProcess>): Promise<void> {
  await Promise.all(
    [...children].map(
      (c) =>
        new Promise((resolve) => {
          if (c.exitCode !== null || c.signalCode !== null) return resolve(null);
          c.once('exit', resolve);
          c.kill('SIGTERM');
        }),
    ),
  );
}

/**
 * Hold `table` (schema-qualified, quoted) in ACCESS EXCLUSIVE mode in an open transaction on a
 * session of `pool`: every statement that reads it waits. `release()` rolls back (idempotent).
 */
export async function holdTableLock(
  pool: pg.Pool,
  table: string,
): Promise<{ client: pg.PoolClient; release: () => Promise<void> }> {
  const client = await pool.connect();
  await client.query('BEGIN');
  await client.query(`LOCK TABLE ${table} IN ACCESS EXCLUSIVE MODE`);
  let done = false;
  return {
    client,
    release: async () => {
      if (done) return;
      done = true;
      await client.query('ROLLBACK').catch(() => undefined);
      client.release();
    },
  };
}

/** Hold a lane's producer lock the way an open enqueue transaction does; call the result to commit. */
export async function holdLaneLock(schema: string, lane: number): Promise<() => Promise<void>> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  await c.query('BEGIN');
  await c.query('SELECT pg_advisory_xact_lock($1, $2)', [schemaLockKey(schema), lane]);
  return async () => {
    await c.query('COMMIT');
    await c.end();
  };
}

/**
 * A schema as an older berth left it, for upgrade tests: `schema_migrations` and the migrations up
 * to `version`, run as they are (no checksum recorded, as before checksums). The schema exists.
 */
export async function migrateUpTo(db: pg.ClientBase | pg.Pool, schema: string, version: number): Promise<void> {
  const s = quoteIdent(schema);
  await db.query(`CREATE TABLE ${s}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now(), checksum text)`);
  for (const m of MIGRATIONS.filter((x) => x.version <= version)) {
    await db.query(m.sql(schema));
    await db.query(`INSERT INTO ${s}.schema_migrations (version, name) VALUES ($1, $2)`, [m.version, m.name]);
  }
}

/** The worker id of the session holding `schema`'s leader lock, from pg_locks + application_name. */
export async function leaderWorkerId(pool: pg.Pool, schema: string): Promise<string | null> {
  const r = await pool.query(
    `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
      WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::oid AND l.objid = $2::oid AND l.objsubid = 2`,
    [schemaLockKey(schema) >>> 0, -1 >>> 0],
  );
  const name: string | undefined = r.rows[0]?.application_name;
  return name?.startsWith('berth leader ') ? name.slice('berth leader '.length) : null;
}
