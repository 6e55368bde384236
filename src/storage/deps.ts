import type { Queryable } from '../sql.js';
import { compile, p, sql } from '../statement.js';
import type { Storage } from './storage.js';

/**
 * Task dependencies (migration 31): a task that waits for other tasks (its parents) to complete.
 * A waiting task lives in deferred storage as `waiting`; `task_deps` holds the edges and
 * `task_waits` each waiting task's count of unfinished parents. The completion of a parent whose
 * entry is marked releases its dependents in the completion's own transaction
 * (`releaseCompleted`); the leader's `deps` branch looks at the rest (`depsTick`).
 * docs/architecture.md, "Task dependencies".
 */

/** Where a task stands for its dependents (the `task_fate()` function). */
export type TaskFate = 'pending' | 'completed' | 'dead' | 'cancelled' | 'deleted' | 'unknown';

/**
 * Count the completion of `parents` (those that did complete: verified in the caller's snapshot)
 * towards their dependents, and free the dependents whose last parent it was. Called by a
 * worker in its completion's transaction, after the fenced settlement. Returns how many
 * dependents it freed.
 */
export async function releaseCompleted(db: Queryable, storage: Storage, parents: readonly string[]): Promise<number> {
  if (parents.length === 0) return 0;
  const statement = storage.statement('deps-release', ({ q: s }) =>
    compile(sql`SELECT ${s}.release_completed(${p('parents')}::bigint[]) AS n`),
  );
  const res = await db.query<{ n: number }>(statement.query({ parents }));
  return res.rows[0]?.n ?? 0;
}

/** What one leader pass over dependency edges did. */
export interface DepsTick {
  released: number;
  cancelled: number;
  /** The last parent looked at, to go on from; null when the pass reached the end. */
  lastParent: string | null;
}

/**
 * The leader's look at the parents of watched edges (`all`: of every unsatisfied edge, the slow
 * sweep), at most `limit` parents after `after`: release the completed ones, apply the failure
 * policies of the dead, cancelled and deleted ones.
 */
export async function depsTick(
  db: Queryable,
  storage: Storage,
  opts: { all: boolean; after: string | null; limit: number },
): Promise<DepsTick> {
  const statement = storage.statement('deps-tick', ({ q: s }) =>
    compile(
      sql`SELECT released, cancelled, last_parent::text AS last_parent
            FROM ${s}.deps_tick(${p('all')}::boolean, ${p('after')}::bigint, ${p('limit')}::integer)`,
    ),
  );
  const res = await db.query<{ released: number; cancelled: number; last_parent: string | null }>(
    statement.query(opts),
  );
  const row = res.rows[0];
  return { released: row?.released ?? 0, cancelled: row?.cancelled ?? 0, lastParent: row?.last_parent ?? null };
}

/**
 * Tasks removed, cancelled, moved or whose dead letter was deleted: their dependents' edges are
 * watched, so the leader reads what became of them. An index probe for a task without dependents.
 */
export async function watchParents(db: Queryable, storage: Storage, ids: readonly string[]): Promise<number> {
  if (ids.length === 0) return 0;
  const statement = storage.statement('deps-watch', ({ q: s }) =>
    compile(sql`SELECT ${s}.watch_parents(${p('ids')}::bigint[]) AS n`),
  );
  const res = await db.query<{ n: number }>(statement.query({ ids }));
  return res.rows[0]?.n ?? 0;
}

/** One parent of a task, as its dependents and operators see it. */
export interface ParentRow {
  id: string;
  type: string;
  fate: TaskFate;
  satisfiedAt: Date | null;
  /** The parent's stored result, when it returned one and the result is kept. */
  result: unknown;
  hasResult: boolean;
}

