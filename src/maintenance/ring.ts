import type pg from 'pg';
import { bindSchema, quoteIdent, type SchemaRef } from '../sql.js';

export interface RingState {
  currentSlot: number;
  slotCount: number;
  generation: number;
  ageMs: number;
}

export async function readRingState(db: pg.Pool | pg.ClientBase, schema: SchemaRef): Promise<RingState> {
  const { q: s } = bindSchema(schema);
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
export async function rotateRing(pool: pg.Pool, schema: SchemaRef, minAgeMs: number): Promise<RotateResult> {
  const bound = bindSchema(schema);
  const s = bound.q;
  const st = await readRingState(pool, bound);
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
 * Reclaim one sealed slot by TRUNCATE, through the schema's `prune_slot` definer function (so
 * a worker role needs no TRUNCATE of its own): under a short lock_timeout it takes ACCESS
 * EXCLUSIVE on the slot's four partitions (so nothing can append, lease or settle in them
 * meanwhile), then truncates only if no entry is still claimable and no lease is still in
 * flight. A slot that any transaction is using (an open producer, a long reader) reports
 * `blocked` instead of waiting. No task can be lost: every entry in a pruned slot was settled or
 * tombstoned. One statement: no client is checked out.
 */
export async function pruneSlot(pool: pg.Pool, schema: SchemaRef, slot: number, lockTimeoutMs: number): Promise<PruneResult> {
  const r = await pool.query<{ result: PruneOutcome }>(`SELECT ${bindSchema(schema).q}.prune_slot($1::smallint, $2::integer) AS result`, [
    slot,
    Math.max(1, Math.round(lockTimeoutMs)),
  ]);
  const result = r.rows[0]!.result;
  if (result === 'pruned') return { slot, result };
  if (result === 'blocked') return { slot, result, reason: 'lock_timeout' };
  return { slot, result: 'skipped', reason: result };
}

/** What prune_slot (migration 7) answers. */
type PruneOutcome = 'pruned' | 'blocked' | 'current' | 'empty' | 'claimable' | 'in_flight';

/** Rotate if due, then try to prune every sealed, non-empty slot, oldest first. */
export async function maintainRing(
  pool: pg.Pool,
  schema: SchemaRef,
  opts: { rotateAfterMs: number; lockTimeoutMs: number },
): Promise<{ rotation: RotateResult; prunes: PruneResult[] }> {
  const bound = bindSchema(schema);
  const s = bound.q;
  const st = await readRingState(pool, bound);
  const prunes: PruneResult[] = [];
  for (let i = 1; i < st.slotCount; i++) {
    const slot = (st.currentSlot + i) % st.slotCount;
    const nonEmpty = await pool.query(`SELECT 1 FROM ${s}.${quoteIdent(`ready_${slot}`)} LIMIT 1`);
    if ((nonEmpty.rowCount ?? 0) === 0) continue;
    prunes.push(await pruneSlot(pool, bound, slot, opts.lockTimeoutMs));
  }
  const rotation = await rotateRing(pool, bound, opts.rotateAfterMs);
  return { rotation, prunes };
}
