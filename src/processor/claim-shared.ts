import { p, sql } from '../statement.js';
import type { Storage } from '../storage/storage.js';
import type { AttemptRef } from '../storage/attempt.js';
import type { RingWindow } from '../storage/ring-window.js';

/**
 * What both claim statements (claim.ts for several lanes, claim-one-lane.ts for one) share: their
 * parameters, what they return, the SQL that renders a lease's tasks as one JSON text, and its
 * parsing.
 */

export interface ClaimParams {
  /** The schema's storage (storage/storage.ts): its statements are compiled there once. */
  storage: Storage;
  /** Candidate lanes, best first. */
  laneIds: readonly number[];
  /** How many entries to lease at most (the number of idle slots). */
  limit: number;
  /** Per-type ceilings in ms; types not listed get `defaultCeilingMs`. */
  ceilings: ReadonlyMap<string, number>;
  /** Per-type attempt limits, used for tasks enqueued without an explicit maxAttempts. */
  maxAttempts: ReadonlyMap<string, number>;
  defaultMaxAttempts: number;
  defaultCeilingMs: number;
  marginMs: number;
  workerId: string;
  /** Channel to re-signal when the claim leased all it asked for (more work is likely). */
  wakeChannel: string;
  /** Only lanes of these queues (null: all). Candidates from a notification may be any lane. */
  queues?: readonly string[] | null;
  /** Lock at most this many candidate lanes, in candidate order (default: all of them). The
   * worker passes one per LANE_SHARE tasks it wants. */
  maxLanes?: number;
  /**
   * Read each locked lane for at most this many entries (default: `limit`). The claim takes a
   * round-robin prefix of its lanes, so with n lanes each gives about limit / n; reading each
   * for the whole limit only to drop the rest cost 3.5 µs per entry read (a claim of 107 over
   * 7 lanes: 5.2 ms reading 749 entries, 2.95 ms reading 112). A lane that gives all of it sets
   * `more` (ClaimBatch), so nothing waits for the poll.
   */
  perLane?: number;
  /**
   * Read only this ring window's segments (storage/ring-window.ts), and lease nothing when the
   * ring's generation in the claim's snapshot is not the window's: the batch then says `stale`
   * and the caller reads the window again. Without one the claim reads the whole ring.
   */
  window?: RingWindow;
  /**
   * Claim the lanes of limited queues (only inside the limited claim's transaction, which
   * bounds `limit` by the queue's free capacity: processor/claim-limited.ts) instead of the
   * others. Default false: the ordinary claim never takes a lane of a limited queue.
   */
  limited?: boolean;
}

/**
 * The claim's lane filter on the locked (latest) row: a lane of a limited queue is claimed only
 * by the limited claim, whose transaction holds the queue's capacity. A constant in each of the
 * two statement texts (not a parameter), so the ordinary claim's plan is what it was.
 */
export function limitedTerm(limited: boolean): string {
  return limited ? 'l.limited' : 'NOT l.limited';
}

/** What one claim leased, and whether its lanes may hold more due entries it left. */
export interface ClaimBatch {
  tasks: ClaimedTask[];
  /**
   * A lane gave all it was read for (`perLane`) or stopped at a ring segment boundary: a short
   * claim with `more` did not drain its lanes.
   */
  more: boolean;
  /** The claim's window (ClaimParams.window) is out of date: it leased nothing. */
  stale: boolean;
}

/** The parameters both claim statements bind for the worker's per-type terms (TYPE_TERMS). */
export type TermParams =
  | 'types'
  | 'typeCeilings'
  | 'typeMaxAttempts'
  | 'defaultCeilingMs'
  | 'defaultMaxAttempts'
  | 'marginMs'
  | 'workerId';

/**
 * The values of TermParams: the types the worker has a ceiling or attempt limit for, with
 * both per type (null: the default), and the defaults.
 */
export function claimTermArgs(c: ClaimParams): { [K in TermParams]: unknown } {
  const types = [...new Set([...c.ceilings.keys(), ...c.maxAttempts.keys()])];
  return {
    types,
    typeCeilings: types.map((t) => c.ceilings.get(t) ?? null),
    typeMaxAttempts: types.map((t) => c.maxAttempts.get(t) ?? null),
    defaultCeilingMs: c.defaultCeilingMs,
    defaultMaxAttempts: c.defaultMaxAttempts,
    marginMs: c.marginMs,
    workerId: c.workerId,
  };
}

