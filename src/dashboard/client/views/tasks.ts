import { api, query } from '../api.js';
import { append, clear, h } from '../dom.js';
import { clip } from '../format.js';
import { filterForm, Pager } from '../filters.js';
import { go } from '../live.js';
import { bulkResultBox, Selection } from '../selection.js';
import { READ_ONLY } from '../shell.js';
import type { View } from '../view.js';
import { stateBadges, table, taskLink, when } from '../widgets.js';
import type { TaskList } from '../../wire.js';

const STATES = ['ready', 'running', 'scheduled', 'retryable', 'held', 'waiting', 'dead', 'completed', 'cancelled'];

/** A fresh pager and selection each time the page is mounted (a new filter starts at page 1, nothing ticked). */
let pager = new Pager();
let selection = new Selection(['retry', 'cancel']);

export const tasks: View<TaskList> = {
  title: 'Tasks',
  mount: (_el, r) => {
    pager = new Pager();
    selection = new Selection(['retry', 'cancel']);
    return [
      filterForm(
        'tasks',
        [
          { name: 'state', label: 'State', options: STATES },
          { name: 'queue', label: 'Queue' },
          { name: 'type', label: 'Type' },
        ],
        r.params,
      ),
      READ_ONLY ? null : bulkResultBox(),
    ];
  },
  load: (r) =>
    api<TaskList>(
      `/api/tasks${query({ state: r.params.get('state'), queue: r.params.get('queue'), type: r.params.get('type'), after: pager.after })}`,
    ),
  render: (el, d) => {
    selection.begin(d.tasks.map((t) => t.id));
    const headers = ['ID', 'Type', 'State', 'Queue', 'Priority', 'Attempts', 'Created', 'Due / finished', 'Last error'];
    append(clear(el), [
      READ_ONLY || d.tasks.length === 0 ? null : selection.toolbar(),
      table(
        READ_ONLY ? headers : [selection.allBox(), ...headers],
        d.tasks.map((t) => ({
          attrs: {
            'data-task': t.id,
            class: 'clickable',
            // The row opens the task; its id link, its checkbox and the cell around it do not.
            onclick: (e) => {
              if (!(e.target instanceof Element && e.target.closest('a, input, label.select'))) go(`#/tasks/${t.id}`);
            },
          },
          cells: [
            READ_ONLY ? null : h('label', { class: 'select' }, selection.checkbox(t.id)),
            taskLink(t.id),
            t.type,
            stateBadges(t.state, t.overdue),
            t.queue,
            String(t.priority),
            `${t.attempts}${t.maxAttempts ? ` / ${t.maxAttempts}` : ''}`,
            when(t.createdAt),
            when(t.finishedAt || t.runAt),
            t.state === 'cancelled'
              ? h('span', { class: 'muted' }, `cancelled by ${clip(t.cancelledBy ?? 'an operator', 80)}`)
              : h('span', { class: 'error-text' }, clip(t.lastError, 80)),
          ].filter((c) => c !== null),
        })),
        'No tasks match.',
      ),
      pager.controls(d.next, d.tasks.length),
    ]);
  },
};
