/**
 * The cold rows of `npm run bench`: what a system does in a process that has run nothing before,
 * as a fleet that deploys or autoscales starts. Each measurement is a child process of its own
 * (bench/cold-child.ts) that has loaded the systems' modules and nothing more; this process
 * enqueues, probes the database and keeps the clock, with the same counting as the warm rows:
 * a drained task counts once the database shows its completion recorded.
 */
import { fork, type ChildProcess } from 'node:child_process';
import pg from 'pg';
import type { BenchConfig } from './config.js';
import { dropDatabase, recreateDatabase } from './db.js';
import type { ChildMessage, ColdJob, ParentMessage } from './cold-child.js';
import { enqueueAll, type Outcome, type PickupResult, latencyPercentiles, untilRecorded } from './scenarios.js';
import type { SystemAdapter } from './systems/types.js';
import { cleanup, log, sleep } from './util.js';

const epoch = (): number => performance.timeOrigin + performance.now();

/** Loading the systems' modules in a new process: a few seconds on a loaded machine. */
const READY_TIMEOUT_MS = 60_000;

/** A child process running one cold job, and the messages it sent. */
class ColdChild {
  private readonly child: ChildProcess;
  private readonly inbox: ChildMessage[] = [];
  private readonly waiters: (() => void)[] = [];
  private exited = false;

  constructor(job: ColdJob) {
    this.child = fork(new URL('./cold-child.ts', import.meta.url), [JSON.stringify(job)], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      // BENCH_CHILD_NODE_OPTIONS: V8 flags for the child only (a probe's --trace-gc, say).
      execArgv: [...process.execArgv, ...(process.env.BENCH_CHILD_NODE_OPTIONS?.split(' ').filter(Boolean) ?? [])],
    });
    this.child.on('message', (msg: ChildMessage) => {
      this.inbox.push(msg);
      this.wake();
    });
    this.child.on('error', () => undefined);
    this.child.on('exit', () => {
      this.exited = true;
      this.wake();
    });
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Every message received so far of this type. */
  received<T extends ChildMessage['type']>(type: T): Extract<ChildMessage, { type: T }>[] {
    return this.inbox.filter((m): m is Extract<ChildMessage, { type: T }> => m.type === type);
  }

  /** The first message of `type`, or a failure note (the child failed, exited or ran out of time). */
  async wait<T extends ChildMessage['type']>(
    type: T,
    timeoutMs: number,
  ): Promise<Extract<ChildMessage, { type: T }> | string> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const found = this.received(type)[0];
      if (found) return found;
      const failed = this.received('failed')[0];
      if (failed) return failed.note;
      if (this.exited) return `the child exited before '${type}'`;
      const left = deadline - performance.now();
      if (left <= 0) return `no '${type}' within ${Math.round(timeoutMs / 1000)} s`;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  tell(msg: ParentMessage): void {
    // A child that has just finished may be gone by now: its error is the callback's, not a crash.
    if (!this.exited && this.child.connected) this.child.send(msg, () => undefined);
  }

  /** Ask the worker to stop and wait for the process to exit; killed if it does not. */
  async end(): Promise<void> {
    this.tell({ type: 'stop' });
    await cleanup('cold child exit', async () => {
      const deadline = performance.now() + 30_000;
      while (!this.exited && performance.now() < deadline) await sleep(20);
      if (!this.exited) {
        this.child.kill('SIGKILL');
        throw new Error('the cold child did not exit; killed');
      }
    });
  }
}

export interface ColdDrainResult {
  tasksPerSec: number;
  startedPerSec: number;
  tailMs: number;
  /** From the clock's start (just before the worker is made) to its start() resolving, and to its first handler run. */
  startMs: number;
  firstRunMs: number;
  duplicates: number;
}

/** A cold drain: `cfg.drainN` tasks queued, then a new process starts the worker. */
export async function coldDrain(
  adapter: SystemAdapter,
  cfg: BenchConfig,
  concurrency: number,
): Promise<Outcome<ColdDrainResult>> {
  const n = cfg.drainN;
  await adapter.reset();
  await enqueueAll(adapter, cfg, n);
  const probe = new pg.Client({ connectionString: cfg.benchUrl, application_name: 'bench-probe' });
  await probe.connect();
  const child = new ColdChild({ kind: 'drain', label: adapter.label, url: cfg.benchUrl, concurrency, n });
  try {
    await adapter.pending(probe); // the probe's first read (catalog, plan) before the clock
    const ready = await child.wait('ready', READY_TIMEOUT_MS);
    if (typeof ready === 'string') return { ok: false, timeout: false, note: ready };
    child.tell({ type: 'go' });
    const started = await child.wait('started', cfg.drainTimeoutMs);
    if (typeof started === 'string') return { ok: false, timeout: true, note: started };
    const recorded = await untilRecorded(() => adapter.pending(probe), performance.now() + cfg.drainTimeoutMs);
    if (recorded.at === null)
      return { ok: false, timeout: true, note: `${recorded.left} not recorded as completed in time` };
    const recordedAt = performance.timeOrigin + recorded.at;
    return {
      ok: true,
      value: {
        tasksPerSec: n / ((recordedAt - started.t0) / 1000),
        startedPerSec: n / ((started.lastFirstRun - started.t0) / 1000),
        tailMs: recordedAt - started.lastFirstRun,
        startMs: started.up - started.t0,
        firstRunMs: started.firstRun - started.t0,
        duplicates: started.duplicates,
      },
    };
  } finally {
    await child.end();
    await cleanup('probe close', () => probe.end());
  }
}

