import assert from 'node:assert/strict';
import pg from 'pg';
import { quoteIdent } from '../../src/sql.js';
import { DATABASE_URL, waitFor } from '../helpers.js';

/**
 * Attacks on an append path's rules (docs/architecture.md, "Invariants" 1 and 2, and the wake),
 * shared by the reviews of the SQL functions that append to a lane: each takes the statements
 * to compare, as SQL text that answers one row with the new task's `id`.
 */

/**
 * Wrong and edge values for the arguments every append function takes for its lane (queue,
 * priority, shard, shards) and its trace context, as SQL expressions; queues `newq` (no lane
 * yet), `pausedq` and `limitedq` are ones the caller's schema may set up.
 */
export const LANE_ARGUMENT_MUTATIONS: readonly (readonly [
  'queue' | 'priority' | 'shard' | 'shards' | 'trace',
  string,
])[] = [
  ['queue', 'NULL'],
  ['queue', `repeat('q', 256)`],
  ['queue', `repeat('é', 128)`],
  ['queue', `repeat('é', 127) || 'q'`],
  ['queue', `''`],
  ['queue', `'newq'`],
  ['queue', `'pausedq'`],
  ['queue', `'limitedq'`],
  ['priority', 'NULL::smallint'],
  ['priority', '(-32768)::smallint'],
  ['priority', '32767::smallint'],
  ['shard', '(-1)::smallint'],
  ['shard', '64::smallint'],
  ['shard', '63::smallint'],
  ['shard', '0::smallint'],
  ['shards', '0::smallint'],
  ['shards', '(-3)::smallint'],
  ['shards', '65::smallint'],
  ['shards', '64::smallint'],
  ['shards', '1::smallint'],
  ['trace', `repeat('x', 1025)`],
  ['trace', `repeat('x', 1024)`],
  ['trace', `''`],
];

/**
 * No mutation, each mutation alone, and (`pairs`) each two on different fields: the order in
 * which a call reports two errors at once.
 */
export function mutationSets<M extends readonly [string, string]>(ms: readonly M[], pairs = true): M[][] {
  const sets: M[][] = [[]];
  for (const m of ms) sets.push([m]);
  if (pairs)
    for (let i = 0; i < ms.length; i++)
      for (let j = i + 1; j < ms.length; j++) if (ms[i]![0] !== ms[j]![0]) sets.push([ms[i]!, ms[j]!]);
  return sets;
}

/** The backend pid of `c`. */
export async function pidOf(c: pg.ClientBase): Promise<number> {
  return (await c.query<{ p: number }>('SELECT pg_backend_pid() AS p')).rows[0]!.p;
}

