import { BerthInputError } from '../errors.js';
import type { Lane } from '../lane.js';
import { DEFAULT_SCHEMA, type Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor } from './storage.js';

/** A task as its enqueue wrote it: what `enqueuedIn` lists. */
export interface EnqueuedTask extends Lane {
  id: string;
  type: string;
  payload: unknown;
  /** `ready`: due at enqueue; `scheduled`: enqueued with a later `runAt` or a `delay`. */
  state: 'ready' | 'scheduled';
  runAt: Date;
  /** null: not set at enqueue (the type's setting applies at claim). */
  maxAttempts: number | null;
  dedupeKey: string | null;
}

/**
 * The tasks the caller's open transaction has enqueued, oldest id first: rows of `ready` and
 * `deferred` (scheduled, no attempt yet) that this transaction or one of its savepoints wrote.
 *
 * How a row is known to be ours: it is visible, and its `xmin` is a transaction still in
 * progress. Another session's uncommitted rows are invisible, so a visible in-progress xmin is
 * this transaction or one of its subtransactions (`pg_xact_status` reports those as in
 * progress). `xmin` is a 32-bit xid and `pg_xact_status` takes a 64-bit one: the row's is rebuilt
 * from the transaction's own (`pg_current_xact_id`), as an offset of less than 2^31 past it
 * (subtransactions get their xids after their parent); rows of older transactions fall outside
 * that window and are never looked up. A sequential scan of both tables: this is for tests, not
 * for a production path.
 */
export async function enqueuedIn(db: Queryable, schema: string = DEFAULT_SCHEMA): Promise<EnqueuedTask[]> {
  const storage = storageFor(schema);
  // Sent without parameters, so over the simple protocol: the statement is then one message,
  // and its statement_timestamp() equals transaction_timestamp() exactly when it is the first
  // command of its transaction (an autocommit statement: a pool, or a client outside BEGIN).
  // Through the extended protocol each message restamps statement_timestamp().
  const own = await db.query<{ first: boolean }>('SELECT statement_timestamp() = transaction_timestamp() AS first');
  if (own.rows[0]?.first) {
    throw new BerthInputError(
      'enqueuedIn: pass the client holding the open transaction that enqueued (after BEGIN, before COMMIT or ROLLBACK); this query ran in a transaction of its own',
    );
  }
  const statement = storage.statement('enqueued-in', ({ name, q: s }) =>
    positional(
      `WITH me AS (
       SELECT x::text::numeric AS top, x::text::numeric % 4294967296 AS top32
         FROM pg_current_xact_id_if_assigned() x
     ), mine AS (
       SELECT t.*, (t.xmin::text::numeric - me.top32 + 4294967296) % 4294967296 AS after_top
         FROM (SELECT xmin, id, type, payload, queue, priority, shard, 'ready' AS state, run_at,
                      max_attempts, dedupe_key
                 FROM ${s}.ready WHERE attempts = 0
               UNION ALL
               SELECT xmin, id, type, payload, queue, priority, shard, 'scheduled', run_at,
                      max_attempts, dedupe_key
                 FROM ${s}.deferred WHERE state = 'scheduled' AND attempts = 0) t, me
     )
     SELECT DISTINCT ON (m.id) m.id::text AS id, m.type, m.payload, m.queue, m.priority, m.shard,
            m.state, m.run_at AS "runAt", m.max_attempts AS "maxAttempts", m.dedupe_key AS "dedupeKey"
       FROM mine m, me
      WHERE m.after_top < 2147483648
        AND pg_xact_status((me.top + m.after_top)::text::xid8) = 'in progress'
      ORDER BY m.id, m.state`,
      [],
      `berth-enqueued-in:${name}`,
    ),
  );
  const res = await db.query<EnqueuedTask>(statement.query({}));
  return res.rows;
}
