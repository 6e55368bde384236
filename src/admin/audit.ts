import { notMigrated } from '../errors.js';
import { checkKeys } from '../limits.js';
import type { Queryable } from '../sql.js';
import type { Logger } from '../logger.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from '../storage/storage.js';

/** Who did an operator action, and through what: `cli:alice`, `dashboard:ops@example.com`. */
export type Actor = string;

export interface AuditEntry {
  id: string;
  at: Date;
  actor: string;
  action: string;
  target: unknown;
  result: unknown;
}

/**
 * Run an operator action and record it: one row in `audit_log` and one structured log line,
 * whether it succeeded or failed. The action's own statements commit first (most are one
 * statement); a failure to write the audit row is logged, never turned into a failed action,
 * because the action has already happened.
 */
export async function audited<T>(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: Actor,
  action: string,
  target: Record<string, unknown>,
  run: () => Promise<T>,
): Promise<T> {
  let result: unknown;
  try {
    const value = await run();
    result = value;
    return value;
  } catch (err) {
    result = { error: (err as Error).message };
    throw err;
  } finally {
    const summary = summarise(result);
    logger?.info({ actor, action, target, result: summary }, 'operator action');
    try {
      // Bound here, inside the try: a schema that cannot be bound is an audit row not written
      // (logged), as any other failure to write it, never a failed action.
      await writeAuditRow(db, storageFor(schema), actor, action, target, summary);
    } catch (err) {
      logger?.error({ err: (err as Error).message, actor, action }, 'could not write the audit log row');
    }
  }
}

async function writeAuditRow(
  db: Queryable,
  storage: Storage,
  actor: Actor,
  action: string,
  target: Record<string, unknown>,
  summary: unknown,
): Promise<void> {
  await db.query(
    storage
      .statement('admin-audit-insert', ({ q: s }) =>
        positional(`INSERT INTO ${s}.audit_log (actor, action, target, result) VALUES ($1, $2, $3, $4)`, [
          'actor',
          'action',
          'target',
          'result',
        ]),
      )
      .query({ actor, action, target: JSON.stringify(target), result: JSON.stringify(summary ?? null) }),
  );
}

/** Large results (a list of 100k ids) are recorded as counts, not copied into the log. */
function summarise(result: unknown): unknown {
  if (Array.isArray(result)) return { items: result.length };
  return result;
}

const AUDIT_PAGE_KEYS: ReadonlySet<string> = new Set(['limit', 'before']);

/** Newest first; `before` is the id of the last entry of the previous page. */
export async function listAudit(
  db: Queryable,
  schema: string,
  page: { limit?: number; before?: string } = {},
): Promise<AuditEntry[]> {
  try {
    const storage = storageFor(schema);
    checkKeys(page, AUDIT_PAGE_KEYS, 'listAudit page');
    const statement = storage.statement('admin-audit-list', ({ q: s }) =>
      positional(
        // a.id, not the text output column: the page is in numeric order and the PK serves it.
        `SELECT a.id::text AS id, a.at, a.actor, a.action, a.target, a.result FROM ${s}.audit_log a
        WHERE ($1::bigint IS NULL OR a.id < $1) ORDER BY a.id DESC LIMIT $2`,
        ['before', 'limit'],
      ),
    );
    const res = await db.query<AuditEntry>(
      statement.query({ before: page.before ?? null, limit: Math.min(Math.max(page.limit ?? 50, 1), 500) }),
    );
    return res.rows;
  } catch (err) {
    throw notMigrated(err, schema);
  }
}
