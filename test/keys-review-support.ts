/**
 * Shared by the keys-review-*.test.ts repros (a review of concurrency keys, migration 29): the
 * SQL doors they drive directly, so each race can be staged statement by statement from two
 * sessions. No node:test import.
 */
import pg from 'pg';
import { DATABASE_URL } from './helpers.js';

/** A worker session's settings (src/process/worker-pools.ts SESSION_OPTIONS): the plans the fleet gets. */
export const WORKER_SESSION =
  '-c jit=off -c plan_cache_mode=force_generic_plan -c enable_bitmapscan=off -c enable_seqscan=off';

export async function client(options = '-c jit=off'): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: DATABASE_URL, options });
  await c.connect();
  c.on('error', () => undefined);
  return c;
}

export interface KeyedSpec {
  queue?: string;
  priority?: number;
  shard?: number | null;
  type?: string;
  runAt?: Date | null;
  dedupe?: string | null;
}

/** `enqueue_keyed()` called as the producer calls it, one lane, one task per key in `keys`. */
export async function enqueueKeyed(
  db: pg.ClientBase | pg.Pool,
  S: string,
  keys: readonly string[],
  spec: KeyedSpec = {},
): Promise<{ id: string | null; state: string; duplicate_of: string | null }[]> {
  const n = keys.length;
  const r = await db.query(
    `SELECT id::text, state, duplicate_of::text FROM ${S}.enqueue_keyed($1, $2::smallint, $3::smallint, 16::smallint,
       array_fill($4::text, ARRAY[$5::int]), array_fill('{}'::jsonb, ARRAY[$5::int]),
       CASE WHEN $6::timestamptz IS NULL THEN NULL ELSE array_fill($6::timestamptz, ARRAY[$5::int]) END,
       NULL, CASE WHEN $7::text IS NULL THEN NULL ELSE array_fill($7::text, ARRAY[$5::int]) END, NULL, $8::text[])
      ORDER BY ord`,
    [
      spec.queue ?? 'kq',
      spec.priority ?? 0,
      spec.shard === undefined ? 0 : spec.shard,
      spec.type ?? 'kt',
      n,
      spec.runAt ?? null,
      spec.dedupe ?? null,
      keys,
    ],
  );
  return r.rows;
}

/** promote_held(keys), as the leader (null: every key) or a releasing worker calls it. */
export async function promoteHeldSql(db: pg.ClientBase | pg.Pool, S: string, keys: string[] | null): Promise<number> {
  return (await db.query(`SELECT admitted AS n FROM ${S}.promote_held($1::text[], NULL)`, [keys])).rows[0].n;
}

/** Tasks of `key` whose ring entry stands (admitted, not settled): what the limit bounds. */
export async function liveOfKey(db: pg.ClientBase | pg.Pool, S: string, key: string): Promise<number> {
  return (
    await db.query(
      `SELECT count(*)::int AS n FROM ${S}.task_keys tk WHERE tk.key = $1 AND ${S}.key_entry_live(tk.id)`,
      [key],
    )
  ).rows[0].n;
}

/** The task's state as storage holds it: held/scheduled/retryable (deferred), ready (a live entry), gone. */
export async function where(db: pg.ClientBase | pg.Pool, S: string, id: string): Promise<string> {
  const r = await db.query(
    `SELECT coalesce((SELECT state FROM ${S}.deferred WHERE id = $1),
                     (SELECT 'dead' FROM ${S}.dead_letters WHERE id = $1),
                     CASE WHEN ${S}.key_entry_live($1) THEN 'ready' END, 'gone') AS s`,
    [id],
  );
  return r.rows[0].s;
}

/** Free the keys of admitted tasks the way a settlement does (their entries stop standing): cancel them. */
export async function settle(db: pg.ClientBase | pg.Pool, S: string, ids: readonly string[]): Promise<void> {
  await db.query(`SELECT count(*) FROM ${S}.cancel_tasks($1::bigint[], 'keys-review')`, [ids]);
}

/** Move a deferred task to the dead letters, as a worker's final failure would leave it. */
export async function bury(db: pg.ClientBase | pg.Pool, S: string, id: string): Promise<void> {
  await db.query(
    `WITH d AS (DELETE FROM ${S}.deferred WHERE id = $1 RETURNING *)
     INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
                                    last_error, created_at, last_attempted_at)
     SELECT id, type, payload, queue, priority, shard, 1, max_attempts, dedupe_key, 'boom', created_at, now() FROM d`,
    [id],
  );
}

/** Ids of `key`'s tasks with a standing entry. */
export async function liveIds(db: pg.ClientBase | pg.Pool, S: string, key: string): Promise<string[]> {
  const r = await db.query(
    `SELECT tk.id::text AS id FROM ${S}.task_keys tk WHERE tk.key = $1 AND ${S}.key_entry_live(tk.id) ORDER BY tk.id`,
    [key],
  );
  return r.rows.map((x) => x.id);
}

/** Wait until backend `pid` waits on a lock (an advisory lock, a transaction): it is blocked. */
export async function waitingOnLock(db: pg.Pool, pid: number, timeoutMs = 20_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await db.query(`SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = $1`, [pid]);
    const row = r.rows[0];
    if (row?.wait_event_type === 'Lock') return String(row.wait_event);
    if (Date.now() > deadline) throw new Error(`backend ${pid} never waited on a lock`);
    await new Promise((res) => setTimeout(res, 20));
  }
}

/** Whether backend `pid` is waiting on a lock now. */
export async function isWaiting(db: pg.Pool, pid: number): Promise<boolean> {
  const r = await db.query(`SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, [pid]);
  return r.rows[0]?.wait_event_type === 'Lock';
}

/** The pg backend pid of a connected client. */
export function pidOf(c: pg.Client): number {
  return (c as unknown as { processID: number }).processID;
}
