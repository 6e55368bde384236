import { query } from './api.js';
import { h } from './dom.js';
import { num } from './format.js';
import { go, refresh } from './live.js';

export interface Field {
  name: string;
  label: string;
  /** A choice of these (and "any") instead of free text. */
  options?: readonly string[];
  placeholder?: string;
}

/** A filter form. Its values live in the URL hash, so a filtered page can be linked. */
export function filterForm(page: string, fields: readonly Field[], params: URLSearchParams): HTMLFormElement {
  const inputs = new Map<string, HTMLInputElement | HTMLSelectElement>();
  const form = h(
    'form',
    {
      class: 'filters',
      onsubmit: (e) => {
        e.preventDefault();
        const next: Record<string, string> = {};
        for (const [k, input] of inputs) next[k] = input.value.trim();
        go(`#/${page}${query(next)}`);
      },
    },
    [
      fields.map((f) => {
        let input: HTMLInputElement | HTMLSelectElement;
        if (f.options) {
          input = h('select', { name: f.name }, [
            h('option', { value: '' }, 'any'),
            f.options.map((o) => h('option', { value: o }, o)),
          ]);
          input.value = params.get(f.name) || '';
          input.addEventListener('change', () => form.requestSubmit());
        } else {
          input = h('input', {
            name: f.name,
            type: 'search',
            placeholder: f.placeholder || 'any',
            value: params.get(f.name) || '',
          });
        }
        inputs.set(f.name, input);
        return h('label', {}, [f.label, ' ', input]);
      }),
      h('button', { type: 'submit' }, 'Apply'),
      h('a', { href: `#/${page}`, class: 'reset' }, 'Clear'),
    ],
  );
  return form;
}

/** Keyset paging: the cursors of the pages before this one. */
export class Pager {
  private readonly stack: (string | undefined)[] = [];
  /** The cursor of the page shown (undefined: the first). */
  after: string | undefined = undefined;

  controls(next: string | null, count: number): HTMLDivElement {
    return h('div', { class: 'pager' }, [
      h('span', { class: 'muted' }, `page ${this.stack.length + 1} · ${num(count)} shown`),
      h(
        'button',
        {
          type: 'button',
          disabled: this.stack.length === 0,
          onclick: () => {
            this.after = this.stack.pop();
            refresh(true);
          },
        },
        '← Previous page',
      ),
      h(
        'button',
        {
          type: 'button',
          disabled: !next,
          'data-next': next || '',
          onclick: () => {
            this.stack.push(this.after);
            this.after = next ?? undefined;
            refresh(true);
          },
        },
        'Next page →',
      ),
    ]);
  }
}
