/** The measured scenarios, written once against the SystemAdapter interface. */
import pg from 'pg';
import type { BenchConfig } from './config.js';
import type { CounterDelta, Monitor } from './db.js';
import { cpuMs, GcTally } from './gc-tally.js';
import { busyCores, machineCpu, threadMs, threadTicks } from './machine-cpu.js';
import { percentile } from './stats.js';
import type { Producer, RunningWorker, RunRecorder, SystemAdapter } from './systems/types.js';
import { cleanup, sleep, TimeoutError, waitUntil, withTimeout } from './util.js';

/** Backends flush their commit counters when they exit; give them a moment before reading. */
const STATS_SETTLE_MS = 500;

export type Outcome<T> = { ok: true; value: T } | { ok: false; timeout: boolean; note: string };

/** Tracks handler runs by payload index: distinct handler starts, duplicates, first-run times. */
export class RunTracker implements RunRecorder {
  readonly firstRun: Float64Array;
  distinct = 0;
  duplicates = 0;
  /** performance.now() of the latest first run. */
  lastFirstRun = NaN;
  constructor(readonly n: number) {
    this.firstRun = new Float64Array(n).fill(NaN);
  }
  record(i: number): void {
    const now = performance.now();
    if (!(i >= 0 && i < this.n)) return; // warm-up task
    if (Number.isNaN(this.firstRun[i]!)) {
      this.firstRun[i] = now;
      this.lastFirstRun = now;
      this.distinct++;
    } else {
      this.duplicates++;
    }
  }
}

async function stopWorker(adapter: SystemAdapter, worker: RunningWorker | null): Promise<void> {
  if (worker) await cleanup(`${adapter.label} worker stop`, () => worker.stop());
}

async function closeProducer(adapter: SystemAdapter, producer: Producer | null): Promise<void> {
  if (producer) await cleanup(`${adapter.label} producer close`, () => producer.close());
}

/** Enqueue tasks 0..n-1 in bulk calls of `cfg.bulkBatch` on a producer of its own. */
export async function enqueueAll(adapter: SystemAdapter, cfg: BenchConfig, n: number): Promise<void> {
  const producer = await adapter.openProducer();
  try {
    for (let start = 0; start < n; start += cfg.bulkBatch)
      await producer.bulk(start, Math.min(cfg.bulkBatch, n - start));
  } finally {
    await closeProducer(adapter, producer);
  }
}

export interface DrainResult {
  /** N / (worker start → the instant the database showed every completion recorded). */
  tasksPerSec: number;
  /** N / (worker start → the last handler start). */
  startedPerSec: number;
  /** Last handler start → every completion recorded, ms (late by at most two probe reads and 1 ms). */
  tailMs: number;
  /** WAL and commits; the probe's own read-only commits are already taken out. */
  cost: CounterDelta;
  duplicates: number;
  /**
   * This process's CPU over the same window (every thread: the handlers' and the worker's code,
   * the probe's reads, and V8's background compiler), and its garbage collections. For telling a
   * slow drain's cause apart: a drain that re-optimizes its code uses two to three times the CPU
   * of one that runs compiled code (docs/benchmarks-journal.md, "Issue 35's eighth round").
   */
  processCpuMs: number;
  gcs: { count: number; ms: number };
  /**
   * The whole machine's busy cores (every process: the server, other runs' leftovers) over the
   * STATS_SETTLE_MS pause just before the worker starts, and over the drain; null without
   * /proc/stat. A busy machine before the start means something outside the drain competes with it.
   */
  machineBusy: { before: number | null; during: number | null };
  /** processCpuMs split: the main thread's and the other threads' (V8's compiler and GC helpers), ms; null without /proc. */
  threads: { main: number; helpers: number } | null;
}

/**
 * Poll `pending()` back to back until it reads 0; returns when (performance.now()) the first
 * zero came back, or null at the deadline, and how many probes ran. The zero is observed at
 * most two probe round trips and the 1 ms pause after it became true (the read in flight then
 * still saw an earlier snapshot), which bounds the error; the caller warms the session first.
 */
export async function untilRecorded(
  pending: () => Promise<number>,
  deadline: number,
): Promise<{ at: number | null; probes: number; left: number }> {
  let probes = 0;
  let left = Number.NaN;
  while (performance.now() < deadline) {
    probes++;
    left = await pending();
    if (left === 0) return { at: performance.now(), probes, left };
    await sleep(1);
  }
  return { at: null, probes, left };
}

/**
 * Enqueue `n` tasks in bulk, then start a worker and time until the database shows every
 * completion recorded (the last handler's start is reported too). Server counters are read
 * around the worker's whole life (start to stop, its sessions closed), so WAL and commits
 * include the settlement writes a worker flushes on stop.
 */
