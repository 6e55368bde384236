import { BerthInputError } from '../errors.js';
import type { Logger } from '../logger.js';
import type { Outcome } from '../metrics/catalogue.js';

/** The task an event is about: one attempt of it on this worker. */
export interface TaskEventTask {
  id: string;
  type: string;
  queue: string;
  priority: number;
  shard: number;
  /** This attempt's number (1 on the first run). */
  attempt: number;
  /** The attempt limit this attempt runs under. */
  maxAttempts: number;
}

/** What a failed attempt threw (or how it broke the contract). */
export interface TaskEventError {
  /** The message stored as the task's `last_error`. */
  message: string;
  /** The value the handler threw, as it was (an Error, or anything else thrown); null when no handler ran. */
  thrown: unknown;
}

/** `task:started`: the handler is about to run (its payload was checked). */
export interface TaskStartedEvent {
  workerId: string;
  task: TaskEventTask;
}

/**
 * Every settled attempt: `task:settled` always, and the event of its outcome (`task:completed`,
 * `task:failed`, `task:cancelled`, `task:continued`, `task:snoozed`, `task:lease_lost`,
 * `task:unsettled`), then
 * `task:retrying` or `task:dead` when the settlement scheduled a retry or dead-lettered it.
 */
export interface TaskSettledEvent {
  workerId: string;
  task: TaskEventTask;
  /** How the attempt ended, as counted on `berth_task_outcomes_total`. */
  outcome: Outcome;
  /** The handler's run time in ms; null when the handler never started (unknown type, bad payload, late claim). */
  durationMs: number | null;
  /** The failure: set for `failure` and `timeout` outcomes, null otherwise. */
  error: TaskEventError | null;
  /** The settlement moved the task to the dead letters. */
  dead: boolean;
  /** A failure scheduled to run again after this backoff (ms); null otherwise. */
  retryInMs: number | null;
}

export interface WorkerStartedEvent {
  workerId: string;
  slots: number;
  /** The queues it claims from; null: every queue. */
  queues: readonly string[] | null;
  types: readonly string[];
}

export interface WorkerStoppedEvent {
  workerId: string;
}

export interface LeaderEvent {
  workerId: string;
}

/** Every event a Worker emits, by name, with its payload (docs/api.md, "Events"). */
export interface WorkerEventMap {
  'task:started': TaskStartedEvent;
  'task:settled': TaskSettledEvent;
  'task:completed': TaskSettledEvent;
  'task:failed': TaskSettledEvent;
  'task:retrying': TaskSettledEvent;
  'task:dead': TaskSettledEvent;
  'task:cancelled': TaskSettledEvent;
  'task:continued': TaskSettledEvent;
  'task:snoozed': TaskSettledEvent;
  'task:lease_lost': TaskSettledEvent;
  'task:unsettled': TaskSettledEvent;
  'worker:started': WorkerStartedEvent;
  'worker:stopped': WorkerStoppedEvent;
  'leader:gained': LeaderEvent;
  'leader:lost': LeaderEvent;
}

export type WorkerEventName = keyof WorkerEventMap;

/**
 * A listener. It runs synchronously in the worker's event loop, so it must not block: hand slow
 * work to something asynchronous. A returned promise is not awaited (its rejection is logged).
 */
export type WorkerEventListener<K extends WorkerEventName> = (event: WorkerEventMap[K]) => unknown;

/** The event an outcome emits besides `task:settled`. */
export const OUTCOME_EVENT: Readonly<Record<Outcome, WorkerEventName>> = {
  success: 'task:completed',
  failure: 'task:failed',
  timeout: 'task:failed',
  continued: 'task:continued',
  snoozed: 'task:snoozed',
  cancelled: 'task:cancelled',
  lost: 'task:lease_lost',
  unsettled: 'task:unsettled',
};

type AnyListener = (event: never) => unknown;

/** Every event name, for checking `on()`'s argument at run time (a typo would otherwise never fire). */
const EVENT_NAMES: Readonly<Record<WorkerEventName, true>> = {
  'task:started': true,
  'task:settled': true,
  'task:completed': true,
  'task:failed': true,
  'task:retrying': true,
  'task:dead': true,
  'task:cancelled': true,
  'task:continued': true,
  'task:snoozed': true,
  'task:lease_lost': true,
  'task:unsettled': true,
  'worker:started': true,
  'worker:stopped': true,
  'leader:gained': true,
  'leader:lost': true,
};

/**
 * `worker.events`: a typed emitter. Not Node's EventEmitter, on purpose: its listeners' throws
 * reach the emitter (the worker), and an `error` event with no listener throws. Here a listener
 * that throws, or whose promise rejects, is logged and skipped: it cannot crash the worker, fail
 * a settlement or hold a slot, and the other listeners still run. Events are emitted after the
 * decision they report (the settlement written, the leadership taken), never before, and
 * nothing waits for a listener. With no task listener the per-task cost is one property read.
 */
export class WorkerEvents {
  /** Copy-on-write arrays, so an emit iterates a snapshot (a listener may remove itself). */
  private readonly listeners = new Map<WorkerEventName, readonly AnyListener[]>();
  private taskListeners = 0;

  constructor(private readonly logger: Logger) {}

  /** Add a listener; returns a function that removes it. */
  on<K extends WorkerEventName>(name: K, listener: WorkerEventListener<K>): () => void {
    if (typeof listener !== 'function') throw new BerthInputError(`the listener for "${name}" must be a function`);
    if (!Object.hasOwn(EVENT_NAMES, name)) throw new BerthInputError(`unknown worker event "${String(name)}"`);
    this.listeners.set(name, [...(this.listeners.get(name) ?? []), listener as AnyListener]);
    if (name.startsWith('task:')) this.taskListeners++;
    return () => this.off(name, listener);
  }

  /** Add a listener for the next event of `name` only (remove it early with the function returned, not `off`). */
  once<K extends WorkerEventName>(name: K, listener: WorkerEventListener<K>): () => void {
    const off = this.on(name, (event) => {
      off();
      return listener(event);
    });
    return off;
  }

  /** Remove a listener (one registration of it); unknown listeners are ignored. */
  off<K extends WorkerEventName>(name: K, listener: WorkerEventListener<K>): void {
    const list = this.listeners.get(name);
    const i = list?.indexOf(listener as AnyListener) ?? -1;
    if (list === undefined || i < 0) return;
    const next = list.filter((_, j) => j !== i);
    if (next.length === 0) this.listeners.delete(name);
    else this.listeners.set(name, next);
    if (name.startsWith('task:')) this.taskListeners--;
  }

  /** How many listeners `name` has. */
  listenerCount(name: WorkerEventName): number {
    return this.listeners.get(name)?.length ?? 0;
  }

  /** Whether any `task:*` event has a listener (the engine skips building task events otherwise). */
  get wantsTaskEvents(): boolean {
    return this.taskListeners > 0;
  }

  /** Emit to every listener of `name`, each isolated (internal: the worker emits, applications listen). */
  emit<K extends WorkerEventName>(name: K, event: WorkerEventMap[K]): void {
    const list = this.listeners.get(name);
    if (list === undefined) return;
    for (const listener of list) {
      try {
        const r = (listener as WorkerEventListener<K>)(event);
        if (r instanceof Promise) r.catch((err: unknown) => this.failed(name, err));
      } catch (err) {
        this.failed(name, err);
      }
    }
  }

  private failed(name: WorkerEventName, err: unknown): void {
    this.logger.error(
      { err: err instanceof Error ? err.message : String(err), event: name },
      'worker event listener failed',
    );
  }
}
