/** What bench/deps.ts asks of each system it measures (bench/deps/berth.ts, bench/deps/pgboss.ts). */
import type { TaskTiming } from './analysis.js';
import type { CallMode, Shape } from './shapes.js';

/** What an enqueue of one shape returned. */
export interface Enqueued {
  /** Task i's id. */
  ids: string[];
  /** Dependents whose parents had all completed when their call ran (no release needed). */
  readyAtEnqueue: Set<number>;
  calls: number;
  /** Wall clock of the enqueue call(s), ms. */
  wallMs: number;
  /** Database clock (ms since the epoch) just before the first call and just after the last. */
  startDbMs: number;
  doneDbMs: number;
}

/** `berth_dependency_releases_total` by path over one run, and the leader's promotions. */
export interface ReleaseCounts {
  /** Freed in the completing transaction of their last parent. */
  completion: number;
  /** Freed by the leader's `deps` branch (a watched parent). */
  leader: number;
  /** Entries the leader's promotion appended: a freed task whose lane's lock was busy at its release. */
  promoted: number;
}

/** berth: the timings read from attempt history against the ring's own rows, where they remain. */
export interface CrossCheck {
  /** Tasks of the run whose lease and settlement were still in the ring. */
  inRing: number;
  tasks: number;
  /** Of those, tasks whose start or completion time differed between the two. */
  differ: number;
}

export interface DepsSystem {
  readonly name: string;
  /** How the worker and the producer are configured, for the report. */
  readonly settings: string;
  /** Why a mode cannot be run, or null when it can. */
  unsupported(mode: CallMode): string | null;
  /** A fresh installation and a worker process that is ready (and leads maintenance, for berth). */
  prepare(): Promise<void>;
  /** Enqueue `n` plain tasks and wait until they are drained (unrecorded). */
  warmUp(n: number, timeoutMs: number): Promise<void>;
  enqueue(shape: Shape, mode: CallMode): Promise<Enqueued>;
  /** Tasks of the installation whose completion is not recorded yet. */
  pending(): Promise<number>;
  /** Each task's start and completion, by index, from the database. */
  timings(e: Enqueued): Promise<TaskTiming[]>;
  /** How the dependents were released (berth's counters over the run); null when the system has none. */
  releases(): Promise<ReleaseCounts | null>;
  /** A check of the timings against a second source; null when the system has none. */
  crossCheck(e: Enqueued, timings: readonly TaskTiming[]): Promise<CrossCheck | null>;
  /** Stop the worker process, drop the installation. */
  finish(): Promise<void>;
  /** Errors the worker reported during the run (pg-boss emits them), cleared by prepare. */
  errors(): string[];
  close(): Promise<void>;
}

/** Milliseconds since the epoch on the database clock, as a float8 column `ms`. */
export const DB_NOW_MS = 'SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS ms';
