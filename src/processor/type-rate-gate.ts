import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import { onConnectionOf } from '../db/connections.js';
import { takeTypeStarts } from '../storage/type-limits.js';
import type { Storage } from '../storage/storage.js';

/** What the gate answers for one task about to start. */
export type TypeStart =
  /** Start now; `startBy` (epoch ms) is the latest the handler may start, null when unlimited. */
  | { granted: true; startBy: number | null }
  /** Refused: hand the task back unstarted, due again in `delayMs`. */
  | { granted: false; delayMs: number; note: string };

/** A task waiting for the answer to its start. */
interface Waiter {
  id: string;
  resolve: (start: TypeStart) => void;
}

/** How long a task is kept away when the database could not be asked (the start is not granted). */
const UNASKED_DELAY_MS = 1_000;
/** At most one warning per type in this long when the database cannot be asked. */
const WARN_EVERY_MS = 10_000;
/** take_type_starts' largest n. */
const MAX_PER_CALL = 10_000;

/**
 * Fleet-wide rate limits of task types (migration 30), taken where a task starts: a worker about
 * to start a task of a rate-limited type asks the database for a start (`take_type_starts`), and
 * the task is started only if it got one. The asks for one type made in one turn of the event
 * loop (a batch of slots starting together) go in one statement. A refused task is handed back
 * unstarted, due when the type's window will have room for it (the database paces a backlog).
 *
 * Which types are limited is the fetcher's read (`setTypes`, once a poll and on a `limits`
 * notice); a worker with none pays one `size` check per task.
 */
export class TypeRateGate {
  private types: ReadonlySet<string> = new Set();
  private readonly pending = new Map<string, Waiter[]>();
  private scheduled = false;
  private readonly warnedAt = new Map<string, number>();

  constructor(
    private readonly db: Queryable,
    private readonly storage: Storage,
    private readonly logger: Logger,
    private readonly metrics: BerthMetrics,
  ) {}

  /** The rate-limited types, as the fetcher last read them. */
  setTypes(types: readonly string[]): void {
    this.types = new Set(types);
  }

  /** Whether a task of `type` must ask for its start. */
  limits(type: string): boolean {
    return this.types.size > 0 && this.types.has(type);
  }

  /** Ask for the start of task `id` of `type`; resolves after the database answered (never rejects). */
  take(type: string, id: string): Promise<TypeStart> {
    return new Promise((resolve) => {
      const waiting = this.pending.get(type);
      if (waiting) waiting.push({ id, resolve });
      else this.pending.set(type, [{ id, resolve }]);
      if (this.scheduled) return;
      this.scheduled = true;
      setImmediate(() => this.flush());
    });
  }

  private flush(): void {
    this.scheduled = false;
    const batches = [...this.pending];
    this.pending.clear();
    for (const [type, waiters] of batches) {
      for (let i = 0; i < waiters.length; i += MAX_PER_CALL) void this.ask(type, waiters.slice(i, i + MAX_PER_CALL));
    }
  }

  private async ask(type: string, waiters: Waiter[]): Promise<void> {
    try {
      // Sent once a pool connection is in hand: a wait for one (behind this worker's hand-backs,
      // releases and leader work) would spend the guard, and grants answered past it are spent
      // starts (a 20-a-second limit on a loaded host started 24 of 200 in 10 s, 189 grants spent).
      // Still before the grant is taken, as the guard needs.
      const { r, sent } = await onConnectionOf(this.db, async (c) => {
        const sent = Date.now();
        const r = await takeTypeStarts(
          c,
          this.storage,
          type,
          waiters.map((w) => w.id),
        );
        return { r, sent };
      });
      const startBy = r.guardMs === null ? null : sent + r.guardMs;
      if (r.granted < waiters.length) this.metrics.typeRateRefused.inc({ task_type: type }, waiters.length - r.granted);
      waiters.forEach(({ resolve }, i) => {
        if (i < r.granted) {
          resolve({ granted: true, startBy });
          return;
        }
        const delayMs = (r.retryMs ?? UNASKED_DELAY_MS) + (i - r.granted) * (r.stepMs ?? 0);
        resolve({
          granted: false,
          delayMs,
          note: `rate limit of task type "${type}": start refused; due again in ${delayMs} ms`,
        });
      });
    } catch (err) {
      // Not granted, so not started: handed back for a second, whatever the database's fault.
      const now = Date.now();
      if (now - (this.warnedAt.get(type) ?? -Infinity) >= WARN_EVERY_MS) {
        this.warnedAt.set(type, now);
        this.logger.warn(
          { err: (err as Error).message, task_type: type, tasks: waiters.length },
          'could not ask for the starts of a rate-limited task type; its tasks are handed back unstarted',
        );
      }
      const note = `rate limit of task type "${type}": the start could not be asked for (${(err as Error).message})`;
      for (const { resolve } of waiters) resolve({ granted: false, delayMs: UNASKED_DELAY_MS, note });
    }
  }
}
