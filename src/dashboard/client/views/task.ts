import { act, actionButton } from '../actions.js';
import { api } from '../api.js';
import { append, type Child, clear, h } from '../dom.js';
import { duration, json } from '../format.js';
import { READ_ONLY } from '../shell.js';
import type { View } from '../view.js';
import { stateBadges, when } from '../widgets.js';
import type { Attempt, ErrorDetail, TaskDetail, TaskState } from '../../wire.js';
import { outcomeBadge } from './attempts.js';
import { dependencyPanels } from './dependencies.js';

type TaskAction = 'retry' | 'cancel' | 'move' | 'delete';

/** Which actions apply to a task in each state (the rest could only answer "not found" or "running"). */
const TASK_ACTIONS: Readonly<Record<TaskState, readonly TaskAction[]>> = {
  dead: ['retry', 'delete'],
  ready: ['cancel', 'move', 'delete'],
  scheduled: ['retry', 'cancel', 'move', 'delete'],
  retryable: ['retry', 'cancel', 'move', 'delete'],
  held: ['cancel', 'move', 'delete'],
  // Waiting on its dependencies: only the last parent's completion makes it due.
  waiting: ['cancel', 'delete'],
  running: ['cancel'],
  completed: [],
  cancelled: [],
};

function taskActions(t: TaskDetail['task']): HTMLDivElement | null {
  const allowed = TASK_ACTIONS[t.state] || [];
  if (READ_ONLY || allowed.length === 0) return null;
  const base = `/api/tasks/${encodeURIComponent(t.id)}`;
  const has = (a: TaskAction) => allowed.includes(a);
  const queue = h('input', { type: 'text', placeholder: 'queue', 'data-keep': 'move-queue', size: 12 });
  const priority = h('input', {
    type: 'number',
    placeholder: 'priority',
    'data-keep': 'move-priority',
    min: -32768,
    max: 32767,
  });
  const retry = t.state === 'dead' ? 'Retry' : 'Run now';
  return h('div', { class: 'actions', id: 'task-actions' }, [
    has('retry') ? actionButton(retry, () => act(retry, `${base}/retry`)) : null,
    has('cancel')
      ? actionButton('Cancel', () =>
          act(
            'Cancel',
            `${base}/cancel`,
            {},
            t.state === 'running'
              ? `Cancel task ${t.id}? Its handler is aborted and it never runs again.`
              : `Cancel task ${t.id}? It is removed before it runs.`,
          ),
        )
      : null,
    has('delete')
      ? actionButton(
          'Delete',
          () => act('Delete', `${base}/delete`, {}, `Delete task ${t.id}? This cannot be undone.`),
          'danger',
        )
      : null,
    has('move')
      ? h('span', { class: 'move' }, [
          'Move to ',
          queue,
          ' ',
          priority,
          ' ',
          actionButton('Move', () => {
            const body: { queue?: string; priority?: number } = {};
            if (queue.value.trim()) body.queue = queue.value.trim();
            if (priority.value !== '') body.priority = Number(priority.value);
            return act('Move', `${base}/move`, body);
          }),
        ])
      : null,
  ]);
}

/** An error and its cause chain: each link's name, message, data and stack, as text. */
function errorBlock(e: ErrorDetail): HTMLElement[] {
  const out: HTMLElement[] = [];
  for (let c: ErrorDetail | undefined = e, first = true; c; c = c.cause, first = false) {
    const head = `${first ? '' : 'Caused by: '}${c.name ? `${c.name}: ` : ''}${c.message}`;
    const lines = [head, c.data ? `data: ${c.data}` : '', c.stack && c.stack !== head ? c.stack : '']
      .filter(Boolean)
      .join('\n');
    out.push(h('pre', { class: 'error-text', 'data-error-depth': String(out.length) }, lines));
  }
  return out;
}

function attemptItem(a: Attempt): HTMLLIElement {
  return h('li', { 'data-attempt': String(a.attempt), 'data-outcome': a.outcome }, [
    h('strong', {}, `#${a.attempt}`),
    ' ',
    outcomeBadge(a.outcome, a.dead),
    ' ',
    h('span', { class: 'muted' }, [
      `on ${a.worker || '?'} · claimed `,
      when(a.claimedAt),
      ` · ${duration(a.durationMs)}${a.runMs !== null ? ` (handler ${duration(a.runMs)})` : ''}`,
    ]),
    a.cursor !== null ? h('pre', { class: 'mono' }, `cursor ${json(a.cursor)}`) : null,
    a.error ? errorBlock(a.error) : null,
  ]);
}

export const task: View<TaskDetail> = {
  title: 'Task',
  load: (r) => api<TaskDetail>(`/api/tasks/${encodeURIComponent(r.id ?? '')}`),
  render: (el, d) => {
    const t = d.task;
    const fields: [string, Child][] = [
      ['State', stateBadges(t.state, t.lease?.overdue)],
      ['Type', t.type],
      ['Queue', t.queue],
      ['Priority', String(t.priority)],
      ['Shard', String(t.shard)],
      ['Attempts', `${t.attempts}${t.maxAttempts ? ` of ${t.maxAttempts}` : ' (type default)'}`],
      ['Dedupe key', t.dedupeKey || '—'],
      ['Created', when(t.createdAt)],
      // A waiting task has no run time of its own: its last parent's completion makes it due.
      ['Due', t.runAt ? when(t.runAt) : t.state === 'waiting' ? 'when its parents complete' : '—'],
      ...(t.cancelled
        ? ([['Cancelled', [`by ${t.cancelled.actor ?? 'an operator'}, `, when(t.cancelled.at)]]] as [string, Child][])
        : []),
      [
        'Lease',
        t.lease
          ? [`attempt ${t.lease.attempt} on ${t.lease.worker || '?'}, expires `, when(t.lease.expiresAt, true)]
          : '—',
      ],
    ];
    append(clear(el), [
      taskActions(t),
      h('h2', {}, ['Task ', h('span', { class: 'mono' }, t.id)]),
      h(
        'dl',
        { class: 'fields' },
        fields.map(([name, value]) => [h('dt', {}, name), h('dd', { 'data-field': name.toLowerCase() }, value)]),
      ),
      dependencyPanels(t.dependencies),
      t.lastError
        ? [h('h3', {}, 'Last error'), h('pre', { class: 'error-text', id: 'last-error' }, t.lastError)]
        : null,
      h('h3', {}, 'Payload'),
      t.source === 'history'
        ? h(
            'p',
            { class: 'muted', id: 'payload' },
            'Not kept: the task has left the queue; this is its attempt history.',
          )
        : h('pre', { id: 'payload' }, json(t.payload, 2)),
      // What the handler returned: only a completed task that stored one has it.
      t.result !== null && t.result !== undefined
        ? [h('h3', {}, 'Result'), h('pre', { id: 'result' }, json(t.result, 2))]
        : null,
      h('h3', {}, 'Attempts'),
      d.attempts.length === 0
        ? h('p', { class: 'muted', id: 'attempts' }, 'No attempt recorded (none ended yet, or attempt history is off).')
        : h('ol', { class: 'attempts', id: 'attempts' }, d.attempts.map(attemptItem)),
      h('h3', {}, 'Timeline'),
      h(
        'ol',
        { class: 'timeline', id: 'timeline' },
        d.timeline.map((e) =>
          h('li', { 'data-event': e.event }, [
            h('span', { class: 'when' }, when(e.at)),
            ' ',
            h('strong', {}, e.event),
            ' ',
            h('span', { class: 'mono muted' }, json(e.detail)),
          ]),
        ),
      ),
    ]);
  },
};
