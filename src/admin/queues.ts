import { notMigrated, orNotMigrated } from '../errors.js';
import { checkText, MAX_ACTOR_CHARS, MAX_QUEUE_BYTES } from '../limits.js';
import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor } from '../storage/storage.js';

export interface QueueInfo {
  queue: string;
  lanes: number;
  paused: boolean;
  pausedAt: Date | null;
  pausedBy: string | null;
  reason: string | null;
}

/**
 * Every queue that has a lane, a pause record, or only scheduled/retryable tasks (a queue whose
 * work is all in the future has no lane yet), by name. The deferred queues are found with a
 * skip scan over the (queue, ...) index: one probe per distinct queue, not a scan of the rows.
 */
export async function listQueues(db: Queryable, schema: string): Promise<QueueInfo[]> {
  try {
    const statement = storageFor(schema).statement('admin-queues-list', ({ q: s }) =>
      positional(
        `WITH RECURSIVE deferred_queues(queue) AS (
         (SELECT queue FROM ${s}.deferred ORDER BY queue LIMIT 1)
         UNION ALL
         SELECT (SELECT d.queue FROM ${s}.deferred d WHERE d.queue > dq.queue ORDER BY d.queue LIMIT 1)
           FROM deferred_queues dq WHERE dq.queue IS NOT NULL
       )
       SELECT q.queue, coalesce(l.lanes, 0)::int AS lanes, p.paused_at, p.paused_by, p.reason
         FROM (SELECT queue FROM ${s}.lanes UNION SELECT queue FROM ${s}.queue_pauses
               UNION SELECT queue FROM deferred_queues) q
         LEFT JOIN (SELECT queue, count(*) AS lanes FROM ${s}.lanes GROUP BY queue) l USING (queue)
         LEFT JOIN ${s}.queue_pauses p USING (queue)
        WHERE q.queue IS NOT NULL
        ORDER BY q.queue`,
        [],
      ),
    );
    const r = await db.query<{
      queue: string;
      lanes: number;
      paused_at: Date | null;
      paused_by: string | null;
      reason: string | null;
    }>(statement.query({}));
    return r.rows.map((x) => ({
      queue: x.queue,
      lanes: x.lanes,
      paused: x.paused_at !== null,
      pausedAt: x.paused_at,
      pausedBy: x.paused_by,
      reason: x.reason,
    }));
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/** Any string names a queue, the empty one included (seed 003), so it can be paused too. */
function queueName(queue: string): string {
  return checkText(queue, 'queue', '', { maxBytes: MAX_QUEUE_BYTES });
}

function actorName(actor: string): string {
  return checkText(actor, 'actor', '', { maxChars: MAX_ACTOR_CHARS });
}

/** A pause's reason is shown to operators: a paragraph, not a document. */
const MAX_REASON_CHARS = 2000;

/**
 * Stop claims from a queue. Once this returns no worker leases a new task from it (the lanes'
 * version bump fences claims already in flight); tasks already running finish. Enqueue and
 * promotion go on, so nothing is lost while it is paused. Pausing a queue with no lanes yet
 * records the pause: its first lane opens paused. Returns the number of lanes changed.
 */
export async function pauseQueue(
  db: Queryable,
  schema: string,
  queue: string,
  actor: string,
  reason?: string,
): Promise<{ lanes: number }> {
  const args = { queue: queueName(queue), actor: actorName(actor), reason: reason ?? null };
  if (reason !== undefined) checkText(reason, 'reason', 'pauseQueue', { maxChars: MAX_REASON_CHARS });
  const statement = storageFor(schema).statement('admin-queue-pause', ({ q: s }) =>
    positional(`SELECT ${s}.set_queue_paused($1, true, $2, $3) AS n`, ['queue', 'actor', 'reason']),
  );
  const r = await orNotMigrated(schema, () => db.query<{ n: number }>(statement.query(args)));
  return { lanes: r.rows[0]!.n };
}

/** Let workers claim from the queue again, and wake them. */
export async function resumeQueue(
  db: Queryable,
  schema: string,
  queue: string,
  actor: string,
): Promise<{ lanes: number }> {
  const args = { queue: queueName(queue), actor: actorName(actor) };
  const statement = storageFor(schema).statement('admin-queue-resume', ({ q: s }) =>
    positional(`SELECT ${s}.set_queue_paused($1, false, $2, NULL) AS n`, ['queue', 'actor']),
  );
  const r = await orNotMigrated(schema, () => db.query<{ n: number }>(statement.query(args)));
  return { lanes: r.rows[0]!.n };
}
