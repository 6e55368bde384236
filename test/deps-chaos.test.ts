/**
 * Task dependencies under faults (issue 33, item 4), on a PostgreSQL cluster of the test's own
 * (test/support/cluster.ts), as the chaos suite (test/chaos.test.ts) runs: never the shared server.
 *
 * Each scenario enqueues, in one enqueueMany call, a 3-level graph: a root, 20 children that
 * depend on it (each works 300-800 ms) and a join that depends on every child. Two worker
 * processes (test/fixtures/deps-chaos-worker.ts) run it and log every run to JSONL files. Once at
 * least 5 children have started and some are in flight, one fault: a SIGKILL of the worker with
 * the most children in flight (a replacement starts), or the chaos suite's database restarts
 * (`pg_ctl restart -m fast`; `pg_ctl stop -m immediate`, 2 s down, `pg_ctl start`). Then, from
 * the run logs and from what berth recorded:
 * - the join ran exactly once, and after every child: its lease was claimed, on the database
 *   clock, no earlier than every child's completing settlement (the release is in the
 *   completion's transaction), and its run started after every child run that returned;
 * - no child was claimed before the root's completing settlement;
 * - `ctx.parents()` in the join gave 20 parents, each child's id with its result;
 * - every task completed exactly once (one completing settlement each; a child may have run more
 *   than once, at least once delivery, but each repeat is explained as the chaos suite explains
 *   it: its process was killed while it was in flight, or it straddled the database fault);
 * - nothing waits any more (`task_waits` empty, no `deferred` row `waiting`), nothing is pending
 *   or dead, and no worker exited that the test did not kill.
 * It prints one row per scenario (docs/architecture.md, "Chaos suite", describes them).
 *
 * Skipped only when the PostgreSQL server binaries (initdb, pg_ctl) are missing.
 *
 *   node --import tsx --test test/deps-chaos.test.ts
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { enqueueMany, migrate } from '../src/index.js';
import { readGauges } from '../src/maintenance-api.js';
import { quoteIdent } from '../src/sql.js';
import { waitFor } from './helpers.js';
import { PG_BIN, TestCluster } from './support/cluster.js';
import { DEPS_CHAOS_TASK, type DepsChaosPayload } from './support/deps-graph.js';
import { assertNoCrashes, Fleet, fixturePath } from './support/fleet.js';
import { explainDuplicates, type FaultWindow, type Run, RunLog } from './support/run-log.js';

const WORKERS = 2;
const CHILDREN = 20;
/** Children started before the fault, so it lands among them. */
const STARTED_BEFORE_FAULT = 5;
/** Liveness bounds, not expectations (waitFor multiplies them by BERTH_TEST_TIMEOUT_SCALE). */
const START_TIMEOUT_MS = 30_000;
const DRAIN_TIMEOUT_MS = 45_000;
const TEST_APP = 'berth deps chaos test';
const loaded = Date.now();

const missing = ['initdb', 'pg_ctl'].filter((b) => !existsSync(join(PG_BIN, b)));
const skip =
  missing.length > 0
    ? `the PostgreSQL server binaries are missing (${missing.join(', ')} not in ${PG_BIN}; BERTH_PG_BIN names another directory): this test runs a cluster of its own`
    : false;

const schema = 'deps_chaos';
const S = quoteIdent(schema);

/** The cluster, the fleet and the test's pool: set up only when the binaries are there. */
const env = skip ? null : await setUp();

