/**
 * The graph the dependency chaos test (test/deps-chaos.test.ts) enqueues and its worker fixture
 * (test/fixtures/deps-chaos-worker.ts) runs: one task type in three roles. Here, not in the
 * fixture, so the test can import it without running a worker.
 */

/** The one task type of the graph (its payload says the role). */
export const DEPS_CHAOS_TASK = 'deps_chaos_step';

export interface DepsChaosPayload {
  role: 'root' | 'child' | 'join';
  /** A child's number (0 for the root and the join): what the child returns, as `{ n }`. */
  n: number;
  /** How long the run works. */
  ms: number;
}
