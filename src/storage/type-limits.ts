import type { Queryable } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * Task type rate limits (`type_limits`, migration 30): at most `rate_limit` starts of a task type
 * per `rate_interval_ms`, across every worker. A type shares its lanes with other types, so the
 * limit is taken where a task starts, not where it is claimed: the worker asks
 * `take_type_starts()` before it starts a task of a limited type (processor/type-rate-gate.ts),
 * and hands a refused task back unstarted. docs/architecture.md, "Type rate limits".
 */

/** What `take_type_starts()` answers for a call asking `n` starts. */
export interface TypeStarts {
  /** The first `granted` of the starts asked may start now (all of them when the type has no limit). */
  granted: number;
  /** How long after the grant a task may still start; null when the type has no limit. */
  guardMs: number | null;
  /** The first refused start may come back in this many ms, each next one `stepMs` later. */
  retryMs: number | null;
  stepMs: number | null;
}

/**
 * Ask for the starts of tasks `ids` of `type` (in the order they would start): one statement,
 * which holds the type's limit row while it runs. The first `granted` may start.
 */
export async function takeTypeStarts(
  db: Queryable,
  storage: Storage,
  type: string,
  ids: readonly string[],
): Promise<TypeStarts> {
  const statement = storage.statement('type-starts', ({ q: s }) =>
    compile(
      sql`SELECT granted, guard_ms, retry_ms, step_ms FROM ${s}.take_type_starts(${p('type')}::text, ${p('ids')}::bigint[])`,
    ),
  );
  const res = await db.query<{
    granted: number;
    guard_ms: number | null;
    retry_ms: number | null;
    step_ms: number | null;
  }>(statement.query({ type, ids }));
  const row = res.rows[0];
  return {
    granted: row?.granted ?? ids.length,
    guardMs: row?.guard_ms ?? null,
    retryMs: row?.retry_ms ?? null,
    stepMs: row?.step_ms ?? null,
  };
}

/** A type's rate limit and how full it is. */
export interface TypeLimitUsage {
  type: string;
  rateLimit: number;
  rateIntervalMs: number;
  /** Starts within the window a start is counted over (the interval plus its guard). */
  started: number;
  /** Starts refused since the limit was set (each a task handed back unstarted). */
  refused: number;
  /** Tasks the limit refused and handed back that are not due again yet. */
  paced: number;
  /** The window is full: the next task of the type to start is handed back. */
  atLimit: boolean;
  updatedAt: Date;
  updatedBy: string;
}

export async function typeLimitUsage(db: Queryable, storage: Storage): Promise<TypeLimitUsage[]> {
  const statement = storage.statement('type-limit-usage', ({ q: s }) =>
    compile(
      sql`SELECT type, rate_limit, rate_interval_ms, started, refused, paced, updated_at, updated_by
            FROM ${s}.type_limit_usage()`,
    ),
  );
  const res = await db.query<{
    type: string;
    rate_limit: number;
    rate_interval_ms: number;
    started: number;
    refused: string;
    paced: number;
    updated_at: Date;
    updated_by: string;
  }>(statement.query({}));
  return res.rows.map((r) => ({
    type: r.type,
    rateLimit: r.rate_limit,
    rateIntervalMs: r.rate_interval_ms,
    started: r.started,
    refused: Number(r.refused),
    paced: r.paced,
    atLimit: r.started >= r.rate_limit,
    updatedAt: r.updated_at,
    updatedBy: r.updated_by,
  }));
}

/** Set (`rate`) or clear (null) a type's rate limit. Returns whether the type had one before. */
export async function setTypeLimitRow(
  db: Queryable,
  storage: Storage,
  type: string,
  rate: { limit: number; intervalMs: number } | null,
  actor: string,
): Promise<boolean> {
  const statement = storage.statement('type-limit-set', ({ q: s }) =>
    compile(
      sql`SELECT ${s}.set_type_limit(${p('type')}::text, ${p('limit')}::integer, ${p('intervalMs')}::integer,
                                    ${p('actor')}::text) AS had`,
    ),
  );
  const res = await db.query<{ had: boolean }>(
    statement.query({ type, limit: rate?.limit ?? null, intervalMs: rate?.intervalMs ?? null, actor }),
  );
  return res.rows[0]?.had ?? false;
}

/**
 * Make due the tasks a limit refused that no limit holds any more (a type whose limit was cleared
 * or changed after their refusal); every type when `type` is null (the leader's rescue branch).
 * Returns how many were made due.
 */
export async function releasePaced(db: Queryable, storage: Storage, type: string | null): Promise<number> {
  const statement = storage.statement('type-paced-release', ({ q: s }) =>
    compile(sql`SELECT ${s}.release_paced(${p('type')}::text) AS n`),
  );
  const res = await db.query<{ n: number }>(statement.query({ type }));
  return res.rows[0]?.n ?? 0;
}
