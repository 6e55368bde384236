/**
 * The batcher's enlisted completions (SettlementBatcher.enlist, the engine's path per task since
 * its Execution became the batch's entry): every owner is told once, with its own answer, after
 * its round; an owner that throws when told, and a logger that throws while that is logged, stop
 * none of the round's other owners; a flush that fails still tells every owner (unwritten).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ClaimedTask } from '../src/processor/claim.js';
import { type CompleteResult, type CompletionOwner, SettlementBatcher } from '../src/processor/settlement-batcher.js';
import { storageFor } from '../src/storage/storage.js';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import type { Logger } from '../src/logger.js';
import type { Queryable } from '../src/sql.js';
import { claimedTasks } from './claimed-tasks.js';
import { freshSchema, testLogger, within } from './helpers.js';

const { schema, pool } = await freshSchema('alloc_enlist');
const storage = storageFor(schema);

const claimed = (n: number, queues: string[]): Promise<ClaimedTask[]> => claimedTasks(pool, schema, n, queues);

type TestOwner = CompletionOwner & { told: Promise<CompleteResult>; calls: number };

function owner(ref: ClaimedTask, onTold?: () => void): TestOwner {
  let resolve!: (r: CompleteResult) => void;
  const told = new Promise<CompleteResult>((r) => {
    resolve = r;
  });
  const o: TestOwner = {
    ref,
    runMs: 1,
    result: null,
    answer: undefined,
    calls: 0,
    told,
    flushed() {
      o.calls++;
      assert.notEqual(o.answer, undefined, 'the answer is set before its owner is told');
      resolve(o.answer as CompleteResult);
      onTold?.();
    },
  };
  return o;
}

/** testLogger, but its `error` throws. */
const throwingLogger = new Proxy(testLogger, {
  get: (t, p) =>
    p === 'error'
      ? () => {
          throw new Error('logger down');
        }
      : Reflect.get(t, p, t),
}) as Logger;

test('every enlisted completion is told once, with its own answer; an owner that throws, and a logger that throws too, stop none of the rest', async () => {
  const [blocker, a, b, c] = await claimed(4, ['q1', 'q2', 'q3', 'q4']);
  const batcher = new SettlementBatcher(pool, storage, new BerthMetrics(), throwingLogger);
  // The blocker's flush starts at once: the three after it share the next round, the thrower first.
  const first = owner(blocker!);
  batcher.enlist(first);
  const thrower = owner(a!, () => {
    throw new Error('owner threw');
  });
  const stolen = owner({ ...b!, token: '00000000-0000-0000-0000-000000000000' });
  const last = owner(c!);
  for (const o of [thrower, stolen, last]) batcher.enlist(o);
  assert.deepEqual(await within(first.told, 10_000, 'the blocker told'), { kind: 'settled' });
  assert.deepEqual(await within(thrower.told, 10_000, 'the thrower told'), { kind: 'settled' });
  assert.deepEqual(await within(stolen.told, 10_000, 'the stolen token told'), { kind: 'refused' });
  assert.deepEqual(await within(last.told, 10_000, 'the one after the thrower told'), { kind: 'settled' });
  await batcher.drain();
  assert.deepEqual(
    [first, thrower, stolen, last].map((o) => o.calls),
    [1, 1, 1, 1],
    'each owner told once',
  );
});

test('a completion statement that keeps failing tells every enlisted owner unwritten', async () => {
  const ts = await claimed(3, ['q1', 'q2']);
  const db = {
    query: (...args: unknown[]) => {
      const name = (args[0] as { name?: string })?.name ?? '';
      if (name.startsWith('berth-complete'))
        return Promise.reject(Object.assign(new Error('injected statement error'), { code: 'XX000' }));
      return (pool.query as (...x: unknown[]) => Promise<unknown>)(...args);
    },
  } as unknown as Queryable;
  const batcher = new SettlementBatcher(db, storage, new BerthMetrics(), testLogger);
  const owners = ts.map((t) => owner(t));
  for (const o of owners) batcher.enlist(o);
  for (const o of owners) {
    const answer = await within(o.told, 20_000, 'told');
    assert.equal(answer.kind, 'unwritten');
  }
  await batcher.drain();
  assert.deepEqual(
    owners.map((o) => o.calls),
    [1, 1, 1],
  );
});
