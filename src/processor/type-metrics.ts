import type { BerthMetrics, Outcome } from '../metrics/catalogue.js';
import type { BoundCounter, BoundHistogram } from '../metrics/instruments.js';

/** The instruments of one task type that the worker updates for every task. */
export interface TypeInstruments {
  /** `berth_task_handler_seconds{task_type}` */
  readonly handlerSeconds: BoundHistogram;
  /** `berth_task_wait_seconds{task_type}` */
  readonly waitSeconds: BoundHistogram;
  /** `berth_task_outcomes_total{task_type, outcome}` */
  outcome(outcome: Outcome): BoundCounter;
}

/**
 * The per-task instruments, bound once per task type (and outcome) instead of building their
 * labels on every task. As many entries as the labels' own cardinality: the task types claimed.
 */
export class TypeMetrics {
  private readonly byType = new Map<string, TypeInstruments>();

  constructor(private readonly metrics: BerthMetrics) {}

  for(type: string): TypeInstruments {
    let found = this.byType.get(type);
    if (found === undefined) {
      found = new TypeInstrumentsBound(this.metrics, type);
      this.byType.set(type, found);
    }
    return found;
  }
}

/**
 * One task type's instruments. An object of a class rather than a literal with an `outcome`
 * closure: each worker binds its own, and code compiled around the last worker's closure was
 * thrown away with it once that worker was collected (instruments.ts, BoundCount).
 */
class TypeInstrumentsBound implements TypeInstruments {
  readonly handlerSeconds: BoundHistogram;
  readonly waitSeconds: BoundHistogram;
  /** Almost every task ends in success: its counter is found without the map. */
  private readonly success: BoundCounter;
  private readonly others = new Map<Outcome, BoundCounter>();

  constructor(
    private readonly metrics: BerthMetrics,
    private readonly type: string,
  ) {
    this.handlerSeconds = metrics.handlerSeconds.bind({ task_type: type });
    this.waitSeconds = metrics.taskWaitSeconds.bind({ task_type: type });
    this.success = metrics.outcomes.bind({ task_type: type, outcome: 'success' });
  }

  outcome(outcome: Outcome): BoundCounter {
    if (outcome === 'success') return this.success;
    let c = this.others.get(outcome);
    if (c === undefined) {
      c = this.metrics.outcomes.bind({ task_type: this.type, outcome });
      this.others.set(outcome, c);
    }
    return c;
  }
}
