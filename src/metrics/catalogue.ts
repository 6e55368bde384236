/**
 * Every berth metric (BerthMetrics) and the outcomes a handler run is counted under, built on
 * the instruments of instruments.ts.
 */
import { checkKeys } from '../limits.js';
import { metrics as otelMetrics, type Meter } from '@opentelemetry/api';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { CounterMetric, GaugeMetric, HistogramMetric, otelName, type Combine, type Described } from './instruments.js';

/**
 * How one run of a handler ended, as counted on `berth_task_outcomes_total`: seed 000's six,
 * plus `unsettled` (the run ended but its settlement could not be written, because the database
 * was unreachable until the lease expired; the task runs again after rescue) and `snoozed` (the
 * handler asked to run again later, `snooze()`). `lost` means only that the fence refused the
 * token, so an outage never inflates it; a run whose settlement lost to an operator's cancel is
 * `cancelled`.
 */
export type Outcome = 'success' | 'failure' | 'timeout' | 'continued' | 'cancelled' | 'snoozed' | 'lost' | 'unsettled';

export const OUTCOMES: readonly Outcome[] = [
  'success',
  'failure',
  'timeout',
  'continued',
  'cancelled',
  'snoozed',
  'lost',
  'unsettled',
];

export interface BerthMetricsOptions {
  /** The prom-client registry every instrument registers on. A new one by default (one per worker). */
  registry?: Registry;
  /**
   * The OpenTelemetry meter the instruments are mirrored on. Default: `metrics.getMeter('berth')`
   * from `@opentelemetry/api`, the global provider's meter — a no-op unless the application
   * registered a MeterProvider (an SDK) before this constructor ran, so an app that installs an
   * SDK gets berth's metrics with no wiring, and one that does not pays nothing.
   */
  meter?: Meter;
}

const METRICS_OPTION_KEYS: ReadonlySet<string> = new Set<keyof BerthMetricsOptions>(['registry', 'meter']);

function isRegistry(x: Registry | BerthMetricsOptions): x is Registry {
  return typeof (x as Registry).registerMetric === 'function';
}

/**
 * Every instrument berth exports, on one prom-client registry per worker (so several workers in
 * one process, as in the tests, keep separate counts), each mirrored on an OpenTelemetry meter.
 * Names and meanings: docs/operations.md.
 *
 * OpenTelemetry: each instrument has the Prometheus name (counters less their `_total`, which
 * OpenTelemetry naming leaves out and every OpenTelemetry-to-Prometheus path — the Prometheus
 * exporters, Prometheus's OTLP receiver — appends to a monotonic sum, so the scraped name is
 * the same either way) and the same label names as attributes. Counters are Counters,
 * histograms are Histograms with the same buckets (as `explicitBucketBoundaries` advice) and
 * unit (`s` where the name ends in `_seconds`), gauges are ObservableGauges reporting what the
 * Prometheus gauge holds at collection, so a reset (a former leader's gauges) shows there too.
 * Several BerthMetrics on one meter share its instruments: counters and histograms add up;
 * gauges of one process's slots add up, and the queue-wide gauges the maintenance leader
 * exports take the largest value (only the leader reports them; the others are empty or 0).
 * The default meter is the global one read at construction: register the SDK's MeterProvider
 * before creating workers.
 */
