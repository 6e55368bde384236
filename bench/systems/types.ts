/**
 * The one interface every queue system implements for the scenarios. Tasks are no-ops whose
 * payload is `{ i }`; the worker reports each handler start through `runs.record(i)`, and `pending`
 * reads from the database how many are not yet recorded as completed.
 */
import type pg from 'pg';

export interface Producer {
  /** Enqueue tasks `i = start .. start+count-1` in one bulk call. */
  bulk(start: number, count: number): Promise<void>;
  /** Enqueue one task with a single-task call. */
  single(i: number): Promise<void>;
  /**
   * The system's own schema migration (its check that the schema is current), run on the
   * producer's session as a service that migrates at start would; absent for a system whose
   * producer cannot be opened without it (pg-boss's `start()`).
   */
  migrate?(): Promise<void>;
  close(): Promise<void>;
}

/** Receives each handler start, by payload index; `record` is a method, not a closure per run. */
export interface RunRecorder {
  record(i: number): void;
}

export interface RunningWorker {
  /** Graceful stop; resolves once every connection the worker opened is closed. */
  stop(): Promise<void>;
}

export interface SystemAdapter {
  /** Row label in the report. */
  readonly label: string;
  /** What this row configures, for the report notes. */
  readonly settings: string;
  /** Drop and reinstall this system's schema so the scenario starts empty. */
  reset(): Promise<void>;
  openProducer(): Promise<Producer>;
  /** Its producer has a `migrate()` of its own (Producer.migrate). */
  readonly producerMigrates?: boolean;
  /** Start processing `noop` tasks with `concurrency` handlers; resolves once started. */
  startWorker(concurrency: number, runs: RunRecorder): Promise<RunningWorker>;
  /**
   * Tasks whose completion is not recorded in the database yet (queued, running, or finished
   * but with the completion still in the worker's memory). One read-only statement on `db`.
   */
  pending(db: pg.ClientBase): Promise<number>;
}

export interface AdapterContext {
  /** Connection string of the dedicated bench database. */
  connectionString: string;
}

export type AdapterFactory = (ctx: AdapterContext) => SystemAdapter;
