/**
 * The shape donors (src/util/shape-anchor.ts, made in processor/engine.ts,
 * processor/settlement-batcher.ts) keep V8's shapes of a worker's per-task objects, of its
 * engine's buffer, running list and deadline timer, of a completion batch's groups, and of the
 * rows its claims and completion return, alive for the life of the process, so that a full garbage
 * collection with no task running, or a new worker in the same process, does not throw away the
 * hot path's compiled code (docs/architecture.md, "Compiled code that survives a full collection").
 *
 * What can break it: a donor whose shape is not the one the engine's objects get (a field added
 * after construction, in a method the donor never ran; a field that starts as a small integer and
 * later holds a fractional number, which V8 gives a new shape). So this file compares, with V8's
 * own %HaveSameMap, each donor with the engine's object of a real drain: for a first worker, for
 * a new worker after every object of the first one's tasks was collected, for an observed worker
 * (task events) and for a task that others depend on. And what the donors must not do: keep a
 * task's payload, while the worker runs or after it stopped; take a row from a pool berth did not
 * open, or one that is not a plain row of writable values.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import v8 from 'node:v8';
import pg from 'pg';
import { runInNewContext } from 'node:vm';
import { defineTask, enqueueMany, type TaskContext, Worker } from '../src/index.js';
import type { AnyTaskDefinition } from '../src/task.js';
import { runDueTasks } from '../src/testing-api.js';
import { type CompletableRef, groupByLease, groupValues } from '../src/storage/complete.js';
import { probeTask } from '../src/processor/prepare-settlement.js';
import { anchoredShapes, anchorRow, keepRowShapesOf } from '../src/util/shape-anchor.js';
import { DATABASE_URL, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('shape_anchor');

v8.setFlagsFromString('--expose-gc');
v8.setFlagsFromString('--allow-natives-syntax');
const fullGc = runInNewContext('gc') as () => void;
// Compiled after the flag: V8's intrinsic, which compares two objects' hidden classes.
const haveSameMap = new Function('a', 'b', 'return %HaveSameMap(a, b)') as (a: unknown, b: unknown) => boolean;

type Bag = Record<string | symbol, unknown>;
/** The engine's per-task objects of one run, as a handler's context and the worker reach them. */
interface Parts {
  context: Bag;
  run: Bag;
  execution: Bag;
  abort: Bag;
  task: Bag;
  attempt: Bag | null;
  /** A settlement round that was gathering completions while a handler ran. */
  round: Bag;
  /** A reaction pair from the engine's idle pool, after the drain; null for an observed worker, whose runs await their handler in a frame of their own. */
  reactions: Bag | null;
  /** The engine's own parts, after its drain: its claim buffer, running list and deadline timer. */
  buffer: Bag;
  running: Bag;
  deadlines: Bag;
}

/** A worker's engine: not public, reached as the engine's own tests of internals do. */
function engineOf(worker: Worker): Bag {
  return (worker as unknown as { running: { engine: Bag } }).running.engine;
}

function runParts(ctx: object): Omit<Parts, 'round' | 'reactions' | 'buffer' | 'running' | 'deadlines'> {
  const key = Object.getOwnPropertySymbols(ctx).find((s) => s.description === 'berth.handlerRun');
  assert.ok(key !== undefined, "the context holds its run under the run's symbol");
  const run = (ctx as Bag)[key] as Bag;
  const execution = run.input as Bag;
  return {
    context: ctx as Bag,
    run,
    execution,
    abort: execution.abort as Bag,
    task: execution.task as Bag,
    attempt: (execution.hooks as Bag | null) ?? null,
  };
}

/**
 * Compare each donor with the engine's object of the same kind. A donor is compared before any of
 * its properties is read: a property read moves an object off a shape V8 has replaced onto the
 * new one, which would hide exactly the mismatch looked for. Donors are found by the name each
 * was kept under (not by any of its properties).
 */
