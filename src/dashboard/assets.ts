import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { clientSourceHash } from './client-hash.js';

/**
 * The dashboard's static assets: the browser client (/assets/app.js, /assets/login.js) and its
 * stylesheet (/assets/app.css). Their sources are TypeScript and CSS in src/dashboard/client,
 * type-checked on their own (tsconfig.client.json: DOM, no Node); `npm run build` bundles them
 * with esbuild (scripts/build-client.mjs) into dist/dashboard/static/, which the package ships.
 *
 * Why files read at start-up, not modules: the bundles are build output, git-ignored, and the
 * library never needs esbuild at run time. From dist/ they sit next to this module. From src/
 * (tsx: the tests, `npm start`, the demo) the same build output in dist/ is served, and its
 * banner names the sources it was built from (a sha256 over src/dashboard/client): a client
 * edited since the last build fails here, loudly, rather than serving stale code. `npm test`
 * and `npm start` run `npm install`, whose `prepare` builds, so a fresh clone always has them.
 * Not rebuilt on the fly from src/: that would put esbuild on this code path, and test files
 * starting dashboards at once would race on the output.
 */

/** Written by scripts/build-client.mjs as each file's first line; the hex digest is its sources'. */
const STAMP =
  /^\/\* berth dashboard client: built by scripts\/build-client\.mjs from src\/dashboard\/client \(sources sha256 ([0-9a-f]{64})\) \*\/\n/;

const FROM_SOURCE = import.meta.url.endsWith('.ts');
const STATIC_DIR = new URL(FROM_SOURCE ? '../../dist/dashboard/static/' : './static/', import.meta.url);
const CLIENT_DIR = new URL('./client/', import.meta.url);

const FILES: readonly (readonly [path: string, file: string, contentType: string])[] = [
  ['/assets/app.css', 'app.css', 'text/css; charset=utf-8'],
  ['/assets/app.js', 'app.js', 'text/javascript; charset=utf-8'],
  ['/assets/login.js', 'login.js', 'text/javascript; charset=utf-8'],
];

/** Content type and body by request path. Code and styles only, never data. */
export type Assets = ReadonlyMap<string, readonly [contentType: string, body: string]>;

let loaded: Assets | null = null;

/** The built assets, read once; throws, saying what to run, when they are missing or (from src/) stale. */
export function loadAssets(): Assets {
  if (loaded) return loaded;
  const expected = FROM_SOURCE ? clientSourceHash(fileURLToPath(CLIENT_DIR)) : null;
  const assets = new Map<string, readonly [string, string]>();
  for (const [path, file, contentType] of FILES) {
    const at = fileURLToPath(new URL(file, STATIC_DIR));
    let body: string;
    try {
      body = readFileSync(at, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      throw new Error(
        FROM_SOURCE
          ? `the dashboard's client is not built: ${at} is missing (run \`npm run build\`, or \`npm run build:client\` for the client alone)`
          : `the berth package is incomplete: ${at} is missing (it was built without scripts/build-client.mjs)`,
      );
    }
    const stamp = STAMP.exec(body)?.[1];
    if (expected !== null && stamp !== expected) {
      throw new Error(
        `the dashboard's client in ${fileURLToPath(STATIC_DIR)} is out of date: src/dashboard/client changed since it was built ` +
          '(run `npm run build:client`, or `npm run build`)',
      );
    }
    assets.set(path, [contentType, body]);
  }
  loaded = assets;
  return assets;
}
