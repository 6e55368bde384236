import { messageOf, post } from './api.js';
import { append, clear, h } from './dom.js';
import { confirmDialog, toast } from './feedback.js';
import { num } from './format.js';
import { refresh } from './live.js';
import { READ_ONLY } from './shell.js';
import { taskLink } from './widgets.js';
import type { BulkTaskAnswer } from '../wire.js';

/** What selected tasks can be asked to do (POST /api/tasks/bulk/<action>). */
export type BulkAction = 'retry' | 'cancel';

const LABELS: Readonly<Record<BulkAction, string>> = { retry: 'Retry', cancel: 'Cancel' };

/** Why a task was not changed, in words; a result this client does not know is shown as sent. */
const REASONS: Readonly<Record<string, string>> = {
  running: 'running under a lease',
  not_retryable: 'not retryable (ready, running or completed)',
  waiting_on_parents: 'waiting on its parents (retry a dead parent instead)',
  duplicate: 'a live task holds its dedupe key',
  not_found: 'not found (finished and reclaimed, or removed)',
};

/** The id of the element a page mounts for the last bulk action's summary (it outlives refreshes). */
const RESULT_ID = 'bulk-result';

/** Where a page shows the summary of its last bulk action: mounted once, above the refreshed list. */
export function bulkResultBox(): HTMLDivElement {
  return h('div', { id: RESULT_ID, class: 'bulk-result', role: 'status', hidden: true });
}

/** "3 removed, 1 retried": counts by result. */
function counts(results: readonly BulkTaskAnswer['results'][number][], phrase: (r: string) => string): string {
  const by = new Map<string, number>();
  for (const r of results) by.set(r.result, (by.get(r.result) ?? 0) + 1);
  return [...by].map(([result, n]) => `${num(n)} ${phrase(result)}`).join(', ');
}

/** The answer in one line: "Cancel: 2 of 3 changed (2 removed); 1 not changed: 1 running under a lease." */
export function summarise(action: BulkAction, a: BulkTaskAnswer): string {
  const changed = a.results.filter((r) => r.changed);
  const unchanged = a.results.filter((r) => !r.changed);
  let text = `${LABELS[action]}: ${num(a.changed)} of ${num(a.requested)} changed`;
  if (changed.length) text += ` (${counts(changed, (r) => r.replace(/_/g, ' '))})`;
  if (unchanged.length)
    text += `; ${num(a.unchanged)} not changed: ${counts(unchanged, (r) => REASONS[r] ?? r.replace(/_/g, ' '))}`;
  return `${text}.`;
}

/** Links to at most this many unchanged tasks per reason; the rest are counted. */
const LINKS_PER_REASON = 20;

/** The tasks not changed, one line per reason: "running under a lease: 12, 14, 15". */
function unchangedList(a: BulkTaskAnswer): HTMLUListElement | null {
  const byReason = new Map<string, string[]>();
  for (const r of a.results) {
    if (r.changed) continue;
    const ids = byReason.get(r.result) ?? [];
    ids.push(r.id);
    byReason.set(r.result, ids);
  }
  if (byReason.size === 0) return null;
  return h(
    'ul',
    { class: 'unchanged' },
    [...byReason].map(([result, ids]) => {
      const shown = ids.slice(0, LINKS_PER_REASON).flatMap((id, i) => [i ? ', ' : '', taskLink(id)]);
      const more = ids.length > LINKS_PER_REASON ? ` and ${num(ids.length - LINKS_PER_REASON)} more` : '';
      return h('li', { 'data-reason': result }, [`${REASONS[result] ?? result.replace(/_/g, ' ')}: `, shown, more]);
    }),
  );
}

function showResult(action: BulkAction, a: BulkTaskAnswer): void {
  const box = document.getElementById(RESULT_ID);
  if (!box) return;
  box.hidden = false;
  box.className = `bulk-result${a.unchanged ? ' partial' : ''}`;
  append(clear(box), [
    h('span', { 'data-summary': '' }, summarise(action, a)),
    unchangedList(a),
    h(
      'button',
      {
        type: 'button',
        class: 'link',
        onclick: () => {
          box.hidden = true;
        },
      },
      'dismiss',
    ),
  ]);
}

