/**
 * Every repository file the docs name exists. What counts as a reference:
 *
 * - a path from the repository root: `src/…`, `test/…`, `scripts/…`, `bench/…`, `docs/…`, and
 *   `spec/…`, `demo/…`, `deploy/…`;
 * - a module path written relative to src/, as the architecture tables do (`storage/complete.ts`,
 *   `processor/claim.ts`, `dashboard/`): its first folder is one under src/, and it names a file
 *   (it has an extension) or a folder (it ends in `/`), so that prose such as "producer/worker"
 *   is not read as a path;
 * - a bare file name (`history.ts`, `alerts.test.ts`). In a table row that names a path (the
 *   module the row is about: `src/dashboard/`, then `actions.ts`; `storage/complete.ts` +
 *   `history.ts`), it must be in the folder of one of the row's paths, a folder above it, test/
 *   (tests are cited by file name alone) or the page's own folder; elsewhere (prose, a row naming
 *   no path) some file of that name must exist in the repository.
 *
 * A token with `<`, `*`, `…`, `{` or `$` in it is a pattern (`range_settlements_<n>`,
 * `attempt_history_<n>`, `src/schema/migrations/NNNN_*.sql`), not a path; a word with neither a
 * slash nor a file extension (an SQL table) is not one either. Pure: reads the docs and the tree,
 * needs no database.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../', import.meta.url));

/** The pages checked (whichever exist). */
const PAGES = [
  'docs/architecture.md',
  'docs/migrations.md',
  'docs/seed-coverage.md',
  'docs/operations.md',
  'docs/api.md',
  'docs/configuration.md',
  'docs/testing.md',
  'docs/dashboard-api.md',
  'docs/scaling.md',
  'README.md',
];

/** Top-level folders of the repository whose paths the docs name. */
const TOP_FOLDERS = new Set(['src', 'test', 'scripts', 'bench', 'docs', 'spec', 'demo', 'deploy']);

/** Folders directly under src/: `storage/complete.ts` in a table means `src/storage/complete.ts`. */
const SRC_FOLDERS = new Set(
  readdirSync(join(ROOT, 'src'), { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => d.name),
);

/**
 * Names the docs use for files that are not in a checkout, on purpose, each with why. Keyed by
 * the reference as written.
 */
const NOT_IN_REPOSITORY: ReadonlyMap<string, string> = new Map([
  // The reader's own task module in the examples (`berth worker --tasks ./tasks.js`, `// tasks.js`).
  ['tasks.js', "the reader's task module"],
  // The runtime's name (README, "Requirements").
  ['Node.js', 'the runtime'],
  // What the typescript@7 npm package's lib/ holds (architecture.md, "Code style").
  ['tsc.js', 'in the typescript package'],
  ['getExePath.js', 'in the typescript package'],
  ['version.cjs', 'in the typescript package'],
  // Prometheus's own configuration file, next to which operations.md says to copy the rules.
  ['prometheus.yml', "the reader's Prometheus configuration"],
  // The files the README's program and testing.md's example test tell the reader to save.
  ['main.mts', "the reader's program"],
  ['receipts.test.mts', "the reader's test file"],
  // The files of the README's "In your own project" (definitions.ts imported as definitions.js).
  ['definitions.ts', "the reader's task definitions"],
  ['definitions.js', "the reader's task definitions, as imported"],
  ['checkout.ts', "the reader's producer"],
  ['send-receipt.test.ts', "the reader's test file"],
  // The routing table docs/scaling.md has producers and workers share.
  ['routing.ts', "the reader's routing table"],
  ['routing.js', "the reader's routing table, as imported"],
]);

/** What separates words in Markdown prose, tables and code spans. */
const SEPARATORS = /[\s`'"()[\]<>,;]+/;
/** Pattern marks: a token with one of these stands for many names. */
const PATTERN = /[*…{}$%<>]/;
/** File extensions a bare name must end in to be taken for a file. */
const FILE_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]*\.(?:ts|mts|cts|js|mjs|cjs|json|jsonc|sql|md|css|qnt|sh|ya?ml|png|svg)$/;

export type PathReference =
  /** A path from the repository root. */
  | { kind: 'path'; written: string; path: string; line: number }
  /** A bare file name: in one of `folders`, or, when there are none, anywhere. */
  | { kind: 'name'; written: string; folders: string[]; line: number };

/** The repository files a page names; `page` is its path from the root. */
export function pathReferences(text: string, page = 'README.md'): PathReference[] {
  const pageFolder = posix.dirname(page) === '.' ? '' : posix.dirname(page);
  const refs: PathReference[] = [];
  text.split('\n').forEach((lineText, i) => {
    const line = i + 1;
    const isRow = lineText.trimStart().startsWith('|');
    const tokens = lineText
      // A table's cell borders (`\|` is a pipe inside a cell) separate words too.
      .split(isRow ? /(?<!\\)\||[\s`'"()[\]<>,;]+/ : SEPARATORS)
      .map((t) => clean(t ?? ''))
      .filter((t) => t !== '' && !PATTERN.test(t));
    const paths = new Map<string, string>();
    for (const written of tokens) {
      const path = written.includes('/') ? resolvePath(written) : null;
      if (path) paths.set(written, path);
    }
    // Where a bare name in this row may be: beside any path the row names, in test/ (the docs
    // cite tests by file name alone: `claim.test.ts` "…"), or beside the page (`architecture.md`
    // from docs/). Prose, or a row naming no path: anywhere.
    const folders =
      isRow && paths.size > 0
        ? [...new Set([...[...paths.values()].flatMap((p) => ancestors(folderOf(p))), 'test', pageFolder])]
        : [];
    for (const written of tokens) {
      const path = paths.get(written);
      if (path) refs.push({ kind: 'path', written, path, line });
      else if (!written.includes('/') && FILE_NAME.test(written)) refs.push({ kind: 'name', written, folders, line });
    }
  });
  return refs;
}