/** The parents of task `id` (none for a task without dependencies), by id. */
export async function parentsOf(db: Queryable, storage: Storage, id: string): Promise<ParentRow[]> {
  const statement = storage.statement('deps-parents', ({ q: s }) =>
    compile(
      sql`SELECT id::text AS id, type, fate, satisfied_at, result, has_result
            FROM ${s}.task_parents(${p('id')}::bigint)`,
    ),
  );
  const res = await db.query<{
    id: string;
    type: string;
    fate: TaskFate;
    satisfied_at: Date | null;
    result: unknown;
    has_result: boolean;
  }>(statement.query({ id }));
  return res.rows.map((r) => ({
    id: r.id,
    type: r.type,
    fate: r.fate,
    satisfiedAt: r.satisfied_at,
    result: r.has_result ? r.result : undefined,
    hasResult: r.has_result,
  }));
}

/** One parent of a task as an operator reads it: a `ParentRow` without the result. */
export type ParentState = Omit<ParentRow, 'result' | 'hasResult'>;

/**
 * The parents of task `id` without their results (`berth tasks show`, the dashboard): the same
 * function as `parentsOf`, but a join of 10,000 parents does not carry 10,000 results over the
 * wire to print their states.
 */
export async function parentStatesOf(db: Queryable, storage: Storage, id: string): Promise<ParentState[]> {
  const statement = storage.statement('deps-parent-states', ({ q: s }) =>
    compile(sql`SELECT id::text AS id, type, fate, satisfied_at FROM ${s}.task_parents(${p('id')}::bigint)`),
  );
  const res = await db.query<{ id: string; type: string; fate: TaskFate; satisfied_at: Date | null }>(
    statement.query({ id }),
  );
  return res.rows.map((r) => ({ id: r.id, type: r.type, fate: r.fate, satisfiedAt: r.satisfied_at }));
}

/** One dependent of a task. */
export interface DependentRow {
  id: string;
  fate: TaskFate;
  /** Still waiting on some parent. */
  waiting: boolean;
  /** Its policy while it waits (null once it no longer waits). */
  onParentFailure: 'cancel' | 'wait' | null;
  /** When this task's completion was counted for it (null: not yet). */
  satisfiedAt: Date | null;
}

/** The first `limit` dependents of task `id`, by id, and how many it has. */
export async function dependentsOf(
  db: Queryable,
  storage: Storage,
  id: string,
  limit: number,
): Promise<{ total: number; dependents: DependentRow[] }> {
  const statement = storage.statement('deps-dependents', ({ q: s }) =>
    compile(
      sql`SELECT id::text AS id, fate, waiting, on_parent_failure, satisfied_at, total::integer AS total
            FROM ${s}.task_dependents(${p('id')}::bigint, ${p('limit')}::integer)`,
    ),
  );
  const res = await db.query<{
    id: string;
    fate: TaskFate;
    waiting: boolean;
    on_parent_failure: 'cancel' | 'wait' | null;
    satisfied_at: Date | null;
    total: number;
  }>(statement.query({ id, limit }));
  return {
    total: res.rows[0]?.total ?? 0,
    dependents: res.rows.map((r) => ({
      id: r.id,
      fate: r.fate,
      waiting: r.waiting,
      onParentFailure: r.on_parent_failure,
      satisfiedAt: r.satisfied_at,
    })),
  };
}

/** Tasks waiting on dependencies in one queue, and how many of them wait on a dead parent. */
export interface DependencyUsageRow {
  queue: string;
  waiting: number;
  blocked: number;
}

/** Per queue: tasks waiting on dependencies, and those blocked by a dead parent. */
export async function dependencyUsage(db: Queryable, storage: Storage): Promise<DependencyUsageRow[]> {
  const statement = storage.statement('deps-usage', ({ q: s }) =>
    compile(sql`SELECT queue, waiting::integer AS waiting, blocked::integer AS blocked FROM ${s}.dependency_usage()`),
  );
  const res = await db.query<DependencyUsageRow>(statement.query({}));
  return res.rows;
}

/** The retention of edges of dependents that are gone: at most `limit` dependents a call. */
export async function pruneDepEdges(db: Queryable, storage: Storage, limit: number): Promise<number> {
  const statement = storage.statement('deps-prune', ({ q: s }) =>
    compile(sql`SELECT ${s}.prune_dep_edges(${p('limit')}::integer) AS n`),
  );
  const res = await db.query<{ n: number }>(statement.query({ limit }));
  return res.rows[0]?.n ?? 0;
}
