import type { Outcome } from '../metrics/catalogue.js';
import type { ResultJson } from '../storage/results.js';
import { backoffDelayMs, type BackoffPolicy, DEFAULT_MAX_SNOOZES } from '../task.js';
import type { ErrorDetail } from '../util/error-detail.js';

/**
 * What happened when the engine took a leased task (processor/run-task.ts): either it never
 * started the handler, or the handler ran and gave one of its answers (or returned a result
 * berth cannot store). Nothing here has been written yet: settling is the next, separate step.
 */
export type TaskRun =
  /**
   * The worker has no definition for the claimed type: not the task's fault, so it is handed
   * back without charging an attempt, kept away `delayMs` (processor/unknown-types.ts).
   */
  | { kind: 'unknown_type'; error: string; delayMs: number }
  /**
   * Its type's fleet-wide rate limit refused the start (processor/type-rate-gate.ts): handed back
   * unstarted, attempt refunded, due again in `delayMs`.
   */
  | { kind: 'rate_limited'; note: string; delayMs: number }
  /** It waited in the prefetch buffer past its deadline: it never ran. */
  | { kind: 'expired_in_buffer' }
  /**
   * A stop aborted its run while its start waited (an asynchronous payload schema, a schedule's
   * ceiling read, a rate-limited type's ask): it never ran.
   */
  | { kind: 'stopped_before_start' }
  /** The claim itself returned after the handler deadline (seed 000: not started, recorded as timeout). */
  | { kind: 'late_claim'; error: string }
  /** The payload failed its definition's schema: it can never succeed, so it is a permanent failure. */
  | { kind: 'invalid_payload'; error: string }
  /** `result`: the JSON of what the handler returned besides berth's answers, stored with the completion. */
  | ({ kind: 'done'; result?: ResultJson } & HandlerRan)
  | ({ kind: 'continue' } & HandlerRan)
  /** The handler returned `snooze(delayMs)`: run again after the delay. */
  | ({ kind: 'snooze'; delayMs: number } & HandlerRan)
  /** `thrown`: what the handler threw, as it was (events and spans report it; the table ignores it). */
  | ({ kind: 'error'; error: string; detail?: ErrorDetail; permanent: boolean; thrown?: unknown } & HandlerRan)
  /**
   * The handler returned a result berth cannot store (not JSON, over `resultMaxBytes`,
   * characters PostgreSQL refuses): a failure naming why (processor/handler-result.ts).
   */
  | ({ kind: 'unstorable_result'; error: string; detail?: ErrorDetail; thrown?: unknown } & HandlerRan);

/** What the engine saw around a handler that ran. */
export interface HandlerRan {
  /** How long the handler ran, in milliseconds (attempt history). */
  ms: number;
  /** An AdvanceCursor of this run was written (its progress is saved, this attempt already settled). */
  advanced: boolean;
  /** stop() aborted the handler (a rollout), as opposed to its deadline or nothing. */
  shutdown: boolean;
  /** The deadline aborted it, or it returned at or after its deadline. */
  pastDeadline: boolean;
  /**
   * The handler settled the task itself (`ctx.dequeue`, in its own transaction). The worker's
   * settlement is still written (the handler's transaction may have rolled back); a refusal then
   * means the handler's completion committed, and counts as a success, not a lost lease.
   */
  dequeued: boolean;
  /**
   * An operator cancelled it: the signal fired because a `cancelled` settlement of this attempt
   * was committed (seen by its notification or the poll), so nothing the handler says is written.
   */
  cancelled: boolean;
}

/** The task as the table needs it: its attempt and the backoff policy that applies. */
export interface TaskAttempt {
  attempt: number;
  backoff: BackoffPolicy;
  /** The type's `maxSnoozes` (default 100). */
  maxSnoozes?: number;
}

