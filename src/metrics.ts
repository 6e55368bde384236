import { checkKeys } from './limits.js';
import {
  metrics as otelMetrics,
  type Attributes,
  type Counter as OtelCounter,
  type Histogram as OtelHistogram,
  type Meter,
  type ObservableResult,
} from '@opentelemetry/api';
import { Counter, Gauge, Histogram, Registry, type LabelValues } from 'prom-client';

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

/** The OpenTelemetry name of a Prometheus metric: the same, less a counter's `_total` (see {@link BerthMetrics}). */
export function otelName(promName: string): string {
  return promName.replace(/_total$/, '');
}

/** prom-client's label values as OpenTelemetry attributes (strings, as Prometheus has them). */
function attributes(labels: LabelValues<string> | undefined): Attributes {
  const out: Attributes = {};
  if (labels) for (const [k, v] of Object.entries(labels)) if (v !== undefined) out[k] = String(v);
  return out;
}

/**
 * One OpenTelemetry instrument per meter and name: several BerthMetrics on one meter (several
 * workers in one process) share it, so counters and histograms add up across them, and a
 * gauge's single callback combines every live source.
 */
const instruments = new WeakMap<Meter, Map<string, unknown>>();
function shared<T>(meter: Meter, name: string, create: () => T): T {
  let byName = instruments.get(meter);
  if (!byName) {
    byName = new Map();
    instruments.set(meter, byName);
  }
  if (!byName.has(name)) byName.set(name, create());
  return byName.get(name) as T;
}

/** An OpenTelemetry instrument's name, description and unit (UCUM: `s`). */
export interface Described {
  name: string;
  help: string;
  unit?: string;
}

/**
 * One label set of an instrument, bound once: what the worker updates per task (per task type).
 * It counts exactly as the instrument's own call with those labels; it only saves building the
 * labels object and its OpenTelemetry attributes on every call.
 */
export interface BoundCounter {
  inc(value?: number): void;
}

/** A histogram's label set, bound once (see {@link BoundCounter}). */
export interface BoundHistogram {
  observe(value: number): void;
}

/**
 * Runs `publish` first whenever prom-client reads `metric` (its `collect` hook, which `get()`,
 * and so every registry read, calls), before a `collect` the metric was configured with.
 */
function onCollect(metric: object, publish: () => void): void {
  const m = metric as { collect?: (this: unknown) => unknown };
  const configured = m.collect;
  m.collect = function (this: unknown) {
    publish();
    return configured?.call(this);
  };
}

/** A label set as one string (names sorted), to find its pending counts or its prom-client entry. */
function labelKey(labels: Record<string, unknown>): string {
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}=${String(labels[k])}`)
    .join('\u0000');
}

/**
 * Runs `cleared(key)` whenever prom-client drops counts of `metric` by its own calls: `reset()`
 * (also `registry.resetMetrics()`) with `key` undefined, `remove(labels)` with that label set's
 * key, so counts a bound instrument holds unpublished go with them.
 */
function onReset(metric: object, cleared: (key: string | undefined) => void): void {
  const m = metric as {
    reset: (this: unknown) => unknown;
    remove: (this: unknown, ...args: unknown[]) => unknown;
    labelNames?: readonly string[];
  };
  const reset = m.reset;
  m.reset = function (this: unknown) {
    cleared(undefined);
    return reset.call(this);
  };
  const remove = m.remove;
  m.remove = function (this: unknown, ...args: unknown[]) {
    const names = m.labelNames ?? [];
    const labels =
      typeof args[0] === 'object' && args[0] !== null
        ? (args[0] as Record<string, unknown>)
        : Object.fromEntries(names.map((n, i) => [n, args[i]]));
    cleared(labelKey(labels));
    return remove.apply(this, args);
  };
}

/** The error prom-client raises for a label its metric was not declared with, raised at bind. */
function checkLabelNames(metric: object, labels: object): void {
  const declared = (metric as { labelNames?: readonly string[] }).labelNames ?? [];
  for (const name of Object.keys(labels)) {
    if (!declared.includes(name))
      throw new Error(`label "${name}" is not one of this metric's labels: ${declared.join(', ')}`);
  }
}

/** A Prometheus counter mirrored on an OpenTelemetry Counter. */
export class CounterMetric<T extends string = string> {
  private readonly otel: OtelCounter;
  /** One per label set bound (bounded by the labels' cardinality, however often bind is called). */
  private readonly bound = new Map<string, PendingCount>();
  constructor(
    readonly prom: Counter<T>,
    meter: Meter,
    { name, help }: Described,
  ) {
    this.otel = shared(meter, name, () => meter.createCounter(name, { description: help }));
    onCollect(prom, () => this.publish());
    onReset(prom, (key) => clearPending(this.bound, key));
  }

