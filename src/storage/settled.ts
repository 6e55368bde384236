import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';
import { entryKey, type AttemptRef } from './attempt.js';

/**
 * Which of these leases already carry a settlement with `outcome`. Only the token's holder
 * writes `completed` or `failed` (rescue writes `rescued`), so after a retried flush such a row
 * is this worker's own write whose commit reply was lost with the connection, not a refusal.
 * Runs only on that retry path, never on the hot path.
 */
export async function settledWith(
  write: Queryable,
  storage: Storage,
  refs: readonly AttemptRef[],
  outcome: 'completed' | 'failed',
): Promise<Map<string, { dead: boolean }>> {
  if (refs.length === 0) return new Map();
  const statement = storage.statement('settled-with', ({ q: s }) =>
    positional(
      `SELECT le.lane_id, le.lane_seq::text AS lane_seq,
            EXISTS (SELECT 1 FROM ${s}.dead_letters d WHERE d.id = le.id) AS dead
       FROM unnest($1::smallint[], $2::integer[], $3::bigint[]) AS u(slot, lane_id, lane_seq)
       CROSS JOIN LATERAL (SELECT * FROM ${s}.leased_entries le
                            WHERE le.slot = u.slot AND le.lane_id = u.lane_id AND le.lane_seq = u.lane_seq) le
      WHERE le.outcome = $4`,
      ['segments', 'laneIds', 'laneSeqs', 'outcome'],
    ),
  );
  const res = await write.query<{ lane_id: number; lane_seq: string; dead: boolean }>(
    statement.query({
      segments: refs.map((r) => r.segment),
      laneIds: refs.map((r) => r.laneId),
      laneSeqs: refs.map((r) => r.laneSeq),
      outcome,
    }),
  );
  return new Map(res.rows.map((r) => [entryKey({ laneId: r.lane_id, laneSeq: r.lane_seq }), { dead: r.dead }]));
}