/**
 * A claim's per-type terms, for rows `x` with a `type`: joined to `t` (the worker's own terms
 * for that type, if any), the lease deadline `expires_at` from the database clock (ceiling plus
 * margin) and the attempt limit `max_attempts` (the task's own is read from its entry).
 */
export const TYPE_TERMS = {
  join: sql`LEFT JOIN unnest(${p('types')}::text[], ${p('typeCeilings')}::float8[], ${p('typeMaxAttempts')}::integer[])
           AS t(type, ceiling_ms, max_attempts)`,
  expiresAt: sql`now() + make_interval(secs => (coalesce(t.ceiling_ms, ${p('defaultCeilingMs')}) + ${p('marginMs')}) / 1000.0)`,
  maxAttempts: sql`coalesce(t.max_attempts, ${p('defaultMaxAttempts')})`,
};

export interface ClaimedTask extends AttemptRef {
  id: string;
  type: string;
  payload: unknown;
  queue: string;
  priority: number;
  shard: number;
  /** This attempt's number (attempts are counted at claim). */
  attempt: number;
  /** The limit this attempt runs under: the task's own, else its type's, else 20. */
  maxAttempts: number;
  dedupeKey: string | null;
  /** lease_expires_at as stamped by the database, in epoch ms. */
  leaseExpiresAt: number;
  /** How long the task had been due when it was claimed (database clock), in seconds. */
  waitedSeconds: number;
  /** The producer's stored trace context (src/tracing.ts), or null when it enqueued untraced. */
  traceContext: string | null;
  /** How many times the task has snoozed so far (its row in `snoozes`; 0 when none). */
  snoozes: number;
  /**
   * Set only on a task of a rate-limited queue (claim-limited.ts): the local time (epoch ms) by
   * which its handler must start, else it is handed back unstarted, so no handler starts later
   * than the rate limit's guard after the start the database counted.
   */
  startBy?: number;
  /**
   * Set only on a task whose entry is marked as having dependents waiting for it: its
   * completion releases them in the same transaction (settlement-batcher.ts).
   */
  hasDependents?: boolean;
}

/** What a claim stamps per type: the claiming worker's ceiling and attempt limit, else the defaults. */
export interface TypeTerms {
  ceilings: ReadonlyMap<string, number>;
  maxAttempts: ReadonlyMap<string, number>;
  defaultCeilingMs: number;
  defaultMaxAttempts: number;
  marginMs: number;
}

/**
 * The claim's result: one row per range lease, with what is the lease's once (slot, token, the
 * lane's queue, priority and shard, its types) and its tasks as one JSON text of ClaimedJson, in
 * lane order. As one row per task with every column, the rows cost the worker 8.8 µs each to
 * parse (bench/row-parse.ts; half of it the per-lease columns repeated) and the server an output
 * row per task; one JSON text per lease is one JSON.parse. Built by concatenation rather than
 * json_agg(json_build_array(…)), which resolves the output of every argument per row: 1.5 µs per
 * task of the claim's server time against ~0.7 µs (docs/benchmarks-journal.md, "The claim's shape").
 *
 * Each type's deadline and attempt limit are not returned: the statement stamps them as
 * `now() + ceiling + margin` and `coalesce(limit, default)` from the worker's own maps, so the
 * worker derives them from `now_ms` (the claim's now(), exact to the microsecond as numeric, then
 * ms as float8) with the same maps. Returned, they were an array per lease built by a subplan
 * over unnest(…): an aggregate the executor set up on every claim, and arrays to parse.
 */
export interface LeaseRow {
  slot: number;
  lane_id: number;
  lease_from: string;
  token: string;
  types: string[];
  now_ms: number;
  queue: string;
  priority: number;
  shard: number;
  tasks: string;
  more: boolean;
  stale: boolean;
}

/**
 * A lease row no claim returned, for code that needs a claimed task of the claim's own shape
 * without a claim (the per-task shape donors in engine.ts, the settlement session's start-time
 * probe in prepare-settlement.ts): one task of type '' at lane position 1, each field of the
 * representation a claim's row gives it (a fractional now and wait).
 */
export function standInLease(laneId: number, token: string): LeaseRow {
  return {
    slot: 0,
    lane_id: laneId,
    lease_from: '1',
    token,
    types: [''],
    now_ms: Date.now() + 0.5,
    queue: '',
    priority: 0,
    shard: 0,
    tasks: '[["1","1",1,1,0.5,null]]',
    more: false,
    stale: false,
  };
}

