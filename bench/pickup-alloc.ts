/**
 * JS heap allocated by a running worker per task picked up one at a time (the pickup scenario:
 * an idle worker, tasks enqueued 10 ms apart), per system. In a new process the young
 * generation's first collections copy what the process has loaded, and each costs a pickup
 * 5-15 ms; how often they come depends on how much the worker allocates per task.
 *
 *   npx tsx bench/pickup-alloc.ts [--n 500] [--systems berth,graphile] [--profile]
 *
 * One process: the worker runs in it, warmed by 200 pickups; then `n` more are measured with
 * node:v8's GCProfiler (heap in use before each collection less what the one before left).
 * The producer's own allocation is measured alone (the same enqueues, no worker) and subtracted.
 * `--profile` also writes a sampling heap profile of the measured pickups (the producer's calls
 * included) as `bench/results/pickup-<system>.heapprofile`; `npx tsx bench/cpuprofile-summary.ts
 * FILE` lists its allocating functions.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { parseArgs } from 'node:util';
import { AllocationMeter } from './allocation.js';
import { loadConfig } from './config.js';
import { openBenchServer, recreateDatabase } from './db.js';
import { benchSystems } from './systems/all.js';
import type { Producer } from './systems/types.js';
import { sleep } from './util.js';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '500' },
    systems: { type: 'string', default: 'berth,graphile' },
    profile: { type: 'boolean', default: false },
  },
});
const n = Number(values.n);

async function allocatedDuring(fn: () => Promise<void>): Promise<number> {
  const allocation = new AllocationMeter();
  await fn();
  return allocation.stop();
}

async function paced(producer: Producer, from: number, count: number, seen?: () => number): Promise<void> {
  const base = performance.now();
  for (let i = 0; i < count; i++) {
    const wait = base + i * 10 - performance.now();
    if (wait > 0) await sleep(wait);
    await producer.single(from + i);
  }
  if (seen) while (seen() < from + count) await sleep(5);
}

const server = await openBenchServer();
try {
  const cfg = loadConfig(server.adminUrl);
  await recreateDatabase(cfg.adminUrl, cfg.benchDbName);
  for (const system of benchSystems({ connectionString: cfg.benchUrl }, values.systems.split(','))) {
    await system.reset();
    const producer = await system.openProducer();
    await paced(producer, 0, 50);
    const alone = await allocatedDuring(() => paced(producer, 50, n));
    await system.reset();
    let seen = 0;
    const worker = await system.startWorker(10, { record: () => void seen++ });
    await paced(producer, 0, 200, () => seen);
    const session = values.profile ? new Session() : null;
    if (session) {
      session.connect();
      await session.post('HeapProfiler.enable');
      await session.post('HeapProfiler.startSampling', {
        samplingInterval: 1024,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: true,
      });
    }
    const withWorker = await allocatedDuring(() => paced(producer, 200, n, () => seen));
    if (session) {
      const { profile } = await session.post('HeapProfiler.stopSampling');
      mkdirSync('bench/results', { recursive: true });
      const file = `bench/results/pickup-${system.label.replace(/\W+/g, '-')}.heapprofile`;
      writeFileSync(file, JSON.stringify(profile));
      console.log(`wrote ${file} (the producer's allocations included)`);
      session.disconnect();
    }
    await worker.stop();
    await producer.close();
    console.log(
      `${system.label}: ${Math.round((withWorker - alone) / n)} B per pickup (producer alone ${Math.round(alone / n)} B per enqueue)`,
    );
  }
} finally {
  await server.stop();
}
