import type pg from 'pg';
import { inPoolTransaction } from '../db/connections.js';
import { quoteIdent } from '../sql.js';
import { isLockTimeout } from './promote.js';

const RING_TABLES = ['ready', 'leases', 'settlements', 'tombstones'] as const;

export interface RingState {
  currentSlot: number;
  slotCount: number;
  generation: number;
  ageMs: number;
}

export async function readRingState(db: pg.Pool | pg.ClientBase, schema: string): Promise<RingState> {
  const s = quoteIdent(schema);
  const r = await db.query<{ current_slot: number; slot_count: number; generation: string; age_ms: number }>(
    `SELECT current_slot, slot_count, generation::text AS generation,
            (extract(epoch FROM now() - rotated_at) * 1000)::float8 AS age_ms
       FROM ${s}.ring_state`,
  );
  const row = r.rows[0]!;
  return { currentSlot: row.current_slot, slotCount: row.slot_count, generation: Number(row.generation), ageMs: row.age_ms };
}

export type RotateResult = 'rotated' | 'not_due' | 'empty' | 'next_slot_busy' | 'raced';

/**
 * Seal the current slot and move new appends to the next one, once the current slot is older
 * than `minAgeMs` and holds something. The next slot must be empty (pruned): a slot is only
 * ever appended to again after TRUNCATE has reclaimed it. Compare-and-set on current_slot, so
 * concurrent rotators move it once.
 */
export async function rotateRing(pool: pg.Pool, schema: string, minAgeMs: number): Promise<RotateResult> {
  const s = quoteIdent(schema);
  const st = await readRingState(pool, schema);
  if (st.ageMs < minAgeMs) return 'not_due';
  const cur = await pool.query(`SELECT 1 FROM ${s}.${quoteIdent(`ready_${st.currentSlot}`)} LIMIT 1`);
  if (cur.rowCount === 0) return 'empty';
  const next = (st.currentSlot + 1) % st.slotCount;
  const busy = await pool.query(`SELECT 1 FROM ${s}.${quoteIdent(`ready_${next}`)} LIMIT 1`);
  if ((busy.rowCount ?? 0) > 0) return 'next_slot_busy';
  const upd = await pool.query(
    `UPDATE ${s}.ring_state SET current_slot = $2, generation = generation + 1, rotated_at = now()
      WHERE current_slot = $1`,
    [st.currentSlot, next],
  );
  return upd.rowCount === 1 ? 'rotated' : 'raced';
}

export type PruneResult =
  | { slot: number; result: 'pruned' }
  | { slot: number; result: 'skipped'; reason: 'current' | 'empty' | 'claimable' | 'in_flight' }
  | { slot: number; result: 'blocked'; reason: 'lock_timeout' };

/**
 * Reclaim one sealed slot by TRUNCATE. Under a short lock_timeout it takes ACCESS EXCLUSIVE on
 * the slot's four partitions (so nothing can append, lease or settle in them meanwhile), then
 * truncates only if no entry is still claimable and no lease is still in flight. A slot that
 * any transaction is using (an open producer, a long reader) reports `blocked` instead of
 * waiting. No task can be lost: every entry in a pruned slot was settled or tombstoned.
 */
export async function pruneSlot(pool: pg.Pool, schema: string, slot: number, lockTimeoutMs: number): Promise<PruneResult> {
  const s = quoteIdent(schema);
  const t = (name: (typeof RING_TABLES)[number]) => `${s}.${quoteIdent(`${name}_${slot}`)}`;
  try {
    return await inPoolTransaction(
      pool,
      async ({ client }) => {
        await client.query(`LOCK TABLE ${RING_TABLES.map(t).join(', ')} IN ACCESS EXCLUSIVE MODE`);
        const cur = await client.query<{ current_slot: number }>(`SELECT current_slot FROM ${s}.ring_state`);
        const check = await client.query<{ any: boolean; claimable: boolean; in_flight: boolean }>(
          `SELECT EXISTS (SELECT 1 FROM ${t('ready')}) AS any,
                  EXISTS (SELECT 1 FROM ${t('ready')} r
                           WHERE NOT EXISTS (SELECT 1 FROM ${t('leases')} l
                                              WHERE l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq)
                             AND NOT EXISTS (SELECT 1 FROM ${t('tombstones')} x
                                              WHERE x.lane_id = r.lane_id AND x.lane_seq = r.lane_seq)) AS claimable,
                  EXISTS (SELECT 1 FROM ${t('leases')} l
                           WHERE NOT EXISTS (SELECT 1 FROM ${t('settlements')} x
                                              WHERE x.lane_id = l.lane_id AND x.lane_seq = l.lane_seq)) AS in_flight`,
        );
        const c = check.rows[0]!;
        let skip: 'current' | 'empty' | 'claimable' | 'in_flight' | null = null;
        if (cur.rows[0]!.current_slot === slot) skip = 'current';
        else if (!c.any) skip = 'empty';
        else if (c.claimable) skip = 'claimable';
        else if (c.in_flight) skip = 'in_flight';
        // Nothing was written: committing the locks-and-reads transaction is as good as a rollback.
        if (skip) return { slot, result: 'skipped', reason: skip } as const;
        await client.query(`TRUNCATE ${RING_TABLES.map(t).join(', ')}`);
        return { slot, result: 'pruned' } as const;
      },
      { lockTimeoutMs },
    );
  } catch (err) {
    // A slot some transaction is using (an open producer, a long reader) is not waited for.
    if (isLockTimeout(err)) return { slot, result: 'blocked', reason: 'lock_timeout' };
    throw err;
  }
}

/** Rotate if due, then try to prune every sealed, non-empty slot, oldest first. */
export async function maintainRing(
  pool: pg.Pool,
  schema: string,
  opts: { rotateAfterMs: number; lockTimeoutMs: number },
): Promise<{ rotation: RotateResult; prunes: PruneResult[] }> {
  const s = quoteIdent(schema);
  const st = await readRingState(pool, schema);
  const prunes: PruneResult[] = [];
  for (let i = 1; i < st.slotCount; i++) {
    const slot = (st.currentSlot + i) % st.slotCount;
    const nonEmpty = await pool.query(`SELECT 1 FROM ${s}.${quoteIdent(`ready_${slot}`)} LIMIT 1`);
    if ((nonEmpty.rowCount ?? 0) === 0) continue;
    prunes.push(await pruneSlot(pool, schema, slot, opts.lockTimeoutMs));
  }
  const rotation = await rotateRing(pool, schema, opts.rotateAfterMs);
  return { rotation, prunes };
}
