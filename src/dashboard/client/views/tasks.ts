import { api, query } from '../api.js';
import { append, clear, h } from '../dom.js';
import { clip } from '../format.js';
import { filterForm, Pager } from '../filters.js';
import { go } from '../live.js';
import type { View } from '../view.js';
import { stateBadges, table, taskLink, when } from '../widgets.js';
import type { TaskList } from '../wire.js';

const STATES = ['ready', 'running', 'scheduled', 'retryable', 'dead', 'completed'];

/** A fresh pager each time the page is mounted (a new filter starts at page 1). */
let pager = new Pager();

export const tasks: View<TaskList> = {
  title: 'Tasks',
  mount: (_el, r) => {
    pager = new Pager();
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
    ];
  },
  load: (r) =>
    api<TaskList>(
      `/api/tasks${query({ state: r.params.get('state'), queue: r.params.get('queue'), type: r.params.get('type'), after: pager.after })}`,
    ),
  render: (el, d) => {
    append(clear(el), [
      table(
        ['ID', 'Type', 'State', 'Queue', 'Priority', 'Attempts', 'Created', 'Due / finished', 'Last error'],
        d.tasks.map((t) => ({
          attrs: {
            'data-task': t.id,
            class: 'clickable',
            // The row opens the task; its id link does that itself.
            onclick: (e) => {
              if (!(e.target instanceof Element && e.target.tagName === 'A')) go(`#/tasks/${t.id}`);
            },
          },
          cells: [
            taskLink(t.id),
            t.type,
            stateBadges(t.state, t.overdue),
            t.queue,
            String(t.priority),
            `${t.attempts}${t.maxAttempts ? ` / ${t.maxAttempts}` : ''}`,
            when(t.createdAt),
            when(t.finishedAt || t.runAt),
            h('span', { class: 'error-text' }, clip(t.lastError, 80)),
          ],
        })),
        'No tasks match.',
      ),
      pager.controls(d.next, d.tasks.length),
    ]);
  },
};
