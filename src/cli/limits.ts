import { type Command, InvalidArgumentError } from 'commander';
import {
  clearQueueLimitAudited,
  listQueueLimits,
  MAX_LIMIT,
  parseRate,
  type QueueLimitChange,
  type QueueLimitStatus,
  type RateLimit,
  rateText,
  setQueueLimitAudited,
} from '../admin/limits.js';
import {
  clearTypeLimitAudited,
  listTypeLimits,
  setTypeLimitAudited,
  type TypeLimitUsage,
} from '../admin/type-limits.js';
import { BerthInputError } from '../errors.js';
import {
  actor,
  CliFailure,
  common,
  intOption,
  listCommand,
  printJson,
  printTable,
  withPool,
  type Common,
} from './common.js';
import { escapeControl, say } from './terminal.js';

/** `--rate 20/1s`: parsed by the admin API's parseRate, its error shown as commander's one line. */
function rateOption(value: string): RateLimit {
  try {
    return parseRate(value);
  } catch (err) {
    if (err instanceof BerthInputError) throw new InvalidArgumentError(err.message);
    throw err;
  }
}

/** The columns `limits list` prints; `berth stats` prints the first six. */
export const LIMIT_COLUMNS = [
  'queue',
  'maxRunning',
  'running',
  'rate',
  'started',
  'held',
  'updatedBy',
  'updatedAt',
] as const;

/** One printed row per limit: the rate as it is written (`20/1s`), held with its mark. */
export function limitRows(limits: readonly QueueLimitStatus[]): Record<string, unknown>[] {
  return limits.map((l) => ({
    ...l,
    rate: rateText(l.rateLimit, l.rateIntervalMs),
    held: l.atLimit ? `${l.heldTasks} (at limit)` : l.heldTasks,
  }));
}

/** The columns `limits type list` prints; `berth stats` prints the first five. */
export const TYPE_LIMIT_COLUMNS = ['type', 'rate', 'started', 'paced', 'refused', 'updatedBy', 'updatedAt'] as const;

/** One printed row per type limit: the rate as it is written, started with its mark. */
export function typeLimitRows(limits: readonly TypeLimitUsage[]): Record<string, unknown>[] {
  return limits.map((l) => ({
    ...l,
    rate: rateText(l.rateLimit, l.rateIntervalMs),
    started: l.atLimit ? `${l.started} (at limit)` : l.started,
  }));
}

/** A limit in words: `max 5 running, 20/1s`. */
function describeLimit(l: { maxRunning: number | null; rateLimit: number | null; rateIntervalMs: number | null }) {
  const parts = [l.maxRunning === null ? null : `max ${l.maxRunning} running`, rateText(l.rateLimit, l.rateIntervalMs)];
  return parts.filter((p) => p !== null).join(', ');
}

export function registerLimitCommands(program: Command): void {
  const limits = program
    .command('limits')
    .description('fleet-wide queue limits: at most N running, at most N starts per interval');
  listCommand(
    limits,
    'every queue limit: how many run now, starts in the current interval, due tasks it holds back (task type limits: limits type list)',
    listQueueLimits,
    (all) => printTable(limitRows(all), LIMIT_COLUMNS),
  );
  common(limits.command('set <queue>'))
    .description("set or change a queue's limits (the ones not named keep their value)")
    .option(
      '--max-running <n>',
      `at most n of the queue's tasks running at once, across every worker (1 to ${MAX_LIMIT})`,
      intOption(1, MAX_LIMIT),
    )
    .option('--no-max-running', 'remove the running limit')
    .option(
      '--rate <count/interval>',
      'at most count starts per interval, across every worker: 20/1s, 100/1m',
      rateOption,
    )
    .option('--no-rate', 'remove the rate limit')
    .addHelpText(
      'after',
      '\nThe interval takes a unit: ms, s, m or h (at most 24h). Tasks already running count against a new limit.',
    )
    .action(async (queue: string, opts: Common & { maxRunning?: number | false; rate?: RateLimit | false }) => {
      const change: QueueLimitChange = {};
      if (opts.maxRunning !== undefined) change.maxRunning = opts.maxRunning === false ? null : opts.maxRunning;
      if (opts.rate !== undefined) change.rate = opts.rate === false ? null : opts.rate;
      if (Object.keys(change).length === 0)
        throw new BerthInputError('limits set: give --max-running, --rate, --no-max-running or --no-rate');
      await withPool(opts, async (pool) => {
        const now = await setQueueLimitAudited(pool, opts.schema, null, actor(), queue, change);
        if (opts.json) return printJson({ queue, limit: now });
        say(
          now
            ? `queue "${escapeControl(queue)}" limited: ${describeLimit(now)}`
            : `queue "${escapeControl(queue)}" has no limits left`,
        );
      });
    });
  common(limits.command('clear <queue>'))
    .description('remove every limit of a queue: workers claim it freely again')
    .action(async (queue: string, opts: Common) => {
      await withPool(opts, async (pool) => {
        const r = await clearQueueLimitAudited(pool, opts.schema, null, actor(), queue);
        if (opts.json) printJson({ queue, ...r });
        if (!r.cleared) throw new CliFailure(`queue "${escapeControl(queue)}" has no limits`);
        if (!opts.json) say(`queue "${escapeControl(queue)}": limits cleared`);
      });
    });
  registerTypeLimitCommands(limits);
}

/** `berth limits type list|set|clear`: a task type's rate limit, across every queue its tasks are in. */
function registerTypeLimitCommands(limits: Command): void {
  const type = limits
    .command('type')
    .description("task type rate limits: at most N starts of a type per interval, whatever its tasks' queue");
  listCommand(
    type,
    'every task type limit: starts in the current interval, tasks it refused that are not due again yet (paced), starts refused so far',
    listTypeLimits,
    (all) => printTable(typeLimitRows(all), TYPE_LIMIT_COLUMNS),
  );
  common(type.command('set <type>'))
    .description("set or change a task type's rate limit")
    .requiredOption(
      '--rate <count/interval>',
      'at most count starts per interval, across every worker: 20/1s, 100/1m',
      rateOption,
    )
    .addHelpText(
      'after',
      '\nThe interval takes a unit: ms, s, m or h (at most 24h). A task that would start past the limit is handed back\nunstarted (no attempt spent) and comes back when the limit has room; other types are not held up.',
    )
    .action(async (name: string, opts: Common & { rate: RateLimit }) => {
      await withPool(opts, async (pool) => {
        const now = await setTypeLimitAudited(pool, opts.schema, null, actor(), name, opts.rate);
        if (opts.json) return printJson({ type: name, limit: now });
        say(`task type "${escapeControl(name)}" limited: ${rateText(now.rateLimit, now.rateIntervalMs)}`);
      });
    });
  common(type.command('clear <type>'))
    .description("remove a task type's rate limit: the tasks it paced are due again at once")
    .action(async (name: string, opts: Common) => {
      await withPool(opts, async (pool) => {
        const r = await clearTypeLimitAudited(pool, opts.schema, null, actor(), name);
        if (opts.json) printJson({ type: name, ...r });
        if (!r.cleared) throw new CliFailure(`task type "${escapeControl(name)}" has no rate limit`);
        if (!opts.json) say(`task type "${escapeControl(name)}": rate limit cleared`);
      });
    });
}
