/** Garbage collections over a window (count and pause time), from perf_hooks' `gc` entries. */
import { PerformanceObserver } from 'node:perf_hooks';

export class GcTally {
  count = 0;
  ms = 0;
  private observer: PerformanceObserver | null = null;

  /** Starts counting from zero. */
  start(): void {
    this.stop();
    this.count = 0;
    this.ms = 0;
    this.observer = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        this.count++;
        this.ms += e.duration;
      }
    });
    this.observer.observe({ entryTypes: ['gc'] });
  }

  /** Stops counting; `count` and `ms` keep what was seen (entries are delivered asynchronously, so stop a tick late). */
  stop(): void {
    this.observer?.disconnect();
    this.observer = null;
  }
}

/** process.cpuUsage()'s user + system, in milliseconds: every thread of this process (V8's compiler threads too). */
export function cpuMs(usage: NodeJS.CpuUsage): number {
  return (usage.user + usage.system) / 1000;
}
