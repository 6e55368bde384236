import { createNoopMeter } from '@opentelemetry/api';
import { pino } from 'pino';
import { BerthMetrics } from '../metrics/catalogue.js';
import { Engine } from '../processor/engine.js';
import { OutcomeTally } from '../processor/heartbeat.js';
import { SettlementBatcher } from '../processor/settlement-batcher.js';
import { WorkerEvents } from '../processor/task-events.js';
import { TaskObserver } from '../processor/task-observer.js';
import { storageFor } from '../storage/storage.js';
import { anchorShape } from '../util/shape-anchor.js';
import { resolveWorkerOptions } from './worker-options.js';
import { workerPool } from './worker-pools.js';

/**
 * A worker's engine, made once per process when a worker first stops (its own objects still
 * alive, so the donor's share their shapes) and never started, kept for the shapes of the
 * engine's own objects (util/shape-anchor.ts): the engine, its fetcher, settlement batcher,
 * deadline timer, rate and throttle, and the dependencies they are made with. They live as long
 * as their worker, so once a stopped worker was collected, a full collection dropped their shapes
 * and threw away the code compiled for them ("weak objects" in `node --trace-deopt`: the engine's
 * dispatch, its settlement, the batcher's flush, the fetch), and the next worker in the process
 * ran its first tasks while V8 compiled them all again (docs/benchmarks-journal.md, "Issue 35's
 * fifteenth round"). A stopped worker's own objects are not kept for this (a stopped worker is
 * garbage: worker-release.test.ts).
 *
 * Made as Worker.start() makes the real one (the same options resolved, the same kinds of pools,
 * batcher, tally and observer, its dependencies in the same order), on pools that never connect,
 * with a silent logger, no task types and no handler: nothing here reaches a database or a user's
 * object. Then taken through the steps after which a real engine's objects have their final
 * shapes (`Engine.ripenDonor`). test/shape-anchor.test.ts compares it with a real worker's.
 */
export function anchorEngineShapes(): void {
  if (made) return;
  made = true;
  try {
    anchorDonor();
  } catch {
    // Never fails a stop: without a donor, a next worker here only compiles its code again.
  }
}

function anchorDonor(): void {
  const o = resolveWorkerOptions({
    connectionString: 'postgresql://donor.invalid/donor',
    tasks: [],
    logger: pino({ level: 'silent' }),
    // The default, given: read from PGCONNECT_TIMEOUT instead, a malformed value would refuse
    // the donor's options (a worker whose URL or option sets it still starts).
    connectTimeoutMs: 10_000,
    // A registry of its own and a meter that records nothing: the donor's instruments are taken
    // through an observation (Engine.ripenDonor), which must reach no exporter of the process.
    metrics: new BerthMetrics({ meter: createNoopMeter() }),
  });
  // The worker's three pools, as its start() makes them (a pool's size does not change its shape).
  const claims = workerPool(o, o.workerId, o.logger, o.database, 1, 'write', 0);
  const settlements = workerPool(o, o.workerId, o.logger, o.database, 1, 'write', 0);
  const write = workerPool(o, o.workerId, o.logger, o.database, 1, 'write');
  const events = new WorkerEvents(o.logger);
  const engine = new Engine({
    options: o,
    write,
    claims,
    replica: null,
    batcher: new SettlementBatcher(settlements, storageFor(o.schema), o.metrics, o.logger),
    logger: o.logger,
    metrics: o.metrics,
    wakeChannel: '',
    tally: new OutcomeTally(),
    onClaimsRecovered: () => {},
    onTooManyStuck: () => {},
    observer: new TaskObserver(events, o.workerId),
  });
  Engine.ripenDonor(engine);
  anchorShape('Engine', engine);
}

let made = false;
