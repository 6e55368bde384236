// The package.json that goes into the tarball (`npm pack`, `npm publish`): the clone's, without
// what only a clone uses. In a clone, `prepare` builds dist/ on `npm install` and `test` runs
// the suite; in an installed package they mean nothing, and npm lists a dependency's `prepare`
// among the scripts it asks the installing project to review. So the tarball ships no scripts,
// no devDependencies and no `allowScripts` (this project's own install policy).
//
//   node scripts/pack-manifest.mjs strip     (prepack, after the build): keep the clone's
//                                            package.json aside, write the published one
//   node scripts/pack-manifest.mjs restore   (postpack): put the clone's back
//
// npm reads package.json from disk when it writes the tarball, and `npm publish` reads it again
// after prepack for the registry's copy, so both see the stripped file. If a pack dies between
// the two steps, the next `strip` (or a `restore`) puts the clone's file back first, so the
// clone never keeps the stripped one for longer than one failed pack.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const manifest = join(root, 'package.json');
const kept = join(root, '.package.json.clone');

/** The fields of package.json that only a clone of the repository uses. */
const CLONE_ONLY = ['scripts', 'devDependencies', 'allowScripts'];

function restore() {
  if (existsSync(kept)) renameSync(kept, manifest);
}

function strip() {
  restore();
  const text = readFileSync(manifest, 'utf8');
  const published = JSON.parse(text);
  for (const field of CLONE_ONLY) delete published[field];
  writeFileSync(kept, text);
  writeFileSync(manifest, `${JSON.stringify(published, null, 2)}\n`);
}

const step = process.argv[2];
if (step === 'strip') strip();
else if (step === 'restore') restore();
else {
  console.error('usage: node scripts/pack-manifest.mjs strip|restore');
  process.exit(2);
}
