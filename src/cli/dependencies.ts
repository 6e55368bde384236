import type { LinkState, ParentLink, TaskDependencies } from '../storage/dependency-view.js';
import { escapeControl } from './terminal.js';

/** How many of a waiting task's parents its one-line summary names. */
const NAMED_IN_SUMMARY = 10;

/** What an operator can do about a parent that holds a waiting task, after its state. */
function parentAdvice(p: ParentLink, policy: 'cancel' | 'wait'): string {
  const gone = (s: LinkState) => s === 'cancelled' || s === 'deleted' || s === 'unknown';
  if (p.state === 'dead')
    return policy === 'wait' ? ' — retry it, or cancel this task' : ' — this task is cancelled with it';
  if (gone(p.state)) return ' — this task is cancelled with it';
  // Completed but not counted yet: the leader counts it within a tick.
  if (p.state === 'completed') return ', counted within a tick';
  return '';
}

/**
 * A waiting task's one line: `waiting on 2 of 3 parents: 123 (running), 456 (dead — retry it,
 * or cancel this task)`, naming at most ten. Null when the task does not wait.
 */
export function waitingLine(d: TaskDependencies): string | null {
  const w = d.waitingOn;
  if (!w) return null;
  const pending = d.parents.filter((p) => p.satisfiedAt === null);
  const named = pending
    .slice(0, NAMED_IN_SUMMARY)
    .map((p) => `${p.id} (${p.state}${parentAdvice(p, w.onParentFailure)})`);
  const more = w.pending - named.length;
  return `waiting on ${w.pending} of ${w.total} parent${w.total === 1 ? '' : 's'}${named.length ? `: ${named.join(', ')}` : ''}${more > 0 ? `, and ${more} more` : ''}`;
}

/** The lines `berth tasks show` prints for a task's dependencies (none for a task without). */
export function dependencyLines(d: TaskDependencies | null): string[] {
  if (!d) return [];
  const out: string[] = [];
  const waiting = waitingLine(d);
  if (waiting && d.waitingOn) {
    out.push(waiting);
    const policy =
      d.waitingOn.onParentFailure === 'wait'
        ? 'if a parent dies: waits for it to be retried'
        : 'if a parent dies: cancelled';
    const notBefore = d.waitingOn.runAt ? `, not before ${d.waitingOn.runAt.toISOString()}` : '';
    out.push(`  ${policy}; due when its last parent completes${notBefore}`);
  }
  if (d.parentsTotal > 0) {
    out.push(`parents (${listed(d.parents.length, d.parentsTotal)}):`);
    for (const p of d.parents)
      out.push(
        `  ${p.id}  ${escapeControl(p.type)}  ${p.state}${p.satisfiedAt ? `  counted ${p.satisfiedAt.toISOString()}` : ''}`,
      );
  }
  if (d.dependentsTotal > 0) {
    out.push(`dependents (${listed(d.dependents.length, d.dependentsTotal)}):`);
    for (const c of d.dependents) {
      const policy = c.onParentFailure ? `  on parent failure: ${c.onParentFailure}` : '';
      out.push(`  ${c.id}  ${c.state}${c.waiting ? '  still waiting' : ''}${policy}`);
    }
  }
  return out;
}

function listed(shown: number, total: number): string {
  return shown < total ? `${shown} of ${total} shown` : String(total);
}
