import { type Queryable, queryRingRead } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor } from '../storage/storage.js';
import { HEARTBEAT_FUTURE_ALLOWANCE_MS } from '../storage/live-workers.js';

export const DEFAULT_DEAD_RETENTION_MS = 7 * 24 * 3600 * 1000;

/**
 * Prune dead letters whose last attempt is older than the retention window and that no live
 * lease carries (the dead gauge's predicate), in bounded batches, through the schema's
 * `prune_dead_letters` definer function: a worker role has no DELETE on the dead letters, and
 * every batch that deletes something leaves an audit log row. Returns rows removed.
 */
export async function pruneDeadLetters(
  db: Queryable,
  schema: string,
  retentionMs = DEFAULT_DEAD_RETENTION_MS,
  batch = 5000,
  signal?: AbortSignal,
): Promise<number> {
  const statement = storageFor(schema).statement('prune-dead-letters', ({ q: s }) =>
    positional(`SELECT ${s}.prune_dead_letters($1::float8, $2::integer) AS n`, ['retentionMs', 'batch']),
  );
  let total = 0;
  for (;;) {
    // A scan of the settled history: with a ring read's planner settings, not a worker session's.
    const r = await queryRingRead<{ n: number }>(db, statement.text, statement.values({ retentionMs, batch }));
    const n = r.rows[0]?.n ?? 0;
    total += n;
    // Stops between batches when the leader steps down; the rest waits for the next run.
    if (n < batch || signal?.aborted) return total;
  }
}

/** How long per-minute outcome counts are kept (the dashboard charts read at most this far back). */
export const OUTCOME_COUNT_RETENTION_MS = 7 * 24 * 3600 * 1000;
/** A worker row not refreshed for this long belongs to a process that died without stopping. */
export const DEAD_WORKER_RETENTION_MS = 3600 * 1000;
/**
 * Prune the operator-surface history: outcome counts and dead workers' rows, and rows no
 * heartbeat wrote (dated past HEARTBEAT_FUTURE_ALLOWANCE_MS ahead of the database's clock, or
 * infinite: a heartbeat stamps now()), which would otherwise never age out. The audit log is
 * deliberately not pruned here: the leader runs with runtime credentials, and a role that can
 * delete audit entries could erase its own trail. Operators prune it (see docs/operations.md).
 */
export async function pruneOperatorHistory(
  db: Queryable,
  schema: string,
): Promise<{ outcomeCounts: number; workers: number }> {
  const storage = storageFor(schema);
  const ago = `now() - make_interval(secs => $1 / 1000.0)`;
  const ahead = `now() + make_interval(secs => $2 / 1000.0)`;
  const window = ['keepMs', 'aheadMs'] as const;
  const counts = await db.query(
    storage
      .statement('prune-outcome-counts', ({ q: s }) =>
        positional(`DELETE FROM ${s}.outcome_counts WHERE minute < ${ago} OR minute > ${ahead}`, window),
      )
      .query({ keepMs: OUTCOME_COUNT_RETENTION_MS, aheadMs: HEARTBEAT_FUTURE_ALLOWANCE_MS }),
  );
  const workers = await db.query(
    storage
      .statement('prune-workers', ({ q: s }) =>
        positional(
          `DELETE FROM ${s}.workers WHERE last_seen_at < ${ago} OR last_seen_at > ${ahead} OR NOT isfinite(started_at)`,
          window,
        ),
      )
      .query({ keepMs: DEAD_WORKER_RETENTION_MS, aheadMs: HEARTBEAT_FUTURE_ALLOWANCE_MS }),
  );
  return { outcomeCounts: counts.rowCount ?? 0, workers: workers.rowCount ?? 0 };
}
