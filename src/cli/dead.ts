import type { Command } from 'commander';
import { audited } from '../admin/audit.js';
import { listDead, purgeDead, retryDead, type BulkResult, type DeadFilter } from '../admin/dead.js';
import {
  actor,
  attemptsCell,
  CliFailure,
  collect,
  common,
  intOption,
  isoDate,
  nextPageCommand,
  printJson,
  printTable,
  taskIdArg,
  withPool,
  type Common,
} from './common.js';
import { progressBar } from './progress.js';
import { say } from './terminal.js';

interface FilterOpts extends Common {
  queue?: string;
  type?: string;
  error?: string;
  diedBefore?: Date;
  id: string[];
  all?: boolean;
}

function filters(c: Command, bulk: boolean): Command {
  c.option('--queue <name>', 'only this queue')
    .option('--type <type>', 'only this task type')
    .option('--error <text>', 'only those whose last error contains this (case-insensitive)')
    .option('--died-before <time>', 'only those that died before this ISO 8601 time, with its zone', isoDate);
  if (bulk) {
    c.option(
      '--id <id>',
      'exactly this dead letter (repeatable)',
      (v: string, prev: string[]) => collect(taskIdArg(v), prev),
      [],
    ).option('--all', 'every dead letter (required when no filter is given)');
  }
  return c;
}

function toFilter(o: FilterOpts): DeadFilter {
  return {
    queue: o.queue,
    type: o.type,
    errorContains: o.error,
    diedBefore: o.diedBefore,
    ids: o.id && o.id.length > 0 ? o.id : undefined,
    all: o.all,
  };
}

/** A bulk action with a progress bar on a terminal, audited; exit 1 when some were left alone. */
async function bulk(
  opts: FilterOpts,
  action: 'retry' | 'purge',
  run: typeof retryDead,
  report: (r: BulkResult) => void,
): Promise<void> {
  const filter = toFilter(opts);
  await withPool(opts, async (pool) => {
    const bar = progressBar(action === 'retry' ? 'retrying' : 'purging');
    let r: BulkResult;
    try {
      r = await audited(pool, opts.schema, null, actor(), `dead.${action}`, { ...filter }, () =>
        run(pool, opts.schema, filter, (p) => bar.update(p)),
      );
    } finally {
      bar.stop();
    }
    if (opts.json) printJson(r);
    else report(r);
    if (r.duplicates > 0)
      throw new CliFailure(`${r.duplicates} dead letter(s) not retried: a live task holds their dedupe key`);
  });
}

export function registerDeadCommands(program: Command): void {
  const dead = program.command('dead').description('dead letters: tasks that ran out of attempts');
  filters(common(dead.command('list')), false)
    .description('dead letters newest first; --after <id> for the next page')
    .option('--limit <n>', 'page size', intOption(1, 500), 50)
    .option('--after <id>', 'page cursor: the "next" printed by the previous page', taskIdArg)
    .action(async (opts: FilterOpts & { limit: number; after?: string }) => {
      await withPool(opts, async (pool) => {
        const page = await listDead(pool, opts.schema, toFilter({ ...opts, id: [] }), {
          limit: opts.limit,
          after: opts.after,
        });
        if (opts.json) return printJson(page);
        printTable(
          page.deadLetters.map((d) => ({
            ...d,
            attempts: attemptsCell(d.attempts, d.maxAttempts),
            lastError: d.lastError?.split('\n')[0]?.slice(0, 70),
          })),
          ['id', 'type', 'queue', 'attempts', 'diedAt', 'lastError'],
        );
        if (page.next) {
          const filters = {
            queue: opts.queue,
            type: opts.type,
            error: opts.error,
            'died-before': opts.diedBefore?.toISOString(),
          };
          say(`\nmore: ${nextPageCommand('dead list', opts, page.next, filters)}`);
        }
      });
    });

  filters(common(dead.command('retry')), true)
    .description('retry the dead letters a filter matches (fresh attempt budget), in batches of 1,000')
    .addHelpText(
      'after',
      '\nNeeds a filter or --all. A dead letter whose dedupe key a live task holds is left in place.',
    )
    .action((opts: FilterOpts) =>
      bulk(opts, 'retry', retryDead, (r) => {
        say(
          `retried ${r.changed} of ${r.matched} dead letter(s)${r.duplicates ? `; ${r.duplicates} left: a live task holds their dedupe key` : ''}`,
        );
      }),
    );

  filters(common(dead.command('purge')), true)
    .description('delete the dead letters a filter matches, in batches of 5,000')
    .addHelpText('after', '\nNeeds a filter or --all.')
    .action((opts: FilterOpts) => bulk(opts, 'purge', purgeDead, (r) => say(`purged ${r.changed} dead letter(s)`)));
}
