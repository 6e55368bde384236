#!/usr/bin/env node
/**
 * The `berth` command line. Every command takes --database-url (default $DATABASE_URL) and
 * --schema (default $BERTH_SCHEMA or `berth`); --json prints machine-readable output.
 * Exit codes: 0 ok, 1 operation failed, 2 bad usage or configuration.
 */
import { Command, InvalidArgumentError } from 'commander';
import { migrate, SchemaTooNewError } from './schema/migrate.js';
import { BerthInputError } from './errors.js';

export const EXIT = { ok: 0, failed: 1, usage: 2 } as const;

interface Common {
  databaseUrl?: string;
  schema: string;
  json?: boolean;
}

function connection(opts: Common): string {
  const url = opts.databaseUrl ?? process.env.DATABASE_URL;
  if (!url) throw new BerthInputError('no database: pass --database-url or set DATABASE_URL');
  return url;
}

function schemaName(value: string): string {
  if (!/^[A-Za-z_][A-Za-z0-9_$]{0,62}$/.test(value)) {
    throw new InvalidArgumentError('schema must be a plain identifier (letters, digits, _ and $; at most 63)');
  }
  return value;
}

export function buildProgram(): Command {
  const program = new Command();
  program
    .name('berth')
    .description('berth: a durable task queue on PostgreSQL')
    .showHelpAfterError()
    .exitOverride();
  const common = (c: Command) =>
    c
      .option('--database-url <url>', 'PostgreSQL connection string (default: $DATABASE_URL)')
      .option('--schema <name>', 'berth schema (default: $BERTH_SCHEMA or berth)', schemaName, process.env.BERTH_SCHEMA ?? 'berth')
      .option('--json', 'print JSON');

  common(program.command('migrate'))
    .description('apply pending schema migrations (one transaction, under an advisory lock)')
    .action(async (opts: Common) => {
      const report = await migrate({ connectionString: connection(opts), schema: opts.schema });
      if (opts.json) console.log(JSON.stringify(report));
      else if (report.applied.length === 0) console.log(`schema "${report.schema}" is up to date at version ${report.to}`);
      else {
        for (const m of report.applied) console.log(`applied ${m.version}: ${m.name}`);
        console.log(`schema "${report.schema}" migrated from ${report.from} to ${report.to}`);
      }
    });
  return program;
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
    return EXIT.ok;
  } catch (err) {
    const e = err as { code?: string; exitCode?: number; message?: string };
    if (e.code?.startsWith('commander.')) {
      return e.code === 'commander.helpDisplayed' || e.code === 'commander.version' ? EXIT.ok : EXIT.usage;
    }
    if (err instanceof BerthInputError) {
      console.error(`berth: ${err.message}`);
      return EXIT.usage;
    }
    if (err instanceof SchemaTooNewError) {
      console.error(`berth: ${err.message}`);
      return EXIT.failed;
    }
    console.error(`berth: ${e.message ?? String(err)}`);
    return EXIT.failed;
  }
}

const invokedDirectly = process.argv[1] && /cli\.(ts|js)$/.test(process.argv[1]);
if (invokedDirectly) process.exitCode = await main(process.argv);
