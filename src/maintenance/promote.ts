import type pg from 'pg';
import { inPoolTransaction } from '../db/connections.js';
import { laneKey, type Lane } from '../lane.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from '../storage/storage.js';

export type DeferredState = 'scheduled' | 'retryable';

export interface PromoteOutcome {
  /** Rows moved into the ready ring. */
  promoted: number;
  /** Lanes whose share was promoted. */
  lanes: number;
  /** Lanes whose lock could not be had within the timeout: their rows stay deferred. */
  contended: Lane[];
  /** Lanes that failed for another reason (logged by the caller). */
  failed: { lane: Lane; error: Error }[];
  /** Rows the batch selected (a full batch means more may be due). */
  selected: number;
}

const LOCK_NOT_AVAILABLE = '55P03';

/**
 * Select one batch of due deferred rows (ORDER BY run_at, priority, id LIMIT, FOR UPDATE SKIP
 * LOCKED, as its own statement so its row locks end with it), group them by lane, and promote
 * each lane's share (that many of the lane's oldest due rows, chosen under the lane lock) in its
 * own transaction under `laneLockTimeoutMs`. A lane that times out
 * rolls back, keeps its rows deferred and is returned as contended; the other lanes go ahead.
 * `skip` leaves named lanes out of the selection (lanes a waiter is already promoting).
 *
 * SKIP LOCKED matters: rows another transaction holds (a waiter left running by a former
 * leader) would otherwise be reselected by every batch and starve every other lane.
 */
export async function promoteDueLanes(
  pool: pg.Pool,
  schema: string,
  state: DeferredState | null,
  batchSize: number,
  laneLockTimeoutMs: number | null,
  skip: readonly Lane[] = [],
): Promise<PromoteOutcome> {
  return promoteDueLanesIn(pool, storageFor(schema), state, batchSize, laneLockTimeoutMs, skip);
}

/** promoteDueLanes on a bound storage. */
export async function promoteDueLanesIn(
  pool: pg.Pool,
  storage: Storage,
  state: DeferredState | null,
  batchSize: number,
  laneLockTimeoutMs: number | null,
  skip: readonly Lane[] = [],
): Promise<PromoteOutcome> {
  // Through due_deferred (a definer function): the row locks need UPDATE on deferred, which a
  // worker role does not have.
  const sel = await pool.query<{ id: string; queue: string; priority: number; shard: number }>(
    storage
      .statement('due-deferred', ({ q: s }) =>
        positional(
          `SELECT id::text AS id, queue, priority, shard
       FROM ${s}.due_deferred($1::text, $2::integer, $3::text[], $4::smallint[], $5::smallint[])`,
          ['state', 'batchSize', 'skipQueues', 'skipPriorities', 'skipShards'],
        ),
      )
      .query({
        state,
        batchSize,
        skipQueues: skip.map((l) => l.queue),
        skipPriorities: skip.map((l) => l.priority),
        skipShards: skip.map((l) => l.shard),
      }),
  );
  const groups = new Map<string, { lane: Lane; ids: string[] }>();
  for (const r of sel.rows) {
    const lane = { queue: r.queue, priority: r.priority, shard: r.shard };
    const k = laneKey(lane);
    let g = groups.get(k);
    if (!g) {
      g = { lane, ids: [] };
      groups.set(k, g);
    }
    g.ids.push(r.id);
  }
  const out: PromoteOutcome = { promoted: 0, lanes: 0, contended: [], failed: [], selected: sel.rowCount ?? 0 };
  for (const { lane, ids } of groups.values()) {
    try {
      const n = await promoteInLaneTransaction(pool, storage, lane, ids.length, laneLockTimeoutMs);
      out.promoted += n;
      out.lanes += 1;
    } catch (err) {
      if ((err as { code?: string }).code === LOCK_NOT_AVAILABLE) out.contended.push(lane);
      else out.failed.push({ lane, error: err as Error });
    }
  }
  return out;
}

/**
 * Promote the oldest due rows of one lane (up to `batchSize`), under an optional lock timeout.
 * Aborting `signal` cancels the statement (its transaction rolls back, the rows stay deferred).
 */
export async function promoteDueLane(
  pool: pg.Pool,
  schema: string,
  lane: Lane,
  batchSize: number,
  laneLockTimeoutMs: number | null,
  signal?: AbortSignal,
): Promise<number> {
  return promoteInLaneTransaction(pool, storageFor(schema), lane, batchSize, laneLockTimeoutMs, signal);
}

/** promoteDueLane on a bound storage. */
export const promoteDueLaneIn = promoteInLaneTransaction;

/** Promote everything due, lane by lane, with no lock timeout. Returns rows promoted. */
export async function promoteDue(pool: pg.Pool, schema: string, batchSize = 1000): Promise<number> {
  const storage = storageFor(schema);
  let total = 0;
  for (;;) {
    const r = await promoteDueLanesIn(pool, storage, null, batchSize, null);
    total += r.promoted;
    if (r.failed.length > 0) throw r.failed[0]!.error;
    if (r.selected < batchSize || r.promoted === 0) return total;
  }
}

/** Whether an error is a lock timeout (the lane was busy). */
export function isLockTimeout(err: unknown): boolean {
  return (err as { code?: string } | null)?.code === LOCK_NOT_AVAILABLE;
}

async function promoteInLaneTransaction(
  pool: pg.Pool,
  storage: Storage,
  lane: Lane,
  limit: number,
  laneLockTimeoutMs: number | null,
  signal?: AbortSignal,
): Promise<number> {
  if (signal?.aborted) return 0;
  const statement = storage.statement('promote-lane', ({ q: s }) =>
    positional(`SELECT ${s}.promote_lane($1, $2::smallint, $3::smallint, $4) AS n`, [
      'queue',
      'priority',
      'shard',
      'limit',
    ]),
  );
  return inPoolTransaction(
    pool,
    async (c) => {
      // A statement waiting on a lock does not notice its socket closing, so cancel it
      // server-side. The cancel travels on another connection and may land after this statement
      // has finished; a cancelled client is therefore discarded, never pooled, so a late cancel
      // can only hit this backend, idle and about to close, never someone else's statement.
      const cancel = () => {
        c.discard();
        if (c.pid) pool.query('SELECT pg_cancel_backend($1)', [c.pid]).catch(() => undefined);
      };
      signal?.addEventListener('abort', cancel);
      try {
        const r = await c.client.query<{ n: number }>(
          statement.query({ queue: lane.queue, priority: lane.priority, shard: lane.shard, limit }),
        );
        return r.rows[0]?.n ?? 0;
      } finally {
        signal?.removeEventListener('abort', cancel);
      }
    },
    {
      lockTimeoutMs: laneLockTimeoutMs,
      // The lock timeout must be what ends a wait on a busy lane (a waiter's 30 s equals the
      // worker's default statement timeout, which would otherwise fire first and read as a
      // failure): the statement gets the lock wait plus room for the promotion itself.
      ...(laneLockTimeoutMs !== null ? { statementTimeoutMs: laneLockTimeoutMs + 10_000 } : {}),
    },
  );
}