/** Progress on stderr with CHAOS_DEBUG=1 (where the time goes on a busy machine). */
function debug(line: string): void {
  if (process.env.CHAOS_DEBUG) console.error(`[deps chaos] ${line} at ${((Date.now() - loaded) / 1000).toFixed(1)} s`);
}
async function setUp() {
  const dir = mkdtempSync(join(tmpdir(), 'berth-deps-chaos-'));
  const fleet = new Fleet(dir, 1, fixturePath('deps-chaos-worker.ts'));
  // The workers load while initdb runs; one spare stays loaded for the replacement.
  fleet.warm(WORKERS + 1);
  const cluster = await TestCluster.create().catch(async (err: unknown) => {
    // It removed itself; the spares and their files go too.
    await fleet.stopAll();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  });
  fleet.target = { databaseUrl: cluster.url(), schema };
  debug('cluster running');
  const pool = new pg.Pool({ connectionString: cluster.url(), max: 4, application_name: TEST_APP });
  // The test's own idle sessions die with the server; the pool drops them and reconnects.
  pool.on('error', () => undefined);
  after(async () => {
    if (rows.length > 0)
      console.log(`\nDependency graphs under faults (${WORKERS} worker processes)\n${table(rows)}\n`);
    await fleet.stopAll();
    await pool.end();
    await cluster.destroy();
    rmSync(dir, { recursive: true, force: true });
  });
  await migrate({ connectionString: cluster.url(), schema });
  debug('schema migrated');
  return { fleet, cluster, pool, runLog: new RunLog() };
}

interface Graph {
  root: string;
  children: string[];
  join: string;
}

/** The graph, in one call: the root, 20 children on it, the join on every child. */
async function enqueueGraph(pool: pg.Pool): Promise<Graph> {
  const task = (payload: DepsChaosPayload, ref: string, dependsOn: string[]) => ({
    type: DEPS_CHAOS_TASK,
    payload,
    ref,
    ...(dependsOn.length > 0 ? { dependsOn: dependsOn.map((r) => ({ ref: r })) } : {}),
  });
  const childRefs = Array.from({ length: CHILDREN }, (_, i) => `child-${i}`);
  const res = await enqueueMany(
    pool,
    [
      task({ role: 'root', n: 0, ms: 20 }, 'root', []),
      // 300-800 ms, spread over the children: the fault finds some running and some done.
      ...childRefs.map((ref, i) => task({ role: 'child', n: i, ms: 300 + ((i * 263) % 501) }, ref, ['root'])),
      task({ role: 'join', n: 0, ms: 20 }, 'join', childRefs),
    ],
    { schema },
  );
  assert.deepEqual(
    res.map((r) => r.state),
    ['ready', ...childRefs.map(() => 'waiting'), 'waiting'],
    'the root is ready, every other task waits',
  );
  const ids = res.map((r) => r.id!);
  return { root: ids[0]!, children: ids.slice(1, 1 + CHILDREN), join: ids[1 + CHILDREN]! };
}

/** One ring entry of a graph task, with what berth recorded of it (times in µs, database clock). */
interface EntryEvidence {
  id: string;
  /** When it was appended to the ring. */
  appendedUs: bigint;
  /** Outcomes of the settlements that cover the entry. */
  outcomes: string[];
  /** When its completing settlement was written, if it has one. */
  completedUs: bigint | null;
  /** When each lease that covers it was claimed. */
  claimsUs: bigint[];
}

/**
 * Every ring entry of `ids`, its lease(s) and settlement(s): ready(id) → lane, seq, slot → the
 * range leases whose range holds the seq, the range settlements whose seqs hold it. The ring does
 * not rotate in this test (see the fixture), so nothing is pruned before it is read.
 */
async function evidence(pool: pg.Pool, ids: readonly string[]): Promise<EntryEvidence[]> {
  const us = (col: string) => `(extract(epoch FROM ${col}) * 1000000)::bigint::text`;
  const r = await pool.query<{
    id: string;
    appended_us: string;
    outcomes: string[] | null;
    completed_us: string | null;
    claims_us: string[] | null;
  }>(
    `SELECT e.id::text AS id, ${us('e.appended_at')} AS appended_us,
            (SELECT array_agg(x.outcome ORDER BY x.settled_at) FROM ${S}.range_settlements x
              WHERE x.slot = e.slot AND x.lane_id = e.lane_id AND x.seqs @> e.lane_seq) AS outcomes,
            (SELECT ${us('max(x.settled_at)')} FROM ${S}.range_settlements x
              WHERE x.slot = e.slot AND x.lane_id = e.lane_id AND x.seqs @> e.lane_seq
                AND x.outcome = 'completed') AS completed_us,
            (SELECT array_agg(${us('l.claimed_at')}) FROM ${S}.range_leases l
              WHERE l.slot = e.slot AND l.lane_id = e.lane_id AND e.lane_seq BETWEEN l.from_seq AND l.to_seq) AS claims_us
       FROM ${S}.ready e WHERE e.id = ANY ($1::bigint[])
      ORDER BY e.id, e.lane_seq`,
    [ids],
  );
  return r.rows.map((x) => ({
    id: x.id,
    appendedUs: BigInt(x.appended_us),
    outcomes: x.outcomes ?? [],
    completedUs: x.completed_us === null ? null : BigInt(x.completed_us),
    claimsUs: (x.claims_us ?? []).map((c) => BigInt(c)),
  }));
}

