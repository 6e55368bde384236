import { anchorRow } from '../util/shape-anchor.js';
import type { Queryable, Schema } from '../sql.js';
import { type Args, compile, p, sql } from '../statement.js';
import type { Storage } from '../storage/storage.js';
import { claimableEntries } from '../storage/predicates.js';
import { type RingWindow, segmentFilter, windowKey } from '../storage/ring-window.js';
import { claimOneLane } from './claim-one-lane.js';
import {
  type ClaimBatch,
  type ClaimedTask,
  type ClaimParams,
  claimTermArgs,
  type TermParams,
  TYPE_TERMS,
  type LeaseRow,
  limitedTerm,
  NOW_MS_SQL,
  taskJsonSql,
  tasksOf,
} from './claim-shared.js';

export type { ClaimBatch, ClaimedTask, ClaimParams } from './claim-shared.js';

/** A lane that discovery saw with claimable entries, in the order they should be served. */
export interface Candidate {
  laneId: number;
  laneSeq: string;
  id: string;
}

/**
 * Discovery: the read half. Oldest first (priority, then due time), 20 at a time, only due
 * entries under the attempt limit and past their lane's claim cursor (so not leased). Runs on
 * the read pool, which may be a replica; the claim re-checks everything on the primary.
 *
 * Plan: one index probe per lane for the cursor (leases PK, backwards) and one for the head
 * (ready PK `(lane_id, lane_seq, slot)`); see docs/architecture.md for the EXPLAIN.
 */
export async function discover(
  read: Queryable,
  storage: Storage,
  queues: readonly string[] | null,
  limit = 20,
  /** At most this many entries per lane (default: `limit`). The worker asks for 1: it only
   * needs the lanes, and one head per lane spreads its candidates over more lanes. */
  perLane?: number,
  /**
   * Read only this ring window's segments (storage/ring-window.ts). Discovery is a hint and may
   * run on a replica, so it does not check the window's generation: a stale window can only
   * leave out lanes whose entries are all in newer segments, and the claim that follows checks
   * (the worker also reads its window again on every poll tick).
   */
  window?: RingWindow,
  /**
   * Read the lanes of limited queues instead of the others (the limited claim's discovery,
   * processor/claim-limited.ts). Each path sees only its own lanes, so a limited queue at its
   * limit never fills the other path's page of candidates.
   */
  limited = false,
): Promise<Candidate[]> {
  const key = `discover${windowKey(window)}${limited ? ':limited' : ''}`;
  const statement = storage.statement(key, (schema) => discoverStatement(schema, window, limited));
  const res = await read.query<{ lane_id: number; lane_seq: string; id: string }>(
    statement.query({ queues, limit, perLane: perLane ?? limit }),
  );
  return res.rows.map((r) => ({ laneId: r.lane_id, laneSeq: r.lane_seq, id: r.id }));
}

/**
 * A claim locks one candidate lane per this many tasks it wants, in candidate order, skipping
 * locked ones. Locking every candidate let the first of several concurrent claimers take all the
 * lanes, so the others found nothing (an empty claim is two round trips) and each batch shrank;
 * with a share per claimer, concurrent workers spread over the lanes instead.
 */
function discoverStatement({ name, q: s }: Schema, window: RingWindow | undefined, limited: boolean) {
  return compile(
    sql`SELECT r.lane_id, r.lane_seq::text AS lane_seq, r.id::text AS id
       FROM ${s}.lanes l
       CROSS JOIN LATERAL (
         SELECT r.lane_id, r.lane_seq, r.id, r.priority, r.run_at
           FROM ${claimableEntries(s, 'l', ['lane_id', 'lane_seq', 'id', 'priority', 'run_at'], sql`${p('perLane')}`, window?.segments, 'r.run_at <= now()')} r) r
      WHERE (${p('queues')}::text[] IS NULL OR l.queue = ANY (${p('queues')}::text[]))
        AND NOT l.paused AND ${limited ? '' : 'NOT '}l.limited
      ORDER BY r.priority, r.run_at, r.lane_id, r.lane_seq
      LIMIT ${p('limit')}`,
    `berth-discover:${name}${windowKey(window)}${limited ? ':limited' : ''}`,
  );
}

export const LANE_SHARE = 16;

