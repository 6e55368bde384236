/**
 * Randomized interleavings of the storage protocol against a real database (fast-check's model
 * runner): producers at READ COMMITTED, REPEATABLE READ and SERIALIZABLE opening, appending to
 * shared lanes, committing and rolling back; the ring rotating and being pruned; claims in ring
 * windows read at random moments (so often stale) and over the whole ring, some with a ceiling
 * that lapses at once; completions, failures, releases, snoozes, cancels, rescues and
 * promotions. Every statement is the production one (src/storage, src/processor/claim*.ts,
 * src/maintenance). After each run every open producer commits and the queue is drained, and
 * the run is checked against docs/architecture.md's invariants:
 * - every task whose COMMIT returned completed, or was cancelled (nothing lost);
 * - nothing a rolled-back transaction enqueued ever ran;
 * - no task completed twice, and no task was claimed while a live lease of ours held it
 *   (at-least-once, never more: a second run only after a lapse or a failure);
 * - the prune never found an entry to recover (its entry-by-entry check is a last line of
 *   defence: `recovered` means an invariant broke).
 * fast-check shrinks a failing run to a short sequence of commands and prints it with its seed.
 *
 * Two invariants are also checked as the run goes: after every commit, no lane's segments go
 * back along its sequence; after every claim, no entry at or below its lane's cursor is
 * unleased. With migration 17's append_ready put back, the first catches the stale-snapshot loss
 * within a few runs, shrunk to five commands (plain enqueue, rotate, plain enqueue, a REPEATABLE
 * READ enqueue on the same lane, commit).
 *
 * Bounded here (BERTH_INTERLEAVINGS_RUNS runs, default 25, of up to 60 commands, a random seed
 * each time; BERTH_INTERLEAVINGS_SEED replays one); `npm run soak` runs it far longer
 * (docs/architecture.md, "Invariants", has its last result).
 */
import { storageFor } from '../src/storage/storage.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import pg from 'pg';
import { enqueueMany } from '../src/index.js';
import { claimBatch, type ClaimedTask } from '../src/processor/claim.js';
import { maintainRing, rotateRing } from '../src/maintenance/ring.js';
import { promoteDueLanes } from '../src/maintenance/promote.js';
import { quoteIdent } from '../src/sql.js';
import { cancelTasks } from '../src/storage/cancel.js';
import { completeLeases } from '../src/storage/complete.js';
import { recordFailures } from '../src/storage/fail.js';
import { entryKey } from '../src/storage/attempt.js';
import { laneCursor } from '../src/storage/predicates.js';
import { rescueLapsedLeases } from '../src/storage/rescue.js';
import { releaseLease } from '../src/storage/return.js';
import { readRingWindow, type RingWindow } from '../src/storage/ring-window.js';
import { snoozeLease } from '../src/storage/snooze.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('interleave');
const S = quoteIdent(schema);
const QUEUE = 'il';
const SHARDS = [0, 1] as const;
const LEVELS = ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'] as const;
type Level = (typeof LEVELS)[number];
const RUNS = Number(process.env.BERTH_INTERLEAVINGS_RUNS ?? 25);
const MAX_COMMANDS = Number(process.env.BERTH_INTERLEAVINGS_COMMANDS ?? 60);
/** A ceiling no run outlasts: such a lease never lapses while a run goes on. */
const LONG_MS = 600_000;

interface Open {
  ids: string[];
  lanes: Set<number>;
}

/** What the commands know; the database is the system under test. */
interface Model {
  open: Map<Level, Open>;
  committed: Set<string>;
  rolledBack: Set<string>;
  /** Tasks we hold under a long lease, not yet settled by us. */
  held: Map<string, ClaimedTask>;
  /** Tasks we claimed under a lease that lapses at once, not yet settled by us. */
  lapsing: Map<string, ClaimedTask>;
  cancelled: Set<string>;
  completions: Map<string, number>;
  window: RingWindow | undefined;
  laneHolder: Map<number, Level>;
  recovered: number;
}

interface Real {
  producers: Map<Level, pg.Client>;
  lanes: number[];
}

function isSerializationFailure(e: unknown): boolean {
  return (e as { code?: unknown } | null)?.code === '40001';
}

/** The producer's transaction is over (committed, rolled back or failed): forget its locks. */
function closeProducer(m: Model, level: Level): Open | undefined {
  const o = m.open.get(level);
  m.open.delete(level);
  for (const [lane, holder] of m.laneHolder) if (holder === level) m.laneHolder.delete(lane);
  return o;
}

