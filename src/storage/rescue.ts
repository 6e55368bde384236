import { bindSchema, type Queryable, type SchemaRef } from '../sql.js';
import { settleAndMove } from './settle-tail.js';

export interface RescueOutcome {
  /** Back to retryable (due now), attempt burnt. */
  retried: number;
  /** Out of attempts: moved to the dead letters. */
  dead: number;
  /**
   * Lapsed but left alone: the holder still runs the handler and refreshes its overdue row
   * (see overdue.ts), so rescuing it would run the task twice at once.
   */
  held: number;
}

/**
 * Rescue lapsed leases: a lease whose expires_at (database clock) has passed with no
 * settlement belongs to a worker that died or hung. The attempt its claim burnt is kept, so a
 * task that reliably kills its worker dead-letters at max_attempts instead of looping.
 * The settlement insert is the fence: a worker settling at the same moment wins or loses
 * cleanly. Safe to run from many processes at once.
 *
 * A lapsed lease whose holder keeps its `overdue_leases` row fresh (the holder is alive and its
 * handler, past its deadline, still runs) is left alone and counted as held: seed 000 accepts
 * the duplicate run there, berth does not. When the holder dies its row goes stale and the
 * lease is rescued as any other. Rows of leases rescued here are removed, and so are stale rows
 * whose lease is settled (a holder that could not delete its own).
 */
export async function rescueLapsedLeases(db: Queryable, schema: SchemaRef, limit = 1000): Promise<RescueOutcome> {
  const { q: s } = bindSchema(schema);
  const res = await db.query<{ retried: string; dead: string; held: string }>(
    `WITH lapsed AS MATERIALIZED (
       SELECT l.slot, l.lane_id, l.lane_seq, l.id FROM ${s}.leases l
        WHERE l.expires_at < now()
          AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                           WHERE st.lane_id = l.lane_id AND st.lane_seq = l.lane_seq AND st.slot = l.slot)
          AND NOT EXISTS (${heldBy(s, 'l')})
        ORDER BY l.expires_at
        LIMIT $1
     ), won AS (
       INSERT INTO ${s}.settlements (slot, lane_id, lane_seq, id, outcome)
       SELECT slot, lane_id, lane_seq, id, 'rescued' FROM lapsed
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lane_seq
     ), src AS MATERIALIZED (
       SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, l.attempt AS attempts,
              r.max_attempts, r.dedupe_key,
              format('lease lapsed at %s on attempt %s (worker %s)', l.expires_at, l.attempt,
                     coalesce(l.worker, 'unknown')) AS last_error,
              r.created_at, l.claimed_at AS last_attempted_at,
              l.attempt >= l.max_attempts AS dead
         FROM won w
         JOIN ${s}.leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.lane_seq = w.lane_seq
         JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq
     ), ${settleAndMove(s, 'now()')}, unmarked AS (
       DELETE FROM ${s}.overdue_leases o USING won w
        WHERE o.lane_id = w.lane_id AND o.lane_seq = w.lane_seq AND o.slot = w.slot
     ), swept AS (
       -- A stale row whose lease is settled (or pruned): its holder's delete failed.
       DELETE FROM ${s}.overdue_leases o
        WHERE o.seen_at <= now() - o.stale_after
          AND NOT EXISTS (SELECT 1 FROM ${s}.leases l
                           WHERE l.lane_id = o.lane_id AND l.lane_seq = o.lane_seq AND l.slot = o.slot
                             AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                                              WHERE st.lane_id = l.lane_id AND st.lane_seq = l.lane_seq AND st.slot = l.slot))
     )
     SELECT count(*) FILTER (WHERE NOT dead) AS retried, count(*) FILTER (WHERE dead) AS dead,
            -- Driven from overdue_leases (a handful of rows), never from the lapsed leases.
            (SELECT count(*) FROM ${s}.overdue_leases o
               JOIN ${s}.leases l ON l.lane_id = o.lane_id AND l.lane_seq = o.lane_seq AND l.slot = o.slot
              WHERE l.expires_at < now() AND o.seen_at > now() - o.stale_after
                AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                                 WHERE st.lane_id = l.lane_id AND st.lane_seq = l.lane_seq AND st.slot = l.slot)) AS held
       FROM src`,
    [limit],
  );
  const row = res.rows[0]!;
  return { retried: Number(row.retried), dead: Number(row.dead), held: Number(row.held) };
}

/** The lease aliased `l` has a fresh overdue row: its holder still runs the handler. */
function heldBy(s: string, l: string): string {
  return `SELECT 1 FROM ${s}.overdue_leases o
           WHERE o.lane_id = ${l}.lane_id AND o.lane_seq = ${l}.lane_seq AND o.slot = ${l}.slot
             AND o.seen_at > now() - o.stale_after`;
}
