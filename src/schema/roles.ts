import { quoteIdent } from '../sql.js';
import { RING_SLOTS } from './migrations.js';

/**
 * What a runtime role may do, by kind:
 *
 * - `producer`: enqueue (the `enqueue` and `enqueue_one` definer functions, and `add_task` / `add_tasks`) and read task state (`getTask`'s
 *   SELECTs). Nothing else: no claim, no settlement, no ring or lane writes, no heartbeats.
 * - `worker`: everything a Worker and the maintenance leader run (claim, settle, heartbeat,
 *   promotion, rescue, ring rotation and prune, retention, gauges), plus what a producer may do.
 *
 * Neither kind can TRUNCATE, DROP or ALTER anything, or DELETE/UPDATE task data at will: the
 * operations that need such power (the ring prune, dead-letter retention, promotion's row
 * locks, lane opening, removal, moves) run inside SECURITY DEFINER functions owned by the
 * schema owner, which check their own safety condition. No role gets a sequence privilege:
 * task ids and lane_seq values are drawn inside the definer functions, as the owner, so a lane
 * sequence created tomorrow works for every role without a grant. No role gets access to
 * schema_migrations, the lane sequence repair functions, the pause function, dead-letter retry
 * or the audit log (operator actions: run them as the schema owner or an operator role).
 * A role also needs CONNECT on the database, which PUBLIC has by default.
 */
export type RoleKind = 'producer' | 'worker';
export const ROLE_KINDS: readonly RoleKind[] = ['producer', 'worker'];

/** One GRANT (or, mirrored, REVOKE): `privileges` ON `on`. */
interface Grant {
  privileges: string;
  on: string;
}

const ENQUEUE = 'enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[], integer[], text[], text)';
/** The client's single plain enqueue (migration 33): enqueue()'s fast path for one task, in scalars. */
const ENQUEUE_ONE = 'enqueue_one(text, smallint, smallint, smallint, text, jsonb, text)';
/** The enqueue before migration 12 (no trace context), kept for producers of the previous version during a deploy. */
const ENQUEUE_BEFORE_13 =
  'enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[], integer[], text[])';
/** A keyed enqueue (migration 29): enqueue() with each task held for its concurrency key. */
const ENQUEUE_KEYED =
  'enqueue_keyed(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[], integer[], text[], text, text[])';
/**
 * The documented SQL doors to enqueue (migration 23): users call them from triggers, psql, other
 * languages and ORMs, under either role. They go through `enqueue()` as the owner.
 */
const ADD_TASK = [
  'add_task(text, jsonb, text, timestamptz, integer, text, integer, interval, integer, integer)',
  'add_tasks(jsonb)',
] as const;

/** An enqueue with dependencies (migration 31): the whole call in one statement. */
const ENQUEUE_GRAPH = 'enqueue_graph(jsonb)';
/** A task's parents and dependents with their states (getTask's readers, ctx.parents()). */
const DEPENDENCY_READS = ['task_parents(bigint)', 'task_dependents(bigint, integer)'] as const;

/**
 * The definer functions a worker calls. Not granted to anyone: `append_ready` (only ever called
 * from inside these, as the owner; calling it directly would bypass dedupe) and the
 * operator-only functions.
 */
