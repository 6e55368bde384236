/**
 * Primary failover under a real HA manager: pg_auto_failover (Debian package
 * postgresql-15-auto-failover), a monitor and two nodes on local ports (test/support/
 * auto-failover.ts). Two worker processes (test/fixtures/chaos-worker.ts, maintenance on) and a
 * producer in the test use the formation's URI as the monitor gives it, every node listed with
 * target_session_attrs=read-write: berth's connection layer finds the primary itself. Once work
 * flows, the primary node crashes (SIGKILL of its pg_autoctl, keeper and postmaster); the monitor
 * promotes the standby; the fleet must carry on by itself.
 *
 * Asserted, from the processes' run logs (test/support/run-log.ts) and the new primary:
 * - synchronous replication (the manager's default for two nodes): every task whose enqueue
 *   returned completes, and a task that ran twice had its earlier run in flight (or its
 *   completion unwritten) when the primary died;
 * - no worker process crashed; the leader is re-elected on the new primary;
 * - asynchronous replication (replication-quorum false): what is lost is counted and printed,
 *   and only enqueues that returned before the crash can be among it.
 * Printed, never asserted: seconds from the crash to the promotion, to the first write, and the
 * longest stretch without a completed run. Skips only when pg_auto_failover is not installed.
 *
 *   node --import tsx --test test/failover.test.ts
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';
import { enqueueMany, migrate, openPool } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { leaderWorkerId, waitFor } from './helpers.js';
import { autoFailoverMissing, Formation } from './support/auto-failover.js';
import { assertNoCrashes, Fleet } from './support/fleet.js';
import { CHAOS_TASK, explainDuplicates, RunLog, uncompleted, type Run } from './support/run-log.js';

const missing = autoFailoverMissing();
const schema = 'failover';
/** Completions before the crash, so it finds work in flight. */
const WARMUP_RUNS = 100;
/** Completions of tasks enqueued after the promotion before the producer stops. */
const AFTER_RUNS = 100;
const MAX_BACKLOG = 200;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Progress on stderr with FAILOVER_DEBUG=1. */
function debug(line: string): void {
  if (process.env.FAILOVER_DEBUG) console.error(`[failover] ${new Date().toISOString()} ${line}`);
}

/** Enqueues 4 tasks every 50 ms while fewer than MAX_BACKLOG are unfinished; remembers when each call began and returned. */
class Producer {
  readonly returned = new Map<string, { start: number; end: number }>();
  errors = 0;
  private stopped = false;
  private loop: Promise<void> | null = null;
  private n = 0;

  constructor(
    private readonly pool: pg.Pool,
    private readonly unfinished: () => number,
  ) {}

  start(): void {
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop;
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      if (this.unfinished() < MAX_BACKLOG) {
        const specs = Array.from({ length: 4 }, () => ({ type: CHAOS_TASK, payload: { n: this.n++ } }));
        const start = Date.now();
        try {
          const res = await enqueueMany(this.pool, specs, { schema });
          const end = Date.now();
          for (const r of res) if (r.id) this.returned.set(r.id, { start, end });
        } catch {
          // Not counted as enqueued: if it did commit, its task is simply not tracked.
          this.errors++;
        }
      }
      await sleep(50);
    }
  }
}

/** The longest stretch between two completed runs from `from` on, in seconds. */
function longestGap(runs: readonly Run[], from: number): number {
  const ends = runs
    .map((r) => r.end)
    .filter((e): e is number => e !== null && e >= from)
    .sort((a, b) => a - b);
  let gap = 0;
  let prev = from;
  for (const e of ends) {
    gap = Math.max(gap, e - prev);
    prev = e;
  }
  return gap / 1000;
}

interface Outcome {
  tasks: number;
  lost: number;
  duplicates: number;
  unexplained: number;
  promoted: number;
  firstWrite: number;
  gap: number;
  errors: number;
}

