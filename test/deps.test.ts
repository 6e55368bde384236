/**
 * Task dependencies (docs/architecture.md, "Task dependencies"): `dependsOn` in enqueue and
 * enqueueMany, refs within a call, refusals that write nothing, release by the completion that
 * frees a dependent, parents' results through ctx.parents(), failure policies.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  BerthInputError,
  cancelTask,
  defineTask,
  deleteTask,
  enqueue,
  enqueueMany,
  getTask,
  moveTask,
  Worker,
} from '../src/index.js';
import { dependencyUsage } from '../src/storage/deps.js';
import { storageFor } from '../src/storage/storage.js';
import { DATABASE_URL, freshSchema, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('deps');
const S = `"${schema}"`;

await pool.query(
  `CREATE TABLE ${S}.dep_runs (run bigserial PRIMARY KEY, name text NOT NULL, task_id bigint NOT NULL,
     parents jsonb, started_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
);

async function count(sql: string, params: unknown[] = []): Promise<number> {
  return (await pool.query<{ n: number }>(sql, params)).rows[0]!.n;
}

async function runsOf(name: string) {
  return (
    await pool.query<{ task_id: string; parents: Record<string, { type: string; result: unknown }> | null }>(
      `SELECT task_id::text, parents FROM ${S}.dep_runs WHERE name = $1 ORDER BY run`,
      [name],
    )
  ).rows;
}

/** A task that records its run (and its parents as ctx.parents() gives them) and returns its name. */
const step = defineTask<{ name: string; fail?: boolean }>({
  type: 'dep_step',
  ceilingMs: 10_000,
  maxAttempts: 1,
  handler: async (p, ctx) => {
    const parents = await ctx.parents();
    await pool.query(`INSERT INTO ${S}.dep_runs (name, task_id, parents) VALUES ($1, $2, $3)`, [
      p.name,
      ctx.id,
      JSON.stringify(Object.fromEntries(parents)),
    ]);
    if (p.fail) throw new Error(`${p.name} fails`);
    return { name: p.name };
  },
});

function startWorker(extra: Record<string, unknown> = {}) {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [step],
    slots: 4,
    heartbeatIntervalMs: false,
    pollIntervalMs: 200,
    logger: testLogger,
    ...extra,
  });
}

test('refusals name the entry and write nothing: cycle, unknown ref, self, bad id, unknown id, ref on enqueue', async () => {
  const before = await count(`SELECT (SELECT count(*) FROM ${S}.deferred) + (SELECT count(*) FROM ${S}.ready) AS n`);
  const cases: Array<[() => Promise<unknown>, RegExp]> = [
    [
      () =>
        enqueueMany(
          pool,
          [
            { type: step, payload: { name: 'a' }, ref: 'a', dependsOn: [{ ref: 'c' }] },
            { type: step, payload: { name: 'b' }, ref: 'b', dependsOn: [{ ref: 'a' }] },
            { type: step, payload: { name: 'c' }, ref: 'c', dependsOn: [{ ref: 'b' }] },
          ],
          { schema },
        ),
      /tasks #\d → #\d → #\d → #\d form a cycle/,
    ],
    [
      () => enqueueMany(pool, [{ type: step, payload: { name: 'a' }, dependsOn: [{ ref: 'nope' }] }], { schema }),
      /task: dependsOn names ref "nope"/,
    ],
    [
      () =>
        enqueueMany(pool, [{ type: step, payload: { name: 'a' }, ref: 'a', dependsOn: [{ ref: 'a' }] }], { schema }),
      /cannot depend on itself/,
    ],
    [() => enqueue(pool, step, { name: 'x' }, { schema, dependsOn: ['abc'] }), /not a task id/],
    [
      () =>
        enqueueMany(
          pool,
          [
            { type: step, payload: { name: 'ok' }, ref: 'ok' },
            { type: step, payload: { name: 'x' }, dependsOn: [{ ref: 'ok' }, '999999999'] },
          ],
          { schema },
        ),
      /task #1 depends on task 999999999, which does not exist/,
    ],
    [() => enqueue(pool, step, { name: 'x' }, { schema, ref: 'r' } as never), /unknown option "ref"/],
    [() => enqueue(pool, step, { name: 'x' }, { schema, onParentFailure: 'ignore' as never }), /'cancel' or 'wait'/],
  ];
  for (const [call, message] of cases) {
    await assert.rejects(
      call,
      (err: Error) => err instanceof BerthInputError && message.test(err.message),
      `${message}`,
    );
  }
  assert.equal(
    await count(`SELECT (SELECT count(*) FROM ${S}.deferred) + (SELECT count(*) FROM ${S}.ready) AS n`),
    before,
    'nothing written',
  );
  assert.equal(await count(`SELECT count(*)::int AS n FROM ${S}.task_deps`), 0);
});

