/**
 * The outcome table (src/processor/outcome-table.ts) row by row, without a database: one test per
 * rule of seed 000's handler contract (done / continue / error, cancellation, deadlines, release
 * on stop, refunds), named after the rule. The writes themselves are pinned against PostgreSQL in
 * seed-rules, outcomes and settlement tests; here only the decision: which fenced write a run
 * gets, and which outcome each answer of the fence counts as.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { OUTCOMES } from '../src/metrics/catalogue.js';
import { backoffDelayMs, DEFAULT_BACKOFF } from '../src/task.js';
import { settlementFor, type HandlerRan, type SettleAnswer, type TaskRun } from '../src/processor/outcome-table.js';

const task = { attempt: 3, backoff: DEFAULT_BACKOFF };
const finalAttempt = { attempt: 20, backoff: DEFAULT_BACKOFF };
const plain: HandlerRan = {
  ms: 0,
  advanced: false,
  shutdown: false,
  pastDeadline: false,
  dequeued: false,
  cancelled: false,
};
const written: SettleAnswer = { kind: 'written', dead: false };
const writtenDead: SettleAnswer = { kind: 'written', dead: true };
const refused: SettleAnswer = { kind: 'refused' };
const unwritten: SettleAnswer = { kind: 'unwritten', error: 'connection refused' };

/** The outcome counted when the settlement gets `answer`. */
function counted(run: TaskRun, answer: SettleAnswer, t = task) {
  return settlementFor(run, t).outcome[answer.kind];
}

test('done: "A handler returns done and the processor writes the consequence" (Dequeue; counted success)', () => {
  const s = settlementFor({ kind: 'done', ...plain }, task);
  assert.deepEqual(s.action, { kind: 'complete' });
  assert.equal(s.outcome.written, 'success');
});

test('error: "A handler error records last_error, pushes run_at forward by a capped exponential backoff (15 s doubling to 10 min)"', () => {
  const s = settlementFor({ kind: 'error', error: 'boom', permanent: false, ...plain }, task);
  assert.deepEqual(s.action, {
    kind: 'fail',
    error: 'boom',
    delayMs: backoffDelayMs(DEFAULT_BACKOFF, 3),
    permanent: false,
  });
  assert.equal(s.action.kind === 'fail' && s.action.delayMs, 60_000, '15 s doubling: the third attempt waits 60 s');
  assert.equal(s.outcome.written, 'failure');
  const late = settlementFor(
    { kind: 'error', error: 'boom', permanent: false, ...plain },
    { attempt: 12, backoff: DEFAULT_BACKOFF },
  );
  assert.equal(late.action.kind === 'fail' && late.action.delayMs, 600_000, 'capped at 10 min');
});

test('dead letters: "At 20 attempts the row dead-letters" (the same RecordFailure; the fenced statement retires it, still counted failure)', () => {
  const s = settlementFor({ kind: 'error', error: 'boom', permanent: false, ...plain }, finalAttempt);
  assert.deepEqual(s.action, {
    kind: 'fail',
    error: 'boom',
    delayMs: backoffDelayMs(DEFAULT_BACKOFF, 20),
    permanent: false,
  });
  assert.equal(
    counted({ kind: 'error', error: 'boom', permanent: false, ...plain }, writtenDead, finalAttempt),
    'failure',
  );
});

test('permanent error: a PermanentError dead-letters now, whatever attempts remain (counted failure)', () => {
  const s = settlementFor({ kind: 'error', error: 'bad input', permanent: true, ...plain }, task);
  assert.equal(s.action.kind === 'fail' && s.action.permanent, true);
  assert.equal(s.outcome.written, 'failure');
});

test('continue: "A continue is counted as continued, not success — a slice is not a finished task" (the release is the safety net)', () => {
  const s = settlementFor({ kind: 'continue', ...plain, advanced: true }, task);
  assert.deepEqual(s.action, {
    kind: 'release',
    reason: 'continue',
    finalError: 'continued without advancing on its final attempt',
  });
  // AdvanceCursor already cleared the lease: the net matching nothing is the normal case.
  assert.equal(counted({ kind: 'continue', ...plain, advanced: true }, refused), 'continued');
  assert.equal(counted({ kind: 'continue', ...plain, advanced: true }, unwritten), 'continued');
});

