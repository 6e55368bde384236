import type { Logger } from '../logger.js';
import type { Outcome } from '../metrics.js';
import type { Queryable } from '../sql.js';
import type { ClaimedTask } from './claim.js';
import type { SettleAnswer, Settlement, TaskRun } from './outcome-table.js';
import type { CompleteResult, SettlementBatcher } from './settlement-batcher.js';
import { releaseLease, returnUnstarted } from '../storage/return.js';

export interface SettleDeps {
  write: Queryable;
  schema: string;
  batcher: SettlementBatcher;
  /** Counts an outcome (metrics and the heartbeat's tally). */
  record: (task: ClaimedTask, outcome: Outcome) => void;
  /** Whether debug lines are wanted (a pino child per task is not free, so ask the parent). */
  debugEnabled: () => boolean;
}

/**
 * Write the settlement the outcome table chose, log what became of it, and count the outcome the
 * table gives for the fence's answer; returns the fence's answer. Never throws for a database
 * fault: an unwritten settlement lapses, and rescue runs the task again.
 */
export async function settleTask(
  deps: SettleDeps,
  task: ClaimedTask,
  run: TaskRun,
  settlement: Settlement,
  log: Logger,
): Promise<SettleAnswer> {
  const answer = await write(deps, task, settlement, log);
  describe(task, run, settlement, answer, log, deps.debugEnabled);
  const outcome: Outcome | null = settlement.outcome[answer.kind];
  if (outcome !== null) deps.record(task, outcome);
  return answer;
}

/**
 * The fenced write. Not an async function: the batcher's answer is mapped with one `then`, not
 * awaited by a frame of its own (each async layer and await allocates, for every task).
 */
function write(deps: SettleDeps, task: ClaimedTask, settlement: Settlement, log: Logger): Promise<SettleAnswer> {
  const action = settlement.action;
  switch (action.kind) {
    case 'complete':
      return deps.batcher.complete(task).then(completeAnswer);
    case 'fail':
      return deps.batcher
        .fail({ ref: task, error: action.error, delayMs: action.delayMs, permanent: action.permanent })
        .then((r) => (r.kind === 'settled' ? { kind: 'written', dead: r.dead } : r));
    case 'release':
      return release(deps, task, action.finalError, log);
    case 'return_unstarted':
      return handBack(deps, task);
  }
}

const WRITTEN: SettleAnswer = Object.freeze({ kind: 'written', dead: false });

function completeAnswer(r: CompleteResult): SettleAnswer {
  return r.kind === 'settled' ? WRITTEN : r;
}

async function release(deps: SettleDeps, task: ClaimedTask, finalError: string, log: Logger): Promise<SettleAnswer> {
  try {
    const r = await releaseLease(deps.write, deps.schema, task, finalError);
    return r.wrote ? { kind: 'written', dead: r.dead } : { kind: 'refused' };
  } catch (err) {
    // Expiry still gets there: the lease lapses and rescue hands the task on.
    log.warn({ err: (err as Error).message }, 'release could not be written; the lease will lapse');
    return { kind: 'unwritten', error: (err as Error).message };
  }
}

async function handBack(deps: SettleDeps, task: ClaimedTask): Promise<SettleAnswer> {
  try {
    const r = await returnUnstarted(deps.write, deps.schema, task);
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
  debugEnabled: () => boolean,
): void {
  const action = settlement.action;
  const ran =
    run.kind === 'done' || run.kind === 'continue' || run.kind === 'error' || run.kind === 'contract_violation'
      ? run
      : null;
  switch (action.kind) {
    case 'return_unstarted':
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
        if (debugEnabled()) log.debug('task done');
      }
  }
}
