/**
 * DOM helpers: every piece of data goes in as a text node or an attribute value, never as
 * markup (nothing here touches innerHTML), so payloads and errors cannot inject anything.
 */

/** What `h` and `s` take as children: nodes, text, nested lists; null, undefined and false draw nothing. */
export type Child = Node | string | number | null | undefined | false | readonly Child[];

/**
 * Attributes: `on<event>` adds a listener, `text` sets the text, `value` the form value;
 * null, undefined and false leave the attribute out, true sets it empty.
 */
export type Attrs = Readonly<Record<string, string | number | boolean | null | undefined | ((event: Event) => void)>>;

function isList(c: Child): c is readonly Child[] {
  return Array.isArray(c);
}

export function append<E extends Element>(el: E, children: Child): E {
  for (const c of isList(children) ? children : [children]) {
    if (c === null || c === undefined || c === false) continue;
    if (isList(c)) append(el, c);
    else el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
  }
  return el;
}

function setAttrs<E extends Element>(el: E, attrs: Attrs): E {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (typeof v === 'function') {
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    } else if (k === 'text') {
      el.textContent = String(v);
    } else if (k === 'value' && 'value' in el) {
      el.value = String(v);
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  return el;
}

/** An HTML element. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  children: Child = [],
): HTMLElementTagNameMap[K] {
  return append(setAttrs(document.createElement(tag), attrs), children);
}

const SVG = 'http://www.w3.org/2000/svg';

/** An SVG element (the charts). */
export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  children: Child = [],
): SVGElementTagNameMap[K] {
  return append(setAttrs(document.createElementNS(SVG, tag), attrs), children);
}

export function clear<E extends Element>(el: E): E {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** An element the server-rendered shell always has (src/dashboard/pages.ts). */
export function byId(id: string): HTMLElement {
  const el = document.getElementById(id);
  if (!el) throw new Error(`the page has no #${id}`);
  return el;
}
