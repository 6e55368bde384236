import type { Command } from 'commander';
import { audited } from '../admin/audit.js';
import { listQueues, pauseQueue, resumeQueue } from '../admin/queues.js';
import { actor, CliFailure, common, listCommand, printJson, printTable, withPool, type Common } from './common.js';
import { say } from './terminal.js';

export function registerQueueCommands(program: Command): void {
  const queues = program.command('queues').description('list, pause and resume queues');
  listCommand(queues, 'every queue with its lanes and pause state', listQueues, (qs) =>
    printTable(
      qs.map((q) => ({ ...q, paused: q.paused ? 'yes' : 'no' })),
      ['queue', 'lanes', 'paused', 'pausedBy', 'pausedAt', 'reason'],
    ),
  );
  common(queues.command('pause <queue>'))
    .description('stop workers claiming from a queue (running tasks finish; enqueue goes on)')
    .option('--reason <text>', 'why, shown by queues list and the dashboard')
    .action(async (queue: string, opts: Common & { reason?: string }) => {
      await withPool(opts, async (pool) => {
        const who = actor();
        const r = await audited(pool, opts.schema, null, who, 'queue.pause', { queue, reason: opts.reason }, () =>
          pauseQueue(pool, opts.schema, queue, who, opts.reason),
        );
        if (opts.json) printJson({ queue, paused: true, ...r });
        else {
          say(`queue "${queue}" paused (${r.lanes} lane(s) changed)`);
          const known = (await listQueues(pool, opts.schema)).find((q) => q.queue === queue && q.lanes > 0);
          if (!known)
            say(`note: no lane of "${queue}" exists yet; the pause is recorded and its first lane will open paused`);
        }
      });
    });
  common(queues.command('resume <queue>'))
    .description('let workers claim from a paused queue again')
    .action(async (queue: string, opts: Common) => {
      await withPool(opts, async (pool) => {
        const who = actor();
        const wasPaused = (await listQueues(pool, opts.schema)).some((q) => q.queue === queue && q.paused);
        if (!wasPaused) {
          if (opts.json) printJson({ queue, paused: false, lanes: 0 });
          throw new CliFailure(`queue "${queue}" is not paused`);
        }
        const r = await audited(pool, opts.schema, null, who, 'queue.resume', { queue }, () =>
          resumeQueue(pool, opts.schema, queue, who),
        );
        if (opts.json) printJson({ queue, paused: false, ...r });
        else say(`queue "${queue}" resumed (${r.lanes} lane(s) changed)`);
      });
    });
}
