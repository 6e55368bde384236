import { inTransactionOn } from '../db/connections.js';
import type { Queryable } from '../sql.js';
import { holdLeases, limitCapacity } from '../storage/limits.js';
import { type ClaimBatch, claimBatch, type ClaimParams, discover } from './claim.js';

/**
 * The limited claim: the claim of one limited queue (a queue with a row in `queue_limits`),
 * one transaction of four statements on the primary:
 *
 * 1. `limit_capacity(queue, want)` locks the queue's limit row (claims of this queue wait for
 *    each other here; claims of other queues never do) and answers how many tasks may start:
 *    `want`, less what the queue's running limit and rate limit leave. 0 ends the transaction.
 * 2. discovery of the queue's limited lanes, in the same transaction (a snapshot taken after the
 *    row lock, on the primary: a replica's candidates could be older than the capacity count);
 * 3. the ordinary claim statement over those lanes (`limited: true`), for at most the capacity;
 * 4. `hold_leases()` records the leases taken, so the next claim of the queue counts them.
 *
 * The claim's own asynchronous commit (ASYNC_COMMIT in claim.ts) covers the whole transaction:
 * a server crash that loses the lease loses its holder with it, never one without the other.
 * No prefetch: `want` is the worker's idle slots, since a task waiting in a worker's buffer
 * would hold a share of a fleet-wide limit that another worker could be running.
 */
export interface LimitedClaim extends ClaimBatch {
  /** What limit_capacity answered: 0 when the queue is at a limit (or no longer limited). */
  capacity: number;
  /** A rate limit bounded the capacity: it frees again in this many ms. */
  retryMs: number | null;
}

export async function claimLimitedQueue(
  db: Queryable,
  params: Omit<ClaimParams, 'laneIds' | 'limit' | 'limited' | 'queues' | 'maxLanes' | 'perLane'>,
  queue: string,
  want: number,
): Promise<LimitedClaim> {
  if (want <= 0) return { tasks: [], more: false, stale: false, capacity: 0, retryMs: null };
  return inTransactionOn(db, async (tx) => {
    const { free: capacity, retryMs, guardMs } = await limitCapacity(tx, params.storage, queue, want);
    if (capacity <= 0) return { tasks: [], more: false, stale: false, capacity: 0, retryMs };
    // Over the whole ring, not the worker's window: a window read before the ring rotated
    // leaves out a lane whose entries are all in the newer segment, and with no candidate no
    // claim runs to find the window stale (the claim below still checks it).
    const candidates = await discover(tx, params.storage, [queue], 20, 1, undefined, true);
    const laneIds = [...new Set(candidates.map((c) => c.laneId))];
    if (laneIds.length === 0) return { tasks: [], more: false, stale: false, capacity, retryMs: null };
    // Every candidate lane, not a share of them (LANE_SHARE, the ordinary claim's): claims of
    // this queue wait for each other on its limit row, so there is no competing claimer to
    // spread over, and a queue whose tasks sit one in each lane would give one task a claim.
    const maxLanes = laneIds.length;
    const batch = await claimBatch(tx, {
      ...params,
      laneIds,
      limit: capacity,
      limited: true,
      queues: [queue],
      maxLanes,
      perLane: capacity,
    });
    if (batch.tasks.length > 0) {
      // The recorded start of these tasks happens inside the next statement, so after now.
      const sent = Date.now();
      await holdLeases(tx, params.storage, queue, leasesOf(batch));
      if (guardMs !== null) for (const t of batch.tasks) t.startBy = sent + guardMs;
    }
    // Lanes beyond the ones locked, or a full page of them: the queue may hold more than it gave.
    const more = batch.more || candidates.length >= 20;
    return { ...batch, more, capacity, retryMs };
  });
}

/** One entry per range lease of the batch (its tasks share the lease's key). */
function leasesOf(batch: ClaimBatch) {
  const seen = new Map<string, { segment: number; laneId: number; leaseFrom: string }>();
  for (const t of batch.tasks) {
    const key = `${t.laneId}:${t.leaseFrom}:${t.segment}`;
    if (!seen.has(key)) seen.set(key, { segment: t.segment, laneId: t.laneId, leaseFrom: t.leaseFrom });
  }
  return [...seen.values()];
}