export async function drain(
  adapter: SystemAdapter,
  monitor: Monitor,
  cfg: BenchConfig,
  concurrency: number,
): Promise<Outcome<DrainResult>> {
  const n = cfg.drainN;
  await adapter.reset();
  await monitor.checkpoint();
  await enqueueAll(adapter, cfg, n);
  // Polled only once every handler has started, so the probe adds nothing during the drain.
  const probe = new pg.Client({ connectionString: cfg.benchUrl, application_name: 'bench-probe' });
  await probe.connect();
  // One read before the clock: a new session's first read loads the catalog entries of every
  // table it counts and plans the statement (berth's count over its ring partitions: 28-32 ms,
  // then 1.5 ms a read; scratch measurement 2026-12-03), and that first read was the one that
  // ran at the last handler's start, so it landed in every berth drain's "all recorded" time.
  // The same for every system; it commits before `before` is read, so no count includes it.
  await adapter.pending(probe);
  const quietFrom = machineCpu();
  await sleep(STATS_SETTLE_MS);
  const busyBefore = busyCores(quietFrom, machineCpu());
  const before = await monitor.read();

  const tracker = new RunTracker(n);
  const gcs = new GcTally();
  let processCpuMs = 0;
  let worker: RunningWorker | null = null;
  let t0 = 0;
  let recorded: Awaited<ReturnType<typeof untilRecorded>> | null = null;
  let started = false;
  let busyDuring: number | null = null;
  let threads: ReturnType<typeof threadMs> = null;
  try {
    gcs.start();
    const cpuBefore = process.cpuUsage();
    const machineFrom = machineCpu();
    const threadsFrom = threadTicks();
    t0 = performance.now();
    const deadline = t0 + cfg.drainTimeoutMs;
    worker = await adapter.startWorker(concurrency, tracker);
    started = await waitUntil(() => tracker.distinct >= n, Math.max(0, deadline - performance.now()));
    if (started) recorded = await untilRecorded(() => adapter.pending(probe), deadline);
    processCpuMs = cpuMs(process.cpuUsage(cpuBefore));
    busyDuring = busyCores(machineFrom, machineCpu());
    threads = threadMs(threadsFrom, threadTicks());
    // The last gc entries are delivered a tick after the collection.
    await sleep(0);
  } finally {
    gcs.stop();
    await stopWorker(adapter, worker);
    await cleanup('probe close', () => probe.end());
  }
  if (!started || !recorded || recorded.at === null) {
    const elapsedS = (performance.now() - t0) / 1000;
    const note = started
      ? `all ${n.toLocaleString('en-US')} started in ${((tracker.lastFirstRun - t0) / 1000).toFixed(1)} s; ` +
        `${recorded?.left ?? '?'} not recorded as completed after ${Math.round(elapsedS)} s`
      : `${tracker.distinct.toLocaleString('en-US')}/${n.toLocaleString('en-US')} started in ${Math.round(elapsedS)} s ` +
        `≈ ${Math.round(tracker.distinct / elapsedS)}/s`;
    return { ok: false, timeout: true, note };
  }
  await sleep(STATS_SETTLE_MS);
  const after = await monitor.read();
  const cost = await monitor.delta(before, after);
  cost.commits -= recorded.probes;
  const allStartedMs = tracker.lastFirstRun - t0;
  return {
    ok: true,
    value: {
      tasksPerSec: n / ((recorded.at - t0) / 1000),
      startedPerSec: n / (allStartedMs / 1000),
      tailMs: recorded.at - tracker.lastFirstRun,
      cost,
      duplicates: tracker.duplicates,
      processCpuMs,
      gcs: { count: gcs.count, ms: gcs.ms },
      machineBusy: { before: busyBefore, during: busyDuring },
      threads,
    },
  };
}

/** Enqueue rate: `bulk` = cfg.bulkN tasks in batches of cfg.bulkBatch; `single` = cfg.singleN calls, sequentially. */
export async function enqueueRate(
  adapter: SystemAdapter,
  cfg: BenchConfig,
  kind: 'bulk' | 'single',
): Promise<Outcome<number>> {
  await adapter.reset();
  const producer = await adapter.openProducer();
  const n = kind === 'bulk' ? cfg.bulkN : cfg.singleN;
  let done = 0;
  let elapsedMs = 0;
  try {
    const deadline = performance.now() + cfg.enqueueTimeoutMs;
    const t0 = performance.now();
    const loop = (async () => {
      if (kind === 'bulk') {
        for (let start = 0; start < n && performance.now() < deadline; start += cfg.bulkBatch) {
          const count = Math.min(cfg.bulkBatch, n - start);
          await producer.bulk(start, count);
          done += count;
        }
      } else {
        for (let i = 0; i < n && performance.now() < deadline; i++) {
          await producer.single(i);
          done++;
        }
      }
    })();
    // A call that never returns is caught by the bound on the wait, not by the loop's check.
    try {
      await withTimeout(loop, cfg.enqueueTimeoutMs + 5_000, `${adapter.label} ${kind} enqueue`);
    } catch (err) {
      if (!(err instanceof TimeoutError)) throw err;
      loop.catch(() => {});
    }
    elapsedMs = performance.now() - t0;
  } finally {
    await closeProducer(adapter, producer);
  }
  if (done < n) {
    return { ok: false, timeout: true, note: `${done}/${n} in ${Math.round(elapsedMs / 1000)} s` };
  }
  return { ok: true, value: n / (elapsedMs / 1000) };
}

