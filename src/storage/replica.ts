import type { Queryable } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * The two statements that tell whether a read replica has caught up with a point of the
 * primary's write-ahead log (processor/discovery-reads.ts): a discovery on a replica that has not
 * replayed a commit does not see its task.
 */

/**
 * The primary's WAL insert position (`pg_lsn` as text). The insert position, not the write
 * position (`pg_current_wal_lsn()`): an asynchronous commit's record is inserted before it is
 * written, and a commit that returned must be at or before the position read after it.
 */
export async function primaryWalPosition(db: Queryable, storage: Storage): Promise<string> {
  const statement = storage.statement('wal-position', () =>
    compile(sql`SELECT pg_current_wal_insert_lsn()::text AS lsn`),
  );
  const res = await db.query<{ lsn: string }>(statement.query({}));
  const lsn = res.rows[0]?.lsn;
  if (lsn === undefined) throw new Error('pg_current_wal_insert_lsn() returned no row');
  return lsn;
}

/**
 * Whether the server `db` has replayed the primary's WAL up to `lsn` (null: any answer is a yes,
 * so the statement doubles as a probe). A server not in recovery (a primary named as the read
 * target) sees every commit: yes. `pg_is_in_recovery()` first: after a crash recovery or a
 * promotion, `pg_last_wal_replay_lsn()` stays at the last record that recovery replayed, and a
 * promoted replica would otherwise read as behind for ever.
 */
export async function replayedUpTo(db: Queryable, storage: Storage, lsn: string | null): Promise<boolean> {
  const statement = storage.statement('replayed-up-to', () =>
    compile(
      sql`SELECT CASE WHEN pg_is_in_recovery()
                      THEN coalesce(pg_last_wal_replay_lsn() >= ${p('lsn')}::pg_lsn, ${p('lsn')}::pg_lsn IS NULL)
                      ELSE true END AS replayed`,
    ),
  );
  const res = await db.query<{ replayed: boolean }>(statement.query({ lsn }));
  return res.rows[0]?.replayed ?? false;
}
