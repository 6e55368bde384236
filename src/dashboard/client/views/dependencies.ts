import { h, type Child } from '../dom.js';
import { num } from '../format.js';
import { badge, table, taskLink, when } from '../widgets.js';
import type { TaskDependencies } from '../../wire.js';

type Parent = TaskDependencies['parents'][number];

/** How many of a waiting task's parents its note names (the Parents panel lists up to 20). */
const NAMED = 10;

/** What to do about a parent that holds the task, after its state (as `berth tasks show` says it). */
function advice(p: Parent, policy: 'cancel' | 'wait'): string {
  if (p.state === 'dead')
    return policy === 'wait' ? ' — retry it, or cancel this task' : ' — this task is cancelled with it';
  if (p.state === 'cancelled' || p.state === 'deleted' || p.state === 'unknown')
    return ' — this task is cancelled with it';
  if (p.state === 'completed') return ', counted within a tick';
  return '';
}

/** "Waiting on 2 of 3 parents: 123 (running), 456 (dead — retry it, or cancel this task)". */
function waitingNote(d: TaskDependencies): HTMLElement | null {
  const w = d.waitingOn;
  if (!w) return null;
  const pending = d.parents.filter((p) => p.satisfiedAt === null).slice(0, NAMED);
  const parts: Child[] = [];
  pending.forEach((p, i) => {
    if (i > 0) parts.push(', ');
    parts.push(taskLink(p.id), ` (${p.state}${advice(p, w.onParentFailure)})`);
  });
  const more = w.pending - pending.length;
  return h('p', { class: `waiting-on${w.dead > 0 ? ' blocked' : ''}`, id: 'waiting-on' }, [
    `Waiting on ${num(w.pending)} of ${num(w.total)} parent${w.total === 1 ? '' : 's'}`,
    parts.length ? ': ' : '',
    ...parts,
    more > 0 ? `, and ${num(more)} more` : '',
    '. ',
    h(
      'span',
      { class: 'muted' },
      `If a parent dies it ${w.onParentFailure === 'wait' ? 'waits for the parent to be retried' : 'is cancelled'}; it is due when its last parent completes${w.runAt ? ', not before ' : '.'}`,
    ),
    w.runAt ? when(w.runAt) : null,
  ]);
}

function shown(listed: number, total: number): string {
  return listed < total ? ` (${num(listed)} of ${num(total)})` : ` (${num(total)})`;
}

/** The task page's Parents and Dependents panels, and a waiting task's note; nothing without dependencies. */
export function dependencyPanels(d: TaskDependencies | null): Child {
  if (!d) return null;
  return [
    waitingNote(d),
    d.parentsTotal > 0
      ? [
          h('h3', {}, `Parents${shown(d.parents.length, d.parentsTotal)}`),
          h(
            'div',
            { id: 'parents' },
            table(
              ['ID', 'Type', 'State', 'Completion counted'],
              d.parents.map((p) => ({
                attrs: { 'data-parent': p.id, 'data-state': p.state },
                cells: [taskLink(p.id), p.type, badge(p.state), p.satisfiedAt ? when(p.satisfiedAt) : '—'],
              })),
            ),
          ),
        ]
      : null,
    d.dependentsTotal > 0
      ? [
          h('h3', {}, `Dependents${shown(d.dependents.length, d.dependentsTotal)}`),
          h(
            'div',
            { id: 'dependents' },
            table(
              ['ID', 'State', 'Still waiting', 'If a parent dies', 'This task counted'],
              d.dependents.map((c) => ({
                attrs: { 'data-dependent': c.id, 'data-state': c.state },
                cells: [
                  taskLink(c.id),
                  badge(c.state),
                  c.waiting ? 'yes' : '—',
                  c.onParentFailure ?? '—',
                  c.satisfiedAt ? when(c.satisfiedAt) : '—',
                ],
              })),
            ),
          ),
        ]
      : null,
  ];
}