  inc(value?: number): void;
  inc(labels: LabelValues<T>, value?: number): void;
  inc(a?: LabelValues<T> | number, b?: number): void {
    const [labels, value] = typeof a === 'object' ? [a, b ?? 1] : [undefined, a ?? 1];
    // prom-client first: it throws on a negative increment or an unknown label, before OTel sees it.
    if (labels) this.prom.inc(labels, value);
    else this.prom.inc(value);
    this.otel.add(value, attributes(labels));
  }

  /**
   * `inc(labels, value)` with `labels` bound once. The count is kept in the bound object and
   * added to the prom-client counter when the registry is read (its `collect`), so the per-task
   * call is an addition: prom-client's own `inc` validates and hashes the labels into a new
   * string on every call (with the histograms below, ~12 % of a drain's main-thread samples and
   * 1 KB allocated per task; docs/benchmarks.md, "The worker's metrics"). Every read of the
   * registry (`metrics()`, `get()`, the OpenTelemetry gauges' callbacks) sees every increment
   * made before it.
   */
  bind(labels: LabelValues<T>): BoundCounter {
    // Checked now rather than at the first read, where a throw would fail the scrape.
    checkLabelNames(this.prom, labels);
    const key = labelKey(labels);
    let bound = this.bound.get(key);
    if (bound === undefined) {
      bound = new PendingCount({ ...labels });
      this.bound.set(key, bound);
    }
    const counted = bound;
    const attrs = attributes(bound.labels);
    return {
      inc: (value = 1) => {
        if (!(value >= 0) || !Number.isFinite(value))
          throw new RangeError(`counter increment must be a finite number >= 0, got ${value}`);
        counted.pending += value;
        this.otel.add(value, attrs);
      },
    };
  }

  /** Adds what the bound label sets counted since the last read (prom-client's `collect`). */
  publish(): void {
    for (const b of this.bound.values()) {
      if (b.pending === 0) continue;
      const n = b.pending;
      b.pending = 0;
      this.prom.inc(b.labels as LabelValues<T>, n);
    }
  }

  reset(): void {
    // An OpenTelemetry counter is monotonic: it has no reset. Only the Prometheus side starts over
    // (prom-client's reset, wrapped above, drops the unpublished counts too).
    this.prom.reset();
  }
}

/** A bound label set's increments not yet added to the prom-client counter. */
class PendingCount {
  pending = 0;
  constructor(readonly labels: LabelValues<string>) {}

  clear(): void {
    this.pending = 0;
  }
}

/** Drops unread counts: of every bound label set (`key` undefined), or of one. */
function clearPending(bound: ReadonlyMap<string, { clear(): void }>, key: string | undefined): void {
  if (key === undefined) for (const b of bound.values()) b.clear();
  else bound.get(key)?.clear();
}

/** A Prometheus histogram mirrored on an OpenTelemetry Histogram with the same buckets. */
export class HistogramMetric<T extends string = string> {
  private readonly otel: OtelHistogram;
  /** One per label set bound (bounded by the labels' cardinality, however often bind is called). */
  private readonly bound = new Map<string, PendingObservations>();
  private readonly buckets: readonly number[];
  constructor(
    readonly prom: Histogram<T>,
    meter: Meter,
    { name, help, unit }: Described,
    buckets: number[],
  ) {
    this.buckets = [...buckets];
    onCollect(prom, () => this.publish());
    onReset(prom, (key) => clearPending(this.bound, key));
    this.otel = shared(meter, name, () =>
      meter.createHistogram(name, {
        description: help,
        ...(unit ? { unit } : {}),
        advice: { explicitBucketBoundaries: buckets },
      }),
    );
  }

  observe(value: number): void;
  observe(labels: LabelValues<T>, value: number): void;
  observe(a: LabelValues<T> | number, b?: number): void {
    if (typeof a === 'number') {
      this.prom.observe(a);
      this.otel.record(a);
    } else {
      this.prom.observe(a, b ?? 0);
      this.otel.record(b ?? 0, attributes(a));
    }
  }