/** What bench/cold-pickup-probe.ts reads of one cold pickup run, before the child stops. */
export interface ColdPickupDetail {
  /** Epoch ms at which the child said its worker had started (its `start()` resolved). */
  workerStartedAt: number;
  /** Per task, epoch ms just before its enqueue call, and its latency (ms). */
  sent: Float64Array;
  latencies: Float64Array;
  /** Per task, epoch ms at which its enqueue call returned. */
  enqueued: Float64Array;
}

/**
 * Pickup in a new process: the worker starts in the child, idles a second, then this process
 * enqueues `cfg.coldPickupN` tasks one at a time `cfg.pickupGapMs` apart. `detail`, if given, is
 * called with the per-task numbers while the child's worker still runs (its sessions still open).
 */
export async function coldPickup(
  adapter: SystemAdapter,
  cfg: BenchConfig,
  detail?: (d: ColdPickupDetail) => Promise<void>,
): Promise<Outcome<PickupResult>> {
  const n = cfg.coldPickupN;
  await adapter.reset();
  const child = new ColdChild({
    kind: 'pickup',
    label: adapter.label,
    url: cfg.benchUrl,
    concurrency: cfg.pickupConcurrency,
  });
  const producer = await adapter.openProducer();
  try {
    await producer.single(-1); // this process's producer is warm: the worker is what is measured
    const ready = await child.wait('ready', READY_TIMEOUT_MS);
    if (typeof ready === 'string') return { ok: false, timeout: false, note: ready };
    child.tell({ type: 'go' });
    const up = await child.wait('workerStarted', cfg.drainTimeoutMs);
    if (typeof up === 'string') return { ok: false, timeout: true, note: up };
    const workerStartedAt = epoch();
    await sleep(1_000); // idle, as the warm pickup lets its worker go idle
    const sent = new Float64Array(n).fill(Number.NaN);
    const enqueued = new Float64Array(n).fill(Number.NaN);
    const base = performance.now();
    for (let i = 0; i < n; i++) {
      const wait = base + i * cfg.pickupGapMs - performance.now();
      if (wait > 0) await sleep(wait);
      sent[i] = epoch();
      await producer.single(i);
      enqueued[i] = epoch();
    }
    const deadline = performance.now() + cfg.pickupTailTimeoutMs;
    const picked = () =>
      new Set(
        child
          .received('run')
          .filter((m) => m.i >= 0 && m.i < n)
          .map((m) => m.i),
      ).size;
    while (picked() < n && performance.now() < deadline) await sleep(5);
    if (picked() < n)
      return {
        ok: false,
        timeout: true,
        note: `${picked()}/${n} picked up ${cfg.pickupTailTimeoutMs / 1000} s after the last enqueue`,
      };
    const ran = new Float64Array(n).fill(Number.NaN);
    let duplicates = 0;
    for (const m of child.received('run')) {
      if (!(m.i >= 0 && m.i < n)) continue;
      if (Number.isNaN(ran[m.i]!)) ran[m.i] = m.at;
      else duplicates++;
    }
    const lat = ran.map((at, i) => at - sent[i]!);
    await detail?.({ workerStartedAt, sent, latencies: lat, enqueued });
    return { ok: true, value: { ...latencyPercentiles(sent, enqueued, ran), duplicates } };
  } finally {
    await child.end();
    await cleanup('producer close', () => producer.close());
  }
}

export interface FirstEnqueueResult {
  /** The first single-task enqueue of a new process, on a new session, ms. */
  firstMs: number;
  /** The median of the calls after it, ms. */
  laterMs: number;
}

/**
 * A new process enqueues into an installation in use, not one made a moment ago: this process
 * enqueues USED_TASKS tasks first, one call each. A schema just installed has none of what its
 * first enqueues create once in an installation's life (berth makes a lane, with its sequence, the
 * first time a queue, priority and shard is used: 16 lanes for the default queue's 16 shards, and
 * a new lane cost the first call ~10 ms more of server time: docs/benchmarks-journal.md, "A new
 * process's first enqueue, client and server"); a deploy or an autoscaled process enqueues into
 * an installation that has them.
 */
