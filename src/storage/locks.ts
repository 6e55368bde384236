import { sessionName } from '../db/connections.js';

/**
 * Every advisory lock berth takes, in one place. Two-key locks are `(schemaLockKey(schema), n)`:
 * the first key namespaces them by schema, so installations in different schemas of one
 * database never contend. The second key:
 *
 * | second key      | mode                          | taken by                                             | serialises |
 * | --------------- | ----------------------------- | ---------------------------------------------------- | ---------- |
 * | `lane_id` (> 0) | transaction (`xact`)          | `append_ready()`, `promote_lane()` (migration 1), `provision_lane_sequence()` (migration 4) | appends to one lane, so its entries become visible in `lane_seq` order (held to the producer's commit) |
 * | `LEADER_LOCK`   | session, `pg_try_advisory_lock` | the election session (maintenance/election.ts); read from `pg_locks` by `leaderInfo` | one maintenance leader per schema |
 * | `MIGRATE_LOCK`  | transaction                   | `migrate()`, `grantRuntimeRole()` (schema/migrate.ts) | migrators and granters of one schema |
 *
 * Lane ids come from a serial (> 0), so they never meet the negative constants.
 *
 * One single-key lock: `hashtextextended(queueLockKey(schema) || queue, 0)`, transaction-level,
 * taken by `set_queue_paused()` and `provision_lane()` (migration 5), so a lane opened while its
 * queue is being paused cannot come out unpaused.
 */

/** Stable 32-bit key for advisory locks namespaced by schema (the first key of every two-key lock). */
export function schemaLockKey(schema: string): number {
  // FNV-1a, folded into int4 range; stable across processes and versions.
  let h = 0x811c9dc5;
  for (const ch of Buffer.from(schema, 'utf8')) {
    h ^= ch;
    h = Math.imul(h, 0x01000193);
  }
  return h | 0;
}

/** The second key whose session holder is the maintenance leader. */
export const LEADER_LOCK = -1;

/** The second key that serialises migrators (and granters) of one schema. */
export const MIGRATE_LOCK = -2;

/**
 * The prefix of a queue's lock text (hashed with the queue name by the SQL functions that pause
 * queues and provision lanes). Part of migration 5's text: changing it needs a new migration.
 */
export function queueLockKey(schema: string): string {
  return `${schema}:queue:`;
}

/**
 * application_name of the leader's session (PostgreSQL truncates it to 63 bytes). The statement
 * that wins LEADER_LOCK sets it, so only the lock holder carries it; `leaderInfo` matches a
 * `workers` row to the holder by it.
 */
export function leaderApplicationName(workerId: string): string {
  return sessionName('leader', workerId);
}

/** application_name of a follower's election session: never mistaken for the leader's. */
export function followerApplicationName(workerId: string): string {
  return sessionName('follower', workerId);
}
