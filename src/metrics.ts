import { Counter, Gauge, Histogram, Registry } from 'prom-client';

/** How one run of a handler ended, as counted on `berth_task_outcomes_total`. */
export type Outcome = 'success' | 'failure' | 'timeout' | 'continued' | 'cancelled' | 'lost';

export const OUTCOMES: readonly Outcome[] = ['success', 'failure', 'timeout', 'continued', 'cancelled', 'lost'];

/**
 * Every instrument berth exports, on one registry per worker (so several workers in one process,
 * as in the tests, keep separate counts). Names and meanings: docs/operations.md.
 */
export class BerthMetrics {
  readonly registry: Registry;
  readonly outcomes: Counter<'task_type' | 'outcome'>;
  readonly handlerSeconds: Histogram<'task_type'>;
  readonly pending: Gauge<'task_type'>;
  readonly running: Gauge<'task_type'>;
  readonly dead: Gauge<'task_type'>;
  readonly oldestDueSeconds: Gauge;
  readonly slots: Gauge;
  readonly busySlots: Gauge;
  readonly bufferedTasks: Gauge;
  readonly claims: Counter<'result'>;
  readonly claimSeconds: Histogram;
  readonly claimedTasks: Counter;
  readonly wakeups: Counter<'reason'>;
  readonly listenReconnects: Counter;
  readonly settlementFlushSeconds: Histogram<'kind'>;
  readonly maintenanceSeconds: Histogram<'branch'>;
  readonly maintenanceErrors: Counter<'branch'>;
  readonly maintenanceOverruns: Counter<'branch'>;
  readonly promoted: Counter;
  readonly promoteBatches: Counter;
  readonly promoteBatchSize: Histogram;
  readonly promoteSeconds: Histogram;
  readonly laneContention: Counter<'state' | 'queue' | 'outcome'>;
  readonly rescued: Counter<'result'>;
  readonly ringPrunes: Counter<'result' | 'reason'>;
  readonly ringRotations: Counter<'result'>;
  readonly deadPruned: Counter;
  readonly isLeader: Gauge;

  constructor(registry: Registry = new Registry()) {
    this.registry = registry;
    const r = [registry];
    this.outcomes = new Counter({
      name: 'berth_task_outcomes_total',
      help: 'Handler runs by task type and outcome (success, failure, timeout, continued, cancelled, lost)',
      labelNames: ['task_type', 'outcome'],
      registers: r,
    });
    this.handlerSeconds = new Histogram({
      name: 'berth_task_handler_seconds',
      help: 'Handler run time by task type (runs that started)',
      labelNames: ['task_type'],
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800],
      registers: r,
    });
    this.pending = new Gauge({
      name: 'berth_tasks_pending',
      help: 'Unfinished tasks by type: ready, scheduled, retryable or running (running is a subset)',
      labelNames: ['task_type'],
      registers: r,
    });
    this.running = new Gauge({
      name: 'berth_tasks_running',
      help: 'Tasks under a live lease by type',
      labelNames: ['task_type'],
      registers: r,
    });
    this.dead = new Gauge({
      name: 'berth_tasks_dead',
      help: 'Dead letters by type',
      labelNames: ['task_type'],
      registers: r,
    });
    this.oldestDueSeconds = new Gauge({
      name: 'berth_task_oldest_due_seconds',
      help: 'How long the longest-waiting claimable task has been due',
      registers: r,
    });
    this.slots = new Gauge({ name: 'berth_task_slots', help: 'Worker slots in this process', registers: r });
    this.busySlots = new Gauge({ name: 'berth_task_slots_busy', help: 'Slots running a handler now', registers: r });
    this.bufferedTasks = new Gauge({
      name: 'berth_tasks_prefetched',
      help: 'Leased tasks waiting in this process for a free slot',
      registers: r,
    });
    this.claims = new Counter({
      name: 'berth_claims_total',
      help: 'Claim statements by result (hit: leased at least one task, empty)',
      labelNames: ['result'],
      registers: r,
    });
    this.claimSeconds = new Histogram({
      name: 'berth_claim_seconds',
      help: 'Discovery plus claim round trip',
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1],
      registers: r,
    });
    this.claimedTasks = new Counter({ name: 'berth_claimed_tasks_total', help: 'Tasks leased', registers: r });
    this.wakeups = new Counter({
      name: 'berth_wakeups_total',
      help: 'Fetcher wake-ups by reason (notify, poll, slot_freed, start)',
      labelNames: ['reason'],
      registers: r,
    });
    this.listenReconnects = new Counter({
      name: 'berth_listen_reconnects_total',
      help: 'Times the LISTEN connection was lost and re-established',
      registers: r,
    });
    this.settlementFlushSeconds = new Histogram({
      name: 'berth_settlement_flush_seconds',
      help: 'Coalesced settlement statements by kind (complete, fail)',
      labelNames: ['kind'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1],
      registers: r,
    });
    this.maintenanceSeconds = new Histogram({
      name: 'berth_maintenance_branch_seconds',
      help: 'Duration of each maintenance branch run',
      labelNames: ['branch'],
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30],
      registers: r,
    });
    this.maintenanceErrors = new Counter({
      name: 'berth_maintenance_errors_total',
      help: 'Maintenance branch runs that failed',
      labelNames: ['branch'],
      registers: r,
    });
    this.maintenanceOverruns = new Counter({
      name: 'berth_maintenance_overruns_total',
      help: 'Maintenance branch runs that took longer than their interval',
      labelNames: ['branch'],
      registers: r,
    });
    this.promoted = new Counter({
      name: 'berth_promoted_total',
      help: 'Deferred tasks promoted into the ready ring',
      registers: r,
    });
    this.promoteBatches = new Counter({
      name: 'berth_promote_batches_total',
      help: 'Promotion batches run (leader ticks and busy-lane waiters)',
      registers: r,
    });
    this.promoteBatchSize = new Histogram({
      name: 'berth_promote_batch_size',
      help: 'Rows promoted per promotion batch',
      buckets: [0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000],
      registers: r,
    });
    this.promoteSeconds = new Histogram({
      name: 'berth_promote_duration_seconds',
      help: 'Duration of one promotion batch',
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30],
      registers: r,
    });
    this.laneContention = new Counter({
      name: 'berth_promote_lane_contention_total',
      help: 'Busy or failing lanes met by promotion, by deferred state, queue and outcome (handed_off, waiter_limit, waiter_timed_out, failed)',
      labelNames: ['state', 'queue', 'outcome'],
      registers: r,
    });
    this.rescued = new Counter({
      name: 'berth_rescued_total',
      help: 'Lapsed leases rescued (retry: back to retryable, dead: out of attempts)',
      labelNames: ['result'],
      registers: r,
    });
    this.ringPrunes = new Counter({
      name: 'berth_ring_prune_total',
      help: 'Ring slot prune attempts by result (pruned, skipped, blocked) and reason',
      labelNames: ['result', 'reason'],
      registers: r,
    });
    this.ringRotations = new Counter({
      name: 'berth_ring_rotations_total',
      help: 'Ring rotations by result (rotated, next_slot_busy)',
      labelNames: ['result'],
      registers: r,
    });
    this.deadPruned = new Counter({
      name: 'berth_dead_letters_pruned_total',
      help: 'Dead letters removed by retention',
      registers: r,
    });
    this.isLeader = new Gauge({
      name: 'berth_maintenance_leader',
      help: '1 while this process is the maintenance leader',
      registers: r,
    });
  }
}
