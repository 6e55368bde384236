import { type Queryable, queryRingRead, type Schema } from '../sql.js';
import { compile, p, positional, sql } from '../statement.js';
import { storageFor, type Storage } from './storage.js';
import { perTaskHistory } from './history.js';
import { unsettledEntriesOf, unsettledRanges } from './predicates.js';
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
 * Rescue lapsed leases: a leased entry whose deadline (its type's expiry in the range lease,
 * database clock) has passed with no settlement belongs to a worker that died or hung. One
 * `rescued` row per range lease, covering its lapsed, unsettled entries. The attempt its claim burnt is kept, so a
 * task that reliably kills its worker dead-letters at max_attempts instead of looping.
 * The settlement insert is the fence: a worker settling at the same moment wins or loses
 * cleanly (a rescue row that overlaps a concurrent settlement is dropped whole, and the range is
 * looked at again on the next run). Safe to run from many processes at once.
 *
 * A lapsed lease whose holder keeps its `overdue_leases` row fresh (the holder is alive and its
 * handler, past its deadline, still runs) is left alone and counted as held: seed 000 accepts
 * the duplicate run there, berth does not. When the holder dies its row goes stale and the
 * lease is rescued as any other. Rows of leases rescued here are removed, and so are stale rows
 * whose lease is settled (a holder that could not delete its own).
 */
export async function rescueLapsedLeases(db: Queryable, schema: string, limit = 1000): Promise<RescueOutcome> {
  return rescueLapsedLeasesIn(db, storageFor(schema), limit);
}

/** rescueLapsedLeases on a bound storage. */
export async function rescueLapsedLeasesIn(db: Queryable, storage: Storage, limit = 1000): Promise<RescueOutcome> {
  if (!(await anythingToRescue(db, storage))) return { retried: 0, dead: 0, held: 0 };
  const statement = storage.statement('rescue', rescueStatement);
  const res = await queryRingRead<{ retried: string; dead: string; held: string }>(
    db,
    statement,
    statement.values({ limit }),
  );
  const row = res.rows[0]!;
  return { retried: Number(row.retried), dead: Number(row.dead), held: Number(row.held) };
}

