#!/usr/bin/env node
/**
 * The `berth` command line. Every command takes --database-url (default $DATABASE_URL) and
 * --schema (default $BERTH_SCHEMA or `berth`); --json prints machine-readable output.
 * Exit codes: 0 ok; 1 the operation failed or did not do what was asked (not found, still
 * running, problems remain, no leader); 2 bad usage or configuration (bad option, bad JSON,
 * a bulk action without a filter). Commands live in src/cli/, one module per group.
 */
import { readFileSync, realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { migrate, SchemaTooNewError, withClient } from './schema/migrate.js';
import { BerthInputError } from './errors.js';
import { CliFailure, collect, common, database, EXIT, type Common } from './cli/common.js';
import { registerTaskCommands } from './cli/tasks.js';
import { registerHistoryCommands } from './cli/history.js';
import { registerDeadCommands } from './cli/dead.js';
import { registerQueueCommands } from './cli/queues.js';
import { registerLimitCommands } from './cli/limits.js';
import { registerKeyCommands } from './cli/keys.js';
import { registerScheduleCommands } from './cli/schedules.js';
import { registerStatsCommands } from './cli/stats.js';
import { registerWorkerCommands } from './cli/worker.js';
import { registerDashboardCommand } from './cli/dashboard.js';
import {
  listLaneSequenceProblems,
  repairLaneSequences,
  type LaneSequenceProblem,
  type LaneSequenceRepairReport,
} from './storage/lane-sequences.js';
import { escapeControl, jsonSafe, say, warn } from './cli/terminal.js';

function describe(p: LaneSequenceProblem): string {
  return `${escapeControl(p.sequence)} (lane ${p.laneId})`;
}

function printRepairs(r: LaneSequenceRepairReport): void {
  for (const p of r.repaired) {
    if (p.result === 'reassigned')
      say(
        `repaired ${describe(p)}: owner ${escapeControl(String(p.currentOwner))} -> ${escapeControl(p.expectedOwner)}`,
      );
    else if (p.result === 'created') say(`recreated ${describe(p)}`);
    else say(`${describe(p)} was already repaired`);
  }
  for (const p of r.busy) say(`busy: ${describe(p)} is locked by an open transaction; run the repair again later`);
  for (const p of r.notPermitted)
    say(
      `not permitted: ${describe(p)} needs one of: ${p.repairRoles.map(escapeControl).join(', ') || 'no login role'}`,
    );
  for (const p of r.failed) say(`failed: ${describe(p)}: ${p.error}`);
}

function printProblems(schema: string, problems: readonly LaneSequenceProblem[]): void {
  if (problems.length === 0) {
    say(`no lane sequence problems in schema "${schema}"`);
    return;
  }
  say(`${problems.length} lane sequence problem(s) in schema "${schema}":`);
  for (const p of problems) {
    const what =
      p.problem === 'missing'
        ? 'missing'
        : `owned by ${escapeControl(String(p.currentOwner))}, should be ${escapeControl(p.expectedOwner)}`;
    say(`  ${describe(p)}: ${what}`);
    say(
      p.repairRoles.length > 0
        ? `    run as one of: ${p.repairRoles.map(escapeControl).join(', ')}`
        : '    no login role qualifies: a superuser must run it',
    );
    say(`    ${escapeControl(p.statement)};`);
  }
}

export { EXIT };

function packageVersion(): string {
  try {
    // src/cli.ts and dist/cli.js both sit one level below package.json.
    return (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string })
      .version;
  } catch {
    return 'unknown';
  }
}

