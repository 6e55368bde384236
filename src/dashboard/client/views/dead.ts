import { act, actionButton } from '../actions.js';
import { api, messageOf, query } from '../api.js';
import { append, clear, h } from '../dom.js';
import { toast } from '../feedback.js';
import { filterForm, Pager } from '../filters.js';
import { ago, clip, num, time } from '../format.js';
import { READ_ONLY } from '../shell.js';
import type { Route, View } from '../view.js';
import { table, taskLink } from '../widgets.js';
import type { DeadLetters } from '../wire.js';

/** A fresh pager each time the page is mounted (a new filter starts at page 1). */
let pager = new Pager();

/** Retry or purge every dead letter the page's filter matches (all of them without one), after a count and a confirmation. */
function bulkActions(r: Route): HTMLDivElement {
  const filter = {
    queue: r.params.get('queue') || undefined,
    type: r.params.get('type') || undefined,
    error: r.params.get('error') || undefined,
  };
  const scoped = Boolean(filter.queue || filter.type || filter.error);
  const what = scoped ? 'matching this filter' : '(all of them)';
  const bulk = (action: 'retry' | 'purge', label: string) =>
    actionButton(
      label + (scoped ? ' all matching' : ' all'),
      () => {
        api<{ count: number }>(`/api/dead/count${query(filter)}`).then(
          (c) =>
            act(
              label,
              `/api/dead/${action}`,
              scoped ? filter : { all: true },
              `${label} ${num(c.count)} dead letter(s) ${what}?`,
            ),
          (err: unknown) => toast(messageOf(err), true),
        );
      },
      action === 'purge' ? 'danger' : '',
    );
  return h('div', { class: 'actions bulk' }, [bulk('retry', 'Retry'), bulk('purge', 'Purge')]);
}

export const dead: View<DeadLetters> = {
  title: 'Dead letters',
  mount: (_el, r) => {
    pager = new Pager();
    return [
      filterForm(
        'dead',
        [
          { name: 'queue', label: 'Queue' },
          { name: 'type', label: 'Type' },
          { name: 'error', label: 'Error contains' },
        ],
        r.params,
      ),
      READ_ONLY ? null : bulkActions(r),
    ];
  },
  load: (r) =>
    api<DeadLetters>(
      `/api/dead${query({ queue: r.params.get('queue'), type: r.params.get('type'), error: r.params.get('error'), after: pager.after })}`,
    ),
  render: (el, d) => {
    append(clear(el), [
      table(
        ['ID', 'Type', 'Queue', 'Attempts', 'Died', 'Last error', READ_ONLY ? '' : 'Actions'],
        d.deadLetters.map((x) => ({
          attrs: { 'data-task': x.id },
          cells: [
            taskLink(x.id),
            x.type,
            x.queue,
            String(x.attempts),
            h('span', { title: `${time(x.diedAt)} (${x.diedAt})` }, ago(x.diedAt)),
            h('span', { class: 'error-text', title: x.lastError || '' }, clip(x.lastError, 120)),
            READ_ONLY
              ? ''
              : h('span', { class: 'row-actions' }, [
                  actionButton('Retry', () => act(`Retry ${x.id}`, `/api/tasks/${x.id}/retry`)),
                  actionButton(
                    'Delete',
                    () => act(`Delete ${x.id}`, `/api/tasks/${x.id}/delete`, {}, `Delete dead letter ${x.id}?`),
                    'danger',
                  ),
                ]),
          ],
        })),
        'No dead letters match.',
      ),
      pager.controls(d.next, d.deadLetters.length),
    ]);
  },
};