async function waitingOnLock(pool: pg.Pool, pid: number): Promise<boolean> {
  const r = await pool.query(`SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, [pid]);
  return r.rowCount === 1;
}

/**
 * Invariant 1: `first` appends on the lane and holds its lock to commit; `second`, on the same
 * lane from a transaction whose snapshot predates the first append, waits for that commit and
 * lands behind it.
 */
export async function assertLaneLockOrder(
  pool: pg.Pool,
  schema: string,
  level: string,
  first: string,
  second: string,
): Promise<void> {
  const a = await pool.connect();
  const b = await pool.connect();
  try {
    await a.query(`BEGIN ISOLATION LEVEL ${level}`);
    await b.query(`BEGIN ISOLATION LEVEL ${level}`);
    // b's snapshot is taken before a appends (the REPEATABLE READ / SERIALIZABLE case of invariant 2).
    await b.query('SELECT 1');
    const idA = (await a.query(first)).rows[0]!.id as string;
    const pidB = await pidOf(b);
    let done = false;
    const pb = b.query(second).then((r) => {
      done = true;
      return r.rows[0]!.id as string;
    });
    await waitFor(() => waitingOnLock(pool, pidB), 30_000, 'the second append waiting on the lane lock');
    assert.equal(done, false);
    await a.query('COMMIT');
    const idB = await pb;
    await b.query('COMMIT');
    const seqs = await pool.query<{ id: string }>(
      `SELECT id::text FROM ${quoteIdent(schema)}.ready WHERE id IN ($1, $2) ORDER BY lane_seq`,
      [idA, idB],
    );
    assert.deepEqual(
      seqs.rows.map((r) => r.id),
      [idA, idB],
    );
  } finally {
    await a.query('ROLLBACK').catch(() => undefined);
    await b.query('ROLLBACK').catch(() => undefined);
    a.release();
    b.release();
  }
}

/**
 * Two producers append `call` (the same statement) on queue `queue`'s lane that does not exist
 * yet, at once: whether the second succeeds (or its error), how many lanes the queue has, and
 * the order of their tasks ('a' the first).
 */
export async function newLaneRace(
  pool: pg.Pool,
  schema: string,
  level: string,
  queue: string,
  call: string,
): Promise<{ b: unknown; lanes: number; order: string[] }> {
  const S = quoteIdent(schema);
  const a = await pool.connect();
  const b = await pool.connect();
  try {
    await a.query(`BEGIN ISOLATION LEVEL ${level}`);
    await b.query(`BEGIN ISOLATION LEVEL ${level}`);
    await b.query('SELECT 1');
    const idA = (await a.query(call)).rows[0]!.id as string;
    const pidB = await pidOf(b);
    const pb = b.query(call).then(
      (r) => ({ id: r.rows[0]!.id as string }),
      (err: { code?: string; message: string }) => ({ error: err.code, message: err.message }),
    );
    await waitFor(() => waitingOnLock(pool, pidB), 30_000, 'the second producer waiting');
    await a.query('COMMIT');
    const rb = await pb;
    await b.query('id' in rb ? 'COMMIT' : 'ROLLBACK');
    const lanes = await pool.query(`SELECT count(*)::int AS n FROM ${S}.lanes WHERE queue = $1`, [queue]);
    const order = await pool.query<{ id: string }>(
      `SELECT r.id::text FROM ${S}.ready r JOIN ${S}.lanes l USING (lane_id) WHERE l.queue = $1 ORDER BY r.lane_seq`,
      [queue],
    );
    return {
      b: 'id' in rb ? 'ok' : rb,
      lanes: lanes.rows[0]!.n as number,
      order: order.rows.map((r) => (r.id === idA ? 'a' : 'b')),
    };
  } finally {
    await a.query('ROLLBACK').catch(() => undefined);
    await b.query('ROLLBACK').catch(() => undefined);
    a.release();
    b.release();
  }
}

/**
 * Runs `body` with a test-only trigger on `ready` that advances the ring epoch after an INSERT
 * while the transaction's `berth_test.rotations` setting is above zero (it counts down), as
 * rotations committing between an append's INSERT and its second read would; then drops it and
 * puts the epoch back.
 */
export async function withRotatingInserts(pool: pg.Pool, schema: string, body: () => Promise<void>): Promise<void> {
  const S = quoteIdent(schema);
  await pool.query(`CREATE FUNCTION ${S}.test_rotate() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE n integer := coalesce(nullif(current_setting('berth_test.rotations', true), ''), '0')::integer;
    BEGIN
      IF n > 0 THEN
        PERFORM set_config('berth_test.rotations', (n - 1)::text, true);
        PERFORM nextval('${S}.ring_epoch');
      END IF;
      RETURN NULL;
    END $f$`);
  await pool.query(`CREATE TRIGGER test_rotate AFTER INSERT ON ${S}.ready FOR EACH STATEMENT
                    EXECUTE FUNCTION ${S}.test_rotate()`);
  const epoch0 = (await pool.query(`SELECT last_value::text AS v FROM ${S}.ring_epoch`)).rows[0]!.v as string;
  try {
    await body();
  } finally {
    await pool.query(`DROP TRIGGER test_rotate ON ${S}.ready`);
    await pool.query(`DROP FUNCTION ${S}.test_rotate()`);
    await pool.query(`SELECT setval('${S}.ring_epoch', $1::bigint)`, [epoch0]);
  }
}

/** The wake channel's notifications sent by what `body` commits (every one delivered before a marker sent after it). */
export async function wakesOf(
  pool: pg.Pool,
  schema: string,
  body: (c: pg.PoolClient) => Promise<void>,
): Promise<string[]> {
  const listener = new pg.Client({ connectionString: DATABASE_URL });
  await listener.connect();
  const got: string[] = [];
  listener.on('notification', (m) => got.push(m.payload ?? ''));
  try {
    await listener.query(`LISTEN ${quoteIdent(`${schema}.wake`)}`);
    const c = await pool.connect();
    try {
      await body(c);
      // A marker committed after: everything before it has been delivered when it arrives.
      await c.query(`SELECT pg_notify($1, 'marker')`, [`${schema}.wake`]);
    } finally {
      c.release();
    }
    await waitFor(() => got.includes('marker'), 30_000, 'the marker notification');
    return got.filter((x) => x !== 'marker');
  } finally {
    await listener.end();
  }
}
