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
      const m = this.metrics;
      const outcomes = new Map<Outcome, BoundCounter>();
      // Almost every task ends in success: its counter is found without the map.
      const success = m.outcomes.bind({ task_type: type, outcome: 'success' });
      found = {
        handlerSeconds: m.handlerSeconds.bind({ task_type: type }),
        waitSeconds: m.taskWaitSeconds.bind({ task_type: type }),
        outcome(outcome) {
          if (outcome === 'success') return success;
          let c = outcomes.get(outcome);
          if (c === undefined) {
            c = m.outcomes.bind({ task_type: type, outcome });
            outcomes.set(outcome, c);
          }
          return c;
        },
      };
      this.byType.set(type, found);
    }
    return found;
  }
}