export class BerthMetrics {
  readonly registry: Registry;
  readonly meter: Meter;
  readonly outcomes: CounterMetric<'task_type' | 'outcome'>;
  readonly unknownTypes: CounterMetric<'task_type'>;
  readonly typeRateRefused: CounterMetric<'task_type'>;
  readonly handlerSeconds: HistogramMetric<'task_type'>;
  readonly pending: GaugeMetric<'task_type'>;
  readonly running: GaugeMetric<'task_type'>;
  readonly dead: GaugeMetric<'task_type'>;
  readonly oldestDueSeconds: GaugeMetric;
  readonly slots: GaugeMetric;
  readonly busySlots: GaugeMetric;
  readonly bufferedTasks: GaugeMetric;
  readonly stuckHandlers: GaugeMetric<'task_type'>;
  readonly rescueHeld: GaugeMetric;
  readonly claims: CounterMetric<'result'>;
  readonly claimSeconds: HistogramMetric;
  readonly claimedTasks: CounterMetric;
  readonly taskWaitSeconds: HistogramMetric<'task_type'>;
  readonly wakeups: CounterMetric<'reason'>;
  readonly listenReconnects: CounterMetric;
  readonly discoveryOnPrimary: GaugeMetric;
  readonly discoveryFallbacks: CounterMetric<'reason'>;
  readonly settlementFlushSeconds: HistogramMetric<'kind'>;
  readonly maintenanceSeconds: HistogramMetric<'branch'>;
  readonly maintenanceErrors: CounterMetric<'branch'>;
  readonly maintenanceOverruns: CounterMetric<'branch'>;
  readonly promoted: CounterMetric;
  readonly promoteBatches: CounterMetric;
  readonly promoteBatchSize: HistogramMetric;
  readonly promoteSeconds: HistogramMetric;
  readonly laneContention: CounterMetric<'state' | 'queue' | 'outcome'>;
  readonly rescued: CounterMetric<'result'>;
  readonly keysAdmitted: CounterMetric;
  readonly dependencyReleases: CounterMetric<'path'>;
  readonly dependencyCancels: CounterMetric;
  readonly ringPrunes: CounterMetric<'result' | 'reason'>;
  readonly ringRotations: CounterMetric<'result'>;
  readonly deadPruned: CounterMetric;
  readonly isLeader: GaugeMetric;
  readonly scheduleFires: CounterMetric<'schedule' | 'kind'>;
  readonly scheduleMisses: CounterMetric<'schedule'>;
  readonly scheduleLatenessSeconds: HistogramMetric<'schedule'>;
  readonly scheduleLastFire: GaugeMetric<'schedule'>;
  readonly scheduleInterval: GaugeMetric<'schedule'>;
  readonly queuePaused: GaugeMetric<'queue'>;
  readonly limitMaxRunning: GaugeMetric<'queue'>;
  readonly limitRunning: GaugeMetric<'queue'>;
  readonly limitRate: GaugeMetric<'queue'>;
  readonly limitRateIntervalSeconds: GaugeMetric<'queue'>;
  readonly limitRateStarts: GaugeMetric<'queue'>;
  readonly limitHeldTasks: GaugeMetric<'queue'>;
  readonly keyHeldTasks: GaugeMetric<'queue'>;
  readonly keysWaiting: GaugeMetric;
  readonly keyLimit: GaugeMetric<'scope' | 'name'>;
  readonly typeLimitRate: GaugeMetric<'task_type'>;
  readonly typeLimitRateIntervalSeconds: GaugeMetric<'task_type'>;
  readonly typeLimitRateStarts: GaugeMetric<'task_type'>;
  readonly typeLimitPacedTasks: GaugeMetric<'task_type'>;
  readonly tasksWaiting: GaugeMetric<'queue'>;
  readonly tasksBlocked: GaugeMetric<'queue'>;
  readonly workers: GaugeMetric;

  /** `new BerthMetrics()`, `new BerthMetrics(registry)` or `new BerthMetrics({ registry, meter })`. */
  constructor(options: Registry | BerthMetricsOptions = {}) {
    if (!isRegistry(options)) checkKeys(options, METRICS_OPTION_KEYS, 'BerthMetrics');
    const { registry = new Registry(), meter = otelMetrics.getMeter('berth') } = isRegistry(options)
      ? { registry: options }
      : options;
    this.registry = registry;
    this.meter = meter;
    const r = [registry];
    const otel = (name: string, help: string): Described => ({
      name: otelName(name),
      help,
      ...(name.endsWith('_seconds') ? { unit: 's' } : {}),
    });
    const counter = <T extends string = string>(name: string, help: string, labelNames: readonly T[] = []) =>
      new CounterMetric<T>(new Counter<T>({ name, help, labelNames, registers: r }), meter, otel(name, help));
    const histogram = <T extends string = string>(
      name: string,
      help: string,
      buckets: number[],
      labelNames: readonly T[] = [],
    ) =>
      new HistogramMetric<T>(
        new Histogram<T>({ name, help, labelNames, buckets, registers: r }),
        meter,
        otel(name, help),
        buckets,
      );
    const gauge = <T extends string = string>(
      name: string,
      help: string,
      combine: Combine,
      labelNames: readonly T[] = [],
    ) => new GaugeMetric<T>(new Gauge<T>({ name, help, labelNames, registers: r }), meter, otel(name, help), combine);
    const fast = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1];

