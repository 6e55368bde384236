import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';
import type { AttemptRef } from './attempt.js';

/**
 * The `overdue_leases` rows a worker writes for a handler still running past its deadline
 * (migration 6). Nothing here runs on the hot path: a row exists only while a handler ignores
 * its AbortSignal. Rescue reads them (see rescue.ts); the dashboard marks them.
 */

/**
 * Record that this worker still runs the lease's handler past its deadline, so rescue leaves
 * the lease alone once it lapses. Fenced like a settlement: only the token's holder, only while
 * the lease is unsettled and not yet expired (a lease that already lapsed may be rescued at any
 * moment, so protecting it then would promise what rescue does not keep). Returns whether the
 * row was written.
 */
export async function protectOverdueLease(
  db: Queryable,
  storage: Storage,
  task: AttemptRef,
  workerId: string,
  stuckInMs: number,
  staleAfterMs: number,
): Promise<boolean> {
  const statement = storage.statement('protect-overdue', ({ q: s }) =>
    positional(
      `INSERT INTO ${s}.overdue_leases (slot, lane_id, lane_seq, id, type, attempt, worker_id, stuck_at, stale_after)
     SELECT l.slot, l.lane_id, l.lane_seq, l.id, l.type, l.attempt, $5,
            now() + make_interval(secs => $6 / 1000.0), make_interval(secs => $7 / 1000.0)
       FROM ${s}.leased_entries l
      WHERE l.lane_id = $1 AND l.lane_seq = $2 AND l.slot = $3 AND l.token = $4
        AND l.expires_at > now() AND l.outcome IS NULL
     ON CONFLICT DO NOTHING`,
      ['laneId', 'laneSeq', 'segment', 'token', 'workerId', 'stuckInMs', 'staleAfterMs'],
    ),
  );
  const r = await db.query(
    statement.query({
      laneId: task.laneId,
      laneSeq: task.laneSeq,
      segment: task.segment,
      token: task.token,
      workerId,
      stuckInMs: Math.max(0, stuckInMs),
      staleAfterMs,
    }),
  );
  return (r.rowCount ?? 0) > 0;
}

/**
 * The holder's proof of life for the leases it still runs: one statement for all of them.
 * Only rows of handlers running now are refreshed, so a row whose delete failed goes stale.
 */
export async function refreshOverdueLeases(
  db: Queryable,
  storage: Storage,
  workerId: string,
  refs: readonly AttemptRef[],
): Promise<void> {
  if (refs.length === 0) return;
  const statement = storage.statement('refresh-overdue', ({ q: s }) =>
    positional(
      `UPDATE ${s}.overdue_leases o SET seen_at = now()
       FROM unnest($2::integer[], $3::bigint[], $4::smallint[]) AS k(lane_id, lane_seq, slot)
      WHERE o.lane_id = k.lane_id AND o.lane_seq = k.lane_seq AND o.slot = k.slot AND o.worker_id = $1`,
      ['workerId', 'laneIds', 'laneSeqs', 'segments'],
    ),
  );
  await db.query(
    statement.query({
      workerId,
      laneIds: refs.map((r) => r.laneId),
      laneSeqs: refs.map((r) => r.laneSeq),
      segments: refs.map((r) => r.segment),
    }),
  );
}

/** The handler returned and its settlement was written (or refused): the row has done its job. */
export async function clearOverdueLease(db: Queryable, storage: Storage, ref: AttemptRef): Promise<void> {
  await db.query(
    storage
      .statement('clear-overdue', ({ q: s }) =>
        positional(`DELETE FROM ${s}.overdue_leases WHERE lane_id = $1 AND lane_seq = $2 AND slot = $3`, [
          'laneId',
          'laneSeq',
          'segment',
        ]),
      )
      .query({ laneId: ref.laneId, laneSeq: ref.laneSeq, segment: ref.segment }),
  );
}

/** What the dashboard shows for a lease still running past its deadline. */
export interface OverdueMark {
  worker: string;
  attempt: number;
  /** When its holder reported it past its deadline. */
  since: Date;
  /** Past deadline + grace: reported stuck. */
  stuck: boolean;
  /** The holder refreshed it recently, so rescue leaves the lease alone. */
  protected: boolean;
}

/** Overdue marks of these tasks' unsettled leases, by task id (most tasks have none). */
export async function overdueMarks(
  db: Queryable,
  storage: Storage,
  ids: readonly string[],
): Promise<Map<string, OverdueMark>> {
  const out = new Map<string, OverdueMark>();
  if (ids.length === 0) return out;
  const r = await db.query<{
    id: string;
    worker_id: string;
    attempt: number;
    since: Date;
    stuck: boolean;
    protected: boolean;
  }>(
    storage
      .statement('overdue-marks', ({ q: s }) =>
        positional(
          `SELECT o.id::text AS id, o.worker_id, o.attempt, o.since, o.stuck_at <= now() AS stuck,
            o.seen_at > now() - o.stale_after AS protected
       FROM ${s}.overdue_leases o
      WHERE o.id = ANY ($1::bigint[])
        AND NOT EXISTS (SELECT 1 FROM ${s}.leased_entries le
                         WHERE le.lane_id = o.lane_id AND le.lane_seq = o.lane_seq AND le.slot = o.slot
                           AND le.outcome IS NOT NULL)`,
          ['ids'],
        ),
      )
      .query({ ids }),
  );
  for (const row of r.rows)
    out.set(row.id, {
      worker: row.worker_id,
      attempt: row.attempt,
      since: row.since,
      stuck: row.stuck,
      protected: row.protected,
    });
  return out;
}
