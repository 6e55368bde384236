/**
 * What one run of `npm run bench:deps` measured, computed from the database's own timestamps of
 * each task (bench/deps/berth.ts and pgboss.ts read them): the drain, the delay from a
 * dependent's last parent's completion to its start, the chain's time per link, and the checks
 * that every task ran exactly once and no dependent started before its parents completed.
 */
import { percentile } from '../stats.js';
import type { Shape } from './shapes.js';

/** One task as the database recorded it; times in ms since the epoch on the database clock. */
export interface TaskTiming {
  /** Its (first) claim: when a worker took it. */
  startedMs: number | null;
  /** The settlement that recorded its completion. */
  completedMs: number | null;
  /** Completions recorded, and attempts of any outcome (both 1 in a clean run). */
  completions: number;
  attempts: number;
  /**
   * When the task was freed, where the system records it (berth: the latest `satisfied_at` of its
   * edges, the `now()` of the transaction that counted its last parent), else undefined.
   */
  releasedMs?: number;
}

/** Delays split by how the dependent was freed. */
export interface DelayByPath {
  /** In its last parent's completing transaction (freed at that completion's `settled_at`). */
  completion: Measured['delay'];
  /** Later: by the leader's watch of a parent (or the prune's backstop). */
  later: Measured['delay'];
  /** Dependents whose release time is not known (their edges were pruned before the read). */
  unknown: number;
}

/** Run facts the analysis needs besides the timings. */
export interface RunFacts {
  /** Database clock just before the first enqueue call and just after the last one returned. */
  enqueueStartDbMs: number;
  enqueueDoneDbMs: number;
  /** Dependents whose parents had all completed when they were enqueued (no release: ready at once). */
  readyAtEnqueue: ReadonlySet<number>;
}

export interface Measured {
  tasks: number;
  completed: number;
  /** Enqueue done → last completion recorded (null when not every task completed). */
  drainMs: number | null;
  /** First enqueue call's start → last completion recorded. */
  totalMs: number | null;
  /** Delays (ms) of the dependents that waited, by the DB clock. */
  delay: { n: number; min: number; p50: number; p99: number; max: number } | null;
  /** The same delays by release path, when the system records release times; else null. */
  byPath: DelayByPath | null;
  /** Chain only: (last link's completion − first link's completion) / (links − 1). */
  perLinkMs: number | null;
  /** Dependents counted as released at enqueue (their parents had completed already). */
  readyAtEnqueue: number;
  /** Failed checks, each a sentence (empty in a clean run). */
  problems: string[];
}

function summary(xs: number[]): Measured['delay'] {
  if (xs.length === 0) return null;
  let min = Infinity;
  let max = -Infinity;
  for (const x of xs) {
    if (x < min) min = x;
    if (x > max) max = x;
  }
  return { n: xs.length, min, p50: percentile(xs, 50), p99: percentile(xs, 99), max };
}

export function analyse(shape: Shape, timings: readonly TaskTiming[], facts: RunFacts): Measured {
  const n = shape.parents.length;
  const problems: string[] = [];
  let completed = 0;
  let lastCompletion = -Infinity;
  let twice = 0;
  let retried = 0;
  for (const t of timings) {
    if (t.completedMs !== null) {
      completed++;
      if (t.completedMs > lastCompletion) lastCompletion = t.completedMs;
    }
    if (t.completions > 1) twice++;
    if (t.attempts > t.completions && t.completions > 0) retried++;
  }
  if (twice > 0) problems.push(`${twice} tasks completed more than once`);
  if (retried > 0) problems.push(`${retried} tasks needed more than one attempt`);

  const delays: number[] = [];
  const byCompletion: number[] = [];
  const byLater: number[] = [];
  let unknownPath = 0;
  let early = 0;
  for (let i = 0; i < n; i++) {
    const parents = shape.parents[i]!;
    if (parents.length === 0) continue;
    const child = timings[i]!;
    let lastParent = -Infinity;
    let parentsDone = true;
    for (const p of parents) {
      const c = timings[p]!.completedMs;
      if (c === null) parentsDone = false;
      else if (c > lastParent) lastParent = c;
    }
    // Not started: the run timed out (reported as such), or its parents have not completed.
    if (child.startedMs === null) continue;
    if (!parentsDone || child.startedMs < lastParent) {
      early++;
      continue;
    }
    if (facts.readyAtEnqueue.has(i)) continue;
    const delay = child.startedMs - lastParent;
    delays.push(delay);
    if (child.releasedMs === undefined) unknownPath++;
    else if (child.releasedMs > lastParent) byLater.push(delay);
    else byCompletion.push(delay);
  }
  if (early > 0) problems.push(`${early} dependents started before their last parent's completion was recorded`);
  const all = completed === n;

  let perLinkMs: number | null = null;
  if (shape.name === 'chain') {
    // The links that completed, in order: a timed-out run still gives its time per link.
    let k = 0;
    while (k < n && timings[k]!.completedMs !== null) k++;
    if (k >= 2) perLinkMs = (timings[k - 1]!.completedMs! - timings[0]!.completedMs!) / (k - 1);
  }
  return {
    tasks: n,
    completed,
    drainMs: all ? lastCompletion - facts.enqueueDoneDbMs : null,
    totalMs: all ? lastCompletion - facts.enqueueStartDbMs : null,
    delay: summary(delays),
    byPath:
      byCompletion.length + byLater.length > 0
        ? { completion: summary(byCompletion), later: summary(byLater), unknown: unknownPath }
        : null,
    perLinkMs,
    readyAtEnqueue: facts.readyAtEnqueue.size,
    problems,
  };
}