function assertSameShapes(real: Parts, when: string): void {
  const donor = (name: string): Bag => {
    const found = anchoredShapes().get(name);
    assert.ok(found !== undefined, `a donor of ${name} is kept`);
    return found as Bag;
  };
  const same = (d: Bag, r: Bag, kind: string): void => {
    assert.ok(haveSameMap(d, r), `${when}: the ${kind} donor has the shape of the engine's ${kind}`);
  };
  same(donor('Round'), real.round, 'settlement round');
  same(donor('ClaimBuffer'), real.buffer, 'claim buffer');
  same(donor('Running'), real.running, 'running list');
  same(donor('DeadlineTimer'), real.deadlines, 'deadline timer');
  if (real.attempt !== null) same(donor('Attempt'), real.attempt, 'attempt');
  const reactions = donor('Reactions');
  if (real.reactions !== null) same(reactions, real.reactions, 'reaction pair');
  const execution = reactions.x as Bag;
  same(execution, real.execution, 'execution');
  const run = reactions.h as Bag;
  same(run, real.run, 'handler run');
  const abort = execution.abort as Bag;
  same(abort, real.abort, 'abort');
  const context = run.ctx as Bag;
  same(context, real.context, 'context');
  if (Object.hasOwn(real.task, 'hasDependents')) {
    same(donor('claimed task with dependents'), real.task, 'claimed task with dependents');
  } else same(execution.task as Bag, real.task, 'claimed task');
}

/** Waits (a full collection each try) until nothing keeps `ref`'s object alive. */
async function collected(ref: WeakRef<object>, what: string): Promise<void> {
  await waitFor(
    () => {
      fullGc();
      return ref.deref() === undefined;
    },
    60_000,
    `${what} to be collected`,
  );
}

/** A worker of this file's schema running `def` alone, four at once, without maintenance. */
function testWorker(def: AnyTaskDefinition): Worker {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 4,
    pollIntervalMs: 100,
    logger: testLogger,
    maintenance: false,
  });
}

/** A task type whose handler only counts its runs. */
function countingTask(type: string): { def: AnyTaskDefinition; runs: () => number } {
  let n = 0;
  const def = defineTask<{ i: number }>({
    type,
    ceilingMs: 60_000,
    handler: async () => {
      n++;
    },
  });
  return { def, runs: () => n };
}

/** The worker whose tasks are running, for its handlers to reach its settlement batcher. */
let current: Worker | null = null;
/** The last run's context and payload, and a round seen gathering; emptied by drain(). */
let captured: { ctx: TaskContext<unknown>; payload: object } | null = null;
let capturedRound: Bag | null = null;
let drains = 0;

/**
 * Runs `n` tasks on a new worker (a type of its own each time, so nothing of one drain is left
 * for the next) and stops it, unless `keepRunning`; `dependents` enqueues each task with one
 * that depends on it.
 * Answers the parts of the last run of a task the predicate picks, and a weak ref to its payload.
 */
async function drain(
  n: number,
  opts: { observed?: boolean; dependents?: boolean; keepRunning?: boolean } = {},
): Promise<{ parts: Parts; payload: WeakRef<object>; worker: Worker }> {
  let done = 0;
  const type = `shape_${++drains}`;
  const def = defineTask<{ i: number; blob: string }>({
    type,
    ceilingMs: 60_000,
    handler: async (payload, ctx) => {
      const wanted = !opts.dependents || Object.hasOwn(runParts(ctx).task, 'hasDependents');
      if (wanted) captured = { ctx, payload };
      const batcher = current === null ? undefined : ((engineOf(current).deps as Bag).batcher as Bag);
      if (batcher?.round) capturedRound = batcher.round as Bag;
      // Only the tasks others depend on are counted: their dependents (`blob: 'y'`) become
      // claimable as they complete, and may still be running when the drain ends.
      if (payload.blob !== 'y') done++;
    },
  });
  const worker = testWorker(def);
  if (opts.observed) worker.events.on('task:settled', () => {});
  if (opts.dependents) {
    // In one call, so the parents' entries carry the mark the claim returns (a parent enqueued
    // earlier is watched by maintenance instead).
    const specs = [];
    for (let i = 0; i < n; i++) {
      specs.push({ type, payload: { i, blob: 'x'.repeat(64) }, ref: `p${i}` });
      specs.push({ type, payload: { i, blob: 'y' }, dependsOn: [{ ref: `p${i}` }] });
    }
    await enqueueMany(pool, specs, { schema });
  } else {
    const specs = Array.from({ length: n }, (_, i) => ({ type, payload: { i, blob: 'x'.repeat(64) } }));
    await enqueueMany(pool, specs, { schema });
  }
  current = worker;
  capturedRound = null;
  try {
    await worker.start();
    await waitFor(() => done >= n, 60_000, `${n} ${type} tasks to run`);
    const got = captured as unknown as { ctx: TaskContext<unknown>; payload: object };
    assert.ok(got !== null, 'a run of the kind looked for was seen');
    // Held from here only by what this answers (the handler's closure outlives the drain).
    captured = null;
    const round = capturedRound as Bag | null;
    capturedRound = null;
    assert.ok(round !== null, 'a handler saw a settlement round gathering completions');
    // A pair goes back to the engine's idle pool once its handler's answer is followed (an
    // observed run awaits its handler in an async frame instead, and takes no pair).
    const idle = engineOf(worker).idleReactions as Bag[];
    if (!opts.observed) await waitFor(() => idle.length > 0, 60_000, 'a reaction pair back in the idle pool');
    const engine = engineOf(worker);
    const parts = {
      ...runParts(got.ctx),
      round,
      reactions: opts.observed ? null : idle[0]!,
      buffer: engine.buffer as Bag,
      running: engine.inflight as Bag,
      deadlines: engine.deadlines as Bag,
    };
    return { parts, payload: new WeakRef(got.payload), worker };
  } finally {
    current = null;
    if (!opts.keepRunning) await worker.stop();
  }
}

