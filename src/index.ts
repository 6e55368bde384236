export { migrate, assertMigrated, SchemaNotMigratedError, SchemaTooNewError, MigrationChangedError, LATEST_SCHEMA_VERSION, type MigrateOptions, type MigrationReport } from './schema/migrate.js';
export { enqueue, enqueueMany, DEFAULT_QUEUE, DEFAULT_SHARDS, type EnqueueOptions, type EnqueueResult, type TaskSpec, type TaskTypeRef } from './producer/enqueue.js';
export {
  defineTask,
  backoffDelayMs,
  DEFAULT_BACKOFF,
  DEFAULT_MAX_ATTEMPTS,
  type TaskDefinition,
  type TaskDefinitionInput,
  type TaskContext,
  type TaskHandler,
  type HandlerResult,
  type BackoffPolicy,
  type Lane,
  type StandardSchemaLike,
} from './task.js';
export { Worker, WORKER_DEFAULTS, type WorkerOptions } from './processor/worker.js';
export { runSlices, SliceLeaseLostError, DEFAULT_SLICE_MS, type SliceOptions, type SlicePage } from './processor/slices.js';
export { dequeue } from './storage/complete.js';
export { removeUnleased } from './storage/remove.js';
export { getTask, type TaskRecord, type TaskState } from './storage/tasks.js';
export { moveTask, type MoveResult } from './storage/move.js';
export { promoteDueLanes, promoteDueLane, promoteDue, type LaneKey, type PromoteOutcome } from './maintenance/promote.js';
export { rescueLapsedLeases, type RescueOutcome } from './storage/rescue.js';
export { maintainRing, pruneSlot, rotateRing, readRingState } from './maintenance/ring.js';
export { pruneDeadLetters } from './maintenance/retention.js';
export { readGauges, type GaugeSnapshot } from './maintenance/gauges.js';
export { Maintenance, MAINTENANCE_DEFAULTS, type MaintenanceOptions } from './maintenance/leader.js';
export { BerthMetrics, OUTCOMES, CounterMetric, HistogramMetric, GaugeMetric, type Outcome, type BerthMetricsOptions } from './metrics.js';
export { metricsRequestHandler, startMetricsServer, type MetricsRequestHandler, type MetricsServerOptions, type MetricsServer } from './observability/metrics-http.js';
export { BerthInputError, LeaseLostError, PermanentError, isPermanentError } from './errors.js';
export { DEFAULT_SCHEMA, type Queryable } from './sql.js';
export { createLogger, type Logger } from './logger.js';
export { grantRuntimeRole, type GrantRuntimeRoleOptions, type ConnectionOptions } from './schema/migrate.js';
export { runtimeGrantStatements, type RoleKind } from './schema/roles.js';
export {
  listLaneSequenceProblems,
  repairLaneSequences,
  type LaneSequenceProblem,
  type LaneSequenceProblemKind,
  type LaneSequenceFix,
  type LaneSequenceRepairReport,
} from './storage/lane-sequences.js';
export { listTasks, taskTimeline, retryTask, cancelTask, deleteTask, parseState, TASK_STATES, type TaskFilter, type TaskPage, type TaskSummary, type TaskList, type TimelineEvent, type TaskActionResult } from './admin/tasks.js';
export { listDead, countDead, retryDead, retryDeadLetters, purgeDead, type DeadFilter, type DeadLetter, type BulkProgress, type BulkResult } from './admin/dead.js';
export { listQueues, pauseQueue, resumeQueue, type QueueInfo } from './admin/queues.js';
export { laneStats, laneActivity, taskCounts, throughput, listWorkers, leaderInfo, CachedReader, DUE_COUNT_CAP, type LaneStat, type TaskCount, type ThroughputPoint, type WorkerInfo, type BranchRecord, type LeaderInfo } from './admin/stats.js';
export { audited, listAudit, type Actor, type AuditEntry } from './admin/audit.js';
export { DEFAULT_HEARTBEAT_MS } from './storage/live-workers.js';
export { DEFAULT_STUCK_GRACE_MS, STUCK_EXIT_CODE } from './processor/stuck.js';
export { overdueMarks, type OverdueMark } from './storage/overdue.js';
export {
  startDashboard,
  createDashboardHandler,
  dashboardOptionsFromEnv,
  DEFAULT_DASHBOARD_HOST,
  DEFAULT_DASHBOARD_PORT,
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
