import { type Attrs, type Child, h } from './dom.js';
import { ago, time } from './format.js';
import type { OverdueMark } from '../wire.js';

/** A coloured label; its class is `kind`, or the text itself ("paused", "dead", "running"). */
export function badge(text: string, kind?: string): HTMLSpanElement {
  return h('span', { class: `badge ${kind || text}` }, text);
}

/** A running task whose handler overran its deadline: "overdue", then "stuck" past the grace. */
export function stateBadges(state: string, overdue: OverdueMark | null | undefined): Child {
  if (!overdue) return badge(state);
  const title =
    `handler still running past its deadline since ${time(overdue.since)} on ${overdue.worker}` +
    (overdue.protected
      ? '; its lease is kept from rescue while that worker lives'
      : '; its holder stopped refreshing, rescue takes the lease');
  const mark = h(
    'span',
    { class: 'badge stuck', 'data-overdue': overdue.stuck ? 'stuck' : 'overdue', title },
    overdue.stuck ? 'stuck' : 'overdue',
  );
  return [badge(state), ' ', mark];
}

/**
 * A time as text (see time: date, clock and zone) with the full ISO timestamp in UTC in its
 * tooltip; with `relative`, "(5m 2s ago)" after it.
 */
export function when(iso: string | null | undefined, relative = false): Child {
  if (!iso) return '';
  const d = new Date(iso);
  const valid = !Number.isNaN(d.getTime());
  const stamp = h('time', { datetime: iso, title: valid ? `${d.toISOString()} (UTC)` : String(iso) }, time(iso));
  const rel = relative && valid ? ago(iso) : '';
  return rel ? h('span', { class: 'when' }, [stamp, ' ', h('span', { class: 'muted ago' }, `(${rel})`)]) : stamp;
}

export interface Row {
  attrs?: Attrs;
  cells: Child[];
}

/** A table, or `empty` (a muted line) when there are no rows. A header is text or a control (select all). */
export function table(headers: readonly Child[], rows: readonly Row[], empty?: string): HTMLElement {
  if (rows.length === 0) return h('p', { class: 'muted empty' }, empty || 'Nothing here.');
  return h('table', {}, [
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        headers.map((x) => h('th', {}, x)),
      ),
    ),
    h(
      'tbody',
      {},
      rows.map((r) =>
        h(
          'tr',
          r.attrs || {},
          r.cells.map((c) => h('td', {}, c)),
        ),
      ),
    ),
  ]);
}

export function taskLink(id: string): HTMLAnchorElement {
  return h('a', { href: `#/tasks/${encodeURIComponent(id)}`, class: 'mono' }, id);
}

/** One of the overview's figures: a label, a value, a note below it. */
export function card(label: string, value: string, note: string, kind?: string): HTMLDivElement {
  return h('div', { class: `card ${kind || ''}`, 'data-card': label.toLowerCase().replace(/\s+/g, '-') }, [
    h('div', { class: 'card-label' }, label),
    h('div', { class: 'card-value', title: value }, value),
    h('div', { class: 'card-note', title: note }, note),
  ]);
}
