import { checkKeys } from '../limits.js';
import { storageFor, type Storage } from '../storage/storage.js';
import type pg from 'pg';
import { queryRingRead } from '../sql.js';
import { positional } from '../statement.js';
import { type RingFill, readRingFill } from '../storage/ring-window.js';

/**
 * The ready ring is 16 segments: segment n is partition n of the four ring tables (`ready_n`,
 * `range_leases_n`, `range_settlements_n`, `tombstones_n`), appended to while current, then
 * sealed, then reclaimed by one TRUNCATE of all of them. (The per-task `leases_n` /
 * `settlements_n` of berth before migration 8 were locked and truncated with them until
 * migration 22; a later migration drops them.) "Segment" keeps it apart from a worker's slots
 * (its concurrency). The database still calls it `slot` (the partition key column, `ring_state`'s
 * `current_slot` and `slot_count`, the `prune_slot` function): renaming those would need a
 * migration, so the SQL keeps the old word and this module translates.
 */
export interface RingState {
  /** The segment new entries are appended to (the ring epoch's; `ring_state.current_slot` follows it). */
  currentSegment: number;
  /** How many segments the ring has (`ring_state.slot_count`). */
  segmentCount: number;
  /** Rotations so far. */
  generation: number;
  /** Time since the last rotation. */
  ageMs: number;
}

export async function readRingState(db: pg.Pool | pg.ClientBase, schema: string): Promise<RingState> {
  const r = await db.query<{ current_slot: number; slot_count: number; generation: string; age_ms: number }>(
    storageFor(schema)
      .statement('ring-state', ({ q: s }) =>
        // Through ring_window(): its current segment is the ring epoch's (migration 18), the one
        // appends go to.
        positional(
          `SELECT current_slot, slot_count, generation::text AS generation,
            (extract(epoch FROM now() - rotated_at) * 1000)::float8 AS age_ms
       FROM ${s}.ring_window()`,
          [],
        ),
      )
      .query({}),
  );
  const row = r.rows[0]!;
  return {
    currentSegment: row.current_slot,
    segmentCount: row.slot_count,
    generation: Number(row.generation),
    ageMs: row.age_ms,
  };
}

/**
 * `next_slot_busy`: the next segment still holds entries. The value keeps the old word because
 * it is the `result` label of `berth_ring_rotations_total`, which alerts and dashboards match.
 */
export type RotateResult = 'rotated' | 'not_due' | 'empty' | 'next_slot_busy' | 'raced';

/**
 * Seal the current segment and move new appends to the next one, once the current segment is
 * older than `minAgeMs` and holds something. The next segment must be empty (pruned): a segment
 * is only ever appended to again after TRUNCATE has reclaimed it. Compare-and-set on
 * current_slot, so concurrent rotators move it once.
 */
export async function rotateRing(pool: pg.Pool, schema: string, minAgeMs: number): Promise<RotateResult> {
  const storage = storageFor(schema);
  const fill = await readRingFill(pool, storage);
  return rotateIfDue(pool, storage, fill, new Set(fill.filled), { minAgeMs, smallAgeMs: minAgeMs });
}

/**
 * A current segment whose `ready` partition is smaller than this is sealed only at the small
 * segment's age (`ringRotateSmallAfterMs`): ~30,000 entries of small payloads.
 */
export const SMALL_SEGMENT_BYTES = 4 * 1024 * 1024;

/**
 * The rotation once the ring's state and fill are known (`filled`: after any prune since). Due
 * at `minAgeMs` once the current segment holds SMALL_SEGMENT_BYTES, else at `smallAgeMs`.
 */
async function rotateIfDue(
  pool: pg.Pool,
  storage: Storage,
  fill: RingFill,
  filled: ReadonlySet<number>,
  age: { minAgeMs: number; smallAgeMs: number },
): Promise<RotateResult> {
  const next = (fill.currentSegment + 1) % fill.segmentCount;
  if (fill.ageMs < age.minAgeMs) return 'not_due';
  if (!filled.has(fill.currentSegment)) return 'empty';
  if (fill.ageMs < age.smallAgeMs && fill.currentBytes < SMALL_SEGMENT_BYTES) return 'not_due';
  if (filled.has(next)) return 'next_slot_busy';
  return rotateFrom(pool, storage, fill.currentSegment, next);
}

/**
 * The rotation, through the schema's `rotate_ring` definer function: it moves appends from
 * `from` to `to` under the ring_state row lock that serializes rotators, only if the ring is
 * still at `from` (else `raced`), `from` holds a committed entry (else `empty`: a segment sealed
 * empty could take an appender's uncommitted entry out of every claim's window) and `to` holds
 * none (else `next_slot_busy`). The function moves the ring epoch (migration 18) with it.
 */
async function rotateFrom(pool: pg.Pool, storage: Storage, from: number, to: number): Promise<RotateResult> {
  const r = await pool.query<{ result: RotateResult }>(
    storage
      .statement('rotate-ring', ({ q: s }) =>
        positional(`SELECT ${s}.rotate_ring($1::smallint, $2::smallint) AS result`, ['from', 'to']),
      )
      .query({ from, to }),
  );
  return r.rows[0]!.result;
}

