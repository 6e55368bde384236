import { messageOf } from './api.js';
import { append, clear, h } from './dom.js';
import type { Page, Route } from './view.js';

/** How often the shown page re-reads its data while the tab is visible. */
const REFRESH_MS = 2500;

interface Shown {
  route: Route;
  page: Page;
  /** Where the page draws its data (below its title and filters). */
  body: HTMLElement;
}

const state: { shown: Shown | null; timer: number | undefined; generation: number; lastJson: string | null } = {
  shown: null,
  timer: undefined,
  // Bumped on every route change: an answer for an earlier route is dropped, not drawn.
  generation: 0,
  lastJson: null,
};

/** Show a newly mounted page: its data is loaded now and then every REFRESH_MS. */
export function show(shown: Shown): void {
  state.shown = shown;
  state.generation++;
  state.lastJson = null;
  refresh(true);
}

/** Keep what the operator is typing or has chosen (and where) across a re-render. */
function keepInputs(el: HTMLElement, draw: () => void): void {
  const kept = new Map<string, string>();
  const focused = document.activeElement?.getAttribute('data-keep');
  for (const input of el.querySelectorAll('[data-keep]')) {
    if (input instanceof HTMLInputElement || input instanceof HTMLSelectElement)
      kept.set(input.getAttribute('data-keep') ?? '', input.value);
  }
  draw();
  for (const input of el.querySelectorAll('[data-keep]')) {
    if (!(input instanceof HTMLInputElement || input instanceof HTMLSelectElement)) continue;
    const k = input.getAttribute('data-keep') ?? '';
    const value = kept.get(k);
    if (value) input.value = value;
    if (k === focused) input.focus();
  }
}

/**
 * Load the shown page's data and draw it if it changed (always when `now`), then schedule the
 * next refresh. A hidden tab is not refreshed: it resumes when it is visible again.
 */
export function refresh(now: boolean): void {
  clearTimeout(state.timer);
  state.timer = undefined;
  if (document.hidden) {
    setLive('paused');
    return;
  }
  const shown = state.shown;
  if (!shown) return;
  const gen = state.generation;
  void shown.page
    .load(shown.route)
    .then(
      (loaded) => {
        if (gen !== state.generation) return;
        if (loaded.text !== state.lastJson || now) {
          state.lastJson = loaded.text;
          keepInputs(shown.body, () => loaded.draw(shown.body));
        }
        setLive('live');
      },
      (err: unknown) => {
        if (gen !== state.generation) return;
        setLive('error');
        state.lastJson = null;
        append(clear(shown.body), h('p', { class: 'error-text', role: 'alert' }, messageOf(err)));
      },
    )
    .then(() => {
      if (gen !== state.generation || document.hidden) return;
      clearTimeout(state.timer);
      state.timer = setTimeout(() => refresh(false), REFRESH_MS);
    });
}

/** Stop refreshing while the tab is hidden. */
export function pause(): void {
  clearTimeout(state.timer);
  setLive('paused');
}

/** Go to a route; to the one already shown, refresh it now. */
export function go(hash: string): void {
  if (location.hash === hash) refresh(true);
  else location.hash = hash;
}

/** The header's live / paused / error indicator. */
function setLive(mode: 'live' | 'paused' | 'error'): void {
  const el = document.getElementById('live');
  if (!el) return;
  el.textContent = mode;
  el.className = `live ${mode}`;
}
