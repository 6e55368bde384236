import { DeadlineAbort } from '../errors.js';

/** setTimeout's longest delay; a longer one fires at once (ceilings stay under it, see task.ts). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * One run's abort: its deadline, why it was aborted (stop(), the deadline) and the handler's
 * `AbortSignal`, which is made only when the handler first reads it, already aborted with the
 * same reason if the abort came first. Measured in the drain probe (bench/drain-profile.ts,
 * 50,000 no-op tasks): creating the signal of an AbortController took ~3.4 µs a task in Node 20
 * (the signal is an EventTarget whose prototype is swapped at creation), 10 % of the worker's CPU,
 * and most handlers never read it.
 */
export class RunAbort {
  private controller: AbortController | null = null;
  private why: Error | undefined = undefined;
  private at: number;
  /** Its place in the DeadlineTimer's list while armed, else -1 (DeadlineTimer's only). */
  armedAt = -1;

  /** `deadline`: the lease's own expiry stamp minus the margin (epoch ms). */
  constructor(deadline: number) {
    this.at = deadline;
  }

  /** The handler's deadline (epoch ms): the lease's, or earlier once shortened. */
  get deadline(): number {
    return this.at;
  }

  /**
   * Bring the deadline forward to `at` (never back: the lease bounds it), before the run is armed
   * (DeadlineTimer.arm reads it once, to set its timer). A schedule's shorter ceiling does this
   * (run-task.ts); a plain task's run never calls it.
   */
  shortenTo(at: number): void {
    if (at < this.at) this.at = at;
  }

  /** The handler's signal: the same object on every read. */
  get signal(): AbortSignal {
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.why !== undefined) this.controller.abort(this.why);
    }
    return this.controller.signal;
  }

  /** Why the run was aborted (the first abort wins, as with an AbortController); undefined if not. */
  get reason(): Error | undefined {
    return this.why;
  }

  abort(reason: Error): void {
    if (this.why !== undefined) return;
    this.why = reason;
    this.controller?.abort(reason);
  }
}

/**
 * Aborts each armed run with a DeadlineAbort once its deadline passes, on one timer for all of
 * them: set for the earliest armed deadline, and moved only when a run with an earlier one is
 * armed. A timer per run (set before the handler, cleared after) cost a Timeout and a timer-list
 * insert and removal per task; here a run costs a push and a swap-remove in an array (each run
 * knowing its place: a Set's table, regrown as entries came and went, was ~30 B a task of a warm
 * drain, docs/benchmarks-journal.md), and a drain of same-type tasks (increasing deadlines) sets
 * the timer about once per ceiling. A run disarmed before its deadline is simply gone when the
 * timer fires, which re-arms for the earliest one left. A run is armed on one timer at a time.
 */
export class DeadlineTimer {
  private readonly armed: RunAbort[] = [];
  private timer: NodeJS.Timeout | null = null;
  private firesAt = Number.POSITIVE_INFINITY;

  /** Abort `run` with a DeadlineAbort at its deadline, unless disarmed first. */
  arm(run: RunAbort): void {
    if (run.armedAt < 0) {
      run.armedAt = this.armed.length;
      this.armed.push(run);
    }
    if (run.deadline < this.firesAt) this.schedule(run.deadline, Date.now());
  }

  disarm(run: RunAbort): void {
    const i = run.armedAt;
    if (i < 0 || this.armed[i] !== run) return;
    const last = this.armed.pop() as RunAbort;
    if (last !== run) {
      this.armed[i] = last;
      last.armedAt = i;
    }
    run.armedAt = -1;
  }

  private schedule(at: number, now: number): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.firesAt = at;
    this.timer = setTimeout(() => this.fire(), Math.min(MAX_TIMER_MS, Math.max(0, at - now)));
    // A handler that ignores its signal must not also keep the process alive after stop().
    this.timer.unref();
  }

  private fire(): void {
    this.timer = null;
    this.firesAt = Number.POSITIVE_INFINITY;
    const now = Date.now();
    let next = Number.POSITIVE_INFINITY;
    // The due runs taken out first, then aborted: an abort runs the signal's listeners at once.
    const due: RunAbort[] = [];
    for (let i = this.armed.length - 1; i >= 0; i--) {
      const run = this.armed[i] as RunAbort;
      if (run.deadline <= now) {
        due.push(run);
        this.disarm(run);
      } else if (run.deadline < next) next = run.deadline;
    }
    for (let i = due.length - 1; i >= 0; i--) {
      const run = due[i] as RunAbort;
      run.abort(new DeadlineAbort(run.deadline));
    }
    // Timers may fire a little early by the wall clock: a run not yet due gets a timer of its own.
    // A run armed by an abort's listener above has set firesAt (arm()); the earlier of the two
    // wins (test/run-abort-review.test.ts: armed while the timer fires).
    const at = Math.min(next, this.firesAt);
    if (at !== Number.POSITIVE_INFINITY) this.schedule(at, Date.now());
  }
}
