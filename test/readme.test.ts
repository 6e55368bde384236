/**
 * The examples of README.md and the docs (testing, configuration, operations) cannot rot:
 * - every ```ts block (and ```js block) is written to a temporary project as a module of its
 *   own (named by its first line when that is a comment `// name.mts`), with `berth-queue` and
 *   its subpaths mapped to src/ through tsconfig `paths`, and type-checked by the repo's tsc
 *   under the repo's own compiler options (strict, noUncheckedIndexedAccess), JavaScript
 *   included (checkJs). A block that uses a name it does not define fails here.
 * - the README's quick start (`main.mts`) runs as pasted, against a database of its own created
 *   for it: it migrates, enqueues in a transaction, its worker runs the task (it prints the line
 *   the README promises), and SIGINT stops it cleanly (exit 0, nothing left running).
 * - docs/testing.md's example test file passes under `node --test` against another database.
 * docs/api.md, architecture.md and the rest hold no TypeScript examples. An example may import
 * another by its file name (`./tasks.js`, the README's task module).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { DATABASE_URL, scaled } from './helpers.js';
import { quoteIdent } from '../src/sql.js';

const root = fileURLToPath(new URL('..', import.meta.url));
// The TypeScript 7 compiler by its package's path: node_modules/.bin/tsc can be 5.9's, whose
// npm alias (typescript5) has a bin of the same name (docs/architecture.md, "Code style").
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
const DOCS = ['README.md', 'docs/testing.md', 'docs/configuration.md', 'docs/operations.md'];
/** Liveness bound for one step on a loaded machine; never a timing assertion. */
const STEP_MS = scaled(240_000);

interface Block {
  doc: string;
  /** 1-based line of the opening fence. */
  line: number;
  file: string;
  code: string;
}

/** The ```ts and ```js blocks of a Markdown file, each with the file name it is written to. */
export function extractBlocks(doc: string, markdown: string): Block[] {
  const blocks: Block[] = [];
  const fence = /^```(ts|js)\n([\s\S]*?)^```$/gm;
  const stem = doc.replace(/\.md$/, '').replace(/[^A-Za-z0-9]+/g, '-');
  for (const m of markdown.matchAll(fence)) {
    const code = m[2]!;
    const line = markdown.slice(0, m.index).split('\n').length;
    const named = /^\/\/ ([\w.-]+\.(?:mts|ts|mjs|js))\n/.exec(code)?.[1];
    const file = named ?? `${stem}-line${line}.${m[1] === 'ts' ? 'mts' : 'mjs'}`;
    blocks.push({ doc, line, file, code });
  }
  return blocks;
}

const blocks = DOCS.flatMap((doc) => extractBlocks(doc, readFileSync(join(root, doc), 'utf8')));
const tmp = mkdtempSync(join(tmpdir(), 'berth-readme-'));
const databases = { main: `berth_readme_main_${process.pid}`, testing: `berth_readme_testing_${process.pid}` };
const admin = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });

