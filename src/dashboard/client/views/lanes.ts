import { api, query } from '../api.js';
import { append, type Child, clear, h } from '../dom.js';
import { age, num } from '../format.js';
import type { View } from '../view.js';
import { badge, table, when } from '../widgets.js';
import type { Contention, Lanes } from '../../wire.js';

type Lane = Lanes['lanes'][number];
type Count = 'handedOff' | 'waiterLimit' | 'waiterTimedOut' | 'failed';

const CONTENTION: readonly (readonly [Count, string])[] = [
  ['handedOff', 'handed off'],
  ['waiterLimit', 'waiter limit'],
  ['waiterTimedOut', 'waiter timed out'],
  ['failed', 'failed'],
];

/** The lane read counts due deferred rows up to this many per lane (DUE_COUNT_CAP in src/admin/stats.ts). */
const DUE_PROBE_CAP = 10000;

/** Queues shown unfolded. Kept while the page refreshes; a fresh visit starts folded. */
let expanded = new Set<string>();

/** Contention counts, the non-zero ones, compact; the full breakdown in the tooltip. */
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

function lastContention(c: Contention | null): Child {
  if (!c) return '';
  return h('span', { title: `last outcome: ${c.lastOutcome.replace(/_/g, ' ')}` }, when(c.lastAt, true));
}

function dueDeferred(n: number, capped: boolean): string {
  return capped ? `${num(n)}+` : num(n);
}

function deadLink(queue: string, n: number): Child {
  return n > 0 ? h('a', { href: `#/dead${query({ queue })}`, class: 'dead-count' }, num(n)) : '0';
}

/** One queue's lanes as one row: sums of the counts, the oldest due, the latest contention. */
interface Folded {
  queue: string;
  lanes: Lane[];
  priorities: number[];
  depth: number;
  dueDeferred: number;
  dueCapped: boolean;
  oldestDueSeconds: number;
  running: number;
  dead: number;
  contention: Contention | null;
  paused: number;
  waiting: number;
}

/** Lanes grouped by queue, in the order the API lists them (by queue, priority, shard). */
export function fold(lanes: readonly Lane[]): Folded[] {
  const byQueue = new Map<string, Folded>();
  for (const l of lanes) {
    let f = byQueue.get(l.queue);
    if (!f) {
      f = {
        queue: l.queue,
        lanes: [],
        priorities: [],
        depth: 0,
        dueDeferred: 0,
        dueCapped: false,
        oldestDueSeconds: 0,
        running: 0,
        dead: 0,
        contention: null,
        paused: 0,
        waiting: 0,
      };
      byQueue.set(l.queue, f);
    }
    f.lanes.push(l);
    if (!f.priorities.includes(l.priority)) f.priorities.push(l.priority);
    f.depth += l.depth;
    f.dueDeferred += l.dueDeferred;
    f.dueCapped ||= l.dueDeferred >= DUE_PROBE_CAP;
    f.oldestDueSeconds = Math.max(f.oldestDueSeconds, l.oldestDueSeconds);
    f.running += l.running;
    f.dead += l.dead;
    if (l.paused) f.paused++;
    if (l.waiting) f.waiting++;
    if (l.contention) {
      const c = l.contention;
      const into = f.contention;
      if (!into) f.contention = { ...c };
      else {
        for (const [k] of CONTENTION) into[k] += c[k];
        if (Date.parse(c.lastAt) > Date.parse(into.lastAt))
          Object.assign(into, { lastAt: c.lastAt, lastOutcome: c.lastOutcome });
      }
    }
  }
  return [...byQueue.values()];
}

function stateOf(paused: number, of: number): HTMLSpanElement {
  if (paused === 0) return badge('active', 'ok');
  return paused === of ? badge('paused') : badge(`${paused} of ${of} paused`, 'paused');
}

const HEADERS = [
  '',
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
];

export const lanes: View<Lanes> = {
  title: 'Lanes',
  mount: () => {
    expanded = new Set();
    return [];
  },
  load: () => api<Lanes>('/api/lanes'),
  render: (el, d, route) => {
    const folded = fold(d.lanes);
    // Folding is drawn from the data already loaded: no request.
    const redraw = () => lanes.render(el, d, route);
    const toggle = (queue: string) => {
      if (expanded.has(queue)) expanded.delete(queue);
      else expanded.add(queue);
      redraw();
    };
    const rows = folded.flatMap((f) => {
      const open = expanded.has(f.queue);
      const summary = {
        attrs: { 'data-queue': f.queue, class: `lane-group${open ? ' open' : ''}` },
        cells: [
          h(
            'button',
            {
              type: 'button',
              class: 'link toggle',
              'aria-expanded': open ? 'true' : 'false',
              title: open ? 'fold the shards into this row' : 'show each lane',
              onclick: () => toggle(f.queue),
            },
            open ? '▾' : '▸',
          ),
          h('strong', {}, f.queue),
          f.priorities.join(', '),
          h('span', { class: 'muted' }, `${num(f.lanes.length)} lane${f.lanes.length === 1 ? '' : 's'}`),
          num(f.depth),
          dueDeferred(f.dueDeferred, f.dueCapped),
          f.oldestDueSeconds > 0 ? age(f.oldestDueSeconds) : '—',
          num(f.running),
          deadLink(f.queue, f.dead),
          contentionCell(f.contention),
          lastContention(f.contention),
          stateOf(f.paused, f.lanes.length),
          f.waiting ? badge(f.waiting === 1 ? 'waiting' : `${f.waiting} waiting`, 'waiting') : '',
        ],
      };
      if (!open) return [summary];
      return [
        summary,
        ...f.lanes.map((l) => ({
          attrs: { 'data-lane': `${l.queue}/${l.priority}/${l.shard}`, class: 'lane-shard' },
          cells: [
            '',
            h('span', { class: 'muted' }, l.queue),
            String(l.priority),
            String(l.shard),
            num(l.depth),
            dueDeferred(l.dueDeferred, l.dueDeferred >= DUE_PROBE_CAP),
            l.oldestDueSeconds > 0 ? age(l.oldestDueSeconds) : '—',
            num(l.running),
            deadLink(l.queue, l.dead),
            contentionCell(l.contention),
            lastContention(l.contention),
            l.paused ? badge('paused') : badge('active', 'ok'),
            l.waiting ? badge('waiting') : '',
          ],
        })),
      ];
    });
    const all = folded.length > 0 && folded.every((f) => expanded.has(f.queue));
    append(clear(el), [
      h(
        'p',
        { class: 'muted' },
        'A lane is (queue, priority, shard); each queue\u2019s lanes are folded into one row (▸ shows them). ' +
          'Depth counts entries past the claim cursor; due deferred rows wait for promotion. ' +
          'Contention is what the leader\u2019s promotion met on a busy lane (handed to a waiter, waiter limit reached, waiter timed out, failed) since it started. ' +
          (d.waitingLanes.length
            ? `${d.waitingLanes.length} lane(s) have a promotion waiter.`
            : 'No promotion waiters.'),
      ),
      folded.length > 1
        ? h(
            'button',
            {
              type: 'button',
              class: 'link',
              id: 'lanes-toggle-all',
              onclick: () => {
                expanded = all ? new Set() : new Set(folded.map((f) => f.queue));
                redraw();
              },
            },
            all ? 'Fold every queue' : 'Show every lane',
          )
        : null,
      table(HEADERS, rows, 'No lanes yet: nothing has been enqueued.'),
      h(
        'p',
        { class: 'muted small' },
        `Running and dead are counted rows, cached for a few seconds (read ${age(d.activityAgeMs / 1000)} ago).`,
      ),
    ]);
  },
};
