/**
 * Loaded into every test process (`--import`, see the `test` script in package.json): every
 * statement any test or berth itself sends with values is checked, before it is sent, for
 * placeholders `$1 … $n` that match its values one for one. A statement whose values and
 * placeholders disagree fails that query with an error naming it, and the test process exits
 * non-zero even if the error was caught and swallowed on the way.
 */
import pg from 'pg';
import { placeholdersOf } from '../src/statement.js';

const mismatches: string[] = [];
const original = pg.Client.prototype.query as (...args: unknown[]) => unknown;

function check(text: unknown, values: unknown): void {
  if (typeof text !== 'string' || !Array.isArray(values)) return;
  const found = placeholdersOf(text);
  const ok = found.size === values.length && values.every((_, i) => found.has(i + 1));
  if (ok) return;
  const what = `${values.length} values for placeholders {${[...found].sort((a, b) => a - b).join(', ')}} in: ${text.trim().replace(/\s+/g, ' ').slice(0, 160)}`;
  mismatches.push(what);
  throw new Error(`statement values and placeholders disagree: ${what}`);
}

pg.Client.prototype.query = function guarded(this: pg.Client, ...args: unknown[]) {
  const [first, second] = args;
  if (typeof first === 'string') check(first, second);
  else if (first && typeof first === 'object' && 'text' in first) {
    const config = first as { text?: unknown; values?: unknown };
    check(config.text, config.values ?? (Array.isArray(second) ? second : undefined));
  }
  return original.apply(this, args);
} as typeof pg.Client.prototype.query;

process.on('exit', () => {
  if (mismatches.length === 0) return;
  process.stderr.write(
    `\nstatements whose values and placeholders disagree:\n${mismatches.map((m) => `  ${m}`).join('\n')}\n`,
  );
  process.exitCode = 1;
});
