import type { Command } from 'commander';
import { audited } from '../admin/audit.js';
import {
  type BulkCancelResult,
  type CancelFilter,
  cancelTask,
  cancelTasks,
  deleteTask,
  listTasks,
  parseState,
  retryTask,
  taskTimeline,
  type TaskActionResult,
} from '../admin/tasks.js';
import { BerthInputError } from '../errors.js';
import { enqueueUnchecked } from '../producer/enqueue.js';
import { MAX_ATTEMPTS_LIMIT } from '../limits.js';
import { attemptsOf } from '../storage/history.js';
import { getTask } from '../storage/tasks.js';
import { moveTask } from '../storage/move.js';
import { taskId } from '../storage/ids.js';
import {
  actor,
  attemptsCell,
  CliFailure,
  common,
  durationMs,
  intOption,
  isoDate,
  nextPageCommand,
  printJson,
  printTable,
  taskIdArg,
  withPool,
  type Common,
} from './common.js';
import { escapeControl, jsonSafe, say } from './terminal.js';
import { progressBar } from './progress.js';
import { ErrorPrinter, timelineDetail } from './error-lines.js';
import { dependencyLines, waitingLine } from './dependencies.js';

function jsonPayload(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new BerthInputError(`payload is not valid JSON: ${(err as Error).message}`);
  }
}

const ACTION_MESSAGES: Record<TaskActionResult, string> = {
  retried: 'retried',
  removed: 'removed',
  cancelled: 'cancelled while running: its attempt is settled as cancelled and its worker aborts the handler',
  already_settled: 'was settled before the cancel (it completed, died or was cancelled already): nothing changed',
  running: 'is running under a lease and was not changed (cancel it first)',
  not_retryable: 'is already ready, running or completed (or held for its concurrency key): nothing to retry',
  waiting_on_parents:
    'waits on the tasks it depends on and runs when the last one completes: retry a dead parent, or cancel this task',
  duplicate: 'was not retried: a live task holds its dedupe key',
  not_found: 'not found',
};

/** Who cancelled a task and when, for a line of output. */
function cancelledLine(c: { actor: string | null; at: Date }): string {
  return `by ${escapeControl(c.actor ?? 'an operator (no actor given)')} at ${c.at.toISOString()}`;
}

async function taskAction(
  opts: Common,
  id: string,
  action: 'retry' | 'cancel' | 'delete',
  run: typeof retryTask,
): Promise<void> {
  taskId(id);
  await withPool(opts, async (pool) => {
    // Cancel means "remove pending work": say what a dead letter needs instead of "not found",
    // and who cancelled one already.
    const before = action === 'cancel' ? await getTask(pool, opts.schema, id) : null;
    if (before?.state === 'dead') {
      if (opts.json) printJson({ id, result: 'dead' });
      throw new CliFailure(`task ${id} is a dead letter, not pending: retry or delete it`);
    }
    if (before?.cancelled) {
      if (opts.json) printJson({ id, result: 'already_settled' });
      throw new CliFailure(`task ${id} was already cancelled, ${cancelledLine(before.cancelled)}`);
    }
    const who = actor();
    const result = await audited(pool, opts.schema, null, who, `task.${action}`, { id }, () =>
      action === 'cancel' ? cancelTask(pool, opts.schema, id, { actor: who }) : run(pool, opts.schema, id),
    );
    if (opts.json) printJson({ id, result });
    if (result === 'waiting_on_parents') {
      // Which parents: the operator's next step is one of them (or this task's cancel).
      const deps = (await getTask(pool, opts.schema, id))?.dependencies;
      const line = deps ? waitingLine(deps) : null;
      throw new CliFailure(`task ${id} ${ACTION_MESSAGES[result]}${line ? `\n${line}` : ''}`);
    }
    if (result !== 'retried' && result !== 'removed' && result !== 'cancelled')
      throw new CliFailure(`task ${id} ${ACTION_MESSAGES[result]}`);
    if (!opts.json) say(`task ${id}: ${ACTION_MESSAGES[result]}`);
  });
}

