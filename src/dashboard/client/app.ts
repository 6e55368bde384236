/**
 * The dashboard's client, served as /assets/app.js: one small single-page app. It polls the
 * JSON API every 2.5 s while the tab is visible and draws everything with DOM calls: data only
 * ever lands in text nodes and attribute values (never innerHTML), so payloads and errors
 * cannot inject markup. scripts/build-client.mjs bundles it (see docs/architecture.md).
 */
import { pause, refresh } from './live.js';
import { mount } from './router.js';
import { BASE, CSRF } from './shell.js';

document.addEventListener('visibilitychange', () => {
  if (document.hidden) pause();
  else refresh(true);
});
window.addEventListener('hashchange', mount);
document.getElementById('logout')?.addEventListener('click', () => {
  void fetch(`${BASE}/logout`, { method: 'POST', credentials: 'same-origin', headers: { 'x-berth-csrf': CSRF } }).then(
    () => {
      location.href = `${BASE}/login`;
    },
  );
});
mount();
