/**
 * The JSON the dashboard's API answers, in one place for both ends: the server's routes
 * (reads.ts, overview.ts, actions.ts, api.ts) are typed to return these shapes, so a server
 * change that breaks one fails typecheck, and the browser client (client/) reads its answers as
 * them. Times travel as ISO strings and bigints as text (sendJson in http.ts; `Json<T>` there is
 * what it makes of a server type).
 *
 * Types only, and no imports: the client is type-checked for the browser (tsconfig.client.json:
 * DOM, no Node) and bundled by esbuild, which erases its `import type` of this module, so
 * nothing here may need Node or exist at run time.
 */

// ---------------------------------------------------------------------------------------------
// Shared pieces

export type TaskState =
  | 'ready'
  | 'running'
  | 'scheduled'
  | 'retryable'
  | 'held'
  | 'waiting'
  | 'dead'
  | 'completed'
  | 'cancelled';

/** A lane: the unit of order and of the claim's row lock (src/lane.ts). */
export interface LaneKey {
  queue: string;
  priority: number;
  shard: number;
}

/** What a handler threw, bounded (src/util/error-detail.ts). */
export interface ErrorDetail {
  message: string;
  name?: string;
  stack?: string;
  /** Own enumerable properties of the error other than the above (`code`, `status`, ...), as JSON. */
  data?: string;
  cause?: ErrorDetail;
}

/** A running task whose handler overran its deadline (see src/storage/overdue.ts). */
export interface OverdueMark {
  worker: string;
  attempt: number;
  /** When its holder reported it past its deadline. */
  since: string;
  /** Past deadline + grace: reported stuck. */
  stuck: boolean;
  /** The holder refreshed it recently, so rescue leaves the lease alone. */
  protected: boolean;
}

/** Any answer that is not 2xx: a message safe to show. */
export interface ErrorAnswer {
  error: string;
}

// ---------------------------------------------------------------------------------------------
// GET /api/session

/** Who the page acts as, its CSRF token, and whether it may act. */
export interface Session {
  actor: string;
  csrf: string;
  readOnly: boolean;
}

// ---------------------------------------------------------------------------------------------
// GET /api/overview (overview.ts)

/**
 * Counts as the pages show them. `pending` keeps seed 000's definition (every unfinished task,
 * running ones included, as berth_tasks_pending counts them); `waiting` is pending minus running,
 * so the overview can show waiting beside running without one task being read twice.
 */
export interface Totals {
  pending: number;
  waiting: number;
  running: number;
  dead: number;
}

/** Counts of one queue and task type (src/admin/stats.ts `TaskCount`). */
export interface TaskCount {
  queue: string;
  type: string;
  /** Unfinished: ready, scheduled, retryable or running (running is a subset, as in the gauge). */
  pending: number;
  running: number;
  dead: number;
}

/** Tasks waiting on the tasks they depend on, and those of them blocked by a dead parent. */
export interface DependencyCounts {
  waiting: number;
  blocked: number;
}

export interface QueueOverview extends Totals {
  queue: string;
  /** Of its pending tasks, those waiting on their parents (state `waiting`), and the blocked ones. */
  dependencies: DependencyCounts;
  /** Entries past the claim cursors of the queue's lanes (an estimate), plus due deferred rows. */
  depth: number;
  oldestDueSeconds: number;
  paused: boolean;
}

export interface MinutePoint {
  minute: string;
  /** Handler runs that ended `success`. */
  completed: number;
  /** `failure`, `timeout` and `lost`. */
  failed: number;
  /** `continued` and `cancelled`. */
  other: number;
}

export interface Overview {
  counts: { ageMs: number; total: Totals; byQueueType: TaskCount[]; byType: (Totals & { type: string })[] };
  queues: QueueOverview[];
  /** Every queue's tasks waiting on their parents, and the blocked ones (cached like `counts`). */
  dependencies: DependencyCounts;
  /** The oldest claimable due work: paused queues left out. */
  oldestDue: { seconds: number; queue: string | null };
  workers: { alive: number; total: number; slots: number; busy: number };
  leader: { workerId: string | null; pid: number; applicationName: string; since: string } | null;
  throughput: MinutePoint[];
}