const WORKER_FUNCTIONS = [
  'provision_lane(text, smallint, smallint)',
  ENQUEUE,
  ENQUEUE_ONE,
  ENQUEUE_BEFORE_13,
  ENQUEUE_KEYED,
  ...ADD_TASK,
  'promote_lane(text, smallint, smallint, integer)',
  'remove_unleased(bigint, text)',
  'move_task(bigint, text, smallint)',
  'prune_slot(smallint, integer)',
  'prune_dead_letters(double precision, integer)',
  'due_deferred(text, integer, text[], smallint[], smallint[])',
  'cancel_tasks(bigint[], text)',
  'rotate_history(integer)',
  // The claim's ring window (migration 13; a definer function since migration 18, when it reads
  // the ring epoch).
  'ring_window()',
  // The leader's ring rotation (migration 18): every condition checked under the row lock; and
  // the repair of a rotation whose transaction was lost after its statement moved the epoch.
  'rotate_ring(smallint, smallint)',
  'repair_ring_state()',
  // A run whose lease a server crash took back counts its attempt (migration 19).
  'count_lost_claim(smallint, integer, bigint, integer, integer, text)',
  // The limited claim (migration 28): a queue's free capacity under its limit row's lock, and
  // the leases it took recorded as holders; the limits and how full they are (gauges).
  'limit_capacity(text, integer)',
  'hold_leases(text, smallint[], integer[], bigint[])',
  'limit_usage()',
  // Concurrency keys (migration 29): admitting held tasks (the leader's tick, and the worker that
  // settled a keyed task), and the retention of keys of tasks that are gone.
  'promote_held(text[], text)',
  'key_entry_live(bigint)',
  'release_keys(bigint[])',
  'prune_task_keys(integer)',
  // Type rate limits (migration 30): a start of a rate-limited type granted or refused, and the
  // limits and how full they are (gauges).
  'take_type_starts(text, bigint[])',
  'release_paced(text)',
  'type_limit_usage()',
  // Task dependencies (migration 31): a completion's release of the dependents it frees, the
  // leader's watch and retention, the hooks of a removal, and the reads of `tasks show` and gauges.
  'release_completed(bigint[])',
  'deps_tick(boolean, bigint, integer)',
  'watch_parents(bigint[])',
  'prune_dep_edges(integer)',
  'dependency_usage()',
  ...DEPENDENCY_READS,
  ENQUEUE_GRAPH,
] as const;

/** The columns of `schedules` a worker writes: everything but the operator's pause. */
const SCHEDULE_WORKER_COLUMNS = [
  'cron',
  'time_zone',
  'task_type',
  'payload',
  'queue',
  'priority',
  'max_attempts',
  'misfire',
  'misfire_cap',
  'misfire_grace_ms',
  'ceiling_ms',
  'interval_ms',
  'declared_by',
  'declared_at',
  'fired_through',
  'last_instant',
  'last_fired_at',
  'last_task_id',
  'stale',
  'stale_since',
] as const;

const RING_TABLES = ['ready', 'range_leases', 'range_settlements', 'tombstones'] as const;
/**
 * The per-task lease tables of berth before migration 8: no statement reads them, migration 22
 * revoked every grant on them, and a later migration drops them (migration 22's header says why
 * not there). That migration takes them out of the retired grants below too: a REVOKE naming a
 * missing table fails.
 */
const RETIRED_RING_TABLES = ['leases', 'settlements'] as const;

function ringPartitions(s: string, tables: readonly string[]): string {
  return tables
    .flatMap((t) => Array.from({ length: RING_SLOTS }, (_, segment) => `${s}.${quoteIdent(`${t}_${segment}`)}`))
    .join(', ');
}

/** getTask reads these (through the partitioned parents, so no partition privilege). */
function producerGrants(s: string): Grant[] {
  return [
    { privileges: 'USAGE', on: `SCHEMA ${s}` },
    {
      privileges: 'EXECUTE',
      on: `FUNCTION ${[ENQUEUE, ENQUEUE_ONE, ENQUEUE_BEFORE_13, ENQUEUE_KEYED, ENQUEUE_GRAPH, ...ADD_TASK, ...DEPENDENCY_READS].map((f) => `${s}.${f}`).join(', ')}`,
    },
    {
      privileges: 'SELECT',
      on: [
        'deferred',
        'dead_letters',
        'ready',
        'tombstones',
        'range_leases',
        'range_settlements',
        'leased_entries',
        // A completed task's attempts, and its queue once its ring entry is gone (migration 10).
        'attempt_history',
        'history_state',
        'lanes',
        // A completed task's result (migration 24).
        'task_results',
        // The schedule that fired a task, shown with its attempts (migration 26).
        'schedule_fires',
        // A task's concurrency key (migration 29).
        'task_keys',
        // A task's dependencies and what it waits for (migration 31).
        'task_deps',
        'task_waits',
      ]
        .map((t) => `${s}.${t}`)
        .join(', '),
    },
  ];
}

/**
 * The worker's set. Why each privilege, by the statement that needs it; every UPDATE and
 * DELETE a worker keeps is on this list with its reason.
 */