function recordClaim(m: Model, tasks: readonly ClaimedTask[], into: Map<string, ClaimedTask>): void {
  for (const t of tasks) {
    assert.ok(!m.rolledBack.has(t.id), `task ${t.id} of a rolled-back transaction was claimed`);
    assert.ok(!m.held.has(t.id), `task ${t.id} was claimed while our live lease held it`);
    assert.ok(!(m.completions.get(t.id) ?? 0), `task ${t.id} was claimed after it completed`);
    into.set(t.id, t);
  }
}

/**
 * A producer's next transaction: BEGIN at its level and a first statement, which takes the
 * snapshot at REPEATABLE READ and SERIALIZABLE. Producers are always in a transaction (each
 * begins the next as soon as one ends), so a rotation or a prune between two commands always
 * lands between some producer's snapshot and its next append: the shape of the loss migration
 * 18 fixed.
 */
async function begin(m: Model, r: Real, level: Level): Promise<void> {
  const c = r.producers.get(level)!;
  await c.query(`BEGIN ISOLATION LEVEL ${level}`);
  await c.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
  m.open.set(level, { ids: [], lanes: new Set() });
}

/** A plain statement (autocommit, READ COMMITTED): an enqueue outside any transaction. */
class EnqueuePlain implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly lane: number,
    readonly n: number,
  ) {}
  check = (m: Readonly<Model>) => !m.laneHolder.has(this.lane);
  async run(m: Model): Promise<void> {
    const got = await enqueueMany(pool, specsOf(this.lane, this.n), { schema });
    for (const g of got) m.committed.add(g.id!);
    await checkLaneOrder();
  }
  toString = () => `enqueue(plain, lane ${this.lane}, ${this.n})`;
}

function specsOf(lane: number, n: number) {
  return Array.from({ length: n }, (_, i) => ({ type: 't', payload: { i }, queue: QUEUE, shard: SHARDS[lane]! }));
}

class Enqueue implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly level: Level,
    readonly lane: number,
    readonly n: number,
  ) {}
  check = (m: Readonly<Model>) => (m.laneHolder.get(this.lane) ?? this.level) === this.level;
  async run(m: Model, r: Real): Promise<void> {
    const c = r.producers.get(this.level)!;
    try {
      const got = await enqueueMany(c, specsOf(this.lane, this.n), { schema });
      const o = m.open.get(this.level)!;
      for (const g of got) o.ids.push(g.id!);
      o.lanes.add(this.lane);
      m.laneHolder.set(this.lane, this.level);
    } catch (e) {
      if (!isSerializationFailure(e)) throw e;
      await c.query('ROLLBACK');
      for (const id of closeProducer(m, this.level)?.ids ?? []) m.rolledBack.add(id);
      await begin(m, r, this.level);
    }
  }
  toString = () => `enqueue(${this.level}, lane ${this.lane}, ${this.n})`;
}

class End implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly level: Level,
    readonly commit: boolean,
  ) {}
  check = () => true;
  async run(m: Model, r: Real): Promise<void> {
    await endProducer(m, r, this.level, this.commit);
    await begin(m, r, this.level);
  }
  toString = () => `${this.commit ? 'commit' : 'rollback'}(${this.level})`;
}

/**
 * Invariant 2, checked after every commit: along each lane, the committed entries' segments
 * never go back. A run rotates fewer than 16 times (it starts at segment 0), so segment numbers
 * are in rotation order.
 */
async function checkLaneOrder(): Promise<void> {
  const r = await pool.query<{ lane_id: number; lane_seq: string; slot: number; prev: number }>(
    `SELECT lane_id, lane_seq::text, slot, prev FROM (
       SELECT lane_id, lane_seq, slot, lag(slot) OVER (PARTITION BY lane_id ORDER BY lane_seq) AS prev FROM ${S}.ready) x
      WHERE slot < prev`,
  );
  assert.deepEqual(r.rows, [], 'a lane whose segments go back along its sequence');
}