/** The terms a stand-in lease is read with: no type of its own, one attempt. */
export const STAND_IN_TERMS: TypeTerms = {
  ceilings: new Map(),
  maxAttempts: new Map(),
  defaultCeilingMs: 1000,
  defaultMaxAttempts: 1,
  marginMs: 0,
};

/** The claim's now() in epoch ms, as LeaseRow.now_ms (numeric until the last step, so exact). */
export const NOW_MS_SQL = '(extract(epoch FROM now()) * 1000)::float8';

/**
 * One task of lease `l` (its `types`) from the ready row aliased `r`, as one ClaimedJson text, for
 * string_agg(…, ','). Its order is the input's: each statement feeds it in lane order, and
 * leaseTasks checks (an ORDER BY inside the aggregate was a sort the executor set up per claim).
 * `s` is the quoted schema.
 *
 * The task's snooze count (`ctx.snoozes`) is the one field not on the ready row: it lives in
 * `snoozes`, one row per task that snoozed. A snooze always sends its task through deferred
 * storage, whose `run_at` (the snooze's `now()` plus its delay) then differs from the
 * `created_at` it keeps; a task enqueued due now is appended with both set to the enqueue's
 * `now()`. So only a ready row whose two differ (a snoozed, retried or delayed task) is
 * probed, by primary key; the claim of tasks that never left the ring reads nothing of
 * `snoozes`. Not an uncorrelated EXISTS over the table: that scans every dead row at the head
 * of the table's index until a vacuum, on every claim, once counts were pruned. A count of 0 is
 * not written.
 */
export function taskJsonSql(s: string, r: string, l: string): string {
  const snoozes = `CASE WHEN ${r}.run_at <> ${r}.created_at
                        THEN (SELECT z.snoozes FROM ${s}.snoozes z WHERE z.id = ${r}.id) END`;
  return `'["' || ${r}.lane_seq || '","' || ${r}.id || '",' || array_position(${l}.types, ${r}.type) || ','
            || (${r}.attempts + 1) || ',' || greatest(date_part('epoch', now() - ${r}.run_at), 0) || ','
            || ${r}.payload
            || CASE WHEN ${r}.max_attempts IS NULL AND ${r}.dedupe_key IS NULL AND ${r}.trace_context IS NULL
                          AND ${r}.has_dependents IS NULL
                    THEN coalesce(',null,null,null,' || (${snoozes}), '') || ']'
                    ELSE ',' || coalesce(${r}.max_attempts::text, 'null') || ','
                         || coalesce(to_json(${r}.dedupe_key)::text, 'null') || ','
                         || coalesce(to_json(${r}.trace_context)::text, 'null')
                         || CASE WHEN ${r}.has_dependents THEN ',' || coalesce((${snoozes}), 0) || ',1'
                                 ELSE coalesce(',' || (${snoozes}), '') END || ']' END`;
}

/**
 * One task of a lease, in lane order: lane_seq and id (int8, as JSON strings: exact whatever
 * their size), its type's 1-based position in the lease's `types`, this attempt, seconds it had
 * been due, payload; then, only when one of them is set, its own attempt limit (null: the
 * type's), dedupe key and the producer's trace context; then, only when the task has snoozed,
 * its snooze count; then, only when the entry is marked as having dependents (migration 31),
 * its snooze count (0 when none) and a 1: the mark, read from a column the claim reads anyway.
 */
type ClaimedJson =
  | [string, string, number, number, number, unknown]
  | [string, string, number, number, number, unknown, number | null, string | null, string | null]
  | [string, string, number, number, number, unknown, number | null, string | null, string | null, number]
  | [string, string, number, number, number, unknown, number | null, string | null, string | null, number, 1];

/** A key's part as it is ordered (the claim's order: priority, rank in lane, due time, lane). */
interface Placed {
  task: ClaimedTask;
  priority: number;
  rank: number;
  waited: number;
}

/**
 * The leases' tasks in the claim's order: by priority, then round-robin over the lanes (rank in
 * lane), the longest due first within a rank, then by lane. The statement leases each lane's
 * prefix and leaves the order to the worker (a sort of every claimed row there cost more).
 */