const USED_TASKS = 64;

async function useInstallation(adapter: SystemAdapter, url: string): Promise<void> {
  const producer = await adapter.openProducer();
  try {
    for (let i = 0; i < USED_TASKS; i++) await producer.single(1_000_000 + i);
  } finally {
    await producer.close();
  }
  await vacuumAsInUse(url);
}

/** How long a first-enqueue measurement waits for autovacuum workers to finish (vacuumAsInUse). */
const AUTOVACUUM_WAIT_MS = 20_000;

/**
 * An installation in use has had its catalogs vacuumed and analyzed since it was made:
 * autovacuum has removed the dead catalog rows its migrations left (every `CREATE OR REPLACE
 * FUNCTION` of a later migration leaves the earlier row) and analyzed the catalogs they grew. So
 * the database is vacuumed and analyzed before every system's measurement alike; otherwise
 * autovacuum does it at a moment of its own, possibly while the measured call runs.
 *
 * Then the measurement waits (at most AUTOVACUUM_WAIT_MS) until no autovacuum worker runs in
 * the cluster: after the drains before this scenario autovacuum may work through the bench
 * database, and a worker running beside the measured 15 ms call would take one of the
 * machine's two cores. A guard, not a measured cause: the run logs each wait, and the
 * scenario runs of 2026-12-07 09:35 had none.
 */
async function vacuumAsInUse(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query('VACUUM ANALYZE');
    const from = performance.now();
    for (let polls = 0; ; polls++) {
      const { rows } = await client.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'",
      );
      const waited = performance.now() - from;
      if (rows[0]?.n === 0) {
        if (polls > 0) log(`  (waited ${Math.round(waited)} ms for autovacuum to finish)`);
        break;
      }
      if (waited > AUTOVACUUM_WAIT_MS) {
        log(`  (autovacuum still running after ${AUTOVACUUM_WAIT_MS / 1000} s; measuring anyway)`);
        break;
      }
      await sleep(50);
    }
  } finally {
    await client.end();
  }
}

/**
 * Each first-enqueue measurement runs in a database made for it, then dropped, as a user's
 * installation lives in a database that has not seen the schema dropped and made again.
 *
 * The bench's own database has: every scenario drops and reinstalls each system's schema, dozens
 * of times in a run, and each reinstall leaves the previous one's catalog rows (a row in
 * pg_class, pg_attribute, pg_proc, pg_depend … for every object, under the same names) in the
 * catalog indexes that a new session's first statements search. `VACUUM` removes the rows but
 * does not shrink those indexes. The cost falls on the system with more objects: in the bench's
 * database a new session's first berth enqueue cost the server 14.9 ms of CPU right after a
 * reinstall and 12.9 after a `VACUUM`, graphile-worker's first `addJob` 13.5 and 13.6
 * (docs/benchmarks-journal.md, "Issue 35's twelfth round"); on a schema installed once, long
 * before, berth's first call took 14.7 ms of wall time against graphile-worker's 16.0. Every
 * system is measured the same way, in a database of its own.
 */
const FIRST_ENQUEUE_DB = 'berth_bench_first_enqueue';

/**
 * A new process opens a producer (its session: `SELECT 1`) and enqueues: the first call, then
 * `calls` more, in a database of its own with the system installed and used there.
 * `migrateFirst`: the system's own migrate() runs on that session before the first call.
 */
export async function coldFirstEnqueue(
  adapterAt: (url: string) => SystemAdapter,
  cfg: BenchConfig,
  migrateFirst = false,
): Promise<Outcome<FirstEnqueueResult>> {
  const at = new URL(cfg.benchUrl);
  at.pathname = `/${FIRST_ENQUEUE_DB}`;
  const url = at.toString();
  let child: ColdChild | null = null;
  try {
    await recreateDatabase(cfg.adminUrl, FIRST_ENQUEUE_DB);
    const adapter = adapterAt(url);
    await adapter.reset();
    await useInstallation(adapter, url);
    child = new ColdChild({ kind: 'enqueue', label: adapter.label, url, calls: 20, migrateFirst });
    const ready = await child.wait('ready', READY_TIMEOUT_MS);
    if (typeof ready === 'string') return { ok: false, timeout: false, note: ready };
    child.tell({ type: 'go' });
    const done = await child.wait('enqueued', cfg.enqueueTimeoutMs);
    if (typeof done === 'string') return { ok: false, timeout: true, note: done };
    const later = [...done.laterMs].sort((a, b) => a - b);
    return { ok: true, value: { firstMs: done.firstMs, laterMs: later[Math.floor(later.length / 2)] ?? Number.NaN } };
  } finally {
    await child?.end();
    await cleanup('first-enqueue database', () => dropDatabase(cfg.adminUrl, FIRST_ENQUEUE_DB));
  }
}
