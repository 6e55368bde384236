import { BerthInputError, orNotMigrated } from '../errors.js';
import { checkKeys, checkText, MAX_QUEUE_BYTES } from '../limits.js';
import { READ_COMMITTED_REQUIRED, readCommittedOnly, type Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from './storage.js';
import { readTaskIn } from './tasks.js';
import { taskId } from './ids.js';
import { watchParents } from './deps.js';

const MOVE_KEYS: ReadonlySet<string> = new Set(['queue', 'priority']);

export type MoveResult = 'moved' | 'leased' | 'not_found';

/**
 * Admin operation: move a task no worker holds to another queue and/or priority. The ready ring
 * stays append-only: the old entry gets a tombstone and the task is re-appended to its new lane
 * (same id, payload, attempts). A task under a lease is not moved ('leased').
 */
export async function moveTask(
  db: Queryable,
  schema: string,
  id: string,
  to: { queue?: string; priority?: number },
): Promise<MoveResult> {
  taskId(id);
  return orNotMigrated(schema, () => moveTaskIn(db, storageFor(schema), id, to));
}

/** moveTask on a bound storage. */
export async function moveTaskIn(
  db: Queryable,
  storage: Storage,
  id: string,
  to: { queue?: string; priority?: number },
): Promise<MoveResult> {
  checkKeys(to, MOVE_KEYS, 'moveTask');
  if (to.queue !== undefined) checkText(to.queue, 'queue', '', { maxBytes: MAX_QUEUE_BYTES });
  const current = await readTaskIn(db, storage, id);
  if (!current || current.state === 'dead' || current.state === 'completed') return 'not_found';
  const priority = to.priority ?? current.priority;
  if (!Number.isInteger(priority) || priority < -32768 || priority > 32767) {
    throw new BerthInputError('priority must be an integer in the smallint range');
  }
  const r = await db.query<{ result: MoveResult | 'isolation' }>(
    storage
      .statement('move-task', ({ q: s }) =>
        positional(`SELECT ${readCommittedOnly(`${s}.move_task($1::bigint, $2, $3::smallint)`)} AS result`, [
          'id',
          'queue',
          'priority',
        ]),
      )
      .query({ id, queue: to.queue ?? current.queue, priority }),
  );
  const result = r.rows[0]!.result;
  if (result === 'isolation') throw new BerthInputError(READ_COMMITTED_REQUIRED);
  // A moved entry is appended again without its dependents' mark: the leader watches it instead.
  if (result === 'moved') await watchParents(db, storage, [id]);
  return result;
}

/**
 * Make a scheduled or retryable task due now (the operator's retry of a deferred task): the
 * leader's promotion appends it within a tick. Returns whether a deferred row was there.
 */
export async function makeDeferredDueNow(db: Queryable, storage: Storage, id: string): Promise<boolean> {
  const r = await db.query(
    storage
      .statement('deferred-due-now', ({ q: s }) =>
        // Not a task waiting on dependencies: only its last parent's completion makes it due.
        positional(`UPDATE ${s}.deferred SET run_at = now() WHERE id = $1 AND state <> 'waiting'`, ['id']),
      )
      .query({ id }),
  );
  return (r.rowCount ?? 0) > 0;
}