test("every per-task object a worker makes has its donor's shape, after the first worker's objects are gone too", async () => {
  let first: { parts: Parts | null; payload: WeakRef<object> } | null = await drain(200);
  assertSameShapes(first.parts!, 'the first worker');
  const firstPayload = first.payload;
  // Nothing of the first worker's tasks is referenced from here on.
  first = null;
  await collected(firstPayload, "the stopped worker's last payload");

  assertSameShapes((await drain(200)).parts, 'a new worker after the first one was collected');

  const observed = await drain(200, { observed: true });
  assert.ok(observed.parts.attempt !== null, 'a worker with a task event listener observes its attempts');
  assertSameShapes(observed.parts, 'an observed worker');

  const dependents = await drain(20, { dependents: true });
  assert.equal(dependents.parts.task.hasDependents, true, 'the captured task is one others depend on');
  assertSameShapes(dependents.parts, 'a task others depend on');
});

test("a running worker keeps no task's payload once the task is settled", async () => {
  const { parts, payload, worker } = await drain(20, { keepRunning: true });
  try {
    // The test's own references to the last run go; only the worker or a donor could keep the
    // payload now.
    for (const k of Object.keys(parts)) (parts as unknown as Record<string, unknown>)[k] = null;
    await collected(payload, "the running worker's last payload");
  } finally {
    await worker.stop();
  }
});

test("a completion batch's groups and their statement values have their donors' shapes", async () => {
  const { parts, worker } = await drain(20, { keepRunning: true });
  try {
    // The completion a worker sends at its start to plan the statement hands in a task of the
    // claim's shape, so the completion's code sees the one shape of task a drain gives it.
    assert.ok(haveSameMap(probeTask(3), parts.task), "the start's probe task has a claimed task's shape");
    // The engine's own tasks, as the batcher hands them in, with fractional run times.
    const task = parts.task as unknown as CompletableRef;
    const refs = [task, { ...task }];
    let groups = groupByLease(refs, [0.25, 1.75]);
    for (let i = 0; i < 200; i++) groups = groupByLease(refs, [i + 0.5, i + 1.5]);
    const values = groupValues(groups);
    const shapes = anchoredShapes();
    assert.ok(haveSameMap(shapes.get('lease group'), groups[0]), 'the lease group donor has the shape of a real group');
    assert.ok(haveSameMap(shapes.get('lease group values'), values), 'the group values donor has their shape');
  } finally {
    await worker.stop();
  }
});

