/**
 * `berth-queue/testing`: helpers for an application's own tests (docs/testing.md). Kept off the
 * package root so production code does not reach for them by accident.
 */
export {
  runDueTasks,
  DEFAULT_MAX_RUNS,
  type RunDueTasksOptions,
  type TaskRunReport,
  type TaskRunStatus,
} from './process/run-due.js';
export { enqueuedIn, type EnqueuedTask } from './storage/enqueued.js';