test('continue: "That net matching a row is how a slice which advanced nothing is detected — it still gets released" (and keeps its burnt attempt)', () => {
  const s = settlementFor({ kind: 'continue', ...plain }, task);
  assert.equal(s.action.kind, 'release');
  assert.equal(s.outcome.written, 'continued');
});

test('continue: "one that continued without advancing keeps the attempt and reaches 20" (the release on the final attempt retires it with an explanation)', () => {
  const s = settlementFor({ kind: 'continue', ...plain }, finalAttempt);
  assert.deepEqual(s.action, {
    kind: 'release',
    reason: 'continue',
    finalError: 'continued without advancing on its final attempt',
  });
  assert.equal(counted({ kind: 'continue', ...plain }, writtenDead, finalAttempt), 'continued');
});

test('continue: "One returned with the handler context already past its deadline is recorded as timeout instead"', () => {
  assert.equal(counted({ kind: 'continue', ...plain, pastDeadline: true }, written), 'timeout');
  assert.equal(counted({ kind: 'continue', ...plain, advanced: true, pastDeadline: true }, refused), 'timeout');
});

test('lease lost: "A sliced handler whose AdvanceCursor is refused must return an ERROR ... which is refused in turn and recorded as lost"', () => {
  const s = settlementFor({ kind: 'error', error: 'slice lost its lease', permanent: false, ...plain }, task);
  assert.equal(s.action.kind, 'fail');
  assert.equal(s.outcome.refused, 'lost');
});

test('lease lost: "A refused settlement is treated as this worker no longer owns the row" (done, error, continue without progress: lost)', () => {
  assert.equal(counted({ kind: 'done', ...plain }, refused), 'lost');
  assert.equal(counted({ kind: 'error', error: 'x', permanent: false, ...plain }, refused), 'lost');
  assert.equal(counted({ kind: 'continue', ...plain }, refused), 'lost');
});

test('deadline: "A ceiling hit is recorded as outcome timeout" — an error at the deadline is an ordinary failure (backoff, retry) counted timeout', () => {
  const s = settlementFor({ kind: 'error', error: 'aborted', permanent: false, ...plain, pastDeadline: true }, task);
  assert.deepEqual(s.action, {
    kind: 'fail',
    error: 'aborted',
    delayMs: backoffDelayMs(DEFAULT_BACKOFF, 3),
    permanent: false,
  });
  assert.equal(s.outcome.written, 'timeout');
});

test('deadline: "done (true, nil) — recorded as success. A handler that swallowed the cancellation and reported completion is indistinguishable"', () => {
  const s = settlementFor({ kind: 'done', ...plain, pastDeadline: true }, task);
  assert.deepEqual(s.action, { kind: 'complete' });
  assert.equal(s.outcome.written, 'success');
});

test('deadline: "If that deadline is already past when the claim returns ... not started ... Recorded as timeout ..., then backed off like any other failure"', () => {
  const s = settlementFor({ kind: 'late_claim', error: 'claim returned after the handler deadline' }, task);
  assert.deepEqual(s.action, {
    kind: 'fail',
    error: 'claim returned after the handler deadline',
    delayMs: backoffDelayMs(DEFAULT_BACKOFF, 3),
    permanent: false,
  });
  assert.equal(s.outcome.written, 'timeout');
});

test('shutdown: "In-flight handlers are cancelled and their leases explicitly released ... recorded as cancelled when the handler saved nothing"', () => {
  for (const run of [
    { kind: 'error', error: 'aborted', permanent: false, ...plain, shutdown: true },
    { kind: 'continue', ...plain, shutdown: true },
    { kind: 'unstorable_result', error: 'returned a BigInt', ...plain, shutdown: true },
  ] as const) {
    const s = settlementFor(run, task);
    assert.deepEqual(
      s.action,
      { kind: 'release', reason: 'shutdown', finalError: 'interrupted by worker shutdown on its final attempt' },
      run.kind,
    );
    assert.deepEqual(
      s.outcome,
      { written: 'cancelled', refused: 'lost', cancelled: 'cancelled', unwritten: 'unsettled' },
      run.kind,
    );
  }
});

