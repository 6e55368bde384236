import type { Child } from './dom.js';

/** Where the hash points: `#/page?filters`, or `#/tasks/<id>` (page `task`). */
export interface Route {
  page: string;
  /** The navigation link to mark active. */
  nav: string;
  /** The task id on the task page. */
  id?: string;
  params: URLSearchParams;
}

/**
 * A page of the dashboard: `mount` once when the route changes (filters and bulk actions
 * above the body), then `load` and `render` on every refresh.
 */
export interface View<T> {
  title: string;
  mount?: (el: HTMLElement, route: Route) => Child[];
  load: (route: Route) => Promise<T>;
  render: (el: HTMLElement, data: T, route: Route) => void;
}

/** A load's result: the data's JSON text (to skip redrawing what did not change) and how to draw it. */
export interface Loaded {
  text: string;
  draw: (el: HTMLElement) => void;
}

/** A view with its data type hidden, so the router can hold every page in one table. */
export interface Page {
  title: string;
  mount: (el: HTMLElement, route: Route) => Child[];
  load: (route: Route) => Promise<Loaded>;
}

export function page<T>(view: View<T>): Page {
  return {
    title: view.title,
    mount: (el, route) => (view.mount ? view.mount(el, route) : []),
    load: (route) =>
      view.load(route).then((data) => ({ text: JSON.stringify(data), draw: (el) => view.render(el, data, route) })),
  };
}
