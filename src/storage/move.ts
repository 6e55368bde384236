import { BerthInputError } from '../errors.js';
import { checkKeys, checkText, MAX_QUEUE_BYTES } from '../limits.js';
import { bindSchema, READ_COMMITTED_REQUIRED, readCommittedOnly, type Queryable, type SchemaRef } from '../sql.js';
import { getTask } from './tasks.js';

const MOVE_KEYS: ReadonlySet<string> = new Set(['queue', 'priority']);

export type MoveResult = 'moved' | 'leased' | 'not_found';

/**
 * Admin operation: move a task no worker holds to another queue and/or priority. The ready ring
 * stays append-only: the old entry gets a tombstone and the task is re-appended to its new lane
 * (same id, payload, attempts). A task under a lease is not moved ('leased').
 */
export async function moveTask(
  db: Queryable,
  schema: SchemaRef,
  id: string,
  to: { queue?: string; priority?: number },
): Promise<MoveResult> {
  checkKeys(to, MOVE_KEYS, 'moveTask');
  if (to.queue !== undefined) checkText(to.queue, 'queue', '', { maxBytes: MAX_QUEUE_BYTES });
  const bound = bindSchema(schema);
  const current = await getTask(db, bound, id);
  if (!current || current.state === 'dead' || current.state === 'completed') return 'not_found';
  const priority = to.priority ?? current.priority;
  if (!Number.isInteger(priority) || priority < -32768 || priority > 32767) {
    throw new BerthInputError('priority must be an integer in the smallint range');
  }
  const r = await db.query<{ result: MoveResult | 'isolation' }>(
    `SELECT ${readCommittedOnly(`${bound.q}.move_task($1::bigint, $2, $3::smallint)`)} AS result`,
    [id, to.queue ?? current.queue, priority],
  );
  const result = r.rows[0]!.result;
  if (result === 'isolation') throw new BerthInputError(READ_COMMITTED_REQUIRED);
  return result;
}

/**
 * Make a scheduled or retryable task due now (the operator's retry of a deferred task): the
 * leader's promotion appends it within a tick. Returns whether a deferred row was there.
 */
export async function makeDeferredDueNow(db: Queryable, schema: SchemaRef, id: string): Promise<boolean> {
  const r = await db.query(`UPDATE ${bindSchema(schema).q}.deferred SET run_at = now() WHERE id = $1`, [id]);
  return (r.rowCount ?? 0) > 0;
}