/** The single completing settlement of task `id` (µs), asserting it has exactly one. */
function completedOnce(entries: readonly EntryEvidence[], id: string, what: string): bigint {
  const done = entries.filter((e) => e.id === id && e.completedUs !== null);
  assert.equal(
    done.length,
    1,
    `${what} (task ${id}) has exactly one completing settlement; its entries: ${JSON.stringify(
      entries.filter((e) => e.id === id),
      (_k, v) => (typeof v === 'bigint' ? String(v) : v),
    )}`,
  );
  return done[0]!.completedUs!;
}

/** Every claim of the entries of `ids` (µs). */
function claimsOf(entries: readonly EntryEvidence[], ids: ReadonlySet<string>): bigint[] {
  return entries.filter((e) => ids.has(e.id)).flatMap((e) => e.claimsUs);
}

/** What the join's `ctx.parents()` gave, from its `end` line in the run logs. */
function joinParents(files: readonly string[], joinId: string): unknown {
  for (const file of files) {
    if (!existsSync(file)) continue;
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      if (!line.endsWith('}')) continue;
      const rec = JSON.parse(line) as { ev: string; id: string; parents?: unknown };
      if (rec.ev === 'end' && rec.id === joinId) return rec.parents;
    }
  }
  return undefined;
}

/** Children's runs still in flight, per pid (started, neither returned nor aborted). */
function inFlight(runs: readonly Run[], children: ReadonlySet<string>): Map<number, number> {
  const out = new Map<number, number>();
  for (const r of runs) {
    if (!children.has(r.id) || r.end !== null || r.aborted !== null) continue;
    out.set(r.pid, (out.get(r.pid) ?? 0) + 1);
  }
  return out;
}

interface Row {
  scenario: string;
  fault: string;
  childRuns: number;
  /** Child runs that returned while the fault lasted: their completions met it. */
  returnedInFault: number;
  repeated: number;
  late: number;
  unexplained: number;
  joinRuns: number;
  /** From the last child's completing settlement to the join's append and to its claim (database clock). */
  release: { appendMs: number; claimMs: number } | null;
  seconds: number;
}
const rows: Row[] = [];

function table(list: readonly Row[]): string {
  const head = [
    'scenario',
    'fault',
    'child runs',
    'returned in fault',
    'repeated',
    'late',
    'unexplained',
    'join runs',
    'join appended / claimed, ms after the last child completed',
    'took s',
  ];
  const body = list.map((r) => [
    r.scenario,
    r.fault,
    String(r.childRuns),
    String(r.returnedInFault),
    String(r.repeated),
    String(r.late),
    String(r.unexplained),
    String(r.joinRuns),
    r.release === null ? '-' : `${r.release.appendMs.toFixed(1)} / ${r.release.claimMs.toFixed(1)}`,
    r.seconds.toFixed(0),
  ]);
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(head), line(head.map(() => '---')), ...body.map(line)].join('\n');
}

interface Scenario {
  name: string;
  /** A repeat whose earlier run straddled the fault window is explained (database faults). */
  windowExplains: boolean;
  /** The fault; says what it did. `busy`: children in flight per pid. */
  inject(busy: ReadonlyMap<number, number>): Promise<string>;
}

