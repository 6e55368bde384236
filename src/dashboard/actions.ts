import { audited } from '../admin/audit.js';
import { storageFor } from '../storage/storage.js';
import { purgeDead, retryDead, type DeadFilter } from '../admin/dead.js';
import { pauseQueue, resumeQueue } from '../admin/queues.js';
import {
  checkRate,
  clearKeyLimitAudited,
  clearQueueLimitAudited,
  type KeyLimitTarget,
  parseRate,
  type QueueLimitChange,
  rateText,
  setKeyLimitAudited,
  setQueueLimitAudited,
} from '../admin/limits.js';
import { setSchedulePaused, triggerSchedule } from '../admin/schedules.js';
import { clearTypeLimitAudited, setTypeLimitAudited } from '../admin/type-limits.js';
import { cancelTask, deleteTask, retryTask, type TaskActionResult } from '../admin/tasks.js';
import { BerthInputError } from '../errors.js';
import type { Logger } from '../logger.js';
import type { Queryable } from '../sql.js';
import { moveTaskIn } from '../storage/move.js';
import {
  MAX_FILTER_TEXT_CHARS,
  optionalBoolean,
  optionalIds,
  optionalInteger,
  optionalQueue,
  optionalText,
  queueName,
  taskId,
  taskType,
} from './params.js';
import type {
  BulkTaskAnswer,
  DeadActionAnswer,
  KeyLimitClearAnswer,
  KeyLimitSetAnswer,
  LimitClearAnswer,
  LimitSetAnswer,
  MoveAnswer,
  QueueActionAnswer,
  ScheduleActionAnswer,
  TaskActionAnswer,
  TypeLimitClearAnswer,
  TypeLimitSetAnswer,
} from './wire.js';

/** The state-changing side of the JSON API. Every action is audited under the caller's actor. */
export interface ActionContext {
  db: Queryable;
  /** The schema's name, as the admin functions take it. */
  schema: string;
  logger: Logger;
  actor: string;
}

type Body = Record<string, unknown>;

function run<T>(c: ActionContext, action: string, target: Record<string, unknown>, fn: () => Promise<T>): Promise<T> {
  return audited(c.db, c.schema, c.logger, c.actor, action, target, fn);
}

const TASK_ACTIONS = {
  retry: retryTask,
  cancel: cancelTask,
  delete: deleteTask,
} as const;

export type TaskAction = keyof typeof TASK_ACTIONS;

export function isTaskAction(name: string): name is TaskAction {
  return Object.hasOwn(TASK_ACTIONS, name);
}

export async function taskAction(c: ActionContext, id: string, action: TaskAction): Promise<TaskActionAnswer> {
  taskId(id);
  const result = await run(c, `task.${action}`, { id }, () => oneTask(c, id, action));
  return { result };
}

/** One task's action; a cancel records the caller's actor on a running task's settlement. */
function oneTask(c: ActionContext, id: string, action: TaskAction) {
  return action === 'cancel'
    ? cancelTask(c.db, c.schema, id, { actor: c.actor })
    : TASK_ACTIONS[action](c.db, c.schema, id);
}

/** Most task ids one bulk retry or cancel may name: a page of the task list at its largest. */
export const MAX_BULK_TASK_IDS = 500;

/**
 * Whether a result changed the task. A Record, not a list, so a result the admin API adds later
 * (cancelling a running task, for one) fails to compile here until it is classified.
 */
const CHANGED: Readonly<Record<TaskActionResult, boolean>> = {
  retried: true,
  removed: true,
  cancelled: true,
  already_settled: false,
  running: false,
  not_retryable: false,
  waiting_on_parents: false,
  duplicate: false,
  not_found: false,
};

export type BulkTaskAction = 'retry' | 'cancel';

/** `{ ids: [...] }`: 1 to MAX_BULK_TASK_IDS task ids (text or integers), nothing else. */
function bulkIds(body: Body): string[] {
  for (const key of Object.keys(body)) {
    if (key !== 'ids')
      throw new BerthInputError(`unknown field "${key.slice(0, 40)}" in a bulk task action (only ids)`);
  }
  const ids = body.ids;
  if (!Array.isArray(ids) || ids.length === 0 || ids.length > MAX_BULK_TASK_IDS)
    throw new BerthInputError(`ids must be a list of 1 to ${MAX_BULK_TASK_IDS} task ids`);
  const checked = ids.map((v) => {
    if (typeof v !== 'string' && !(typeof v === 'number' && Number.isSafeInteger(v)))
      throw new BerthInputError('ids must hold task ids (text or integers)');
    return taskId(String(v));
  });
  return [...new Set(checked)];
}