test('a graph in one call: fan-out, fan-in and a chain run in order, each join once, with its parents results', async () => {
  const res = await enqueueMany(
    pool,
    [
      {
        type: step,
        payload: { name: 'g-join' },
        ref: 'join',
        dependsOn: [{ ref: 'c1' }, { ref: 'c2' }, { ref: 'c3' }],
      },
      { type: step, payload: { name: 'g-root' }, ref: 'root' },
      { type: step, payload: { name: 'g-c1' }, ref: 'c1', dependsOn: [{ ref: 'root' }] },
      { type: step, payload: { name: 'g-c2' }, ref: 'c2', dependsOn: [{ ref: 'root' }] },
      { type: step, payload: { name: 'g-c3' }, ref: 'c3', dependsOn: [{ ref: 'root' }, { ref: 'c1' }] },
    ],
    { schema },
  );
  assert.deepEqual(
    res.map((r) => r.state),
    ['waiting', 'ready', 'waiting', 'waiting', 'waiting'],
  );
  const w = startWorker();
  await w.start();
  try {
    await waitFor(async () => (await runsOf('g-join')).length === 1, 30_000, 'the join ran');
    const order = (
      await pool.query<{ name: string }>(`SELECT name FROM ${S}.dep_runs WHERE name LIKE 'g-%' ORDER BY run`)
    ).rows.map((r) => r.name);
    assert.equal(order[0], 'g-root');
    assert.ok(order.indexOf('g-c3') > order.indexOf('g-c1'), 'c3 after c1');
    assert.equal(order.at(-1), 'g-join');
    assert.equal(order.length, 5, 'each ran once');
    const [join] = await runsOf('g-join');
    assert.deepEqual(join!.parents, {
      [res[2]!.id!]: { type: 'dep_step', result: { name: 'g-c1' } },
      [res[3]!.id!]: { type: 'dep_step', result: { name: 'g-c2' } },
      [res[4]!.id!]: { type: 'dep_step', result: { name: 'g-c3' } },
    });
    assert.equal((await getTask(pool, schema, res[0]!.id!))?.state, 'completed');
  } finally {
    await w.stop();
  }
});

test('dependsOn an earlier id: completed parent satisfied at once; a running one watched and released', async () => {
  const [done] = await enqueueMany(pool, [{ type: step, payload: { name: 'e-done' } }], { schema });
  const w = startWorker();
  await w.start();
  try {
    await waitFor(async () => (await getTask(pool, schema, done!.id!))?.state === 'completed', 30_000, 'parent done');
    const after = await enqueue(pool, step, { name: 'e-after-done' }, { schema, dependsOn: [done!.id!] });
    assert.equal(after.state, 'ready', 'a completed parent is satisfied at enqueue');
    // A parent enqueued earlier in another call, not yet run: watched, released by the leader.
    const p = await enqueue(pool, step, { name: 'e-parent' }, { schema, delay: 1500 });
    const child = await enqueue(pool, step, { name: 'e-child' }, { schema, dependsOn: [p.id!] });
    assert.equal(child.state, 'waiting');
    await waitFor(async () => (await runsOf('e-child')).length === 1, 30_000, 'the child ran');
    const [c] = await runsOf('e-child');
    assert.deepEqual(c!.parents, { [p.id!]: { type: 'dep_step', result: { name: 'e-parent' } } });
    assert.equal((await runsOf('e-after-done')).length, 1);
  } finally {
    await w.stop();
  }
});

