/**
 * Issue 12, item 9: the CLI's usage errors. An unknown command (even with --help) is an error
 * with exit 2; an option error is one line without the usage dump; a duration needs its unit;
 * --run-at needs its zone; a `.ts` task module loads without `npx tsx` in front, through the
 * project's tsx on a Node that cannot strip types (and says what to install when there is none).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, cpSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { runCli } from './support/run-cli.js';
import { durationMs, isoDate } from '../src/cli/common.js';
import { enqueue } from '../src/index.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('cliusage');
const root = fileURLToPath(new URL('..', import.meta.url));

const berth = (...args: string[]) => runCli(args);

/**
 * The CLI as a plain Node program, without `--import tsx`: src/ transpiled file by file (with the
 * migrations beside it, as the build does) into a directory inside this checkout, so its
 * packages resolve from node_modules as an installed berth's would.
 */
const outDir = join(root, 'node_modules', '.cache', `berth-cli-usage-${process.pid}`);
after(() => rmSync(outDir, { recursive: true, force: true }));
const sources = readdirSync(join(root, 'src'), { recursive: true, encoding: 'utf8' });
await build({
  entryPoints: sources
    .filter((f) => f.endsWith('.ts') && !f.startsWith('dashboard/client/'))
    .map((f) => join(root, 'src', f)),
  outbase: join(root, 'src'),
  outdir: outDir,
  platform: 'node',
  format: 'esm',
  logLevel: 'silent',
});
for (const f of sources.filter((f) => f.endsWith('.sql'))) cpSync(join(root, 'src', f), join(outDir, f));
const plainNode = (args: string[], cwd = root) =>
  spawnSync(process.execPath, [join(outDir, 'cli.js'), ...args], {
    cwd,
    encoding: 'utf8',
    env: { ...process.env },
    timeout: 120_000,
  });

const oneLine = (text: string) => text.trim().split('\n').length === 1;

