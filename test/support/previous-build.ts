/**
 * berth's code as it was before a migration: its src/ taken from git (`git archive`) and
 * transpiled file by file with esbuild into a directory inside this checkout (so its packages
 * resolve from node_modules, as an installed berth's would), with its migrations beside it. For
 * the tests that run a fleet of an older version through a migration, once the code under test
 * needs a newer schema than the fleet's.
 */
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after } from 'node:test';
import { build } from 'esbuild';

const root = fileURLToPath(new URL('../..', import.meta.url));

/**
 * The commit before the first one that added a migration newer than `version`: the last code
 * whose schema was `version` or older. Null when no newer migration has been committed (the
 * code under test is that code).
 */
export function lastCommitAtVersion(version: number): string | null {
  const log = execFileSync(
    'git',
    ['log', '--diff-filter=A', '--name-only', '--format=commit %H', '--', 'src/schema/migrations/'],
    {
      cwd: root,
      encoding: 'utf8',
    },
  );
  let commit = '';
  let oldest: string | null = null;
  for (const line of log.split('\n')) {
    if (line.startsWith('commit ')) commit = line.slice(7);
    const m = /^src\/schema\/migrations\/(\d{4})_/.exec(line);
    if (m && Number(m[1]) > version) oldest = commit; // newest first: the last seen is the oldest
  }
  return oldest === null ? null : `${oldest}^`;
}

/** The `dist`-like directory of `commit`'s src/, transpiled (index.js, schema/roles.js, …); removed after the file's tests. */
export async function buildAt(commit: string): Promise<string> {
  const dir = join(root, 'node_modules', '.cache', `berth-previous-${process.pid}`);
  const src = join(dir, 'src');
  const out = join(dir, 'dist');
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(src, { recursive: true });
  after(() => rmSync(dir, { recursive: true, force: true }));
  const tar = execFileSync('git', ['archive', '--format=tar', commit, 'src'], { cwd: root, maxBuffer: 256 << 20 });
  execFileSync('tar', ['-x', '-C', dir], { input: tar });
  const files = readdirSync(src, { recursive: true, encoding: 'utf8' });
  await build({
    entryPoints: files.filter((f) => f.endsWith('.ts') && !f.startsWith('dashboard/client/')).map((f) => join(src, f)),
    outbase: src,
    outdir: out,
    platform: 'node',
    format: 'esm',
    logLevel: 'silent',
  });
  for (const f of files.filter((f) => f.endsWith('.sql'))) cpSync(join(src, f), join(out, f));
  return out;
}