/**
 * Retry or cancel each of several tasks with the admin API's one-task action, one audit row per
 * task (as when each is done on its own, so a task's audit trail is complete), and answer how
 * many changed and why the rest did not. One at a time: each is the admin call's own statement(s),
 * and at most MAX_BULK_TASK_IDS of them.
 */
export async function bulkTaskAction(c: ActionContext, action: BulkTaskAction, body: Body): Promise<BulkTaskAnswer> {
  const ids = bulkIds(body);
  const results: BulkTaskAnswer['results'] = [];
  const byResult: BulkTaskAnswer['byResult'] = {};
  let changed = 0;
  for (const id of ids) {
    const result = await run(c, `task.${action}`, { id, bulk: true }, () => oneTask(c, id, action));
    results.push({ id, result, changed: CHANGED[result] });
    byResult[result] = (byResult[result] ?? 0) + 1;
    if (CHANGED[result]) changed++;
  }
  return { requested: ids.length, changed, unchanged: ids.length - changed, byResult, results };
}

export async function moveAction(c: ActionContext, id: string, body: Body): Promise<MoveAnswer> {
  taskId(id);
  const queue = optionalQueue(body.queue);
  const priority = optionalInteger(body.priority, 'priority');
  if (queue === undefined && priority === undefined)
    throw new BerthInputError('a move needs a queue, a priority, or both');
  const to = { ...(queue !== undefined && { queue }), ...(priority !== undefined && { priority }) };
  const result = await run(c, 'task.move', { id, ...to }, () => moveTaskIn(c.db, storageFor(c.schema), id, to));
  return { result };
}

/** The body of a bulk dead-letter action; the admin API refuses one with no filter and no `all`. */
function deadFilter(body: Body): DeadFilter {
  const filter: DeadFilter = {};
  const ids = optionalIds(body.ids);
  const queue = optionalQueue(body.queue);
  const type = optionalText(body.type, 'type');
  const error = optionalText(body.error, 'error', MAX_FILTER_TEXT_CHARS);
  const all = optionalBoolean(body.all, 'all');
  if (ids !== undefined) filter.ids = ids;
  if (queue !== undefined) filter.queue = queue;
  if (type !== undefined) filter.type = type;
  if (error !== undefined) filter.errorContains = error;
  if (all !== undefined) filter.all = all;
  return filter;
}

export function deadAction(c: ActionContext, action: 'retry' | 'purge', body: Body): Promise<DeadActionAnswer> {
  const filter = deadFilter(body);
  const target = {
    ...filter,
    ...(filter.ids && { ids: filter.ids.length <= 20 ? filter.ids : `${filter.ids.length} ids` }),
  };
  return run(c, `dead.${action}`, target, () => (action === 'retry' ? retryDead : purgeDead)(c.db, c.schema, filter));
}

export function queueAction(
  c: ActionContext,
  queue: string,
  action: 'pause' | 'resume',
  body: Body,
): Promise<QueueActionAnswer> {
  queueName(queue);
  if (action === 'pause') {
    const reason = optionalText(body.reason, 'reason', MAX_FILTER_TEXT_CHARS);
    return run(c, 'queue.pause', { queue, ...(reason !== undefined && { reason }) }, () =>
      pauseQueue(c.db, c.schema, queue, c.actor, reason),
    );
  }
  return run(c, 'queue.resume', { queue }, () => resumeQueue(c.db, c.schema, queue, c.actor));
}

/**
 * Set or change a queue's limits (`berth limits set` does the same), audited. The body is
 * setQueueLimit's change: `maxRunning` and `rate`, each left out to keep it or null to remove
 * it; `rate` also as the CLI writes it (`"20/1s"`). setQueueLimit refuses the rest, naming the
 * field (400).
 */
export async function setLimitAction(c: ActionContext, queue: string, body: Body): Promise<LimitSetAnswer> {
  queueName(queue);
  if (Object.keys(body).length === 0)
    throw new BerthInputError('a limit needs maxRunning, rate, or both (null removes one)');
  const change = (typeof body.rate === 'string' ? { ...body, rate: parseRate(body.rate) } : body) as QueueLimitChange;
  const now = await setQueueLimitAudited(c.db, c.schema, c.logger, c.actor, queue, change);
  return { queue, limit: now && { maxRunning: now.maxRunning, rate: rateText(now.rateLimit, now.rateIntervalMs) } };
}

