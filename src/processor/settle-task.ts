import type { Storage } from '../storage/storage.js';
import type { Logger } from '../logger.js';
import type { Outcome } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import type { ClaimedTask } from './claim.js';
import type { SettleAction, SettleAnswer, Settlement, TaskRun } from './outcome-table.js';
import type { TaskReports } from './task-reports.js';
import type { CompleteResult, Completion, SettlementBatcher } from './settlement-batcher.js';
import { type ReleaseHistory, releaseLease, returnUnstarted } from '../storage/return.js';
import { countLostClaim, refusalOf } from '../storage/lost-claim.js';
import { snoozeLease } from '../storage/snooze.js';

export interface SettleDeps {
  write: Queryable;
  storage: Storage;
  batcher: SettlementBatcher;
  /** Counts an outcome (metrics and the heartbeat's tally) and says whether debug lines are wanted. */
  reports: TaskReports;
  /** Recorded with the attempt of a run whose lease a server crash took back. */
  workerId: string;
}

/**
 * Write the settlement the outcome table chose, log what became of it, and count the outcome the
 * table gives for the fence's answer. Never throws for a database fault: an unwritten settlement
 * lapses, and rescue runs the task again. Returns the fence's answer (the engine ignores it;
 * `runDueTasks` reports it).
 */
export async function settleTask(
  deps: SettleDeps,
  task: ClaimedTask,
  run: TaskRun,
  settlement: Settlement,
  log: Logger,
): Promise<SettleAnswer> {
  let answer = await writeSettlement(deps, task, run, settlement, log);
  if (answer.kind === 'refused') answer = await afterRefused(deps, task, answer, log);
  return settled(deps, task, run, settlement, answer, log);
}

/**
 * A refusal is rare: only then ask who won, so a settlement that lost to an operator's cancel is
 * told apart from a lease taken over, and a lease a server crash took back is counted (one point
 * read, never on the written path).
 */
export async function afterRefused(
  deps: SettleDeps,
  task: ClaimedTask,
  refused: SettleAnswer,
  log: Logger,
): Promise<SettleAnswer> {
  return (await afterRefusal(deps, task, log)) === 'cancelled' ? LOST_TO_CANCEL : refused;
}

/** Log what became of the settlement and count the outcome the table gives for the fence's answer. */
export function settled(
  deps: SettleDeps,
  task: ClaimedTask,
  run: TaskRun,
  settlement: Settlement,
  answer: SettleAnswer,
  log: Logger,
): SettleAnswer {
  describe(task, run, settlement, answer, log, deps.reports);
  const outcome: Outcome | null = settlement.outcome[answer.kind];
  if (outcome !== null) deps.reports.record(task, outcome);
  return answer;
}

/**
 * The fenced write. Not an async function: the batcher's answer is mapped with one `then`, not
 * awaited by a frame of its own (each async layer and await allocates, for every task).
 *
 * With `afterRefused` (only for a refusal) and then `settled`, settleTask's steps, for a caller
 * that runs them in its own async frame: the engine, per task (an async layer and its await were
 * ~0.4 KB allocated per task on Node 20, docs/benchmarks-journal.md).
 */
export function writeSettlement(
  deps: SettleDeps,
  task: ClaimedTask,
  run: TaskRun,
  settlement: Settlement,
  log: Logger,
): Promise<SettleAnswer> {
  const action = settlement.action;
  // Attempt history records the outcome counted when the write lands, in the same statement.
  const runMs = 'ms' in run ? run.ms : null;
  switch (action.kind) {
    case 'complete':
      return deps.batcher.complete(task, runMs, action.result ?? null).then(completeAnswer);
    case 'fail':
      return deps.batcher
        .fail({
          ref: task,
          error: action.error,
          delayMs: action.delayMs,
          permanent: action.permanent,
          outcome: settlement.outcome.written === 'timeout' ? 'timeout' : 'failure',
          detail: ('detail' in run ? run.detail : undefined) ?? { message: action.error },
          runMs,
        })
        .then((r) => (r.kind === 'settled' ? { kind: 'written', dead: r.dead } : r));
    case 'release': {
      const counted = settlement.outcome.written;
      const outcome = counted === 'cancelled' || counted === 'timeout' ? counted : 'continued';
      return release(deps, task, action.finalError, { outcome, runMs }, log);
    }
    case 'return_unstarted':
      return handBack(deps, task, action.away);
    case 'snooze':
      return snoozeIt(deps, task, action, runMs, log);
    case 'none':
      return Promise.resolve(NOTHING_WRITTEN);
  }
}