test('a dead parent refuses new dependents; cancel policy cancels, wait policy waits for the retry', async () => {
  const [parent, cancelKid, waitKid, grandKid] = await enqueueMany(
    pool,
    [
      { type: step, payload: { name: 'f-parent', fail: true }, ref: 'p' },
      { type: step, payload: { name: 'f-cancel' }, ref: 'k1', dependsOn: [{ ref: 'p' }] },
      { type: step, payload: { name: 'f-wait' }, ref: 'k2', dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
      { type: step, payload: { name: 'f-grand' }, dependsOn: [{ ref: 'k1' }], onParentFailure: 'wait' },
    ],
    { schema },
  );
  const w = startWorker();
  await w.start();
  try {
    await waitFor(async () => (await getTask(pool, schema, parent!.id!))?.state === 'dead', 30_000, 'parent dead');
    await waitFor(
      async () => (await getTask(pool, schema, cancelKid!.id!))?.state === 'cancelled',
      30_000,
      'the cancel-policy dependent is cancelled',
    );
    await waitFor(
      async () => (await getTask(pool, schema, grandKid!.id!))?.state === 'cancelled',
      30_000,
      "a cancelled dependent's own dependent is cancelled, whatever its policy",
    );
    assert.equal((await getTask(pool, schema, waitKid!.id!))?.state, 'waiting');
    await assert.rejects(
      enqueue(pool, step, { name: 'f-late' }, { schema, dependsOn: [parent!.id!] }),
      /depends on task \d+, which is dead \(a dead letter\): retry it first/,
    );
    // Retried (and now succeeding): the waiting dependent runs.
    await pool.query(`UPDATE ${S}.dead_letters SET payload = '{"name":"f-parent"}' WHERE id = $1`, [parent!.id]);
    await pool.query(`SELECT * FROM ${S}.retry_dead(ARRAY[$1::bigint])`, [parent!.id]);
    await waitFor(async () => (await runsOf('f-wait')).length === 1, 30_000, 'the wait-policy dependent ran');
    assert.equal((await runsOf('f-cancel')).length, 0);
    assert.equal((await runsOf('f-grand')).length, 0);
  } finally {
    await w.stop();
  }
});

test('a cancelled parent cancels its dependents whatever their policy', async () => {
  const [parent, kid] = await enqueueMany(
    pool,
    [
      { type: step, payload: { name: 'h-parent' }, ref: 'p', delay: 60_000 },
      { type: step, payload: { name: 'h-kid' }, dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
    ],
    { schema },
  );
  assert.equal(parent!.state, 'scheduled');
  assert.equal(kid!.state, 'waiting');
  assert.equal(await cancelTask(pool, schema, parent!.id!), 'removed');
  const w = startWorker();
  await w.start();
  try {
    await waitFor(async () => (await getTask(pool, schema, kid!.id!))?.state === 'cancelled', 30_000, 'kid cancelled');
  } finally {
    await w.stop();
  }
});

test('a dead parent whose dead letter is deleted cancels its waiting dependents within a tick', async () => {
  const [parent, kid] = await enqueueMany(
    pool,
    [
      { type: step, payload: { name: 'i-parent', fail: true }, ref: 'p' },
      { type: step, payload: { name: 'i-kid' }, dependsOn: [{ ref: 'p' }], onParentFailure: 'wait' },
    ],
    { schema },
  );
  const w = startWorker();
  await w.start();
  try {
    await waitFor(async () => (await getTask(pool, schema, parent!.id!))?.state === 'dead', 30_000, 'parent dead');
    assert.equal((await getTask(pool, schema, kid!.id!))?.state, 'waiting');
    assert.equal(await deleteTask(pool, schema, parent!.id!), 'removed');
    // The leader reads the deleted parent's fate at its next tick (not when the ring is pruned).
    await waitFor(async () => (await getTask(pool, schema, kid!.id!))?.state === 'cancelled', 10_000, 'kid cancelled');
    assert.equal((await runsOf('i-kid')).length, 0);
  } finally {
    await w.stop();
  }
});

test('a waiting task moved to another queue is counted in its new queue', async () => {
  const [, kid] = await enqueueMany(
    pool,
    [
      { type: step, payload: { name: 'j-parent' }, ref: 'p', delay: 600_000 },
      { type: step, payload: { name: 'j-kid' }, dependsOn: [{ ref: 'p' }], queue: 'j-old' },
    ],
    { schema },
  );
  const storage = storageFor(schema);
  assert.deepEqual(
    (await dependencyUsage(pool, storage)).filter((u) => u.queue.startsWith('j-')),
    [{ queue: 'j-old', waiting: 1, blocked: 0 }],
  );
  assert.equal(await moveTask(pool, schema, kid!.id!, { queue: 'j-new' }), 'moved');
  assert.deepEqual(
    (await dependencyUsage(pool, storage)).filter((u) => u.queue.startsWith('j-')),
    [{ queue: 'j-new', waiting: 1, blocked: 0 }],
  );
  assert.equal((await getTask(pool, schema, kid!.id!))?.state, 'waiting', 'a move does not free it');
});
