import { storageFor } from '../src/storage/storage.js';
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import {
  BerthInputError,
  defineTask,
  enqueue,
  getTask,
  startDashboard,
  STUCK_EXIT_CODE,
  Worker,
  type TaskContext,
} from '../src/index.js';
import { rescueLapsedLeases } from '../src/maintenance-api.js';
import { claim, discover, type ClaimedTask } from '../src/processor/claim.js';
import { overdueMarks, protectOverdueLease } from '../src/storage/overdue.js';
import { completeLeases } from '../src/storage/complete.js';
import { claimParams } from './claim-params.js';
import {
  captureLogger,
  counterValue,
  DATABASE_URL,
  FAST_MAINTENANCE,
  freshSchema,
  outcomes,
  spawnWorkerProcess,
  testLogger,
  waitFor,
} from './helpers.js';

const { schema, pool } = await freshSchema('stuck');
const S = `"${schema}"`;
await pool.query(
  `CREATE TABLE ${S}.executions (i integer NOT NULL, attempt integer NOT NULL, worker text NOT NULL, at timestamptz DEFAULT clock_timestamp())`,
);

/** Stopped when the test ends, passed or failed, so a failure never leaks workers into the next test. */
function cleanup(t: TestContext, f: () => Promise<unknown>): void {
  t.after(() =>
    f().then(
      () => undefined,
      () => undefined,
    ),
  );
}

async function record(i: number, attempt: number, worker: string): Promise<void> {
  await pool.query(`INSERT INTO ${S}.executions (i, attempt, worker) VALUES ($1, $2, $3)`, [i, attempt, worker]);
}

/** Enqueue one task; its id (never a duplicate here). */
async function add(type: string, payload: unknown, queue: string): Promise<string> {
  const r = await enqueue(pool, type, payload, { schema, queue });
  assert.ok(r.id);
  return r.id;
}

async function runs(i: number): Promise<{ attempt: number; worker: string }[]> {
  return (await pool.query(`SELECT attempt, worker FROM ${S}.executions WHERE i = $1 ORDER BY at`, [i])).rows;
}

/** A worker that completes `type` at once (recording the run): the one that would run a duplicate. */
async function otherWorker(t: TestContext, type: string, id: string, queue: string): Promise<Worker> {
  const def = defineTask<{ i: number }>({
    type,
    ceilingMs: 5000,
    handler: async ({ i }, ctx) => record(i, ctx.attempt, id),
  });
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 2,
    workerId: id,
    pollIntervalMs: 100,
    queues: [queue],
    heartbeatIntervalMs: 200,
    logger: testLogger,
    maintenance: FAST_MAINTENANCE,
  });
  await w.start();
  cleanup(t, () => w.stop());
  return w;
}

const gauge = (w: Worker, name: string, labels: Record<string, string> = {}) => counterValue(w.metrics, name, labels);