/** A body that must be empty (a clear takes no fields): the first field it has is a 400 naming it. */
function noFields(body: Body, what: string): void {
  const extra = Object.keys(body)[0];
  if (extra !== undefined)
    throw new BerthInputError(`unknown field "${extra.slice(0, 40)}" in ${what} (it takes none)`);
}

/** Remove every limit of a queue (`berth limits clear`), audited. */
export async function clearLimitAction(c: ActionContext, queue: string, body: Body): Promise<LimitClearAnswer> {
  queueName(queue);
  noFields(body, 'a limit clear');
  return { queue, ...(await clearQueueLimitAudited(c.db, c.schema, c.logger, c.actor, queue)) };
}

/**
 * Set or change a task type's rate limit (`berth limits type set` does the same), audited
 * (`type.limit`). The body is `rate`, as the CLI writes it (`"20/1s"`) or as setTypeLimit takes
 * it (`{ limit, intervalMs }`). Anything else is refused naming the field (400) before anything
 * is written or audited.
 */
export async function setTypeLimitAction(c: ActionContext, type: string, body: Body): Promise<TypeLimitSetAnswer> {
  taskType(type);
  for (const key of Object.keys(body)) {
    if (key !== 'rate') throw new BerthInputError(`unknown field "${key.slice(0, 40)}" in a type limit (only rate)`);
  }
  if (body.rate === undefined || body.rate === null)
    throw new BerthInputError('a type limit needs rate, such as 20/1s (clear removes a limit)');
  const rate = typeof body.rate === 'string' ? parseRate(body.rate) : checkRate(body.rate, 'setTypeLimit');
  const now = await setTypeLimitAudited(c.db, c.schema, c.logger, c.actor, type, rate);
  return { type, limit: { rate: rateText(now.rateLimit, now.rateIntervalMs)! } };
}

/** Remove a task type's rate limit (`berth limits type clear`), audited (`type.unlimit`). */
export async function clearTypeLimitAction(c: ActionContext, type: string, body: Body): Promise<TypeLimitClearAnswer> {
  taskType(type);
  noFields(body, 'a type limit clear');
  return { type, ...(await clearTypeLimitAudited(c.db, c.schema, c.logger, c.actor, type)) };
}

/**
 * Set or change a key limit (`berth keys set` does the same), audited (`key.limit`). The body is
 * the target, `queue` or `type`, and `perKey`; setKeyLimit refuses the rest, naming the field (400).
 */
export async function setKeyLimitAction(c: ActionContext, body: Body): Promise<KeyLimitSetAnswer> {
  const { perKey, ...target } = body;
  if (perKey === undefined || perKey === null)
    throw new BerthInputError('a key limit needs perKey (an integer from 1; clear removes a limit)');
  // A perKey that is not an integer reaches setKeyLimit as sent, which refuses it naming the field.
  const now = await setKeyLimitAudited(c.db, c.schema, c.logger, c.actor, target as KeyLimitTarget, perKey as number);
  return { keyLimit: now && { scope: now.scope, name: now.name, perKey: now.perKey } };
}

/** Clear a key limit (`berth keys clear`), audited (`key.unlimit`). The body is the target alone. */
export async function clearKeyLimitAction(c: ActionContext, body: Body): Promise<KeyLimitClearAnswer> {
  const r = await clearKeyLimitAudited(c.db, c.schema, c.logger, c.actor, body as KeyLimitTarget);
  return { keyLimitCleared: r.cleared };
}

/** A schedule paused, resumed or triggered (`berth schedules` does the same), audited. */
export async function scheduleAction(
  c: ActionContext,
  name: string,
  action: 'pause' | 'resume' | 'trigger',
): Promise<ScheduleActionAnswer> {
  if (action === 'trigger') {
    const r = await run(c, 'schedule.trigger', { schedule: name }, () => triggerSchedule(c.db, c.schema, name));
    return { name, taskId: r.taskId };
  }
  const r = await run(c, `schedule.${action}`, { schedule: name }, () =>
    setSchedulePaused(c.db, c.schema, name, c.actor, action === 'pause'),
  );
  return { name, changed: r.changed };
}
