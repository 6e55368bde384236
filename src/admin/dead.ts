import { checkKeys, checkNameFilter, checkText } from '../limits.js';
import { BerthInputError, notMigrated, orNotMigrated } from '../errors.js';
import type { Queryable } from '../sql.js';
import { type Args, compile, p, positional, sql } from '../statement.js';
import { deadRowPredicate } from '../storage/predicates.js';
import { storageFor, type Storage } from '../storage/storage.js';
import { taskId } from '../storage/ids.js';

/**
 * Which dead letters a bulk action applies to. A bulk action needs at least one filter or an
 * explicit `all: true`: an empty filter is refused, never read as "everything".
 */
export interface DeadFilter {
  queue?: string;
  type?: string;
  /** Only dead letters whose last error contains this text (case-insensitive). */
  errorContains?: string;
  /** Only ones that died before this time. */
  diedBefore?: Date;
  /** Exactly these ids. */
  ids?: readonly string[];
  all?: boolean;
}

const FILTER_KEYS: ReadonlySet<string> = new Set<keyof DeadFilter>([
  'queue',
  'type',
  'errorContains',
  'diedBefore',
  'ids',
  'all',
]);
const PAGE_KEYS: ReadonlySet<string> = new Set(['limit', 'after']);

export interface DeadLetter {
  id: string;
  type: string;
  queue: string;
  priority: number;
  attempts: number;
  /** The task's own attempt limit; null: its type's. */
  maxAttempts: number | null;
  lastError: string | null;
  payload: unknown;
  createdAt: Date;
  diedAt: Date;
}

export interface BulkProgress {
  done: number;
  total: number;
}

export interface BulkResult {
  matched: number;
  /** retried, or purged. */
  changed: number;
  /** Dead letters left alone because a live task holds their dedupe key (retry only). */
  duplicates: number;
}

function assertBulkScope(f: DeadFilter): void {
  // An empty string is no filter (strpos(x, '') matches every row): refuse it rather than read
  // it as "everything".
  for (const [name, v] of [
    ['queue', f.queue],
    ['type', f.type],
    ['error', f.errorContains],
  ] as const) {
    if (v !== undefined && v.trim() === '') throw new BerthInputError(`the ${name} filter must not be empty`);
  }
  if (f.ids !== undefined && f.ids.length === 0) throw new BerthInputError('the ids filter must name at least one id');
  if (f.diedBefore !== undefined && Number.isNaN(f.diedBefore.getTime()))
    throw new BerthInputError('diedBefore must be a valid time');
  const scoped =
    f.queue !== undefined ||
    f.type !== undefined ||
    f.errorContains !== undefined ||
    f.diedBefore !== undefined ||
    f.ids !== undefined;
  if (!scoped && !f.all) {
    throw new BerthInputError(
      'a bulk dead-letter action needs a filter (queue, type, error, died before, ids) or all (--all on the CLI)',
    );
  }
  for (const id of f.ids ?? []) taskId(id);
}

/**
 * The WHERE clause for a filter, over alias `d`: one text for every filter, an absent field a
 * NULL parameter (see `filterArgs`).
 */
const WHERE = sql`(${p('queue')}::text IS NULL OR d.queue = ${p('queue')}) AND (${p('type')}::text IS NULL OR d.type = ${p('type')})
          AND (${p('errorContains')}::text IS NULL OR strpos(lower(d.last_error), lower(${p('errorContains')})) > 0)
          AND (${p('diedBefore')}::timestamptz IS NULL OR d.died_at < ${p('diedBefore')})
          AND (${p('ids')}::bigint[] IS NULL OR d.id = ANY (${p('ids')}::bigint[]))`;

type FilterParams = 'queue' | 'type' | 'errorContains' | 'diedBefore' | 'ids';

