/**
 * Shared by the type-limits-review-*.test.ts repros (a review of task type rate limits, migration
 * 30): an in-process worker with fast maintenance, and the row lock that makes a worker's ask for
 * a start (`take_type_starts()`) wait. No node:test import.
 */
import pg from 'pg';
import { Worker } from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { DATABASE_URL, FAST_MAINTENANCE, testLogger, waitFor } from './helpers.js';

export function reviewWorker(schema: string, tasks: AnyTaskDefinition[], slots = 8): Worker {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    slots,
    pollIntervalMs: 200,
    logger: testLogger,
    maintenance: { ...FAST_MAINTENANCE, ringIntervalMs: 600_000 },
  });
}

/** A session holding `type`'s type_limits row (schema `S`, quoted), so every take_type_starts of the type waits. */
export async function holdTypeRow(S: string, type: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  await c.query('BEGIN');
  await c.query(`SELECT 1 FROM ${S}.type_limits WHERE type = $1 FOR UPDATE`, [type]);
  return c;
}

/** The pid of a worker's take_type_starts once it waits on a lock. */
export function askWaiting(pool: pg.Pool): Promise<number> {
  return waitFor(
    async () =>
      (
        await pool.query<{ pid: number }>(
          `SELECT pid FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%take_type_starts%'`,
        )
      ).rows[0]?.pid,
    20_000,
    'a take_type_starts waiting on the type row',
  );
}
