import { type Command, InvalidArgumentError } from 'commander';
import { audited } from '../admin/audit.js';
import { BerthInputError } from '../errors.js';
import {
  listAttempts,
  MIN_HISTORY_RETENTION_MS,
  parseOutcome,
  readHistorySettings,
  setHistorySettings,
  type AttemptOutcome,
  type HistorySettings,
} from '../storage/history.js';
import {
  actor,
  attemptsCell,
  common,
  type Common,
  intOption,
  nextPageCommand,
  printJson,
  printTable,
  withPool,
} from './common.js';
import { escapeControl, say } from './terminal.js';

const UNITS: Record<string, number> = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** `90m`, `24h`, `7d`, `3600s`: a retention of at least MIN_HISTORY_RETENTION_MS. */
function retentionArg(value: string): number {
  const m = /^([0-9]+(?:\.[0-9]+)?)(s|m|h|d)$/.exec(value);
  const ms = m ? Number(m[1]) * UNITS[m[2]!]! : Number.NaN;
  if (!Number.isFinite(ms) || ms < MIN_HISTORY_RETENTION_MS)
    throw new InvalidArgumentError(`a duration like 24h, 90m or 7d, at least ${MIN_HISTORY_RETENTION_MS / 1000}s`);
  return ms;
}

function timeArg(value: string): Date {
  const t = new Date(value);
  if (Number.isNaN(t.getTime())) throw new InvalidArgumentError('a time like 2026-12-01T06:00Z');
  return t;
}

function printSettings(opts: Common, st: HistorySettings): void {
  if (opts.json) {
    printJson(st);
    return;
  }
  const hours = st.retentionMs / 3_600_000;
  say(
    `attempt history ${st.enabled ? 'on' : 'off'}, kept ${hours >= 1 ? `${+hours.toFixed(2)}h` : `${st.retentionMs / 1000}s`} (${st.partitions} partitions, partition ${st.currentPartition} current since ${st.rotatedAt.toISOString()})`,
  );
}

export function registerHistoryCommands(program: Command): void {
  const history = program
    .command('history')
    .description('attempt history: its setting, and attempts by type, queue, outcome');
  common(history.command('show'))
    .description('whether attempt history is written and how long it is kept')
    .action(async (opts: Common) => {
      await withPool(opts, async (pool) => {
        printSettings(opts, await readHistorySettings(pool, opts.schema));
      });
    });
  common(history.command('set'))
    .description('turn attempt history on or off, or change its retention (schema-wide; run as the schema owner)')
    .option('--on', 'write attempt history')
    .option('--off', 'stop writing attempt history (what is kept ages out)')
    .option('--retention <duration>', 'keep attempts at least this long: 24h, 90m, 7d', retentionArg)
    .action(async (opts: Common & { on?: boolean; off?: boolean; retention?: number }) => {
      if (opts.on && opts.off) throw new BerthInputError('give --on or --off, not both');
      if (!opts.on && !opts.off && opts.retention === undefined)
        throw new BerthInputError('history set needs --on, --off or --retention');
      const change = {
        ...(opts.on || opts.off ? { enabled: Boolean(opts.on) } : {}),
        ...(opts.retention !== undefined ? { retentionMs: opts.retention } : {}),
      };
      await withPool(opts, async (pool) => {
        const st = await audited(pool, opts.schema, null, actor(), 'history.set', change, () =>
          setHistorySettings(pool, opts.schema, change),
        );
        printSettings(opts, st);
      });
    });
  common(history.command('list'))
    .description('attempts newest first, completed and failed alike; --after <cursor> for the next page')
    .option('--type <type>', 'only this task type')
    .option('--queue <name>', 'only this queue')
    .option('--outcome <outcome>', 'success, failure, timeout, continued, cancelled, lost or snoozed', parseOutcome)
    .option('--since <time>', 'settled at or after this time (ISO 8601)', timeArg)
    .option('--before <time>', 'settled before this time (ISO 8601)', timeArg)
    .option('--limit <n>', 'page size', intOption(1, 500), 50)
    .option('--after <cursor>', 'page cursor: the "next" printed by the previous page')
    .action(
      async (
        opts: Common & {
          type?: string;
          queue?: string;
          outcome?: AttemptOutcome;
          since?: Date;
          before?: Date;
          limit: number;
          after?: string;
        },
      ) => {
        await withPool(opts, async (pool) => {
          const page = await listAttempts(
            pool,
            opts.schema,
            { type: opts.type, queue: opts.queue, outcome: opts.outcome, since: opts.since, before: opts.before },
            { limit: opts.limit, after: opts.after },
          );
          if (opts.json) return printJson(page);
          printTable(
            page.attempts.map((a) => ({
              ...a,
              // Attempt history keeps no limit: the column reads `3/-`, as the other lists do for a type's.
              attempts: attemptsCell(a.attempt, null),
              ms: Math.round(a.durationMs),
              error:
                (a.invalid ? '(malformed row) ' : '') +
                (a.error ? escapeControl(a.error.message.split('\n')[0]!.slice(0, 60)) : ''),
            })),
            ['id', 'attempts', 'outcome', 'type', 'queue', 'schedule', 'worker', 'settledAt', 'ms', 'error'],
          );
          if (page.next)
            say(
              `\nmore: ${nextPageCommand('history list', opts, page.next, {
                type: opts.type,
                queue: opts.queue,
                outcome: opts.outcome,
                since: opts.since?.toISOString(),
                before: opts.before?.toISOString(),
              })}`,
            );
        });
      },
    );
}