// ---------------------------------------------------------------------------------------------
// GET /api/lanes

/** A lane's promotion contention as the leader reports it, in the page's words. */
export interface Contention {
  handedOff: number;
  waiterLimit: number;
  waiterTimedOut: number;
  failed: number;
  lastOutcome: string;
  lastAt: string;
}

export interface LaneRow extends LaneKey {
  laneId: number;
  paused: boolean;
  /** Entries appended past the lane's claim cursor, less the removed (tombstoned) ones. */
  depth: number;
  /** Due deferred rows waiting for promotion, counted up to DUE_COUNT_CAP (src/admin/stats.ts). */
  dueDeferred: number;
  /** How long the lane's oldest claimable work has been due; 0 when it has none. */
  oldestDueSeconds: number;
  running: number;
  dead: number;
  contention: Contention | null;
  /** A promotion waiter waits on the lane (the leader's report). */
  waiting: boolean;
}

export interface Lanes {
  /** Age of the lane stats (index probes) and of the running and dead counts (cached). */
  ageMs: number;
  activityAgeMs: number;
  /** The leader's worker id, whose heartbeat reported the waiters and contention. */
  leader: string | null;
  waitingLanes: LaneKey[];
  lanes: LaneRow[];
}

// ---------------------------------------------------------------------------------------------
// GET /api/tasks, /api/tasks/:id

export interface TaskSummary {
  id: string;
  type: string;
  state: TaskState;
  queue: string;
  priority: number;
  attempts: number;
  maxAttempts: number | null;
  /** First 300 characters of the last error. */
  lastError: string | null;
  createdAt: string;
  /** When it is (or was) due; null for dead letters. */
  runAt: string | null;
  /** Completion, death or cancel time, when it has one. */
  finishedAt: string | null;
  leaseExpiresAt: string | null;
  worker: string | null;
  /** State `cancelled` only: who cancelled it (null when the cancel named nobody). */
  cancelledBy?: string | null;
  /** Only on a running task whose handler overran its deadline. */
  overdue?: OverdueMark;
}

export interface TaskList {
  tasks: TaskSummary[];
  /** The `after` of the next page; null when this was the last page. */
  next: string | null;
}

/**
 * One attempt in attempt history (src/storage/history.ts `AttemptRecord`). Rows are read
 * defensively: what was wrong with one is named in `invalid`, so `outcome` is whatever the row
 * holds (berth writes success, failure, timeout, continued, cancelled, lost, snoozed).
 */
export interface Attempt {
  id: string;
  attempt: number;
  outcome: string;
  type: string;
  queue: string;
  priority: number;
  shard: number;
  worker: string | null;
  claimedAt: string;
  settledAt: string;
  /** From the claim to the settlement. */
  durationMs: number;
  /** The handler's own run time; null when it did not run (or the attempt was not settled by its worker). */
  runMs: number | null;
  createdAt: string;
  error: ErrorDetail | null;
  /** The payload AdvanceCursor saved, for a `continued` attempt that advanced. */
  cursor: unknown;
  /** The attempt retired the task to the dead letters. */
  dead: boolean;
  invalid?: string[];
}

export interface TimelineEvent {
  at: string;
  event: 'created' | 'appended' | 'claimed' | 'settled' | 'attempt' | 'removed' | 'scheduled' | 'dead';
  detail: Record<string, unknown>;
}

/**
 * Where a parent or dependent stands: a task state, or `deleted` (removed before it ran) or
 * `unknown` (never enqueued, or gone longer than attempt history keeps).
 */
export type LinkState = TaskState | 'deleted' | 'unknown';

