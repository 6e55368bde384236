/**
 * berth's public API (`berth-queue`): what an application needs to enqueue, define and run
 * tasks, operate the queue, watch it, and handle its errors. The maintenance leader's
 * primitives (promotion, rescue, ring rotation and prune, retention, gauges) are not here: they
 * are `berth-queue/maintenance` (src/maintenance-api.ts); the helpers for an application's own
 * tests are `berth-queue/testing` (src/testing-api.ts). docs/api.md lists all three.
 */

// Schema and roles
export {
  migrate,
  assertMigrated,
  grantRuntimeRole,
  LATEST_SCHEMA_VERSION,
  type MigrateOptions,
  type MigrationReport,
  type GrantRuntimeRoleOptions,
  type ConnectionOptions,
} from './schema/migrate.js';
export { runtimeGrantStatements, type RoleKind } from './schema/roles.js';
export {
  listLaneSequenceProblems,
  repairLaneSequences,
  type LaneSequenceProblem,
  type LaneSequenceProblemKind,
  type LaneSequenceFix,
  type LaneSequenceRepairReport,
} from './storage/lane-sequences.js';
export { DEFAULT_SCHEMA, type Queryable } from './sql.js';
export { withoutPreparedStatements } from './db/prepared.js';

// Producer
export {
  enqueue,
  enqueueMany,
  DEFAULT_QUEUE,
  DEFAULT_SHARDS,
  ENQUEUE_DEFAULTS,
  type EnqueueOptions,
  type EnqueueManyOptions,
  type EnqueueResult,
  type EnqueuedResult,
  type DuplicateResult,
  type TaskSpec,
  type TaskTypeRef,
  type CheckedTaskSpec,
  type CheckedTaskSpecs,
} from './producer/enqueue.js';
export { enqueueSql, type SqlCall, type SqlEnqueueOptions } from './producer/enqueue-sql.js';
export {
  defineTaskType,
  implement,
  type TaskRegistry,
  type TaskTypeName,
  type TaskPayload,
  type PayloadOf,
  type TaskType,
  type TaskTypeInput,
  type TaskTypeLike,
  type TaskImplementation,
} from './task-type.js';
export type { Lane } from './lane.js';

// Task definitions and handlers
export {
  defineTask,
  backoffDelayMs,
  DEFAULT_BACKOFF,
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_MAX_SNOOZES,
  snooze,
  isSnooze,
  type Snooze,
  type TaskDefinition,
  type TaskDefinitionInput,
  type TaskDefinitionFields,
  type TaskContext,
  type TaskHandler,
  type HandlerResult,
  type BackoffPolicy,
  type StandardSchemaLike,
  type ScheduleFire,
} from './task.js';
export {
  defineSchedule,
  SCHEDULE_DEFAULTS,
  MISFIRE_POLICIES,
  type MisfirePolicy,
  type ScheduleDefinition,
  type ScheduleFields,
  type ScheduleInput,
  type NamedScheduleInput,
} from './schedule.js';
export { runSlices, DEFAULT_SLICE_MS, type SliceOptions, type SlicePage } from './processor/slices.js';
export { dequeue } from './storage/complete.js';

// Worker
export {
  Worker,
  WORKER_DEFAULTS,
  type WorkerOptions,
  type StopOptions,
  type StopOnSignalsOptions,
} from './process/worker.js';
export { UNKNOWN_TYPE_DEFAULTS, type UnknownTypeOptions } from './processor/unknown-types.js';
export {
  WorkerEvents,
  type WorkerEventMap,
  type WorkerEventName,
  type WorkerEventListener,
  type TaskEventTask,
  type TaskEventError,
  type TaskStartedEvent,
  type TaskSettledEvent,
  type WorkerStartedEvent,
  type WorkerStoppedEvent,
  type LeaderEvent,
} from './processor/task-events.js';
export { MAINTENANCE_DEFAULTS, type MaintenanceOptions } from './maintenance/leader.js';
export { DEFAULT_HEARTBEAT_MS } from './storage/live-workers.js';
export { DEFAULT_STUCK_GRACE_MS, STUCK_EXIT_CODE } from './processor/stuck.js';
export { createLogger, type Logger } from './logger.js';
export {
  fromEnv,
  workerOptionsFromEnv,
  type BerthEnvironment,
  type Environment,
  type WorkerEnvOptions,
} from './process/env.js';

