/**
 * What `import 'berth-queue'` loads. A worker or a producer pays for every package the root
 * entry point loads, in start-up time and in heap its first collections must scan, so a package
 * that only the dashboard or the CLI needs is loaded where it is used. zod (~90 ms and ~4 MB of
 * heap here) reads a worker's maintenance report for the dashboard and `berth leader`; a
 * worker never does. The test loads src/index.ts in a new Node process with a resolve hook that
 * prints every package specifier resolved, so no database is needed.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const root = fileURLToPath(new URL('..', import.meta.url));

/** Prints `PKG <specifier>` on stderr for every bare specifier a module of src/ imports. */
const hook = `
export async function resolve(specifier, context, next) {
  if (!/^(\\.|\\/|node:|file:|data:)/.test(specifier) && (context.parentURL ?? '').includes('/src/')) {
    process.stderr.write('PKG ' + specifier + '\\n');
  }
  return next(specifier, context);
}`;
const register = `import { register } from 'node:module'; register(${JSON.stringify(
  `data:text/javascript,${encodeURIComponent(hook)}`,
)});`;

async function packagesLoadedBy(entry: string): Promise<Set<string>> {
  const { stderr } = await run(
    process.execPath,
    [
      '--import',
      'tsx',
      '--import',
      `data:text/javascript,${encodeURIComponent(register)}`,
      '-e',
      `await import(${JSON.stringify(entry)})`,
      '--input-type=module',
    ],
    { cwd: root, timeout: 120_000 },
  );
  return new Set(
    stderr
      .split('\n')
      .filter((l) => l.startsWith('PKG '))
      .map((l) =>
        l
          .slice(4)
          .split('/')
          .slice(0, l.slice(4).startsWith('@') ? 2 : 1)
          .join('/'),
      ),
  );
}

test('the root entry point loads what a worker and a producer use, and not zod', async () => {
  const loaded = await packagesLoadedBy('./src/index.ts');
  // The hook saw the graph: a worker's own packages are there.
  for (const pkg of ['pg', 'pino', 'prom-client'])
    assert.ok(loaded.has(pkg), `${pkg} is loaded (saw ${[...loaded].join(', ')})`);
  assert.ok(
    !loaded.has('zod'),
    `zod is loaded only where a maintenance report is read (saw ${[...loaded].join(', ')})`,
  );
});

test('the hook sees zod where a maintenance report is read, so the check above can fail', async () => {
  const loaded = await packagesLoadedBy('./src/admin/worker-report.ts');
  assert.ok(loaded.has('zod'));
});