async function runScenario(s: Scenario): Promise<void> {
  const { fleet, pool, runLog } = env!;
  const began = Date.now();
  const crashesBefore = fleet.crashes.length;
  await Promise.all(Array.from({ length: Math.max(0, WORKERS - fleet.alive.length) }, () => fleet.spawn()));
  debug(`${s.name}: workers running`);
  const graph = await enqueueGraph(pool);
  const all = new Set([graph.root, ...graph.children, graph.join]);
  const children = new Set(graph.children);
  const runs = () => runLog.read(fleet.runLogs).filter((r) => all.has(r.id));

  // The fault lands among the children: enough have started, and some run now.
  const busy = await waitFor(
    () => {
      const rs = runs();
      const started = new Set(rs.filter((r) => children.has(r.id)).map((r) => r.id)).size;
      const now = inFlight(rs, children);
      return started >= STARTED_BEFORE_FAULT && now.size > 0 ? now : null;
    },
    START_TIMEOUT_MS,
    `${STARTED_BEFORE_FAULT} children started and some in flight`,
  );
  const start = Date.now();
  const fault = await s.inject(busy);
  const window: FaultWindow = { start, end: Date.now() };
  debug(`${s.name}: fault over (${fault})`);

  // Drained: the join returned, and berth counts every task of the graph completed.
  await waitFor(
    async () => {
      if (!runs().some((r) => r.id === graph.join && r.end !== null)) return false;
      const r = await pool
        .query<{ n: number }>(
          `SELECT count(*) FILTER (WHERE ${S}.task_fate(u.id) = 'completed')::int AS n FROM unnest($1::bigint[]) u(id)`,
          [[...all]],
        )
        .catch(() => null);
      return r?.rows[0]?.n === all.size;
    },
    DRAIN_TIMEOUT_MS,
    'the join returned and every task of the graph completed',
  );
  await fleet.ready();
  debug(`${s.name}: drained`);

  const finalRuns = runs();
  const joinRuns = finalRuns.filter((r) => r.id === graph.join);
  const childRuns = finalRuns.filter((r) => children.has(r.id));
  const dups = explainDuplicates(finalRuns, s.windowExplains ? window : null, fleet.kills);
  const entries = await evidence(pool, [...all]);
  const rootDone = completedOnce(entries, graph.root, 'the root');
  const childDone = graph.children.map((c, i) => completedOnce(entries, c, `child ${i}`));
  // bigint µs (Math.max takes numbers only).
  let lastChildDone = rootDone;
  for (const t of childDone) if (t > lastChildDone) lastChildDone = t;
  const joinEntries = entries.filter((e) => e.id === graph.join);
  const joinClaims = claimsOf(entries, new Set([graph.join]));
  rows.push({
    scenario: s.name,
    fault,
    childRuns: childRuns.length,
    returnedInFault: childRuns.filter((r) => r.end !== null && r.end >= window.start && r.end <= window.end).length,
    repeated: dups.repeated,
    late: dups.late,
    unexplained: dups.unexplained.length,
    joinRuns: joinRuns.length,
    release:
      joinClaims.length === 1 && joinEntries.length === 1
        ? {
            appendMs: Number(joinEntries[0]!.appendedUs - lastChildDone) / 1000,
            claimMs: Number(joinClaims[0]! - lastChildDone) / 1000,
          }
        : null,
    seconds: (Date.now() - began) / 1000,
  });

  assertNoCrashes(fleet.crashes.slice(crashesBefore));
  // The join: once, on one entry, under one lease, claimed after every child's completion.
  assert.equal(joinRuns.length, 1, `the join ran exactly once: ${JSON.stringify(joinRuns)}`);
  assert.equal(joinEntries.length, 1, 'the join was appended to the ring once');
  completedOnce(entries, graph.join, 'the join');
  assert.equal(joinClaims.length, 1, 'the join was claimed once');
  assert.ok(
    joinClaims[0]! >= lastChildDone,
    `the join was claimed (${joinClaims[0]} µs) before a child's completing settlement (${lastChildDone} µs)`,
  );
  const early = claimsOf(entries, children).filter((c) => c < rootDone);
  assert.deepEqual(early, [], `no child was claimed before the root's completing settlement (${rootDone} µs)`);
  // The run logs agree: the join started after every child run that returned.
  const lastChildEnd = Math.max(...childRuns.map((r) => r.end ?? 0));
  assert.ok(
    joinRuns[0]!.start >= lastChildEnd,
    `the join started (${joinRuns[0]!.start}) after every child's run returned (last ${lastChildEnd})`,
  );
  for (const [i, c] of graph.children.entries())
    assert.ok(
      childRuns.some((r) => r.id === c && r.end !== null),
      `child ${i} (task ${c}) has a run that returned`,
    );
  assert.deepEqual(
    joinParents(env!.fleet.runLogs, graph.join),
    Object.fromEntries(graph.children.map((c, i) => [c, { type: DEPS_CHAOS_TASK, result: { n: i } }])),
    "the join's ctx.parents(): every child by id, with its result",
  );
  // Nothing waits, nothing is pending or dead.
  const waits = await pool.query<{ waits: number; waiting: number }>(
    `SELECT (SELECT count(*) FROM ${S}.task_waits)::int AS waits,
            (SELECT count(*) FROM ${S}.deferred WHERE state = 'waiting')::int AS waiting`,
  );
  assert.deepEqual(waits.rows[0], { waits: 0, waiting: 0 }, 'no task waits on a dependency any more');
  const g = await readGauges(pool, schema);
  assert.equal(g.pending.get(DEPS_CHAOS_TASK) ?? 0, 0, 'nothing pending');
  assert.equal(g.dead.get(DEPS_CHAOS_TASK) ?? 0, 0, 'nothing dead');
  // Repeated runs (at least once delivery) are explained by the fault, as in the chaos suite.
  assert.deepEqual(
    dups.unexplained.slice(0, 5).map((u) => ({ task: u.id, earlier: u.run, next: u.next, window })),
    [],
    `${dups.unexplained.length} repeated run(s) not explained by the kill or the fault (kills: ${JSON.stringify(Object.fromEntries(fleet.kills))})`,
  );
}