function workerGrants(s: string): Grant[] {
  return [
    // To name anything in the schema.
    { privileges: 'USAGE', on: `SCHEMA ${s}` },
    // Enqueue, promotion, removal, move, lane opening, ring prune, retention, promotion's selection, cancel.
    { privileges: 'EXECUTE', on: `FUNCTION ${WORKER_FUNCTIONS.map((f) => `${s}.${f}`).join(', ')}` },
    // Appended by append_ready and tombstoned by remove_unleased / move_task, as the owner.
    { privileges: 'SELECT', on: `${s}.ready, ${s}.tombstones` },
    // The claim inserts range leases; complete, fail, release, advance and rescue insert range
    // settlements.
    { privileges: 'SELECT, INSERT', on: `${s}.range_leases, ${s}.range_settlements` },
    { privileges: 'SELECT', on: `${s}.leased_entries` },
    // UPDATE (version): the claim's `FOR UPDATE SKIP LOCKED` on lanes needs UPDATE on at least one
    // column. version is the column the lane lock protects; a forged bump only makes a claim
    // with an older snapshot skip the lane once.
    { privileges: 'SELECT, UPDATE (version)', on: `${s}.lanes` },
    // Rotation and the completion statement read a ring segment's partitions directly, and PostgreSQL
    // checks a partition's own privileges then. No TRUNCATE: the prune is prune_slot's.
    { privileges: 'SELECT', on: ringPartitions(s, RING_TABLES) },
    // A batched completion inserts into its ring segment's range_settlements partition directly.
    { privileges: 'INSERT', on: ringPartitions(s, ['range_settlements']) },
    // The ring's state, read by the window and the claim (its generation). This version rotates
    // through rotate_ring, as the owner; UPDATE of the columns a rotation writes stays for the
    // leaders of migrations 13-17 in a fleet being upgraded (their compare-and-set is a plain
    // UPDATE, which the ring_epoch_follows trigger turns into a move of the epoch). A forged value
    // only moves the epoch forward to another segment: appends stay in rotation order, and the
    // prune still checks every entry under its lock, so none is lost.
    { privileges: 'SELECT, UPDATE (current_slot, generation, rotated_at)', on: `${s}.ring_state` },
    // INSERT: a failure's retry, a release, a cursor advance and a rescue defer the task.
    // Promotion deletes (promote_lane) and locks (due_deferred) as the owner: no UPDATE, no DELETE.
    { privileges: 'SELECT, INSERT', on: `${s}.deferred` },
    // INSERT: a task out of attempts is buried. UPDATE of exactly the columns the bury's
    // `ON CONFLICT (id) DO UPDATE` sets (a task with a dead letter already there dies again).
    // No DELETE: retention is prune_dead_letters'.
    {
      privileges: 'SELECT, INSERT, UPDATE (payload, attempts, last_error, last_attempted_at, died_at)',
      on: `${s}.dead_letters`,
    },
    // DELETE: a completed or buried task frees its dedupe key, in the settling statement itself
    // (the hot completion path). A forged delete can only let a second task with the key in; it
    // never loses or changes a task.
    { privileges: 'SELECT, DELETE', on: `${s}.dedupe` },
    // The heartbeat upserts its own rows and deletes its row on a clean stop; the leader's
    // retention deletes stale rows and old counts. Status reports, not task data: leadership is
    // the advisory lock (leaderInfo reads pg_locks), so a forged row cannot make a leader.
    { privileges: 'SELECT, INSERT, UPDATE, DELETE', on: `${s}.workers, ${s}.outcome_counts` },
    // A worker protects the lease of a handler still running past its deadline (INSERT),
    // refreshes it (UPDATE seen_at) and removes it once the lease settles; rescue deletes the
    // rows of leases it takes and stale ones. Rescue and the dashboard read it.
    { privileges: 'SELECT, INSERT, UPDATE (seen_at), DELETE', on: `${s}.overdue_leases` },
    // A snooze counts itself (INSERT … ON CONFLICT DO UPDATE of its count); the leader's
    // retention deletes the rows of tasks that are no longer pending.
    { privileges: 'SELECT, INSERT, UPDATE (snoozes, last_snoozed_at), DELETE', on: `${s}.snoozes` },
    // Every settling statement appends the attempt it ends (migration 10), reading the schema's
    // history setting; getTask and the timeline read it. Reclaimed by rotate_history (TRUNCATE
    // as the owner): no UPDATE, no DELETE.
    { privileges: 'SELECT, INSERT', on: `${s}.attempt_history` },
    { privileges: 'SELECT', on: `${s}.history_state` },
    // A completion that carries a handler's result stores it in the same statement (INSERT … ON
    // CONFLICT (id) DO UPDATE of exactly these columns); the leader's retention deletes results
    // past resultRetentionMs; getTask reads them. A forged row only changes what a reader is told
    // a task returned, never a task's state.
    { privileges: 'SELECT, INSERT, UPDATE (attempt, result, stored_at), DELETE', on: `${s}.task_results` },
    // The leader's oldest-due gauge leaves paused queues out. Pausing is set_queue_paused's (operators).
    { privileges: 'SELECT', on: `${s}.queue_pauses` },
    // Which queues are limited (the fetcher claims them through the limited claim). Setting a
    // limit is set_queue_limit's (operators); holders and starts are written by the definer
    // functions above, as the owner.
    { privileges: 'SELECT', on: `${s}.queue_limits` },
    // Concurrency keys (migration 29): read by the gauges and the worker (which queues hold keyed
    // tasks); written only by the definer functions, as the owner. Key limits are set_key_limit's
    // (operators).
    {
      privileges: 'SELECT',
      on: `${s}.task_keys, ${s}.held_keys, ${s}.key_holders, ${s}.key_limits, ${s}.keyed_queues, ${s}.key_arrivals`,
    },
    // Which task types are rate-limited (the worker asks for their starts). Setting a limit is
    // set_type_limit's (operators); starts are written by take_type_starts, as the owner.
    { privileges: 'SELECT', on: `${s}.type_limits, ${s}.type_starts, ${s}.type_paced` },
    // Task dependencies (migration 31): read by result retention (a parent's result is kept
    // while an edge names it) and the gauges; written only by the definer functions, as the owner.
    { privileges: 'SELECT', on: `${s}.task_deps, ${s}.task_waits` },
    // Schedules (migration 26): a worker upserts the ones it declares at start (INSERT … ON
    // CONFLICT DO UPDATE of the declaration); the leader moves the watermark and the last fire in
    // each fire's transaction, and marks schedules stale or not. Pausing is an operator's: no
    // runtime role writes paused, paused_at or paused_by. A forged row can fire a task of a type
    // the worker already runs, as enqueue can. berth's own statements only move the watermark
    // forward, under the row lock, so they never fire an instant twice; a session of this role
    // writing the column by hand could move it back (the grant is by column, not by direction).
    {
      privileges: `SELECT, INSERT, UPDATE (${SCHEDULE_WORKER_COLUMNS.join(', ')})`,
      on: `${s}.schedules`,
    },
    // Each fire records itself; the leader's retention deletes fires older than 7 days.
    { privileges: 'SELECT, INSERT, DELETE', on: `${s}.schedule_fires` },
  ];
}