/** The values of WHERE's parameters for a filter. */
function filterArgs(f: DeadFilter): Args<FilterParams> {
  checkKeys(f, FILTER_KEYS, 'dead-letter filter');
  checkNameFilter(f, 'dead-letter filter');
  // Any length is a fair substring to look for; NUL or a lone surrogate is not text PostgreSQL takes.
  if (f.errorContains !== undefined)
    checkText(f.errorContains, 'errorContains', 'dead-letter filter', { maxChars: Number.MAX_SAFE_INTEGER });
  return {
    queue: f.queue ?? null,
    type: f.type ?? null,
    errorContains: f.errorContains ?? null,
    diedBefore: f.diedBefore ?? null,
    ids: f.ids ? [...f.ids] : null,
  };
}

/** Newest first, keyset-paginated by id (`after`: the last id of the previous page). */
export async function listDead(
  db: Queryable,
  schema: string,
  filter: Omit<DeadFilter, 'all'> = {},
  page: { limit?: number; after?: string } = {},
): Promise<{ deadLetters: DeadLetter[]; next: string | null }> {
  try {
    const storage = storageFor(schema);
    // `all` is a bulk action's scope; a list ignores it (the CLI builds one filter for both).
    checkKeys(filter, FILTER_KEYS, 'listDead filter');
    checkKeys(page, PAGE_KEYS, 'listDead page');
    const limit = page.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 500)
      throw new BerthInputError('limit must be an integer from 1 to 500');
    if (page.after !== undefined) taskId(page.after, 'page cursor');
    const args = filterArgs(filter);
    const statement = storage.statement('admin-dead-list', ({ q: s }) =>
      compile(
        sql`SELECT d.id::text, d.type, d.queue, d.priority, d.attempts, d.max_attempts, d.last_error, d.payload, d.created_at, d.died_at
         FROM ${s}.dead_letters d
        WHERE ${WHERE} AND (${p('after')}::bigint IS NULL OR d.id < ${p('after')})
        ORDER BY d.id DESC LIMIT ${p('limit')}`,
      ),
    );
    const res = await db.query<{
      id: string;
      type: string;
      queue: string;
      priority: number;
      attempts: number;
      max_attempts: number | null;
      last_error: string | null;
      payload: unknown;
      created_at: Date;
      died_at: Date;
    }>(statement.query({ ...args, after: page.after ?? null, limit: limit + 1 }));
    const rows = res.rows.slice(0, limit);
    return {
      deadLetters: rows.map((r) => ({
        id: r.id,
        type: r.type,
        queue: r.queue,
        priority: r.priority,
        attempts: r.attempts,
        maxAttempts: r.max_attempts,
        lastError: r.last_error,
        payload: r.payload,
        createdAt: r.created_at,
        diedAt: r.died_at,
      })),
      next: res.rows.length > limit ? rows[rows.length - 1]!.id : null,
    };
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

/** How many dead letters a filter matches (what a bulk action will touch). */
export async function countDead(db: Queryable, schema: string, filter: DeadFilter): Promise<number> {
  try {
    return await countDeadIn(db, storageFor(schema), filter);
  } catch (err) {
    throw notMigrated(err, schema);
  }
}

async function countDeadIn(db: Queryable, storage: Storage, filter: DeadFilter): Promise<number> {
  const args = filterArgs(filter);
  const r = await db.query<{ n: string }>(
    storage
      .statement('admin-dead-count', ({ q: s }) =>
        compile(sql`SELECT count(*)::text AS n FROM ${s}.dead_letters d WHERE ${WHERE}`),
      )
      .query(args),
  );
  return Number(r.rows[0]!.n);
}

/** Retry these dead letters (see `retry_dead` in migration 5), in one statement. */
export async function retryDeadLetters(
  db: Queryable,
  schema: string,
  ids: readonly string[],
): Promise<{ id: string; result: 'retried' | 'duplicate' | 'not_found' }[]> {
  for (const id of ids) taskId(id);
  return orNotMigrated(schema, () => retryDeadLettersIn(db, storageFor(schema), ids));
}

/** retryDeadLetters on a bound storage. */
export async function retryDeadLettersIn(
  db: Queryable,
  storage: Storage,
  ids: readonly string[],
): Promise<{ id: string; result: 'retried' | 'duplicate' | 'not_found' }[]> {
  for (const id of ids) taskId(id);
  if (ids.length === 0) return [];
  const r = await db.query<{ id: string; result: 'retried' | 'duplicate' | 'not_found' }>(
    storage
      .statement('admin-dead-retry', ({ q: s }) =>
        positional(`SELECT id::text, result FROM ${s}.retry_dead($1::bigint[])`, ['ids']),
      )
      .query({ ids: [...ids] }),
  );
  return r.rows;
}

const BULK_BATCH = 1000;

type BulkRun = (
  db: Queryable,
  storage: Storage,
  filter: DeadFilter,
  onProgress?: (p: BulkProgress) => void,
) => Promise<BulkResult>;

/** A bulk action's public door: its filter checked first, a schema nobody migrated named as such. */
function bulkDoor(
  db: Queryable,
  schema: string,
  filter: DeadFilter,
  onProgress: ((p: BulkProgress) => void) | undefined,
  run: BulkRun,
): Promise<BulkResult> {
  assertBulkScope(filter);
  return orNotMigrated(schema, () => run(db, storageFor(schema), filter, onProgress));
}

/** What every bulk action does first: refuse an unscoped filter, count what it will touch. */
async function startBulk(db: Queryable, storage: Storage, filter: DeadFilter) {
  assertBulkScope(filter);
  const total = await countDeadIn(db, storage, filter);
  return { total, args: filterArgs(filter), out: { matched: total, changed: 0, duplicates: 0 } as BulkResult };
}

/**
 * Retry every dead letter a filter matches, in batches of 1,000 (one transaction each, oldest
 * first by id), reporting progress after each batch. A batch that commits stays committed if a
 * later one fails; running it again picks up what is left.
 */
export async function retryDead(
  db: Queryable,
  schema: string,
  filter: DeadFilter,
  onProgress?: (p: BulkProgress) => void,
): Promise<BulkResult> {
  return bulkDoor(db, schema, filter, onProgress, retryMatching);
}

const retryMatching: BulkRun = async (db, storage, filter, onProgress) => {
  const { total, args, out } = await startBulk(db, storage, filter);
  const statement = storage.statement('admin-dead-retry-batch', ({ q: s }) =>
    compile(
      sql`SELECT d.id::text FROM ${s}.dead_letters d
        WHERE ${WHERE} AND d.id > ${p('after')} ORDER BY d.id LIMIT ${p('limit')}`,
    ),
  );
  let after = '0';
  let done = 0;
  for (;;) {
    const batch = await db.query<{ id: string }>(statement.query({ ...args, after, limit: BULK_BATCH }));
    if (batch.rows.length === 0) break;
    const ids = batch.rows.map((r) => r.id);
    after = ids[ids.length - 1]!;
    for (const r of await retryDeadLettersIn(db, storage, ids)) {
      if (r.result === 'retried') out.changed++;
      else if (r.result === 'duplicate') out.duplicates++;
    }
    done += ids.length;
    onProgress?.({ done, total: Math.max(total, done) });
  }
  return out;
};

/**
 * Delete every dead letter a filter matches, in batches of 5,000, with the predicate the dead
 * gauge counts by (a dead letter whose id a live lease carries is not abandoned, so not purged).
 */
export async function purgeDead(
  db: Queryable,
  schema: string,
  filter: DeadFilter,
  onProgress?: (p: BulkProgress) => void,
): Promise<BulkResult> {
  return bulkDoor(db, schema, filter, onProgress, purgeMatching);
}

const purgeMatching: BulkRun = async (db, storage, filter, onProgress) => {
  const { total, args, out } = await startBulk(db, storage, filter);
  const statement = storage.statement('admin-dead-purge-batch', ({ q: s }) =>
    compile(
      sql`DELETE FROM ${s}.dead_letters WHERE id IN (
         SELECT d.id FROM ${s}.dead_letters d WHERE ${WHERE} AND ${deadRowPredicate(s)} LIMIT ${p('limit')})`,
    ),
  );
  for (;;) {
    const r = await db.query(statement.query({ ...args, limit: 5000 }));
    const n = r.rowCount ?? 0;
    out.changed += n;
    onProgress?.({ done: out.changed, total: Math.max(total, out.changed) });
    if (n < 5000) return out;
  }
};
