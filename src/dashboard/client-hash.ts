import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';

/**
 * The hash scripts/build-client.mjs stamps into the bundles and src/dashboard/assets.ts checks:
 * sha256 over the client's .ts and .css files (an editor's swap file is not a source), by
 * relative path in sorted order, each as `path NUL content NUL`. One function for both: the
 * build script imports its compiled copy from dist/ (tsc runs before it).
 */
export function clientSourceHash(dir: string): string {
  const files = readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile() && /\.(ts|css)$/.test(d.name))
    .map((d) => relative(dir, join(d.parentPath, d.name)).split(sep).join('/'))
    .sort();
  const hash = createHash('sha256');
  for (const f of files)
    hash
      .update(`${f}\0`)
      .update(readFileSync(join(dir, f)))
      .update('\0');
  return hash.digest('hex');
}