/**
 * The tasks ticked on a list page. It outlives the page's refreshes (which redraw every row),
 * but only ever holds tasks the page shows: a redraw drops the ids no longer on it, so an action
 * never reaches a task the operator cannot see.
 */
export class Selection {
  readonly ids = new Set<string>();
  /** The controls of the last redraw, kept in step with every tick. */
  private boxes: { id: string; box: HTMLInputElement }[] = [];
  private all: HTMLInputElement | null = null;
  private bar: { count: HTMLElement; buttons: HTMLButtonElement[] } | null = null;

  constructor(private readonly actions: readonly BulkAction[]) {}

  /** Start a redraw showing these ids: forget the rest and the previous controls. */
  begin(visible: readonly string[]): void {
    const shown = new Set(visible);
    for (const id of this.ids) if (!shown.has(id)) this.ids.delete(id);
    this.boxes = [];
    this.all = null;
    this.bar = null;
  }

  /** A row's checkbox. */
  checkbox(id: string): HTMLInputElement {
    const box = h('input', {
      type: 'checkbox',
      'data-select': id,
      'aria-label': `select task ${id}`,
      checked: this.ids.has(id),
      onchange: () => {
        if (box.checked) this.ids.add(id);
        else this.ids.delete(id);
        this.sync();
      },
    });
    this.boxes.push({ id, box });
    return box;
  }

  /** The header's checkbox: every task on the page, or none. */
  allBox(): HTMLInputElement {
    const box = h('input', {
      type: 'checkbox',
      'data-select-all': '',
      'aria-label': 'select every task on this page',
      onchange: () => {
        for (const b of this.boxes) {
          if (box.checked) this.ids.add(b.id);
          else this.ids.delete(b.id);
        }
        this.sync();
      },
    });
    this.all = box;
    return box;
  }

  /** "N selected" and a button per action; nothing on a read-only dashboard. */
  toolbar(): HTMLDivElement | null {
    if (READ_ONLY) return null;
    const count = h('span', { class: 'muted', 'data-selected': '' });
    const buttons = this.actions.map((action) =>
      h(
        'button',
        {
          type: 'button',
          class: action === 'cancel' ? 'danger' : '',
          'data-bulk': action,
          onclick: () => void this.run(action),
        },
        `${LABELS[action]} selected`,
      ),
    );
    this.bar = { count, buttons };
    const bar = h('div', { class: 'actions bulk selection' }, [count, buttons]);
    this.sync();
    return bar;
  }

  /** Bring the header checkbox, the count and the buttons in line with the ticks. */
  private sync(): void {
    for (const b of this.boxes) b.box.checked = this.ids.has(b.id);
    const ticked = this.boxes.filter((b) => this.ids.has(b.id)).length;
    if (this.all) {
      this.all.checked = ticked > 0 && ticked === this.boxes.length;
      this.all.indeterminate = ticked > 0 && ticked < this.boxes.length;
    }
    if (this.bar) {
      this.bar.count.textContent = `${num(this.ids.size)} selected`;
      for (const b of this.bar.buttons) b.disabled = this.ids.size === 0;
    }
  }

  /** Confirm, send the ids in one request, show what changed and what did not (and why), refresh. */
  private async run(action: BulkAction): Promise<void> {
    const ids = [...this.ids];
    if (ids.length === 0) return;
    const label = LABELS[action];
    const what =
      action === 'cancel'
        ? 'Each is cancelled as its own Cancel button would; the summary lists any that could not be.'
        : 'Dead letters get a fresh attempt budget; scheduled and retryable tasks become due now.';
    if (!(await confirmDialog(`${label} ${num(ids.length)} selected task(s)? ${what}`))) return;
    let answer: BulkTaskAnswer;
    try {
      answer = (await post(`/api/tasks/bulk/${action}`, { ids })) as BulkTaskAnswer;
    } catch (err) {
      toast(`${label} failed: ${messageOf(err)}`, true);
      return;
    }
    this.ids.clear();
    showResult(action, answer);
    toast(summarise(action, answer));
    refresh(true);
  }
}
