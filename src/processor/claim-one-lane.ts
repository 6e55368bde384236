import { anchorRow } from '../util/shape-anchor.js';
import type { Queryable, Schema } from '../sql.js';
import { type Args, compile, p, sql } from '../statement.js';
import { claimableEntries } from '../storage/predicates.js';
import { type RingWindow, windowKey } from '../storage/ring-window.js';
import {
  type ClaimBatch,
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

/**
 * The claim when it may lock one lane: the first unlocked of its candidates. An idle worker's
 * pickup is this claim (the notified lane), and so is every discovery claim of a worker that
 * wants at most LANE_SHARE tasks. It keeps every rule of the claim over several lanes (the
 * comment on claim() in claim.ts: SKIP LOCKED, the prefix that stops at the first entry not due
 * or in a later segment, the version check against a tombstone or pause committed meanwhile,
 * ON CONFLICT DO NOTHING against a competing claim, the re-signal when full, the asynchronous
 * commit, the window's generation) and drops what only several lanes need: the round-robin cut
 * across lanes, the lease per lane, the second read of the leased range.
 *
 * Why a second statement: the claim is small work in a large plan. perf of a backend running
 * one-task claims in a loop (PostgreSQL 15, the 2-core development machine): ExecutorStart 31 %
 * of its time, as much as ExecutorRun, the aggregates' set-up alone 15 % (the several-lane plan
 * has 65 nodes, 11 of them aggregates; this one 34 and 4), and none of it in
 * pg_stat_statements' time. `CLAIM_LANES=1 CLAIM_LIMIT=1 npx tsx bench/claim-ab.ts <base>` against
 * the several-lane statement alone: 0.86 against 1.28 ms of backend CPU per one-task claim, its
 * round trip 1.14 against 1.52 ms (docs/benchmarks-journal.md, "The one-lane claim").
 *
 * - `locked` also switches the transaction to an asynchronous commit (set_config in its target
 *   list, which the plan evaluates for each candidate row before LockRows locks it: so before
 *   any row lock or lease, the only writes the claim makes).
 * - `picked` carries each entry's task columns: the lane's prefix is at most `perLane` entries
 *   (the pickup's one), so carrying them costs less than reading the range again, and the tasks'
 *   JSON is aggregated in the order the lane was read.
 * - The version check sits in picked (no `current` step): a lane whose version changed since
 *   the snapshot yields no entries, so nothing is leased or returned.
 */
export async function claimOneLane(write: Queryable, c: ClaimParams): Promise<ClaimBatch> {
  if (c.limit <= 0 || c.laneIds.length === 0) return { tasks: [], more: false, stale: false };
  const w = c.window;
  const limited = c.limited === true;
  const key = `claim-one-lane${windowKey(w)}${limited ? ':limited' : ''}`;
  const statement = c.storage.statement(key, (schema) => claimOneLaneStatement(schema, w, limited));
  const res = await write.query<LeaseRow>(
    statement.query({
      laneIds: c.laneIds,
      // The lane is read for at most its share (the only lane: all of the limit, unless told less).
      share: Math.min(c.limit, c.perLane ?? c.limit),
      ...claimTermArgs(c),
      wakeChannel: c.wakeChannel,
      queues: c.queues ?? null,
      limit: c.limit,
      ...(w ? { generation: w.generation } : {}),
    } as Args<ClaimOneLaneParams>),
  );
  if (w && res.rows.some((r) => r.stale)) return { tasks: [], more: false, stale: true };
  const row = res.rows[0];
  if (!row) return { tasks: [], more: false, stale: false };
  const batch = { tasks: tasksOf([row], c), more: row.more, stale: false };
  anchorRow('claim-one-lane', write, row);
  return batch;
}

type ClaimOneLaneParams = TermParams | 'laneIds' | 'share' | 'wakeChannel' | 'queues' | 'limit' | 'generation';

const ONE_LANE_COLUMNS = [
  'slot',
  'lane_seq',
  'run_at',
  'type',
  'id',
  'attempts',
  'payload',
  'max_attempts',
  'dedupe_key',
  'trace_context',
  // Read with run_at by taskJsonSql: is the task worth a probe of `snoozes`.
  'created_at',
  // The mark of a task with dependents (migration 31): its completion releases them.
  'has_dependents',
];

function claimOneLaneStatement({ name, q: s }: Schema, w: RingWindow | undefined, limited: boolean) {
  const current = w ? sql`AND (SELECT rs.generation FROM ${s}.ring_state rs) = ${p('generation')}::bigint` : '';
  return compile(
    sql`WITH locked AS MATERIALIZED (
       SELECT l.lane_id, l.version, l.queue, l.priority, l.shard,
              set_config('synchronous_commit', 'off', true) AS async_commit
         FROM ${s}.lanes l
        WHERE l.lane_id = ANY (${p('laneIds')}::integer[])
          AND (${p('queues')}::text[] IS NULL OR l.queue = ANY (${p('queues')}::text[]))
          AND NOT l.paused AND ${limitedTerm(limited)} ${current}
        ORDER BY array_position(${p('laneIds')}::integer[], l.lane_id)
        LIMIT 1
        FOR UPDATE SKIP LOCKED
     ), picked AS MATERIALIZED (
       SELECT k.lane_id, r.*, r.lane_slot_lo = r.lane_slot_hi AS in_lane_slot
         FROM locked k
         CROSS JOIN LATERAL (
           SELECT r.*,
                  row_number() OVER w AS rank_in_lane,
                  bool_and(r.run_at <= now()) OVER w AS due_so_far,
                  min(r.slot) OVER w AS lane_slot_lo,
                  max(r.slot) OVER w AS lane_slot_hi
             FROM ${claimableEntries(s, 'k', ONE_LANE_COLUMNS, sql`${p('share')}`, w?.segments)} r
           WINDOW w AS (ORDER BY r.lane_seq ROWS UNBOUNDED PRECEDING)) r
        WHERE k.version = (SELECT v.version FROM ${s}.lanes v WHERE v.lane_id = k.lane_id)
     ), per_type AS (
       -- The lane's due prefix in its first segment, per type: the claiming worker's ceiling and
       -- attempt limit, else the defaults, and the deadline stamped from the database clock.
       SELECT p.lane_id, p.type, min(p.slot) AS slot, min(p.lane_seq) AS from_seq, max(p.lane_seq) AS to_seq,
              count(*) AS n,
              ${TYPE_TERMS.expiresAt} AS expires_at,
              ${TYPE_TERMS.maxAttempts} AS max_attempts
         FROM picked p
         ${TYPE_TERMS.join}
           ON t.type = p.type
        WHERE p.due_so_far AND p.in_lane_slot
        GROUP BY p.lane_id, p.type, t.ceiling_ms, t.max_attempts
     ), leased AS (
       -- One lease, none when the prefix is empty (HAVING). The arrays line up: one aggregate
       -- over the same rows in the same order.
       INSERT INTO ${s}.range_leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker,
                                      types, type_expires, type_max_attempts, expires_at)
       SELECT min(c.slot), min(c.lane_id), min(c.from_seq), max(c.to_seq), sum(c.n)::integer,
              gen_random_uuid(), now(), ${p('workerId')},
              array_agg(c.type), array_agg(c.expires_at), array_agg(c.max_attempts), min(c.expires_at)
         FROM per_type c
       HAVING count(*) > 0
       ON CONFLICT DO NOTHING
       RETURNING slot, lane_id, from_seq, to_seq, n, token, types
     )
     SELECT l.slot, l.lane_id, l.from_seq::text AS lease_from, l.token::text AS token, l.types,
            ${NOW_MS_SQL} AS now_ms, k.queue, k.priority, k.shard,
            (SELECT '[' || string_agg(${taskJsonSql(s, 'r', 'l')}, ',') || ']'
               FROM picked r WHERE r.due_so_far AND r.in_lane_slot) AS tasks,
            -- The lane may hold due entries this claim left: it gave its whole share, or its due
            -- prefix ran into a later ring segment.
            EXISTS (SELECT 1 FROM picked x
                     WHERE x.due_so_far AND (x.rank_in_lane >= ${p('share')} OR NOT x.in_lane_slot)) AS more,
            false AS stale,
            -- Full: re-signal (delivered at commit), as the claim over several lanes does.
            CASE WHEN l.n >= ${p('limit')} THEN pg_notify(${p('wakeChannel')}, '') END IS NULL AS resignalled
       FROM leased l CROSS JOIN locked k${
         w
           ? sql`
     UNION ALL
     -- The ring moved on since the window was read: nothing was locked or leased.
     SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, true, NULL
       FROM ${s}.ring_state rs WHERE rs.generation <> ${p('generation')}::bigint`
           : ''
       }`,
    `berth-claim-one-lane:${name}${windowKey(w)}${limited ? ':limited' : ''}`,
  );
}
