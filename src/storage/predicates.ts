import { joinSql, type Sql, sql } from '../statement.js';
import { quoteIdent } from '../sql.js';

/**
 * Row predicates and row sources shared by more than one statement, so a gauge and the
 * statement that acts on what it counts can never disagree (seed 000: the dead-letter prune
 * uses the gauge's predicate).
 *
 * Leases are ranges (migration 8, docs/design/range-leases.md): one `range_leases` row leases
 * the non-tombstoned entries `from_seq..to_seq` of a lane in one ring segment, and
 * `range_settlements` rows settle subsets of them (an int8multirange each, disjoint by the
 * exclusion constraint). A lane's claim cursor is the `to_seq` of its last range.
 */

/**
 * The claim cursor of lane `laneId` (an SQL expression): every entry at or below it is leased,
 * tombstoned or gone with its segment. (Within a ring window, see claimableInWindow.) Ranges of a lane never overlap and are appended in order,
 * so it is the `to_seq` of the range with the greatest `from_seq`: one backward probe of each
 * partition's primary key under a Merge Append, the shape `max(lane_seq)` had per task.
 */
export function laneCursor(s: string, laneId: string): string {
  return `coalesce((SELECT cur.to_seq FROM ${s}.range_leases cur
                     WHERE cur.lane_id = ${laneId} ORDER BY cur.from_seq DESC LIMIT 1), 0)`;
}

/**
 * A dead letter (alias `d`) that is really abandoned: no live, unsettled lease carries its id.
 * A task retried out of the dead letters and on its final attempt under a worker is not pruned.
 * Dead-letter retention runs a frozen copy of it inside `prune_dead_letters` (migration 8):
 * changing it here needs a new migration that replaces that function too.
 *
 * The ids under a live lease are computed once, from the ranges with unsettled entries (the
 * work in flight), and the dead letters anti-joined to them. Asked per dead letter through
 * `leased_entries`, the planner expanded every leased entry of the ring (the settled history)
 * and compared each dead letter with them: 5.5 s for `taskCounts` at 100k dead letters and 100k
 * settled entries (docs/explain-admin.md).
 */
export function deadRowPredicate(s: string): string {
  return `NOT EXISTS (SELECT 1 FROM ${liveLeasedIds(s)} live WHERE live.id = d.id)`;
}

/** Ids of tasks under a live (not yet expired), unsettled lease. */
function liveLeasedIds(s: string): string {
  return `(SELECT e.id FROM ${unsettledRanges(s)} l
            CROSS JOIN LATERAL (${unsettledEntriesOf(s, 'l')}) e
            WHERE l.type_expires[array_position(l.types, e.type)] > now())`;
}

/**
 * Every lane's claim cursor as one jsonb object (lane id → cursor), computed once per statement
 * (an InitPlan) for statements that compare many entries with their lane's cursor: per entry,
 * the cursor probe is a Merge Append over every range_leases partition.
 */
export function laneCursorsJson(s: string): string {
  return `(SELECT jsonb_object_agg(c.lane_id, ${laneCursor(s, 'c.lane_id')}) FROM ${s}.lanes c)`;
}

/**
 * The entries that still stand for their tasks (not tombstoned, not settled), as rows of
 * `ready` plus `expires_at` (the entry's own lease deadline, null when unleased). Two parts,
 * so the cost follows the backlog and the work in flight, never the settled history:
 * - unleased: per lane, the entries past its cursor;
 * - leased: the ranges with unsettled entries (`n` above the settled count, sound because a
 *   lease's settlements are disjoint), each expanded to its entries without a settlement
 *   (one index range scan of `ready` per range; `OFFSET 0` keeps it one).
 */
export function liveEntries(s: string): string {
  return `(SELECT r.*, NULL::timestamptz AS expires_at
             FROM ${s}.lanes ln
            CROSS JOIN LATERAL (
              SELECT r.* FROM ${s}.ready r
               WHERE r.lane_id = ln.lane_id AND r.lane_seq > ${laneCursor(s, 'ln.lane_id')}
                 AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                                  WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
               OFFSET 0) r
           UNION ALL
           SELECT e.*, l.type_expires[array_position(l.types, e.type)]
             FROM ${unsettledRanges(s)} l
            CROSS JOIN LATERAL (${unsettledEntriesOf(s, 'l')}) e)`;
}

/** Range leases (alias it) with at least one unsettled entry. */
export function unsettledRanges(s: string): string {
  return `(SELECT l.* FROM ${s}.range_leases l
            WHERE l.n > coalesce((SELECT sum(x.n) FROM ${s}.range_settlements x
                                   WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq AND x.slot = l.slot), 0))`;
}

