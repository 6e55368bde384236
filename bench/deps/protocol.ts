/**
 * What the driver (bench/deps.ts) and its worker process (bench/deps/worker.ts) say to each
 * other. A module of its own: importing worker.ts would run a worker in the importing process.
 */

/** What the driver sends. */
export type ToWorker = { kind: 'stats' } | { kind: 'stop' };

/** Counters the worker reports: berth's by name of the path; pg-boss reports none. */
export interface WorkerStats {
  kind: 'stats';
  leader: boolean;
  /** berth_dependency_releases_total by path. */
  releases: Record<string, number>;
  /** berth_promoted_total: entries the leader's promotion appended (a release whose lane was busy). */
  promoted: number;
}

export type FromWorker = { kind: 'ready' } | WorkerStats | { kind: 'stopped' } | { kind: 'error'; message: string };

/** The environment the driver passes. */
export interface WorkerEnv {
  DEPS_SYSTEM: 'berth' | 'pg-boss';
  DEPS_URL: string;
  DEPS_SCHEMA: string;
  DEPS_SLOTS: string;
  /** pg-boss: its flow resolver's interval (s), its workers' poll (s), and the queue. */
  DEPS_FLOW_INTERVAL_S: string;
  DEPS_POLL_S: string;
  DEPS_QUEUE: string;
}

/** pg-boss's batch size as the main bench's `pg-boss (batched)` row runs it (bench/systems/pgboss.ts). */
export const PGBOSS_BATCH_SIZE = 50;
