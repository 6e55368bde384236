import { APP_CSS } from './app-css.js';
import { APP_JS } from './app-js.js';
import { LOGIN_JS } from './login-js.js';

/** Static assets by path: content type and body. Code and styles only, never data. */
export const ASSETS: Readonly<Record<string, readonly [string, string]>> = Object.freeze({
  '/assets/app.css': ['text/css; charset=utf-8', APP_CSS],
  '/assets/app.js': ['text/javascript; charset=utf-8', APP_JS],
  '/assets/login.js': ['text/javascript; charset=utf-8', LOGIN_JS],
});