/**
 * Privileges an earlier berth granted its one runtime role and no role gets now; every grant
 * revokes them (migration 7 revoked them from the roles it found).
 */
function retiredGrants(s: string): Grant[] {
  return [
    { privileges: 'TRUNCATE', on: ringPartitions(s, RING_TABLES) },
    // Per-task leases and settlements, written before migration 8 and read by no statement since;
    // SELECT was granted until migration 22.
    {
      privileges: 'SELECT, INSERT, TRUNCATE',
      on: `${s}.leases, ${s}.settlements, ${ringPartitions(s, RETIRED_RING_TABLES)}`,
    },
    { privileges: 'DELETE', on: `${s}.dead_letters` },
    { privileges: 'UPDATE (run_at)', on: `${s}.deferred` },
  ];
}

/**
 * The statements that make `role` exactly a `kind` role on `schema`: revoke everything any
 * runtime grant ever gave (so a worker role regranted as a producer loses the rest, and a role
 * from before the split loses what was retired), then grant the kind's set. Run them in one
 * transaction. Privileges berth never grants (an operator's own) are left alone.
 */
export function runtimeGrantStatements(schema: string, role: string, kind: RoleKind = 'worker'): string[] {
  const s = quoteIdent(schema);
  const r = quoteIdent(role);
  const grants = kind === 'producer' ? producerGrants(s) : workerGrants(s);
  return [
    ...[...workerGrants(s), ...retiredGrants(s)].map((g) => `REVOKE ${g.privileges} ON ${g.on} FROM ${r}`),
    ...grants.map((g) => `GRANT ${g.privileges} ON ${g.on} TO ${r}`),
  ];
}
