/**
 * Review of task dependencies (migration 31), invariants D and E. D: an enqueue with
 * dependencies is all or nothing (a refused call writes nothing, in autocommit and in a
 * transaction; a hand-built `enqueue_graph` JSON cannot point an edge forwards, at itself, or at
 * a task of the same call by its id); a dependency on a duplicate goes to the live holder of its
 * key. E: plain tasks are untouched: the batcher sends the statements it always did, their
 * entries carry no mark, and no dependency function runs for them.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import type pg from 'pg';
import { BerthInputError, dequeue, enqueue, enqueueMany } from '../src/index.js';
import { promoteDue } from '../src/maintenance/promote.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import { SettlementBatcher } from '../src/processor/settlement-batcher.js';
import type { Queryable } from '../src/sql.js';
import { recordFailures } from '../src/storage/fail.js';
import { releaseLease, returnUnstarted } from '../src/storage/return.js';
import { storageFor } from '../src/storage/storage.js';
import { freshSchema, testLogger } from './helpers.js';
import {
  bury,
  claimIds,
  completeAndRelease,
  edgesOf,
  enqueueGraphSql,
  footprint,
  graph,
  graphTask,
  session,
  stateOf,
  tick,
} from './deps-review-support.js';

const { schema, pool } = await freshSchema('drev_enqueue');
const S = `"${schema}"`;
const storage = storageFor(schema);
const a = await session(undefined, '-c jit=off -c track_functions=pl');
after(async () => {
  await a.end();
});

/** A session that records what it is sent (a statement's name, else its text). */
function recording(c: pg.Client): Queryable & { sent: string[] } {
  const sent: string[] = [];
  return {
    sent,
    query: (...args: unknown[]) => {
      const q = args[0];
      sent.push(
        typeof q === 'string' ? q : ((q as { name?: string; text: string }).name ?? (q as { text: string }).text),
      );
      return (c.query as (...x: unknown[]) => Promise<unknown>)(...args);
    },
  } as unknown as Queryable & { sent: string[] };
}

test('a refused call writes nothing: a dead parent named by the last entry, in autocommit and in a transaction (with a savepoint, the rest commits)', async () => {
  const [dead] = await graph(pool, schema, [{ name: 'dead', queue: 'e-dead', delay: 3_600_000 }]);
  await bury(pool, schema, dead!);
  // Entries on several lanes (queues a, m, z), the refused one last in every order.
  const call = (db: Queryable) =>
    graph(db, schema, [
      { name: 'r', queue: 'e-a', ref: 'r', dedupeKey: 'e-key-1' },
      { name: 'k', queue: 'e-m', ref: 'k', dependsOn: [{ ref: 'r' }], concurrencyKey: 'e-ck' },
      { name: 'x', queue: 'e-z', dependsOn: [{ ref: 'k' }, dead!] },
    ]);
  const before = await footprint(pool, schema);
  await assert.rejects(
    call(pool),
    (e: Error) => e instanceof BerthInputError && /task #2 depends on task \d+, which is dead/.test(e.message),
  );
  assert.equal(await footprint(pool, schema), before, 'autocommit: nothing written');
  const c = await session();
  try {
    await c.query('BEGIN');
    const [kept] = await graph(c, schema, [{ name: 'kept', queue: 'e-a' }]);
    await c.query('SAVEPOINT s');
    await assert.rejects(call(c), BerthInputError);
    await c.query('ROLLBACK TO SAVEPOINT s');
    await c.query('COMMIT');
    assert.equal(await footprint(pool, schema), before + 1, 'in a transaction: only what came before');
    assert.equal(await stateOf(pool, schema, kept!), 'ready');
    assert.equal((await pool.query(`SELECT 1 FROM ${S}.dedupe WHERE dedupe_key = 'e-key-1'`)).rowCount, 0);
  } finally {
    await c.end();
  }
});

test('a hand-built enqueue_graph JSON: an edge forwards, at itself, or with a bad payload in the last lane is refused whole', async () => {
  const task = (name: string, queue: string, type = 'dr') => graphTask(name, queue, { type, shard: null });
  const cases: [string, { tasks: Record<string, unknown>[]; edges: unknown[] }][] = [
    ['forwards', { tasks: [task('a', 'g-a'), task('b', 'g-b')], edges: [[0, 1, null]] }],
    ['itself', { tasks: [task('a', 'g-a')], edges: [[0, 0, null]] }],
    ['both', { tasks: [task('a', 'g-a')], edges: [[0, 0, '1']] }],
    ['not an array', { tasks: [task('a', 'g-a')], edges: [[0]] }],
    ['bad type last', { tasks: [task('a', 'g-a'), task('b', 'g-z', '')], edges: [[1, 0, null]] }],
    ['bad policy', { tasks: [{ ...task('a', 'g-a'), policy: 'ignore' }], edges: [] }],
  ];
  const before = await footprint(pool, schema);
  for (const [name, g] of cases) {
    await assert.rejects(
      enqueueGraphSql(pool, schema, g.tasks, g.edges),
      (e: { code?: string }) => e.code === '22023',
      name,
    );
  }
  assert.equal(await footprint(pool, schema), before, 'nothing written');
});