test('shutdown: "... and continued when it saved progress first" (whatever the release answers: the progress is saved)', () => {
  const s = settlementFor(
    { kind: 'error', error: 'aborted', permanent: false, ...plain, shutdown: true, advanced: true },
    task,
  );
  assert.equal(s.action.kind, 'release');
  assert.deepEqual(s.outcome, {
    written: 'continued',
    refused: 'continued',
    cancelled: 'continued',
    unwritten: 'continued',
  });
});

test('shutdown: "A release does not refund the attempt the claim burnt" and "a shutdown on a task\'s final attempt retires it ... the release stamps last_error"', () => {
  const s = settlementFor({ kind: 'error', error: 'aborted', permanent: true, ...plain, shutdown: true }, finalAttempt);
  // A release, never a refund (return_unstarted) nor a failure (a permanent error interrupted by stop is still a release).
  assert.deepEqual(s.action, {
    kind: 'release',
    reason: 'shutdown',
    finalError: 'interrupted by worker shutdown on its final attempt',
  });
  assert.equal(
    counted({ kind: 'error', error: 'aborted', permanent: false, ...plain, shutdown: true }, writtenDead, finalAttempt),
    'cancelled',
  );
});

test('shutdown: a handler that finished before it saw the abort reports done, and done is written (counted success)', () => {
  const s = settlementFor({ kind: 'done', ...plain, shutdown: true }, task);
  assert.deepEqual(s.action, { kind: 'complete' });
  assert.equal(s.outcome.written, 'success');
});

test('shutdown: "If the release itself fails, expiry still gets there" (not written: counted unsettled, the lease lapses)', () => {
  assert.equal(
    counted({ kind: 'error', error: 'aborted', permanent: false, ...plain, shutdown: true }, unwritten),
    'unsettled',
  );
});

test('refund: a prefetched task that waited past its deadline never ran: handed back with the attempt refunded, counted nowhere', () => {
  const s = settlementFor({ kind: 'expired_in_buffer' }, task);
  assert.deepEqual(s, {
    action: { kind: 'return_unstarted' },
    outcome: { written: null, refused: null, cancelled: null, unwritten: null },
  });
});

test('refund: a run a stop aborted before its handler started: handed back with the attempt refunded, counted nowhere', () => {
  const s = settlementFor({ kind: 'stopped_before_start' }, task);
  assert.deepEqual(s, {
    action: { kind: 'return_unstarted' },
    outcome: { written: null, refused: null, cancelled: null, unwritten: null },
  });
});

test('outage: a settlement the database never took is counted unsettled, never lost ("lost" means only that the token was refused)', () => {
  assert.equal(counted({ kind: 'done', ...plain }, unwritten), 'unsettled');
  assert.equal(counted({ kind: 'error', error: 'x', permanent: false, ...plain }, unwritten), 'unsettled');
  assert.equal(counted({ kind: 'continue', ...plain }, unwritten), 'unsettled');
});

test('a handler that returns a value completes the task and the completion carries the result; returning nothing carries none', () => {
  const s = settlementFor({ kind: 'done', result: '{"sent":true}', ...plain }, task);
  assert.deepEqual(s.action, { kind: 'complete', result: '{"sent":true}' });
  assert.equal(s.outcome.written, 'success');
  assert.equal(s.outcome.refused, 'lost');
  assert.deepEqual(settlementFor({ kind: 'done', ...plain }, task).action, { kind: 'complete' });
});

test('a result berth cannot store fails loudly (backoff, counted failure), never a success', () => {
  const error = "handler returned a result of 70000 bytes as JSON, over the worker's resultMaxBytes cap of 65536 bytes";
  const s = settlementFor({ kind: 'unstorable_result', error, ...plain }, task);
  assert.deepEqual(s.action, {
    kind: 'fail',
    error,
    delayMs: backoffDelayMs(DEFAULT_BACKOFF, 3),
    permanent: false,
  });
  assert.equal(s.outcome.written, 'failure');
  assert.equal(counted({ kind: 'unstorable_result', error: 'x', ...plain, pastDeadline: true }, written), 'timeout');
});

test('unknown type: handed back unstarted, the attempt refunded, kept away for its delay, nothing counted', () => {
  const s = settlementFor({ kind: 'unknown_type', error: 'no handler for task type "x"', delayMs: 5000 }, task);
  assert.deepEqual(s.action, {
    kind: 'return_unstarted',
    away: { delayMs: 5000, note: 'no handler for task type "x"' },
  });
  assert.deepEqual(
    s.outcome,
    { written: null, refused: null, cancelled: null, unwritten: null },
    'not a handler outcome, never a failure',
  );
});

