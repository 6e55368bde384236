/**
 * A run's abort without a database (src/processor/run-abort.ts): the handler's signal is made on
 * first read and carries the same state as an AbortController would have; one timer aborts every
 * armed run at its deadline. The signal's end-to-end behaviour (a handler aborted at lease expiry
 * minus the margin, stop() aborting with ShutdownAbort) is pinned in processor.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DeadlineAbort, ShutdownAbort } from '../src/errors.js';
import { DeadlineTimer, RunAbort } from '../src/processor/run-abort.js';
import { waitFor } from './helpers.js';

test('the signal read after an abort is already aborted, with that reason; the same object on every read', () => {
  const run = new RunAbort(Date.now() + 60_000);
  const stop = new ShutdownAbort();
  run.abort(stop);
  const signal = run.signal;
  assert.equal(signal.aborted, true);
  assert.equal(signal.reason, stop);
  assert.equal(run.signal, signal);
});

test('the signal read before an abort fires its abort event; the first abort wins', () => {
  const run = new RunAbort(Date.now() + 60_000);
  const signal = run.signal;
  let fired = 0;
  signal.addEventListener('abort', () => fired++);
  assert.equal(signal.aborted, false);
  const stop = new ShutdownAbort();
  run.abort(stop);
  run.abort(new DeadlineAbort(run.deadline));
  assert.equal(fired, 1);
  assert.equal(signal.reason, stop);
  assert.equal(run.reason, stop);
});

test('one timer aborts each armed run at its deadline, earliest first, and never a disarmed one', async () => {
  const timer = new DeadlineTimer();
  const now = Date.now();
  const late = new RunAbort(now + 120);
  const early = new RunAbort(now + 30);
  const disarmed = new RunAbort(now + 60);
  timer.arm(late);
  timer.arm(early);
  timer.arm(disarmed);
  timer.disarm(disarmed);
  await waitFor(() => late.reason, 10_000, 'the later deadline to pass');
  assert.ok(early.reason instanceof DeadlineAbort);
  assert.equal(early.reason.deadline, early.deadline);
  assert.ok(late.reason instanceof DeadlineAbort);
  assert.ok(Date.now() >= late.deadline);
  assert.equal(disarmed.reason, undefined);
});
