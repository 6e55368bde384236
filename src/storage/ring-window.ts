import { type Queryable, quoteIdent, type Schema } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * The ring segments a worker's claims read (migration 13, `ring_window()`): the current one (the
 * ring epoch's, and the one the last committed rotation left, if another) and every sealed one
 * not yet pruned, with the ring's generation they were read at. Entries outside
 * it are newer than every entry in it, so a claim that reads only these never passes over an
 * older entry of a lane; a claim whose snapshot shows a later generation reads nothing and says
 * it is stale (see the claim), and the worker reads the window again.
 *
 * Why: a claim over the whole ring names 16 partitions of each ring table per lane it reads,
 * and the executor locks and initialises all of them on every execution (docs/benchmarks-journal.md,
 * "Ring windows": a one-task claim's round trip after 10 ms idle, 1.49 → 0.96 ms).
 */
export interface RingWindow {
  /** `ring_state.generation` in the window's snapshot (int8, as text). */
  readonly generation: string;
  /** The segments, ascending; null: every segment (more than MAX_WINDOW_SEGMENTS hold entries). */
  readonly segments: readonly number[] | null;
}

/**
 * A window of more segments is read as the whole ring: each distinct window is a statement a
 * session prepares and keeps, and a backlog spread over many segments gains little from naming
 * them. A ring that drains keeps one or two.
 */
export const MAX_WINDOW_SEGMENTS = 4;

/** What `ring_window()` reads: the ring's state and the segments with entries. */
export interface RingFill {
  generation: string;
  currentSegment: number;
  segmentCount: number;
  /** Time since the last rotation (database clock). */
  ageMs: number;
  /** Segments with at least one row in `ready`, ascending. */
  filled: number[];
  /** The size of the current segment's `ready` partition (`pg_relation_size`: its file, no scan). */
  currentBytes: number;
  /**
   * `ring_state.current_slot` in the window's snapshot: the current segment as the last committed
   * rotation left it. The epoch's (`currentSegment`) is one ahead while a rotation is between its
   * statement and its commit, or after a rotation whose transaction was lost (the leader then
   * calls repair_ring_state). A window holds both (migration 18).
   */
  committedSegment: number;
}

export async function readRingFill(db: Queryable, storage: Storage): Promise<RingFill> {
  const { name } = storage.schema;
  const statement = storage.statement('ring-window', ({ q: s }) =>
    positional(
      `SELECT w.generation::text AS generation, w.current_slot, w.slot_count,
                  (extract(epoch FROM now() - w.rotated_at) * 1000)::float8 AS age_ms, w.filled,
                  pg_relation_size(format('%I.%I', $1::text, 'ready_' || w.current_slot)::regclass)::text
                    AS current_bytes, w.committed_slot
             FROM ${s}.ring_window() w`,
      ['schema'],
      `berth-ring-window:${name}`,
    ),
  );
  const r = await db.query<{
    generation: string;
    current_slot: number;
    slot_count: number;
    age_ms: number;
    filled: number[];
    current_bytes: string;
    committed_slot: number;
  }>(statement.query({ schema: name }));
  const row = r.rows[0];
  if (!row) throw new Error(`berth schema "${name}" has no ring_state row`);
  const filled = row.filled.map(Number);
  if (filled.some((x) => !Number.isInteger(x) || x < 0 || x > 32767)) {
    throw new Error(`ring_window() returned a segment that is not a smallint: ${row.filled.join(',')}`);
  }
  return {
    generation: row.generation,
    currentSegment: row.current_slot,
    segmentCount: row.slot_count,
    ageMs: row.age_ms,
    filled,
    currentBytes: Number(row.current_bytes),
    committedSegment: row.committed_slot,
  };
}

export async function readRingWindow(db: Queryable, storage: Storage): Promise<RingWindow> {
  const fill = await readRingFill(db, storage);
  // The epoch's segment and the committed one (the same but for a rotation in between): the one a
  // rotation in flight is sealing may hold an entry committed after this window's snapshot, which
  // its filled list does not show.
  const segments = [...new Set([...fill.filled, fill.currentSegment, fill.committedSegment])].sort((a, b) => a - b);
  return { generation: fill.generation, segments: segments.length > MAX_WINDOW_SEGMENTS ? null : segments };
}

/**
 * `AND <alias>.slot IN (…)` for a window's segments (nothing for the whole ring). The numbers
 * come from the database and are checked integers; the statement is planned with them as
 * constants, so its partitions are pruned when it is planned, not at every execution.
 */
export function segmentFilter(alias: string, segments: readonly number[] | null | undefined): string {
  if (!segments) return '';
  return `AND ${alias}.slot IN (${segments.map((x) => String(Math.trunc(x))).join(', ')})`;
}

/** The window as part of a prepared statement's name (one statement per distinct window). */
export function windowKey(window: RingWindow | undefined): string {
  if (!window) return '';
  return window.segments ? `:w${window.segments.join('.')}` : ':wall';
}

/** The ring's partitioned parents (each partition of one is `<parent>_<segment>`). */
const RING_PARENTS = ['ready', 'range_leases', 'range_settlements', 'tombstones'] as const;

/**
 * A read-only ring statement over a window: each ring parent it names (`<schema>.ready`, …) is
 * replaced by the union of the window's partitions, which the planner flattens into the same
 * append of partitions as a pruned parent, with every predicate pushed into each. The whole
 * ring when `segments` is null. Only for statements that read: a write must name its parent.
 *
 * Why: a statement over the parents plans and opens every partition of each (16 of four
 * tables, ~70 relations with their indexes), and each prune's TRUNCATE of a segment makes it
 * plan again. The gauges over the whole ring took 35-48 ms on a new session and 14-24 ms after
 * a prune, every 5 s; over a one-segment window 17-29 and 7-12 ms (`npm run bench:leader-reads`,
 * docs/benchmarks-journal.md, "The pickup's tail").
 */
export function overWindow(text: string, schema: Schema, segments: readonly number[] | null): string {
  if (!segments) return text;
  // The parent, and its alias if one follows (a subquery in FROM needs one: an unaliased parent
  // keeps its own name as the alias, so `parent.column` still resolves).
  const parent = new RegExp(
    `${escapeRegExp(schema.q)}\\.(${RING_PARENTS.join('|')})(?![A-Za-z0-9_$"])` +
      `(?:\\s+(?:AS\\s+)?(?!(?:${SQL_AFTER_TABLE.join('|')})\\b)([A-Za-z_][A-Za-z0-9_]*))?`,
    'gi',
  );
  return text.replace(parent, (_m, table: string, alias: string | undefined) => {
    const parts = segments.map((k) => `SELECT * FROM ${schema.q}.${quoteIdent(`${table}_${Math.trunc(k)}`)}`);
    return `(${parts.join(' UNION ALL ')}) AS ${alias ?? table}`;
  });
}

/** Words that may follow a table in FROM and are not its alias. */
const SQL_AFTER_TABLE = [
  'WHERE',
  'JOIN',
  'ON',
  'USING',
  'GROUP',
  'ORDER',
  'LIMIT',
  'OFFSET',
  'UNION',
  'EXCEPT',
  'INTERSECT',
  'CROSS',
  'LEFT',
  'RIGHT',
  'INNER',
  'FULL',
  'NATURAL',
  'LATERAL',
  'HAVING',
  'WINDOW',
  'FOR',
  'RETURNING',
  'TABLESAMPLE',
];

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * The ring's current segment as committed (`ring_state.current_slot`): where new entries go, so
 * where the next leases and their completions will be. A statement of its own, not the window's
 * read: behind a transaction pooler that shares one server session, two client sessions
 * preparing one name collide (42P05), and this is read on the settlement session, which reads
 * nothing else of the ring.
 */
export async function readCurrentSegment(db: Queryable, storage: Storage): Promise<number> {
  const { name, q: s } = storage.schema;
  const statement = storage.statement('current-segment', () =>
    positional(`SELECT current_slot FROM ${s}.ring_state`, [], `berth-current-segment:${name}`),
  );
  const r = await db.query<{ current_slot: number }>(statement.query({}));
  const row = r.rows[0];
  if (!row) throw new Error(`berth schema "${name}" has no ring_state row`);
  return row.current_slot;
}
