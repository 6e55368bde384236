import { MAX_ACTOR_CHARS } from '../limits.js';

/**
 * Who cancelled a task, as its `cancelled` attempt-history row says. `cancel_tasks()` writes the
 * actor into the row's error as `data: '{"cancelledBy": <actor>, "state": <state>}'` (JSON as
 * text, like every error's data; migrations 11, 20 and 25). A worker role can insert any history
 * row, so the data is parsed, not trusted: anything but a string of at most 200 characters is no
 * actor, and text that is not JSON is no cancel detail at all.
 */
export interface CancelDetail {
  /** `cli:alice`, `dashboard:ops@example.com`; null when the cancel named nobody. */
  actor: string | null;
  /** What the task was when cancelled: `running`, or a pending state; null on a row older than migration 25. */
  state: 'running' | 'ready' | 'scheduled' | 'retryable' | 'held' | null;
}

const CANCELLED_WHILE: ReadonlySet<string> = new Set(['running', 'ready', 'scheduled', 'retryable', 'held']);

/** The cancel detail in a `cancelled` row's error data (the `data` text, or the whole error object). */
export function cancelDetail(data: unknown): CancelDetail {
  const text = data !== null && typeof data === 'object' ? (data as { data?: unknown }).data : data;
  let parsed: unknown = null;
  if (typeof text === 'string') {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
  }
  const o = parsed !== null && typeof parsed === 'object' ? (parsed as Record<string, unknown>) : {};
  const actor = typeof o.cancelledBy === 'string' && o.cancelledBy.length <= MAX_ACTOR_CHARS ? o.cancelledBy : null;
  const state = typeof o.state === 'string' && CANCELLED_WHILE.has(o.state) ? (o.state as CancelDetail['state']) : null;
  return { actor, state };
}

/**
 * An operator's cancel row in attempt history (SQL, over the alias `h`): `cancel_tasks()` names
 * its error `Cancel`. A worker records `cancelled` too, for a run its own stop interrupted and
 * released (the task runs again), which is no cancel of the task. Written as migration 25's
 * partial index `attempt_history_cancelled_idx` is, so a walk by bucket can use that index. Null
 * when the row has no error (a stop's release may have none): say `IS TRUE` outside a WHERE.
 */
export const OPERATOR_CANCEL_ROW = `(h.outcome = 'cancelled' AND (h.error ->> 'name') = 'Cancel')`;