const scenarios: Scenario[] = [
  {
    name: 'SIGKILL of a worker running children',
    windowExplains: false,
    async inject(busy) {
      const { fleet } = env!;
      const [pid, n] = [...busy].sort((a, b) => b[1] - a[1])[0]!;
      const victim = fleet.alive.find((p) => p.pid === pid);
      assert.ok(victim, `the worker running children (pid ${pid}) is one of the fleet's`);
      const role = victim.leader ? ', the leader' : '';
      await fleet.kill(victim);
      fleet.spawnInBackground();
      return `SIGKILL of ${victim.id}${role}, ${n} children in flight`;
    },
  },
  {
    name: 'database restart -m fast',
    windowExplains: true,
    async inject(busy) {
      await env!.cluster.restart('fast');
      return `pg_ctl restart -m fast, ${[...busy.values()].reduce((a, b) => a + b, 0)} children in flight`;
    },
  },
  {
    name: 'database stop -m immediate, then start',
    windowExplains: true,
    async inject(busy) {
      await env!.cluster.stop('immediate');
      // The outage itself (part of the fault, not a wait for a condition), as in the chaos suite.
      await new Promise((r) => setTimeout(r, 2000));
      await env!.cluster.start();
      return `pg_ctl stop -m immediate, 2 s, start, ${[...busy.values()].reduce((a, b) => a + b, 0)} children in flight`;
    },
  },
];

for (const s of scenarios) test(`deps chaos: ${s.name}`, { skip }, () => runScenario(s));

test('deps chaos: every worker still running stops cleanly', { skip }, async () => {
  const { fleet } = env!;
  const before = fleet.crashes.length;
  await fleet.stopAll();
  assertNoCrashes(fleet.crashes.slice(before));
});