export function buildProgram(): Command {
  const program = new Command();
  program
    .name('berth')
    .description('berth: a durable task queue on PostgreSQL')
    .version(packageVersion(), '-V, --version', 'print the berth version')
    // An option error is one line (`berth: option '--delay <duration>' argument '30' is
    // invalid. ...`), not that line followed by the whole usage: `--help` shows the usage.
    .configureOutput({ outputError: (text, write) => write(`berth: ${text.replace(/^error: /, '')}`) })
    .exitOverride();
  common(program.command('migrate'))
    .description(
      'apply pending schema migrations (one transaction, under an advisory lock), then repair lane sequences',
    )
    .option(
      '--runtime-role <role>',
      'make this role a worker role (what workers and the maintenance leader need), in the migration transaction (repeatable)',
      collect,
      [],
    )
    .option(
      '--producer-role <role>',
      'make this role a producer role (enqueue and read task state only), in the migration transaction (repeatable)',
      collect,
      [],
    )
    .addHelpText(
      'after',
      '\nLane sequences that could not be repaired are listed on stderr; `berth storage lane-sequences` shows what to run.',
    )
    .action(async (opts: Common & { runtimeRole: string[]; producerRole: string[] }) => {
      const db = database(opts);
      const report = await migrate({
        connectionString: db.connectionString,
        connectTimeoutMs: db.connectTimeoutMs,
        schema: opts.schema,
        runtimeRoles: opts.runtimeRole,
        producerRoles: opts.producerRole,
      });
      if (opts.json) console.log(jsonSafe(JSON.stringify(report)));
      else {
        if (report.applied.length === 0) say(`schema "${report.schema}" is up to date at version ${report.to}`);
        for (const m of report.applied) say(`applied ${m.version}: ${m.name}`);
        if (report.applied.length > 0) say(`schema "${report.schema}" migrated from ${report.from} to ${report.to}`);
        for (const r of report.grantedRoles) say(`granted runtime privileges to "${r}" (worker role)`);
        for (const r of report.grantedProducerRoles) say(`granted producer privileges to "${r}"`);
        printRepairs(report.laneSequences);
      }
      const left =
        report.laneSequences.busy.length +
        report.laneSequences.notPermitted.length +
        report.laneSequences.failed.length;
      if (left > 0)
        warn(
          `berth: ${left} lane sequence problem(s) remain; see: berth storage lane-sequences --schema ${report.schema}`,
        );
    });

  const storage = program.command('storage').description('inspect and repair queue storage');
  common(storage.command('lane-sequences'))
    .description(
      "list lane sequences that are missing or not owned by the role berth's functions run as, with the statement to run and the roles that may run it",
    )
    .option(
      '--repair',
      'repair each one first (own transaction each, 300 ms lock timeout: a busy sequence is reported, not waited for)',
    )
    .addHelpText(
      'after',
      '\nExit status: 0 when no problem remains, 1 when problems remain (or the command failed), 2 on bad usage.',
    )
    .action(async (opts: Common & { repair?: boolean }) => {
      const db = database(opts);
      const target = { connectionString: db.connectionString, connectTimeoutMs: db.connectTimeoutMs };
      await withClient(target, 'berth storage lane-sequences', async (client) => {
        const repair = opts.repair ? await repairLaneSequences(client, opts.schema) : null;
        const remaining = await listLaneSequenceProblems(client, opts.schema);
        if (opts.json) console.log(jsonSafe(JSON.stringify({ schema: opts.schema, repair, remaining })));
        else {
          if (repair) printRepairs(repair);
          printProblems(opts.schema, remaining);
        }
        if (remaining.length > 0)
          throw new CliFailure(`${remaining.length} lane sequence problem(s) remain in schema "${opts.schema}"`);
      });
    });
  registerWorkerCommands(program);
  registerTaskCommands(program);
  registerHistoryCommands(program);
  registerDeadCommands(program);
  registerQueueCommands(program);
  registerLimitCommands(program);
  registerKeyCommands(program);
  registerScheduleCommands(program);
  registerStatsCommands(program);
  registerDashboardCommand(program);
  return program;
}

/** The options without a value that may come before a command. */
const FLAGS = new Set(['-h', '--help', '-V', '--version']);

/**
 * The first word of `args` that names no command where a command is expected, with the
 * commands that would have been: commander shows the parent's help (and exits 0) for
 * `berth schedules --help`, so an unknown command is caught before it parses anything.
 */
export function unknownCommand(program: Command, args: readonly string[]): { word: string; known: string[] } | null {
  let at: Command = program;
  let previous = '';
  for (const word of args) {
    if (word === '--') return null;
    const after = previous;
    previous = word;
    if (word.startsWith('-')) continue;
    if (at.commands.length === 0) return null;
    // Perhaps an option's value (`--database-url <url>` misplaced before its command): commander
    // reports that, and a value is never echoed as a command name (it may hold a password).
    if (after.startsWith('-') && !after.includes('=') && !FLAGS.has(after)) return null;
    const next = at.commands.find((c) => c.name() === word || c.aliases().includes(word));
    if (next) {
      at = next;
      continue;
    }
    // `berth help [command]`: commander's own help command, at the top.
    if (word === 'help' && at === program) return null;
    return { word, known: at.commands.map((c) => c.name()) };
  }
  return null;
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  const unknown = unknownCommand(program, argv.slice(2));
  if (unknown) {
    warn(
      `berth: unknown command "${escapeControl(unknown.word)}" (commands here: ${unknown.known.join(', ')}); see berth --help`,
    );
    return EXIT.usage;
  }
  try {
    await program.parseAsync(argv);
    return EXIT.ok;
  } catch (err) {
    const e = err as { code?: string; exitCode?: number; message?: string };
    if (e.code?.startsWith('commander.')) {
      // Help asked for (`--help`, `berth help tasks`) exits 0; help shown for a missing
      // subcommand (`berth tasks`) and every parse error exit 2.
      return e.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    if (err instanceof BerthInputError) {
      warn(`berth: ${err.message}`);
      return EXIT.usage;
    }
    if (err instanceof SchemaTooNewError || err instanceof CliFailure) {
      warn(`berth: ${err.message}`);
      return EXIT.failed;
    }
    warn(`berth: ${e.message ?? String(err)}`);
    return EXIT.failed;
  }
}

/**
 * Run when this file is the program: `node dist/cli.js`, `tsx src/cli.ts`, or npm's
 * `node_modules/.bin/berth` symlink (hence the realpath), not when a test imports `main`.
 */
function invokedDirectly(): boolean {
  try {
    return (
      process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url))
    );
  } catch {
    return false;
  }
}

if (invokedDirectly()) {
  // `berth tasks list | head`: a closed pipe ends the output, not the process with a stack trace.
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(process.exitCode ?? 0);
    throw err;
  });
  process.exitCode = await main(process.argv);
}