test('a handler that ignores its signal keeps its lease past expiry: no second run while its holder lives; reported stuck once; it settles normally when it returns', async (t) => {
  let release: () => void = () => {};
  const released = new Promise<void>((r) => (release = r));
  const hang = defineTask<{ i: number }>({
    type: 'inproc_hang',
    // Long enough that a claim on a loaded machine still returns before the deadline.
    ceilingMs: 3000,
    handler: async ({ i }, ctx: TaskContext<{ i: number }>) => {
      await record(i, ctx.attempt, 'holder');
      await released; // ignores ctx.signal
    },
  });
  const { logger, lines } = captureLogger();
  // Margin 8 s: the lease lapses 8 s after the deadline; protection is written 100 ms after it,
  // with room to spare for a database slowed down by a busy machine.
  const holder = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [hang],
    slots: 1,
    workerId: 'holder',
    pollIntervalMs: 100,
    queues: ['hang'],
    leaseMarginMs: 8000,
    stuckGraceMs: 100,
    heartbeatIntervalMs: 200,
    maintenance: false,
    logger,
  });
  await holder.start();
  cleanup(t, () => holder.stop());
  const id = await add('inproc_hang', { i: 1 }, 'hang');
  await waitFor(async () => (await runs(1)).length === 1, 20_000, 'the holder runs the task');
  const other = await otherWorker(t, 'inproc_hang', 'other', 'hang');

  // The lease lapses while the handler runs; rescue (in `other`, the only leader) leaves it alone.
  await waitFor(
    async () => (await gauge(other, 'berth_rescue_held_leases')) >= 1,
    60_000,
    'rescue holds the lapsed lease',
  );
  const runsAtHeld = other.maintenanceStats().rescue?.runs ?? 0;
  await waitFor(() => (other.maintenanceStats().rescue?.runs ?? 0) >= runsAtHeld + 5, 30_000, 'five more rescue runs');
  assert.deepEqual(
    await runs(1),
    [{ attempt: 1, worker: 'holder' }],
    'no second run while the holder lives and runs it',
  );
  const lease = await pool.query(`SELECT expires_at < now() AS lapsed FROM ${S}.leased_entries WHERE id = $1`, [id]);
  assert.equal(lease.rows[0].lapsed, true, 'the lease itself has lapsed');

  // Reported: the gauge, one warn line with the task's fields, and the dashboard's mark.
  assert.equal(await gauge(holder, 'berth_task_stuck_handlers', { task_type: 'inproc_hang' }), 1);
  const stuckLines = lines.filter((l) => String(l.msg).startsWith('handler is stuck'));
  assert.equal(stuckLines.length, 1, 'warned once');
  assert.equal(stuckLines[0]!.level, 40);
  assert.equal(stuckLines[0]!.task_id, id);
  assert.equal(stuckLines[0]!.task_type, 'inproc_hang');
  assert.match(String(stuckLines[0]!.lane), /^hang\/0\/\d+$/);
  assert.equal(stuckLines[0]!.attempt, 1);
  const mark = (await overdueMarks(pool, storageFor(schema), [id])).get(id);
  assert.ok(mark, 'an overdue mark');
  assert.equal(mark.stuck, true);
  assert.equal(mark.protected, true);
  assert.equal(mark.worker, 'holder');

  const dash = await startDashboard({ connectionString: DATABASE_URL, schema, port: 0, logger: testLogger });
  cleanup(t, () => dash.close());
  const page = (await (await fetch(`${dash.url}api/tasks/${id}`)).json()) as {
    task: { state: string; lease: { overdue: { stuck: boolean } } };
  };
  assert.equal(page.task.state, 'running');
  assert.equal(page.task.lease.overdue.stuck, true, 'the task page carries the stuck mark');
  // Waited on: under heavy load the running list was once seen empty for a moment (see the report).
  const listed = async () => {
    const list = (await (await fetch(`${dash.url}api/tasks?state=running`)).json()) as {
      tasks: { id: string; overdue?: { stuck: boolean } }[];
    };
    return list.tasks.find((t) => t.id === id)?.overdue?.stuck === true;
  };
  await waitFor(listed, 30_000, 'the running list carries the stuck mark');
  const js = await (await fetch(`${dash.url}assets/app.js`)).text();
  assert.match(js, /badge stuck/, 'the page draws the mark');

  // It returns at last: settled as its own lease, the mark and the gauge gone, no second run.
  release();
  // Counted as a success only once the fenced completion was written. Not read back with
  // getTask: the leader's fast ring maintenance may reclaim the completed entry's segment
  // within one 25 ms poll, after which the task is simply gone.
  await waitFor(
    async () => (await outcomes(holder.metrics, 'inproc_hang', 'success')) === 1,
    20_000,
    'the late result is written',
  );
  await waitFor(
    async () => Number((await pool.query(`SELECT count(*) AS n FROM ${S}.overdue_leases`)).rows[0].n) === 0,
    20_000,
    'the overdue row removed',
  );
  assert.equal(await gauge(holder, 'berth_task_stuck_handlers', { task_type: 'inproc_hang' }), 0);
  assert.equal(
    await counterValue(holder.metrics, 'berth_task_outcomes_total', { task_type: 'inproc_hang', outcome: 'success' }),
    1,
  );
  assert.deepEqual(await runs(1), [{ attempt: 1, worker: 'holder' }]);
  assert.equal(lines.filter((l) => String(l.msg).startsWith('handler is stuck')).length, 1, 'still warned once');
  await holder.stop();
  await other.stop();
});

