import { BerthInputError } from '../errors.js';
import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';
import type { AttemptRef } from './attempt.js';

/**
 * Who took a refused settlement's entry: the outcome of the settlement that covers it (null when
 * none does), and whether the lease the refused writer held still exists. A lease that does not
 * exist was never durable: its claim commits asynchronously (src/processor/claim.ts), and a
 * server crash within the WAL writer's delay lost it. One statement, on the refused path only.
 */
export interface Refusal {
  outcome: string | null;
  leaseExists: boolean;
}

export async function refusalOf(db: Queryable, storage: Storage, ref: AttemptRef): Promise<Refusal> {
  const statement = storage.statement('refusal', ({ q: s }) =>
    positional(
      `SELECT (SELECT x.outcome FROM ${s}.range_settlements x
              WHERE x.lane_id = $1 AND x.lease_from = $2 AND x.slot = $3 AND x.seqs @> $4::bigint
              LIMIT 1) AS outcome,
            EXISTS (SELECT 1 FROM ${s}.range_leases l
                     WHERE l.lane_id = $1 AND l.from_seq = $2 AND l.slot = $3 AND l.token = $5::uuid) AS lease_exists`,
      ['laneId', 'leaseFrom', 'segment', 'laneSeq', 'token'],
    ),
  );
  const res = await db.query<{ outcome: string | null; lease_exists: boolean }>(
    statement.query({
      laneId: ref.laneId,
      leaseFrom: ref.leaseFrom,
      segment: ref.segment,
      laneSeq: ref.laneSeq,
      token: ref.token,
    }),
  );
  const row = res.rows[0]!;
  return { outcome: row.outcome, leaseExists: row.lease_exists };
}

/**
 * What `countLostClaim` did with the entry of a run whose lease a server crash took back:
 * - `counted`: its attempt counted, the task back in deferred (due now);
 * - `dead`: that was its last attempt, the task buried;
 * - `running`: another claim took the entry first and runs it again under the same attempt;
 * - `gone`: the entry no longer stands for the task (settled, removed, reclaimed).
 */
export type LostClaimResult = 'counted' | 'dead' | 'running' | 'gone';

/**
 * Count the attempt of a run whose lease vanished (`count_lost_claim()`, migration 19): without
 * it the next claim of the entry carried the same attempt number, so a task whose run crashes
 * the database could run for ever. Attempt history gets a `lost` row for the run. Must run at
 * READ COMMITTED (as `removeUnleased`).
 */
export async function countLostClaim(
  db: Queryable,
  storage: Storage,
  ref: AttemptRef & { attempt: number; maxAttempts: number },
  worker: string,
): Promise<LostClaimResult> {
  const statement = storage.statement('count-lost-claim', ({ q: s }) =>
    positional(
      `SELECT ${s}.count_lost_claim($1::smallint, $2::integer, $3::bigint, $4::integer, $5::integer, $6::text) AS result`,
      ['segment', 'laneId', 'laneSeq', 'attempt', 'maxAttempts', 'worker'],
    ),
  );
  const res = await db.query<{ result: LostClaimResult | 'isolation' }>(
    statement.query({
      segment: ref.segment,
      laneId: ref.laneId,
      laneSeq: ref.laneSeq,
      attempt: ref.attempt,
      maxAttempts: ref.maxAttempts,
      worker,
    }),
  );
  const result = res.rows[0]!.result;
  if (result === 'isolation') throw new BerthInputError('countLostClaim must run at READ COMMITTED');
  return result;
}
