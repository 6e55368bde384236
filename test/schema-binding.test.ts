import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bindSchema } from '../src/sql.js';
import { storageFor } from '../src/storage/storage.js';

test('a schema name is bound once: quoted, frozen, and one storage per name holds it', () => {
  const bound = bindSchema('odd"name');
  assert.deepEqual({ ...bound }, { name: 'odd"name', q: '"odd""name"' });
  assert.ok(Object.isFrozen(bound));
  assert.throws(() => bindSchema(''), /must not be empty/);
  assert.throws(() => bindSchema('a\u0000b'), /NUL/);
  const storage = storageFor('odd"name');
  assert.equal(storageFor('odd"name'), storage, 'the same storage for the same name');
  assert.equal(storage.schema.q, '"odd""name"');
  assert.throws(() => storageFor(''), /must not be empty/);
});

test('the public functions take a schema name, and a bad one is a rejected promise, never a throw', async () => {
  const { dequeue, getTask, listTasks, countDead, retryDeadLetters, moveTask } = await import('../src/index.js');
  const { rescueLapsedLeases, pruneSegment, promoteDueLanes, promoteDueLane, readGauges } = await import(
    '../src/maintenance-api.js'
  );
  const db = { query: () => Promise.reject(new Error('not reached')) } as never;
  const calls: [string, () => Promise<unknown>][] = [
    ['dequeue', () => dequeue(db, '', '1', '')],
    ['getTask', () => getTask(db, '', '1')],
    ['listTasks', () => listTasks(db, '')],
    ['countDead', () => countDead(db, '', { all: true })],
    ['retryDeadLetters', () => retryDeadLetters(db, '', ['1'])],
    ['moveTask', () => moveTask(db, '', '1', { priority: 1 })],
    ['rescueLapsedLeases', () => rescueLapsedLeases(db, '')],
    ['pruneSegment', () => pruneSegment(db, '', 1, 100)],
    ['promoteDueLanes', () => promoteDueLanes(db, '', null, 10, null)],
    ['promoteDueLane', () => promoteDueLane(db, '', { queue: 'q', priority: 0, shard: 0 }, 10, null)],
    ['readGauges', () => readGauges(db, '')],
  ];
  for (const [name, call] of calls) {
    let promise: Promise<unknown>;
    assert.doesNotThrow(() => {
      promise = call();
    }, `${name} throws synchronously`);
    await assert.rejects(promise!, /must not be empty/, name);
  }
});