async function claimOne(type: string, ceilingMs: number): Promise<ClaimedTask> {
  const lanes = [...new Set((await discover(pool, storageFor(schema), ['sql'], 20)).map((c) => c.laneId))];
  const [t] = await claim(
    pool,
    claimParams(schema, lanes, 1, {
      ceilings: new Map([[type, ceilingMs]]),
      defaultCeilingMs: ceilingMs,
      workerId: 'sql',
    }),
  );
  assert.ok(t, 'a task was claimed');
  return t;
}

test('rescue honours a fresh overdue row only: stale, the lease is rescued and the row removed; protection is fenced like a settlement', async () => {
  const id = await add('sql_hang', {}, 'sql');
  const t = await claimOne('sql_hang', 3000);
  assert.equal(t.id, id);
  assert.equal(
    await protectOverdueLease(
      pool,
      storageFor(schema),
      { ...t, token: '00000000-0000-0000-0000-000000000000' },
      'sql',
      0,
      60_000,
    ),
    false,
    'another token protects nothing',
  );
  assert.equal(await protectOverdueLease(pool, storageFor(schema), t, 'sql', 0, 60_000), true);
  await waitFor(
    async () =>
      (await pool.query(`SELECT expires_at < now() AS lapsed FROM ${S}.leased_entries WHERE id = $1`, [id])).rows[0]
        .lapsed,
    20_000,
    'the lease lapses',
  );
  assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 0, dead: 0, held: 1 });

  // The holder stops refreshing (it died): past stale_after the lease is rescued as any other.
  await pool.query(`UPDATE ${S}.overdue_leases SET seen_at = now() - interval '2 minutes'`);
  assert.deepEqual(await rescueLapsedLeases(pool, schema), { retried: 1, dead: 0, held: 0 });
  assert.equal((await getTask(pool, schema, id))?.state, 'retryable');
  assert.equal(
    Number((await pool.query(`SELECT count(*) AS n FROM ${S}.overdue_leases`)).rows[0].n),
    0,
    'the rescued lease has no row left',
  );

  // A lapsed lease cannot be protected any more (rescue may already be taking it).
  await pool.query(`DELETE FROM ${S}.deferred WHERE id = $1`, [id]);
  const id2 = await add('sql_hang', { n: 2 }, 'sql');
  const t2 = await claimOne('sql_hang', 200);
  assert.equal(t2.id, id2);
  await waitFor(
    async () =>
      (await pool.query(`SELECT expires_at < now() AS lapsed FROM ${S}.leased_entries WHERE id = $1`, [id2])).rows[0]
        .lapsed,
    20_000,
    'the lease lapses',
  );
  assert.equal(await protectOverdueLease(pool, storageFor(schema), t2, 'sql', 0, 60_000), false, 'too late to protect');
  await rescueLapsedLeases(pool, schema);
  await pool.query(`DELETE FROM ${S}.deferred WHERE id = $1`, [id2]);

  // A stale row whose lease was settled (its holder could not delete it) is swept.
  const id3 = await add('sql_hang', { n: 3 }, 'sql');
  const t3 = await claimOne('sql_hang', 60_000);
  assert.equal(t3.id, id3);
  assert.equal(await protectOverdueLease(pool, storageFor(schema), t3, 'sql', 0, 60_000), true);
  assert.equal((await completeLeases(pool, storageFor(schema), [t3])).size, 1);
  await rescueLapsedLeases(pool, schema);
  assert.equal(
    Number((await pool.query(`SELECT count(*) AS n FROM ${S}.overdue_leases`)).rows[0].n),
    1,
    'fresh: left for its holder to delete',
  );
  await pool.query(`UPDATE ${S}.overdue_leases SET seen_at = now() - interval '2 minutes'`);
  await rescueLapsedLeases(pool, schema);
  assert.equal(
    Number((await pool.query(`SELECT count(*) AS n FROM ${S}.overdue_leases`)).rows[0].n),
    0,
    'stale and settled: swept',
  );
});

