import { userInfo } from 'node:os';
import { type Command, InvalidArgumentError, Option } from 'commander';
import type pg from 'pg';
import { createPool, resolveDatabase, type DatabaseTarget } from '../db/connections.js';
import { BerthError, BerthInputError } from '../errors.js';
import { checkText, MAX_ACTOR_CHARS } from '../limits.js';
import { isTaskId } from '../storage/ids.js';
import { parseDuration } from '../util/duration.js';
import { assertMigrated } from '../schema/migrate.js';
import { escapeControl, jsonSafe, say } from './terminal.js';

export const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

/** The operation ran but did not do what was asked (not found, still running, problems remain): exit 1. */
export class CliFailure extends BerthError {
  override readonly code = 'CLI_FAILURE';

  constructor(message: string) {
    super(message);
    this.name = 'CliFailure';
  }
}

export interface Common {
  databaseUrl?: string;
  /** --connect-timeout, in ms. */
  connectTimeout?: number;
  schema: string;
  json?: boolean;
}

/**
 * The command's database: --database-url or $DATABASE_URL, checked (a malformed URL is a usage
 * error naming where it came from, never echoed), with the connect timeout resolved:
 * --connect-timeout, else the URL's connect_timeout, else $PGCONNECT_TIMEOUT, else 10 s.
 */
export function database(opts: Common): DatabaseTarget {
  // The default comes from $BERTH_SCHEMA, which commander's parser never sees: check it here.
  if (!/^[A-Za-z_][A-Za-z0-9_$]{0,62}$/.test(opts.schema)) {
    throw new BerthInputError(
      `schema must be a plain identifier (letters, digits, _ and $; at most 63), got "${opts.schema}" (from --schema or $BERTH_SCHEMA)`,
    );
  }
  const url = opts.databaseUrl ?? process.env.DATABASE_URL;
  if (!url) throw new BerthInputError('no database: pass --database-url or set DATABASE_URL');
  return resolveDatabase(url, {
    field: opts.databaseUrl !== undefined ? '--database-url' : 'DATABASE_URL',
    connectTimeoutMs: opts.connectTimeout,
  });
}

/**
 * An ISO 8601 time with its zone: `2026-12-01T09:00:00Z` or `...+01:00`. A time without one is
 * refused rather than guessed: JavaScript reads `2026-12-01T09:00` as the machine's local time
 * and `2026-12-01` as UTC midnight, and the operator's terminal, the server and the database may
 * each be in another zone.
 */
export function isoDate(value: string): Date {
  const v = value.trim();
  const shape =
    /^(?:[+-]\d{6}|\d{4})-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)?(Z|[+-]\d{2}(?::?\d{2})?)?$/i.exec(v);
  if (!shape) throw new InvalidArgumentError(`expected an ISO 8601 time such as 2026-12-01T09:00:00Z, got "${value}"`);
  if (!shape[1])
    throw new InvalidArgumentError(
      `"${value}" has no time zone: add Z for UTC (2026-12-01T09:00:00Z) or an offset (2026-12-01T10:00:00+01:00)`,
    );
  const d = new Date(v.replace(' ', 'T'));
  if (Number.isNaN(d.getTime())) throw new InvalidArgumentError(`"${value}" is not a valid time`);
  return d;
}

/** A duration with its unit: 500ms, 30s, 15m, 2h (src/util/duration.ts says why a unit is required). */
export function durationMs(value: string): number {
  const d = parseDuration(value);
  if ('error' in d) throw new InvalidArgumentError(d.error);
  return d.ms;
}

export function schemaName(value: string): string {
  if (!/^[A-Za-z_][A-Za-z0-9_$]{0,62}$/.test(value)) {
    throw new InvalidArgumentError('schema must be a plain identifier (letters, digits, _ and $; at most 63)');
  }
  return value;
}

export function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

export function intOption(min: number, max: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max)
      throw new InvalidArgumentError(`expected an integer from ${min} to ${max}`);
    return n;
  };
}

/** Option parser for an id (commander prints the error). Inside an action use admin/ids taskId. */
export function taskIdArg(value: string): string {
  if (!isTaskId(value)) throw new InvalidArgumentError('a task id is a positive integer up to 9223372036854775807');
  return value;
}