test('regression (review): a dependency on the id its own call draws, or on a duplicate of itself, is refused: it could never be released', async () => {
  const before = await footprint(pool, schema);
  // Through the public API: the id the task will get is the sequence's next value.
  const next = (await pool.query(`SELECT last_value + 1 AS n FROM ${S}.task_id_seq`)).rows[0].n as string;
  const self = await enqueue(pool, 'dr', { name: 'self' }, { schema, queue: 'e-self', dependsOn: [String(next)] }).then(
    (r) => r,
    (e: Error) => e,
  );
  if (!(self instanceof Error)) {
    const state = await stateOf(pool, schema, self.id!);
    await tick(pool, schema, true);
    assert.fail(
      `task ${self.id} was accepted depending on itself (${state}, still ${await stateOf(pool, schema, self.id!)} after a sweep)`,
    );
  }
  assert.ok(self instanceof BerthInputError, `refused as an input error: ${self.message}`);
  // A cycle of two through ids, hand-built.
  const n2 = BigInt((await pool.query(`SELECT last_value AS n FROM ${S}.task_id_seq`)).rows[0].n as string);
  const t = (name: string) => graphTask(name, 'e-cycle');
  await assert.rejects(
    enqueueGraphSql(
      pool,
      schema,
      [t('a'), t('b')],
      [
        [1, 0, null],
        [0, null, String(n2 + 2n)],
      ],
    ),
    (e: { code?: string }) => e.code === '22023',
  );
  // Through a duplicate: the parent (sent first) is a duplicate of its own child, whose lane
  // (queue e-cyc-a) is enqueued before the parent's (e-cyc-z) and so holds the key first.
  await assert.rejects(
    graph(pool, schema, [
      { name: 'p', queue: 'e-cyc-z', ref: 'p', dedupeKey: 'e-cyc-key' },
      { name: 'c', queue: 'e-cyc-a', dependsOn: [{ ref: 'p' }], dedupeKey: 'e-cyc-key' },
    ]),
    (e: Error) =>
      e instanceof BerthInputError && /task #1 depends on task \d+, which this same call enqueues/.test(e.message),
  );
  assert.equal(await footprint(pool, schema), before, 'nothing written');
});

test('a dependency on a duplicate of the same call goes to the live holder of its key, released by its completion', async () => {
  const [holder] = await graph(pool, schema, [{ name: 'holder', queue: 'e-dup', dedupeKey: 'e-dup-key' }]);
  const [t] = await claimIds(pool, schema, [holder!], 'e-dup');
  const res = await enqueueMany(
    pool,
    [
      { type: 'dr', payload: { name: 'dup' }, queue: 'e-dup', ref: 'd', dedupeKey: 'e-dup-key' },
      { type: 'dr', payload: { name: 'same-call-dup' }, queue: 'e-dup', ref: 'd2', dedupeKey: 'e-dup-2' },
      { type: 'dr', payload: { name: 'same-call-dup-b' }, queue: 'e-dup', ref: 'd3', dedupeKey: 'e-dup-2' },
      { type: 'dr', payload: { name: 'kid' }, queue: 'e-dup', dependsOn: [{ ref: 'd' }, { ref: 'd3' }] },
    ],
    { schema },
  );
  assert.equal(res[0]!.state, 'duplicate');
  assert.equal(res[0]!.duplicateOf, holder);
  assert.equal(res[2]!.state, 'duplicate');
  const kid = res[3]!.id!;
  assert.deepEqual(
    (await edgesOf(pool, schema, kid)).map((e) => e.parent),
    [holder, res[1]!.id].sort((x, y) => Number(BigInt(x!) - BigInt(y!))),
    'edges to the live holders',
  );
  await completeAndRelease(pool, schema, [t!]);
  const [t2] = await claimIds(pool, schema, [res[1]!.id!], 'e-dup');
  await completeAndRelease(pool, schema, [t2!]);
  await tick(pool, schema);
  assert.equal(await stateOf(pool, schema, kid), 'ready');
});