    this.outcomes = counter(
      'berth_task_outcomes_total',
      'Handler runs by task type and outcome (success, failure, timeout, continued, cancelled, lost, unsettled)',
      ['task_type', 'outcome'],
    );
    this.unknownTypes = counter(
      'berth_tasks_unknown_type_total',
      'Claimed tasks of a type this worker has no definition for, handed back without charging an attempt, by task type',
      ['task_type'],
    );
    this.typeRateRefused = counter(
      'berth_type_rate_refused_total',
      "Starts this worker was refused by a task type's rate limit (each task handed back unstarted, its attempt refunded), by task type",
      ['task_type'],
    );
    this.handlerSeconds = histogram(
      'berth_task_handler_seconds',
      'Handler run time by task type (runs that started)',
      [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800],
      ['task_type'],
    );
    this.pending = gauge(
      'berth_tasks_pending',
      'Unfinished tasks by type: ready, scheduled, retryable or running (running is a subset)',
      'max',
      ['task_type'],
    );
    this.running = gauge('berth_tasks_running', 'Tasks under a live lease by type', 'max', ['task_type']);
    this.dead = gauge('berth_tasks_dead', 'Dead letters by type', 'max', ['task_type']);
    this.oldestDueSeconds = gauge(
      'berth_task_oldest_due_seconds',
      'How long the longest-waiting claimable task has been due; paused queues and queues at a limit are left out',
      'max',
    );
    this.slots = gauge('berth_task_slots', 'Worker slots in this process', 'sum');
    this.busySlots = gauge('berth_task_slots_busy', 'Slots running a handler now', 'sum');
    this.bufferedTasks = gauge('berth_tasks_prefetched', 'Leased tasks waiting in this process for a free slot', 'sum');
    this.stuckHandlers = gauge(
      'berth_task_stuck_handlers',
      'Handlers still running past their deadline plus the stuck grace, by task type: each holds a slot (and its lease) in this process',
      'sum',
      ['task_type'],
    );
    this.rescueHeld = gauge(
      'berth_rescue_held_leases',
      'Lapsed leases rescue left alone because their holder is alive and still runs the handler; exported by the maintenance leader',
      'max',
    );
    this.claims = counter('berth_claims_total', 'Claim statements by result (hit: leased at least one task, empty)', [
      'result',
    ]);
    this.claimSeconds = histogram('berth_claim_seconds', 'Discovery plus claim round trip', fast);
    this.claimedTasks = counter('berth_claimed_tasks_total', 'Tasks leased');
    this.taskWaitSeconds = histogram(
      'berth_task_wait_seconds',
      'How long a task had been due when a worker claimed it (database clock), by task type',
      [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 1800, 3600],
      ['task_type'],
    );
    this.wakeups = counter(
      'berth_wakeups_total',
      'Fetcher wake-ups by reason (notify, poll, slot_freed, more, limit_freed, settled, retry, start, stop)',
      ['reason'],
    );
    this.listenReconnects = counter(
      'berth_listen_reconnects_total',
      'Times the LISTEN connection was lost and re-established',
    );
    this.discoveryOnPrimary = gauge(
      'berth_discovery_on_primary',
      'Whether discovery reads the primary because the read replica (readConnectionString) failed: 1 until a retry finds it answering again',
      'sum',
    );
    this.discoveryFallbacks = counter(
      'berth_discovery_fallbacks_total',
      'Discoveries run on the primary instead of the read replica, by reason (unavailable: it failed or awaits a retry; lagging: it had not replayed what the primary wrote half a poll interval earlier)',
      ['reason'],
    );
    this.settlementFlushSeconds = histogram(
      'berth_settlement_flush_seconds',
      'Coalesced settlement statements by kind (complete, fail)',
      fast,
      ['kind'],
    );
    this.maintenanceSeconds = histogram(
      'berth_maintenance_branch_seconds',
      'Duration of each maintenance branch run',
      [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30],
      ['branch'],
    );
    this.maintenanceErrors = counter('berth_maintenance_errors_total', 'Maintenance branch runs that failed', [
      'branch',
    ]);
    this.maintenanceOverruns = counter(
      'berth_maintenance_overruns_total',
      'Maintenance branch runs that took longer than their interval',
      ['branch'],
    );
    this.promoted = counter('berth_promoted_total', 'Deferred tasks promoted into the ready ring');
    this.promoteBatches = counter(
      'berth_promote_batches_total',
      'Promotion batches run (leader ticks and busy-lane waiters)',
    );
    this.promoteBatchSize = histogram(
      'berth_promote_batch_size',
      'Rows promoted per promotion batch',
      [0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000],
    );
    this.promoteSeconds = histogram(
      'berth_promote_duration_seconds',
      'Duration of one promotion batch',
      [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30],
    );
    this.laneContention = counter(
      'berth_promote_lane_contention_total',
      'Busy or failing lanes met by promotion, by deferred state, queue and outcome (handed_off, waiter_limit, waiter_timed_out, failed)',
      ['state', 'queue', 'outcome'],
    );
    this.rescued = counter(
      'berth_rescued_total',
      'Lapsed leases rescued (retry: back to retryable, dead: out of attempts)',
      ['result'],
    );
    this.keysAdmitted = counter(
      'berth_keys_admitted_total',
      'Held keyed tasks admitted into their lanes by the maintenance leader (the settling workers admit most of them)',
      [],
    );
    this.dependencyReleases = counter(
      'berth_dependency_releases_total',
      'Tasks freed because the last task they depended on completed, by path (completion: in the completing transaction; leader: its watch of parents that were not marked)',
      ['path'],
    );
    this.dependencyCancels = counter(
      'berth_dependency_cancels_total',
      'Waiting tasks cancelled by the maintenance leader because a task they depended on died, was cancelled or deleted',
      [],
    );
    this.ringPrunes = counter(
      'berth_ring_prune_total',
      'Ring segment prune attempts by result (pruned, skipped, blocked) and reason',
      ['result', 'reason'],
    );
    this.ringRotations = counter('berth_ring_rotations_total', 'Ring rotations by result (rotated, next_slot_busy)', [
      'result',
    ]);
    this.deadPruned = counter('berth_dead_letters_pruned_total', 'Dead letters removed by retention');
    this.isLeader = gauge('berth_maintenance_leader', '1 while this process is the maintenance leader', 'max');
    this.queuePaused = gauge(
      'berth_queue_paused',
      '1 while the queue is paused; exported by the maintenance leader',
      'max',
      ['queue'],
    );
    // A queue's limits (setQueueLimit, `berth limits`), one series per limited queue; a cleared
    // limit's series go with the next gauge run (publishGauges resets them).
    const limitGauge = (name: string, help: string) =>
      gauge(name, `${help}; exported by the maintenance leader`, 'max', ['queue']);
    this.limitMaxRunning = limitGauge(
      'berth_queue_limit_max_running',
      "The queue's running limit: at most this many of its tasks run at once across the fleet",
    );
    this.limitRunning = limitGauge(
      'berth_queue_limit_running',
      'Tasks of a limited queue running now, as its limit counts them (leased and not settled)',
    );
    this.limitRate = limitGauge(
      'berth_queue_limit_rate',
      "The queue's rate limit: at most this many starts per berth_queue_limit_rate_interval_seconds",
    );
    this.limitRateIntervalSeconds = limitGauge(
      'berth_queue_limit_rate_interval_seconds',
      "The interval of the queue's rate limit, in seconds",
    );
    this.limitRateStarts = limitGauge(
      'berth_queue_limit_rate_starts',
      'Starts of a rate-limited queue within the current interval',
    );
    this.limitHeldTasks = limitGauge(
      'berth_queue_limit_held_tasks',
      'Due tasks of a limited queue waiting while it is at a limit (0 below its limits); left out of berth_task_oldest_due_seconds',
    );
    // Concurrency keys (setKeyLimit, `berth keys`): reset each gauge run like the queue limits,
    // so a queue with nothing held and a cleared key limit lose their series.
    this.keyHeldTasks = gauge(
      'berth_key_held_tasks',
      'Tasks held for their concurrency key (due, waiting for the key to admit them), by queue; exported by the maintenance leader',
      'max',
      ['queue'],
    );
    this.keysWaiting = gauge(
      'berth_keys_waiting',
      'Concurrency keys with tasks held for them; exported by the maintenance leader',
      'max',
    );
    this.keyLimit = gauge(
      'berth_key_limit',
      'A key limit: at most this many tasks per concurrency key run at once, for a queue or a task type (scope); exported by the maintenance leader',
      'max',
      ['scope', 'name'],
    );
    // Task type rate limits (setTypeLimit, `berth limits`): reset each gauge run like the queue
    // limits, so a cleared limit loses its series.
    const typeLimitGauge = (name: string, help: string) =>
      gauge(name, `${help}; exported by the maintenance leader`, 'max', ['task_type']);
    this.typeLimitRate = typeLimitGauge(
      'berth_type_limit_rate',
      "A task type's rate limit: at most this many starts per berth_type_limit_rate_interval_seconds, across the fleet",
    );
    this.typeLimitRateIntervalSeconds = typeLimitGauge(
      'berth_type_limit_rate_interval_seconds',
      "The interval of the task type's rate limit, in seconds",
    );
    this.typeLimitRateStarts = typeLimitGauge(
      'berth_type_limit_rate_starts',
      'Starts of a rate-limited task type within the current interval',
    );
    this.typeLimitPacedTasks = typeLimitGauge(
      'berth_type_limit_paced_tasks',
      "Tasks a type's rate limit refused and handed back that are not due again yet (left out of berth_task_oldest_due_seconds until due)",
    );
    this.tasksWaiting = gauge(
      'berth_tasks_waiting',
      'Tasks waiting for the tasks they depend on to complete, by queue; exported by the maintenance leader',
      'max',
      ['queue'],
    );
    this.tasksBlocked = gauge(
      'berth_tasks_blocked',
      'Waiting tasks (onParentFailure: wait) whose parent is dead: retry the parent or cancel them; exported by the maintenance leader',
      'max',
      ['queue'],
    );
    this.workers = gauge(
      'berth_workers',
      'Worker processes with a fresh heartbeat; exported by the maintenance leader',
      'max',
    );
    this.scheduleFires = counter(
      'berth_schedule_fires_total',
      'Tasks enqueued by schedules, by schedule and kind (cron: an instant of its expression, missed: a missed instant its misfire policy runs, trigger: an operator)',
      ['schedule', 'kind'],
    );
    this.scheduleMisses = counter(
      'berth_schedule_misses_total',
      'Instants of a schedule its misfire policy did not run (missed while no leader could fire them)',
      ['schedule'],
    );
    this.scheduleLatenessSeconds = histogram(
      'berth_schedule_lateness_seconds',
      'How late each fire of a schedule committed after its instant (database clock)',
      [0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 5, 15, 60, 300],
      ['schedule'],
    );
    this.scheduleLastFire = gauge(
      'berth_schedule_last_fire_timestamp_seconds',
      'When an active (neither paused nor stale) schedule last fired, else when it was created, in Unix seconds; exported by the maintenance leader',
      'max',
      ['schedule'],
    );
    this.scheduleInterval = gauge(
      'berth_schedule_interval_seconds',
      'The longest gap between consecutive instants of an active schedule; exported by the maintenance leader',
      'max',
      ['schedule'],
    );
  }
}
