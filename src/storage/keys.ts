import type { Queryable } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * Concurrency keys (migration 29): at most K tasks with the same key in the ring or running,
 * across the fleet. A keyed task waits in deferred storage (`held`) until promote_held admits it
 * into its lane; the database counts each admitted task while its ring entry stands.
 * docs/architecture.md, "Concurrency keys".
 */

/**
 * Admit held tasks of `keys` (null: the keys with held tasks after `after`, in key order, at most
 * 1000 a call) up to their limits. Returns how many were admitted and the last key visited (null
 * when none was: the caller starts again from the first key).
 */
export async function promoteHeld(
  db: Queryable,
  storage: Storage,
  keys: readonly string[] | null,
  after: string | null = null,
): Promise<{ admitted: number; lastKey: string | null }> {
  const statement = storage.statement('keys-promote', ({ q: s }) =>
    compile(sql`SELECT admitted, last_key FROM ${s}.promote_held(${p('keys')}::text[], ${p('after')}::text)`),
  );
  const res = await db.query<{ admitted: number; last_key: string | null }>(statement.query({ keys, after }));
  return { admitted: res.rows[0]?.admitted ?? 0, lastKey: res.rows[0]?.last_key ?? null };
}

/** The worker's step after settling keyed tasks: admit the next held tasks of their keys. */
export async function releaseKeys(db: Queryable, storage: Storage, ids: readonly string[]): Promise<number> {
  if (ids.length === 0) return 0;
  const statement = storage.statement('keys-release', ({ q: s }) =>
    compile(sql`SELECT coalesce(${s}.release_keys(${p('ids')}::bigint[]), 0) AS n`),
  );
  const res = await db.query<{ n: number }>(statement.query({ ids }));
  return res.rows[0]?.n ?? 0;
}

/** The retention of keys of tasks that are gone: at most `limit` a call. */
export async function pruneTaskKeys(db: Queryable, storage: Storage, limit: number): Promise<number> {
  const statement = storage.statement('keys-prune', ({ q: s }) =>
    compile(sql`SELECT ${s}.prune_task_keys(${p('limit')}::integer) AS n`),
  );
  const res = await db.query<{ n: number }>(statement.query({ limit }));
  return res.rows[0]?.n ?? 0;
}

/** What a worker's fetcher reads once a poll (queueFlags). */
export interface QueueFlags {
  /** Queues with a limit: claimed through the limited claim. */
  limited: string[];
  /** Queues holding admitted keyed tasks: a settled task of one frees its key. */
  keyed: string[];
  /** Task types with a rate limit: a start of one is asked for (type-rate-gate.ts). */
  rateTypes: string[];
}

/**
 * Which queues are limited, which hold admitted keyed tasks and which task types are
 * rate-limited: what a worker's fetcher needs to route its claims, free keys and ask for starts.
 * One read of three small tables.
 */
export async function queueFlags(db: Queryable, storage: Storage): Promise<QueueFlags> {
  const statement = storage.statement('queue-flags', ({ q: s }) =>
    compile(
      sql`SELECT ARRAY(SELECT queue FROM ${s}.queue_limits ORDER BY queue) AS limited,
                 ARRAY(SELECT queue FROM ${s}.keyed_queues ORDER BY queue) AS keyed,
                 ARRAY(SELECT type FROM ${s}.type_limits ORDER BY type) AS rate_types`,
    ),
  );
  const res = await db.query<{ limited: string[]; keyed: string[]; rate_types: string[] }>(statement.query({}));
  const row = res.rows[0];
  return { limited: row?.limited ?? [], keyed: row?.keyed ?? [], rateTypes: row?.rate_types ?? [] };
}

/** A key limit: K for the tasks of a queue or of a task type. */
export interface KeyLimitRow {
  scope: 'queue' | 'type';
  name: string;
  perKey: number;
  updatedAt: Date;
  updatedBy: string;
}

export async function keyLimits(db: Queryable, storage: Storage): Promise<KeyLimitRow[]> {
  const statement = storage.statement('key-limits', ({ q: s }) =>
    compile(sql`SELECT scope, name, per_key, updated_at, updated_by FROM ${s}.key_limits ORDER BY scope, name`),
  );
  const res = await db.query<{
    scope: 'queue' | 'type';
    name: string;
    per_key: number;
    updated_at: Date;
    updated_by: string;
  }>(statement.query({}));
  return res.rows.map((r) => ({
    scope: r.scope,
    name: r.name,
    perKey: r.per_key,
    updatedAt: r.updated_at,
    updatedBy: r.updated_by,
  }));
}