function rescueStatement({ name, q: s }: Schema) {
  return compile(
    sql`WITH cand AS MATERIALIZED (
       -- Leases with an entry to rescue now, oldest expiry first. The limit counts only those: a
       -- lease past its earliest expiry whose unsettled entries are of a type with a longer
       -- ceiling, or whose holder still runs them (a fresh overdue row), is looked at on every
       -- run until then, and with the limit on every lease past its expiry enough of them would
       -- keep real lapses out of every run (its EXISTS stops at the first entry it can take).
       SELECT l.* FROM ${unsettledRanges(s)} l
        WHERE l.expires_at < now()
          AND EXISTS (SELECT 1 FROM (${unsettledEntriesOf(s, 'l')}) e
                       WHERE l.type_expires[array_position(l.types, e.type)] < now()
                         AND NOT EXISTS (${heldBy(s, 'e')}))
        ORDER BY l.expires_at
        LIMIT ${p('limit')}
     ), lapsed AS MATERIALIZED (
       -- Per candidate range, one index range scan of ready (OFFSET 0 keeps it one: joined to
       -- ready as a whole, the planner sorted every ready row; docs/design/range-leases.md).
       SELECT c.slot, c.lane_id, c.from_seq, e.lane_seq,
              c.type_expires[array_position(c.types, e.type)] AS expires_at
         FROM cand c
         CROSS JOIN LATERAL (${unsettledEntriesOf(s, 'c')}) e
        WHERE c.type_expires[array_position(c.types, e.type)] < now()
          AND NOT EXISTS (${heldBy(s, 'e')})
     ), won AS (
       INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
       SELECT slot, lane_id, from_seq, range_agg(int8range(lane_seq, lane_seq + 1)), count(*)::integer, 'rescued'
         FROM lapsed GROUP BY slot, lane_id, from_seq
        ORDER BY lane_id, from_seq
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, lease_from, seqs
     ), src AS MATERIALIZED (
       SELECT r.id, r.type, r.payload, r.queue, r.priority, r.shard, r.attempts + 1 AS attempts,
              r.max_attempts, r.dedupe_key,
              format('lease lapsed at %s on attempt %s (worker %s)', x.expires_at, r.attempts + 1,
                     coalesce(l.worker, 'unknown')) AS last_error,
              r.created_at, l.claimed_at AS last_attempted_at, r.trace_context,
              r.attempts + 1 >= coalesce(r.max_attempts, l.type_max_attempts[array_position(l.types, r.type)]) AS dead,
              r.slot, r.lane_id, r.lane_seq, l.worker
         FROM won w
         JOIN lapsed x ON x.slot = w.slot AND x.lane_id = w.lane_id AND x.from_seq = w.lease_from
         JOIN ${s}.range_leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.from_seq = w.lease_from
         JOIN ${s}.ready r ON r.slot = x.slot AND r.lane_id = x.lane_id AND r.lane_seq = x.lane_seq
     ), ${settleAndMove(s, sql`now()`)}, hist AS (${perTaskHistory(
       s,
       // The holder never settled it: history records the attempt as lost, with why.
       sql`SELECT id, 'lost' AS outcome, lane_id, type, worker, last_attempted_at AS claimed_at, attempts AS attempt,
               created_at, NULL::integer AS run_ms, jsonb_build_object('message', last_error) AS error,
               NULL::jsonb AS cursor, dead FROM src`,
     )}), unmarked AS (
       DELETE FROM ${s}.overdue_leases o USING src w
        WHERE o.lane_id = w.lane_id AND o.lane_seq = w.lane_seq AND o.slot = w.slot
     ), swept AS (
       -- A stale row whose lease is settled (or pruned): its holder's delete failed.
       DELETE FROM ${s}.overdue_leases o
        WHERE o.seen_at <= now() - o.stale_after
          AND NOT EXISTS (SELECT 1 FROM ${s}.leased_entries le
                           WHERE le.lane_id = o.lane_id AND le.lane_seq = o.lane_seq AND le.slot = o.slot
                             AND le.outcome IS NULL)
     )
     SELECT count(*) FILTER (WHERE NOT dead) AS retried, count(*) FILTER (WHERE dead) AS dead,
            -- Driven from overdue_leases (a handful of rows), never from the lapsed leases.
            (SELECT count(*) FROM ${s}.overdue_leases o
               JOIN LATERAL (SELECT * FROM ${s}.leased_entries le
                              WHERE le.lane_id = o.lane_id AND le.lane_seq = o.lane_seq AND le.slot = o.slot) le ON true
              WHERE le.expires_at < now() AND o.seen_at > now() - o.stale_after
                AND le.outcome IS NULL) AS held
       FROM src`,
    // Prepared once per session: planning it was ~21 ms a run (RingReadStatement, src/sql.ts).
    `berth-rescue:${name}`,
  );
}

/**
 * Whether the rescue has anything to look at: an unsettled lease past its deadline, or any
 * overdue row (a holder running late, or a stale row to sweep; `held` counts only those). When
 * neither exists the rescue below would change nothing and report zeros, so it is not run.
 *
 * Why: the rescue names ~100 relations (every ring partition of five tables), and the prune's
 * TRUNCATE of a ring segment, every few seconds under load, invalidates its plan: on a quiet
 * schema a run was ~20 ms of planning and ~6 ms of execution every 5 s on one core, and in the
 * pickup probe the slowest 1 % of pickups overlapped a rescue run 10 times in 18
 * (bench/pickup-probe.ts --stages). This check names the lease and settlement partitions only:
 * ~1 ms to plan, ~0.3 ms to run. A lease that lapses after it is rescued on the next run, as
 * one that lapses after the rescue's snapshot always was.
 */
async function anythingToRescue(db: Queryable, storage: Storage): Promise<boolean> {
  const statement = storage.statement('rescue-due', ({ name, q: s }) =>
    positional(
      `SELECT EXISTS (SELECT 1 FROM ${unsettledRanges(s)} l WHERE l.expires_at < now())
               OR EXISTS (SELECT 1 FROM ${s}.overdue_leases) AS due`,
      [],
      `berth-rescue-due:${name}`,
    ),
  );
  const r = await queryRingRead<{ due: boolean }>(db, statement);
  return r.rows[0]?.due === true;
}

/** The leased entry aliased `e` has a fresh overdue row: its holder still runs the handler. */
function heldBy(s: string, e: string): string {
  return `SELECT 1 FROM ${s}.overdue_leases o
           WHERE o.lane_id = ${e}.lane_id AND o.lane_seq = ${e}.lane_seq AND o.slot = ${e}.slot
             AND o.seen_at > now() - o.stale_after`;
}