// Admin: reads and actions on tasks, dead letters, queues; stats; the audit log
export { getTask, type GetTaskOptions, type TaskRecord, type TaskState } from './storage/tasks.js';
export {
  DEPENDENCY_LIST_LIMIT,
  type TaskDependencies,
  type ParentLink,
  type DependentLink,
  type WaitingOn,
  type LinkState,
} from './storage/dependency-view.js';
export { dependencyStats, type DependencyUsageRow } from './admin/dependencies.js';
export { moveTask, type MoveResult } from './storage/move.js';
export {
  attemptsOf,
  listAttempts,
  readHistorySettings,
  setHistorySettings,
  parseOutcome,
  ATTEMPT_OUTCOMES,
  MIN_HISTORY_RETENTION_MS,
  type AttemptOutcome,
  type AttemptRecord,
  type AttemptFilter,
  type AttemptPage,
  type AttemptList,
  type HistorySettings,
} from './storage/history.js';
export type { ErrorDetail } from './util/error-detail.js';
export {
  listTasks,
  taskTimeline,
  retryTask,
  cancelTask,
  cancelTasks,
  deleteTask,
  parseState,
  TASK_STATES,
  type TaskFilter,
  type TaskPage,
  type TaskSummary,
  type TaskList,
  type TimelineEvent,
  type TaskActionResult,
  type CancelOptions,
  type CancelFilter,
  type BulkCancelResult,
} from './admin/tasks.js';
export {
  listDead,
  countDead,
  retryDead,
  retryDeadLetters,
  purgeDead,
  type DeadFilter,
  type DeadLetter,
  type BulkProgress,
  type BulkResult,
} from './admin/dead.js';
export { listQueues, pauseQueue, resumeQueue, type QueueInfo } from './admin/queues.js';
export {
  clearQueueLimit,
  listHeldKeys,
  listKeyLimits,
  listQueueLimits,
  setKeyLimit,
  setQueueLimit,
  type HeldKey,
  type KeyLimitRow,
  type KeyLimitTarget,
  type QueueLimitChange,
  type QueueLimitStatus,
  type QueueLimitUsage,
  type RateLimit,
} from './admin/limits.js';
export {
  setTypeLimit,
  clearTypeLimit,
  listTypeLimits,
  setTypeLimitAudited,
  clearTypeLimitAudited,
  type TypeLimitUsage,
} from './admin/type-limits.js';
export {
  listSchedules,
  getSchedule,
  setSchedulePaused,
  triggerSchedule,
  type ScheduleInfo,
} from './admin/schedules.js';
export {
  laneStats,
  laneActivity,
  taskCounts,
  throughput,
  listWorkers,
  leaderInfo,
  DUE_COUNT_CAP,
  type LaneStat,
  type TaskCount,
  type ThroughputPoint,
  type WorkerInfo,
  type BranchRecord,
  type LeaderInfo,
} from './admin/stats.js';
export { audited, listAudit, type Actor, type AuditEntry } from './admin/audit.js';

// Dashboard
export {
  startDashboard,
  createDashboardHandler,
  dashboardOptionsFromEnv,
  DEFAULT_DASHBOARD_HOST,
  DEFAULT_DASHBOARD_PORT,
  DASHBOARD_DEFAULTS,
  MIN_TOKEN_LENGTH,
  MIN_PASSWORD_LENGTH,
  AUTH_LIMIT_DEFAULTS,
  type AuthLimitOptions,
  type DashboardServer,
  type DashboardHandler,
  type DashboardHandlerOptions,
  type DashboardAuth,
  type DashboardEnvOptions,
  type DashboardOptions,
  type WorkerHttpOptions,
  type WorkerDashboardOptions,
} from './dashboard/index.js';

// Metrics
export { BerthMetrics, OUTCOMES, type Outcome, type BerthMetricsOptions } from './metrics/catalogue.js';
export { CounterMetric, HistogramMetric, GaugeMetric } from './metrics/instruments.js';
export {
  metricsRequestHandler,
  startMetricsServer,
  type MetricsRequestHandler,
  type MetricsServerOptions,
  type MetricsServer,
} from './observability/metrics-http.js';

// Errors (docs/api.md has the table of codes)
export {
  BerthError,
  BerthInputError,
  LeaseLostError,
  PermanentError,
  isPermanentError,
  ShutdownAbort,
  DeadlineAbort,
  CancelAbort,
  type BerthErrorCode,
} from './errors.js';
export { SchemaNotMigratedError, SchemaTooNewError, MigrationChangedError } from './schema/migrate.js';
export { SliceLeaseLostError } from './processor/slices.js';
export { ConnectError, DEFAULT_CONNECT_TIMEOUT_MS } from './db/connections.js';
export { openPool, type OpenPoolOptions } from './db/pool.js';
