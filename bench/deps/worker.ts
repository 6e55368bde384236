/**
 * The worker process of `npm run bench:deps` (bench/deps.ts forks it, one per run): one berth
 * Worker that leads maintenance, or one pg-boss instance that works the queue and resolves its
 * flows, with no-op handlers. It answers the driver over IPC: `stats` (is it the leader, the
 * dependency counters of its metrics), `stop` (stops gracefully, then exits).
 *
 * A process of its own, so the driver's enqueue calls and its reads do not share the worker's
 * event loop, and each run starts from the same cold process.
 */
import { PgBoss } from 'pg-boss';
import { pino } from 'pino';
import { BerthMetrics, defineTask, Worker } from '../../src/index.js';
import { type FromWorker, PGBOSS_BATCH_SIZE, type ToWorker, type WorkerEnv, type WorkerStats } from './protocol.js';

const send = (m: FromWorker) => process.send!(m);
const env = process.env as unknown as WorkerEnv;
const slots = Number(env.DEPS_SLOTS);

async function counterValues(m: BerthMetrics): Promise<{ releases: Record<string, number>; promoted: number }> {
  const releases: Record<string, number> = {};
  for (const v of (await m.dependencyReleases.prom.get()).values) releases[String(v.labels.path)] = v.value;
  const promoted = (await m.promoted.prom.get()).values.reduce((a, v) => a + v.value, 0);
  return { releases, promoted };
}

async function berth(): Promise<{ stats(): Promise<WorkerStats>; stop(): Promise<void> }> {
  const metrics = new BerthMetrics();
  const noop = defineTask<{ i: number }>({ type: 'noop', ceilingMs: 60_000, handler: async () => {} });
  const worker = new Worker({
    connectionString: env.DEPS_URL,
    schema: env.DEPS_SCHEMA,
    tasks: [noop],
    slots,
    logger: pino({ level: 'silent' }),
    metrics,
    maintenance: true,
  });
  await worker.start();
  return {
    stats: async () => ({ kind: 'stats', leader: worker.isLeader, ...(await counterValues(metrics)) }),
    stop: () => worker.stop(),
  };
}

async function pgBoss(): Promise<{ stats(): Promise<WorkerStats>; stop(): Promise<void> }> {
  const boss = new PgBoss({
    connectionString: env.DEPS_URL,
    schema: env.DEPS_SCHEMA,
    useListenNotify: true,
    flowIntervalSeconds: Number(env.DEPS_FLOW_INTERVAL_S),
  });
  boss.on('error', (err: Error) => send({ kind: 'error', message: err.message }));
  await boss.start();
  await boss.work(
    env.DEPS_QUEUE,
    {
      localConcurrency: slots,
      batchSize: PGBOSS_BATCH_SIZE,
      burstWhenBatchFull: true,
      // A job its flow resolver unblocks sends no notification: the poll finds it.
      pollingIntervalSeconds: Number(env.DEPS_POLL_S),
      notifyPollingIntervalSeconds: Number(env.DEPS_POLL_S),
    },
    async () => {},
  );
  return {
    stats: async () => ({ kind: 'stats', leader: true, releases: {}, promoted: 0 }),
    stop: () => boss.stop({ graceful: true, timeout: 10_000 }),
  };
}

const running = env.DEPS_SYSTEM === 'berth' ? await berth() : await pgBoss();
// The driver gone (it crashed or was interrupted): nothing is left to report to.
process.on('disconnect', () => process.exit(0));
process.on('message', async (m: ToWorker) => {
  if (m.kind === 'stats') send(await running.stats());
  else if (m.kind === 'stop') {
    await running.stop();
    send({ kind: 'stopped' });
    process.disconnect();
  }
});
send({ kind: 'ready' });