/** A task's dependencies (src/storage/dependency-view.ts `TaskDependencies`). */
export interface TaskDependencies {
  /** At most 20: the ones not yet counted first, then by id. */
  parents: {
    id: string;
    type: string;
    state: LinkState;
    /** When its completion was counted for this task; null: not yet. */
    satisfiedAt: string | null;
  }[];
  parentsTotal: number;
  /** The first 20 by id. */
  dependents: {
    id: string;
    state: LinkState;
    /** Still waiting on at least one of its parents. */
    waiting: boolean;
    /** What it does if a parent dies while it waits; null once it no longer waits. */
    onParentFailure: 'cancel' | 'wait' | null;
    /** When this task's completion was counted for it; null: not yet. */
    satisfiedAt: string | null;
  }[];
  dependentsTotal: number;
  /** While the task is `waiting`: how many parents it still waits for, of how many, how many are dead. */
  waitingOn: {
    pending: number;
    total: number;
    dead: number;
    onParentFailure: 'cancel' | 'wait';
    /** Its own run time once released; null: at once. */
    runAt: string | null;
  } | null;
}

export interface TaskDetail {
  task: LaneKey & {
    id: string;
    type: string;
    state: TaskState;
    payload: unknown;
    attempts: number;
    maxAttempts: number | null;
    dedupeKey: string | null;
    lastError: string | null;
    createdAt: string;
    runAt: string | null;
    /** The lease without its token (the fence a holder settles with is never shown). */
    lease: { expiresAt: string; worker: string | null; attempt: number; overdue: OverdueMark | null } | null;
    /** `history`: the task has left the queue; read from attempt history (no payload kept). */
    source: 'queue' | 'history';
    /** When it completed, died or was cancelled, when that is known. */
    finishedAt?: string;
    /** What the handler of its completed attempt returned (JSON); null when it stored none. */
    result: unknown;
    /** State `cancelled` only: who cancelled it (null when the cancel named nobody) and when. */
    cancelled?: { actor: string | null; at: string };
    /** Its parents and dependents, and what it waits for; null: no dependencies either way. */
    dependencies: TaskDependencies | null;
  };
  attempts: Attempt[];
  timeline: TimelineEvent[];
}

// ---------------------------------------------------------------------------------------------
// GET /api/attempts

export interface AttemptList {
  attempts: Attempt[];
  next: string | null;
}

// ---------------------------------------------------------------------------------------------
// GET /api/dead, /api/dead/count

export interface DeadLetter {
  id: string;
  type: string;
  queue: string;
  priority: number;
  attempts: number;
  lastError: string | null;
  payload: unknown;
  createdAt: string;
  diedAt: string;
}

export interface DeadLetters {
  deadLetters: DeadLetter[];
  next: string | null;
}

/** How many dead letters a filter matches: what a bulk action on it would touch. */
export interface DeadCount {
  count: number;
}

// ---------------------------------------------------------------------------------------------
// GET /api/queues

export interface QueueRow {
  queue: string;
  lanes: number;
  paused: boolean;
  pausedAt: string | null;
  pausedBy: string | null;
  reason: string | null;
}

/** A queue's limits and how full they are (src/storage/limits.ts, QueueLimitStatus). */
export interface LimitRow {
  queue: string;
  maxRunning: number | null;
  /** Tasks of the queue running now, as the limit counts them. */
  running: number;
  rateLimit: number | null;
  rateIntervalMs: number | null;
  /** The rate limit as it is written (`20/1s`), or null. */
  rate: string | null;
  /** Starts within the current rate interval. */
  started: number;
  /** At a limit now: running at its max, or the interval's starts used up. */
  atLimit: boolean;
  /** Due tasks waiting while the queue is at a limit (0 below its limits). */
  heldTasks: number;
  updatedAt: string;
  updatedBy: string;
}

