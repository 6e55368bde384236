/** Benchmark settings: defaults per the benchmark spec, shrinkable through BENCH_* env vars. */

/** A comma-separated list of positive integers from the environment, e.g. "20000,200000". */
export function intListEnv(name: string, fallback: readonly number[]): readonly number[] {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === '') return fallback;
  const xs = raw.split(',').map((x) => Number(x.trim()));
  if (xs.length === 0 || xs.some((n) => !Number.isInteger(n) || n < 1)) {
    throw new Error(`${name} must be a comma-separated list of positive integers, got "${raw}"`);
  }
  return xs;
}

export function intEnv(name: string, fallback: number, min = 1): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got "${raw}"`);
  return n;
}

export interface BenchConfig {
  /** Server to connect to for creating the bench database (the dedicated cluster, or BENCH_DATABASE_URL). */
  adminUrl: string;
  /** The dedicated database, dropped and recreated at start. */
  benchDbName: string;
  benchUrl: string;
  reps: number;
  /** Tasks per drain run (BENCH_DRAIN_N). */
  drainN: number;
  /**
   * Tasks of the unrecorded warm-up drain each system runs before the repetitions
   * (BENCH_WARMUP_N; 0 skips it), and how long it may take.
   */
  warmupN: number;
  warmupTimeoutMs: number;
  drainConcurrencies: readonly number[];
  /** Tasks per bulk-enqueue run and tasks per enqueue call. */
  bulkN: number;
  bulkBatch: number;
  /** Sequential single-task enqueues per run. */
  singleN: number;
  pickupN: number;
  /** Run the cold rows (BENCH_COLD=0 skips them). */
  cold: boolean;
  /** Pickups of the cold row, in a new process (BENCH_COLD_PICKUP_N). */
  coldPickupN: number;
  pickupGapMs: number;
  pickupConcurrency: number;
  /** Drain: time allowed from worker start to the last handler (BENCH_TIMEOUT_S). */
  drainTimeoutMs: number;
  /** Enqueue scenarios: time allowed for the whole run. */
  enqueueTimeoutMs: number;
  /** Pickup: time allowed after the last enqueue for the stragglers. */
  pickupTailTimeoutMs: number;
  /** Only run rows whose label contains one of these (BENCH_SYSTEMS, comma separated). */
  systemFilter: readonly string[];
  /**
   * Only run scenarios whose name is one of these (BENCH_SCENARIOS, comma separated, e.g.
   * `drain c10,pickup latency`); empty runs every scenario. For finding what one scenario does
   * to the next; a published run runs them all.
   */
  scenarioFilter: readonly string[];
}

/** A comma-separated list, trimmed and lower-cased; unset or empty is []. */
function listEnv(name: string): string[] {
  return (process.env[name] ?? '')
    .split(',')
    .map((s) => s.trim().toLowerCase())
    .filter(Boolean);
}

export function loadConfig(adminUrl: string): BenchConfig {
  const benchDbName = 'berth_bench';
  const u = new URL(adminUrl);
  u.pathname = `/${benchDbName}`;
  const timeoutS = intEnv('BENCH_TIMEOUT_S', 60);
  return {
    adminUrl,
    benchDbName,
    benchUrl: u.toString(),
    reps: intEnv('BENCH_REPS', 3),
    drainN: intEnv('BENCH_DRAIN_N', 20_000),
    // 100,000: a process drains 20,000-task batches at its plateau only from its third (berth:
    // worker CPU 765, 460, then 280-300 ms a drain) or fifth (graphile-worker's preset: 22.6k,
    // 24.0k, 25.0k, 27.6k, then 29-31k tasks/s) batch on; after a 5,000-task warm-up the first
    // repetition was often the slowest (docs/benchmarks-journal.md, "A process's first 100,000 tasks").
    warmupN: intEnv('BENCH_WARMUP_N', 100_000, 0),
    warmupTimeoutMs: 15_000,
    drainConcurrencies: [10, 50],
    // 100 calls of 1,000: every system's first call on a new session takes 32-41 ms against
    // berth's 7.3 ms and graphile-worker's 15 ms after it, so over 20 calls the row measured
    // mostly that first call (bench/bulk-calls.ts; docs/benchmarks-journal.md, "Bulk enqueue call by call").
    bulkN: intEnv('BENCH_BULK_N', 100_000),
    bulkBatch: 1_000,
    singleN: intEnv('BENCH_SINGLE_N', 2_000),
    // 2,000 pickups a repetition (20 s a system): at 500 the p99 was the fifth-slowest pickup,
    // and three 500-pickup repetitions of one build spread its p99 over 10.5-11.8 ms and its
    // p95 over 4.3-6.1 ms in one hour (docs/benchmarks-journal.md, "Pickup with 2,000 samples").
    pickupN: intEnv('BENCH_PICKUP_N', 2_000),
    // 500 pickups 10 ms apart: the first five seconds of a new process, where its tail is.
    cold: process.env.BENCH_COLD !== '0',
    coldPickupN: intEnv('BENCH_COLD_PICKUP_N', 500),
    pickupGapMs: 10,
    pickupConcurrency: 10,
    drainTimeoutMs: timeoutS * 1000,
    enqueueTimeoutMs: timeoutS * 1000,
    pickupTailTimeoutMs: Math.min(30, timeoutS) * 1000,
    systemFilter: listEnv('BENCH_SYSTEMS'),
    scenarioFilter: listEnv('BENCH_SCENARIOS'),
  };
}