/** The one fenced write that settles a run. */
export type SettleAction =
  /** Dequeue: settled as completed (the batcher's completion), storing `result` when there is one. */
  | { kind: 'complete'; result?: ResultJson }
  /** RecordFailure: backoff, last_error, retry or (out of attempts, or permanent) dead letter. */
  | { kind: 'fail'; error: string; delayMs: number; permanent: boolean }
  /**
   * Release: back due now with the burnt attempt kept (seed 000: a rollout is not refunded);
   * `finalError` is stamped only when it retires the task on its final attempt.
   */
  | { kind: 'release'; reason: 'shutdown' | 'continue'; finalError: string }
  /**
   * Hand back a never-started task with the claim's attempt refunded: due now, or (`away`) after
   * a delay, with a note as its last_error (a null note keeps the last error as it was).
   */
  | { kind: 'return_unstarted'; away?: { delayMs: number; note: string | null } }
  /**
   * Snooze: defer to now() + delayMs; the attempt is given back within `maxSnoozes` snoozes of
   * the task, kept past it (`finalError` stamped when that retires it on its final attempt).
   */
  | { kind: 'snooze'; delayMs: number; maxSnoozes: number; finalError: string }
  /** Nothing to write: an operator's cancel already settled this attempt. */
  | { kind: 'none' };

/**
 * What the fence answered: the write landed (`dead`: it moved the task to the dead letters), the
 * token no longer owned the lease, an operator's cancel had settled the attempt first (a refusal
 * whose winner was a cancel), or the statement could not be written at all.
 */
export type SettleAnswer =
  | { kind: 'written'; dead: boolean }
  | { kind: 'refused' }
  | { kind: 'cancelled' }
  | { kind: 'unwritten'; error: string };

/** The outcome counted for each answer the settlement can get; null: not counted. */
export type OutcomeByAnswer = Readonly<Record<SettleAnswer['kind'], Outcome | null>>;

export interface Settlement {
  action: SettleAction;
  outcome: OutcomeByAnswer;
}

/**
 * A refused write means the lease was taken over (`lost`), or lost to an operator's cancel
 * (`cancelled`: the cancel is what the attempt came to); an unwritten one lapses (`unsettled`).
 */
function fenced(written: Outcome | null): OutcomeByAnswer {
  return { written, refused: 'lost', cancelled: 'cancelled', unwritten: 'unsettled' };
}

/** Nothing is counted whatever the write answers (no handler ran). */
const NOT_COUNTED: OutcomeByAnswer = Object.freeze({ written: null, refused: null, cancelled: null, unwritten: null });

/** Counted as `outcome` whatever the write answers (the run already saved its progress). */
function always(outcome: Outcome): OutcomeByAnswer {
  return { written: outcome, refused: outcome, cancelled: outcome, unwritten: outcome };
}

/** A failure retried after the task's backoff (dead-lettered instead when permanent or out of attempts). */
function failWithBackoff(error: string, task: TaskAttempt, permanent: boolean): SettleAction {
  return { kind: 'fail', error, delayMs: backoffDelayMs(task.backoff, task.attempt), permanent };
}

/** The common case, one value for every run (the table is pure, and nothing changes a settlement). */
const COMPLETE: Settlement = Object.freeze({
  action: Object.freeze({ kind: 'complete' }),
  outcome: Object.freeze(fenced('success')),
});

const SHUTDOWN_FINAL_ERROR = 'interrupted by worker shutdown on its final attempt';
const SNOOZE_FINAL_ERROR = 'snoozed past maxSnoozes on its final attempt';

/** An operator's cancel settled the attempt: nothing to write, counted cancelled. */
const CANCELLED: Settlement = Object.freeze({
  action: Object.freeze({ kind: 'none' }),
  outcome: Object.freeze(always('cancelled')),
});
const CONTINUE_FINAL_ERROR = 'continued without advancing on its final attempt';

/**
 * Seed 000's handler contract as a table: what happened (the run), the task's attempt and its
 * backoff policy give the settlement to write and the outcome to count for each answer of the
 * fence. Pure: no clock, no database. The retire decision (attempt >= max attempts, or a
 * permanent failure) is the fenced statement's, on the lease row's own numbers.
 */
