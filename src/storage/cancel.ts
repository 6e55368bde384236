import { BerthInputError } from '../errors.js';
import { checkText, MAX_ACTOR_CHARS } from '../limits.js';
import { READ_COMMITTED_REQUIRED, type Queryable } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';
import { entryKey, type AttemptRef } from './attempt.js';
import { watchParents } from './deps.js';

/**
 * What a cancel did to one task:
 * - `removed`: it was pending (ready, scheduled or retryable) and is gone before it ran again;
 * - `cancelled`: it was running (or held by a dead worker's lease); its attempt is settled as
 *   `cancelled` and its holder is told to abort the handler;
 * - `already_settled`: its attempt was settled first (it completed, died, or was cancelled
 *   already): the cancel lost the race and changed nothing;
 * - `not_found`: no such task (a dead letter is not pending: retry or delete it).
 */
export type CancelResult = 'removed' | 'cancelled' | 'already_settled' | 'not_found';

/** The wake-channel payload prefix of a cancel (`cancel:<lane_id>:<lane_seq>`). */
export const CANCEL_NOTICE_PREFIX = 'cancel:';

/**
 * Cancel tasks by id, in order, in one statement (`cancel_tasks()`, a definer function): a
 * pending task is removed as `removeUnleased` does; a running one gets a `cancelled` settlement
 * carrying `actor`, fenced like every settlement by the `range_settlements` exclusion constraint,
 * so of a cancel and the holder's own settlement exactly one is written. The holder is notified
 * on the wake channel at commit. Must run at READ COMMITTED (it takes a lane's row lock and then
 * needs a fresh snapshot to see a lease committed meanwhile).
 */
export async function cancelTasks(
  executor: Queryable,
  storage: Storage,
  ids: readonly string[],
  actor: string | null,
): Promise<Map<string, CancelResult>> {
  if (actor !== null) checkText(actor, 'actor', 'cancel', { maxChars: MAX_ACTOR_CHARS });
  const res = await executor.query<{ id: string; result: CancelResult | 'isolation' }>(
    storage
      .statement('cancel', ({ q: s }) =>
        positional(`SELECT c.id::text AS id, c.result FROM ${s}.cancel_tasks($1::bigint[], $2) c`, ['ids', 'actor']),
      )
      .query({ ids, actor }),
  );
  const out = new Map<string, CancelResult>();
  for (const r of res.rows) {
    if (r.result === 'isolation') throw new BerthInputError(READ_COMMITTED_REQUIRED);
    out.set(r.id, r.result);
  }
  // A cancelled task's dependents: the leader reads its fate and cancels them.
  await watchParents(
    executor,
    storage,
    [...out].filter(([, r]) => r === 'removed' || r === 'cancelled').map(([id]) => id),
  );
  return out;
}

/**
 * The poll behind the cancel notification: which of these leases (a worker's in-flight
 * handlers) an operator cancelled. One statement per check, one index probe of
 * `range_settlements` per lease; run by a worker only while it has handlers running.
 */
export async function cancelledAmong(
  db: Queryable,
  storage: Storage,
  refs: readonly AttemptRef[],
): Promise<Set<string>> {
  if (refs.length === 0) return new Set();
  const statement = storage.statement('cancelled', ({ name, q: s }) =>
    positional(
      `SELECT u.lane_id, u.lane_seq::text AS lane_seq
       FROM unnest($1::smallint[], $2::integer[], $3::bigint[], $4::bigint[]) AS u(slot, lane_id, lease_from, lane_seq)
      WHERE EXISTS (SELECT 1 FROM ${s}.range_settlements x
                     WHERE x.lane_id = u.lane_id AND x.lease_from = u.lease_from AND x.slot = u.slot
                       AND x.seqs @> u.lane_seq AND x.outcome = 'cancelled')`,
      ['segments', 'laneIds', 'leaseFroms', 'laneSeqs'],
      `berth-cancelled:${name}`,
    ),
  );
  const res = await db.query<{ lane_id: number; lane_seq: string }>(
    statement.query({
      segments: refs.map((r) => r.segment),
      laneIds: refs.map((r) => r.laneId),
      leaseFroms: refs.map((r) => r.leaseFrom),
      laneSeqs: refs.map((r) => r.laneSeq),
    }),
  );
  return new Set(res.rows.map((r) => entryKey({ laneId: r.lane_id, laneSeq: r.lane_seq })));
}

/** Parse a cancel notice (`cancel:<lane_id>:<lane_seq>`) into the lease key it names, or null. */
export function parseCancelNotice(payload: string): string | null {
  if (!payload.startsWith(CANCEL_NOTICE_PREFIX)) return null;
  const m = /^(\d+):(\d+)$/.exec(payload.slice(CANCEL_NOTICE_PREFIX.length));
  if (!m) return null;
  return entryKey({ laneId: Number(m[1]), laneSeq: m[2]! });
}
