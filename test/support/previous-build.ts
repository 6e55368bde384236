import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));

/**
 * The build of berth as it was just before `migrationFile` was added: its `src/` taken from git
 * history (the first parent of the commit that added the file), compiled with this checkout's
 * TypeScript and packages, its migrations copied beside it. Cached in the temporary directory by
 * commit. Returns its dist/ directory. A test that runs the previous version's fleet through a
 * migration uses it once the code under test no longer runs on the older schema.
 */
export function previousBuild(migrationFile: string): string {
  const git = (...args: string[]) => execFileSync('git', ['-C', root, ...args], { encoding: 'utf8' }).trim();
  let added: string;
  try {
    // First parent, merges diffed against it: a migration that came in by a merge was added by the merge.
    added = git('log', '--first-parent', '-m', '--diff-filter=A', '--format=%H', '-1', '--', migrationFile);
  } catch (err) {
    throw new Error(`the previous build needs this checkout's git history (git log failed: ${String(err)})`);
  }
  if (!added) throw new Error(`no commit in this checkout's history adds ${migrationFile}`);
  const commit = git('rev-parse', `${added}^1`);
  const dir = join(tmpdir(), `berth-previous-${commit.slice(0, 12)}`);
  const dist = join(dir, 'dist');
  // The last step's output: a build interrupted before it is built again.
  if (existsSync(join(dist, 'schema', 'migrations'))) {
    linkPackages(dir);
    return dist;
  }
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  execFileSync('sh', [
    '-c',
    `git -C "$1" archive "$2" src tsconfig.json package.json scripts/copy-sql.mjs | tar -x -C "$3"`,
    'sh',
    root,
    commit,
    dir,
  ]);
  linkPackages(dir);
  execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], {
    cwd: dir,
  });
  execFileSync(process.execPath, [join(dir, 'scripts', 'copy-sql.mjs')], { cwd: dir });
  return dist;
}

/**
 * The build's packages: a link to this checkout's node_modules. A cached build keeps the link of
 * the checkout that built it, which may since have been deleted (a clone in the temporary
 * directory): then its imports of pg or pino fail, so a dangling link is made again here. Two
 * test files may do this at once; the one that loses the race finds the other's link.
 */
function linkPackages(dir: string): void {
  const link = join(dir, 'node_modules');
  if (existsSync(link)) return;
  rmSync(link, { force: true });
  try {
    symlinkSync(join(root, 'node_modules'), link, 'dir');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
}