test('plain tasks: the batcher sends the completion it always did; a marked one adds only the release, in one transaction', async () => {
  const [plain] = await graph(pool, schema, [{ name: 'plain', queue: 'e-plain' }]);
  const [p, c] = await graph(pool, schema, [
    { name: 'marked', queue: 'e-plain', ref: 'p' },
    { name: 'kid', queue: 'e-plain', dependsOn: [{ ref: 'p' }] },
  ]);
  const [tp, tm] = await claimIds(pool, schema, [plain!, p!], 'e-plain');
  assert.equal(tp!.hasDependents, undefined);
  for (const [t, want] of [
    [tp!, (s: string[]) => s.length === 1 && s[0]!.startsWith(`berth-complete:${schema}:`)],
    [
      tm!,
      (s: string[]) =>
        s.length === 4 &&
        s[0] === 'BEGIN' &&
        s[1]!.startsWith(`berth-complete:${schema}:`) &&
        s[2]!.includes('release_completed') &&
        s[3] === 'COMMIT',
    ],
  ] as const) {
    const db = recording(a);
    const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
    assert.equal((await batcher.complete(t)).kind, 'settled');
    assert.ok(want(db.sent), `sent: ${JSON.stringify(db.sent.map((x) => x.slice(0, 60)))}`);
  }
  assert.equal(await stateOf(pool, schema, c!), 'ready');
  // A plain enqueue, one lane or several, never goes near the graph statement.
  const db = recording(a);
  await enqueue(db, 'dr', { name: 'one' }, { schema, queue: 'e-plain' });
  await enqueueMany(
    db,
    [
      { type: 'dr', payload: {}, queue: 'e-plain', shard: 1 },
      { type: 'dr', payload: {}, queue: 'e-plain-2', delay: 60_000 },
    ],
    { schema },
  );
  assert.ok(
    db.sent.every((x) => !/enqueue_graph|task_deps|task_waits/.test(x)),
    JSON.stringify(db.sent.map((x) => x.slice(0, 60))),
  );
  // A producer's inline dequeue of a plain task (it did the work itself): one statement.
  const [inline] = await graph(pool, schema, [{ name: 'inline', queue: 'e-plain-3' }]);
  const before = db.sent.length;
  await dequeue(db, schema, inline!, '');
  assert.equal(db.sent.length - before, 1, JSON.stringify(db.sent.slice(before).map((x) => x.slice(0, 60))));
  assert.match(db.sent[before]!, /remove_unleased/);
});

test('plain tasks carry no mark wherever they are appended from (enqueue, promotion, a retry, a graph entry without dependents)', async () => {
  const [fast] = await graph(pool, schema, [{ name: 'fast', queue: 'e-mark' }]);
  const [later] = await graph(pool, schema, [{ name: 'later', queue: 'e-mark', delay: 3_600_000 }]);
  const [p, c] = await graph(pool, schema, [
    { name: 'p', queue: 'e-mark', ref: 'p' },
    { name: 'c', queue: 'e-mark', dependsOn: [{ ref: 'p' }] },
  ]);
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE id = $1`, [later]);
  await promoteDue(pool, schema);
  const [tf] = await claimIds(pool, schema, [fast!], 'e-mark');
  await recordFailures(pool, storage, [{ ref: tf!, error: 'boom', delayMs: 0, permanent: false }]);
  await promoteDue(pool, schema);
  const [tp] = await claimIds(pool, schema, [p!], 'e-mark');
  await completeAndRelease(pool, schema, [tp!]);
  const marks = await pool.query<{ id: string; has_dependents: boolean | null }>(
    `SELECT id::text, has_dependents FROM ${S}.ready WHERE id = ANY ($1::bigint[]) ORDER BY appended_at`,
    [[fast, later, c]],
  );
  assert.equal(marks.rows.length, 4, 'fast twice (its retry), later, the freed kid');
  assert.ok(
    marks.rows.every((r) => r.has_dependents === null),
    JSON.stringify(marks.rows),
  );
  const claimed = await claimIds(pool, schema, [fast!, later!, c!], 'e-mark');
  assert.ok(claimed.every((t) => t.hasDependents === undefined));
});

test('regression (review): no dependency function runs for a plain task: enqueue, claim, hand-back, release, failure with retry, completion', async () => {
  const calls = async () => {
    await a.query('SELECT pg_stat_force_next_flush()');
    await a.query('SELECT pg_stat_clear_snapshot()');
    return (
      await a.query<{ funcname: string; calls: number }>(
        `SELECT funcname, calls::int FROM pg_stat_user_functions WHERE schemaname = $1 ORDER BY funcname`,
        [schema],
      )
    ).rows;
  };
  const before = new Map((await calls()).map((r) => [r.funcname, r.calls]));
  const [id] = await graph(a, schema, [{ name: 'hot', queue: 'e-hot' }]);
  const [t1] = await claimIds(a, schema, [id!], 'e-hot');
  await returnUnstarted(a, storage, t1!);
  await promoteDue(pool, schema);
  const [t2] = await claimIds(a, schema, [id!], 'e-hot');
  await releaseLease(a, storage, t2!, 'stopping');
  await promoteDue(pool, schema);
  const [t3] = await claimIds(a, schema, [id!], 'e-hot');
  await recordFailures(a, storage, [{ ref: t3!, error: 'boom', delayMs: 0, permanent: false }]);
  await promoteDue(pool, schema);
  const [t4] = await claimIds(a, schema, [id!], 'e-hot');
  const batcher = new SettlementBatcher(a, storage, new BerthMetrics(), testLogger);
  assert.equal((await batcher.complete(t4!)).kind, 'settled');
  const ran = (await calls())
    .map((r) => ({ name: r.funcname, calls: r.calls - (before.get(r.funcname) ?? 0) }))
    .filter((r) => r.calls > 0 && /dep|watch|release_completed|free_waiting|task_fate|enqueue_graph/.test(r.name));
  assert.deepEqual(ran, [], 'a dependency function ran for a plain task');
});
