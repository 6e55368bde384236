/**
 * The instrument framework: a prom-client metric mirrored on an OpenTelemetry instrument of the
 * same name, labels and buckets (counter, histogram, gauge), with the bound (per-task) label sets
 * that count in themselves and hand their counts to prom-client when the registry is read. What
 * berth measures with it is in catalogue.ts.
 */
import type {
  Attributes,
  Counter as OtelCounter,
  Histogram as OtelHistogram,
  Meter,
  ObservableResult,
} from '@opentelemetry/api';
import { Histogram, type Counter, type Gauge, type LabelValues } from 'prom-client';

/** The OpenTelemetry name of a Prometheus metric: the same, less a counter's `_total` (see BerthMetrics in catalogue.ts). */
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
 * labels object and its OpenTelemetry attributes on every call. Call `inc` (and a bound
 * histogram's `observe`) on the bound object: they are methods, not functions to take off it.
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
   * 1 KB allocated per task; docs/benchmarks-journal.md, "The worker's metrics"). Every read of the
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
    return new BoundCount(bound, this.otel, attributes(bound.labels));
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

/**
 * A counter's bound label set. An object of a class, not a closure per binding: each worker binds
 * its own, and code compiled around the last worker's closure (inlined into the settlement's
 * count) was thrown away with it once that worker was collected; a method outlives every worker.
 */
class BoundCount implements BoundCounter {
  constructor(
    private readonly counted: PendingCount,
    private readonly otel: OtelCounter,
    private readonly attrs: Attributes,
  ) {}

  inc(value = 1): void {
    if (!(value >= 0) || !Number.isFinite(value))
      throw new RangeError(`counter increment must be a finite number >= 0, got ${value}`);
    this.counted.pending += value;
    this.otel.add(value, this.attrs);
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
    if (!histogramEntriesWritable()) return new BoundPromHistogram(this.prom, bound, this.otel, attrs);
    const key = labelKey(bound);
    let found = this.bound.get(key);
    if (found === undefined) {
      found = new PendingObservations(bound, this.buckets.length);
      this.bound.set(key, found);
    }
    return new BoundPendingHistogram(found, this.buckets, this.otel, attrs);
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

/** A histogram's bound label set, counting in itself (an object of a class: see BoundCount). */
class BoundPendingHistogram implements BoundHistogram {
  constructor(
    private readonly pending: PendingObservations,
    private readonly buckets: readonly number[],
    private readonly otel: OtelHistogram,
    private readonly attrs: Attributes,
  ) {}

  observe(value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`histogram value must be a finite number, got ${value}`);
    const buckets = this.buckets;
    const pending = this.pending;
    let i = 0;
    while (i < buckets.length && value > buckets[i]!) i++;
    // Past the last bucket: counted in +Inf only (count and sum), as prom-client does.
    if (i < buckets.length) pending.counts[i]!++;
    pending.count++;
    pending.sum += value;
    this.otel.record(value, this.attrs);
  }
}

/** A histogram's bound label set where prom-client's entries are not writable: observed through prom-client every time. */
class BoundPromHistogram implements BoundHistogram {
  constructor(
    private readonly prom: Histogram<string>,
    private readonly labels: LabelValues<string>,
    private readonly otel: OtelHistogram,
    private readonly attrs: Attributes,
  ) {}

  observe(value: number): void {
    this.prom.observe(this.labels, value);
    this.otel.record(value, this.attrs);
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
export type Combine = 'sum' | 'max';

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