/** A task type's rate limit and how full it is (src/storage/type-limits.ts, TypeLimitUsage). */
export interface TypeLimitRow {
  type: string;
  rateLimit: number;
  rateIntervalMs: number;
  /** The rate limit as it is written (`20/1s`). */
  rate: string;
  /** Starts within the window a start is counted over (the interval plus its guard). */
  started: number;
  /** Starts refused since the limit was set (each a task handed back unstarted). */
  refused: number;
  /** Tasks the limit refused and handed back that are not due again yet. */
  paced: number;
  /** The window is full: the next task of the type to start is handed back. */
  atLimit: boolean;
  updatedAt: string;
  updatedBy: string;
}

/** A key limit (src/storage/keys.ts, KeyLimitRow): at most perKey tasks per key, for a queue or a type. */
export interface KeyLimitWire {
  scope: 'queue' | 'type';
  name: string;
  perKey: number;
  updatedAt: string;
  updatedBy: string;
}

/** A key with tasks held for it (src/storage/keys.ts, HeldKey). */
export interface HeldKeyWire {
  key: string;
  /** Tasks held, waiting for the key. */
  held: number;
  /** Tasks of the key admitted and not yet settled. */
  running: number;
  /** When the key's wait began. */
  since: string;
}

export interface Queues {
  queues: QueueRow[];
  limits: LimitRow[];
  /** Every task type rate limit. */
  typeLimits: TypeLimitRow[];
  /** Every key limit set. */
  keyLimits: KeyLimitWire[];
  /** The keys with held tasks, the longest waiting first, at most 100. */
  heldKeys: HeldKeyWire[];
}

// ---------------------------------------------------------------------------------------------
// GET /api/schedules

/** One schedule as `berth schedules list` shows it (src/admin/schedules.ts, ScheduleInfo). */
export interface ScheduleRow {
  name: string;
  cron: string;
  timeZone: string;
  taskType: string;
  queue: string;
  misfire: string;
  /** The handler's ceiling for its tasks in ms; null: the task type's. */
  ceilingMs: number | null;
  nextFireAt: string | null;
  lastInstant: string | null;
  lastFiredAt: string | null;
  lastTaskId: string | null;
  lastTaskState: string | null;
  stale: boolean;
  staleSince: string | null;
  paused: boolean;
  pausedAt: string | null;
  pausedBy: string | null;
}

export interface Schedules {
  schedules: ScheduleRow[];
}

// ---------------------------------------------------------------------------------------------
// GET /api/maintenance

/** One maintenance branch's statistics in the leader's heartbeat (src/admin/worker-report.ts). */
export interface Branch {
  runs: number;
  failures: number;
  overruns: number;
  lastMs: number;
  maxMs: number;
  lastRunAt: string | null;
}

/** A lane's contention as the leader's heartbeat carries it (the lanes page renames the counts). */
export interface ContentionReport extends LaneKey {
  handed_off: number;
  waiter_limit: number;
  waiter_timed_out: number;
  failed: number;
  lastOutcome: string;
  lastAt: string;
}

/** The valid parts of a worker's maintenance report; a malformed part is left out (see `invalid`). */
export interface MaintenanceReport {
  branches?: Record<string, Branch>;
  waitingLanes?: LaneKey[];
  contention?: ContentionReport[];
}

export interface WorkerRow {
  workerId: string;
  host: string;
  pid: number;
  queues: string[] | null;
  slots: number;
  busy: number;
  prefetched: number;
  /** It says it leads, and it is the session holding the leader lock: never the row's word alone. */
  leader: boolean;
  startedAt: string;
  lastSeenAt: string;
  alive: boolean;
  maintenance: MaintenanceReport;
  /** What is wrong with the row (forged or corrupt: a future heartbeat, a malformed report), or null. */
  invalid: string | null;
}

export interface AuditEntry {
  id: string;
  at: string;
  actor: string;
  action: string;
  target: unknown;
  result: unknown;
}

