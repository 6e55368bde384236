import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor } from '../storage/storage.js';

/**
 * `not_due`: the current partition is younger than retention / (partitions - 1). `blocked`: a
 * reader held the partition to reclaim past the lock timeout; the next run tries again.
 */
export type HistoryRotation = 'rotated' | 'not_due' | 'blocked';

/**
 * Rotate attempt history (the leader's `history` branch): once the current partition is
 * retention / (partitions - 1) old, truncate the next one and make it current, through the
 * schema's `rotate_history` definer function (a worker role has no TRUNCATE). One cheap statement
 * when nothing is due. Writers never insert into the partition being reclaimed, so the task
 * path never waits for it.
 */
export async function rotateHistory(db: Queryable, schema: string, lockTimeoutMs: number): Promise<HistoryRotation> {
  const r = await db.query<{ r: HistoryRotation }>(
    storageFor(schema)
      .statement('rotate-history', ({ q: s }) =>
        positional(`SELECT ${s}.rotate_history($1::integer) AS r`, ['lockTimeoutMs']),
      )
      .query({ lockTimeoutMs: Math.max(1, Math.round(lockTimeoutMs)) }),
  );
  return r.rows[0]!.r;
}