  /**
   * `observe(labels, value)` with `labels` bound once. As with a bound counter, the observations
   * are counted into the bound object's own buckets and added to the prom-client histogram when
   * the registry is read. prom-client has no call that adds counts to a bucket, so that step
   * writes its per-label-set entry (`hashMap`), whose shape is checked once per process against
   * a private histogram ({@link histogramEntriesWritable}); where the check fails (another
   * prom-client), a bound histogram observes through prom-client on every call, as before.
   */
  bind(labels: LabelValues<T>): BoundHistogram {
    checkLabelNames(this.prom, labels);
    const bound = { ...labels };
    const attrs = attributes(bound);
    if (!histogramEntriesWritable()) {
      return {
        observe: (value) => {
          this.prom.observe(bound, value);
          this.otel.record(value, attrs);
        },
      };
    }
    const key = labelKey(bound);
    let found = this.bound.get(key);
    if (found === undefined) {
      found = new PendingObservations(bound, this.buckets.length);
      this.bound.set(key, found);
    }
    const pending = found;
    const buckets = this.buckets;
    return {
      observe: (value) => {
        if (!Number.isFinite(value)) throw new TypeError(`histogram value must be a finite number, got ${value}`);
        let i = 0;
        while (i < buckets.length && value > buckets[i]!) i++;
        // Past the last bucket: counted in +Inf only (count and sum), as prom-client does.
        if (i < buckets.length) pending.counts[i]!++;
        pending.count++;
        pending.sum += value;
        this.otel.record(value, attrs);
      },
    };
  }

  /** Adds what the bound label sets observed since the last read (prom-client's `collect`). */
  publish(): void {
    let entries: Map<string, PromHistogramEntry> | null = null;
    const internals = this.prom as unknown as { hashMap: Record<string, PromHistogramEntry> };
    for (const [key, b] of this.bound) {
      if (b.count === 0) continue;
      // prom-client's entries by label set, indexed once per read (one pass over them).
      entries ??= entriesByLabels(internals.hashMap);
      let entry = entries.get(key);
      if (entry === undefined) {
        this.prom.zero(b.labels as LabelValues<T>);
        entry = entriesByLabels(internals.hashMap).get(key);
        if (entry === undefined) continue;
        entries.set(key, entry);
      }
      for (let i = 0; i < b.counts.length; i++) {
        const c = b.counts[i]!;
        if (c === 0) continue;
        entry.bucketValues[this.buckets[i]!] = (entry.bucketValues[this.buckets[i]!] ?? 0) + c;
        b.counts[i] = 0;
      }
      entry.sum += b.sum;
      entry.count += b.count;
      b.sum = 0;
      b.count = 0;
    }
  }

  reset(): void {
    // prom-client's reset, wrapped above, drops the unpublished counts too.
    this.prom.reset();
  }
}

/** A bound label set's observations not yet added to the prom-client histogram. */
class PendingObservations {
  readonly counts: Float64Array;
  count = 0;
  sum = 0;
  constructor(
    readonly labels: LabelValues<string>,
    buckets: number,
  ) {
    this.counts = new Float64Array(buckets);
  }

  clear(): void {
    this.counts.fill(0);
    this.count = 0;
    this.sum = 0;
  }
}

/** prom-client's record of one label set of a histogram: per-bucket (not cumulative) counts by upper bound. */
interface PromHistogramEntry {
  labels: Record<string, unknown>;
  bucketValues: Record<number, number>;
  sum: number;
  count: number;
}

function entriesByLabels(hashMap: Record<string, PromHistogramEntry> | undefined): Map<string, PromHistogramEntry> {
  const out = new Map<string, PromHistogramEntry>();
  if (hashMap !== undefined) for (const e of Object.values(hashMap)) out.set(labelKey(e.labels), e);
  return out;
}

let entriesWritable: boolean | undefined;

/**
 * Whether this prom-client keeps a histogram's label sets as {@link PromHistogramEntry} in
 * `hashMap`, as prom-client 11 to 15 do: checked once, on a histogram of its own that no
 * registry holds, by observing through prom-client and finding the observation where `publish`
 * would add its counts (the bucket keyed by its upper bound, not cumulative; sum and count).
 */
export function histogramEntriesWritable(): boolean {
  if (entriesWritable === undefined) {
    try {
      const h = new Histogram<'k'>({
        name: 'berth_probe',
        help: 'p',
        labelNames: ['k'],
        buckets: [1, 2],
        registers: [],
      });
      h.zero({ k: 'x' });
      h.observe({ k: 'x' }, 1.5);
      const e = entriesByLabels((h as unknown as { hashMap?: Record<string, PromHistogramEntry> }).hashMap).get(
        labelKey({ k: 'x' }),
      );
      entriesWritable =
        e !== undefined && e.bucketValues[1] === 0 && e.bucketValues[2] === 1 && e.sum === 1.5 && e.count === 1;
    } catch {
      entriesWritable = false;
    }
  }
  return entriesWritable;
}

/**
 * How a gauge's values combine when several BerthMetrics on one meter report the same label
 * set: `sum` for counts (slots, tasks, leaders), `max` for an age or a flag.
 */
type Combine = 'sum' | 'max';