export function registerTaskCommands(program: Command): void {
  common(program.command('enqueue <type> <json>'))
    .description('enqueue one task: <json> is its payload')
    .option('--queue <name>', 'queue (default: default)')
    .option('--priority <n>', 'priority, lower runs first (default 0)', intOption(-32768, 32767))
    .option('--run-at <time>', 'not before this ISO 8601 time, with its zone (2026-12-01T09:00:00Z)', isoDate)
    .option('--delay <duration>', 'not before now + this (500ms, 30s, 15m, 2h), on the database clock', durationMs)
    .option('--dedupe-key <key>', 'at most one live task per key: a second enqueue returns the first')
    .option('--max-attempts <n>', "attempt limit for this task (default: its type's)", intOption(1, MAX_ATTEMPTS_LIMIT))
    .action(
      async (
        type: string,
        json: string,
        opts: Common & {
          queue?: string;
          priority?: number;
          runAt?: Date;
          delay?: number;
          dedupeKey?: string;
          maxAttempts?: number;
        },
      ) => {
        if (opts.runAt !== undefined && opts.delay !== undefined)
          throw new BerthInputError('give --run-at or --delay, not both');
        const payload = jsonPayload(json);
        await withPool(opts, async (pool) => {
          const r = await enqueueUnchecked(pool, type, payload, {
            schema: opts.schema,
            queue: opts.queue,
            priority: opts.priority,
            runAt: opts.runAt,
            delay: opts.delay,
            dedupeKey: opts.dedupeKey,
            maxAttempts: opts.maxAttempts,
          });
          if (opts.json) printJson(r);
          else if (r.state === 'duplicate')
            say(`duplicate of live task ${r.duplicateOf} (dedupe key ${escapeControl(opts.dedupeKey ?? '')})`);
          else say(`enqueued task ${r.id} (${r.state})`);
        });
      },
    );

  const tasks = program.command('tasks').description('list, inspect and act on tasks');
  common(tasks.command('list'))
    .description('tasks newest first; --after <id> for the next page')
    .option(
      '--state <state>',
      'ready, running, scheduled, retryable, held, waiting (on the tasks it depends on), dead, completed or cancelled',
      parseState,
    )
    .option('--queue <name>', 'only this queue')
    .option('--type <type>', 'only this task type')
    .option('--limit <n>', 'page size', intOption(1, 500), 50)
    .option('--after <id>', 'page cursor: the "next" printed by the previous page', taskIdArg)
    .action(
      async (
        opts: Common & {
          state?: ReturnType<typeof parseState>;
          queue?: string;
          type?: string;
          limit: number;
          after?: string;
        },
      ) => {
        await withPool(opts, async (pool) => {
          const page = await listTasks(
            pool,
            opts.schema,
            { state: opts.state, queue: opts.queue, type: opts.type },
            { limit: opts.limit, after: opts.after },
          );
          if (opts.json) return printJson(page);
          printTable(
            page.tasks.map((t) => ({
              ...t,
              attempts: attemptsCell(t.attempts, t.maxAttempts),
              lastError:
                t.state === 'cancelled'
                  ? `cancelled by ${t.cancelledBy ?? 'an operator'}`.slice(0, 60)
                  : t.lastError?.split('\n')[0]?.slice(0, 60),
            })),
            ['id', 'type', 'state', 'queue', 'priority', 'attempts', 'runAt', 'lastError'],
          );
          if (page.next)
            say(
              `\nmore: ${nextPageCommand('tasks list', opts, page.next, { state: opts.state, queue: opts.queue, type: opts.type })}`,
            );
        });
      },
    );

  common(tasks.command('show <id>'))
    .description(
      'one task: payload, result, parents and dependents (what a waiting task waits for), attempts (each with its error, stack and cause), last error, lease (while it runs), timeline',
    )
    .action(async (id: string, opts: Common) => {
      taskId(id);
      await withPool(opts, async (pool) => {
        const task = await getTask(pool, opts.schema, id);
        if (!task) throw new CliFailure(`task ${id} not found`);
        const timeline = await taskTimeline(pool, opts.schema, id);
        if (opts.json) return printJson({ task, timeline });
        say(`task ${task.id}  ${escapeControl(task.type)}  ${task.state}`);
        say(
          `queue ${escapeControl(task.queue)}  priority ${task.priority}  shard ${task.shard}  attempts ${attemptsCell(task.attempts, task.maxAttempts)}`,
        );
        if (task.dedupeKey) say(`dedupe key ${escapeControl(task.dedupeKey)}`);
        if (task.runAt) say(`due ${task.runAt.toISOString()}`);
        for (const line of dependencyLines(task.dependencies)) say(line);
        // A completed task's lease ended with its settlement: its expiry would read as still held.
        if (task.lease && task.state === 'running')
          say(
            `lease: worker ${escapeControl(task.lease.worker ?? '-')}, expires ${task.lease.expiresAt.toISOString()}`,
          );
        if (task.cancelled) say(`cancelled ${cancelledLine(task.cancelled)}`);
        if (task.source === 'history')
          say('payload: not kept (the task has left the queue; this is its record in attempt history)');
        else say(`payload:\n${jsonSafe(JSON.stringify(task.payload, null, 2))}`);
        if (task.lastError) say(`last error:\n${task.lastError}`);
        if (task.result !== null) say(`result:\n${jsonSafe(JSON.stringify(task.result, null, 2))}`);
        const attempts = await attemptsOf(pool, opts.schema, id);
        const schedule = attempts.find((a) => a.schedule !== null)?.schedule;
        if (schedule) say(`fired by schedule ${escapeControl(schedule)}`);
        if (attempts.length > 0) say('attempts:');
        const errors = new ErrorPrinter();
        for (const a of attempts) {
          // No worker: a row no claim wrote (an operator's cancel of a pending task), so it has a
          // time but no claim and no duration.
          const run =
            a.worker === null
              ? `at ${a.claimedAt.toISOString()}`
              : `worker ${escapeControl(a.worker)}  claimed ${a.claimedAt.toISOString()}  ${Math.round(a.durationMs)} ms${a.runMs !== null ? ` (handler ${a.runMs} ms)` : ''}`;
          say(`  #${a.attempt}  ${a.outcome}${a.dead ? ' (dead-lettered)' : ''}  ${run}`);
          if (a.invalid) say(`    malformed row, shown as far as it reads: ${a.invalid.join('; ')}`);
          if (a.cursor !== null) say(`    cursor ${jsonSafe(JSON.stringify(a.cursor))}`);
          for (const line of errors.lines(a.attempt, a.error)) say(line);
        }
        say('timeline:');
        for (const e of timeline)
          say(`  ${e.at.toISOString()}  ${e.event}  ${jsonSafe(JSON.stringify(timelineDetail(e.detail)))}`);
      });
    });

  common(tasks.command('retry <id>'))
    .description(
      'run now: a dead letter gets a fresh attempt budget; a scheduled or retryable task becomes due (a task waiting on its parents is refused: retry the parent)',
    )
    .action((id: string, opts: Common) => taskAction(opts, id, 'retry', retryTask));
  common(tasks.command('cancel [id]'))
    .description(
      'cancel a task so it never runs again: a pending one is removed, a running one is settled as cancelled and its handler aborted; without <id>, every task a filter matches',
    )
    .option('--state <state>', 'bulk: only ready, running, scheduled, retryable, held or waiting tasks', parseState)
    .option('--queue <name>', 'bulk: only this queue')
    .option('--type <type>', 'bulk: only this task type')
    .option('--all', 'bulk: every pending and running task')
    .action(async (id: string | undefined, opts: Common & CancelFilter) => {
      if (id !== undefined) {
        if (opts.state !== undefined || opts.queue !== undefined || opts.type !== undefined || opts.all)
          throw new BerthInputError('give a task id or a filter (--state, --queue, --type, --all), not both');
        return taskAction(opts, id, 'cancel', cancelTask);
      }
      const filter: CancelFilter = { state: opts.state, queue: opts.queue, type: opts.type, all: opts.all };
      await withPool(opts, async (pool) => {
        const who = actor();
        const bar = progressBar('cancelling');
        let r: BulkCancelResult;
        try {
          r = await audited(pool, opts.schema, null, who, 'task.cancel', { ...filter }, () =>
            cancelTasks(pool, opts.schema, filter, { actor: who, onProgress: (p) => bar.update(p) }),
          );
        } finally {
          bar.stop();
        }
        if (opts.json) return printJson(r);
        say(
          `cancelled ${r.cancelled} running and removed ${r.removed} pending task(s) of ${r.matched} matched` +
            (r.alreadySettled > 0 ? `; ${r.alreadySettled} settled first (left as they were)` : ''),
        );
      });
    });
  common(tasks.command('delete <id>'))
    .description('remove a task in any state but running, dead letters included')
    .action((id: string, opts: Common) => taskAction(opts, id, 'delete', deleteTask));
  common(tasks.command('move <id>'))
    .description('move a pending task to another queue and/or priority')
    .option('--queue <name>', 'target queue')
    .option('--priority <n>', 'target priority', intOption(-32768, 32767))
    .action(async (id: string, opts: Common & { queue?: string; priority?: number }) => {
      taskId(id);
      if (opts.queue === undefined && opts.priority === undefined)
        throw new BerthInputError('tasks move needs --queue and/or --priority');
      await withPool(opts, async (pool) => {
        const state = (await getTask(pool, opts.schema, id))?.state;
        if (state === 'dead' || state === 'completed') {
          if (opts.json) printJson({ id, result: state });
          throw new CliFailure(
            `task ${id} is ${state === 'dead' ? 'a dead letter' : 'completed'}: only pending tasks move`,
          );
        }
        const result = await audited(
          pool,
          opts.schema,
          null,
          actor(),
          'task.move',
          { id, queue: opts.queue, priority: opts.priority },
          () => moveTask(pool, opts.schema, id, { queue: opts.queue, priority: opts.priority }),
        );
        if (opts.json) printJson({ id, result });
        else if (result === 'moved') say(`task ${id}: moved`);
        if (result !== 'moved')
          throw new CliFailure(
            `task ${id} was not moved: ${result === 'leased' ? 'it is running under a lease' : 'not found'}`,
          );
      });
    });
}
