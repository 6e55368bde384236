import type { Command } from 'commander';
import {
  clearKeyLimitAudited,
  type HeldKey,
  type KeyLimitTarget,
  listHeldKeys,
  listKeyLimits,
  MAX_LIMIT,
  setKeyLimitAudited,
} from '../admin/limits.js';
import { BerthInputError } from '../errors.js';
import { actor, CliFailure, common, intOption, printJson, printTable, withPool, type Common } from './common.js';
import { escapeControl, say } from './terminal.js';

/** The columns of the key limits table. */
export const KEY_LIMIT_COLUMNS = ['scope', 'name', 'perKey', 'updatedBy', 'updatedAt'] as const;
/** The columns of the held keys table: `waitingSince` is when the key's first held task began to wait. */
export const HELD_KEY_COLUMNS = ['key', 'held', 'running', 'waitingSince'] as const;

/** One printed row per key with held tasks. */
export function heldKeyRows(keys: readonly HeldKey[]): Record<string, unknown>[] {
  return keys.map((k) => ({ ...k, waitingSince: k.since }));
}

/** How many held keys `keys list` reads (the oldest waits first). */
const HELD_LIST_LIMIT = 100;

type TargetOpts = Common & { queue?: string; type?: string };

/**
 * --queue Q or --type T, exactly one: what the admin API takes. `verb` names the command in the
 * error (a bad name itself is refused by the API, naming the field).
 */
function target(opts: TargetOpts, verb: string): KeyLimitTarget {
  if ((opts.queue === undefined) === (opts.type === undefined))
    throw new BerthInputError(`keys ${verb}: give exactly one of --queue <queue> or --type <type>`);
  return opts.queue !== undefined ? { queue: opts.queue } : { type: opts.type as string };
}

function describeTarget(t: KeyLimitTarget): string {
  return t.queue !== undefined ? `queue "${escapeControl(t.queue)}"` : `type "${escapeControl(t.type)}"`;
}

export function registerKeyCommands(program: Command): void {
  const keys = program
    .command('keys')
    .description('concurrency keys: how many tasks per key may run at once, and the keys with tasks waiting');
  common(keys.command('list'))
    .description('every key limit (per queue or task type), then the keys with held tasks, oldest wait first')
    .addHelpText(
      'after',
      `\nA key without a limit for its task's type or queue runs one task at a time. At most ${HELD_LIST_LIMIT} held keys are listed.`,
    )
    .action(async (opts: Common) => {
      await withPool(opts, async (pool) => {
        const [limits, held] = await Promise.all([
          listKeyLimits(pool, opts.schema),
          listHeldKeys(pool, opts.schema, HELD_LIST_LIMIT),
        ]);
        if (opts.json) return printJson({ limits, held });
        if (limits.length === 0) say('no key limits set: every key runs one task at a time');
        else printTable(limits as unknown as Record<string, unknown>[], KEY_LIMIT_COLUMNS);
        say('');
        if (held.length === 0) say('no tasks held for their keys');
        else printTable(heldKeyRows(held), HELD_KEY_COLUMNS);
      });
    });
  common(keys.command('set'))
    .description('set or change how many tasks with the same key may run at once, for a queue or a task type')
    .option('--queue <queue>', "the limit of this queue's keyed tasks")
    .option('--type <type>', "the limit of this task type (wins over its queue's)")
    .option('--per-key <k>', `at most k tasks per key running at once (1 to ${MAX_LIMIT})`, intOption(1, MAX_LIMIT))
    .addHelpText('after', "\nA raised limit admits held tasks within the leader's next promotion tick.")
    .action(async (opts: TargetOpts & { perKey?: number }) => {
      const t = target(opts, 'set');
      if (opts.perKey === undefined) throw new BerthInputError('keys set: give --per-key <k>');
      const perKey = opts.perKey;
      await withPool(opts, async (pool) => {
        const now = await setKeyLimitAudited(pool, opts.schema, null, actor(), t, perKey);
        if (opts.json) return printJson({ ...t, limit: now });
        say(`${describeTarget(t)}: at most ${perKey} task(s) per key at once`);
      });
    });
  common(keys.command('clear'))
    .description('remove the key limit of a queue or a task type: its keys run one task at a time again')
    .option('--queue <queue>', "the limit of this queue's keyed tasks")
    .option('--type <type>', 'the limit of this task type')
    .action(async (opts: TargetOpts) => {
      const t = target(opts, 'clear');
      await withPool(opts, async (pool) => {
        const r = await clearKeyLimitAudited(pool, opts.schema, null, actor(), t);
        if (opts.json) printJson({ ...t, ...r });
        if (!r.cleared) throw new CliFailure(`${describeTarget(t)} has no key limit`);
        if (!opts.json) say(`${describeTarget(t)}: key limit cleared`);
      });
    });
}