export function tasksOf(rows: readonly LeaseRow[], terms: TypeTerms): ClaimedTask[] {
  const t = termsOf(terms);
  if (rows.length === 1) return leaseTasks(leaseOf(rows[0]!), t, null);
  const placed: Placed[] = [];
  for (const r of rows) leaseTasks(leaseOf(r), t, placed);
  placed.sort(
    (a, b) => a.priority - b.priority || a.rank - b.rank || b.waited - a.waited || a.task.laneId - b.task.laneId,
  );
  return placed.map((p) => p.task);
}

/**
 * The fields leaseTasks reads, copied into one shape each. A lease row comes in several shapes:
 * each claim statement's result has columns of its own (the one-lane claim's `resignalled`), and
 * the shape donors pass object literals (standInLease, and one spread from it). The terms too:
 * each of the fetcher's claims passes its ClaimParams, spread together at its own call site.
 * Read from them directly, leaseTasks, whose loop builds every claimed task, was compiled for the
 * shapes it had seen and thrown away at each new one: three or four times in a new process's
 * first drain (`node --trace-deopt`, "wrong map" at `r.tasks` and `terms.ceilings`), each time
 * running in slower code until compiled again. These copies are two objects a claim, each from
 * one literal; only they meet the several shapes, and they are small to compile again.
 */
function leaseOf(r: LeaseRow): LeaseFields {
  return {
    slot: r.slot,
    lane_id: r.lane_id,
    lease_from: r.lease_from,
    token: r.token,
    types: r.types,
    now_ms: r.now_ms,
    queue: r.queue,
    priority: r.priority,
    shard: r.shard,
    tasks: r.tasks,
  };
}

/** A lease row less what only the claim's caller reads (`more`, `stale`). */
type LeaseFields = Omit<LeaseRow, 'more' | 'stale'>;

function termsOf(t: TypeTerms): TypeTerms {
  return {
    ceilings: t.ceilings,
    maxAttempts: t.maxAttempts,
    defaultCeilingMs: t.defaultCeilingMs,
    defaultMaxAttempts: t.defaultMaxAttempts,
    marginMs: t.marginMs,
  };
}

/** Whether lane position `a` (decimal int8 text) precedes `b`. */
function seqBefore(a: string, b: string): boolean {
  return a.length !== b.length ? a.length < b.length : a < b;
}

function leaseTasks(r: LeaseFields, terms: TypeTerms, placed: Placed[] | null): ClaimedTask[] {
  const out: ClaimedTask[] = [];
  const tasks = JSON.parse(r.tasks) as ClaimedJson[];
  for (let i = 1; i < tasks.length; i++) {
    if (!seqBefore(tasks[i - 1]![0], tasks[i]![0])) {
      tasks.sort((a, b) => (seqBefore(a[0], b[0]) ? -1 : 1));
      break;
    }
  }
  // Per type, as the statement stamped them (LeaseRow).
  // Filled by push from literals, not by map(): the arrays' element kinds then come from these
  // two allocation sites alone (a map() result's differed, and threw the loop's code away too).
  const expires: number[] = [];
  const limits: number[] = [];
  for (const type of r.types) {
    expires.push(r.now_ms + (terms.ceilings.get(type) ?? terms.defaultCeilingMs) + terms.marginMs);
    limits.push(terms.maxAttempts.get(type) ?? terms.defaultMaxAttempts);
  }
  for (let i = 0; i < tasks.length; i++) {
    const row = tasks[i]!;
    const t = row[2] - 1;
    const own = row.length > 6 ? row[6] : null;
    const task: ClaimedTask = {
      segment: r.slot,
      laneId: r.lane_id,
      laneSeq: row[0],
      leaseFrom: r.lease_from,
      token: r.token,
      id: row[1],
      type: r.types[t]!,
      payload: row[5],
      queue: r.queue,
      priority: r.priority,
      shard: r.shard,
      attempt: row[3],
      maxAttempts: own ?? limits[t]!,
      dedupeKey: row.length > 6 ? (row[7] ?? null) : null,
      leaseExpiresAt: expires[t]!,
      waitedSeconds: row[4],
      traceContext: row.length > 6 ? (row[8] ?? null) : null,
      snoozes: row.length > 9 ? (row[9] ?? 0) : 0,
    };
    // Set only when marked (not spread in from an object made per task, empty for almost all).
    if (row.length > 10) task.hasDependents = true;
    if (placed === null) out.push(task);
    else placed.push({ task, priority: r.priority, rank: i, waited: row[4] });
  }
  return out;
}
