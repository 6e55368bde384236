import { userInfo } from 'node:os';
import { type Command, InvalidArgumentError, Option } from 'commander';
import pg from 'pg';
import { BerthError, BerthInputError } from '../errors.js';
import { isTaskId } from '../admin/ids.js';
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
  schema: string;
  json?: boolean;
}

export function connection(opts: Common): string {
  // The default comes from $BERTH_SCHEMA, which commander's parser never sees: check it here.
  if (!/^[A-Za-z_][A-Za-z0-9_$]{0,62}$/.test(opts.schema)) {
    throw new BerthInputError(
      `schema must be a plain identifier (letters, digits, _ and $; at most 63), got "${opts.schema}" (from --schema or $BERTH_SCHEMA)`,
    );
  }
  const url = opts.databaseUrl ?? process.env.DATABASE_URL;
  if (!url) throw new BerthInputError('no database: pass --database-url or set DATABASE_URL');
  return url;
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
  c.option('--database-url <url>', 'PostgreSQL connection string (default: $DATABASE_URL)').addOption(
    new Option('--schema <name>', 'berth schema')
      .default(process.env.BERTH_SCHEMA || 'berth', '$BERTH_SCHEMA or berth')
      .argParser(schemaName),
  );
  return json ? c.option('--json', 'print JSON') : c;
}

/** Who an operator action is recorded as: $BERTH_ACTOR, else cli:<login name>. */
export function actor(): string {
  if (process.env.BERTH_ACTOR) return process.env.BERTH_ACTOR;
  try {
    return `cli:${userInfo().username}`;
  } catch {
    return 'cli:unknown';
  }
}

/** A short-lived pool for one command, closed afterwards whatever happens. */
export async function withPool<T>(opts: Common, run: (pool: pg.Pool) => Promise<T>): Promise<T> {
  const pool = new pg.Pool({
    connectionString: connection(opts),
    max: 2,
    application_name: 'berth cli',
    options: '-c jit=off',
  });
  pool.on('error', () => undefined);
  try {
    await assertMigrated(pool, opts.schema);
    return await run(pool);
  } finally {
    await pool.end();
  }
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
