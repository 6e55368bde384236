/**
 * The examples of README.md and the docs (testing, configuration, operations) cannot rot:
 * - every ```ts block (and ```js block) is written to a temporary project as a module of its
 *   own (named by its first line when that is a comment `// name.mts`), with `berth-queue` and
 *   its subpaths mapped to src/ through tsconfig `paths`, and type-checked by the repo's tsc
 *   under the repo's own compiler options (strict, noUncheckedIndexedAccess), JavaScript
 *   included (checkJs). A block that uses a name it does not define fails here.
 * - the README's one-file program (`main.mts`) runs as pasted, against a database of its own
 *   created for it: it migrates, enqueues in a transaction, its worker runs the task (it prints
 *   the line the README promises), and SIGINT stops it cleanly (exit 0, nothing left running).
 * - the README's "In your own project" files are a project: they type-check again in a folder of
 *   their own under the README's own package.json and tsconfig.json (with only `paths` and
 *   `noEmit` added), `placeOrder` from checkout.ts enqueues on a migrated database, worker.ts
 *   runs as the README says to run it in production (`node --import tsx worker.ts`), runs the
 *   task, and SIGTERM stops it (exit 0); its example test passes under `node --test`.
 * - docs/testing.md's example test file passes under `node --test` against another database.
 * docs/api.md, architecture.md and the rest hold no TypeScript examples. An example may import
 * another by its file name (`./tasks.js`, the README's task module).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { DATABASE_URL, scaled } from './helpers.js';
import { migrate } from '../src/index.js';
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
const databases = {
  main: `berth_readme_main_${process.pid}`,
  testing: `berth_readme_testing_${process.pid}`,
  own: `berth_readme_own_${process.pid}`,
};

/** The README's "In your own project" section: the files of a user's project and its config. */
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const ownSection = (() => {
  const start = readme.indexOf('\n## In your own project\n');
  const end = readme.indexOf('\n## ', start + 1);
  return readme.slice(start, end === -1 ? undefined : end);
})();
const ownBlocks = extractBlocks('README.md', ownSection);
/** The section's ```json blocks: the package.json fields and the tsconfig.json it tells to use. */
const ownJson = [...ownSection.matchAll(/^```json\n([\s\S]*?)^```$/gm)].map(
  (m) => JSON.parse(m[1]!) as Record<string, unknown>,
);
const own = join(tmp, 'own');
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

/** tsc's errors for the project in `dir`, or '' when it type-checks. */
function typeCheck(dir: string): Promise<string> {
  return new Promise<string>((resolve) => {
    execFile(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: dir, timeout: STEP_MS }, (err, stdout, stderr) =>
      resolve(err ? `${stdout}${stderr}` || err.message : ''),
    );
  });
}

/** Run a child to its end: its exit code and everything it printed. */
function runChild(
  args: string[],
  cwd: string,
  env: NodeJS.ProcessEnv,
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, args, { cwd, env, timeout: STEP_MS }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, output: `${stdout}${stderr}` }),
    );
  });
}

/**
 * Start a child, wait until its output matches `ready` (or it exits), send `signal`, and wait
 * for its exit. Kills it if it is still running at the end.
 */
