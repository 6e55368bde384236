import type { Logger } from '../logger.js';
import type { Outcome } from '../metrics/catalogue.js';
import type { ClaimedTask } from './claim.js';
import type { OutcomeTally } from './heartbeat.js';
import type { TypeMetrics } from './type-metrics.js';

/**
 * What a run and its settlement report per task: the handler's run time and the outcome (the
 * per-type metrics, the heartbeat's tally), and whether debug lines are wanted. One per engine
 * (and per runDueTasks), called through its methods: as closures made per engine, each call site
 * that had inlined the last worker's lost its compiled code once that worker was collected.
 */
export class TaskReports {
  constructor(
    private readonly typeMetrics: TypeMetrics,
    /** The heartbeat's per-minute outcome counts; null without a heartbeat (and in runDueTasks). */
    private readonly tally: OutcomeTally | null,
    private readonly logger: Logger,
  ) {}

  /** A started handler's run time, into its type's histogram. */
  handlerRan(task: ClaimedTask, seconds: number): void {
    this.typeMetrics.for(task.type).handlerSeconds.observe(seconds);
  }

  /** Counts an outcome (metrics and the heartbeat's tally). */
  record(task: ClaimedTask, outcome: Outcome): void {
    this.typeMetrics.for(task.type).outcome(outcome).inc();
    this.tally?.record(task.queue, task.type, outcome);
  }

  /** Whether debug lines are wanted (a pino child per task is not free, so ask the parent). */
  debugEnabled(): boolean {
    return this.logger.isLevelEnabled('debug');
  }
}
