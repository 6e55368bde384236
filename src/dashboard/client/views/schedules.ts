import { act, actionButton } from '../actions.js';
import { api } from '../api.js';
import { append, clear, h } from '../dom.js';
import { duration } from '../format.js';
import { READ_ONLY } from '../shell.js';
import type { View } from '../view.js';
import { badge, table, taskLink, when } from '../widgets.js';
import type { ScheduleRow, Schedules } from '../../wire.js';

/** The schedule's mark: stale and paused are what an operator acts on. */
function state(s: ScheduleRow) {
  if (s.stale) return badge('stale', 'dead');
  if (s.paused) return badge('paused');
  return badge('active', 'ok');
}

export const schedules: View<Schedules> = {
  title: 'Schedules',
  load: () => api<Schedules>('/api/schedules'),
  render: (el, d) => {
    append(clear(el), [
      h(
        'p',
        { class: 'muted' },
        'Recurring tasks declared by the workers. A paused schedule is not fired until resumed (the instants it misses are not run); a stale one is declared by no running worker. Trigger enqueues one run now without moving the schedule.',
      ),
      table(
        ['Schedule', 'Cron', 'Task', 'State', 'Next fire', 'Last fire', 'Last task', READ_ONLY ? '' : 'Action'],
        d.schedules.map((s) => {
          const base = `/api/schedules/${encodeURIComponent(s.name)}`;
          return {
            attrs: { 'data-schedule': s.name },
            cells: [
              s.name,
              `${s.cron} (${s.timeZone})`,
              `${s.taskType} on ${s.queue}${s.ceilingMs === null ? '' : `, ceiling ${duration(s.ceilingMs)}`}`,
              [state(s), s.paused && s.pausedBy ? h('span', { class: 'muted' }, ` by ${s.pausedBy}`) : ''],
              when(s.nextFireAt, true),
              when(s.lastInstant, true),
              s.lastTaskId ? [taskLink(s.lastTaskId), ' ', s.lastTaskState ? badge(s.lastTaskState) : ''] : '',
              READ_ONLY
                ? ''
                : h('span', { class: 'row-actions' }, [
                    s.paused
                      ? actionButton('Resume', () => act(`Resume ${s.name}`, `${base}/resume`))
                      : actionButton('Pause', () => act(`Pause ${s.name}`, `${base}/pause`), 'danger'),
                    ' ',
                    actionButton('Trigger', () =>
                      act(`Trigger ${s.name}`, `${base}/trigger`, {}, `Enqueue one run of ${s.name} now?`),
                    ),
                  ]),
            ],
          };
        }),
        'No schedules: a worker declares them with its schedules option.',
      ),
    ]);
  },
};
