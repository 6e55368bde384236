// Builds the dashboard's browser client: bundles src/dashboard/client/app.ts and login.ts with
// esbuild (one classic script each, an IIFE, as the pages load them with <script defer>) and
// copies app.css, into dist/dashboard/static/, which src/dashboard/assets.ts serves and the
// package ships. Not minified and no source maps: the bundles stay readable in the browser's
// debugger, and the package ships no map pointing at sources it does not include.
//
// Every file's first line names the sources it was built from (sha256, clientSourceHash in
// src/dashboard/client-hash.ts, imported from dist/): run from src/, the server refuses a build
// older than the client's sources. Run by `npm run build` (after tsc) or `npm run build:client`.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';

const root = fileURLToPath(new URL('..', import.meta.url));
const src = join(root, 'src', 'dashboard', 'client');
const out = join(root, 'dist', 'dashboard', 'static');

// The same function src/dashboard/assets.ts checks with, from tsc's output (the build runs tsc first).
const hashModule = join(root, 'dist', 'dashboard', 'client-hash.js');
if (!existsSync(hashModule)) {
  console.error(`build-client: ${relative(root, hashModule)} is missing; run npm run build (tsc comes first)`);
  process.exit(1);
}
const { clientSourceHash } = await import(pathToFileURL(hashModule).href);

const banner = `/* berth dashboard client: built by scripts/build-client.mjs from src/dashboard/client (sources sha256 ${clientSourceHash(src)}) */`;

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  absWorkingDir: root,
  entryPoints: { app: join(src, 'app.ts'), login: join(src, 'login.ts') },
  outdir: out,
  tsconfig: join(root, 'tsconfig.client.json'),
  bundle: true,
  format: 'iife',
  platform: 'browser',
  target: 'es2022',
  charset: 'utf8',
  banner: { js: banner },
  legalComments: 'none',
  sourcemap: false,
  minify: false,
  logLevel: 'warning',
});
writeFileSync(join(out, 'app.css'), `${banner}\n${readFileSync(join(src, 'app.css'), 'utf8')}`);
