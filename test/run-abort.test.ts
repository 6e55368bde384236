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

test('the timer’s list: runs disarmed anywhere in it (first, middle, last, twice, never armed) are never aborted, the rest all are', async () => {
  const timer = new DeadlineTimer();
  const now = Date.now();
  const runs = Array.from({ length: 12 }, (_, i) => new RunAbort(now + 20 + (i % 4) * 15));
  for (const r of runs) timer.arm(r);
  // Armed twice: still one entry (disarmed once below, it stays disarmed).
  timer.arm(runs[5]!);
  const disarmed = [runs[0]!, runs[5]!, runs[6]!, runs[11]!];
  for (const r of disarmed) timer.disarm(r);
  timer.disarm(runs[6]!);
  timer.disarm(new RunAbort(now + 10));
  const kept = runs.filter((r) => !disarmed.includes(r));
  // Later than every other deadline: once it is aborted, every disarmed run's deadline has passed.
  const sentinel = new RunAbort(now + 150);
  timer.arm(sentinel);
  await waitFor(() => sentinel.reason, 10_000, 'the last deadline to pass');
  for (const r of kept) {
    assert.ok(r.reason instanceof DeadlineAbort);
    assert.ok(Date.now() >= r.deadline);
  }
  for (const r of disarmed) assert.equal(r.reason, undefined);
  // Re-armed after its deadline: aborted at once by the timer.
  timer.arm(runs[0]!);
  await waitFor(() => runs[0]!.reason, 10_000, 'the re-armed run to be aborted');
});
