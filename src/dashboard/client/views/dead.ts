import { act, actionButton } from '../actions.js';
import { api, messageOf, query } from '../api.js';
import { append, clear, h } from '../dom.js';
import { toast } from '../feedback.js';
import { filterForm, Pager } from '../filters.js';
import { clip, num } from '../format.js';
import { bulkResultBox, Selection } from '../selection.js';
import { READ_ONLY } from '../shell.js';
import type { Route, View } from '../view.js';
import { table, taskLink, when } from '../widgets.js';
import type { DeadCount, DeadLetters } from '../../wire.js';

/** A fresh pager and selection each time the page is mounted (a new filter starts at page 1, nothing ticked). */
let pager = new Pager();
let selection = new Selection(['retry']);

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
        api<DeadCount>(`/api/dead/count${query(filter)}`).then(
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
    selection = new Selection(['retry']);
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
      READ_ONLY ? null : bulkResultBox(),
    ];
  },
  load: (r) =>
    api<DeadLetters>(
      `/api/dead${query({ queue: r.params.get('queue'), type: r.params.get('type'), error: r.params.get('error'), after: pager.after })}`,
    ),
  render: (el, d) => {
    selection.begin(d.deadLetters.map((x) => x.id));
    const headers = ['ID', 'Type', 'Queue', 'Attempts', 'Died', 'Last error', READ_ONLY ? '' : 'Actions'];
    append(clear(el), [
      READ_ONLY || d.deadLetters.length === 0 ? null : selection.toolbar(),
      table(
        READ_ONLY ? headers : [selection.allBox(), ...headers],
        d.deadLetters.map((x) => ({
          attrs: { 'data-task': x.id },
          cells: [
            READ_ONLY ? null : h('label', { class: 'select' }, selection.checkbox(x.id)),
            taskLink(x.id),
            x.type,
            x.queue,
            String(x.attempts),
            when(x.diedAt, true),
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
          ].filter((c) => c !== null),
        })),
        'No dead letters match.',
      ),
      pager.controls(d.next, d.deadLetters.length),
    ]);
  },
};
