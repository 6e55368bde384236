import { api, query } from '../api.js';
import { barChart } from '../chart.js';
import { append, clear, h } from '../dom.js';
import { age, num, time } from '../format.js';
import type { View } from '../view.js';
import { badge, card, table } from '../widgets.js';
import type { DependencyCounts, Overview } from '../../wire.js';

/** A waiting count, with the pending total (waiting + running) it is part of on hover. */
function pendingPart(waiting: number, pending: number): HTMLSpanElement {
  return h(
    'span',
    { title: `${num(pending)} pending = ${num(waiting)} waiting + ${num(pending - waiting)} running` },
    num(waiting),
  );
}

/** A queue's tasks waiting on their parents (and blocked by a dead one), linking to their list; nothing when none. */
function dependencyBadges(queue: string, d: DependencyCounts): HTMLElement[] {
  if (d.waiting === 0) return [];
  const link = h('a', { href: `#/tasks${query({ state: 'waiting', queue })}`, class: 'on-parents' }, [
    badge(`${num(d.waiting)} on parents`, 'waiting'),
  ]);
  return d.blocked > 0 ? [link, h('span', {}, ' '), badge(`${num(d.blocked)} blocked`, 'dead')] : [link];
}

export const overview: View<Overview> = {
  title: 'Overview',
  load: () => api<Overview>('/api/overview'),
  render: (el, d) => {
    const t = d.counts.total;
    const stats = h('div', { class: 'cards' }, [
      // Waiting and running add up to pending (seed 000 counts running tasks as pending, as the
      // berth_tasks_pending gauge does): shown side by side, no task is counted twice.
      card('Waiting', num(t.waiting), `of ${num(t.pending)} pending`, 'pending'),
      card('Running', num(t.running), 'under a live lease', 'running'),
      card('Dead letters', num(t.dead), 'out of attempts', t.dead > 0 ? 'dead' : ''),
      card(
        'Oldest due',
        d.oldestDue.seconds > 0 ? age(d.oldestDue.seconds) : '—',
        d.oldestDue.queue ? `in ${d.oldestDue.queue}` : 'nothing waiting',
        'oldest',
      ),
      card('Workers', num(d.workers.alive), `${num(d.workers.busy)} of ${num(d.workers.slots)} slots busy`, 'workers'),
      card(
        'Leader',
        d.leader ? d.leader.workerId || `pid ${d.leader.pid}` : 'none',
        d.leader ? `since ${time(d.leader.since)}` : 'no maintenance leader',
        d.leader ? 'leader' : 'dead',
      ),
      // Only where task dependencies are used: waiting tasks are part of the pending count.
      d.dependencies.waiting > 0
        ? card(
            'On parents',
            num(d.dependencies.waiting),
            d.dependencies.blocked > 0
              ? `${num(d.dependencies.blocked)} blocked by a dead parent`
              : 'waiting for the tasks they depend on',
            d.dependencies.blocked > 0 ? 'dead' : 'pending',
          )
        : null,
    ]);
    const charts = h('div', { class: 'charts' }, [
      barChart('Completed per minute', d.throughput, 'completed', 'ok'),
      barChart('Failures per minute', d.throughput, 'failed', 'bad'),
    ]);
    const byQueue = table(
      ['Queue', 'Waiting', 'Running', 'Dead', 'Depth', 'Oldest due', ''],
      d.queues.map((q) => ({
        attrs: { 'data-queue': q.queue },
        cells: [
          h('a', { href: `#/tasks${query({ queue: q.queue })}` }, q.queue),
          pendingPart(q.waiting, q.pending),
          num(q.running),
          q.dead > 0 ? h('a', { href: `#/dead${query({ queue: q.queue })}`, class: 'dead-count' }, num(q.dead)) : '0',
          num(q.depth),
          q.oldestDueSeconds > 0 ? age(q.oldestDueSeconds) : '—',
          [
            q.paused ? badge('paused') : '',
            q.paused && q.dependencies.waiting > 0 ? ' ' : '',
            ...dependencyBadges(q.queue, q.dependencies),
          ],
        ],
      })),
      'No queues yet.',
    );
    const byType = table(
      ['Task type', 'Waiting', 'Running', 'Dead'],
      d.counts.byType.map((c) => ({
        attrs: { 'data-type': c.type },
        cells: [
          h('a', { href: `#/tasks${query({ type: c.type })}` }, c.type),
          pendingPart(c.waiting, c.pending),
          num(c.running),
          num(c.dead),
        ],
      })),
      'No task types yet.',
    );
    append(clear(el), [
      stats,
      charts,
      h('div', { class: 'columns' }, [
        h('section', {}, [h('h2', {}, 'By queue'), byQueue]),
        h('section', {}, [h('h2', {}, 'By task type'), byType]),
      ]),
      h(
        'p',
        { class: 'muted small' },
        `Waiting + running = pending (berth_tasks_pending counts both). Counts are cached for a few seconds (read ${age(d.counts.ageMs / 1000)} ago); charts come from the workers\u2019 per-minute heartbeats.`,
      ),
    ]);
  },
};
