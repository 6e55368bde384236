import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import type { Storage } from './storage.js';
import { dependentsOf, parentStatesOf, type TaskFate } from './deps.js';
import type { TaskState } from './task-state.js';

/**
 * What `getTask` tells of a task's dependencies (migration 31): its parents and dependents with
 * where each stands, and what a waiting task still waits for. `berth tasks show` and the
 * dashboard's task page print it. A task without edges costs one statement of three index probes
 * (`dependenciesIn` returns null after it).
 */

/** How many parents and dependents one reading lists; the totals count them all. */
export const DEPENDENCY_LIST_LIMIT = 20;

/**
 * Where a parent or dependent stands: a task state, or `deleted` (removed before it ran: no
 * record is kept) or `unknown` (never enqueued, or gone longer than attempt history keeps).
 */
export type LinkState = TaskState | 'deleted' | 'unknown';

/** One task this task depends on. */
export interface ParentLink {
  id: string;
  type: string;
  state: LinkState;
  /** When its completion was counted for this task; null: not yet (it has not completed, or completed a moment ago and the leader counts it within a tick). */
  satisfiedAt: Date | null;
}

/** One task that depends on this task. */
export interface DependentLink {
  id: string;
  state: LinkState;
  /** Still waiting on at least one of its parents. */
  waiting: boolean;
  /** What it does if a parent dies while it waits: `cancel` or `wait` (null once it no longer waits). */
  onParentFailure: 'cancel' | 'wait' | null;
  /** When this task's completion was counted for it; null: not yet. */
  satisfiedAt: Date | null;
}

/** What a waiting task waits for. */
export interface WaitingOn {
  /** Parents whose completion has not been counted yet. */
  pending: number;
  /** All its parents. */
  total: number;
  /** Of the pending ones, those that are dead letters: retry them, or cancel this task. */
  dead: number;
  onParentFailure: 'cancel' | 'wait';
  /** Its own run time once released (`runAt` or `delay` at enqueue); null: at once. */
  runAt: Date | null;
}

export interface TaskDependencies {
  /** At most DEPENDENCY_LIST_LIMIT: the ones not yet counted first, then by id. */
  parents: ParentLink[];
  parentsTotal: number;
  /** The first DEPENDENCY_LIST_LIMIT by id. */
  dependents: DependentLink[];
  dependentsTotal: number;
  /** Set while the task is in state `waiting`; null otherwise. */
  waitingOn: WaitingOn | null;
}

/** The state of a task that `task_fate` calls pending, read precisely (null: gone meanwhile). */
export type StateOf = (id: string) => Promise<TaskState | null>;

/**
 * The dependencies of task `id`, now in `state`; null when it has neither parents nor
 * dependents. `stateOf` reads the exact state (running, scheduled, …) of each listed task that
 * is still pending: at most DEPENDENCY_LIST_LIMIT of each side, one point read each.
 */
export async function dependenciesIn(
  db: Queryable,
  storage: Storage,
  id: string,
  state: TaskState,
  stateOf: StateOf,
): Promise<TaskDependencies | null> {
  const probe = await db.query<{
    has_parents: boolean;
    has_dependents: boolean;
    pending: number | null;
    policy: 'cancel' | 'wait' | null;
    run_at: Date | null;
  }>(
    storage
      .statement('deps-probe', ({ q: s }) =>
        positional(
          `SELECT EXISTS (SELECT 1 FROM ${s}.task_deps d WHERE d.child_id = $1) AS has_parents,
                  EXISTS (SELECT 1 FROM ${s}.task_deps d WHERE d.parent_id = $1) AS has_dependents,
                  w.pending, w.on_parent_failure AS policy, w.run_at
             FROM (SELECT 1) one LEFT JOIN ${s}.task_waits w ON w.id = $1`,
          ['id'],
        ),
      )
      .query({ id }),
  );
  const p = probe.rows[0]!;
  if (!p.has_parents && !p.has_dependents) return null;
  const [parents, dependents] = await Promise.all([
    p.has_parents ? parentStatesOf(db, storage, id) : [],
    p.has_dependents ? dependentsOf(db, storage, id, DEPENDENCY_LIST_LIMIT) : { total: 0, dependents: [] },
  ]);
  // The ones it still waits for first: a join of 10,000 shows what holds it, not the done ones.
  const shown = [...parents.filter((x) => x.satisfiedAt === null), ...parents.filter((x) => x.satisfiedAt !== null)]
    .slice(0, DEPENDENCY_LIST_LIMIT)
    .map(async (x) => ({
      id: x.id,
      type: x.type,
      state: await linkState(x.fate, x.id, stateOf),
      satisfiedAt: x.satisfiedAt,
    }));
  const listed = dependents.dependents.map(async (d) => ({
    id: d.id,
    // A waiting dependent is in deferred storage as `waiting`: no second read.
    state: d.waiting && d.fate === 'pending' ? ('waiting' as const) : await linkState(d.fate, d.id, stateOf),
    waiting: d.waiting,
    onParentFailure: d.onParentFailure,
    satisfiedAt: d.satisfiedAt,
  }));
  const pending = parents.filter((x) => x.satisfiedAt === null);
  return {
    parents: await Promise.all(shown),
    parentsTotal: parents.length,
    dependents: await Promise.all(listed),
    dependentsTotal: dependents.total,
    waitingOn:
      state === 'waiting' && p.policy !== null
        ? {
            pending: p.pending ?? pending.length,
            total: parents.length,
            dead: pending.filter((x) => x.fate === 'dead').length,
            onParentFailure: p.policy,
            runAt: p.run_at,
          }
        : null,
  };
}

/** A fate as a state: a pending task's exact state is read (it may have moved on meanwhile). */
async function linkState(fate: TaskFate, id: string, stateOf: StateOf): Promise<LinkState> {
  if (fate !== 'pending') return fate;
  return (await stateOf(id)) ?? 'unknown';
}