/** Invariant 4, checked after every claim: no entry at or below its lane's cursor is unleased. */
async function checkCursor(): Promise<void> {
  const r = await pool.query<{ id: string }>(
    `SELECT r.id::text FROM ${S}.ready r
      WHERE r.lane_seq <= ${laneCursor(S, 'r.lane_id')}
        AND NOT EXISTS (SELECT 1 FROM ${S}.leased_entries le
                         WHERE le.lane_id = r.lane_id AND le.lane_seq = r.lane_seq AND le.slot = r.slot)
        AND NOT EXISTS (SELECT 1 FROM ${S}.tombstones t
                         WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)`,
  );
  assert.deepEqual(r.rows, [], 'an entry the claim cursor passed without a lease');
}

async function endProducer(m: Model, r: Real, level: Level, commit: boolean): Promise<void> {
  const c = r.producers.get(level)!;
  let ok = commit;
  if (commit) {
    try {
      await c.query('COMMIT');
    } catch (e) {
      if (!isSerializationFailure(e)) throw e;
      await c.query('ROLLBACK').catch(() => undefined);
      ok = false;
    }
  } else await c.query('ROLLBACK');
  for (const id of closeProducer(m, level)?.ids ?? []) (ok ? m.committed : m.rolledBack).add(id);
  if (ok) await checkLaneOrder();
}

class Rotate implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(): Promise<void> {
    await rotateRing(pool, schema, 0);
  }
  toString = () => 'rotate';
}

class Prune implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(m: Model): Promise<void> {
    await prune(m);
  }
  toString = () => 'prune';
}

/** Every sealed segment with entries pruned if it may be (never rotating: rotateAfterMs an hour). */
async function prune(m: Model): Promise<void> {
  const r = await maintainRing(pool, schema, { rotateAfterMs: 3_600_000, lockTimeoutMs: 20 });
  for (const p of r.prunes) if (p.result === 'recovered') m.recovered += p.entries;
}

class ReadWindow implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(m: Model): Promise<void> {
    m.window = await readRingWindow(pool, storageFor(schema));
  }
  toString = () => 'read window';
}

class Claim implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly lanes: number[],
    readonly limit: number,
    readonly windowed: boolean,
    readonly lapse: boolean,
  ) {}
  check = (m: Readonly<Model>) => !this.windowed || m.window !== undefined;
  async run(m: Model, r: Real): Promise<void> {
    const ceilingMs = this.lapse ? 1 : LONG_MS;
    const b = await claimBatch(
      pool,
      claimParams(
        schema,
        this.lanes.map((i) => r.lanes[i]!),
        this.limit,
        {
          ceilings: new Map([['t', ceilingMs]]),
          defaultCeilingMs: ceilingMs,
          defaultMaxAttempts: 1000,
          workerId: 'interleavings',
          window: this.windowed ? m.window : undefined,
        },
      ),
    );
    recordClaim(m, b.tasks, this.lapse ? m.lapsing : m.held);
    await checkCursor();
  }
  toString = () =>
    `claim(lanes ${this.lanes.join('+')}, ${this.limit}${this.windowed ? ', windowed' : ''}${this.lapse ? ', lapsing' : ''})`;
}

/** Settle some of the tasks we hold: `pick` indexes into them. */
class Settle implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly how: 'complete' | 'fail' | 'release' | 'snooze' | 'cancel',
    readonly pick: number[],
  ) {}
  check = (m: Readonly<Model>) => m.held.size > 0;
  async run(m: Model): Promise<void> {
    const all = [...m.held.values()];
    const chosen = [...new Set(this.pick.map((i) => all[i % all.length]!))];
    for (const t of chosen) m.held.delete(t.id);
    if (this.how === 'complete') {
      const won = await completeLeases(pool, storageFor(schema), chosen);
      for (const t of chosen) {
        assert.ok(won.has(entryKey(t)), `our completion of ${t.id} under a live lease was refused`);
        m.completions.set(t.id, (m.completions.get(t.id) ?? 0) + 1);
      }
    } else if (this.how === 'fail') {
      await recordFailures(
        pool,
        storageFor(schema),
        chosen.map((t) => ({ ref: t, error: 'boom', delayMs: 0, permanent: false })),
      );
    } else if (this.how === 'release') {
      for (const t of chosen) await releaseLease(pool, storageFor(schema), t, 'released');
    } else if (this.how === 'snooze') {
      for (const t of chosen) await snoozeLease(pool, storageFor(schema), t, 0, 100, 'snoozed out');
    } else {
      const res = await cancelTasks(
        pool,
        storageFor(schema),
        chosen.map((t) => t.id),
        'interleavings',
      );
      for (const t of chosen) if (res.get(t.id) === 'cancelled') m.cancelled.add(t.id);
    }
  }
  toString = () => `${this.how}(${this.pick.join(',')})`;
}