test('an unknown command is an error with exit 2, --help or not, at any level; help itself exits 0', () => {
  for (const args of [['crontab', '--help'], ['crontab'], ['tasks', 'frob', '--help'], ['dead', 'frob']]) {
    const r = plainNode(args);
    assert.equal(r.status, 2, `berth ${args.join(' ')}`);
    assert.match(r.stderr, new RegExp(`^berth: unknown command "${args[0] === 'crontab' ? 'crontab' : 'frob'}"`));
    assert.ok(oneLine(r.stderr), r.stderr);
    assert.equal(r.stdout, '', 'no help on stdout');
  }
  // An option's value before the command is not named as a command (it may hold a password).
  const misplaced = plainNode(['--database-url', 'postgres://u:Secret-pw-9@h/db', 'stats']);
  assert.equal(misplaced.status, 2);
  assert.ok(oneLine(misplaced.stderr), misplaced.stderr);
  assert.doesNotMatch(misplaced.stderr, /Secret-pw-9/);
  for (const args of [['--help'], ['tasks', '--help'], ['help', 'tasks'], ['enqueue', '--help']]) {
    const r = plainNode(args);
    assert.equal(r.status, 0, `berth ${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stdout, /Usage: berth/);
  }
});

test('an option error is one line, without the usage dump', async () => {
  const base = ['--database-url', DATABASE_URL, '--schema', schema];
  const delay = await berth('enqueue', 'cli_usage', '{}', '--delay', '30', ...base);
  assert.equal(delay.code, 2);
  assert.ok(oneLine(delay.err), delay.err);
  assert.match(
    delay.err,
    /^berth: option '--delay <duration>' argument '30' is invalid\. "30" has no unit: write 30ms, 30s/,
  );
  assert.doesNotMatch(delay.err, /Usage:/);
  const runAt = await berth('enqueue', 'cli_usage', '{}', '--run-at', '2026-12-01T09:00', ...base);
  assert.equal(runAt.code, 2);
  assert.ok(oneLine(runAt.err), runAt.err);
  assert.match(runAt.err, /has no time zone: add Z for UTC/);
  const missing = await berth('enqueue', ...base);
  assert.equal(missing.code, 2);
  assert.ok(oneLine(missing.err), missing.err);
  const unknownOption = await berth('stats', '--frobnicate', ...base);
  assert.equal(unknownOption.code, 2);
  assert.ok(oneLine(unknownOption.err), unknownOption.err);
  const none = (await pool.query(`SELECT count(*)::int AS n FROM "${schema}".deferred`)).rows[0].n;
  assert.equal(none, 0, 'nothing was enqueued by a refused command');
});

test('durations need a unit; --run-at needs a zone (Z or an offset)', async () => {
  assert.equal(durationMs('500ms'), 500);
  assert.equal(durationMs('30s'), 30_000);
  assert.equal(durationMs('15m'), 900_000);
  assert.equal(durationMs('2h'), 7_200_000);
  assert.throws(() => durationMs('30'), /"30" has no unit/);
  assert.throws(() => durationMs('30 days'), /expected a duration/);
  assert.equal(isoDate('2026-12-01T09:00:00Z').toISOString(), '2026-12-01T09:00:00.000Z');
  assert.equal(isoDate('2026-12-01T10:00:00+01:00').toISOString(), '2026-12-01T09:00:00.000Z');
  assert.equal(isoDate('2026-12-01 09:00Z').toISOString(), '2026-12-01T09:00:00.000Z');
  assert.throws(() => isoDate('2026-12-01T09:00:00'), /has no time zone/);
  assert.throws(() => isoDate('2026-12-01'), /has no time zone/);
  assert.throws(() => isoDate('tomorrow'), /expected an ISO 8601 time/);
  assert.throws(() => isoDate('2026-13-45T09:00Z'), /not a valid time/);
  const base = ['--database-url', DATABASE_URL, '--schema', schema, '--json'];
  const ok = await berth('enqueue', 'cli_usage', '{}', '--delay', '30s', ...base);
  assert.equal(ok.code, 0, ok.err);
  const { id } = JSON.parse(ok.out) as { id: string };
  const due = await pool.query<{ s: number }>(
    `SELECT extract(epoch FROM run_at - now())::float8 AS s FROM "${schema}".deferred WHERE id = $1`,
    [id],
  );
  assert.ok(due.rows[0]!.s > 20 && due.rows[0]!.s <= 30, `30s means seconds (${due.rows[0]!.s})`);
});

test('a .ts task module runs under plain node: through the project tsx when Node cannot strip types', async () => {
  await enqueue(pool, 'cli_ok', { n: 1 }, { schema });
  const mod = fileURLToPath(new URL('./fixtures/cli-tasks.ts', import.meta.url));
  const r = plainNode([
    'worker',
    '--tasks',
    mod,
    '--drain',
    '--no-maintenance',
    '--schema',
    schema,
    '--database-url',
    DATABASE_URL,
  ]);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /drained/);
  const left = await pool.query(
    `SELECT count(*)::int AS n FROM "${schema}".range_settlements WHERE outcome = 'completed'`,
  );
  assert.ok(left.rows[0].n >= 1);
});

test('without tsx, a .ts module on a Node that cannot strip types is a usage error that says what to install', (t) => {
  const major = Number(process.versions.node.split('.')[0]);
  const minor = Number(process.versions.node.split('.')[1]);
  if (major > 22 || (major === 22 && minor >= 18)) {
    // Node 22.18+ runs .ts itself: nothing to install, the module loads.
    t.diagnostic('this Node strips types by itself');
  }
  const dir = mkdtempSync(join(tmpdir(), 'berth-ts-'));
  try {
    const file = join(dir, 'tasks.ts');
    copyFileSync(fileURLToPath(new URL('./fixtures/not-tasks.ts', import.meta.url)), file);
    const r = plainNode(['worker', '--tasks', file, '--database-url', DATABASE_URL, '--schema', schema], dir);
    assert.equal(r.status, 2, r.stderr);
    assert.ok(oneLine(r.stderr), r.stderr);
    if (major > 22 || (major === 22 && minor >= 18)) assert.match(r.stderr, /not a task definition/);
    else assert.match(r.stderr, /cannot run TypeScript by itself and no tsx was found.*npm install --save-dev tsx/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