async function scenario(synchronous: boolean): Promise<Outcome> {
  const dir = mkdtempSync(join(tmpdir(), 'berth-failover-'));
  const fleet = new Fleet(dir, 0);
  // The worker processes load while the formation starts.
  fleet.warm(2);
  let formation: Formation | null = null;
  let pool: pg.Pool | null = null;
  let producer: Producer | null = null;
  try {
    formation = await Formation.create({ synchronous });
    debug('formation running');
    const url = await formation.uri();
    assert.match(url, /,.*target_session_attrs=read-write/, 'the monitor lists both nodes');
    await migrate({ connectionString: url, schema });
    fleet.target = { databaseUrl: url, schema };
    await Promise.all([fleet.spawn(), fleet.spawn()]);
    const db = openPool({ connectionString: url, max: 4, connectTimeoutMs: 2000 });
    pool = db;
    const runLog = new RunLog();
    const prod: Producer = new Producer(db, () => uncompleted(runs(), prod.returned.keys()).length);
    producer = prod;
    const runs = () => runLog.read(fleet.runLogs).filter((r) => prod.returned.has(r.id));
    const completed = () => runs().filter((r) => r.end !== null).length;
    prod.start();
    await waitFor(() => completed() >= WARMUP_RUNS, 60_000, `${WARMUP_RUNS} runs before the crash`);
    const before = await formation.primary();
    assert.equal(before?.name, 'node1');

    debug('warm; crashing node1');
    const crashAt = Date.now();
    formation.crash('node1');
    const f = formation;
    await waitFor(async () => (await f.primary().catch(() => undefined))?.name === 'node2', 90_000, 'node2 promoted');
    const promotedAt = Date.now();
    debug('node2 promoted');
    // The first enqueue begun after the crash that returned: the new primary takes writes.
    const after = () => [...prod.returned.values()].filter((t) => t.start > crashAt).map((t) => t.end);
    await waitFor(() => after().length > 0, 60_000, 'an enqueue after the crash');
    const writeAt = Math.min(...after());
    await waitFor(
      () => runs().filter((r) => r.end !== null && r.start > writeAt).length >= AFTER_RUNS,
      60_000,
      `${AFTER_RUNS} runs after the promotion`,
    );
    debug('runs after the promotion');
    await prod.stop();
    await waitFor(
      async () => (await leaderWorkerId(db, schema).catch(() => null))?.startsWith('w') === true,
      30_000,
      'a leader on the new primary',
    );
    // Drained: nothing pending on the new primary (what async lost is not there to wait for).
    await waitFor(
      async () => {
        if (synchronous && uncompleted(runs(), prod.returned.keys()).length > 0) return false;
        const g = await readGauges(db, schema).catch(() => null);
        return g !== null && (g.pending.get(CHAOS_TASK) ?? 0) === 0 && (g.running.get(CHAOS_TASK) ?? 0) === 0;
      },
      90_000,
      'every task settled',
    );
    debug('drained');
    const all = runs();
    const lost = uncompleted(all, prod.returned.keys());
    const window = { start: crashAt, end: writeAt };
    const dups = explainDuplicates(all, window, fleet.kills);
    const outcome: Outcome = {
      tasks: prod.returned.size,
      lost: lost.length,
      duplicates: dups.repeated,
      unexplained: dups.unexplained.length,
      promoted: (promotedAt - crashAt) / 1000,
      firstWrite: (writeAt - crashAt) / 1000,
      gap: longestGap(all, crashAt - 1000),
      errors: prod.errors,
    };
    console.log(`failover (${synchronous ? 'synchronous' : 'asynchronous'}): ${JSON.stringify(outcome)}`);
    assertNoCrashes(fleet.crashes);
    assert.deepEqual(
      dups.unexplained.slice(0, 5).map((u) => ({ task: u.id, earlier: u.run, next: u.next, window })),
      [],
      'every repeated run had its earlier run in flight when the primary died',
    );
    if (synchronous)
      assert.deepEqual(lost.slice(0, 10), [], `${lost.length} task(s) whose enqueue returned never completed`);
    else
      assert.deepEqual(
        lost.filter((id) => (prod.returned.get(id)?.start ?? 0) > crashAt),
        [],
        'only enqueues begun before the crash can be lost',
      );
    return outcome;
  } catch (err) {
    throw new Error(`${String(err)}\n${formation?.logs() ?? ''}`, { cause: err });
  } finally {
    await producer?.stop();
    await fleet.stopAll(15_000);
    await pool?.end().catch(() => undefined);
    await formation?.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('synchronous replication: the standby is promoted, the fleet follows, nothing whose enqueue returned is lost', {
  skip: missing ?? false,
}, async () => {
  const o = await scenario(true);
  assert.equal(o.lost, 0);
});

test('asynchronous replication: the fleet follows; what is lost is counted', { skip: missing ?? false }, async () => {
  await scenario(false);
});
