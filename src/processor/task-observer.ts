import {
  type Attributes,
  type Context,
  context,
  type Link,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from '@opentelemetry/api';
import type { Outcome } from '../metrics/catalogue.js';
import { berthTracer, restoreTraceContext, tracingEnabled } from '../tracing.js';
import type { ClaimedTask } from './claim.js';
import type { SettleAnswer, Settlement, TaskRun } from './outcome-table.js';
import type { HandlerHooks } from './run-task.js';
import { OUTCOME_EVENT, type TaskEventTask, type TaskSettledEvent, type WorkerEvents } from './task-events.js';

/**
 * The one place the engine reports an attempt to the outside: `worker.events` (task-events.ts)
 * and its OpenTelemetry consumer span (tracing.ts). `begin()` answers null when no task event
 * has a listener and no TracerProvider is registered, and the engine then runs the task exactly
 * as without this module: the hot path pays one global read and two property reads per task.
 */
export class TaskObserver {
  constructor(
    private readonly events: WorkerEvents,
    private readonly workerId: string,
  ) {}

  begin(task: ClaimedTask): Attempt | null {
    const traced = tracingEnabled();
    if (!traced && !this.events.wantsTaskEvents) return null;
    return new Attempt(this.events, this.workerId, task, traced);
  }
}

/** OpenTelemetry messaging semantic conventions (stable names of semconv 1.27+) and berth's own. */
const MESSAGING_SYSTEM = 'berth';

/** One attempt being observed: its span (when traced), its handler time, its events. */
export class Attempt implements HandlerHooks {
  private readonly span: Span | null = null;
  private readonly spanContext: Context = ROOT_CONTEXT;
  private handlerStart = 0;
  private durationMs: number | null = null;
  private readonly info: TaskEventTask;

  constructor(
    private readonly events: WorkerEvents,
    private readonly workerId: string,
    task: ClaimedTask,
    traced: boolean,
  ) {
    this.info = {
      id: task.id,
      type: task.type,
      queue: task.queue,
      priority: task.priority,
      shard: task.shard,
      attempt: task.attempt,
      maxAttempts: task.maxAttempts,
    };
    if (!traced) return;
    // The producer's context is the parent (one trace from enqueue to handler) and a link (the
    // messaging conventions' way to reach the creation context from a process span). Without a
    // stored context the attempt starts a trace of its own, not one under whatever context the
    // worker's fetch loop happens to carry.
    const producer = restoreTraceContext(task.traceContext);
    const producerSpan = producer === undefined ? undefined : trace.getSpanContext(producer);
    const links: Link[] = producerSpan === undefined ? [] : [{ context: producerSpan }];
    const attributes: Attributes = {
      'messaging.system': MESSAGING_SYSTEM,
      'messaging.operation.type': 'process',
      'messaging.operation.name': 'process',
      'messaging.destination.name': task.queue,
      'messaging.message.id': task.id,
      'berth.task.type': task.type,
      'berth.task.attempt': task.attempt,
      'berth.task.max_attempts': task.maxAttempts,
      'berth.lane.priority': task.priority,
      'berth.lane.shard': task.shard,
      'berth.worker.id': this.workerId,
    };
    const parent = producer ?? ROOT_CONTEXT;
    const span = berthTracer().startSpan(
      `process ${task.type}`,
      { kind: SpanKind.CONSUMER, attributes, links },
      parent,
    );
    this.span = span;
    this.spanContext = trace.setSpan(parent, span);
  }

  /** Run `fn` (the attempt: payload check, handler) with the attempt's span active. */
  run<T>(fn: () => T): T {
    return this.span === null ? fn() : context.with(this.spanContext, fn);
  }

  /**
   * `fn` run outside the attempt's span: what the engine does when the slot frees (dispatching the
   * next task, waking the fetch loop) must not carry this attempt's context into the next task's
   * statements or the settlement batcher's timers. Unchanged when the attempt is not traced.
   */
  detached(fn: () => void): () => void {
    return this.span === null ? fn : () => context.with(ROOT_CONTEXT, fn);
  }

  handlerStarted(): void {
    this.handlerStart = performance.now();
    if (this.events.wantsTaskEvents) this.events.emit('task:started', { workerId: this.workerId, task: this.info });
  }

  handlerEnded(): void {
    this.durationMs = performance.now() - this.handlerStart;
  }

  /**
   * The settlement is written (or refused, or given up on): end the span and emit the events.
   * Called after the slot is free and the outcome counted, so a listener delays nothing of the
   * task's own.
   */
  settled(run: TaskRun, settlement: Settlement, answer: SettleAnswer): void {
    const outcome = settlement.outcome[answer.kind];
    const action = settlement.action;
    const failed = outcome === 'failure' || outcome === 'timeout';
    const thrown = run.kind === 'error' || run.kind === 'unstorable_result' ? run.thrown : null;
    const message = 'error' in run ? run.error : null;
    const dead = answer.kind === 'written' && answer.dead;
    const retryInMs = action.kind === 'fail' && answer.kind === 'written' && !dead ? action.delayMs : null;
    if (this.span !== null) this.endSpan(outcome, answer, message, thrown, dead, retryInMs);
    // A task handed back unstarted (it waited in the buffer past its deadline) counts nothing.
    if (outcome === null || !this.events.wantsTaskEvents) return;
    const event: TaskSettledEvent = {
      workerId: this.workerId,
      task: this.info,
      outcome,
      durationMs: this.durationMs,
      error: failed && message !== null ? { message, thrown } : null,
      dead,
      retryInMs,
    };
    this.events.emit('task:settled', event);
    this.events.emit(OUTCOME_EVENT[outcome], event);
    if (retryInMs !== null) this.events.emit('task:retrying', event);
    if (dead) this.events.emit('task:dead', event);
  }

  /** runTask or settleTask threw (a bug): the span says so; no settlement event is emitted. */
  crashed(err: unknown): void {
    if (this.span === null) return;
    this.span.recordException(asException(err));
    this.span.setStatus({ code: SpanStatusCode.ERROR, message: `task execution crashed: ${String(err)}` });
    this.span.end();
  }

  private endSpan(
    outcome: Outcome | null,
    answer: SettleAnswer,
    message: string | null,
    thrown: unknown,
    dead: boolean,
    retryInMs: number | null,
  ): void {
    const span = this.span!;
    span.setAttribute('berth.task.outcome', outcome ?? 'returned');
    if (dead) span.setAttribute('berth.task.dead', true);
    if (retryInMs !== null) span.setAttribute('berth.task.retry_in_ms', retryInMs);
    if (thrown !== null && thrown !== undefined) span.recordException(asException(thrown));
    if (outcome === 'failure' || outcome === 'timeout') {
      span.setStatus({ code: SpanStatusCode.ERROR, message: message ?? outcome });
    } else if (answer.kind === 'refused') {
      span.setStatus({ code: SpanStatusCode.ERROR, message: 'lease lost: the settlement was refused' });
    } else if (answer.kind === 'unwritten') {
      span.recordException({ name: 'SettlementUnwritten', message: answer.error });
      span.setStatus({ code: SpanStatusCode.ERROR, message: `settlement could not be written: ${answer.error}` });
    }
    span.end();
  }
}

/** A thrown value as the api's Exception: an Error as it is, anything else by its text. */
function asException(thrown: unknown): Error | string {
  if (thrown instanceof Error) return thrown;
  if (typeof thrown === 'string') return thrown;
  try {
    return JSON.stringify(thrown) ?? String(thrown);
  } catch {
    return String(thrown);
  }
}
