/**
 * What a producer or an operator sees when something is set up wrong: a berth error naming the
 * fix, never a bare PostgreSQL code or a TypeError.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { BerthInputError, enqueue, enqueueMany, getTask, SchemaNotMigratedError, Worker } from '../src/index.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('producer_errors');

test('enqueue into a schema nobody migrated is a SchemaNotMigratedError naming the fix, inside a transaction too', async () => {
  const missing = `never_migrated_${process.pid}`;
  await assert.rejects(enqueue(pool, 'x', {}, { schema: missing }), (e: Error) => {
    assert.ok(e instanceof SchemaNotMigratedError, `${e.name}: ${e.message}`);
    assert.match(e.message, new RegExp(`berth schema "${missing}" is not migrated.*berth migrate --schema ${missing}`));
    assert.equal((e as SchemaNotMigratedError).code, 'SCHEMA_NOT_MIGRATED');
    return true;
  });
  const client = new pg.Client(DATABASE_URL);
  await client.connect();
  try {
    await client.query('BEGIN');
    await assert.rejects(
      enqueueMany(client, [{ type: 'x', payload: {} }], { schema: missing }),
      SchemaNotMigratedError,
    );
    await client.query('ROLLBACK');
  } finally {
    await client.end();
  }
});

test('getTask of a schema nobody migrated, and of a malformed id, are berth errors', async () => {
  await assert.rejects(getTask(pool, `never_migrated_${process.pid}`, '1'), SchemaNotMigratedError);
  for (const bad of ['abc', '-1', '0', '99999999999999999999', '1.5', '']) {
    await assert.rejects(getTask(pool, schema, bad), (e: Error) => {
      assert.ok(e instanceof BerthInputError, `${bad}: ${e.name}: ${e.message}`);
      assert.match(e.message, /bad task id/);
      return true;
    });
  }
  assert.equal(await getTask(pool, schema, '12345'), null, 'a well-formed id nobody has is null');
});

test('new Worker without tasks is a BerthInputError that says what tasks are', () => {
  assert.throws(
    () => new Worker({ connectionString: DATABASE_URL, schema } as never),
    (e: Error) => e instanceof BerthInputError && /Worker needs tasks/.test(e.message),
  );
});

test('the operator reads against a schema nobody migrated are SchemaNotMigratedErrors too', async () => {
  const api = await import('../src/index.js');
  const missing = `never_migrated_${process.pid}`;
  const reads: [string, () => Promise<unknown>][] = [
    ['listTasks', () => api.listTasks(pool, missing)],
    ['taskTimeline', () => api.taskTimeline(pool, missing, '1')],
    ['listDead', () => api.listDead(pool, missing)],
    ['countDead', () => api.countDead(pool, missing, { all: true })],
    ['listQueues', () => api.listQueues(pool, missing)],
    ['laneStats', () => api.laneStats(pool, missing)],
    ['taskCounts', () => api.taskCounts(pool, missing)],
    ['throughput', () => api.throughput(pool, missing)],
    ['listWorkers', () => api.listWorkers(pool, missing)],
    ['leaderInfo', () => api.leaderInfo(pool, missing)],
    ['listAudit', () => api.listAudit(pool, missing)],
    ['attemptsOf', () => api.attemptsOf(pool, missing, '1')],
    ['listAttempts', () => api.listAttempts(pool, missing)],
    ['readHistorySettings', () => api.readHistorySettings(pool, missing)],
  ];
  for (const [name, read] of reads) {
    await assert.rejects(read(), (e: Error) => {
      assert.ok(e instanceof SchemaNotMigratedError, `${name}: ${e.name}: ${e.message}`);
      return true;
    });
  }
});

test("a peer's option name points at berth's: concurrency is slots, taskList is tasks", () => {
  for (const [key, hint] of [
    ['concurrency', 'slots'],
    ['localConcurrency', 'slots'],
    ['taskList', 'tasks'],
  ] as const) {
    assert.throws(
      () => new Worker({ connectionString: DATABASE_URL, schema, tasks: [], [key]: 4 } as never),
      (e: Error) =>
        e instanceof BerthInputError &&
        new RegExp(`unknown worker option "${key}"; did you mean "${hint}"`).test(e.message),
    );
  }
});
