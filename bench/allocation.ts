/**
 * JS heap bytes a stretch of this process allocated, collected or not: each collection's heap in
 * use before it, less what the one before left, plus what is in use at the end beyond the last
 * one's leftovers (node:v8's GCProfiler reports the heap around every collection). For
 * bench/drain-profile.ts and bench/pickup-alloc.ts.
 */
import { GCProfiler, getHeapStatistics } from 'node:v8';

export class AllocationMeter {
  private readonly gc = new GCProfiler();
  private readonly heap0: number;

  /** Starts measuring now. */
  constructor() {
    this.gc.start();
    this.heap0 = getHeapStatistics().used_heap_size;
  }

  /** Bytes allocated since the meter was made; it measures nothing after this. */
  stop(): number {
    const gcs = this.gc.stop().statistics;
    let allocated = 0;
    let floor = this.heap0;
    for (const g of gcs) {
      allocated += Math.max(0, g.beforeGC.heapStatistics.usedHeapSize - floor);
      floor = g.afterGC.heapStatistics.usedHeapSize;
    }
    return allocated + Math.max(0, getHeapStatistics().used_heap_size - floor);
  }
}
