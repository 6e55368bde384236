import { api } from '../api.js';
import { append, clear, h } from '../dom.js';
import { age, clip, json, num, time } from '../format.js';
import type { View } from '../view.js';
import { badge, table, when } from '../widgets.js';
import type { Maintenance } from '../../wire.js';

export const maintenance: View<Maintenance> = {
  title: 'Maintenance',
  load: () => api<Maintenance>('/api/maintenance'),
  render: (el, d) => {
    const l = d.leader;
    const branches = l.worker?.maintenance.branches || {};
    const waiting = l.worker?.maintenance.waitingLanes || [];
    append(clear(el), [
      h('h2', {}, 'Leader'),
      l.session
        ? h('p', { id: 'leader' }, [
            `Session pid ${l.session.pid} (${l.session.applicationName})${l.session.clientAddr ? ` from ${l.session.clientAddr}` : ''}, connected since ${time(l.session.since)}.`,
            l.worker ? ` Worker ${l.worker.workerId}.` : ' Its heartbeat is not fresh.',
          ])
        : h(
            'p',
            { class: 'error-text', id: 'leader' },
            'No maintenance leader: nothing is promoting, rescuing or pruning.',
          ),
      table(
        ['Branch', 'Runs', 'Last', 'Max', 'Overruns', 'Failures', 'Last run'],
        Object.entries(branches)
          .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
          .map(([name, b]) => ({
            cells: [
              name,
              num(b.runs),
              `${b.lastMs.toFixed(1)} ms`,
              `${b.maxMs.toFixed(1)} ms`,
              num(b.overruns),
              b.failures ? h('span', { class: 'error-text' }, num(b.failures)) : '0',
              when(b.lastRunAt, true),
            ],
          })),
        'No branch statistics yet.',
      ),
      h('h3', {}, 'Lanes waiting for promotion'),
      waiting.length
        ? h(
            'ul',
            {},
            waiting.map((w) => h('li', {}, `${w.queue} / priority ${w.priority} / shard ${w.shard}`)),
          )
        : h('p', { class: 'muted' }, 'None.'),
      h('h2', {}, 'Workers'),
      table(
        ['Worker', 'Host', 'PID', 'Queues', 'Slots', 'Busy', 'Prefetched', 'Leader', 'Started', 'Heartbeat'],
        d.workers.map((w) => {
          // A row the server could not read as written (forged or corrupt) says so, with the reason on hover.
          const heartbeat = w.invalid
            ? h('span', { class: 'badge dead', title: w.invalid, 'data-invalid': '' }, 'invalid')
            : w.alive
              ? // The age is the server's (its clock against the database's), not the browser's.
                h('span', { class: 'when' }, [
                  when(w.lastSeenAt),
                  ' ',
                  h('span', { class: 'muted ago' }, `(${age(w.heartbeatAgeSeconds)} ago)`),
                ])
              : badge('stale', 'dead');
          return {
            cells: [
              h('span', { class: 'mono' }, w.workerId),
              w.host,
              String(w.pid),
              w.queues ? w.queues.join(', ') : 'all',
              String(w.slots),
              String(w.busy),
              String(w.prefetched),
              w.leader ? badge('leader') : '',
              when(w.startedAt),
              heartbeat,
            ],
          };
        }),
        'No workers are running.',
      ),
      h('h2', {}, 'Recent operator actions'),
      table(
        ['When', 'Who', 'Action', 'Target', 'Result'],
        d.audit.map((a) => ({
          cells: [
            when(a.at),
            a.actor,
            a.action,
            h('span', { class: 'mono' }, clip(json(a.target), 120)),
            h('span', { class: 'mono' }, clip(json(a.result), 120)),
          ],
        })),
        'No operator actions yet.',
      ),
    ]);
  },
};
