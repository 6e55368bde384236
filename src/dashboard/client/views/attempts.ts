import { api, query } from '../api.js';
import { append, clear, h } from '../dom.js';
import { clip } from '../format.js';
import { filterForm, Pager } from '../filters.js';
import { go } from '../live.js';
import type { View } from '../view.js';
import { badge, table, taskLink, when } from '../widgets.js';
import type { AttemptList } from '../../wire.js';

const OUTCOMES = ['success', 'failure', 'timeout', 'continued', 'cancelled', 'lost', 'snoozed'];

/** How an outcome is drawn: failures stand out, successes do not. */
export function outcomeBadge(outcome: string, dead: boolean): HTMLSpanElement {
  const kind =
    outcome === 'success'
      ? 'ok'
      : outcome === 'continued' || outcome === 'cancelled' || outcome === 'snoozed'
        ? 'waiting'
        : 'dead';
  return badge(dead ? `${outcome} · dead` : outcome, kind);
}

/** A fresh pager each time the page is mounted (a new filter starts at page 1). */
let pager = new Pager();

/** Completed and failed attempts from attempt history, newest first, by outcome, type, queue and time. */
export const attempts: View<AttemptList> = {
  title: 'Attempts',
  mount: (_el, r) => {
    pager = new Pager();
    return [
      filterForm(
        'attempts',
        [
          { name: 'outcome', label: 'Outcome', options: OUTCOMES },
          { name: 'queue', label: 'Queue' },
          { name: 'type', label: 'Type' },
          { name: 'since', label: 'Since', placeholder: '2026-12-01T06:00Z' },
          { name: 'before', label: 'Before', placeholder: 'now' },
        ],
        r.params,
      ),
    ];
  },
  load: (r) =>
    api<AttemptList>(
      `/api/attempts${query({ outcome: r.params.get('outcome'), queue: r.params.get('queue'), type: r.params.get('type'), since: r.params.get('since'), before: r.params.get('before'), after: pager.after })}`,
    ),
  render: (el, d) => {
    append(clear(el), [
      table(
        ['Task', 'Attempt', 'Outcome', 'Type', 'Queue', 'Worker', 'Settled', 'Duration', 'Error'],
        d.attempts.map((a) => ({
          attrs: {
            'data-attempt': `${a.id}:${a.attempt}`,
            class: 'clickable',
            onclick: (e) => {
              if (!(e.target instanceof Element && e.target.tagName === 'A')) go(`#/tasks/${a.id}`);
            },
          },
          cells: [
            taskLink(a.id),
            String(a.attempt),
            outcomeBadge(a.outcome, a.dead),
            a.type,
            a.queue,
            a.worker || '—',
            when(a.settledAt),
            `${Math.round(a.durationMs)} ms`,
            h('span', { class: 'error-text' }, clip(a.error?.message ?? '', 80)),
          ],
        })),
        'No attempts match (attempt history may be off, or these are older than its retention).',
      ),
      pager.controls(d.next, d.attempts.length),
    ]);
  },
};
