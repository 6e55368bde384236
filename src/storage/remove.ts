import { BerthInputError } from '../errors.js';
import { READ_COMMITTED_REQUIRED, readCommittedOnly, type Queryable } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * Remove a task that no worker holds: a deferred row is deleted; a ready entry past its lane's
 * claim cursor gets a tombstone (the ring stays append-only). The lane row is locked first so
 * no claim can lease the entry between the check and the tombstone (`remove_unleased`, a
 * definer function). Dequeue with an empty token, and the operator's cancel and delete.
 */
export async function removeUnleased(
  executor: Queryable,
  storage: Storage,
  id: string,
  reason: string,
): Promise<'removed' | 'leased' | 'not_found'> {
  const res = await executor.query<{ outcome: 'removed' | 'leased' | 'not_found' | 'isolation' }>(
    storage
      .statement('remove-unleased', ({ q: s }) =>
        positional(`SELECT ${readCommittedOnly(`${s}.remove_unleased($1::bigint, $2)`)} AS outcome`, ['id', 'reason']),
      )
      .query({ id, reason }),
  );
  const outcome = res.rows[0]!.outcome;
  if (outcome === 'isolation') throw new BerthInputError(READ_COMMITTED_REQUIRED);
  // A removed task's dependents are the function's (remove_unleased_quietly, migration 31): no
  // second statement here.
  return outcome;
}

/** Delete one dead letter (the operator's delete). Returns whether there was one. */
export async function deleteDeadLetter(db: Queryable, storage: Storage, id: string): Promise<boolean> {
  const r = await db.query(
    storage
      .statement('delete-dead-letter', ({ q: s }) => positional(`DELETE FROM ${s}.dead_letters WHERE id = $1`, ['id']))
      .query({ id }),
  );
  return (r.rowCount ?? 0) > 0;
}
