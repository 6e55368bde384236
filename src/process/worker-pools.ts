import type pg from 'pg';
import { createPool, type DatabaseTarget, sessionName } from '../db/connections.js';
import type { Logger } from '../logger.js';
import type { ResolvedWorkerOptions } from './worker-options.js';

/**
 * Worker sessions run without JIT: the claim's plan over every ring partition is costed high
 * enough to trigger JIT compilation, which took ~1 s per statement for a sub-millisecond query.
 *
 * And without bitmap scans: ring partitions are truncated all the time and so are almost never
 * analyzed, and on such estimates the claim read a lane's whole backlog past its cursor with a
 * bitmap scan (unordered) to sort it and keep the first entries: 5.3 ms per claim at 1,700
 * entries per lane (20k queued), growing with the backlog. Without it the plan is a Merge
 * Append of the partitions' primary keys under the LIMIT, which stops after the entries it
 * takes: 0.2 ms per lane (EXPLAIN ANALYZE, docs/benchmarks-journal.md "Range leases").
 *
 * And without sequential scans: the claim and the completion are named statements whose generic
 * plan each session keeps, made when a ring segment's lease partition was nearly empty (a page).
 * That plan read the lane cursor (the lane's highest lease) with a sequential scan of every
 * lease in the segment, once per lane, and the completion joined its batch against the same: both
 * grew with the slot, to ~1,900 leases read per lane per claim at 50k tasks (3.2 ms of a 7.2 ms
 * claim, auto_explain during bench/drain-profile.ts). With them off the same cached plans probe
 * the primary keys; the PostgreSQL backends' CPU per task went from 47–56 µs to 32–37 µs, and
 * the drain from 16–20k to 23–25k tasks/s (c10, 2026-12-01). Reads that walk whole partitions
 * on purpose (rescue, gauges, prune) turn both back on for themselves (`queryRingRead`).
 */
export const SESSION_OPTIONS =
  '-c jit=off -c plan_cache_mode=force_generic_plan -c enable_bitmapscan=off -c enable_seqscan=off' +
  // READ COMMITTED whatever the database's or the role's default: the limited claim's capacity
  // and a key's admission read, after taking their lock, what was committed before it was
  // granted (a statement's own snapshot); at REPEATABLE READ the transaction's first snapshot,
  // older than the lock, would miss a competing claim or admission (limit_capacity and
  // promote_held refuse to run at another level).
  ' -c default_transaction_isolation=read\\ committed';

/**
 * One of a worker's pools on `target` (the primary, the replica, the leader's session), its
 * sessions started with SESSION_OPTIONS and named for the worker. The engine's shape donor
 * (engine-donor.ts) makes its pools here too, so their options have the real ones' shape.
 */
export function workerPool(
  o: ResolvedWorkerOptions,
  workerId: string,
  logger: Logger,
  target: DatabaseTarget,
  max: number,
  kind: 'write' | 'read',
  idleTimeoutMillis?: number,
): pg.Pool {
  return createPool(
    target,
    {
      max,
      statement_timeout: o.statementTimeoutMs,
      // The replica's statements are bounded on this side too: statement_timeout is the
      // server's, and a replica cut off by the network (no reset, no answer) would hold the
      // fetch until TCP gave up, where this fails it and discovery reads the primary.
      ...(kind === 'read' ? { query_timeout: o.statementTimeoutMs } : {}),
      options: SESSION_OPTIONS,
      application_name: sessionName(kind === 'write' ? 'worker' : 'read', workerId),
      ...(idleTimeoutMillis === undefined ? {} : { idleTimeoutMillis }),
    },
    logger,
    kind,
  );
}