interface GaugeSources {
  combine: Combine;
  /** Weak, so a dropped worker's gauges stop being reported (and are not kept alive by the meter). */
  gauges: Set<WeakRef<Gauge<string>>>;
  /** Every label set reported so far (bounded by the labels' cardinality: task types, queues). */
  reported: Map<string, Attributes>;
}

/**
 * A Prometheus gauge mirrored on an OpenTelemetry ObservableGauge whose callback reports the
 * Prometheus gauge's current values, so `set`, `reset` and the rest carry over as they are (a
 * label set a reset removed reads 0 on the OpenTelemetry side: see `observeGauges`).
 */
export class GaugeMetric<T extends string = string> {
  private readonly samplers = new Set<() => number>();
  constructor(
    readonly prom: Gauge<T>,
    meter: Meter,
    { name, help, unit }: Described,
    combine: Combine,
  ) {
    const sources = shared(meter, name, (): GaugeSources => {
      const s: GaugeSources = { combine, gauges: new Set(), reported: new Map() };
      const gauge = meter.createObservableGauge(name, { description: help, ...(unit ? { unit } : {}) });
      gauge.addCallback((result) => observeGauges(s, result));
      return s;
    });
    sources.gauges.add(new WeakRef(prom as unknown as Gauge<string>));
    onCollect(prom, () => {
      if (this.samplers.size > 0) this.prom.set(this.sampled());
    });
  }

  /**
   * Report the (label-free) gauge as `read()` whenever it is read, summed over every reader
   * registered, instead of `set` on every change: the worker's busy slots and prefetched tasks
   * change with every task, and each prom-client `set` allocates its entry anew. Returns the
   * call that removes the reader (the gauge then reads the remaining readers' sum, 0 for none).
   */
  sample(read: () => number): () => void {
    this.samplers.add(read);
    return () => {
      if (this.samplers.delete(read)) this.prom.set(this.sampled());
    };
  }

  /** The readers' sum (0 for none). */
  private sampled(): number {
    let sum = 0;
    for (const read of this.samplers) sum += read();
    return sum;
  }

  set(value: number): void;
  set(labels: LabelValues<T>, value: number): void;
  set(a: LabelValues<T> | number, b?: number): void {
    if (typeof a === 'number') this.prom.set(a);
    else this.prom.set(a, b ?? 0);
  }

  inc(value?: number): void;
  inc(labels: LabelValues<T>, value?: number): void;
  inc(a?: LabelValues<T> | number, b?: number): void {
    if (typeof a === 'object') this.prom.inc(a, b);
    else this.prom.inc(a);
  }

  dec(value?: number): void;
  dec(labels: LabelValues<T>, value?: number): void;
  dec(a?: LabelValues<T> | number, b?: number): void {
    if (typeof a === 'object') this.prom.dec(a, b);
    else this.prom.dec(a);
  }

  reset(): void {
    this.prom.reset();
  }
}

async function observeGauges(s: GaugeSources, result: ObservableResult): Promise<void> {
  const combined = new Map<string, { attrs: Attributes; value: number }>();
  for (const ref of s.gauges) {
    const g = ref.deref();
    if (!g) {
      s.gauges.delete(ref);
      continue;
    }
    for (const v of (await g.get()).values) {
      const attrs = attributes(v.labels);
      const key = JSON.stringify(Object.entries(attrs).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
      const seen = combined.get(key);
      if (!seen) combined.set(key, { attrs, value: v.value });
      else seen.value = s.combine === 'sum' ? seen.value + v.value : Math.max(seen.value, v.value);
    }
  }
  for (const [key, { attrs, value }] of combined) {
    result.observe(value, attrs);
    s.reported.set(key, attrs);
  }
  // The SDK keeps exporting a label set's last observation after the callback stops reporting
  // it; a series the Prometheus gauge dropped (reset) is reported as 0 instead, which is what a
  // reset reads as in PromQL (`max`/`sum` ignore it).
  for (const [key, attrs] of s.reported) if (!combined.has(key)) result.observe(0, attrs);
}

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
  readonly ringPrunes: CounterMetric<'result' | 'reason'>;
  readonly ringRotations: CounterMetric<'result'>;
  readonly deadPruned: CounterMetric;
  readonly isLeader: GaugeMetric;
  readonly queuePaused: GaugeMetric<'queue'>;
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
      'How long the longest-waiting claimable task has been due',
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
    this.wakeups = counter('berth_wakeups_total', 'Fetcher wake-ups by reason (notify, poll, slot_freed, start)', [
      'reason',
    ]);
    this.listenReconnects = counter(
      'berth_listen_reconnects_total',
      'Times the LISTEN connection was lost and re-established',
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
    this.workers = gauge(
      'berth_workers',
      'Worker processes with a fresh heartbeat; exported by the maintenance leader',
      'max',
    );
  }
}