/** The ready rows of range `l` (an alias) that are leased by it and not settled. */
export function unsettledEntriesOf(s: string, l: string): string {
  return `SELECT r.* FROM ${s}.ready r
           WHERE r.lane_id = ${l}.lane_id AND r.slot = ${l}.slot
             AND r.lane_seq BETWEEN ${l}.from_seq AND ${l}.to_seq
             AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                              WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
             AND NOT EXISTS (SELECT 1 FROM ${s}.range_settlements x
                              WHERE x.lane_id = ${l}.lane_id AND x.lease_from = ${l}.from_seq
                                AND x.slot = ${l}.slot AND x.seqs @> r.lane_seq)
           OFFSET 0`;
}

/**
 * A ready entry (alias `r`) of the lane aliased `lane` (a `lanes` row: its `lane_id` and
 * `version`) that a claim may lease: past the lane's claim cursor (so not leased) and not
 * tombstoned. Discovery (read pool) and the claim (primary, which re-checks everything under
 * the lane lock) both select by it, in lane order.
 *
 * Due (`run_at <= now()`) is not part of it: discovery filters by it (a hint, it leases
 * nothing), but the claim must stop a lane at its first entry that is not due rather than skip
 * it, or the cursor passes that entry for good (see `claim` in src/processor/claim.ts). Nor is
 * the attempt limit: every writer of `ready` appends entries under their limit (a new task with
 * 0 attempts, a retry below its lease's limit, a refund one below), and a range leases every
 * non-tombstoned entry between its ends, so skipping one would lease it anyway.
 *
 * The tombstone check is skipped for a lane whose `version` is 0: every tombstone bumps its
 * lane's version in the same transaction (remove_unleased, move_task), so such a lane never had
 * one. It was a probe of all 16 tombstones partitions per entry looked at: 750 entries per
 * claim at 7 lanes, most of the claim's 7.6 ms (pg_stat_statements, docs/benchmarks-journal.md).
 * Where it runs, the `OFFSET 0` keeps it a per-row probe inside the ordered index scan; as a
 * hash anti-join it read the whole lane to sort it (docs/architecture.md, "Performance notes").
 */
export function claimableEntry(s: string, lane: string): string {
  return `r.lane_id = ${lane}.lane_id
            AND r.lane_seq > ${laneCursor(s, `${lane}.lane_id`)}
            AND (${lane}.version = 0
                 OR NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                                 WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
                                 OFFSET 0))`;
}

/**
 * The claimable entries (see `claimableEntry`) of the lane aliased `lane`, in lane order, at
 * most `limit` (an SQL expression) of them, with `columns` of `ready` (each `r.<name>`): a FROM
 * item for discovery and the claim, which read a lane's head in order.
 *
 * The tombstone probe runs once above the partitions' Merge Append, not inside each partition's
 * scan: there (a WHERE clause on `ready` is pushed into every partition) it was a subplan over
 * the 16 tombstones partitions under each of the 16 ready partitions, 256 index scans in the
 * plan of every lane read. The executor initialises all of them on every execution, pruned or
 * not (ExecutorStart, which pg_stat_statements does not time, was ~15 % of a claiming
 * session's CPU in perf), and the first execution plans them: 19.5 ms to bind discovery on a
 * new session (docs/benchmarks-journal.md, "The claim's shape"). `OFFSET 0` keeps the ordered read a
 * subquery of its own, so the probe is not pushed back down, and the LIMIT counts only
 * claimable entries (the probe's own `OFFSET 0` keeps it a probe per entry, not a hashed
 * subplan reading every tombstone); its order is the index's (the outer ORDER BY sorts nothing: see the plan
 * in docs/explain.md). `segments`: read only these ring segments (a worker's ring window,
 * storage/ring-window.ts), each by its partitions' names (claimableInWindow).
 */