const LOST_TO_CANCEL: SettleAnswer = Object.freeze({ kind: 'cancelled' });
/** The action `none` (a cancel settled the attempt first) writes nothing: the answer is the cancel's. */
const NOTHING_WRITTEN: SettleAnswer = LOST_TO_CANCEL;

/**
 * Who took a refused lease's entry. An operator's cancel: `cancelled`. No lease at all: the
 * claim committed asynchronously and a server crash lost it before the WAL reached disk
 * (src/processor/claim.ts, ASYNC_COMMIT), so the entry was claimable again while this run went on
 * and may have run a second time elsewhere (at-least-once allows it); the attempt is counted
 * (`countLostClaim`: the task goes back to deferred with it, or is buried at its limit) unless
 * another claim took the entry first. Anything else (rescue after a lapse): `lost`.
 */
async function afterRefusal(deps: SettleDeps, task: ClaimedTask, log: Logger): Promise<'cancelled' | 'lost'> {
  try {
    const r = await refusalOf(deps.write, deps.storage, task);
    if (r.outcome === 'cancelled') return 'cancelled';
    if (!r.leaseExists) {
      const counted = await countLostClaim(deps.write, deps.storage, task, deps.workerId);
      log.warn(
        { lost_claim: counted },
        'the lease of this run was lost in a database crash (its claim had not reached disk): the task may have run again elsewhere; its attempt is counted unless another claim took it first',
      );
    }
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'could not read who settled a refused lease');
  }
  return 'lost';
}

async function snoozeIt(
  deps: SettleDeps,
  task: ClaimedTask,
  action: Extract<SettleAction, { kind: 'snooze' }>,
  runMs: number | null,
  log: Logger,
): Promise<SettleAnswer> {
  try {
    const r = await snoozeLease(
      deps.write,
      deps.storage,
      task,
      action.delayMs,
      action.maxSnoozes,
      action.finalError,
      runMs,
    );
    if (r.wrote) {
      log.info(
        { snooze_ms: action.delayMs, snoozes: r.snoozes, refunded: r.refunded, dead: r.dead },
        r.refunded ? 'task snoozed' : 'task snoozed past maxSnoozes; the attempt counts',
      );
    }
    return r.wrote ? { kind: 'written', dead: r.dead } : { kind: 'refused' };
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'snooze could not be written; the lease will lapse');
    return { kind: 'unwritten', error: (err as Error).message };
  }
}

const WRITTEN: SettleAnswer = Object.freeze({ kind: 'written', dead: false });

/**
 * The answer of a completion handed to the batcher (a Completion once its `flushed` resolved, or
 * an owner `enlist`ed once it is told): writeSettlement's for the action `complete`.
 */
export function completedAnswer(c: Pick<Completion, 'answer'>): SettleAnswer {
  return completeAnswer(c.answer as CompleteResult);
}

function completeAnswer(r: CompleteResult): SettleAnswer {
  return r.kind === 'settled' ? WRITTEN : r;
}

async function release(
  deps: SettleDeps,
  task: ClaimedTask,
  finalError: string,
  history: ReleaseHistory,
  log: Logger,
): Promise<SettleAnswer> {
  try {
    const r = await releaseLease(deps.write, deps.storage, task, finalError, history);
    return r.wrote ? { kind: 'written', dead: r.dead } : { kind: 'refused' };
  } catch (err) {
    // Expiry still gets there: the lease lapses and rescue hands the task on.
    log.warn({ err: (err as Error).message }, 'release could not be written; the lease will lapse');
    return { kind: 'unwritten', error: (err as Error).message };
  }
}

async function handBack(
  deps: SettleDeps,
  task: ClaimedTask,
  away: { delayMs: number; note: string | null } | undefined,
): Promise<SettleAnswer> {
  try {
    const r = await returnUnstarted(deps.write, deps.storage, task, away);
    return r.wrote ? { kind: 'written', dead: false } : { kind: 'refused' };
  } catch (err) {
    return { kind: 'unwritten', error: (err as Error).message };
  }
}

