/** What the server-rendered shell tells the client (src/dashboard/pages.ts writes these meta tags). */

function meta(name: string): string {
  const m = document.querySelector(`meta[name="${name}"]`);
  return m ? m.getAttribute('content') || '' : '';
}

/** The dashboard's base path ('' at the root, '/ops/berth' mounted below it). */
export const BASE = meta('berth-base');
/** Sent as x-berth-csrf with every action. */
export const CSRF = meta('berth-csrf');
/** Actions turned off: no action buttons are drawn. */
export const READ_ONLY = meta('berth-read-only') === '1';
