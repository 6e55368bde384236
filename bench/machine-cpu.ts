/** Whole-machine CPU over a window, from /proc/stat (Linux); null elsewhere. */
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';

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