/**
 * The claim: one statement on the primary that leases exactly the entries it returns.
 *
 * - `locked` takes candidate lanes FOR UPDATE SKIP LOCKED: two claimers handed the same
 *   candidates take different lanes instead of queueing on one.
 * - Each locked lane yields its entries past the cursor in lane order; `chosen` keeps a prefix
 *   of every lane (ordered by rank within lane), so the cursor (max leased lane_seq) never
 *   jumps over an unleased entry.
 * - Due is a stop, not a filter: a lane's prefix ends at its first entry with `run_at > now()`
 *   (`due_so_far`). now() is the claim's transaction start, but its snapshot is taken when it
 *   executes, and anything in between (a CPU stall, a wait for the ring prune's partition lock
 *   while the plan is locked) lets it see entries appended after its now() whose run_at is later
 *   than it. A lane is not in run_at order (an enqueue with an old runAt, or a promotion of a row
 *   due long ago, appends behind newer entries), so filtering them out leased the entries behind
 *   them and the cursor passed entries nobody would ever claim (5 tasks lost in the chaos suite;
 *   test/claim.test.ts "the cursor never passes an unleased entry…"). Stopped there, the lane's
 *   next claim (a later now()) takes them: every appender writes run_at ≤ its own now(), which
 *   precedes its commit.
 * - READ COMMITTED: the lane lock may be granted after a competing claim or a tombstone
 *   committed, while the rest of the statement still reads the older snapshot. A competing
 *   claim's leases are caught by ON CONFLICT DO NOTHING (the loser leases fewer, never a leased
 *   entry twice); a tombstone bumps lanes.version, and `current` drops a lane whose locked
 *   (latest) version differs from the snapshot's, so a removed entry is never leased.
 * - Both are MATERIALIZED so the row picking runs once: a FROM-subquery can be rescanned per
 *   outer tuple of a nested loop, and each rescan would lease more rows (seed 000's
 *   ClaimLeasesExactlyOneRow).
 * - The lease token is random and the expiry is stamped from the database clock:
 *   now() + ceiling + margin. The lease also records the attempt limit in force, so every
 *   later decision about this attempt (failure, release, rescue) uses the same number.
 * - A paused lane is never taken: `NOT l.paused` is re-checked on the locked (latest) row, and
 *   pausing bumps version, so a claim whose snapshot predates the pause drops the lane too.
 * - The wake re-signal rides in the same statement (delivered at commit) only when every
 *   requested slot was filled, so a burst cascades across processes one claimer at a time.
 * - ASYNC_COMMIT: the claim's transaction commits with `synchronous_commit = off` (set_config
 *   local to it), so a pickup does not wait for a WAL flush (fdatasync took 0.4–1.3 ms per
 *   commit on the 2-core development machine, and its tail was the pickup's). Nothing durable
 *   is given up: a lease only matters once its task settles, and every settlement commits
 *   synchronously, which flushes the WAL up to and past the lease it is fenced on. A server
 *   crash before that flush loses the lease row: the entry is claimable again and may run a
 *   second time beside the first run (at-least-once), the worker's settlement is refused by the
 *   token fence, and its refused path counts the lost run's attempt (count_lost_claim, migration
 *   19; settle-task.ts) unless the entry was claimed again first. The claim must therefore run in its own
 *   transaction (a pool, autocommit): inside a caller's transaction the setting would make the
 *   caller's commit asynchronous too.
 */
export async function claim(write: Queryable, p: ClaimParams): Promise<ClaimedTask[]> {
  return (await claimBatch(write, p)).tasks;
}

/**
 * The claim, in the statement for the number of lanes it may lock: one (a notified lane, a
 * discovery share of at most LANE_SHARE tasks: an idle worker's pickup) or several.
 */
export function claimBatch(write: Queryable, p: ClaimParams): Promise<ClaimBatch> {
  return lanesToLock(p) === 1 ? claimOneLane(write, p) : claimLanes(write, p);
}

/** How many candidate lanes a claim may lock: `maxLanes` of them, at least one. */
export function lanesToLock(p: Pick<ClaimParams, 'laneIds' | 'maxLanes'>): number {
  return Math.max(1, Math.min(p.laneIds.length, p.maxLanes ?? p.laneIds.length));
}

/** The claim over several lanes (the statement the comment on claim() describes). */
export async function claimLanes(write: Queryable, c: ClaimParams): Promise<ClaimBatch> {
  if (c.limit <= 0 || c.laneIds.length === 0) return { tasks: [], more: false, stale: false };
  const w = c.window;
  const limited = c.limited === true;
  const key = `claim${windowKey(w)}${limited ? ':limited' : ''}`;
  const statement = c.storage.statement(key, (schema) => claimLanesStatement(schema, w, limited));
  const res = await write.query<LeaseRow>(
    statement.query({
      laneIds: c.laneIds,
      limit: c.limit,
      ...claimTermArgs(c),
      wakeChannel: c.wakeChannel,
      queues: c.queues ?? null,
      maxLanes: lanesToLock(c),
      perLane: c.perLane ?? null,
      ...(w ? { generation: w.generation } : {}),
    } as Args<ClaimLanesParams>),
  );
  if (w && res.rows.some((r) => r.stale)) return { tasks: [], more: false, stale: true };
  const batch = { tasks: tasksOf(res.rows, c), more: res.rows[0]?.more ?? false, stale: false };
  anchorRow('claim-lanes', write, res.rows[0]);
  return batch;
}

