import { append, byId, clear, h } from './dom.js';
import { show } from './live.js';
import type { Route } from './view.js';
import { PAGES } from './views/index.js';

const main = byId('main');

/** The route in the hash: `#/page?filters`, `#/tasks/<id>`; anything else is the overview. */
function parseRoute(): Route {
  const hash = location.hash.replace(/^#\/?/, '');
  const q = hash.indexOf('?');
  const path = q < 0 ? hash : hash.slice(0, q);
  const params = new URLSearchParams(q < 0 ? '' : hash.slice(q + 1));
  const parts = path
    .split('/')
    .filter(Boolean)
    .map((p) => {
      try {
        return decodeURIComponent(p);
      } catch {
        return p;
      }
    });
  const [first, second] = parts;
  if (first === 'tasks' && second) return { page: 'task', nav: 'tasks', id: second, params };
  const name = first !== undefined && first !== 'task' && PAGES.has(first) ? first : 'overview';
  return { page: name, nav: name, params };
}

/** Draw the page the hash points at: title, navigation, filters, then its data (refreshed from then on). */
export function mount(): void {
  const route = parseRoute();
  const page = PAGES.get(route.page);
  if (!page) throw new Error(`no page ${route.page}`);
  document.title = `${page.title} · berth`;
  for (const a of document.querySelectorAll('[data-nav]'))
    a.classList.toggle('active', a.getAttribute('data-nav') === route.nav);
  const top = page.mount(main, route);
  const body = h('div', { class: 'view-body' }, h('p', { class: 'muted' }, 'Loading…'));
  append(clear(main), [h('h1', {}, page.title), top, body]);
  main.setAttribute('data-page', route.page);
  show({ route, page, body });
}