/** Markdown emphasis, a leading `./`, an anchor, a `:line` and trailing punctuation taken off. */
function clean(token: string): string {
  let t = token.replace(/^[*_]+/, '').replace(/[*_]+$/, '');
  t = t.replace(/^\.\//, '');
  t = t.replace(/#.*$/, '');
  t = t.replace(/:\d+(?::\d+)?$/, '');
  t = t.replace(/[.:!?\\]+$/, '');
  return t;
}

/** The path from the root, or null when the token is no reference to a repository file. */
function resolvePath(written: string): string | null {
  const first = written.slice(0, written.indexOf('/'));
  if (TOP_FOLDERS.has(first)) return written;
  if (SRC_FOLDERS.has(first) && (written.endsWith('/') || FILE_NAME.test(posix.basename(written)))) {
    return `src/${written}`;
  }
  return null;
}

/** The folder a path names or sits in, from the root, without a trailing slash. */
function folderOf(path: string): string {
  if (path.endsWith('/')) return path.slice(0, -1);
  const full = join(ROOT, path);
  if (existsSync(full) && statSync(full).isDirectory()) return path;
  return posix.dirname(path);
}

/** The folder and each of its parents up to the root (''). */
function ancestors(folder: string): string[] {
  const out: string[] = [];
  for (let f = folder; ; f = posix.dirname(f)) {
    out.push(f === '.' ? '' : f);
    if (f === '.' || f === '' || !f.includes('/')) break;
  }
  if (out.at(-1) !== '') out.push('');
  return out;
}

/**
 * Every file name in the repository (sources, tests, docs, deploy files), for a bare name in
 * prose. What .gitignore keeps out of a checkout is left out, so a name passes only if a fresh
 * clone has it.
 */
function repositoryFileNames(): Set<string> {
  const names = new Set<string>();
  const skipNames = new Set(['node_modules', '.git', 'dist']);
  const skipPaths = new Set(['.berth', 'scratch', 'bench/results', 'bench/.probe']);
  const walk = (dir: string) => {
    for (const entry of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
      const path = dir === '' ? entry.name : `${dir}/${entry.name}`;
      if (skipNames.has(entry.name) || skipPaths.has(path) || entry.name.endsWith('.log')) continue;
      if (entry.isDirectory()) walk(path);
      else names.add(entry.name);
    }
  };
  walk('');
  return names;
}

test('pathReferences: what counts as a path', () => {
  const found = (text: string) =>
    pathReferences(text).map((r) => (r.kind === 'path' ? r.path : `${r.written} in ${r.folders.join(',') || '*'}`));
  assert.deepEqual(found('see `src/sql.ts`, `docs/benchmarks.md`, "Bulk enqueue".'), [
    'src/sql.ts',
    'docs/benchmarks.md',
  ]);
  assert.deepEqual(found('`dashboard/` and `cli/terminal.ts`; (test/claim.test.ts)'), [
    'src/dashboard/',
    'src/cli/terminal.ts',
    'test/claim.test.ts',
  ]);
  assert.deepEqual(found('[api](docs/api.md#traces) and src/processor/claim.ts:12'), [
    'docs/api.md',
    'src/processor/claim.ts',
  ]);
  // A bare name in a table: beside one of the row's paths or in test/; in prose, anywhere.
  assert.deepEqual(found('| complete | `storage/complete.ts` + `history.ts` | `ready` |'), [
    'src/storage/complete.ts',
    'history.ts in src/storage,src,,test',
  ]);
  assert.deepEqual(found('| `src/dashboard/` | the pages (docs/operations.md); `actions.ts` the actions |'), [
    'src/dashboard/',
    'docs/operations.md',
    'actions.ts in src/dashboard,src,,docs,test',
  ]);
  assert.deepEqual(found('| 000-30 | deploy/prometheus/a.yaml (`x\\|y`) | alerts.test.ts "promtool" |'), [
    'deploy/prometheus/a.yaml',
    'alerts.test.ts in deploy/prometheus,deploy,,test',
  ]);
  assert.deepEqual(found('| 000-31 | metrics.ts | alerts.test.ts |'), ['metrics.ts in *', 'alerts.test.ts in *']);
  assert.deepEqual(found('both statements (`claim-one-lane.ts`) agree'), ['claim-one-lane.ts in *']);
  // Patterns, tables, prose, addresses and values are not paths.
  assert.deepEqual(
    found(
      '`range_settlements_<n>`, `attempt_history_<n>`, `src/schema/migrations/NNNN_*.sql`, `src/**/*.ts`, ' +
        'producer/worker roles, read/write, `cancel:<lane>:<lane_seq>`, https://example.com/src/x.ts, ' +
        '`./migrations/`, `ready`, `dist/schema/migrations/`, test/…, `worker.events`, `lanes.version`, ' +
        '`/assets/app.js`, `berth-queue/testing`',
    ),
    [],
  );
});

test('every repository file the docs name exists', () => {
  const names = repositoryFileNames();
  const missing: string[] = [];
  let checked = 0;
  for (const page of PAGES) {
    const file = join(ROOT, page);
    if (!existsSync(file)) continue;
    for (const ref of pathReferences(readFileSync(file, 'utf8'), page)) {
      if (NOT_IN_REPOSITORY.has(ref.written)) continue;
      checked++;
      if (ref.kind === 'path') {
        if (existsSync(join(ROOT, ref.path))) continue;
        const as = ref.written === ref.path ? '' : ` (read as ${ref.path})`;
        missing.push(`${page}:${ref.line}: ${ref.written}${as}`);
      } else if (ref.folders.length === 0) {
        if (names.has(ref.written)) continue;
        missing.push(`${page}:${ref.line}: ${ref.written} (no file of that name in the repository)`);
      } else {
        if (ref.folders.some((f) => existsSync(join(ROOT, f, ref.written)))) continue;
        missing.push(`${page}:${ref.line}: ${ref.written} (in none of ${ref.folders.map((f) => `${f}/`).join(', ')})`);
      }
    }
  }
  assert.ok(checked > 300, `only ${checked} references found: is the extraction broken?`);
  assert.deepEqual(missing, [], `files named in the docs that do not exist:\n${missing.join('\n')}`);
});