type ClaimLanesParams =
  | TermParams
  | 'laneIds'
  | 'limit'
  | 'wakeChannel'
  | 'queues'
  | 'maxLanes'
  | 'perLane'
  | 'generation';

function claimLanesStatement({ name, q: s }: Schema, w: RingWindow | undefined, limited: boolean) {
  // The window's generation, checked in the claim's own snapshot (storage/ring-window.ts).
  const current = w ? sql`AND (SELECT rs.generation FROM ${s}.ring_state rs) = ${p('generation')}::bigint` : '';
  return compile(
    sql`WITH locked AS MATERIALIZED (
       SELECT l.lane_id, l.version, l.queue, l.priority, l.shard FROM ${s}.lanes l
        WHERE l.lane_id = ANY (${p('laneIds')}::integer[])
          AND (${p('queues')}::text[] IS NULL OR l.queue = ANY (${p('queues')}::text[]))
          AND NOT l.paused AND ${limitedTerm(limited)} ${current}
        ORDER BY array_position(${p('laneIds')}::integer[], l.lane_id)
        LIMIT ${p('maxLanes')}
        FOR UPDATE SKIP LOCKED
     ), current AS MATERIALIZED (
       SELECT k.* FROM locked k
        WHERE k.version = (SELECT v.version FROM ${s}.lanes v WHERE v.lane_id = k.lane_id)
     ), picked AS MATERIALIZED (
       -- Per lane, in lane order (the index scan's, so the window sorts nothing): rank, and
       -- whether the prefix is still due and still in the lane's first ring segment. Both are
       -- stops: a lane yields the prefix up to its first entry that is not due or lies in another
       -- segment. The segment test is the running min and max of the segment agreeing, a prefix
       -- by construction: a lane read as B, A, B stops after its first B. Appends keep a lane's
       -- segments in rotation order (migration 18), so the stop is defence in depth; compared
       -- with the first segment alone (a filter), that lane was leased as one range B..B and the
       -- cursor passed A for good. Only the columns the shaping needs: the tasks are read once
       -- more, by range, for the result (a payload carried through here and the sort cost more
       -- than that read).
       SELECT k.lane_id, k.priority, r.slot, r.lane_seq, r.run_at, r.type, r.rank_in_lane,
              r.due_so_far, r.lane_slot_lo = r.lane_slot_hi AS in_lane_slot
         FROM current k
         CROSS JOIN LATERAL (
           SELECT r.slot, r.lane_seq, r.run_at, r.type,
                  row_number() OVER w AS rank_in_lane,
                  bool_and(r.run_at <= now()) OVER w AS due_so_far,
                  min(r.slot) OVER w AS lane_slot_lo,
                  max(r.slot) OVER w AS lane_slot_hi
             FROM ${claimableEntries(s, 'k', ['slot', 'lane_seq', 'run_at', 'type'], sql`least(${p('limit')}, coalesce(${p('perLane')}::integer, ${p('limit')}))`, w?.segments)} r
           WINDOW w AS (ORDER BY r.lane_seq ROWS UNBOUNDED PRECEDING)) r
     ), chosen AS (
       -- The round-robin prefix of every lane, by priority. Sorted only when the lanes gave more
       -- than the limit (each is read for its share, so mostly they give at most the limit): the
       -- one-time filters run one branch.
       SELECT p.lane_id, p.slot, p.lane_seq, p.type FROM picked p
        WHERE p.due_so_far AND p.in_lane_slot
          AND (SELECT count(*) FROM picked x WHERE x.due_so_far AND x.in_lane_slot) <= ${p('limit')}
       UNION ALL
       (SELECT p.lane_id, p.slot, p.lane_seq, p.type FROM picked p
         WHERE p.due_so_far AND p.in_lane_slot
           AND (SELECT count(*) FROM picked x WHERE x.due_so_far AND x.in_lane_slot) > ${p('limit')}
         ORDER BY p.priority, p.rank_in_lane, p.run_at, p.lane_id LIMIT ${p('limit')})
     ), more AS (
       -- Whether a lane may hold due entries this claim left: it gave its whole share (its entry
       -- ranked at the share is in the prefix), or its due prefix ran into a later ring segment.
       -- The worker then claims again at once instead of taking a short claim for a drained lane.
       SELECT coalesce(bool_or(p.due_so_far AND (p.rank_in_lane >= least(${p('limit')}, coalesce(${p('perLane')}::integer, ${p('limit')}))
                                                 OR NOT p.in_lane_slot)), false) AS more
         FROM picked p
     ), leases AS (
       -- One lease per lane: its range, and per type (the claiming worker's ceiling and attempt
       -- limit, else the defaults) the deadline stamped from the database clock. The three arrays
       -- are aggregated over the same rows in the same order, so they line up; which order the
       -- types come in does not matter (every reader looks a type up with array_position).
       SELECT c.lane_id, min(c.slot) AS slot, min(c.from_seq) AS from_seq, max(c.to_seq) AS to_seq,
              sum(c.n)::integer AS n, array_agg(c.type) AS types, array_agg(c.expires_at) AS type_expires,
              array_agg(c.max_attempts) AS type_max_attempts, min(c.expires_at) AS expires_at
         FROM (SELECT ch.lane_id, ch.type, min(ch.slot) AS slot, min(ch.lane_seq) AS from_seq,
                      max(ch.lane_seq) AS to_seq, count(*) AS n,
                      ${TYPE_TERMS.expiresAt} AS expires_at,
                      ${TYPE_TERMS.maxAttempts} AS max_attempts
                 FROM chosen ch
                 ${TYPE_TERMS.join}
                   ON t.type = ch.type
                GROUP BY ch.lane_id, ch.type, t.ceiling_ms, t.max_attempts) c
        GROUP BY c.lane_id
     ), leased AS (
       INSERT INTO ${s}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker,
                                      types, type_expires, type_max_attempts, expires_at)
       SELECT c.slot, c.lane_id, c.from_seq, c.to_seq, c.n, gen_random_uuid(), now(), ${p('workerId')},
              c.types, c.type_expires, c.type_max_attempts, c.expires_at
         FROM leases c
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, from_seq, to_seq, n, token, types
     ), resignal AS (
       SELECT pg_notify(${p('wakeChannel')}, '') WHERE (SELECT coalesce(sum(n), 0) FROM leased) >= ${p('limit')}
     ), async_commit AS (
       -- This statement's transaction commits without waiting for the WAL flush (ASYNC_COMMIT
       -- in the comment on claim()).
       SELECT set_config('synchronous_commit', 'off', true) AS was
     )
     -- One row per range lease, its tasks as one JSON text (see LeaseRow).
     SELECT l.slot, l.lane_id, l.from_seq::text AS lease_from, l.token::text AS token, l.types,
            ${NOW_MS_SQL} AS now_ms, k.queue, k.priority, k.shard,
            -- A lease covers every claimable entry from from_seq to to_seq of its lane and slot
            -- (a prefix is contiguous in lane order; the same snapshot, the same tombstone check),
            -- so its tasks are one range read of the lane's index, in its order (the tombstone
            -- probe above the partitions, as in claimableEntries).
            (SELECT '[' || string_agg(${taskJsonSql(s, 'r', 'l')}, ',') || ']'
               FROM (SELECT r.* FROM ${s}.ready r
                      WHERE r.lane_id = l.lane_id AND r.slot = l.slot ${segmentFilter('r', w?.segments)}
                        AND r.lane_seq BETWEEN l.from_seq AND l.to_seq
                      ORDER BY r.lane_seq OFFSET 0) r
              WHERE k.version = 0
                 OR NOT EXISTS (SELECT 1 FROM ${s}.tombstones t
                                 WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot
                                   ${segmentFilter('t', w?.segments)}
                                 OFFSET 0)) AS tasks,
            (SELECT more FROM more) AS more, false AS stale
       FROM leased l JOIN current k ON k.lane_id = l.lane_id
      WHERE (SELECT count(*) FROM resignal) >= 0 AND (SELECT count(*) FROM async_commit) = 1${
        w
          ? sql`
     UNION ALL
     -- The ring moved on since the window was read: nothing was locked or leased (locked's
     -- generation check); one row says so.
     SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, true
       FROM ${s}.ring_state rs WHERE rs.generation <> ${p('generation')}::bigint`
          : ''
      }`,
    `berth-claim:${name}${windowKey(w)}${limited ? ':limited' : ''}`,
  );
}