export function claimableEntries<N extends string>(
  s: string,
  lane: string,
  columns: readonly string[],
  /** How many entries at most (an SQL expression, usually a parameter). */
  limit: Sql<N>,
  segments?: readonly number[] | null,
  /** A condition on the entry (alias `r`) applied before the limit: discovery's `due`. */
  filter?: string,
): Sql<N> {
  const inner = [...new Set(['lane_id', 'lane_seq', 'slot', ...columns])];
  const also = filter ? `AND ${filter}` : '';
  if (segments) return claimableInWindow(s, lane, columns, inner, limit, segments, also);
  return sql`(SELECT ${columns.map((c) => `x.${c}`).join(', ')}
            FROM (SELECT ${inner.map((c) => `r.${c}`).join(', ')} FROM ${s}.ready r
                   WHERE r.lane_id = ${lane}.lane_id AND r.lane_seq > ${laneCursor(s, `${lane}.lane_id`)} ${also}
                   ORDER BY r.lane_seq OFFSET 0) x
           WHERE ${lane}.version = 0
              OR NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                              WHERE t.lane_id = x.lane_id AND t.lane_seq = x.lane_seq AND t.slot = x.slot
                              OFFSET 0)
           ORDER BY x.lane_seq LIMIT ${limit})`;
}

/**
 * claimableEntries in a ring window: each segment's partitions read by name, each for its first
 * `limit` claimable entries in lane order, and those merged. Over the parent with the window as a
 * constant list, the planner priced two or three small partitions as cheaper to read whole and
 * sort than to merge in index order: a claim of 45 entries per lane read each lane's whole
 * backlog in the segment (12,000 entries) to sort it, 30-70 ms a claim in a 200,000-task drain
 * (auto_explain; docs/benchmarks-journal.md, "Scaling with work"). Read per segment under a LIMIT, no
 * plan can read past the share. The cursor is the latest range of the lane in the window: ranges
 * of later segments start later, so it is the greatest of each segment's last range.
 */
function claimableInWindow<N extends string>(
  s: string,
  lane: string,
  columns: readonly string[],
  inner: readonly string[],
  limit: Sql<N>,
  segments: readonly number[],
  also: string,
): Sql<N> {
  const part = (table: string, k: number) => `${s}.${quoteIdent(`${table}_${Math.trunc(k)}`)}`;
  const cursor = `coalesce(greatest(${segments
    .map(
      (k) =>
        `(SELECT cur.to_seq FROM ${part('range_leases', k)} cur
           WHERE cur.lane_id = ${lane}.lane_id ORDER BY cur.from_seq DESC LIMIT 1)`,
    )
    .join(', ')}), 0)`;
  const bySegment = segments.map(
    (k) => sql`(SELECT ${inner.map((c) => `r.${c}`).join(', ')} FROM ${part('ready', k)} r
              WHERE r.lane_id = ${lane}.lane_id AND r.lane_seq > ${cursor} ${also}
                AND (${lane}.version = 0
                     OR NOT EXISTS (SELECT 1 FROM ${part('tombstones', k)} t
                                     WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq OFFSET 0))
              ORDER BY r.lane_seq LIMIT ${limit})`,
  );
  return sql`(SELECT ${columns.map((c) => `x.${c}`).join(', ')}
            FROM (${joinSql(bySegment, ' UNION ALL ')}) x
           ORDER BY x.lane_seq LIMIT ${limit})`;
}

/** Due deferred rows are counted up to this many per lane; more reads as "10000+". */
export const DUE_COUNT_CAP = 10_000;

/**
 * What a lane (alias `lane`) has waiting, from index probes only (cost per lane, not per task),
 * for `berth stats`, the dashboard and the queue-limit reads: `laneBacklogJoins` adds the two
 * LATERALs (`h.seq`, the ready head; `c.seq`, the claim cursor) that `laneDepth` reads.
 */
export function laneBacklogJoins(s: string, lane: string): string {
  return `LEFT JOIN LATERAL (SELECT max(r.lane_seq) AS seq FROM ${s}.ready r WHERE r.lane_id = ${lane}.lane_id) h ON true
         LEFT JOIN LATERAL (SELECT ${laneCursor(s, `${lane}.lane_id`)} AS seq) c ON true`;
}

/** Entries appended past the lane's claim cursor, less the removed (tombstoned) ones (see laneBacklogJoins). */
export function laneDepth(s: string, lane: string): string {
  return `greatest(coalesce(h.seq, 0) - coalesce(c.seq, 0)
                       - (SELECT count(*) FROM ${s}.tombstones t
                           WHERE t.lane_id = ${lane}.lane_id AND t.lane_seq > coalesce(c.seq, 0)), 0)`;
}

/** The lane's due deferred rows waiting for promotion, counted up to DUE_COUNT_CAP. */
export function laneDueDeferred(s: string, lane: string): string {
  return `(SELECT count(*) FROM (SELECT 1 FROM ${s}.deferred d
                                      WHERE d.queue = ${lane}.queue AND d.priority = ${lane}.priority AND d.shard = ${lane}.shard
                                        AND d.run_at <= now() LIMIT ${DUE_COUNT_CAP}) x)`;
}