export function settlementFor(run: TaskRun, task: TaskAttempt): Settlement {
  switch (run.kind) {
    case 'unknown_type':
      // Not the task's fault: another worker (or this one's next version) runs it. Nothing ran,
      // so no outcome; berth_tasks_unknown_type_total counts it. Seed 000 keeps a rollout's
      // attempt because a refund could hide a task that always dies mid-flight; a task that is
      // never started cannot be one (docs/architecture.md, "Routing").
      return {
        action: { kind: 'return_unstarted', away: { delayMs: run.delayMs, note: run.error } },
        outcome: NOT_COUNTED,
      };
    case 'rate_limited':
      // Nothing ran: the limit, not the task, held it back, so the attempt is refunded. No note:
      // the task's last error (of an earlier attempt) stays what it was.
      return {
        action: { kind: 'return_unstarted', away: { delayMs: run.delayMs, note: null } },
        outcome: NOT_COUNTED,
      };
    case 'expired_in_buffer':
    case 'stopped_before_start':
      // Nothing ran, so nothing is counted; the refund keeps a slow process from burning attempts.
      return { action: { kind: 'return_unstarted' }, outcome: NOT_COUNTED };
    case 'late_claim':
      return {
        action: failWithBackoff(run.error, task, false),
        outcome: fenced('timeout'),
      };
    case 'invalid_payload':
      return { action: { kind: 'fail', error: run.error, delayMs: 0, permanent: true }, outcome: fenced('failure') };
    default:
      return afterHandler(run, task);
  }
}

function afterHandler(run: Extract<TaskRun, HandlerRan>, task: TaskAttempt): Settlement {
  // Cancelled: the cancel's settlement is the attempt's; whatever the handler said loses to it.
  if (run.cancelled) return CANCELLED;
  const settlement = byHandlerResult(run, task);
  return run.dequeued ? { ...settlement, outcome: { ...settlement.outcome, refused: 'success' } } : settlement;
}

function byHandlerResult(run: Extract<TaskRun, HandlerRan>, task: TaskAttempt): Settlement {
  if (run.kind === 'snooze' && run.advanced) {
    // The run's AdvanceCursor already settled the lease and made the task due now: the snooze
    // has nothing left to defer, so it is the safety-net release of a continue (refused).
    return byHandlerResult({ ...run, kind: 'continue' }, task);
  }
  if (run.kind === 'snooze') {
    // An explicit answer, written as it is, during a stop or at the deadline too.
    return {
      action: {
        kind: 'snooze',
        delayMs: run.delayMs,
        maxSnoozes: task.maxSnoozes ?? DEFAULT_MAX_SNOOZES,
        finalError: SNOOZE_FINAL_ERROR,
      },
      outcome: fenced('snoozed'),
    };
  }
  if (run.shutdown && run.kind !== 'done') {
    // Interrupted by stop(): hand the lease back so another worker takes it within a poll.
    // A run that saved progress first is counted as continued whatever the release answers.
    const action: SettleAction = { kind: 'release', reason: 'shutdown', finalError: SHUTDOWN_FINAL_ERROR };
    if (run.advanced) return { action, outcome: always('continued') };
    return { action, outcome: fenced('cancelled') };
  }
  const counted: Outcome = run.pastDeadline ? 'timeout' : 'failure';
  switch (run.kind) {
    case 'error':
      return {
        action: failWithBackoff(run.error, task, run.permanent),
        outcome: fenced(counted),
      };
    case 'unstorable_result':
      return {
        action: failWithBackoff(run.error, task, false),
        outcome: fenced(counted),
      };
    case 'continue': {
      // AdvanceCursor already settled this attempt; this release is the safety net. Matching a row
      // means the slice advanced nothing and its next attempt repeats this one. A continue at
      // the deadline is a timeout (a property of the deadline, not of intent).
      const continued: Outcome = run.pastDeadline ? 'timeout' : 'continued';
      const action: SettleAction = { kind: 'release', reason: 'continue', finalError: CONTINUE_FINAL_ERROR };
      if (run.advanced) return { action, outcome: always(continued) };
      return { action, outcome: fenced(continued) };
    }
    case 'done':
      // Done after the deadline is still a success: indistinguishable from one that finished.
      return run.result === undefined
        ? COMPLETE
        : { action: { kind: 'complete', result: run.result }, outcome: COMPLETE.outcome };
  }
}
