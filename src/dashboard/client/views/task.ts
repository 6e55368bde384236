import { act, actionButton } from '../actions.js';
import { api } from '../api.js';
import { append, type Child, clear, h } from '../dom.js';
import { duration, json } from '../format.js';
import { READ_ONLY } from '../shell.js';
import type { View } from '../view.js';
import { badge, stateBadges, table, when } from '../widgets.js';
import type { Attempt, TaskDetail, TaskState } from '../wire.js';

type TaskAction = 'retry' | 'cancel' | 'move' | 'delete';

/** Which actions apply to a task in each state (the rest could only answer "not found" or "running"). */
const TASK_ACTIONS: Readonly<Record<TaskState, readonly TaskAction[]>> = {
  dead: ['retry', 'delete'],
  ready: ['cancel', 'move', 'delete'],
  scheduled: ['retry', 'cancel', 'move', 'delete'],
  retryable: ['retry', 'cancel', 'move', 'delete'],
  running: ['cancel'],
  completed: [],
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

/** An attempt's error: its message, and its stack folded below it when the history kept one. */
function attemptError(e: Attempt['error']): Child {
  if (!e) return '';
  return h('div', { class: 'attempt-error' }, [
    h('span', { class: 'error-text', 'data-error': '' }, e.message),
    e.stack
      ? h('details', {}, [
          h('summary', {}, 'stack'),
          h('pre', { class: 'error-text stack', 'data-stack': '' }, e.stack),
        ])
      : null,
  ]);
}

/**
 * Every attempt the server knows of, oldest first: claim, worker, outcome, duration, error and
 * stack. Drawn from whatever the API sends (`attempts`); it says when they came off the ring's
 * timeline, which keeps claims and settlements while their segment is retained and no error
 * per attempt.
 */
function attemptsSection(d: TaskDetail): Child {
  if (!d.attempts) return null;
  const fromTimeline = d.attemptsFrom !== 'history';
  return h('section', { id: 'attempts', 'data-from': fromTimeline ? 'timeline' : 'history' }, [
    h('h3', {}, 'Attempts'),
    table(
      ['Attempt', 'Claimed', 'Worker', 'Outcome', 'Duration', 'Error'],
      d.attempts.map((a, i) => ({
        attrs: { 'data-attempt': a.attempt ?? `#${i + 1}` },
        cells: [
          a.attempt === null ? '?' : String(a.attempt),
          when(a.claimedAt),
          h('span', { class: 'mono' }, a.worker || '?'),
          a.outcome ? badge(a.outcome, `outcome ${a.outcome}`) : a.settledAt ? '?' : badge('running'),
          a.durationMs === null ? '' : duration(a.durationMs),
          attemptError(a.error),
        ],
      })),
      fromTimeline ? 'No claim of this task is retained on the ring.' : 'Not claimed yet.',
    ),
    fromTimeline
      ? h(
          'p',
          { class: 'muted small', id: 'attempts-note' },
          'Read off the ring\u2019s claims and settlements while their segment is retained; the ring keeps only the last error (above), not one per attempt.',
        )
      : null,
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
      ['Due', t.runAt ? when(t.runAt) : '—'],
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
      t.lastError
        ? [h('h3', {}, 'Last error'), h('pre', { class: 'error-text', id: 'last-error' }, t.lastError)]
        : null,
      attemptsSection(d),
      h('h3', {}, 'Payload'),
      h('pre', { id: 'payload' }, json(t.payload, 2)),
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