/** --database-url, --schema and (for commands that print data) --json on a command. */
export function common(c: Command, { json = true }: { json?: boolean } = {}): Command {
  c.option('--database-url <url>', 'PostgreSQL connection string (default: $DATABASE_URL)')
    .option(
      '--connect-timeout <duration>',
      "give up connecting after this long (default: the URL's connect_timeout, else $PGCONNECT_TIMEOUT, else 10s)",
      durationMs,
    )
    .addOption(
      new Option('--schema <name>', 'berth schema')
        .default(process.env.BERTH_SCHEMA || 'berth', '$BERTH_SCHEMA or berth')
        .argParser(schemaName),
    );
  return json ? c.option('--json', 'print JSON') : c;
}

/** Who an operator action is recorded as: $BERTH_ACTOR, else cli:<login name>. */
export function actor(): string {
  if (process.env.BERTH_ACTOR) {
    // Refused here, before any change, rather than by the database after a bulk action began.
    checkText(process.env.BERTH_ACTOR, 'actor', 'BERTH_ACTOR', { maxChars: MAX_ACTOR_CHARS });
    return process.env.BERTH_ACTOR;
  }
  try {
    return `cli:${userInfo().username}`;
  } catch {
    return 'cli:unknown';
  }
}

/**
 * A group's `list` command: `read` once, printed as JSON with --json, else as `print` lays it
 * out (a table).
 */
export function listCommand<T>(
  group: Command,
  description: string,
  read: (pool: pg.Pool, schema: string) => Promise<T>,
  print: (data: T) => void,
): void {
  common(group.command('list'))
    .description(description)
    .action(async (opts: Common) => {
      await withPool(opts, async (pool) => {
        const data = await read(pool, opts.schema);
        if (opts.json) printJson(data);
        else print(data);
      });
    });
}

/** A short-lived pool for one command, closed afterwards whatever happens. */
export async function withPool<T>(opts: Common, run: (pool: pg.Pool) => Promise<T>): Promise<T> {
  const pool = cliPool(database(opts), 'berth cli', 2);
  try {
    await assertMigrated(pool, opts.schema);
    return await run(pool);
  } finally {
    await pool.end();
  }
}

/** A CLI pool: no JIT (see SESSION_OPTIONS), idle errors dropped (the command fails on its next query). */
export function cliPool(target: DatabaseTarget, applicationName: string, max: number): pg.Pool {
  return createPool(target, { max, application_name: applicationName, options: '-c jit=off' }, null, 'cli');
}

export function printJson(value: unknown): void {
  console.log(jsonSafe(JSON.stringify(value, null, 2)));
}

/** A plain aligned text table (no colours: it goes to logs and pipes as often as to people). */
export function printTable(rows: readonly Record<string, unknown>[], columns: readonly string[]): void {
  const cell = (v: unknown): string => {
    if (v === null || v === undefined) return '-';
    if (v instanceof Date) return v.toISOString();
    // Database text: escaped whole (newlines too), so a cell stays one cell on one line.
    return escapeControl(String(v));
  };
  const widths = columns.map((c) => Math.max(c.length, ...rows.map((r) => cell(r[c]).length)));
  const line = (vals: string[]) =>
    vals
      .map((v, i) => v.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  say(line(columns.map((c) => c.toUpperCase())));
  for (const r of rows) say(line(columns.map((c) => cell(r[c]))));
}

/**
 * The attempts column, one format in every command: attempts made (or, for one attempt in
 * history, its number), a slash, and the attempt limit, `3/20`. The limit is `-` when the row
 * does not know it: a task without a limit of its own runs under its type's, which only the
 * workers' definitions hold, and attempt history keeps no limit.
 */
export function attemptsCell(attempts: number, limit: number | null | undefined): string {
  return `${attempts}/${limit ?? '-'}`;
}

/** Seconds as a short human duration: 42s, 3m05s, 2h10m. */
export function duration(seconds: number): string {
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/** The command that prints the next page: the same filters, page size and schema. */
export function nextPageCommand(
  command: string,
  opts: Common & { limit?: number },
  next: string,
  filters: Record<string, string | undefined>,
): string {
  const quote = (v: string) => (/^[A-Za-z0-9_.:/@-]+$/.test(v) ? v : `'${v.replaceAll("'", "'\\''")}'`);
  const parts = [`berth ${command}`];
  for (const [k, v] of Object.entries(filters)) if (v !== undefined) parts.push(`--${k} ${quote(v)}`);
  if (opts.limit !== undefined && opts.limit !== 50) parts.push(`--limit ${opts.limit}`);
  if (opts.schema !== (process.env.BERTH_SCHEMA || 'berth')) parts.push(`--schema ${opts.schema}`);
  parts.push(`--after ${next}`);
  return parts.join(' ');
}