test("a statement's row is kept with its shape and none of its data, from berth's own sessions only", async () => {
  const probe = (db: pg.Pool) =>
    db.query<{ n: number; t: string; a: string[]; b: boolean; x: null }>(
      `SELECT 7 AS n, 'payload text' AS t, ARRAY['a', 'b'] AS a, true AS b, NULL AS x`,
    );
  const own = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  keepRowShapesOf(own);
  try {
    // Rows are taken as the statement's results come, until their shape has settled.
    for (let i = 0; i < 70; i++) anchorRow('shape-probe', own, (await probe(own)).rows[0]);
    const kept = anchoredShapes().get('row:shape-probe');
    const later = (await probe(own)).rows[0]!;
    assert.ok(haveSameMap(kept, later), "the kept row has the shape of the statement's later rows");
    assert.deepEqual(kept, { n: 7, t: '', a: [], b: true, x: null }, 'its text and arrays are emptied');
    assert.equal(later.t, 'payload text', 'a row not taken is left as it was');
  } finally {
    await own.end();
  }
  // A pool berth did not open (a caller's): its rows are never taken.
  const callers = [];
  for (let i = 0; i < 3; i++) {
    const row = (await probe(pool)).rows[0]!;
    anchorRow('caller-probe', pool, row);
    callers.push(row);
  }
  assert.equal(anchoredShapes().has('row:caller-probe'), false);
  for (const row of callers) assert.equal(row.t, 'payload text', "a caller's row is left as it was");
});

test('a row that is not a plain row of writable values is left alone, and taking one never throws', () => {
  const own = {};
  keepRowShapesOf(own);
  const getter = Object.defineProperty({ t: 'a' }, 'token', { get: () => 'tok', enumerable: true });
  const readOnly = Object.defineProperty({ t: 'a' }, 'token', { value: 'tok', enumerable: true, writable: false });
  const hidden = Object.defineProperty({ t: 'a' }, 'token', { value: 'tok', enumerable: false, writable: true });
  const refusing = new Proxy({ t: 'a', token: 'tok' }, { set: () => false });
  const parsed = { t: 'a', payload: { secret: 'x' } };
  const frozen = Object.freeze({ t: 'a' });
  const classy = new (class Row {
    t = 'a';
  })();
  const rows: [string, object][] = [
    ['getter', getter],
    ['read-only', readOnly],
    ['hidden', hidden],
    ['proxy', refusing],
    ['parsed', parsed],
    ['frozen', frozen],
    ['class', classy],
  ];
  for (const [name, row] of rows) {
    assert.doesNotThrow(() => anchorRow(`odd-${name}`, own, row), name);
    assert.equal(anchoredShapes().has(`row:odd-${name}`), false, `a ${name} row is not kept`);
    assert.equal((row as { t: string }).t, 'a', `a ${name} row is not written`);
  }
});

test("the worker keeps its claims' and completion's rows, emptied, with the shape of its later rows", async () => {
  const { def, runs } = countingTask('shape_rows');
  const worker = testWorker(def);
  await worker.start();
  try {
    // The last row each of the worker's two own sessions returned (its claims, its completions).
    const running = (worker as unknown as { running: { claims: pg.Pool; settlements: pg.Pool } }).running;
    const last: { claim: object | null; complete: object | null } = { claim: null, complete: null };
    const record = (session: pg.Pool, into: 'claim' | 'complete', column: string): void => {
      const query = session.query.bind(session) as (...args: unknown[]) => unknown;
      (session as unknown as { query: unknown }).query = (...args: unknown[]) => {
        const answer = query(...args);
        if (answer instanceof Promise) {
          void answer.then(
            (res: pg.QueryResult) => {
              const row = res.rows[0] as object | undefined;
              if (row !== undefined && Object.hasOwn(row, column)) last[into] = row;
            },
            () => {},
          );
        }
        return answer;
      };
    };
    record(running.claims, 'claim', 'tasks');
    record(running.settlements, 'complete', 'lease_from');
    // Many small rounds: many claims and completions, so the row kept (the 2nd, 4th, … result)
    // is another object than the last one.
    for (let round = 0; round < 20; round++) {
      await enqueueMany(
        pool,
        Array.from({ length: 5 }, (_, i) => ({ type: 'shape_rows', payload: { i } })),
        { schema },
      );
      await waitFor(() => runs() >= (round + 1) * 5, 60_000, `round ${round} of shape_rows to run`);
    }
    await waitFor(() => last.claim !== null && last.complete !== null, 60_000, 'a claim and a completion row');
    const shapes = anchoredShapes();
    const claim = shapes.get('row:claim-one-lane') ?? shapes.get('row:claim-lanes');
    const complete = shapes.get('row:complete');
    assert.ok(claim !== undefined && complete !== undefined, "a claim's and a completion's row are kept");
    assert.ok(haveSameMap(claim, last.claim), "the kept claim row has the shape of the worker's last claim row");
    assert.ok(haveSameMap(complete, last.complete), 'the kept completion row has the shape of its last one');
    assert.notEqual(claim, last.claim, 'the kept claim row is an earlier one');
    assert.equal((claim as { tasks: string }).tasks, '', "the kept claim row holds no task's data");
  } finally {
    await worker.stop();
  }
});