/** The child's log lines, parsed, as they arrive. */
function logLines(child: ChildProcess): Record<string, unknown>[] {
  const lines: Record<string, unknown>[] = [];
  createInterface({ input: child.stdout! }).on('line', (l) => {
    try {
      lines.push(JSON.parse(l));
    } catch {
      // not a log line
    }
  });
  return lines;
}

/** On failure, say what the child logged (warn and above): a wait that timed out says why. */
async function explained<T>(lines: Record<string, unknown>[], wait: Promise<T>): Promise<T> {
  try {
    return await wait;
  } catch (err) {
    const logged = lines
      .filter((l) => Number(l.level) >= 40)
      .map((l) => JSON.stringify(l))
      .join('\n');
    throw new Error(`${(err as Error).message}; the child logged:\n${logged || '(nothing at warn or above)'}`);
  }
}

async function spawnStuck(
  t: TestContext,
  id: string,
  env: Record<string, string>,
): Promise<{ child: ChildProcess; lines: Record<string, unknown>[]; exited: Promise<number | null> }> {
  const child = await spawnWorkerProcess(schema, id, { fixture: 'stuck-worker.ts', env, pipe: true });
  const lines = logLines(child);
  const exited = new Promise<number | null>((r) => {
    if (child.exitCode !== null) r(child.exitCode);
    else child.once('exit', (code) => r(code));
  });
  cleanup(t, async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  });
  return { child, lines, exited };
}

test('exitOnStuckSlots: with both slots stuck the worker process exits 75; nothing re-runs while it lives; then another worker runs both tasks to completion', async (t) => {
  const { child, lines, exited } = await spawnStuck(t, 'stuck-exit', { EXIT_ON_STUCK: '2', HEARTBEAT_MS: '1000' });
  const a = await add('stuck_hang', { i: 101 }, 'stuck');
  const b = await add('stuck_hang', { i: 102 }, 'stuck');
  await explained(
    lines,
    waitFor(
      async () => (await runs(101)).length === 1 && (await runs(102)).length === 1,
      60_000,
      'the child runs both',
    ),
  );
  const other = await otherWorker(t, 'stuck_hang', 'after-exit', 'stuck');

  // Reported by the child: one warn per task, and its metric.
  await waitFor(
    () => lines.filter((l) => String(l.msg).startsWith('handler is stuck')).length >= 2,
    60_000,
    'two stuck warnings',
  );
  const warned = lines.filter((l) => String(l.msg).startsWith('handler is stuck'));
  assert.deepEqual(new Set(warned.map((l) => l.task_id)), new Set([a, b]));
  assert.ok(warned.every((l) => l.task_type === 'stuck_hang' && l.attempt === 1 && typeof l.lane === 'string'));
  const url = await waitFor(
    () => lines.find((l) => typeof l.metrics_url === 'string')?.metrics_url as string | undefined,
    10_000,
    'metrics url',
  );
  const scraped = await (await fetch(new URL('metrics', url))).text();
  assert.match(scraped, /^berth_task_stuck_handlers\{task_type="stuck_hang"\} 2$/m);

  // The leases lapse while the child still runs both handlers: rescue holds them.
  await waitFor(
    async () => (await gauge(other, 'berth_rescue_held_leases')) >= 2,
    60_000,
    'rescue holds both lapsed leases',
  );
  assert.equal(child.exitCode, null, 'the child still lives');
  assert.equal((await runs(101)).length + (await runs(102)).length, 2, 'no second run while the holder lives');

  const code = await exited;
  assert.equal(code, STUCK_EXIT_CODE);
  assert.equal(code, 75);
  assert.deepEqual(
    [...(await runs(101)), ...(await runs(102))].map((r) => r.worker),
    ['stuck-exit', 'stuck-exit'],
    'nothing re-ran before the exit',
  );
  const exitLine = lines.find((l) => String(l.msg).startsWith('too many stuck slots'));
  assert.ok(exitLine, 'the exit is logged');
  assert.equal(exitLine.level, 50);
  assert.equal(exitLine.exit_code, 75);

  // Its rows go stale; rescue hands both tasks on, and the other worker completes them.
  // Both written completions (the success outcomes), not getTask: the fast ring maintenance may
  // reclaim the first task's segment before the second completes, so the two are never seen
  // 'completed' at once.
  await waitFor(async () => (await outcomes(other.metrics, 'stuck_hang', 'success')) === 2, 60_000, 'both completed');
  assert.deepEqual(await runs(101), [
    { attempt: 1, worker: 'stuck-exit' },
    { attempt: 2, worker: 'after-exit' },
  ]);
  assert.deepEqual(await runs(102), [
    { attempt: 1, worker: 'stuck-exit' },
    { attempt: 2, worker: 'after-exit' },
  ]);
  await other.stop();
});

