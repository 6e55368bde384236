/**
 * Review of e20c403 (architecture.md, "Eager compilation"): the enqueue path's functions became
 * `const f = (function (…) {…});` (named at first, `(function f(…)`; anonymous since this
 * review). A const is in its temporal dead zone until its module has evaluated that line, where a function declaration was usable from the module's instantiation:
 * a call at module load (a top-level statement, or an import cycle that runs an importer's
 * top-level code before the module finished) would now throw a ReferenceError.
 *
 * Attacks: every package entry point and the CLI load in a fresh process; no converted module is
 * on an import cycle of value imports (the only way a later module's load could reach a const
 * first); no converted function is called at a module's top level; the functions keep their
 * names and kinds (names appear in stack traces and logs).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'src');

/** The modules e20c403 converted and the functions it converted in each. */
const CONVERTED: Record<string, readonly string[]> = {
  'producer/enqueue.ts': [
    'enqueueTasks',
    'enqueueInSchema',
    'sameLane',
    'enqueueChunk',
    'readResults',
    'isPlain',
    'enqueueOneStatement',
    'resolveTaskSpecs',
    'whereOf',
    'resolveTaskSpec',
  ],
  'limits.ts': ['unstorable', 'checkText', 'checkKeys', 'checkPayloadJson', 'unstorableInJson'],
  'sql.ts': ['quoteIdent', 'statementName', 'preparedName', 'textHash', 'bindSchema'],
  'statement.ts': ['positional', 'placeholdersOf'],
  'storage/storage.ts': ['storageFor'],
  'tracing.ts': ['nothingRegistered', 'captureTraceContext'],
  'db/prepared.ts': ['executorFor', 'isPreparedStatementsOption'],
};
const ALL_NAMES = new Set(Object.values(CONVERTED).flat());

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      if (p === join(src, 'dashboard', 'client')) continue;
      out.push(...sources(p));
    } else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/** Relative value imports of a module (an `import type` or all-`type` specifier list is erased). */
function valueImports(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const out: string[] = [];
  for (const m of text.matchAll(/^(import|export)\s+(type\s+)?([^;]*?)\s+from\s+'(\.[^']+)'/gms)) {
    if (m[2]) continue;
    const clause = m[3]!;
    const braces = /^\{([^}]*)\}$/s.exec(clause.trim());
    if (braces) {
      const items = braces[1]!
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
      if (items.length > 0 && items.every((s) => s.startsWith('type '))) continue;
    }
    out.push(resolve(dirname(file), m[4]!.replace(/\.js$/, '.ts')));
  }
  for (const m of text.matchAll(/^import\s+'(\.[^']+)'/gm))
    out.push(resolve(dirname(file), m[1]!.replace(/\.js$/, '.ts')));
  return out;
}

function node(args: string[]): string {
  return execFileSync(process.execPath, args, { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

for (const entry of [
  'src/index.ts',
  'src/maintenance-api.ts',
  'src/testing-api.ts',
  ...Object.keys(CONVERTED).map((m) => `src/${m}`),
]) {
  test(`${entry} loads as the first module of a fresh process`, () => {
    const href = pathToFileURL(join(root, entry)).href;
    node(['--import', 'tsx', '--input-type=module', '-e', `await import(${JSON.stringify(href)});`]);
  });
}

test('the CLI answers --help in a fresh process', () => {
  const out = node(['--import', 'tsx', 'src/cli.ts', '--help']);
  assert.match(out, /Usage: berth/);
});

test('no converted module is on an import cycle of value imports', () => {
  const files = sources(src);
  const graph = new Map(files.map((f) => [f, valueImports(f).filter((d) => files.includes(d))]));
  const reaches = (from: string, to: string): boolean => {
    const seen = new Set<string>();
    const stack = [...(graph.get(from) ?? [])];
    while (stack.length > 0) {
      const f = stack.pop()!;
      if (f === to) return true;
      if (seen.has(f)) continue;
      seen.add(f);
      stack.push(...(graph.get(f) ?? []));
    }
    return false;
  };
  const onCycle = Object.keys(CONVERTED).filter((m) => reaches(join(src, m), join(src, m)));
  assert.deepEqual(onCycle, []);
});

test('no converted function is called at a module top level (a line that starts at column 0)', () => {
  const call = new RegExp(`\\b(${[...ALL_NAMES].join('|')})\\(`);
  const found: string[] = [];
  for (const f of sources(src)) {
    const lines = readFileSync(f, 'utf8').split('\n');
    lines.forEach((line, i) => {
      if (!/^[A-Za-z_$]/.test(line) || !call.test(line)) return;
      // The definitions themselves, and function declarations whose parameters mention one.
      if (/^(export\s+)?(const\s+\w+\s*=\s*\((async\s+)?function|(async\s+)?function\*?\s)/.test(line)) return;
      found.push(`${relative(root, f)}:${i + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(found, []);
});

test('the exported converted functions keep their names and kinds', async () => {
  for (const [mod, names] of Object.entries(CONVERTED)) {
    const ns = (await import(pathToFileURL(join(src, mod)).href)) as Record<string, unknown>;
    for (const name of names) {
      if (!(name in ns)) continue; // module-private
      const f = ns[name] as (...a: unknown[]) => unknown;
      assert.equal(typeof f, 'function', `${mod} ${name}`);
      assert.equal(f.name, name, `${mod} ${name}.name`);
      assert.equal(f.constructor.name, 'Function', `${mod} ${name} stays a plain (sync) function`);
    }
  }
});

test("a converted function's own name in a stack trace is unchanged (quoteIdent's error)", async () => {
  const { quoteIdent } = await import('../src/sql.js');
  assert.throws(
    () => quoteIdent(''),
    (err: Error) => /at quoteIdent /.test(err.stack ?? '') && err.message === 'identifier must not be empty',
  );
});

test("bundled with esbuild at its defaults (no keepNames), a converted function keeps its name (quoteIdent's .name and stack frame)", async () => {
  // A service bundling berth (esbuild: serverless functions, single-file deploys) renamed a named
  // function expression whose name equals its const's (`const quoteIdent = (function quoteIdent2(…)`),
  // so stack traces and `.name` said quoteIdent2, enqueueTasks2, …; the expressions are anonymous
  // now, named by their binding.
  const esbuild = await import('esbuild');
  const out = await esbuild.build({
    entryPoints: [join(src, 'sql.ts')],
    bundle: true,
    platform: 'node',
    format: 'esm',
    write: false,
    packages: 'external',
    logLevel: 'silent',
  });
  const code = out.outputFiles[0]!.text;
  const mod = (await import(`data:text/javascript;base64,${Buffer.from(code).toString('base64')}`)) as {
    quoteIdent: (s: string) => string;
  };
  let stack = '';
  try {
    mod.quoteIdent('');
  } catch (err) {
    stack = (err as Error).stack ?? '';
  }
  assert.equal(mod.quoteIdent.name, 'quoteIdent');
  // Called through the bundle's module namespace, V8 names the receiver too (`Module.quoteIdent`).
  assert.match(stack, /at (Module\.)?quoteIdent /);
});
