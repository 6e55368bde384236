/**
 * Row predicates shared by more than one statement, so a gauge and the statement that acts on
 * what it counts can never disagree (seed 000: the dead-letter prune uses the gauge's predicate).
 */

/**
 * A dead letter (alias `d`) that is really abandoned: no live, unsettled lease carries its id.
 * A task retried out of the dead letters and on its final attempt under a worker is not pruned.
 * Dead-letter retention runs a frozen copy of it inside `prune_dead_letters` (migration 7):
 * changing it here needs a new migration that replaces that function too.
 */
export function deadRowPredicate(s: string): string {
  // Through ready(id): leases carry no index on id (one index fewer on the hot insert).
  return `NOT EXISTS (SELECT 1 FROM ${s}.ready rr
                        JOIN ${s}.leases l
                          ON l.lane_id = rr.lane_id AND l.lane_seq = rr.lane_seq AND l.slot = rr.slot
                       WHERE rr.id = d.id AND l.expires_at > now()
                         AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                                          WHERE st.lane_id = l.lane_id AND st.lane_seq = l.lane_seq
                                            AND st.slot = l.slot))`;
}

/** A ready entry (alias `r`) that still stands for its task: not tombstoned, not settled. */
export function liveEntryPredicate(s: string): string {
  return `NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                       WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
          AND NOT EXISTS (SELECT 1 FROM ${s}.settlements st
                           WHERE st.lane_id = r.lane_id AND st.lane_seq = r.lane_seq AND st.slot = r.slot)`;
}

/**
 * A ready entry (alias `r`) of the lane `laneId` (an SQL expression) that a claim may lease:
 * past the lane's claim cursor (`max(leases.lane_seq)`, so not leased), under the attempt
 * limit, and not tombstoned. Discovery (read pool) and the claim (primary, which re-checks
 * everything under the lane lock) both select by it, in lane order.
 *
 * Due (`run_at <= now()`) is not part of it: discovery filters by it (a hint, it leases
 * nothing), but the claim must stop a lane at its first entry that is not due rather than skip
 * it, or the cursor passes that entry for good (see `claim` in src/processor/claim.ts).
 *
 * The `OFFSET 0` keeps the tombstone check a per-row probe inside the ordered index scan; as a
 * hash anti-join it read the whole lane to sort it (docs/architecture.md, "Performance notes").
 */
export function claimableEntry(s: string, laneId: string): string {
  return `r.lane_id = ${laneId}
            AND r.lane_seq > coalesce((SELECT max(le.lane_seq) FROM ${s}.leases le
                                        WHERE le.lane_id = ${laneId}), 0)
            AND r.attempts < coalesce(r.max_attempts, 2147483647)
            AND NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                             WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
                             OFFSET 0)`;
}