test('bad payload: a payload its schema refuses can never succeed: dead-lettered at once, no backoff (counted failure)', () => {
  const s = settlementFor({ kind: 'invalid_payload', error: 'payload.n: expected number' }, task);
  assert.deepEqual(s.action, { kind: 'fail', error: 'payload.n: expected number', delayMs: 0, permanent: true });
  assert.equal(s.outcome.written, 'failure');
});

test('every outcome the table counts is one of the eight the metrics export', () => {
  const runs: TaskRun[] = [
    { kind: 'unknown_type', error: 'x', delayMs: 0 },
    { kind: 'expired_in_buffer' },
    { kind: 'stopped_before_start' },
    { kind: 'late_claim', error: 'x' },
    { kind: 'invalid_payload', error: 'x' },
  ];
  for (const advanced of [false, true]) {
    for (const shutdown of [false, true]) {
      for (const pastDeadline of [false, true]) {
        for (const cancelled of [false, true]) {
          const ran = { ms: 0, advanced, shutdown, pastDeadline, cancelled, dequeued: false };
          runs.push(
            { kind: 'done', ...ran },
            { kind: 'continue', ...ran },
            { kind: 'snooze', delayMs: 1000, ...ran },
            { kind: 'error', error: 'x', permanent: false, ...ran },
            { kind: 'unstorable_result', error: 'x', ...ran },
          );
        }
      }
    }
  }
  const seen = new Set<string>();
  for (const run of runs) {
    for (const o of Object.values(settlementFor(run, task).outcome)) if (o !== null) seen.add(o);
  }
  assert.deepEqual([...seen].sort(), [...OUTCOMES].sort());
});

test('cancel: a run an operator cancelled (its signal fired by the cancel) writes nothing and counts cancelled, whatever it returned', () => {
  for (const run of [
    { kind: 'done', ...plain, cancelled: true },
    { kind: 'continue', ...plain, cancelled: true },
    { kind: 'snooze', delayMs: 5, ...plain, cancelled: true },
    { kind: 'error', error: 'aborted', permanent: false, ...plain, cancelled: true, shutdown: true },
  ] satisfies TaskRun[]) {
    const s = settlementFor(run, task);
    assert.deepEqual(s.action, { kind: 'none' }, run.kind);
    assert.deepEqual(s.outcome, {
      written: 'cancelled',
      refused: 'cancelled',
      cancelled: 'cancelled',
      unwritten: 'cancelled',
    });
  }
});

test('cancel race: a settlement refused because an operator cancelled first counts cancelled, not lost', () => {
  const lostToCancel: SettleAnswer = { kind: 'cancelled' };
  assert.equal(counted({ kind: 'done', ...plain }, lostToCancel), 'cancelled');
  assert.equal(counted({ kind: 'error', error: 'x', permanent: false, ...plain }, lostToCancel), 'cancelled');
  assert.equal(counted({ kind: 'done', ...plain }, refused), 'lost');
});

test("snooze: written as a snooze with the type's maxSnoozes (default 100), counted snoozed; during a stop too", () => {
  const s = settlementFor({ kind: 'snooze', delayMs: 30_000, ...plain }, task);
  assert.deepEqual(s.action, {
    kind: 'snooze',
    delayMs: 30_000,
    maxSnoozes: 100,
    finalError: 'snoozed past maxSnoozes on its final attempt',
  });
  assert.deepEqual(s.outcome, { written: 'snoozed', refused: 'lost', cancelled: 'cancelled', unwritten: 'unsettled' });
  const t = settlementFor({ kind: 'snooze', delayMs: 1, ...plain, shutdown: true }, { ...task, maxSnoozes: 3 });
  assert.equal(t.action.kind === 'snooze' && t.action.maxSnoozes, 3);
});

test('snooze after an AdvanceCursor: the advance already released the task, so it settles as a continue that saved progress', () => {
  const s = settlementFor({ kind: 'snooze', delayMs: 10, ...plain, advanced: true }, task);
  assert.equal(s.action.kind, 'release');
  assert.deepEqual(s.outcome, {
    written: 'continued',
    refused: 'continued',
    cancelled: 'continued',
    unwritten: 'continued',
  });
});
