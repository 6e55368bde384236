import { BerthInputError } from '../errors.js';
import { checkKeys, checkMs, MAX_TIMER_MS } from '../limits.js';
import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { BoundCounter } from '../metrics/instruments.js';
import type { ClaimedTask } from './claim.js';

/**
 * What a worker does with a claimed task whose type it has no definition for (the `unknownTypes`
 * worker option). Such a task is not at fault, so it is handed back without charging an
 * attempt and is never dead-lettered for it; the delay keeps a lane of types nobody here knows
 * from cycling through this worker's claims (docs/architecture.md, "Routing").
 */
export interface UnknownTypeOptions {
  /** How long the first hand-backs of a type keep it away (its tasks are due again after this). 5 s. */
  delayMs?: number;
  /** The cap: the delay doubles for each consecutive log interval the type is seen in. 5 min. */
  maxDelayMs?: number;
  /** One warn line per type per interval, with the count of the interval before. 60 s. */
  logIntervalMs?: number;
}

export type ResolvedUnknownTypeOptions = Readonly<Required<UnknownTypeOptions>>;

export const UNKNOWN_TYPE_DEFAULTS: ResolvedUnknownTypeOptions = Object.freeze({
  delayMs: 5_000,
  maxDelayMs: 300_000,
  logIntervalMs: 60_000,
});

const KEYS: ReadonlySet<string> = new Set<keyof UnknownTypeOptions>(['delayMs', 'maxDelayMs', 'logIntervalMs']);

/** The option checked, defaults filled in (unknown keys refused). */
export function resolveUnknownTypeOptions(input: UnknownTypeOptions | undefined): ResolvedUnknownTypeOptions {
  if (input === undefined) return UNKNOWN_TYPE_DEFAULTS;
  if (typeof input !== 'object' || input === null) throw new BerthInputError('unknownTypes must be an object');
  checkKeys(input, KEYS, 'unknownTypes');
  const d = UNKNOWN_TYPE_DEFAULTS;
  const delayMs = checkMs(input.delayMs ?? d.delayMs, 'unknownTypes.delayMs', '', 0, MAX_TIMER_MS);
  const maxDelayMs = checkMs(
    input.maxDelayMs ?? Math.max(d.maxDelayMs, delayMs),
    'unknownTypes.maxDelayMs',
    '',
    delayMs,
    MAX_TIMER_MS,
    ' (at least delayMs)',
  );
  const logIntervalMs = checkMs(
    input.logIntervalMs ?? d.logIntervalMs,
    'unknownTypes.logIntervalMs',
    '',
    1,
    MAX_TIMER_MS,
  );
  return Object.freeze({ delayMs, maxDelayMs, logIntervalMs });
}

interface TypeState {
  /** When the current log interval of this type began (epoch ms). */
  since: number;
  /** Hand-backs in the current interval. */
  count: number;
  /** Consecutive intervals the type was seen in, minus one: the delay's doubling. */
  streak: number;
  readonly counter: BoundCounter;
}

/**
 * The worker's memory of the types it had to hand back: the delay each one gets now, the
 * `berth_tasks_unknown_type_total{task_type}` counter, and the once-per-interval warn line.
 * One entry per type seen (the metric's own label cardinality).
 */
export class UnknownTypes {
  private readonly byType = new Map<string, TypeState>();

  constructor(
    private readonly options: ResolvedUnknownTypeOptions,
    private readonly metrics: BerthMetrics,
    private readonly logger: Logger,
    private readonly workerId: string,
  ) {}

  /** A task of a type this worker cannot run was claimed: count and maybe log it; returns its delay in ms. */
  handBack(task: Pick<ClaimedTask, 'type' | 'queue'>, now = Date.now()): number {
    const o = this.options;
    let s = this.byType.get(task.type);
    if (s === undefined) {
      s = {
        since: Number.NEGATIVE_INFINITY,
        count: 0,
        streak: 0,
        counter: this.metrics.unknownTypes.bind({ task_type: task.type }),
      };
      this.byType.set(task.type, s);
    }
    s.counter.inc();
    const elapsed = now - s.since;
    if (elapsed >= o.logIntervalMs) {
      // A new interval. Seen in the one just before it too: the type keeps coming back (nobody
      // else takes it, or this worker serves a queue it should not), so it stays away longer.
      s.streak = elapsed < 2 * o.logIntervalMs ? s.streak + 1 : 0;
      const before = s.count;
      s.since = now;
      s.count = 0;
      const delayMs = this.delay(s);
      this.logger.warn(
        {
          task_type: task.type,
          queue: task.queue,
          delay_ms: delayMs,
          handed_back_last_interval: before,
          log_interval_ms: o.logIntervalMs,
        },
        `no handler for task type "${task.type}" on this worker; its tasks are handed back without charging an attempt`,
      );
    }
    s.count++;
    return this.delay(s);
  }

  /** The text stamped as the task's last_error, so the task itself says why it waits. */
  note(type: string): string {
    return `no handler for task type "${type}" on worker ${this.workerId}: handed back without charging an attempt`;
  }

  private delay(s: TypeState): number {
    const o = this.options;
    return Math.min(o.delayMs * 2 ** Math.min(s.streak, 40), o.maxDelayMs);
  }
}
