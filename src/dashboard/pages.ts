/** The two server-rendered pages: the app shell (the rest is drawn by /assets/app.js) and the login form. */

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

export const NAV: readonly (readonly [string, string])[] = [
  ['overview', 'Overview'],
  ['lanes', 'Lanes'],
  ['tasks', 'Tasks'],
  ['attempts', 'Attempts'],
  ['dead', 'Dead letters'],
  ['queues', 'Queues'],
  ['schedules', 'Schedules'],
  ['maintenance', 'Maintenance'],
];

function head(base: string, title: string, extra = ''): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${escapeHtml(base)}/assets/app.css">
${extra}</head>`;
}

export interface ShellOptions {
  base: string;
  csrf: string;
  actor: string;
  readOnly: boolean;
  /** Logged in with the form: show a log-out button. */
  session: boolean;
}

export function shellPage(o: ShellOptions): string {
  const meta = [
    `<meta name="berth-base" content="${escapeHtml(o.base)}">`,
    `<meta name="berth-csrf" content="${escapeHtml(o.csrf)}">`,
    `<meta name="berth-read-only" content="${o.readOnly ? '1' : '0'}">`,
    `<script src="${escapeHtml(o.base)}/assets/app.js" defer></script>`,
  ].join('\n');
  const nav = NAV.map(([id, label]) => `<a href="#/${id}" data-nav="${id}">${escapeHtml(label)}</a>`).join('');
  return `${head(o.base, 'berth dashboard', `${meta}\n`)}
<body${o.readOnly ? ' class="read-only"' : ''}>
<header class="top">
  <span class="brand">berth</span>
  <nav>${nav}</nav>
  <span class="spacer"></span>
  ${o.readOnly ? '<span class="badge ro" title="actions are turned off">read-only</span>' : ''}
  <span class="live" id="live" title="refreshes every few seconds while this tab is visible">live</span>
  <span class="who" title="recorded on the audit log for every action">${escapeHtml(o.actor)}</span>
  ${o.session ? '<button type="button" id="logout" class="link">log out</button>' : ''}
</header>
<main id="main"><p class="muted">Loading…</p></main>
<div id="toast" role="status" aria-live="polite"></div>
<dialog id="confirm">
  <form method="dialog">
    <p id="confirm-text"></p>
    <menu><button value="cancel" type="submit">Cancel</button><button value="ok" type="submit" id="confirm-ok" class="danger">Confirm</button></menu>
  </form>
</dialog>
</body>
</html>
`;
}

/**
 * The token form; with Basic users configured too, a link that asks the browser for a user name
 * and password instead (`/basic`). /assets/login.js carries the `#/route` through either.
 */
export function loginPage(base: string, error: string | null, basic = false): string {
  const script = `<script src="${escapeHtml(base)}/assets/login.js" defer></script>\n`;
  return `${head(base, 'berth dashboard: log in', script)}
<body class="login">
<form method="post" action="${escapeHtml(base)}/login" class="login-box">
  <h1>berth dashboard</h1>
  ${error ? `<p class="error">${escapeHtml(error)}</p>` : ''}
  <label>Access token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
  <input type="hidden" name="next" value="">
  <button type="submit">Log in</button>
  ${basic ? `<p class="muted small">Have a user name and password instead? <a id="basic-login" href="${escapeHtml(base)}/basic">Sign in with them</a> (HTTP Basic: your browser asks).</p>` : ''}
</form>
</body>
</html>
`;
}

/** For a 401 when only Basic users are configured (the browser shows its own prompt first). */
export function unauthorizedPage(base: string): string {
  return `${head(base, 'berth dashboard')}
<body class="login"><div class="login-box"><h1>berth dashboard</h1><p>Authentication required.</p></div></body>
</html>
`;
}