test('a stuck lease is rescued once its holder is gone (SIGKILL): its row goes stale', async (t) => {
  const { child, lines, exited } = await spawnStuck(t, 'stuck-killed', { HEARTBEAT_MS: '300' });
  await add('stuck_hang', { i: 201 }, 'stuck');
  await explained(
    lines,
    waitFor(async () => (await runs(201)).length === 1, 60_000, 'the child runs it'),
  );
  const other = await otherWorker(t, 'stuck_hang', 'after-kill', 'stuck');
  await waitFor(
    async () => (await gauge(other, 'berth_rescue_held_leases')) >= 1,
    60_000,
    'rescue holds the lapsed lease',
  );
  assert.equal((await runs(201)).length, 1, 'not re-run while the holder lives');
  child.kill('SIGKILL');
  await exited;
  // A written completion (not getTask: the fast ring maintenance may reclaim it at once).
  await waitFor(
    async () => (await outcomes(other.metrics, 'stuck_hang', 'success')) === 1,
    60_000,
    'completed by the other worker',
  );
  assert.deepEqual(await runs(201), [
    { attempt: 1, worker: 'stuck-killed' },
    { attempt: 2, worker: 'after-kill' },
  ]);
  await other.stop();
});

test('stuckGraceMs and exitOnStuckSlots are validated; an unknown worker option is refused', () => {
  const base = { connectionString: DATABASE_URL, schema, tasks: [], slots: 4 };
  for (const stuckGraceMs of [-1, Number.NaN, Infinity, '10' as unknown as number]) {
    assert.throws(
      () => new Worker({ ...base, stuckGraceMs }),
      (e: Error) => e instanceof BerthInputError && /stuckGraceMs/.test(e.message),
    );
  }
  for (const exitOnStuckSlots of [0, 1.5, 5, -1, '2' as unknown as number]) {
    assert.throws(
      () => new Worker({ ...base, exitOnStuckSlots }),
      (e: Error) =>
        e instanceof BerthInputError && /exitOnStuckSlots must be an integer from 1 to slots \(4\)/.test(e.message),
    );
  }
  assert.doesNotThrow(() => new Worker({ ...base, stuckGraceMs: 0, exitOnStuckSlots: 4 }));
  assert.throws(
    () => new Worker({ ...base, exitOnStuckSlot: 2 } as never),
    (e: Error) => e instanceof BerthInputError && /unknown worker option "exitOnStuckSlot"/.test(e.message),
  );
});
