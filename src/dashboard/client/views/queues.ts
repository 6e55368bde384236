import { act, actionButton } from '../actions.js';
import { api } from '../api.js';
import { append, clear, h } from '../dom.js';
import { READ_ONLY } from '../shell.js';
import type { View } from '../view.js';
import { badge, table, when } from '../widgets.js';
import type { Queues } from '../../wire.js';

export const queues: View<Queues> = {
  title: 'Queues',
  load: () => api<Queues>('/api/queues'),
  render: (el, d) => {
    append(clear(el), [
      h(
        'p',
        { class: 'muted' },
        'A paused queue keeps accepting tasks; workers stop claiming from it until it is resumed. Running tasks finish.',
      ),
      table(
        ['Queue', 'Lanes', 'State', 'Paused by', 'Since', 'Reason', READ_ONLY ? '' : 'Action'],
        d.queues.map((q) => {
          const reason = h('input', {
            type: 'text',
            placeholder: 'reason (optional)',
            'data-keep': `reason:${q.queue}`,
            size: 18,
          });
          const base = `/api/queues/${encodeURIComponent(q.queue)}`;
          const pause = () =>
            act(`Pause ${q.queue}`, `${base}/pause`, reason.value.trim() ? { reason: reason.value.trim() } : {});
          return {
            attrs: { 'data-queue': q.queue },
            cells: [
              q.queue,
              String(q.lanes),
              q.paused ? badge('paused') : badge('active', 'ok'),
              q.pausedBy || '',
              q.pausedAt ? when(q.pausedAt) : '',
              q.reason || '',
              READ_ONLY
                ? ''
                : q.paused
                  ? actionButton('Resume', () => act(`Resume ${q.queue}`, `${base}/resume`))
                  : h('span', { class: 'row-actions' }, [reason, ' ', actionButton('Pause', pause, 'danger')]),
            ],
          };
        }),
        'No queues yet.',
      ),
    ]);
  },
};