/** Set (a number) or clear (null) a key limit, as `actor`: an operator's statement. */
export async function setKeyLimitRow(
  db: Queryable,
  storage: Storage,
  scope: 'queue' | 'type',
  name: string,
  perKey: number | null,
  actor: string,
): Promise<void> {
  const statement = storage.statement('key-limit-set', ({ q: s }) =>
    compile(
      sql`SELECT ${s}.set_key_limit(${p('scope')}::text, ${p('name')}::text, ${p('perKey')}::integer, ${p('actor')}::text)`,
    ),
  );
  await db.query(statement.query({ scope, name, perKey, actor }));
}

/** Held tasks per key (the most held first): what waits for its key. */
export interface HeldKey {
  key: string;
  held: number;
  running: number;
  since: Date;
}

export async function heldKeys(db: Queryable, storage: Storage, limit: number): Promise<HeldKey[]> {
  const statement = storage.statement('keys-held', ({ q: s }) =>
    compile(
      // The keys the leader lists (held_keys) and those held since its last tick (key_arrivals).
      sql`SELECT hk.key, hk.since,
                 (SELECT count(*) FROM ${s}.task_keys tk JOIN ${s}.deferred d ON d.id = tk.id
                   WHERE tk.key = hk.key AND d.state = 'held')::integer AS held,
                 (SELECT count(*) FROM ${s}.key_holders h
                   WHERE h.key = hk.key AND ${s}.key_entry_live(h.id))::integer AS running
            FROM (SELECT key, min(since) AS since
                    FROM (SELECT key, since FROM ${s}.held_keys
                          UNION ALL SELECT key, at FROM ${s}.key_arrivals) k
                   GROUP BY key) hk
           ORDER BY hk.since LIMIT ${p('limit')}`,
    ),
  );
  const res = await db.query<{ key: string; since: Date; held: number; running: number }>(statement.query({ limit }));
  return res.rows.map((r) => ({ key: r.key, held: r.held, running: r.running, since: r.since }));
}

/**
 * A held row's run_at is 'infinity' (every statement that holds a task writes both), so the
 * deferred (run_at, priority, id) index finds the held rows alone: a backlog of scheduled tasks
 * is never read. The state test is kept for a row the runtime role wrote with an infinite run_at.
 */
const HELD_ROWS = `d.run_at = 'infinity'::timestamptz AND d.state = 'held'`;

/** Held tasks per queue, and the keys they wait for: the leader's key gauges. */
export interface HeldSummary {
  heldByQueue: Map<string, number>;
  keysWaiting: number;
}

export async function heldSummary(db: Queryable, storage: Storage): Promise<HeldSummary> {
  const statement = storage.statement('keys-held-summary', ({ q: s }) =>
    compile(
      sql`SELECT d.queue, count(*)::integer AS held, NULL::integer AS keys
            FROM ${s}.deferred d WHERE ${HELD_ROWS} GROUP BY d.queue
          UNION ALL
          -- The keys of the held rows (the same rows as above, their keys by primary key).
          SELECT NULL, NULL, count(DISTINCT tk.key)::integer
            FROM ${s}.deferred d JOIN ${s}.task_keys tk ON tk.id = d.id WHERE ${HELD_ROWS}`,
    ),
  );
  const res = await db.query<{ queue: string | null; held: number | null; keys: number | null }>(statement.query({}));
  const summary: HeldSummary = { heldByQueue: new Map(), keysWaiting: 0 };
  for (const r of res.rows) {
    if (r.queue === null) summary.keysWaiting = r.keys ?? 0;
    else summary.heldByQueue.set(r.queue, r.held ?? 0);
  }
  return summary;
}

/**
 * The `top` keys with the most held tasks (ties: the longest waiting first): `berth stats`'s
 * keys section. Reads every held row's key once; a command's read, not a gauge's.
 */
export async function topHeldKeys(db: Queryable, storage: Storage, top: number): Promise<HeldKey[]> {
  const statement = storage.statement('keys-top-held', ({ q: s }) =>
    compile(
      sql`SELECT t.key, t.held, hk.since,
                 (SELECT count(*) FROM ${s}.key_holders h
                   WHERE h.key = t.key AND ${s}.key_entry_live(h.id))::integer AS running
            FROM (SELECT tk.key, count(*)::integer AS held
                    FROM ${s}.deferred d JOIN ${s}.task_keys tk ON tk.id = d.id
                   WHERE ${HELD_ROWS}
                   GROUP BY tk.key) t
            LEFT JOIN ${s}.held_keys hk ON hk.key = t.key
           ORDER BY t.held DESC, hk.since NULLS LAST, t.key
           LIMIT ${p('top')}`,
    ),
  );
  const res = await db.query<{ key: string; held: number; running: number; since: Date | null }>(
    statement.query({ top }),
  );
  // A held row whose key is not (yet) in held_keys is an enqueue's in flight: its wait starts now.
  return res.rows.map((r) => ({ key: r.key, held: r.held, running: r.running, since: r.since ?? new Date() }));
}
