import type { Queryable, Schema } from '../sql.js';
import { compile, p, type Sql, sql } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * Task results: the value a handler returned, as JSON, stored by the completion that settles
 * the task (`task_results`, migration 24). Only a completion whose batch carries a result sends
 * the statements that write here (complete.ts): a completion without one sends the statement
 * it always did.
 */

/** How long a stored result is kept by default (the maintenance option `resultRetentionMs`): 7 days. */
export const DEFAULT_RESULT_RETENTION_MS = 7 * 24 * 3600 * 1000;

/** A completion's result as the completion statements take it: the JSON text, already checked. */
export type ResultJson = string;

/** The parameters the result CTE binds: one element per result, in any order. */
export type ResultParams = 'resultLaneIds' | 'resultSeqs' | 'results';

/** The entries of a completion batch that carry a result, as the result CTE binds them. */
export function resultValues(entries: readonly { laneId: number; laneSeq: string; result: ResultJson }[]): {
  [K in ResultParams]: unknown;
} {
  return {
    resultLaneIds: entries.map((e) => e.laneId),
    resultSeqs: entries.map((e) => e.laneSeq),
    results: entries.map((e) => e.result),
  };
}

/**
 * CTE `kept`: the results of the entries whose completion won (`done`, complete.ts's
 * `wonEntries`), stored under their task's id with the attempt that completed it. A data-modifying
 * CTE runs whether or not anything reads it; it reads only `done`, so an entry whose completion
 * the fence refused stores nothing. A task completes once, so the conflict arm only matters for
 * a statement that somehow completes an id again (a later completion's result replaces the one
 * it supersedes rather than failing the batch).
 */
export function storedResults(s: string): Sql<ResultParams> {
  return sql`kept AS (
       INSERT INTO ${s}.task_results (id, attempt, result)
       SELECT d.id, d.attempt, v.result::jsonb
         FROM done d
         JOIN unnest(${p('resultLaneIds')}::integer[], ${p('resultSeqs')}::bigint[], ${p('results')}::text[])
                AS v(lane_id, lane_seq, result)
           ON v.lane_id = d.lane_id AND v.lane_seq = d.lane_seq
       ON CONFLICT (id) DO UPDATE SET attempt = excluded.attempt, result = excluded.result, stored_at = excluded.stored_at
     )`;
}

/** A task's stored result; `undefined` when none is stored (it returned nothing, or retention removed it). */
export async function resultOf(db: Queryable, storage: Storage, id: string): Promise<unknown> {
  const res = await db.query<{ result: unknown }>(storage.statement('task-result', resultStatement).query({ id }));
  return res.rows.length === 0 ? undefined : res.rows[0]!.result;
}

function resultStatement({ q: s }: Schema) {
  return compile(sql`SELECT result FROM ${s}.task_results WHERE id = ${p('id')}::bigint`);
}

/**
 * Delete results stored longer ago than `retentionMs`, at most `batch` a statement (the leader's
 * retention branch, through `stored_at`'s index), until fewer than a batch are left or `signal`
 * says the leader stepped down. Returns the rows removed.
 */
export async function pruneResults(
  db: Queryable,
  storage: Storage,
  retentionMs: number,
  batch = 5000,
  signal?: AbortSignal,
): Promise<number> {
  const statement = storage.statement('prune-results', pruneStatement);
  let total = 0;
  for (;;) {
    const res = await db.query(statement.query({ retentionMs, batch }));
    const n = res.rowCount ?? 0;
    total += n;
    if (n < batch || signal?.aborted) return total;
  }
}

/**
 * The batch's ids as an array (`= ANY (ARRAY(…))`), so the delete probes the primary key for
 * them. Written as `id IN (SELECT …)` the planner made it a hash semi-join over a seq scan of
 * the whole table, every batch: 1.2 s a batch of 5,000 at a million results, 70 ms this way.
 */
function pruneStatement({ q: s }: Schema) {
  return compile(
    sql`DELETE FROM ${s}.task_results
         WHERE id = ANY (ARRAY(SELECT id FROM ${s}.task_results
                                WHERE stored_at < now() - make_interval(secs => ${p('retentionMs')}::float8 / 1000.0)
                                  -- A parent's result stays while an edge names it: its dependents read it.
                                  AND NOT EXISTS (SELECT 1 FROM ${s}.task_deps d WHERE d.parent_id = task_results.id)
                                ORDER BY stored_at
                                LIMIT ${p('batch')}::integer))`,
  );
}
