import { audited } from '../admin/audit.js';
import { purgeDead, retryDead, type DeadFilter } from '../admin/dead.js';
import { pauseQueue, resumeQueue } from '../admin/queues.js';
import { cancelTask, deleteTask, retryTask } from '../admin/tasks.js';
import { BerthInputError } from '../errors.js';
import type { Logger } from '../logger.js';
import type { Queryable, Schema } from '../sql.js';
import { moveTask } from '../storage/move.js';
import {
  MAX_FILTER_TEXT_CHARS,
  optionalBoolean,
  optionalIds,
  optionalInteger,
  optionalQueue,
  optionalText,
  queueName,
  taskId,
} from './params.js';

/** The state-changing side of the JSON API. Every action is audited under the caller's actor. */
export interface ActionContext {
  db: Queryable;
  schema: Schema;
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

export async function taskAction(c: ActionContext, id: string, action: TaskAction) {
  taskId(id);
  const result = await run(c, `task.${action}`, { id }, () =>
    action === 'cancel' ? cancelTask(c.db, c.schema, id, { actor: c.actor }) : TASK_ACTIONS[action](c.db, c.schema, id),
  );
  return { result };
}

export async function moveAction(c: ActionContext, id: string, body: Body) {
  taskId(id);
  const queue = optionalQueue(body.queue);
  const priority = optionalInteger(body.priority, 'priority');
  if (queue === undefined && priority === undefined)
    throw new BerthInputError('a move needs a queue, a priority, or both');
  const to = { ...(queue !== undefined && { queue }), ...(priority !== undefined && { priority }) };
  const result = await run(c, 'task.move', { id, ...to }, () => moveTask(c.db, c.schema, id, to));
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

export function deadAction(c: ActionContext, action: 'retry' | 'purge', body: Body) {
  const filter = deadFilter(body);
  const target = {
    ...filter,
    ...(filter.ids && { ids: filter.ids.length <= 20 ? filter.ids : `${filter.ids.length} ids` }),
  };
  return run(c, `dead.${action}`, target, () => (action === 'retry' ? retryDead : purgeDead)(c.db, c.schema, filter));
}

export function queueAction(c: ActionContext, queue: string, action: 'pause' | 'resume', body: Body) {
  queueName(queue);
  if (action === 'pause') {
    const reason = optionalText(body.reason, 'reason', MAX_FILTER_TEXT_CHARS);
    return run(c, 'queue.pause', { queue, ...(reason !== undefined && { reason }) }, () =>
      pauseQueue(c.db, c.schema, queue, c.actor, reason),
    );
  }
  return run(c, 'queue.resume', { queue }, () => resumeQueue(c.db, c.schema, queue, c.actor));
}
