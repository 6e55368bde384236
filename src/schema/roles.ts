import { quoteIdent } from '../sql.js';
import { RING_SLOTS } from './migrations.js';

/**
 * The SECURITY DEFINER functions a runtime role calls. They run as the schema owner, which is
 * how a role without CREATE opens a lane (and its sequence) and appends to it. Not granted:
 * `append_ready` (only ever called from inside these, as the owner; calling it directly would
 * bypass dedupe) and the operator-only lane sequence repair functions.
 */
const RUNTIME_FUNCTIONS = [
  'provision_lane(text, smallint, smallint)',
  'enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[], integer[], text[])',
  'promote_lane(text, smallint, smallint, integer)',
  'remove_unleased(bigint, text)',
  'move_task(bigint, text, smallint)',
] as const;

const RING_TABLES = ['ready', 'leases', 'settlements', 'tombstones'] as const;

/**
 * The privileges a runtime role (producer, worker, maintenance leader) needs, and nothing more.
 * Why each one, by the statement that needs it:
 *
 * - USAGE on the schema: to name anything in it.
 * - EXECUTE on the definer functions above: enqueue, promotion, removal, move, lane opening.
 * - lanes: SELECT (discovery); UPDATE (version), because the claim's `FOR UPDATE SKIP LOCKED`
 *   needs UPDATE on at least one column. version is the column the lane lock protects;
 *   bumping it only makes a claim with an older snapshot skip the lane once.
 * - ready: SELECT only. Entries are appended by append_ready, as the owner.
 * - leases: SELECT, INSERT (the claim).
 * - settlements: SELECT, INSERT (complete, fail, release, advance, rescue).
 * - tombstones: SELECT only; written by remove_unleased / move_task, as the owner.
 * - the 64 ring partitions: SELECT (rotation and prune read a slot's partitions directly, and
 *   PostgreSQL checks a partition's own privileges then) and TRUNCATE (prune's LOCK TABLE ...
 *   ACCESS EXCLUSIVE needs UPDATE, DELETE or TRUNCATE; its TRUNCATE needs TRUNCATE); INSERT
 *   on the settlements partitions (a batched completion inserts into its slot's partition).
 * - ring_state: SELECT; UPDATE of the columns rotation sets.
 * - deferred: SELECT, INSERT (retry, release, advance, rescue); UPDATE (run_at) only because
 *   promotion's batch selection locks rows `FOR UPDATE` (promote_lane deletes, as the owner).
 * - dead_letters: SELECT, INSERT, UPDATE of the columns `ON CONFLICT (id) DO UPDATE` sets
 *   (a task retried out of the dead letters dies again), DELETE (retention).
 * - dedupe: SELECT, DELETE (a completed or dead task frees its key).
 * - workers, outcome_counts: SELECT, INSERT, UPDATE, DELETE (the worker's heartbeat writes its
 *   own rows; the leader's retention removes stale ones).
 * - overdue_leases: SELECT (rescue, the dashboard), INSERT (a worker protects the lease of a
 *   handler still running past its deadline), UPDATE (seen_at: the holder's refresh), DELETE (the
 *   holder once the lease is settled; rescue for the leases it takes and for stale rows).
 * - queue_pauses: SELECT (the leader's oldest-due gauge leaves paused queues out). Pausing is an
 *   operator action (set_queue_paused), not granted.
 *
 * No sequence privilege at all: task ids and lane_seq values are drawn by nextval inside the
 * definer functions, as the owner, so a lane sequence created tomorrow works for every runtime
 * role without a grant. No access to schema_migrations or the lane sequence repair view.
 * The role also needs CONNECT on the database, which PUBLIC has by default.
 */
export function runtimeGrantStatements(schema: string, role: string): string[] {
  const s = quoteIdent(schema);
  const r = quoteIdent(role);
  const partitions = RING_TABLES.flatMap((t) =>
    Array.from({ length: RING_SLOTS }, (_, slot) => `${s}.${quoteIdent(`${t}_${slot}`)}`),
  );
  const settlementPartitions = Array.from({ length: RING_SLOTS }, (_, slot) => `${s}.${quoteIdent(`settlements_${slot}`)}`);
  return [
    `GRANT USAGE ON SCHEMA ${s} TO ${r}`,
    `GRANT EXECUTE ON FUNCTION ${RUNTIME_FUNCTIONS.map((f) => `${s}.${f}`).join(', ')} TO ${r}`,
    `GRANT SELECT ON ${s}.ready, ${s}.tombstones TO ${r}`,
    `GRANT SELECT, INSERT ON ${s}.leases, ${s}.settlements TO ${r}`,
    `GRANT SELECT, UPDATE (version) ON ${s}.lanes TO ${r}`,
    `GRANT SELECT, TRUNCATE ON ${partitions.join(', ')} TO ${r}`,
    `GRANT INSERT ON ${settlementPartitions.join(', ')} TO ${r}`,
    `GRANT SELECT, UPDATE (current_slot, generation, rotated_at) ON ${s}.ring_state TO ${r}`,
    `GRANT SELECT, INSERT, UPDATE (run_at) ON ${s}.deferred TO ${r}`,
    `GRANT SELECT, INSERT, DELETE, UPDATE (payload, attempts, last_error, last_attempted_at, died_at) ON ${s}.dead_letters TO ${r}`,
    `GRANT SELECT, DELETE ON ${s}.dedupe TO ${r}`,
    `GRANT SELECT, INSERT, UPDATE, DELETE ON ${s}.workers, ${s}.outcome_counts TO ${r}`,
    `GRANT SELECT, INSERT, UPDATE (seen_at), DELETE ON ${s}.overdue_leases TO ${r}`,
    `GRANT SELECT ON ${s}.queue_pauses TO ${r}`,
  ];
}
