/**
 * Task results: a handler that returns a value other than berth's answers succeeds, and the
 * value (JSON, within `resultMaxBytes`) is stored with its completion, in the same statement.
 * - stored and shown: getTask, `berth tasks show`, the dashboard's task read, runDueTasks;
 * - nothing returned, nothing stored (and `null` stores nothing);
 * - over the cap, or not JSON (a BigInt, a cycle): a failure naming why, retried with backoff;
 * - a completion the fence refuses stores nothing, while the result of a batch-mate whose
 *   completion won is kept ("a stored result belongs to the accepted completion");
 * - retention deletes results past `resultRetentionMs`, and the option is checked.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BerthInputError, defineTask, enqueue, getTask, Worker } from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { resolveWorkerOptions } from '../src/process/worker-options.js';
import { resolveMaintenanceOptions } from '../src/maintenance/leader.js';
import { pruneResults } from '../src/storage/results.js';
import { storageFor } from '../src/storage/storage.js';
import { DashboardReads } from '../src/dashboard/overview.js';
import { task as dashboardTask } from '../src/dashboard/reads.js';
import { DEFAULT_BACKOFF, backoffDelayMs } from '../src/task.js';
import { encodeResult } from '../src/processor/handler-result.js';
import { FLUSH_MAX_COMPLETIONS, flushParts } from '../src/processor/settlement-batcher.js';
import { captureLogger, DATABASE_URL, freshSchema, takeLeaseOver, testLogger, waitFor } from './helpers.js';
import { runCli } from './support/run-cli.js';

const { schema, pool } = await freshSchema('results');
const S = `"${schema}"`;

async function storedRows(id: string): Promise<{ attempt: number; result: unknown }[]> {
  return (await pool.query(`SELECT attempt, result FROM ${S}.task_results WHERE id = $1`, [id])).rows;
}

test('a handler that returns an object completes its task, and getTask, the CLI, the dashboard and runDueTasks show the result', async () => {
  const def = defineTask<{ to: string }>({
    type: 'r_mail',
    ceilingMs: 5000,
    handler: async (p) => ({ messageId: `m-${p.to}`, accepted: [p.to] }),
  });
  const { id } = await enqueue(pool, def, { to: 'ann' }, { schema });
  const [report] = await runDueTasks(pool, [def], { schema });
  assert.equal(report?.status, 'completed');
  assert.equal(report?.outcome, 'success');
  assert.deepEqual(report?.result, { messageId: 'm-ann', accepted: ['ann'] });

  const t = await getTask(pool, schema, id!);
  assert.equal(t?.state, 'completed');
  assert.deepEqual(t?.result, { messageId: 'm-ann', accepted: ['ann'] });
  assert.deepEqual(await storedRows(id!), [{ attempt: 1, result: { messageId: 'm-ann', accepted: ['ann'] } }]);

  const show = await runCli(['tasks', 'show', id!, '--schema', schema, '--database-url', DATABASE_URL]);
  assert.equal(show.code, 0, show.err);
  // jsonb keeps an object's keys in its own order (shorter keys first).
  assert.match(show.out, /\nresult:\n\{\n {2}"accepted": \[\n {4}"ann"\n {2}\],\n {2}"messageId": "m-ann"\n\}\n/);
  // The completed attempt's lease ended with it: no expiry that would read as still held.
  assert.doesNotMatch(show.out, /^lease:/m);
  const json = await runCli(['tasks', 'show', id!, '--json', '--schema', schema, '--database-url', DATABASE_URL]);
  assert.deepEqual(JSON.parse(json.out).task.result, { messageId: 'm-ann', accepted: ['ann'] });

  const reads = new DashboardReads(pool, schema, testLogger);
  const detail = JSON.parse(JSON.stringify(await dashboardTask(reads, id!)));
  assert.deepEqual(detail.task.result, { messageId: 'm-ann', accepted: ['ann'] });
});

test("a handler that returns nothing, null or one of berth's answers stores no result", async () => {
  const answers: unknown[] = [undefined, null, 'done'];
  const ids: string[] = [];
  const def = defineTask<{ i: number }>({
    type: 'r_nothing',
    ceilingMs: 5000,
    handler: async (p) => answers[p.i] as undefined,
  });
  for (let i = 0; i < answers.length; i++) ids.push((await enqueue(pool, def, { i }, { schema })).id!);
  const reports = await runDueTasks(pool, [def], { schema });
  assert.deepEqual(
    reports.map((r) => [r.status, r.result]),
    answers.map(() => ['completed', null]),
  );
  for (const id of ids) {
    assert.equal((await getTask(pool, schema, id))?.result, null);
    assert.deepEqual(await storedRows(id), []);
  }
});

test('a result over resultMaxBytes fails its attempt with its size and the cap named, and is retried with the backoff', async () => {
  const def = defineTask<unknown>({
    type: 'r_big',
    ceilingMs: 5000,
    handler: async () => ({ blob: 'é'.repeat(600) }),
  });
  const { id } = await enqueue(pool, def, {}, { schema });
  const [report] = await runDueTasks(pool, [def], { schema, resultMaxBytes: 1000 });
  // 600 two-byte characters and `{"blob":""}`: 1,211 bytes of JSON.
  const error = "handler returned a result of 1211 bytes as JSON, over the worker's resultMaxBytes cap of 1000 bytes";
  assert.equal(report?.status, 'retry');
  assert.equal(report?.outcome, 'failure');
  assert.equal(report?.error, error);
  assert.equal(report?.retryDelayMs, backoffDelayMs(DEFAULT_BACKOFF, 1));
  const t = await getTask(pool, schema, id!);
  assert.equal(t?.state, 'retryable');
  assert.equal(t?.lastError, error);
  assert.equal(t?.result, null);
  assert.deepEqual(await storedRows(id!), []);
});

test('a result that is not JSON (a BigInt, a cycle, a function) or holds what PostgreSQL refuses is a failure naming why', async () => {
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  const values: unknown[] = [10n, cycle, () => 1, { text: 'a\u0000b' }];
  const def = defineTask<{ i: number }>({
    type: 'r_bad',
    ceilingMs: 5000,
    maxAttempts: 1,
    handler: async (p) => values[p.i] as object,
  });
  const ids: string[] = [];
  for (let i = 0; i < values.length; i++) ids.push((await enqueue(pool, def, { i }, { schema })).id!);
  const reports = await runDueTasks(pool, [def], { schema });
  assert.deepEqual(
    reports.map((r) => r.status),
    ['dead', 'dead', 'dead', 'dead'],
  );
  assert.match(reports[0]!.error!, /^handler returned bigint 10, which is not JSON-serialisable \(.*BigInt.*\)/);
  assert.match(
    reports[1]!.error!,
    /^handler returned an object \(Object\), which is not JSON-serialisable \(.*circular/,
  );
  assert.match(reports[2]!.error!, /^handler returned a function, which has no JSON form/);
  assert.match(reports[3]!.error!, /^handler returned a result PostgreSQL cannot store: result\.text contains a NUL/);
  for (const id of ids) assert.deepEqual(await storedRows(id), []);
});

test('encodeResult: the cap counts UTF-8 bytes, null stores nothing, a Date is its JSON', () => {
  assert.deepEqual(encodeResult(null, 10), { ok: true, json: null });
  assert.deepEqual(encodeResult('abc', 5), { ok: true, json: '"abc"' });
  assert.equal(encodeResult('abcd', 5).ok, false);
  assert.deepEqual(encodeResult(new Date(0), 100), { ok: true, json: '"1970-01-01T00:00:00.000Z"' });
  assert.deepEqual(encodeResult(new Date(Number.NaN), 100), { ok: true, json: null });
  assert.equal(encodeResult('€', 4).ok, false, 'three bytes and two quotes');
  assert.equal(encodeResult('€', 5).ok, true);
});

test('a stored result belongs to the accepted completion: one the fence refuses stores nothing, a batch-mate that won keeps its own', async () => {
  // One worker, one lane: both tasks are claimed, usually in one range lease. The first takes the
  // second's entry over (what rescue does after a lapse) before either returns, so the second's
  // completion is refused whether it flushes alone or in one batch with the first (then the
  // lease's row is dropped whole and the remainder statement settles the first alone).
  let release!: () => void;
  const gate = new Promise<void>((r) => {
    release = r;
  });
  const ids: string[] = [];
  const def = defineTask<{ i: number }>({
    type: 'r_fenced',
    ceilingMs: 30_000,
    handler: async (p, ctx) => {
      if (p.i === 0) {
        // The second task may be claimed after the first (a loaded machine splits the claims):
        // the takeover needs its lease, or it takes nothing and the second completes as it should.
        await waitFor(
          async () =>
            (await pool.query(`SELECT 1 FROM ${S}.leased_entries WHERE id = $1 AND outcome IS NULL`, [ids[1]]))
              .rowCount === 1,
          30_000,
          'the second task leased',
        );
        await takeLeaseOver(pool, schema, ids[1]!);
      } else await gate;
      if (p.i === 0) release();
      return { from: ctx.id };
    },
  });
  for (let i = 0; i < 2; i++) ids.push((await enqueue(pool, def, { i }, { schema })).id!);
  const { logger } = captureLogger();
  const w = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    slots: 2,
    maintenance: false,
    heartbeatIntervalMs: false,
    pollIntervalMs: 100,
    logger,
  });
  await w.start();
  try {
    await waitFor(
      async () => (await getTask(pool, schema, ids[0]!))?.state === 'completed',
      30_000,
      'the first task completed',
    );
    await w.stop();
  } finally {
    await w.stop();
  }
  assert.deepEqual(await storedRows(ids[0]!), [{ attempt: 1, result: { from: ids[0] } }]);
  assert.deepEqual(await storedRows(ids[1]!), [], 'the refused completion stored nothing');
  // takeLeaseOver wrote only the rescue's settlement (no retry row): the task is not completed.
  assert.notEqual((await getTask(pool, schema, ids[1]!))?.state, 'completed');
});

test('retention deletes results stored longer ago than resultRetentionMs, and keeps the rest', async () => {
  const def = defineTask<{ i: number }>({ type: 'r_old', ceilingMs: 5000, handler: async (p) => ({ i: p.i }) });
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) ids.push((await enqueue(pool, def, { i }, { schema })).id!);
  await runDueTasks(pool, [def], { schema });
  await pool.query(`UPDATE ${S}.task_results SET stored_at = now() - interval '2 hours' WHERE id = ANY($1::bigint[])`, [
    ids.slice(0, 2),
  ]);
  const pruned = await pruneResults(pool, storageFor(schema), 3600_000, 1);
  assert.equal(pruned, 2, 'two batches of one, then an empty one');
  assert.deepEqual(await storedRows(ids[0]!), []);
  assert.deepEqual(await storedRows(ids[1]!), []);
  assert.deepEqual(await storedRows(ids[2]!), [{ attempt: 1, result: { i: 2 } }]);
  assert.equal((await getTask(pool, schema, ids[0]!))?.result, null);
});

test('resultMaxBytes and resultRetentionMs are checked like every option', () => {
  const base = { connectionString: DATABASE_URL, tasks: [] };
  assert.equal(resolveWorkerOptions(base).resultMaxBytes, 64 * 1024);
  assert.equal(resolveWorkerOptions({ ...base, resultMaxBytes: 10 }).resultMaxBytes, 10);
  for (const bad of [0, -1, 1.5, Number.NaN, 17 * 1024 * 1024, '10'])
    assert.throws(
      () => resolveWorkerOptions({ ...base, resultMaxBytes: bad as number }),
      (e: unknown) =>
        e instanceof BerthInputError && /resultMaxBytes must be an integer from 1 to 16777216/.test(e.message),
    );
  assert.throws(
    () => resolveWorkerOptions({ ...base, resultMaxByte: 10 } as never),
    /unknown worker option "resultMaxByte"; did you mean "resultMaxBytes"/,
  );
  assert.equal(resolveMaintenanceOptions(undefined).resultRetentionMs, 7 * 24 * 3600_000);
  assert.throws(() => resolveMaintenanceOptions({ resultRetentionMs: 0 }), BerthInputError);
  assert.throws(() => resolveMaintenanceOptions({ resultRetentionMS: 1 } as never), /did you mean "resultRetentionMs"/);
});

test("a completion flush is split so that one statement carries at most the flush's share of result text", () => {
  const entry = (chars: number | null) => ({ result: chars === null ? null : 'x'.repeat(chars) });
  const small = [entry(10), entry(null), entry(10)];
  assert.deepEqual(flushParts(small, 100), [small], 'within the bound: one statement');
  const [a, b, c, d] = [entry(60), entry(30), entry(60), entry(null)];
  assert.deepEqual(
    flushParts([a, b, c, d], 100),
    [
      [a, b],
      [c, d],
    ],
    'parts in batch order, each within the bound',
  );
  const big = entry(500);
  assert.deepEqual(flushParts([entry(1), big, entry(1)], 100).length, 3, 'a result over the bound goes alone');
});

test('a completion flush is split so that one statement carries at most FLUSH_MAX_COMPLETIONS completions', () => {
  const many = Array.from({ length: 2 * FLUSH_MAX_COMPLETIONS + 1 }, (_, i) => ({ result: null, i }));
  const parts = flushParts(many);
  assert.deepEqual(
    parts.map((p) => p.length),
    [FLUSH_MAX_COMPLETIONS, FLUSH_MAX_COMPLETIONS, 1],
    'full parts, the rest last',
  );
  assert.deepEqual(parts.flat(), many, 'every completion once, in batch order');
  const exactly = many.slice(0, FLUSH_MAX_COMPLETIONS);
  assert.deepEqual(flushParts(exactly), [exactly], 'at the bound: one statement');
  const r = (chars: number | null) => ({ result: chars === null ? null : 'x'.repeat(chars) });
  const mixed = [r(60), r(null), r(null), r(60)];
  assert.deepEqual(
    flushParts(mixed, 100, 2).map((p) => p.length),
    [2, 2],
    'both bounds at once: whichever is reached first ends a part',
  );
});