/** Cancel a committed task wherever it is (pending, deferred, running under someone's lease). */
class CancelCommitted implements fc.AsyncCommand<Model, Real> {
  constructor(readonly pick: number) {}
  check = (m: Readonly<Model>) => m.committed.size > 0;
  async run(m: Model): Promise<void> {
    const ids = [...m.committed];
    const id = ids[this.pick % ids.length]!;
    const res = (await cancelTasks(pool, storageFor(schema), [id], 'interleavings')).get(id);
    if (res === 'removed' || res === 'cancelled') {
      m.cancelled.add(id);
      m.held.delete(id);
      m.lapsing.delete(id);
    }
  }
  toString = () => `cancel committed(${this.pick})`;
}

class Rescue implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(m: Model): Promise<void> {
    await rescueLapsedLeases(pool, schema);
    // What lapsed is rescue's now (or already taken): ours no more.
    m.lapsing.clear();
  }
  toString = () => 'rescue';
}

class Promote implements fc.AsyncCommand<Model, Real> {
  check = () => true;
  async run(): Promise<void> {
    // A lane an open producer holds times out and stays deferred (it never blocks the run).
    await promoteDueLanes(pool, schema, null, 1000, 20);
  }
  toString = () => 'promote';
}

const plain = fc
  .tuple(fc.integer({ min: 0, max: SHARDS.length - 1 }), fc.integer({ min: 1, max: 3 }))
  .map(([lane, n]) => new EnqueuePlain(lane, n));
const enqueue = fc
  .tuple(fc.constantFrom(...LEVELS), fc.integer({ min: 0, max: SHARDS.length - 1 }), fc.integer({ min: 1, max: 3 }))
  .map(([l, lane, n]) => new Enqueue(l, lane, n));
// Three commits to one rollback.
const end = fc
  .tuple(fc.constantFrom(...LEVELS), fc.constantFrom(true, true, true, false))
  .map(([l, c]) => new End(l, c));
const claim = fc
  .tuple(
    fc.subarray([0, 1], { minLength: 1 }),
    fc.integer({ min: 1, max: 6 }),
    fc.boolean(),
    // One claim in four leases under a ceiling that lapses at once.
    fc.constantFrom(false, false, false, true),
  )
  .map(([lanes, limit, w, lapse]) => new Claim(lanes, limit, w, lapse));
const settle = fc
  .tuple(
    fc.constantFrom('complete', 'complete', 'complete', 'fail', 'release', 'snooze', 'cancel' as const),
    fc.array(fc.nat(20), { minLength: 1, maxLength: 4 }),
  )
  .map(([how, pick]) => new Settle(how as Settle['how'], pick));
/**
 * fast-check picks among these uniformly, so the ones a loss needs most (producers holding a
 * snapshot across a rotation and a prune, windows read in between, claims) are listed more than
 * once: with every command once, a run reproduced migration 17's stale-snapshot loss far more
 * rarely.
 */
const commands = [
  plain,
  plain,
  enqueue,
  enqueue,
  enqueue,
  enqueue,
  end,
  end,
  end,
  fc.constant(new Rotate()),
  fc.constant(new Rotate()),
  fc.constant(new Rotate()),
  fc.constant(new Prune()),
  fc.constant(new Prune()),
  fc.constant(new ReadWindow()),
  fc.constant(new ReadWindow()),
  claim,
  claim,
  claim,
  settle,
  settle,
  fc.nat(50).map((p) => new CancelCommitted(p)),
  fc.constant(new Rescue()),
  fc.constant(new Promote()),
];

async function resetDatabase(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dedupe,
              ${S}.dead_letters, ${S}.snoozes, ${S}.attempt_history`,
  );
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0, rotated_at = now()`);
}

/**
 * Every open producer commits, then the queue is drained to the end: promotion, rescue of what
 * lapsed, prune and rotation, and claims over the whole ring completed at once, until a round
 * finds nothing pending.
 */
