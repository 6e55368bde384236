/**
 * Chaos suite: berth under process and database faults, on a PostgreSQL cluster of its own
 * (test/support/cluster.ts), so it can stop, crash and restart that server freely.
 *
 * The scenarios run one after another on one schema, with 3 worker processes
 * (test/fixtures/chaos-worker.ts; a killed one is replaced). Each has producers enqueuing a
 * steady trickle of tasks (plain statements, and transactions at REPEATABLE READ and at
 * SERIALIZABLE that hold their snapshot before they enqueue) and one fault once work is flowing,
 * and drains before the next starts.
 * Each asserts, from the processes' run logs (its own tasks only) and what berth records:
 * - no task is lost: every enqueued task has a run that returned, nothing is left pending, and
 *   nothing was dead-lettered;
 * - every process the test started is alive unless the test killed it (a berth process that
 *   crashes on a database fault fails the scenario, with its output);
 * - every repeated run is explained: the earlier run's process was killed while it was in flight,
 *   or (database faults) it straddled the fault window; a repeat whose earlier run overran its
 *   deadline (a starved process on a loaded machine) is explained too, but counted apart (`late`);
 * - throughput recovers: runs that started after the fault complete (the seconds until the first
 *   RECOVERY_RUNS of them are reported, never asserted).
 * It prints one row per scenario (docs/architecture.md, "Chaos suite", keeps a copy).
 *
 *   node --import tsx --test test/chaos.test.ts
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { enqueueMany, leaderInfo, migrate } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { leaderApplicationName } from '../src/storage/locks.js';
import { quoteIdent } from '../src/sql.js';
import { laneCursor, liveEntries } from '../src/storage/predicates.js';
import { waitFor } from './helpers.js';
import { TestCluster } from './support/cluster.js';
import { assertNoCrashes, Fleet, type FleetProcess } from './support/fleet.js';
import {
  CHAOS_TASK,
  explainDuplicates,
  recoverySeconds,
  RunLog,
  uncompleted,
  type FaultWindow,
} from './support/run-log.js';

const WORKERS = 3;
/** Completions before the fault, so it finds work in flight. */
const WARMUP_RUNS = 150;
/** The most unfinished tasks the producer lets stand (see Producer). */
const MAX_BACKLOG = 300;
/** Completions after the fault that count as "throughput recovered". */
const RECOVERY_RUNS = 50;
/** The test's own sessions: never terminated by the session-kill scenario. */
const TEST_APP = 'berth chaos test';
/** Liveness bounds, not expectations (waitFor multiplies them by BERTH_TEST_TIMEOUT_SCALE, 3). */
const WARMUP_TIMEOUT_MS = 30_000;
const RECOVERY_TIMEOUT_MS = 30_000;
const DRAIN_TIMEOUT_MS = 45_000;

/**
 * One cluster, one schema and one fleet for every scenario: starting processes is the slow part
 * on a busy machine. The first workers load while initdb runs, and two spares stay loaded (a
 * replacement starts at once even after kills in a row).
 */
const schema = 'chaos';
const dir = mkdtempSync(join(tmpdir(), 'berth-chaos-'));
const fleet = new Fleet(dir, 2);
const setupBegan = Date.now();
fleet.warm(WORKERS + 2);
const cluster = await TestCluster.create();
fleet.target = { databaseUrl: cluster.url(), schema };
debug(`cluster running after ${((Date.now() - setupBegan) / 1000).toFixed(1)} s`);
const runLog = new RunLog();
const rows: Row[] = [];
const pool = new pg.Pool({ connectionString: cluster.url(), max: 4, application_name: TEST_APP });
// The test's own idle sessions die with the server; the pool drops them and reconnects.
pool.on('error', () => undefined);
after(async () => {
  if (rows.length > 0) console.log(`\nChaos suite (${WORKERS} worker processes)\n${formatTable(rows)}\n`);
  await fleet.stopAll();
  await pool.end();
  await cluster.destroy();
  rmSync(dir, { recursive: true, force: true });
});
await migrate({ connectionString: cluster.url(), schema });

interface Row {
  scenario: string;
  tasks: number;
  /** Of them, enqueued at REPEATABLE READ / SERIALIZABLE. */
  transactional: string;
  lost: number;
  left: number;
  duplicates: number;
  late: number;
  unexplained: number;
  recovery: number | null;
  survivors: string;
  killed: number;
  seconds: number;
}

