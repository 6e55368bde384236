/**
 * The settle-and-move tail that fail (processor), return (processor: release, AdvanceCursor,
 * hand-back) and rescue (maintenance) end with: once the settlement row has won the fence, the
 * task leaves the ring for the dead letters or for deferred storage, and a buried task frees
 * its dedupe key. Written once here; each caller's statement splices it in after its own `src`
 * CTE, so each path stays one statement (docs/architecture.md, "Every transition is one
 * statement").
 */

/** The columns a settled entry carries to `dead_letters` or `deferred`. */
export const MOVE_COLUMNS = `id, type, payload, queue, priority, shard, attempts, max_attempts, dedupe_key,
  last_error, created_at, last_attempted_at, trace_context`;

/**
 * The tail's CTEs, to follow a `src` CTE (MATERIALIZED, so the moves read it once) that selects
 * every MOVE_COLUMNS column plus `dead` (boolean: bury instead of retry) for each settlement won.
 *
 * - `buried`: a dead letter replaces an older one of the same task (a task retried out of the
 *   dead letters dies again under the same id).
 * - `retried`: back to deferred, `retryable`, due at `runAt` (an SQL expression over `src`).
 *   `ON CONFLICT (id) DO NOTHING`: a task already deferred can only be a duplicate copy, and one
 *   colliding row must never fail a settlement batch or wedge rescue for every lapsed lease
 *   behind it.
 * - `freed`: a dead letter never holds a dedupe key (a retried task keeps its own).
 *
 * `s` is the quoted schema. The caller's final SELECT reads `src` for its result.
 */
export function settleAndMove(s: string, runAt: string): string {
  return `buried AS (
       INSERT INTO ${s}.dead_letters (${MOVE_COLUMNS})
       SELECT ${MOVE_COLUMNS} FROM src WHERE dead
       ON CONFLICT (id) DO UPDATE SET
         payload = EXCLUDED.payload, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
         last_attempted_at = EXCLUDED.last_attempted_at, died_at = now()
       RETURNING id
     ), retried AS (
       INSERT INTO ${s}.deferred (state, run_at, ${MOVE_COLUMNS})
       SELECT 'retryable', ${runAt}, ${MOVE_COLUMNS} FROM src WHERE NOT dead
       ON CONFLICT (id) DO NOTHING
     ), freed AS (
       DELETE FROM ${s}.dedupe d USING buried WHERE d.id = buried.id
     )`;
}
