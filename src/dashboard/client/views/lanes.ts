import { api, query } from '../api.js';
import { append, clear, h } from '../dom.js';
import { age, ago, num } from '../format.js';
import type { View } from '../view.js';
import { badge, table } from '../widgets.js';
import type { Contention, Lanes } from '../wire.js';

type Count = 'handedOff' | 'waiterLimit' | 'waiterTimedOut' | 'failed';

const CONTENTION: readonly (readonly [Count, string])[] = [
  ['handedOff', 'handed off'],
  ['waiterLimit', 'waiter limit'],
  ['waiterTimedOut', 'waiter timed out'],
  ['failed', 'failed'],
];

/** A lane's contention counts, the non-zero ones, compact; the full breakdown in the tooltip. */
function contentionCell(c: Contention | null): HTMLSpanElement | '' {
  if (!c) return '';
  const shown = CONTENTION.filter(([k]) => c[k] > 0).map(([k, label]) => `${num(c[k])} ${label}`);
  const full = CONTENTION.map(([k, label]) => `${label}: ${num(c[k])}`).join(', ');
  return h(
    'span',
    { class: c.failed || c.waiterTimedOut ? 'error-text' : '', title: full, 'data-contention': '' },
    shown.join(' · '),
  );
}

export const lanes: View<Lanes> = {
  title: 'Lanes',
  load: () => api<Lanes>('/api/lanes'),
  render: (el, d) => {
    append(clear(el), [
      h(
        'p',
        { class: 'muted' },
        'A lane is (queue, priority, shard). Depth counts entries past the claim cursor; due deferred rows wait for promotion. ' +
          'Contention is what the leader\u2019s promotion met on a busy lane (handed to a waiter, waiter limit reached, waiter timed out, failed) since it started. ' +
          (d.waitingLanes.length
            ? `${d.waitingLanes.length} lane(s) have a promotion waiter.`
            : 'No promotion waiters.'),
      ),
      table(
        [
          'Queue',
          'Priority',
          'Shard',
          'Depth',
          'Due deferred',
          'Oldest due',
          'Running',
          'Dead',
          'Contention',
          'Last contention',
          'State',
          'Waiter',
        ],
        d.lanes.map((l) => ({
          attrs: { 'data-lane': `${l.queue}/${l.priority}/${l.shard}` },
          cells: [
            l.queue,
            String(l.priority),
            String(l.shard),
            num(l.depth),
            l.dueDeferred >= 10000 ? '10,000+' : num(l.dueDeferred),
            l.oldestDueSeconds > 0 ? age(l.oldestDueSeconds) : '—',
            num(l.running),
            l.dead > 0 ? h('a', { href: `#/dead${query({ queue: l.queue })}`, class: 'dead-count' }, num(l.dead)) : '0',
            contentionCell(l.contention),
            l.contention
              ? h(
                  'span',
                  { title: `${l.contention.lastAt} (${l.contention.lastOutcome.replace(/_/g, ' ')})` },
                  ago(l.contention.lastAt),
                )
              : '',
            l.paused ? badge('paused') : badge('active', 'ok'),
            l.waiting ? badge('waiting') : '',
          ],
        })),
        'No lanes yet: nothing has been enqueued.',
      ),
      h(
        'p',
        { class: 'muted small' },
        `Running and dead are counted rows, cached for a few seconds (read ${age(d.activityAgeMs / 1000)} ago).`,
      ),
    ]);
  },
};