function formatTable(list: readonly Row[]): string {
  const head = [
    'scenario',
    'tasks',
    'RR/SER',
    'lost',
    'left',
    'dup runs',
    'late',
    'unexplained',
    'recovery s',
    'survivors',
    'killed',
    'took s',
  ];
  const body = list.map((r) => [
    r.scenario,
    String(r.tasks),
    r.transactional,
    String(r.lost),
    String(r.left),
    String(r.duplicates),
    String(r.late),
    String(r.unexplained),
    r.recovery === null ? 'none' : r.recovery.toFixed(1),
    r.survivors,
    String(r.killed),
    r.seconds.toFixed(0),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (cells: string[]) =>
    `| ${cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ')} |`;
  return [
    line(head),
    `|${widths.map((w, i) => (i === 0 ? ':' : '') + '-'.repeat(w + 1) + (i === 0 ? '' : ':')).join('|')}|`,
    ...body.map(line),
  ].join('\n');
}

/** Progress on stderr with CHAOS_DEBUG=1 (where the time goes on a busy machine). */
function debug(line: string): void {
  if (process.env.CHAOS_DEBUG) console.error(`[chaos] ${line}`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type TxLevel = 'REPEATABLE READ' | 'SERIALIZABLE';
const TX_LEVELS: readonly TxLevel[] = ['REPEATABLE READ', 'SERIALIZABLE'];

/**
 * A steady trickle of tasks (8 every 50 ms as plain statements, while fewer than MAX_BACKLOG are
 * unfinished, so a slow machine gets fewer tasks rather than a backlog it cannot drain), some
 * delayed if asked; and beside it one producer at REPEATABLE READ and one at SERIALIZABLE, each a
 * transaction after another that takes its snapshot, waits up to 200 ms (the ring may rotate and
 * prune meanwhile), enqueues 1-3 tasks and commits, retrying on a serialization failure as an
 * application would. Remembers every id whose COMMIT returned.
 */
class Producer {
  readonly ids = new Set<string>();
  /** Tasks of each transaction producer whose COMMIT returned. */
  readonly byLevel = new Map<TxLevel, number>(TX_LEVELS.map((l) => [l, 0]));
  /** Enqueues that failed (none expected: the producers pause while the server is down). */
  errors = 0;
  private paused = false;
  private stopped = false;
  private readonly inFlight = new Set<Promise<unknown>>();
  private loops: Promise<void>[] = [];
  private n = 0;

  constructor(
    private readonly pool: pg.Pool,
    private readonly schema: string,
    private readonly delayed: boolean,
    /** How many of its tasks have not completed yet. */
    private readonly unfinished: () => number,
  ) {}

  start(): void {
    this.loops = [this.run(() => this.plain()), ...TX_LEVELS.map((l) => this.run(() => this.transaction(l)))];
  }

  private async run(step: () => Promise<void>): Promise<void> {
    while (!this.stopped) {
      if (!this.paused && this.unfinished() < MAX_BACKLOG) {
        const p = step();
        this.inFlight.add(p);
        await p;
        this.inFlight.delete(p);
      }
      await sleep(50);
    }
  }

  private spec() {
    return {
      type: CHAOS_TASK,
      payload: { n: this.n++ },
      // Due 0.5-4 s from now: some come due across the fault, so promotion must carry on.
      ...(this.delayed && Math.random() < 0.5 ? { delay: 500 + Math.floor(Math.random() * 3500) } : {}),
    };
  }

  private async plain(): Promise<void> {
    const specs = Array.from({ length: 8 }, () => this.spec());
    await enqueueMany(this.pool, specs, { schema: this.schema }).then(
      (res) => {
        for (const r of res) if (r.id) this.ids.add(r.id);
      },
      // Not counted as enqueued: if it did commit, its task is simply not tracked.
      (err: Error) => {
        this.errors++;
        debug(`enqueue failed: ${err.message}`);
      },
    );
  }

  private async transaction(level: TxLevel): Promise<void> {
    let client: pg.PoolClient | undefined;
    try {
      client = await this.pool.connect();
      for (let attempt = 1; ; attempt++) {
        try {
          await client.query(`BEGIN ISOLATION LEVEL ${level}`);
          await client.query('SELECT 1');
          await sleep(Math.floor(Math.random() * 200));
          const res = await enqueueMany(
            client,
            Array.from({ length: 1 + Math.floor(Math.random() * 3) }, () => this.spec()),
            { schema: this.schema },
          );
          await client.query('COMMIT');
          for (const r of res) if (r.id) this.ids.add(r.id);
          this.byLevel.set(level, this.byLevel.get(level)! + res.length);
          return;
        } catch (err) {
          await client.query('ROLLBACK').catch(() => undefined);
          if ((err as { code?: string }).code !== '40001' || attempt >= 10) throw err;
        }
      }
    } catch (err) {
      // Not counted as enqueued: if its COMMIT did go through, its tasks are simply not tracked.
      this.errors++;
      debug(`${level} enqueue failed: ${(err as Error).message}`);
      client?.release(err as Error);
      client = undefined;
    } finally {
      client?.release();
    }
  }

  /** Stop enqueuing (for a database fault); resolves once the enqueues in flight have finished. */
  async pause(): Promise<void> {
    this.paused = true;
    await Promise.all(this.inFlight);
  }

  resume(): void {
    this.paused = false;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.loops);
  }
}

/** What a scenario's fault sees. */
interface Ctx {
  fleet: Fleet;
  pool: pg.Pool;
  schema: string;
}

interface Scenario {
  name: string;
  /** Pause the producer during the fault (the server goes away). */
  serverDown?: boolean;
  /** A repeat whose earlier run straddled the fault window is explained (database faults). */
  windowExplains: boolean;
  delayed?: boolean;
  /** Before the fault window opens: wait for whatever the fault needs. */
  prepare?(ctx: Ctx): Promise<void>;
  /** The fault itself; resolves when it is over. */
  inject(ctx: Ctx): Promise<void>;
}

/** Runs that returned so far, of every scenario. */
function completedRuns(): number {
  return runLog.read(fleet.runLogs).filter((r) => r.end !== null).length;
}

/** A read that may hit a connection cut by the fault: retried until it answers. */
function read<T>(ctx: Ctx, what: string, fn: (pool: pg.Pool) => Promise<T>): Promise<NonNullable<T>> {
  return waitFor(() => fn(ctx.pool).catch(() => null), 30_000, what) as Promise<NonNullable<T>>;
}

/** The leader as both the processes and the database see it: its report agrees with the lock holder. */
async function confirmedLeader(ctx: Ctx, not?: FleetProcess): Promise<FleetProcess | null> {
  const p = ctx.fleet.leader();
  if (!p || p === not) return null;
  const info = await leaderInfo(ctx.pool, ctx.schema).catch(() => null);
  return info?.session?.applicationName === leaderApplicationName(p.id) ? p : null;
}

/** What berth still holds unfinished (for a failure message): live ring entries and deferred rows. */
async function unfinished(db: pg.Pool): Promise<unknown[]> {
  const S = quoteIdent(schema);
  const r = await db.query(
    `SELECT r.id::text AS id, 'ring' AS at, r.lane_id, r.lane_seq, r.slot, r.attempts, l.attempt, l.worker,
            r.expires_at, r.expires_at < now() AS lapsed, ${laneCursor(S, 'r.lane_id')} AS lane_cursor
       FROM ${liveEntries(S)} r
       LEFT JOIN LATERAL (SELECT * FROM ${S}.leased_entries le
                           WHERE le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot) l ON true
     UNION ALL
     SELECT id::text, 'deferred ' || state, NULL, NULL, NULL, attempts, NULL, NULL, run_at, run_at < now(), NULL FROM ${S}.deferred
     LIMIT 10`,
  );
  return r.rows;
}

/** Sessions other than the test's own (the workers', their listeners, the leader's). */
const BERTH_SESSIONS = `FROM pg_stat_activity
      WHERE datname = current_database() AND backend_type = 'client backend'
        AND pid <> pg_backend_pid() AND application_name <> $1`;

/**
 * Terminates every berth session and returns how many, once they are gone: with a timeout,
 * pg_terminate_backend waits for the backend to exit. Without it the call returns at the signal,
 * and an exiting backend still shows its locks and its row in pg_stat_activity for a moment.
 */
async function terminateBerthSessions(pool: pg.Pool): Promise<number> {
  const r = await pool.query<{ n: number }>(
    `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, $2))::int AS n ${BERTH_SESSIONS}`,
    [TEST_APP, 60_000],
  );
  return r.rows[0]!.n;
}

async function countBerthSessions(pool: pg.Pool): Promise<number> {
  const r = await pool.query<{ n: number }>(`SELECT count(*)::int AS n ${BERTH_SESSIONS}`, [TEST_APP]);
  return r.rows[0]!.n;
}

async function runScenario(s: Scenario): Promise<void> {
  const began = Date.now();
  const phase = (what: string) => debug(`${s.name}: ${what} at ${((Date.now() - began) / 1000).toFixed(1)} s`);
  const ctx: Ctx = { fleet, pool, schema };
  const crashesBefore = fleet.crashes.length;
  // Every process that takes part: those running now (topped up to WORKERS) and any started during.
  await Promise.all(Array.from({ length: Math.max(0, WORKERS - fleet.alive.length) }, () => fleet.spawn()));
  const firstNew = fleet.workers.length;
  const present = fleet.alive;
  // This scenario's runs: of the tasks it enqueued.
  const runs = () => runLog.read(fleet.runLogs).filter((r) => producer.ids.has(r.id));
  // Typed: its last argument reads it, which TypeScript 5.x (and 7, depending on the order its
  // parallel checkers reach it) cannot infer through.
  const producer: Producer = new Producer(
    pool,
    schema,
    s.delayed ?? false,
    () => uncompleted(runs(), producer.ids).length,
  );
  producer.start();
  let window: FaultWindow | null = null;
  let recovery: number | null = null;
  let left = -1;
  let dead = -1;
  let leftover: unknown[] = [];
  let failure: unknown = null;
  try {
    const warm = completedRuns() + WARMUP_RUNS;
    phase('workers running');
    await waitFor(() => completedRuns() >= warm, WARMUP_TIMEOUT_MS, `${WARMUP_RUNS} runs before the fault`);
    phase('warm');
    await s.prepare?.(ctx);
    if (s.serverDown) await producer.pause();
    const start = Date.now();
    await s.inject(ctx);
    window = { start, end: Date.now() };
    phase('fault over');
    producer.resume();
    const faultEnd = window.end;
    recovery = await waitFor(
      () => recoverySeconds(runs(), faultEnd, RECOVERY_RUNS),
      RECOVERY_TIMEOUT_MS,
      'completions after the fault',
    ).catch(() => null);
    await producer.stop();
    phase('recovered');
    if (process.env.CHAOS_DEBUG) {
      // Completions per second around the fault (by end time), and by whom.
      const per = new Map<number, Map<number, number>>();
      for (const r of runs()) {
        if (r.end === null) continue;
        const sec = Math.floor((r.end - faultEnd) / 1000);
        if (sec < -5 || sec > 30) continue;
        const m = per.get(sec) ?? new Map<number, number>();
        m.set(r.pid, (m.get(r.pid) ?? 0) + 1);
        per.set(sec, m);
      }
      for (const [sec, m] of [...per].sort((a, b) => a[0] - b[0]))
        debug(`  ${sec} s: ${[...m].map(([pid, n]) => `${pid}:${n}`).join(' ')}`);
    }
    // Done means: every task has a run that returned, and berth holds nothing unfinished.
    await waitFor(
      async () => {
        if (uncompleted(runs(), producer.ids).length > 0) return false;
        const g = await readGauges(pool, schema).catch(() => null);
        return g !== null && (g.pending.get(CHAOS_TASK) ?? 0) === 0;
      },
      DRAIN_TIMEOUT_MS,
      'every task completed',
    ).catch(() => undefined);
    const g = await read(ctx, 'gauges', (p) => readGauges(p, schema));
    left = g.pending.get(CHAOS_TASK) ?? 0;
    dead = g.dead.get(CHAOS_TASK) ?? 0;
    if (left > 0 || uncompleted(runs(), producer.ids).length > 0)
      leftover = await read(ctx, 'unfinished tasks', (p) => unfinished(p));
  } catch (err) {
    failure = err;
  }
  phase('drained');
  await producer.stop();
  await fleet.ready();
  phase('replacements running');
  const members = [...present, ...fleet.workers.slice(firstNew)];
  const expected = members.filter((p) => p.killedAt === null);
  const survivors = expected.filter((p) => p.exit === null);
  const finalRuns = runs();
  const lost = uncompleted(finalRuns, producer.ids);
  const dups = explainDuplicates(finalRuns, s.windowExplains ? window : null, fleet.kills);
  rows.push({
    scenario: s.name,
    tasks: producer.ids.size,
    transactional: TX_LEVELS.map((l) => producer.byLevel.get(l)).join('/'),
    lost: lost.length + Math.max(dead, 0),
    left,
    duplicates: dups.repeated,
    late: dups.late,
    unexplained: dups.unexplained.length,
    recovery,
    survivors: `${survivors.length}/${expected.length}`,
    killed: members.length - expected.length,
    seconds: (Date.now() - began) / 1000,
  });
  assertNoCrashes(fleet.crashes.slice(crashesBefore));
  if (failure) throw failure;
  assert.deepEqual(
    lost.slice(0, 10),
    [],
    `${lost.length} task(s) never completed; some of what berth holds unfinished: ${JSON.stringify(leftover)}`,
  );
  assert.equal(dead, 0, 'no task was dead-lettered');
  for (const l of TX_LEVELS) assert.ok(producer.byLevel.get(l)! > 0, `the ${l} producer committed tasks`);
  assert.equal(
    left,
    0,
    `nothing left pending; some of what is: ${JSON.stringify(leftover.map((t) => ({ ...(t as object), runs: finalRuns.filter((r) => r.id === (t as { id: string }).id) })))}`,
  );
  assert.deepEqual(
    dups.unexplained
      .slice(0, 5)
      .map((u) => ({ task: u.id, earlier: u.run, next: u.next, window, kills: Object.fromEntries(fleet.kills) })),
    [],
    `${dups.unexplained.length} repeated run(s) not explained by a kill or the fault`,
  );
  assert.ok(
    recovery !== null,
    `throughput did not recover: fewer than ${RECOVERY_RUNS} runs completed after the fault`,
  );
}

const scenarios: Scenario[] = [
  {
    name: 'SIGKILL of a worker',
    windowExplains: false,
    async inject({ fleet }) {
      // A follower: the leader has its own scenario. Its replacement starts in the background.
      await fleet.kill(fleet.alive.find((p) => !p.leader) ?? fleet.alive[0]!);
      fleet.spawnInBackground();
    },
  },
  {
    name: 'repeated kills (3, each replaced)',
    windowExplains: false,
    async inject({ fleet }) {
      // The oldest process each time, so the leader dies too; its replacement starts in the
      // background. The next kill comes once work has flowed again (30 more runs returned) and
      // two workers run, so no kill leaves none: the wait would measure process start-up.
      for (let i = 0; i < 3; i++) {
        if (i > 0) {
          const done = completedRuns();
          await waitFor(
            () => completedRuns() >= done + 30 && fleet.alive.filter((p) => p.ready).length >= 2,
            60_000,
            'work flowing and two workers running between kills',
          );
        }
        await fleet.kill(fleet.alive[0]!);
        fleet.spawnInBackground();
      }
    },
  },
  {
    name: 'restart -m fast',
    serverDown: true,
    windowExplains: true,
    async inject() {
      await cluster.restart('fast');
    },
  },
  {
    name: 'stop -m immediate, then start',
    serverDown: true,
    windowExplains: true,
    async inject() {
      await cluster.stop('immediate');
      // The outage itself (part of the fault, not a wait for a condition): long enough for
      // every worker to hit it in claims, settlements, heartbeats and LISTEN.
      await sleep(2000);
      await cluster.start();
    },
  },
  {
    name: 'pg_terminate_backend of every berth session, twice',
    windowExplains: true,
    async inject(ctx) {
      for (let i = 0; i < 2; i++) {
        const n = await terminateBerthSessions(ctx.pool);
        assert.ok(n >= WORKERS, `terminated ${n} berth sessions`);
        if (i === 0) {
          // Before the second cut, the workers have reconnected: a leader, and a session for every
          // worker. The terminated backends have exited by now, so both are new sessions. Waiting
          // only for "a leader" after a termination that returned at the signal could pass on the
          // old leader's exiting backend; the second cut then found no session (CI, stop 25).
          await waitFor(() => confirmedLeader(ctx), 30_000, 'a leader after the first termination');
          await waitFor(
            async () => (await countBerthSessions(ctx.pool)) >= WORKERS,
            30_000,
            `${WORKERS} berth sessions after the first termination`,
          );
        }
      }
    },
  },
  {
    name: 'SIGKILL of the leader while delayed tasks come due',
    windowExplains: false,
    delayed: true,
    async prepare(ctx) {
      const future = await read(ctx, 'deferred tasks', async (p) => {
        const r = await p.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ${quoteIdent(ctx.schema)}.deferred WHERE run_at > now()`,
        );
        return r.rows[0]!.n || null;
      });
      assert.ok(future > 0, 'delayed tasks are waiting to come due when the leader dies');
    },
    async inject(ctx) {
      const leader = await waitFor(() => confirmedLeader(ctx), 30_000, 'a leader');
      await ctx.fleet.kill(leader);
      ctx.fleet.spawnInBackground();
      await waitFor(() => confirmedLeader(ctx, leader), 30_000, 'a new leader');
    },
  },
];

for (const s of scenarios) test(`chaos: ${s.name}`, () => runScenario(s));

test('chaos: every worker still running stops cleanly', async () => {
  const before = fleet.crashes.length;
  await fleet.stopAll();
  assertNoCrashes(fleet.crashes.slice(before));
});
