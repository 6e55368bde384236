/**
 * The JSON the dashboard's API answers, as this client reads it (src/dashboard/reads.ts and
 * actions.ts build it). Times travel as ISO strings and bigints as text. Only what the pages
 * read is declared: the server's own types cannot be imported here, since they pull in Node.
 */

export type TaskState = 'ready' | 'running' | 'scheduled' | 'retryable' | 'dead' | 'completed';

interface Totals {
  /** Every unfinished task, running ones included (seed 000's definition, as the gauge). */
  pending: number;
  /** Pending minus running: what no worker holds yet. */
  waiting: number;
  running: number;
  dead: number;
}

export interface MinutePoint {
  minute: string;
  completed: number;
  failed: number;
  other: number;
}

export interface Overview {
  counts: { ageMs: number; total: Totals; byType: (Totals & { type: string })[] };
  queues: (Totals & { queue: string; depth: number; oldestDueSeconds: number; paused: boolean })[];
  oldestDue: { seconds: number; queue: string | null };
  workers: { alive: number; total: number; slots: number; busy: number };
  leader: { workerId: string | null; pid: number; applicationName: string; since: string } | null;
  throughput: MinutePoint[];
}

export interface LaneKey {
  queue: string;
  priority: number;
  shard: number;
}

export interface Contention {
  handedOff: number;
  waiterLimit: number;
  waiterTimedOut: number;
  failed: number;
  lastOutcome: string;
  lastAt: string;
}

export interface Lanes {
  activityAgeMs: number;
  waitingLanes: LaneKey[];
  lanes: (LaneKey & {
    paused: boolean;
    depth: number;
    dueDeferred: number;
    oldestDueSeconds: number;
    running: number;
    dead: number;
    contention: Contention | null;
    waiting: boolean;
  })[];
}

/** A running task whose handler overran its deadline (see src/storage/overdue.ts). */
export interface OverdueMark {
  worker: string;
  attempt: number;
  since: string;
  stuck: boolean;
  protected: boolean;
}

export interface TaskSummary {
  id: string;
  type: string;
  state: TaskState;
  queue: string;
  priority: number;
  attempts: number;
  maxAttempts: number | null;
  lastError: string | null;
  createdAt: string;
  runAt: string | null;
  finishedAt: string | null;
  overdue?: OverdueMark;
}

export interface TaskList {
  tasks: TaskSummary[];
  next: string | null;
}

export interface TaskDetail {
  task: {
    id: string;
    type: string;
    state: TaskState;
    payload: unknown;
    queue: string;
    priority: number;
    shard: number;
    attempts: number;
    maxAttempts: number | null;
    dedupeKey: string | null;
    lastError: string | null;
    createdAt: string;
    runAt: string | null;
    lease: { expiresAt: string; worker: string | null; attempt: number; overdue: OverdueMark | null } | null;
    /** `history`: the task has left the queue; read from attempt history (no payload kept). */
    source: 'queue' | 'history';
  };
  attempts: Attempt[];
  timeline: { at: string; event: string; detail: unknown }[];
}

/** What a handler threw, bounded (src/util/error-detail.ts). */
export interface ErrorDetail {
  message: string;
  name?: string;
  stack?: string;
  data?: string;
  cause?: ErrorDetail;
}

/** One attempt in attempt history (src/storage/history.ts `AttemptRecord`). */
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
  durationMs: number;
  runMs: number | null;
  createdAt: string;
  error: ErrorDetail | null;
  cursor: unknown;
  dead: boolean;
}

export interface AttemptList {
  attempts: Attempt[];
  next: string | null;
}

export interface DeadLetters {
  deadLetters: {
    id: string;
    type: string;
    queue: string;
    attempts: number;
    lastError: string | null;
    diedAt: string;
  }[];
  next: string | null;
}

export interface Queues {
  queues: {
    queue: string;
    lanes: number;
    paused: boolean;
    pausedAt: string | null;
    pausedBy: string | null;
    reason: string | null;
  }[];
}

export interface Branch {
  runs: number;
  failures: number;
  overruns: number;
  lastMs: number;
  maxMs: number;
  lastRunAt: string | null;
}

export interface WorkerRow {
  workerId: string;
  host: string;
  pid: number;
  queues: string[] | null;
  slots: number;
  busy: number;
  prefetched: number;
  leader: boolean;
  startedAt: string;
  lastSeenAt: string;
  alive: boolean;
  maintenance: { branches?: Record<string, Branch>; waitingLanes?: LaneKey[] };
  invalid: string | null;
}

export interface Maintenance {
  leader: {
    session: { pid: number; applicationName: string; clientAddr: string | null; since: string } | null;
    worker: WorkerRow | null;
  };
  workers: (WorkerRow & { heartbeatAgeSeconds: number })[];
  audit: { at: string; actor: string; action: string; target: unknown; result: unknown }[];
}

/** A bulk retry or cancel of selected tasks: each id's result, and whether it changed the task. */
export interface BulkTaskAnswer {
  requested: number;
  changed: number;
  unchanged: number;
  byResult: Record<string, number>;
  results: { id: string; result: string; changed: boolean }[];
}

/** What an action answers: a task action's result, a bulk dead-letter count, or a queue's lanes. */
export type ActionAnswer =
  | { result: string }
  | BulkTaskAnswer
  | { matched: number; changed: number; duplicates: number }
  | { lanes: number };