async function drain(m: Model, r: Real): Promise<void> {
  for (const level of [...m.open.keys()]) await endProducer(m, r, level, true);
  const ours = [...m.held.values()];
  m.held.clear();
  if (ours.length) for (const t of ours) if ((await completeLeases(pool, storageFor(schema), [t])).size) bump(m, t.id);
  for (let round = 0; round < 200; round++) {
    await promoteDueLanes(pool, schema, null, 1000, null);
    await rescueLapsedLeases(pool, schema);
    await prune(m);
    await rotateRing(pool, schema, 0);
    const b = await claimBatch(
      pool,
      claimParams(schema, r.lanes, 500, {
        ceilings: new Map([['t', LONG_MS]]),
        defaultCeilingMs: LONG_MS,
        defaultMaxAttempts: 1000,
        workerId: 'interleavings',
      }),
    );
    recordClaim(m, b.tasks, m.held);
    for (const t of b.tasks) m.held.delete(t.id);
    if (b.tasks.length) for (const id of (await completed(b.tasks)).values()) bump(m, id);
    const pending = await pool.query<{ n: number }>(
      `SELECT ((SELECT count(*) FROM ${S}.ready) + (SELECT count(*) FROM ${S}.deferred)
               - (SELECT coalesce(sum(n), 0) FROM ${S}.range_settlements) - (SELECT count(*) FROM ${S}.tombstones))::int AS n`,
    );
    if (pending.rows[0]!.n === 0 && b.tasks.length === 0) return;
    // Lapsing leases need the database clock to pass their (1 ms) deadline before rescue.
    if (b.tasks.length === 0) await new Promise((res) => setTimeout(res, 20));
  }
  assert.fail('the queue did not drain in 200 rounds');
}

async function completed(tasks: readonly ClaimedTask[]): Promise<string[]> {
  const won = await completeLeases(pool, storageFor(schema), tasks);
  return tasks.filter((t) => won.has(entryKey(t))).map((t) => t.id);
}

function bump(m: Model, id: string): void {
  m.completions.set(id, (m.completions.get(id) ?? 0) + 1);
}

/** The invariants after a drained run (see the header). */
function verify(m: Model): void {
  assert.equal(m.recovered, 0, `the prune recovered ${m.recovered} stranded entr(y/ies): an invariant broke`);
  const lost = [...m.committed].filter((id) => !m.completions.get(id) && !m.cancelled.has(id));
  assert.deepEqual(lost, [], `committed tasks that never completed and were not cancelled: ${lost.join(', ')}`);
  const twice = [...m.completions].filter(([, n]) => n > 1).map(([id]) => id);
  assert.deepEqual(twice, [], `tasks completed more than once: ${twice.join(', ')}`);
  for (const id of m.rolledBack) assert.ok(!m.completions.get(id), `rolled-back task ${id} ran`);
}

test('randomized interleavings of producers at every isolation level, rotations, prunes, claims, settlements, cancels and rescues lose nothing and run nothing beyond at-least-once', async () => {
  const producers = new Map<Level, pg.Client>();
  for (const level of LEVELS) {
    const c = new pg.Client({ connectionString: DATABASE_URL, options: '-c jit=off' });
    await c.connect();
    producers.set(level, c);
  }
  // The lanes exist before any producer opens: a producer opening a lane holds its queue's lock.
  const lanes: number[] = [];
  for (const shard of SHARDS) {
    lanes.push(
      (
        await pool.query<{ id: number }>(`SELECT ${S}.provision_lane($1, 0::smallint, $2::smallint) AS id`, [
          QUEUE,
          shard,
        ])
      ).rows[0]!.id,
    );
  }
  try {
    await fc.assert(
      fc.asyncProperty(fc.commands(commands, { maxCommands: MAX_COMMANDS, size: 'max' }), async (cmds) => {
        for (const c of producers.values()) await c.query('ROLLBACK').catch(() => undefined);
        await resetDatabase();
        const model: Model = {
          open: new Map(),
          committed: new Set(),
          rolledBack: new Set(),
          held: new Map(),
          lapsing: new Map(),
          cancelled: new Set(),
          completions: new Map(),
          window: undefined,
          laneHolder: new Map(),
          recovered: 0,
        };
        const real: Real = { producers, lanes };
        for (const level of LEVELS) await begin(model, real, level);
        await fc.asyncModelRun(() => ({ model, real }), cmds);
        await drain(model, real);
        verify(model);
      }),
      {
        numRuns: RUNS,
        ...(process.env.BERTH_INTERLEAVINGS_SEED ? { seed: Number(process.env.BERTH_INTERLEAVINGS_SEED) } : {}),
      },
    );
  } finally {
    for (const c of producers.values()) {
      await c.query('ROLLBACK').catch(() => undefined);
      await c.end();
    }
  }
});