test('runDueTasks on a pool whose rows cannot be written runs and settles its task', async () => {
  /** A caller's pool that returns each row with read-only fields (an immutable-rows wrapper). */
  class ReadOnlyRows extends pg.Pool {
    override query(...args: unknown[]): never {
      const answer = (super.query as (...a: unknown[]) => unknown)(...args);
      if (!(answer instanceof Promise)) return answer as never;
      return answer.then((res: pg.QueryResult) => {
        res.rows = res.rows.map((r: Record<string, unknown>) => {
          const o = {};
          for (const k of Object.keys(r))
            Object.defineProperty(o, k, { value: r[k], enumerable: true, writable: false });
          return o;
        });
        return res;
      }) as never;
    }
  }
  // A schema of its own: the drains above leave dependents of other types unrun.
  const own = await freshSchema('shape_anchor_read_only');
  const callers = new ReadOnlyRows({ connectionString: DATABASE_URL, max: 2 });
  const { def, runs } = countingTask('shape_read_only');
  try {
    await enqueueMany(own.pool, [{ type: 'shape_read_only', payload: { i: 1 } }], { schema: own.schema });
    const reports = await runDueTasks(callers, [def], { schema: own.schema });
    assert.deepEqual(
      reports.map((r) => r.status),
      ['completed'],
    );
    assert.equal(runs(), 1);
  } finally {
    await callers.end();
  }
});

// Last in the file: its drains move the claim statements' result counts, at which the row
// tests above expect rows to be kept.
test("a worker's engine and every object it is made with have the donor engine's shapes", async () => {
  // A worker that stops makes the donor (once per process), then one that runs is compared.
  await drain(20);
  const { parts, worker } = await drain(200, { keepRunning: true });
  try {
    const donor = anchoredShapes().get('Engine');
    assert.ok(donor !== undefined, 'a donor engine is kept once a worker has stopped');
    // Three levels down from the engine (its fetcher, batcher, pools, rate, throttle, the run's
    // and the settlement's dependencies and what they hold), each pair compared before either's
    // properties are read (see assertSameShapes). Arrays, maps and sets take their shapes from
    // V8's built-in ones, which never die; loggers are the application's (a pino child has a
    // shape of its own, whatever berth does).
    const differ: string[] = [];
    const seen = new Set<unknown>();
    const walk = (d: unknown, r: unknown, path: string, depth: number): void => {
      if (typeof r !== 'object' || r === null || typeof d !== 'object' || d === null || seen.has(r)) return;
      seen.add(r);
      if (Array.isArray(r) || r instanceof Map || r instanceof Set) return;
      if (!haveSameMap(d, r)) differ.push(`${path} (${(r as object).constructor?.name})`);
      if (depth === 0) return;
      for (const k of Object.keys(r as Bag)) {
        if (k === 'logger' || k === 'log') continue;
        walk((d as Bag)[k], (r as Bag)[k], `${path}.${k}`, depth - 1);
      }
    };
    const engine = engineOf(worker);
    walk(donor, engine, 'engine', 3);
    // A task type's bound instruments, made at its first task (kept in a Map, which the walk
    // does not enter): the drained type's against the donor's.
    type Instruments = { for(type: string): Bag };
    const own = (engine.typeMetrics as Instruments).for(String(parts.task.type));
    const donated = ((donor as Bag).typeMetrics as Instruments).for('');
    walk(donated, own, 'typeMetrics.for(type)', 2);
    assert.deepEqual(differ, [], "the running engine's objects have the donor's shapes");
    assert.ok(seen.size > 40, `the walk reached the engine's parts (${seen.size} objects)`);
  } finally {
    await worker.stop();
  }
});