export interface Maintenance {
  leader: {
    /** Who holds the leader lock now (from pg_locks), or null when nobody leads. */
    session: { pid: number; applicationName: string; clientAddr: string | null; since: string } | null;
    /** The leader's worker row, when its heartbeat is fresh. */
    worker: WorkerRow | null;
  };
  workers: (WorkerRow & { heartbeatAgeSeconds: number })[];
  audit: AuditEntry[];
}

// ---------------------------------------------------------------------------------------------
// POST actions (actions.ts)

/** What a one-task action did (src/admin/tasks.ts `TaskActionResult`). */
export type TaskActionResult =
  | 'retried'
  | 'removed'
  | 'cancelled'
  | 'already_settled'
  | 'running'
  | 'not_retryable'
  | 'waiting_on_parents'
  | 'duplicate'
  | 'not_found';

/** POST /api/tasks/:id/(retry|cancel|delete). */
export interface TaskActionAnswer {
  result: TaskActionResult;
}

/** POST /api/tasks/:id/move (src/storage/move.ts `MoveResult`). */
export interface MoveAnswer {
  result: 'moved' | 'leased' | 'not_found';
}

/** POST /api/tasks/bulk/(retry|cancel): each id's result, and whether it changed the task. */
export interface BulkTaskAnswer {
  /** Distinct ids asked for. */
  requested: number;
  changed: number;
  unchanged: number;
  /** How many ended in each result (`retried`, `removed`, `running`, `not_found`, …). */
  byResult: Partial<Record<TaskActionResult, number>>;
  /** Each id's result, in the order asked, and whether it changed the task. */
  results: { id: string; result: TaskActionResult; changed: boolean }[];
}

/** POST /api/dead/(retry|purge). */
export interface DeadActionAnswer {
  matched: number;
  /** Retried, or purged. */
  changed: number;
  /** Dead letters left alone because a live task holds their dedupe key (retry only). */
  duplicates: number;
}

/** POST /api/queues/:queue/(pause|resume): the lanes changed. */
export interface QueueActionAnswer {
  lanes: number;
}

/** POST /api/queues/:queue/limits: the limits now in force (null: none left). */
export interface LimitSetAnswer {
  queue: string;
  limit: { maxRunning: number | null; rate: string | null } | null;
}

/** POST /api/queues/:queue/limits/clear: whether the queue had a limit. */
export interface LimitClearAnswer {
  queue: string;
  cleared: boolean;
}

/** POST /api/types/:type/limits: the rate limit now in force (as `20/1s`). */
export interface TypeLimitSetAnswer {
  type: string;
  limit: { rate: string };
}

/** POST /api/types/:type/limits/clear: whether the type had a rate limit. */
export interface TypeLimitClearAnswer {
  type: string;
  cleared: boolean;
}

/** POST /api/keys/limits: the key limit now in force. */
export interface KeyLimitSetAnswer {
  keyLimit: { scope: 'queue' | 'type'; name: string; perKey: number } | null;
}

/** POST /api/keys/limits/clear: whether there was a key limit to clear. */
export interface KeyLimitClearAnswer {
  keyLimitCleared: boolean;
}

/** POST /api/schedules/:name/(pause|resume|trigger). */
export interface ScheduleActionAnswer {
  name: string;
  /** pause, resume: whether the mark changed. */
  changed?: boolean;
  /** trigger: the task enqueued. */
  taskId?: string;
}

/** What an action answers: a task action's result, a bulk count, a queue's lanes or limits, a schedule's. */
export type ActionAnswer =
  | TaskActionAnswer
  | MoveAnswer
  | BulkTaskAnswer
  | DeadActionAnswer
  | QueueActionAnswer
  | LimitSetAnswer
  | LimitClearAnswer
  | TypeLimitSetAnswer
  | TypeLimitClearAnswer
  | KeyLimitSetAnswer
  | KeyLimitClearAnswer
  | ScheduleActionAnswer;