async function runUntil(
  args: string[],
  cwd: string,
  env: NodeJS.ProcessEnv,
  ready: RegExp,
  signal: NodeJS.Signals,
): Promise<{ seen: boolean; end: { code: number | null; signal: NodeJS.Signals | null } | null; output: string }> {
  const child = spawn(process.execPath, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, sig) => resolve({ code, signal: sig })),
  );
  try {
    const seen = await Promise.race([
      (async () => {
        for (const deadline = Date.now() + STEP_MS; Date.now() < deadline; ) {
          if (ready.test(output)) return true;
          await new Promise((r) => setTimeout(r, 50));
        }
        return false;
      })(),
      exited.then(() => false),
    ]);
    if (!seen) return { seen, end: null, output };
    child.kill(signal);
    let timer: NodeJS.Timeout | undefined;
    const end = await Promise.race([exited, new Promise<null>((r) => (timer = setTimeout(() => r(null), STEP_MS)))]);
    clearTimeout(timer);
    return { seen, end, output };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

/** Run `fn` on a client of the database `name`. */
async function inDatabase(name: string, fn: (db: pg.Client) => Promise<void>): Promise<void> {
  const db = new pg.Client({ connectionString: databaseUrl(name) });
  await db.connect();
  try {
    await fn(db);
  } finally {
    await db.end();
  }
}

/** How many send_receipt tasks completed in the schema `berth`. */
async function completedReceipts(db: pg.Client): Promise<number> {
  const done = await db.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM berth.leased_entries WHERE type = 'send_receipt' AND outcome = 'completed'`,
  );
  return done.rows[0]?.n ?? 0;
}

/** An example test file passes under `node --test`, all `tests` of it, on the database `name`. */
async function examplePasses(file: string, cwd: string, name: string, tests: number): Promise<void> {
  const result = await runChild(
    ['--import', 'tsx', '--test', file],
    cwd,
    childEnv({ DATABASE_URL: databaseUrl(name) }),
  );
  assert.equal(result.code, 0, result.output);
  assert.match(result.output, new RegExp(`^# pass ${tests}$`, 'm'));
  assert.match(result.output, /^# fail 0$/m);
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
    assert.deepEqual(
      ownBlocks.map((b) => b.file),
      ['definitions.ts', 'checkout.ts', 'worker.ts', 'send-receipt.test.ts'],
    );
    assert.deepEqual(
      ownJson.map((j) => Object.keys(j)),
      [['type'], ['compilerOptions']],
      'a package.json fragment, then a tsconfig.json',
    );
  });

  test("the README's own-project files type-check under the README's package.json and tsconfig.json", async () => {
    mkdirSync(own);
    const [pkg, tsconfig] = ownJson as [Record<string, unknown>, { compilerOptions: Record<string, unknown> }];
    writeFileSync(join(own, 'package.json'), JSON.stringify({ name: 'own-project', private: true, ...pkg }));
    for (const b of ownBlocks) writeFileSync(join(own, b.file), b.code);
    const entry = (file: string) => [join(root, 'src', file)];
    writeFileSync(
      join(own, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          ...tsconfig.compilerOptions,
          noEmit: true,
          // berth-queue from source, as in the examples' project above (tsx honours these too);
          // the source sits outside the folder, which an installed package would not.
          rootDir: '/',
          paths: {
            'berth-queue': entry('index.ts'),
            'berth-queue/testing': entry('testing-api.ts'),
          },
        },
        include: ownBlocks.map((b) => b.file),
      }),
    );
    assert.equal(await typeCheck(own), '', 'tsc found errors in the own-project files');
  });

  test('every example type-checks', async () => {
    const out = await typeCheck(tmp);
    // Name the Markdown line of each error's block, not only the temporary file.
    const located = out.replace(/^([\w.-]+)\((\d+),/gm, (all, file: string, line: string) => {
      const b = blocks.find((x) => x.file === file);
      return b ? `${b.doc}:${b.line + Number(line)} (${all}` : all;
    });
    assert.equal(located, '', 'tsc found errors in the examples');
  });

  test("the README's one-file program runs as pasted: the task runs, and SIGINT stops it cleanly", async () => {
    const run = await runUntil(
      ['--import', 'tsx', 'main.mts'],
      tmp,
      childEnv({ DATABASE_URL: databaseUrl(databases.main) }),
      /^sent "Your receipt for order 1" to ada@example\.com$/m,
      'SIGINT',
    );
    assert.ok(run.seen, `the example sent its receipt:\n${run.output}`);
    assert.match(run.output, /^order 1: task \d+ is ready$/m);
    assert.deepEqual(run.end, { code: 0, signal: null }, `it exits once stopped:\n${run.output}`);
    await inDatabase(databases.main, async (db) => assert.equal(await completedReceipts(db), 1));
  });

  test("docs/testing.md's example test passes", () => examplePasses('receipts.test.mts', tmp, databases.testing, 2));

  test("the README's own project runs: placeOrder enqueues, `node --import tsx worker.ts` runs the task, SIGTERM stops it", async () => {
    const url = databaseUrl(databases.own);
    await migrate({ connectionString: url });
    await inDatabase(databases.own, async (db) => {
      await db.query('CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)');
      // The web app's side: a script of the test's own that calls the README's placeOrder.
      writeFileSync(
        join(own, 'place-order.ts'),
        [
          "import { placeOrder, pool } from './checkout.js';",
          "console.log('order', await placeOrder('ada@example.com'));",
          'await pool.end();',
        ].join('\n'),
      );
      const placed = await runChild(['--import', 'tsx', 'place-order.ts'], own, childEnv({ DATABASE_URL: url }));
      assert.equal(placed.code, 0, placed.output);
      assert.match(placed.output, /^order 1$/m);

      const run = await runUntil(
        ['--import', 'tsx', 'worker.ts'],
        own,
        childEnv({ DATABASE_URL: url }),
        /^mailed "Your receipt for order 1" to ada@example\.com$/m,
        'SIGTERM',
      );
      assert.ok(run.seen, `the worker ran the task:\n${run.output}`);
      assert.deepEqual(run.end, { code: 0, signal: null }, `it exits once stopped:\n${run.output}`);
      assert.equal(await completedReceipts(db), 1);
    });
  });

  test("the README's example test passes", () => examplePasses('send-receipt.test.ts', own, databases.own, 1));
});
