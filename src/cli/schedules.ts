import type { Command } from 'commander';
import { audited } from '../admin/audit.js';
import {
  getSchedule,
  listSchedules,
  setSchedulePaused,
  triggerSchedule,
  type ScheduleInfo,
} from '../admin/schedules.js';
import { actor, common, listCommand, printJson, printTable, withPool, type Common } from './common.js';
import { escapeControl, jsonSafe, say } from './terminal.js';

/** What a schedule's state is, in one word: paused and stale are the marks an operator acts on. */
function status(s: ScheduleInfo): string {
  if (s.stale) return 'stale';
  if (s.paused) return 'paused';
  return 'active';
}

export function registerScheduleCommands(program: Command): void {
  const schedules = program.command('schedules').description('recurring tasks: list, show, pause, resume, trigger');
  listCommand(
    schedules,
    'every schedule: its task and ceiling, next and last fire, the last task, paused and stale marks',
    listSchedules,
    (all) =>
      printTable(
        all.map((s) => ({
          ...s,
          status: status(s),
          lastTask: s.lastTaskId ? `${s.lastTaskId} ${s.lastTaskState ?? '?'}` : null,
        })),
        ['name', 'cron', 'timeZone', 'taskType', 'ceilingMs', 'status', 'nextFireAt', 'lastInstant', 'lastTask'],
      ),
  );
  common(schedules.command('show <name>'))
    .description('one schedule in full')
    .action(async (name: string, opts: Common) => {
      await withPool(opts, async (pool) => {
        const s = await getSchedule(pool, opts.schema, name);
        if (opts.json) return printJson(s);
        const t = (d: Date | null) => (d === null ? '-' : d.toISOString());
        say(`schedule ${escapeControl(s.name)}: ${status(s)}`);
        say(`cron: ${escapeControl(s.cron)} (${escapeControl(s.timeZone)})`);
        say(
          `task: ${escapeControl(s.taskType)} on queue ${escapeControl(s.queue)}, priority ${s.priority}${s.maxAttempts === null ? '' : `, max attempts ${s.maxAttempts}`}`,
        );
        say(`payload: ${jsonSafe(JSON.stringify(s.payload))}`);
        say(`ceiling: ${s.ceilingMs === null ? "the task type's" : `${s.ceilingMs} ms`}`);
        say(
          `misfire: ${s.misfire}${s.misfire === 'all' ? ` (cap ${s.misfireCap})` : ''}, grace ${s.misfireGraceMs} ms`,
        );
        say(`next fire: ${t(s.nextFireAt)}`);
        say(`last fire: instant ${t(s.lastInstant)}, committed ${t(s.lastFiredAt)}`);
        say(`last task: ${s.lastTaskId === null ? '-' : `${s.lastTaskId} (${s.lastTaskState ?? 'no longer known'})`}`);
        if (s.paused) say(`paused by ${escapeControl(s.pausedBy ?? '-')} at ${t(s.pausedAt)}`);
        if (s.stale) say(`stale since ${t(s.staleSince)}: no running worker declares it, so it is not fired`);
        say(`declared by ${escapeControl(s.declaredBy ?? '-')} at ${t(s.declaredAt)}`);
      });
    });
  for (const [verb, paused, description] of [
    ['pause', true, 'stop firing a schedule (kept across restarts and deploys) until resumed'],
    ['resume', false, 'fire a paused schedule again (the instants that passed while paused are not run)'],
  ] as const) {
    common(schedules.command(`${verb} <name>`))
      .description(description)
      .action(async (name: string, opts: Common) => {
        await withPool(opts, async (pool) => {
          const who = actor();
          const r = await audited(pool, opts.schema, null, who, `schedule.${verb}`, { schedule: name }, () =>
            setSchedulePaused(pool, opts.schema, name, who, paused),
          );
          if (opts.json) return printJson(r);
          say(
            r.changed ? `schedule "${name}" ${verb}d` : `schedule "${name}" was ${paused ? 'already' : 'not'} paused`,
          );
        });
      });
  }
  common(schedules.command('trigger <name>'))
    .description('enqueue one run of a schedule now, without moving its next fire')
    .action(async (name: string, opts: Common) => {
      await withPool(opts, async (pool) => {
        const r = await audited(pool, opts.schema, null, actor(), 'schedule.trigger', { schedule: name }, () =>
          triggerSchedule(pool, opts.schema, name),
        );
        if (opts.json) return printJson(r);
        say(`schedule "${name}" triggered: task ${r.taskId}`);
      });
    });
}
