/**
 * The user docs speak to users: what to do and what happens. They name no rule of the
 * specifications berth was built from ("seed 000", "rule 12"), no issue ("issue 11", "#28") and
 * no migration by number ("since migration 18", "0022_x.sql"): those are engineering history, kept
 * in docs/architecture.md, docs/migrations.md and docs/seed-coverage.md. Pure: reads the docs.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../', import.meta.url));

/** The pages written for users of the package (whichever exist). */
export const USER_DOCS = [
  'README.md',
  'docs/api.md',
  'docs/configuration.md',
  'docs/operations.md',
  'docs/testing.md',
  'docs/dashboard-api.md',
  'docs/scaling.md',
];

/** What a user doc must not say, each with what it is. */
const FORBIDDEN: [RegExp, string][] = [
  // "seed 000", "seeds", "the seed's rule"; the link to docs/seed-coverage.md is allowed.
  [/\bseeds?\b(?!-coverage)/i, 'a seed (specification) reference'],
  [/\brules? \d+/i, 'a numbered rule'],
  [/\bissues? #?\d+/i, 'an issue number'],
  // "#28", but not "task #3" (how an error names the third task of a batch) or an anchor.
  [/(?<![\w/]|task )#\d+\b/i, 'an issue number'],
  [/\bmigrations? \d+/i, 'a migration number'],
  [/\b\d{4}_\w+\.sql\b/, 'a migration file'],
  [/\b(?:before|since|until|after) v?0\.\d+/i, 'version history'],
];

/** Every forbidden phrase in a page, as `page:line: phrase (what)`. */
export function forbiddenPhrases(page: string, text: string): string[] {
  const found: string[] = [];
  text.split('\n').forEach((line, i) => {
    for (const [pattern, what] of FORBIDDEN) {
      const m = pattern.exec(line);
      if (m) found.push(`${page}:${i + 1}: "${m[0]}" (${what})`);
    }
  });
  return found;
}

test('forbiddenPhrases: what counts', () => {
  const hits = (text: string) => forbiddenPhrases('x.md', text).map((h) => h.replace(/^x\.md:\d+: /, ''));
  assert.deepEqual(hits('as seed 000 says'), ['"seed" (a seed (specification) reference)']);
  assert.deepEqual(hits('see rule 12'), ['"rule 12" (a numbered rule)']);
  assert.deepEqual(hits('fixed in issue 11, see #28'), ['"issue 11" (an issue number)', '"#28" (an issue number)']);
  assert.deepEqual(hits('since migration 18'), ['"migration 18" (a migration number)']);
  assert.deepEqual(hits('0022_retire_leases.sql'), ['"0022_retire_leases.sql" (a migration file)']);
  assert.deepEqual(hits('before 0.3 it did not'), ['"before 0.3" (version history)']);
  // Not history: an error naming a batch's task, an anchor, a port, the coverage page's name.
  assert.deepEqual(
    hits(
      '`task #3: queue ...`, [x](docs/api.md#events), 127.0.0.1:5432, docs/seed-coverage.md, ' +
        'migrations are forward-only, PostgreSQL 15',
    ),
    [],
  );
});

test('the user docs name no seed rule, issue number or migration number', () => {
  const found: string[] = [];
  let pages = 0;
  for (const page of USER_DOCS) {
    const file = join(ROOT, page);
    if (!existsSync(file)) continue;
    pages++;
    found.push(...forbiddenPhrases(page, readFileSync(file, 'utf8')));
  }
  assert.ok(pages >= 5, 'the user docs were read');
  assert.deepEqual(
    found,
    [],
    `the user docs tell engineering history; say what the user does instead:\n${found.join('\n')}`,
  );
});