export type PruneResult =
  | { segment: number; result: 'pruned' }
  | { segment: number; result: 'skipped'; reason: 'current' | 'empty' | 'claimable' | 'in_flight' }
  | { segment: number; result: 'blocked'; reason: 'lock_timeout' }
  /**
   * Pruned, and the entry-by-entry check found entries neither settled nor tombstoned, which no
   * claim would ever lease (their lane's cursor had passed them): they were copied to deferred
   * (due now) in the transaction that truncated the segment. A bug, logged as an error by the
   * leader.
   */
  | { segment: number; result: 'recovered'; entries: number };

/**
 * Reclaim one sealed segment by TRUNCATE, through the schema's `prune_slot` definer function
 * (so a worker role needs no TRUNCATE of its own): under a short lock_timeout it takes ACCESS
 * EXCLUSIVE on the segment's partitions (so nothing can append, lease or settle in them
 * meanwhile), then truncates only if no entry is still claimable, no lease is still in flight,
 * and every entry is settled or tombstoned (checked entry by entry: `recovered` otherwise). A
 * segment that any transaction is using (an open producer, a long reader) reports `blocked`
 * instead of waiting. No task can be lost: every entry in a pruned segment was settled or
 * tombstoned. One statement: no client is checked out.
 */
export async function pruneSegment(
  pool: pg.Pool,
  schema: string,
  segment: number,
  lockTimeoutMs: number,
): Promise<PruneResult> {
  return pruneSegmentIn(pool, storageFor(schema), segment, lockTimeoutMs);
}

async function pruneSegmentIn(
  pool: pg.Pool,
  storage: Storage,
  segment: number,
  lockTimeoutMs: number,
): Promise<PruneResult> {
  const statement = storage.statement('prune-segment', ({ q: s }) =>
    positional(`SELECT ${s}.prune_slot($1::smallint, $2::integer) AS result`, ['segment', 'lockTimeoutMs']),
  );
  // Its in-flight check reads the segment's whole partitions: with the planner settings of a
  // ring read, not the worker session's (no sequential scans).
  const r = await queryRingRead<{ result: PruneOutcome }>(
    pool,
    statement.text,
    statement.values({ segment, lockTimeoutMs: Math.max(1, Math.round(lockTimeoutMs)) }),
  );
  const result = r.rows[0]!.result;
  if (result === 'pruned') return { segment, result };
  if (result === 'blocked') return { segment, result, reason: 'lock_timeout' };
  if (result === 'current' || result === 'empty' || result === 'claimable' || result === 'in_flight') {
    return { segment, result: 'skipped', reason: result };
  }
  return { segment, result: 'recovered', entries: Number(result.slice('recovered:'.length)) };
}

/** What prune_slot (migration 7) answers. */
type PruneOutcome = 'pruned' | 'blocked' | 'current' | 'empty' | 'claimable' | 'in_flight' | `recovered:${number}`;

const RING_KEYS: ReadonlySet<string> = new Set(['rotateAfterMs', 'rotateSmallAfterMs', 'lockTimeoutMs']);

/**
 * Rotate if due, then try to prune every sealed, non-empty segment, oldest first. Which
 * segments hold entries comes from one statement (`ring_window()`, beside the ring's state):
 * probing each segment with its own `SELECT 1 … LIMIT 1` was 19 statements a second on an idle
 * leader, each a wakeup of its session that a pickup running at the same moment waited behind
 * (docs/benchmarks-journal.md, "Ring windows"). The current segment in the rotation's compare-and-set
 * is the window's; another rotator's move since makes it `raced`.
 */
export async function maintainRing(
  pool: pg.Pool,
  schema: string,
  opts: {
    rotateAfterMs: number;
    /** When a segment smaller than SMALL_SEGMENT_BYTES is sealed; default `rotateAfterMs` (size ignored). */
    rotateSmallAfterMs?: number;
    lockTimeoutMs: number;
  },
): Promise<{ rotation: RotateResult; prunes: PruneResult[] }> {
  checkKeys(opts, RING_KEYS, 'maintainRing');
  const storage = storageFor(schema);
  const fill = await readRingFill(pool, storage);
  if (fill.committedSegment !== fill.currentSegment) {
    // A rotation's transaction was lost after its statement moved the epoch (or another rotator
    // is mid-rotation): bring ring_state level first; the next tick rotates and prunes.
    await pool.query(
      storage.statement('repair-ring-state', ({ q: s }) => positional(`SELECT ${s}.repair_ring_state()`, [])).query({}),
    );
    return { rotation: 'raced', prunes: [] };
  }
  const filled = new Set(fill.filled);
  const prunes: PruneResult[] = [];
  for (let i = 1; i < fill.segmentCount; i++) {
    const segment = (fill.currentSegment + i) % fill.segmentCount;
    if (!filled.has(segment)) continue;
    const p = await pruneSegmentIn(pool, storage, segment, opts.lockTimeoutMs);
    if (p.result === 'pruned' || p.result === 'recovered') filled.delete(segment);
    prunes.push(p);
  }
  const rotation = await rotateIfDue(pool, storage, fill, filled, {
    minAgeMs: opts.rotateAfterMs,
    smallAgeMs: Math.max(opts.rotateAfterMs, opts.rotateSmallAfterMs ?? opts.rotateAfterMs),
  });
  return { rotation, prunes };
}
