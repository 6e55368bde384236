/** CPU over a window: the whole machine's, and one process tree's (Linux /proc); null elsewhere. */
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';

export interface CpuMark {
  busy: number;
  total: number;
}

/** Busy and total CPU jiffies of the whole machine; null where /proc/stat is missing. */
export function machineCpu(): CpuMark | null {
  try {
    const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
    const total = f.reduce((a, x) => a + x, 0);
    const idle = f[3]! + (f[4] ?? 0);
    return { busy: total - idle, total };
  } catch {
    return null;
  }
}

/** Busy cores between two marks (every process on the machine), out of `cpus().length`. */
export function busyCores(from: CpuMark | null, to: CpuMark | null): number | null {
  if (!from || !to || to.total <= from.total) return null;
  return (cpus().length * (to.busy - from.busy)) / (to.total - from.total);
}

let ticksPerSecond: number | undefined;

/**
 * CPU seconds (user + system) used so far by a process and every live descendant, from
 * /proc/<pid>/stat: for a PostgreSQL cluster, the postmaster and its backends. A process that
 * exited in between is no longer counted, so take both marks while the sessions measured are open.
 * Null where /proc is missing.
 */
export function treeCpuSeconds(rootPid: number): number | null {
  try {
    ticksPerSecond ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    const children = new Map<number, number[]>();
    const ticks = new Map<number, number>();
    for (const name of readdirSync('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      let stat: string;
      try {
        stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      } catch {
        continue; // exited while we looked
      }
      // Fields after the command, which is in parentheses and may itself hold spaces.
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const pid = Number(name);
      const ppid = Number(f[1]);
      ticks.set(pid, Number(f[11]) + Number(f[12]));
      children.set(ppid, [...(children.get(ppid) ?? []), pid]);
    }
    if (!ticks.has(rootPid)) return null;
    let total = 0;
    const stack = [rootPid];
    while (stack.length) {
      const pid = stack.pop()!;
      total += ticks.get(pid) ?? 0;
      stack.push(...(children.get(pid) ?? []));
    }
    return total / ticksPerSecond;
  } catch {
    return null;
  }
}

/** The postmaster's pid of a cluster's data directory (first line of postmaster.pid), or null. */
export function postmasterPid(dataDir: string | null): number | null {
  if (dataDir === null) return null;
  try {
    const pid = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/**
 * CPU ticks used so far by this process's main thread and by its other threads together (V8's
 * compiler and garbage-collector helpers, libuv's pool), from /proc/self/task; null where /proc
 * is missing. process.cpuUsage() counts them together; this tells JavaScript running slower
 * (the main thread) from V8 compiling or marking the heap beside it (the rest).
 */
export function threadTicks(): { main: number; helpers: number } | null {
  try {
    let main = 0;
    let helpers = 0;
    for (const tid of readdirSync('/proc/self/task')) {
      let stat: string;
      try {
        stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
      } catch {
        continue; // a helper thread that exited while we looked
      }
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const t = Number(f[11]) + Number(f[12]);
      if (Number(tid) === process.pid) main += t;
      else helpers += t;
    }
    return { main, helpers };
  } catch {
    return null;
  }
}

/** Milliseconds of the main thread and of the helpers between two threadTicks() marks. */
export function threadMs(
  from: ReturnType<typeof threadTicks>,
  to: ReturnType<typeof threadTicks>,
): { main: number; helpers: number } | null {
  if (!from || !to) return null;
  ticksPerSecond ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  const ms = 1000 / ticksPerSecond;
  return { main: (to.main - from.main) * ms, helpers: (to.helpers - from.helpers) * ms };
}