/** The log lines of a settlement (operators search for these words; keep them stable). */
function describe(
  task: ClaimedTask,
  run: TaskRun,
  settlement: Settlement,
  answer: SettleAnswer,
  log: Logger,
  reports: TaskReports,
): void {
  const action = settlement.action;
  const ran =
    run.kind === 'done' ||
    run.kind === 'continue' ||
    run.kind === 'error' ||
    run.kind === 'unstorable_result' ||
    run.kind === 'snooze'
      ? run
      : null;
  if (answer.kind === 'refused' && ran?.dequeued) {
    // Not a lost lease: the handler's own ctx.dequeue committed first.
    if (reports.debugEnabled()) log.debug('task dequeued by its handler');
    return;
  }
  if (answer.kind === 'cancelled') {
    // The loser of the race with a cancel: say so (the cancel's caller got `cancelled`).
    log.warn(
      { settlement: action.kind, aborted: ran?.cancelled ?? false },
      action.kind === 'none'
        ? 'task cancelled by an operator; its handler aborted, or never started'
        : 'task settlement lost to a cancel: an operator cancelled it first',
    );
    return;
  }
  switch (action.kind) {
    case 'none':
    case 'snooze':
      if (answer.kind === 'refused') log.warn('snooze refused: lease lost');
      return;
    case 'return_unstarted':
      if (run.kind === 'unknown_type') {
        // Each hand-back that landed is in the type's once-per-interval line; one that did not
        // is told here (its lease lapses, and rescue hands it on).
        if (answer.kind !== 'written') {
          log.warn({ handed_back: false, answer: answer.kind }, 'a task of an unknown type could not be handed back');
        }
        return;
      }
      if (run.kind === 'rate_limited') {
        // The limit at work, not a fault: told at debug (the type's gauges count the refusals).
        if (answer.kind !== 'written') {
          log.warn(
            { handed_back: false, answer: answer.kind },
            "a task refused by its type's rate limit could not be handed back",
          );
        } else if (reports.debugEnabled()) log.debug({ delay_ms: run.delayMs }, run.note);
        return;
      }
      if (run.kind === 'stopped_before_start') {
        // The stop's own doing: said at info when it landed, as a prefetched task's hand-back is.
        (answer.kind === 'written' ? log.info : log.warn).call(
          log,
          { handed_back: answer.kind === 'written' },
          'the worker stopped before the handler started; task handed back unstarted',
        );
        return;
      }
      log.warn(
        { handed_back: answer.kind === 'written' },
        'prefetched task reached its deadline before a slot freed; handed back unstarted',
      );
      return;
    case 'fail':
      if (answer.kind === 'refused') log.warn({ err: action.error }, 'RecordFailure was refused: lease lost');
      else if (answer.kind === 'unwritten') {
        log.error(
          { err: action.error, settle_error: answer.error },
          'the failure could not be recorded (database unreachable); the lease will lapse and the task run again',
        );
      } else if (ran) {
        (answer.dead ? log.error : log.warn).call(
          log,
          { err: action.error, dead: answer.dead, max_attempts: task.maxAttempts },
          answer.dead ? 'task failed; dead-lettered' : 'task failed; will retry',
        );
      }
      return;
    case 'release':
      if (action.reason === 'shutdown') {
        if (answer.kind === 'written' && answer.dead)
          log.warn('released on its final attempt by shutdown; dead-lettered');
        if (answer.kind === 'refused' && !ran?.advanced) log.warn('shutdown release refused: lease no longer held');
        return;
      }
      if (answer.kind === 'written') {
        log.warn(
          { dead: answer.dead, max_attempts: task.maxAttempts },
          'slice returned continue without advancing its cursor',
        );
      } else if (!ran?.advanced) {
        if (answer.kind === 'refused') log.warn('continue release refused: lease lost');
        return;
      }
      if (ran?.pastDeadline) log.warn('slice continued at its deadline; recorded as timeout');
      return;
    case 'complete':
      if (answer.kind === 'refused')
        log.warn('task finished but Dequeue was refused: lease lost (the task may run again)');
      else if (answer.kind === 'unwritten') {
        log.error(
          { settle_error: answer.error },
          'task finished but its completion could not be written (database unreachable); it will run again after its lease lapses',
        );
      } else {
        if (ran?.pastDeadline) log.warn('task reported done after its deadline');
        if (reports.debugEnabled()) log.debug('task done');
      }
  }
}
