import { readdirSync, readFileSync } from 'node:fs';
import { renderPlaceholders, unknownPlaceholders } from './placeholders.js';

/**
 * Forward-only, numbered migrations, one SQL file each in `./migrations/`
 * (`NNNN_<what>.sql`, NNNN the version). Never edit a shipped migration: add the next number.
 * docs/architecture.md explains every table and index they define and which statement uses it;
 * docs/schema.sql is the schema they add up to (`npm run schema:dump`).
 *
 * A file starts with its header: comment lines, the first `-- name: <name>` (the name recorded
 * in schema_migrations), the rest notes on why. The header ends at the first empty line; the
 * migration is everything from that line on, with its placeholders (src/schema/placeholders.ts)
 * replaced for the schema. That rendered text is what runs and what the checksum covers, so the
 * notes can grow without changing a shipped migration.
 */
export interface Migration {
  version: number;
  name: string;
  sql(schema: string): string;
  /**
   * The tables of the schema its DDL alters, indexes, triggers, drops, locks or truncates (read
   * from the file's top-level statements), each with the strongest lock those statements take.
   * migrate() takes those locks on the tables that exist before it runs anything, all at once,
   * so that it never holds one while it waits for another that a worker holds while waiting for
   * the first (a deadlock with the live fleet).
   */
  locks: readonly TableLock[];
}

/** PostgreSQL's table lock modes that DDL takes, weakest first. */
export const LOCK_MODES = ['SHARE', 'SHARE ROW EXCLUSIVE', 'ACCESS EXCLUSIVE'] as const;
export type LockMode = (typeof LOCK_MODES)[number];
export interface TableLock {
  table: string;
  mode: LockMode;
}

/**
 * A top-level statement (at the start of a line) that takes a lock on an existing table of the
 * schema: its kind and the table it names. CREATE INDEX takes SHARE, CREATE TRIGGER SHARE ROW
 * EXCLUSIVE, the others ACCESS EXCLUSIVE (a LOCK TABLE in these files takes that mode, and
 * ALTER TABLE is counted at its strongest).
 */
const LOCKING_STATEMENT =
  /^(ALTER TABLE(?: IF EXISTS)?(?: ONLY)?|DROP TABLE(?: IF EXISTS)?|LOCK TABLE(?: ONLY)?|TRUNCATE(?: TABLE)?(?: ONLY)?|CREATE (?:UNIQUE )?INDEX[^;]*?\sON(?: ONLY)?|CREATE (?:OR REPLACE )?TRIGGER[^;]*?\sON)\s+\{\{schema\}\}\.([a-z_][a-z0-9_]*)/gm;

function statementMode(statement: string): LockMode {
  if (statement.startsWith('CREATE TRIGGER') || statement.startsWith('CREATE OR REPLACE TRIGGER'))
    return 'SHARE ROW EXCLUSIVE';
  if (/^CREATE (UNIQUE )?INDEX/.test(statement)) return 'SHARE';
  return 'ACCESS EXCLUSIVE';
}

/** Each table once, with the strongest of the modes `locks` name for it, in first-seen order. */
export function strongestLocks(locks: Iterable<TableLock>): Map<string, LockMode> {
  const out = new Map<string, LockMode>();
  for (const { table, mode } of locks) {
    const had = out.get(table);
    if (had === undefined || LOCK_MODES.indexOf(mode) > LOCK_MODES.indexOf(had)) out.set(table, mode);
  }
  return out;
}

/** The tables a migration's top-level statements lock, each once with its strongest mode, in the order they appear. */
export function lockedTables(template: string): TableLock[] {
  const seen = [...template.matchAll(LOCKING_STATEMENT)].map((m) => ({ table: m[2]!, mode: statementMode(m[1]!) }));
  return [...strongestLocks(seen)].map(([table, mode]) => ({ table, mode }));
}

/** Ring partitions of the ready storage. Fixed per installation at migration 1 (its slots 0–15). */
export const RING_SLOTS = 16;

/**
 * Read at run time, next to this module: in src under tsx, in dist after the build (which copies
 * the files, scripts/copy-sql.mjs). Read once, at import, so a package missing them fails at
 * once, not at the first migrate().
 */
const DIRECTORY = new URL('./migrations/', import.meta.url);

const FILE_NAME = /^(\d{4})_[a-z0-9_]+\.sql$/;
const NAME_LINE = /^-- name: (.+)$/;

/** One migration from its file name and text; throws, naming the file, when either is malformed. */
export function parseMigration(fileName: string, text: string): Migration {
  const version = FILE_NAME.exec(fileName)?.[1];
  if (version === undefined) throw new Error(`migration file ${fileName}: the name must be NNNN_<lowercase words>.sql`);
  // The old in-code migrations were template literals, which read a CRLF in the source as LF;
  // the same here keeps the checksums of a checkout with Windows line endings.
  const lines = text.replaceAll('\r\n', '\n').split('\n');
  const blank = lines.indexOf('');
  const header = lines.slice(0, blank === -1 ? lines.length : blank);
  const name = NAME_LINE.exec(header[0] ?? '')?.[1];
  if (name === undefined) throw new Error(`migration file ${fileName}: the first line must be "-- name: <name>"`);
  const notComment = header.find((l) => !l.startsWith('--'));
  if (notComment !== undefined)
    throw new Error(
      `migration file ${fileName}: the header (up to the first empty line) holds comments only, found "${notComment}"`,
    );
  if (blank === -1) throw new Error(`migration file ${fileName}: no empty line ends the header`);
  const template = lines.slice(blank).join('\n');
  const unknown = unknownPlaceholders(template);
  if (unknown.length > 0)
    throw new Error(`migration file ${fileName}: unknown placeholder(s) ${unknown.map((u) => `{{${u}}}`).join(', ')}`);
  return {
    version: Number(version),
    name,
    sql: (schema) => renderPlaceholders(template, schema),
    locks: lockedTables(template),
  };
}

/** Every migration in `directory`, by version; throws when two share a version. */
function loadMigrations(directory: URL): Migration[] {
  let files: string[];
  try {
    files = readdirSync(directory).filter((f) => f.endsWith('.sql'));
  } catch (err) {
    throw new Error(`berth's migration files are missing (${directory.href}): ${(err as Error).message}`, {
      cause: err,
    });
  }
  const migrations = files.map((f) => parseMigration(f, readFileSync(new URL(f, directory), 'utf8')));
  migrations.sort((a, b) => a.version - b.version);
  const repeated = migrations.find((m, i) => i > 0 && migrations[i - 1]!.version === m.version);
  if (repeated) throw new Error(`two migration files in ${directory.href} have version ${repeated.version}`);
  if (migrations.length === 0) throw new Error(`berth's migration files are missing: ${directory.href} holds none`);
  return migrations;
}

export const MIGRATIONS: readonly Migration[] = loadMigrations(DIRECTORY);