/** The test database's URL with another database name. */
function databaseUrl(name: string): string {
  const url = new URL(DATABASE_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

/** The environment of a child process: no test-runner context (a nested `node --test` would report to us in its wire format). */
function childEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = { ...process.env, ...extra };
  delete env.NODE_TEST_CONTEXT;
  return env;
}

async function dropDatabases(): Promise<void> {
  for (const name of Object.values(databases))
    await admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`);
}

describe('the examples in README.md and the docs', () => {
  before(async () => {
    symlinkSync(join(root, 'node_modules'), join(tmp, 'node_modules'), 'dir');
    // An ES module project, as the README's task module (`tasks.js`, with `import`) assumes.
    writeFileSync(
      join(tmp, 'package.json'),
      JSON.stringify({ name: 'readme-examples', private: true, type: 'module' }),
    );
    const seen = new Set<string>();
    for (const b of blocks) {
      assert.ok(!seen.has(b.file), `two examples are both named ${b.file}`);
      seen.add(b.file);
      writeFileSync(join(tmp, b.file), b.code);
    }
    const entry = (file: string) => [join(root, 'src', file)];
    writeFileSync(
      join(tmp, 'tsconfig.json'),
      JSON.stringify({
        extends: join(root, 'tsconfig.json'),
        compilerOptions: {
          noEmit: true,
          rootDir: '/',
          // An example may end with the value it shows how to make (a worker, a server).
          noUnusedLocals: false,
          allowJs: true,
          checkJs: true,
          // What the published package's `exports` map to, as source (tsx honours these too).
          paths: {
            'berth-queue': entry('index.ts'),
            'berth-queue/maintenance': entry('maintenance-api.ts'),
            'berth-queue/testing': entry('testing-api.ts'),
          },
        },
        include: [...seen],
        exclude: [],
      }),
    );
    await dropDatabases();
    for (const name of Object.values(databases)) await admin.query(`CREATE DATABASE ${quoteIdent(name)}`);
  });

  after(async () => {
    await dropDatabases().catch(() => undefined);
    await admin.end();
    rmSync(tmp, { recursive: true, force: true });
  });

  test('the docs hold the examples this test runs', () => {
    const files = blocks.map((b) => `${b.doc}: ${b.file}`);
    assert.ok(files.includes('README.md: main.mts'), files.join('\n'));
    assert.ok(files.includes('docs/testing.md: receipts.test.mts'), files.join('\n'));
  });

  test('every example type-checks', async () => {
    const out = await new Promise<string>((resolve) => {
      execFile(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: tmp, timeout: STEP_MS }, (err, stdout, stderr) =>
        resolve(err ? `${stdout}${stderr}` || err.message : ''),
      );
    });
    // Name the Markdown line of each error's block, not only the temporary file.
    const located = out.replace(/^([\w.-]+)\((\d+),/gm, (all, file: string, line: string) => {
      const b = blocks.find((x) => x.file === file);
      return b ? `${b.doc}:${b.line + Number(line)} (${all}` : all;
    });
    assert.equal(located, '', 'tsc found errors in the examples');
  });

  test("the README's quick start runs as pasted: the task runs, and SIGINT stops it cleanly", async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'main.mts'], {
      cwd: tmp,
      env: childEnv({ DATABASE_URL: databaseUrl(databases.main) }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.once('exit', (code, signal) => resolve({ code, signal })),
    );
    try {
      const sent = await Promise.race([
        (async () => {
          for (const deadline = Date.now() + STEP_MS; Date.now() < deadline; ) {
            if (/^sent "Your receipt for order 1" to ada@example\.com$/m.test(output)) return true;
            await new Promise((r) => setTimeout(r, 50));
          }
          return false;
        })(),
        exited.then(() => false),
      ]);
      assert.ok(sent, `the example sent its receipt:\n${output}`);
      assert.match(output, /^order 1: task \d+ is ready$/m);
      child.kill('SIGINT');
      let timer: NodeJS.Timeout | undefined;
      const end = await Promise.race([exited, new Promise<null>((r) => (timer = setTimeout(() => r(null), STEP_MS)))]);
      clearTimeout(timer);
      assert.deepEqual(end, { code: 0, signal: null }, `it exits once stopped:\n${output}`);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
    const db = new pg.Client({ connectionString: databaseUrl(databases.main) });
    await db.connect();
    try {
      const done = await db.query<{ n: string }>(
        `SELECT count(*)::text AS n FROM berth.leased_entries WHERE type = 'send_receipt' AND outcome = 'completed'`,
      );
      assert.equal(done.rows[0]?.n, '1');
    } finally {
      await db.end();
    }
  });

  test("docs/testing.md's example test passes", async () => {
    const result = await new Promise<{ code: number | null; output: string }>((resolve) => {
      execFile(
        process.execPath,
        ['--import', 'tsx', '--test', 'receipts.test.mts'],
        { cwd: tmp, env: childEnv({ DATABASE_URL: databaseUrl(databases.testing) }), timeout: STEP_MS },
        (err, stdout, stderr) =>
          resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, output: `${stdout}${stderr}` }),
      );
    });
    assert.equal(result.code, 0, result.output);
    assert.match(result.output, /^# pass 2$/m);
    assert.match(result.output, /^# fail 0$/m);
  });
});
