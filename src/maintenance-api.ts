/**
 * `berth-queue/maintenance`: what the elected maintenance leader runs, one primitive per branch,
 * each callable on its own (a test, a one-off script, a maintenance process of your own). A
 * Worker runs all of them for you (its `maintenance` option, on by default): most applications
 * never import this. The leader's branches are safe to run beside it; each is one statement or
 * one short transaction per lane or ring segment. docs/api.md says what each is for.
 */

/** The leader itself: election, the branch loops and their statistics, for a process that only maintains. */
export { Maintenance } from './maintenance/leader.js';
export type { LaneContention } from './maintenance/promoter.js';
export {
  promoteDueLanes,
  promoteDueLane,
  promoteDue,
  type DeferredState,
  type PromoteOutcome,
} from './maintenance/promote.js';
export { rescueLapsedLeases, type RescueOutcome } from './storage/rescue.js';
export {
  maintainRing,
  rotateRing,
  pruneSegment,
  readRingState,
  type RingState,
  type RotateResult,
  type PruneResult,
} from './maintenance/ring.js';
export { pruneDeadLetters, pruneOperatorHistory } from './maintenance/retention.js';
export { rotateHistory, type HistoryRotation } from './maintenance/history.js';
export { readGauges, type GaugeSnapshot } from './maintenance/gauges.js';
