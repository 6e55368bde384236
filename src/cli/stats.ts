import type { Command } from 'commander';
import {
  laneActivity,
  laneStats,
  leaderInfo,
  listWorkers,
  taskCounts,
  throughput,
  DUE_COUNT_CAP,
} from '../admin/stats.js';
import { keysSummary, listQueueLimits } from '../admin/limits.js';
import { laneLabel } from '../lane.js';
import { CliFailure, common, duration, printJson, printTable, withPool, type Common } from './common.js';
import { HELD_KEY_COLUMNS, heldKeyRows } from './keys.js';
import { LIMIT_COLUMNS, limitRows, TYPE_LIMIT_COLUMNS, typeLimitRows } from './limits.js';
import { listTypeLimits } from '../admin/type-limits.js';
import { dependencyStats } from '../admin/dependencies.js';
import { escapeControl, say } from './terminal.js';

export function registerStatsCommands(program: Command): void {
  common(program.command('stats'))
    .description(
      'queues (pending, running, dead, rates), lanes (depth, oldest due, paused), queue and task type limits, concurrency keys, tasks waiting on their dependencies',
    )
    .addHelpText(
      'after',
      '\nRates are handler outcomes per minute over the last 5 minutes, per queue (from worker heartbeats).',
    )
    .action(async (opts: Common) => {
      await withPool(opts, async (pool) => {
        const [counts, laneRows, activity, points, workers, limits, keys, typeLimits, deps] = await Promise.all([
          taskCounts(pool, opts.schema),
          laneStats(pool, opts.schema),
          laneActivity(pool, opts.schema),
          throughput(pool, opts.schema, 5),
          listWorkers(pool, opts.schema),
          listQueueLimits(pool, opts.schema),
          keysSummary(pool, opts.schema),
          listTypeLimits(pool, opts.schema),
          dependencyStats(pool, opts.schema),
        ]);
        const lanes = laneRows.map((l) => ({
          ...l,
          running: activity.get(l.laneId)?.running ?? 0,
          dead: activity.get(l.laneId)?.dead ?? 0,
        }));
        const queues = new Map<
          string,
          {
            queue: string;
            pending: number;
            running: number;
            dead: number;
            donePerMin: number;
            failedPerMin: number;
            oldestDue: number;
            paused: boolean;
          }
        >();
        const q = (name: string) => {
          let v = queues.get(name);
          if (!v) {
            v = {
              queue: name,
              pending: 0,
              running: 0,
              dead: 0,
              donePerMin: 0,
              failedPerMin: 0,
              oldestDue: 0,
              paused: false,
            };
            queues.set(name, v);
          }
          return v;
        };
        for (const c of counts)
          Object.assign(q(c.queue), {
            pending: q(c.queue).pending + c.pending,
            running: q(c.queue).running + c.running,
            dead: q(c.queue).dead + c.dead,
          });
        for (const l of lanes) {
          const v = q(l.queue);
          v.oldestDue = Math.max(v.oldestDue, l.oldestDueSeconds);
          v.paused ||= l.paused;
        }
        for (const p of points) {
          if (p.outcome === 'success') q(p.queue).donePerMin += p.count / 5;
          if (p.outcome === 'failure' || p.outcome === 'timeout') q(p.queue).failedPerMin += p.count / 5;
        }
        const rows = [...queues.values()].sort((a, b) => a.queue.localeCompare(b.queue));
        const alive = workers.filter((w) => w.alive);
        if (opts.json)
          return printJson({
            queues: rows,
            lanes,
            limits,
            typeLimits,
            keys,
            dependencies: deps,
            workers: alive.length,
            slots: alive.reduce((n, w) => n + w.slots, 0),
          });
        printTable(
          rows.map((r) => ({
            ...r,
            donePerMin: r.donePerMin.toFixed(1),
            failedPerMin: r.failedPerMin.toFixed(1),
            oldestDue: duration(r.oldestDue),
            paused: r.paused ? 'yes' : '',
          })),
          ['queue', 'pending', 'running', 'dead', 'donePerMin', 'failedPerMin', 'oldestDue', 'paused'],
        );
        say('');
        printTable(
          lanes.map((l) => ({
            ...l,
            dueDeferred: l.dueDeferred >= DUE_COUNT_CAP ? `${DUE_COUNT_CAP}+` : l.dueDeferred,
            oldestDue: duration(l.oldestDueSeconds),
            paused: l.paused ? 'yes' : '',
          })),
          ['laneId', 'queue', 'priority', 'shard', 'depth', 'dueDeferred', 'oldestDue', 'running', 'dead', 'paused'],
        );
        if (limits.length > 0) {
          say('');
          // Compact: who set a limit and when is in `berth limits list`.
          printTable(limitRows(limits), LIMIT_COLUMNS.slice(0, 6));
        }
        if (typeLimits.length > 0) {
          say('');
          // Compact: who set a limit and when is in `berth limits type list`.
          printTable(typeLimitRows(typeLimits), TYPE_LIMIT_COLUMNS.slice(0, 5));
        }
        if (keys.heldTasks > 0 || keys.limits.length > 0) {
          // Compact: the limits themselves and every waiting key are in `berth keys list`.
          say(
            `\nconcurrency keys: ${keys.heldTasks} task(s) held, ${keys.keysWaiting} key(s) waiting, ${keys.limits.length} key limit(s) set`,
          );
          if (keys.top.length > 0) printTable(heldKeyRows(keys.top), HELD_KEY_COLUMNS);
        }
        if (deps.length > 0) {
          const waiting = deps.reduce((n, d) => n + d.waiting, 0);
          const blocked = deps.reduce((n, d) => n + d.blocked, 0);
          say(
            `\ntask dependencies: ${waiting} task(s) waiting on their parents, ${blocked} blocked by a dead parent` +
              (blocked > 0 ? ' (retry the parent, or cancel the task: berth tasks list --state waiting)' : ''),
          );
          printTable(
            deps.map((d) => ({ ...d })),
            ['queue', 'waiting', 'blocked'],
          );
        }
        say(
          `\n${alive.length} worker(s) alive, ${alive.reduce((n, w) => n + w.busy, 0)}/${alive.reduce((n, w) => n + w.slots, 0)} slots busy`,
        );
      });
    });

  common(program.command('leader'))
    .description("who leads maintenance, and each branch's runs, last and max duration, overruns")
    .addHelpText('after', '\nExit status 1 when no process holds the leader lock.')
    .action(async (opts: Common) => {
      await withPool(opts, async (pool) => {
        const info = await leaderInfo(pool, opts.schema);
        if (opts.json) printJson(info);
        else if (!info.session)
          say(`no maintenance leader for schema "${opts.schema}": no worker with maintenance enabled is connected`);
        else {
          say(
            `leader: ${escapeControl(info.session.applicationName)} (backend pid ${info.session.pid}${info.session.clientAddr ? `, from ${info.session.clientAddr}` : ''}, connected since ${info.session.since.toISOString()})`,
          );
          const branches = info.worker?.maintenance.branches ?? {};
          if (Object.keys(branches).length === 0)
            say("no branch statistics yet (they arrive with the leader's next heartbeat)");
          else {
            const ms = (v: number) => (v < 10 ? v.toFixed(2) : v.toFixed(0));
            printTable(
              Object.entries(branches).map(([branch, b]) => ({
                branch,
                ...b,
                lastMs: ms(b.lastMs),
                maxMs: ms(b.maxMs),
              })),
              ['branch', 'runs', 'failures', 'overruns', 'lastMs', 'maxMs', 'lastRunAt'],
            );
          }
          for (const l of info.worker?.maintenance.waitingLanes ?? [])
            say(`promotion waiter on busy lane ${escapeControl(laneLabel(l))}`);
        }
        if (!info.session) throw new CliFailure(`no maintenance leader for schema "${opts.schema}"`);
      });
    });
}