export interface PickupResult {
  p50: number;
  p95: number;
  p99: number;
  max: number;
  /**
   * The p99 of the enqueue call alone (the producer's statement and its commit, whose WAL flush
   * the worker cannot see past: PostgreSQL delivers the notification and shows the row only after
   * it), and of the rest: the call's return to the handler's start (the worker's part).
   */
  callP99: number;
  afterP99: number;
  duplicates: number;
}

/**
 * Nearest-rank percentiles and the maximum of pickup latencies, ms, from the instants before each
 * enqueue call (`sent`), after it returned (`enqueued`) and the handler's start (`ran`).
 */
export function latencyPercentiles(
  sent: ArrayLike<number>,
  enqueued: ArrayLike<number>,
  ran: ArrayLike<number>,
): Omit<PickupResult, 'duplicates'> {
  const lat: number[] = [];
  const calls: number[] = [];
  const after: number[] = [];
  for (let i = 0; i < sent.length; i++) {
    lat.push(ran[i]! - sent[i]!);
    calls.push(enqueued[i]! - sent[i]!);
    after.push(ran[i]! - enqueued[i]!);
  }
  return {
    p50: percentile(lat, 50),
    p95: percentile(lat, 95),
    p99: percentile(lat, 99),
    max: Math.max(...lat),
    callP99: percentile(calls, 99),
    afterP99: percentile(after, 99),
  };
}

/** Each pickup's instants (performance.now()): before its enqueue call, at the call's return, at its handler's start. */
export interface PickupInstants {
  sent: Float64Array;
  enqueued: Float64Array;
  ran: Float64Array;
  duplicates: number;
}

export interface PickupRunOptions {
  n: number;
  gapMs: number;
  concurrency: number;
  /** How long after the last enqueue every task may take to be picked up. */
  tailTimeoutMs: number;
  /** Whose producer enqueues (default: the adapter's own; bench/pickup-tail.ts's `--async`). */
  producerOf?: SystemAdapter;
  /** Called once the worker is idle, right before the first timed enqueue. */
  beforeFirst?: () => void;
}

/**
 * The pickup loop, on a schema the caller reset: a running worker left idle for a second, then
 * tasks 0..n-1 enqueued one at a time every `gapMs`, each with its three instants.
 */
export async function pickupRun(adapter: SystemAdapter, o: PickupRunOptions): Promise<Outcome<PickupInstants>> {
  const { n } = o;
  const tracker = new RunTracker(n);
  const sent = new Float64Array(n).fill(NaN);
  const enqueued = new Float64Array(n).fill(NaN);
  let worker: RunningWorker | null = null;
  let producer: Producer | null = null;
  let finished = false;
  try {
    worker = await adapter.startWorker(o.concurrency, tracker);
    producer = await (o.producerOf ?? adapter).openProducer();
    await producer.single(-1); // warm the producer's connection and statements
    await sleep(1_000); // let the worker go idle
    o.beforeFirst?.();
    const base = performance.now();
    for (let i = 0; i < n; i++) {
      const wait = base + i * o.gapMs - performance.now();
      if (wait > 0) await sleep(wait);
      sent[i] = performance.now();
      await producer.single(i);
      enqueued[i] = performance.now();
    }
    finished = await waitUntil(() => tracker.distinct >= n, o.tailTimeoutMs, 2);
  } finally {
    await stopWorker(adapter, worker);
    await closeProducer(adapter, producer);
  }
  if (!finished) {
    return {
      ok: false,
      timeout: true,
      note: `${tracker.distinct}/${n} picked up ${o.tailTimeoutMs / 1000} s after the last enqueue`,
    };
  }
  return { ok: true, value: { sent, enqueued, ran: tracker.firstRun, duplicates: tracker.duplicates } };
}

/**
 * Idle pickup latency: a running, idle worker; tasks enqueued one at a time every gap ms; the
 * latency of task i is its handler's start minus the instant just before its enqueue call.
 */
export async function pickup(adapter: SystemAdapter, cfg: BenchConfig): Promise<Outcome<PickupResult>> {
  await adapter.reset();
  const run = await pickupRun(adapter, {
    n: cfg.pickupN,
    gapMs: cfg.pickupGapMs,
    concurrency: cfg.pickupConcurrency,
    tailTimeoutMs: cfg.pickupTailTimeoutMs,
  });
  if (!run.ok) return run;
  const { sent, enqueued, ran, duplicates } = run.value;
  return { ok: true, value: { ...latencyPercentiles(sent, enqueued, ran), duplicates } };
}
