// `npm start`'s first step: install dependencies only when they are missing or stale, and build
// only when the dashboard's client is missing, instead of `npm install` (and with it the
// `prepare` build: tsc and the client bundle) on every start. A fresh clone installs; a second
// start does nothing here.
//
// "Stale" means package.json or package-lock.json changed since the last install this script
// ran: their SHA-256 is kept in node_modules/.berth-deps (inside node_modules, so deleting
// node_modules forgets it too). An install made by hand is not recorded, so the next start
// installs once more (npm then finds nothing to change) and records it.
//
// BERTH_NPM names a Node script to run instead of npm (tests: a fake that records its call).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const root = process.cwd();
const stamp = join(root, 'node_modules', '.berth-deps');

function digest() {
  const h = createHash('sha256');
  for (const f of ['package.json', 'package-lock.json']) {
    const p = join(root, f);
    h.update(`${f}\0${existsSync(p) ? readFileSync(p) : ''}\0`);
  }
  return h.digest('hex');
}

function npm(args) {
  const fake = process.env.BERTH_NPM;
  const r = fake
    ? spawnSync(process.execPath, [fake, ...args], { stdio: 'inherit' })
    : spawnSync('npm', args, { stdio: 'inherit', shell: process.platform === 'win32' });
  if (r.error) {
    console.error(`npm start: could not run npm ${args.join(' ')}: ${r.error.message}`);
    process.exit(1);
  }
  if (r.status !== 0) {
    console.error(`npm start: npm ${args.join(' ')} failed (exit ${r.status})`);
    process.exit(r.status ?? 1);
  }
}

const want = digest();
const have = existsSync(stamp) ? readFileSync(stamp, 'utf8').trim() : null;
if (have !== want) {
  console.error(
    have === null
      ? 'npm start: installing dependencies (first start)'
      : 'npm start: package.json or package-lock.json changed: installing',
  );
  // `prepare` builds as part of the install.
  npm(['install', '--no-audit', '--no-fund']);
  writeFileSync(stamp, `${want}\n`);
} else if (!existsSync(join(root, 'dist', 'dashboard', 'static', 'app.css'))) {
  console.error("npm start: building (the dashboard's client is missing)");
  npm(['run', 'build']);
}
