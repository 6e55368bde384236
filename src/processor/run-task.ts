import { DeadlineAbort, isPermanentError, ShutdownAbort } from '../errors.js';
import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics.js';
import type { Queryable } from '../sql.js';
import { validatePayload, type TaskContext, type AnyTaskDefinition } from '../task.js';
import type { ClaimedTask } from './claim.js';
import { describeHandlerResult, isContractResult } from './handler-result.js';
import type { TaskRun } from './outcome-table.js';
import { advanceCursor } from '../storage/return.js';

/** What running one task needs from the engine. */
export interface RunDeps {
  write: Queryable;
  schema: string;
  metrics: BerthMetrics;
  workerId: string;
}

export interface RunInput {
  task: ClaimedTask;
  def: AnyTaskDefinition | undefined;
  /** The handler's deadline: the lease's own expiry stamp minus the margin (epoch ms). */
  deadline: number;
  /** When the claim handed this task to the process (epoch ms). */
  receivedAt: number;
  controller: AbortController;
  log: Logger;
  /** Gives the slot back: called as soon as no handler runs for this task any more. */
  freeSlot: () => void;
}

/**
 * Take a leased task: decide whether it may start, run its handler under its deadline, and say
 * what happened. Writes nothing but the handler's own AdvanceCursor calls; the settlement is
 * the caller's next step (outcome-table.ts, settle-task.ts).
 */
export async function runTask(deps: RunDeps, input: RunInput): Promise<TaskRun> {
  const { task, def, deadline, controller, log, freeSlot } = input;
  if (!def) {
    freeSlot();
    const error = `no handler registered for task type "${task.type}" on worker ${deps.workerId}`;
    log.error({ max_attempts: task.maxAttempts }, error);
    return { kind: 'unknown_type', error };
  }
  if (deadline <= Date.now() && input.receivedAt < deadline) {
    // It waited in the prefetch buffer past its deadline: it never ran, so hand it back with
    // the attempt refunded rather than charge it a failure.
    freeSlot();
    return { kind: 'expired_in_buffer' };
  }
  if (deadline <= Date.now()) {
    freeSlot();
    // The claim outlasted the whole ceiling: running now would outlive the lease.
    const error = `claim returned after the handler deadline (${new Date(deadline).toISOString()}); not started`;
    log.warn(error);
    return { kind: 'late_claim', error };
  }
  // A validator that throws (instead of returning issues) is a bad payload too.
  const parsed = await validatePayload(def, task.payload).catch((err: unknown) => ({
    ok: false as const,
    message: `payload validation for task type "${task.type}" threw: ${(err as Error)?.message ?? String(err)}`,
  }));
  if (!parsed.ok) {
    freeSlot();
    log.error(parsed.message);
    return { kind: 'invalid_payload', error: parsed.message };
  }

  const timer = setTimeout(() => controller.abort(new DeadlineAbort(deadline)), Math.max(0, deadline - Date.now()));
  // A handler that ignores its signal must not also keep the process alive after stop().
  timer.unref();
  let advanced = false;
  const ctx: TaskContext<unknown> = {
    id: task.id,
    type: task.type,
    attempt: task.attempt,
    maxAttempts: task.maxAttempts,
    lane: { queue: task.queue, priority: task.priority, shard: task.shard },
    signal: controller.signal,
    deadline: new Date(deadline),
    logger: log,
    advanceCursor: async (next) => {
      const ok = await advanceCursor(deps.write, deps.schema, task, next);
      if (ok) advanced = true;
      else log.warn('AdvanceCursor refused: lease no longer held');
      return ok;
    },
  };
  const started = performance.now();
  let result: unknown;
  let error: unknown = null;
  let violation = false;
  try {
    result = await def.handler(parsed.value, ctx);
    // Seed 000's contract has three answers; anything else (42, 'retry', false) is a bug in
    // the handler, so it fails loudly instead of counting as a success.
    if (!isContractResult(result)) {
      violation = true;
      error = new Error(
        `handler returned ${describeHandlerResult(result)}; a handler must return 'done', 'continue' or nothing`,
      );
    }
  } catch (err) {
    error = err ?? new Error('handler threw a nullish value');
  } finally {
    clearTimeout(timer);
  }
  freeSlot();
  deps.metrics.handlerSeconds.observe({ task_type: task.type }, (performance.now() - started) / 1000);
  const ran = {
    advanced,
    shutdown: controller.signal.reason instanceof ShutdownAbort,
    pastDeadline: controller.signal.reason instanceof DeadlineAbort || Date.now() >= deadline,
  };
  if (error !== null) {
    const message = error instanceof Error ? error.message || error.name : String(error);
    if (violation) return { kind: 'contract_violation', error: message, ...ran };
    return { kind: 'error', error: message, permanent: isPermanentError(error), ...ran };
  }
  return result === 'continue' ? { kind: 'continue', ...ran } : { kind: 'done', ...ran };
}
